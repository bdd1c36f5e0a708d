"""An audit's report computed from its models' scores and the membership design (``engine.audit.pa_alooa.stats``
does the statistics): GPR per group with bootstrap CIs, Δ bias-corrected with its CI (``stats.DELTA_METHOD``; the
plug-in max − min beside it), each group's null floor and the null Δ
spread (permuted membership) with the "resolved" flag, PA-GA / PA-GBA, accuracy, LiRA per group, the
per-tier empirical ε lower bound and the advantage histograms.

The membership score (``AuditConfig.score``) is float64: the logit-scaled confidence of the true class
log p_y − log(1 − p_y) (default; LiRA's score) or −loss."""
from __future__ import annotations

import dataclasses

import numpy as np

from engine.audit.pa_alooa import stats
from engine.audit.pa_alooa.parallel import beside
from engine.audit.pa_alooa.controls import compare
from engine.audit.pa_alooa.design import group_sizes
from engine.audit.pa_alooa.report import AlgorithmReport, AuditReport, json_clean
from engine.train.records import PlanRecord

_HIST_BINS = 40
_ROC_POINTS = 160


def plan_table(setup, a):
    """Per tier: the plan's sample rate, clip, noise multiplier σ_k, noise std and ε (ε None when the algorithm has
    no formal guarantee). σ_k is the run records' (``PlanRecord.noise_multipliers``): SCALE's σ*·C/C_k per tier,
    DP-SGD-S's z_Δ, the shared σ* otherwise — what the Train page shows for the same plan."""
    if a.plan is None:
        return None
    p = a.plan
    sigma = PlanRecord.from_privacy(a.privacy, setup.tiers, steps=setup.steps).noise_multipliers
    return [{"tier": setup.tiers.names[k], "sample_rate": float(p.sample_rates[k]), "clip_norm": float(p.clip_norms[k]),
             "noise_multiplier": float(sigma[k]), "noise_std": float(p.noise_std),
             "epsilon": float(p.epsilons[k]) if a.formal_dp else None, "target_epsilon": float(p.target_epsilons[k])}
            for k in range(len(p.sample_rates))]


def empty_report(setup) -> AuditReport:
    """The audit's report before any algorithm is done: what the design fixes."""
    cfg = setup.config
    return AuditReport(config=cfg.to_dict(), dataset=cfg.run.data.name, n_train=setup.n, R=cfg.R,
                       n_models=setup.n_models, steps_per_model=setup.steps, threshold=cfg.threshold,
                       group_by=cfg.group_by, group_names=tuple(setup.group_names),
                       group_sizes=group_sizes(setup.groups, setup.group_names), tier_names=tuple(setup.tiers.names),
                       tier_sizes=tuple(int(s) for s in setup.tiers.sizes), device=str(setup.device),
                       chunk_models=setup.chunk_models, score=cfg.score)


def membership_scores(score: str, losses, confs) -> np.ndarray:
    """The audit's per-sample scores (high = member-like), float64: ``confs`` or ``−losses``."""
    return np.asarray(confs if score == "logit_confidence" else -np.asarray(losses), dtype=np.float64)


def correct_predictions(setup, preds) -> np.ndarray:
    """(models, test samples) bool: each model's test prediction equals the label. Its row means are the models'
    test accuracies (the report's, the paired accuracy differences', the accuracy-matched search's)."""
    return np.asarray(preds) == setup.dataset.y_test.numpy()[None, :]


