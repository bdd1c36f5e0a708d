"""Membership-audit statistics (pure numpy / scipy).

Conventions used throughout
---------------------------
* ``scores`` and ``membership`` are ``(n_models, n_samples)`` arrays.  A score is
  "member-like" when high (e.g. ``score = -loss``).  ``membership[m, i]`` is
  True when sample ``i`` was in the training set of model ``m``.
* The attack family is the one-sided threshold rule "member if score >= t".
  Only thresholds that separate *distinct* score values are considered, so
  tied scores are always classified together.
* PA-ALOOA design (:func:`complementary_membership`): rows ``2r`` and ``2r+1``
  are complementary random halves of the data, so every sample is a member of
  exactly ``R`` of the ``2R`` models.  Functions that need to split models in
  two (``threshold="held_out"``, :func:`per_group_epsilon_lower_bound`) detect
  this pair structure and split whole pairs, which stratifies every sample
  (each half holds the same number of members and non-members for it).
"""

from __future__ import annotations

import math
from typing import Any, Hashable

import numpy as np
from scipy import stats as _sps

__all__ = [
    "complementary_membership",
    "sample_advantage",
    "group_privacy_risk",
    "gpr_delta",
    "bootstrap_gpr",
    "null_floor",
    "null_distribution",
    "delta_resolved",
    "pa_ga",
    "pa_gba",
    "pa_looa",
    "logit_confidence",
    "lira_scores",
    "roc_curve_points",
    "auc",
    "tpr_at_fpr",
    "lira_by_group",
    "epsilon_lower_bound",
    "per_group_epsilon_lower_bound",
]

# Max number of matrix elements processed per chunk in the vectorised kernels
# (bounds peak memory at roughly a few hundred MB for float64).
_CHUNK_ELEMS = 2_000_000


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def _as_pair(scores, membership) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64)
    m = np.asarray(membership)
    if s.ndim != 2:
        raise ValueError(f"scores must be 2-D (n_models, n_samples), got shape {s.shape}")
    if m.shape != s.shape:
        raise ValueError(f"membership shape {m.shape} != scores shape {s.shape}")
    if m.dtype != np.bool_:
        if not np.isin(m, (0, 1)).all():
            raise ValueError("membership must be boolean (or 0/1)")
        m = m.astype(bool)
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    return s, m


def _py(v: Any) -> Hashable:
    """numpy scalar -> plain python scalar (for dict keys)."""
    return v.item() if isinstance(v, np.generic) else v


def _group_index(groups, n: int) -> tuple[list, list[np.ndarray]]:
    g = np.asarray(groups)
    if g.shape != (n,):
        raise ValueError(f"groups must have shape ({n},), got {g.shape}")
    values, inverse = np.unique(g, return_inverse=True)
    idx = [np.flatnonzero(inverse == k) for k in range(len(values))]
    return [_py(v) for v in values], idx


def _is_paired(membership: np.ndarray) -> bool:
    M = membership.shape[0]
    return M >= 2 and M % 2 == 0 and bool(np.all(membership[0::2] != membership[1::2]))


