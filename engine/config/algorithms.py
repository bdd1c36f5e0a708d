"""The algorithms' plain facts: one frozen :class:`AlgorithmSpec` per algorithm, the one table of them.

    ALGORITHM_SPECS / algorithm_spec(name)   config name → AlgorithmSpec: its label, colour and marker, what the
                                             planner plans for it, its formal-DP rule, the config fields it
                                             uses (validated here), what its gains are measured against, its
                                             audit controls, its grouping, its own figures, its picker place
    no_formal_dp_reason(algorithm, …)        the formal-DP rule by name (a spec's ``no_formal_dp_reason``)

This is the configuration layer's half of the algorithm registry: what ``engine.config.run`` (validation,
labels, the formal-DP rule) needs, and every other fact that is plain data. ``engine.dp.algorithms`` builds the
registry the layers above read on it (one ``Algorithm`` per spec, adding the mechanism factory and what the
privacy preparation fixes before step 1), so every fact has one owner and nothing above branches on a name.
"""
from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.config.schema import (ConfigError, _show, check_choice, check_int, check_list, check_number,
                                  check_positive)

TIF_SHAPES = ("beta", "linear", "power", "step", "piecewise")
GROUP_BY = ("tier", "class", "attribute")
CLIP_RULES = ("quantile", "reference")  # DP-SGD-S: the lab's bounded relative quantile rule; fair-privacy's rule
MAX_GROUPS = 100_000
MAX_KNOTS = 1_000

# A spec's ``plan_mode``: what engine.dp.accounting plans (one of its MODES: one σ for everybody "dpsgd", per-tier
# sampling rates "sample", per-tier clip norms "scale"); IDP_MODE: the one the config's ``idp_mode`` names (INO-SGD
# builds on either IDP-SGD); None: no plan (the non-private reference).
IDP_MODE = "idp_mode"

NO_DP_REASONS = {
    "nonprivate": "non-private SGD (no clipping, no noise)",
    "nonprivate_quantile": "DP-SGD-S with a non-private quantile (the exact batch quantile of gradient norms)",
    "reference": "DP-SGD-S with the reference clip rule (clips from the batch's gradients, not privatised)",
}


def _formal(config) -> str | None:
    return None


def _no_noise(config) -> str | None:
    return NO_DP_REASONS["nonprivate"]


def group_clip_no_dp_reason(*, private_quantile: bool, clip_rule: str) -> str | None:
    """DP-SGD-S's rule: its clips are private only from a privately tracked quantile (``engine.dp.mechanisms.
    GroupAdaptive`` asks here too)."""
    if clip_rule == "reference":
        return NO_DP_REASONS["reference"]
    if not private_quantile:
        return NO_DP_REASONS["nonprivate_quantile"]
    return None


def _group_clip_reason(config) -> str | None:
    return group_clip_no_dp_reason(private_quantile=config.private_quantile, clip_rule=config.clip_rule)


def tif_knots_problem(knots) -> str | None:
    """Why ``knots`` (u, TIF(u)) are no valid piecewise-linear TIF, or None: they must start at u = 0, end at
    u = 1, have strictly increasing u and non-decreasing values inside [0, 1] — otherwise INO-SGD's
    sensitivity bound fails. The one rule (``engine.dp.importance.PiecewiseLinearTIF`` refuses the same)."""
    pts = np.asarray(knots, dtype=float)
    if pts.ndim != 2 or pts.shape[1] != 2 or len(pts) < 2:
        return "a piecewise TIF needs at least two (u, value) knots"
    u, y = pts[:, 0], pts[:, 1]
    if not np.all(np.isfinite(pts)):
        return "TIF knots must be finite"
    if u[0] != 0.0 or u[-1] != 1.0 or np.any(np.diff(u) <= 0):
        return "TIF knots must have strictly increasing u from 0 to 1"
    if np.any(y < 0) or np.any(y > 1):
        return "TIF values must stay inside [0, 1]"
    if np.any(np.diff(y) < 0):
        return "TIF must be non-decreasing (a decreasing TIF breaks the sensitivity bound)"
    return None


IDP_MODES = ("sample", "scale")  # INO-SGD's ``idp_mode``: the IDP-SGD planner it builds on


