"""The fast path of :mod:`engine.dp.accounting`: Opacus' RDP formulas for the Poisson-subsampled Gaussian,
vectorized over many (q, σ) at once, and a vectorized monotone root finder. Used only to *search* for noise
multipliers and sampling rates; every ε that is reported, and every planned σ and q, is checked with Opacus' own
functions in :mod:`engine.dp.accounting`.

    rdp(q, σ)                      one-step RDP at Opacus' default orders, shape (K, n_orders)
    epsilon(q, σ, steps, δ)        ε per row, inflated by FAST_SAFETY so it is never below Opacus' value
    solve_increasing(G, x0, ...)   G(x) = 0 per row for an increasing G (bracketing + Illinois)

Integer orders are the binomial sum of Opacus' ``_compute_log_a_for_int_alpha`` with a log-sum-exp over a
(rates × orders × terms) array; fractional orders evaluate Opacus' series (``_compute_log_a_for_frac_alpha``) in
growing chunks of terms with the same stopping rule, falling back to Opacus for a pathological row.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np
from scipy import special

from engine.dp.opacus_rdp import DEFAULT_ALPHAS
from engine.dp.opacus_rdp import analysis as _opacus_rdp

__all__ = ["ALPHAS", "FAST_SAFETY", "rdp", "epsilon", "solve_increasing", "clear_caches"]

#: Opacus' default RDP orders, as an array.
ALPHAS = np.asarray(DEFAULT_ALPHAS, dtype=float)
_INT_MASK = np.array([float(a).is_integer() for a in DEFAULT_ALPHAS])
_INT_ORDERS = ALPHAS[_INT_MASK]
_FRAC_ORDERS = ALPHAS[~_INT_MASK]

#: relative inflation of the fast ε so that it never undercuts Opacus' ε.
FAST_SAFETY = 1e-9
# fractional-order series: chunked, up to this many terms before falling back to Opacus
_FRAC_MAX_TERMS = 1 << 15

# --------------------------------------------------------------------------------------
# Vectorized RDP (same formulas as Opacus, many rates / noise levels at once)
# --------------------------------------------------------------------------------------

_I_INT = np.arange(int(_INT_ORDERS.max()) + 1, dtype=float)  # 0..63


def _int_tables():
    a = _INT_ORDERS[:, None]
    i = _I_INT[None, :]
    valid = i <= a
    with np.errstate(divide="ignore", invalid="ignore"):
        lb = np.where(valid, np.log(special.binom(a, i)), -np.inf)
    return lb, np.where(valid, a - i, 0.0), (_I_INT * _I_INT - _I_INT)


_INT_LOGBINOM, _INT_AMI, _INT_I2I = _int_tables()


@functools.lru_cache(maxsize=64)
def _frac_binom_chunk(start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """log|binom(α, i)| and its sign for fractional orders, i in [start, stop)."""
    i = np.arange(start, stop, dtype=float)
    c = special.binom(_FRAC_ORDERS[:, None], i[None, :])
    with np.errstate(divide="ignore"):
        return np.log(np.abs(c)), np.sign(c)


def _log_a_int(q: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """log A_α for integer orders, shape (K, n_int) — Opacus' binomial sum, vectorized."""
    lq = np.log(q)[:, None, None]
    l1q = np.log1p(-q)[:, None, None]
    inv = (1.0 / (2.0 * sigma**2))[:, None, None]
    s = _INT_LOGBINOM[None] + _I_INT[None, None, :] * lq + _INT_AMI[None] * l1q + _INT_I2I[None, None, :] * inv
    return special.logsumexp(s, axis=-1)


