"""The PA-ALOOA privacy audit runner: batched model training, checkpoints, resume (the set-up it runs is
``engine.audit.pa_alooa.setup.prepare_audit``'s).

    run_audit(config, ...)  train every algorithm's 2R models (+ PA-LOOA models) as batched ensembles,
                            score every training sample under every model → AuditReport
    cli_audit               ``python -m engine audit CONFIG.json [--json]``

The worker (``python -m engine worker RUN_ID``) reaches ``run_audit`` through ``engine.jobs.kinds``'s
registry (kind "audit"), which also keeps the run's status in the store.

Method. For r = 1..R the training set is split into two complementary random halves; model 2r
trains on one, model 2r+1 on the other (``design.complementary_membership``), with each
algorithm and the same tiers. Every sample is a member of exactly R of the 2R models. Each
sample's score under a model is, in float64, its logit-scaled confidence log p_y − log(1 − p_y)
(``score="logit_confidence"``, the default) or −loss (``score="loss"``). Per-sample advantage, GPR per group with bootstrap CIs,
Δ, the permutation null floor, the PA-GA / PA-GBA / PA-LOOA baselines, LiRA and the per-tier
empirical ε lower bound all come from ``engine.audit.pa_alooa.stats``.

Training is a dashboard run's, through the same code: ``engine.dp.prepare.prepare_privacy`` plans
once for the expected half-size tiers (a tier's ε depends only on its q, σ and T, so every model
meets its tier's claimed ε exactly; INO-SGD's γ is fixed from that plan too),
``engine.dp.mechanisms.build_mechanism`` builds one mechanism for the chunk's M models, and every step
is ``engine.dp.step.dp_step`` (Poisson batches, noise N(0, noise_std²), division by the model's
expected batch Σ q_i over its members), applied by plain SGD (``engine.dp.stacked.sgd_train``).
T = ``engine.dp.prepare.total_steps`` with n/2 samples: round(epochs · (n/2) / batch_size).

Checkpoints. With a store, each finished chunk of models writes its per-sample losses and
confidences as an artifact (``chunk/<algorithm>/<kind>/<chunk>``, ``.npz``); re-running the same
run id skips every chunk already there. Every chunk has its own seeds, so a resumed audit gives
exactly the results of an uninterrupted one. Checkpoints of version 2 hold float64 scores; those of
version 1 (float32) still load (their scores are widened to float64, with the float32 ties they
have), and a version-1 PA-LOOA chunk, which holds losses only, is retrained.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from engine.audit.pa_alooa import stats
from engine.audit.pa_alooa.analysis import (algorithm_report, correct_predictions, empty_report, membership_scores,
                                   plan_table)
from engine.audit.pa_alooa.config import AuditConfig
from engine.audit.pa_alooa.controls.compare import comparisons
from engine.audit.pa_alooa.controls.runs import resolve_control
from engine.audit.pa_alooa.design import chunk_layout, derived_seed, init_seeds, looa_membership, looa_targets
from engine.audit.pa_alooa.executor import ChunkTask, LocalChunks
from engine.audit.pa_alooa.records import Baselines, LooaRecord
from engine.audit.pa_alooa.report import AuditReport
from engine.audit.pa_alooa.setup import AlgoSetup, AuditSetup, prepare_audit
from engine.config.schema import ConfigError
from engine.dp.algorithms import algorithm
from engine.store.artifacts import npy_bytes
from engine.store.lifecycle import NO_STORE, RunLifecycle

# ================================================================================================
# checkpoints
# ================================================================================================

def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _unnpz(blob: bytes) -> dict:
    with np.load(io.BytesIO(blob), allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


CHECKPOINT_VERSION = 2  # 2: float64 losses and confidences (LOOA chunks too); 1: float32, LOOA losses only


class _Checkpoints:
    """Chunk results in the run store (or nowhere, without a store)."""

    def __init__(self, life: RunLifecycle, config: AuditConfig, layout: dict):
        store, run_id = life.store, life.run_id
        self.store, self.run_id = store, run_id
        self.active = life.active
        if not self.active:
            return
        meta = {"version": CHECKPOINT_VERSION, "config": config.to_dict(), "layout": layout}
        old = store.get_artifact(run_id, "audit/meta")
        if old is not None:
            prev = json.loads(old.decode())
            if int(prev.get("version") or 1) > CHECKPOINT_VERSION:
                raise ConfigError("config", f"run {run_id} holds checkpoints of version {prev.get('version')}, newer "
                                            f"than this version reads ({CHECKPOINT_VERSION})")
            if _migrated(prev.get("config")) != meta["config"] or prev.get("layout") != layout:
                raise ConfigError("config", f"run {run_id} holds checkpoints of a different audit configuration")
        else:
            store.put_artifact(run_id, "audit/meta", json.dumps(meta, sort_keys=True).encode())

    def get(self, key: str):
        if not self.active:
            return None
        blob = self.store.get_artifact(self.run_id, key)
        return None if blob is None else _unnpz(blob)

    def put(self, key: str, **arrays):
        if self.active:
            self.store.put_artifact(self.run_id, key, _npz(**arrays))

    def get_json(self, key: str):
        if not self.active:
            return None
        blob = self.store.get_artifact(self.run_id, key)
        return None if blob is None else json.loads(blob.decode())

    def put_json(self, key: str, value) -> None:
        if self.active:
            self.store.put_artifact(self.run_id, key, json.dumps(value, sort_keys=True).encode())


def _migrated(config_dict):
    """A stored audit config in today's shape (checkpoints written before the nested config still match)."""
    try:
        return AuditConfig.from_dict(config_dict).to_dict()
    except (ConfigError, TypeError):
        return config_dict