def _optional_positive(value, field: str) -> None:
    if value is not None:
        check_positive(value, field)


def _check_knots(knots, field: str) -> None:
    check_list(knots, field, max_len=MAX_KNOTS)
    if knots:  # () is the default of every algorithm (and INO-SGD's piecewise TIF needs knots: _check_ino)
        _refuse_bad_knots(knots, field)


def _refuse_bad_knots(knots, field: str) -> None:
    try:
        problem = tif_knots_problem(knots)
    except (ValueError, TypeError) as e:  # not numbers at all
        problem = str(e)
    if problem is not None:
        raise ConfigError(field, problem)


def _check_group_sizes(sizes, field: str) -> None:
    if sizes is not None:
        check_list(sizes, field, max_len=MAX_GROUPS, nonempty=True)
        for k, n in enumerate(sizes):
            check_int(n, f"{field}[{k}]", 1, 10**12)


# The values each AlgorithmConfig field may take for ANY algorithm (field → check(value, dotted field)): a value
# outside is refused whatever the algorithm, including one that ignores the field (a quantile of 1.5 is nobody's
# quantile). Which algorithm reads which field is its spec's ``fields``; a valid value an algorithm ignores is
# an advisory (:func:`ignored_fields`), not a refusal.
FIELD_CHECKS: dict[str, Callable[[object, str], object]] = {
    "idp_mode": lambda v, f: check_choice(v, f, IDP_MODES),
    "tif": lambda v, f: check_choice(v, f, TIF_SHAPES),
    "alpha": check_positive,
    "beta": check_positive,
    "power": check_positive,
    "step_cut": lambda v, f: check_number(v, f, 0, 1),
    "knots": _check_knots,
    "tail_length": _optional_positive,
    "tail_fraction": _optional_positive,
    "clip_rule": lambda v, f: check_choice(v, f, CLIP_RULES),
    "tau": check_positive,
    "quantile": lambda v, f: check_number(v, f, 0, 1, low_open=True, high_open=True),
    "ema": lambda v, f: check_number(v, f, 0, 1, high_open=True),
    "c_min": check_positive,
    "c_max": check_positive,
    "initial_clip": _optional_positive,
    "group_by": lambda v, f: check_choice(v, f, GROUP_BY),
    "group_sizes": _check_group_sizes,
    "group_size_noise_std": _optional_positive,
    "private_quantile": lambda v, f: v,  # true or false: its type is all there is to check
    "quantile_lr": check_positive,
    "count_noise_std": _optional_positive,
}


def check_field_values(a, p: str) -> None:
    """Every field of the AlgorithmConfig-like ``a`` within what any algorithm accepts (:data:`FIELD_CHECKS`), and
    the pairs no algorithm accepts (c_min above c_max); one ConfigError naming ``p`` + the field otherwise."""
    for name, check in FIELD_CHECKS.items():
        check(getattr(a, name), p + name)
    if a.c_min > a.c_max:
        raise ConfigError(p + "c_min", f"must be at most c_max = {_show(a.c_max)}, got {_show(a.c_min)}")


def _check_ino(a, p: str) -> None:
    """What INO-SGD needs beyond valid values: a tail length γ (absolute or as a fraction), knots for a piecewise
    TIF."""
    if a.tail_length is None and a.tail_fraction is None:
        raise ConfigError(p + "tail_length", "INO-SGD needs tail_length or tail_fraction")
    if a.tif == "piecewise":
        _refuse_bad_knots(a.knots, p + "knots")


def _ino_detail(a) -> str:
    """INO-SGD's label in an audit names a TIF or planner other than the paper's (Beta, SAMPLE)."""
    return f" ({a.tif}, {a.idp_mode.upper()})" if a.tif != "beta" or a.idp_mode != "sample" else ""


