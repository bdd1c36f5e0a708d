"""The TIF explorer's compute: a Poisson-sampled batch (no DP training), each item's clip-mass interval
and weight ρ, the per-tier summary, and the BIF curve the explorer draws. Weights, BIF and γ come from
the one implementation each (:mod:`engine.dp.importance`, :func:`engine.dp.importance.resolve_tail_length`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from engine.config.run import AlgorithmConfig, RunConfig
from engine.config.schema import ConfigError
from engine.dp.importance import weights_from_order
from engine.dp.prepare import make_plan, total_steps
from engine.dp.tiers import assign_tiers


def explorer_batch(losses, clip_norms, tiers, tier_names, tier_epsilons, *, tif, tail_length: float) -> pd.DataFrame:
    """One row per batch item, in loss order: its clip-mass interval on [0, Γ] and its weight ρ."""
    losses = np.asarray(losses, dtype=float)
    clip = np.asarray(clip_norms, dtype=float)
    tiers = np.asarray(tiers, dtype=int)
    order = np.argsort(losses, kind="stable")
    rho = weights_from_order(order, clip, tif, tail_length)
    ends = np.cumsum(clip[order])
    starts = ends - clip[order]
    rank_order = np.argsort([tier_epsilons[k] for k in range(len(tier_names))], kind="stable")
    tier_rank = {int(k): r for r, k in enumerate(rank_order)}
    return pd.DataFrame({
        "rank": np.arange(len(order)), "item": order, "loss": losses[order], "clip_norm": clip[order],
        "mass_start": starts, "mass_end": ends, "mass_center": (starts + ends) / 2, "rho": rho[order],
        "tier": [tier_names[t] for t in tiers[order]], "tier_index": [tier_rank[int(t)] for t in tiers[order]],
        "epsilon": [tier_epsilons[t] for t in tiers[order]],
    })


def explorer_tier_table(batch: pd.DataFrame) -> pd.DataFrame:
    if batch.empty:
        return pd.DataFrame(columns=["tier", "tier_index", "epsilon", "items", "mean_rho", "dropped_mass"])
    b = batch.assign(dropped=(1 - batch["rho"]) * batch["clip_norm"])
    g = b.groupby(["tier", "tier_index", "epsilon"], sort=False).agg(items=("rho", "size"), mean_rho=("rho", "mean"),
                                                                    dropped_mass=("dropped", "sum")).reset_index()
    return g.sort_values("tier_index").reset_index(drop=True)


def explorer_sample(dataset, tiers_cfg, *, batch_size: int = 64, seed: int = 0, mode: str = "sample",
                    delta: float = 1e-5, clip_norm: float = 1.0, epochs: float = 3.0, ref_samples: int = 2000) -> dict:
    """A Poisson-sampled batch for the TIF explorer (no DP training involved).

    Per-tier sampling rates and clip norms come from the IDP-SGD plan (``mode`` "sample" or "scale")
    for these tiers; per-sample losses come from a deliberately under-fitted logistic regression on a
    subsample (a stand-in for an early-training model: easy items have low loss, hard ones high).
    Returns numpy arrays and the expected batch clip mass Σ_n q_n N_n C_n (the unit of γ).
    """
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    tiers = assign_tiers(tiers_cfg, dataset, seed=seed)
    n = len(dataset.y_train)
    if batch_size > n:
        raise ConfigError("batch_size", f"must be at most the training set size {n}, got {batch_size}")
    # the plan a run of these tiers would train with: the run's step count (and its work cap) and planner
    config = RunConfig(tiers=tiers_cfg, algorithm=AlgorithmConfig(name=f"idp_{mode}"), epochs=epochs,
                       batch_size=batch_size, delta=delta, clip_norm=clip_norm, seed=seed)
    steps = total_steps(config, n)
    plan = make_plan(config, tiers.sizes, steps)
    rng = np.random.default_rng(seed)
    q_all = np.asarray(plan.sample_rates)[tiers.train]
    c_all = np.asarray(plan.clip_norms)[tiers.train]
    idx = np.flatnonzero(rng.random(n) < q_all)
    x = dataset.x_train.reshape(n, -1).numpy()
    y = dataset.y_train.numpy()
    sub = rng.choice(n, size=min(n, ref_samples), replace=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = LogisticRegression(max_iter=8).fit(x[sub], y[sub])
    proba = np.full((len(idx), dataset.num_classes), 1e-3)
    if len(idx):
        proba[:, clf.classes_] = clf.predict_proba(x[idx])
    losses = -np.log(np.clip(proba[np.arange(len(idx)), y[idx]], 1e-12, 1.0)) if len(idx) else np.zeros(0)
    return {"losses": losses, "clip_norms": c_all[idx], "tiers": tiers.train[idx], "tier_names": list(tiers.names),
            "tier_epsilons": list(tiers.epsilons), "expected_clip_mass": float(np.sum(q_all * c_all)),
            "expected_batch": float(plan.expected_batch_size), "sample_rates": list(plan.sample_rates),
            "clip_norms_per_tier": list(plan.clip_norms), "steps": steps, "batch_indices": idx}
