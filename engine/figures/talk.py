"""The figures a talk needs: pure Plotly builders over the frames of :mod:`engine.figures.talk_frames`
(and :func:`engine.tools.sweep.sweep_frame`), and :func:`build_talk_figures`, their set for a selection of runs
(the Results page, ``python -m engine export`` and presentation packs include them).

* ``privacy_frontier`` — per-tier final recall vs the tier's ε, one line per algorithm (series), error
  bars = standard error over the series' seeds (or over the runs of one algorithm), each run faint;
* ``ino_internals`` — INO-SGD over training: mean ρ per tier and the fraction of clip mass down-weighted;
* ``group_clip`` — DP-SGD-S or DPSGD-F over training: each group's clip norm C_k and its noise relative to plain
  DP-SGD's at the same ε, (z_Δ · max_k C_k) / (σ·C) (the raw noise std for runs stored without σ);
* ``global_scale`` — DPSGD-Global-Adapt over training: its tracked threshold Z, its scale C / max(Z, C) and its noise
  against DP-SGD's (:mod:`engine.figures.global_scale`);
* ``individual_epsilon`` — per group (class, tier, attribute) the median individual ε a run spent on its samples,
  quartiles as whiskers, beside the tier's planned ε (:mod:`engine.figures.individual`);
* ``tif_sweep`` — a sweep group (:mod:`engine.tools.sweep`): the most private tier's recall gain INO − IDP as a
  heatmap over two of α, β, γ;
* ``audit_tiers`` — an audit (grouped by tier): GPR per tier (CI, its null floor) against the tier's ε with the
  largest advantage that ε allows, and the empirical ε lower bounds against the claimed ε;
* ``results_table`` — the one-slide table per algorithm.

User text (run, series, tier, group names) is escaped where it enters a figure.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.dp.algorithms import draws
from engine.figures import talk_frames as tf
from engine.figures.bands import seed_mean
from engine.figures.common_span import common_span, span_title
from engine.figures.global_scale import fig_global_scale, global_scale_frame
from engine.figures.individual import fig_individual, individual_frame
from engine.figures.scaffold import (FigureSpec, algo_color, base_figure, empty_figure, esc, escape_columns, facet_grid,
                                     fig_table, group_color, tier_color)
from engine.figures.sweep_frame import PARAM_LABELS, sweep_frame

TALK_FIGURES = ("privacy_frontier", "results_table", "ino_internals", "group_clip", "global_scale",
                "individual_epsilon", "tif_sweep", "audit_tiers")
TITLES = {"privacy_frontier": "Privacy–utility frontier", "results_table": "Results table",
          "ino_internals": "INO-SGD internals", "group_clip": "Group clips and their noise",
          "global_scale": "Global-Adapt's threshold and scale", "tif_sweep": "TIF sweep", "audit_tiers": "Audit: GPR vs ε",
          "individual_epsilon": "Individual ε per group"}
NOT_RECORDED = ("not recorded by this run: its evaluations carry no mean ρ per tier / down-weighted mass "
                f"(keys {tf.RHO_KEY}, {tf.DOWNWEIGHTED_KEY})")


def _series_colors(frame: pd.DataFrame) -> dict:
    """(escaped) series → colour: the algorithm's colour first, distinct ones for further series."""
    out, seen = {}, {}
    for s, a in dict.fromkeys(zip(frame["series"], frame["algorithm"])):
        k = seen.get(a, 0)
        out[s] = algo_color(a) if k == 0 else algo_color("", len(out) + k)
        seen[a] = k + 1
    return out


def _err(se) -> dict:
    return dict(type="data", array=pd.Series(se, dtype=float).fillna(0).to_numpy(), thickness=1.5, width=5)


