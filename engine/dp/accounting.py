"""Privacy accounting and the individualized-DP planner.

Each plan is made under one accountant (``Plan.accountant``, one of ``engine.dp.accountants.ACCOUNTANTS``).
The default, ``"rdp"``, is Opacus' RDP analysis of the Poisson-subsampled Gaussian mechanism
(``opacus.accountants.analysis.rdp.compute_rdp`` + ``get_privacy_spent``) over Opacus' default RDP orders
(``RDPAccountant.DEFAULT_ALPHAS``), with the fast searches below; ``"prv"`` and ``"pld"`` plan the same three
modes (:func:`_plan_with`) along RDP's shape: RDP's fast searches at per-tier RDP targets moved until the tight
accountant's own ε of each tier is within 1e-4 below its target (:func:`_follow_rdp`: a few of its ε, one per tier a
round), else through the accountants' own searches, started from the RDP plan. Plans are cached across processes
(:mod:`engine.dp.plan_cache`, keyed by every input and the accounting code's fingerprint).

Adjacency: add/remove one sample, each sample drawn into a batch independently (Poisson) with its tier's
rate, the noisy sum of clipped contributions divided by a number fixed before training (the plan's expected
batch, ``engine.dp.step.PoissonSampler``): one sample moves the released sum by at most its clip norm.

Under RDP, speed comes from :mod:`engine.dp.fast_rdp`, a vectorized re-implementation of the very same
formulas with a safety-inflated ε that is never below Opacus' value; it is used only to
*search* for noise multipliers and sampling rates.  Every RDP ε that is reported (``epsilon()``,
``Plan.epsilons``, ``TierAccountant.epsilons()``) is computed with Opacus' own functions, and
each plan is re-verified against its targets with them. Under PRV and PLD every reported ε is the accountant's
own (``engine.dp.accountants``), and each tier is checked against its target with it.

Modes of :func:`plan` (tiers are given and returned in the caller's order):

* ``"dpsgd"``  — everybody gets q = B/N and clip C; σ is the smallest noise
  multiplier meeting the strictest ε.  Looser tiers are over-protected.
* ``"scale"``  — IDP-SGD SCALE (Boenisch et al. 2023): q = B/N for all,
  σ* = σ(ε_min, q, T), per-tier clip C_n = C·σ*/σ(ε_n, q, T) (≥ C); noise std
  σ*·C, i.e. tier n sees the effective multiplier σ*·C/C_n = σ(ε_n, q, T).
* ``"sample"`` — IDP-SGD SAMPLE: shared clip C and σ*; per-tier rates q_n, the
  largest with ε(q_n, σ*, T) ≤ ε_n, with q_min chosen so Σ q_n N_n = B.
  If some q_n would exceed 1 it is capped at 1; that tier is then *not* tight
  (ε < target) and the fact is reported in ``Plan.notes``.

A plan with a single tier, or with all targets equal, is the dpsgd plan in every mode.
"""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from dataclasses import replace as dataclasses_replace

import numpy as np
from engine.config.schema import ConfigError
from engine.dp import accountants, fast_rdp, plan_cache

__all__ = [
    "Plan",
    "PlanError",
    "plan_errors",
    "MODES",
    "ORDERS",
    "plan",
    "epsilon",
    "noise_multiplier_for",
    "TierAccountant",
    "adaptive_clipping_noise_multiplier",
    "plan_with_release",
    "plan_at_noise",
    "release_noise_multiplier_default",
    "epsilon_floor",
    "clear_caches",
]

MODES = ("dpsgd", "scale", "sample")

#: Opacus' default RDP orders; all accounting here uses exactly these.
ORDERS = accountants.ORDERS

#: searches stop once ε is within this relative distance below the target.
_TIGHT_RTOL = 1e-6
#: SAMPLE: expected batch matched to this relative tolerance (spec: 0.1%).
_BATCH_RTOL = 1e-5
_SIGMA_MIN, _SIGMA_MAX = 1e-3, 1e6
_Q_MIN = 1e-12


class PlanError(ValueError):
    """Infeasible or invalid planning/accounting arguments."""


@contextmanager
def plan_errors(field: str, prefix: str = ""):
    """Inside the block, ``PlanError`` becomes ``ConfigError(field, prefix + message)``: the one place planning
    failures become configuration errors."""
    try:
        yield
    except PlanError as e:
        raise ConfigError(field, f"{prefix}{e}") from None


# --------------------------------------------------------------------------------------
# Plan
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    mode: str
    noise_multiplier: float  # σ* (noise std / base clip norm)
    sample_rates: tuple[float, ...]  # per tier
    clip_norms: tuple[float, ...]  # per tier
    noise_std: float  # absolute std of the Gaussian noise added to the weighted clipped gradient SUM
    epsilons: tuple[float, ...]  # achieved ε per tier after `steps` (under `accountant`)
    target_epsilons: tuple[float, ...]
    delta: float
    steps: int
    tier_sizes: tuple[int, ...]
    expected_batch_size: float  # Σ q_n N_n
    notes: tuple[str, ...] = field(default=())  # e.g. sample rates capped at 1
    # one-off (not subsampled) Gaussian releases of L2 sensitivity 1 composed with the T steps, as noise
    # multipliers (DP-SGD-S's noisy group sizes); ``epsilons`` include them
    release_noise_multipliers: tuple[float, ...] = field(default=())
    accountant: str = "rdp"  # the accountant the plan was searched and its ε computed with (accountants.ACCOUNTANTS)

    @property
    def noise_multipliers(self) -> tuple[float, ...]:
        """Effective per-tier noise multiplier σ*·C/C_n (σ* unless SCALE); feed to TierAccountant."""
        return _effective_multipliers(self.noise_multiplier, self.noise_std, self.clip_norms)

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d


def _effective_multipliers(sigma: float, noise_std: float, clips) -> tuple[float, ...]:
    base = min(clips)  # the strictest tier keeps the base clip C, so σ*·C/C = σ* exactly
    return tuple(float(sigma) if c == base else float(noise_std / c) for c in clips)


# --------------------------------------------------------------------------------------
# Exact (Opacus) accounting
# --------------------------------------------------------------------------------------


_opacus_rdp_one_step = accountants.rdp_one_step
_opacus_eps_from_rdp = accountants.epsilon_from_rdp