def algorithm_report(setup, a, losses, confs, preds, *, realised_noise=None) -> tuple[AlgorithmReport, np.ndarray]:
    """One algorithm's statistics from its models' per-sample losses / confidences on the training set
    and their test predictions (and, DP-SGD-S, each model's realised noise multiplier); returns the report and
    the per-sample advantage (float64)."""
    cfg = setup.config
    run = cfg.run
    mem = setup.membership
    scores = membership_scores(cfg.score, losses, confs)
    groups = setup.groups
    pairs = cfg.R  # the design's complementary pairs, handed to every statistic that splits the models
    tier_lab = np.asarray(setup.tiers.train)

    def beside_the_advantage():  # what does not need the per-sample advantage: on a helper thread meanwhile
        lira = stats.lira_scores(confs.astype(np.float64), mem)  # LiRA (online, fixed variance), logit confidence
        by_group = stats.lira_by_group(lira, mem, groups, roc_points=_ROC_POINTS)
        # per-tier empirical ε lower bound (threshold attack on the scores, selection and counting on disjoint models)
        lb = stats.per_group_epsilon_lower_bound(scores, mem, tier_lab, delta=run.delta, confidence=cfg.confidence,
                                                 seed=run.seed, pairs=pairs)
        return by_group, lb, {"pa_ga": stats.pa_ga(scores, mem), "pa_gba": stats.pa_gba(scores, mem, groups)}

    def the_advantage():
        adv = stats.sample_advantage(scores, mem, threshold=cfg.threshold, seed=run.seed, pairs=pairs)
        boot = stats.bootstrap_gpr(adv, groups, n_boot=cfg.n_boot, ci=cfg.confidence, seed=run.seed)
        null = stats.null_distribution(scores, mem, groups, threshold=cfg.threshold, n_perm=cfg.null_perms,
                                       ci=cfg.confidence, seed=run.seed + 1, pairs=pairs)
        return adv, boot, null

    (adv, boot, null), (by_group, lb, baselines) = beside(beside_the_advantage, the_advantage)
    res = {"key": a.key, "name": a.algo.name, "label": a.label, "formal_dp": a.formal_dp,
           "algorithm": dataclasses.asdict(a.algo), "plan": plan_table(setup, a),
           "info": {**a.info, **({} if a.formal_dp else {"formal_dp_reason": a.privacy.formal_dp_reason})},
           "gpr": boot, "null_floor": null["floor"], "advantage_mean": float(np.nanmean(adv)),
           "null": {"groups": null["groups"], "delta": null["delta"], "n_perm": null["n_perm"]},
           "resolved": stats.delta_resolved(boot["delta"]["low"], null["delta"]["high"])
           if len(setup.group_names) > 1 else None,  # one group: no Δ to resolve
           "baselines": baselines}
    # accuracy on the test set, per model
    correct = correct_predictions(setup, preds)
    acc = correct.mean(1)
    acc_groups = {}
    if setup.test_groups is not None:
        for g in setup.group_names:
            sel = setup.test_groups == g
            if sel.any():
                acc_groups[g] = float(correct[:, sel].mean())
    res["accuracy"] = {"mean": float(acc.mean()), "std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                       "min": float(acc.min()), "max": float(acc.max()), "groups": acc_groups}
    ci = compare.accuracy_interval(acc, ci=cfg.confidence)
    res["accuracy_ci"] = {"value": ci.value, "low": ci.low, "high": ci.high}
    if realised_noise is not None:  # DP-SGD-S: its noise against DP-SGD's at the same ε
        res["realised_noise_multiplier"] = float(np.mean(realised_noise))
        res["dpsgd_noise_multiplier"] = a.info.get("dpsgd_noise_multiplier")
    if getattr(a, "control_info", None) is not None:
        res["control"] = a.control_info.to_dict()
    lira_groups = {g: {k: by_group[g][k] for k in ("auc", "tpr_at_0.1%", "tpr_at_1%")} for g in setup.group_names}
    rocs = {g: by_group[g]["roc"] for g in setup.group_names}
    res["lira"] = {"groups": lira_groups, "roc": rocs}
    tiers = []
    for k, name in enumerate(setup.tiers.names):
        r = lb.get(k, {})
        tiers.append({"name": name, "claimed": a.claimed[k] if a.formal_dp else None,
                      "target": float(setup.tiers.epsilons[k]),
                      "lower_bound": r.get("epsilon_lb"), "tpr": r.get("tpr"), "fpr": r.get("fpr"),
                      "tp": r.get("tp"), "fn": r.get("fn"), "fp": r.get("fp"), "tn": r.get("tn")})
    res["epsilon"] = {"tiers": tiers, "confidence": cfg.confidence, "delta": run.delta}
    # per-sample advantage histogram per group
    lo = min(0.0, float(np.nanmin(adv))) if np.isfinite(adv).any() else 0.0
    edges = np.linspace(lo, 1.0, _HIST_BINS + 1)
    res["histogram"] = {"edges": edges.tolist(), "counts": {
        g: np.histogram(adv[(groups == g) & np.isfinite(adv)], bins=edges)[0].tolist() for g in setup.group_names}}
    return AlgorithmReport.from_dict(json_clean(res)), np.asarray(adv, dtype=np.float64)
