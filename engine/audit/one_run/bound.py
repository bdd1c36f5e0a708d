"""ε lower bounds from ONE training run (Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training
Run", NeurIPS 2023), pure numpy / scipy.

    m canaries, each included in training independently with probability ½ (the only randomness the bound uses)
    scores s_1..s_m ← the auditor's attack on the trained model (white-box: on the noisy updates)
    guess "in" for the k₊ highest scores, "out" for the k₋ lowest, abstain on the rest: r = k₊ + k₋ guesses
    v ← the number of correct guesses
    if training is (ε, δ)-DP with respect to every canary, then for every v₀ (their Theorem 3.1 with δ, §5.2):
        P[v ≥ v₀] ≤ P[Bin(r, p_ε) ≥ v₀] + 2m·δ·α(v₀),      p_ε = e^ε / (1 + e^ε)
        α(v₀) = max_{1 ≤ i ≤ v₀} P[v₀ − i ≤ Bin(r, p_ε) < v₀] / i
    ε̂ = sup {ε : p-value(ε) < β}: every ε below ε̂ is rejected at confidence 1 − β, so "training is at least
        ε̂-leaky" holds with probability ≥ 1 − β — a LOWER bound, whatever the scores are.

k₊ and k₋ are never chosen by looking at which canaries were in: :func:`epsilon_lower_bound` takes the best of a
FIXED grid of (k₊, k₋) pairs (:func:`guess_grid`), each tested at β / |grid| (Bonferroni), as
``jax_privacy.auditing``'s Bonferroni strategy does. The Gaussian mechanism's exact (ε, δ) curve
(:func:`gaussian_epsilon`) is the truth the estimator is tested against (tests/test_one_run_bound.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize as _opt
from scipy import special as _special
from scipy.special import _ufuncs as _boost  # scipy.stats.binom's own kernels (Boost), called without its
# per-call argument handling (half of a p-value's time) and without importing scipy.stats (~0.5 s a process): the
# same numbers, tests/test_one_run_bound.py checks

EPSILON_CAP = 50.0  # the search range of ε̂ (p_ε is 1 − 2e-22 there: no count of guesses reaches beyond)
GRID_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)  # k / m of the guess grid


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[≥ v of r guesses correct] under the hypothesis "training is (ε, δ)-DP for each of the m canaries"."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if v == 0:
        return 1.0
    p = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(_boost._binom_sf(v - 1, r, p))  # P[Bin ≥ v] (scipy.stats.binom.sf)
    if delta <= 0:
        return min(tail, 1.0)
    below = _boost._binom_pmf(np.arange(v - 1, -1, -1, dtype=np.float64), r, p)  # P[Bin = v − i], i = 1..v
    alpha = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def epsilon_from_count(m: int, r: int, v: int, *, delta: float, beta: float, above: float = 0.0) -> float:
    """ε̂ = sup {ε ≥ 0 : p_value(m, r, v, ε, δ) < β} (0 when even ε = 0 is not rejected); p_value grows with ε.
    ``above``: only an ε̂ above it is wanted (the best of a grid so far); when ε = ``above`` is not rejected, ε̂ is at
    most ``above`` and 0 is returned without the search (the search, when it runs, is the same from 0)."""
    if r == 0 or p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    if above > 0.0 and p_value(m, r, v, min(above, EPSILON_CAP), delta) >= beta:
        return 0.0
    if p_value(m, r, v, EPSILON_CAP, delta) < beta:
        return EPSILON_CAP
    return float(_opt.brentq(lambda e: p_value(m, r, v, e, delta) - beta, 0.0, EPSILON_CAP, xtol=1e-6))


def guess_grid(m: int, fractions=GRID_FRACTIONS) -> list[tuple[int, int]]:
    """The fixed (k₊, k₋) pairs tried for m canaries: for each k = max(1, round(f·m/2)), one-sided (k, 0) and
    two-sided (k, k) guesses; fixed before any score is seen."""
    ks = sorted({max(1, int(round(f * m / 2))) for f in fractions if f * m / 2 <= m / 2})
    pairs = [(k, 0) for k in ks] + [(k, k) for k in ks if 2 * k <= m]
    return [p for p in dict.fromkeys(pairs) if sum(p) <= m]


@dataclass(frozen=True)
class OneRunBound:
    """One tier's (or one set of canaries') bound: ε̂ at confidence 1 − β and the guesses behind it."""

    epsilon_hat: float
    m: int  # canaries
    guesses: int  # r = k₊ + k₋ of the best pair
    correct: int  # v
    k_plus: int
    k_minus: int
    beta: float
    delta: float
    grid_size: int  # Bonferroni: each pair tested at β / grid_size

    @property
    def confidence(self) -> float:
        return 1.0 - self.beta

    def to_dict(self) -> dict:
        return {"epsilon_hat": self.epsilon_hat, "m": self.m, "guesses": self.guesses, "correct": self.correct,
                "k_plus": self.k_plus, "k_minus": self.k_minus, "beta": self.beta, "delta": self.delta,
                "grid_size": self.grid_size}

    @classmethod
    def from_dict(cls, d: dict) -> "OneRunBound":
        return cls(epsilon_hat=float(d["epsilon_hat"]), m=int(d["m"]), guesses=int(d["guesses"]),
                   correct=int(d["correct"]), k_plus=int(d["k_plus"]), k_minus=int(d["k_minus"]),
                   beta=float(d["beta"]), delta=float(d["delta"]), grid_size=int(d["grid_size"]))


def count_correct(scores, included, k_plus: int, k_minus: int) -> int:
    """Correct guesses of "in" for the k₊ highest and "out" for the k₋ lowest scores. Ties are broken by the
    canary's position (a stable sort), which does not depend on who is in."""
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    order = np.argsort(-scores, kind="stable")  # highest first
    top = order[:k_plus]
    bottom = order[len(order) - k_minus:] if k_minus else order[:0]
    return int(included[top].sum() + (~included[bottom]).sum())


