"""The accountants behind one interface, a registry as small as Opacus' (``opacus.accountants.registry``).

An accountant answers three questions about one tier's mechanism: T steps of the Poisson-subsampled Gaussian
with rate q and noise multiplier σ, composed with one-off Gaussian releases of sensitivity 1 and noise
multipliers ``releases`` (DP-SGD-S's noisy group sizes), at a target δ. Adjacency is add/remove one sample:
each sample enters a batch independently (Poisson) with its tier's rate, and the noisy sum of clipped
contributions is divided by a number fixed before training (the plan's expected batch,
``engine.dp.step.PoissonSampler``), so one sample moves what is released by at most its clip norm.

    epsilon(q, σ, T, δ, releases)              ε spent, an upper bound under every accountant here
    noise_multiplier(ε, q, T, δ, releases)     the smallest σ with epsilon(…) ≤ ε   (DP-SGD's and SCALE's plan)
    sample_rate(ε, σ, T, δ)                    the largest q ≤ 1 with epsilon(…) ≤ ε   (a SAMPLE tier's rate)

``ACCOUNTANTS``:

* ``"rdp"`` — Opacus' RDP analysis over its default orders (``compute_rdp`` + ``get_privacy_spent``): what every
  plan and report of the lab used before the choice existed, and what the papers' experiment scripts keep.
  Sound, loose for composed subsampled Gaussians.
* ``"prv"`` — Opacus' ``PRVAccountant`` (Gopi et al. 2021, numerical composition of privacy random variables),
  its ε upper bound at ``eps_error`` 0.01.
* ``"pld"`` — Google's ``dp-accounting`` PLD accountant (privacy loss distributions), the reference for tight
  numbers, with its pessimistic discretisation (every privacy loss rounded up to the grid, so the ε is an upper
  bound) on a grid of 1e-3: 0.04 s an ε at T = 3000 instead of 0.35 s at the library's default 1e-4, and
  within 0.6 % above that finer figure on the issue's settings (0.6397 against 0.6375 for the MNIST ε = 1 tier).

The searches are safeguarded regula falsi (Illinois) steps on log ε against log σ or log q, where the curve is
nearly straight: a handful of evaluations instead of a bisection's fifteen. They end on the safe side: what they
return meets the target under that accountant (an evaluated point, never an interpolated one). Every ε is
cached: the planner asks for the same mechanism many times.
"""
from __future__ import annotations

import functools
import math
import warnings

import numpy as np

from engine.config.run import ACCOUNTANTS
from engine.dp.opacus_rdp import DEFAULT_ALPHAS, ORDERS
from engine.dp.opacus_rdp import analysis as _opacus_rdp

_RTOL = 1e-4  # the searches stop within this relative distance of tight (in σ or q, or in ε)
_PLD_DISCRETISATION = 1e-3
_PRV_EPS_ERROR = 0.01
_SIGMA_MAX = 1e4
_Q_MIN = 1e-12

@functools.lru_cache(maxsize=4096)
def rdp_one_step(q: float, sigma: float) -> np.ndarray:
    """Per-order RDP of ONE step of the subsampled Gaussian, computed by Opacus itself (read-only array; q = 1:
    a one-off Gaussian release)."""
    r = np.asarray(_opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=DEFAULT_ALPHAS),
                   dtype=float)
    r.setflags(write=False)
    return r