@dataclass(frozen=True, kw_only=True)
class AlgorithmSpec:
    """One algorithm's plain facts (an ``AlgorithmConfig``-like ``config`` is what the callables read)."""

    name: str  # the config name (AlgorithmConfig.name, a stored run's "algorithm")
    label: str  # in every page, figure, table and CLI line
    colour: str  # its colour in every figure (engine.figures.scaffold: its first run; extra colours after)
    symbol: str  # its Plotly marker
    plan_mode: str | None  # what engine.dp.accounting plans: one of its MODES, IDP_MODE, or None (no plan)
    picker_rank: int  # its place in the dashboard's algorithm pickers (Train, Audit): the lab's comparison first
    no_formal_dp_reason: Callable[[object], str | None] = _formal  # the formal-DP rule: why none (None: it has one)
    check: Callable[[object, str], None] | None = None  # what it needs beyond valid field values (field prefix)
    # the AlgorithmConfig fields it reads (beyond its name): a value set in any other is ignored (an advisory)
    fields: tuple[str, ...] = ()
    label_detail: Callable[[object], str] | None = None  # what an audit's label adds for this configuration
    # its gains (the headline, the sweep's cells) are paired by seed against one of these; the preferred one
    # plans with the same planner mode (:meth:`gain_reference`)
    gain_against: tuple[str, ...] = ()
    # the algorithm its audit controls are: re-planned at the noise it realised (kept per model) and at its accuracy
    controls: str | None = None
    grouped: bool = False  # it clips per group of samples (its config's ``group_by``; an audit's groups)
    figures: tuple[str, ...] = ()  # the talk figures of its own internals (engine.figures.talk.TALK_FIGURES)

    @property
    def private(self) -> bool:
        """It clips and noises under a privacy plan; False for the non-private reference (it has no ε)."""
        return self.plan_mode is not None

    def mode(self, config) -> str | None:
        """The planner mode ``config`` plans with (None: no plan)."""
        return config.idp_mode if self.plan_mode == IDP_MODE else self.plan_mode

    def label_for(self, config, label: str | None = None) -> str:
        """``label`` (default: its own) with what this configuration adds (an audit's algorithm label)."""
        return (label or self.label) + (self.label_detail(config) if self.label_detail is not None else "")

    def gain_reference(self, config) -> str | None:
        """The algorithm its gain is measured against for ``config``: the one of :attr:`gain_against` that plans
        with the same mode, else the first; None when it has none."""
        mode = self.mode(config)
        same = [n for n in self.gain_against if ALGORITHM_SPECS[n].plan_mode == mode]
        return (same or list(self.gain_against) or [None])[0]


# The fields each algorithm reads (engine.dp: its mechanism and set-up): INO-SGD's planner, TIF and tail length γ;
# a privately tracked quantile of gradient norms (Andrew et al. 2021: its target, step, start and count noise),
# which DP-SGD-S's group clips and DPSGD-Global-Adapt's threshold Z both track; DP-SGD-S's clip rule, clip range
# and groups with their sizes.
INO_FIELDS = ("idp_mode", "tif", "alpha", "beta", "power", "step_cut", "knots", "tail_length", "tail_fraction")
TRACKED_QUANTILE_FIELDS = ("quantile", "quantile_lr", "initial_clip", "count_noise_std")
GROUP_CLIP_FIELDS = ("clip_rule", "tau", "ema", "c_min", "c_max", "group_by", "group_sizes", "group_size_noise_std",
                     "private_quantile", *TRACKED_QUANTILE_FIELDS)

