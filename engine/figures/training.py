"""Figures of training runs: pure Plotly builders over the tidy frames of :mod:`engine.figures.frames`,
and :func:`build_figures`, the figure set of a selection (dashboard, ``python -m engine export``,
presentation packs). Builders never read the store, never mutate their inputs, never call Streamlit;
user text (run, tier and class names) is escaped where it enters a figure.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.figures import frames as fr
from engine.figures.scaffold import (EXTRA_COLORS, FigureSpec, base_figure, colors_from_frame, empty_figure,
                                     esc, escape_columns, facet_grid, fig_table, run_colors, tier_color)
from engine.runs import dp_note, run_label

LIVE_FIGURES = ("mid_curves", "tier_recall", "class_recall", "accuracy", "epsilon_spent")
RESULT_FIGURES = ("recall_vs_budget", "recall_gain_class", "recall_gain_time", "recall_auc", "overall_bars",
                  "fairness_bars", "mid_summary")


# --- live training ----------------------------------------------------------------------------------

def fig_mid_curves(hist: pd.DataFrame, spans: pd.DataFrame, *, theme: str = "light", layout: str = "facet",
                   title: str = "MID curves: per-tier test loss (shaded: MID spans)") -> go.Figure:
    """Per-tier test loss over steps; the MID span of each tier (loss above its initial value) shaded.

    layout="facet": one panel per run; "overlay": one panel, line dash per run.
    """
    if hist.empty:
        return empty_figure(title, theme, "no evaluations yet")
    hist, spans = escape_columns(hist, "run", "tier"), escape_columns(spans, "run", "tier")
    runs = list(dict.fromkeys(hist["run"]))
    if layout == "overlay":
        fig = base_figure(title, theme)
        dashes = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
        for i, run in enumerate(runs):
            for tier, g in hist[hist.run == run].groupby("tier", sort=False):
                color = tier_color(int(g["tier_index"].iloc[0]))
                fig.add_trace(go.Scatter(x=g["step"], y=g["loss"], mode="lines+markers", name=f"{tier} · {run}",
                                         line=dict(color=color, dash=dashes[i % len(dashes)]),
                                         marker=dict(size=5), legendgroup=tier))
        for _, s in spans[spans.state != "none"].iterrows() if not spans.empty else []:
            fig.add_vrect(x0=s["onset_step"], x1=s["end_step"] if s["end_step"] is not None and not pd.isna(s["end_step"])
                          else s["last_step"], fillcolor=tier_color(int(s["tier_index"])), opacity=0.10,
                          line_width=0, layer="below")
        fig.update_xaxes(title_text="step")
        fig.update_yaxes(title_text="test loss")
        return fig
    fig, nrows, ncols = facet_grid(runs, title, theme)
    shown = set()
    for i, run in enumerate(runs):
        row, col = i // ncols + 1, i % ncols + 1
        g_run = hist[hist.run == run]
        for tier, g in g_run.groupby("tier", sort=False):
            color = tier_color(int(g["tier_index"].iloc[0]))
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
                fig.add_vrect(x0=s["onset_step"], x1=end, fillcolor=tier_color(int(s["tier_index"])), opacity=0.12,
                              line_width=0, layer="below", row=row, col=col)
        fig.update_xaxes(title_text="step", row=row, col=col)
    fig.update_yaxes(title_text="test loss", col=1)
    fig.update_layout(height=max(380, 320 * nrows))
    return fig


def _per_group_lines(df: pd.DataFrame, group_col: str, value: str, *, title: str, theme: str, y_title: str,
                     run_colors: dict, max_cols: int = 3, y_range=None) -> go.Figure:
    groups = list(dict.fromkeys(df.sort_values("tier_index" if "tier_index" in df else group_col)[group_col])) \
        if group_col == "tier" else list(dict.fromkeys(df[group_col]))
    fig, nrows, ncols = facet_grid([str(g) for g in groups], title, theme, max_cols=max_cols,
                                   vertical_spacing=0.14 if len(groups) > max_cols else 0.1)
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
        return empty_figure(title, theme, "no evaluations yet")
    colors = run_colors or colors_from_frame(hist)
    return _per_group_lines(escape_columns(hist, "run", "tier"), "tier", "recall", title=title, theme=theme, y_title="recall",
                            run_colors=colors, y_range=[-0.02, 1.02])


def fig_class_recall(hist: pd.DataFrame, *, theme: str = "light", run_colors: dict | None = None,
                     title: str = "Per-class recall over training", max_classes: int = 20) -> go.Figure:
    if hist.empty:
        return empty_figure(title, theme, "no evaluations yet")
    df = escape_columns(hist, "run", "class", "tier")
    df["panel"] = [f"{c} ({t})" if t else str(c) for c, t in zip(df["class"], df["tier"])]
    keep = list(dict.fromkeys(df["panel"]))[:max_classes]
    df = df[df["panel"].isin(keep)]
    colors = run_colors or colors_from_frame(hist)
    return _per_group_lines(df, "panel", "recall", title=title, theme=theme, y_title="recall", run_colors=colors,
                            max_cols=5, y_range=[-0.02, 1.02])


def fig_accuracy(overall: pd.DataFrame, *, theme: str = "light", run_colors: dict | None = None,
                 title: str = "Overall test accuracy") -> go.Figure:
    if overall.empty:
        return empty_figure(title, theme, "no evaluations yet")
    colors = run_colors or colors_from_frame(overall)
    fig = base_figure(title, theme)
    for (run_id, run), g in escape_columns(overall, "run").groupby(["run_id", "run"], sort=False):
        fig.add_trace(go.Scatter(x=g["step"], y=g["accuracy"], mode="lines+markers", name=run,
                                 line=dict(color=colors.get(run_id)), marker=dict(size=5)))
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="accuracy", range=[-0.02, 1.02])
    return fig


def fig_epsilon_spent(hist: pd.DataFrame, *, theme: str = "light", notes: dict | None = None,
                      title: str = "ε spent per tier vs budget (dashed)") -> go.Figure:
    """Per run: each tier's ε spent so far (Opacus RDP) and its budget as a dashed line."""
    df = hist.dropna(subset=["epsilon_spent"]) if not hist.empty else hist
    # runs without a formal guarantee record ε spent as null: name them (and why) instead of a curve
    unaccounted = [r for r in dict.fromkeys(hist["run"])] if not hist.empty else []
    unaccounted = [r for r in unaccounted if r not in set(df["run"])]
    unaccounted_text = "ε spent null (no accounting): " + "; ".join(
        f"{esc(r)} — {esc((notes or {}).get(r) or 'no formal DP guarantee')}" for r in unaccounted)
    if df.empty:
        return empty_figure(title, theme, unaccounted_text if unaccounted else
                            "no privacy accounting (non-private runs or no evaluations yet)")
    notes = {esc(r): esc(n) for r, n in (notes or {}).items()}  # keyed by run label
    df = escape_columns(df, "run", "tier")
    runs = list(dict.fromkeys(df["run"]))
    titles = [f"{r} — {notes[r]}" if notes.get(r) else r for r in runs]
    fig, nrows, ncols = facet_grid(titles, title, theme)
    shown = set()
    for i, run in enumerate(runs):
        row, col = i // ncols + 1, i % ncols + 1
        for tier, g in df[df.run == run].groupby("tier", sort=False):
            color = tier_color(int(g["tier_index"].iloc[0]))
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
    if unaccounted:
        fig.add_annotation(text=unaccounted_text, xref="paper", yref="paper", x=0, y=-0.18, showarrow=False,
                           xanchor="left", font=dict(size=11))
    return fig


