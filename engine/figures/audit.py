"""Figures of a privacy audit: pure Plotly builders over the tidy frames of the typed
:class:`~engine.audit.pa_alooa.report.AuditReport` (each builder takes a report or the stored results dict, a
running audit's partial one too). Nothing here reads the store or calls Streamlit. :func:`build_audit_figures` returns
:class:`~engine.figures.scaffold.FigureSpec` s, so the dashboard's export menu (PNG/SVG/PDF/HTML + CSV of
the data) and presentation packs work alike. Group, tier and algorithm names are escaped.

Figures: GPR bars per group grouped by algorithm (bootstrap CI whiskers, each group's own null floor as a
tick on its bar, "Δ not resolved" named below the plot; more than four algorithms: a panel each; legends beside
the plot); the Δ table (pp, bias-corrected, with CI, the null Δ spread and whether Δ is resolved) and accuracy per
algorithm;
per-tier empirical ε lower bound next to the claimed ε; LiRA ROC per group on log-log axes; per-sample advantage histograms; baselines
(PA-GA, PA-GBA, PA-LOOA) next to PA-ALOOA.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from engine.audit.pa_alooa.report import AuditReport, as_report
from engine.audit.pa_alooa.stats import DELTA_METHOD_SHORT
from engine.figures.scaffold import (LEGEND_BESIDE, FigureSpec, algo_color, base_figure, empty_figure, esc,
                                     escape_columns, facet_grid, fig_table, group_color, notes_below)

AUDIT_FIGURES = ("gpr_bars", "delta_table", "accuracy", "epsilon_bounds", "lira_roc", "advantage_hist", "baselines",
                 "paired_differences")
NO_RESULTS = "No audit results yet"
# More audited algorithms than this (six with DP-SGD-S's controls): the GPR and ε-bound charts draw one panel per
# algorithm (small multiples) instead of six to twelve bars side by side in each group.
MAX_GROUPED_ALGORITHMS = 4


def _colors(report: AuditReport) -> dict:
    """Escaped algorithm label → colour."""
    return {esc(a.label): algo_color(a.key if a.control is not None else a.name, k)
            for k, a in enumerate(report.algorithms)}


def _group_title(report: AuditReport) -> str:
    by, attr = report.group_by or "group", report.config.get("group_attribute")
    return {"attribute": f"sensitive attribute{(' ' + esc(attr)) if attr else ''}", "class": "class",
            "tier": "privacy tier"}.get(by, esc(by))


def _top(title: str, theme: str, fig: go.Figure | None = None) -> go.Figure:
    """A one-panel audit figure: its legend beside the plot (never over the title or a note, however many
    algorithms: :data:`engine.figures.scaffold.LEGEND_BESIDE`)."""
    fig = base_figure(title, theme, fig)
    fig.update_layout(legend=LEGEND_BESIDE)
    return fig


def _grid(labels: list, title: str, theme: str):
    """One panel per algorithm, at most three a row, the legend beside them."""
    fig, rows, cols = facet_grid(labels, title, theme, horizontal_spacing=0.05, vertical_spacing=0.16)
    fig.update_layout(height=max(400, 120 + 300 * rows), margin=dict(t=110), legend=LEGEND_BESIDE)
    return fig, rows, cols


def _note_below(fig: go.Figure, lines: list[str]) -> None:
    """``lines`` (escaped) under the plot, the figure grown by them (:func:`engine.figures.scaffold.notes_below`):
    a note in the title's second line had run over a legend above the plot."""
    top, bottom = fig.layout.margin.t or 80, fig.layout.margin.b or 50
    plot_px = (fig.layout.height or 450) - top - bottom
    note, layout = notes_below(lines, plot_px=plot_px, top_px=top)
    fig.add_annotation(**note)
    fig.update_layout(**layout)


