"""The threshold searches every statistic of the audit runs on: each sample's scores sorted once
(``_Sorted``), the in-sample and held-out best rules with exact integer objectives (the checked inputs and the
models' halves they search over: ``inputs``)."""

from __future__ import annotations

import threading
import weakref

import numpy as np

from engine.audit.pa_alooa.parallel import each_block as _each_block

# Max number of matrix elements processed per chunk in the vectorised kernels
# (bounds peak memory at roughly a few hundred MB for float64).
_CHUNK_ELEMS = 2_000_000


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


_SORTED: dict = {}  # layout -> (weak reference to the scores array, its _Sorted): the last one built of each layout
_SORTED_LOCK = threading.Lock()  # the audit's analysis runs sample_advantage / null_distribution beside pa_ga / pa_gba


def _sorted_of(s: np.ndarray, layout: str) -> _Sorted:
    """``_Sorted`` of the scores ``s`` (``(M, n)``) by sample (``layout="samples"``: each sample's models) or by
    model (``"models"``: each model's samples, without the sorted values). The last one built of each layout is kept
    while its array lives, and reused when the same array comes back with the same contents (checked: the kept
    order must still sort it), so ``sample_advantage`` / ``null_distribution`` and ``pa_ga`` / ``pa_gba`` sort once,
    also when the two pairs run on two threads at once."""
    rows = s.T if layout == "samples" else s
    with _SORTED_LOCK:
        kept = _SORTED.get(layout)
    if kept is not None and kept[0]() is s and kept[1].sorts(rows):
        return kept[1]
    with _SORTED_LOCK:
        _SORTED.pop(layout, None)  # frees the last one before sorting again
    srt = _Sorted(rows, keep_values=layout == "samples")
    try:
        ref = weakref.ref(s, lambda r: _SORTED.pop(layout, None) if _SORTED.get(layout, (None,))[0] is r else None)
    except TypeError:
        return srt
    with _SORTED_LOCK:
        _SORTED[layout] = (ref, srt)
    return srt


class _Work:
    """Per-block scratch arrays of one pass over a :class:`_Sorted` (reused block after block)."""

    def __init__(self, srt: "_Sorted", n_x: int, dt=None):
        C = max((b - a for a, b in srt.blocks), default=0)
        L, K = srt.L, srt.K
        self.dt = dt or (np.int32 if (L + 1) * K < 2**31 else np.int64)
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


_INT_MIN = {2: np.iinfo(np.int16).min, 4: np.iinfo(np.int32).min, 8: np.iinfo(np.int64).min}


def _halves_packing(sizes) -> tuple[int, type]:
    """K and the integer type of :func:`_halves_pm1`'s packing for halves of ``sizes`` models: in a half of ``n``,
    at most ``n`` elements are counted (< K) and the objective (members - non-members so far) is at most ``n / 2``
    either way, so every packed sum lies in ``(-(n / 2 + 1) * K, (n / 2 + 1) * K)``: int16 for up to ~500 models
    (2R = 400: K = 256, |sums| <= 25,800), half the bytes of int32 for the passes over all (rows, L) elements."""
    n = max(sizes)
    K = 1 << int(n).bit_length()
    bound = (n // 2 + 1) * K
    return K, (np.int16 if bound < 2**15 else np.int32 if bound < 2**31 else np.int64)


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
    sizes = {"A": nA, "B": L - nA}
    K, dt = _halves_packing(sizes.values()) if balanced else (srt.K, None)
    code = np.empty((u, L), dtype=np.int8)
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

    _each_block(srt.blocks, search, lambda: _Work(srt, 2, dt))
    return srt, K, code, cms, P, N, j, raw, pm1


def _held_out_scored(rules: tuple) -> np.ndarray:
    """The second part of :func:`_held_out`, over whole rows: each half's rule scored on the other half."""
    srt, K, code, cms, P, N, j, raw, pm1 = rules
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