# --- results -------------------------------------------------------------------------------------

def fig_recall_vs_budget(owners: pd.DataFrame, stats: pd.DataFrame, *, theme: str = "light",
                         run_colors: dict | None = None,
                         title: str = "Per-owner recall vs privacy budget") -> go.Figure:
    if owners.empty:
        return empty_figure(title, theme, "no finished evaluations in the selection")
    colors = run_colors or colors_from_frame(owners)
    owners = escape_columns(owners, "run", "owner", "tier")
    fig = base_figure(title, theme)
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
        return empty_figure(title, theme, "select an INO-SGD run and the IDP-SGD run it builds on")
    fig = base_figure(title, theme)
    gain = escape_columns(gain, "pair", "owner", "tier")
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
        return empty_figure(title, theme, "select an INO-SGD run and the IDP-SGD run it builds on")
    fig = base_figure(title, theme)
    gain = escape_columns(gain, "pair", "tier")
    dashes = ["solid", "dash", "dot", "dashdot"]
    for i, (pair, gp) in enumerate(gain.groupby("pair", sort=False)):
        for tier, g in gp.groupby("tier", sort=False):
            fig.add_trace(go.Scatter(x=g["step"], y=g["gain"], mode="lines+markers",
                                     name=f"{tier}" + (f" · {pair}" if gain["pair"].nunique() > 1 else ""),
                                     line=dict(color=tier_color(int(g["tier_index"].iloc[0])),
                                               dash=dashes[i % len(dashes)]), marker=dict(size=5)))
    fig.add_hline(y=0, line=dict(color="gray", width=1))
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="recall gain (INO − IDP)")
    return fig


