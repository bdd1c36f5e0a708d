"""Statistics of an audit from its scores and membership, and the summaries read from the results."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from engine.audit import stats
from engine.audit.design import group_sizes

RESULTS_VERSION = 1
_HIST_BINS = 40
_ROC_POINTS = 160


def plan_table(setup, a):
    if a.plan is None:
        return None
    p = a.plan
    return [{"tier": setup.tiers.names[k], "sample_rate": float(p.sample_rates[k]), "clip_norm": float(p.clip_norms[k]),
             "noise_multiplier": float(p.noise_multiplier), "noise_std": float(p.noise_std),
             "epsilon": float(p.epsilons[k]), "target_epsilon": float(p.target_epsilons[k])}
            for k in range(len(p.sample_rates))]


def results_header(setup) -> dict:
    cfg = setup.config
    return {"kind": "audit", "version": RESULTS_VERSION, "config": cfg.to_dict(), "dataset": cfg.run.data.name,
            "n_train": setup.n, "R": cfg.R, "n_models": setup.n_models, "steps_per_model": setup.steps,
            "threshold": cfg.threshold, "group_by": cfg.group_by, "group_names": list(setup.group_names),
            "group_sizes": group_sizes(setup.groups, setup.group_names), "tier_names": list(setup.tiers.names),
            "tier_sizes": list(setup.tiers.sizes), "device": str(setup.device), "chunk_models": setup.chunk_models,
            "algorithms": []}


def algorithm_statistics(setup, a, losses, confs, preds) -> dict:
    cfg = setup.config
    run = cfg.run
    mem = setup.membership
    scores = -losses.astype(np.float64)
    groups = setup.groups
    adv = stats.sample_advantage(scores, mem, threshold=cfg.threshold, seed=run.seed)
    boot = stats.bootstrap_gpr(adv, groups, n_boot=cfg.n_boot, ci=cfg.confidence, seed=run.seed)
    floor = stats.null_floor(scores, mem, threshold=cfg.threshold, n_perm=cfg.null_perms, seed=run.seed + 1)
    res = {"key": a.key, "name": a.algo.name, "label": a.label, "formal_dp": a.formal_dp,
           "algorithm": dataclasses.asdict(a.algo), "plan": plan_table(setup, a), "info": a.info,
           "gpr": boot, "null_floor": floor, "advantage_mean": float(np.nanmean(adv)),
           "baselines": {"pa_ga": stats.pa_ga(scores, mem), "pa_gba": stats.pa_gba(scores, mem, groups)}}
    # accuracy on the test set, per model
    yt = setup.dataset.y_test.numpy()
    correct = preds == yt[None, :]
    acc = correct.mean(1)
    acc_groups = {}
    if setup.test_groups is not None:
        for g in setup.group_names:
            sel = setup.test_groups == g
            if sel.any():
                acc_groups[g] = float(correct[:, sel].mean())
    res["accuracy"] = {"mean": float(acc.mean()), "std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                       "min": float(acc.min()), "max": float(acc.max()), "groups": acc_groups}
    # LiRA (online, fixed variance) on logit-scaled confidence
    lira = stats.lira_scores(confs.astype(np.float64), mem)
    lira_groups, rocs = {}, {}
    for g in setup.group_names:
        sel = groups == g
        fpr, tpr = stats.roc_curve_points(lira[:, sel], mem[:, sel])
        lira_groups[g] = {"auc": stats.auc(fpr, tpr), "tpr_at_0.1%": stats.tpr_at_fpr(fpr, tpr, 0.001),
                          "tpr_at_1%": stats.tpr_at_fpr(fpr, tpr, 0.01)}
        rocs[g] = _thin_roc(fpr, tpr)
    res["lira"] = {"groups": lira_groups, "roc": rocs}
    # per-tier empirical ε lower bound (threshold attack on −loss, selection and counting on disjoint models)
    tier_lab = np.asarray(setup.tiers.train)
    lb = stats.per_group_epsilon_lower_bound(scores, mem, tier_lab, delta=run.delta, confidence=cfg.confidence,
                                             seed=run.seed)
    tiers = []
    for k, name in enumerate(setup.tiers.names):
        r = lb.get(k, {})
        tiers.append({"name": name, "claimed": a.claimed[k], "target": float(setup.tiers.epsilons[k]),
                      "lower_bound": r.get("epsilon_lb"), "tpr": r.get("tpr"), "fpr": r.get("fpr"),
                      "tp": r.get("tp"), "fn": r.get("fn"), "fp": r.get("fp"), "tn": r.get("tn")})
    res["epsilon"] = {"tiers": tiers, "confidence": cfg.confidence, "delta": run.delta}
    # per-sample advantage histogram per group
    lo = min(0.0, float(np.nanmin(adv))) if np.isfinite(adv).any() else 0.0
    edges = np.linspace(lo, 1.0, _HIST_BINS + 1)
    res["histogram"] = {"edges": edges.tolist(), "counts": {
        g: np.histogram(adv[(groups == g) & np.isfinite(adv)], bins=edges)[0].tolist() for g in setup.group_names}}
    res["_advantage"] = adv.astype(np.float32)
    return res


def _thin_roc(fpr, tpr, points: int = _ROC_POINTS) -> dict:
    """The ROC's upper envelope on a log-spaced FPR grid (for log-log plots), plus (1, 1)."""
    grid = np.unique(np.concatenate([np.logspace(-5, 0, points), [1.0]]))
    pos = np.searchsorted(fpr, grid, side="right") - 1
    t = np.maximum.accumulate(tpr)[np.clip(pos, 0, None)]
    keep = grid >= max(float(fpr[fpr > 0].min()) if np.any(fpr > 0) else 1.0, 1e-5) / 2
    return {"fpr": grid[keep].tolist(), "tpr": t[keep].tolist()}


