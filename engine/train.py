"""The one training loop, readable top to bottom.

    prepare(config)        data, tiers, model, plan, mechanism — everything fixed before step 1
    for step in 1..T:
        Poisson-sample each training sample with its tier's rate q_i (empty batches allowed)
        per-sample gradients g_i and losses ℓ_i (torch.func, one batch at a time)
        C_i, ρ_i  ← mechanism                  (the only place algorithms differ)
        sum      = Σ ρ_i · g_i · min(1, C_i/‖g_i‖)  +  N(0, noise_std² I)
        step the optimizer on sum / (expected batch size Σ q_n N_n)
        every eval_every steps: per-tier/per-class metrics, ε spent per tier → store
"""
from __future__ import annotations

import math
import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from engine import accounting
from engine.config import ALGORITHM_LABELS, ConfigError, RunConfig
from engine.data import load_dataset
from engine.grad_sample import per_sample_grad_fn
from engine.mechanisms import (Clipped, GroupAdaptive, Importance, NonPrivate, build_tif,
                               default_count_noise_std, resolve_tail_length)
from engine.metrics import fairness_metrics, group_metrics, mid_markers, predict
from engine.models import build_model
from engine.tiers import assign_tiers

PLAN_MODES = {"dpsgd": "dpsgd", "idp_sample": "sample", "idp_scale": "scale", "dpsgd_s": "dpsgd"}


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
    config: RunConfig
    dataset: object
    tiers: object
    model: torch.nn.Module
    plan: object | None
    mechanism: object
    sample_rates: np.ndarray  # per training sample
    steps: int
    expected_batch: float
    device: torch.device
    tail_length: float | None = None
    groups: np.ndarray | None = None
    accountant_noise: tuple | None = None
    info: dict = field(default_factory=dict)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "CUDA was requested but no GPU is available")
    return torch.device(name)


def total_steps(config: RunConfig, n_train: int) -> int:
    """Steps of this run (engine.config.total_steps), refused over the work cap (RunConfig.planned_steps)."""
    return config.planned_steps(n_train)


def make_plan(config: RunConfig, tier_sizes, steps: int):
    """The privacy plan (per-tier q, C, σ) this configuration trains with; None if non-private."""
    algo = config.algorithm.name
    if algo == "nonprivate":
        return None
    mode = config.algorithm.idp_mode if algo == "ino" else PLAN_MODES[algo]
    try:
        return accounting.plan(mode=mode, epsilons=[t.epsilon for t in config.tiers.tiers], delta=config.delta,
                               tier_sizes=list(tier_sizes), batch_size=config.batch_size,
                               clip_norm=config.clip_norm, steps=steps)
    except accounting.PlanError as e:
        raise ConfigError("tiers", f"no privacy plan: {e}") from None


def prepare(config: RunConfig) -> Prepared:
    config.validate()
    device = resolve_device(config.device)
    dataset = load_dataset(config.data.name, data_dir=config.data.data_dir, seed=config.seed,
                           max_train=config.data.max_train)
    n = len(dataset.y_train)
    if config.batch_size > n:
        raise ConfigError("batch_size", f"must be at most the training set size {n}, got {config.batch_size}")
    torch.manual_seed(config.seed)
    model = build_model(config.model, dataset.input_shape, dataset.num_classes).to(device)
    tiers = assign_tiers(config.tiers, dataset, seed=config.seed)
    steps = total_steps(config, n)
    plan = make_plan(config, tiers.sizes, steps)
    algo = config.algorithm
    prep = Prepared(config=config, dataset=dataset, tiers=tiers, model=model, plan=plan, mechanism=None,
                    sample_rates=np.full(n, config.batch_size / n), steps=steps,
                    expected_batch=float(config.batch_size), device=device)
    if plan is None:
        prep.mechanism = NonPrivate()
        return prep
    q = np.asarray(plan.sample_rates)[tiers.train]
    clip = np.asarray(plan.clip_norms)[tiers.train]
    prep.sample_rates = q
    prep.expected_batch = float(plan.expected_batch_size)
    # Per-tier noise multiplier relative to its own clip norm (SCALE gives bigger-C tiers less).
    prep.accountant_noise = tuple(plan.noise_std / c for c in plan.clip_norms)
    if algo.name in ("dpsgd", "idp_sample", "idp_scale"):
        prep.mechanism = Clipped(sample_clip_norms=clip, noise_std=plan.noise_std)
    elif algo.name == "ino":
        prep.tail_length = resolve_tail_length(algo, float(np.sum(q * clip)))
        prep.mechanism = Importance(sample_clip_norms=clip, noise_std=plan.noise_std,
                                    tail_length=prep.tail_length, tif=build_tif(algo))
    else:  # dpsgd_s
        groups, n_groups = _groups(algo.group_by, dataset, tiers)
        prep.groups = groups
        sigma_b = algo.count_noise_std or default_count_noise_std(prep.expected_batch)
        z = plan.noise_multiplier
        if algo.private_quantile:
            try:
                z = accounting.adaptive_clipping_noise_multiplier(noise_multiplier=z, count_noise_std=sigma_b)
            except accounting.PlanError as e:
                raise ConfigError("algorithm.count_noise_std", str(e)) from None
        prep.info["gradient_noise_multiplier"] = z
        prep.info["count_noise_std"] = sigma_b if algo.private_quantile else None
        prep.accountant_noise = tuple(plan.noise_multiplier for _ in plan.clip_norms)
        prep.mechanism = GroupAdaptive(
            groups=groups, n_groups=n_groups, noise_multiplier=z,
            expected_group_batch=np.bincount(groups, weights=q, minlength=n_groups),
            initial=algo.initial_clip or config.clip_norm, tau=algo.tau, quantile=algo.quantile, ema=algo.ema,
            min_clip=algo.min_clip, private=algo.private_quantile, quantile_lr=algo.quantile_lr,
            count_noise_std=sigma_b)
    return prep