class _Progress:
    def __init__(self, life: RunLifecycle, total: int, bar):
        self.life, self.total, self.bar = life, total, bar
        self.done = 0
        self.last = 0.0

    def advance(self, k: int = 1):
        self.done += k
        if self.bar is not None:
            self.bar.update(k)
        now = time.time()
        if now - self.last > 0.5 or self.done >= self.total:
            self.life.progress(self.done)
            self.last = now


# ================================================================================================
# the audit
# ================================================================================================

def run_audit(config: AuditConfig, *, life: RunLifecycle = NO_STORE, progress: bool = False,
              should_stop=None, executor=None) -> AuditReport:
    """Run (or resume) an audit inside its lifecycle ``life`` (:func:`engine.jobs.kinds.execute` opens it;
    none: no store) and return its report (``report.to_dict()`` is the run's summary).

    With a store the run's progress, chunk checkpoints, per-sample advantages (artifacts
    ``advantage/<key>``) and results go to it; a run that was stopped (``should_stop`` →
    :class:`engine.store.lifecycle.Cancelled`), killed or crashed continues from its last completed chunk
    when run again with the same id. ``executor`` trains the chunks (``engine.audit.pa_alooa.executor``; default: in this
    process, :class:`LocalChunks`); it changes no number.
    """
    started = time.time()
    executor = executor or LocalChunks()
    if config.run.threads is not None:
        torch.set_num_threads(config.run.threads)
    setup = prepare_audit(config)
    layout = chunk_layout(setup)
    ckpt = _Checkpoints(life, config, layout)
    total = sum(len(v) for v in layout.values()) * setup.steps
    life.start(total_steps=total, plan=_run_plan(setup))
    bar = _bar(total) if progress else None
    prog = _Progress(life, total, bar)
    report = empty_report(setup)
    results: dict[str, AlgoResult] = {}
    try:
        for k, a in enumerate(setup.algos):
            if not a.resolved:
                a = setup.algos[k] = resolve_control(setup, a, results, ckpt, should_stop)
            results[a.key] = got = _audit_algorithm(setup, a, layout, ckpt, prog, should_stop, executor)
            report = dataclasses.replace(report, algorithms=report.algorithms + (got.report,),
                                         seconds=time.time() - started)
            if life.active:
                life.store.set_summary(life.run_id, dataclasses.replace(report, partial=True).to_dict())
                life.store.put_artifact(life.run_id, f"advantage/{a.key}", npy_bytes(got.advantage.astype(np.float32)))
    finally:  # also when stopped (Cancel, Ctrl-C): the terminal's bar line is cleared for the CLI's message
        if bar is not None:
            bar.close()
    report = dataclasses.replace(report, comparisons=comparisons(setup, results))
    report = dataclasses.replace(report, seconds=time.time() - started,
                                 train_seconds=sum(r.train_seconds for r in report.algorithms),
                                 stats_seconds=sum(r.stats_seconds for r in report.algorithms))
    life.finish(report.to_dict())
    return report


def _bar(total):
    from tqdm import tqdm

    return tqdm(total=total, desc="audit", unit="step", leave=False)


def _run_plan(setup: AuditSetup) -> dict:
    return {"kind": "audit", "steps_per_model": setup.steps, "n_models": setup.n_models, "n_train": setup.n,
            "chunk_models": setup.chunk_models, "tier_names": list(setup.tiers.names),
            "algorithms": {a.key: plan_table(setup, a) if a.resolved else None for a in setup.algos},
            "controls": {a.key: a.control for a in setup.algos if a.control is not None},
            # the Runs page's "formal DP": only when every algorithm of the audit has a formal guarantee
            "formal_dp": all(a.formal_dp for a in setup.algos),
            "no_formal_dp": [a.label for a in setup.algos if not a.formal_dp]}


@dataclass
class AlgoResult:
    """One algorithm's report and what the paired comparisons and the controls need from its models."""

    report: object  # AlgorithmReport
    advantage: np.ndarray  # (n,) per-sample advantage, float64
    accuracy: np.ndarray  # (2R,) test accuracy per model
    realised_noise: np.ndarray | None  # (2R,) DP-SGD-S: each model's realised noise multiplier