def epsilon_from_rdp(rdp: np.ndarray, delta: float) -> float:
    """Opacus' conversion of per-order RDP to (ε, δ)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "optimal order is the largest alpha" etc.
        eps, _ = _opacus_rdp.get_privacy_spent(orders=DEFAULT_ALPHAS, rdp=rdp, delta=delta)
    return float(eps)


def releases_rdp(releases: tuple) -> np.ndarray | float:
    """Summed per-order RDP of one-off Gaussian releases (Opacus' formula at q = 1); 0.0 if there are none."""
    return sum((rdp_one_step(1.0, float(r)) for r in releases), 0.0)


def _check(q, sigma, steps, delta, releases) -> tuple:
    q, sigma, steps, delta = float(q), float(sigma), int(steps), float(delta)
    releases = tuple(float(r) for r in releases)
    if not (0.0 <= q <= 1.0) or not (sigma >= 0.0) or steps < 0 or not (0.0 < delta < 1.0):
        raise ValueError(f"need 0 ≤ q ≤ 1, σ ≥ 0, T ≥ 0 and 0 < δ < 1; got q={q!r}, σ={sigma!r}, T={steps!r}, "
                         f"δ={delta!r}")
    if not all(math.isfinite(r) and r > 0 for r in releases):
        raise ValueError(f"release noise multipliers must be finite and > 0, got {releases!r}")
    return q, sigma, steps, delta, releases


class Accountant:
    """ε of one tier's mechanism, and the two searches (see the module docstring)."""

    name = ""
    # the smallest noise multiplier a search tries: a target still met there is too loose to plan noise for (a
    # PLD of σ = 0.03 already takes 11 s, and the cost grows as 1/σ²: the floor keeps a huge ε from hanging)
    sigma_floor = 0.1

    def epsilon(self, q: float, sigma: float, steps: int, delta: float, releases: tuple = ()) -> float:
        """ε (an upper bound) of T steps at (q, σ) composed with ``releases``."""
        q, sigma, steps, delta, releases = _check(q, sigma, steps, delta, releases)
        if (steps == 0 or q == 0.0) and not releases:
            return 0.0
        if sigma == 0.0 and steps > 0 and q > 0.0:
            return math.inf
        return _cached_epsilon(self.name, q, sigma, steps, delta, releases)

    def _epsilon(self, q: float, sigma: float, steps: int, delta: float, releases: tuple) -> float:
        raise NotImplementedError

    def noise_multiplier(self, epsilon: float, q: float, steps: int, delta: float, releases: tuple = (), *,
                         rtol: float = _RTOL, guess: float | None = None) -> float:
        """The smallest σ (within ``rtol``) with ε ≤ ``epsilon``; ValueError if none up to 1e4 (the
        releases alone may spend it). ``guess``: where to start looking (another accountant's σ)."""
        target = float(epsilon)

        def g(x):  # increasing in x = −log σ
            return _log_ratio(self.epsilon(q, math.exp(-x), steps, delta, releases), target)

        if guess is None and self.name != "rdp":  # RDP's σ (cheap) is feasible here too, or close
            try:
                guess = _REGISTRY["rdp"].noise_multiplier(target, q, steps, delta, releases, rtol=1e-2)
            except ValueError:  # RDP cannot certify ε at all: look from σ = 1
                guess = None
        x = largest_feasible(g, -math.log(_SIGMA_MAX), 0.0, rtol, start=None if guess is None else -math.log(guess),
                             step=math.log(2.0) if guess is None else 0.05, hi_limit=-math.log(self.sigma_floor))
        if x is None:
            raise ValueError(f"no noise multiplier up to {_SIGMA_MAX:g} reaches ε = {target:g} under {self.name}; "
                             f"raise epsilon")
        if x == math.inf:
            raise ValueError(f"ε = {target:g} is met even with noise multiplier {self.sigma_floor:g} under {self.name}: "
                             f"the target is too loose to plan noise for")
        return math.exp(-x)

    def sample_rate(self, epsilon: float, sigma: float, steps: int, delta: float, *, rtol: float = _RTOL,
                    guess: float | None = None, step: float = 0.05) -> float:
        """The largest q ≤ 1 (within ``rtol``) with ε ≤ ``epsilon``; 0.0 if even q = 1e-12 exceeds it (the
        caller refuses such a tier). ``guess``: where to start looking (a neighbouring search's rate), and
        ``step``: how far from it the bracket is first looked for (log units)."""
        target = float(epsilon)

        def g(x):  # increasing in x = log q
            return _log_ratio(self.epsilon(math.exp(x), sigma, steps, delta), target)

        if guess is None and self.name != "rdp":  # RDP's rate (cheap) is feasible here too, or close
            guess = _REGISTRY["rdp"].sample_rate(target, sigma, steps, delta, rtol=1e-2) or None
        if guess is None and g(0.0) <= 0.0:
            return 1.0
        x = largest_feasible(g, math.log(_Q_MIN), 0.0, rtol, start=None if guess is None else math.log(min(guess, 1.0)),
                             upper_infeasible=True, step=math.log(2.0) if guess is None else step)
        return 0.0 if x is None else math.exp(x)


def _log_ratio(eps: float, target: float) -> float:
    if eps <= 0.0:
        return -math.inf
    return math.log(eps / target) if math.isfinite(eps) else math.inf


def largest_feasible(g, lo_limit: float, start_hi: float, rtol: float, *, start: float | None = None,
                     upper_infeasible: bool = False, step: float = math.log(2.0),
                     hi_limit: float | None = None) -> float | None:
    """The largest x (within ``rtol``) with g(x) ≤ 0 for an increasing g, searched in [lo_limit, ∞) (and ≤ 0 if
    ``upper_infeasible``).

    First a bracket g(lo) ≤ 0 < g(hi) from ``start`` (or ``start_hi``), grown by ``step`` and then by doubling
    steps; then Illinois steps, each kept strictly inside the bracket, until the bracket is narrower than ``rtol``
    or g(lo) is within ``rtol`` of 0. Returns lo, an x that was evaluated and found feasible (never an
    interpolated one); None if there is none down to ``lo_limit``; ``math.inf`` if x is still feasible at
    ``hi_limit`` (nothing beyond it is evaluated)."""
    x0 = start_hi if start is None else start
    if hi_limit is not None:
        x0 = min(x0, hi_limit)
    g0 = g(x0)
    if g0 <= 0.0:
        lo, glo = x0, g0
        if upper_infeasible and x0 == 0.0:
            return x0
        hi, ghi = x0 + step, None
        while True:
            if upper_infeasible and hi >= 0.0:
                hi = 0.0
            if hi_limit is not None and hi >= hi_limit:
                if lo >= hi_limit:
                    return math.inf
                hi = hi_limit
            ghi = g(hi)
            if ghi > 0.0:
                break
            if upper_infeasible and hi == 0.0:
                return 0.0
            if hi_limit is not None and hi >= hi_limit:
                return math.inf
            step *= 2.0
            lo, glo, hi = hi, ghi, hi + step
    else:
        hi, ghi = x0, g0
        lo = x0 - step
        while True:
            if lo <= lo_limit:
                lo = lo_limit
            glo = g(lo)
            if glo <= 0.0:
                break
            if lo == lo_limit:
                return None
            step *= 2.0
            hi, ghi, lo = lo, glo, lo - step
    side = 0
    while hi - lo > rtol and glo < -rtol:
        if math.isfinite(glo) and math.isfinite(ghi):
            x = (lo * ghi - hi * glo) / (ghi - glo)
        else:
            x = 0.5 * (lo + hi)
        width = hi - lo
        x = min(max(x, lo + 0.01 * width), hi - 0.01 * width)  # strictly inside: the bracket always shrinks
        gx = g(x)
        if gx <= 0.0:
            lo, glo = x, gx
            if side == -1:
                ghi *= 0.5  # Illinois: the end that stays twice in a row counts half
            side = -1
        else:
            hi, ghi = x, gx
            if side == 1:
                glo *= 0.5
            side = 1
    return lo


class RDP(Accountant):
    name = "rdp"
    sigma_floor = 1e-3  # the RDP planner's own (engine.dp.accounting); its ε costs the same at any σ

    def _epsilon(self, q, sigma, steps, delta, releases):
        rdp = (rdp_one_step(q, sigma) * steps if steps and q > 0 else 0.0) + releases_rdp(releases)
        return epsilon_from_rdp(np.asarray(rdp, dtype=float) + np.zeros(len(ORDERS)), delta)


class PRV(Accountant):
    name = "prv"

    def _epsilon(self, q, sigma, steps, delta, releases):
        from opacus.accountants import PRVAccountant

        acc = PRVAccountant()
        acc.history = ([(sigma, q, steps)] if steps and q > 0 else []) + [(r, 1.0, 1) for r in releases]
        if acc.history:  # Opacus' PRVAccountant.get_epsilon, its RDP half from the cached one-step RDP (below)
            acc._get_domain = functools.partial(_prv_domain, acc.history)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(acc.get_epsilon(delta, eps_error=_PRV_EPS_ERROR))  # Opacus returns the upper bound


def _prv_domain(history, *, prvs, num_self_compositions, eps_error, delta_error):
    """Opacus' ``PRVAccountant._get_domain`` to the bit, for ``history`` [(σ, q, steps)]: its safe domain size
    (``compute_safe_domain_size``: the RDP ε of the whole history at δ_err / 4 and of one step of each entry at
    δ_err / (8 · steps)) from :func:`rdp_one_step` × steps, which is Opacus' ``compute_rdp`` (one step, times the
    steps) cached per (q, σ), instead of two fresh evaluations of the fractional orders' series per ε; a PRV plan
    asks for dozens of ε, and the series was ~90 % of each (14 s of a 3-tier SAMPLE plan at T = 11)."""
    from opacus.accountants.analysis.prv import Domain

    total = sum(num_self_compositions)
    whole = sum([rdp_one_step(q, sigma) * n for sigma, q, n in history])  # (Opacus' sum over its history)
    L = epsilon_from_rdp(whole, delta_error / 4)
    for sigma, q, _ in history:
        L = max(L, epsilon_from_rdp(rdp_one_step(q, sigma) * 1, delta_error / (8 * total)))
    L = max(L, eps_error) + 3
    mesh_size = eps_error / np.sqrt(total * np.log(12 / delta_error) / 2)
    return Domain.create_aligned(-L, L, mesh_size)


class PLD(Accountant):
    name = "pld"

    def _epsilon(self, q, sigma, steps, delta, releases):
        from dp_accounting import dp_event
        from dp_accounting.pld import pld_privacy_accountant

        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=_PLD_DISCRETISATION)
        if steps and q > 0:
            acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
        for r in releases:
            acc.compose(dp_event.GaussianDpEvent(r))
        return float(acc.get_epsilon(delta))  # pessimistic discretisation: an upper bound


