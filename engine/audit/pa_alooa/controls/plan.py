"""DP-SGD-S's two controls, planned (the package's head says what they are and why): the noise-matched plan
(:func:`noise_matched`), the accuracy-matched search (:func:`search_accuracy_match`), their keys and labels."""
from __future__ import annotations

import dataclasses
import math

from engine.audit.pa_alooa.records import ControlInfo
from engine.config.run import AlgorithmConfig, TiersConfig
from engine.config.schema import ConfigError
from engine.dp import accounting
from engine.dp.algorithms import WITH_CONTROLS
from engine.dp.prepare import PrivacyPlan

KINDS = ("noise_matched", "accuracy_matched")
KEYS = {"noise_matched": "dpsgd_noise_matched", "accuracy_matched": "dpsgd_accuracy_matched"}
LABELS = {"noise_matched": "DP-SGD (noise-matched)", "accuracy_matched": "DP-SGD (accuracy-matched)"}
CONTROLLED = WITH_CONTROLS[0]  # the algorithm the controls are of: DP-SGD-S (its registry entry, engine.dp.algorithms)
ALGORITHM = AlgorithmConfig(name=CONTROLLED.controls)  # what each control trains: DP-SGD (the entry's ``controls``)
PILOT_MODELS = 16  # models per accuracy evaluation of the search (at most 2R)
SEARCH_SPAN = 64.0  # the search looks for the crossing within [ε / span, ε] (or [ε, ε · span])
SEARCH_STEPS = 8  # bisection halvings in log ε after the bracket: the found ε is within span^(1/2^8) ≈ 1.6 %


def pilot_models(n_models: int) -> int:
    return int(min(PILOT_MODELS, n_models))


def max_pilot_runs() -> int:
    """Accuracy evaluations the search makes at most (the bracket's two ends and the halvings)."""
    return 2 + SEARCH_STEPS


def noise_matched(dpsgd: PrivacyPlan, realised: float, *, of: str) -> tuple[PrivacyPlan, ControlInfo]:
    """DP-SGD (``dpsgd``: DP-SGD's privacy at the audit's ε) at the noise multiplier ``realised``."""
    if not (math.isfinite(realised) and realised > 0):
        raise ConfigError("controls", f"DP-SGD-S realised no usable noise multiplier ({realised!r}); "
                                      "the noise-matched control needs one")
    plan = accounting.plan_at_noise(dpsgd.plan, realised)
    info = ControlInfo(kind="noise_matched", of=of, noise_multiplier=float(plan.noise_multiplier),
                       epsilon=float(plan.epsilons[0]), target_epsilon=float(min(dpsgd.plan.target_epsilons)),
                       realised_noise_multiplier=float(realised))
    return dataclasses.replace(dpsgd, plan=plan), info


def tiers_at(tiers: TiersConfig, epsilon: float) -> TiersConfig:
    """``tiers`` with every tier at ``epsilon`` (DP-SGD plans for the strictest tier anyway)."""
    return dataclasses.replace(tiers, tiers=tuple(dataclasses.replace(t, epsilon=float(epsilon)) for t in tiers.tiers))


def search_accuracy_match(accuracy_at, target: float, epsilon0: float, *, floor: float = 0.0,
                          span: float = SEARCH_SPAN, steps: int = SEARCH_STEPS):
    """The ε whose accuracy (``accuracy_at(ε)``, non-decreasing in ε up to noise) equals ``target``.

    Evaluates ``epsilon0`` (the audit's ε), brackets the crossing with ε0 / span (or ε0 · span; never below
    ``floor``), then halves the bracket in log ε ``steps`` times. Returns (ε, trace of (ε, accuracy) in the
    order tried, matched): the bracket end whose accuracy is closest to ``target``; matched False when the
    bracket held no crossing (the nearer end is returned)."""
    trace = []

    def at(e: float) -> float:
        a = float(accuracy_at(e))
        trace.append((float(e), a))
        return a

    a0 = at(epsilon0)
    if a0 == target:
        return float(epsilon0), tuple(trace), True
    if a0 > target:  # DP-SGD is more accurate at ε0: the match is at a smaller ε
        hi, a_hi = epsilon0, a0
        lo = max(epsilon0 / span, floor)
        a_lo = at(lo)
        if a_lo > target:  # still more accurate at the bracket's end: no crossing, the nearer end
            return float(lo if abs(a_lo - target) <= abs(a_hi - target) else hi), tuple(trace), False
    else:
        lo, a_lo = epsilon0, a0
        hi = epsilon0 * span
        a_hi = at(hi)
        if a_hi < target:
            return float(hi if abs(a_hi - target) <= abs(a_lo - target) else lo), tuple(trace), False
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        a = at(mid)
        if a >= target:
            hi, a_hi = mid, a
        else:
            lo, a_lo = mid, a
    best = lo if abs(a_lo - target) < abs(a_hi - target) else hi
    return float(best), tuple(trace), True


def accuracy_matched_info(privacy: PrivacyPlan, *, of: str, target_epsilon: float, target_accuracy: float,
                          trace, matched: bool, pilot: int) -> ControlInfo:
    return ControlInfo(kind="accuracy_matched", of=of, noise_multiplier=float(privacy.plan.noise_multiplier),
                       epsilon=float(privacy.plan.epsilons[0]), target_epsilon=float(target_epsilon),
                       target_accuracy=float(target_accuracy), search=tuple(tuple(p) for p in trace),
                       matched=bool(matched), pilot_models=int(pilot))
