"""Membership-audit statistics (numpy / scipy; torch only for the in-place cumulative sums, see _best_run_end).

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

Implementation: the threshold searches sort each sample's scores once (``_Sorted``) and reuse that order
for both held-out halves and for every permutation of the null (a subset's best rule is found on the full
order), with exact integer objectives, so the numbers are those of one sort per half and per permutation;
the random draws are the same calls, in the same order, as in the straightforward implementation.

Threads: the loops over blocks of rows (the sorts, the threshold searches, LiRA, the ROC's pieces) run on
:func:`set_threads` threads (:mod:`engine.audit.parallel`). Each block writes only its own rows, and whatever
is summed over blocks is summed in block order afterwards, so every number is the same for any number of
threads (a test checks 1 against 3).
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Hashable

import numpy as np
from scipy import stats as _sps

from engine.audit.parallel import each_block as _each_block
from engine.audit.parallel import one_ahead as _one_ahead
from engine.audit.parallel import set_threads
from engine.audit.parallel import then as _then

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
    "set_threads",
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


def _split_pairs(R: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random split of ``R`` complementary pairs into two halves (pair indices)."""
    if R < 2:
        raise ValueError("need at least 2 complementary pairs (2R >= 4) to split models")
    perm = rng.permutation(R)
    return np.sort(perm[: R // 2]), np.sort(perm[R // 2:])


def _split_models(membership: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random split of model indices into two halves.

    With complementary pairs, whole pairs go to one half (stratified: every
    sample has equally many members and non-members in each half); otherwise a
    plain random split of the models.
    """
    M = membership.shape[0]
    if _is_paired(membership):
        a, b = _split_pairs(M // 2, rng)
        pa = np.stack([2 * a, 2 * a + 1], axis=1).ravel()
        pb = np.stack([2 * b, 2 * b + 1], axis=1).ravel()
        return pa, pb
    if M < 4:
        raise ValueError("need at least 4 models to split them in halves")
    perm = rng.permutation(M)
    return np.sort(perm[: M // 2]), np.sort(perm[M // 2:])


# Elements per block of a sorted layout (:class:`_Sorted`): a block's temporaries stay in the CPU's cache.
_BLOCK_ELEMS = 1 << 17


class _Sorted:
    """Each row of ``rows`` — ``(u, L)``: one unit (a sample, or a model) and its ``L`` scores — sorted in
    descending order, once; every threshold search on these scores (both held-out halves, every permutation
    of the membership, every group) reuses the sort.

    A search over a subset H of a row's elements (a half of the models, a group of samples) runs on the row's
    full order: cumulative member / non-member counts of H over all ``L`` positions hold, at each position, the
    counts of H's last element at or before it, so the first maximum over *run ends* (the last position of each
    run of equal scores) is the first maximum over H's own admissible rules (the last H element of each run of
    equal scores) — the rule a sort of H alone finds, with the same scores around it. Tied scores are
    classified together either way, so the order of the sort within ties does not matter.
    """

    def __init__(self, rows: np.ndarray, keep_values: bool = True):
        u, L = rows.shape
        self.u, self.L = u, L
        step = max(1, _BLOCK_ELEMS // max(L, 1))
        self.blocks = [(a, min(u, a + step)) for a in range(0, u, step)]
        self.ss = np.empty((u, L)) if keep_values else None  # the sorted scores (thresholds need them)
        # per block: flat index of each sorted position into a (rows, L) source
        self.idx: list[np.ndarray] = [None] * len(self.blocks)
        # per block: None (no ties) or (rows with ties, mask of positions ending no run)
        self.notend: list = [None] * len(self.blocks)
        self._pidx: list[np.ndarray] | None = None
        idt = np.int32 if u * L < 2**31 else np.intp  # (np.take widens it as it goes: a little slower, half the memory)

        def sort_block(k, a, b, _):
            r = np.ascontiguousarray(rows[a:b], dtype=np.float64)
            o = np.argsort(-r, axis=1)
            ss = np.take_along_axis(r, o, axis=1)
            if keep_values:
                self.ss[a:b] = ss
            o += (np.arange(b - a, dtype=o.dtype) * L)[:, None]
            self.idx[k] = o.astype(idt, copy=False)
            self.notend[k] = self._ties(ss)

        _each_block(self.blocks, sort_block)
        # cumulative counts are packed as (objective) * K - (elements so far), elements < K
        self.K = 1 << int(L).bit_length()

    @staticmethod
    def _ties(ss: np.ndarray):
        tie = ss[:, :-1] == ss[:, 1:]
        tied = np.flatnonzero(tie.any(axis=1))
        if not tied.size:
            return None
        mask = np.zeros((tied.size, ss.shape[1]), dtype=bool)
        mask[:, :-1] = tie[tied]
        return tied, mask

    def sorts(self, rows: np.ndarray) -> bool:
        """Whether this order still sorts ``rows`` (same shape; the same scores, or without kept values: scores
        in the same order with the same ties, all a search without thresholds depends on)."""
        if rows.shape != (self.u, self.L):
            return False
        ok = [False] * len(self.blocks)

        def check(k, a, b, _):
            v = np.take(np.ascontiguousarray(rows[a:b], dtype=np.float64).reshape(-1), self.idx[k])
            if self.ss is not None:
                ok[k] = np.array_equal(v, self.ss[a:b])
                return
            if not (v[:, :-1] >= v[:, 1:]).all():
                return
            ties, kept = self._ties(v), self.notend[k]
            ok[k] = not ((ties is None) != (kept is None) or (ties is not None and not (
                np.array_equal(ties[0], kept[0]) and np.array_equal(ties[1], kept[1]))))

        _each_block(self.blocks, check)
        return all(ok)

    def pair_idx(self, k: int) -> np.ndarray:
        """Block ``k``'s flat index into a ``(rows, L // 2)`` source of the complementary pairs (model // 2)."""
        if self._pidx is None:
            self._pidx = [(o >> 1).astype(np.intp) for o in self.idx]  # (i*L + model) // 2 = i*L/2 + model // 2
        return self._pidx[k]

    def rows_coder(self, mem_rows: np.ndarray, extra: np.ndarray | None = None):
        """Fills block ``k`` of the code (sorted order): bit 0 = ``mem_rows`` (``(u, L)`` bool), plus ``extra``
        (``(L,)`` int8, in the rows' own order)."""
        def fill(k, a, b, out):
            src = np.ascontiguousarray(mem_rows[a:b]).view(np.int8)
            if extra is not None:
                src = src + extra
            np.take(src.reshape(-1), self.idx[k], out=out)
        return fill

    def flip_coder(self, m_sorted: np.ndarray, pairs: np.ndarray):
        """Like :meth:`rows_coder` for the membership ``m`` with each complementary pair's member swapped where
        bit 0 of ``pairs`` (``(u, L/2)`` int8: unit, pair) is set, given ``m`` in sorted order (``m_sorted``);
        the other bits of ``pairs`` are kept (bit 1: the pair is in half A)."""
        def fill(k, a, b, out):
            np.take(pairs[a:b].reshape(-1), self.pair_idx(k), out=out)
            out ^= m_sorted[a:b]
        return fill


_SORTED: list = []  # [layout, weak reference to the scores array, its _Sorted]: the last one built


def _sorted_of(s: np.ndarray, layout: str) -> _Sorted:
    """``_Sorted`` of the scores ``s`` (``(M, n)``) by sample (``layout="samples"``: each sample's models) or by
    model (``"models"``: each model's samples, without the sorted values). The last one built is kept while its
    array lives, and reused when the same array comes back with the same contents (checked: the kept order must
    still sort it), so ``sample_advantage`` / ``null_distribution`` and ``pa_ga`` / ``pa_gba`` sort once."""
    rows = s.T if layout == "samples" else s
    if _SORTED and _SORTED[0] == layout and _SORTED[1]() is s and _SORTED[2].sorts(rows):
        return _SORTED[2]
    _SORTED.clear()  # frees the last one before sorting again
    srt = _Sorted(rows, keep_values=layout == "samples")
    try:
        ref = weakref.ref(s, lambda r: _SORTED.clear() if _SORTED and _SORTED[1] is r else None)
    except TypeError:
        return srt
    _SORTED[:] = [layout, ref, srt]
    return srt


class _Work:
    """Per-block scratch arrays of one pass over a :class:`_Sorted` (reused block after block)."""

    def __init__(self, srt: "_Sorted", n_x: int):
        C = max((b - a for a, b in srt.blocks), default=0)
        L, K = srt.L, srt.K
        self.dt = np.int32 if (L + 1) * K < 2**31 else np.int64
        self.bit = np.empty((C, L), dtype=np.int8)
        self.e = np.empty((C, L), dtype=self.dt)
        self.x = [np.empty((C, L), dtype=self.dt) for _ in range(n_x)]


def _weights(code: np.ndarray, cm: int, cn: int, P: np.ndarray, N: np.ndarray, K: int, out: np.ndarray):
    """Weights whose cumulative sums pack, at each position, ``(tp * N - fp * P) / g * K - (tp + fp)`` of the
    elements coded ``cm`` (members) / ``cn`` (non-members): ``g = P`` where every row has ``P == N`` (-> True),
    else 1 (int64; -> False)."""
    C = code.shape[0]
    if np.array_equal(P, N):
        lut = np.zeros(4, dtype=out.dtype)
        lut[cm], lut[cn] = K - 1, -K - 1
        np.take(lut, code, out=out)
        return out, True
    lut = np.zeros((C, 4), dtype=np.int64)
    lut[:, cm], lut[:, cn] = N * K - 1, -P * K - 1
    return np.take(lut.reshape(-1), code + (np.arange(C) * 4)[:, None]), False


def _halves_pm1(code: np.ndarray, K: int, w: _Work, C: int):
    """The weights of :func:`_weights` for both halves at once (every row balanced in both): members of A
    (code 3) K - 1, non-members of A (code 2) -K - 1, in x[0]; the same for B (codes 1, 0) in x[1]."""
    bit, e = w.bit[:C], w.e[:C]
    xa, xb = w.x[0][:C], w.x[1][:C]
    np.bitwise_and(code, 1, out=bit)
    np.multiply(bit, 2 * K, out=e, dtype=w.dt)
    e -= K + 1  # K - 1 for members, -K - 1 for non-members
    np.right_shift(code, 1, out=bit)  # 1 in A
    np.multiply(e, bit, out=xa, dtype=w.dt)
    np.subtract(e, xa, out=xb)
    return xa, xb


_INT_MIN = {4: np.iinfo(np.int32).min, 8: np.iinfo(np.int64).min}


def _best_run_end(srt: _Sorted, k: int, x: np.ndarray) -> np.ndarray:
    """Cumulates the weights ``x`` (in place) and finds per row the first run end where the packed objective
    is largest (the first maximum of ``tp * N - fp * P``: exact integers, so equally good rules tie exactly;
    among them the highest threshold wins)."""
    import torch  # its in-place cumsum: ~2.5x numpy's along rows, and it releases the GIL (numpy's does not)

    torch.from_numpy(x).cumsum_(dim=1)  # exact: integers, and the packing keeps every sum inside x's dtype
    ne = srt.notend[k]
    if ne is not None:  # only run ends are rules
        tied, mask = ne
        sub = x[tied]
        sub[mask] = _INT_MIN[x.dtype.itemsize]
        x[tied] = sub
    return np.argmax(x, axis=1)


def _decode(x: np.ndarray, K: int, P: np.ndarray, N: np.ndarray, pm1: np.ndarray):
    """(tp, fp) from packed cumulative counts (``pm1``: per row, whether the weights were the balanced ones)."""
    x = x.astype(np.int64)
    cnt = (-x) % K
    d = (x + cnt) // K
    tp = np.where(pm1, (cnt + d) // 2, (d + P * cnt) // np.maximum(N + P, 1))
    return tp, cnt - tp


def _advantage(best: np.ndarray, P: np.ndarray, N: np.ndarray) -> np.ndarray:
    """TPR - FPR of the best rule (0 for the empty rule; NaN without members or non-members)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        adv = np.where(best <= 0, 0.0, best / (P * N).astype(np.float64))
    adv[(P == 0) | (N == 0)] = np.nan
    return adv


def _threshold(ss: np.ndarray, code: np.ndarray, j: np.ndarray, empty: np.ndarray, cm: int, cn: int):
    """The rule's threshold, strictly between its lowest included score (``ss[j]``) and the subset's next
    distinct score (the midpoint when representable); -inf for "all included"; NaN for the empty rule ("score
    >= nan" is never true; it wins ties: among equally good rules the highest threshold wins). -> (t, next)."""
    rows = np.arange(ss.shape[0])
    hi = ss[rows, j]
    nxt = _next_in(code, j, cm, cn)
    has = nxt >= 0
    lo = np.where(has, ss[rows, np.maximum(nxt, 0)], -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        mid = 0.5 * hi + 0.5 * lo
    t = np.where(np.isfinite(lo) & (mid > lo) & (mid <= hi), mid, hi)
    t = np.where(has, t, -np.inf)
    return np.where(empty, np.nan, t), nxt


def _next_in(code: np.ndarray, j: np.ndarray, cm: int, cn: int) -> np.ndarray:
    """Per row, the first position after ``j`` coded ``cm`` or ``cn`` (-1 where none)."""
    u, L = code.shape
    flat = code.reshape(-1)
    nxt = np.full(u, -1, dtype=np.intp)
    rows, at = np.arange(u), np.arange(u) * L + j + 1  # flat positions
    end = (rows + 1) * L
    while rows.size:  # one position per step: runs of other codes are short
        inside = at < end
        rows, at, end = rows[inside], at[inside], end[inside]
        v = flat[at]
        hit = (v == cm) | (v == cn)
        nxt[rows[hit]] = at[hit] - rows[hit] * L
        miss = ~hit
        rows, at, end = rows[miss], at[miss] + 1, end[miss]
    return nxt


def _scored(ss, code, j, t, pre, cm, cn, P, N):
    """(tp, fp) of the rule "score >= t" on the elements coded ``cm`` / ``cn``, given their counts ``pre``
    among the first ``j + 1`` positions (``t <= ss[j]``; after ``j``, the scores >= t belong to them)."""
    tp, fp = pre[0].copy(), pre[1].copy()
    u, L = ss.shape
    sflat, cflat = ss.reshape(-1), code.reshape(-1)
    rows = np.flatnonzero(np.isfinite(t))
    at = rows * L + j[rows] + 1
    end = (rows + 1) * L
    tt = t[rows]
    while rows.size:  # one position per step, while the scores reach t
        more = at < end
        more[more] = sflat[at[more]] >= tt[more]
        rows, at, end, tt = rows[more], at[more], end[more], tt[more]
        v = cflat[at]
        tp[rows] += v == cm
        fp[rows] += v == cn
        at = at + 1
    empty, every = np.isnan(t), np.isneginf(t)
    tp[empty], fp[empty] = 0, 0
    tp[every], fp[every] = P[every], N[every]
    return tp, fp


def _rate_gap(tp, fp, P, N) -> np.ndarray:
    """TPR - FPR (NaN without members or non-members)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = tp / P - fp / N
    out[(P == 0) | (N == 0)] = np.nan
    return out


def _in_sample(srt: _Sorted, coder, *, subset: bool = False, balanced: bool = False, want_threshold: bool = False):
    """Best in-sample rule per row of ``srt`` over all its elements (``coder``: bit 0 = member) or over the
    subset with bit 1 set. ``balanced``: as many members as non-members in every row (skips the count).
    -> adv [, threshold]."""
    u, L = srt.u, srt.L
    cm, cn = (3, 2) if subset else (1, 0)
    P, N, raw = (np.empty(u, dtype=np.int64) for _ in range(3))
    pm1 = np.empty(u, dtype=bool)
    j = np.empty(u, dtype=np.intp)
    code = np.empty((u, L), dtype=np.int8) if want_threshold else None

    def search(k, a, b, w):
        C = b - a
        c = code[a:b] if want_threshold else w.bit[:C]
        coder(k, a, b, c)
        if balanced:
            P[a:b] = N[a:b] = L // 2
        else:
            P[a:b] = np.count_nonzero(c == cm, axis=1)
            N[a:b] = (L - P[a:b]) if not subset else np.count_nonzero(c == cn, axis=1)
        x, pm1[a:b] = _weights(c, cm, cn, P[a:b], N[a:b], srt.K, w.x[0][:C])
        j[a:b] = jk = _best_run_end(srt, k, x)
        raw[a:b] = x[np.arange(C), jk]

    _each_block(srt.blocks, search, lambda: _Work(srt, 1))
    tp, fp = _decode(raw, srt.K, P, N, pm1)
    best = tp * N - fp * P
    adv = _advantage(best, P, N)
    if not want_threshold:
        return adv
    return adv, _threshold(srt.ss, code, j, best <= 0, cm, cn)[0]


def _held_out(srt: _Sorted, coder, nA: int, *, balanced: bool = False) -> np.ndarray:
    """Held-out advantage per row of ``srt`` (the samples; ``L`` = the models): the rule chosen on half A
    (``coder``: bit 0 = member, bit 1 = model in A; ``nA`` models) scored on half B and the other way round,
    averaged. ``balanced``: every row has as many members as non-members in each half (whole pairs)."""
    return _held_out_scored(_held_out_rules(srt, coder, nA, balanced=balanced))


def _held_out_rules(srt: _Sorted, coder, nA: int, *, balanced: bool = False) -> tuple:
    """The first part of :func:`_held_out`, over the blocks: each half's best rule and the packed counts of both
    halves at it."""
    u, L = srt.u, srt.L
    K = srt.K
    code = np.empty((u, L), dtype=np.int8)
    sizes = {"A": nA, "B": L - nA}
    cms = {"A": (3, 2), "B": (1, 0)}
    P, N, j = {}, {}, {}
    for h in "AB":
        if balanced:
            P[h] = N[h] = np.full(u, sizes[h] // 2, dtype=np.int64)
        else:
            P[h], N[h] = np.empty(u, dtype=np.int64), np.empty(u, dtype=np.int64)
        j[h] = np.empty(u, dtype=np.intp)
    raw = {(h, o): np.empty(u, dtype=np.int64) for h in "AB" for o in "AB"}  # h's packed counts at o's rule
    pm1 = {h: np.full(u, True) for h in "AB"}

    def search(k, a, b, w):
        C = b - a
        c = code[a:b]
        coder(k, a, b, c)
        if balanced:
            xs = dict(zip("AB", _halves_pm1(c, K, w, C)))
        else:
            xs = {}
            for i, h in enumerate("AB"):
                P[h][a:b] = np.count_nonzero(c == cms[h][0], axis=1)
                N[h][a:b] = sizes[h] - P[h][a:b]
                xs[h], pm1[h][a:b] = _weights(c, *cms[h], P[h][a:b], N[h][a:b], K, w.x[i][:C])
        for h in "AB":
            j[h][a:b] = _best_run_end(srt, k, xs[h])
        rows = np.arange(C)
        for h in "AB":
            for o in "AB":
                raw[h, o][a:b] = xs[h][rows, j[o][a:b]]

    _each_block(srt.blocks, search, lambda: _Work(srt, 2))
    return srt, code, cms, P, N, j, raw, pm1


def _held_out_scored(rules: tuple) -> np.ndarray:
    """The second part of :func:`_held_out`, over whole rows: each half's rule scored on the other half."""
    srt, code, cms, P, N, j, raw, pm1 = rules
    K = srt.K
    out = 0.0
    for h, o in (("A", "B"), ("B", "A")):  # h's rule on o
        tp, fp = _decode(raw[h, h], K, P[h], N[h], pm1[h])
        t, _ = _threshold(srt.ss, code, j[h], tp * N[h] - fp * P[h] <= 0, *cms[h])
        pre = _decode(raw[o, h], K, P[o], N[o], pm1[o])  # o's counts among the first j[h] + 1 positions
        tp, fp = _scored(srt.ss, code, j[h], t, pre, *cms[o], P[o], N[o])
        out = out + _rate_gap(tp, fp, P[o], N[o])
    return 0.5 * out


def _best_threshold(scores: np.ndarray, membership: np.ndarray, want_threshold: bool = False):
    """Column-wise best threshold over models.  (M, n) -> (n,) advantage [, threshold]."""
    srt = _Sorted(scores.T)
    return _in_sample(srt, srt.rows_coder(membership.T), want_threshold=want_threshold)


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
        srt = _sorted_of(s, "samples")
        return _in_sample(srt, srt.rows_coder(m.T))
    if threshold != "held_out":
        raise ValueError(f"threshold must be 'in_sample' or 'held_out', got {threshold!r}")
    ia, _ = _split_models(m, np.random.default_rng(seed))
    srt = _sorted_of(s, "samples")
    inA = np.zeros(m.shape[0], dtype=np.int8)
    inA[ia] = 2
    return _held_out(srt, srt.rows_coder(m.T, inA), ia.size, balanced=_is_paired(m))


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
    if int(n_perm) > 0 and threshold not in ("in_sample", "held_out"):
        raise ValueError(f"threshold must be 'in_sample' or 'held_out', got {threshold!r}")
    rng = np.random.default_rng(seed)
    M = m.shape[0]
    paired = _is_paired(m)
    if int(n_perm) > 0:  # one sort for every permutation
        srt = _sorted_of(s, "samples")
        if paired:  # a permutation swaps members within pairs: code it from m's own sorted order
            m_sorted = np.empty((srt.u, M), dtype=np.int8)
            fill = srt.rows_coder(m.T)
            _each_block(srt.blocks, lambda k, a, b, _: fill(k, a, b, m_sorted[a:b]))
            # two of each: the next permutation is drawn into one while the other is searched
            flips = [np.empty((M // 2, m.shape[1]), dtype=bool) for _ in range(2)]
            pairs_of = [np.empty((m.shape[1], M // 2), dtype=np.int8) for _ in range(2)]  # flip + 2 * (pair in A)
            buf = np.empty((max(1, _BLOCK_ELEMS // max(m.shape[1], 1)), m.shape[1]))

    def prepare(p):
        """Permutation ``p``'s draws — those of _permute_membership(m, rng), then of sample_advantage(s, mp,
        seed=split_seed), in that order — and the coder of its membership (-> coder, models in half A)."""
        if paired:  # rng.random((M // 2, n)) < 0.5, drawn a few rows at a time (the same numbers)
            flip, pairs = flips[p % 2], pairs_of[p % 2]
            for r0 in range(0, M // 2, buf.shape[0]):
                r1 = min(M // 2, r0 + buf.shape[0])
                np.less(rng.random(out=buf[: r1 - r0]), 0.5, out=flip[r0:r1])
        else:
            mp = _permute_membership(m, rng)
        split_seed = int(rng.integers(2**63 - 1))
        if threshold == "in_sample":
            if paired:
                np.copyto(pairs, flip.T.view(np.int8))
                return srt.flip_coder(m_sorted, pairs), None
            return srt.rows_coder(mp.T), None
        if paired:  # the permuted membership keeps the pairs: whole pairs go to one half
            a_pairs, _ = _split_pairs(M // 2, np.random.default_rng(split_seed))
            inA = np.zeros(M // 2, dtype=np.int8)
            inA[a_pairs] = 2
            np.add(flip.T.view(np.int8), inA, out=pairs)
            return srt.flip_coder(m_sorted, pairs), 2 * a_pairs.size
        ia, _ = _split_models(mp, np.random.default_rng(split_seed))
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


def roc_curve_points(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    """ROC of "positive if score >= t" over distinct thresholds (NaN scores
    dropped).  Returns ``(fpr, tpr)``, both starting at 0 and ending at 1."""
    import torch  # the pieces' cumulative sums (as in _best_run_end)

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
    pos, neg = both[:P], both[P:]
    # positives and negatives sorted apart, then merged piece by piece, from the top
    _each_block([(0, P), (P, P + N)], lambda k, a, b, _: both[a:b].sort())
    # pieces: cut at every _BLOCK_ELEMS-th value of either side (equal scores stay in one piece)
    cuts = np.unique(np.concatenate([pos[_BLOCK_ELEMS::_BLOCK_ELEMS], neg[_BLOCK_ELEMS::_BLOCK_ELEMS]]))
    pcut = np.r_[0, np.searchsorted(pos, cuts, side="left"), P]
    ncut = np.r_[0, np.searchsorted(neg, cuts, side="left"), N]
    pieces = [(k, k + 1) for k in range(cuts.size, -1, -1)]  # in descending order of scores
    points: list = [None] * len(pieces)

    def piece_points(i, k, _next, _):  # the ROC points at the run ends of piece k (the i-th from the top)
        p0, p1, n0, n1 = pcut[k], pcut[k + 1], ncut[k], ncut[k + 1]
        if p1 == p0 and n1 == n0:
            return
        piece = np.concatenate([pos[p0:p1], neg[n0:n1]])
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
        points[i] = (np.divide(at + (done + 1) - tp, N), np.divide(tp, P))

    _each_block(pieces, piece_points)
    got = [pt for pt in points if pt is not None]
    fpr = np.concatenate([np.zeros(1)] + [f for f, _ in got])
    tpr = np.concatenate([np.zeros(1)] + [t for _, t in got])
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
    step = max(1, _BLOCK_ELEMS // max(s.shape[1], 1))
    for v, ix in zip(values, idx):
        full = ix.size == s.shape[1]

        def rows(models):  # (scores, membership) of the group's samples, a few models at a time
            for r in range(0, models.size, step):
                sel = models[r:r + step]
                yield (s[sel], m[sel]) if full else (s[np.ix_(sel, ix)], m[np.ix_(sel, ix)])

        P_a = int(np.count_nonzero(m[ia] if full else m[np.ix_(ia, ix)]))
        both = np.empty(ia.size * ix.size)  # half A's member scores, then its non-member scores
        pp, pn = 0, P_a
        for sr, mr in rows(ia):
            k = int(np.count_nonzero(mr))
            np.compress(mr.ravel(), sr.ravel(), out=both[pp:pp + k])
            np.compress(~mr.ravel(), sr.ravel(), out=both[pn:pn + mr.size - k])
            pp, pn = pp + k, pn + mr.size - k
        pos_a, neg_a = both[:P_a], both[P_a:]
        pos_a.sort()
        neg_a.sort()
        merged = np.sort(both, kind="stable")  # the sorted scores of half A: a merge of two sorted runs
        new_value = merged[1:] != merged[:-1]
        n_uniq = int(np.count_nonzero(new_value)) + 1 if merged.size else 0
        if n_uniq > max_thresholds:  # np.unique(sa) at evenly spaced ranks
            pick = np.linspace(0, n_uniq - 1, max_thresholds).round().astype(int)
            if n_uniq < merged.size:
                pick = np.flatnonzero(np.r_[True, new_value])[pick]
            cand = np.unique(merged[pick])
        else:
            cand = merged[np.r_[True, new_value]] if merged.size else merged
        del merged, new_value
        # rule: member if score >= t
        tp_a = pos_a.size - np.searchsorted(pos_a, cand, side="left")
        fp_a = neg_a.size - np.searchsorted(neg_a, cand, side="left")
        if pos_a.size and neg_a.size:
            eps_a = _eps_from_rates(
                _cp_upper(fp_a, neg_a.size, alpha), _cp_upper(pos_a.size - tp_a, pos_a.size, alpha), delta
            )
            t = float(cand[int(np.argmax(eps_a))])
        else:
            t = float("inf")
        del both, pos_a, neg_a
        tp = fp = P_b = N_b = 0
        for sr, mr in rows(ib):  # counted on half B only
            pred = sr >= t
            k = int(np.count_nonzero(mr))
            P_b, N_b = P_b + k, N_b + mr.size - k
            tp += int(np.count_nonzero(pred & mr))
            fp += int(np.count_nonzero(pred)) - int(np.count_nonzero(pred & mr))
        fn, tn = P_b - tp, N_b - fp
        if tp + fn and fp + tn:
            eps = epsilon_lower_bound(tp, fn, fp, tn, delta=delta, confidence=confidence)
            tpr, fpr = tp / (tp + fn), fp / (fp + tn)
        else:
            eps, tpr, fpr = float("nan"), float("nan"), float("nan")
        out[v] = {"tp": tp, "fn": fn, "fp": fp, "tn": tn, "threshold": t,
                  "tpr": tpr, "fpr": fpr, "epsilon_lb": eps}
    return out
