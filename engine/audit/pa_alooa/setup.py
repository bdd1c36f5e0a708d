"""An audit's set-up, everything fixed before the first model trains: the data, tiers and GPR groups, the
complementary membership (2R models), each algorithm's privacy plan for the half-size tiers, the chunk size.

    prepare_audit(config)   → AuditSetup (one AlgoSetup per algorithm; DP-SGD-S's controls stand in as DP-SGD)
    preview_audit(config)   what the audit will do, for the page before launching (with the runtime estimate)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from engine.audit.pa_alooa.controls import plan as controls
from engine.audit.pa_alooa.analysis import plan_table
from engine.audit.pa_alooa.chunks import CACHE_TARGET_BYTES, DEFAULT_BUDGET_BYTES, chunk_step_bytes, models_per_chunk
from engine.audit.pa_alooa.config import AuditConfig
from engine.audit.pa_alooa.design import complementary_membership, group_labels, group_sizes, resolved_tiers
from engine.audit.pa_alooa.estimate import estimate_runtime
from engine.config.job import algorithm_keys
from engine.config.run import MAX_AUDIT_MODEL_STEPS, AlgorithmConfig, check_work
from engine.config.schema import ConfigError
from engine.dp.algorithms import algorithm
from engine.dp.prepare import PrivacyPlan, load_run_dataset, prepare_data, prepare_privacy, total_steps


# ================================================================================================
# preparation (everything fixed before the first model trains)
# ================================================================================================

@dataclass
class AlgoSetup:
    key: str
    algo: AlgorithmConfig
    label: str
    privacy: PrivacyPlan  # engine.dp.prepare's plan and what derives from it (the same as a run's)
    claimed: list  # per tier: ε the plan guarantees (None when non-private)
    control: str | None = None  # a control of DP-SGD-S (engine.audit.pa_alooa.controls.plan.KINDS)
    # a control is planned once DP-SGD-S has trained (until then ``privacy`` is DP-SGD's, for the estimate only)
    resolved: bool = True
    control_info: object = None  # the ControlInfo of a resolved control

    plan = property(lambda self: self.privacy.plan)
    sample_rates = property(lambda self: self.privacy.sample_rates)  # per training sample
    formal_dp = property(lambda self: self.privacy.formal_dp)
    info = property(lambda self: self.privacy.info)


@dataclass
class AuditSetup:
    config: AuditConfig
    dataset: object
    tiers: object
    groups: np.ndarray  # GPR group label (str) per training sample
    group_names: list
    test_groups: np.ndarray | None
    membership: np.ndarray  # (2R, n) bool: config.R complementary pairs (design.complementary_membership)
    steps: int
    half_tier_sizes: list
    algos: list
    device: torch.device
    chunk_models: int
    budget_bytes: int
    data: object = None  # engine.dp.prepare.PreparedData (the controls plan with it)
    tiers_config: object = None  # the resolved TiersConfig
    chunk_bytes: int = 0  # one chunk's step working set (engine.audit.pa_alooa.chunks.chunk_step_bytes)

    @property
    def n(self) -> int:
        return int(self.membership.shape[1])

    @property
    def n_models(self) -> int:
        return self.config.n_models  # 2R (the membership matrix has one row per model)


def prepare_audit(config: AuditConfig) -> AuditSetup:
    """Validate with the data and plan every algorithm; raises ConfigError (or DataError)."""
    config.validate()
    run = config.run
    ds = load_run_dataset(run)
    n = len(ds.y_train)
    if n < 8:
        raise ConfigError("run.data.max_train", f"an audit needs at least 8 training samples, got {n}")
    half = n / 2
    if run.batch_size > n // 2:
        raise ConfigError("run.batch_size", f"must be at most half the training set ({n // 2}) since each model "
                                        f"trains on one half, got {run.batch_size}")
    tiers_cfg = resolved_tiers(config, ds)
    try:  # a run's preparation: device, the model fits the data, tiers (the audit's own tiers when not set)
        data = prepare_data(run.replace(tiers=tiers_cfg), dataset=ds)
    except ConfigError as e:
        if run.tiers is None and e.field.startswith("tiers"):
            raise ConfigError("epsilon", e.message) from None
        raise e.under("run.") from None
    device, tiers, model_cfg = data.device, data.tiers, run.model
    groups, group_names, test_groups = group_labels(config, ds, tiers, config.group_by, "group_by")
    try:
        steps = total_steps(run, half)
    except ConfigError as e:
        raise e.under("run.") from None
    looa = (config.looa_k + 1) * config.looa_models if config.looa_k else 0
    n_algos = len(config.algorithms) + (len(controls.KINDS) if config.controls else 0)
    pilot = controls.max_pilot_runs() * controls.pilot_models(config.n_models) if config.controls else 0
    check_work(((config.n_models + looa) * n_algos + pilot) * steps, "R", limit=MAX_AUDIT_MODEL_STEPS,
               allow_large=run.allow_large, what="model-steps")
    half_sizes = [max(1, int(round(s / 2))) for s in tiers.sizes]
    membership = complementary_membership(n, config.R, seed=run.seed)
    algos = []
    for k, (key, algo) in enumerate(zip(algorithm_keys(config), config.algorithms)):
        algos.append(_algo_setup(config, k, key, algo, tiers_cfg, data, steps, half_sizes))
    if config.controls:  # planned after DP-SGD-S has trained (resolve_control); DP-SGD's plan stands in until then
        dpsgd = next(a for a in algos if a.algo.name == controls.ALGORITHM.name)
        for kind in controls.KINDS:
            algos.append(dataclasses.replace(dpsgd, key=controls.KEYS[kind], algo=controls.ALGORITHM,
                                             label=controls.LABELS[kind], control=kind, resolved=False))
    budget = int(config.memory_budget_gib * (1 << 30)) if config.memory_budget_gib else DEFAULT_BUDGET_BYTES
    expected_batch = max(a.plan.expected_batch_size if a.plan is not None else run.batch_size for a in algos)
    on_cpu = device.type == "cpu"  # CPU: cache-sized chunks; GPU: as many models as the budget holds
    chunk = config.chunk_models or models_per_chunk(
        model_cfg, ds.input_shape, ds.num_classes, expected_batch, budget_bytes=budget, cap=200 if on_cpu else 400,
        cache_bytes=CACHE_TARGET_BYTES if on_cpu else None)
    chunk_bytes = chunk_step_bytes(model_cfg, ds.input_shape, ds.num_classes, expected_batch,
                                   min(int(chunk), len(membership)))
    return AuditSetup(config=config, dataset=ds, tiers=tiers, groups=groups, group_names=group_names,
                      test_groups=test_groups, membership=membership, steps=steps, half_tier_sizes=half_sizes,
                      algos=algos, device=device, chunk_models=int(chunk), budget_bytes=budget, data=data,
                      tiers_config=tiers_cfg, chunk_bytes=chunk_bytes)


def _algo_setup(config, k, key, algo, tiers_cfg, data, steps, half_sizes, *, label=None) -> AlgoSetup:
    """One algorithm's privacy preparation: engine.dp.prepare's, planned once for the half-size tiers."""
    field_prefix = f"algorithms[{k}]"
    label = algorithm(algo.name).label_for(algo, label)  # INO-SGD's names a TIF or planner other than the paper's
    rc = config.run_for(algo, tiers_cfg)
    try:
        privacy = prepare_privacy(rc, data, steps=steps, tier_sizes=half_sizes, group_attribute=config.group_attribute,
                                  field=field_prefix)
    except ConfigError as e:
        if e.field.startswith(field_prefix):
            raise
        raise ConfigError(f"run.{e.field}", f"{field_prefix} ({algo.name}): {e.message}") from None
    formal = privacy.plan is not None and privacy.formal_dp
    claimed = [float(e) for e in privacy.plan.epsilons] if formal else [None] * len(data.tiers.epsilons)
    if privacy.plan is not None and not privacy.formal_dp:
        label += " (no formal DP)"  # the why: the report's info (formal_dp_reason)
    return AlgoSetup(key=key, algo=algo, label=label, privacy=privacy, claimed=claimed)


def preview_audit(config: AuditConfig, *, estimate: bool = False) -> dict:
    """What an audit will do (for the UI before launching): sizes, groups, per-algorithm plans; with
    ``estimate`` also the runtime estimate (``engine.audit.pa_alooa.estimate``: a few measured steps)."""
    s = prepare_audit(config)
    out = {"n_train": s.n, "n_models": s.n_models, "steps_per_model": s.steps, "chunk_models": s.chunk_models,
           "group_names": s.group_names, "group_sizes": group_sizes(s.groups, s.group_names),
           "tier_names": list(s.tiers.names), "tier_sizes": list(s.tiers.sizes), "device": str(s.device),
           "looa_models": (config.looa_k + 1) * config.looa_models if config.looa_k else 0, "algorithms": []}
    for a in s.algos:  # a control is planned from what DP-SGD-S realises: no plan before the audit runs
        out["algorithms"].append({"key": a.key, "label": a.label, "formal_dp": a.formal_dp,
                                  "plan": plan_table(s, a) if a.resolved else None,
                                  **({"control": a.control} if a.control is not None else {})})
    if estimate:
        out["estimate"] = estimate_runtime(s)
    return out