def _log_a_frac(q: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """log A_α for fractional orders, shape (K, n_frac) — Opacus' series, vectorized.

    Terms are evaluated in chunks; a row stops at the first term whose two parts are
    both < -30 (that term included), exactly like Opacus' do-until loop.
    """
    K, m = len(q), len(_FRAC_ORDERS)
    out = np.full((K, m), np.nan)
    rq = np.repeat(np.arange(K), m)
    ra = np.tile(np.arange(m), K)
    alpha = _FRAC_ORDERS[ra]
    lq, l1q = np.log(q)[rq], np.log1p(-q)[rq]
    sig = sigma[rq]
    two_s2 = 2.0 * sig**2
    z0 = sig**2 * np.log(1.0 / q[rq] - 1.0) + 0.5
    sq2s = math.sqrt(2.0) * sig
    n = K * m
    M0 = np.full(n, -np.inf)
    S0 = np.zeros(n)
    M1 = np.full(n, -np.inf)
    S1 = np.zeros(n)
    active = np.ones(n, dtype=bool)
    start, chunk = 0, 32
    log_half = math.log(0.5) + math.log(2.0)  # log(0.5) + _log_erfc's log(2)
    while active.any() and start < _FRAC_MAX_TERMS:
        idx = np.nonzero(active)[0]
        lbin_t, sgn_t = _frac_binom_chunk(start, start + chunk)
        lbin, sgn = lbin_t[ra[idx]], sgn_t[ra[idx]]
        i = np.arange(start, start + chunk, dtype=float)[None, :]
        a = alpha[idx, None]
        j = a - i
        lqi, l1qi = lq[idx, None], l1q[idx, None]
        t2s = two_s2[idx, None]
        zz, ss = z0[idx, None], sq2s[idx, None]
        log_t0 = lbin + i * lqi + j * l1qi
        log_t1 = lbin + j * lqi + i * l1qi
        log_e0 = log_half + special.log_ndtr(-((i - zz) / ss) * 2**0.5)
        log_e1 = log_half + special.log_ndtr(-((zz - j) / ss) * 2**0.5)
        s0 = log_t0 + (i * i - i) / t2s + log_e0
        s1 = log_t1 + (j * j - j) / t2s + log_e1
        stop = np.maximum(s0, s1) < -30
        has = stop.any(axis=1)
        first = np.where(has, stop.argmax(axis=1), chunk - 1)
        keep = np.arange(chunk)[None, :] <= first[:, None]
        for M, S, s in ((M0, S0, s0), (M1, S1, s1)):
            s = np.where(keep, s, -np.inf)
            Mi = M[idx]
            newM = np.maximum(Mi, s.max(axis=1))
            safeM = np.where(np.isfinite(newM), newM, 0.0)
            with np.errstate(over="ignore", invalid="ignore"):
                old = np.where(np.isfinite(Mi), S[idx] * np.exp(np.where(np.isfinite(Mi), Mi, 0.0) - safeM), 0.0)
            S[idx] = old + (sgn * np.exp(s - safeM[:, None])).sum(axis=1)
            M[idx] = newM
        active[idx[has]] = False
        start += chunk
        chunk = min(chunk * 2, 4096)
    with np.errstate(divide="ignore", invalid="ignore"):
        la0 = M0 + np.log(S0)
        la1 = M1 + np.log(S1)
    res = np.logaddexp(la0, la1)
    bad = active | ~np.isfinite(res) | (S0 < 0) | (S1 < 0)
    if bad.any():  # pathological: let Opacus do it (it is the reference anyway)
        for r in np.nonzero(bad)[0]:
            res[r] = _opacus_rdp._compute_log_a(float(q[rq[r]]), float(sigma[rq[r]]), float(alpha[r]))
    out[:] = res.reshape(K, m)
    return out


def rdp(q, sigma) -> np.ndarray:
    """One-step RDP at Opacus' default orders, shape (K, n_orders); q, σ broadcast."""
    q, sigma = np.broadcast_arrays(np.atleast_1d(np.asarray(q, float)), np.atleast_1d(np.asarray(sigma, float)))
    q, sigma = q.ravel(), sigma.ravel()
    K = len(q)
    out = np.zeros((K, len(ALPHAS)))
    full = q >= 1.0
    part = (q > 0) & ~full
    if full.any():
        out[full] = ALPHAS[None, :] / (2.0 * sigma[full, None] ** 2)
    if part.any():
        qp, sp = q[part], sigma[part]
        r = np.empty((len(qp), len(ALPHAS)))
        r[:, _INT_MASK] = _log_a_int(qp, sp) / (_INT_ORDERS - 1.0)
        r[:, ~_INT_MASK] = _log_a_frac(qp, sp) / (_FRAC_ORDERS - 1.0)
        out[part] = r
    return out


def _epsilon_from_rdp(rdp: np.ndarray, delta: float) -> np.ndarray:
    """Opacus' get_privacy_spent formula, row-wise (no safety margin)."""
    a = ALPHAS[None, :]
    eps = rdp - (np.log(delta) + np.log(a)) / (a - 1) + np.log((a - 1) / a)
    allnan = np.isnan(eps).all(axis=1)
    eps = np.where(np.isnan(eps), np.inf, eps)
    e = eps.min(axis=1)
    e[allnan] = np.inf
    return e


def epsilon(q, sigma, steps: int, delta: float) -> np.ndarray:
    """Vectorized ε (never below Opacus' value: inflated by FAST_SAFETY)."""
    return _epsilon_from_rdp(rdp(q, sigma) * steps, delta) * (1.0 + FAST_SAFETY)


# --------------------------------------------------------------------------------------
# Monotone root finding (vectorized Illinois with bracketing)
# --------------------------------------------------------------------------------------


def solve_increasing(
    G: Callable[[np.ndarray, np.ndarray], np.ndarray],
    x0: np.ndarray,
    slope0: float,
    x_lo: float,
    x_hi: float,
    *,
    mode: str,
    tol: float,
    xtol: float = 1e-12,
    max_iter: int = 200,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Solve G(x) = 0 for each row, G increasing in x, x within [x_lo, x_hi].

    mode "le": return the largest evaluated x with G ≤ 0 once -tol ≤ G ≤ 0 (feasible side).
    mode "abs": return an x with |G| ≤ tol.
    Returns (x, g(x), status) with status 0 = ok, -1 = G > 0 even at x_lo,
    +1 = G ≤ 0 even at x_hi (x = x_hi is returned for "le").
    """
    x0 = np.clip(np.asarray(x0, float).copy(), x_lo, x_hi)
    K = len(x0)
    xl = np.full(K, np.nan)
    gl = np.full(K, np.nan)  # G ≤ 0 side
    xh = np.full(K, np.nan)
    gh = np.full(K, np.nan)  # G > 0 side
    xp = np.full(K, np.nan)
    gp = np.full(K, np.nan)  # previous point (for secant extrapolation)
    last_side = np.zeros(K, dtype=int)
    fl = np.ones(K)
    fh = np.ones(K)  # Illinois weights
    res_x = np.full(K, np.nan)
    res_g = np.full(K, np.nan)
    status = np.zeros(K, dtype=int)
    active = np.ones(K, dtype=bool)
    x = x0
    for _ in range(max_iter):
        idx = np.nonzero(active)[0]
        if len(idx) == 0:
            break
        xs = x[idx]
        g = np.asarray(G(xs, idx), float)
        for k, r in enumerate(idx):
            xr, gr = xs[k], g[k]
            if gr <= 0:
                if last_side[r] == -1:
                    fh[r] *= 0.5
                else:
                    fh[r] = 1.0
                fl[r] = 1.0
                xl[r], gl[r] = xr, gr
                last_side[r] = -1
            else:
                if last_side[r] == 1:
                    fl[r] *= 0.5
                else:
                    fl[r] = 1.0
                fh[r] = 1.0
                xh[r], gh[r] = xr, gr
                last_side[r] = 1
            done = False
            if mode == "le":
                if gr <= 0 and gr >= -tol:
                    done = True
            elif abs(gr) <= tol:
                done = True
            if not done and not np.isnan(xl[r]) and not np.isnan(xh[r]) and xh[r] - xl[r] <= xtol:
                done = True
                if mode == "abs" and abs(gh[r]) < abs(gl[r]):
                    xr, gr = xh[r], gh[r]
                else:
                    xr, gr = xl[r], gl[r]
            if done:
                if mode == "le" and gr > 0:
                    xr, gr = xl[r], gl[r]
                res_x[r], res_g[r] = xr, gr
                active[r] = False
                continue
            # next candidate
            if not np.isnan(xl[r]) and not np.isnan(xh[r]):
                a, b = xl[r], xh[r]
                ga, gb = gl[r] * fl[r], gh[r] * fh[r]
                w = b - a
                nx = a - ga * w / (gb - ga)
                nx = min(max(nx, a + 0.01 * w), b - 0.01 * w)
            else:
                if gr > 0 and xr <= x_lo:
                    status[r] = -1
                    res_x[r], res_g[r] = xr, gr
                    active[r] = False
                    continue
                if gr <= 0 and xr >= x_hi:
                    status[r] = 1
                    res_x[r], res_g[r] = xr, gr
                    active[r] = False
                    continue
                s = slope0
                if not np.isnan(xp[r]) and xp[r] != xr:
                    sec = (gr - gp[r]) / (xr - xp[r])
                    if sec > 0 and np.isfinite(sec):
                        s = sec
                step = -gr / s
                # overshoot a little so the next point brackets; grow steps geometrically
                step *= 1.3
                if not np.isnan(xp[r]):
                    prev = abs(xr - xp[r])
                    if abs(step) < prev and np.sign(step) == np.sign(xr - xp[r]):
                        step = np.sign(step) * max(abs(step), 2.0 * prev)
                if abs(step) < 1e-6:
                    step = np.sign(step) * 1e-6 if step != 0 else 1e-6
                nx = min(max(xr + step, x_lo), x_hi)
            xp[r], gp[r] = xr, gr
            x[r] = nx
    else:  # pragma: no cover - guarded by tolerances
        for r in np.nonzero(active)[0]:
            if np.isnan(xl[r]):
                status[r] = -1
                res_x[r], res_g[r] = xh[r], gh[r]
            else:
                res_x[r], res_g[r] = xl[r], gl[r]
    return res_x, res_g, status


def clear_caches() -> None:
    """Drop the memoized series coefficients (the benchmark's cold timings)."""
    _frac_binom_chunk.cache_clear()
