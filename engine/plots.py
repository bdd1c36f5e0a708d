"""Figures of the lab: compute the data once (tidy pandas frames), plot in separate pure functions.

Two layers, used alike by the dashboard, ``python -m engine export`` and the tests:

* **data** functions turn run records into tidy :class:`pandas.DataFrame` s
  (``tier_history``, ``class_history``, ``overall_history``, ``mid_spans``, ``owner_recall``,
  ``pearson_by_run``, ``recall_gain_by_class``, ``recall_gain_over_time``, ``recall_auc_table``,
  ``final_table``, ``fairness_table``, ``mid_summary``, ``explorer_batch``);
* **figure** functions (``fig_*``) take those frames and return a :class:`plotly.graph_objects.Figure`;
  they never read the store, never mutate their inputs and never call Streamlit.

A *run record* is the store's run dict (``RunStore.get_run``) with its evaluation list added
under ``"evals"`` (``RunStore.eval_metrics``); :func:`run_record` builds one.
Themes: ``"light"``, ``"dark"`` and ``"presentation"`` (light, large fonts, thick lines: slides).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from engine.config import ALGORITHM_LABELS

THEMES = ("light", "dark", "presentation")

ALGORITHM_COLORS = {
    "nonprivate": "#7f7f7f",
    "dpsgd": "#8c564b",
    "idp_sample": "#1f77b4",
    "idp_scale": "#17becf",
    "ino": "#d62728",
    "dpsgd_s": "#2ca02c",
}
EXTRA_COLORS = ("#9467bd", "#ff7f0e", "#e377c2", "#bcbd22", "#7f7f7f", "#393b79", "#637939", "#8c6d31")
# Tiers sorted by ε: the most private first, in warm colours.
TIER_COLORS = ("#e4572e", "#f0a202", "#3a86ff", "#8338ec", "#06a77d", "#ff006e", "#6c757d", "#2b2d42")


# --- run records --------------------------------------------------------------------------------

def run_record(store, run_id: int) -> dict | None:
    """The store's run dict plus its evaluations under ``"evals"`` (None if the run is gone)."""
    run = store.get_run(run_id)
    if run is None:
        return None
    run = dict(run)
    run["evals"] = store.eval_metrics(run_id)
    return run


def algorithm_label(algorithm: str) -> str:
    return ALGORITHM_LABELS.get(algorithm, algorithm or "run")


def run_label(run: dict) -> str:
    """Short unique legend label: "INO-SGD #12" (the run's name if it has one)."""
    base = run.get("name") or algorithm_label(run.get("algorithm", ""))
    return f"{base} #{run['id']}"


def formal_dp(run: dict) -> bool | None:
    """True/False from the run's plan (False: DP-SGD-S with a non-private quantile); None if unknown."""
    plan = run.get("plan") or {}
    if run.get("algorithm") == "nonprivate":
        return False
    if "formal_dp" in plan:
        return bool(plan["formal_dp"])
    summary = run.get("summary") or {}
    if "formal_dp" in summary:
        return bool(summary["formal_dp"])
    cfg = (run.get("config") or {}).get("algorithm") or {}
    if cfg.get("name") == "dpsgd_s" and cfg.get("private_quantile") is False:
        return False
    return None


def dp_note(run: dict) -> str:
    """'' for a run with a formal DP guarantee; otherwise a short warning for labels and tables."""
    if run.get("algorithm") == "nonprivate":
        return "non-private reference (no DP)"
    if formal_dp(run) is False:
        return "no formal DP guarantee"
    return ""


def _run_colors(runs: list[dict]) -> dict[int, str]:
    used: dict[str, int] = {}
    out = {}
    extra = iter(EXTRA_COLORS * 8)
    for run in runs:
        algo = run.get("algorithm", "")
        if algo in ALGORITHM_COLORS and algo not in used:
            out[run["id"]] = ALGORITHM_COLORS[algo]
        else:
            out[run["id"]] = next(extra)
        used[algo] = used.get(algo, 0) + 1
    return out


def _tier_color(k: int) -> str:
    return TIER_COLORS[k % len(TIER_COLORS)]


def _tier_order(evals_tiers: list[dict]) -> dict[str, int]:
    """Colour index per tier name: ascending ε (ties keep the configured order)."""
    order = sorted(range(len(evals_tiers)), key=lambda k: (evals_tiers[k].get("epsilon") or math.inf, k))
    return {evals_tiers[k]["name"]: rank for rank, k in enumerate(order)}


def _finite(x) -> float:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return float("nan")
    return x if math.isfinite(x) else float("nan")


# --- themes -------------------------------------------------------------------------------------

def template(theme: str = "light") -> go.layout.Template:
    """The plot template of a theme (cached: building a Template costs ~50 ms)."""
    if theme not in THEMES:
        raise ValueError(f"unknown theme {theme!r}; allowed: {', '.join(THEMES)}")
    return _template(theme)


@functools.lru_cache(maxsize=None)
def _template(theme: str) -> go.layout.Template:
    if theme not in THEMES:
        raise ValueError(f"unknown theme {theme!r}; allowed: {', '.join(THEMES)}")
    base = pio.templates["plotly_dark" if theme == "dark" else "plotly_white"]
    tpl = go.layout.Template(base)
    color = "#e8eaf0" if theme == "dark" else "#1f2430"
    tpl.layout.font = dict(family="Inter, Helvetica, Arial, sans-serif", size=13, color=color)
    tpl.layout.margin = dict(l=60, r=20, t=80, b=50)
    tpl.layout.legend = dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0)
    if theme == "dark":
        tpl.layout.paper_bgcolor = "#0e1117"
        tpl.layout.plot_bgcolor = "#0e1117"
    if theme == "presentation":
        tpl.layout.font = dict(family="Inter, Helvetica, Arial, sans-serif", size=20, color=color)
        tpl.layout.title = dict(font=dict(size=26))
        tpl.data.scatter = [go.Scatter(line=dict(width=4), marker=dict(size=11))]
        tpl.layout.margin = dict(l=80, r=30, t=110, b=70)
        tpl.layout.legend = dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0, font=dict(size=18))
    return tpl


def apply_theme(fig: go.Figure, theme: str = "light") -> go.Figure:
    """Return a themed copy (the input figure is not changed)."""
    out = go.Figure(fig)
    out.update_layout(template=template(theme))
    return out