def _panels(labels: list, title: str, theme: str):
    """(figure, where) for a per-group chart of the algorithms ``labels`` (escaped): up to
    :data:`MAX_GROUPED_ALGORITHMS` side by side on one panel (``where(k)`` = {}), more one panel each
    (``where(k)`` = that panel's row and col)."""
    if len(labels) <= MAX_GROUPED_ALGORITHMS:
        return _top(title, theme), lambda k: {}
    fig, rows, cols = _grid(labels, title, theme)
    return fig, lambda k: {"row": k // cols + 1, "col": k % cols + 1}


def fig_gpr_bars(results, *, theme: str = "light", title: str | None = None) -> go.Figure:
    report = as_report(results)
    title = title or (f"Group privacy risk (PA-ALOOA, {(report.threshold or 'in_sample').replace('_', '-')} "
                      f"thresholds, 2R = {report.n_models or '?'})")
    df = report.gpr_frame()
    if df.empty:
        return empty_figure(title, theme, NO_RESULTS, legend="top")
    colors = _colors(report)
    frame = escape_columns(df, "label", "group")
    labels = list(dict.fromkeys(frame["label"]))
    fig, where = _panels(labels, title, theme)
    for k, (label, g) in enumerate(frame.groupby("label", sort=False)):
        # offsetgroup: each algorithm's bar beside the others' (not on top), its CI and null floor tick on it
        fig.add_trace(go.Bar(x=g["group"], y=g["gpr"], name=label, marker_color=colors.get(label), offsetgroup=label,
                             error_y=dict(type="data", symmetric=False, array=(g["high"] - g["gpr"]).clip(lower=0),
                                          arrayminus=(g["gpr"] - g["low"]).clip(lower=0), thickness=1.5, width=4),
                             customdata=np.stack([g["low"], g["high"], g["n"].fillna(0)], axis=1),
                             hovertemplate="%{x}: GPR %{y:.4f} [%{customdata[0]:.4f}, %{customdata[1]:.4f}]"
                                           "<br>n = %{customdata[2]}<extra>" + label + "</extra>"), **where(k))
        # each group's own null floor (permuted membership within the group), on its algorithm's bar
        if g["null_floor"].notna().any():
            fig.add_trace(go.Scatter(x=g["group"], y=g["null_floor"], mode="markers", name=f"{label}: null floor",
                                     offsetgroup=label, legendgroup="null floor", showlegend=False,
                                     marker=dict(symbol="line-ew-open", size=22, color="#555",
                                                 line=dict(width=3, color="#555")),
                                     hovertemplate="%{x}: null floor %{y:.4f} (permuted membership)<extra>" + label
                                                   + "</extra>"), **where(k))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="null floor (each group's own)",
                             legendgroup="null floor",
                             marker=dict(symbol="line-ew-open", size=22, color="#555", line=dict(width=3, color="#555"))),
                  **where(0))
    unresolved = [esc(a.label) for a in report.algorithms if a.resolved is False]
    if unresolved:
        _note_below(fig, ["Δ not resolved (its CI reaches the null Δ spread): " + ", ".join(unresolved)])
    fig.update_layout(scattermode="group", barmode="group")
    fig.update_xaxes(type="category", title_text=_group_title(report))
    fig.update_yaxes(title_text="GPR = mean per-sample advantage", **({"col": 1} if where(0) else {}))
    return fig


def _table(df, title: str, theme: str) -> go.Figure:
    return empty_figure(title, theme, NO_RESULTS, legend="top") if df.empty else fig_table(df, theme=theme, title=title)


def fig_delta_table(results, *, theme: str = "light", title: str | None = None) -> go.Figure:
    """The Δ table; its default title names how Δ was estimated (bias-corrected from version 3 of the report)."""
    report = as_report(results)
    if title is None:
        title = (f"Δ (pp): max − min GPR, {DELTA_METHOD_SHORT}" if report.delta_bias_corrected
                 else "Δ = (max − min GPR) × 100, in pp")
    return _table(report.delta_frame(), title, theme)


