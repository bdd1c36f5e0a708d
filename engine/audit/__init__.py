"""Membership-inference audit (PA-ALOOA statistics, baselines, LiRA, empirical ε).

    config.py    AuditConfig: the RunConfig its models train with (``run``) plus the audit's own fields
    design.py    membership design: complementary halves' groups, PA-LOOA targets, seeds, chunk layout
    runner.py    preparation, chunk training, checkpoints / resume, progress, ``python -m engine audit``
    analysis.py  the report computed from the models' scores and the membership
    report.py    AuditReport / AlgorithmReport (typed, to_dict / from_dict for the store) and CLI summaries
    frames.py    the report's tidy pandas frames (what the figures draw)
    stats.py     the statistics themselves (advantage, GPR, bootstrap, null floor, LiRA, ε lower bounds)
"""

from .stats import (
    auc,
    bootstrap_gpr,
    complementary_membership,
    epsilon_lower_bound,
    gpr_delta,
    group_privacy_risk,
    lira_by_group,
    lira_scores,
    logit_confidence,
    null_floor,
    pa_ga,
    pa_gba,
    pa_looa,
    per_group_epsilon_lower_bound,
    roc_curve_points,
    sample_advantage,
    tpr_at_fpr,
)

__all__ = [
    "auc",
    "bootstrap_gpr",
    "complementary_membership",
    "epsilon_lower_bound",
    "gpr_delta",
    "group_privacy_risk",
    "lira_by_group",
    "lira_scores",
    "logit_confidence",
    "null_floor",
    "pa_ga",
    "pa_gba",
    "pa_looa",
    "per_group_epsilon_lower_bound",
    "roc_curve_points",
    "sample_advantage",
    "tpr_at_fpr",
]
