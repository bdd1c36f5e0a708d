"""Everything fixed before step 1, in two parts that a dashboard run and the audit both use.

    prepare_data(config)                  device, dataset, tiers                        → PreparedData
    total_steps(config, n_train)          T = round(epochs · n_train / batch) (the audit: n_train = n/2)
    prepare_privacy(config, data, steps)  plan (per-tier q, C, σ), per-sample q_i and C_i, the INO tail
                                          length γ (fixed once), the DP-SGD-S set-up     → PrivacyPlan
    engine.dp.mechanisms.build_mechanism(privacy=…, members=…, device=…)   the step's mechanism

Planning failures (``accounting.PlanError``) become ``ConfigError`` in one place, :func:`plan_errors`.
"""
from __future__ import annotations

import secrets
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from engine.config.run import RunConfig
from engine.config.schema import ConfigError
from engine.data import load_dataset
from engine.dp import accounting
from engine.dp.importance import resolve_tail_length
from engine.dp.mechanisms import default_count_noise_std
from engine.dp.tiers import assign_tiers
from engine.models.nets import build_model

PLAN_MODES = {"dpsgd": "dpsgd", "idp_sample": "sample", "idp_scale": "scale", "dpsgd_s": "dpsgd"}


# --- data -------------------------------------------------------------------------------------

@dataclass
class PreparedData:
    config: RunConfig
    device: torch.device
    dataset: object
    tiers: object  # engine.dp.tiers.TierAssignment

    @property
    def n_train(self) -> int:
        return int(len(self.dataset.y_train))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "CUDA was requested but no GPU is available")
    return torch.device(name)


def prepare_data(config: RunConfig, *, dataset=None) -> PreparedData:
    """Validate ``config``, pick the device, load the data (unless ``dataset`` is given), check that the
    model fits it (``model.name``) and assign tiers."""
    config.validate()
    device = resolve_device(config.device)
    if dataset is None:
        dataset = load_dataset(config.data.name, data_dir=config.data.data_dir, seed=config.seed,
                               max_train=config.data.max_train)
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        build_model(config.model, dataset.input_shape, dataset.num_classes)
    tiers = assign_tiers(config.tiers, dataset, seed=config.seed)
    return PreparedData(config=config, device=device, dataset=dataset, tiers=tiers)


def seeded_model(model_cfg, input_shape, num_classes: int, seed: int) -> torch.nn.Module:
    """The model a run with this seed starts from: ``torch.manual_seed(seed)`` then ``build_model``
    (seeding only the CPU generator: re-seeding every accelerator costs ~0.6 ms a call)."""
    torch.random.default_generator.manual_seed(int(seed))
    return build_model(model_cfg, tuple(input_shape), num_classes)


def total_steps(config, n_train: float) -> int:
    """T = round(epochs · n_train / batch_size), at least 1 (``engine.config.run.total_steps``), refused over the
    work cap unless ``config.allow_large`` (``RunConfig.planned_steps``)."""
    return config.planned_steps(n_train)


# --- privacy ----------------------------------------------------------------------------------

@contextmanager
def plan_errors(field: str, prefix: str = ""):
    """Inside the block, ``accounting.PlanError`` becomes ``ConfigError(field, prefix + message)``."""
    try:
        yield
    except accounting.PlanError as e:
        raise ConfigError(field, f"{prefix}{e}") from None


def make_plan(config: RunConfig, tier_sizes, steps: int):
    """The privacy plan (per-tier q, C, σ) this configuration trains with; None if non-private."""
    algo = config.algorithm.name
    if algo == "nonprivate":
        return None
    mode = config.algorithm.idp_mode if algo == "ino" else PLAN_MODES[algo]
    with plan_errors("tiers", "no privacy plan: "):
        return accounting.plan(mode=mode, epsilons=[t.epsilon for t in config.tiers.tiers], delta=config.delta,
                               tier_sizes=list(tier_sizes), batch_size=config.batch_size,
                               clip_norm=config.clip_norm, steps=steps, accountant=config.accountant)


@dataclass
class GroupClipSetup:
    """DP-SGD-S: clip groups, the public group sizes that normalise the counts, and the noise of its
    releases (the gradient sum, the clipped counts, once: the group sizes unless declared)."""

    groups: np.ndarray  # group index per training sample
    group_names: list
    noise_multiplier: float  # gradient noise multiplier: z_Δ (private quantile) or the plan's z
    count_noise_std: float  # σ_b of the clipped-count release
    initial_clip: float
    base_clip: float  # the run's clip_norm C: C_k = C · clamp(τ S_k / S̄, c_min, c_max)
    group_sizes: np.ndarray  # (K,) public sizes: declared, or released with noise (float)
    group_size_source: str  # "declared" | "released"
    group_size_noise_std: float | None  # σ of the one-off release (None: declared)
    expected_group_batch: np.ndarray  # (K,) public expected count of group k in one model's batch
    dpsgd_noise_multiplier: float  # σ of plain DP-SGD at the same ε (its plan before the releases raise it):
    #                                DP-SGD adds σ·C, DP-SGD-S z_Δ · max_k C_k (engine.train.records.GroupClipPlan)