def fig_accuracy(results, *, theme: str = "light",
                 title: str = "Test accuracy per algorithm (mean ± sd over models)") -> go.Figure:
    report = as_report(results)
    df = report.accuracy_frame()
    if df.empty:
        return empty_figure(title, theme, NO_RESULTS, legend="top")
    fig = _top(title, theme)
    df = escape_columns(df, "label", "group")
    overall = df[df["group"] == "all"]
    colors = _colors(report)
    fig.add_trace(go.Bar(x=overall["label"], y=overall["accuracy"], name="all", showlegend=False,
                         marker_color=[colors.get(lab) for lab in overall["label"]],
                         error_y=dict(type="data", array=overall["std"].fillna(0)),
                         hovertemplate="%{x}: %{y:.4f}<extra>all test samples</extra>"))
    per = df[df["group"] != "all"]
    for k, (g, d) in enumerate(per.groupby("group", sort=False)):
        fig.add_trace(go.Scatter(x=d["label"], y=d["accuracy"], mode="markers", name=f"group {g}",
                                 marker=dict(symbol="diamond", size=11, color=group_color(k),
                                             line=dict(width=1, color="#333")),
                                 hovertemplate="%{x}, group " + str(g) + ": %{y:.4f}<extra></extra>"))
    lo = float(np.nanmin(df["accuracy"])) if df["accuracy"].notna().any() else 0.0
    fig.update_layout(yaxis_title="accuracy", yaxis_range=[max(0.0, lo - 0.1), 1.0])
    return fig


def fig_epsilon_bounds(results, *, theme: str = "light",
                       title: str = "Per-tier empirical ε lower bound vs claimed ε") -> go.Figure:
    report = as_report(results)
    df = report.epsilon_frame()
    if df.empty:
        return empty_figure(title, theme, NO_RESULTS, legend="top")
    conf = df["confidence"].dropna()
    title += f" ({int(round(100 * conf.iloc[0]))}% Clopper–Pearson)" if len(conf) else ""
    colors = _colors(report)
    frame = escape_columns(df, "label", "tier")
    fig, where = _panels(list(dict.fromkeys(frame["label"])), title, theme)
    for k, (label, d) in enumerate(frame.groupby("label", sort=False)):
        fig.add_trace(go.Bar(x=d["tier"], y=d["lower_bound"], name=f"{label}: lower bound", offsetgroup=label,
                             marker_color=colors.get(label), legendgroup=label, texttemplate="%{y:.2f}",
                             textposition="outside", cliponaxis=False,
                             customdata=np.stack([d["tpr"], d["fpr"]], axis=1),
                             hovertemplate="%{x}: ε ≥ %{y:.3f} (TPR %{customdata[0]:.4f}, FPR %{customdata[1]:.4f})"
                                           "<extra>" + label + "</extra>"), **where(k))
        claimed = d["claimed"]
        if claimed.notna().any():
            fig.add_trace(go.Scatter(x=d["tier"], y=claimed, mode="markers", name=f"{label}: claimed ε",
                                     offsetgroup=label, legendgroup=label, showlegend=True,
                                     marker=dict(symbol="line-ew-open", size=28, color=colors.get(label),
                                                 line=dict(width=4, color=colors.get(label))),
                                     hovertemplate="%{x}: claimed ε = %{y:.3f}<extra>" + label + "</extra>"),
                          **where(k))
    fig.update_layout(barmode="group", scattermode="group")
    fig.update_xaxes(type="category", title_text="privacy tier")
    fig.update_yaxes(title_text="ε", **({"col": 1} if where(0) else {}))
    fig.update_yaxes(rangemode="tozero")
    return fig


