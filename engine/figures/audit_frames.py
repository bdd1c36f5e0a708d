"""Tidy frames of a privacy audit, and the one place that reads the audit's results dict.

The input is the results dict of :func:`engine.audit.runner.run_audit` (also the audit run's
``summary`` in the store; a running audit's partial summary works too). The figures
(:mod:`engine.figures.audit`) and the Audit page read it only through the functions here, so the
typed audit report (issue 7 §3) replaces this one module. Frames hold raw text (group and algorithm
names as they come); figures escape it.
"""
from __future__ import annotations

import math

import pandas as pd


def _algos(results: dict) -> list[dict]:
    return list(results.get("algorithms") or [])


def _nan(x):
    return float("nan") if x is None else float(x)


def _r(x, nd):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else round(float(x), nd)


# --- what the page and the figures ask of a results dict ----------------------------------------------

def algorithms(results: dict) -> pd.DataFrame:
    """One row per analysed algorithm: key (artifact name), name (engine algorithm), label, null floor."""
    rows = [{"key": a["key"], "name": a.get("name", ""), "label": a["label"], "null_floor": _nan(a.get("null_floor")),
             "formal_dp": a.get("formal_dp")} for a in _algos(results)]
    return pd.DataFrame(rows, columns=["key", "name", "label", "null_floor", "formal_dp"])


def has_results(results: dict | None) -> bool:
    """True once at least one algorithm has been analysed."""
    return bool(results and results.get("algorithms"))


def is_partial(results: dict) -> bool:
    """True while the audit is still training (some algorithms are not analysed yet)."""
    return bool(results.get("partial"))


def design(results: dict) -> dict:
    """The audit design the titles name: threshold, number of models, grouping."""
    return {"threshold": results.get("threshold", "in_sample"), "n_models": results.get("n_models"),
            "group_by": results.get("group_by", "group"),
            "group_attribute": (results.get("config") or {}).get("group_attribute")}


# --- frames ---------------------------------------------------------------------------------------------

def gpr_frame(results: dict) -> pd.DataFrame:
    rows = []
    for a in _algos(results):
        for g in results.get("group_names", []):
            r = a["gpr"]["groups"].get(g, {})
            rows.append({"algorithm": a["key"], "label": a["label"], "group": g,
                         "n": (results.get("group_sizes") or {}).get(g), "gpr": _nan(r.get("mean")),
                         "low": _nan(r.get("low")), "high": _nan(r.get("high")),
                         "null_floor": _nan(a.get("null_floor")), "threshold": results.get("threshold")})
    return pd.DataFrame(rows, columns=["algorithm", "label", "group", "n", "gpr", "low", "high", "null_floor",
                                       "threshold"])


def delta_frame(results: dict) -> pd.DataFrame:
    """One row per algorithm: Δ (pp) with its CI, accuracy, floor and the GPR of each group."""
    rows = []
    for a in _algos(results):
        d = a["gpr"]["delta"]
        row = {"algorithm": a["label"], "Δ (pp)": _r(d.get("value"), 2), "Δ CI low": _r(d.get("low"), 2),
               "Δ CI high": _r(d.get("high"), 2), "accuracy": _r(a["accuracy"]["mean"], 4),
               "null floor": _r(a.get("null_floor"), 4), "formal DP": "yes" if a.get("formal_dp") else "no"}
        for g in results.get("group_names", []):
            row[f"GPR {g}"] = _r(a["gpr"]["groups"].get(g, {}).get("mean"), 4)
        rows.append(row)
    return pd.DataFrame(rows)


def accuracy_frame(results: dict) -> pd.DataFrame:
    rows = []
    for a in _algos(results):
        acc = a["accuracy"]
        rows.append({"algorithm": a["key"], "label": a["label"], "group": "all", "accuracy": _nan(acc["mean"]),
                     "std": _nan(acc.get("std")), "min": _nan(acc.get("min")), "max": _nan(acc.get("max"))})
        for g, v in (acc.get("groups") or {}).items():
            rows.append({"algorithm": a["key"], "label": a["label"], "group": g, "accuracy": _nan(v),
                         "std": float("nan"), "min": float("nan"), "max": float("nan")})
    return pd.DataFrame(rows, columns=["algorithm", "label", "group", "accuracy", "std", "min", "max"])


