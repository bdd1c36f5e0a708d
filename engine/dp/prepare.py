"""Everything fixed before step 1, in two parts that a dashboard run and the audit both use.

    prepare_data(config)                  device, dataset, tiers                        → PreparedData
    total_steps(config, n_train)          T = round(epochs · n_train / batch) (the audit: n_train = n/2)
    prepare_privacy(config, data, steps)  plan (per-tier q, C, σ) in the algorithm's planner mode, per-sample
                                          q_i and C_i, and what its registry entry fixes beyond the plan
                                          (engine.dp.algorithms: INO's tail length γ, DP-SGD-S's set-up,
                                          engine.dp.groups)                             → PrivacyPlan
    engine.dp.mechanisms.build_mechanism(privacy=…, members=…, device=…)   the step's mechanism

Planning failures (``accounting.PlanError``) become ``ConfigError`` in one place, ``accounting.plan_errors``
(used here as :func:`plan_errors`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from engine.config.run import MAX_TIERS, RunConfig
from engine.config.schema import ConfigError
from engine.data import load_dataset
from engine.data.user_table import load_user_table
from engine.dp import accounting
from engine.dp.accounting import plan_errors
from engine.dp.algorithms import Algorithm, algorithm
from engine.dp.groups import GroupClipSetup
from engine.dp.tiers import assign_tiers, column_tiers
from engine.models.nets import build_model


# --- data -------------------------------------------------------------------------------------

@dataclass
class PreparedData:
    config: RunConfig  # with tiers from a budget column made from the table (engine.dp.tiers.column_tiers)
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


def load_run_dataset(config: RunConfig):
    """The dataset ``config`` trains on: a registered one by ``data.name``, or a researcher's table ``data.file``
    (:func:`engine.data.user_table.load_user_table`, with the budget column ``tiers.column`` when the tiers come
    from it), subsampled by ``data.max_train``. A table's dataset carries its owners' budgets per row
    (``meta["budgets_train"]`` / ``["budgets_test"]``, what ``tiers.assign = "column"`` reads) and the file's
    sha256, size and resolved schema (``meta["table"]``, what the run records)."""
    data, tiers = config.data, config.tiers  # tiers None: an audit's own (never a column)
    if data.file is None:
        return load_dataset(data.name, data_dir=data.data_dir, seed=config.seed, max_train=data.max_train)
    table = data.schema_fields(tiers.column if tiers is not None and tiers.assign == "column" else None)
    loaded = load_user_table(table, max_tiers=MAX_TIERS, data_dir=data.data_dir).subsample(data.max_train,
                                                                                           config.seed)
    ds = loaded.dataset
    if loaded.budgets_train is not None:  # a copy: the loaded dataset is shared in-process
        ds = dataclasses.replace(ds, meta={**ds.meta, "budgets_train": loaded.budgets_train,
                                           "budgets_test": loaded.budgets_test})
    return ds


def prepare_data(config: RunConfig, *, dataset=None) -> PreparedData:
    """Validate ``config``, pick the device, load the data (unless ``dataset`` is given), check that the
    model fits it (``model.name``) and assign tiers. Tiers from a budget column are made from the table here:
    the returned ``config`` carries them (``tiers.tiers``: one per distinct budget or bin, its ε)."""
    config.validate()
    device = resolve_device(config.device)
    if dataset is None:
        dataset = load_run_dataset(config)
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        build_model(config.model, dataset.input_shape, dataset.num_classes)
    tiers = assign_tiers(config.tiers, dataset, seed=config.seed)
    if config.tiers.assign == "column" and not config.tiers.tiers:
        config = config.replace(tiers=column_tiers(config.tiers, dataset))
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

def make_plan(config: RunConfig, tier_sizes, steps: int):
    """The privacy plan (per-tier q, C, σ) this configuration trains with, in its algorithm's planner mode
    (``Algorithm.mode``, engine.dp.algorithms); None if it plans nothing (non-private)."""
    mode = algorithm(config.algorithm.name).mode(config.algorithm)
    if mode is None:
        return None
    if config.tiers.assign == "column" and not config.tiers.tiers:
        raise ConfigError("tiers", "tiers from a budget column are made when the table loads: plan the config "
                                   "prepare_data returns")
    with plan_errors("tiers", "no privacy plan: "):
        return accounting.plan(mode=mode, epsilons=[t.epsilon for t in config.tiers.tiers], delta=config.delta,
                               tier_sizes=list(tier_sizes), batch_size=config.batch_size,
                               clip_norm=config.clip_norm, steps=steps, accountant=config.accountant)


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
    clip_setup: GroupClipSetup | None  # the set-up of an algorithm whose clips move (DP-SGD-S, DPSGD-F, Global-Adapt)
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

    @property
    def entry(self) -> Algorithm:
        """Its algorithm's registry entry (engine.dp.algorithms): the mechanism ``build_mechanism`` builds."""
        return algorithm(self.algorithm.name)

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
        """What an algorithm with moving clips uses instead of the plan's noise std and clips (those are per step:
        ``state()``): its set-up's ``info()`` (engine.dp.groups.GroupClipSetup); {} for the others."""
        return {} if self.clip_setup is None else self.clip_setup.info()


def prepare_privacy(config: RunConfig, data: PreparedData, *, steps: int, tier_sizes=None,
                    group_attribute: str | None = None, field: str = "algorithm") -> PrivacyPlan:
    """Plan ``config``'s algorithm for ``tier_sizes`` (default: the data's tiers; the audit plans once
    for its expected half-size tiers) and derive the per-sample rates and clips, γ and DP-SGD-S's set-up.
    ``field``: the config path errors about the algorithm name (the audit: ``algorithms[k]``)."""
    if config.tiers.assign == "column" and not config.tiers.tiers:  # the table's tiers, made by prepare_data
        config = config.replace(tiers=data.config.tiers)
    algo = config.algorithm
    entry = algorithm(algo.name)
    sizes = list(data.tiers.sizes if tier_sizes is None else tier_sizes)
    plan = make_plan(config, sizes, steps)
    tier_of = np.asarray(data.tiers.train)
    if plan is None:
        q = min(1.0, config.batch_size / sum(sizes))
        return PrivacyPlan(algorithm=algo, plan=None, sample_rates=np.full(data.n_train, q), sample_clips=None,
                           expected_batch=float(config.batch_size), expected_clip_mass=None, tail_length=None,
                           clip_setup=None, formal_dp=False, formal_dp_reason=algo.no_formal_dp_reason)
    clip_setup = None
    if entry.setup is not None:  # what the algorithm fixes beyond the plan (DP-SGD-S: its groups, z_Δ, σ_b)
        plan, clip_setup = entry.setup(config, data, plan, tier_sizes=sizes, group_attribute=group_attribute, field=field)
    rates, clips = np.asarray(plan.sample_rates, dtype=float), np.asarray(plan.clip_norms, dtype=float)
    mass = float(np.sum(rates * clips * np.asarray(plan.tier_sizes, dtype=float)))
    reason = algo.no_formal_dp_reason
    return PrivacyPlan(algorithm=algo, plan=plan, sample_rates=rates[tier_of], sample_clips=clips[tier_of],
                       expected_batch=float(plan.expected_batch_size), expected_clip_mass=mass,
                       tail_length=entry.tail_length(algo, mass) if entry.tail_length is not None else None,
                       clip_setup=clip_setup, formal_dp=reason is None, formal_dp_reason=reason)
