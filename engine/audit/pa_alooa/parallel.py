"""Threads for the audit statistics' loops over blocks of rows (:mod:`engine.audit.pa_alooa.stats`).

The statistics cut their (rows, L) work into blocks of about 2^17 elements that stay in the CPU's cache
(``stats.thresholds._BLOCK_ELEMS``); a block writes only its own rows. :func:`each_block` spreads the blocks over
:func:`set_threads` threads, interleaved, each thread with its own scratch arrays; numpy releases the GIL
inside the array operations, which hold almost all of the time. Default: the CPUs this process may use, at
most 8 — the statistics run after all training, so nothing of the audit competes for them.

The rule that keeps the numbers independent of the thread count: a block never reads what another block
writes, and whatever is summed over blocks is summed afterwards, in block order, by the caller.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["beside", "each_block", "one_ahead", "set_threads", "then"]
def _default_threads() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


_THREADS = [_default_threads()]
_POOL: list = []  # [ThreadPoolExecutor, its size], made on first use
_POOL_LOCK = threading.Lock()
_IN_POOL = threading.local()  # set in the pool's threads: a block loop inside a block runs serially (no deadlock)


def set_threads(n: int) -> int:
    """Threads for the statistics' block loops (>= 1); returns the previous number. The numbers do not depend
    on it."""
    n = int(n)
    if n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    old, _THREADS[0] = _THREADS[0], n
    return old


def _pool(size: int) -> ThreadPoolExecutor:
    with _POOL_LOCK:
        if not _POOL or _POOL[1] < size:
            if _POOL:
                _POOL[0].shutdown(wait=False)
            _POOL[:] = [ThreadPoolExecutor(size, thread_name_prefix="audit-stats",
                                           initializer=lambda: setattr(_IN_POOL, "on", True)), size]
        return _POOL[0]


def each_block(blocks, body, scratch=None) -> None:
    """``body(k, a, b, work)`` for every block ``k = (a, b)`` of ``blocks``; thread ``t`` of ``T`` takes blocks
    ``t, t + T, ...`` with its own ``work = scratch()`` (None without ``scratch``). Blocks must write disjoint
    rows: the order in which they run is not fixed."""
    T = min(_THREADS[0], len(blocks))
    if T <= 1 or getattr(_IN_POOL, "on", False):
        work = scratch() if scratch else None
        for k, (a, b) in enumerate(blocks):
            body(k, a, b, work)
        return

    def part(t):
        work = scratch() if scratch else None
        for k in range(t, len(blocks), T):
            body(k, *blocks[k], work)

    futures = [_pool(T).submit(part, t) for t in range(T)]
    for f in futures:
        f.result()


def one_ahead(make, n: int):
    """Yields ``make(0), ..., make(n - 1)``, in order; with more than one thread, ``make(p + 1)`` runs on a helper
    thread while the caller works on ``make(p)`` (so ``make`` may reuse the buffers of ``p - 1``)."""
    if n <= 0:
        return
    if _THREADS[0] <= 1 or getattr(_IN_POOL, "on", False):
        for p in range(n):
            yield make(p)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="audit-stats-ahead") as ahead:
        nxt = ahead.submit(make, 0)
        for p in range(n):
            cur = nxt.result()
            if p + 1 < n:
                nxt = ahead.submit(make, p + 1)
            yield cur


def then(first, second, items):
    """Yields ``second(first(x))`` for each ``x`` of ``items``, in order; with more than one thread, ``second`` of
    one item runs on a helper thread while ``first`` of the next one runs (``first``'s result must not share
    buffers with the next ``first``)."""
    if _THREADS[0] <= 1 or getattr(_IN_POOL, "on", False):
        for x in items:
            yield second(first(x))
        return
    with ThreadPoolExecutor(1, thread_name_prefix="audit-stats-then") as helper:
        pending = None
        for x in items:
            done = first(x)
            if pending is not None:
                yield pending.result()
            pending = helper.submit(second, done)
        if pending is not None:
            yield pending.result()


def beside(background, foreground):
    """``(foreground(), background())``; with more than one thread, ``background`` runs on a helper thread while
    ``foreground`` runs on the caller's. The two must share no buffers: each reads its own inputs and draws from
    its own generators, so the numbers are those of running one after the other."""
    if _THREADS[0] <= 1 or getattr(_IN_POOL, "on", False):
        return foreground(), background()
    with ThreadPoolExecutor(1, thread_name_prefix="audit-stats-beside") as helper:
        later = helper.submit(background)
        try:
            first = foreground()
        except BaseException:
            later.cancel()
            raise
        return first, later.result()
