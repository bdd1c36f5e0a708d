"""The one training loop, readable top to bottom.

    prepare(config)        data, tiers, model, plan, mechanism — everything fixed before step 1
                           (engine.prepare: prepare_data + prepare_privacy; build_mechanism, M = 1)
    for step in 1..T:      engine.step.dp_step, the step the audit's models take too:
        Poisson-sample each training sample with its tier's rate q_i (empty batches allowed)
        per-sample gradients g_i and losses ℓ_i (engine.grad_sample, one batch at a time)
        C_i, ρ_i  ← mechanism                  (the only place algorithms differ)
        sum      = Σ ρ_i · g_i · min(1, C_i/‖g_i‖)  +  N(0, noise_std² I)
        mechanism.observe(...)                 (every step, empty batches included)
        step the optimizer on sum / (expected batch size Σ q_n N_n)
        every eval_every steps: per-tier/per-class metrics, ε spent per tier → store
"""
from __future__ import annotations

import os
import secrets
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from engine.config import ALGORITHM_LABELS, ConfigError, RunConfig
from engine.grad_sample import ModuleGrads
from engine.mechanisms import build_mechanism
from engine.metrics import fairness_metrics, group_metrics, mid_markers, predict
from engine.prepare import (PreparedData, PrivacyPlan, make_plan, prepare_data, prepare_privacy,  # noqa: F401
                            resolve_device, seeded_model, total_steps)
from engine.step import PoissonSampler, dp_step


class Cancelled(Exception):
    """Raised inside the loop when the caller asks the run to stop."""


@contextmanager
def sigterm_cancels():
    """Inside the block SIGTERM (the job manager's Cancel) raises Cancelled, so the run ends as
    'cancelled' with its metrics kept instead of dying mid-write."""

    def on_term(signum, frame):
        raise Cancelled("terminated by signal")

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@dataclass
class Prepared:
    """A run ready to start: its data, privacy plan, model and mechanism (M = 1)."""

    config: RunConfig
    data: PreparedData
    privacy: PrivacyPlan
    model: torch.nn.Module
    mechanism: object
    steps: int  # T the privacy plan is made for
    train_steps: int = 0  # steps this run trains (config.train_epochs: the first ones of T); 0: T

    dataset = property(lambda self: self.data.dataset)
    tiers = property(lambda self: self.data.tiers)
    device = property(lambda self: self.data.device)
    plan = property(lambda self: self.privacy.plan)
    sample_rates = property(lambda self: self.privacy.sample_rates)  # per training sample
    expected_batch = property(lambda self: self.privacy.expected_batch)
    tail_length = property(lambda self: self.privacy.tail_length)
    accountant_noise = property(lambda self: self.privacy.accountant_noise)
    info = property(lambda self: self.privacy.info)


def prepare(config: RunConfig) -> Prepared:
    data = prepare_data(config)
    n = data.n_train
    if config.batch_size > n:
        raise ConfigError("batch_size", f"must be at most the training set size {n}, got {config.batch_size}")
    ds = data.dataset
    model = seeded_model(config.model, ds.input_shape, ds.num_classes, config.seed).to(data.device)
    steps = total_steps(config, n)
    privacy = prepare_privacy(config, data, steps=steps)
    mechanism = build_mechanism(privacy=privacy, members=np.ones((1, n), bool), device=data.device)
    return Prepared(config=config, data=data, privacy=privacy, model=model, mechanism=mechanism, steps=steps,
                    train_steps=config.trained_steps(n))


def step_generator(config: RunConfig, device) -> torch.Generator:
    """The generator of a run's Poisson sampling and noise: seeded by ``config.seed``, or with
    ``secure_rng`` from the OS's entropy (as Opacus' secure mode; the run is then not reproducible)."""
    seed = secrets.randbits(63) if config.secure_rng else config.seed
    return torch.Generator(device=device).manual_seed(seed)


# --- the loop ---------------------------------------------------------------------------------

@dataclass
class RunResult:
    config: RunConfig
    plan: dict | None
    evals: list
    summary: dict
    model: torch.nn.Module