def fig_lira_roc(results, *, theme: str = "light", title: str = "LiRA ROC per group (log-log)") -> go.Figure:
    report = as_report(results)
    df = report.roc_frame()
    if df.empty:
        return empty_figure(title, theme, NO_RESULTS, legend="top")
    df = escape_columns(df, "label", "group")
    labels = list(dict.fromkeys(df["label"]))
    fig, rows, cols = _grid(labels, title, theme)
    groups = list(dict.fromkeys(df["group"]))
    for i, label in enumerate(labels):
        r, c = i // cols + 1, i % cols + 1
        fig.add_trace(go.Scatter(x=[1e-5, 1], y=[1e-5, 1], mode="lines", line=dict(dash="dot", color="#999"),
                                 name="chance", showlegend=i == 0, legendgroup="chance", hoverinfo="skip"),
                      row=r, col=c)
        d = df[df["label"] == label]
        for k, g in enumerate(groups):
            dg = d[(d["group"] == g) & (d["tpr"] > 0)]  # TPR = 0 has no place on a log axis
            if dg.empty:
                continue
            auc_ = dg["auc"].iloc[0]
            fig.add_trace(go.Scatter(x=dg["fpr"], y=dg["tpr"], mode="lines", line=dict(color=group_color(k), width=2),
                                     name=f"group {g}", legendgroup=f"g{k}", showlegend=i == 0,
                                     hovertemplate=f"group {g} (AUC {auc_:.3f})<br>FPR %{{x:.2e}}, TPR %{{y:.2e}}"
                                                   "<extra>" + label + "</extra>"), row=r, col=c)
        fig.update_xaxes(type="log", range=[-5, 0], title_text="FPR" if r == rows else None, row=r, col=c)
        fig.update_yaxes(type="log", range=[-5, 0], row=r, col=c)
    fig.update_yaxes(title_text="TPR", col=1)
    return fig


def fig_advantage_hist(results, *, theme: str = "light",
                       title: str = "Per-sample membership advantage (fraction of each group)") -> go.Figure:
    report = as_report(results)
    df = report.histogram_frame()
    if df.empty:
        return empty_figure(title, theme, NO_RESULTS, legend="top")
    df = escape_columns(df, "label", "group")
    labels = list(dict.fromkeys(df["label"]))
    fig, rows, cols = _grid(labels, title, theme)
    groups = list(dict.fromkeys(df["group"]))
    floor = {esc(a.label): a.null_floor for a in report.algorithms}
    for i, label in enumerate(labels):
        r, c = i // cols + 1, i % cols + 1
        d = df[df["label"] == label]
        for k, g in enumerate(groups):
            dg = d[d["group"] == g]
            fig.add_trace(go.Bar(x=(dg["bin_low"] + dg["bin_high"]) / 2, y=dg["fraction"],
                                 width=(dg["bin_high"] - dg["bin_low"]), name=f"group {g}", legendgroup=f"g{k}",
                                 showlegend=i == 0, marker_color=group_color(k), opacity=0.55,
                                 hovertemplate=f"group {g}: %{{y:.3f}} at advantage %{{x:.3f}}<extra>{label}</extra>"),
                          row=r, col=c)
        if floor.get(label) is not None and np.isfinite(floor[label]):
            fig.add_vline(x=floor[label], line=dict(dash="dash", color="#888"), row=r, col=c)
        fig.update_xaxes(title_text="advantage (TPR − FPR)" if r == rows else None, row=r, col=c)
    fig.update_yaxes(title_text="fraction of group", col=1)
    fig.update_layout(barmode="overlay")
    return fig


def fig_baselines(results, *, theme: str = "light",
                  title: str = "Baselines: PA-GA, PA-GBA and PA-LOOA next to PA-ALOOA") -> go.Figure:
    return _table(as_report(results).baselines_frame(), title, theme)