def _split_models(membership: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random split of model indices into two halves.

    With complementary pairs, whole pairs go to one half (stratified: every
    sample has equally many members and non-members in each half); otherwise a
    plain random split of the models.
    """
    M = membership.shape[0]
    if _is_paired(membership):
        R = M // 2
        if R < 2:
            raise ValueError("need at least 2 complementary pairs (2R >= 4) to split models")
        perm = rng.permutation(R)
        a, b = np.sort(perm[: R // 2]), np.sort(perm[R // 2:])
        pa = np.stack([2 * a, 2 * a + 1], axis=1).ravel()
        pb = np.stack([2 * b, 2 * b + 1], axis=1).ravel()
        return pa, pb
    if M < 4:
        raise ValueError("need at least 4 models to split them in halves")
    perm = rng.permutation(M)
    return np.sort(perm[: M // 2]), np.sort(perm[M // 2:])


def _best_threshold_chunk(s: np.ndarray, m: np.ndarray, want_threshold: bool):
    """Best "score >= t" rule per row.  ``s``, ``m``: (k, M) — one row per sample.

    Returns (adv, threshold or None).  adv is NaN where a row has no members or
    no non-members.  The threshold is a value strictly between two distinct
    consecutive scores (the midpoint when representable), +inf for the empty
    rule (encoded as NaN, which no score reaches — robust to +inf scores);
    among equally good rules the highest threshold wins.
    """
    k, M = s.shape
    order = np.argsort(-s, axis=1, kind="stable")
    ss = np.take_along_axis(s, order, axis=1)
    mm = np.take_along_axis(m, order, axis=1)
    P = mm.sum(axis=1)
    N = M - P
    P = P.astype(np.int64)
    N = N.astype(np.int64)
    tp = np.cumsum(mm, axis=1, dtype=np.int64)
    # position j (0-based, "include the top j+1 scores") -> fp = j+1-tp
    fp = np.arange(1, M + 1, dtype=np.int64)[None, :] - tp
    # exact integer objective: (TPR - FPR) * P * N = tp*N - fp*P  (so equally
    # good rules tie exactly and the tie-break below is deterministic)
    val = tp * N[:, None]
    val -= fp * P[:, None]
    valid = np.empty((k, M), dtype=bool)
    valid[:, :-1] = ss[:, :-1] != ss[:, 1:]
    valid[:, -1] = True
    val[~valid] = np.iinfo(np.int64).min
    j = np.argmax(val, axis=1)
    best = val[np.arange(k), j]
    empty = best <= 0  # the empty rule (t=+inf) gives 0 and wins ties
    bad = (P == 0) | (N == 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        adv = np.where(empty, 0.0, best / (P * N).astype(np.float64))
    adv[bad] = np.nan
    if not want_threshold:
        return adv, None
    rows = np.arange(k)
    hi = ss[rows, j]
    lo = np.where(j + 1 < M, ss[rows, np.minimum(j + 1, M - 1)], -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        mid = 0.5 * hi + 0.5 * lo
    t = np.where(np.isfinite(lo) & (mid > lo) & (mid <= hi), mid, hi)
    t = np.where(j + 1 >= M, -np.inf, t)  # all included
    t = np.where(empty, np.nan, t)  # empty rule: "score >= nan" is never true
    return adv, t


def _best_threshold(scores: np.ndarray, membership: np.ndarray, want_threshold: bool = False):
    """Column-wise best threshold over models.  (M, n) -> (n,) advantage [, threshold]."""
    M, n = scores.shape
    adv = np.empty(n)
    thr = np.empty(n) if want_threshold else None
    step = max(1, _CHUNK_ELEMS // max(M, 1))
    for a in range(0, n, step):
        b = min(n, a + step)
        s = np.ascontiguousarray(scores[:, a:b].T)
        m = np.ascontiguousarray(membership[:, a:b].T)
        r, t = _best_threshold_chunk(s, m, want_threshold)
        adv[a:b] = r
        if want_threshold:
            thr[a:b] = t
    return (adv, thr) if want_threshold else adv


def _eval_threshold(scores: np.ndarray, membership: np.ndarray, t: np.ndarray) -> np.ndarray:
    """TPR - FPR of per-column rule "score >= t[i]" over the models (rows).
    ``t[i] = NaN`` encodes the empty rule."""
    with np.errstate(invalid="ignore"):
        pred = scores >= t[None, :]
    P = membership.sum(axis=0)
    N = membership.shape[0] - P
    tp = (pred & membership).sum(axis=0)
    fp = (pred & ~membership).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = tp / P - fp / N
    out[(P == 0) | (N == 0)] = np.nan
    return out


# --------------------------------------------------------------------------- #
# 1. design
# --------------------------------------------------------------------------- #
def complementary_membership(n_samples: int, R: int, *, seed) -> np.ndarray:
    """PA-ALOOA membership matrix, bool of shape ``(2R, n_samples)``.

    For each ``r``, a fresh random permutation splits the samples into two
    complementary halves: row ``2r`` and row ``2r+1``.  For odd ``n_samples``
    the extra sample goes to row ``2r`` for even ``r`` and to row ``2r+1`` for
    odd ``r``.  Every sample is a member of exactly ``R`` models.
    """
    n, R = int(n_samples), int(R)
    if n < 1 or R < 1:
        raise ValueError("n_samples and R must be >= 1")
    rng = np.random.default_rng(seed)
    out = np.zeros((2 * R, n), dtype=bool)
    for r in range(R):
        k = n // 2 + (n % 2 if r % 2 == 0 else 0)
        idx = rng.permutation(n)[:k]
        out[2 * r, idx] = True
        out[2 * r + 1] = ~out[2 * r]
    return out


# --------------------------------------------------------------------------- #
# 2. per-sample advantage
# --------------------------------------------------------------------------- #
def sample_advantage(scores, membership, *, threshold: str = "in_sample", seed=0) -> np.ndarray:
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
        membership has the PA-ALOOA pair structure, else a random split);
        ``t`` is chosen in-sample on one half and ``TPR - FPR`` is evaluated on
        the other, both ways, averaged.  This is an unbiased estimate of the
        advantage of the *selected* rule — so ≈ 0 under no signal and slightly
        conservative w.r.t. the best rule — and it is noisier, and **can be
        negative** for individual samples.

    Samples without any member or any non-member (in either half, for
    ``held_out``) get NaN.  Vectorised over samples (sort per sample, cumulative
    member / non-member counts; thresholds only between distinct scores).
    """
    s, m = _as_pair(scores, membership)
    if threshold == "in_sample":
        return _best_threshold(s, m)
    if threshold != "held_out":
        raise ValueError(f"threshold must be 'in_sample' or 'held_out', got {threshold!r}")
    rng = np.random.default_rng(seed)
    ia, ib = _split_models(m, rng)
    sa, ma, sb, mb = s[ia], m[ia], s[ib], m[ib]
    _, ta = _best_threshold(sa, ma, want_threshold=True)
    _, tb = _best_threshold(sb, mb, want_threshold=True)
    ab = _eval_threshold(sb, mb, ta)
    ba = _eval_threshold(sa, ma, tb)
    return 0.5 * (ab + ba)


# --------------------------------------------------------------------------- #
# 3-4. group privacy risk
# --------------------------------------------------------------------------- #
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
    """Percentile bootstrap of the per-group GPR and of Δ (resampling samples
    with replacement *within* each group, so group sizes are fixed).

    Returns ``{"groups": {g: {"mean", "low", "high"}}, "delta": {"value", "low",
    "high"}, "n_boot", "ci"}``; GPRs are fractions, Δ is in percentage points.
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
    with np.errstate(invalid="ignore"):
        dboot = (np.nanmax(boots, axis=0) - np.nanmin(boots, axis=0)) * 100.0 if len(values) else np.array([np.nan])
    return {
        "groups": res_groups,
        "delta": {
            "value": point,
            "low": float(np.percentile(dboot, lo_q)),
            "high": float(np.percentile(dboot, hi_q)),
        },
        "n_boot": int(n_boot),
        "ci": float(ci),
    }


# --------------------------------------------------------------------------- #
# 5. permutation null
# --------------------------------------------------------------------------- #
def _permute_membership(m: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    M, n = m.shape
    if _is_paired(m):
        # Re-draw which model of each complementary pair holds the sample: the
        # same randomisation as the design, keeps exactly R members and the
        # pair structure (so held_out stays stratified).
        flip = rng.random((M // 2, n)) < 0.5
        out = np.empty_like(m)
        out[0::2] = m[0::2] ^ flip
        out[1::2] = ~out[0::2]
        return out
    order = np.argsort(rng.random((M, n)), axis=0)
    return np.take_along_axis(m, order, axis=0)


def null_floor(scores, membership, *, threshold: str = "in_sample", n_perm: int = 1, seed=0) -> float:
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
                             seed=seed)["floor"]


def null_distribution(scores, membership, groups, *, threshold: str = "in_sample", n_perm: int = 20,
                      ci: float = 0.95, seed=0) -> dict:
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
    rng = np.random.default_rng(seed)
    floors, gprs, deltas = [], [], []
    for _ in range(int(n_perm)):
        mp = _permute_membership(m, rng)
        adv = sample_advantage(s, mp, threshold=threshold, seed=int(rng.integers(2**63 - 1)))
        floors.append(np.nanmean(adv))
        with np.errstate(invalid="ignore"):
            g = [np.nanmean(adv[ix]) if np.isfinite(adv[ix]).any() else np.nan for ix in idx]
        gprs.append(g)
        deltas.append(gpr_delta(dict(zip(values, g))))
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
    """Δ is resolved when its CI lies above the null Δ spread (None where either is undefined)."""
    if delta_low is None or null_delta_high is None:
        return None
    lo, hi = float(delta_low), float(null_delta_high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return bool(lo > hi)


# --------------------------------------------------------------------------- #
# 6. baselines
# --------------------------------------------------------------------------- #
def pa_ga(scores, membership) -> float:
    """Global attack: one threshold per model shared by all samples (chosen
    in-sample to maximise TPR - FPR over that model's samples); mean over models."""
    s, m = _as_pair(scores, membership)
    return float(np.nanmean(_best_threshold(s.T, m.T)))


def pa_gba(scores, membership, groups) -> dict:
    """Group-based attack: one in-sample threshold per (model, group); the
    mean over models of TPR - FPR, per group."""
    s, m = _as_pair(scores, membership)
    values, idx = _group_index(groups, s.shape[1])
    out = {}
    for v, ix in zip(values, idx):
        adv = _best_threshold(s[:, ix].T, m[:, ix].T)
        out[v] = float(np.nanmean(adv)) if np.isfinite(adv).any() else float("nan")
    return out


def pa_looa(scores_with, scores_without) -> float:
    """Leave-one-out attack on one record: best "score >= t" advantage
    separating its scores under models trained with it (``(n_with,)``) from
    those under models trained without it (``(n_without,)``), in-sample."""
    a = np.asarray(scores_with, dtype=np.float64).ravel()
    b = np.asarray(scores_without, dtype=np.float64).ravel()
    if a.size == 0 or b.size == 0:
        raise ValueError("need at least one score with and one without the record")
    s = np.concatenate([a, b])[:, None]
    m = np.concatenate([np.ones(a.size, bool), np.zeros(b.size, bool)])[:, None]
    return float(sample_advantage(s, m)[0])


# --------------------------------------------------------------------------- #
# 7. LiRA
# --------------------------------------------------------------------------- #
def logit_confidence(probs_true_class, eps: float = 1e-12) -> np.ndarray:
    """``log(p / (1 - p))`` with ``p`` clipped to ``[eps, 1 - eps]`` (finite)."""
    p = np.clip(np.asarray(probs_true_class, dtype=np.float64), eps, 1.0 - eps)
    return np.log(p) - np.log1p(-p)


def lira_scores(conf, membership) -> np.ndarray:
    """Online LiRA with fixed (global) variance, leave-one-model-out.

    For target model ``m`` and sample ``i``: ``mu_in`` / ``mu_out`` are the means
    of ``conf[:, i]`` over the *other* models where ``i`` is / is not a member;
    ``sigma`` is one pooled std of all in- and out- residuals (about the full
    per-sample means).  Score = ``log N(c; mu_in, sigma) - log N(c; mu_out,
    sigma)``; NaN where a leave-one-out mean has no models.
    """
    c, m = _as_pair(conf, membership)
    mf = m.astype(np.float64)
    n_in = mf.sum(axis=0)
    n_out = m.shape[0] - n_in
    s_in = (c * mf).sum(axis=0)
    s_out = c.sum(axis=0) - s_in
    with np.errstate(divide="ignore", invalid="ignore"):
        mu_in_full = s_in / n_in
        mu_out_full = s_out / n_out
        resid = np.where(m, c - mu_in_full, c - mu_out_full)
        ok = ~np.isnan(resid)
        dof = ok.sum() - np.count_nonzero(n_in > 0) - np.count_nonzero(n_out > 0)
        var = float(np.nansum(resid**2) / max(dof, 1))
        var = max(var, 1e-30)
        li_n_in = n_in[None, :] - mf
        li_n_out = n_out[None, :] - (1.0 - mf)
        mu_in = (s_in[None, :] - c * mf) / li_n_in
        mu_out = (s_out[None, :] - c * (1.0 - mf)) / li_n_out
        out = ((c - mu_out) ** 2 - (c - mu_in) ** 2) / (2.0 * var)
    out[(li_n_in <= 0) | (li_n_out <= 0)] = np.nan
    return out


def roc_curve_points(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    """ROC of "positive if score >= t" over distinct thresholds (NaN scores
    dropped).  Returns ``(fpr, tpr)``, both starting at 0 and ending at 1."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).astype(bool).ravel()
    if s.shape != y.shape:
        raise ValueError("scores and labels must have the same size")
    keep = ~np.isnan(s)
    s, y = s[keep], y[keep]
    P, N = int(y.sum()), int((~y).sum())
    if P == 0 or N == 0:
        raise ValueError("need both positive and negative labels")
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    tp = np.cumsum(y)
    fp = np.cumsum(~y)
    last = np.r_[s[:-1] != s[1:], True]
    tpr = np.r_[0.0, tp[last] / P]
    fpr = np.r_[0.0, fp[last] / N]
    return fpr, tpr


def auc(fpr, tpr) -> float:
    """Area under an ROC curve given by its points (trapezoidal)."""
    f = np.asarray(fpr, dtype=np.float64)
    t = np.asarray(tpr, dtype=np.float64)
    return float(np.sum(np.diff(f) * (t[1:] + t[:-1]) * 0.5))


def tpr_at_fpr(fpr, tpr, target: float) -> float:
    """Largest TPR among ROC points with FPR <= target (0 if none)."""
    f = np.asarray(fpr, dtype=np.float64)
    t = np.asarray(tpr, dtype=np.float64)
    ok = f <= target
    return float(t[ok].max()) if ok.any() else 0.0


def lira_by_group(lira, membership, groups) -> dict:
    """Pool every (model, sample) pair of a group's samples;
    ``{g: {"auc", "tpr_at_0.1%", "tpr_at_1%"}}``."""
    s = np.asarray(lira, dtype=np.float64)
    m = np.asarray(membership).astype(bool)
    values, idx = _group_index(groups, s.shape[1])
    out = {}
    for v, ix in zip(values, idx):
        fpr, tpr = roc_curve_points(s[:, ix], m[:, ix])
        out[v] = {
            "auc": auc(fpr, tpr),
            "tpr_at_0.1%": tpr_at_fpr(fpr, tpr, 0.001),
            "tpr_at_1%": tpr_at_fpr(fpr, tpr, 0.01),
        }
    return out


# --------------------------------------------------------------------------- #
# 8. empirical epsilon lower bound
# --------------------------------------------------------------------------- #
def _cp_upper(k, n, alpha):
    """One-sided Clopper-Pearson upper bound at level 1 - alpha (vectorised)."""
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ub = _sps.beta.ppf(1.0 - alpha, k + 1.0, np.maximum(n - k, 1e-300))
    return np.where(k >= n, 1.0, ub)


def _eps_from_rates(fpr_hi, fnr_hi, delta):
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(1.0 - delta - fpr_hi) - np.log(fnr_hi)
        b = np.log(1.0 - delta - fnr_hi) - np.log(fpr_hi)
    a = np.where(np.isnan(a), -np.inf, a)
    b = np.where(np.isnan(b), -np.inf, b)
    return np.maximum(np.maximum(a, b), 0.0)


def epsilon_lower_bound(tp, fn, fp, tn, *, delta: float, confidence: float = 0.95) -> float:
    """Empirical ε lower bound from attack counts (Jagielski et al. 2020;
    Nasr et al. 2021).

    Any (ε, δ)-DP mechanism forces every test to satisfy
    ``FPR + e^ε FNR >= 1 - δ`` and ``FNR + e^ε FPR >= 1 - δ``, hence
    ``ε >= max(ln((1-δ-FPR)/FNR), ln((1-δ-FNR)/FPR))``.  FPR and FNR are replaced
    by one-sided Clopper-Pearson *upper* bounds, each at level
    ``1 - (1 - confidence)/2`` (Bonferroni split), so the returned bound holds
    with probability >= ``confidence``.  Clamped at 0.
    """
    tp, fn, fp, tn = (int(x) for x in (tp, fn, fp, tn))
    if min(tp, fn, fp, tn) < 0 or tp + fn == 0 or fp + tn == 0:
        raise ValueError("need non-negative counts with at least one member and one non-member trial")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    alpha = (1.0 - confidence) / 2.0
    fpr_hi = _cp_upper(fp, fp + tn, alpha)
    fnr_hi = _cp_upper(fn, tp + fn, alpha)
    return float(_eps_from_rates(fpr_hi, fnr_hi, delta))


def per_group_epsilon_lower_bound(
    scores, membership, groups, *, delta: float, confidence: float = 0.95,
    seed=0, max_thresholds: int = 512,
) -> dict:
    """Per-group empirical ε lower bound from the threshold attack.

    For each group all (model, sample) pairs of its samples are pooled.  The
    models are split in two halves (pair-stratified, as for ``held_out``); the
    threshold is chosen on the first half (maximising the Clopper-Pearson ε
    bound over up to ``max_thresholds`` candidate thresholds) and the attack is
    *counted on the second half only*, so the selection does not invalidate the
    bound.  Returns ``{g: {"tp", "fn", "fp", "tn", "threshold", "tpr", "fpr",
    "epsilon_lb"}}``.  (Pairs sharing a sample are not independent trials — the
    usual caveat of auditing with many samples per model.)
    """
    s, m = _as_pair(scores, membership)
    values, idx = _group_index(groups, s.shape[1])
    rng = np.random.default_rng(seed)
    ia, ib = _split_models(m, rng)
    alpha = (1.0 - confidence) / 2.0
    out = {}
    for v, ix in zip(values, idx):
        sa, ma = s[np.ix_(ia, ix)].ravel(), m[np.ix_(ia, ix)].ravel()
        sb, mb = s[np.ix_(ib, ix)].ravel(), m[np.ix_(ib, ix)].ravel()
        pos_a, neg_a = np.sort(sa[ma]), np.sort(sa[~ma])
        uniq = np.unique(sa)
        if uniq.size > max_thresholds:
            uniq = np.unique(uniq[np.linspace(0, uniq.size - 1, max_thresholds).round().astype(int)])
        cand = uniq  # rule: member if score >= t
        tp_a = pos_a.size - np.searchsorted(pos_a, cand, side="left")
        fp_a = neg_a.size - np.searchsorted(neg_a, cand, side="left")
        if pos_a.size and neg_a.size:
            eps_a = _eps_from_rates(
                _cp_upper(fp_a, neg_a.size, alpha), _cp_upper(pos_a.size - tp_a, pos_a.size, alpha), delta
            )
            t = float(cand[int(np.argmax(eps_a))])
        else:
            t = float("inf")
        pred = sb >= t
        tp = int(np.count_nonzero(pred & mb))
        fn = int(np.count_nonzero(~pred & mb))
        fp = int(np.count_nonzero(pred & ~mb))
        tn = int(np.count_nonzero(~pred & ~mb))
        if tp + fn and fp + tn:
            eps = epsilon_lower_bound(tp, fn, fp, tn, delta=delta, confidence=confidence)
            tpr, fpr = tp / (tp + fn), fp / (fp + tn)
        else:
            eps, tpr, fpr = float("nan"), float("nan"), float("nan")
        out[v] = {"tp": tp, "fn": fn, "fp": fp, "tn": tn, "threshold": t,
                  "tpr": tpr, "fpr": fpr, "epsilon_lb": eps}
    return out
