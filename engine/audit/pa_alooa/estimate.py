"""An audit's runtime estimate before it starts (the page shows it beside the launch button).

    estimate = Σ over algorithms of (2R + PA-LOOA models) × steps per model × per-model-step cost
             + Σ over algorithms of 2R × training samples × the statistics' cost per model and sample

The per-model-step cost is measured, not guessed: one chunk of the audit's own size trains for a few
steps of each distinct mechanism (the same ``engine.dp.step.dp_step`` the audit runs, on the audit's
device), and its wall time is divided by models × steps. The probe runs with the worker's torch threads
(one, unless the config says otherwise): the page's process has more, and on a busy 2-core machine a
2-thread probe measured 20× the cost the 1-thread worker then had. The statistics (thresholds, null
permutations, bootstrap) are vectorised over models × samples, so their cost is a rate: measured at about
7e-7 s per model and sample on a 2-core machine (digits 2R = 400: 0.8 s for two algorithms). The worker's
start is the caller's to add (``engine.jobs.estimates.start_seconds``: it knows the store).
"""
from __future__ import annotations

import contextlib
import time

import torch

from engine.audit.pa_alooa.controls import plan as controls
from engine.audit.pa_alooa.chunks import on_device
from engine.dp.mechanisms import build_mechanism
from engine.dp.stacked import StackedModels, sgd_train
from engine.dp.step import PoissonSampler

_PROBE_STEPS = 5
_WARMUP_STEPS = 2
STATS_SECONDS_PER_MODEL_SAMPLE = 7e-7  # per algorithm (see the module docstring)


@contextlib.contextmanager
def _torch_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def estimate_runtime(setup, *, probe_steps: int = _PROBE_STEPS, method: str = "auto") -> dict:
    """``{"seconds", "train_seconds", "stats_seconds", "model_steps", "per_model_step_seconds": {algorithm key:
    s}, "how"}`` for a prepared audit (:func:`engine.audit.pa_alooa.setup.prepare_audit`). ``method``: the stack's
    per-sample path (``engine.dp.stacked.StackedModels``; "auto" is what the audit takes)."""
    cfg, dev = setup.config, setup.device
    ds = setup.dataset
    x, y = on_device(ds.x_train, dev), on_device(ds.y_train, dev)
    k = max(1, min(setup.chunk_models, setup.n_models))
    members = setup.membership[:k]
    looa = (cfg.looa_k + 1) * cfg.looa_models if cfg.looa_k else 0
    per_step, cache, total, model_steps = {}, {}, 0.0, 0
    for a in setup.algos:
        kind = (a.algo.name, a.formal_dp)
        if kind not in cache:
            cache[kind] = _probe(setup, a, x, y, members, k, probe_steps, method)
        per_step[a.key] = cache[kind]
        n_models = setup.n_models + looa
        model_steps += n_models * setup.steps
        total += cache[kind] * n_models * setup.steps
    train = total
    pilot = ""
    if cfg.controls:  # the accuracy-matched control's ε search: at most max_pilot_runs() trainings of a few models
        dpsgd = next(a for a in setup.algos if a.algo.name == controls.ALGORITHM.name)
        pilot_steps = controls.max_pilot_runs() * controls.pilot_models(setup.n_models) * setup.steps
        model_steps += pilot_steps
        train += per_step[dpsgd.key] * pilot_steps
        pilot = f" + {pilot_steps:,} for the accuracy-matched control's ε search"
    stats = STATS_SECONDS_PER_MODEL_SAMPLE * len(setup.algos) * setup.n_models * setup.n
    how = (f"training {train:.0f} s: {model_steps:,} model-steps ({len(setup.algos)} algorithms × "
           f"{setup.n_models + looa} models × {setup.steps} steps{pilot}) × a per-model-step cost measured on "
           f"{probe_steps} steps of a {k}-model chunk on {dev}; statistics {stats:.0f} s")
    return {"seconds": float(train + stats), "train_seconds": float(train), "stats_seconds": float(stats),
            "model_steps": int(model_steps),
            "per_model_step_seconds": {key: float(v) for key, v in per_step.items()}, "how": how}


def _probe(setup, a, x, y, members, k: int, probe_steps: int, method: str = "auto") -> float:
    """Seconds per model-step of algorithm ``a``: a ``k``-model chunk trained ``probe_steps`` steps after a
    warm-up, with the worker's torch threads."""
    cfg, ds, dev = setup.config, setup.dataset, setup.device
    with _torch_threads(cfg.run.threads or 1):
        ens = StackedModels(cfg.run.model, ds.input_shape, ds.num_classes, list(range(k)), dev, method=method)
        sampler = PoissonSampler(members, a.sample_rates, dev, expected_batch=a.privacy.expected_batch)
        mech = build_mechanism(privacy=a.privacy, members=members, device=dev)
        gen = torch.Generator(device=dev).manual_seed(0)
        sgd_train(ens, x, y, sampler, mech, steps=_WARMUP_STEPS, lr=cfg.run.optimizer.lr, gen=gen)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        sgd_train(ens, x, y, sampler, mech, steps=probe_steps, lr=cfg.run.optimizer.lr, gen=gen)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return (time.perf_counter() - t0) / (k * probe_steps)