def _base_fig(title: str, theme: str, fig: go.Figure | None = None) -> go.Figure:
    fig = fig if fig is not None else go.Figure()
    fig.update_layout(template=template(theme), title=dict(text=title, x=0.01, xanchor="left", y=0.98, yanchor="top"))
    return fig


def _facets(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = max(1, min(n, max_cols))
    return max(1, math.ceil(n / cols)), cols


def _empty(title: str, theme: str, message: str) -> go.Figure:
    fig = _base_fig(title, theme)
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


# --- data: histories ------------------------------------------------------------------------------

TIER_COLUMNS = ["run_id", "run", "algorithm", "step", "epoch", "progress", "tier", "tier_index", "epsilon",
                "epsilon_spent", "loss", "recall", "accuracy"]


def tier_history(runs: list[dict]) -> pd.DataFrame:
    """One row per (run, evaluation, tier)."""
    rows = []
    for run in runs:
        total = run.get("total_steps") or ((run.get("evals") or [{}])[-1].get("step") or 1)
        for e in run.get("evals") or []:
            order = _tier_order(e.get("tiers") or [])
            for k, t in enumerate(e.get("tiers") or []):
                rows.append({"run_id": run["id"], "run": run_label(run), "algorithm": run.get("algorithm", ""),
                             "step": e["step"], "epoch": e.get("epoch"), "progress": e["step"] / max(total, 1),
                             "tier": t["name"], "tier_index": order.get(t["name"], k),
                             "epsilon": _finite(t.get("epsilon")), "epsilon_spent": _finite(t.get("epsilon_spent")),
                             "loss": _finite(t.get("loss")), "recall": _finite(t.get("recall")),
                             "accuracy": _finite(t.get("accuracy"))})
    return pd.DataFrame(rows, columns=TIER_COLUMNS)


def class_tier_lookup(run: dict) -> dict[int, tuple[str, float]]:
    """class index → (tier name, ε) for class-assigned tiers; {} otherwise."""
    tiers_cfg = (run.get("config") or {}).get("tiers") or {}
    if tiers_cfg.get("assign", "class") != "class":
        return {}
    evals = run.get("evals") or []
    names = [t["name"] for t in (evals[-1].get("tiers") if evals else [])]
    out = {}
    for k, t in enumerate(tiers_cfg.get("tiers") or []):
        name = names[k] if k < len(names) else (t.get("name") or f"tier {k}")
        for c in t.get("classes") or []:
            out[int(c)] = (name, float(t["epsilon"]))
    return out


CLASS_COLUMNS = ["run_id", "run", "algorithm", "step", "progress", "class", "class_index", "tier", "epsilon",
                 "loss", "recall", "accuracy"]


def class_history(runs: list[dict]) -> pd.DataFrame:
    rows = []
    for run in runs:
        lookup = class_tier_lookup(run)
        total = run.get("total_steps") or ((run.get("evals") or [{}])[-1].get("step") or 1)
        for e in run.get("evals") or []:
            for c, m in enumerate(e.get("classes") or []):
                tier, eps = lookup.get(c, ("", float("nan")))
                rows.append({"run_id": run["id"], "run": run_label(run), "algorithm": run.get("algorithm", ""),
                             "step": e["step"], "progress": e["step"] / max(total, 1), "class": m.get("name", str(c)),
                             "class_index": c, "tier": tier, "epsilon": eps, "loss": _finite(m.get("loss")),
                             "recall": _finite(m.get("recall")), "accuracy": _finite(m.get("accuracy"))})
    return pd.DataFrame(rows, columns=CLASS_COLUMNS)


OVERALL_COLUMNS = ["run_id", "run", "algorithm", "step", "epoch", "elapsed", "loss", "accuracy", "balanced_accuracy"]


def overall_history(runs: list[dict]) -> pd.DataFrame:
    rows = []
    for run in runs:
        for e in run.get("evals") or []:
            o = e.get("overall") or {}
            rows.append({"run_id": run["id"], "run": run_label(run), "algorithm": run.get("algorithm", ""),
                         "step": e["step"], "epoch": e.get("epoch"), "elapsed": e.get("elapsed"),
                         "loss": _finite(o.get("loss")), "accuracy": _finite(o.get("accuracy")),
                         "balanced_accuracy": _finite(o.get("balanced_accuracy"))})
    return pd.DataFrame(rows, columns=OVERALL_COLUMNS)


MID_COLUMNS = ["run_id", "run", "algorithm", "tier", "tier_index", "epsilon", "initial_loss", "onset_step",
               "end_step", "peak_step", "peak_increase", "last_step", "state"]


def mid_spans(runs: list[dict]) -> pd.DataFrame:
    """MID (minority initial drop) per run and tier, from the history so far (works while running).

    state: "none" (loss never rose above its initial value), "ongoing" (above it at the last
    evaluation), "recovered" (back at or below it).
    """
    from engine.metrics import mid_markers

    rows = []
    for run in runs:
        evals = run.get("evals") or []
        if not evals or not evals[0].get("tiers"):
            continue
        steps = [e["step"] for e in evals]
        losses = [[_finite(t.get("loss")) for t in e["tiers"]] for e in evals]
        marks = mid_markers(losses, steps)
        order = _tier_order(evals[-1]["tiers"])
        for k, (t, m) in enumerate(zip(evals[-1]["tiers"], marks)):
            state = "none" if m["onset_step"] is None else ("recovered" if m["end_step"] is not None else "ongoing")
            rows.append({"run_id": run["id"], "run": run_label(run), "algorithm": run.get("algorithm", ""),
                         "tier": t["name"], "tier_index": order.get(t["name"], k), "epsilon": _finite(t.get("epsilon")),
                         "initial_loss": losses[0][k], "onset_step": m["onset_step"], "end_step": m["end_step"],
                         "peak_step": m["peak_step"], "peak_increase": m["peak_increase"], "last_step": steps[-1],
                         "state": state})
    return pd.DataFrame(rows, columns=MID_COLUMNS)


# --- data: comparisons (finished or partial runs; the last evaluation counts) -----------------------

OWNER_COLUMNS = ["run_id", "run", "algorithm", "owner", "owner_kind", "tier", "epsilon", "recall"]


def owner_recall(runs: list[dict]) -> pd.DataFrame:
    """Final recall per data owner: per class when tiers are assigned by class, else per tier."""
    rows = []
    for run in runs:
        evals = run.get("evals") or []
        if not evals:
            continue
        last = evals[-1]
        lookup = class_tier_lookup(run)
        if lookup:
            for c, m in enumerate(last.get("classes") or []):
                tier, eps = lookup.get(c, ("", float("nan")))
                rows.append({"run_id": run["id"], "run": run_label(run), "algorithm": run.get("algorithm", ""),
                             "owner": m.get("name", str(c)), "owner_kind": "class", "tier": tier, "epsilon": eps,
                             "recall": _finite(m.get("recall"))})
        else:
            for t in last.get("tiers") or []:
                rows.append({"run_id": run["id"], "run": run_label(run), "algorithm": run.get("algorithm", ""),
                             "owner": t["name"], "owner_kind": "tier", "tier": t["name"],
                             "epsilon": _finite(t.get("epsilon")), "recall": _finite(t.get("recall"))})
    return pd.DataFrame(rows, columns=OWNER_COLUMNS)


def pearson_by_run(owners: pd.DataFrame) -> pd.DataFrame:
    """Pearson r (and two-sided p) between owner recall and privacy budget, per run."""
    from scipy.stats import pearsonr

    rows = []
    for (run_id, run, algo), g in owners.groupby(["run_id", "run", "algorithm"], sort=False):
        g = g.dropna(subset=["epsilon", "recall"])
        r = p = float("nan")
        if len(g) >= 3 and g["epsilon"].nunique() > 1 and g["recall"].nunique() > 1:
            res = pearsonr(g["epsilon"].to_numpy(float), g["recall"].to_numpy(float))
            r, p = float(res.statistic), float(res.pvalue)
        rows.append({"run_id": run_id, "run": run, "algorithm": algo, "n": len(g), "r": r, "p": p})
    return pd.DataFrame(rows, columns=["run_id", "run", "algorithm", "n", "r", "p"])


def pair_runs(runs: list[dict]) -> list[tuple[dict, dict]]:
    """(INO-SGD run, IDP-SGD run it builds on) pairs: same IDP mode, same group preferred."""
    pairs = []
    idps = [r for r in runs if r.get("algorithm") in ("idp_sample", "idp_scale")]
    for ino in (r for r in runs if r.get("algorithm") == "ino"):
        mode = ((ino.get("config") or {}).get("algorithm") or {}).get("idp_mode", "sample")
        want = "idp_scale" if mode == "scale" else "idp_sample"
        cands = [r for r in idps if r["algorithm"] == want] or idps
        if not cands:
            continue
        same = [r for r in cands if r.get("group_id") and r.get("group_id") == ino.get("group_id")]
        pairs.append((ino, (same or cands)[0]))
    return pairs


def _pair_label(ino: dict, idp: dict) -> str:
    return f"INO #{ino['id']} − {algorithm_label(idp['algorithm'])} #{idp['id']}"


GAIN_CLASS_COLUMNS = ["pair", "ino_run_id", "idp_run_id", "owner", "tier", "epsilon", "ino_recall", "idp_recall", "gain"]


def recall_gain_by_class(runs: list[dict]) -> pd.DataFrame:
    """Per-owner final recall gain INO − IDP (owner = class for class tiers, else tier)."""
    owners = owner_recall(runs)
    rows = []
    for ino, idp in pair_runs(runs):
        a = owners[owners.run_id == ino["id"]].set_index("owner")
        b = owners[owners.run_id == idp["id"]].set_index("owner")
        for owner in a.index.intersection(b.index):
            rows.append({"pair": _pair_label(ino, idp), "ino_run_id": ino["id"], "idp_run_id": idp["id"],
                         "owner": owner, "tier": a.at[owner, "tier"], "epsilon": a.at[owner, "epsilon"],
                         "ino_recall": a.at[owner, "recall"], "idp_recall": b.at[owner, "recall"],
                         "gain": a.at[owner, "recall"] - b.at[owner, "recall"]})
    return pd.DataFrame(rows, columns=GAIN_CLASS_COLUMNS)


GAIN_TIME_COLUMNS = ["pair", "ino_run_id", "idp_run_id", "step", "progress", "tier", "tier_index", "epsilon",
                     "ino_recall", "idp_recall", "gain"]


def recall_gain_over_time(runs: list[dict]) -> pd.DataFrame:
    """Per-tier recall gain INO − IDP along training (IDP interpolated onto INO's progress)."""
    hist = tier_history(runs)
    rows = []
    for ino, idp in pair_runs(runs):
        a, b = hist[hist.run_id == ino["id"]], hist[hist.run_id == idp["id"]]
        for tier, ga in a.groupby("tier", sort=False):
            gb = b[b.tier == tier].sort_values("progress")
            if gb.empty:
                continue
            ga = ga.sort_values("progress")
            idp_rec = np.interp(ga["progress"].to_numpy(float), gb["progress"].to_numpy(float),
                                gb["recall"].to_numpy(float))
            prog_max = gb["progress"].max()
            for (_, r), ir in zip(ga.iterrows(), idp_rec):
                if r["progress"] > prog_max + 1e-9:  # IDP has not got this far (yet)
                    continue
                rows.append({"pair": _pair_label(ino, idp), "ino_run_id": ino["id"], "idp_run_id": idp["id"],
                             "step": r["step"], "progress": r["progress"], "tier": tier,
                             "tier_index": r["tier_index"], "epsilon": r["epsilon"], "ino_recall": r["recall"],
                             "idp_recall": float(ir), "gain": r["recall"] - float(ir)})
    return pd.DataFrame(rows, columns=GAIN_TIME_COLUMNS)


def _auc(progress, recalls) -> float:
    x, y = np.asarray(progress, float), np.asarray(recalls, float)
    if len(x) < 2 or x[-1] <= 0:
        return float(y[-1]) if len(y) else float("nan")
    return float(np.trapezoid(y, x / x[-1]))


def recall_auc_table(runs: list[dict]) -> pd.DataFrame:
    """Area under each tier's recall-vs-progress curve, normalised to [0, 1] (as the engine's summary)."""
    hist = tier_history(runs)
    rows = []
    for (run_id, run, algo, tier), g in hist.groupby(["run_id", "run", "algorithm", "tier"], sort=False):
        g = g.sort_values("step")
        rows.append({"run_id": run_id, "run": run, "algorithm": algo, "tier": tier,
                     "tier_index": int(g["tier_index"].iloc[0]), "epsilon": g["epsilon"].iloc[0],
                     "recall_auc": _auc(g["step"], g["recall"]), "final_recall": g["recall"].iloc[-1]})
    return pd.DataFrame(rows, columns=["run_id", "run", "algorithm", "tier", "tier_index", "epsilon", "recall_auc",
                                       "final_recall"])


FINAL_COLUMNS = ["run_id", "run", "algorithm", "status", "steps", "loss", "accuracy", "balanced_accuracy", "dp"]


def final_table(runs: list[dict]) -> pd.DataFrame:
    rows = []
    for run in runs:
        evals = run.get("evals") or []
        if not evals:
            continue
        o = evals[-1].get("overall") or {}
        rows.append({"run_id": run["id"], "run": run_label(run), "algorithm": run.get("algorithm", ""),
                     "status": run.get("status", ""), "steps": evals[-1]["step"], "loss": _finite(o.get("loss")),
                     "accuracy": _finite(o.get("accuracy")), "balanced_accuracy": _finite(o.get("balanced_accuracy")),
                     "dp": dp_note(run) or "formal DP"})
    return pd.DataFrame(rows, columns=FINAL_COLUMNS)


def fairness_table(runs: list[dict]) -> pd.DataFrame:
    rows = []
    for run in runs:
        evals = run.get("evals") or []
        fair = evals[-1].get("fairness") if evals else None
        if not fair:
            continue
        for metric, value in fair.items():
            rows.append({"run_id": run["id"], "run": run_label(run), "algorithm": run.get("algorithm", ""),
                         "metric": metric, "value": _finite(value)})
    return pd.DataFrame(rows, columns=["run_id", "run", "algorithm", "metric", "value"])


def mid_summary(runs: list[dict]) -> pd.DataFrame:
    """The MID table: per run and tier, onset/end/peak, final recall and recall AUC."""
    spans = mid_spans(runs)
    auc = recall_auc_table(runs)
    if spans.empty:
        return pd.DataFrame(columns=["run", "tier", "ε", "MID", "onset step", "end step", "peak step",
                                     "peak loss increase", "final recall", "recall AUC", "DP"])
    merged = spans.merge(auc[["run_id", "tier", "recall_auc", "final_recall"]], on=["run_id", "tier"], how="left")
    notes = {r["id"]: dp_note(r) or "formal DP" for r in runs}
    out = pd.DataFrame({
        "run": merged["run"], "tier": merged["tier"], "ε": merged["epsilon"], "MID": merged["state"],
        "onset step": merged["onset_step"], "end step": merged["end_step"], "peak step": merged["peak_step"],
        "peak loss increase": merged["peak_increase"].round(4), "final recall": merged["final_recall"].round(4),
        "recall AUC": merged["recall_auc"].round(4), "DP": merged["run_id"].map(notes),
    })
    return out


# --- figures: live training ---------------------------------------------------------------------------

def fig_mid_curves(hist: pd.DataFrame, spans: pd.DataFrame, *, theme: str = "light", layout: str = "facet",
                   title: str = "MID curves: per-tier test loss (shaded: MID spans)") -> go.Figure:
    """Per-tier test loss over steps; the MID span of each tier (loss above its initial value) shaded.

    layout="facet": one panel per run; "overlay": one panel, line dash per run.
    """
    if hist.empty:
        return _empty(title, theme, "no evaluations yet")
    runs = list(dict.fromkeys(hist["run"]))
    if layout == "overlay":
        fig = _base_fig(title, theme)
        dashes = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
        for i, run in enumerate(runs):
            for tier, g in hist[hist.run == run].groupby("tier", sort=False):
                color = _tier_color(int(g["tier_index"].iloc[0]))
                fig.add_trace(go.Scatter(x=g["step"], y=g["loss"], mode="lines+markers", name=f"{tier} · {run}",
                                         line=dict(color=color, dash=dashes[i % len(dashes)]),
                                         marker=dict(size=5), legendgroup=tier))
        for _, s in spans[spans.state != "none"].iterrows() if not spans.empty else []:
            fig.add_vrect(x0=s["onset_step"], x1=s["end_step"] if s["end_step"] is not None and not pd.isna(s["end_step"])
                          else s["last_step"], fillcolor=_tier_color(int(s["tier_index"])), opacity=0.10,
                          line_width=0, layer="below")
        fig.update_xaxes(title_text="step")
        fig.update_yaxes(title_text="test loss")
        return fig
    nrows, ncols = _facets(len(runs))
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=runs, shared_yaxes=True,
                        horizontal_spacing=0.04, vertical_spacing=0.12)
    _base_fig(title, theme, fig)
    shown = set()
    for i, run in enumerate(runs):
        row, col = i // ncols + 1, i % ncols + 1
        g_run = hist[hist.run == run]
        for tier, g in g_run.groupby("tier", sort=False):
            color = _tier_color(int(g["tier_index"].iloc[0]))
            fig.add_trace(go.Scatter(x=g["step"], y=g["loss"], mode="lines+markers", name=tier,
                                     line=dict(color=color), marker=dict(size=5), legendgroup=tier,
                                     showlegend=tier not in shown), row=row, col=col)
            shown.add(tier)
            fig.add_trace(go.Scatter(x=[g["step"].min(), g["step"].max()], y=[g["loss"].iloc[0]] * 2, mode="lines",
                                     line=dict(color=color, dash="dot", width=1), hoverinfo="skip",
                                     showlegend=False, legendgroup=tier), row=row, col=col)
        if not spans.empty:
            for _, s in spans[(spans.run == run) & (spans.state != "none")].iterrows():
                end = s["end_step"] if s["end_step"] is not None and not pd.isna(s["end_step"]) else s["last_step"]
                fig.add_vrect(x0=s["onset_step"], x1=end, fillcolor=_tier_color(int(s["tier_index"])), opacity=0.12,
                              line_width=0, layer="below", row=row, col=col)
        fig.update_xaxes(title_text="step", row=row, col=col)
    fig.update_yaxes(title_text="test loss", col=1)
    fig.update_layout(height=max(380, 320 * nrows))
    return fig