def _opacus_eps(q: float, sigma: float, steps: int, delta: float) -> float:
    # Opacus' compute_rdp(steps=T) is `rdp_one_step * T`; identical floating point.
    return _opacus_eps_from_rdp(_opacus_rdp_one_step(float(q), float(sigma)) * steps, delta)


def epsilon(*, sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    """ε after `steps` steps of the subsampled Gaussian mechanism (Opacus RDP, default orders)."""
    _check_rate(sample_rate, "sample_rate")
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise PlanError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier!r}")
    _check_steps(steps, allow_zero=True)
    _check_delta(delta)
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    return _opacus_eps(float(sample_rate), float(noise_multiplier), int(steps), float(delta))


def epsilon_floor(delta: float) -> float:
    """Smallest ε the RDP→(ε,δ) conversion over Opacus' orders can certify (σ → ∞)."""
    _check_delta(delta)
    return _opacus_eps_from_rdp(np.zeros(len(fast_rdp.ALPHAS)), float(delta))


# --------------------------------------------------------------------------------------
# σ(ε, q, T, δ) and q(ε, σ, T, δ) searches
# --------------------------------------------------------------------------------------


def _sigma_guess(eps: float, q: float, steps: int, delta: float) -> float:
    # Gaussian approximation of the subsampled mechanism: ε ≈ q·sqrt(2 T log(1/δ)) / σ
    g = q * math.sqrt(2.0 * steps * math.log(1.0 / delta)) / eps
    return min(max(g, 0.3), 1e4)


def _log_epsilon(eps: np.ndarray) -> np.ndarray:
    """log ε for the searches. At a large δ RDP's conversion can give ε ≤ 0 (the bound is met by any target): its
    log is taken at the smallest positive float, the feasible side, not NaN — a NaN left the searches bracketing
    nothing, down to σ where Opacus' fractional-order series takes seconds an evaluation: plans at δ ≈ 0.05–0.5
    never ended (issue 58). Every planned ε is still recomputed by Opacus before it is reported."""
    return np.log(np.maximum(np.asarray(eps, float), np.finfo(float).tiny))


def _sigmas_fast(eps: np.ndarray, q: np.ndarray, steps: int, delta: float) -> np.ndarray:
    """Smallest σ (per row) with fast ε(q, σ) ≤ eps, tight to _TIGHT_RTOL."""
    eps = np.asarray(eps, float)
    q = np.asarray(q, float)
    x0 = np.array([-math.log(_sigma_guess(e, qq, steps, delta)) for e, qq in zip(eps, q)])
    log_t = np.log(eps)

    def G(x, idx):
        return _log_epsilon(fast_rdp.epsilon(q[idx], np.exp(-x), steps, delta)) - log_t[idx]

    x, _, st = fast_rdp.solve_increasing(
        G, x0, 1.0, -math.log(_SIGMA_MAX), -math.log(_SIGMA_MIN), mode="le", tol=_TIGHT_RTOL
    )
    if (st == -1).any():
        r = int(np.nonzero(st == -1)[0][0])
        raise PlanError(
            f"epsilon={eps[r]:g} is not reachable with sample_rate={q[r]:g}, steps={steps}, "
            f"delta={delta:g} even with noise_multiplier={_SIGMA_MAX:g}; "
            f"raise epsilon (the RDP bound cannot go below {epsilon_floor(delta):.4g} at this delta)"
        )
    if (st == 1).any():
        r = int(np.nonzero(st == 1)[0][0])
        raise PlanError(
            f"epsilon={eps[r]:g} is met even with noise_multiplier={_SIGMA_MIN:g} "
            f"(sample_rate={q[r]:g}, steps={steps}); the target is too loose to plan noise for"
        )
    return np.exp(-x)


@functools.lru_cache(maxsize=8192)
def _sigma_cached(eps: float, q: float, steps: int, delta: float) -> float:
    return float(_sigmas_fast(np.array([eps]), np.array([q]), steps, delta)[0])


def _rates_fast(eps: np.ndarray, sigma: float, steps: int, delta: float, q0=None):
    """Largest q (per row) with fast ε(q, σ) ≤ eps, capped at 1. Returns (q, capped)."""
    eps = np.asarray(eps, float)
    if q0 is None:
        q0 = np.array([min(e * sigma / math.sqrt(2.0 * steps * math.log(1.0 / delta)), 0.5) for e in eps])
    log_t = np.log(eps)

    def G(x, idx):
        return _log_epsilon(fast_rdp.epsilon(np.exp(x), sigma, steps, delta)) - log_t[idx]

    x, _, st = fast_rdp.solve_increasing(
        G, np.log(q0), 1.0, math.log(_Q_MIN), 0.0, mode="le", tol=_TIGHT_RTOL
    )
    if (st == -1).any():
        r = int(np.nonzero(st == -1)[0][0])
        raise PlanError(
            f"epsilon={eps[r]:g} cannot be met at noise_multiplier={sigma:g}, steps={steps}, "
            f"delta={delta:g} for any sample rate ≥ {_Q_MIN:g}; raise epsilon"
        )
    q = np.exp(x)
    capped = st == 1
    q[capped] = 1.0
    return q, capped


def noise_multiplier_for(*, epsilon: float, sample_rate: float, steps: int, delta: float) -> float:
    """Smallest σ with Opacus ε(sample_rate, σ, steps, δ) ≤ epsilon (ε ≥ (1-1e-6)·target)."""
    _check_eps(epsilon, "epsilon")
    _check_rate(sample_rate, "sample_rate")
    _check_steps(steps)
    _check_delta(delta)
    s = _sigma_cached(float(epsilon), float(sample_rate), int(steps), float(delta))
    return _verify_sigma(s, float(epsilon), float(sample_rate), int(steps), float(delta))


def _verify_sigma(s: float, eps: float, q: float, steps: int, delta: float) -> float:
    # Opacus check (the fast ε is conservative, so this loop virtually never iterates)
    for _ in range(100):
        if _opacus_eps(q, s, steps, delta) <= eps:
            return s
        s = s * (1.0 + 1e-9)
    raise RuntimeError("internal error: could not verify noise multiplier with Opacus")


# --------------------------------------------------------------------------------------
# Planner
# --------------------------------------------------------------------------------------


