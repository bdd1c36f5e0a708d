"""Who pays and who leaks: each group's median individual ε (what a training run spent on it, under RDP:
``engine.dp.individual``) beside its PA-ALOOA GPR (what the audit measured it leaks), their rank correlation and the
one sentence that says whether the groups that pay most in ε are the ones that leak most (issue 62, point 3).

    individual_vs_gpr(gpr, individual)   IndividualVsGpr: per group both numbers, Spearman's ρ, its permutation p,
                                         the sentence; ``gpr``: group → GPR (an ``AlgorithmReport.gpr`` of Estimates
                                         or plain numbers), ``individual``: an ``IndividualEpsilonSummary`` of the
                                         same grouping (a run summary's ``individual_epsilon[grouping]``)

The individual ε comes from a training run of the audited algorithm and configuration, grouped as the audit groups
(class, tier or the attribute), matched by group name: the audit's own models are not measured (its stacked chunks
do not carry a panel yet). ρ over a handful of groups is weak evidence, so its p-value is exact (every permutation
of up to 8 groups; beyond, 20 000 seeded random ones) and the sentence claims a relation only at p < 0.05; two
groups have no rank correlation to speak of, the sentence then says whether one group tops both.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from engine.dp.individual import IndividualEpsilonSummary

ALPHA = 0.05  # a relation is claimed only with a permutation p below this
_EXACT_UP_TO = 8  # groups: every permutation (8! = 40 320)
_DRAWS = 20_000


@dataclass(frozen=True)
class IndividualVsGpr:
    groups: tuple[str, ...]  # the groups with both numbers, in the audit's order
    epsilon_median: tuple[float, ...]  # each group's median individual ε (under ``accountant``)
    gpr: tuple[float, ...]  # each group's GPR point estimate
    accountant: str
    spearman: float | None  # None: fewer than 3 groups, or a constant column
    p_value: float | None  # two-sided permutation p of ρ
    sentence: str

    def frame(self):
        """Tidy: one row per group (group, epsilon_median, gpr)."""
        import pandas as pd

        return pd.DataFrame({"group": list(self.groups), "epsilon_median": list(self.epsilon_median),
                             "gpr": list(self.gpr)})


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions), 1-based."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        tie = x == v
        ranks[tie] = ranks[tie].mean()
    return ranks


def spearman(a, b) -> float | None:
    """Spearman's rank correlation of ``a`` and ``b`` (None when either is constant or fewer than 3 values)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(np.corrcoef(_ranks(a), _ranks(b))[0, 1])


def permutation_p(a, b, rho: float, *, seed: int = 0) -> float:
    """Two-sided p of ``rho`` under exchangeability: the share of permutations of ``b`` whose |ρ| ≥ |rho|
    (every one up to 8 values, else ``_DRAWS`` seeded draws, the observed one counted)."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if len(rb) <= _EXACT_UP_TO:
        perms = np.array(list(itertools.permutations(rb)))
    else:
        rng = np.random.default_rng(seed)
        perms = np.vstack([rb, np.array([rng.permutation(rb) for _ in range(_DRAWS)])])
    ca = ra - ra.mean()
    cp = perms - perms.mean(axis=1, keepdims=True)
    rhos = cp @ ca / (np.linalg.norm(cp, axis=1) * np.linalg.norm(ca))
    return float(np.mean(np.abs(rhos) >= abs(rho) - 1e-12))


def _value(v) -> float:
    v = getattr(v, "value", v)
    return math.nan if v is None else float(v)


def individual_vs_gpr(gpr: dict, individual: IndividualEpsilonSummary | dict) -> IndividualVsGpr:
    """Per group present in both with finite numbers: median individual ε beside GPR, ρ, p, the sentence."""
    if isinstance(individual, dict):
        individual = IndividualEpsilonSummary.from_dict(individual)
    medians = {g.group: g.epsilon_median for g in individual.groups}
    groups, eps, leak = [], [], []
    for name, value in gpr.items():
        e, r = medians.get(str(name), math.nan), _value(value)
        if math.isfinite(e) and math.isfinite(r):
            groups.append(str(name))
            eps.append(float(e))
            leak.append(r)
    rho = spearman(eps, leak)
    p = None if rho is None else permutation_p(eps, leak, rho)
    return IndividualVsGpr(groups=tuple(groups), epsilon_median=tuple(eps), gpr=tuple(leak),
                           accountant=individual.accountant, spearman=rho, p_value=p,
                           sentence=sentence(groups, eps, leak, rho, p, individual.accountant))


def sentence(groups, eps, leak, rho, p, accountant: str = "rdp") -> str:
    """THE sentence: whether the groups that pay most in ε (median individual ε) are the ones that leak most (GPR)."""
    n = len(groups)
    if n < 2:
        return (f"Too few groups have both a median individual ε and a GPR ({n}) to say whether the groups that pay "
                "most in ε are the ones that leak most.")
    payer, leaker = groups[int(np.argmax(eps))], groups[int(np.argmax(leak))]
    top = (f"{payer} pays most in ε (median individual ε {max(eps):.3g} under {accountant.upper()}) and {leaker} "
           f"leaks most (GPR {max(leak):.3g})")
    if n == 2:
        same = "the same group" if payer == leaker else "not the same group"
        return f"With two groups, the one that pays most in ε is {same} as the one that leaks most: {top}."
    if rho is None:
        return (f"Over {n} groups the median individual ε or the GPR does not vary, so their ranks cannot say "
                f"whether the groups that pay most in ε are the ones that leak most; {top}.")
    stats = f"Spearman ρ = {rho:+.2f} over {n} groups, permutation p = {p:.2g}"
    if p < ALPHA and rho > 0:
        return f"The groups that pay most in ε are the ones that leak most ({stats}): {top}."
    if p < ALPHA:
        return f"The groups that pay most in ε are the ones that leak least ({stats}): {top}."
    return (f"The groups that pay most in ε are not clearly the ones that leak most ({stats}, no relation claimed "
            f"at p < {ALPHA:g}): {top}.")
