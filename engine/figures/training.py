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

from engine.dp.algorithms import draws
from engine.figures import bands as bd
from engine.figures import curves as cv
from engine.figures import frames as fr
from engine.figures import headline as hd
from engine.figures import talk
from engine.figures import talk_frames as tf
from engine.figures.common_span import common_span, span_title
from engine.figures.global_scale import fig_global_scale, global_scale_frame
from engine.figures.individual import fig_individual, individual_frame
from engine.figures.scaffold import (EXTRA_COLORS, FigureSpec, base_figure, colors_from_frame, empty_figure, esc,
                                     escape_columns, fig_table, render, run_colors)
from engine.jobs.runs import dp_note, formal_dp, run_label

LIVE_FIGURES = ("mid_curves", "tier_recall", "class_recall", "accuracy", "epsilon_spent")
RESULT_FIGURES = ("recall_vs_budget", "recall_gain_class", "recall_gain_time", "recall_auc", "overall_bars",
                  "fairness_bars", "mid_summary")
# built when named (not by default)
EXTRA_FIGURES = ("gain_spread", "group_clip", "global_scale", "private_gain", "individual_epsilon")
# the live view's too, when its comparison has a run whose algorithm draws it
DRAWN_LIVE_FIGURES = ("group_clip", "global_scale")
INDIVIDUAL_LIVE_FIGURES = ("individual_epsilon",)  # individual ε per group (engine.figures.individual)
# the live view's first figure when its comparison pairs an INO-SGD run with an IDP-SGD one: the headline
GAIN_LIVE_FIGURES = ("private_gain",)
# the figures drawn from plans (:mod:`engine.figures.curves`), which a live view patches in place
CURVE_NAMES = cv.CURVE_FIGURES + GAIN_LIVE_FIGURES


def live_figure_names(runs: list[dict]) -> tuple[str, ...]:
    """The live view's figures of a comparison (run records): the most private tier's INO − IDP recall gain
    first (``private_gain``) when the comparison pairs an INO-SGD run with an IDP-SGD one
    (:func:`engine.figures.frames.pair_runs`), :data:`LIVE_FIGURES`, and the group clips and noise vs DP-SGD at
    the same ε (``group_clip``, :func:`engine.figures.talk.fig_group_clip`) when one of its runs is of an algorithm
    that draws them (DP-SGD-S, DPSGD-F: ``engine.dp.algorithms.draws``)."""
    drawn = tuple(f for f in DRAWN_LIVE_FIGURES if any(draws(r.get("algorithm"), f) for r in runs))
    gain = GAIN_LIVE_FIGURES if fr.pair_runs(runs) else ()
    # whose privacy a run spends, as it trains: for the runs with a formal guarantee that measure it (the default)
    spends = any(formal_dp(r) and (r.get("config") or {}).get("individual_epsilon", True) for r in runs)
    return gain + LIVE_FIGURES + drawn + (INDIVIDUAL_LIVE_FIGURES if spends else ())


# --- live training: the curves (plans in engine.figures.curves) -----------------------------------------

GAIN_CLASS_TITLE = "Recall gain INO − IDP per owner vs ε"
RECALL_AUC_TITLE = "Area under each tier's recall curve"
OVERALL_TITLE = "Overall test loss and accuracy"
FAIRNESS_TITLE = "Outcome fairness (lower is fairer)"


def fig_mid_curves(hist: pd.DataFrame, *, theme: str = "light", layout: str = "facet", x_axis: str = "step",
                   smoothing: float = 0.0, bands: bool = True, title: str | None = None) -> go.Figure:
    """Per-tier test loss with the MID spans shaded (:func:`engine.figures.curves.mid_curves_plan`)."""
    return render(cv.mid_curves_plan(hist, layout=layout, x_axis=x_axis, smoothing=smoothing, bands=bands,
                                     title=title), theme)


def fig_tier_recall(hist: pd.DataFrame, *, theme: str = "light", x_axis: str = "step", smoothing: float = 0.0,
                    bands: bool = True, title: str = "Per-tier recall over training") -> go.Figure:
    return render(cv.tier_recall_plan(hist, x_axis=x_axis, smoothing=smoothing, bands=bands, title=title), theme)