def _per_group_lines(df: pd.DataFrame, group_col: str, value: str, *, title: str, theme: str, y_title: str,
                     run_colors: dict, max_cols: int = 3, y_range=None) -> go.Figure:
    groups = list(dict.fromkeys(df.sort_values("tier_index" if "tier_index" in df else group_col)[group_col])) \
        if group_col == "tier" else list(dict.fromkeys(df[group_col]))
    nrows, ncols = _facets(len(groups), max_cols)
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=[str(g) for g in groups], shared_yaxes=True,
                        horizontal_spacing=0.04, vertical_spacing=0.14 if nrows > 1 else 0.1)
    _base_fig(title, theme, fig)
    shown = set()
    for i, grp in enumerate(groups):
        row, col = i // ncols + 1, i % ncols + 1
        for (run_id, run), g in df[df[group_col] == grp].groupby(["run_id", "run"], sort=False):
            fig.add_trace(go.Scatter(x=g["step"], y=g[value], mode="lines+markers", name=run,
                                     line=dict(color=run_colors.get(run_id)), marker=dict(size=4), legendgroup=run,
                                     showlegend=run not in shown), row=row, col=col)
            shown.add(run)
    fig.update_yaxes(title_text=y_title, col=1)
    if y_range is not None:
        fig.update_yaxes(range=y_range)
    fig.update_layout(height=max(360, 260 * nrows + 80))
    return fig