def _check_eps(e, name):
    try:
        ok = math.isfinite(e) and e > 0
    except TypeError:
        ok = False
    if not ok:
        raise PlanError(f"{name} must be finite and > 0 (allowed: 0 < ε < inf), got {e!r}")


def _check_delta(d):
    try:
        ok = 0 < d < 1
    except TypeError:
        ok = False
    if not ok:
        raise PlanError(f"delta must satisfy 0 < delta < 1, got {d!r}")


def _check_rate(q, name):
    try:
        ok = 0 < q <= 1
    except TypeError:
        ok = False
    if not ok:
        raise PlanError(f"{name} must satisfy 0 < {name} <= 1, got {q!r}")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _check_steps(s, allow_zero: bool = False):
    lo = 0 if allow_zero else 1
    if not _is_int(s) or s < lo:
        raise PlanError(f"steps must be an integer >= {lo}, got {s!r}")


def _validate(mode, epsilons, delta, tier_sizes, batch_size, clip_norm, steps, rdp_floor: bool = True):
    if mode not in MODES:
        raise PlanError(f"mode must be one of {MODES}, got {mode!r}")
    try:
        eps = tuple(float(e) for e in epsilons)
        sizes_in = tuple(tier_sizes)
    except TypeError as exc:
        raise PlanError("epsilons and tier_sizes must be sequences (one entry per tier)") from exc
    if len(eps) == 0:
        raise PlanError("epsilons must contain at least one tier")
    if len(sizes_in) != len(eps):
        raise PlanError(
            f"tier_sizes must have one entry per tier: got {len(sizes_in)} sizes for {len(eps)} epsilons"
        )
    for k, e in enumerate(eps):
        _check_eps(e, f"epsilons[{k}]")
    for k, n in enumerate(sizes_in):
        if not (_is_int(n) or (isinstance(n, float) and n.is_integer())) or n < 1:
            raise PlanError(f"tier_sizes[{k}] must be an integer >= 1, got {n!r}")
    sizes = tuple(int(n) for n in sizes_in)
    _check_delta(delta)
    N = sum(sizes)
    try:
        ok = math.isfinite(batch_size) and 1 <= batch_size <= N
    except TypeError:
        ok = False
    if not ok:
        raise PlanError(f"batch_size must satisfy 1 <= batch_size <= N = {N} (total tier size), got {batch_size!r}")
    try:
        ok = math.isfinite(clip_norm) and clip_norm > 0
    except TypeError:
        ok = False
    if not ok:
        raise PlanError(f"clip_norm must be finite and > 0, got {clip_norm!r}")
    _check_steps(steps)
    floor = epsilon_floor(float(delta)) if rdp_floor else 0.0
    for k, e in enumerate(eps):
        if e <= floor * (1 + 1e-6):
            raise PlanError(
                f"epsilons[{k}]={e:g} is infeasible at delta={delta:g}: the Opacus RDP bound cannot "
                f"certify ε <= {floor:.4g}; allowed: epsilon > {floor:.4g} (or raise delta)"
            )
    return eps, sizes, float(delta), float(batch_size), float(clip_norm), int(steps)


def plan(*, mode, epsilons, delta, tier_sizes, batch_size, clip_norm, steps, accountant: str = "rdp") -> Plan:
    """Plan noise, per-tier sample rates and clip norms for individualized DP-SGD.

    Arguments are per tier, results are in the same tier order.  ``accountant``: whose ε the plan meets
    (``engine.dp.accountants``; "rdp" is the fast path below, the others :func:`_plan_with`). Raises PlanError.
    A plan made before with the same inputs and the same accounting code comes from :mod:`engine.dp.plan_cache`.
    """
    acc = _get_accountant(accountant)
    eps, sizes, delta, B, C, T = _validate(mode, epsilons, delta, tier_sizes, batch_size, clip_norm, steps,
                                           rdp_floor=acc.name == "rdp")
    inputs = dict(mode=mode, epsilons=list(eps), delta=delta, tier_sizes=list(sizes), batch_size=B, clip_norm=C,
                  steps=T, accountant=acc.name)
    cached = _cached_plan("plan", inputs)
    if cached is not None and _answers(cached, inputs):
        return cached
    if acc.name != "rdp":
        p = _plan_with(acc, mode, eps, delta, sizes, B, C, T)
    else:
        p = _plan_rdp(mode, eps, sizes, delta, B, C, T)
    plan_cache.put("plan", inputs, p.to_dict())
    return p


def _cached_plan(kind: str, inputs: dict) -> Plan | None:
    value = plan_cache.get(kind, inputs)
    if value is None:
        return None
    try:
        return Plan(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()})
    except TypeError:  # a row of another Plan's fields (the code fingerprint changed with them: cannot happen)
        return None


def _answers(p: Plan, inputs: dict) -> bool:
    """Whether a cached plan is one of this request (a cheap check of what the key promises): its echoed inputs
    are the request's and every tier's ε is within its target."""
    return (p.mode == inputs["mode"] and list(p.target_epsilons) == inputs["epsilons"] and p.delta == inputs["delta"]
            and list(p.tier_sizes) == inputs["tier_sizes"] and p.steps == inputs["steps"]
            and p.accountant == inputs["accountant"] and len(p.epsilons) == len(p.target_epsilons)
            and all(e <= t for e, t in zip(p.epsilons, p.target_epsilons)))


