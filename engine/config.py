"""One frozen configuration tree per run, with JSON round-trip and validation.

Every run is described by a :class:`RunConfig`. Its canonical JSON (sorted keys, no
whitespace) is what the run store saves next to the results, so a run can always be
reproduced from the store alone. Validation happens in two stages:

* :meth:`RunConfig.validate` checks everything that can be checked without data;
* ``engine.tiers.assign_tiers`` and ``engine.models.build_model`` check what needs the
  dataset (empty tiers, classes in two tiers, model/shape mismatches, batch > data).

Both raise :class:`ConfigError`, which names the offending field and the allowed range,
so the CLI can print one line and the UI can show it in ``st.error``.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

ALGORITHMS = ("nonprivate", "dpsgd", "idp_sample", "idp_scale", "ino", "dpsgd_s")
ALGORITHM_LABELS = {
    "nonprivate": "Non-private SGD",
    "dpsgd": "DP-SGD",
    "idp_sample": "IDP-SGD (SAMPLE)",
    "idp_scale": "IDP-SGD (SCALE)",
    "ino": "INO-SGD",
    "dpsgd_s": "DP-SGD-S",
}
MODELS = ("auto", "lr", "mlp", "cnn", "resnet18")
TIF_SHAPES = ("beta", "linear", "power", "step", "piecewise")
TIER_ASSIGNMENTS = ("class", "attribute", "random", "explicit")
GROUP_BY = ("tier", "class", "attribute")
OPTIMIZERS = ("sgd", "adam")
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """An invalid run configuration. ``field`` is the dotted path of the bad field."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def _finite_positive(value: Any, name: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ConfigError(name, f"must be a finite number > 0, got {value!r}")