def fig_tier_recall(hist: pd.DataFrame, *, theme: str = "light", run_colors: dict | None = None,
                    title: str = "Per-tier recall over training") -> go.Figure:
    if hist.empty:
        return _empty(title, theme, "no evaluations yet")
    colors = run_colors or _colors_from_frame(hist)
    return _per_group_lines(hist, "tier", "recall", title=title, theme=theme, y_title="recall",
                            run_colors=colors, y_range=[-0.02, 1.02])


def fig_class_recall(hist: pd.DataFrame, *, theme: str = "light", run_colors: dict | None = None,
                     title: str = "Per-class recall over training", max_classes: int = 20) -> go.Figure:
    if hist.empty:
        return _empty(title, theme, "no evaluations yet")
    df = hist.copy()
    df["panel"] = [f"{c} ({t})" if t else str(c) for c, t in zip(df["class"], df["tier"])]
    keep = list(dict.fromkeys(df["panel"]))[:max_classes]
    df = df[df["panel"].isin(keep)]
    colors = run_colors or _colors_from_frame(hist)
    return _per_group_lines(df, "panel", "recall", title=title, theme=theme, y_title="recall", run_colors=colors,
                            max_cols=5, y_range=[-0.02, 1.02])


def _colors_from_frame(df: pd.DataFrame) -> dict:
    runs = [{"id": rid, "algorithm": algo} for rid, algo in dict.fromkeys(zip(df["run_id"], df["algorithm"]))]
    return _run_colors(runs)