@dataclass
class PrivacyPlan:
    """The plan and what is derived from it, fixed before step 1."""

    algorithm: object  # AlgorithmConfig
    plan: accounting.Plan | None  # None: non-private
    sample_rates: np.ndarray  # q_i per training sample
    sample_clips: np.ndarray | None  # C_i per training sample
    expected_batch: float  # Σ q_k N_k over the planned tier sizes
    expected_clip_mass: float | None  # Σ q_k C_k N_k (INO-SGD's γ is a fraction of it)
    tail_length: float | None  # INO-SGD's γ, absolute clip-mass units
    dpsgd_s: GroupClipSetup | None
    formal_dp: bool
    formal_dp_reason: str | None = None  # why there is no formal guarantee (None: there is one)

    @property
    def accountant_noise(self) -> tuple | None:
        """Per-tier noise multiplier for the accountant (``Plan.noise_multipliers``)."""
        return None if self.plan is None else tuple(self.plan.noise_multipliers)

    @property
    def accountant_releases(self) -> tuple:
        """Noise multipliers of the one-off releases composed with the steps (``Plan.release_noise_multipliers``)."""
        return () if self.plan is None else tuple(self.plan.release_noise_multipliers)

    def accountant(self, delta: float):
        """The live per-tier accountant of this plan; None without a formal guarantee (nothing to account)."""
        if self.plan is None or not self.formal_dp:
            return None
        return accounting.TierAccountant(sample_rates=list(self.plan.sample_rates),
                                         noise_multiplier=self.plan.noise_multiplier, delta=delta,
                                         noise_multipliers=list(self.accountant_noise),
                                         releases=self.accountant_releases, accountant=self.plan.accountant)

    @property
    def info(self) -> dict:
        """What DP-SGD-S uses instead of the plan's noise std and clip (those are per step: ``state()``)."""
        s = self.dpsgd_s
        if s is None:
            return {}
        a = self.algorithm
        private_counts = a.clip_rule == "quantile" and a.private_quantile
        return {"gradient_noise_multiplier": s.noise_multiplier, "dpsgd_noise_multiplier": s.dpsgd_noise_multiplier,
                "count_noise_std": s.count_noise_std if private_counts else None,
                "clip_rule": a.clip_rule, "base_clip": s.base_clip, "c_min": a.c_min, "c_max": a.c_max,
                "clip_groups": list(s.group_names), "group_sizes": [float(v) for v in s.group_sizes],
                "group_size_source": s.group_size_source, "group_size_noise_std": s.group_size_noise_std,
                "expected_group_batch": [float(v) for v in s.expected_group_batch]}


def prepare_privacy(config: RunConfig, data: PreparedData, *, steps: int, tier_sizes=None,
                    group_attribute: str | None = None, field: str = "algorithm") -> PrivacyPlan:
    """Plan ``config``'s algorithm for ``tier_sizes`` (default: the data's tiers; the audit plans once
    for its expected half-size tiers) and derive the per-sample rates and clips, γ and DP-SGD-S's set-up.
    ``field``: the config path errors about the algorithm name (the audit: ``algorithms[k]``)."""
    algo = config.algorithm
    sizes = list(data.tiers.sizes if tier_sizes is None else tier_sizes)
    plan = make_plan(config, sizes, steps)
    tier_of = np.asarray(data.tiers.train)
    if plan is None:
        q = min(1.0, config.batch_size / sum(sizes))
        return PrivacyPlan(algorithm=algo, plan=None, sample_rates=np.full(data.n_train, q), sample_clips=None,
                           expected_batch=float(config.batch_size), expected_clip_mass=None, tail_length=None,
                           dpsgd_s=None, formal_dp=False, formal_dp_reason=algo.no_formal_dp_reason)
    dpsgd_s = None
    if algo.name == "dpsgd_s":
        plan, dpsgd_s = group_clip_setup(config, data, plan, tier_sizes=sizes, group_attribute=group_attribute,
                                         field=field)
    rates, clips = np.asarray(plan.sample_rates, dtype=float), np.asarray(plan.clip_norms, dtype=float)
    mass = float(np.sum(rates * clips * np.asarray(plan.tier_sizes, dtype=float)))
    reason = algo.no_formal_dp_reason
    return PrivacyPlan(algorithm=algo, plan=plan, sample_rates=rates[tier_of], sample_clips=clips[tier_of],
                       expected_batch=float(plan.expected_batch_size), expected_clip_mass=mass,
                       tail_length=resolve_tail_length(algo, mass) if algo.name == "ino" else None,
                       dpsgd_s=dpsgd_s, formal_dp=reason is None, formal_dp_reason=reason)


def group_clip_setup(config: RunConfig, data: PreparedData, plan, *, tier_sizes, group_attribute=None,
                     field: str = "algorithm"):
    """DP-SGD-S's set-up (runs and audits): its groups; the public group sizes (declared in
    ``group_sizes``, else released once with Gaussian noise of std σ_N and composed into the plan, whose
    noise multiplier is raised so the total still meets ε); each group's public expected per-step count
    q · N_k · (planned size / training-set size) — refused below 1 —; z_Δ (Andrew et al. 2021) and the
    count noise σ_b (default: max(expected batch / 20, 1.64 z, 1), so z_Δ ≤ 1.05 z). ``plan`` is plain DP-SGD's
    plan at the same ε: its noise multiplier σ is kept (``dpsgd_noise_multiplier``), the yardstick of DP-SGD-S's
    noise. Returns (the plan it trains with, the set-up)."""
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
                                dpsgd_noise_multiplier=dpsgd_sigma)


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
