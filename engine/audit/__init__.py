"""Membership-inference audit (PA-ALOOA statistics, baselines, LiRA, empirical ε).

    config.py    AuditConfig: the RunConfig its models train with (``run``) plus the audit's own fields
    design.py    membership design: complementary halves' groups, PA-LOOA targets, seeds, chunk layout
    setup.py     everything fixed before the first model: data, groups, membership, per-algorithm plans, chunk size;
                 the preview before launch
    runner.py    chunk training, checkpoints / resume, progress, DP-SGD-S's control runs, ``python -m engine audit``
    executor.py  train_chunk (one chunk of stacked models) and the local chunk executor (engine.jobs.ray_backend: Ray's)
    analysis.py  the report computed from the models' scores and the membership
    report.py    AuditReport / AlgorithmReport / PairedComparison / ControlInfo (typed, to_dict / from_dict)
    summary.py   the report as CLI text: the table, ``--json``'s headline numbers, the verdict under them
    controls.py  DP-SGD-S's noise-matched and accuracy-matched DP-SGD controls (planned while the audit runs)
    compare.py   paired comparisons of two algorithms on the shared splits (paired bootstrap, paired accuracy)
    verdict.py   the answer in words: DP-SGD-S vs DP-SGD and its controls, levelling up per group
    frames.py    the report's tidy pandas frames (what the figures draw)
    stats/       the statistics themselves, by concern: thresholds (the sorted searches), advantage (the design,
                 advantage, GPR, bootstrap, null floor / null Δ), baselines (PA-GA/GBA/LOOA, LiRA, ROC), epsilon
    presets.py   named audits (quick, quick-eps1, adult-paper, mnist-paper)
    estimate.py  the runtime estimate before launch (model-steps × a measured per-model-step cost)

  one_run/      the one-run audit (per-tier empirical ε from one training run per algorithm, Steinke et al. 2023),
                a package of its own that imports nothing of the PA-ALOOA modules above (engine.audit.one_run)

Layer 7 of data → config → store → models → dp → train → audit → jobs → figures → tools → cli:
may import engine.train, engine.dp and everything below them.
"""

from .stats import (auc, bootstrap_gpr, complementary_membership, delta_resolved, epsilon_lower_bound, gpr_delta,
                    group_privacy_risk, lira_by_group, lira_scores, logit_confidence, null_distribution, null_floor,
                    pa_ga, pa_gba, pa_looa, per_group_epsilon_lower_bound, roc_curve_points, sample_advantage,
                    tpr_at_fpr)

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
    "delta_resolved",
    "null_distribution",
    "null_floor",
    "pa_ga",
    "pa_gba",
    "pa_looa",
    "per_group_epsilon_lower_bound",
    "roc_curve_points",
    "sample_advantage",
    "tpr_at_fpr",
]
