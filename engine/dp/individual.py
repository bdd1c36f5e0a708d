"""Individual (output-specific) privacy accounting of a DP-SGD-type run: what the run spent on each sample, under RDP.

Feldman & Zrnic (NeurIPS 2021, individual RDP) and Yu et al. ("individual privacy accounting for DP-SGD"): the
Poisson-subsampled Gaussian step with noise std N and a sample i whose contribution to the noisy sum is at most
s_i,t (its clipped, weighted gradient norm at step t, ≤ its tier's C_i) costs i the RDP of that step at noise
multiplier N / s_i,t (none at all when s_i,t = 0); composed over the steps per RDP order and converted to (ε, δ).
A sample that is always at its tier's bound spends exactly the tier's ε; any other spends no more.

Ratios. A step is given to this module as each sample's ratio u = σ_k / σ_eff ∈ [0, 1], σ_k its tier's planned
noise multiplier and σ_eff = N / s the step's own (with a count release of noise multiplier σ_c made on the same
batch, as DPSGD-F, DP-SGD-S and Global-Adapt do, 1/σ_eff² = (s / N)² + 1/σ_c², the joint step the planner accounts:
``engine.dp.accounting.adaptive_clipping_noise_multiplier``). :func:`step_ratios` computes u; u = 1 is the tier's
own step. ``engine.dp.individual_panel`` measures u for a panel of samples from a live model and its mechanism.

Approximations, each on the safe side or stated:

* Norms are known at checkpoints only (a fixed panel's norms measured every few steps): the steps from one
  checkpoint to the next use the earlier checkpoint's norm, as Yu et al. do with their per-epoch norms. This is
  an estimate of the run's individual ε, not a bound on it: between checkpoints a norm can move either way.
* Each step's u is rounded UP to the next point of a grid of ``GRID`` equal steps in (0, 1] (the RDP of one step
  is increasing in u, so rounding up can only over-state ε: by at most C / GRID in norm units); u = 0 spends
  nothing, u = 1 is exactly the tier's step. Between the points where every order is evaluated (every 8th), a
  fractional order's RDP is bounded by the next integer order's or the next such point's (:func:`ratio_grid_rdp`).
  Together: ~1 % above Opacus' ε at a sample's own constant ratio typically, up to 8 % in our checks.
* RDP only: under RDP the composition of steps with different noise multipliers is a sum per order, cheap for a
  few thousand samples; a per-sample PLD would be a convolution of distinct PLDs per sample and checkpoint (seconds
  each), so a run whose accountant is PLD or PRV gets its individual ε under RDP, labelled so
  (``IndividualAccountant.accountant`` is always "rdp", ``run_accountant`` the run's), beside its tier's ε under
  RDP (:meth:`IndividualAccountant.tier_epsilons`), never beside its tier's PLD ε.

The formulas are the run's RDP accountant's (``engine.dp.accountants``): the orders (Opacus' default), the one-step
RDP of the tier's own step (``rdp_one_step``: Opacus' ``compute_rdp``), the RDP of one-off releases
(``releases_rdp``) and the conversion to (ε, δ) (Opacus' ``get_privacy_spent``, row-wise as
``engine.dp.fast_rdp`` evaluates it); the grid's other points are Opacus' formulas vectorised
(``engine.dp.fast_rdp``). Nothing here is a second RDP formula.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from engine.dp import accountants, fast_rdp

#: the honest words, said once: where an individual ε is shown, this sentence is shown with it
DATA_DEPENDENT_NOTE = ("Individual ε is computed from this run's own gradients, so it depends on the data and is not "
                       "itself differentially private: it describes what the run spent on each sample, not a guarantee "
                       "that can be published, and each tier's planned ε stays the promise.")
#: the accountant every individual ε here is under
ACCOUNTANT = "rdp"
#: points of the ratio grid in (0, 1]: a step's u is rounded up to a multiple of 1 / GRID
GRID = 256
# float round-off of a ratio: above 1 by more than this is a caller's error (a sensitivity above the tier's bound);
# within it of a grid point counts as that point (u = σ_k·C / (σ_k·C) may come out 1 + 1 ulp)
_U_TOLERANCE = 1e-9


def step_ratios(sensitivity, noise_std, tier_noise_multiplier, count_noise_multiplier=math.inf) -> np.ndarray:
    """u = σ_k / σ_eff per sample: ``sensitivity`` s (its contribution bound this step, ≥ 0), the step's ``noise_std``
    N, its tier's planned noise multiplier σ_k, and the noise multiplier σ_c of a count release made on the same
    batch (∞: none); 1/σ_eff² = (s/N)² + 1/σ_c². Broadcasts; float64."""
    s = np.asarray(sensitivity, dtype=np.float64)
    n = np.asarray(noise_std, dtype=np.float64)
    if np.any(~(s >= 0)) or np.any(~(n > 0)):
        raise ValueError("sensitivities must be ≥ 0 and the noise std > 0")
    inv_c = 1.0 / np.asarray(count_noise_multiplier, dtype=np.float64)
    return np.asarray(tier_noise_multiplier, dtype=np.float64) * np.sqrt((s / n) ** 2 + inv_c ** 2)


def grid_index(ratios) -> np.ndarray:
    """The grid point each ratio is rounded up to (0: no loss, GRID: the tier's own step); ValueError above 1."""
    u = np.asarray(ratios, dtype=np.float64)
    if np.any(~(u >= 0)) or np.any(u > 1.0 + _U_TOLERANCE):
        raise ValueError(f"step ratios must lie in [0, 1] (a sensitivity above its tier's bound?), got max "
                         f"{np.nanmax(u) if u.size else 0:g}")
    return np.minimum(np.ceil(u * GRID - _U_TOLERANCE * GRID), GRID).astype(np.int64).clip(0, GRID)


# for each of the accountant's orders, the smallest integer order at or above it (Opacus' list has no 11: 10.1-10.9
# take 12's value)
_CEILING = np.searchsorted(fast_rdp.ALPHAS[fast_rdp._INT_MASK], fast_rdp.ALPHAS, side="left")


_COARSE = 8  # every 8th grid point also gets its fractional orders' own value
# fast_rdp's vectorised sums differ from Opacus' own by round-off: up to 4.5e-4 relative for the fractional orders'
# series where the RDP is ~1e-9, ~1e-10 for the integer orders' sum; its values are raised by this to stay above
_FAST_SAFETY = 1e-3


@functools.lru_cache(maxsize=64)
def ratio_grid_rdp(q: float, sigma: float) -> np.ndarray:
    """(GRID + 1, orders) an upper bound on the one-step RDP at noise multiplier σ / u_j, u_j = j / GRID, per order:
    row 0 is 0 (no loss); the last row is Opacus' ``rdp_one_step(q, σ)`` itself (what the tier's accountant
    composes); a row in between is the least of three upper bounds — the tier's own step (u ≤ 1); Opacus'
    integer-order binomial sum (``fast_rdp``, vectorised) with each fractional order α given the next integer order's
    value (a Rényi divergence never falls as its order grows); every order's own value (``fast_rdp.rdp``, all of
    Opacus' formulas) at the next multiple of ``_COARSE`` (RDP never falls as u grows) — the last two raised by
    ``_FAST_SAFETY``, the rows kept non-decreasing in u. The fractional orders' series costs ~1 ms a row, so it is
    paid for 31 rows only, the integer sum for all: 0.05-0.3 s a tier (0.7 s at q = 0.5), once per (q, σ). Against
    Opacus' ε at a sample's own constant u: ~1 % more typically, up to 8 % in our checks (with the rounding of u)."""
    out = np.zeros((GRID + 1, len(accountants.ORDERS)))
    if q > 0:
        top = accountants.rdp_one_step(float(q), float(sigma))
        j = np.arange(1, GRID)
        noise = float(sigma) * GRID / j
        if q >= 1.0:  # no subsampling: the Gaussian's α / 2σ², every order exactly
            rows = fast_rdp.rdp(np.ones(GRID - 1), noise) * (1.0 + _FAST_SAFETY)
        else:
            ints = np.concatenate([fast_rdp._log_a_int(np.full(len(part), float(q)), part)  # blocks that stay in cache
                                   for part in np.array_split(noise, -(-len(noise) // 128))])
            coarse = np.arange(_COARSE, GRID, _COARSE)
            exact = np.vstack([fast_rdp.rdp(np.full(len(coarse), float(q)), float(sigma) * GRID / coarse)
                               * (1.0 + _FAST_SAFETY), top])
            rows = np.minimum((ints / (fast_rdp._INT_ORDERS - 1.0))[:, _CEILING] * (1.0 + _FAST_SAFETY),
                              exact[(j - 1) // _COARSE])
        out[1:GRID] = np.maximum.accumulate(np.minimum(rows, top), axis=0)
        out[GRID] = top
    out.setflags(write=False)
    return out


def epsilons_from_rdp(rdp: np.ndarray, delta: float) -> np.ndarray:
    """ε per row of (n, orders) RDP: Opacus' conversion (``accountants.epsilon_from_rdp``) row by row, vectorised."""
    return fast_rdp._epsilon_from_rdp(np.atleast_2d(rdp), float(delta))


class IndividualAccountant:
    """The individual ε of a panel of samples of one model, as training goes.

    ``tiers`` (n,): each panel sample's tier; ``sample_rates``, ``noise_multipliers`` (K,): each tier's planned q_k
    and σ_k (``Plan.sample_rates``, ``Plan.noise_multipliers``); ``releases``: the plan's one-off releases
    (``Plan.release_noise_multipliers``: every sample spends them whole); ``run_accountant``: the run's accountant
    (the ε here are under RDP whatever it is). ``checkpoint(step, ratios)`` records the panel's ratios measured at
    ``step`` (after ``step`` steps); they hold from that step until the next checkpoint. Steps before the first
    checkpoint count at u = 1 (the tier's worst case)."""

    accountant = ACCOUNTANT

    def __init__(self, *, tiers, sample_rates, noise_multipliers, delta: float, releases=(),
                 run_accountant: str = ACCOUNTANT):
        self.tiers = np.asarray(tiers, dtype=np.int64)
        self.sample_rates = tuple(float(q) for q in sample_rates)
        self.noise_multipliers = tuple(float(s) for s in noise_multipliers)
        if len(self.sample_rates) != len(self.noise_multipliers) or not self.sample_rates:
            raise ValueError("one sample rate and one noise multiplier per tier")
        if self.tiers.ndim != 1 or (self.tiers.size and not 0 <= self.tiers.min() <= self.tiers.max()
                                    < len(self.sample_rates)):
            raise ValueError("tiers must be a 1-d array of tier indices")
        if not 0.0 < float(delta) < 1.0:
            raise ValueError(f"need 0 < δ < 1, got {delta!r}")
        self.delta = float(delta)
        self.releases = tuple(float(r) for r in releases)
        self.run_accountant = accountants.get_accountant(run_accountant).name
        self._grids = np.stack([ratio_grid_rdp(q, s) for q, s in zip(self.sample_rates, self.noise_multipliers)])
        self._release = np.asarray(accountants.releases_rdp(self.releases), dtype=np.float64)
        n = len(self.tiers)
        # the RDP composed so far, in two parts: steps at the tier's own step (u = 1) counted, the others summed per
        # order — a sample always at its bound then gets T times its tier's one-step RDP, the tier's own product
        self._top_steps = np.zeros(n, dtype=np.int64)
        self._rdp_below = np.zeros((n, self._grids.shape[2]))
        self._last_step, self._last_index = 0, np.full(n, GRID, dtype=np.int64)
        self.checkpoints: list[int] = []

    def checkpoint(self, step: int, ratios) -> None:
        """The panel's ratios (n,) measured after ``step`` steps; steps must not decrease."""
        step = int(step)
        if step < self._last_step:
            raise ValueError(f"checkpoint at step {step} after one at step {self._last_step}")
        index = grid_index(ratios)
        if index.shape != self._last_index.shape:
            raise ValueError(f"ratios must have one entry per panel sample ({len(self.tiers)}), got {index.shape}")
        self._top_steps, self._rdp_below = self._composed(step)
        self._last_step, self._last_index = step, index
        self.checkpoints.append(step)

    def _composed(self, step: int):
        """(steps at u = 1, RDP of the other steps) after ``step`` steps, the last checkpoint's ratios held since."""
        if step < self._last_step:
            raise ValueError(f"steps {step} is before the last checkpoint {self._last_step}")
        d = step - self._last_step
        top = self._last_index == GRID
        top_steps, below = self._top_steps + d * top, self._rdp_below
        if d and not top.all():
            below = below.copy()
            rows = np.flatnonzero(~top)
            below[rows] += d * self._grids[self.tiers[rows], self._last_index[rows]]
        return top_steps, below

    def rdp(self, steps: int) -> np.ndarray:
        """(n, orders) each panel sample's RDP after ``steps`` steps (≥ the last checkpoint)."""
        top_steps, below = self._composed(int(steps))
        return top_steps[:, None] * self._grids[self.tiers, GRID] + below + self._release

    def epsilons(self, steps: int) -> np.ndarray:
        """(n,) each panel sample's individual ε (under RDP) after ``steps`` steps."""
        if not len(self.tiers):
            return np.zeros(0)
        rdp = self.rdp(steps)
        eps = epsilons_from_rdp(rdp, self.delta)
        # no loss at any step and no release: the run's output never depended on the sample, ε = 0 (what the
        # accountants answer for no step; the conversion alone would give its floor, ~0.1 at δ = 1e-5)
        eps[~rdp.any(axis=1)] = 0.0
        return eps

    def tier_epsilons(self, steps: int) -> np.ndarray:
        """(K,) each tier's ε under RDP after ``steps`` steps: the run's RDP accountant's number, what a sample at its
        tier's bound at every step spends (the denominators of the share of the promise spent, at the planned T)."""
        acc = accountants.get_accountant(ACCOUNTANT)
        return np.array([acc.epsilon(q, s, int(steps), self.delta, self.releases)
                         for q, s in zip(self.sample_rates, self.noise_multipliers)])


# --- the per-group summary --------------------------------------------------------------------

@dataclass(frozen=True)
class GroupIndividualEpsilon:
    """One group's distribution of individual ε over its panel samples (quartiles), and of the share of the promise
    spent: each sample's individual ε over its tier's ε at the planned T, both under ``accountant``."""

    group: str
    n_samples: int
    epsilon_q1: float
    epsilon_median: float
    epsilon_q3: float
    share_q1: float
    share_median: float
    share_q3: float

    def to_dict(self) -> dict:
        return {"group": self.group, "n_samples": self.n_samples, "epsilon_q1": self.epsilon_q1,
                "epsilon_median": self.epsilon_median, "epsilon_q3": self.epsilon_q3, "share_q1": self.share_q1,
                "share_median": self.share_median, "share_q3": self.share_q3}

    @classmethod
    def from_dict(cls, d: dict) -> "GroupIndividualEpsilon":
        return cls(group=str(d["group"]), n_samples=int(d["n_samples"]),
                   **{k: float(d[k]) if d.get(k) is not None else math.nan
                      for k in ("epsilon_q1", "epsilon_median", "epsilon_q3", "share_q1", "share_median", "share_q3")})


@dataclass(frozen=True)
class IndividualEpsilonSummary:
    """The panel's individual ε per group after ``step`` steps, under ``accountant`` (always "rdp"; the run's own
    is ``run_accountant``), with the tiers' ε under the same accountant at the planned T (``tier_epsilons``), the
    panel size per group and the checkpoints the norms were measured at. ``note``: :data:`DATA_DEPENDENT_NOTE`."""

    step: int
    accountant: str
    run_accountant: str
    delta: float
    panel_per_group: int
    checkpoints: tuple
    tier_epsilons: tuple
    groups: tuple = field(default=())
    note: str = DATA_DEPENDENT_NOTE

    def to_dict(self) -> dict:
        return {"step": self.step, "accountant": self.accountant, "run_accountant": self.run_accountant,
                "delta": self.delta, "panel_per_group": self.panel_per_group, "checkpoints": list(self.checkpoints),
                "tier_epsilons": list(self.tier_epsilons), "groups": [g.to_dict() for g in self.groups],
                "note": self.note}

    @classmethod
    def from_dict(cls, d: dict) -> "IndividualEpsilonSummary":
        return cls(step=int(d["step"]), accountant=str(d["accountant"]), run_accountant=str(d["run_accountant"]),
                   delta=float(d["delta"]), panel_per_group=int(d["panel_per_group"]),
                   checkpoints=tuple(int(s) for s in d.get("checkpoints", ())),
                   tier_epsilons=tuple(float(e) for e in d.get("tier_epsilons", ())),
                   groups=tuple(GroupIndividualEpsilon.from_dict(g) for g in d.get("groups", ())),
                   note=str(d.get("note", DATA_DEPENDENT_NOTE)))

    def group(self, name: str) -> GroupIndividualEpsilon | None:
        return next((g for g in self.groups if g.group == name), None)


def summarize(accountant: IndividualAccountant, steps: int, planned_steps: int, groups, group_names, *,
              panel_per_group: int) -> IndividualEpsilonSummary:
    """The per-group summary of ``accountant``'s panel after ``steps`` steps: ``groups`` (n,) each panel sample's
    group index into ``group_names`` (a group without panel samples is left out); the share of the promise is each
    sample's ε over its tier's RDP ε at ``planned_steps`` (the plan's T)."""
    eps = accountant.epsilons(steps)
    tier_eps = accountant.tier_epsilons(planned_steps)
    promise = tier_eps[accountant.tiers]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(promise > 0, eps / promise, math.nan)
    groups = np.asarray(groups, dtype=np.int64)
    rows = []
    for g, name in enumerate(group_names):
        sel = groups == g
        if not sel.any():
            continue
        e1, e2, e3 = (float(v) for v in np.quantile(eps[sel], [0.25, 0.5, 0.75]))
        s1, s2, s3 = (float(v) for v in np.quantile(share[sel], [0.25, 0.5, 0.75]))
        rows.append(GroupIndividualEpsilon(group=str(name), n_samples=int(sel.sum()), epsilon_q1=e1,
                                           epsilon_median=e2, epsilon_q3=e3, share_q1=s1, share_median=s2,
                                           share_q3=s3))
    return IndividualEpsilonSummary(step=int(steps), accountant=accountant.accountant,
                                    run_accountant=accountant.run_accountant, delta=accountant.delta,
                                    panel_per_group=int(panel_per_group), checkpoints=tuple(accountant.checkpoints),
                                    tier_epsilons=tuple(float(e) for e in tier_eps), groups=tuple(rows))
