"""The per-sample advantage on the PA-ALOOA membership design (``design.complementary_membership``), group privacy
risk (GPR) with its bootstrap CIs, Δ bias-corrected with the bootstrap (:data:`DELTA_METHOD`), and the null: the floor
a group's GPR has without any signal and the spread of Δ under permuted memberships."""

from __future__ import annotations

import math

import numpy as np

from engine.audit.pa_alooa.parallel import each_block as _each_block
from engine.audit.pa_alooa.parallel import one_ahead as _one_ahead
from engine.audit.pa_alooa.parallel import then as _then
from engine.audit.pa_alooa.stats.inputs import _as_pair, _group_index, _pairs_of, _split_models, _split_pairs
from engine.audit.pa_alooa.stats.thresholds import (_BLOCK_ELEMS, _CHUNK_ELEMS, _held_out, _held_out_rules,
                                                    _held_out_scored, _in_sample, _sorted_of)


# --------------------------------------------------------------------------- #
# 1. per-sample advantage
# --------------------------------------------------------------------------- #
def sample_advantage(scores, membership, *, threshold: str = "in_sample", seed=0, pairs: int | None = None) -> np.ndarray:
    """Per-sample membership advantage, shape ``(n_samples,)``.

    For sample ``i`` the attack is "member if ``scores[m, i] >= t``" over the
    models ``m``; the advantage of a rule is ``TPR - FPR`` (members / non-members
    of sample ``i`` among the models).

    threshold="in_sample"
        ``t`` is chosen and scored on the same outputs: ``max_t (TPR - FPR)``.
        Always in ``[0, 1]`` but optimistically biased: with no signal at all
        it is the one-sided two-sample KS statistic (≈ 0.06 for 200 vs 200).
    threshold="held_out"
        Models are split into two halves (whole complementary pairs when the
        design has ``pairs`` of them, else a random split);
        ``t`` is chosen in-sample on one half and ``TPR - FPR`` is evaluated on
        the other, both ways, averaged.  This is an unbiased estimate of the
        advantage of the *selected* rule — so ≈ 0 under no signal and slightly
        conservative w.r.t. the best rule — and it is noisier, and **can be
        negative** for individual samples.

    ``pairs``: the design's number of complementary pairs (rows ``2r``, ``2r+1``; the audit hands its R down,
    0: none); ``None`` reads it off a bare matrix.

    Samples without any member or any non-member (in either half, for
    ``held_out``) get NaN.  Vectorised over samples (sort per sample, cumulative
    member / non-member counts; thresholds only between distinct scores).
    """
    s, m = _as_pair(scores, membership)
    if threshold == "in_sample":
        srt = _sorted_of(s, "samples")
        return _in_sample(srt, srt.rows_coder(m.T))
    if threshold != "held_out":
        raise ValueError(f"threshold must be 'in_sample' or 'held_out', got {threshold!r}")
    pairs = _pairs_of(m, pairs)
    ia, _ = _split_models(m, np.random.default_rng(seed), pairs)
    srt = _sorted_of(s, "samples")
    inA = np.zeros(m.shape[0], dtype=np.int8)
    inA[ia] = 2
    return _held_out(srt, srt.rows_coder(m.T, inA), ia.size, balanced=bool(pairs))


# --------------------------------------------------------------------------- #
# 2. group privacy risk
# --------------------------------------------------------------------------- #
# Δ = max_k GPR_k − min_k GPR_k is biased upward (the largest of noisy group means is too large, the smallest too
# small; the closer the groups, the larger the bias), and so is each bootstrap replicate Δ*: a percentile interval
# of Δ* can lie wholly above the plug-in Δ̂ (a digits audit, R = 4: "Δ 5.15 [5.41, 13.83]"). The bootstrap measures
# that bias as median(Δ*) − Δ̂; Δ̂ less it is the bias-corrected Δ, and its interval is symmetric about it with the
# wider of the bootstrap's two tails, so it holds Δ by construction (the basic interval [2Δ̂ − q_hi, 2Δ̂ − q_lo]
# mirrors the tails and under-covers two close groups; the percentile interval shifted by the bias under-covers many
# close groups; their union, this one, covered the true Δ in 0.87–0.94 of simulated audits of 2–10 groups, 0.65
# where ten groups tie, against 0.01–0.38 for the percentile interval where many groups are close).
DELTA_METHOD = ("Δ is bias-corrected with the bootstrap: the max − min of noisy group means is biased upward, so "
                "Δ = 2 Δ̂ − median Δ* (Δ̂ = max − min GPR, Δ* the same on resampled samples), clipped at 0, with "
                "the interval Δ ± the wider of the two tails of Δ* about its median, which always holds Δ")
