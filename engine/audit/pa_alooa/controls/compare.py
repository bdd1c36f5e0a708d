"""Paired comparisons of two algorithms of one audit (pure numpy / scipy).

Every algorithm of an audit trains its 2R models on the same membership splits from the same
initialisations (``engine.audit.pa_alooa.design``), so sample i's advantage under algorithm a and under algorithm b
share most of their noise (the sample itself, its splits). A difference a − b is then resampled with
**the same draws** for both — the paired bootstrap — and its CI is what the difference's own sampling
spread is, usually far narrower than two independent CIs side by side (``paired=False`` gives that one,
for reference).

    paired_bootstrap(adv_a, adv_b, groups)   Δ_a − Δ_b bias-corrected (as each Δ is, ``stats.DELTA_METHOD``) and
                                             GPR_a − GPR_b per group (pp, percentile CIs: a difference of means has
                                             no max − min bias); samples resampled within each group (group sizes
                                             fixed, as ``stats.bootstrap_gpr``), only samples finite under both
    accuracy_difference(acc_a, acc_b)        mean test accuracy a − b (points), paired over models: a t interval
                                             over the complementary pairs (model 2r and 2r+1 are one unit)
    accuracy_interval(acc_models)            one algorithm's mean accuracy with the same t interval
    compare(...)                             a PairedComparison record from two algorithms' reports: Δ_a − Δ_b is
                                             their own bias-corrected Δ's difference, with the interval's width
                                             from the paired (and the unpaired) draws
    comparisons(setup, results)              each DP-SGD-S against DP-SGD and against its own controls
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special as _special

from engine.audit.pa_alooa.design import derived_seed
from engine.audit.pa_alooa.records import Estimate, PairedComparison
from engine.audit.pa_alooa.report import AlgorithmReport
from engine.audit.pa_alooa.stats import bias_corrected
from engine.dp.algorithms import algorithm

_CHUNK_ELEMS = 2_000_000  # index-matrix elements drawn at once (bounds memory like stats.bootstrap_gpr)


def _spread(x: np.ndarray) -> np.ndarray:
    """(G, B) group means → (B,) Δ = max − min over groups, in pp."""
    with np.errstate(invalid="ignore"):
        return (np.nanmax(x, axis=0) - np.nanmin(x, axis=0)) * 100.0


def _percentiles(x: np.ndarray, ci: float) -> tuple[float, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.percentile(x, [100 * (1 - ci) / 2, 100 * (1 + ci) / 2])
    return float(lo), float(hi)


def paired_bootstrap(adv_a, adv_b, groups, *, n_boot: int = 1000, ci: float = 0.95, seed=0,
                     paired: bool = True, delta_centre: float | None = None) -> dict:
    """Δ_a − Δ_b (pp) bias-corrected with its interval and, per group, GPR_a − GPR_b (pp) with percentile CIs.

    ``adv_a``, ``adv_b``: per-sample advantages of the same samples under two algorithms; ``groups``: each
    sample's group. Samples are resampled with replacement within each group; ``paired`` draws one index
    matrix for both algorithms, else one for each (independent resamples). Only samples finite under both
    enter (with shared membership the NaN samples are the same ones). Each Δ is a max − min, biased upward by
    an amount of its own, so their difference is too: it is corrected as one Δ is (``stats.bias_corrected``,
    2 d̂ − median d*), or, given ``delta_centre`` (the two algorithms' own bias-corrected Δ_a − Δ_b), centred
    there; either way the interval holds the value. Returns ``{"delta": {"value", "low", "high", "plug_in"},
    "groups": {g: {"value", "low", "high"}}, "n_boot", "ci", "paired"}``.
    """
    if not 0 < ci < 1:
        raise ValueError("ci must be in (0, 1)")
    a = np.asarray(adv_a, dtype=np.float64)
    b = np.asarray(adv_b, dtype=np.float64)
    g = np.asarray(groups)
    if a.shape != b.shape or a.shape != g.shape:
        raise ValueError(f"advantages and groups must have one shape, got {a.shape}, {b.shape}, {g.shape}")
    names = list(dict.fromkeys(g.tolist()))
    ok = np.isfinite(a) & np.isfinite(b)
    rng = np.random.default_rng(seed)
    boot_a = np.full((len(names), n_boot), np.nan)
    boot_b = np.full((len(names), n_boot), np.nan)
    point_a, point_b = np.full(len(names), np.nan), np.full(len(names), np.nan)
    for gi, name in enumerate(names):
        ix = np.flatnonzero((g == name) & ok)
        k = ix.size
        if k == 0:
            continue
        va, vb = a[ix], b[ix]
        point_a[gi], point_b[gi] = va.mean(), vb.mean()
        step = max(1, _CHUNK_ELEMS // k)
        for s0 in range(0, n_boot, step):
            s1 = min(n_boot, s0 + step)
            draw = rng.integers(0, k, size=(s1 - s0, k))
            boot_a[gi, s0:s1] = va[draw].mean(axis=1)
            if not paired:
                draw = rng.integers(0, k, size=(s1 - s0, k))
            boot_b[gi, s0:s1] = vb[draw].mean(axis=1)
    out_groups = {}
    for gi, name in enumerate(names):
        diff = (boot_a[gi] - boot_b[gi]) * 100.0
        lo, hi = _percentiles(diff, ci)
        out_groups[str(name)] = {"value": float((point_a[gi] - point_b[gi]) * 100.0), "low": lo, "high": hi}
    finite = np.isfinite(point_a) & np.isfinite(point_b)
    plug_in = float(_spread(point_a[finite, None])[0] - _spread(point_b[finite, None])[0]) if finite.any() \
        else float("nan")
    diffs = _spread(boot_a[finite]) - _spread(boot_b[finite]) if finite.any() else np.array([np.nan])
    delta = bias_corrected(plug_in, diffs, ci, centre=delta_centre)
    return {"delta": {**delta, "plug_in": plug_in}, "groups": out_groups, "n_boot": int(n_boot),
            "ci": float(ci), "paired": bool(paired)}


def _t_interval(units: np.ndarray, ci: float) -> Estimate:
    units = np.asarray(units, dtype=np.float64)
    units = units[np.isfinite(units)]
    if units.size == 0:
        return Estimate(None, None, None)
    mean = float(units.mean())
    if units.size < 2:
        return Estimate(mean, None, None)
    # Student's t quantile: scipy.stats.t.ppf is special.stdtrit (importing scipy.stats costs ~0.5 s a process)
    half = float(_special.stdtrit(units.size - 1, (1 + ci) / 2) * units.std(ddof=1) / math.sqrt(units.size))
    return Estimate(mean, mean - half, mean + half)


def _pair_units(x: np.ndarray) -> np.ndarray:
    """Model-level values → one value per complementary pair (models 2r, 2r+1), the independent units."""
    x = np.asarray(x, dtype=np.float64)
    return x.reshape(-1, 2).mean(1) if x.size % 2 == 0 and x.size >= 4 else x


def accuracy_interval(acc_models, *, ci: float = 0.95) -> Estimate:
    """Mean test accuracy over an algorithm's models, in points, with a t interval over complementary pairs."""
    est = _t_interval(_pair_units(acc_models) * 100.0, ci)
    return est


def accuracy_difference(acc_a, acc_b, *, ci: float = 0.95) -> Estimate:
    """Mean test accuracy a − b in points, paired over models (model j of both: same split, same init)."""
    a, b = np.asarray(acc_a, dtype=np.float64), np.asarray(acc_b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"accuracy arrays of different models: {a.shape} vs {b.shape}")
    return _t_interval(_pair_units(a - b) * 100.0, ci)


def _est(d: dict) -> Estimate:
    f = [d.get(k) for k in ("value", "low", "high")]
    return Estimate(*(v if v is not None and math.isfinite(v) else None for v in f))


def compare(ra: AlgorithmReport, rb: AlgorithmReport, adv_a, adv_b, acc_a, acc_b, groups, *, n_boot: int,
            ci: float, seed) -> PairedComparison:
    """Algorithm ``ra`` against ``rb`` (their per-sample advantages and per-model test accuracies), paired.
    Δ_a − Δ_b is the difference of the two reports' Δ (each bias-corrected with its own bootstrap), so it is their
    rows' difference; the paired and the unpaired draws give its interval's width (``paired_bootstrap``)."""
    va, vb = ra.delta.value, rb.delta.value
    centre = va - vb if None not in (va, vb) and ra.delta_plug_in is not None and rb.delta_plug_in is not None \
        else None  # a report stored before the correction: the difference corrected with the paired draws
    paired = paired_bootstrap(adv_a, adv_b, groups, n_boot=n_boot, ci=ci, seed=seed, delta_centre=centre)
    unpaired = paired_bootstrap(adv_a, adv_b, groups, n_boot=n_boot, ci=ci, seed=seed, paired=False,
                                delta_centre=centre)
    return PairedComparison(a=ra.key, b=rb.key, a_label=ra.label, b_label=rb.label, delta=_est(paired["delta"]),
                            delta_unpaired=_est(unpaired["delta"]),
                            groups={k: _est(v) for k, v in paired["groups"].items()},
                            reference_gpr={k: e.value for k, e in rb.gpr.items()},
                            accuracy=accuracy_difference(acc_a, acc_b, ci=ci), n_boot=int(n_boot), ci=float(ci))


def comparisons(setup, results: dict) -> tuple:
    """Each algorithm with controls (DP-SGD-S) against the first of the algorithm its controls are (DP-SGD) and
    against its controls, paired (:func:`compare`)."""
    cfg = setup.config
    out = []
    for i, s in enumerate(a for a in setup.algos if a.control is None and algorithm(a.algo.name).controls):
        want = algorithm(s.algo.name).controls
        base = [a for a in setup.algos if a.algo.name == want and a.control is None][:1]
        refs = base + [a for a in setup.algos if a.control_info is not None and a.control_info.of == s.key]
        for j, b in enumerate(refs):
            ra, rb = results[s.key], results[b.key]
            out.append(compare(ra.report, rb.report, ra.advantage, rb.advantage, ra.accuracy, rb.accuracy,
                                       setup.groups, n_boot=cfg.n_boot, ci=cfg.confidence,
                                       seed=derived_seed(cfg.run.seed, 6, i, j)))
    return tuple(out)
