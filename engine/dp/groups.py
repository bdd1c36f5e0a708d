"""Groups of samples: the one grouping (by tier, class or a sensitive attribute) and DP-SGD-S's set-up on it.

    sample_groups(group_by, dataset, tiers)   group index per training (and test) sample, the group names: DP-SGD-S's
                                              clip groups and the audit's GPR groups are both this
    group_clip_setup(config, data, plan, …)   DP-SGD-S's set-up before step 1 (its registry entry's ``setup``,
                                              engine.dp.algorithms): groups, public group sizes, z_Δ, σ_b
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from engine.config.run import RunConfig
from engine.config.schema import ConfigError
from engine.dp import accounting
from engine.dp.accounting import plan_errors
from engine.dp.mechanisms import default_count_noise_std


@dataclass
class GroupClipSetup:
    """What an algorithm with moving clips fixes before step 1 beyond the plan (``PrivacyPlan.clip_setup``; DP-SGD-S,
    DPSGD-F, DPSGD-Global-Adapt): its clip groups, the public sizes that normalise its counts, and the noise of
    its releases (the gradient sum, the per-step counts, once: DP-SGD-S's group sizes unless declared)."""

    groups: np.ndarray | None  # group index per training sample (None: one clip for every sample)
    group_names: list
    noise_multiplier: float  # gradient noise multiplier after the count releases (z_Δ), or the plan's z
    count_noise_std: float  # σ_b of the per-step count release
    initial_clip: float
    base_clip: float  # the run's clip_norm C (DP-SGD-S: C_k = C · clamp(τ S_k / S̄, c_min, c_max))
    group_sizes: np.ndarray  # (K,) public sizes: declared, or released with noise (float)
    group_size_source: str  # "declared" | "released" | "planned" (the plan's public tier sizes)
    group_size_noise_std: float | None  # σ of the one-off release (None: declared)
    expected_group_batch: np.ndarray  # (K,) public expected count of group k in one model's batch
    dpsgd_noise_multiplier: float  # σ of plain DP-SGD at the same ε (its plan before the releases raise it):
    #                                DP-SGD adds σ·C, DP-SGD-S z_Δ · max_k C_k (engine.train.records.GroupClipPlan)
    clip_rule: str = "quantile"  # how the clips move: DP-SGD-S's "quantile" | "reference"; "bias"; "global"
    c_min: float | None = None  # the clips' range relative to C (None: unbounded on that side)
    c_max: float | None = None
    private_counts: bool = True  # the counts the clips move on are released with noise (False: no formal DP)
    largest_contribution: float | None = None  # the largest norm one sample's term can have (None: c_max · C)

    @property
    def largest_clip(self) -> float:
        """The largest norm one sample's weighted, clipped gradient can reach in any step (the one-run audit's
        gradient canaries are at least this long)."""
        if self.largest_contribution is not None:
            return float(self.largest_contribution)
        return float(self.c_max) * self.base_clip

    def info(self) -> dict:
        """The set-up as a run record's ``GroupClipPlan`` (``engine.train.records``) reads it."""
        return {"gradient_noise_multiplier": self.noise_multiplier,
                "dpsgd_noise_multiplier": self.dpsgd_noise_multiplier,
                "count_noise_std": self.count_noise_std if self.private_counts else None,
                "clip_rule": self.clip_rule, "base_clip": self.base_clip, "c_min": self.c_min, "c_max": self.c_max,
                "clip_groups": list(self.group_names), "group_sizes": [float(v) for v in self.group_sizes],
                "group_size_source": self.group_size_source, "group_size_noise_std": self.group_size_noise_std,
                "expected_group_batch": [float(v) for v in self.expected_group_batch]}


def group_clip_setup(config: RunConfig, data, plan, *, tier_sizes, group_attribute=None, field: str = "algorithm"):
    """DP-SGD-S's set-up (runs and audits): its groups; the public group sizes (declared in
    ``group_sizes``, else released once with Gaussian noise of std σ_N and composed into the plan, whose
    noise multiplier is raised so the total still meets ε); each group's public expected per-step count
    q · N_k · (planned size / training-set size) — refused below 1 —; z_Δ (Andrew et al. 2021) and the
    count noise σ_b (default: max(expected batch / 20, 1.64 z, 1), so z_Δ ≤ 1.05 z). ``plan`` is plain DP-SGD's
    plan at the same ε: its noise multiplier σ is kept (``dpsgd_noise_multiplier``), the yardstick of DP-SGD-S's
    noise. ``data``: the run's ``engine.dp.prepare.PreparedData``. Returns (the plan it trains with, the set-up)."""
    algo = config.algorithm
    dpsgd_sigma = float(plan.noise_multiplier)  # before plan_with_release raises it
    groups, names, _ = sample_groups(algo.group_by, data.dataset, data.tiers, attribute=group_attribute,
                                     field=f"{field}.group_by")
    if algo.group_sizes is not None:
        if len(algo.group_sizes) != len(names):
            raise ConfigError(f"{field}.group_sizes", f"needs one size per group ({len(names)}: "
                                                       f"{', '.join(names[:20])}), got {len(algo.group_sizes)}")
        public, source, sigma_n = np.asarray(algo.group_sizes, dtype=float), "declared", None
    else:
        q0, steps = float(plan.sample_rates[0]), int(plan.steps)
        sigma_n = float(algo.group_size_noise_std or accounting.release_noise_multiplier_default(
            noise_multiplier=plan.noise_multiplier, sample_rate=q0, steps=steps))
        with plan_errors(f"{field}.group_size_noise_std"):
            plan = accounting.plan_with_release(plan, sigma_n)
        exact = np.bincount(groups, minlength=len(names)).astype(float)
        rng = np.random.default_rng(secrets.randbits(63) if config.secure_rng else [int(config.seed), 0x5e7])
        public, source = exact + sigma_n * rng.standard_normal(len(names)), "released"
    share = float(sum(tier_sizes)) / float(len(groups))  # the audit trains each model on about half the data
    expected = float(plan.sample_rates[0]) * share * public
    for name, e, size in zip(names, expected, public):
        if not e >= 1.0:
            raise ConfigError(f"{field}.group_by", f"group {name!r} expects {e:.3g} samples per step (< 1; "
                                                   f"{source} size {size:.4g}): too small "
                                                   f"to track its clip; group differently or raise batch_size")
    sigma_b = algo.count_noise_std or default_count_noise_std(float(plan.expected_batch_size), plan.noise_multiplier)
    z = plan.noise_multiplier
    if algo.private_quantile and algo.clip_rule == "quantile":
        with plan_errors(f"{field}.count_noise_std"):
            z = accounting.adaptive_clipping_noise_multiplier(noise_multiplier=z, count_noise_std=sigma_b)
    return plan, GroupClipSetup(groups=groups, group_names=names, noise_multiplier=float(z),
                                count_noise_std=float(sigma_b), initial_clip=float(algo.initial_clip or config.clip_norm),
                                base_clip=float(config.clip_norm), group_sizes=public, group_size_source=source,
                                group_size_noise_std=sigma_n, expected_group_batch=expected,
                                dpsgd_noise_multiplier=dpsgd_sigma, clip_rule=algo.clip_rule, c_min=float(algo.c_min),
                                c_max=float(algo.c_max),
                                private_counts=algo.clip_rule == "quantile" and bool(algo.private_quantile))


def sample_groups(group_by: str, dataset, tiers, *, attribute: str | None = None, field: str = "algorithm.group_by"):
    """The one grouping of samples by "tier", "class" or "attribute" (the dataset's default sensitive attribute
    unless ``attribute`` names one; values sorted): (group index per training sample, group names, group index
    per test sample or None when the test set has no such label; −1 for a test sample in no group). DP-SGD-S's
    clip groups and the audit's GPR groups are both this."""
    if group_by == "tier":
        test = None if tiers.test is None else np.asarray(tiers.test, dtype=np.int64)
        return np.asarray(tiers.train, dtype=np.int64), list(tiers.names), test
    if group_by == "class":
        return (dataset.y_train.numpy().astype(np.int64), [str(c) for c in dataset.class_names],
                dataset.y_test.numpy().astype(np.int64))
    names, inv = np.unique(sensitive_values(dataset, attribute, field), return_inverse=True)
    names = [str(v) for v in names]
    attr = attribute or dataset.default_sensitive
    test = None
    if attr in dataset.sensitive_test:
        place = {v: k for k, v in enumerate(names)}
        test = np.array([place.get(v, -1) for v in np.asarray(dataset.sensitive_test[attr]).astype(str)], dtype=np.int64)
    return inv.astype(np.int64), names, test


def sensitive_values(ds, attribute: str | None, field: str) -> np.ndarray:
    """The training samples' values (str) of ``attribute`` (None: the dataset's default sensitive attribute);
    ConfigError naming ``field`` when the dataset has no such attribute."""
    attr = attribute or ds.default_sensitive
    if attr is None or attr not in ds.sensitive_train:
        known = ", ".join(ds.sensitive_train) or "none"
        raise ConfigError(field, f"{ds.name} has no sensitive attribute {attr!r} to group by; known: {known}")
    return np.asarray(ds.sensitive_train[attr]).astype(str)