def fig_accuracy(overall: pd.DataFrame, *, theme: str = "light", run_colors: dict | None = None,
                 title: str = "Overall test accuracy") -> go.Figure:
    if overall.empty:
        return _empty(title, theme, "no evaluations yet")
    colors = run_colors or _colors_from_frame(overall)
    fig = _base_fig(title, theme)
    for (run_id, run), g in overall.groupby(["run_id", "run"], sort=False):
        fig.add_trace(go.Scatter(x=g["step"], y=g["accuracy"], mode="lines+markers", name=run,
                                 line=dict(color=colors.get(run_id)), marker=dict(size=5)))
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="accuracy", range=[-0.02, 1.02])
    return fig


def fig_epsilon_spent(hist: pd.DataFrame, *, theme: str = "light", notes: dict | None = None,
                      title: str = "ε spent per tier vs budget (dashed)") -> go.Figure:
    """Per run: each tier's ε spent so far (Opacus RDP) and its budget as a dashed line."""
    df = hist.dropna(subset=["epsilon_spent"]) if not hist.empty else hist
    if df.empty:
        return _empty(title, theme, "no privacy accounting (non-private runs or no evaluations yet)")
    runs = list(dict.fromkeys(df["run"]))
    notes = notes or {}
    titles = [f"{r} — {notes[r]}" if notes.get(r) else r for r in runs]
    nrows, ncols = _facets(len(runs))
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=titles, shared_yaxes=True,
                        horizontal_spacing=0.04, vertical_spacing=0.12)
    _base_fig(title, theme, fig)
    shown = set()
    for i, run in enumerate(runs):
        row, col = i // ncols + 1, i % ncols + 1
        for tier, g in df[df.run == run].groupby("tier", sort=False):
            color = _tier_color(int(g["tier_index"].iloc[0]))
            fig.add_trace(go.Scatter(x=g["step"], y=g["epsilon_spent"], mode="lines+markers", name=tier,
                                     line=dict(color=color), marker=dict(size=4), legendgroup=tier,
                                     showlegend=tier not in shown), row=row, col=col)
            shown.add(tier)
            fig.add_trace(go.Scatter(x=[0, max(g["step"].max(), 1)], y=[g["epsilon"].iloc[0]] * 2, mode="lines",
                                     name=f"{tier} budget", line=dict(color=color, dash="dash", width=1.5),
                                     legendgroup=tier, showlegend=False, hoverinfo="name+y"), row=row, col=col)
        fig.update_xaxes(title_text="step", row=row, col=col)
    fig.update_yaxes(title_text="ε", col=1, rangemode="tozero")
    fig.update_layout(height=max(380, 320 * nrows))
    return fig


# --- figures: results -------------------------------------------------------------------------------