def _choice(value: Any, name: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(name, f"unknown value {value!r}; allowed: {', '.join(allowed)}")


@dataclass(frozen=True)
class DataConfig:
    name: str = "digits"
    data_dir: str | None = None  # None: $PRIVACY_LAB_DATA_DIR, else the user cache folder
    max_train: int | None = None  # stratified subsample of the training set (quick runs)

    def validate(self) -> None:
        from engine.data import dataset_names

        _choice(self.name, "data.name", tuple(dataset_names()))
        if self.max_train is not None and (not isinstance(self.max_train, int) or self.max_train < 2):
            raise ConfigError("data.max_train", f"must be an integer >= 2 or null, got {self.max_train!r}")


@dataclass(frozen=True)
class TierConfig:
    """One privacy tier: a set of data owners sharing one ε (δ is the run's)."""

    epsilon: float
    classes: tuple[int, ...] = ()  # assign="class"
    values: tuple[str, ...] = ()  # assign="attribute": sensitive-attribute values
    ratio: float | None = None  # assign="random": fraction of the training samples
    name: str = ""


# The MNIST/digits "paper" split (INO-SGD, ICLR 2026): ε = 1 for {2,5,9}, 2 for {3,7,8}, 3 for {0,1,4,6}.
PAPER_TIERS = (
    TierConfig(epsilon=1.0, classes=(2, 5, 9), name="ε=1"),
    TierConfig(epsilon=2.0, classes=(3, 7, 8), name="ε=2"),
    TierConfig(epsilon=3.0, classes=(0, 1, 4, 6), name="ε=3"),
)


@dataclass(frozen=True)
class TiersConfig:
    assign: str = "class"
    tiers: tuple[TierConfig, ...] = PAPER_TIERS
    attribute: str | None = None  # assign="attribute": which sensitive attribute (None: the dataset's default)
    assignment: tuple[int, ...] | None = None  # assign="explicit": tier index per training sample

    def validate(self) -> None:
        _choice(self.assign, "tiers.assign", TIER_ASSIGNMENTS)
        if not self.tiers:
            raise ConfigError("tiers.tiers", "at least one tier is needed")
        for k, tier in enumerate(self.tiers):
            _finite_positive(tier.epsilon, f"tiers.tiers[{k}].epsilon")
        if self.assign == "random":
            ratios = [t.ratio for t in self.tiers]
            for k, r in enumerate(ratios):
                if r is None or not math.isfinite(r) or r <= 0 or r > 1:
                    raise ConfigError(f"tiers.tiers[{k}].ratio", f"must be in (0, 1], got {r!r}")
            if abs(sum(ratios) - 1.0) > 1e-6:
                raise ConfigError("tiers.tiers", f"random ratios must sum to 1, got {sum(ratios):.6g}")
        if self.assign in ("class", "attribute"):
            # each class (or attribute value) belongs to exactly one tier
            member, what = ("classes", "class") if self.assign == "class" else ("values", "value")
            seen: dict = {}
            for k, tier in enumerate(self.tiers):
                for item in getattr(tier, member):
                    if item in seen:
                        raise ConfigError(f"tiers.tiers[{k}].{member}",
                                          f"{what} {item!r} is already assigned to tier {seen[item]}")
                    seen[item] = k
        if self.assign == "explicit":
            if not self.assignment:
                raise ConfigError("tiers.assignment", "explicit assignment needs one tier index per training sample")
            bad = [a for a in self.assignment if not (0 <= int(a) < len(self.tiers))]
            if bad:
                raise ConfigError("tiers.assignment", f"tier index {bad[0]} out of range 0..{len(self.tiers) - 1}")


@dataclass(frozen=True)
class ModelConfig:
    name: str = "auto"  # auto: CNN for images, logistic regression for tabular data
    hidden: tuple[int, ...] = (64,)  # MLP hidden widths

    def validate(self) -> None:
        _choice(self.name, "model.name", MODELS)
        if self.name == "mlp" and (not self.hidden or any(int(h) < 1 for h in self.hidden)):
            raise ConfigError("model.hidden", f"MLP hidden widths must be integers >= 1, got {self.hidden!r}")


@dataclass(frozen=True)
class AlgorithmConfig:
    name: str = "ino"
    # INO-SGD: which IDP-SGD planner sets the per-tier rates / clip norms it builds on.
    idp_mode: str = "sample"
    tif: str = "beta"
    alpha: float = 1.0
    beta: float = 1.0
    power: float = 2.0  # tif="power": TIF(u) = u**power
    step_cut: float = 0.5  # tif="step": TIF(u) = 1[u >= step_cut]
    knots: tuple[tuple[float, float], ...] = ()  # tif="piecewise": (u, TIF(u)) points, linear between
    tail_length: float | None = None  # absolute γ in clip-norm units; wins over tail_fraction
    tail_fraction: float | None = 0.5  # γ as a fraction of the expected batch clip mass Σ q_n N_n C_n
    # DP-SGD-S: per-group clip C_k = max(tau * EMA(quantile of group k's grad norms), min_clip).
    tau: float = 1.0
    quantile: float = 0.75
    ema: float = 0.9
    min_clip: float = 0.01
    initial_clip: float | None = None  # start of the quantile estimate; None: the run's clip_norm
    group_by: str = "tier"
    private_quantile: bool = True  # False: non-private batch quantile, no formal DP guarantee
    quantile_lr: float = 0.2  # geometric update step of the private quantile tracker (Andrew et al. 2021)
    count_noise_std: float | None = None  # σ_b of the noisy clipped-fraction count; None: expected batch / 20

    def validate(self) -> None:
        _choice(self.name, "algorithm.name", ALGORITHMS)
        if self.name == "ino":
            _choice(self.idp_mode, "algorithm.idp_mode", ("sample", "scale"))
            _choice(self.tif, "algorithm.tif", TIF_SHAPES)
            if self.tail_length is None and self.tail_fraction is None:
                raise ConfigError("algorithm.tail_length", "INO-SGD needs tail_length or tail_fraction")
            if self.tail_length is not None:
                _finite_positive(self.tail_length, "algorithm.tail_length")
            elif self.tail_fraction is not None:
                _finite_positive(self.tail_fraction, "algorithm.tail_fraction")
            if self.tif == "beta":
                _finite_positive(self.alpha, "algorithm.alpha")
                _finite_positive(self.beta, "algorithm.beta")
            if self.tif == "power":
                _finite_positive(self.power, "algorithm.power")
            if self.tif == "step" and not (0 <= self.step_cut <= 1):
                raise ConfigError("algorithm.step_cut", f"must be in [0, 1], got {self.step_cut!r}")
            if self.tif == "piecewise":
                from engine.importance import PiecewiseLinearTIF

                try:
                    PiecewiseLinearTIF(self.knots)
                except ValueError as e:
                    raise ConfigError("algorithm.knots", str(e)) from None
        if self.name == "dpsgd_s":
            _finite_positive(self.tau, "algorithm.tau")
            if not (isinstance(self.quantile, (int, float)) and 0 < self.quantile < 1):
                raise ConfigError("algorithm.quantile", f"must be in (0, 1), got {self.quantile!r}")
            if not (0 <= self.ema < 1):
                raise ConfigError("algorithm.ema", f"must be in [0, 1), got {self.ema!r}")
            _finite_positive(self.min_clip, "algorithm.min_clip")
            _finite_positive(self.quantile_lr, "algorithm.quantile_lr")
            if self.initial_clip is not None:
                _finite_positive(self.initial_clip, "algorithm.initial_clip")
            if self.count_noise_std is not None:
                _finite_positive(self.count_noise_std, "algorithm.count_noise_std")
            _choice(self.group_by, "algorithm.group_by", GROUP_BY)


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "sgd"
    lr: float = 1.0
    momentum: float = 0.0

    def validate(self) -> None:
        _choice(self.name, "optimizer.name", OPTIMIZERS)
        _finite_positive(self.lr, "optimizer.lr")
        if not (0 <= self.momentum < 1):
            raise ConfigError("optimizer.momentum", f"must be in [0, 1), got {self.momentum!r}")


@dataclass(frozen=True)
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    tiers: TiersConfig = field(default_factory=TiersConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    epochs: float = 10.0  # digits: ~110 steps, a few seconds on a laptop CPU
    batch_size: int = 128
    delta: float = 1e-5
    clip_norm: float = 1.0
    seed: int = 0
    device: str = "auto"
    eval_every: int = 0  # steps between evaluations; 0: about 25 evaluations per run
    threads: int | None = None  # torch.set_num_threads; workers default to 1
    name: str = ""

    def validate(self) -> "RunConfig":
        self.data.validate()
        self.tiers.validate()
        self.model.validate()
        self.algorithm.validate()
        self.optimizer.validate()
        _finite_positive(self.epochs, "epochs")
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            raise ConfigError("batch_size", f"must be an integer >= 1, got {self.batch_size!r}")
        if not (isinstance(self.delta, (int, float)) and math.isfinite(self.delta) and 0 < self.delta < 1):
            raise ConfigError("delta", f"must be in (0, 1), got {self.delta!r}")
        _finite_positive(self.clip_norm, "clip_norm")
        _choice(self.device, "device", DEVICES)
        if not isinstance(self.eval_every, int) or self.eval_every < 0:
            raise ConfigError("eval_every", f"must be an integer >= 0, got {self.eval_every!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ConfigError("threads", f"must be an integer >= 1 or null, got {self.threads!r}")
        return self

    # --- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return _to_jsonable(dataclasses.asdict(self))

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace; equal configs give equal strings."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        return _from_dict(cls, d, "")

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        return cls.from_dict(parse_config_json(text))

    def replace(self, **changes) -> "RunConfig":
        """Copy with top-level fields or dotted sub-fields changed: replace(**{"algorithm.name": "dpsgd"})."""
        out = self
        for key, value in changes.items():
            out = _replace_path(out, key.split("."), value)
        return out

    @property
    def label(self) -> str:
        return self.name or ALGORITHM_LABELS.get(self.algorithm.name, self.algorithm.name)


def _replace_path(obj, path: list[str], value):
    if len(path) == 1:
        return dataclasses.replace(obj, **{path[0]: value})
    return dataclasses.replace(obj, **{path[0]: _replace_path(getattr(obj, path[0]), path[1:], value)})


def _to_jsonable(x):
    if isinstance(x, dict):
        return {k: _to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_jsonable(v) for v in x]
    return x


_NESTED = {
    "data": DataConfig,
    "tiers": TiersConfig,
    "model": ModelConfig,
    "algorithm": AlgorithmConfig,
    "optimizer": OptimizerConfig,
}


def _from_dict(cls, d: dict, prefix: str):
    if not isinstance(d, dict):
        raise ConfigError(prefix.rstrip(".") or "config", "must be a JSON object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ConfigError(prefix + unknown[0], f"unknown field; allowed: {', '.join(sorted(fields))}")
    kwargs = {}
    for name, value in d.items():
        path = prefix + name
        if cls is RunConfig and name in _NESTED:
            kwargs[name] = _from_dict(_NESTED[name], value, path + ".")
        elif cls is TiersConfig and name == "tiers":
            if not isinstance(value, list):
                raise ConfigError(path, "must be a list of tiers")
            kwargs[name] = tuple(_from_dict(TierConfig, t, f"{path}[{k}].") for k, t in enumerate(value))
        elif isinstance(value, list):
            kwargs[name] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        else:
            kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing (TierConfig.epsilon)
        raise ConfigError(prefix.rstrip(".") or "config", str(e)) from None


def parse_config_json(text: str) -> dict:
    """The JSON object of a configuration; ConfigError if it is not valid JSON or not an object."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError("config", f"not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise ConfigError("config", "the top level must be a JSON object")
    return d


def read_config_text(path: str) -> str:
    """A configuration file's text (JSON only: configs are never unpickled)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror}") from None


def load_config(path: str) -> RunConfig:
    """Read and validate a run configuration file."""
    return RunConfig.from_json(read_config_text(path)).validate()