def best_over_grid(scores, included, *, delta: float, beta: float, grid, epsilon_of) -> OneRunBound:
    """The largest ε̂ over the fixed guess grid (default :func:`guess_grid`), each pair tested at β/|grid|:
    ``epsilon_of(m, r, v, level, best)`` is one analysis's ε̂ of v correct of r guesses at ``level`` (``best``: the
    largest ε̂ so far, which an analysis may start its search from). The one owner of the inputs' checks, the grid,
    the counts and the Bonferroni split, for Steinke et al.'s bound and the f-DP one
    (:func:`engine.audit.one_run.fdp.fdp_epsilon_lower_bound`)."""
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    m = len(scores)
    if m == 0 or len(included) != m:
        raise ValueError(f"need one inclusion flag per score, got {len(included)} for {m}")
    if not np.all(np.isfinite(scores)):
        raise ValueError("canary scores must be finite")
    pairs = guess_grid(m) if grid is None else [tuple(p) for p in grid]
    level = beta / len(pairs)
    best = None
    for kp, km in pairs:
        if kp < 0 or km < 0:
            raise ValueError(f"need k_plus, k_minus >= 0, got ({kp}, {km})")
        if kp + km > m:
            raise ValueError(f"need 0 <= v <= r <= m, got r={kp + km} guesses of m={m} canaries")
        v = count_correct(scores, included, kp, km)
        eps = epsilon_of(m, kp + km, v, level, 0.0 if best is None else best.epsilon_hat)
        if best is None or eps > best.epsilon_hat:
            best = OneRunBound(epsilon_hat=eps, m=m, guesses=kp + km, correct=v, k_plus=kp, k_minus=km,
                               beta=beta, delta=delta, grid_size=len(pairs))
    return best


def epsilon_lower_bound(scores, included, *, delta: float, beta: float = 0.05, grid=None) -> OneRunBound:
    """The one-run ε lower bound of canaries with ``scores`` (higher: more likely in) and their true
    ``included`` flags: the largest ε̂ over the fixed guess grid (default :func:`guess_grid`), each pair at β/|grid|."""
    return best_over_grid(scores, included, delta=delta, beta=beta, grid=grid,
                          epsilon_of=lambda m, r, v, level, best: epsilon_from_count(m, r, v, delta=delta, beta=level,
                                                                                     above=best))


