"""INO-SGD importance weights.

The batch is sorted by per-sample loss (ascending, ties by position). Each item's clipped
gradient is seen as ``C_i`` units of mass laid end to end on [0, Γ]; the item's weight is
the exact average, over its interval, of a batch-independent importance function

    BIF(x) = TIF(x / γ)  for x < γ,    1  for x ≥ γ,

with TIF non-decreasing and valued in [0, 1]. Because BIF is non-decreasing and does
not depend on the batch, adding a sample z shifts the later items to the right (their
weights can only grow) and the total change of the weighted clipped sum telescopes to
∫ BIF over an interval of length C_z, i.e. at most C_z: the sensitivity of plain DP-SGD.

Averages come from closed-form antiderivatives (no quadrature):
    F(x) = ∫_0^x BIF = γ·G(min(x/γ, 1)) + max(x − γ, 0),   G(v) = ∫_0^v TIF(u) du.
"""
from __future__ import annotations

import numpy as np
from scipy.special import betainc

from engine.config.algorithms import tif_knots_problem


class TIF:
    """A tail importance function on [0, 1]; subclasses give TIF(u) and G(v) = ∫_0^v TIF."""

    def __call__(self, u):
        raise NotImplementedError

    def integral(self, v):
        raise NotImplementedError

    @property
    def dropped_fraction(self) -> float:
        """Mass dropped per unit tail length: 1 − G(1) (γ·α/(α+β) for Beta, over γ)."""
        return float(1.0 - self.integral(np.array([1.0]))[0])


class BetaTIF(TIF):
    def __init__(self, alpha: float, beta: float):
        if not (alpha > 0 and beta > 0 and np.isfinite(alpha) and np.isfinite(beta)):
            raise ValueError(f"Beta TIF needs alpha > 0 and beta > 0, got alpha={alpha}, beta={beta}")
        self.alpha, self.beta = float(alpha), float(beta)

    def __call__(self, u):
        return betainc(self.alpha, self.beta, np.clip(u, 0.0, 1.0))

    def integral(self, v):
        v = np.clip(v, 0.0, 1.0)
        a, b = self.alpha, self.beta
        return v * betainc(a, b, v) - a / (a + b) * betainc(a + 1.0, b, v)


class LinearTIF(TIF):
    def __call__(self, u):
        return np.clip(u, 0.0, 1.0)

    def integral(self, v):
        v = np.clip(v, 0.0, 1.0)
        return 0.5 * v * v


class PowerTIF(TIF):
    def __init__(self, power: float):
        if not (power > 0 and np.isfinite(power)):
            raise ValueError(f"power TIF needs an exponent > 0, got {power}")
        self.power = float(power)

    def __call__(self, u):
        return np.clip(u, 0.0, 1.0) ** self.power

    def integral(self, v):
        v = np.clip(v, 0.0, 1.0)
        return v ** (self.power + 1.0) / (self.power + 1.0)


class StepTIF(TIF):
    def __init__(self, cut: float):
        if not (0.0 <= cut <= 1.0):
            raise ValueError(f"step TIF needs a cut in [0, 1], got {cut}")
        self.cut = float(cut)

    def __call__(self, u):
        return (np.asarray(u) >= self.cut).astype(float)

    def integral(self, v):
        v = np.clip(v, 0.0, 1.0)
        return np.maximum(v - self.cut, 0.0)


class PiecewiseLinearTIF(TIF):
    """A custom TIF given by knots (u, TIF(u)); linear in between, exact integrals.

    The knots must start at u = 0, end at u = 1, have increasing u, and values that are
    non-decreasing and inside [0, 1]: otherwise the sensitivity bound fails, so we refuse.
    """

    def __init__(self, knots):
        problem = tif_knots_problem(knots)  # the one rule, also what a config's validation checks
        if problem is not None:
            raise ValueError(problem)
        pts = np.asarray(knots, dtype=float)
        u, y = pts[:, 0], pts[:, 1]
        self.u, self.y = u, y
        # cumulative integral at each knot (trapezoids)
        self._cum = np.concatenate([[0.0], np.cumsum(np.diff(u) * (y[1:] + y[:-1]) / 2)])

    def __call__(self, u):
        return np.interp(np.clip(u, 0.0, 1.0), self.u, self.y)

    def integral(self, v):
        v = np.clip(np.asarray(v, dtype=float), 0.0, 1.0)
        k = np.clip(np.searchsorted(self.u, v, side="right") - 1, 0, len(self.u) - 2)
        u0, y0 = self.u[k], self.y[k]
        yv = np.interp(v, self.u, self.y)
        return self._cum[k] + (v - u0) * (y0 + yv) / 2


def make_tif(shape: str = "beta", *, alpha: float = 1.0, beta: float = 1.0, power: float = 2.0,
             cut: float = 0.5, knots=()) -> TIF:
    if shape == "beta":
        return BetaTIF(alpha, beta)
    if shape == "linear":
        return LinearTIF()
    if shape == "power":
        return PowerTIF(power)
    if shape == "step":
        return StepTIF(cut)
    if shape == "piecewise":
        return PiecewiseLinearTIF(knots)
    raise ValueError(f"unknown TIF shape {shape!r}; allowed: beta, linear, power, step, piecewise")


