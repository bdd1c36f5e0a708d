"""ε lower bounds from ONE training run read through f-DP (Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential
Privacy in One Run", ICML 2025), pure numpy / scipy. Same canaries, same guesses, same counts as
:mod:`engine.audit.one_run.bound` (Steinke, Nasr & Jagielski 2023); only the analysis of the count differs.

    m canaries, each included in training independently with probability ½ (the only randomness the bound uses)
    guess "in" for the k₊ highest scores, "out" for the k₋ lowest: always exactly r = k₊ + k₋ guesses, v correct
    hypothesis H_f: training is f-DP with respect to every canary (both orders of a neighbouring pair), where
        f: α ↦ β is a trade-off function and g(y) = inf {α : 1 − f(α) ≥ y} the least false-positive rate at which
        a test reaches power y (for f_{ε,δ}: g(y) = max(0, (y − δ)e^{−ε}, 1 − δ − e^ε(1 − y)))
    for a level τ:                                   # "could P[≥ v correct] be τ?"
        ρ ← τ·v/m, η ← τ·(r − v)/m                   # a random canary is guessed right / wrong, with ≥ v right
        for i = v − 1, …, 0:
            η' ← max(η, g(ρ))                        # f-DP: a wrong mass below g(ρ) cannot carry a right mass ρ
            if η' = η: stop                          # nothing changes any more
            ρ ← ρ + i/(r − i)·(η' − η); η ← η'       # the least mass at exactly i right that pays for it
            if ρ + η > r/m: stop                     # already a contradiction
        rejected(τ) ⟺ ρ + η > r/m                    # a random canary is guessed with probability exactly r/m
    p-value(f) = inf {τ : rejected(τ)} ≥ P[≥ v correct] under H_f            (:func:`fdp_p_value`)
    ε̂ = sup {ε : rejected(β) for f = f_{ε,δ}} (the first crossing from ε = 0 up: :func:`epsilon_from_count_fdp`)

Why it is sound. Pick a canary U uniformly. Whether U is guessed, and whether at least i − 1 of the OTHER guesses are
right, is decided by the output and the other canaries' bits alone, so f-DP for U applies to that event. Averaging
over U and the other bits (f is convex: Jensen), with C the count of right guesses,
    R_i = E[C·1{C ≥ i}]/m ≤ 1 − f(H_{i−1}),   H_i = E[(r − C)·1{C ≥ i}]/m,   i = 1 … r,   and R_0 + H_0 = r/m.
The loop is the least R_0 + H_0 of any law of C with P[C ≥ v] ≥ τ that meets those constraints (all of the tail at
exactly v, then down the counts the least mass that pays for the right guesses above it); for f_{ε,δ} the
constraints are linear and tests/test_one_run_fdp.py checks the loop against the linear program's optimum. If even
that least value exceeds r/m, no f-DP mechanism gets ≥ v right with probability τ.

The subtle rules, where they happen:
- The hypothesis is the CLAIM's own curve f_{ε,δ}, the weakest f-DP statement (ε, δ)-DP makes, so ε̂ is a lower
  bound on the ε of ANY (ε, δ)-DP mechanism. ``jax_privacy.auditing``'s ``epsilon_one_run_fdp`` tests instead the
  Gaussian curve of the σ that is (ε, δ)-DP ("a Gaussian mechanism no leakier than ε"), a stronger hypothesis: on
  randomized response, which is ε-DP but not that Gaussian, its ε̂ lands above the true ε (a test shows it). The
  Gaussian family is here only as :func:`gdp_mu_from_count`, a lower bound on μ for a mechanism KNOWN to be μ-GDP.
- Monotone: g shrinks pointwise as ε grows, the constraint sets nest, and the loop is their exact optimum, so
  rejection at ε implies rejection at every smaller ε. The search still keeps, by bisection, an ε that IS rejected
  (never the far side of the crossing).
- One-sided: guessing "in" for high scores is fixed before any score is seen; a count at or below chance is no
  evidence. Nothing is flipped after looking at who was in. jax_privacy's ``epsilon_from_gdp`` took |μ̂| of
  μ̂ = Φ⁻¹(1 − FPR⁺) − Φ⁻¹(FNR⁺) ("the test holds in reverse") until its 2026 fix: upper confidence bounds FPR⁺, FNR⁺
  push every threshold of a null attack to FPR⁺ + FNR⁺ > 1, i.e. μ̂ < 0, and |·| made that evidence (a replica of
  the old rule on 5000 + 5000 pure-noise scores: forward μ̂ = −0.18, |μ̂| = 1.6, "ε̂" = 7.7 at δ = 1e-5).
- δ enters through the curve, not as Steinke's additive 2m·δ·α(v), which grows with m (0.2·α at m = 10 000,
  δ = 1e-5): at the lab's δ = 1e-5 the f-DP ε̂ is the larger one, more so as m grows (Gaussian mechanism at ε = 2,
  mean tier ε̂: 0.56 → 0.57 at m = 1000, 0.88 → 0.98 at m = 10 000), though pair by pair it can sit up to ~1e-3
  below at m = 1000, r = m/2; at δ = 0 it is slightly looser, Steinke's binomial tail being exact there.
- Floating point: the loop multiplies its increments by e^{−ε}·i/(r − i), > 1 above r/2, so an ABSOLUTE error in
  g(ρ) of 1e-16 at a tiny ρ grows like the signal. g is computed without cancelling (see TradeOff.eps_delta); the
  p-value and ε̂ keep the rejected end of their bisections (60-digit arithmetic, tried on random counts while
  building this, agrees with ε̂ to 1e-5).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import special as _special

from engine.audit.one_run.bound import (EPSILON_CAP, OneRunBound, best_over_grid, gaussian_mu, gaussian_scores,
                                        subsampled_scores)

MU_CAP = 40.0  # the search range of μ̂ (Φ(−μ/2) ≈ 1e-89 there: no count of guesses reaches beyond)
_EPS_TOL = 1e-6  # ε̂ and μ̂ to this absolute precision (the returned value is the rejected end of the bracket)


class TradeOff:
    """A trade-off function f: α ↦ β (convex, non-increasing, f(α) ≤ 1 − α) and its inverse power curve
    g(y) = inf {α : 1 − f(α) ≥ y}, which the bound needs. Closed forms for the (ε, δ) and Gaussian curves; any other
    f is inverted numerically (bisection on α, keeping the lower end: a g that is never too large)."""

    def __init__(self, f: Callable[[float], float], inverse_power: Callable[[float], float] | None = None,
                 name: str = "f"):
        self._f, self._g, self.name = f, inverse_power, name

    def __call__(self, alpha: float) -> float:
        return float(self._f(alpha))

    def inverse_power(self, y: float) -> float:
        """g(y): the least false-positive rate of a test with power y (∞ above power 1)."""
        if self._g is not None:
            return self._g(y)
        if y > 1.0:
            return math.inf
        if self._f(0.0) <= 1.0 - y:
            return 0.0
        lo, hi = 0.0, 1.0  # f(lo) > 1 − y ≥ f(hi) (f(1) = 0 for a trade-off function)
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if self._f(mid) <= 1.0 - y:
                hi = mid
            else:
                lo = mid
        return lo

    @classmethod
    def eps_delta(cls, epsilon: float, delta: float) -> "TradeOff":
        """f_{ε,δ}(α) = max(0, 1 − δ − e^ε α, e^{−ε}(1 − δ − α)): what (ε, δ)-DP says, and nothing more."""
        if epsilon < 0 or not 0 <= delta < 1:
            raise ValueError(f"need epsilon >= 0 and 0 <= delta < 1, got epsilon={epsilon}, delta={delta}")
        e, ie, em1 = math.exp(epsilon), math.exp(-epsilon), math.expm1(epsilon)

        def f(a):
            return max(0.0, 1.0 - delta - e * a, ie * (1.0 - delta - a))

        def g(y):
            # the steep piece 1 − δ − e^ε(1 − y) without cancelling 1 − (1 − y): below y = ½ as e^ε·y − (e^ε − 1) − δ
            # (1 − (1 − y) has an absolute error of 1e-16, which the loop amplifies when y is tiny: ε = 0, r = 500
            # put the p-value at half the exact binomial tail); above ½, 1 − y is exact
            steep = e * y - em1 - delta if y < 0.5 else 1.0 - delta - e * (1.0 - y)
            return max(0.0, (y - delta) * ie, steep)
        return cls(f, g, f"f_(eps={epsilon:g}, delta={delta:g})")

    @classmethod
    def gaussian(cls, mu: float) -> "TradeOff":
        """G_μ(α) = Φ(Φ⁻¹(1 − α) − μ): the Gaussian mechanism with sensitivity / σ = μ (μ-GDP)."""
        if mu < 0:
            raise ValueError(f"need mu >= 0, got {mu}")

        def f(a):
            return float(_special.ndtr(_special.ndtri(1.0 - a) - mu))

        def g(y):
            return math.inf if y > 1.0 else float(_special.ndtr(_special.ndtri(min(y, 1.0)) - mu))
        return cls(f, g, f"G_(mu={mu:g})")


def _check_counts(m: int, r: int, v: int) -> None:
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")


def _excess(m: int, r: int, v: int, g: Callable[[float], float], tau: float) -> float:
    """The loop of the module docstring at level τ: > 0 iff "P[≥ v of r guesses right] ≥ τ" contradicts H_f. Returns
    ρ + η − r/m (at the stop)."""
    lim = r / m
    rho, eta = tau * v / m, tau * (r - v) / m
    for i in range(v - 1, -1, -1):
        eta_new = g(rho)
        if eta_new <= eta:  # η' = η: ρ and η never move again
            break
        rho += i / (r - i) * (eta_new - eta)
        eta = eta_new
        if rho + eta > lim:  # ρ + η only grows down the loop
            break
    return rho + eta - lim


def _as_tradeoff(f) -> TradeOff:
    return f if isinstance(f, TradeOff) else TradeOff(f)


def fdp_p_value(m: int, r: int, v: int, f) -> float:
    """An upper bound on P[≥ v of r guesses right] about m canaries under "training is f-DP for each canary" (the
    recursion of the module docstring): the least τ at which it is a contradiction, to 1e-12 and rounded up.
    ``f``: a :class:`TradeOff` or any trade-off callable α ↦ β (inverted numerically: slower)."""
    _check_counts(m, r, v)
    if v == 0:
        return 1.0
    g = _as_tradeoff(f).inverse_power
    if _excess(m, r, v, g, 1.0) <= 0:
        return 1.0
    lo, hi = 0.0, 1.0  # not rejected at lo, rejected at hi: the p-value lies between; hi is the safe side
    while hi - lo > 1e-12 * max(hi, 1e-300) and hi > 1e-300:
        mid = 0.5 * (lo + hi)
        if _excess(m, r, v, g, mid) > 0:
            hi = mid
        else:
            lo = mid
    return hi


def _last_rejected(rejected: Callable[[float], bool], lo: float, hi: float) -> float:
    """The crossing of a monotone test (rejected at lo, not at hi), to ``_EPS_TOL``; returns the rejected end."""
    while hi - lo > _EPS_TOL:
        mid = 0.5 * (lo + hi)
        if rejected(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _search_epsilon(m: int, r: int, v: int, delta: float, beta: float, floor: float = 0.0) -> float:
    """sup {ε ≥ floor : f_{ε,δ} rejected at β}, or ``floor`` when even ε = floor is not rejected."""
    def rejected(eps):
        return _excess(m, r, v, TradeOff.eps_delta(eps, delta).inverse_power, beta) > 0
    if r == 0 or v == 0 or not rejected(floor):
        return floor
    if rejected(EPSILON_CAP):
        return EPSILON_CAP
    return _last_rejected(rejected, floor, EPSILON_CAP)


def _check_levels(delta: float, beta: float) -> None:
    if not 0 <= delta < 1 or not 0 < beta < 1:
        raise ValueError(f"need 0 <= delta < 1 and 0 < beta < 1, got delta={delta}, beta={beta}")


def epsilon_from_count_fdp(m: int, r: int, v: int, *, delta: float, beta: float) -> float:
    """ε̂ = sup {ε ≥ 0 : "(ε, δ)-DP", i.e. f_{ε,δ}-DP, is rejected at level β by v of r guesses right among m
    canaries} (0 when even ε = 0 is not rejected; capped at bound.EPSILON_CAP). Sound for ANY (ε, δ)-DP mechanism."""
    _check_counts(m, r, v)
    _check_levels(delta, beta)
    return _search_epsilon(m, r, v, delta, beta)


def gdp_mu_from_count(m: int, r: int, v: int, *, beta: float) -> float:
    """OPTIONAL, Gaussian mechanisms only: μ̂ = sup {μ ≥ 0 : "μ-GDP" rejected at level β}. A lower bound on μ for a
    mechanism KNOWN to be μ-GDP for some μ (a Gaussian mechanism and its compositions; subsampled DP-SGD is GDP only
    in a limit); for anything else μ̂, and
    ``gaussian_epsilon(μ̂, δ)`` from it (what jax_privacy reports as its f-DP ε), are no bound on the mechanism's
    ε: randomized response at ε = 2 drives it above 2. Never the default; :func:`epsilon_from_count_fdp` is."""
    _check_counts(m, r, v)
    _check_levels(0.0, beta)

    def rejected(mu):
        return _excess(m, r, v, TradeOff.gaussian(mu).inverse_power, beta) > 0
    if r == 0 or v == 0 or not rejected(0.0):
        return 0.0
    if rejected(MU_CAP):
        return MU_CAP
    return _last_rejected(rejected, 0.0, MU_CAP)


def fdp_epsilon_lower_bound(scores, included, *, delta: float, beta: float = 0.05, grid=None) -> OneRunBound:
    """The f-DP one-run ε lower bound of canaries with ``scores`` (higher: more likely in) and their true ``included``
    flags: the same fixed guess grid (default bound.guess_grid) and counts as bound.epsilon_lower_bound, each pair
    tested at β/|grid|, the largest ε̂ (the first pair reaching it)."""
    _check_levels(delta, beta)
    # a pair not rejected at the best ε so far cannot beat it (monotone): each search starts from there
    return best_over_grid(scores, included, delta=delta, beta=beta, grid=grid,
                          epsilon_of=lambda m, r, v, level, best: _search_epsilon(m, r, v, delta, level, best))


# --- ceilings: the mean ε̂ this estimator reaches on mechanisms whose ε is known --------------------------------

def expected_gaussian_bound_fdp(epsilon: float, delta: float, m: int, *, beta: float = 0.05, trials: int = 20,
                                seed: int = 0) -> float:
    """bound.expected_gaussian_bound for this estimator: the mean ε̂ with m canaries on the Gaussian mechanism that
    is exactly (ε, δ)-DP (same seed: the same scores as the Steinke ceiling, so the two compare pair by pair)."""
    mu = gaussian_mu(epsilon, delta)
    rng = np.random.default_rng(seed)
    return float(np.mean([fdp_epsilon_lower_bound(*gaussian_scores(mu, m, rng), delta=delta, beta=beta).epsilon_hat
                          for _ in range(trials)]))


def expected_subsampled_bound_fdp(rate: float, noise_multiplier: float, steps: int, m: int, *, delta: float,
                                  beta: float = 0.05, trials: int = 10, seed: int = 0) -> float:
    """bound.expected_subsampled_bound for this estimator: the mean ε̂ on the subsampled Gaussian mechanism a run
    composes (rate q, noise multiplier σ, T steps) with the most powerful per-step score (same scores per seed)."""
    rng = np.random.default_rng(seed)
    return float(np.mean([fdp_epsilon_lower_bound(*subsampled_scores(rate, noise_multiplier, steps, m, rng),
                                                  delta=delta, beta=beta).epsilon_hat for _ in range(trials)]))