def fig_paired_differences(results, *, theme: str = "light",
                           title: str = "DP-SGD-S against DP-SGD and its controls: paired differences (a − b)") -> go.Figure:
    """One row per comparison: Δ_a − Δ_b and each group's GPR_a − GPR_b (pp), paired CIs; the unpaired Δ CI
    drawn faint behind; a zero line. Left of zero: DP-SGD-S lowers it."""
    report = as_report(results)
    df = report.comparison_frame()
    df = df[df["quantity"] != "accuracy"]
    if df.empty:
        return empty_figure(title, theme, "no paired comparisons: audit DP-SGD-S and DP-SGD together (add controls "
                                          "for the noise- and accuracy-matched DP-SGD)", legend="top")
    df = escape_columns(df, "b_label", "group")
    df["row"] = np.where(df["quantity"] == "Δ", "Δ", "GPR " + df["group"].astype(str))
    fig = _top(title, theme)
    colors = _colors(report)
    labels = {esc(a.key): esc(a.label) for a in report.algorithms}
    for b, d in df.groupby("b", sort=False):
        label = labels.get(esc(b), esc(b))
        color = colors.get(label)
        u = d[d["quantity"] == "Δ"]
        fig.add_trace(go.Scatter(x=u["value"], y=u["row"], mode="markers", showlegend=False, hoverinfo="skip",
                                 orientation="h",
                                 marker=dict(size=1, color=color), opacity=0.35, offsetgroup=label,
                                 error_x=dict(type="data", symmetric=False, array=u["unpaired_high"] - u["value"],
                                              arrayminus=u["value"] - u["unpaired_low"], thickness=8, width=0)))
        fig.add_trace(go.Scatter(x=d["value"], y=d["row"], mode="markers", name=f"− {label}", offsetgroup=label,
                                 orientation="h",  # with scattermode "group": one row per comparison within a quantity
                                 marker=dict(size=11, color=color, symbol="diamond"),
                                 error_x=dict(type="data", symmetric=False, array=d["high"] - d["value"],
                                              arrayminus=d["value"] - d["low"], thickness=2, width=6),
                                 customdata=np.stack([d["low"], d["high"]], axis=1),
                                 hovertemplate="%{y}: %{x:+.2f} pp [%{customdata[0]:+.2f}, %{customdata[1]:+.2f}]"
                                               "<extra>DP-SGD-S − " + label + "</extra>"))
    fig.add_vline(x=0, line=dict(color="#555", width=1))
    fig.update_layout(scattermode="group", xaxis_title="difference (pp): left of 0, DP-SGD-S lower",
                      yaxis=dict(type="category", autorange="reversed"))
    fig.update_layout(title_text=(fig.layout.title.text or "") + "<br><sub>paired bootstrap CIs (thin); the unpaired "
                      "Δ CI (thick, faint) is what two independent CIs would imply</sub>")
    return fig


def build_audit_figures(results, *, theme: str = "light", names=None) -> list[FigureSpec]:
    """Every audit figure with the data it shows (for the UI, CSV/PNG export and presentation packs)."""
    report = as_report(results)
    figures = {"gpr_bars": ("Group privacy risk", fig_gpr_bars, report.gpr_frame),
               "delta_table": ("Δ table", fig_delta_table, report.delta_frame),
               "accuracy": ("Accuracy", fig_accuracy, report.accuracy_frame),
               "epsilon_bounds": ("ε lower bounds", fig_epsilon_bounds, report.epsilon_frame),
               "lira_roc": ("LiRA ROC", fig_lira_roc, report.roc_frame),
               "advantage_hist": ("Advantage histogram", fig_advantage_hist, report.histogram_frame),
               "baselines": ("Baselines", fig_baselines, report.baselines_frame),
               "paired_differences": ("Paired differences", fig_paired_differences, report.comparison_frame)}
    out = []
    for name in (list(names) if names is not None else list(AUDIT_FIGURES)):
        if name not in figures:
            raise ValueError(f"unknown audit figure {name!r}; allowed: {', '.join(AUDIT_FIGURES)}")
        title, fig, frame = figures[name]
        out.append(FigureSpec(name, title, fig(report, theme=theme), frame()))
    return out