def _plan_rdp(mode, eps, sizes, delta, B, C, T) -> Plan:
    """:func:`plan` under RDP, from validated arguments."""
    N = sum(sizes)
    e_min = min(eps)
    q_base = B / N
    notes: list[str] = []
    if mode == "dpsgd" or len(set(eps)) == 1:
        sigma = _verify_sigma(_sigma_cached(e_min, q_base, T, delta), e_min, q_base, T, delta)
        rates = (q_base,) * len(eps)
        clips = (C,) * len(eps)
    elif mode == "scale":
        distinct = sorted(set(eps))
        sig = _sigmas_fast(np.array(distinct), np.full(len(distinct), q_base), T, delta)
        sig_of = {}
        prev = math.inf
        for e, s in zip(distinct, sig):  # ascending ε: σ non-increasing, so C_n non-decreasing
            prev = min(prev, _verify_sigma(float(s), e, q_base, T, delta))
            sig_of[e] = prev
        sigma = sig_of[e_min]
        rates = (q_base,) * len(eps)
        clips = tuple(C if sig_of[e] == sigma else C * sigma / sig_of[e] for e in eps)
    else:  # sample
        sigma, rate_of, capped = _plan_sample(eps, sizes, B, T, delta)
        rates = tuple(rate_of[e] for e in eps)
        clips = (C,) * len(eps)
        for k, e in enumerate(eps):
            if capped.get(e, False):
                notes.append(
                    f"tier {k}: sample rate capped at 1 (epsilon={e:g} would allow more); "
                    f"achieved ε is below its target"
                )
    noise_std = sigma * C
    achieved = []
    mults = _effective_multipliers(sigma, noise_std, clips)
    for k, (q, z, e) in enumerate(zip(rates, mults, eps)):
        a = _opacus_eps(q, z, T, delta)
        if a > e:  # cannot happen: the search uses a conservative ε; keep the guarantee explicit
            raise RuntimeError(f"internal error: tier {k} ε={a} exceeds target {e}")
        achieved.append(a)
    return Plan(
        mode=mode,
        noise_multiplier=float(sigma),
        sample_rates=tuple(float(q) for q in rates),
        clip_norms=tuple(float(c) for c in clips),
        noise_std=float(noise_std),
        epsilons=tuple(achieved),
        target_epsilons=eps,
        delta=delta,
        steps=T,
        tier_sizes=sizes,
        expected_batch_size=float(sum(q * n for q, n in zip(rates, sizes))),
        notes=tuple(notes),
    )


def _plan_sample_fast(eps, sizes, B, T, delta):
    """SAMPLE's search on the fast RDP ε alone (before Opacus' verification): σ, the strictest tier's rate q_min,
    and the other tiers' rates and whether each was capped at 1, by ε."""
    N = sum(sizes)
    e_min = min(eps)
    others = sorted(set(eps) - {e_min})
    n_min = sum(n for n, e in zip(sizes, eps) if e == e_min)
    n_oth = np.array([sum(n for n, e in zip(sizes, eps) if e == v) for v in others], float)
    e_oth = np.array(others)
    memo: dict[float, tuple] = {}
    last_q = [None]

    def evaluate(q_min: float):
        if q_min in memo:
            return memo[q_min]
        sigma = _sigma_cached(e_min, q_min, T, delta)
        q0 = None
        if last_q[0] is not None:  # rates scale roughly with q_min: warm start
            prev_qmin, prev_q = last_q[0]
            q0 = np.clip(prev_q * (q_min / prev_qmin), _Q_MIN, 1.0)
        q, capped = _rates_fast(e_oth, sigma, T, delta, q0=q0)
        last_q[0] = (q_min, q)
        batch = q_min * n_min + float((q * n_oth).sum())
        memo[q_min] = (sigma, q, capped, batch)
        return memo[q_min]

    logB = math.log(B)

    def G(x, idx):
        return np.array([math.log(evaluate(math.exp(float(v)))[3]) - logB for v in x])

    # the largest admissible q_min is B/N (all other rates are ≥ q_min)
    x_hi = math.log(B / N)
    x, _, st = fast_rdp.solve_increasing(
        G, np.array([x_hi]), 1.0, math.log(_Q_MIN), x_hi, mode="abs", tol=_BATCH_RTOL
    )
    if st[0] == -1:
        raise PlanError(
            f"SAMPLE mode cannot reach batch_size={B:g}: even with a vanishing rate "
            f"({_Q_MIN:g}) for the strictest tier the looser tiers alone give an expected batch of "
            f"{evaluate(_Q_MIN)[3]:.4g}; raise batch_size, lower the looser epsilons or raise steps"
        )
    q_min = math.exp(float(x[0]))
    sigma, q, capped, _ = evaluate(q_min)
    return sigma, q_min, dict(zip(others, (float(v) for v in q))), dict(zip(others, (bool(c) for c in capped)))


def _plan_sample(eps, sizes, B, T, delta):
    sigma, q_min, q_of, capped_of = _plan_sample_fast(eps, sizes, B, T, delta)
    e_min = min(eps)
    others = sorted(set(eps) - {e_min})
    # Opacus verification of the shared σ and of each rate
    sigma = _verify_sigma(sigma, e_min, q_min, T, delta)
    rate_of = {e_min: q_min}
    cap_of = {e_min: False}
    prev = q_min
    for e, qq, cp in zip(others, (q_of[e] for e in others), (capped_of[e] for e in others)):
        # ascending ε: rates non-decreasing, ≥ q_min
        qq = max(float(qq), prev)
        for _ in range(100):
            if _opacus_eps(qq, sigma, T, delta) <= e:
                break
            qq *= 1.0 - 1e-9
        rate_of[e] = prev = qq
        cap_of[e] = bool(cp)
    return sigma, rate_of, cap_of


# --------------------------------------------------------------------------------------
# The same plans under another accountant (PRV, PLD)
# --------------------------------------------------------------------------------------

_GENERIC_BATCH_RTOL = 3e-4  # SAMPLE under PRV / PLD: the expected batch within about 0.1 % of B
#: the largest target ε a PRV or PLD plan takes (their ε at the tiny σ a looser target needs costs seconds to
#: minutes an evaluation; RDP plans any ε its bound can certify)
MAX_TIGHT_EPSILON = 50.0


#: PRV / PLD plans first follow RDP's shape (:func:`_sigma_by_rdp_shape`, :func:`_sample_by_rdp_shape`); False:
#: the accountants' own searches alone (``bench/planner.py`` times both)
SHAPED_SEARCH = True
_SHAPE_RTOL = 1e-4  # the accountants' searches' tolerance (engine.dp.accountants): ε within it below the target
_SHAPE_ROUNDS = 20  # a round costs one ε per tier; the searches it saves cost 20 to 30 per tier