def fig_class_recall(hist: pd.DataFrame, *, theme: str = "light", x_axis: str = "step", smoothing: float = 0.0,
                     bands: bool = True, title: str = "Per-class recall over training",
                     max_classes: int = 20) -> go.Figure:
    return render(cv.class_recall_plan(hist, x_axis=x_axis, smoothing=smoothing, bands=bands, title=title,
                                       max_classes=max_classes), theme)


def fig_accuracy(overall: pd.DataFrame, *, theme: str = "light", x_axis: str = "step", smoothing: float = 0.0,
                 bands: bool = True, title: str = "Overall test accuracy") -> go.Figure:
    return render(cv.accuracy_plan(overall, x_axis=x_axis, smoothing=smoothing, bands=bands, title=title), theme)


def fig_epsilon_spent(hist: pd.DataFrame, *, theme: str = "light", notes: dict | None = None,
                      accountants: dict | None = None, x_axis: str = "step", bands: bool = True,
                      title: str = "ε spent per tier vs budget (dashed)") -> go.Figure:
    """Per run: each tier's ε spent so far (under the run's accountant) and its budget as a dashed line."""
    return render(cv.epsilon_spent_plan(hist, notes=notes, accountants=accountants, x_axis=x_axis, bands=bands,
                                        title=title), theme)


def run_accountant(run: dict) -> str:
    """The accountant whose ε a run spends: its plan's (a plan stored before it said so: RDP), else its config's."""
    return (run.get("plan") or {}).get("accountant") or (run.get("config") or {}).get("accountant") or "rdp"


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
    fig.update_yaxes(title_text=f"recall per {kind}", range=[-0.02, 1.05])
    return fig


def fig_recall_gain_by_class(gain: pd.DataFrame, *, theme: str = "light",
                             title: str = GAIN_CLASS_TITLE) -> go.Figure:
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


def fig_recall_gain_over_time(gain: pd.DataFrame, *, theme: str = "light", x_axis: str = "step",
                              smoothing: float = 0.0, bands: bool = True,
                              title: str = "Recall gain INO − IDP per tier over training") -> go.Figure:
    """Per tier, INO − IDP (mean over paired seeds ± SE, and whether it is beyond the seed spread)."""
    return render(cv.recall_gain_time_plan(gain, x_axis=x_axis, smoothing=smoothing, bands=bands, title=title), theme)


def fig_gain_spread(spread: pd.DataFrame, *, theme: str = "light",
                    title: str = "Recall gain beyond the seed spread") -> go.Figure:
    """The gain-beyond-seed-spread frame as a table, with its verdict in words as the title's subtitle."""
    if spread.empty:
        return empty_figure(title, theme, "select an INO-SGD run and the IDP-SGD run it builds on")
    t = spread.assign(mean_gain=spread["mean_gain"].round(4), se=spread["se"].round(4), p=spread["p"].round(4))
    fig = fig_table(t[["series", "tier", "step", "mean_gain", "se", "n", "p", "beyond_spread"]], theme=theme, title=title)
    words = bd.gain_spread_words(spread)
    fig.add_annotation(text="<br>".join(esc(w) for w in words), xref="paper", yref="paper", x=0, y=1.0,
                       yanchor="bottom", xanchor="left", align="left", showarrow=False, font=dict(size=11))
    fig.update_layout(margin=dict(t=90 + 16 * len(words)))
    return fig


def fig_recall_auc(auc: pd.DataFrame, *, theme: str = "light", run_colors: dict | None = None,
                   title: str = RECALL_AUC_TITLE) -> go.Figure:
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
                     title: str = OVERALL_TITLE) -> go.Figure:
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
                      title: str = FAIRNESS_TITLE) -> go.Figure:
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

CURVE_TITLES = {"mid_curves": "MID curves", "tier_recall": "Per-tier recall", "class_recall": "Per-class recall",
                "accuracy": "Overall accuracy", "epsilon_spent": "ε spent vs budget",
                "recall_gain_time": "Recall gain over training",
                "private_gain": "INO gain, most private tier"}