def _groups(group_by: str, dataset, tiers):
    if group_by == "tier":
        return tiers.train, len(tiers.epsilons)
    if group_by == "class":
        return dataset.y_train.numpy().astype(np.int64), dataset.num_classes
    attr = dataset.default_sensitive
    if attr is None:
        raise ConfigError("algorithm.group_by", f"{dataset.name} has no sensitive attribute to group by")
    _, inv = np.unique(np.asarray(dataset.sensitive_train[attr]).astype(str), return_inverse=True)
    return inv.astype(np.int64), int(inv.max()) + 1


# --- per-sample gradients ---------------------------------------------------------------------

def clipped_weighted_sum(grads, losses: torch.Tensor, clip_norms: np.ndarray, mechanism):
    """Σ ρ_i · g_i · min(1, C_i/‖g_i‖) from PerSampleGrads, and the unclipped per-sample norms."""
    norms_np = torch.sqrt(grads.sq_norms()).detach().cpu().numpy().astype(np.float64)
    rho = mechanism.weights(losses.detach().cpu().numpy(), clip_norms)
    scale = np.minimum(1.0, clip_norms / np.maximum(norms_np, 1e-12))
    coef = torch.as_tensor(rho * scale, dtype=losses.dtype, device=losses.device)
    return grads.weighted_sum(coef), norms_np, rho


def set_gradients(model, params, ps_grad, mech, x, y, batch_idx, *, expected_batch, noise_gen, rng) -> float:
    """Fill p.grad with this step's (private) gradient; returns the batch's mean train loss."""
    if len(batch_idx) and not mech.private:
        # Reference run: plain mean-loss backward, no per-sample work.
        loss = F.cross_entropy(model(x[batch_idx]), y[batch_idx], reduction="sum")
        (loss / expected_batch).backward()
        return float(loss.detach()) / len(batch_idx)
    summed = {k: torch.zeros_like(p) for k, p in params.items()}
    train_loss = float("nan")
    if len(batch_idx):
        idx_t = torch.as_tensor(batch_idx, device=x.device)
        grads, losses = ps_grad({k: p.detach() for k, p in params.items()}, x[idx_t], y[idx_t])
        summed, norms, _ = clipped_weighted_sum(grads, losses, mech.clip_norms(batch_idx), mech)
        train_loss = float(losses.mean())
        del grads  # per-sample gradients live for one batch only
    std = mech.noise_std()  # before observe(): this step's clip norms set the sensitivity
    for k, p in params.items():
        noise = torch.normal(0.0, std, size=p.shape, generator=noise_gen, device=p.device) if std > 0 else 0.0
        p.grad = (summed[k] + noise) / expected_batch
    if len(batch_idx):
        mech.observe(batch_idx, norms, rng)
    return train_loss


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
    rng = np.random.default_rng(config.seed)  # Poisson sampling and the quantile tracker's noise
    noise_gen = torch.Generator(device=device).manual_seed(config.seed + 1)
    optimizer = _optimizer(config, model)
    params = {k: p for k, p in model.named_parameters()}
    ps_grad = per_sample_grad_fn(model)
    accountant = None
    if prep.plan is not None:
        accountant = accounting.TierAccountant(sample_rates=list(prep.plan.sample_rates),
                                               noise_multiplier=prep.plan.noise_multiplier, delta=config.delta,
                                               noise_multipliers=list(prep.accountant_noise))
    eval_every = config.eval_every or max(1, prep.steps // 25)
    evaluator = _Evaluator(prep)
    plan_dict = _plan_dict(prep)
    if store is not None and run_id is not None:
        store.start_run(run_id, pid=os.getpid(), total_steps=prep.steps, plan=plan_dict)
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
    bar = _progress_bar(prep.steps, config.label) if progress else None
    for step in range(1, prep.steps + 1):
        if should_stop is not None and should_stop():
            raise Cancelled(f"stopped at step {step - 1}")
        batch_idx = np.flatnonzero(rng.random(n) < prep.sample_rates)
        optimizer.zero_grad(set_to_none=True)
        train_loss = set_gradients(model, params, ps_grad, mech, x_train, y_train, batch_idx,
                                   expected_batch=prep.expected_batch, noise_gen=noise_gen, rng=rng)
        optimizer.step()
        if accountant is not None:
            accountant.step()
        pending_steps.append((step, train_loss, len(batch_idx)))
        if bar is not None:
            bar.update(1)
        if step % eval_every == 0 or step == prep.steps:
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


def _plan_dict(prep: Prepared) -> dict:
    d = {"steps": prep.steps, "expected_batch_size": prep.expected_batch,
         "tier_names": list(prep.tiers.names), "tier_sizes": list(prep.tiers.sizes),
         "target_epsilons": list(prep.tiers.epsilons), "formal_dp": prep.mechanism.formal_dp,
         "tail_length": prep.tail_length, **prep.info}
    if prep.plan is not None:
        d.update(prep.plan.to_dict())
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
        spent = accountant.epsilons() if accountant is not None else [math.inf] * k
        for j, t in enumerate(tiers):
            t.update(name=prep.tiers.names[j], epsilon=prep.tiers.epsilons[j], epsilon_spent=float(spent[j]))
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
        "steps": prep.steps, "seconds": seconds, "formal_dp": prep.mechanism.formal_dp,
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