def json_clean(x):
    """JSON-safe: numpy scalars → Python, NaN/±inf → None, keys → str."""
    if isinstance(x, dict):
        return {str(k): json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return json_clean(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def compact_summary(results: dict) -> dict:
    """The headline numbers of an audit (what ``--json`` prints)."""
    out = {k: results.get(k) for k in ("dataset", "n_train", "R", "n_models", "threshold", "group_by", "seconds",
                                       "train_seconds", "stats_seconds")}
    algos = []
    for r in results.get("algorithms", []):
        g = r["gpr"]
        algos.append({
            "key": r["key"], "label": r["label"], "formal_dp": r["formal_dp"],
            "accuracy": r["accuracy"]["mean"],
            "gpr": {k: v["mean"] for k, v in g["groups"].items()},
            "gpr_ci": {k: [v["low"], v["high"]] for k, v in g["groups"].items()},
            "delta_pp": g["delta"]["value"], "delta_ci": [g["delta"]["low"], g["delta"]["high"]],
            "null_floor": r["null_floor"], "pa_ga": r["baselines"]["pa_ga"],
            "lira_auc": {k: v["auc"] for k, v in r["lira"]["groups"].items()},
            "epsilon": [{"tier": t["name"], "claimed": t["claimed"], "lower_bound": t["lower_bound"]}
                        for t in r["epsilon"]["tiers"]],
        })
    out["algorithms"] = algos
    return out


def summary_table(results: dict) -> str:
    groups = results["group_names"]
    lines = [f"PA-ALOOA on {results['dataset']} (n={results['n_train']}, 2R={results['n_models']} models per "
             f"algorithm, threshold {results['threshold']}, groups by {results['group_by']})"]
    head = f"{'algorithm':<22} {'acc':>6} " + " ".join(f"{('GPR ' + g)[:14]:>14}" for g in groups) + \
        f" {'Δ pp [CI]':>20} {'floor':>6} {'ε LB / claimed':>18}"
    lines.append(head)
    for r in results["algorithms"]:
        gp = r["gpr"]["groups"]
        d = r["gpr"]["delta"]
        eps = ", ".join(f"{_f(t['lower_bound'], '.2f')}/{_f(t['claimed'], '.2f')}" for t in r["epsilon"]["tiers"])
        lines.append(f"{r['label'][:22]:<22} {r['accuracy']['mean']:>6.3f} "
                     + " ".join(f"{_f(gp[g]['mean'], '.4f'):>14}" for g in groups)
                     + f" {_f(d['value'], '.2f')} [{_f(d['low'], '.2f')}, {_f(d['high'], '.2f')}]".rjust(21)
                     + f" {_f(r['null_floor'], '.3f'):>6} {eps:>18}")
    lines.append(f"{results['seconds']:.1f} s ({results['train_seconds']:.1f} s training, "
                 f"{results['stats_seconds']:.1f} s statistics)")
    return "\n".join(lines)


def _f(x, spec):
    return "—" if x is None else format(x, spec)