def bif_antiderivative(x, tif: TIF, tail_length):
    """F(x) = ∫_0^x BIF for absolute cumulative mass x ≥ 0; ``tail_length`` γ is a scalar or
    broadcasts against ``x`` (one γ per row: shape (M, 1)). γ ≤ 0 is the limit BIF ≡ 1."""
    x = np.asarray(x, dtype=float)
    g = np.broadcast_to(np.asarray(tail_length, dtype=float), x.shape) if np.ndim(tail_length) else \
        np.full(x.shape, float(tail_length))
    pos = g > 0
    safe = np.where(pos, g, 1.0)
    tail = safe * tif.integral(np.minimum(x / safe, 1.0)) + np.maximum(x - safe, 0.0)
    return np.where(pos, tail, x)


def bif(x, tif: TIF, tail_length: float) -> np.ndarray:
    """BIF(x) = TIF(x/γ) for x < γ, 1 for x ≥ γ (γ ≤ 0: BIF ≡ 1) — e.g. for plotting."""
    x = np.asarray(x, dtype=float)
    if tail_length <= 0:
        return np.ones_like(x)
    return np.where(x < tail_length, np.asarray(tif(np.clip(x / tail_length, 0.0, 1.0)), dtype=float), 1.0)


def ino_weights(losses, clip_norms, valid, tif: TIF, tail_length) -> np.ndarray:
    """INO-SGD weights ρ for M batches at once: ``(M, L)`` arrays in, ``(M, L)`` out, 0 where
    ``valid`` is False. The one definition of the weights (every other entry point wraps it).

    Per row: stable sort by loss (ties keep position, invalid entries last), clip masses laid end
    to end, ρ_i = exact average of BIF over item i's interval via the closed-form antiderivative.
    ``tail_length``: γ, one for all rows or one per row (shape (M,)).
    """
    losses = np.asarray(losses, dtype=float)
    valid = np.asarray(valid, dtype=bool)
    c = np.where(valid, np.asarray(clip_norms, dtype=float), 0.0)
    if losses.ndim != 2 or c.shape != losses.shape or valid.shape != losses.shape:
        raise ValueError("losses, clip_norms and valid must be (M, L) arrays of one shape")
    if np.any(c[valid] <= 0) or not np.all(np.isfinite(c)):
        raise ValueError("clip norms of valid entries must be finite and > 0")
    gamma = np.asarray(tail_length, dtype=float)
    if np.any(~np.isfinite(gamma)) or np.any(gamma < 0):
        raise ValueError(f"tail_length must be finite and >= 0, got {tail_length}")
    gamma = np.broadcast_to(gamma.reshape(-1, 1), (losses.shape[0], 1))
    order = np.argsort(np.where(valid, losses, np.inf), axis=1, kind="stable")
    c_sorted = np.take_along_axis(c, order, axis=1)
    ends = np.cumsum(c_sorted, axis=1)
    starts = ends - c_sorted
    with np.errstate(invalid="ignore", divide="ignore"):
        rho_sorted = (bif_antiderivative(ends, tif, gamma) - bif_antiderivative(starts, tif, gamma)) / c_sorted
    # clip guards float round-off (exact values lie in [0, 1]); invalid entries get exactly 0
    rho_sorted = np.where(np.take_along_axis(valid, order, axis=1), np.clip(rho_sorted, 0.0, 1.0), 0.0)
    rho = np.empty_like(rho_sorted)
    np.put_along_axis(rho, order, rho_sorted, axis=1)
    return rho


def weights_from_order(order, clip_norms, tif: TIF, tail_length: float) -> np.ndarray:
    """ρ in input order, for one batch laid out in ``order`` (lowest loss first)."""
    c = np.asarray(clip_norms, dtype=float).reshape(-1)
    rank = np.empty(len(c))
    rank[np.asarray(order, dtype=np.int64)] = np.arange(len(c))
    return ino_weights(rank[None, :], c[None, :], np.ones((1, len(c)), bool), tif, tail_length)[0]


def importance_weights(losses, clip_norms, *, tail_length: float, alpha: float = 1.0, beta: float = 1.0,
                       shape: str = "beta", power: float = 2.0, cut: float = 0.5, knots=()) -> np.ndarray:
    """INO-SGD weights ρ_i (input order) for a batch with per-sample losses and clip norms.

    >>> importance_weights([0.3, 2.0, 0.1, 1.5, 0.7], [1] * 5, tail_length=2, alpha=1, beta=1).tolist()
    [0.75, 1.0, 0.25, 1.0, 1.0]
    """
    losses = np.asarray(losses, dtype=float).reshape(1, -1)
    clip = np.broadcast_to(np.asarray(clip_norms, dtype=float), losses.shape[1:])[None, :]
    if np.any(clip <= 0) or not np.all(np.isfinite(clip)):
        raise ValueError("clip norms must be finite and > 0")
    if not np.isfinite(tail_length) or tail_length < 0:
        raise ValueError(f"tail_length must be finite and >= 0, got {tail_length}")
    tif = make_tif(shape, alpha=alpha, beta=beta, power=power, cut=cut, knots=knots)
    return ino_weights(losses, clip, np.ones(losses.shape, bool), tif, tail_length)[0]


def resolve_tail_length(algo, expected_clip_mass: float) -> float:
    """γ in absolute clip-mass units, fixed once before training (never per batch): the
    algorithm's absolute ``tail_length`` or ``tail_fraction`` × the expected batch clip mass."""
    if algo.tail_length is not None:
        return float(algo.tail_length)
    return float(algo.tail_fraction) * float(expected_clip_mass)


def expected_dropped_mass(tif: TIF, tail_length: float) -> float:
    """Clip mass dropped per full batch (Γ ≥ γ): γ·(1 − ∫TIF) — γ·α/(α+β) for Beta."""
    return tail_length * tif.dropped_fraction