def fig_recall_auc(auc: pd.DataFrame, *, theme: str = "light", run_colors: dict | None = None,
                   title: str = "Area under each tier's recall curve") -> go.Figure:
    if auc.empty:
        return empty_figure(title, theme, "no evaluations yet")
    colors = run_colors or colors_from_frame(auc)
    auc = escape_columns(auc, "run", "tier")
    fig = base_figure(title, theme)
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
        return empty_figure(title, theme, "no evaluations yet")
    colors = run_colors or colors_from_frame(final)
    final = escape_columns(final, "run")
    fig = make_subplots(rows=1, cols=2, subplot_titles=["test loss", "test accuracy"], horizontal_spacing=0.1)
    base_figure(title, theme, fig)
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
        return empty_figure(title, theme, "fairness metrics exist for binary tabular datasets with a sensitive attribute")
    colors = run_colors or colors_from_frame(fair)
    fig = base_figure(title, theme)
    names = {"demographic_parity_difference": "demographic parity diff.",
             "equalized_odds_difference": "equalized odds diff."}
    for (run_id, run), g in escape_columns(fair, "run").groupby(["run_id", "run"], sort=False):
        fig.add_trace(go.Bar(x=[names.get(m, esc(m)) for m in g["metric"]], y=g["value"], name=run,
                             marker_color=colors.get(run_id), text=g["value"].round(3), textposition="outside"))
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="difference", rangemode="tozero")
    return fig


# --- the figure set of a selection ------------------------------------------------------------------

def build_figures(runs: list[dict], *, theme: str = "light", names=None, mid_layout: str = "facet",
                  skip_empty: bool = False) -> list[FigureSpec]:
    """All figures for a selection of run records (``names`` restricts and orders them)."""
    names = list(names) if names is not None else list(LIVE_FIGURES + RESULT_FIGURES)
    colors = run_colors(runs)
    out: list[FigureSpec] = []
    hist = fr.tier_history(runs) if runs else pd.DataFrame(columns=fr.TIER_COLUMNS)
    notes = {run_label(r): dp_note(r) for r in runs}
    for name in names:
        if name == "mid_curves":
            spans = fr.mid_spans(runs)
            fig = fig_mid_curves(hist, spans, theme=theme, layout=mid_layout)
            data = hist[["run_id", "run", "algorithm", "step", "tier", "epsilon", "loss"]].merge(
                spans[["run_id", "tier", "onset_step", "end_step", "state"]], on=["run_id", "tier"], how="left")
            spec = FigureSpec(name, "MID curves", fig, data)
        elif name == "tier_recall":
            spec = FigureSpec(name, "Per-tier recall", fig_tier_recall(hist, theme=theme, run_colors=colors),
                              hist[["run_id", "run", "algorithm", "step", "tier", "epsilon", "recall", "accuracy"]])
        elif name == "class_recall":
            ch = fr.class_history(runs)
            spec = FigureSpec(name, "Per-class recall", fig_class_recall(ch, theme=theme, run_colors=colors), ch)
        elif name == "accuracy":
            ov = fr.overall_history(runs)
            spec = FigureSpec(name, "Overall accuracy", fig_accuracy(ov, theme=theme, run_colors=colors), ov)
        elif name == "epsilon_spent":
            spec = FigureSpec(name, "ε spent vs budget", fig_epsilon_spent(hist, theme=theme, notes=notes),
                              hist[["run_id", "run", "algorithm", "step", "tier", "epsilon", "epsilon_spent"]])
        elif name == "recall_vs_budget":
            owners = fr.owner_recall(runs)
            stats = fr.pearson_by_run(owners)
            fig = fig_recall_vs_budget(owners, stats, theme=theme, run_colors=colors)
            data = owners.merge(stats[["run_id", "r", "p"]], on="run_id", how="left")
            spec = FigureSpec(name, "Recall vs budget", fig, data)
        elif name == "recall_gain_class":
            g = fr.recall_gain_by_class(runs)
            spec = FigureSpec(name, "Recall gain per owner", fig_recall_gain_by_class(g, theme=theme), g)
        elif name == "recall_gain_time":
            g = fr.recall_gain_over_time(runs)
            spec = FigureSpec(name, "Recall gain over training", fig_recall_gain_over_time(g, theme=theme), g)
        elif name == "recall_auc":
            a = fr.recall_auc_table(runs)
            spec = FigureSpec(name, "Recall AUC", fig_recall_auc(a, theme=theme, run_colors=colors), a)
        elif name == "overall_bars":
            f = fr.final_table(runs)
            spec = FigureSpec(name, "Loss and accuracy", fig_overall_bars(f, theme=theme, run_colors=colors), f)
        elif name == "fairness_bars":
            f = fr.fairness_table(runs)
            spec = FigureSpec(name, "Fairness", fig_fairness_bars(f, theme=theme, run_colors=colors), f)
        elif name == "mid_summary":
            t = fr.mid_summary(runs)
            spec = FigureSpec(name, "MID summary", fig_table(t, theme=theme), t)
        else:
            raise ValueError(f"unknown figure {name!r}")
        if skip_empty and spec.data.empty:
            continue
        out.append(spec)
    return out