def _audit_algorithm(setup: AuditSetup, a: AlgoSetup, layout: dict, ckpt: _Checkpoints, prog,
                     should_stop, executor) -> AlgoResult:
    """Train (or load) the algorithm's 2R models chunk by chunk, then its statistics."""
    if not a.resolved:
        raise RuntimeError(f"internal error: the control {a.key} was not planned before training")
    cfg = setup.config
    n, M = setup.n, setup.n_models
    k_algo = [x.key for x in setup.algos].index(a.key)
    t0 = time.time()
    losses = np.empty((M, n), dtype=np.float64)
    confs = np.empty((M, n), dtype=np.float64)
    spans = layout[f"{a.key}/aloo"]
    preds, noise = [None] * len(spans), [None] * len(spans)
    tracks_noise = algorithm(a.algo.name).controls is not None  # its noise-matched control needs what it realised
    at = {}  # chunk key → its index in the layout (results are placed by index, whatever order they finish in)

    def place(c, got):
        lo, hi = spans[c]
        losses[lo:hi], confs[lo:hi] = got["losses"], got["confs"]
        preds[c], noise[c] = np.asarray(got["preds"]), got.get("noise")

    todo = []
    for c, (lo, hi) in enumerate(spans):
        key = f"chunk/{a.key}/aloo/{c}"
        at[key] = c
        got = ckpt.get(key)
        if got is not None and tracks_noise and "noise" not in got and cfg.controls:
            got = None  # a checkpoint from before the realised noise was kept: the controls need it, trained again
        if got is None:
            todo.append(ChunkTask(key, lo, hi, setup.membership[lo:hi], tuple(init_seeds(cfg.run.seed, lo, hi)),
                                  derived_seed(cfg.run.seed, 2, k_algo, c)))
        else:
            prog.advance(setup.steps)
            place(c, got)
    for t, (l, cf, p, z) in _finished(executor, setup, a, todo, prog, should_stop):
        ckpt.put(t.key, losses=l, confs=cf, preds=p.astype(np.int16), **({} if z is None else {"noise": z}))
        place(at[t.key], {"losses": l, "confs": cf, "preds": p, **({} if z is None else {"noise": z})})
    train_seconds = time.time() - t0
    t1 = time.time()
    preds = np.concatenate(preds, 0)
    realised = np.concatenate(noise).astype(np.float64) if tracks_noise and all(z is not None for z in noise) \
        else None
    res, adv = algorithm_report(setup, a, losses, confs, preds, realised_noise=realised)
    stats_seconds = time.time() - t1
    # PA-LOOA on the records the ALOOA advantage ranks riskiest (outside model 0's half)
    if cfg.looa_k:
        t2 = time.time()
        res = dataclasses.replace(res, baselines=_looa(setup, a, res.baselines, adv.astype(np.float32), layout, ckpt,
                                                       prog, should_stop, k_algo, executor))
        train_seconds += time.time() - t2
    accuracy = correct_predictions(setup, preds).mean(1)
    return AlgoResult(report=dataclasses.replace(res, train_seconds=train_seconds, stats_seconds=stats_seconds),
                      advantage=adv, accuracy=accuracy, realised_noise=realised)


def _finished(executor, setup, a, tasks, prog, should_stop):
    """(task, result) of each of ``tasks`` as the executor finishes it; the executor's pending work is dropped
    when the caller stops reading (Cancelled, an error)."""
    if not tasks:
        return
    run = executor.run(setup, a, tasks, prog, should_stop)
    try:
        yield from run
    finally:
        run.close()


def _looa(setup, a, baselines: Baselines, adv, layout, ckpt, prog, should_stop, k_algo, executor) -> Baselines:
    cfg = setup.config
    targets = looa_targets(setup.membership[0], adv, cfg.looa_k)
    m = cfg.looa_models
    members = looa_membership(setup.membership[0], targets, m)
    total = len(members)
    score = np.empty((total, len(targets)), dtype=np.float64)
    todo = []
    for c, (lo, hi) in enumerate(layout[f"{a.key}/looa"]):
        key = f"chunk/{a.key}/looa/{c}"
        got = ckpt.get(key)
        if got is None or "confs" not in got:  # version-1 LOOA chunks hold losses only: trained again
            todo.append(ChunkTask(key, lo, hi, members[lo:hi], tuple(derived_seed(cfg.run.seed, 3, j)
                                                                     for j in range(lo, hi)),
                                  derived_seed(cfg.run.seed, 4, k_algo, c), score_idx=targets))
        else:
            prog.advance(setup.steps)
            score[lo:hi] = membership_scores(cfg.score, got["losses"], got["confs"])
    for t, (l, cf, _, _) in _finished(executor, setup, a, todo, prog, should_stop):
        ckpt.put(t.key, losses=l, confs=cf)
        score[t.lo:t.hi] = membership_scores(cfg.score, l, cf)
    rows = []
    for t, i in enumerate(targets):
        without = score[:m, t]
        with_ = score[(t + 1) * m:(t + 2) * m, t]
        rows.append(LooaRecord(index=int(i), group=str(setup.groups[i]),
                               looa_advantage=_finite(stats.pa_looa(with_, without)), aloo_advantage=_finite(adv[i])))
    return dataclasses.replace(baselines, pa_looa=tuple(rows), looa_models=int(total), looa_models_per_record=2 * m)


def _finite(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None