def fig_privacy_frontier(frame: pd.DataFrame, *, theme: str = "light", value: str = "recall",
                         title: str | None = None, span=None) -> go.Figure:
    """Mean final recall (``value="recall"``) or recall AUC (``"recall_auc"``) per tier vs its ε; ``span``: the
    runs' common span (:mod:`engine.figures.common_span`), named in the title when it cuts a run."""
    se_col = "recall_se" if value == "recall" else "auc_se"
    what = "final recall" if value == "recall" else "recall AUC"
    if frame.empty:
        return empty_figure(title or f"Per-tier {what} vs ε", theme, "no evaluations in the selection")
    bars = "seeds" if (frame["error_bars"] == "seeds").any() else "runs"
    title = span_title(title or f"Privacy–utility frontier: per-tier {what} vs ε (mean ± s.e. over {bars})", span)
    df = escape_columns(frame, "series", "tier")
    colors = _series_colors(df)
    fig = base_figure(title, theme)
    for series, g in df.groupby("series", sort=False):
        m = g[g.kind == "mean"].sort_values("epsilon")
        n = int(m["n"].max())
        fig.add_trace(go.Scatter(x=m["epsilon"], y=m[value], mode="lines+markers", name=f"{series} (n={n})",
                                 error_y=_err(m[se_col]), legendgroup=series, line=dict(color=colors[series]),
                                 marker=dict(size=10), customdata=np.stack([m["tier"], m["n"]], axis=1),
                                 hovertemplate="%{customdata[0]} (ε=%{x}): %{y:.3f} (n=%{customdata[1]})"
                                               "<extra>" + series + "</extra>"))
        r = g[g.kind == "run"]
        if n > 1:
            fig.add_trace(go.Scatter(x=r["epsilon"], y=r[value], mode="markers", name=f"{series}: each run",
                                     legendgroup=series, showlegend=False, opacity=0.4, hoverinfo="skip",
                                     marker=dict(size=6, color=colors[series], symbol="circle-open")))
    fig.update_xaxes(title_text="privacy budget ε of the tier")
    fig.update_yaxes(title_text=what, range=[-0.02, 1.05])
    return fig


