"""The audit's configuration: one frozen :class:`AuditConfig` (JSON round-trip, ConfigError naming the field)."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from engine.config import (ALGORITHMS, DEVICES, GROUP_BY, AlgorithmConfig, ConfigError, TiersConfig,
                           parse_config_json, read_config_text)

AUDIT_MODELS = ("lr", "mlp", "cnn")
THRESHOLDS = ("in_sample", "held_out")
DEFAULT_ALGORITHMS = (
    AlgorithmConfig(name="idp_sample"),
    AlgorithmConfig(name="ino"),
    AlgorithmConfig(name="dpsgd_s", group_by="attribute"),
    AlgorithmConfig(name="dpsgd"),
    AlgorithmConfig(name="nonprivate"),
)


def _positive(value, name):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ConfigError(name, f"must be a finite number > 0, got {value!r}")


def _int_at_least(value, name, low, high=None):
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        rng = f">= {low}" if high is None else f"in {low}..{high}"
        raise ConfigError(name, f"must be an integer {rng}, got {value!r}")


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