DELTA_METHOD_SHORT = "bias-corrected with the bootstrap"
# what reports of versions 1 and 2 hold (engine.audit.pa_alooa.report.AuditReport.delta_method)
DELTA_METHOD_BEFORE = "the plug-in max − min with the percentile interval of its bootstrap, which can lie above it"


def bias_corrected(point: float, boot, ci: float, *, centre: float | None = None, floor: float | None = None) -> dict:
    """The bootstrap bias correction of a max − min statistic and its interval (:data:`DELTA_METHOD`).

    ``point``: the plug-in estimate; ``boot``: its bootstrap replicates (NaN ignored). ``centre``: the
    bias-corrected value to centre the interval on when it is known otherwise (a difference of two Δ: the
    difference of their own corrections); ``None``: ``2 point − median(boot)``. ``floor``: clip the value and the
    interval at it (Δ ≥ 0; clipping is monotone, so the interval still holds the value). Returns ``{"value",
    "low", "high"}`` with ``low <= value <= high`` whenever the value is finite; NaN when nothing is finite.
    """
    b = np.asarray(boot, dtype=np.float64)
    b = b[np.isfinite(b)]
    if b.size == 0 or not math.isfinite(point):
        return {"value": float("nan"), "low": float("nan"), "high": float("nan")}
    # sorted: quantiles are ordered, np.percentile's interpolation could break that by an ulp
    lo, med, hi = np.sort(np.percentile(b, [100 * (1 - ci) / 2, 50.0, 100 * (1 + ci) / 2]))
    value = float(2 * point - med) if centre is None else float(centre)
    half = float(max(hi - med, med - lo))  # >= 0
    out = {"value": value, "low": value - half, "high": value + half}
    if floor is not None:
        out = {k: max(float(floor), v) for k, v in out.items()}
    return out


def group_privacy_risk(advantage, groups) -> dict:
    """Mean per-sample advantage per group (NaN advantages ignored)."""
    adv = np.asarray(advantage, dtype=np.float64)
    values, idx = _group_index(groups, adv.shape[0])
    out = {}
    for v, ix in zip(values, idx):
        a = adv[ix]
        a = a[~np.isnan(a)]
        out[v] = float(a.mean()) if a.size else float("nan")
    return out