def fig_recall_vs_budget(owners: pd.DataFrame, stats: pd.DataFrame, *, theme: str = "light",
                         run_colors: dict | None = None,
                         title: str = "Per-owner recall vs privacy budget") -> go.Figure:
    if owners.empty:
        return _empty(title, theme, "no finished evaluations in the selection")
    colors = run_colors or _colors_from_frame(owners)
    fig = _base_fig(title, theme)
    runs = list(dict.fromkeys(zip(owners["run_id"], owners["run"])))
    width = 0.06 * max(1, len(runs) - 1)
    for i, (run_id, run) in enumerate(runs):
        g = owners[owners.run_id == run_id]
        s = stats[stats.run_id == run_id]
        r = s["r"].iloc[0] if not s.empty else float("nan")
        p = s["p"].iloc[0] if not s.empty else float("nan")
        stat = f"r = {r:.2f}, p = {p:.2g}" if math.isfinite(r) else "r = n/a"
        offset = (i / max(1, len(runs) - 1) - 0.5) * width if len(runs) > 1 else 0.0
        fig.add_trace(go.Scatter(x=g["epsilon"] + offset, y=g["recall"], mode="markers", name=f"{run} ({stat})",
                                 marker=dict(color=colors.get(run_id), size=10, line=dict(width=1, color="white")),
                                 text=g["owner"], customdata=g["epsilon"],
                                 hovertemplate="%{text}: recall %{y:.3f} at ε=%{customdata}<extra>" + run + "</extra>"))
        gg = g.dropna(subset=["epsilon", "recall"])
        if len(gg) >= 2 and gg["epsilon"].nunique() > 1:
            slope, icpt = np.polyfit(gg["epsilon"].to_numpy(float), gg["recall"].to_numpy(float), 1)
            xs = np.array([gg["epsilon"].min(), gg["epsilon"].max()])
            fig.add_trace(go.Scatter(x=xs, y=slope * xs + icpt, mode="lines", showlegend=False, hoverinfo="skip",
                                     line=dict(color=colors.get(run_id), dash="dot", width=1.5)))
    kind = owners["owner_kind"].iloc[0]
    fig.update_xaxes(title_text=f"privacy budget ε of the {kind}'s tier")
    fig.update_yaxes(title_text=f"final recall per {kind}", range=[-0.02, 1.05])
    return fig


def fig_recall_gain_by_class(gain: pd.DataFrame, *, theme: str = "light",
                             title: str = "Recall gain INO − IDP per owner vs ε") -> go.Figure:
    if gain.empty:
        return _empty(title, theme, "select an INO-SGD run and the IDP-SGD run it builds on")
    fig = _base_fig(title, theme)
    for i, (pair, g) in enumerate(gain.groupby("pair", sort=False)):
        fig.add_trace(go.Scatter(x=g["epsilon"], y=g["gain"], mode="markers+text", name=pair, text=g["owner"],
                                 textposition="middle right",
                                 marker=dict(size=11, color=EXTRA_COLORS[i % len(EXTRA_COLORS)] if i else "#d62728"),
                                 hovertemplate="%{text}: gain %{y:+.3f} at ε=%{x}<extra></extra>"))
    fig.add_hline(y=0, line=dict(color="gray", width=1))
    fig.update_xaxes(title_text="privacy budget ε")
    fig.update_yaxes(title_text="recall gain (INO − IDP)", zeroline=True)
    return fig


def fig_recall_gain_over_time(gain: pd.DataFrame, *, theme: str = "light",
                              title: str = "Recall gain INO − IDP per tier over training") -> go.Figure:
    if gain.empty:
        return _empty(title, theme, "select an INO-SGD run and the IDP-SGD run it builds on")
    fig = _base_fig(title, theme)
    dashes = ["solid", "dash", "dot", "dashdot"]
    for i, (pair, gp) in enumerate(gain.groupby("pair", sort=False)):
        for tier, g in gp.groupby("tier", sort=False):
            fig.add_trace(go.Scatter(x=g["step"], y=g["gain"], mode="lines+markers",
                                     name=f"{tier}" + (f" · {pair}" if gain["pair"].nunique() > 1 else ""),
                                     line=dict(color=_tier_color(int(g["tier_index"].iloc[0])),
                                               dash=dashes[i % len(dashes)]), marker=dict(size=5)))
    fig.add_hline(y=0, line=dict(color="gray", width=1))
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="recall gain (INO − IDP)")
    return fig


def fig_recall_auc(auc: pd.DataFrame, *, theme: str = "light", run_colors: dict | None = None,
                   title: str = "Area under each tier's recall curve") -> go.Figure:
    if auc.empty:
        return _empty(title, theme, "no evaluations yet")
    colors = run_colors or _colors_from_frame(auc)
    fig = _base_fig(title, theme)
    order = list(dict.fromkeys(auc.sort_values("tier_index")["tier"]))
    for (run_id, run), g in auc.groupby(["run_id", "run"], sort=False):
        g = g.set_index("tier").reindex(order).reset_index()
        fig.add_trace(go.Bar(x=g["tier"], y=g["recall_auc"], name=run, marker_color=colors.get(run_id),
                             text=g["recall_auc"].round(3), textposition="outside"))
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="recall AUC (normalised)", range=[0, 1.1])
    return fig


def fig_overall_bars(final: pd.DataFrame, *, theme: str = "light", run_colors: dict | None = None,
                     title: str = "Overall test loss and accuracy") -> go.Figure:
    if final.empty:
        return _empty(title, theme, "no evaluations yet")
    colors = run_colors or _colors_from_frame(final)
    fig = make_subplots(rows=1, cols=2, subplot_titles=["test loss", "test accuracy"], horizontal_spacing=0.1)
    _base_fig(title, theme, fig)
    cols = [colors.get(r) for r in final["run_id"]]
    fig.add_trace(go.Bar(x=final["run"], y=final["loss"], marker_color=cols, showlegend=False,
                         text=final["loss"].round(3), textposition="outside"), row=1, col=1)
    fig.add_trace(go.Bar(x=final["run"], y=final["accuracy"], marker_color=cols, showlegend=False,
                         text=final["accuracy"].round(3), textposition="outside"), row=1, col=2)
    fig.update_yaxes(range=[0, 1.1], row=1, col=2)
    return fig


def fig_fairness_bars(fair: pd.DataFrame, *, theme: str = "light", run_colors: dict | None = None,
                      title: str = "Outcome fairness (lower is fairer)") -> go.Figure:
    if fair.empty:
        return _empty(title, theme, "fairness metrics exist for binary tabular datasets with a sensitive attribute")
    colors = run_colors or _colors_from_frame(fair)
    fig = _base_fig(title, theme)
    names = {"demographic_parity_difference": "demographic parity diff.",
             "equalized_odds_difference": "equalized odds diff."}
    for (run_id, run), g in fair.groupby(["run_id", "run"], sort=False):
        fig.add_trace(go.Bar(x=[names.get(m, m) for m in g["metric"]], y=g["value"], name=run,
                             marker_color=colors.get(run_id), text=g["value"].round(3), textposition="outside"))
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="difference", rangemode="tozero")
    return fig