def _follow_rdp(targets, spend, start=None):
    """Broyden's method on RDP targets ε' (one per tier, in log) until what each spends under the tight
    accountant is within 1e-4 below its target: ``spend(ε')`` makes the RDP plan (fast ε) of those targets and
    returns (each tier's ε under the tight accountant, which tiers are capped at q = 1, the plan), or None. The two
    accountants' ε are nearly proportional near a plan, so the Jacobian starts at the identity and the rank-one
    updates learn the rest: three to eight rounds, one ε per tier each (up to 15 where RDP is far looser). ``start``: the first RDP targets (default
    the targets). The plan, or None if it does not settle."""
    targets = np.asarray(targets, float)
    aim = np.log(targets) - _SHAPE_RTOL / 2
    u = np.log(targets if start is None else np.asarray(start, float))
    jac, last = np.eye(len(targets)), None
    for _ in range(_SHAPE_ROUNDS):
        out = spend(np.exp(u))
        if out is None:
            return None
        got, capped, made = out
        if not np.all((got > 0.0) & np.isfinite(got)):
            return None
        rest = capped & (got <= targets)  # a capped tier within its target: nothing to move
        if np.all((got <= targets) & ((got >= targets * math.exp(-_SHAPE_RTOL)) | rest)):
            return made
        h = np.where(rest, 0.0, np.log(got) - aim)
        if last is not None:
            du, dh = u - last[0], h - last[1]
            if du @ du > 1e-18:
                jac = jac + np.outer(dh - jac @ du, du) / (du @ du)
        last = (u, h)
        try:
            step = np.linalg.solve(jac, h)
        except np.linalg.LinAlgError:
            return None
        if not np.all(np.isfinite(step)):
            return None
        u = u - np.clip(step, -0.5, 0.5)
    return None


def _sigma_by_rdp_shape(acc, eps, q, T, delta, ratio=1.0):
    """The smallest σ (within the searches' tolerance) with ``acc``'s ε(q, σ, T) ≤ ``eps``, found along RDP's
    fast σ(ε) (:func:`_follow_rdp`): ``acc``'s ε of the σ returned (its own, at its real discretisation) is within
    1e-4 below ``eps``. Three or four ε evaluations instead of the general search's five to ten. ``ratio``: the
    first RDP target over ``eps`` (a neighbouring tier's). (σ, the settled RDP target over ``eps``), or None if it
    does not settle (the caller searches)."""

    def spend(shadow):
        try:
            sigma = _sigma_cached(float(shadow[0]), float(q), int(T), float(delta))
        except PlanError:
            return None
        if sigma < acc.sigma_floor:
            return None
        return np.array([acc.epsilon(q, sigma, T, delta)]), np.array([False]), (sigma, float(shadow[0]) / eps)

    return _follow_rdp([eps], spend, start=[eps * ratio])


def _sample_by_rdp_shape(acc, eps, sizes, B, T, delta):
    """SAMPLE under ``acc`` along RDP's shape (:func:`_follow_rdp`): the RDP SAMPLE search (fast ε) with per-tier
    RDP targets, until ``acc``'s ε of every tier (its own, at its real discretisation) is within 1e-4 below the
    tier's target (a tier capped at q = 1: at most it). The expected batch is RDP's search's, B to 1e-5. One ε
    per tier a round instead of a search on σ with a rate search per tier inside. (σ, {ε: q}), or None if it does
    not settle (the caller searches)."""
    distinct = sorted(set(eps))

    def spend(shadow):
        value = dict(zip(distinct, (float(v) for v in shadow)))
        if len(set(value.values())) < len(distinct):
            return None
        try:
            sigma, q_min, q_of, capped_of = _plan_sample_fast([value[e] for e in eps], sizes, B, T, delta)
        except PlanError:
            return None
        if sigma < acc.sigma_floor:
            return None
        strictest = min(value.values())
        rate_of = {e: q_min if value[e] == strictest else q_of[value[e]] for e in distinct}
        capped = np.array([value[e] != strictest and capped_of[value[e]] for e in distinct])
        got = np.array([acc.epsilon(rate_of[e], sigma, T, delta) for e in distinct])
        return got, capped, (float(sigma), rate_of)

    return _follow_rdp(distinct, spend)


def _get_accountant(name):
    try:
        return accountants.get_accountant(name)
    except ValueError as e:
        raise PlanError(str(e)) from None


def _plan_with(acc, mode, epsilons, delta, tier_sizes, batch_size, clip_norm, steps) -> Plan:
    """:func:`plan` under the accountant ``acc``: the same three modes, each searched with the accountant's
    search ε and verified with its reported ε (the searches of ``engine.dp.accountants``). The RDP plan's σ is
    where the searches start (a tighter accountant needs less noise for the same ε: it is close above)."""
    eps, sizes, delta, B, C, T = _validate(mode, epsilons, delta, tier_sizes, batch_size, clip_norm, steps,
                                           rdp_floor=False)
    for k, e in enumerate(eps):
        if e > MAX_TIGHT_EPSILON:
            raise PlanError(f"epsilons[{k}]={e:g} is above what the {acc.name} accountant plans (ε ≤ "
                            f"{MAX_TIGHT_EPSILON:g}: a looser target needs almost no noise, where its numerical "
                            f"accounting grows slow); use the rdp accountant for it")
    N = sum(sizes)
    e_min = min(eps)
    q_base = B / N
    notes: list[str] = []
    try:
        if mode == "dpsgd" or len(set(eps)) == 1:
            sigma, _ = _sigma_with(acc, e_min, q_base, T, delta)
            rates, clips = (q_base,) * len(eps), (C,) * len(eps)
        elif mode == "scale":
            sig_of, prev, ratio = {}, math.inf, 1.0
            for e in sorted(set(eps)):  # ascending ε: σ non-increasing, so C_n non-decreasing
                sigma_e, ratio = _sigma_with(acc, e, q_base, T, delta, ratio)  # from the stricter tier's ratio
                prev = min(prev, sigma_e)
                sig_of[e] = prev
            sigma = sig_of[e_min]
            rates = (q_base,) * len(eps)
            clips = tuple(C if sig_of[e] == sigma else C * sigma / sig_of[e] for e in eps)
        else:
            sigma, rate_of = _plan_sample_with(acc, eps, sizes, B, T, delta)
            rates, clips = tuple(rate_of[e] for e in eps), (C,) * len(eps)
            notes = [f"tier {k}: sample rate capped at 1 (epsilon={e:g} would allow more); achieved ε is below "
                     f"its target" for k, e in enumerate(eps) if rate_of[e] == 1.0]
    except ValueError as e:
        raise PlanError(str(e)) from None
    noise_std = sigma * C
    mults = _effective_multipliers(sigma, noise_std, clips)
    achieved = [acc.epsilon(q, z, T, delta) for q, z in zip(rates, mults)]
    for k, (a, e) in enumerate(zip(achieved, eps)):
        if a > e:  # cannot happen: the search ε is never below the reported one; keep the guarantee explicit
            raise RuntimeError(f"internal error: tier {k} ε={a} exceeds target {e} under {acc.name}")
    return Plan(mode=mode, noise_multiplier=float(sigma), sample_rates=tuple(float(q) for q in rates),
                clip_norms=tuple(float(c) for c in clips), noise_std=float(noise_std), epsilons=tuple(achieved),
                target_epsilons=eps, delta=delta, steps=T, tier_sizes=sizes,
                expected_batch_size=float(sum(q * n for q, n in zip(rates, sizes))), notes=tuple(notes),
                accountant=acc.name)


