"""Named one-run audit studies (the Audit page's one-run presets): each is a set of one-run audits launched together
as one comparison, one per setting, with the question it asks in words.

    collusion   Does my tier's risk depend on the others' budgets? (Kaiser et al., SaTML 2026: under sampling-based
                individualized DP one person's risk depends on the other people's budgets, every formal ε holding.)
                The paper's class tiers under IDP-SGD (SAMPLE): the ε = 1 tier (digits 2, 5, 9) fixed, the other two
                tiers' (3, 7, 8 and 0, 1, 4, 6) budgets varied over four settings — equal (1, 1), the paper's (2, 3),
                looser (3, 6), loosest (4, 8) — on the shipped digits set, white-box gradient canaries. The planner
                keeps the fixed tier at ε = 1 in each (its rate falls as the shared σ falls); each audit's ε̂ of the
                fixed tier says whether its empirical risk moved. ``experiments/collusion.py`` runs the same study
                on MNIST with PA-ALOOA beside it; the sentence is ``engine.figures.experiments.collusion_sentence``.

Each study's configs are validated :class:`~engine.audit.one_run.config.OneRunConfig` s whose ``name`` says the
study and the setting (:func:`study_setting` reads them back, so a stored audit knows which study it belongs to).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.audit.one_run.config import DEFAULT_ONE_RUN, OneRunConfig
from engine.audit.one_run.report import OneRunReport
from engine.config.run import AlgorithmConfig, TierConfig, TiersConfig
from engine.config.schema import ConfigError

SEPARATOR = " · "  # a study config's name: "<study> · <setting>"


@dataclass(frozen=True)
class OneRunStudy:
    """One study: its name, its question, the tier it watches, and one validated config per setting."""

    name: str
    question: str  # what it asks, in one line (the page's caption)
    watched_tier: str  # the tier whose ε̂ the sentence follows across the settings
    settings: tuple[tuple[str, tuple[float, ...]], ...]  # (setting, the other tiers' ε) in launch order
    configs: tuple[OneRunConfig, ...]  # one per setting, named "<study> · <setting>"


# The paper's class tiers (MNIST's and digits' ten classes): the fixed ε = 1 tier and the two whose budgets vary.
COLLUSION_FIXED = TierConfig(epsilon=1.0, classes=(2, 5, 9), name="ε=1")
COLLUSION_OTHERS = ((3, 7, 8), (0, 1, 4, 6))
COLLUSION_SETTINGS = (("equal", (1.0, 1.0)), ("paper", (2.0, 3.0)), ("looser", (3.0, 6.0)), ("loosest", (4.0, 8.0)))
COLLUSION_QUESTION = ("Does my tier's risk depend on the others' budgets? The ε = 1 tier (digits 2, 5, 9) stays fixed "
                      "while the other two tiers' budgets grow over four settings; one one-run audit of IDP-SGD "
                      "(SAMPLE) per setting measures the fixed tier's ε̂ (Kaiser et al., SaTML 2026).")


def collusion_tiers(epsilons) -> TiersConfig:
    """The tiers of one collusion setting: the fixed ε = 1 tier, then each other tier at its budget."""
    others = tuple(TierConfig(epsilon=float(e), classes=c, name=f"{','.join(map(str, c))} at ε={e:g}")
                   for c, e in zip(COLLUSION_OTHERS, epsilons))
    return TiersConfig(assign="class", tiers=(COLLUSION_FIXED, *others))


def collusion_study(run=DEFAULT_ONE_RUN, *, canaries: int = 500) -> OneRunStudy:
    """The collusion study on ``run`` (default: the one-run form's, digits): one validated config per setting."""
    configs = tuple(OneRunConfig(run=run.replace(tiers=collusion_tiers(eps)),
                                 algorithms=(AlgorithmConfig(name="idp_sample"),), canaries=canaries,
                                 input_canaries=0, name=f"collusion{SEPARATOR}{setting}").validate()
                    for setting, eps in COLLUSION_SETTINGS)
    return OneRunStudy("collusion", COLLUSION_QUESTION, COLLUSION_FIXED.name, COLLUSION_SETTINGS, configs)


PRESETS: dict[str, OneRunStudy] = {"collusion": collusion_study()}


def preset(name: str) -> OneRunStudy:
    """The named study; ConfigError ``preset`` naming the known ones otherwise."""
    if name not in PRESETS:
        raise ConfigError("preset", f"unknown one-run preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]


def study_setting(config: OneRunConfig) -> tuple[OneRunStudy, str] | None:
    """(the study, the setting) a one-run audit was launched for, from its name; None for any other audit."""
    study, _, setting = (config.name or "").partition(SEPARATOR)
    found = PRESETS.get(study)
    return (found, setting) if found is not None and setting in dict(found.settings) else None


def _finite(x) -> float:
    return float(x) if x is not None and math.isfinite(float(x)) else float("nan")


def study_rows(study: OneRunStudy, reports: dict[str, OneRunReport]) -> list[dict]:
    """The watched tier per finished setting (``reports``: setting → its audit's report), in the study's order: the
    rows of ``engine.figures.experiments.COLLUSION_COLUMNS`` a one-run audit gives (its white-box ε̂ by both bounds,
    its claimed ε, the accuracy; no GPR: that is the PA-ALOOA half of ``experiments/collusion.py``)."""
    rows = []
    for setting, others in study.settings:
        report = reports.get(setting)
        if report is None or report.partial or not report.algorithms:
            continue
        algo = report.algorithms[0]
        tier = next((t for t in algo.tiers if t.tier == study.watched_tier), None)
        if tier is None or tier.white is None:
            continue
        rows.append({"setting": setting, "others": ", ".join(f"{e:g}" for e in others), "tier": tier.tier,
                     "epsilon": _finite(tier.epsilon), "sample_rate": float("nan"), "noise_multiplier": float("nan"),
                     "epsilon_hat": _finite(tier.white.epsilon_hat),
                     "epsilon_hat_fdp": _finite(tier.white_fdp.epsilon_hat if tier.white_fdp else None),
                     "gpr": float("nan"), "gpr_low": float("nan"), "gpr_high": float("nan"),
                     "null_floor": float("nan"), "accuracy": _finite(algo.accuracy)})
    return rows
