"""The baselines from the same models: PA-GA (one threshold per model), PA-GBA (one per model and group),
PA-LOOA (dedicated models with and without a record), and LiRA (online, fixed variance) with its ROC, AUC and
TPR at low FPR per group."""

from __future__ import annotations


import numpy as np

from engine.audit.pa_alooa.parallel import each_block as _each_block
from engine.audit.pa_alooa.stats.inputs import _as_pair, _group_index
from engine.audit.pa_alooa.stats.thresholds import _BLOCK_ELEMS, _in_sample, _sorted_of
from engine.audit.pa_alooa.stats.advantage import sample_advantage


# --------------------------------------------------------------------------- #
# 6. baselines
# --------------------------------------------------------------------------- #
def pa_ga(scores, membership) -> float:
    """Global attack: one threshold per model shared by all samples (chosen
    in-sample to maximise TPR - FPR over that model's samples); mean over models."""
    s, m = _as_pair(scores, membership)
    srt = _sorted_of(s, "models")
    return float(np.nanmean(_in_sample(srt, srt.rows_coder(m))))


def pa_gba(scores, membership, groups) -> dict:
    """Group-based attack: one in-sample threshold per (model, group); the
    mean over models of TPR - FPR, per group."""
    s, m = _as_pair(scores, membership)
    values, idx = _group_index(groups, s.shape[1])
    srt = _sorted_of(s, "models")  # each model's scores sorted once; a group is a subset of them
    out = {}
    for v, ix in zip(values, idx):
        sub = np.zeros(s.shape[1], dtype=np.int8)
        sub[ix] = 2
        adv = _in_sample(srt, srt.rows_coder(m, sub), subset=True)
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
    M, n = c.shape
    step = max(1, _BLOCK_ELEMS // max(M, 1))
    blocks = [(a, min(n, a + step)) for a in range(0, n, step)]
    n_in, s_in, s_out = np.empty(n), np.empty(n), np.empty(n)
    ok_counts, sq_sums = [0] * len(blocks), [0.0] * len(blocks)  # per block, summed in block order below

    def sums(k, a, b, _):  # per-sample sums and the pooled residuals, by blocks of samples
        cb, mb = c[:, a:b], m[:, a:b]
        mf = mb.astype(np.float64)
        n_in[a:b] = mf.sum(axis=0)
        s_in[a:b] = (cb * mf).sum(axis=0)
        s_out[a:b] = cb.sum(axis=0) - s_in[a:b]
        mu_in_full = s_in[a:b] / n_in[a:b]
        mu_out_full = s_out[a:b] / (M - n_in[a:b])
        resid = np.where(mb, cb - mu_in_full, cb - mu_out_full)
        ok_counts[k] = int(np.count_nonzero(~np.isnan(resid)))
        sq_sums[k] = float(np.nansum(resid**2))

    out = np.empty((M, n))

    def score(k, a, b, _):
        cb, mf = c[:, a:b], m[:, a:b].astype(np.float64)
        li_n_in = n_in[None, a:b] - mf
        li_n_out = n_out[None, a:b] - (1.0 - mf)
        mu_in = (s_in[None, a:b] - cb * mf) / li_n_in
        mu_out = (s_out[None, a:b] - cb * (1.0 - mf)) / li_n_out
        o = ((cb - mu_out) ** 2 - (cb - mu_in) ** 2) / (2.0 * var)
        o[(li_n_in <= 0) | (li_n_out <= 0)] = np.nan
        out[:, a:b] = o

    with np.errstate(divide="ignore", invalid="ignore"):  # (numpy's error state is per thread: set in each)
        _each_block(blocks, lambda *a: _quiet(sums, *a))
        ok_count, sq_sum = sum(ok_counts), 0.0
        for v in sq_sums:
            sq_sum += v
        n_out = M - n_in
        dof = ok_count - np.count_nonzero(n_in > 0) - np.count_nonzero(n_out > 0)
        var = float(sq_sum / max(dof, 1))
        var = max(var, 1e-30)
        _each_block(blocks, lambda *a: _quiet(score, *a))
    return out


def _quiet(body, *args):
    """``body(*args)`` without numpy's divide / invalid warnings (in the thread that runs it)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return body(*args)


class _RocPieces:
    """The ROC of "positive if score >= t" over distinct thresholds (NaN scores dropped), in pieces: the positives
    and the negatives sorted apart, then cut at every ``_BLOCK_ELEMS``-th value of either side (equal scores stay
    in one piece) and merged piece by piece, from the top. :func:`roc_curve_points` joins the pieces' points;
    :func:`roc_summary` folds each piece into its summary as it comes (a curve of millions of points is never
    kept whole)."""

    def __init__(self, scores, labels):
        s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels).astype(bool, copy=False)
        if s.shape != y.shape:
            raise ValueError("scores and labels must have the same size")
        # the points do not depend on the order of the pairs: flatten both in their memory order (a column
        # selection such as scores[:, sel] is Fortran-ordered; a C-order ravel would copy it)
        order = "F" if s.flags.f_contiguous and y.flags.f_contiguous else "C"
        s, y = s.ravel(order=order), y.ravel(order=order)
        keep = ~np.isnan(s)
        pos_sel = keep & y
        P = int(np.count_nonzero(pos_sel))
        N = int(np.count_nonzero(keep)) - P
        if P == 0 or N == 0:
            raise ValueError("need both positive and negative labels")
        both = np.empty(P + N)
        np.compress(pos_sel, s, out=both[:P])
        keep &= ~y
        np.compress(keep, s, out=both[P:])
        del keep, pos_sel
        self.P, self.N = P, N
        self.pos, self.neg = both[:P], both[P:]
        _each_block([(0, P), (P, P + N)], lambda k, a, b, _: both[a:b].sort())
        cuts = np.unique(np.concatenate([self.pos[_BLOCK_ELEMS::_BLOCK_ELEMS], self.neg[_BLOCK_ELEMS::_BLOCK_ELEMS]]))
        self.pcut = np.r_[0, np.searchsorted(self.pos, cuts, side="left"), P]
        self.ncut = np.r_[0, np.searchsorted(self.neg, cuts, side="left"), N]
        self.pieces = [(k, k + 1) for k in range(cuts.size, -1, -1)]  # in descending order of scores

    def above(self, i: int) -> tuple[float, float]:
        """The ROC point (fpr, tpr) just before piece ``i``: every element of the pieces above it counted ((0, 0)
        for the first). Pieces end between distinct scores, so it is the last point of piece ``i - 1``."""
        k = self.pieces[i][0]
        return (self.N - int(self.ncut[k + 1])) / self.N, (self.P - int(self.pcut[k + 1])) / self.P

    def points(self, i: int):
        """(fpr, tpr) at the run ends of piece ``i`` (the i-th from the top); None for an empty piece."""
        import torch  # the pieces' cumulative sums (as in _best_run_end)

        k = self.pieces[i][0]
        P, N = self.P, self.N
        p0, p1, n0, n1 = self.pcut[k], self.pcut[k + 1], self.ncut[k], self.ncut[k + 1]
        if p1 == p0 and n1 == n0:
            return None
        piece = np.concatenate([self.pos[p0:p1], self.neg[n0:n1]])
        order = np.argsort(piece, kind="stable")[::-1]  # descending; the order within ties does not matter
        v = piece[order]
        last = np.empty(v.size, dtype=bool)  # the last position of each run of equal scores
        np.not_equal(v[:-1], v[1:], out=last[:-1])
        last[-1] = True  # pieces end between distinct scores
        tp = torch.from_numpy(order < p1 - p0).cumsum(0).numpy()  # int64 (torch: see _best_run_end)
        tp += P - p1  # the positives of the pieces above (all of pos[p1:])
        at = np.flatnonzero(last)
        tp = tp[at]
        done = (P - p1) + (N - n1)  # the elements of the pieces above
        return np.divide(at + (done + 1) - tp, N), np.divide(tp, P)


def roc_curve_points(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    """ROC of "positive if score >= t" over distinct thresholds (NaN scores
    dropped).  Returns ``(fpr, tpr)``, both starting at 0 and ending at 1."""
    roc = _RocPieces(scores, labels)
    points: list = [None] * len(roc.pieces)

    def piece_points(i, _a, _b, _):
        points[i] = roc.points(i)

    _each_block(roc.pieces, piece_points)
    got = [pt for pt in points if pt is not None]
    fpr = np.concatenate([np.zeros(1)] + [f for f, _ in got])
    tpr = np.concatenate([np.zeros(1)] + [t for _, t in got])
    return fpr, tpr


def roc_summary(scores, labels, *, roc_points: int | None = None) -> dict:
    """What a report shows of the ROC of :func:`roc_curve_points`, without keeping the curve: ``{"auc",
    "tpr_at_0.1%", "tpr_at_1%"}`` as :func:`auc` and :func:`tpr_at_fpr` give them on the whole curve, and with
    ``roc_points`` ``"roc": {"fpr", "tpr"}``, the curve's upper envelope on the grid below from half its smallest
    positive FPR (at least 1e-5) up, plus (1, 1): a grid of ``roc_points`` log-spaced FPRs from 1e-5 to 1 (for
    log-log plots).

    Each piece of the curve is folded in with the point before it (its area, the last point at or below each
    FPR asked for; the TPR never decreases along the curve, so that point's TPR is the largest up to it); the
    pieces' areas are added in the curve's order, so the numbers do not depend on the number of threads."""
    roc = _RocPieces(scores, labels)
    targets = np.array([0.001, 0.01])
    grid = np.unique(np.concatenate([np.logspace(-5, 0, roc_points), [1.0]])) if roc_points else np.empty(0)
    ask = np.concatenate([targets, grid])
    n = len(roc.pieces)
    area, found, smallest = np.zeros(n), np.full((n, ask.size), np.nan), np.full(n, np.inf)

    def fold(i, _a, _b, _):
        pt = roc.points(i)
        if pt is None:
            return
        f0, t0 = roc.above(i)
        f, t = np.r_[f0, pt[0]], np.r_[t0, pt[1]]
        area[i] = auc(f, t)  # this piece's trapezoids, the point before it included
        at = np.searchsorted(f, ask, side="right") - 1
        found[i] = np.where(at >= 0, t[np.maximum(at, 0)], np.nan)
        positive = f[f > 0]
        if positive.size:
            smallest[i] = positive.min()

    _each_block(roc.pieces, fold)
    total = 0.0
    for a in area:  # in the curve's order
        total += a
    last = np.zeros(ask.size)  # the curve's first point, (0, 0)
    for row in found:  # the last piece that reaches down to an FPR holds its last point at or below it
        last = np.where(np.isnan(row), last, row)
    out = {"auc": float(total), "tpr_at_0.1%": float(last[0]), "tpr_at_1%": float(last[1])}
    if roc_points:
        lowest = float(smallest.min()) if np.isfinite(smallest).any() else 1.0
        keep = grid >= max(lowest, 1e-5) / 2
        out["roc"] = {"fpr": grid[keep].tolist(), "tpr": last[targets.size:][keep].tolist()}
    return out


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


def lira_by_group(lira, membership, groups, *, roc_points: int | None = None) -> dict:
    """Pool every (model, sample) pair of a group's samples; ``{g: {"auc", "tpr_at_0.1%", "tpr_at_1%"}}``, and with
    ``roc_points`` each group's thinned ROC (:func:`roc_summary`)."""
    s = np.asarray(lira, dtype=np.float64)
    m = np.asarray(membership).astype(bool)
    values, idx = _group_index(groups, s.shape[1])
    return {v: roc_summary(s[:, ix], m[:, ix], roc_points=roc_points) for v, ix in zip(values, idx)}