def noise_saved_sentence(accountant: str, sigma: float, rdp_sigma: float) -> str:
    """What a tighter accountant buys, in one sentence (the plan preview and ``privacy-lab plan``): the noise
    multiplier σ* of a plan under ``accountant`` against the same settings' under RDP."""
    saved = 1.0 - float(sigma) / float(rdp_sigma)
    return (f"σ* = {sigma:.4g} under {accountant} against {rdp_sigma:.4g} under rdp: "
            f"{abs(saved) * 100:.1f} % {'less' if saved >= 0 else 'more'} noise at the same ε")


def _rdp_sigma_guess(eps, q, steps, delta):
    """RDP's σ for (ε, q, T, δ) when RDP can certify ε at all (a starting point, never a result)."""
    if eps <= epsilon_floor(delta) * (1 + 1e-3):
        return None
    try:
        return _sigma_cached(float(eps), float(q), int(steps), float(delta))
    except PlanError:
        return None


def _sigma_with(acc, eps, q, T, delta, ratio=1.0):
    """``acc``'s smallest σ for ε(q, σ, T) ≤ ``eps``: along RDP's shape (from the RDP target ``ratio`` × ``eps``),
    else the accountant's own search. (σ, the RDP target over ``eps`` to start a neighbouring tier's from)."""
    shaped = _sigma_by_rdp_shape(acc, eps, q, T, delta, ratio) if SHAPED_SEARCH else None
    if shaped is not None:
        return shaped
    return acc.noise_multiplier(eps, q, T, delta, guess=_rdp_sigma_guess(eps, q, T, delta)), ratio


def _plan_sample_with(acc, eps, sizes, B, T, delta):
    shaped = _sample_by_rdp_shape(acc, eps, sizes, B, T, delta) if SHAPED_SEARCH else None
    if shaped is not None:
        sigma, rate_of = shaped
        prev = 0.0
        for e in sorted(rate_of):  # ascending ε: rates non-decreasing (as below)
            rate_of[e] = prev = max(rate_of[e], prev)
        return sigma, rate_of
    return _plan_sample_searched(acc, eps, sizes, B, T, delta)


def _plan_sample_searched(acc, eps, sizes, B, T, delta):
    """SAMPLE under ``acc``: the shared σ at which every tier's largest rate q_n(σ) (its own search) gives
    Σ q_n N_n = B. The batch grows with σ (more noise allows every tier a larger rate), so σ is found by the
    same safeguarded search on log σ, from RDP's SAMPLE σ; each tier's rate search starts where the last two
    σ's rates point (log q is nearly straight in log σ), so it needs two or three ε evaluations."""
    distinct = sorted(set(eps))
    n_of = {e: sum(n for n, x in zip(sizes, eps) if x == e) for e in distinct}
    seen: list = []  # (log σ, {ε: log q}) of the σ's tried whose rates are all > 0, in order
    memo: dict = {}

    def rates_at(y):
        if y in memo:
            return memo[y]
        out = {}
        for e in distinct:
            guess, step = None, 0.05
            if len(seen) >= 2:
                (y1, r1), (y2, r2) = seen[-2], seen[-1]
                slope = (r2[e] - r1[e]) / (y2 - y1) if y2 != y1 else 1.0
                guess, step = math.exp(r2[e] + slope * (y - y2)), 0.01
            elif seen:
                guess = math.exp(seen[-1][1][e] + (y - seen[-1][0]))  # rates grow about linearly with σ
            out[e] = acc.sample_rate(e, math.exp(y), T, delta, guess=guess, step=step)
        if all(q > 0 for q in out.values()):
            seen.append((y, {e: math.log(q) for e, q in out.items()}))
        memo[y] = out
        return out

    def gap(y):  # log(batch / B), increasing in y = log σ
        r = rates_at(y)
        batch = sum(r[e] * n_of[e] for e in distinct)
        return math.log(batch / B) if batch > 0 else -math.inf

    try:  # RDP's SAMPLE σ: a tighter accountant's is a few per cent below it
        start = _plan_sample(eps, sizes, B, T, delta)[0] * 0.97
    except PlanError:
        start = 1.0
    y = accountants.largest_feasible(gap, math.log(acc.sigma_floor), 0.0, _GENERIC_BATCH_RTOL,
                                     start=math.log(max(start, acc.sigma_floor)), step=0.03,
                                     hi_limit=math.log(_SIGMA_MAX))
    if y == math.inf:  # cannot happen: at σ → ∞ every rate reaches 1 and the batch N ≥ B
        raise RuntimeError(f"internal error: no σ up to {_SIGMA_MAX:g} gives batch_size={B:g} under {acc.name}")
    if y is None:
        raise PlanError(f"SAMPLE mode cannot reach batch_size={B:g} under {acc.name}: even noise multiplier "
                        f"{acc.sigma_floor:g} gives a larger expected batch; the targets are too loose to plan "
                        f"noise for (lower them, or raise batch_size)")
    rate_of = rates_at(y)
    if gap(y) < -_GENERIC_BATCH_RTOL:
        # The bracket closed on a jump: a numerical accountant's ε is discretised (PRV: eps_error), so the batch
        # can leap past B between two σ the search tells apart (found: eps (3, 2), sizes (2643, 699), T = 107,
        # B = 43 gave 42.949). Take the σ just above the jump and scale its rates down to B: a smaller rate at the
        # same σ spends less, and each tier's ε is evaluated again before the plan takes them.
        above = [x for x in memo if x > y and gap(x) > 0.0]
        if above:
            y_hi = min(above)
            scale = B / sum(memo[y_hi][e] * n_of[e] for e in distinct)
            scaled = {e: q * scale for e, q in memo[y_hi].items()}
            if all(acc.epsilon(scaled[e], math.exp(y_hi), T, delta) <= e for e in distinct):
                y, rate_of = y_hi, scaled
    e_min = distinct[0]
    if rate_of[e_min] <= 0.0:
        raise PlanError(f"epsilon={e_min:g} cannot be met at noise_multiplier={math.exp(y):g}, steps={T} under "
                        f"{acc.name} for any sample rate; raise epsilon")
    prev = 0.0
    for e in distinct:  # ascending ε: rates non-decreasing (a stricter tier's rate meets a looser target too)
        rate_of[e] = prev = max(rate_of[e], prev)
    return math.exp(y), rate_of