def fig_table(df: pd.DataFrame, *, theme: str = "light", title: str = "MID summary") -> go.Figure:
    fig = _base_fig(title, theme)
    dark = theme == "dark"
    cells = [[("—" if (v is None or (isinstance(v, float) and math.isnan(v))) else v) for v in df[c]] for c in df]
    fig.add_trace(go.Table(
        header=dict(values=list(df.columns), fill_color="#262730" if dark else "#eef1f6",
                    font=dict(color="#fafafa" if dark else "#111", size=13), align="left"),
        cells=dict(values=cells, fill_color="#0e1117" if dark else "white",
                   font=dict(color="#fafafa" if dark else "#111", size=12), align="left")))
    fig.update_layout(height=max(250, 60 + 28 * (len(df) + 2)))
    return fig


# --- the figure set of a selection (UI export, CLI export, presentation pack) ---------------------------

@dataclass
class FigureSpec:
    name: str  # file stem
    title: str
    figure: go.Figure
    data: pd.DataFrame  # what the figure shows (CSV export)


LIVE_FIGURES = ("mid_curves", "tier_recall", "class_recall", "accuracy", "epsilon_spent")
RESULT_FIGURES = ("recall_vs_budget", "recall_gain_class", "recall_gain_time", "recall_auc", "overall_bars",
                  "fairness_bars", "mid_summary")


def build_figures(runs: list[dict], *, theme: str = "light", names=None, mid_layout: str = "facet",
                  skip_empty: bool = False) -> list[FigureSpec]:
    """All figures for a selection of run records (``names`` restricts and orders them)."""
    names = list(names) if names is not None else list(LIVE_FIGURES + RESULT_FIGURES)
    colors = _run_colors(runs)
    out: list[FigureSpec] = []
    hist = tier_history(runs) if runs else pd.DataFrame(columns=TIER_COLUMNS)
    notes = {run_label(r): dp_note(r) for r in runs}
    for name in names:
        if name == "mid_curves":
            spans = mid_spans(runs)
            fig = fig_mid_curves(hist, spans, theme=theme, layout=mid_layout)
            data = hist[["run_id", "run", "algorithm", "step", "tier", "epsilon", "loss"]].merge(
                spans[["run_id", "tier", "onset_step", "end_step", "state"]], on=["run_id", "tier"], how="left")
            spec = FigureSpec(name, "MID curves", fig, data)
        elif name == "tier_recall":
            spec = FigureSpec(name, "Per-tier recall", fig_tier_recall(hist, theme=theme, run_colors=colors),
                              hist[["run_id", "run", "algorithm", "step", "tier", "epsilon", "recall", "accuracy"]])
        elif name == "class_recall":
            ch = class_history(runs)
            spec = FigureSpec(name, "Per-class recall", fig_class_recall(ch, theme=theme, run_colors=colors), ch)
        elif name == "accuracy":
            ov = overall_history(runs)
            spec = FigureSpec(name, "Overall accuracy", fig_accuracy(ov, theme=theme, run_colors=colors), ov)
        elif name == "epsilon_spent":
            spec = FigureSpec(name, "ε spent vs budget", fig_epsilon_spent(hist, theme=theme, notes=notes),
                              hist[["run_id", "run", "algorithm", "step", "tier", "epsilon", "epsilon_spent"]])
        elif name == "recall_vs_budget":
            owners = owner_recall(runs)
            stats = pearson_by_run(owners)
            fig = fig_recall_vs_budget(owners, stats, theme=theme, run_colors=colors)
            data = owners.merge(stats[["run_id", "r", "p"]], on="run_id", how="left")
            spec = FigureSpec(name, "Recall vs budget", fig, data)
        elif name == "recall_gain_class":
            g = recall_gain_by_class(runs)
            spec = FigureSpec(name, "Recall gain per owner", fig_recall_gain_by_class(g, theme=theme), g)
        elif name == "recall_gain_time":
            g = recall_gain_over_time(runs)
            spec = FigureSpec(name, "Recall gain over training", fig_recall_gain_over_time(g, theme=theme), g)
        elif name == "recall_auc":
            a = recall_auc_table(runs)
            spec = FigureSpec(name, "Recall AUC", fig_recall_auc(a, theme=theme, run_colors=colors), a)
        elif name == "overall_bars":
            f = final_table(runs)
            spec = FigureSpec(name, "Loss and accuracy", fig_overall_bars(f, theme=theme, run_colors=colors), f)
        elif name == "fairness_bars":
            f = fairness_table(runs)
            spec = FigureSpec(name, "Fairness", fig_fairness_bars(f, theme=theme, run_colors=colors), f)
        elif name == "mid_summary":
            t = mid_summary(runs)
            spec = FigureSpec(name, "MID summary", fig_table(t, theme=theme), t)
        else:
            raise ValueError(f"unknown figure {name!r}")
        if skip_empty and spec.data.empty:
            continue
        out.append(spec)
    return out


# --- TIF explorer -------------------------------------------------------------------------------------

def explorer_batch(losses, clip_norms, tiers, tier_names, tier_epsilons, *, tif, tail_length: float) -> pd.DataFrame:
    """One row per batch item, in loss order: its clip-mass interval on [0, Γ] and its weight ρ."""
    from engine.importance import weights_from_order

    losses = np.asarray(losses, dtype=float)
    clip = np.asarray(clip_norms, dtype=float)
    tiers = np.asarray(tiers, dtype=int)
    order = np.argsort(losses, kind="stable")
    rho = weights_from_order(order, clip, tif, tail_length)
    ends = np.cumsum(clip[order])
    starts = ends - clip[order]
    rank_order = np.argsort([tier_epsilons[k] for k in range(len(tier_names))], kind="stable")
    tier_rank = {int(k): r for r, k in enumerate(rank_order)}
    return pd.DataFrame({
        "rank": np.arange(len(order)), "item": order, "loss": losses[order], "clip_norm": clip[order],
        "mass_start": starts, "mass_end": ends, "mass_center": (starts + ends) / 2, "rho": rho[order],
        "tier": [tier_names[t] for t in tiers[order]], "tier_index": [tier_rank[int(t)] for t in tiers[order]],
        "epsilon": [tier_epsilons[t] for t in tiers[order]],
    })