# Colours and markers: picked from Okabe–Ito and Paul Tol's bright, vibrant, muted and high-contrast sets so that
# every two of the six algorithms stay apart (CIEDE2000 ΔE ≥ 17) in normal vision and under simulated
# protanopia, deuteranopia and tritanopia (Machado et al. 2009, severity 1), and so that INO-SGD, light amber, is
# a light line against IDP-SGD's dark blue (SAMPLE) or wine (SCALE) in greyscale too (CIELAB L* 72 vs 48 / 32):
# the pair the lab compares reads apart for everyone. tests/test_live_gain.py checks both.
ALGORITHM_SPECS: dict[str, AlgorithmSpec] = {s.name: s for s in (
    AlgorithmSpec(name="nonprivate", label="Non-private SGD", colour="#999999", symbol="x", plan_mode=None,
                  picker_rank=5, no_formal_dp_reason=_no_noise),
    AlgorithmSpec(name="dpsgd", label="DP-SGD", colour="#CC3311", symbol="diamond", plan_mode="dpsgd", picker_rank=3),
    AlgorithmSpec(name="idp_sample", label="IDP-SGD (SAMPLE)", colour="#0077BB", symbol="circle", plan_mode="sample",
                  picker_rank=0),
    AlgorithmSpec(name="idp_scale", label="IDP-SGD (SCALE)", colour="#882255", symbol="triangle-up",
                  plan_mode="scale", picker_rank=2),
    AlgorithmSpec(name="ino", label="INO-SGD", colour="#DDAA33", symbol="square", plan_mode=IDP_MODE, picker_rank=1,
                  check=_check_ino, fields=INO_FIELDS, label_detail=_ino_detail,
                  gain_against=("idp_sample", "idp_scale"), figures=("ino_internals",)),
    AlgorithmSpec(name="dpsgd_s", label="DP-SGD-S", colour="#33BBEE", symbol="star", plan_mode="dpsgd", picker_rank=4,
                  no_formal_dp_reason=_group_clip_reason, fields=GROUP_CLIP_FIELDS, controls="dpsgd", grouped=True,
                  figures=("group_clip",)),
    # the fairness baselines of the DP-SGD-S paper's code: group clips from noisy clipped counts (Xu et al.
    # 2021); one global scale with a privately tracked threshold (Esipova et al. 2023). Colours: the two
    # farthest (ΔE00 ≥ 13 from every other algorithm and control colour in every vision) at mid lightness.
    AlgorithmSpec(name="dpsgd_f", label="DPSGD-F", colour="#775544", symbol="triangle-down", plan_mode="dpsgd",
                  picker_rank=6, fields=("group_by", "count_noise_std"), grouped=True, figures=("group_clip",)),
    AlgorithmSpec(name="dpsgd_global_adapt", label="DPSGD-Global-Adapt", colour="#AACC99", symbol="pentagon",
                  plan_mode="dpsgd", picker_rank=7, fields=TRACKED_QUANTILE_FIELDS, figures=("global_scale",)),
)}
ALGORITHMS = tuple(ALGORITHM_SPECS)  # the valid config names
ALGORITHM_LABELS = {name: s.label for name, s in ALGORITHM_SPECS.items()}


def algorithm_spec(name) -> AlgorithmSpec:
    """The spec of ``name``; ConfigError("algorithm.name", …) naming the known algorithms otherwise."""
    spec = ALGORITHM_SPECS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ConfigError("algorithm.name", f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return spec


def no_formal_dp_reason(algorithm: str, *, private_quantile: bool = True, clip_rule: str = "quantile") -> str | None:
    """Why ``algorithm`` (with DP-SGD-S's quantile and clip rule) has no formal DP guarantee; None when it has one
    (an unknown name too). The one rule — its spec's ``no_formal_dp_reason``: a run's plan, its mechanism, the
    audit and the run records all ask there."""
    spec = ALGORITHM_SPECS.get(algorithm)
    fields = types.SimpleNamespace(private_quantile=private_quantile, clip_rule=clip_rule)
    return None if spec is None else spec.no_formal_dp_reason(fields)


def ignored_fields(config) -> tuple[str, ...]:
    """The fields of the AlgorithmConfig ``config`` set away from their default that its algorithm does not read
    (its spec's ``fields``), in the config's order; () for an unknown name."""
    spec = ALGORITHM_SPECS.get(config.name)
    if spec is None:
        return ()
    return tuple(f.name for f in dataclasses.fields(config) if f.name in FIELD_CHECKS and f.name not in spec.fields
                 and getattr(config, f.name) != f.default)


def ignored_advisory(field: str, value, labels, prefix: str = "algorithm.") -> ConfigError:
    """The advisory for a valid ``value`` of ``field`` that the algorithms ``labels`` ignore: it names the ones
    that read it (a warning, not a refusal: the run trains as if it were unset)."""
    users = [s.label for s in ALGORITHM_SPECS.values() if field in s.fields]
    verb = "uses" if len(users) == 1 else "use"
    return ConfigError(prefix + field, f"{_show(value)} is ignored by {_words(labels)}: only {_words(users)} {verb} "
                                       "it (the run trains as if it were unset)")


def _words(items) -> str:
    items = list(dict.fromkeys(items))
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
