"""One frozen configuration tree per run, with JSON round-trip and validation.

Every run is described by a :class:`RunConfig`. Its canonical JSON (sorted keys, no
whitespace) is what the run store saves next to the results, so a run can always be
reproduced from the store alone. Validation happens in two stages:

* :meth:`RunConfig.validate` checks everything that can be checked without data;
* ``engine.dp.tiers.assign_tiers`` and ``engine.models.nets.build_model`` check what needs the
  dataset (empty tiers, classes in two tiers, model/shape mismatches, batch > data).

Both raise :class:`ConfigError`, which names the offending field and the allowed range,
so the CLI can print one line and the UI can show it in ``st.error``. Field *types* are checked
by the shared helpers of :mod:`engine.config.schema` (re-exported here: ``check_int``,
``check_number``, ``check_str``, ``parse_section`` ...) when JSON is parsed and again in
``validate()``; the limits (``MAX_*``, :mod:`engine.config.limits`, re-exported here) bound the work one config
can ask for.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field

from engine.config.algorithms import (ALGORITHM_LABELS, ALGORITHM_SPECS, ALGORITHMS, CLIP_RULES, GROUP_BY,  # noqa: F401
                                      MAX_GROUPS, MAX_KNOTS, NO_DP_REASONS, TIF_SHAPES, algorithm_spec,
                                      check_field_values, ignored_advisory, ignored_fields, no_formal_dp_reason,
                                      tif_knots_problem)
from engine.config.limits import (ACCOUNTANTS, DEFAULT_CLIP_NORM, DEFAULT_DELTA, LARGE_BATCH_FRACTION, LIFT_IN_CONFIG,  # noqa: F401
                                  MAX_AUDIT_MODEL_STEPS,
                                  MAX_BATCH_SIZE, MAX_CHUNK_MODELS, MAX_CLASS_ID, MAX_CNN_PADDING, MAX_DELTA,
                                  MAX_HIDDEN_LAYERS, MAX_HIDDEN_WIDTH, MAX_MODEL_PARAMS, MAX_NAME_CHARS,
                                  MAX_PATH_CHARS, MAX_SEED, MAX_SEEDS, MAX_THREADS, MAX_TIERS, MAX_TOTAL_STEPS,
                                  MAX_COLUMNS,
                                  MAX_TRAIN, STEPS_RULES, total_steps, check_work, check_epsilon, check_delta,
                                  check_batch_size, check_clip_norm, check_plan_request)
from engine.config.schema import (ConfigError, _show, check_choice, check_int, check_list, check_number, check_positive,
                                  check_section, check_str, parse_config_json, parse_section, read_config_text,
                                  replace_dotted)
from engine.data import dataset_names
from engine.data.errors import DataError
from engine.data.table_records import TableSchema


MODELS = ("auto", "lr", "mlp", "cnn", "resnet18")
TIER_ASSIGNMENTS = ("class", "attribute", "random", "explicit", "column")
#: data.name of a run on a researcher's own table (data.file set; issue 61)
TABLE_DATASET = "table"
OPTIMIZERS = ("sgd", "adam")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class DataConfig:
    """A registered dataset (``name``), or a researcher's own table (``file`` set: the file decides, ``name`` is
    then :data:`TABLE_DATASET`, "table", whatever the config says: an audit's run merges its data section over a
    preset's, whose name is a registered dataset's).
    The table's fields are :class:`engine.data.table_records.TableSchema`'s (its budget column is ``tiers.column``)."""

    name: str = "digits"
    data_dir: str | None = None  # None: $PRIVACY_LAB_DATA_DIR, else the user cache folder
    max_train: int | None = None  # stratified subsample of the training set (quick runs)
    file: str | None = None  # a CSV (.csv.gz) or Parquet table; a relative path resolves in the data folder
    label: str | None = None  # the table's target column
    attributes: tuple[str, ...] = ()  # the table's sensitive-attribute columns (groups, audits, fairness)
    features: tuple[str, ...] | None = None  # None: every other column
    categorical: tuple[str, ...] = ()  # columns read as categories even when they hold numbers
    split: str | None = None  # a column of "train" / "test"; None: a seeded stratified split

    def __post_init__(self):
        if self.file is not None:
            object.__setattr__(self, "name", TABLE_DATASET)

    def validate(self) -> None:
        check_section(self, "data.")
        check_choice(self.name, "data.name", (*dataset_names(), TABLE_DATASET))
        if self.data_dir is not None:
            check_str(self.data_dir, "data.data_dir", max_len=MAX_PATH_CHARS, nonempty=True)
            folder = os.path.expanduser(self.data_dir)
            if os.path.exists(folder) and not os.path.isdir(folder):  # never a silent fall-back to the shipped copy
                raise ConfigError("data.data_dir", f"{self.data_dir!r} is a file, not a folder: give the folder that "
                                                   "holds mnist/, adult/ …")
        if self.max_train is not None:
            check_int(self.max_train, "data.max_train", 2, MAX_TRAIN)
        self.validate_table()

    def validate_table(self) -> None:
        """The table's fields: each typed and bounded, then the schema's own checks (a column named twice …)."""
        table_fields = ("label", "attributes", "features", "categorical", "split")
        if self.file is None:
            if self.name == TABLE_DATASET:
                raise ConfigError("data.file", f'data.name "{TABLE_DATASET}" needs the table\'s path in data.file')
            given = [f for f in table_fields if getattr(self, f) not in ((), None)]
            if given:
                raise ConfigError(f"data.{given[0]}", "describes a table: set data.file too")
            return
        check_str(self.file, "data.file", max_len=MAX_PATH_CHARS, nonempty=True)
        if self.label is None:
            raise ConfigError("data.label", "a table needs its label column (the target the model predicts)")
        check_str(self.label, "data.label", max_len=MAX_NAME_CHARS, nonempty=True)
        for name in ("attributes", "features", "categorical"):
            for k, column in enumerate(check_list(getattr(self, name) or (), f"data.{name}", max_len=MAX_COLUMNS)):
                check_str(column, f"data.{name}[{k}]", max_len=MAX_NAME_CHARS, nonempty=True)
        if self.split is not None:
            check_str(self.split, "data.split", max_len=MAX_NAME_CHARS, nonempty=True)
        try:
            TableSchema(**self.schema_fields())
        except DataError as e:
            text = str(e)
            field = next((f"data.{f}" for f in table_fields if text.startswith(f"data.{f}")), "data")
            raise ConfigError(field, text.removeprefix(field + " ").rstrip(".")) from None

    def schema_fields(self, budget: str | None = None) -> dict:
        """The :class:`~engine.data.table_records.TableSchema` fields of this table (``budget``: tiers.column)."""
        return {"file": self.file, "label": self.label, "attributes": tuple(self.attributes),
                "features": None if self.features is None else tuple(self.features),
                "categorical": tuple(self.categorical), "split": self.split, "budget": budget}

    def advisories(self) -> list[ConfigError]:
        """A data folder that does not exist (a typo, an unmounted disk) is said, not refused: the datasets the lab
        ships (digits, MNIST, Adult) still load from its own copy, which is then what the run trains on."""
        if self.data_dir is not None and not os.path.exists(os.path.expanduser(self.data_dir)):
            return [ConfigError("data.data_dir", f"{self.data_dir!r} does not exist: {self.name} is read from the "
                                                 "lab's shipped copy if it has one (else it will not load)")]
        return []


@dataclass(frozen=True)
class TierConfig:
    """One privacy tier: a set of data owners sharing one ε (δ is the run's)."""

    epsilon: float
    classes: tuple[int, ...] = ()  # assign="class"
    values: tuple[str, ...] = ()  # assign="attribute": sensitive-attribute values
    ratio: float | None = None  # assign="random": fraction of the training samples
    name: str = ""

    def validate(self, prefix: str = "tiers.tiers[0].") -> None:
        check_section(self, prefix)
        check_epsilon(self.epsilon, prefix + "epsilon")
        for k, c in enumerate(self.classes):
            check_int(c, f"{prefix}classes[{k}]", 0, MAX_CLASS_ID)
        for k, v in enumerate(self.values):
            check_str(v, f"{prefix}values[{k}]", max_len=MAX_NAME_CHARS)
        if self.ratio is not None:
            check_number(self.ratio, prefix + "ratio", 0, 1, low_open=True)
        check_str(self.name, prefix + "name", max_len=MAX_NAME_CHARS)


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
    # assign="column": the table's column of each owner's ε; each distinct budget (or bin) is one tier with that ε
    # (engine.data.budgets). `tiers` is then made from the table when the data load (empty until then)
    column: str | None = None
    bins: tuple[float, ...] | None = None  # assign="column": upper edges grouping the budgets; a bin's ε: its smallest

    def __post_init__(self):
        if self.assign == "column" and self.tiers is PAPER_TIERS:  # the default tiers: the table makes them
            object.__setattr__(self, "tiers", ())

    def validate(self) -> None:
        check_section(self, "tiers.")
        check_choice(self.assign, "tiers.assign", TIER_ASSIGNMENTS)
        check_list(self.tiers, "tiers.tiers", max_len=MAX_TIERS, nonempty=self.assign != "column")
        self.validate_column()
        for k, tier in enumerate(self.tiers):
            tier.validate(f"tiers.tiers[{k}].")
        if self.attribute is not None:
            check_str(self.attribute, "tiers.attribute", max_len=MAX_NAME_CHARS, nonempty=True)
        if self.assign == "random":
            for k, t in enumerate(self.tiers):
                if t.ratio is None:
                    raise ConfigError(f"tiers.tiers[{k}].ratio", "must be in (0, 1] for a random split, got None")
            total = math.fsum(t.ratio for t in self.tiers)
            if abs(total - 1.0) > 1e-6:
                raise ConfigError("tiers.tiers", f"random ratios must sum to 1, got {total:.6g}")
        if self.assign in ("class", "attribute"):
            # each class (or attribute value) belongs to exactly one tier; the members are typed
            # (ints / strings) above, so the id compared here is the id training uses
            member, what = ("classes", "class") if self.assign == "class" else ("values", "value")
            seen: dict = {}
            for k, tier in enumerate(self.tiers):
                for item in getattr(tier, member):
                    key = int(item) if member == "classes" else item
                    if key in seen:
                        where = "this tier" if seen[key] == k else f"tier {seen[key]}"
                        raise ConfigError(f"tiers.tiers[{k}].{member}", f"{what} {_show(item)} is already assigned to {where}")
                    seen[key] = k
        if self.assign == "explicit":
            if not self.assignment:
                raise ConfigError("tiers.assignment", "explicit assignment needs one tier index per training sample")
            for i, a in enumerate(self.assignment):
                check_int(a, f"tiers.assignment[{i}]", 0, len(self.tiers) - 1)

    def validate_column(self) -> None:
        if self.assign != "column":
            for name in ("column", "bins"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"tiers.{name}", f'is read with tiers.assign "column" only, got assign '
                                                       f"{_show(self.assign)}")
            return
        if self.column is None:
            raise ConfigError("tiers.column", "tiers from a column need the column of each owner's ε")
        check_str(self.column, "tiers.column", max_len=MAX_NAME_CHARS, nonempty=True)
        if self.bins is not None:
            edges = check_list(self.bins, "tiers.bins", max_len=MAX_TIERS, nonempty=True)
            for k, e in enumerate(edges):
                check_positive(e, f"tiers.bins[{k}]")
                if k and e <= edges[k - 1]:
                    raise ConfigError(f"tiers.bins[{k}]", f"the upper edges must increase: {_show(edges[k - 1])} "
                                                          f"then {_show(e)}")


@dataclass(frozen=True)
class ModelConfig:
    name: str = "auto"  # auto: CNN for images, logistic regression for tabular data
    hidden: tuple[int, ...] = (64,)  # MLP hidden widths
    cnn_padding: int | None = None  # Papernot CNN's first-conv padding on 28×28 inputs; None: 3 (the reference uses 2)

    def validate(self) -> None:
        check_section(self, "model.")
        check_choice(self.name, "model.name", MODELS)
        check_hidden(self.hidden, "model.hidden", required=self.name == "mlp")
        if self.cnn_padding is not None:
            check_int(self.cnn_padding, "model.cnn_padding", 0, MAX_CNN_PADDING)


def check_hidden(hidden, field: str, *, required: bool = True) -> tuple[int, ...]:
    """MLP hidden widths: 1..MAX_HIDDEN_LAYERS integers in 1..MAX_HIDDEN_WIDTH, and the hidden-to-hidden
    weights alone within MAX_MODEL_PARAMS (``engine.models.nets`` checks the full model against the data)."""
    hidden = check_list(hidden, field, max_len=MAX_HIDDEN_LAYERS, nonempty=required)
    for k, h in enumerate(hidden):
        check_int(h, f"{field}[{k}]", 1, MAX_HIDDEN_WIDTH)
    inner = sum(a * b for a, b in zip(hidden, hidden[1:]))
    if inner > MAX_MODEL_PARAMS:
        raise ConfigError(field, f"{inner:,} hidden-layer weights, over the limit of {MAX_MODEL_PARAMS:,}")
    return hidden


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
    # DP-SGD-S (clip_rule "quantile"): group k's clip C_k = C · clamp(tau · S_k / mean_j S_j, c_min, c_max),
    # S_k the EMA of a (private) tracked quantile of group k's gradient norms, C the run's clip_norm.
    # clip_rule "reference" (fair-privacy's DP-SGD-S): C_k = C · min(c_max, ‖batch mean grad‖ / ‖group k's
    # batch mean grad‖), computed from the batch's gradients without privacy: no formal DP guarantee.
    clip_rule: str = "quantile"
    tau: float = 1.0
    quantile: float = 0.75
    ema: float = 0.9
    c_min: float = 0.5
    c_max: float = 4.0
    initial_clip: float | None = None  # start of the quantile estimate; None: the run's clip_norm
    group_by: str = "tier"
    # public group sizes (one per group, in the order of the group names: tiers, classes, sorted attribute
    # values) that normalise the private counts; None: sizes released once with Gaussian noise (accounted)
    group_sizes: tuple[int, ...] | None = None
    group_size_noise_std: float | None = None  # σ of that release; None: ≈ 1 % of the training RDP
    private_quantile: bool = True  # False: non-private batch quantile, no formal DP guarantee
    quantile_lr: float = 0.2  # geometric update step of the private quantile tracker (Andrew et al. 2021)
    count_noise_std: float | None = None  # σ_b of the noisy clipped-fraction count; None: max(expected batch / 20, 1.64 z, 1)

    @property
    def no_formal_dp_reason(self) -> str | None:
        """Why this algorithm has no formal DP guarantee (None: it has one): its spec's formal-DP rule
        (engine.config.algorithms; :func:`no_formal_dp_reason` by name)."""
        spec = ALGORITHM_SPECS.get(self.name)
        return None if spec is None else spec.no_formal_dp_reason(self)

    def validate(self, prefix: str = "algorithm.") -> None:
        """Types and values of every field whatever the algorithm (a value no algorithm accepts is refused even where
        this one ignores it: ``engine.config.algorithms.FIELD_CHECKS``), then what this algorithm needs beyond them
        (its spec's ``check``). ``prefix`` names the fields (an audit passes ``algorithms[k].``)."""
        p = prefix
        check_section(self, p)
        check_choice(self.name, p + "name", ALGORITHMS)
        check_field_values(self, p)
        spec = algorithm_spec(self.name)
        if spec.check is not None:
            spec.check(self, p)

    def ignored_fields(self) -> tuple[str, ...]:
        """The fields set away from their default that this algorithm does not read (its spec's ``fields``)."""
        return ignored_fields(self)

    def advisories(self, prefix: str = "algorithm.") -> list[ConfigError]:
        """A valid value this algorithm ignores, each as a ConfigError naming its field (a warning: the run trains
        as if it were unset)."""
        label = ALGORITHM_LABELS[self.name]
        return [ignored_advisory(f, getattr(self, f), [label], prefix) for f in self.ignored_fields()]


# The learning rates each optimizer trains the lab's models with (the presets and the papers: SGD 0.05–4 on
# clipped, averaged DP gradients; Adam 1e-4–1e-2), widened 10-fold or more each way: a value outside is far
# outside, and draws a warning before Launch (never a block: a researcher may mean it).
LR_TRAINS = {"sgd": (1e-4, 50.0), "adam": (1e-6, 0.1)}
MAX_LR = 1e38  # above float32's largest value (3.4e38) the optimizer's update raises instead of training


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "sgd"
    lr: float = 1.0
    momentum: float = 0.0

    def validate(self) -> None:
        check_section(self, "optimizer.")
        check_choice(self.name, "optimizer.name", OPTIMIZERS)
        check_positive(self.lr, "optimizer.lr")
        check_number(self.lr, "optimizer.lr", 0, MAX_LR, low_open=True)  # a step torch's float32 update can take
        check_number(self.momentum, "optimizer.momentum", 0, 1, high_open=True)

    def advisories(self) -> list[ConfigError]:
        """Valid settings far from what trains, each as a ConfigError naming its field (a warning, not a
        refusal): a learning rate outside :data:`LR_TRAINS`."""
        lo, hi = LR_TRAINS[self.name]
        if self.lr > hi:
            return [ConfigError("optimizer.lr", f"{self.lr:g} is far above the learning rates {self.name.upper()} "
                                                f"trains with (up to about {hi:g}): expect the run to diverge")]
        if self.lr < lo:
            return [ConfigError("optimizer.lr", f"{self.lr:g} is far below the learning rates {self.name.upper()} "
                                                f"trains with (from about {lo:g}): expect the model to barely move")]
        return []


@dataclass(frozen=True)
class RunConfig:
    """One run. Work is bounded: a run may plan at most :data:`MAX_TOTAL_STEPS` optimizer steps
    (:func:`total_steps`; ``epochs`` alone over it is refused before any data is loaded, the exact count
    once the training-set size is known, see :meth:`planned_steps`). ``allow_large: true`` is the
    explicit flag that lifts the cap (it is saved with the config, so the store shows it was asked for)."""

    data: DataConfig = field(default_factory=DataConfig)
    tiers: TiersConfig = field(default_factory=TiersConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    epochs: float = 10.0  # digits: ~110 steps, a few seconds on a laptop CPU
    batch_size: int = 128
    delta: float = DEFAULT_DELTA
    accountant: str = "rdp"  # whose ε the plan meets and the run reports: rdp | prv | pld (engine.dp.accountants)
    clip_norm: float = DEFAULT_CLIP_NORM
    seed: int = 0
    device: str = "auto"
    eval_every: int = 0  # steps between evaluations; 0: about 25 evaluations per run
    threads: int | None = None  # torch.set_num_threads; workers default to 1
    name: str = ""
    allow_large: bool = False  # True: lift the MAX_TOTAL_STEPS cap on planned work
    secure_rng: bool = False  # sampling and noise from an OS-seeded generator (not reproducible; Opacus' secure mode)
    steps_rule: str = "round"  # total_steps: "round" round(E·N/B) | "floor_per_epoch" E·⌊N/B⌋ (the reference's)
    train_epochs: float | None = None  # stop after this many of the planned `epochs` (plan, σ, q are for `epochs`)
    # per group the individual ε the run spent on a seeded panel of training samples (engine.dp.individual_panel;
    # ~10 % extra training time); false: skip it. Runs without a formal DP guarantee get none either way
    individual_epsilon: bool = True
    # "repeat over k seeds": one job trains `seeds` models together (the model axis, M = seeds); model j starts
    # from seed `base + j`. The store keeps one row per model: row j's config has seed = base + j,
    # seed_index = j (base = seed - seed_index; see seed_configs / job_config).
    seeds: int = 1
    seed_index: int = 0

    def validate(self) -> "RunConfig":
        check_section(self, "", skip=("data", "tiers", "model", "algorithm", "optimizer"))
        self.data.validate()
        self.tiers.validate()
        if self.tiers.assign == "column" and self.data.file is None:
            raise ConfigError("tiers.assign", '"column" reads each owner\'s ε from a table: set data.file')
        if self.tiers.column is not None and self.tiers.column in (self.data.label, self.data.split,
                                                                   *self.data.attributes, *(self.data.features or ())):
            raise ConfigError("tiers.column", f"{_show(self.tiers.column)} is also a data column of another role "
                                              "(label, split, attribute or feature)")
        self.model.validate()
        self.algorithm.validate()
        self.optimizer.validate()
        check_positive(self.epochs, "epochs")
        check_batch_size(self.batch_size)
        # total_steps >= epochs since batch_size <= n_train is required: refuse before loading any data
        check_work(max(1, int(round(self.epochs))), "epochs", allow_large=self.allow_large, at_least=True)
        check_delta(self.delta)
        check_choice(self.accountant, "accountant", ACCOUNTANTS)
        check_clip_norm(self.clip_norm)
        check_int(self.seed, "seed", 0, MAX_SEED)
        check_int(self.seeds, "seeds", 1, MAX_SEEDS)
        check_int(self.seed_index, "seed_index", 0, self.seeds - 1)
        if self.seed_index > self.seed:
            raise ConfigError("seed_index", f"must be at most seed = {self.seed} (the job's base seed is "
                                            f"seed - seed_index), got {self.seed_index}")
        if self.seed - self.seed_index + self.seeds - 1 > MAX_SEED:
            raise ConfigError("seed", f"base seed + seeds - 1 must be at most {MAX_SEED}, got "
                                      f"{self.seed - self.seed_index} + {self.seeds - 1}")
        check_choice(self.device, "device", DEVICES)
        check_int(self.eval_every, "eval_every", 0, MAX_SEED)
        if self.threads is not None:
            check_int(self.threads, "threads", 1, MAX_THREADS)
        check_str(self.name, "name", max_len=MAX_NAME_CHARS)
        check_choice(self.steps_rule, "steps_rule", STEPS_RULES)
        if self.train_epochs is not None:
            check_number(self.train_epochs, "train_epochs", 0, self.epochs, low_open=True)
        return self

    def advisories(self, n_train: int | None = None) -> list[ConfigError]:
        """Valid settings far from what trains or that the algorithm ignores (warnings shown before Launch and by the
        CLI, never a refusal), each a ConfigError naming its field; with the training-set size ``n_train``, also
        :meth:`batch_advisories`."""
        return comparison_advisories([self]) + ([] if n_train is None else self.batch_advisories(n_train))

    def batch_advisories(self, n_train: int) -> list[ConfigError]:
        """A batch over :data:`LARGE_BATCH_FRACTION` of the ``n_train`` training samples (a batch size carried over
        from a larger dataset): few steps, each sampling so many of the data that the accountant gets little
        amplification from subsampling and plans much more noise per step for the same ε."""
        n, b = int(n_train), int(self.batch_size)
        if n < 1 or b <= LARGE_BATCH_FRACTION * n or b > n:  # (a batch over the data is refused once they load)
            return []
        steps = total_steps(self.epochs, n, b, self.steps_rule)
        return [ConfigError("batch_size", f"{b} is {b / n:.0%} of the {n:,} training samples: {steps:,} steps in "
                                          f"all, each sampling so much of the data that the plan needs far more "
                                          f"noise for the same ε; a batch of at most {int(LARGE_BATCH_FRACTION * n):,} "
                                          "trains more steps at less noise")]

    def planned_steps(self, n_train: int) -> int:
        """:func:`total_steps` for a training set of ``n_train`` samples, refused (ConfigError naming
        ``epochs``) over :data:`MAX_TOTAL_STEPS` unless ``allow_large``."""
        return check_work(total_steps(self.epochs, n_train, self.batch_size, self.steps_rule), "epochs",
                          allow_large=self.allow_large)

    def trained_steps(self, n_train: int) -> int:
        """Steps actually trained: :meth:`planned_steps`, or with ``train_epochs`` the first
        :func:`total_steps` (train_epochs, …) of them — the privacy plan is still made for ``epochs``."""
        planned = self.planned_steps(n_train)
        if self.train_epochs is None:
            return planned
        return min(planned, total_steps(self.train_epochs, n_train, self.batch_size, self.steps_rule))

    # --- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """JSON-able dict of every field; ``seeds`` and ``seed_index`` are left out at their defaults (1, 0),
        so a single-seed config's canonical JSON (and any hash of it) is what it was before they existed."""
        d = _to_jsonable(dataclasses.asdict(self))
        for key, default in _OMIT_AT_DEFAULT.items():
            if d.get(key) == default and type(d.get(key)) is type(default):
                del d[key]
        for section, defaults in _OMIT_SECTION_AT_DEFAULT.items():  # a config without a table: JSON as before
            for key, default in defaults.items():
                if isinstance(d.get(section), dict) and key in d[section] and d[section][key] == default:
                    del d[section][key]
        return d

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
            out = replace_dotted(out, key, value)
        return out

    # --- seeds on the model axis ---------------------------------------------------------
    @property
    def base_seed(self) -> int:
        """The seed of model 0 of this config's job (``seed - seed_index``)."""
        return self.seed - self.seed_index

    def job_config(self) -> "RunConfig":
        """The config of the whole job this (per-seed) config belongs to: base seed, seed_index 0."""
        return self if self.seed_index == 0 else dataclasses.replace(self, seed=self.base_seed, seed_index=0)

    def seed_configs(self) -> list["RunConfig"]:
        """One config per model of the job (the rows the store keeps): seed = base + j, seed_index = j."""
        base = self.base_seed
        return [dataclasses.replace(self, seed=base + j, seed_index=j) for j in range(self.seeds)]

    @property
    def label(self) -> str:
        return self.name or ALGORITHM_LABELS.get(self.algorithm.name, self.algorithm.name)


def comparison_advisories(configs) -> list[ConfigError]:
    """The advisories of a comparison, runs whose configs differ only in their algorithm (the Train form): the data
    and optimizer ones once, and a valid value that every algorithm of the comparison ignores, in one sentence
    naming them (a value one of them reads is no advisory: that run uses it)."""
    if not configs:
        return []
    first = configs[0]
    ignored = set(first.algorithm.ignored_fields()).intersection(*(c.algorithm.ignored_fields() for c in configs))
    labels = [ALGORITHM_LABELS[c.algorithm.name] for c in configs]
    algorithm = [ignored_advisory(f, getattr(first.algorithm, f), labels)
                 for f in first.algorithm.ignored_fields() if f in ignored]
    return first.data.advisories() + first.optimizer.advisories() + algorithm


_OMIT_AT_DEFAULT = {"seeds": 1, "seed_index": 0, "accountant": "rdp"}
_OMIT_SECTION_AT_DEFAULT = {"data": {"file": None, "label": None, "attributes": [], "features": None,
                                     "categorical": [], "split": None},
                            "tiers": {"column": None, "bins": None}}


def _to_jsonable(x):
    if isinstance(x, dict):
        return {k: _to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_jsonable(v) for v in x]
    return x


def parse_tiers_param(text: str) -> TiersConfig:
    """The dashboard's ``?tiers=`` URL value (the JSON of a TiersConfig), parsed and validated by the
    same code as a config file; one ConfigError (field ``tiers…``) for anything else."""
    d = parse_config_json(text, what="tiers")
    tiers = parse_section(TiersConfig, d, "tiers.")
    tiers.validate()
    return tiers


def load_config(path: str) -> RunConfig:
    """Read and validate a run configuration file."""
    return RunConfig.from_json(read_config_text(path)).validate()