def private_gain_title(gain: pd.DataFrame) -> str:
    """The ``private_gain`` figure's title: the tier's ε when the gain frame has one."""
    eps = gain["epsilon"].dropna() if "epsilon" in gain else ()
    where = f" (ε = {float(eps.iloc[0]):g})" if len(eps) else ""
    return f"Recall gain INO − IDP on the most private tier{where}: paired seeds, mean ± s.e."


def curve_parts(runs: list[dict], names, *, mid_layout: str = "facet", x_axis: str = "step", smoothing: float = 0.0,
                bands: bool = True, memo: dict | None = None, frames: dict | None = None) -> dict:
    """name → (plan, data frame) for the curve figures among ``names`` (frames computed once; ``memo``: the
    frames' row memo of a live view, see :func:`engine.figures.frames.tier_history`). ``frames``: a dict the
    caller keeps while the runs' evaluations stay the same (a live view keys it by their last logged step): the
    data frames do not depend on the options (x unit, smoothing, layout, bands), so a view change takes them from
    it and computes only the plans."""
    out = {}
    cache = {} if frames is None else frames

    def kept(key, make):
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def hist():
        return kept("hist", lambda: fr.tier_history(runs, memo) if runs else pd.DataFrame(columns=fr.TIER_COLUMNS))

    opts = dict(x_axis=x_axis, smoothing=smoothing, bands=bands)
    ids = fr.ID_COLUMNS
    for name in names:
        if name == "mid_curves":
            h = hist()
            plan = cv.mid_curves_plan(h, layout=mid_layout, **opts)
            data = kept(name, lambda: h[ids + ["step", "epoch", "elapsed", "tier", "epsilon", "loss"]].merge(
                fr.mid_spans(runs, memo)[["run_id", "tier", "onset_step", "end_step", "state"]],
                on=["run_id", "tier"], how="left"))
        elif name == "tier_recall":
            h = hist()
            plan = cv.tier_recall_plan(h, **opts)
            data = kept(name, lambda: h[ids + ["step", "epoch", "elapsed", "tier", "epsilon", "epsilon_spent",
                                             "recall", "accuracy"]])
        elif name == "class_recall":
            data = kept(name, lambda: fr.class_history(runs, memo))
            plan = cv.class_recall_plan(data, **opts)
        elif name == "accuracy":
            data = kept(name, lambda: fr.overall_history(runs, memo))
            plan = cv.accuracy_plan(data, **opts)
        elif name == "epsilon_spent":
            h = hist()
            plan = cv.epsilon_spent_plan(h, notes={run_label(r): dp_note(r) for r in runs},
                                         accountants={run_label(r): run_accountant(r) for r in runs}, x_axis=x_axis,
                                         bands=bands)
            data = kept(name, lambda: h[ids + ["step", "epoch", "elapsed", "tier", "epsilon", "epsilon_spent"]])
        elif name == "recall_gain_time":
            data = kept(name, lambda: fr.recall_gain_over_time(runs, hist(), memo))
            plan = cv.recall_gain_time_plan(data, **opts)
        elif name == "private_gain":  # the Results page's gain frame, cut to the tier the lab is about
            data = kept(name, lambda: hd.private_gain(runs, fr.recall_gain_over_time(runs, hist(), memo), memo))
            plan = cv.recall_gain_time_plan(data, title=private_gain_title(data), **opts)
        else:
            continue
        out[name] = (plan, data)
    return out


