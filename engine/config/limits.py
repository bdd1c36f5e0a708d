"""The documented limits on the work and values one config may ask for, the one steps formula, and the checks of the
fields a privacy plan is made of (ε, δ, batch size, clip norm, steps): a run config's ``validate()`` and a plan asked
for without one (``privacy-lab plan``'s flags, :func:`check_plan_request`) go through the same ones.
``engine.config.run`` re-exports every name here.
"""
from __future__ import annotations

import math

from engine.config.schema import ConfigError, _show, check_int, check_list, check_number, check_positive

# --- documented limits (a config over them is refused with a ConfigError naming the field) --------
MAX_TOTAL_STEPS = 1_000_000  # optimizer steps of one run; RunConfig.allow_large=True lifts it
MAX_AUDIT_MODEL_STEPS = 50_000_000  # audits: models trained × steps each (engine.audit); same override
MAX_THREADS = 64
MAX_CHUNK_MODELS = 4096  # audits: models trained at once in one chunk (engine.audit)
MAX_BATCH_SIZE = 10_000_000
MAX_HIDDEN_WIDTH = 65_536
MAX_HIDDEN_LAYERS = 16
MAX_MODEL_PARAMS = 50_000_000  # weights of the model built for the data (engine.models.nets)
MAX_TIERS = 1_000
MAX_CLASS_ID = 1_000_000
MAX_NAME_CHARS = 200
MAX_PATH_CHARS = 4096
MAX_COLUMNS = 100_000  # a table's columns one config may name (data.attributes, data.features, data.categorical)
MAX_SEED = 2**63 - 1
MAX_SEEDS = 16  # RunConfig.seeds: models trained together on the model axis of one job
MAX_TRAIN = 10**9  # training samples: data.max_train, a plan's tiers in all
# δ above it certifies nothing. (Below it, at δ ≈ 0.05–0.5, RDP's conversion gives ε ≤ 0 for some σ: the searches
# take that as the feasible side, engine.dp.accounting._log_epsilon; before, they never ended.)
MAX_DELTA = 0.5
STEPS_RULES = ("round", "floor_per_epoch")
#: a run config's δ and clip norm when it names none (RunConfig's defaults; privacy-lab plan's without a config)
DEFAULT_DELTA = 1e-5
DEFAULT_CLIP_NORM = 1.0
#: the accountants a run may plan and report under (engine.dp.accountants implements one per name)
ACCOUNTANTS = ("rdp", "prv", "pld")
MAX_CNN_PADDING = 8
# a batch above this fraction of the training set draws an advisory (RunConfig.batch_advisories): digits' 1,437
# samples at the batch of 512 the MNIST comparison trains with gave 56 steps at σ = 5.7 (issue 58)
LARGE_BATCH_FRACTION = 0.25


def total_steps(epochs: float, n_train: int, batch_size: int, rule: str = "round") -> int:
    """Optimizer steps of a run, at least 1. The one steps formula (training, audits, previews and the
    work cap all use it). ``rule``: "round" (default) T = round(E · N / B) — 12 epochs of MNIST at B = 512
    are 1406 steps; "floor_per_epoch" T = E · ⌊N / B⌋ (rounded), the reference code's count (1404)."""
    if rule == "floor_per_epoch":
        steps = epochs * (n_train // batch_size)
    else:
        steps = epochs * n_train / batch_size
    if not math.isfinite(steps):
        raise ConfigError("epochs", f"plans too many steps ({_show(epochs)} epochs)")
    return max(1, int(round(steps)))


LIFT_IN_CONFIG = 'set "allow_large": true in the run config'


def check_work(work: int, field: str, *, limit: int = MAX_TOTAL_STEPS, allow_large: bool = False,
               what: str = "steps", at_least: bool = False, lift: str = LIFT_IN_CONFIG) -> int:
    """Refuse planned work over ``limit`` unless ``allow_large``: one ConfigError naming ``field``
    (the knob to turn down, e.g. ``epochs`` or ``R``) with the estimate and how to lift the cap (``lift``: the
    config's flag, or a command's). ``at_least``: ``work`` is a lower bound (known before the data are), and the
    message says so."""
    if work > limit and not allow_large:
        shown = ("at least " if at_least else "") + (f"{work:,}" if work < 1e12 else f"{work:.3g}")
        raise ConfigError(field, f"plans {shown} {what}, over the limit of {limit:,}; lower it, "
                                 f"or {lift} to run it anyway")
    return work


# --- the fields a privacy plan is made of: one check each, for a run config and a plan asked for without one -------

def check_epsilon(value, field: str) -> float:
    """A tier's ε: a finite number > 0."""
    return check_positive(value, field)


def check_delta(value, field: str = "delta") -> float:
    """The run's δ: in (0, :data:`MAX_DELTA`]."""
    return check_number(value, field, 0, MAX_DELTA, low_open=True)


def check_batch_size(value, field: str = "batch_size") -> int:
    """A batch size: an integer in 1..:data:`MAX_BATCH_SIZE`."""
    return check_int(value, field, 1, MAX_BATCH_SIZE)


def check_clip_norm(value, field: str = "clip_norm") -> float:
    """The base clip norm C: a finite number > 0."""
    return check_positive(value, field)


def check_plan_request(*, epsilons, tier_sizes, delta, batch_size, clip_norm, steps, allow_large: bool = False,
                       fields: dict | None = None, lift: str = LIFT_IN_CONFIG) -> None:
    """A privacy plan asked for without a run config (``privacy-lab plan``'s flags): each value through the check
    and cap of the run config's field it stands for (a tier's ε, δ, batch size, clip norm, the steps cap of
    :data:`MAX_TOTAL_STEPS`, at most :data:`MAX_TIERS` tiers of at most :data:`MAX_TRAIN` samples in all, a batch
    no larger than them), so the planner is never asked what a run config refuses. ``fields``: field → the name
    an error gives it (a command's flag); ``lift``: how that command lifts the steps cap."""
    name = {"epsilons": "epsilons", "tier_sizes": "tier_sizes", "delta": "delta", "batch_size": "batch_size",
            "clip_norm": "clip_norm", "steps": "steps", **(fields or {})}
    epsilons = check_list(epsilons, name["epsilons"], max_len=MAX_TIERS, nonempty=True)
    for k, e in enumerate(epsilons):
        check_epsilon(e, f"{name['epsilons']}[{k}]")
    sizes = check_list(tier_sizes, name["tier_sizes"], max_len=MAX_TIERS, nonempty=True)
    if len(sizes) != len(epsilons):
        raise ConfigError(name["tier_sizes"], f"needs one size per tier's ε: {len(epsilons)} ε, {len(sizes)} sizes")
    for k, n in enumerate(sizes):
        check_int(n, f"{name['tier_sizes']}[{k}]", 1, MAX_TRAIN)
    if sum(sizes) > MAX_TRAIN:
        raise ConfigError(name["tier_sizes"], f"{sum(sizes):,} samples in all, over the limit of {MAX_TRAIN:,}")
    check_delta(delta, name["delta"])
    check_batch_size(batch_size, name["batch_size"])
    if batch_size > sum(sizes):
        raise ConfigError(name["batch_size"], f"must be at most the {sum(sizes):,} samples of the tiers, got "
                                              f"{batch_size:,}")
    check_clip_norm(clip_norm, name["clip_norm"])
    check_int(steps, name["steps"], 1)
    check_work(steps, name["steps"], allow_large=allow_large, lift=lift)