def gpr_delta(gpr: dict) -> float:
    """Gap between the riskiest and the safest group, in percentage points."""
    vals = [v for v in gpr.values() if not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return float("nan")
    return float((max(vals) - min(vals)) * 100.0)


def bootstrap_gpr(advantage, groups, *, n_boot: int = 1000, ci: float = 0.95, seed=0) -> dict:
    """Bootstrap of the per-group GPR and of Δ (resampling samples with replacement *within* each group, so
    group sizes are fixed): each GPR with its percentile interval (a mean: its bootstrap is centred on it), Δ
    bias-corrected with its interval (:func:`bias_corrected`, :data:`DELTA_METHOD`), the plug-in max − min beside it.

    Returns ``{"groups": {g: {"mean", "low", "high"}}, "delta": {"value", "low", "high", "plug_in"}, "n_boot",
    "ci"}``; GPRs are fractions, Δ is in percentage points.
    """
    if not 0 < ci < 1:
        raise ValueError("ci must be in (0, 1)")
    adv = np.asarray(advantage, dtype=np.float64)
    values, idx = _group_index(groups, adv.shape[0])
    rng = np.random.default_rng(seed)
    lo_q, hi_q = 100 * (1 - ci) / 2, 100 * (1 + ci) / 2
    boots = np.empty((len(values), n_boot))
    res_groups = {}
    for gi, (v, ix) in enumerate(zip(values, idx)):
        a = adv[ix]
        a = a[~np.isnan(a)]
        k = a.size
        if k == 0:
            boots[gi] = np.nan
            res_groups[v] = {"mean": float("nan"), "low": float("nan"), "high": float("nan")}
            continue
        step = max(1, _CHUNK_ELEMS // k)
        for s0 in range(0, n_boot, step):
            s1 = min(n_boot, s0 + step)
            draw = rng.integers(0, k, size=(s1 - s0, k))
            boots[gi, s0:s1] = a[draw].mean(axis=1)
        res_groups[v] = {
            "mean": float(a.mean()),
            "low": float(np.percentile(boots[gi], lo_q)),
            "high": float(np.percentile(boots[gi], hi_q)),
        }
    point = gpr_delta({v: r["mean"] for v, r in res_groups.items()})
    filled = boots[~np.isnan(boots).all(axis=1)]  # an empty group's row is all NaN (nanmax warned on all-NaN columns)
    dboot = (filled.max(axis=0) - filled.min(axis=0)) * 100.0 if filled.shape[0] else np.array([np.nan])
    return {
        "groups": res_groups,
        "delta": {**bias_corrected(point, dboot, ci, floor=0.0), "plug_in": point},
        "n_boot": int(n_boot),
        "ci": float(ci),
    }


# --------------------------------------------------------------------------- #
# 3. permutation null
# --------------------------------------------------------------------------- #
def _permute_membership(m: np.ndarray, rng: np.random.Generator, pairs: int) -> np.ndarray:
    M, n = m.shape
    if pairs:
        # Re-draw which model of each complementary pair holds the sample: the
        # same randomisation as the design, keeps exactly R members and the
        # pair structure (so held_out stays stratified).
        flip = rng.random((pairs, n)) < 0.5
        out = np.empty_like(m)
        out[0::2] = m[0::2] ^ flip
        out[1::2] = ~out[0::2]
        return out
    order = np.argsort(rng.random((M, n)), axis=0)
    return np.take_along_axis(m, order, axis=0)


def null_floor(scores, membership, *, threshold: str = "in_sample", n_perm: int = 1, seed=0,
               pairs: int | None = None) -> float:
    """Mean advantage of the same estimator on permuted membership labels.

    Each sample's membership column is permuted independently (keeping its
    member count; with the PA-ALOOA pair design: a random re-draw of which model
    of each complementary pair is the member).  Averaged over ``n_perm``
    permutations.  The "in_sample" floor is the estimator's optimism under no
    signal (≈ sqrt(pi/8) * sqrt(1/P + 1/N) ≈ 0.06 for 2R = 400); the "held_out"
    floor is ≈ 0.  :func:`null_distribution` gives it per group, with the null Δ.
    """
    s, m = _as_pair(scores, membership)
    return null_distribution(s, m, np.zeros(s.shape[1], np.int8), threshold=threshold, n_perm=n_perm,
                             seed=seed, pairs=pairs)["floor"]


def null_distribution(scores, membership, groups, *, threshold: str = "in_sample", n_perm: int = 20,
                      ci: float = 0.95, seed=0, pairs: int | None = None) -> dict:
    """The estimator under no signal, per group: ``n_perm`` permutations of the membership labels
    (as in :func:`null_floor`; a permutation of each sample's column is a permutation within its group).

    Returns ``{"floor": mean advantage over all samples, "groups": {g: mean GPR under the null},
    "delta": {"value": mean null Δ, "low", "high": its percentile spread at ``ci``}, "n_perm"}``; Δ in pp.
    A measured Δ whose CI reaches into the null Δ spread is not resolved (:func:`delta_resolved`).
    """
    if not 0 < ci < 1:
        raise ValueError("ci must be in (0, 1)")
    s, m = _as_pair(scores, membership)
    values, idx = _group_index(groups, s.shape[1])
    if int(n_perm) > 0 and threshold not in ("in_sample", "held_out"):
        raise ValueError(f"threshold must be 'in_sample' or 'held_out', got {threshold!r}")
    rng = np.random.default_rng(seed)
    M = m.shape[0]
    pairs = _pairs_of(m, pairs)  # (as in sample_advantage)
    paired = bool(pairs)
    if int(n_perm) > 0:  # one sort for every permutation
        srt = _sorted_of(s, "samples")
        if paired:  # a permutation swaps members within pairs: code it from m's own sorted order
            m_sorted = np.empty((srt.u, M), dtype=np.int8)
            fill = srt.rows_coder(m.T)
            _each_block(srt.blocks, lambda k, a, b, _: fill(k, a, b, m_sorted[a:b]))
            # two of each: the next permutation is drawn into one while the other is searched
            flips = [np.empty((pairs, m.shape[1]), dtype=bool) for _ in range(2)]
            pairs_of = [np.empty((m.shape[1], pairs), dtype=np.int8) for _ in range(2)]  # flip + 2 * (pair in A)
            buf = np.empty((max(1, _BLOCK_ELEMS // max(m.shape[1], 1)), m.shape[1]))

    def prepare(p):
        """Permutation ``p``'s draws — those of _permute_membership(m, rng), then of sample_advantage(s, mp,
        seed=split_seed), in that order — and the coder of its membership (-> coder, models in half A)."""
        if paired:  # rng.random((pairs, n)) < 0.5, drawn a few rows at a time (the same numbers)
            flip, coded = flips[p % 2], pairs_of[p % 2]
            for r0 in range(0, pairs, buf.shape[0]):
                r1 = min(pairs, r0 + buf.shape[0])
                np.less(rng.random(out=buf[: r1 - r0]), 0.5, out=flip[r0:r1])
        else:
            mp = _permute_membership(m, rng, pairs)
        split_seed = int(rng.integers(2**63 - 1))
        if threshold == "in_sample":
            if paired:
                np.copyto(coded, flip.T.view(np.int8))
                return srt.flip_coder(m_sorted, coded), None
            return srt.rows_coder(mp.T), None
        if paired:  # the permuted membership keeps the pairs: whole pairs go to one half
            a_pairs, _ = _split_pairs(pairs, np.random.default_rng(split_seed))
            inA = np.zeros(pairs, dtype=np.int8)
            inA[a_pairs] = 2
            np.add(flip.T.view(np.int8), inA, out=coded)
            return srt.flip_coder(m_sorted, coded), 2 * a_pairs.size
        ia, _ = _split_models(mp, np.random.default_rng(split_seed), pairs)
        inA = np.zeros(M, dtype=np.int8)
        inA[ia] = 2
        return srt.rows_coder(mp.T, inA), ia.size

    floors, gprs, deltas = [], [], []
    drawn = _one_ahead(prepare, int(n_perm))
    if threshold == "in_sample":
        advs = (_in_sample(srt, coder, balanced=paired) for coder, _ in drawn)
    else:  # a permutation's rules are scored while the next one's are searched
        advs = _then(lambda d: _held_out_rules(srt, d[0], d[1], balanced=paired), _held_out_scored, drawn)
    for adv in advs:
        floors.append(np.nanmean(adv))
        with np.errstate(invalid="ignore"):
            g = [np.nanmean(adv[ix]) if np.isfinite(adv[ix]).any() else np.nan for ix in idx]
        gprs.append(g)
        deltas.append(gpr_delta(dict(zip(values, g))))
    if int(n_perm) > 0:
        srt._pidx = None  # the permutations' index: not kept
    gprs_a = np.asarray(gprs, dtype=np.float64).reshape(len(floors), len(values))
    d = np.asarray(deltas, dtype=np.float64)
    d = d[np.isfinite(d)]
    lo_q, hi_q = 100 * (1 - ci) / 2, 100 * (1 + ci) / 2
    with np.errstate(invalid="ignore"):
        group_floor = {v: float(np.nanmean(gprs_a[:, k])) if np.isfinite(gprs_a[:, k]).any() else float("nan")
                       for k, v in enumerate(values)}
    return {"floor": float(np.mean(floors)), "groups": group_floor,
            "delta": {"value": float(d.mean()) if d.size else float("nan"),
                      "low": float(np.percentile(d, lo_q)) if d.size else float("nan"),
                      "high": float(np.percentile(d, hi_q)) if d.size else float("nan")},
            "n_perm": int(n_perm)}


def delta_resolved(delta_low, null_delta_high) -> bool | None:
    """Δ is resolved when its CI lies above the null Δ spread (None where either is undefined). The null spread is
    that of the plug-in max − min under shuffled labels (biased upward like any Δ̂), Δ's CI the bias-corrected one:
    the comparison errs on the side of "not resolved"."""
    if delta_low is None or null_delta_high is None:
        return None
    lo, hi = float(delta_low), float(null_delta_high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return bool(lo > hi)