def build_figures(runs: list[dict], *, theme: str = "light", names=None, mid_layout: str = "facet",
                  x_axis: str = "step", smoothing: float = 0.0, bands: bool = True,
                  skip_empty: bool = False, memo: dict | None = None) -> list[FigureSpec]:
    """All figures for a selection of run records (``names`` restricts and orders them; default: the live and
    the result figures). ``mid_layout`` "facet" | "overlay" (the most private tier of every run on one
    panel); ``x_axis`` "step" | "epoch" | "elapsed" | "epsilon"; ``smoothing``: EMA weight in [0, 0.99) (raw
    drawn faint); ``bands``: a series of several seeds as its mean ± 1 SE. ``memo``: a live view's frame memo
    (:mod:`engine.figures.frames`); by default one for this build, so each evaluation is read once."""
    names = list(names) if names is not None else list(LIVE_FIGURES + RESULT_FIGURES)
    bd.check_options(mid_layout=mid_layout, x_axis=x_axis, smoothing=smoothing)
    unknown = [n for n in names if n not in LIVE_FIGURES + RESULT_FIGURES + EXTRA_FIGURES]
    if unknown:
        raise ValueError(f"unknown figure {unknown[0]!r}")
    memo = {} if memo is None else memo
    curves = curve_parts(runs, names, mid_layout=mid_layout, x_axis=x_axis, smoothing=smoothing, bands=bands,
                         memo=memo)
    colors = run_colors(runs)
    span = common_span(runs)  # what every comparison below is computed over (and says, when it cuts a run)
    out: list[FigureSpec] = []
    for name in names:
        if name in curves:
            plan, data = curves[name]
            spec = FigureSpec(name, CURVE_TITLES[name], render(plan, theme), data)
        elif name == "recall_vs_budget":
            owners = fr.owner_recall(runs, memo, span)
            stats = fr.pearson_by_run(owners)
            fig = fig_recall_vs_budget(owners, stats, theme=theme, run_colors=colors,
                                       title=span_title("Per-owner recall vs privacy budget", span))
            data = owners.merge(stats[["run_id", "r", "p"]], on="run_id", how="left")
            spec = FigureSpec(name, "Recall vs budget", fig, data)
        elif name == "recall_gain_class":
            g = fr.recall_gain_by_class(runs, memo, span)
            fig = fig_recall_gain_by_class(g, theme=theme, title=span_title(GAIN_CLASS_TITLE, span))
            spec = FigureSpec(name, "Recall gain per owner", fig, g)
        elif name == "group_clip":  # the talk figure, built on the live view's memo
            f = tf.group_clip_frame(runs, memo)
            spec = FigureSpec(name, talk.TITLES[name], talk.fig_group_clip(f, theme=theme), f)
        elif name == "global_scale":  # the talk figure, built on the live view's memo
            f = global_scale_frame(runs, memo)
            spec = FigureSpec(name, talk.TITLES[name], fig_global_scale(f, theme=theme), f)
        elif name == "individual_epsilon":  # the talk figure, built on the live view's memo
            f = individual_frame(runs, memo)
            spec = FigureSpec(name, talk.TITLES[name], fig_individual(f, theme=theme), f)
        elif name == "gain_spread":
            t = bd.recall_gain_spread(fr.recall_gain_over_time(runs, memo=memo))
            spec = FigureSpec(name, "Gain beyond seed spread", fig_gain_spread(t, theme=theme), t)
        elif name == "recall_auc":
            a = fr.recall_auc_table(runs, memo, span)
            fig = fig_recall_auc(a, theme=theme, run_colors=colors, title=span_title(RECALL_AUC_TITLE, span))
            spec = FigureSpec(name, "Recall AUC", fig, a)
        elif name == "overall_bars":
            f = fr.final_table(runs, memo, span)
            fig = fig_overall_bars(f, theme=theme, run_colors=colors, title=span_title(OVERALL_TITLE, span))
            spec = FigureSpec(name, "Loss and accuracy", fig, f)
        elif name == "fairness_bars":
            f = fr.fairness_table(runs, memo, span)
            fig = fig_fairness_bars(f, theme=theme, run_colors=colors, title=span_title(FAIRNESS_TITLE, span))
            spec = FigureSpec(name, "Fairness", fig, f)
        else:  # mid_summary
            t = fr.mid_summary(runs, memo, span)
            spec = FigureSpec(name, "MID summary", fig_table(t, theme=theme, title=span_title("MID summary", span)), t)
        if skip_empty and spec.data.empty:
            continue
        out.append(spec)
    return out