def _mean_lines(df: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """Mean (column ``mean``) and s.e. over seeds per (keys…, step) (:func:`engine.figures.bands.seed_mean`)."""
    return seed_mean(df, keys + ["step"], value).rename(columns={value: "mean"}).sort_values("step")


def _two_panels(df: pd.DataFrame, titles: list[str], title: str, theme: str):
    """Two side-by-side panels with their own y axes, and a line dash per series."""
    fig, _, _ = facet_grid(titles, title, theme, max_cols=2, horizontal_spacing=0.08)
    fig.update_yaxes(matches=None, showticklabels=True)
    return fig, dict(zip(dict.fromkeys(df["series"]), ["solid", "dash", "dot", "dashdot"] * 8))


def _seed_lines(fig, df: pd.DataFrame, keys: list[str], value: str, *, col: int, name, color, dashes) -> None:
    """One line per group of ``keys`` (series first): the mean over seeds at each step, ± s.e. as error bars."""
    for key, g in df.groupby(keys, sort=False):
        m = _mean_lines(g, [], value)
        fig.add_trace(go.Scatter(x=m["step"], y=m["mean"], error_y=_err(m["se"]), mode="lines+markers", name=name(key),
                                 legendgroup=name(key), line=dict(color=color(g), dash=dashes[key[0]])), row=1, col=col)


def fig_ino_internals(frame: pd.DataFrame, *, theme: str = "light", has_ino: bool = True,
                      title: str = "INO-SGD internals: mean ρ per tier and the clip mass down-weighted "
                                   "(training-batch diagnostics, outside the DP guarantee)") -> go.Figure:
    if frame.empty:
        return empty_figure(title, theme, NOT_RECORDED if has_ino else "select an INO-SGD run")
    df = escape_columns(frame, "series", "tier")
    fig, dashes = _two_panels(df, ["mean ρ per tier (importance weight)", "fraction of clip mass down-weighted"],
                              title, theme)
    multi = df["series"].nunique() > 1
    _seed_lines(fig, df[df.quantity == "rho"], ["series", "tier"], "value", col=1, dashes=dashes,
                name=lambda k: k[1] + (f" · {k[0]}" if multi else ""),
                color=lambda g: tier_color(int(g["tier_index"].iloc[0])))
    _seed_lines(fig, df[df.quantity == "downweighted"], ["series"], "value", col=2, dashes=dashes,
                name=lambda k: f"down-weighted · {k[0]}", color=lambda g: "#555")
    fig.update_yaxes(title_text="mean ρ", range=[-0.02, 1.05], row=1, col=1)
    fig.update_yaxes(title_text="Σ(1−ρ)C / ΣC", rangemode="tozero", row=1, col=2)
    fig.update_xaxes(title_text="step")
    return fig


def fig_group_clip(frame: pd.DataFrame, *, theme: str = "light",
                   title: str = "Per-group clip norm C_k and its noise vs DP-SGD at the same ε",
                   ) -> go.Figure:
    """Left: each group's clip C_k over training. Right: the noise relative to plain DP-SGD's at the same ε,
    (z_Δ · max_k C_k) / (σ·C), with DP-SGD at 1 (``noise_ratio``); the raw noise std where no run recorded σ
    (plans stored before it was)."""
    if frame.empty:
        return empty_figure(title, theme, "select a run whose clips move per group, such as DP-SGD-S or DPSGD-F "
                                          "(its evaluations carry group_clip_norms)")
    df = escape_columns(frame, "series", "group")
    has_ratio = "noise_ratio" in df and bool(np.isfinite(df["noise_ratio"].to_numpy(float)).any())
    second = "noise vs DP-SGD at the same ε: z_Δ · max C_k / (σ · C)" if has_ratio else "noise std (σ · max C_k)"
    fig, dashes = _two_panels(df, ["clip norm C_k per group", second], title, theme)
    multi = df["series"].nunique() > 1
    _seed_lines(fig, df, ["series", "group"], "clip_norm", col=1, dashes=dashes,
                name=lambda k: k[1] + (f" · {k[0]}" if multi else ""),
                color=lambda g: group_color(int(g["group_index"].iloc[0])))
    per_step = df.drop_duplicates(["run_id", "step"])
    if has_ratio:
        per_step = per_step[np.isfinite(per_step["noise_ratio"].to_numpy(float))]
        _seed_lines(fig, per_step, ["series"], "noise_ratio", col=2, dashes=dashes,
                    name=lambda k: f"noise ÷ DP-SGD's · {k[0]}", color=lambda g: "#555")
        fig.add_hline(y=1.0, line=dict(color="gray", width=1, dash="dot"), row=1, col=2,
                      annotation_text="DP-SGD (σ · C)", annotation_position="bottom right")
        fig.update_yaxes(title_text="× DP-SGD's noise std", rangemode="tozero", row=1, col=2)
    else:
        _seed_lines(fig, per_step, ["series"], "noise_std", col=2, dashes=dashes,
                    name=lambda k: f"noise std · {k[0]}", color=lambda g: "#555")
        fig.update_yaxes(title_text="noise std", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="C_k", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="step")
    return fig


def fig_sweep_heatmap(frame: pd.DataFrame, *, theme: str = "light", title: str | None = None) -> go.Figure:
    """The most private tier's recall gain INO − IDP (pp) in each cell of a sweep; missing cells blank."""
    if frame.empty:
        return empty_figure(title or "TIF sweep: recall gain of the most private tier", theme,
                            "not a sweep group (launch one from the TIF explorer), or no evaluations yet")
    xp, yp = frame["x_param"].iloc[0], frame["y_param"].iloc[0]
    what = "recall AUC" if frame["metric"].iloc[0] == "auc" else "recall"
    tier = esc(frame["tier"].iloc[0])
    title = title or f"TIF sweep: {tier} {what} gain INO − IDP (pp) over {PARAM_LABELS[xp]} × {PARAM_LABELS[yp]}"
    cells = frame.groupby(["y", "x"], sort=True)["gain"].mean().reset_index()
    xs, ys = sorted(cells["x"].unique()), sorted(cells["y"].unique())
    z = cells.pivot(index="y", columns="x", values="gain").reindex(index=ys, columns=xs)
    text = [[("" if not math.isfinite(v) else f"{v:+.1f}") for v in row] for row in z.to_numpy(float)]
    lim = float(np.nanmax(np.abs(z.to_numpy(float)))) if np.isfinite(z.to_numpy(float)).any() else 1.0
    fig = base_figure(title, theme)
    fig.add_trace(go.Heatmap(x=[f"{v:g}" for v in xs], y=[f"{v:g}" for v in ys], z=z.to_numpy(float), text=text,
                             texttemplate="%{text}", colorscale="RdBu", zmid=0, zmin=-max(lim, 1e-9),
                             zmax=max(lim, 1e-9), colorbar=dict(title="gain (pp)"),
                             hovertemplate=f"{PARAM_LABELS[xp]}=%{{x}}, {PARAM_LABELS[yp]}=%{{y}}: "
                                           "%{z:+.2f} pp<extra></extra>"))
    fig.update_xaxes(title_text=PARAM_LABELS[xp], type="category")
    fig.update_yaxes(title_text=PARAM_LABELS[yp], type="category")
    return fig


def fig_audit_tiers(frame: pd.DataFrame, *, theme: str = "light",
                    title: str = "Audit: GPR per tier vs its ε, and the empirical ε lower bound") -> go.Figure:
    """Left: each tier's GPR (bootstrap CI) against its claimed ε, with the largest advantage (ε, δ)-DP
    allows, (e^ε − 1 + 2δ)/(e^ε + 1) (Kairouz et al. 2015). Right: the audit's Clopper–Pearson ε lower bound
    (Jagielski et al. 2020) and the ε the GPR implies, ln((1 + GPR − 2δ)/(1 − GPR)), against the claimed ε."""
    if frame.empty:
        return empty_figure(title, theme, "no audit in the selection (run one on the Audit page)")
    df = escape_columns(frame, "label", "tier")
    fig, _, _ = facet_grid(["GPR per tier vs its ε", "empirical ε lower bound vs claimed ε"], title, theme,
                           max_cols=2, horizontal_spacing=0.08)
    fig.update_yaxes(matches=None, showticklabels=True)
    for k, (label, g) in enumerate(df.groupby("label", sort=False)):
        g = g.sort_values("epsilon")
        color = algo_color(g["algorithm"].iloc[0].split("/")[0], k)
        if g["gpr"].notna().any():
            fig.add_trace(go.Scatter(x=g["epsilon"], y=g["gpr"], mode="lines+markers", name=f"{label}: GPR",
                                     legendgroup=label, marker=dict(size=10, color=color), text=g["tier"],
                                     error_y=dict(type="data", symmetric=False,
                                                  array=(g["high"] - g["gpr"]).clip(lower=0).fillna(0),
                                                  arrayminus=(g["gpr"] - g["low"]).clip(lower=0).fillna(0)),
                                     hovertemplate="%{text} (ε=%{x}): GPR %{y:.4f}<extra>" + label + "</extra>"),
                          row=1, col=1)
        if g["null_floor"].notna().any():  # what the same scores give with membership shuffled: GPR's zero
            fig.add_trace(go.Scatter(x=g["epsilon"], y=g["null_floor"], mode="markers", name=f"{label}: null floor",
                                     legendgroup=label, text=g["tier"],
                                     marker=dict(size=16, color=color, symbol="line-ew-open", line=dict(width=2)),
                                     hovertemplate="%{text}: null floor %{y:.4f}<extra>" + label + "</extra>"),
                          row=1, col=1)
        fig.add_trace(go.Scatter(x=g["epsilon"], y=g["epsilon_lower_bound"], mode="markers",
                                 name=f"{label}: ε lower bound (Clopper–Pearson)", legendgroup=label, text=g["tier"],
                                 marker=dict(size=11, color=color, symbol="triangle-up"),
                                 hovertemplate="%{text}: ε ≥ %{y:.3f} (claimed %{x})<extra>" + label + "</extra>"),
                      row=1, col=2)
        if g["epsilon_from_gpr"].notna().any():
            fig.add_trace(go.Scatter(x=g["epsilon"], y=g["epsilon_from_gpr"], mode="markers",
                                     name=f"{label}: ε implied by GPR", legendgroup=label, text=g["tier"],
                                     marker=dict(size=9, color=color, symbol="circle-open"),
                                     hovertemplate="%{text}: ε ≳ %{y:.3f} from GPR<extra>" + label + "</extra>"),
                          row=1, col=2)
    eps = df["epsilon"].dropna()
    if not eps.empty:
        delta = float(df["delta"].dropna().max()) if df["delta"].notna().any() else 0.0
        grid = np.linspace(0, float(eps.max()) * 1.1, 60)
        fig.add_trace(go.Scatter(x=grid, y=[tf.advantage_ceiling(e, delta) for e in grid], mode="lines",
                                 name="largest advantage (ε, δ)-DP allows", hoverinfo="skip",
                                 line=dict(color="#888", dash="dash")), row=1, col=1)
        fig.add_trace(go.Scatter(x=[0, float(eps.max()) * 1.1], y=[0, float(eps.max()) * 1.1], mode="lines",
                                 name="claimed ε (bound must lie below)", hoverinfo="skip",
                                 line=dict(color="#888", dash="dot")), row=1, col=2)
        _zoom_below_ceiling(fig, df, delta, float(eps.min()))
    fig.update_xaxes(title_text="tier ε (claimed)")
    fig.update_yaxes(title_text="GPR (mean per-sample advantage)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="ε", rangemode="tozero", row=1, col=2)
    return fig


def _zoom_below_ceiling(fig: go.Figure, df: pd.DataFrame, delta: float, smallest_epsilon: float) -> None:
    """Audited GPRs are often a few hundredths while the (ε, δ)-DP ceiling is ~0.5–0.9: scaled to the ceiling,
    the tiers' GPRs and CIs would sit on one flat line. Then the GPR panel zooms to the data and says where the
    ceiling is."""
    values = pd.concat([df[c] for c in ("gpr", "low", "high", "null_floor")]).dropna()
    values = values[np.isfinite(values)]
    lowest = tf.advantage_ceiling(smallest_epsilon, delta)
    if values.empty or not np.isfinite(lowest) or lowest <= 3 * max(float(values.max()), 0.0):
        return
    top, bottom = float(values.max()), min(float(values.min()), 0.0)
    pad = 0.15 * max(top - bottom, 1e-6)
    fig.update_yaxes(range=[bottom - pad, top + 2 * pad], row=1, col=1)
    fig.add_annotation(text=f"(ε, δ)-DP ceiling at the tiers' ε: ≥ {lowest:.2f}, above this panel", showarrow=False,
                       xref="x domain", yref="y domain", x=0.98, y=0.98, xanchor="right", yanchor="top",
                       font=dict(size=11, color="#666"))


def fig_results_table(table: pd.DataFrame, *, theme: str = "light", title: str = "Results") -> go.Figure:
    if table.empty:
        return empty_figure(title, theme, "no evaluations in the selection")
    return fig_table(table, theme=theme, title=title)


def build_talk_figures(runs: list[dict], *, theme: str = "light", names=None, audit=None, sweep_metric: str = "auc",
                       sweep_epoch: float | None = None, skip_empty: bool = False) -> list[FigureSpec]:
    """The talk figures of a selection of run records (``names`` restricts and orders them); ``audit``: an
    audit report (or its results dict) for ``audit_tiers`` and the table's Δ column."""
    names = list(names) if names is not None else list(TALK_FIGURES)
    span = common_span(runs)  # the frontier and the table compare the runs over it (and say so when it cuts one)
    out = []
    for name in names:
        if name == "privacy_frontier":
            f = tf.frontier_frame(runs)
            fig = fig_privacy_frontier(f, theme=theme, span=span)
            spec = FigureSpec(name, TITLES[name], fig, f)
        elif name == "results_table":
            t = tf.results_table(runs, audit)
            spec = FigureSpec(name, TITLES[name], fig_results_table(t, theme=theme, title=span_title("Results", span)), t)
        elif name == "ino_internals":
            f = tf.ino_internals_frame(runs)
            has_ino = any(draws(r.get("algorithm"), name) for r in runs)
            spec = FigureSpec(name, TITLES[name], fig_ino_internals(f, theme=theme, has_ino=has_ino), f)
        elif name == "group_clip":
            f = tf.group_clip_frame(runs)
            spec = FigureSpec(name, TITLES[name], fig_group_clip(f, theme=theme), f)
        elif name == "global_scale":
            f = global_scale_frame(runs)
            spec = FigureSpec(name, TITLES[name], fig_global_scale(f, theme=theme), f)
        elif name == "individual_epsilon":
            f = individual_frame(runs)
            spec = FigureSpec(name, TITLES[name], fig_individual(f, theme=theme), f)
        elif name == "tif_sweep":
            f = sweep_frame(runs, metric=sweep_metric, epoch=sweep_epoch)
            spec = FigureSpec(name, TITLES[name], fig_sweep_heatmap(f, theme=theme), f)
        elif name == "audit_tiers":
            f = tf.audit_tier_frame(audit)
            spec = FigureSpec(name, TITLES[name], fig_audit_tiers(f, theme=theme), f)
        else:
            raise ValueError(f"unknown talk figure {name!r}; allowed: {', '.join(TALK_FIGURES)}")
        if skip_empty and spec.data.empty:
            continue
        out.append(spec)
    return out
