"""Membership-audit statistics (numpy / scipy; torch only for the in-place cumulative sums, see _best_run_end),
in five modules by concern:

    inputs.py      the checked (scores, membership) pair, the groups, the models' halves (the design's pairs whole)
    thresholds.py  each sample's scores sorted once, the in-sample and held-out best rules
    advantage.py   per-sample advantage, GPR and its bootstrap, Δ bias-corrected, the null floor and null Δ
    baselines.py   PA-GA, PA-GBA, PA-LOOA, LiRA, ROC / AUC / TPR at low FPR
    epsilon.py     empirical ε lower bounds (Clopper-Pearson), overall and per group


Conventions used throughout
---------------------------
* ``scores`` and ``membership`` are ``(n_models, n_samples)`` arrays.  A score is
  "member-like" when high (e.g. ``score = -loss``).  ``membership[m, i]`` is
  True when sample ``i`` was in the training set of model ``m``.
* The attack family is the one-sided threshold rule "member if score >= t".
  Only thresholds that separate *distinct* score values are considered, so
  tied scores are always classified together.
* PA-ALOOA design (``engine.audit.pa_alooa.design.complementary_membership``): rows
  ``2r`` and ``2r+1`` are complementary random halves of the data, so every sample is
  a member of exactly ``R`` of the ``2R`` models.  Functions that split models in two
  (``threshold="held_out"``, the null's permutations, :func:`per_group_epsilon_lower_bound`)
  take the design's ``pairs=R`` and split whole pairs, which stratifies every sample
  (each half holds the same number of members and non-members for it); the audit hands
  R down, and a matrix that does not match it is refused.  ``pairs=None`` (a bare matrix
  from elsewhere) reads the pairs off its rows.

Implementation: the threshold searches sort each sample's scores once (``_Sorted``) and reuse that order
for both held-out halves and for every permutation of the null (a subset's best rule is found on the full
order), with exact integer objectives, so the numbers are those of one sort per half and per permutation;
the random draws are the same calls, in the same order, as in the straightforward implementation.

Threads: the loops over blocks of rows (the sorts, the threshold searches, LiRA, the ROC's pieces) run on
:func:`set_threads` threads (:mod:`engine.audit.pa_alooa.parallel`). Each block writes only its own rows, and whatever
is summed over blocks is summed in block order afterwards, so every number is the same for any number of
threads (a test checks 1 against 3).
"""

from __future__ import annotations

from engine.audit.pa_alooa.parallel import set_threads
from engine.audit.pa_alooa.stats.advantage import (DELTA_METHOD, DELTA_METHOD_BEFORE, DELTA_METHOD_SHORT,
                                                   bias_corrected, bootstrap_gpr,
                                                   delta_resolved, gpr_delta, group_privacy_risk, null_distribution,
                                                   null_floor, sample_advantage)
from engine.audit.pa_alooa.stats.baselines import (auc, lira_by_group, lira_scores, logit_confidence, pa_ga, pa_gba, pa_looa,
                                          roc_curve_points, roc_summary, tpr_at_fpr)
from engine.audit.pa_alooa.stats.epsilon import epsilon_lower_bound, per_group_epsilon_lower_bound

__all__ = [
    "sample_advantage",
    "group_privacy_risk",
    "gpr_delta",
    "bootstrap_gpr",
    "bias_corrected",
    "DELTA_METHOD",
    "DELTA_METHOD_SHORT",
    "DELTA_METHOD_BEFORE",
    "null_floor",
    "null_distribution",
    "delta_resolved",
    "pa_ga",
    "pa_gba",
    "pa_looa",
    "logit_confidence",
    "lira_scores",
    "roc_curve_points",
    "roc_summary",
    "auc",
    "tpr_at_fpr",
    "lira_by_group",
    "epsilon_lower_bound",
    "per_group_epsilon_lower_bound",
    "set_threads",
]