# --- the Gaussian mechanism's truth ---------------------------------------------------------------

def gaussian_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP (the Gaussian mechanism with sensitivity / σ = μ): Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
    if mu <= 0:
        return 0.0
    return float(_special.ndtr(-epsilon / mu + mu / 2) - math.exp(epsilon) * _special.ndtr(-epsilon / mu - mu / 2))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ε of μ-GDP at δ (0 when δ(0) ≤ δ)."""
    if mu <= 0 or gaussian_delta(mu, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while gaussian_delta(mu, hi) > delta:
        hi *= 2.0
    return float(_opt.brentq(lambda e: gaussian_delta(mu, e) - delta, 0.0, hi, xtol=1e-10))


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The μ of the Gaussian mechanism that is exactly (ε, δ)-DP (the inverse of :func:`gaussian_epsilon`)."""
    hi = 1.0
    while gaussian_epsilon(hi, delta) < epsilon:
        hi *= 2.0
    return float(_opt.brentq(lambda u: gaussian_epsilon(u, delta) - epsilon, 1e-9, hi, xtol=1e-10))


def gaussian_scores(mu: float, m: int, rng: np.random.Generator):
    """What an optimal attack sees on the Gaussian mechanism: canary i is in with probability ½ and its score is
    N(μ·1[in], 1). Returns (scores, included)."""
    included = rng.random(m) < 0.5
    return rng.standard_normal(m) + mu * included, included


def expected_gaussian_bound(epsilon: float, delta: float, m: int, *, beta: float = 0.05, trials: int = 20,
                            seed: int = 0) -> float:
    """The mean ε̂ this estimator reaches with m canaries on the Gaussian mechanism that is exactly (ε, δ)-DP:
    what the tightest white-box attack could show at this m (the ceiling the lab's ε̂/ε is read against)."""
    mu = gaussian_mu(epsilon, delta)
    rng = np.random.default_rng(seed)
    return float(np.mean([epsilon_lower_bound(*gaussian_scores(mu, m, rng), delta=delta, beta=beta).epsilon_hat
                          for _ in range(trials)]))


def subsampled_scores(rate: float, noise_multiplier: float, steps: int, m: int, rng: np.random.Generator):
    """m canaries through the mechanism DP-SGD runs, with nothing else at their coordinates: each in with
    probability ½; per step an in canary is sampled with probability ``rate`` and adds 1 (its clip), then
    N(0, σ²) noise is added (σ = ``noise_multiplier``, in clips). Scores are the per-step likelihood ratio
    Σ_t log(1 − q + q·exp((x_t − ½)/σ²)) — the white-box score of engine.dp.canaries."""
    included = rng.random(m) < 0.5
    s2 = noise_multiplier ** 2
    scores = np.zeros(m)
    for _ in range(int(steps)):
        x = (included & (rng.random(m) < rate)) + noise_multiplier * rng.standard_normal(m)
        scores += np.logaddexp(np.log1p(-rate), np.log(rate) + (x - 0.5) / s2)
    return scores, included


def expected_subsampled_bound(rate: float, noise_multiplier: float, steps: int, m: int, *, delta: float,
                              beta: float = 0.05, trials: int = 10, seed: int = 0) -> float:
    """The mean ε̂ this estimator reaches on the subsampled Gaussian mechanism a run actually composes (rate q,
    noise multiplier σ, T steps), with the most powerful per-step score and no other gradient in the way: the
    ceiling for a white-box attack on *this* run. It sits below :func:`expected_gaussian_bound` at the run's
    ε: the accountant's ε is an upper bound for the composition, and a one-run guess about a canary sampled in
    few of the T steps sees less than the worst case the ε describes."""
    rng = np.random.default_rng(seed)
    return float(np.mean([epsilon_lower_bound(*subsampled_scores(rate, noise_multiplier, steps, m, rng),
                                              delta=delta, beta=beta).epsilon_hat for _ in range(trials)]))