_REGISTRY = {cls.name: cls() for cls in (RDP, PRV, PLD)}
#: what each accountant is, in the lab's words (the forms' help, the CLI's and the plan preview's labels)
DESCRIPTIONS = {"rdp": "RDP (Opacus; the papers' accountant, loose for long compositions)",
                "prv": "PRV (Opacus' PRVAccountant, its upper bound)",
                "pld": "PLD (Google dp-accounting, pessimistic; the tightest)"}
if tuple(_REGISTRY) != ACCOUNTANTS:  # the config's names, one implementation each
    raise ImportError(f"engine.config.run.ACCOUNTANTS {ACCOUNTANTS} and the implemented {tuple(_REGISTRY)} differ")


def get_accountant(name: str) -> Accountant:
    """The accountant called ``name`` (one of :data:`ACCOUNTANTS`)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown accountant {name!r}; one of {', '.join(ACCOUNTANTS)}") from None


@functools.lru_cache(maxsize=65536)
def _cached_epsilon(name: str, q: float, sigma: float, steps: int, delta: float, releases: tuple) -> float:
    return _REGISTRY[name]._epsilon(q, sigma, steps, delta, releases)


def clear_caches() -> None:
    """Drop every cached ε (the planner bench's cold timings)."""
    _cached_epsilon.cache_clear()
    rdp_one_step.cache_clear()
