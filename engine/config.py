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

    def under(self, prefix: str) -> "ConfigError":
        """The same error with ``prefix`` put before its field (``e.under("run.")``: ``run.data.name``)."""
        field = prefix.rstrip(".") if self.field == "config" else prefix + self.field
        return ConfigError(field, self.message)


# --- typed field checks (shared by every config type: run, audit, URL parameters) -----------------
# Each returns the value unchanged when it is valid and raises one ConfigError naming ``field``
# otherwise; none lets a TypeError/ValueError/OverflowError escape, whatever the value is.

def _show(value: Any, limit: int = 60) -> str:
    """A short one-line repr of a (possibly hostile) value for an error message."""
    try:
        text = repr(value)
    except Exception:  # e.g. an int over Python's int-string limit
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _type_name(value: Any) -> str:
    return {bool: "a boolean", str: "a string", int: "an integer", float: "a number", list: "a list",
            tuple: "a list", dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def check_int(value: Any, field: str, low: int | None = None, high: int | None = None) -> int:
    """An integer (not a bool, float or string) with ``low <= value <= high`` (bounds inclusive)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(field, f"must be an integer, got {_type_name(value)} {_show(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        rng = f">= {low}" if high is None else f"<= {high}" if low is None else f"in {low}..{high}"
        raise ConfigError(field, f"must be an integer {rng}, got {_show(value)}")
    return value


def check_number(value: Any, field: str, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False) -> float:
    """A finite int or float (not a bool or string) in the interval [low, high]; ``low_open`` /
    ``high_open`` exclude the bound. Returns the value unchanged (an int stays an int)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigError(field, f"must be a number, got {_type_name(value)} {_show(value)}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise ConfigError(field, f"must be a finite number, got {_show(value)}")
    if (low is not None and (value <= low if low_open else value < low)) or \
            (high is not None and (value >= high if high_open else value > high)):
        lo = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
        hi = "" if high is None else f"{high:g}" + (")" if high_open else "]")
        if low is None:
            rng = f"{'<' if high_open else '<='} {high:g}"
        elif high is None:
            rng = f"{'>' if low_open else '>='} {low:g}"
        else:
            rng = f"in {lo}, {hi}"
        raise ConfigError(field, f"must be a number {rng}, got {_show(value)}")
    return value


def check_positive(value: Any, field: str) -> float:
    """A finite number > 0."""
    return check_number(value, field, 0, None, low_open=True)


def check_str(value: Any, field: str, *, max_len: int = 1000, nonempty: bool = False) -> str:
    """A string without NUL bytes, at most ``max_len`` characters (non-empty if asked)."""
    if not isinstance(value, str):
        raise ConfigError(field, f"must be a string, got {_type_name(value)} {_show(value)}")
    if "\x00" in value:
        raise ConfigError(field, "must not contain a NUL byte")
    if len(value) > max_len:
        raise ConfigError(field, f"must be at most {max_len} characters, got {len(value)}")
    if nonempty and not value.strip():
        raise ConfigError(field, "must not be empty")
    return value


def check_bool(value: Any, field: str) -> bool:
    """true or false (not 0/1 or a string)."""
    if not isinstance(value, bool):
        raise ConfigError(field, f"must be true or false, got {_type_name(value)} {_show(value)}")
    return value


def check_choice(value: Any, field: str, allowed) -> str:
    """One of the ``allowed`` strings."""
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(field, f"unknown value {_show(value)}; allowed: {', '.join(allowed)}")
    return value


def check_list(value: Any, field: str, *, max_len: int | None = None, nonempty: bool = False) -> tuple:
    """A JSON list (a tuple or list in Python), at most ``max_len`` long; returned as a tuple."""
    if not isinstance(value, (list, tuple)):
        raise ConfigError(field, f"must be a list, got {_type_name(value)} {_show(value)}")
    if max_len is not None and len(value) > max_len:
        raise ConfigError(field, f"must have at most {max_len} entries, got {len(value)}")
    if nonempty and not value:
        raise ConfigError(field, "must not be empty")
    return tuple(value)


def _finite_positive(value: Any, name: str) -> None:
    check_positive(value, name)


def _choice(value: Any, name: str, allowed: tuple[str, ...]) -> None:
    check_choice(value, name, allowed)


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
    secure_rng: bool = False  # sampling and noise from an OS-seeded generator (not reproducible; Opacus' secure mode)

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
        if not isinstance(self.secure_rng, bool):
            raise ConfigError("secure_rng", f"must be true or false, got {self.secure_rng!r}")
        return self

    # --- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return _to_jsonable(dataclasses.asdict(self))

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace; equal configs give equal strings."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        return parse_section(cls, d, "")

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


_SCALARS = {int: check_int, float: check_number, str: check_str, bool: check_bool}


def _field_types(cls) -> dict:
    import typing

    return typing.get_type_hints(cls)


def parse_value(hint: Any, value: Any, path: str, *, convert: bool = True) -> Any:
    """Check ``value`` against a field's type annotation and return it in its frozen form (JSON lists
    become tuples, objects become the annotated dataclass). Supported: ``int``, ``float``, ``str``,
    ``bool``, ``X | None``, ``tuple[X, ...]``, ``tuple[X, Y]``, and nested dataclasses. ``convert=False``
    only checks (dataclass values must then already be instances)."""
    import types
    import typing

    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return parse_value(rest[0], value, path, convert=convert)
        return value  # a union the schema does not describe: the owner's validate() checks it
    if origin is tuple:
        args = typing.get_args(hint)
        items = check_list(value, path)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(parse_value(args[0], v, f"{path}[{k}]", convert=convert) for k, v in enumerate(items))
        if len(items) != len(args):
            raise ConfigError(path, f"must be a list of {len(args)} entries, got {_show(value)}")
        return tuple(parse_value(a, v, f"{path}[{k}]", convert=convert) for k, (a, v) in enumerate(zip(args, items)))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return check_section(value, path + ".") if not convert else value
        if not convert:
            raise ConfigError(path, f"must be a {hint.__name__}, got {_type_name(value)} {_show(value)}")
        return parse_section(hint, value, path + ".")
    if hint in _SCALARS:
        return _SCALARS[hint](value, path)
    return value  # unannotated / Any: the owner's validate() checks it


def parse_section(cls, data: Any, prefix: str = "", *, parsers: dict | None = None):
    """Build the frozen dataclass ``cls`` from a JSON object, checking every field's type from its
    annotation (see :func:`parse_value`); unknown fields, missing required fields and wrong types raise
    one ConfigError naming the dotted field (``prefix`` + name, e.g. ``"run.data."``). ``parsers`` maps
    a field name to ``fn(value, path) -> parsed`` for fields the annotation cannot describe."""
    where = prefix.rstrip(".") or "config"
    if not isinstance(data, dict):
        raise ConfigError(where, f"must be a JSON object, got {_type_name(data)} {_show(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        raise ConfigError(prefix + unknown[0], f"unknown field; allowed: {', '.join(sorted(fields))}")
    hints = _field_types(cls)
    kwargs = {}
    for name, value in data.items():
        path = prefix + name
        if parsers and name in parsers:
            kwargs[name] = parsers[name](value, path)
        else:
            kwargs[name] = parse_value(hints.get(name, Any), value, path)
    missing = [n for n, f in fields.items() if n not in kwargs and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(prefix + missing[0], "is required")
    return cls(**kwargs)


def check_section(obj, prefix: str = "", *, skip: tuple[str, ...] = ()):
    """Type-check every field of a dataclass instance built in Python (same rules as
    :func:`parse_section`; nested dataclasses are checked too). Returns ``obj``."""
    hints = _field_types(type(obj))
    for f in dataclasses.fields(obj):
        if f.name not in skip:
            parse_value(hints.get(f.name, Any), getattr(obj, f.name), prefix + f.name, convert=False)
    return obj


_from_dict = parse_section  # old private name, kept while other modules move to parse_section


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