def epsilon_frame(results: dict) -> pd.DataFrame:
    rows = []
    for a in _algos(results):
        for t in a["epsilon"]["tiers"]:
            rows.append({"algorithm": a["key"], "label": a["label"], "tier": t["name"], "claimed": _nan(t["claimed"]),
                         "target": _nan(t.get("target")), "lower_bound": _nan(t["lower_bound"]),
                         "tpr": _nan(t.get("tpr")), "fpr": _nan(t.get("fpr")), "formal_dp": a.get("formal_dp"),
                         "confidence": a["epsilon"].get("confidence")})
    return pd.DataFrame(rows, columns=["algorithm", "label", "tier", "claimed", "target", "lower_bound", "tpr", "fpr",
                                       "formal_dp", "confidence"])


def roc_frame(results: dict) -> pd.DataFrame:
    rows = []
    for a in _algos(results):
        lira = a.get("lira") or {}
        for g, roc in (lira.get("roc") or {}).items():
            summ = (lira.get("groups") or {}).get(g, {})
            for f, t in zip(roc["fpr"], roc["tpr"]):
                rows.append({"algorithm": a["key"], "label": a["label"], "group": g, "fpr": f, "tpr": t,
                             "auc": _nan(summ.get("auc")), "tpr_at_0.1%": _nan(summ.get("tpr_at_0.1%")),
                             "tpr_at_1%": _nan(summ.get("tpr_at_1%"))})
    return pd.DataFrame(rows, columns=["algorithm", "label", "group", "fpr", "tpr", "auc", "tpr_at_0.1%", "tpr_at_1%"])


def histogram_frame(results: dict) -> pd.DataFrame:
    rows = []
    sizes = results.get("group_sizes") or {}
    for a in _algos(results):
        h = a.get("histogram") or {}
        edges = h.get("edges") or []
        for g, counts in (h.get("counts") or {}).items():
            total = max(1, sum(counts))
            for k, c in enumerate(counts):
                rows.append({"algorithm": a["key"], "label": a["label"], "group": g, "bin_low": edges[k],
                             "bin_high": edges[k + 1], "count": int(c), "fraction": c / total,
                             "group_size": sizes.get(g)})
    return pd.DataFrame(rows, columns=["algorithm", "label", "group", "bin_low", "bin_high", "count", "fraction",
                                       "group_size"])


def baselines_frame(results: dict) -> pd.DataFrame:
    """PA-ALOOA's per-group GPR next to PA-GA, PA-GBA (per group) and PA-LOOA (per audited record)."""
    rows = []
    n_models = results.get("n_models")
    n = results.get("n_train")
    for a in _algos(results):
        b = a.get("baselines") or {}
        for g in results.get("group_names", []):
            rows.append({"algorithm": a["label"], "attack": "PA-ALOOA (per sample)", "target": f"group {g}",
                         "advantage": _r(a["gpr"]["groups"].get(g, {}).get("mean"), 4),
                         "models": n_models, "records covered": (results.get("group_sizes") or {}).get(g)})
        rows.append({"algorithm": a["label"], "attack": "PA-GA (one threshold per model)", "target": "all",
                     "advantage": _r(b.get("pa_ga"), 4), "models": n_models, "records covered": n})
        for g, v in (b.get("pa_gba") or {}).items():
            rows.append({"algorithm": a["label"], "attack": "PA-GBA (per model and group)", "target": f"group {g}",
                         "advantage": _r(v, 4), "models": n_models,
                         "records covered": (results.get("group_sizes") or {}).get(g)})
        for rec in b.get("pa_looa") or []:
            rows.append({"algorithm": a["label"], "attack": "PA-LOOA (one record)",
                         "target": f"record {rec['index']} ({rec['group']}); ALOOA {_r(rec['aloo_advantage'], 3)}",
                         "advantage": _r(rec["looa_advantage"], 4), "models": b.get("looa_models_per_record"),
                         "records covered": 1})
    return pd.DataFrame(rows, columns=["algorithm", "attack", "target", "advantage", "models", "records covered"])

