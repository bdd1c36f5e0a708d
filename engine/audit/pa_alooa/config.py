"""The audit's configuration: one frozen :class:`AuditConfig` that contains the :class:`RunConfig` its
models train with, plus the audit's own fields. JSON round-trip; every ConfigError names a dotted field.

    {"run": {"data": {"name": "adult", "data_dir": null, "max_train": null},
             "model": {"name": "lr", "hidden": [64]}, "tiers": null,
             "optimizer": {"name": "sgd", "lr": 1.0, "momentum": 0.0},
             "epochs": 2.0, "batch_size": 256, "delta": 1e-05, "clip_norm": 1.0, "seed": 0,
             "device": "auto", "threads": null},
     "epsilon": 10.0, "algorithms": [...], "R": 16, "group_by": "attribute", "group_attribute": null,
     "threshold": "held_out", "score": "logit_confidence", "n_boot": 1000, "confidence": 0.95,
     "null_perms": 20,
     "looa_k": 2, "looa_models": 16, "chunk_models": null, "memory_budget_gib": 1.0, "controls": false,
     "name": ""}

``controls: true`` (needs ``dpsgd_s`` and ``dpsgd`` among the algorithms) adds DP-SGD-S's two controls after
the listed algorithms: DP-SGD at the noise multiplier DP-SGD-S realised, and DP-SGD at the ε where its accuracy
equals DP-SGD-S's (``engine.audit.pa_alooa.controls``); both are compared with DP-SGD-S pairwise.

``run.tiers = null`` means one tier holding everyone at ``epsilon``. A ``run`` object in JSON only
needs the fields that differ from the audit's defaults (:data:`DEFAULT_RUN`; one level deep:
``{"run": {"data": {"max_train": 500}}}`` keeps Adult). ``run.algorithm``, ``run.eval_every`` and
``run.name`` are not part of an audit (the audit lists its ``algorithms`` and has its own ``name``).
Configs of the earlier flat shape (``dataset``, ``lr``, ``epochs`` … at the top) still load
(:func:`migrate_flat`), so audits already in a run store keep working.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from engine.config.job import parse_algorithms, parse_run, run_dict, validate_algorithms
from engine.config.run import (GROUP_BY, MAX_CHUNK_MODELS, AlgorithmConfig, DataConfig, ModelConfig, OptimizerConfig,
                               RunConfig, TierConfig, TiersConfig)
from engine.config.schema import (ConfigError, check_choice, check_int, check_number, check_positive, check_section,
                                  check_str, parse_config_json, parse_section, read_config_text, replace_dotted)
from engine.dp.algorithms import WITH_CONTROLS

AUDIT_MODELS = ("lr", "mlp", "cnn")
THRESHOLDS = ("in_sample", "held_out")
SCORES = ("logit_confidence", "loss")  # per-sample membership score, both float64 from the logits
DEFAULT_ALGORITHMS = (
    AlgorithmConfig(name="idp_sample"),
    AlgorithmConfig(name="ino"),
    AlgorithmConfig(name="dpsgd_s", group_by="attribute"),
    AlgorithmConfig(name="dpsgd"),
    AlgorithmConfig(name="nonprivate"),
)
# The audit's own defaults for the models it trains (RunConfig's defaults are the dashboard's digits run).
DEFAULT_RUN = RunConfig(data=DataConfig(name="adult"), tiers=None, model=ModelConfig(name="lr"),
                        optimizer=OptimizerConfig(lr=1.0), epochs=2.0, batch_size=256, delta=1e-5, clip_norm=1.0,
                        seed=0, device="auto", threads=None)
# RunConfig fields that an audit does not use: not written, refused when read.
_NOT_IN_AUDIT = {"algorithm": "an audit lists its algorithms in the top-level 'algorithms'",
                 "eval_every": "an audit evaluates every model once, at the end",
                 "name": "an audit's name is the top-level 'name'",
                 "secure_rng": "an audit's generators are seeded so that it resumes bit-identically",
                 "train_epochs": "an audit's models train their whole plan (run.epochs)",
                 "individual_epsilon": "an audit's models carry no panel: a training run's individual ε meets its GPR",
                 "seeds": "an audit's models are seeded by the audit (its 2R models are the repeats)",
                 "seed_index": "an audit's models are seeded by the audit (its 2R models are the repeats)"}
# The earlier flat audit config: top-level key → path in the run.
_FLAT = {"dataset": ("data", "name"), "data_dir": ("data", "data_dir"), "max_train": ("data", "max_train"),
         "model": ("model", "name"), "hidden": ("model", "hidden"), "lr": ("optimizer", "lr"),
         "epochs": ("epochs",), "batch_size": ("batch_size",), "delta": ("delta",), "clip_norm": ("clip_norm",),
         "seed": ("seed",), "device": ("device",), "threads": ("threads",), "tiers": ("tiers",)}


@dataclass(frozen=True)
class AuditConfig:
    """One PA-ALOOA audit. ``run.tiers=None`` means a single tier holding everyone at ``epsilon``."""

    run: RunConfig = DEFAULT_RUN  # data, model, tiers, optimizer, epochs, batch, δ, clip, seed, device, threads
    epsilon: float = 10.0  # the single tier's ε when run.tiers is None
    algorithms: tuple[AlgorithmConfig, ...] = DEFAULT_ALGORITHMS
    R: int = 16  # 2R models per algorithm
    group_by: str = "attribute"  # GPR groups: class | attribute | tier
    group_attribute: str | None = None  # None: the dataset's default sensitive attribute
    threshold: str = "held_out"  # held_out (unbiased; the default for Δ) | in_sample (the design's estimator)
    score: str = "logit_confidence"  # log p_y − log(1 − p_y) (LiRA's score) | loss (−cross-entropy); float64
    n_boot: int = 1000
    confidence: float = 0.95  # bootstrap CIs, the null Δ spread and Clopper-Pearson ε lower bounds
    null_perms: int = 20  # membership permutations: each group's null floor and the null Δ spread
    looa_k: int = 2  # PA-LOOA: records audited one at a time
    looa_models: int = 16  # PA-LOOA: models with / without each record
    chunk_models: int | None = None  # models trained at once; None: from the memory budget
    memory_budget_gib: float = 1.0  # working set of one training step of a chunk
    # DP-SGD-S's controls: noise-matched and accuracy-matched DP-SGD, audited on the same splits (paired)
    controls: bool = False
    name: str = ""

    def validate(self) -> "AuditConfig":
        run = self.run
        if not isinstance(run, RunConfig):
            raise ConfigError("run", f"must be a run configuration, got {type(run).__name__}")
        check_section(self, "", skip=("run", "algorithms"))  # every audit field's type, from its annotation
        if run.tiers is None:
            check_positive(self.epsilon, "epsilon")
        checked = run if run.tiers is not None else dataclasses.replace(run, tiers=single_tier(self.epsilon, (0,)))
        try:  # the run's own checks (with a stand-in single tier when tiers is None)
            checked.validate()
        except ConfigError as e:
            raise e.under("run.") from None
        check_choice(run.model.name, "run.model.name", AUDIT_MODELS)
        if run.data.max_train is not None:
            check_int(run.data.max_train, "run.data.max_train", 8)
        check_choice(run.optimizer.name, "run.optimizer.name", ("sgd",))  # the ensembles train with plain SGD
        if run.optimizer.momentum != 0:
            raise ConfigError("run.optimizer.momentum", f"the audit trains with plain SGD: must be 0, got "
                                                        f"{run.optimizer.momentum!r}")
        check_int(run.seed, "run.seed", 0)
        check_choice(self.group_by, "group_by", GROUP_BY)
        if self.group_attribute is not None:
            check_str(self.group_attribute, "group_attribute", max_len=200)
        validate_algorithms(self.algorithms)
        check_int(self.R, "R", 2, 100_000)
        check_choice(self.threshold, "threshold", THRESHOLDS)
        check_choice(self.score, "score", SCORES)
        check_int(self.n_boot, "n_boot", 10, 1_000_000)
        check_number(self.confidence, "confidence", 0, 1, low_open=True, high_open=True)
        check_int(self.null_perms, "null_perms", 1, 1000)
        check_int(self.looa_k, "looa_k", 0, 1000)
        if self.looa_k:
            check_int(self.looa_models, "looa_models", 2, 100_000)
        if self.chunk_models is not None:
            check_int(self.chunk_models, "chunk_models", 1, MAX_CHUNK_MODELS)
        check_positive(self.memory_budget_gib, "memory_budget_gib")
        if self.controls:
            names = [a.name for a in self.algorithms]
            s = WITH_CONTROLS[0]  # DP-SGD-S, and DP-SGD that its controls are (engine.dp.algorithms)
            missing = [n for n in (s.name, s.controls) if n not in names]
            if missing:
                raise ConfigError("controls", "the controls compare DP-SGD-S with DP-SGD at its noise and at its "
                                              f"accuracy: add {' and '.join(repr(n) for n in missing)} to algorithms")
        check_str(self.name, "name", max_len=200)
        return self

    @property
    def n_models(self) -> int:
        """2R: the models each algorithm trains (R complementary pairs), the design's one count of them."""
        return 2 * int(self.R)

    def run_for(self, algorithm: AlgorithmConfig, tiers: TiersConfig) -> RunConfig:
        """The run one of the audit's models is: this audit's run with ``algorithm`` and the resolved tiers."""
        return dataclasses.replace(self.run, algorithm=algorithm, tiers=tiers)

    # --- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["run"] = _run_dict(self.run)
        d["algorithms"] = [dataclasses.asdict(a) for a in self.algorithms]
        return json.loads(json.dumps(d))  # tuples → lists: exactly what the store gives back

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "AuditConfig":
        """Parse (not validate) an audit config; the earlier flat shape is migrated first."""
        if not isinstance(d, dict):
            raise ConfigError("config", "must be a JSON object")
        return parse_section(cls, migrate_flat(d), "", parsers={"run": _parse_run, "algorithms": parse_algorithms})

    @classmethod
    def from_json(cls, text: str) -> "AuditConfig":
        return cls.from_dict(parse_config_json(text))

    def replace(self, **changes) -> "AuditConfig":
        """Copy with fields changed; ``run.``-dotted keys change the run: ``replace(**{"run.epochs": 6.0})``."""
        out = self
        for key, value in changes.items():
            out = replace_dotted(out, key, value)
        return out