def train(config: RunConfig, *, store=None, run_id: int | None = None, progress: bool = False,
          should_stop=None, prepared: Prepared | None = None) -> RunResult:
    """Train one run. With ``store`` and ``run_id`` the metrics stream into the run store."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    prep = prepared or prepare(config)
    model, mech, ds, device = prep.model, prep.mechanism, prep.dataset, prep.device
    x_train, y_train = ds.x_train.to(device), ds.y_train.to(device)
    n = len(y_train)
    gen = step_generator(config, device)  # Poisson sampling, the noise, the quantile tracker's noise
    sampler = PoissonSampler(np.ones((1, n), bool), prep.sample_rates, device)
    optimizer = _optimizer(config, model)
    grads_of = ModuleGrads(model)  # per-sample gradients of this one model (M = 1)
    accountant = prep.privacy.accountant(config.delta)  # None without a formal guarantee: ε spent is null
    last = prep.train_steps or prep.steps
    eval_every = config.eval_every or max(1, last // 25)
    evaluator = _Evaluator(prep)
    plan_dict = plan_record(prep)
    if store is not None and run_id is not None:
        store.start_run(run_id, pid=os.getpid(), total_steps=last, plan=plan_dict)
    evals, pending_steps = [], []
    started = time.time()
    last_flush = started

    def record_eval(step):
        e = evaluator(model, step, accountant, time.time() - started)
        evals.append(e)
        if store is not None and run_id is not None:
            store.log_steps(run_id, pending_steps)
            pending_steps.clear()
            store.log_eval(run_id, step, e)

    record_eval(0)
    bar = _progress_bar(last, config.label) if progress else None
    for step in range(1, last + 1):
        if should_stop is not None and should_stop():
            raise Cancelled(f"stopped at step {step - 1}")
        out = dp_step(grads_of, x_train, y_train, sampler, mech, gen)
        optimizer.zero_grad(set_to_none=True)
        for k, p in grads_of.params.items():
            p.grad = out.grads[k][0]
        optimizer.step()
        if accountant is not None:
            accountant.step()
        pending_steps.append((step, out.mean_losses()[0], int(out.batch_sizes[0])))
        if bar is not None:
            bar.update(1)
        if step % eval_every == 0 or step == last:
            record_eval(step)
            last_flush = time.time()
        elif store is not None and run_id is not None and time.time() - last_flush > 0.5:
            store.log_steps(run_id, pending_steps)  # keeps the UI's progress bar live between evaluations
            pending_steps.clear()
            last_flush = time.time()
    if bar is not None:
        bar.close()
    summary = summarize(prep, evals, time.time() - started)
    if store is not None and run_id is not None:
        store.finish_run(run_id, summary)
    return RunResult(config=config, plan=plan_dict, evals=evals, summary=summary, model=model)


def _optimizer(config: RunConfig, model):
    o = config.optimizer
    if o.name == "adam":
        return torch.optim.Adam(model.parameters(), lr=o.lr)
    return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum)


def _progress_bar(total, label):
    from tqdm import tqdm

    return tqdm(total=total, desc=label, unit="step", leave=False)


def plan_record(prep: Prepared) -> dict:
    """The plan record the store keeps. Without a formal guarantee ``epsilons`` is null and
    ``formal_dp_reason`` says why; DP-SGD-S records what it uses (``prep.info``: z_Δ, count noise, base
    clip, c_min/c_max, public group sizes) instead of a noise std and clip (those change every step and
    are in each evaluation: ``group_clip_norms``, ``noise_std``)."""
    d = {"steps": prep.steps, "trained_steps": prep.train_steps or prep.steps, "expected_batch_size": prep.expected_batch,
         "tier_names": list(prep.tiers.names), "tier_sizes": list(prep.tiers.sizes),
         "target_epsilons": list(prep.tiers.epsilons), "formal_dp": prep.privacy.formal_dp,
         "formal_dp_reason": prep.privacy.formal_dp_reason, "tail_length": prep.tail_length}
    if prep.config.secure_rng:
        d["reproducible"] = False  # sampling and noise drawn from OS entropy
    if prep.plan is not None:
        d.update(prep.plan.to_dict())
        if prep.privacy.dpsgd_s is not None:
            d.update(noise_std=None, clip_norms=None)
        if not prep.privacy.formal_dp:
            d["epsilons"] = None
    d.update(prep.info)
    return d


class _Evaluator:
    """Test-set metrics per tier and class; per-tier metrics on a fixed training subsample
    when tiers are per-sample (random/explicit) and so undefined on test data."""

    def __init__(self, prep: Prepared):
        ds = prep.dataset
        self.prep = prep
        self.x, self.y = ds.x_test.to(prep.device), ds.y_test.numpy()
        self.tier_split = "test"
        self.tier_groups = prep.tiers.test
        self.sensitive = None
        attr = ds.default_sensitive
        if ds.num_classes == 2 and attr is not None and attr in ds.sensitive_test:
            self.sensitive = np.asarray(ds.sensitive_test[attr]).astype(str)
        if self.tier_groups is None:
            self.tier_split = "train"
            rng = np.random.default_rng(prep.config.seed + 7)
            n = len(ds.y_train)
            self.sub = np.sort(rng.choice(n, size=min(n, 5000), replace=False))
            self.x_sub = ds.x_train[self.sub].to(prep.device)
            self.y_sub = ds.y_train.numpy()[self.sub]
            self.tier_sub = prep.tiers.train[self.sub]

    def __call__(self, model, step, accountant, elapsed):
        prep, ds = self.prep, self.prep.dataset
        logp = predict(model, self.x)
        k = len(prep.tiers.epsilons)
        overall, tiers, classes, pred = group_metrics(self.y, logp, self.tier_groups, k, ds.num_classes)
        if self.tier_groups is None:
            _, tiers, _, _ = group_metrics(self.y_sub, predict(model, self.x_sub), self.tier_sub, k, ds.num_classes)
        spent = [float(e) for e in accountant.epsilons()] if accountant is not None else [None] * k
        for j, t in enumerate(tiers):
            t.update(name=prep.tiers.names[j], epsilon=prep.tiers.epsilons[j], epsilon_spent=spent[j])
        for c, m in enumerate(classes):
            m["name"] = ds.class_names[c]
        out = {"step": step, "epoch": step * prep.expected_batch / len(ds.y_train), "elapsed": elapsed,
               "overall": overall, "tiers": tiers, "classes": classes, "tier_split": self.tier_split}
        if self.sensitive is not None:
            out["fairness"] = fairness_metrics(self.y, pred, self.sensitive)
        out.update(prep.mechanism.state())
        return out


def summarize(prep: Prepared, evals: list, seconds: float) -> dict:
    last = evals[-1]
    steps = [e["step"] for e in evals]
    mids = mid_markers([[t["loss"] for t in e["tiers"]] for e in evals], steps)
    tiers = []
    for j, t in enumerate(last["tiers"]):
        recalls = [e["tiers"][j]["recall"] for e in evals]
        tiers.append({"name": t["name"], "epsilon": t["epsilon"], "epsilon_spent": t["epsilon_spent"],
                      "recall": t["recall"], "accuracy": t["accuracy"], "loss": t["loss"],
                      "recall_auc": recall_auc(steps, recalls), "mid": mids[j]})
    return {
        "algorithm": prep.config.algorithm.name,
        "label": prep.config.label or ALGORITHM_LABELS[prep.config.algorithm.name],
        "steps": prep.train_steps or prep.steps, "planned_steps": prep.steps, "seconds": seconds,
        "formal_dp": prep.privacy.formal_dp, "formal_dp_reason": prep.privacy.formal_dp_reason,
        "accuracy": last["overall"]["accuracy"], "balanced_accuracy": last["overall"]["balanced_accuracy"],
        "loss": last["overall"]["loss"], "tiers": tiers,
        "class_recall": [c["recall"] for c in last["classes"]],
        "fairness": last.get("fairness"),
    }


def recall_auc(steps, recalls) -> float:
    """Area under a recall-vs-progress curve, normalised to [0, 1] (progress = step / T)."""
    if len(steps) < 2 or steps[-1] == 0:
        return float(recalls[-1]) if recalls else float("nan")
    x = np.asarray(steps, dtype=float) / steps[-1]
    return float(np.trapezoid(np.asarray(recalls, dtype=float), x))
