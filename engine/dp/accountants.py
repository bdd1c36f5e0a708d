"""The accountants behind one interface, a registry as small as Opacus' (``opacus.accountants.registry``).

An accountant answers three questions about one tier's mechanism, the Poisson-subsampled Gaussian with rate q,
noise multiplier σ, T steps and a target δ, under add/remove adjacency (``engine.dp.accounting``'s docstring):

    epsilon(q, σ, T, δ)              ε spent (an upper bound: every accountant here reports its upper bound)
    noise_multiplier(ε, q, T, δ)     the smallest σ with epsilon(q, σ, T, δ) ≤ ε   (DP-SGD's plan)
    sample_rate(ε, σ, T, δ)          the largest q ≤ 1 with epsilon(q, σ, T, δ) ≤ ε   (a SAMPLE tier's rate)

``ACCOUNTANTS``:

* ``"rdp"`` — Opacus' RDP analysis over its default orders (``engine.dp.accounting``: what every plan and
  report of the lab has used so far). Sound, loose for composed subsampled Gaussians.
* ``"prv"`` — Opacus' ``PRVAccountant`` (Gopi et al. 2021, numerical composition of privacy random variables),
  its ε upper bound at ``eps_error`` 0.01.
* ``"pld"`` — Google's ``dp-accounting`` PLD accountant (privacy loss distributions, pessimistic
  discretisation at ``value_discretization_interval`` 1e-4), the reference for tight numbers.

The inverse searches are bisections on the accountant's own ε (monotone in σ and in q), ended on the safe
side: the σ returned always satisfies the target under that accountant, the rate likewise; ``rtol`` is how
far from tight they may stop. Results are cached: the planner asks for the same mechanism many times.
"""
from __future__ import annotations

import functools
import math
import warnings

from engine.dp import accounting

ACCOUNTANTS = ("rdp", "prv", "pld")
_RTOL = 1e-4  # the searches stop within this relative distance of tight
_PLD_DISCRETISATION = 1e-4
_PRV_EPS_ERROR = 0.01


class Accountant:
    """ε of one tier's subsampled Gaussian mechanism, and the two searches (see the module docstring)."""

    name = ""

    def epsilon(self, q: float, sigma: float, steps: int, delta: float) -> float:
        q, sigma, steps, delta = float(q), float(sigma), int(steps), float(delta)
        if not (0.0 <= q <= 1.0) or not (sigma >= 0.0) or steps < 0 or not (0.0 < delta < 1.0):
            raise ValueError(f"need 0 ≤ q ≤ 1, σ ≥ 0, T ≥ 0 and 0 < δ < 1; got q={q!r}, σ={sigma!r}, T={steps!r}, "
                             f"δ={delta!r}")
        if steps == 0 or q == 0.0:
            return 0.0
        if sigma == 0.0:
            return math.inf
        return _cached_epsilon(self.name, q, sigma, steps, delta)

    def _epsilon(self, q: float, sigma: float, steps: int, delta: float) -> float:
        raise NotImplementedError

    def noise_multiplier(self, epsilon: float, q: float, steps: int, delta: float, *, rtol: float = _RTOL) -> float:
        """The smallest σ (within ``rtol``) with ε(q, σ, T, δ) ≤ ``epsilon``; ValueError if none up to 1e4."""
        target = float(epsilon)
        hi = 1.0
        while self.epsilon(q, hi, steps, delta) > target:
            hi *= 2.0
            if hi > 1e4:
                raise ValueError(f"no noise multiplier up to 1e4 reaches ε = {target:g} under {self.name}")
        lo = hi / 2.0
        while self.epsilon(q, lo, steps, delta) <= target and lo > 1e-3:
            hi, lo = lo, lo / 2.0
        while hi - lo > rtol * hi:  # invariant: ε(hi) ≤ target < ε(lo)
            mid = 0.5 * (lo + hi)
            if self.epsilon(q, mid, steps, delta) <= target:
                hi = mid
            else:
                lo = mid
        return hi

    def sample_rate(self, epsilon: float, sigma: float, steps: int, delta: float, *, rtol: float = _RTOL) -> float:
        """The largest q ≤ 1 (within ``rtol``) with ε(q, σ, T, δ) ≤ ``epsilon``; 0.0 if even a vanishing rate
        exceeds it (the caller refuses such a tier)."""
        target = float(epsilon)
        if self.epsilon(1.0, sigma, steps, delta) <= target:
            return 1.0
        lo, hi = 0.0, 1.0  # invariant: ε(lo) ≤ target < ε(hi)
        while hi - lo > rtol * hi:
            mid = math.sqrt(lo * hi) if lo > 0 else hi / 16.0  # log steps down to the first feasible rate
            if self.epsilon(mid, sigma, steps, delta) <= target:
                lo = mid
            else:
                hi = mid
            if hi < 1e-12:
                return 0.0
        return lo


class RDP(Accountant):
    name = "rdp"

    def _epsilon(self, q, sigma, steps, delta):
        return accounting.epsilon(sample_rate=q, noise_multiplier=sigma, steps=steps, delta=delta)


class PRV(Accountant):
    name = "prv"

    def _epsilon(self, q, sigma, steps, delta):
        from opacus.accountants import PRVAccountant

        acc = PRVAccountant()
        acc.history = [(sigma, q, steps)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(acc.get_epsilon(delta, eps_error=_PRV_EPS_ERROR))  # Opacus returns the upper bound


class PLD(Accountant):
    name = "pld"

    def _epsilon(self, q, sigma, steps, delta):
        from dp_accounting import dp_event
        from dp_accounting.pld import pld_privacy_accountant

        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=_PLD_DISCRETISATION)
        acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
        return float(acc.get_epsilon(delta))  # pessimistic discretisation: an upper bound


_REGISTRY = {cls.name: cls() for cls in (RDP, PRV, PLD)}


def get_accountant(name: str) -> Accountant:
    """The accountant called ``name`` (one of :data:`ACCOUNTANTS`)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown accountant {name!r}; one of {', '.join(ACCOUNTANTS)}") from None


@functools.lru_cache(maxsize=65536)
def _cached_epsilon(name: str, q: float, sigma: float, steps: int, delta: float) -> float:
    return _REGISTRY[name]._epsilon(q, sigma, steps, delta)