def explorer_tier_table(batch: pd.DataFrame) -> pd.DataFrame:
    if batch.empty:
        return pd.DataFrame(columns=["tier", "tier_index", "epsilon", "items", "mean_rho", "dropped_mass"])
    b = batch.assign(dropped=(1 - batch["rho"]) * batch["clip_norm"])
    g = b.groupby(["tier", "tier_index", "epsilon"], sort=False).agg(items=("rho", "size"), mean_rho=("rho", "mean"),
                                                                    dropped_mass=("dropped", "sum")).reset_index()
    return g.sort_values("tier_index").reset_index(drop=True)


def fig_tif(tif, *, theme: str = "light", title: str = "Tail importance function TIF(u)") -> go.Figure:
    u = np.linspace(0, 1, 201)
    y = np.asarray(tif(u), dtype=float)
    fig = _base_fig(title, theme)
    fig.add_trace(go.Scatter(x=u, y=y, mode="lines", name="TIF(u)", fill="tozeroy", line=dict(color="#d62728", width=3)))
    fig.add_annotation(text=f"dropped: 1 − ∫TIF = {tif.dropped_fraction:.3f}", x=0.02, y=0.97, xref="paper",
                       yref="paper", showarrow=False, xanchor="left", yanchor="top")
    fig.update_xaxes(title_text="u = clip mass / γ", range=[0, 1])
    fig.update_yaxes(title_text="weight", range=[-0.02, 1.05])
    return fig


def fig_bif_batch(batch: pd.DataFrame, tif, tail_length: float, *, theme: str = "light",
                  title: str = "BIF over a sampled batch: each item's ρ (coloured by tier)") -> go.Figure:
    fig = _base_fig(title, theme)
    if batch.empty:
        return _empty(title, theme, "the sampled batch is empty")
    total = float(batch["mass_end"].iloc[-1])
    xs = np.linspace(0, max(total, tail_length) * 1.02, 400)
    bif = np.where(xs < tail_length, np.asarray(tif(xs / tail_length if tail_length > 0 else 1.0)), 1.0) \
        if tail_length > 0 else np.ones_like(xs)
    fig.add_trace(go.Scatter(x=xs, y=bif, mode="lines", name="BIF(x)", line=dict(color="#888", width=2),
                             hoverinfo="skip"))
    for (tier, k), g in batch.groupby(["tier", "tier_index"], sort=False):
        fig.add_trace(go.Scatter(
            x=g["mass_center"], y=g["rho"], mode="markers", name=f"{tier}",
            marker=dict(color=_tier_color(int(k)), size=9, line=dict(width=1, color="white")),
            customdata=np.stack([g["loss"], g["clip_norm"]], axis=1),
            hovertemplate="loss %{customdata[0]:.3f}, C %{customdata[1]:.3f}<br>ρ = %{y:.3f}<extra>" + tier + "</extra>"))
    fig.add_vline(x=tail_length, line=dict(color="#d62728", dash="dash"), annotation_text="γ (tail length)",
                  annotation_position="top right")
    fig.update_xaxes(title_text="cumulative clip mass x (items sorted by loss, lowest first)")
    fig.update_yaxes(title_text="ρ (importance weight)", range=[-0.03, 1.08])
    return fig


def fig_tier_rho(tiers: pd.DataFrame, *, theme: str = "light", title: str = "Mean ρ per tier") -> go.Figure:
    if tiers.empty:
        return _empty(title, theme, "the sampled batch is empty")
    fig = _base_fig(title, theme)
    fig.add_trace(go.Bar(x=tiers["tier"], y=tiers["mean_rho"], marker_color=[_tier_color(int(k)) for k in tiers["tier_index"]],
                         text=[f"{v:.2f} (n={n})" for v, n in zip(tiers["mean_rho"], tiers["items"])],
                         textposition="outside", showlegend=False))
    fig.update_yaxes(title_text="mean ρ in the batch", range=[0, 1.15])
    return fig


def explorer_sample(dataset, tiers_cfg, *, batch_size: int = 64, seed: int = 0, mode: str = "sample",
                    delta: float = 1e-5, clip_norm: float = 1.0, epochs: float = 3.0, ref_samples: int = 2000) -> dict:
    """A Poisson-sampled batch for the TIF explorer (no DP training involved).

    Per-tier sampling rates and clip norms come from the IDP-SGD plan (``mode`` "sample" or "scale")
    for these tiers; per-sample losses come from a deliberately under-fitted logistic regression on a
    subsample (a stand-in for an early-training model: easy items have low loss, hard ones high).
    Returns numpy arrays and the expected batch clip mass Σ_n q_n N_n C_n (the unit of γ).
    """
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    from engine import accounting
    from engine.config import ConfigError
    from engine.tiers import assign_tiers

    tiers = assign_tiers(tiers_cfg, dataset, seed=seed)
    n = len(dataset.y_train)
    if batch_size > n:
        raise ConfigError("batch_size", f"must be at most the training set size {n}, got {batch_size}")
    steps = max(1, int(round(epochs * n / batch_size)))
    try:
        plan = accounting.plan(mode=mode, epsilons=list(tiers.epsilons), delta=delta, tier_sizes=list(tiers.sizes),
                               batch_size=batch_size, clip_norm=clip_norm, steps=steps)
    except accounting.PlanError as e:
        raise ConfigError("tiers", f"no privacy plan: {e}") from None
    rng = np.random.default_rng(seed)
    q_all = np.asarray(plan.sample_rates)[tiers.train]
    c_all = np.asarray(plan.clip_norms)[tiers.train]
    idx = np.flatnonzero(rng.random(n) < q_all)
    x = dataset.x_train.reshape(n, -1).numpy()
    y = dataset.y_train.numpy()
    sub = rng.choice(n, size=min(n, ref_samples), replace=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = LogisticRegression(max_iter=8).fit(x[sub], y[sub])
    proba = np.full((len(idx), dataset.num_classes), 1e-3)
    if len(idx):
        proba[:, clf.classes_] = clf.predict_proba(x[idx])
    losses = -np.log(np.clip(proba[np.arange(len(idx)), y[idx]], 1e-12, 1.0)) if len(idx) else np.zeros(0)
    return {"losses": losses, "clip_norms": c_all[idx], "tiers": tiers.train[idx], "tier_names": list(tiers.names),
            "tier_epsilons": list(tiers.epsilons), "expected_clip_mass": float(np.sum(q_all * c_all)),
            "expected_batch": float(plan.expected_batch_size), "sample_rates": list(plan.sample_rates),
            "clip_norms_per_tier": list(plan.clip_norms), "steps": steps, "batch_indices": idx}
