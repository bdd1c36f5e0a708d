"""Tidy pandas frames of an :class:`~engine.audit.pa_alooa.report.AuditReport` (one row per algorithm × group,
tier, ROC point, histogram bin or attack): what the audit figures draw and the CSV exports hold.
Call them as report methods (``report.gpr_frame()``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import math

if TYPE_CHECKING:
    import pandas as pd


def _nan(x):
    return float("nan") if x is None else float(x)


def _r(x, nd):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else round(float(x), nd)


def gpr_frame(report) -> pd.DataFrame:
    import pandas as pd

    rows = []
    for a in report.algorithms:
        for g in report.group_names:
            e = a.gpr.get(g)
            rows.append({"algorithm": a.key, "label": a.label, "group": g, "n": report.group_sizes.get(g),
                         "gpr": _nan(e and e.value), "low": _nan(e and e.low), "high": _nan(e and e.high),
                         "null_floor": _nan(a.null_groups.get(g) if a.null_groups else a.null_floor),
                         "threshold": report.threshold, "formal_dp": a.formal_dp})
    return pd.DataFrame(rows, columns=["algorithm", "label", "group", "n", "gpr", "low", "high", "null_floor",
                                       "threshold", "formal_dp"])


ACCURACY_VS_DPSGD = "accuracy − DP-SGD (points)"  # a − b: a "cost" column read +0.07 as a loss (issue 58)


def delta_frame(report) -> pd.DataFrame:
    """One row per algorithm: Δ (pp, bias-corrected from version 3 of the report: ``report.delta_method``) with its CI,
    the null Δ spread and whether Δ is resolved beyond it, accuracy, floor, claimed ε (None without a formal
    guarantee) and the GPR of each group; with paired comparisons, DP-SGD-S's accuracy minus DP-SGD's (signed:
    below 0, DP-SGD-S is less accurate) and its noise."""
    import pandas as pd

    rows = []
    for a in report.algorithms:
        d, nd = a.delta, a.null_delta
        claimed = [c for c in a.claimed_epsilons() if c is not None]  # one value per tier
        row = {"algorithm": a.label, "Δ (pp)": _r(d.value, 2), "Δ CI low": _r(d.low, 2), "Δ CI high": _r(d.high, 2),
               "null Δ low": _r(nd and nd.low, 2), "null Δ high": _r(nd and nd.high, 2),
               "resolved": None if a.resolved is None else ("yes" if a.resolved else "not resolved"),
               "accuracy": _r(a.accuracy.mean, 4), "null floor": _r(a.null_floor, 4),
               "formal DP": "yes" if a.formal_dp else "no",
               "claimed ε": ", ".join(f"{c:.3g}" for c in claimed) if claimed else None}
        for g in report.group_names:
            row[f"GPR {g}"] = _r(a.gpr[g].value if g in a.gpr else None, 4)
        if report.comparisons:  # DP-SGD-S: its accuracy against DP-SGD's and its noise beside its Δ
            base = report.dpsgd_comparison(a.key)
            row[ACCURACY_VS_DPSGD] = _r(base.accuracy.value, 2) if base is not None else None
            row["noise × DP-SGD"] = _r(a.noise_ratio, 3)
        rows.append(row)
    return pd.DataFrame(rows)


COMPARISON_COLUMNS = ["a", "b", "a_label", "b_label", "quantity", "group", "value", "low", "high", "unpaired_low",
                      "unpaired_high", "resolved"]


def comparison_frame(report) -> pd.DataFrame:
    """One row per paired comparison (a − b) and quantity: Δ (pp), each group's GPR (pp) and accuracy (points),
    with the paired CI (Δ also with the unpaired one); ``resolved``: the CI excludes 0."""
    import pandas as pd

    rows = []
    for c in report.comparisons:
        parts = [("Δ", None, c.delta, c.delta_unpaired)] + [("GPR", g, e, None) for g, e in c.groups.items()] + \
            [("accuracy", None, c.accuracy, None)]
        for quantity, group, e, u in parts:
            resolved = None if e.low is None or e.high is None else bool(e.low > 0 or e.high < 0)
            rows.append({"a": c.a, "b": c.b, "a_label": c.a_label, "b_label": c.b_label, "quantity": quantity,
                         "group": group, "value": _nan(e.value), "low": _nan(e.low), "high": _nan(e.high),
                         "unpaired_low": _nan(u.low) if u is not None else float("nan"),
                         "unpaired_high": _nan(u.high) if u is not None else float("nan"), "resolved": resolved})
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def accuracy_frame(report) -> pd.DataFrame:
    import pandas as pd

    rows = []
    for a in report.algorithms:
        acc = a.accuracy
        rows.append({"algorithm": a.key, "label": a.label, "group": "all", "accuracy": _nan(acc.mean),
                     "std": _nan(acc.std), "min": _nan(acc.min), "max": _nan(acc.max)})
        for g, v in acc.groups.items():
            rows.append({"algorithm": a.key, "label": a.label, "group": g, "accuracy": _nan(v),
                         "std": float("nan"), "min": float("nan"), "max": float("nan")})
    return pd.DataFrame(rows, columns=["algorithm", "label", "group", "accuracy", "std", "min", "max"])


def epsilon_frame(report) -> pd.DataFrame:
    import pandas as pd

    rows = []
    for a in report.algorithms:
        for t, claimed in zip(a.epsilon, a.claimed_epsilons()):
            rows.append({"algorithm": a.key, "label": a.label, "tier": t.name, "claimed": _nan(claimed),
                         "target": _nan(t.target), "lower_bound": _nan(t.lower_bound), "tpr": _nan(t.tpr),
                         "fpr": _nan(t.fpr), "formal_dp": a.formal_dp, "confidence": a.epsilon_confidence})
    return pd.DataFrame(rows, columns=["algorithm", "label", "tier", "claimed", "target", "lower_bound", "tpr", "fpr",
                                       "formal_dp", "confidence"])


def roc_frame(report) -> pd.DataFrame:
    import pandas as pd

    rows = []
    for a in report.algorithms:
        for g, v in a.lira.items():
            for f, t in zip(v.roc_fpr, v.roc_tpr):
                rows.append({"algorithm": a.key, "label": a.label, "group": g, "fpr": f, "tpr": t,
                             "auc": _nan(v.auc), "tpr_at_0.1%": _nan(v.tpr_at_0_1pct),
                             "tpr_at_1%": _nan(v.tpr_at_1pct)})
    return pd.DataFrame(rows, columns=["algorithm", "label", "group", "fpr", "tpr", "auc", "tpr_at_0.1%", "tpr_at_1%"])


def histogram_frame(report) -> pd.DataFrame:
    import pandas as pd

    rows = []
    for a in report.algorithms:
        edges = a.histogram.edges
        for g, counts in a.histogram.counts.items():
            total = max(1, sum(counts))
            for k, c in enumerate(counts):
                rows.append({"algorithm": a.key, "label": a.label, "group": g, "bin_low": edges[k],
                             "bin_high": edges[k + 1], "count": int(c), "fraction": c / total,
                             "group_size": report.group_sizes.get(g)})
    return pd.DataFrame(rows, columns=["algorithm", "label", "group", "bin_low", "bin_high", "count", "fraction",
                                       "group_size"])


def baselines_frame(report) -> pd.DataFrame:
    """PA-ALOOA's per-group GPR next to PA-GA, PA-GBA (per group) and PA-LOOA (per audited record)."""
    import pandas as pd

    rows = []
    sizes = report.group_sizes
    for a in report.algorithms:
        b = a.baselines
        for g in report.group_names:
            rows.append({"algorithm": a.label, "attack": "PA-ALOOA (per sample)", "target": f"group {g}",
                         "advantage": _r(a.gpr[g].value if g in a.gpr else None, 4), "models": report.n_models,
                         "records covered": sizes.get(g)})
        rows.append({"algorithm": a.label, "attack": "PA-GA (one threshold per model)", "target": "all",
                     "advantage": _r(b.pa_ga, 4), "models": report.n_models, "records covered": report.n_train})
        for g, v in b.pa_gba.items():
            rows.append({"algorithm": a.label, "attack": "PA-GBA (per model and group)", "target": f"group {g}",
                         "advantage": _r(v, 4), "models": report.n_models, "records covered": sizes.get(g)})
        for rec in b.pa_looa or ():
            rows.append({"algorithm": a.label, "attack": "PA-LOOA (one record)",
                         "target": f"record {rec.index} ({rec.group}); ALOOA {_r(rec.aloo_advantage, 3)}",
                         "advantage": _r(rec.looa_advantage, 4), "models": b.looa_models_per_record,
                         "records covered": 1})
    return pd.DataFrame(rows, columns=["algorithm", "attack", "target", "advantage", "models", "records covered"])