def single_tier(epsilon: float, classes) -> TiersConfig:
    """One tier holding every class at ``epsilon`` (the audit's tiers when ``run.tiers`` is None)."""
    return TiersConfig(assign="class", tiers=(TierConfig(epsilon=float(epsilon), classes=tuple(classes),
                                                         name=f"all (ε={epsilon:g})"),))


def migrate_flat(d: dict) -> dict:
    """An audit config dict of the earlier flat shape (``dataset``, ``lr``, ``tiers`` … at the top level)
    in the nested shape (``run.data.name``, ``run.optimizer.lr``, ``run.tiers`` …). Nested dicts pass
    through unchanged; a dict mixing ``run`` with flat keys is refused, naming the flat key."""
    flat = [k for k in d if k in _FLAT]
    if not flat:
        return d
    if "run" in d:
        key = sorted(flat)[0]
        raise ConfigError(key, f"moved to run.{'.'.join(_FLAT[key])}; give it inside 'run'")
    out = {k: v for k, v in d.items() if k not in _FLAT}
    run: dict = {}
    for key in flat:
        path = _FLAT[key]
        if len(path) == 1:
            run[path[0]] = d[key]
        else:
            run.setdefault(path[0], {})[path[1]] = d[key]
    out["run"] = run
    return out


def _parse_run(value, path: str) -> RunConfig:
    return parse_run(value, path, default=DEFAULT_RUN, refused=_NOT_IN_AUDIT)


def _run_dict(run: RunConfig) -> dict:
    return run_dict(run, _NOT_IN_AUDIT)


def load_audit_config(path: str) -> AuditConfig:
    """Read and validate an audit configuration file (JSON only)."""
    return AuditConfig.from_json(read_config_text(path)).validate()
