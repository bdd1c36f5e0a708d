"""The PA-ALOOA privacy audit: configuration, batched model training, statistics, checkpoints.

    AuditConfig             one frozen configuration (JSON round-trip, ConfigError naming the field)
    prepare_audit(config)   data, tiers, groups, membership, per-algorithm plans — what the audit will do
    run_audit(config, ...)  train every algorithm's 2R models (+ PA-LOOA models) as batched ensembles,
                            score every training sample under every model, compute the statistics
    run_audit_in_store      the worker entry point (``python -m engine worker RUN_ID`` for kind "audit")
    cli_audit               ``python -m engine audit CONFIG.json [--json]``

Method. For r = 1..R the training set is split into two complementary random halves; model 2r
trains on one, model 2r+1 on the other (``stats.complementary_membership``), with each
algorithm and the same tiers. Every sample is a member of exactly R of the 2R models. Each
sample's score under a model is −loss. Per-sample advantage, GPR per group with bootstrap CIs,
Δ, the permutation null floor, the PA-GA / PA-GBA / PA-LOOA baselines, LiRA and the per-tier
empirical ε lower bound all come from ``engine.audit.stats``.

Training semantics are ``engine.train``'s: per-tier sampling rates and clip norms from
``engine.train.make_plan`` (planned once for the expected half-size tiers — a tier's ε depends
only on its q, σ and T, so every model meets its tier's claimed ε exactly), Poisson batches,
noise N(0, noise_std²), division by the model's expected batch Σ q_i over its members, plain SGD.
T = round(epochs · (n/2) / batch_size) steps per model.

Checkpoints. With a store, each finished chunk of models writes its per-sample losses and
confidences as an artifact (``chunk/<algorithm>/<kind>/<chunk>``, ``.npz``); re-running the same
run id skips every chunk already there. Every chunk has its own seeds, so a resumed audit gives
exactly the results of an uninterrupted one.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from engine import accounting
from engine.config import (ALGORITHM_LABELS, ALGORITHMS, DEVICES, GROUP_BY, AlgorithmConfig, ConfigError, DataConfig,
                           ModelConfig, OptimizerConfig, RunConfig, TierConfig, TiersConfig, check_int,
                           check_positive, parse_config_json, read_config_text)
from engine.audit import stats
from engine.audit.ensemble import (CACHE_TARGET_BYTES, DEFAULT_BUDGET_BYTES, BatchedClipped, BatchedGroupAdaptive,
                                   BatchedImportance, BatchedNonPrivate, Ensemble, PoissonSampler, models_per_chunk,
                                   per_model_step_bytes, train_ensemble)
from engine.mechanisms import build_tif, default_count_noise_std, resolve_tail_length
from engine.train import Cancelled, make_plan, sigterm_cancels

AUDIT_MODELS = ("lr", "mlp", "cnn")
THRESHOLDS = ("in_sample", "held_out")
DEFAULT_ALGORITHMS = (
    AlgorithmConfig(name="idp_sample"),
    AlgorithmConfig(name="ino"),
    AlgorithmConfig(name="dpsgd_s", group_by="attribute"),
    AlgorithmConfig(name="dpsgd"),
    AlgorithmConfig(name="nonprivate"),
)
RESULTS_VERSION = 1
_HIST_BINS = 40
_ROC_POINTS = 160


# ================================================================================================
# configuration
# ================================================================================================

def _positive(value, name):
    check_positive(value, name)


def _int_at_least(value, name, low, high=None):
    check_int(value, name, low, high)


@dataclass(frozen=True)
class AuditConfig:
    """One PA-ALOOA audit. ``tiers=None`` means a single tier holding everyone at ``epsilon``."""

    dataset: str = "adult"
    data_dir: str | None = None
    max_train: int | None = None  # stratified subsample of the training set (quick audits)
    model: str = "lr"  # lr | mlp | cnn
    hidden: tuple[int, ...] = (64,)  # MLP widths
    tiers: TiersConfig | None = None
    epsilon: float = 10.0  # the single tier's ε when tiers is None
    group_by: str = "attribute"  # GPR groups: class | attribute | tier
    group_attribute: str | None = None  # None: the dataset's default sensitive attribute
    algorithms: tuple[AlgorithmConfig, ...] = DEFAULT_ALGORITHMS
    R: int = 16  # 2R models per algorithm
    epochs: float = 2.0
    batch_size: int = 256
    lr: float = 1.0
    delta: float = 1e-5
    clip_norm: float = 1.0
    seed: int = 0
    threshold: str = "in_sample"  # in_sample (the design's estimator) | held_out (unbiased)
    n_boot: int = 1000
    confidence: float = 0.95  # bootstrap CIs and Clopper-Pearson ε lower bounds
    null_perms: int = 1
    looa_k: int = 2  # PA-LOOA: records audited one at a time
    looa_models: int = 16  # PA-LOOA: models with / without each record
    device: str = "auto"
    threads: int | None = None
    chunk_models: int | None = None  # models trained at once; None: from the memory budget
    memory_budget_gib: float = 1.0  # working set of one training step of a chunk
    name: str = ""

    def validate(self) -> "AuditConfig":
        from engine.data import dataset_names

        if self.dataset not in dataset_names():
            raise ConfigError("dataset", f"unknown value {self.dataset!r}; allowed: {', '.join(dataset_names())}")
        if self.max_train is not None:
            _int_at_least(self.max_train, "max_train", 8)
        if self.model not in AUDIT_MODELS:
            raise ConfigError("model", f"unknown value {self.model!r}; allowed: {', '.join(AUDIT_MODELS)}")
        if self.model == "mlp" and (not self.hidden or any(not isinstance(h, int) or h < 1 for h in self.hidden)):
            raise ConfigError("hidden", f"MLP hidden widths must be integers >= 1, got {self.hidden!r}")
        if self.tiers is not None:
            self.tiers.validate()  # fields named tiers.…
        else:
            _positive(self.epsilon, "epsilon")
        if self.group_by not in GROUP_BY:
            raise ConfigError("group_by", f"unknown value {self.group_by!r}; allowed: {', '.join(GROUP_BY)}")
        if not self.algorithms:
            raise ConfigError("algorithms", "at least one algorithm is needed")
        for k, algo in enumerate(self.algorithms):
            if not isinstance(algo, AlgorithmConfig):
                raise ConfigError(f"algorithms[{k}]", f"must be an algorithm object, got {algo!r}")
            try:
                algo.validate()
            except ConfigError as e:
                raise ConfigError(e.field.replace("algorithm", f"algorithms[{k}]", 1), e.message) from None
        _int_at_least(self.R, "R", 2, 100_000)
        _positive(self.epochs, "epochs")
        _int_at_least(self.batch_size, "batch_size", 1)
        _positive(self.lr, "lr")
        if not (isinstance(self.delta, (int, float)) and math.isfinite(self.delta) and 0 < self.delta < 1):
            raise ConfigError("delta", f"must be in (0, 1), got {self.delta!r}")
        _positive(self.clip_norm, "clip_norm")
        _int_at_least(self.seed, "seed", 0)
        if self.threshold not in THRESHOLDS:
            raise ConfigError("threshold", f"unknown value {self.threshold!r}; allowed: {', '.join(THRESHOLDS)}")
        _int_at_least(self.n_boot, "n_boot", 10, 1_000_000)
        if not (isinstance(self.confidence, float) and 0 < self.confidence < 1):
            raise ConfigError("confidence", f"must be in (0, 1), got {self.confidence!r}")
        _int_at_least(self.null_perms, "null_perms", 1, 1000)
        _int_at_least(self.looa_k, "looa_k", 0, 1000)
        if self.looa_k:
            _int_at_least(self.looa_models, "looa_models", 2, 100_000)
        if self.device not in DEVICES:
            raise ConfigError("device", f"unknown value {self.device!r}; allowed: {', '.join(DEVICES)}")
        if self.threads is not None:
            _int_at_least(self.threads, "threads", 1)
        if self.chunk_models is not None:
            _int_at_least(self.chunk_models, "chunk_models", 1)
        _positive(self.memory_budget_gib, "memory_budget_gib")
        if not isinstance(self.name, str):
            raise ConfigError("name", "must be a string")
        return self

    # --- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["tiers"] = None if self.tiers is None else _jsonable(dataclasses.asdict(self.tiers))
        d["algorithms"] = [_jsonable(dataclasses.asdict(a)) for a in self.algorithms]
        return _jsonable(d)

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "AuditConfig":
        from engine.config import _from_dict

        if not isinstance(d, dict):
            raise ConfigError("config", "must be a JSON object")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ConfigError(unknown[0], f"unknown field; allowed: {', '.join(sorted(fields))}")
        kw = {}
        for key, value in d.items():
            if key == "tiers":
                kw[key] = None if value is None else _from_dict(TiersConfig, value, "tiers.")
            elif key == "algorithms":
                if not isinstance(value, list):
                    raise ConfigError("algorithms", "must be a list of algorithm names or objects")
                algos = []
                for k, a in enumerate(value):
                    if isinstance(a, str):
                        if a not in ALGORITHMS:
                            raise ConfigError(f"algorithms[{k}]",
                                              f"unknown algorithm {a!r}; allowed: {', '.join(ALGORITHMS)}")
                        algos.append(AlgorithmConfig(name=a))
                    else:
                        try:
                            algos.append(_from_dict(AlgorithmConfig, a, f"algorithms[{k}]."))
                        except ConfigError as e:
                            raise ConfigError(e.field, e.message) from None
                kw[key] = tuple(algos)
            elif key == "hidden" and isinstance(value, list):
                kw[key] = tuple(value)
            else:
                kw[key] = value
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> "AuditConfig":
        return cls.from_dict(parse_config_json(text))

    def replace(self, **changes) -> "AuditConfig":
        return dataclasses.replace(self, **changes)


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def load_audit_config(path: str) -> AuditConfig:
    """Read and validate an audit configuration file (JSON only)."""
    return AuditConfig.from_json(read_config_text(path)).validate()


def algorithm_keys(config: AuditConfig) -> list[str]:
    """Unique keys (``dpsgd``, ``ino``, ``ino_2`` …) in the configured order."""
    seen: dict[str, int] = {}
    keys = []
    for a in config.algorithms:
        seen[a.name] = seen.get(a.name, 0) + 1
        keys.append(a.name if seen[a.name] == 1 else f"{a.name}_{seen[a.name]}")
    return keys


# ================================================================================================
# preparation (everything fixed before the first model trains)
# ================================================================================================

@dataclass
class AlgoSetup:
    key: str
    algo: AlgorithmConfig
    label: str
    plan: object | None
    sample_rates: np.ndarray  # per training sample
    sample_clips: np.ndarray | None
    formal_dp: bool
    claimed: list  # per tier: ε the plan guarantees (None when non-private)
    info: dict = field(default_factory=dict)
    dpsgd_s: dict | None = None


@dataclass
class AuditSetup:
    config: AuditConfig
    dataset: object
    tiers: object
    groups: np.ndarray  # GPR group label (str) per training sample
    group_names: list
    test_groups: np.ndarray | None
    membership: np.ndarray  # (2R, n) bool
    steps: int
    half_tier_sizes: list
    algos: list
    device: torch.device
    chunk_models: int
    budget_bytes: int

    @property
    def n(self) -> int:
        return int(self.membership.shape[1])

    @property
    def n_models(self) -> int:
        return int(self.membership.shape[0])


def _run_config(config: AuditConfig, tiers: TiersConfig, algo: AlgorithmConfig) -> RunConfig:
    return RunConfig(data=DataConfig(name=config.dataset, data_dir=config.data_dir, max_train=config.max_train),
                     tiers=tiers, model=ModelConfig(name=config.model, hidden=tuple(config.hidden)), algorithm=algo,
                     optimizer=OptimizerConfig(lr=config.lr), epochs=config.epochs, batch_size=config.batch_size,
                     delta=config.delta, clip_norm=config.clip_norm, seed=config.seed, device=config.device)


def resolved_tiers(config: AuditConfig, dataset) -> TiersConfig:
    if config.tiers is not None:
        return config.tiers
    return TiersConfig(assign="class", tiers=(
        TierConfig(epsilon=float(config.epsilon), classes=tuple(range(dataset.num_classes)),
                   name=f"all (ε={config.epsilon:g})"),))


def _attribute(config: AuditConfig, dataset, field_name: str) -> np.ndarray:
    attr = config.group_attribute or dataset.default_sensitive
    if attr is None or attr not in dataset.sensitive_train:
        known = ", ".join(dataset.sensitive_train) or "none"
        raise ConfigError(field_name, f"{dataset.name} has no sensitive attribute {attr!r} to group by; known: {known}")
    return np.asarray(dataset.sensitive_train[attr]).astype(str)


def _labels(config, dataset, tiers, by: str, field_name: str):
    """(label per training sample, ordered label names, label per test sample or None)."""
    if by == "class":
        names = [str(c) for c in dataset.class_names]
        y, yt = dataset.y_train.numpy(), dataset.y_test.numpy()
        return np.asarray(names, dtype=object)[y].astype(str), names, np.asarray(names, dtype=object)[yt].astype(str)
    if by == "tier":
        names = list(tiers.names)
        arr = np.asarray(names + [""], dtype=object)  # test samples outside every tier (-1) → ""
        test = None if tiers.test is None else arr[tiers.test].astype(str)
        return arr[tiers.train].astype(str), names, test
    values = _attribute(config, dataset, field_name)
    attr = config.group_attribute or dataset.default_sensitive
    test = np.asarray(dataset.sensitive_test[attr]).astype(str) if attr in dataset.sensitive_test else None
    return values, sorted(set(values.tolist())), test


def prepare_audit(config: AuditConfig) -> AuditSetup:
    """Validate with the data and plan every algorithm; raises ConfigError (or DataError)."""
    from engine.data import load_dataset
    from engine.tiers import assign_tiers
    from engine.train import resolve_device

    config.validate()
    device = resolve_device(config.device)
    ds = load_dataset(config.dataset, data_dir=config.data_dir, seed=config.seed, max_train=config.max_train)
    n = len(ds.y_train)
    if n < 8:
        raise ConfigError("max_train", f"an audit needs at least 8 training samples, got {n}")
    half = n / 2
    if config.batch_size > n // 2:
        raise ConfigError("batch_size", f"must be at most half the training set ({n // 2}) since each model "
                                        f"trains on one half, got {config.batch_size}")
    tiers_cfg = resolved_tiers(config, ds)
    tiers = assign_tiers(tiers_cfg, ds, seed=config.seed)
    groups, group_names, test_groups = _labels(config, ds, tiers, config.group_by, "group_by")
    model_cfg = ModelConfig(name=config.model, hidden=tuple(config.hidden))
    from engine.models import build_model

    build_model(model_cfg, ds.input_shape, ds.num_classes)  # ConfigError "model.name" if it does not fit
    steps = max(1, int(round(config.epochs * half / config.batch_size)))
    half_sizes = [max(1, int(round(s / 2))) for s in tiers.sizes]
    membership = stats.complementary_membership(n, config.R, seed=config.seed)
    algos = []
    for k, (key, algo) in enumerate(zip(algorithm_keys(config), config.algorithms)):
        algos.append(_algo_setup(config, k, key, algo, tiers_cfg, tiers, ds, steps, half_sizes, half))
    budget = int(config.memory_budget_gib * (1 << 30)) if config.memory_budget_gib else DEFAULT_BUDGET_BYTES
    expected_batch = max(a.plan.expected_batch_size if a.plan is not None else config.batch_size for a in algos)
    on_cpu = device.type == "cpu"  # CPU: cache-sized chunks; GPU: as many models as the budget holds
    chunk = config.chunk_models or models_per_chunk(
        model_cfg, ds.input_shape, ds.num_classes, expected_batch, budget_bytes=budget, cap=200 if on_cpu else 400,
        cache_bytes=CACHE_TARGET_BYTES if on_cpu else None)
    return AuditSetup(config=config, dataset=ds, tiers=tiers, groups=groups, group_names=group_names,
                      test_groups=test_groups, membership=membership, steps=steps, half_tier_sizes=half_sizes,
                      algos=algos, device=device, chunk_models=int(chunk), budget_bytes=budget)


def _algo_setup(config, k, key, algo, tiers_cfg, tiers, ds, steps, half_sizes, half) -> AlgoSetup:
    field_prefix = f"algorithms[{k}]"
    label = ALGORITHM_LABELS.get(algo.name, algo.name)
    if algo.name == "ino":
        label += f" ({algo.tif}, {algo.idp_mode.upper()})" if algo.tif != "beta" or algo.idp_mode != "sample" else ""
    rc = _run_config(config, tiers_cfg, algo)
    try:
        plan = make_plan(rc, half_sizes, steps)
    except ConfigError as e:
        raise ConfigError(e.field, f"{field_prefix} ({algo.name}): {e.message}") from None
    n = len(ds.y_train)
    if plan is None:
        rates = np.full(n, min(1.0, config.batch_size / half))
        return AlgoSetup(key=key, algo=algo, label=label, plan=None, sample_rates=rates, sample_clips=None,
                         formal_dp=False, claimed=[None] * len(tiers.epsilons))
    rates = np.asarray(plan.sample_rates, dtype=float)[tiers.train]
    clips = np.asarray(plan.clip_norms, dtype=float)[tiers.train]
    setup = AlgoSetup(key=key, algo=algo, label=label, plan=plan, sample_rates=rates, sample_clips=clips,
                      formal_dp=True, claimed=[float(e) for e in plan.epsilons])
    if algo.name == "dpsgd_s":
        g_labels, g_names, _ = _labels(config, ds, tiers, algo.group_by, f"{field_prefix}.group_by")
        lookup = {v: i for i, v in enumerate(g_names)}
        gidx = np.array([lookup[v] for v in g_labels], dtype=np.int64)
        sigma_b = algo.count_noise_std or default_count_noise_std(float(plan.expected_batch_size))
        z = plan.noise_multiplier
        if algo.private_quantile:
            try:
                z = accounting.adaptive_clipping_noise_multiplier(noise_multiplier=z, count_noise_std=sigma_b)
            except accounting.PlanError as e:
                raise ConfigError(f"{field_prefix}.count_noise_std", str(e)) from None
        setup.formal_dp = bool(algo.private_quantile)
        setup.dpsgd_s = {"groups": gidx, "group_names": g_names, "noise_multiplier": z, "count_noise_std": sigma_b}
        setup.info.update(gradient_noise_multiplier=z, count_noise_std=sigma_b if algo.private_quantile else None,
                          clip_groups=g_names)
    return setup


def _mechanism(setup: AuditSetup, a: AlgoSetup, members: np.ndarray, sampler: PoissonSampler):
    m, dev, cfg = members.shape[0], setup.device, setup.config
    if a.plan is None:
        return BatchedNonPrivate(m, dev)
    name = a.algo.name
    if name in ("dpsgd", "idp_sample", "idp_scale"):
        return BatchedClipped(sample_clip_norms=a.sample_clips, noise_std=a.plan.noise_std, n_models=m, device=dev)
    if name == "ino":
        mass = (members * (a.sample_rates * a.sample_clips)[None, :]).sum(1)
        gammas = np.array([resolve_tail_length(a.algo, float(x)) for x in mass])
        return BatchedImportance(sample_clip_norms=a.sample_clips, noise_std=a.plan.noise_std, n_models=m,
                                 device=dev, tail_lengths=gammas, tif=build_tif(a.algo))
    s = a.dpsgd_s
    k = len(s["group_names"])
    onehot = np.zeros((len(s["groups"]), k))
    onehot[np.arange(len(s["groups"])), s["groups"]] = 1.0
    expected_groups = (members * a.sample_rates[None, :]) @ onehot  # (M, K) Σ q_i over members of group k
    algo = a.algo
    return BatchedGroupAdaptive(groups=s["groups"], n_groups=k, noise_multiplier=s["noise_multiplier"],
                                expected_group_batch=expected_groups, initial=algo.initial_clip or cfg.clip_norm,
                                tau=algo.tau, quantile=algo.quantile, ema=algo.ema, min_clip=algo.min_clip,
                                private=algo.private_quantile, quantile_lr=algo.quantile_lr,
                                count_noise_std=s["count_noise_std"], device=dev)


def _seed(*parts) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0] % (2**63 - 1))


def _chunks(total: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(total, a + size)) for a in range(0, total, size)]


def preview_audit(config: AuditConfig) -> dict:
    """What an audit will do (for the UI before launching): sizes, groups, per-algorithm plans."""
    s = prepare_audit(config)
    out = {"n_train": s.n, "n_models": s.n_models, "steps_per_model": s.steps, "chunk_models": s.chunk_models,
           "group_names": s.group_names, "group_sizes": _group_sizes(s.groups, s.group_names),
           "tier_names": list(s.tiers.names), "tier_sizes": list(s.tiers.sizes), "device": str(s.device),
           "looa_models": (config.looa_k + 1) * config.looa_models if config.looa_k else 0, "algorithms": []}
    for a in s.algos:
        out["algorithms"].append({"key": a.key, "label": a.label, "formal_dp": a.formal_dp,
                                  "plan": _plan_table(s, a)})
    return out


def _group_sizes(groups, names) -> dict:
    return {g: int(np.sum(groups == g)) for g in names}


def _plan_table(setup: AuditSetup, a: AlgoSetup):
    if a.plan is None:
        return None
    p = a.plan
    return [{"tier": setup.tiers.names[k], "sample_rate": float(p.sample_rates[k]), "clip_norm": float(p.clip_norms[k]),
             "noise_multiplier": float(p.noise_multiplier), "noise_std": float(p.noise_std),
             "epsilon": float(p.epsilons[k]), "target_epsilon": float(p.target_epsilons[k])}
            for k in range(len(p.sample_rates))]


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


class _Checkpoints:
    """Chunk results in the run store (or nowhere, without a store)."""

    def __init__(self, store, run_id, config: AuditConfig, layout: dict):
        self.store, self.run_id = store, run_id
        self.active = store is not None and run_id is not None
        if not self.active:
            return
        meta = {"version": RESULTS_VERSION, "config": config.to_dict(), "layout": layout}
        old = store.get_artifact(run_id, "audit/meta")
        if old is not None:
            prev = json.loads(old.decode())
            if prev.get("config") != meta["config"] or prev.get("layout") != layout:
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


class _Progress:
    def __init__(self, store, run_id, total: int, bar):
        self.store, self.run_id, self.total, self.bar = store, run_id, total, bar
        self.done = 0
        self.last = 0.0

    def advance(self, k: int = 1):
        self.done += k
        if self.bar is not None:
            self.bar.update(k)
        now = time.time()
        if self.store is not None and self.run_id is not None and (now - self.last > 0.5 or self.done >= self.total):
            self.store.update_progress(self.run_id, self.done)
            self.last = now


# ================================================================================================
# the audit
# ================================================================================================

def run_audit(config: AuditConfig, *, store=None, run_id: int | None = None, progress: bool = False,
              should_stop=None) -> dict:
    """Run (or resume) an audit and return its results dict (JSON-able; also the run's summary).

    With ``store`` and ``run_id`` the run's status, progress, chunk checkpoints, per-sample
    advantages (artifacts ``advantage/<key>``) and results go to the store; a run that was
    stopped (``should_stop`` → :class:`engine.train.Cancelled`), killed or crashed continues
    from its last completed chunk when run again with the same id.
    """
    started = time.time()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    in_store = store is not None and run_id is not None
    try:
        setup = prepare_audit(config)
        layout = _layout(setup)
        ckpt = _Checkpoints(store, run_id, config, layout)
        total = sum(len(v) for v in layout.values()) * setup.steps
        if in_store:
            store.start_run(run_id, pid=os.getpid(), total_steps=total, plan=_run_plan(setup))
        bar = _bar(total) if progress else None
        prog = _Progress(store if in_store else None, run_id, total, bar)
        results = _results_header(setup)
        for a in setup.algos:
            res = _audit_algorithm(setup, a, layout, ckpt, prog, should_stop)
            results["algorithms"].append(res)
            results["seconds"] = time.time() - started
            if in_store:
                store.set_summary(run_id, _clean(dict(results, partial=True)))
                adv = res.pop("_advantage")
                store.put_artifact(run_id, f"advantage/{a.key}", _npy(adv))
            else:
                res.pop("_advantage")
        if bar is not None:
            bar.close()
        results["seconds"] = time.time() - started
        results["train_seconds"] = sum(r["train_seconds"] for r in results["algorithms"])
        results["stats_seconds"] = sum(r["stats_seconds"] for r in results["algorithms"])
        results = _clean(results)
        if in_store:
            store.finish_run(run_id, results)
        return results
    except Cancelled as e:
        if in_store:
            store.set_status(run_id, "cancelled", error=str(e))
        raise
    except ConfigError as e:
        if in_store:
            store.set_status(run_id, "failed", error=str(e))
        raise
    except BaseException as e:  # noqa: BLE001 - record why, then let it propagate
        if in_store:
            store.set_status(run_id, "failed", error=f"{type(e).__name__}: {e}")
        raise


def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(arr), allow_pickle=False)
    return buf.getvalue()


def load_array(blob: bytes) -> np.ndarray:
    """Inverse of the artifacts' ``np.save`` encoding (never unpickles)."""
    return np.load(io.BytesIO(blob), allow_pickle=False)


def _bar(total):
    from tqdm import tqdm

    return tqdm(total=total, desc="audit", unit="step", leave=False)


def _layout(setup: AuditSetup) -> dict:
    cfg = setup.config
    out = {}
    for a in setup.algos:
        out[f"{a.key}/aloo"] = [list(c) for c in _chunks(setup.n_models, setup.chunk_models)]
        if cfg.looa_k:
            out[f"{a.key}/looa"] = [list(c) for c in _chunks((cfg.looa_k + 1) * cfg.looa_models, setup.chunk_models)]
    return out


def _run_plan(setup: AuditSetup) -> dict:
    return {"kind": "audit", "steps_per_model": setup.steps, "n_models": setup.n_models, "n_train": setup.n,
            "chunk_models": setup.chunk_models, "tier_names": list(setup.tiers.names),
            "algorithms": {a.key: _plan_table(setup, a) for a in setup.algos}}


def _results_header(setup: AuditSetup) -> dict:
    cfg = setup.config
    return {"kind": "audit", "version": RESULTS_VERSION, "config": cfg.to_dict(), "dataset": cfg.dataset,
            "n_train": setup.n, "R": cfg.R, "n_models": setup.n_models, "steps_per_model": setup.steps,
            "threshold": cfg.threshold, "group_by": cfg.group_by, "group_names": list(setup.group_names),
            "group_sizes": _group_sizes(setup.groups, setup.group_names), "tier_names": list(setup.tiers.names),
            "tier_sizes": list(setup.tiers.sizes), "device": str(setup.device), "chunk_models": setup.chunk_models,
            "algorithms": []}


def _train_chunk(setup: AuditSetup, a: AlgoSetup, members: np.ndarray, init_seeds, gen_seed: int, prog,
                 should_stop, score_idx=None):
    """Train one chunk of models; returns (losses, confs) on ``score_idx`` (all samples) and test accuracy."""
    ds, dev = setup.dataset, setup.device
    x, y = _on(ds.x_train, dev), _on(ds.y_train, dev)
    model_cfg = ModelConfig(name=setup.config.model, hidden=tuple(setup.config.hidden))
    ens = Ensemble(model_cfg, ds.input_shape, ds.num_classes, init_seeds, dev)
    sampler = PoissonSampler(members, a.sample_rates, dev)
    mech = _mechanism(setup, a, members, sampler)
    gen = torch.Generator(device=dev).manual_seed(gen_seed)
    train_ensemble(ens, x, y, sampler, mech, steps=setup.steps, lr=setup.config.lr,
                   expected_batch=sampler.expected_batch, gen=gen, should_stop=should_stop,
                   on_step=lambda _s: prog.advance())
    chunk = _eval_chunk(setup, len(init_seeds))
    if score_idx is not None:  # PA-LOOA: only the target records matter
        ix = torch.as_tensor(score_idx, device=dev)
        losses, confs, _ = ens.score(x[ix], y[ix], chunk=chunk)
        return losses, confs, None
    losses, confs, _ = ens.score(x, y, chunk=chunk)
    _, _, pred = ens.score(_on(ds.x_test, dev), _on(ds.y_test, dev), chunk=chunk)
    return losses, confs, pred


_DEVICE_CACHE: dict = {}


def _on(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """The dataset tensor on the audit's device (copied once per process and device, not per chunk)."""
    if dev.type == "cpu":
        return t
    key = (id(t), str(dev))
    hit = _DEVICE_CACHE.get(key)
    if hit is None or hit[0] is not t:
        if len(_DEVICE_CACHE) >= 8:
            _DEVICE_CACHE.clear()
        hit = _DEVICE_CACHE[key] = (t, t.to(dev))
    return hit[1]


def _eval_chunk(setup: AuditSetup, n_models: int) -> int:
    model_cfg = ModelConfig(name=setup.config.model, hidden=tuple(setup.config.hidden))
    ds = setup.dataset
    per_sample = per_model_step_bytes(model_cfg, ds.input_shape, ds.num_classes, 1) // 2
    return int(max(64, min(8192, setup.budget_bytes // max(1, per_sample * n_models))))


def _audit_algorithm(setup: AuditSetup, a: AlgoSetup, layout: dict, ckpt: _Checkpoints, prog, should_stop) -> dict:
    cfg = setup.config
    n, M = setup.n, setup.n_models
    k_algo = [x.key for x in setup.algos].index(a.key)
    t0 = time.time()
    losses = np.empty((M, n), dtype=np.float32)
    confs = np.empty((M, n), dtype=np.float32)
    preds = []
    for c, (lo, hi) in enumerate(layout[f"{a.key}/aloo"]):
        key = f"chunk/{a.key}/aloo/{c}"
        got = ckpt.get(key)
        if got is None:
            seeds = [_seed(cfg.seed, 1, j) for j in range(lo, hi)]  # model j's init: shared by all algorithms
            l, cf, p = _train_chunk(setup, a, setup.membership[lo:hi], seeds, _seed(cfg.seed, 2, k_algo, c),
                                    prog, should_stop)
            ckpt.put(key, losses=l, confs=cf, preds=p.astype(np.int16))
            got = {"losses": l, "confs": cf, "preds": p}
        else:
            prog.advance(setup.steps)
        losses[lo:hi], confs[lo:hi] = got["losses"], got["confs"]
        preds.append(np.asarray(got["preds"]))
    train_seconds = time.time() - t0
    t1 = time.time()
    res = _statistics(setup, a, losses, confs, np.concatenate(preds, 0))
    stats_seconds = time.time() - t1
    # PA-LOOA on the records the ALOOA advantage ranks riskiest (outside model 0's half)
    if cfg.looa_k:
        t2 = time.time()
        res["baselines"].update(_looa(setup, a, res["_advantage"], layout, ckpt, prog, should_stop, k_algo))
        train_seconds += time.time() - t2
    res["train_seconds"] = train_seconds
    res["stats_seconds"] = stats_seconds
    return res


def _looa(setup, a, adv, layout, ckpt, prog, should_stop, k_algo) -> dict:
    cfg = setup.config
    base = setup.membership[0]
    outside = np.flatnonzero(~base)
    score = np.where(np.isnan(adv[outside]), -np.inf, adv[outside])
    order = np.lexsort((outside, -score))  # highest advantage first, ties by index
    targets = outside[order[: cfg.looa_k]]
    m = cfg.looa_models
    total = (len(targets) + 1) * m
    members = np.repeat(base[None, :], total, axis=0)
    for t, i in enumerate(targets):
        members[(t + 1) * m:(t + 2) * m, i] = True
    loss = np.empty((total, len(targets)), dtype=np.float32)
    for c, (lo, hi) in enumerate(layout[f"{a.key}/looa"]):
        key = f"chunk/{a.key}/looa/{c}"
        got = ckpt.get(key)
        if got is None:
            seeds = [_seed(cfg.seed, 3, j) for j in range(lo, hi)]
            l, _, _ = _train_chunk(setup, a, members[lo:hi], seeds, _seed(cfg.seed, 4, k_algo, c), prog,
                                   should_stop, score_idx=targets)
            ckpt.put(key, losses=l)
            got = {"losses": l}
        else:
            prog.advance(setup.steps)
        loss[lo:hi] = got["losses"]
    rows = []
    for t, i in enumerate(targets):
        without = -loss[:m, t]
        with_ = -loss[(t + 1) * m:(t + 2) * m, t]
        rows.append({"index": int(i), "group": str(setup.groups[i]), "looa_advantage": stats.pa_looa(with_, without),
                     "aloo_advantage": float(adv[i])})
    return {"pa_looa": rows, "looa_models": int(total), "looa_models_per_record": 2 * m}


def _statistics(setup: AuditSetup, a: AlgoSetup, losses, confs, preds) -> dict:
    cfg = setup.config
    mem = setup.membership
    scores = -losses.astype(np.float64)
    groups = setup.groups
    adv = stats.sample_advantage(scores, mem, threshold=cfg.threshold, seed=cfg.seed)
    boot = stats.bootstrap_gpr(adv, groups, n_boot=cfg.n_boot, ci=cfg.confidence, seed=cfg.seed)
    floor = stats.null_floor(scores, mem, threshold=cfg.threshold, n_perm=cfg.null_perms, seed=cfg.seed + 1)
    res = {"key": a.key, "name": a.algo.name, "label": a.label, "formal_dp": a.formal_dp,
           "algorithm": dataclasses.asdict(a.algo), "plan": _plan_table(setup, a), "info": a.info,
           "gpr": boot, "null_floor": floor, "advantage_mean": float(np.nanmean(adv)),
           "baselines": {"pa_ga": stats.pa_ga(scores, mem), "pa_gba": stats.pa_gba(scores, mem, groups)}}
    # accuracy on the test set, per model
    yt = setup.dataset.y_test.numpy()
    correct = preds == yt[None, :]
    acc = correct.mean(1)
    acc_groups = {}
    if setup.test_groups is not None:
        for g in setup.group_names:
            sel = setup.test_groups == g
            if sel.any():
                acc_groups[g] = float(correct[:, sel].mean())
    res["accuracy"] = {"mean": float(acc.mean()), "std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                       "min": float(acc.min()), "max": float(acc.max()), "groups": acc_groups}
    # LiRA (online, fixed variance) on logit-scaled confidence
    lira = stats.lira_scores(confs.astype(np.float64), mem)
    lira_groups, rocs = {}, {}
    for g in setup.group_names:
        sel = groups == g
        fpr, tpr = stats.roc_curve_points(lira[:, sel], mem[:, sel])
        lira_groups[g] = {"auc": stats.auc(fpr, tpr), "tpr_at_0.1%": stats.tpr_at_fpr(fpr, tpr, 0.001),
                          "tpr_at_1%": stats.tpr_at_fpr(fpr, tpr, 0.01)}
        rocs[g] = _thin_roc(fpr, tpr)
    res["lira"] = {"groups": lira_groups, "roc": rocs}
    # per-tier empirical ε lower bound (threshold attack on −loss, selection and counting on disjoint models)
    tier_lab = np.asarray(setup.tiers.train)
    lb = stats.per_group_epsilon_lower_bound(scores, mem, tier_lab, delta=cfg.delta, confidence=cfg.confidence,
                                             seed=cfg.seed)
    tiers = []
    for k, name in enumerate(setup.tiers.names):
        r = lb.get(k, {})
        tiers.append({"name": name, "claimed": a.claimed[k], "target": float(setup.tiers.epsilons[k]),
                      "lower_bound": r.get("epsilon_lb"), "tpr": r.get("tpr"), "fpr": r.get("fpr"),
                      "tp": r.get("tp"), "fn": r.get("fn"), "fp": r.get("fp"), "tn": r.get("tn")})
    res["epsilon"] = {"tiers": tiers, "confidence": cfg.confidence, "delta": cfg.delta}
    # per-sample advantage histogram per group
    lo = min(0.0, float(np.nanmin(adv))) if np.isfinite(adv).any() else 0.0
    edges = np.linspace(lo, 1.0, _HIST_BINS + 1)
    res["histogram"] = {"edges": edges.tolist(), "counts": {
        g: np.histogram(adv[(groups == g) & np.isfinite(adv)], bins=edges)[0].tolist() for g in setup.group_names}}
    res["_advantage"] = adv.astype(np.float32)
    return res


def _thin_roc(fpr, tpr, points: int = _ROC_POINTS) -> dict:
    """The ROC's upper envelope on a log-spaced FPR grid (for log-log plots), plus (1, 1)."""
    grid = np.unique(np.concatenate([np.logspace(-5, 0, points), [1.0]]))
    pos = np.searchsorted(fpr, grid, side="right") - 1
    t = np.maximum.accumulate(tpr)[np.clip(pos, 0, None)]
    keep = grid >= max(float(fpr[fpr > 0].min()) if np.any(fpr > 0) else 1.0, 1e-5) / 2
    return {"fpr": grid[keep].tolist(), "tpr": t[keep].tolist()}


def _clean(x):
    """JSON-safe: numpy scalars → Python, NaN/±inf → None, keys → str."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return _clean(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# ================================================================================================
# summaries, worker and CLI
# ================================================================================================

def compact_summary(results: dict) -> dict:
    """The headline numbers of an audit (what ``--json`` prints)."""
    out = {k: results.get(k) for k in ("dataset", "n_train", "R", "n_models", "threshold", "group_by", "seconds",
                                       "train_seconds", "stats_seconds")}
    algos = []
    for r in results.get("algorithms", []):
        g = r["gpr"]
        algos.append({
            "key": r["key"], "label": r["label"], "formal_dp": r["formal_dp"],
            "accuracy": r["accuracy"]["mean"],
            "gpr": {k: v["mean"] for k, v in g["groups"].items()},
            "gpr_ci": {k: [v["low"], v["high"]] for k, v in g["groups"].items()},
            "delta_pp": g["delta"]["value"], "delta_ci": [g["delta"]["low"], g["delta"]["high"]],
            "null_floor": r["null_floor"], "pa_ga": r["baselines"]["pa_ga"],
            "lira_auc": {k: v["auc"] for k, v in r["lira"]["groups"].items()},
            "epsilon": [{"tier": t["name"], "claimed": t["claimed"], "lower_bound": t["lower_bound"]}
                        for t in r["epsilon"]["tiers"]],
        })
    out["algorithms"] = algos
    return out


def summary_table(results: dict) -> str:
    groups = results["group_names"]
    lines = [f"PA-ALOOA on {results['dataset']} (n={results['n_train']}, 2R={results['n_models']} models per "
             f"algorithm, threshold {results['threshold']}, groups by {results['group_by']})"]
    head = f"{'algorithm':<22} {'acc':>6} " + " ".join(f"{('GPR ' + g)[:14]:>14}" for g in groups) + \
        f" {'Δ pp [CI]':>20} {'floor':>6} {'ε LB / claimed':>18}"
    lines.append(head)
    for r in results["algorithms"]:
        gp = r["gpr"]["groups"]
        d = r["gpr"]["delta"]
        eps = ", ".join(f"{_f(t['lower_bound'], '.2f')}/{_f(t['claimed'], '.2f')}" for t in r["epsilon"]["tiers"])
        lines.append(f"{r['label'][:22]:<22} {r['accuracy']['mean']:>6.3f} "
                     + " ".join(f"{_f(gp[g]['mean'], '.4f'):>14}" for g in groups)
                     + f" {_f(d['value'], '.2f')} [{_f(d['low'], '.2f')}, {_f(d['high'], '.2f')}]".rjust(21)
                     + f" {_f(r['null_floor'], '.3f'):>6} {eps:>18}")
    lines.append(f"{results['seconds']:.1f} s ({results['train_seconds']:.1f} s training, "
                 f"{results['stats_seconds']:.1f} s statistics)")
    return "\n".join(lines)


def _f(x, spec):
    return "—" if x is None else format(x, spec)


def run_audit_in_store(store, run_id: int, config_dict: dict) -> dict:
    """Worker entry point: run (or resume) the queued audit ``run_id``; SIGTERM → status cancelled."""
    try:
        config = AuditConfig.from_dict(config_dict).validate()
    except ConfigError as e:
        store.set_status(run_id, "failed", error=str(e))
        raise

    with sigterm_cancels():
        return run_audit(config, store=store, run_id=run_id, progress=False)


def cli_audit(args, store) -> int:
    """``python -m engine audit CONFIG.json [--json]``: run an audit in this process, into the store."""
    config = load_audit_config(args.config)
    run_id = store.create_run(config.to_dict(), kind="audit", status="queued", name=config.name or "audit")
    try:
        results = run_audit_in_store(store, run_id, config.to_dict()) if args.json else \
            _with_progress(store, run_id, config)
    except Cancelled:
        print(f"audit {run_id} cancelled", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"run_id": run_id, **compact_summary(results)}, sort_keys=True))
    else:
        print(f"audit run {run_id} — finished")
        print(summary_table(results))
    return 0


def _with_progress(store, run_id, config):
    with sigterm_cancels():
        return run_audit(config, store=store, run_id=run_id, progress=True)