# --------------------------------------------------------------------------------------
# Live accountant
# --------------------------------------------------------------------------------------


class TierAccountant:
    """Per-tier accountant: ε per tier after `steps` steps, under ``accountant`` (``engine.dp.accountants``; RDP:
    Opacus' formulas, composed per order here so a step costs nothing; PRV and PLD: their ε of the T steps and the
    releases, cached per (tier, T)).

    noise_multipliers (optional, per tier) overrides the shared noise_multiplier, e.g. the
    SCALE effective multipliers σ*·C/C_n (``Plan.noise_multipliers``).
    ``releases``: noise multipliers of one-off Gaussian releases (sensitivity 1, no subsampling) made
    before step 1 (``Plan.release_noise_multipliers``); their RDP is composed with the steps.
    Before any step, epsilons() returns 0.0 for every tier (the releases' ε if there are any).
    """

    def __init__(self, *, sample_rates, noise_multiplier, delta, noise_multipliers=None, releases=(),
                 accountant: str = "rdp"):
        rates = tuple(float(q) for q in sample_rates)
        if not rates:
            raise PlanError("sample_rates must contain at least one tier")
        for k, q in enumerate(rates):
            _check_rate(q, f"sample_rates[{k}]")
        _check_delta(delta)
        if noise_multipliers is None:
            if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
                raise PlanError(f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
            sig = (float(noise_multiplier),) * len(rates)
        else:
            sig = tuple(float(s) for s in noise_multipliers)
            if len(sig) != len(rates):
                raise PlanError(
                    f"noise_multipliers must have one entry per tier ({len(rates)}), got {len(sig)}"
                )
            for k, s in enumerate(sig):
                if not (math.isfinite(s) and s > 0):
                    raise PlanError(f"noise_multipliers[{k}] must be finite and > 0, got {s!r}")
        self.sample_rates = rates
        self.noise_multiplier = float(noise_multiplier) if noise_multiplier is not None else None
        self.noise_multipliers = sig
        self.delta = float(delta)
        self.steps = 0
        self.accountant = _get_accountant(accountant).name
        self.releases = tuple(float(r) for r in releases)
        self._rdp1 = [_opacus_rdp_one_step(q, s) for q, s in zip(rates, sig)]
        self._release = _release_rdp(self.releases)

    def step(self, n: int = 1) -> None:
        if not _is_int(n) or n < 0:
            raise PlanError(f"n must be an integer >= 0, got {n!r}")
        self.steps += int(n)

    def epsilons(self) -> list[float]:
        if self.steps == 0 and self._release is None:
            return [0.0] * len(self._rdp1)
        if self.accountant != "rdp":
            acc = accountants.get_accountant(self.accountant)
            return [acc.epsilon(q, z, self.steps, self.delta, self.releases)
                    for q, z in zip(self.sample_rates, self.noise_multipliers)]
        extra = 0.0 if self._release is None else self._release
        return [_opacus_eps_from_rdp(r * self.steps + extra, self.delta) for r in self._rdp1]


def _release_rdp(releases: tuple) -> np.ndarray | None:
    """Summed per-order RDP of one-off Gaussian releases (q = 1, Opacus' formula), None if there are none."""
    for k, r in enumerate(releases):
        if not (math.isfinite(r) and r > 0):
            raise PlanError(f"releases[{k}] must be finite and > 0, got {r!r}")
    if not releases:
        return None
    return accountants.releases_rdp(releases)


def release_noise_multiplier_default(*, noise_multiplier: float, sample_rate: float, steps: int,
                                     share: float = 0.01) -> float:
    """A one-off release's noise multiplier whose RDP is about ``share`` of the T training steps' RDP
    (small-q estimate: T steps cost ≈ 2 T q² α / z², one release α / (2 σ²)), at least 1."""
    return max(1.0, float(noise_multiplier) / (2.0 * float(sample_rate) * math.sqrt(share * int(steps))))


def plan_with_release(p: Plan, release_noise_multiplier: float) -> Plan:
    """``p`` (a plan with one sample rate and one noise multiplier: a DP-SGD plan) with a one-off
    Gaussian release of noise multiplier ``release_noise_multiplier`` composed in: the noise
    multiplier is raised to the smallest z' with ε(T steps at z' ∘ the releases) ≤ the strictest
    target under ``p.accountant`` (tight to 1e-6 below it under RDP, 1e-4 under the others), and ``epsilons``
    are the composed ε. Cached as :func:`plan` is (:mod:`engine.dp.plan_cache`)."""
    inputs = {"plan": p.to_dict(), "release_noise_multiplier": float(release_noise_multiplier)}
    cached = _cached_plan("plan_with_release", inputs)
    if cached is not None and cached == _released(p, cached) and all(
            e <= t for e, t in zip(cached.epsilons, cached.target_epsilons)):
        return cached
    out = _plan_with_release(p, release_noise_multiplier)
    plan_cache.put("plan_with_release", inputs, out.to_dict())
    return out


def _released(p: Plan, out: Plan) -> Plan:
    """``p`` with ``out``'s release fields: what a plan with a release echoes of the plan it was made from."""
    return dataclasses_replace(p, noise_multiplier=out.noise_multiplier, noise_std=out.noise_std,
                               epsilons=out.epsilons, release_noise_multipliers=out.release_noise_multipliers)


def _plan_with_release(p: Plan, release_noise_multiplier: float) -> Plan:
    rates, mults = set(p.sample_rates), set(p.noise_multipliers)
    if len(rates) != 1 or len(mults) != 1:
        raise PlanError("a one-off release can only be composed with a plan of one sample rate and noise multiplier")
    q, T, delta, target = float(p.sample_rates[0]), p.steps, p.delta, min(p.target_epsilons)
    releases = p.release_noise_multipliers + (float(release_noise_multiplier),)
    acc = _get_accountant(p.accountant)
    if acc.epsilon(q, 0.0, 0, delta, releases) >= target:
        raise PlanError(f"the one-off release (noise multiplier {release_noise_multiplier:g}) alone spends "
                        f"ε ≥ {target:g}; raise its noise")
    if acc.name == "rdp":
        z = _rdp_sigma_with_releases(p, releases)
    else:
        try:
            z = acc.noise_multiplier(target, q, T, delta, releases, guess=float(p.noise_multiplier) * 1.05)
        except ValueError:
            raise PlanError(f"epsilon={target:g} cannot be met together with the one-off release; raise epsilon") \
                from None
    eps = acc.epsilon(q, z, T, delta, releases)
    if eps > target:  # cannot happen: the searches end on the feasible side
        raise RuntimeError(f"internal error: composed ε={eps} exceeds target {target}")
    C = min(p.clip_norms)
    return dataclasses_replace(p, noise_multiplier=float(z), noise_std=float(z * C),
                               epsilons=(float(eps),) * len(p.epsilons), release_noise_multipliers=releases)


def _rdp_sigma_with_releases(p: Plan, releases: tuple) -> float:
    """The smallest z with Opacus RDP ε(T steps at z ∘ ``releases``) ≤ p's strictest target (1e-6 below it)."""
    q, T, delta, target = float(p.sample_rates[0]), p.steps, p.delta, min(p.target_epsilons)
    extra = _release_rdp(releases)

    def eps_at(z: float) -> float:
        return _opacus_eps_from_rdp(_opacus_rdp_one_step(q, z) * T + extra, delta)

    lo, hi = float(p.noise_multiplier), float(p.noise_multiplier)
    while eps_at(hi) > target:  # grow until feasible (ε → the releases' ε as z → ∞)
        lo, hi = hi, hi * 1.25
        if hi > _SIGMA_MAX:
            raise PlanError(f"epsilon={target:g} cannot be met together with the one-off release; raise epsilon")
    for _ in range(200):  # bisection on z: the smallest z' with ε ≤ target, ε ≥ (1 − 1e-6)·target
        if hi == lo or eps_at(hi) >= target * (1 - _TIGHT_RTOL):
            break
        mid = 0.5 * (lo + hi)
        if eps_at(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


def plan_at_noise(p: Plan, noise_multiplier: float) -> Plan:
    """``p`` (a DP-SGD plan: one sample rate, one clip, no one-off release) trained at the noise multiplier
    ``noise_multiplier`` instead of its own: noise std z · C, and ``epsilons`` the ε that z spends in T steps
    (under ``p.accountant``), whatever the targets were — above them when z is below p's σ (the caller says so). The
    noise-matched control of DP-SGD-S (``engine.audit.pa_alooa.controls``) is this. ε under ``p.accountant``."""
    if len(set(p.sample_rates)) != 1 or len(set(p.clip_norms)) != 1 or p.release_noise_multipliers:
        raise PlanError("a plan at a given noise multiplier needs a DP-SGD plan (one sample rate and clip, "
                        "no one-off release)")
    z = float(noise_multiplier)
    if not (math.isfinite(z) and z > 0):
        raise PlanError(f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
    eps = _get_accountant(p.accountant).epsilon(float(p.sample_rates[0]), z, p.steps, p.delta)
    return dataclasses_replace(p, noise_multiplier=z, noise_std=z * float(p.clip_norms[0]),
                               epsilons=(float(eps),) * len(p.epsilons))


# --------------------------------------------------------------------------------------
# Adaptive clipping
# --------------------------------------------------------------------------------------


def adaptive_clipping_noise_multiplier(*, noise_multiplier: float, count_noise_std: float,
                                       count_sensitivity: float = 0.5) -> float:
    """Gradient noise multiplier z_Δ = (z^-2 − (Δ_b/σ_b)^2)^(-1/2) (Andrew et al. 2021, Thm 1, with Δ_b = ½).

    A step that releases a count vector of L2 sensitivity Δ_b (``count_sensitivity``) with Gaussian noise of
    std σ_b per entry, then the clipped-gradient sum with noise z_Δ times its sensitivity, both on the same
    Poisson batch, is — as an adaptive composition of a (Δ_b/σ_b)- and a (1/z_Δ)-GDP mechanism on that batch —
    (1/z)-GDP per batch, so each step is accounted as one subsampled Gaussian with noise multiplier z. Andrew
    et al.'s centred count Σ (1[‖g‖ ≤ S] − ½) has Δ_b = ½ (DP-SGD-S, DPSGD-Global-Adapt); DPSGD-F's per-group
    counts above and below C₀ have Δ_b = 1 (one sample moves one entry by one).
    """
    z, sb, d = noise_multiplier, count_noise_std, count_sensitivity
    try:
        ok = math.isfinite(z) and z > 0
    except TypeError:
        ok = False
    if not ok:
        raise PlanError(f"noise_multiplier must be finite and > 0, got {z!r}")
    try:
        ok = sb > 0 and not math.isnan(sb)
    except TypeError:
        ok = False
    if not ok:
        raise PlanError(f"count_noise_std must be > 0, got {sb!r}")
    if not (isinstance(d, (int, float)) and math.isfinite(d) and d > 0):
        raise PlanError(f"count_sensitivity must be finite and > 0, got {d!r}")
    if sb <= d * z:
        raise PlanError(
            f"adaptive clipping infeasible: need count_noise_std > {d:g} * noise_multiplier "
            f"(got {sb:g} <= {d * z:g}); raise count_noise_std above {d * z:g}"
        )
    return float((z**-2 - (d / sb) ** 2) ** -0.5)


def clear_caches() -> None:
    """Drop all memoized accounting results (used by the benchmark for cold timings)."""
    _sigma_cached.cache_clear()
    fast_rdp.clear_caches()
    accountants.clear_caches()  # every accountant's ε, and Opacus' one-step RDP
    plan_cache.clear_memory()  # this process's plan-cache hits (the file is $PRIVACY_LAB_PLAN_CACHE's: "off" skips it)
