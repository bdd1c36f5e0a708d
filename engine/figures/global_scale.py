"""DPSGD-Global-Adapt's own figure (``global_scale``, its registry entry's figures): over training, the privately
tracked threshold Z (with C, below which Z stops mattering: the step clips at Z' = max(Z, C)), the one scale
C / Z' every gradient of a step is multiplied by, and the step's noise std z_Δ · C against plain DP-SGD's σ · C at
the same ε (what the threshold's noisy count costs). From each evaluation's ``EvalRecord.global_scale`` and
``group_clip`` (``GlobalScaling.model_state``) and the plan's set-up (``PlanRecord.group_clip``).

    global_scale_frame(runs, memo)   one row per run and evaluation
    fig_global_scale(frame)          three panels, one line per series (the mean over its seeds, ± s.e.)
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.dp.algorithms import draws
from engine.figures import frames as fr
from engine.figures.bands import seed_mean
from engine.figures.scaffold import algo_color, empty_figure, esc, escape_columns, facet_grid
from engine.jobs.runs import algorithm_label, run_label, seed_index
from engine.train.records import PlanRecord

FIGURE = "global_scale"
TITLE = "DPSGD-Global-Adapt: threshold Z, scale C/Z and noise"
GLOBAL_SCALE_COLUMNS = ["run_id", "run", "series", "algorithm", "seed_index", "step", "epoch", "threshold",
                        "applied_threshold", "scale", "noise_std", "base_clip", "dpsgd_noise_std"]
# short enough for three panels side by side (the step clips at max(Z, C): the dotted C says where Z stops counting)
PANELS = ("threshold Z (dotted: C)", "scale C / max(Z, C)", "noise z_Δ·C (dotted: DP-SGD's σ·C)")
EMPTY = ("select a DPSGD-Global-Adapt run (its evaluations carry global_threshold and global_scale: runs trained "
         "before they were recorded do not)")


def global_scale_frame(runs: list[dict], memo: dict | None = None) -> pd.DataFrame:
    """Per run of an algorithm that draws ``global_scale`` (DPSGD-Global-Adapt) and evaluation: the tracked
    threshold Z, the threshold the step clips at max(Z, C) (``applied_threshold``), the scale C / max(Z, C), the
    step's noise std z_Δ · C, the run's C (``base_clip``) and plain DP-SGD's noise std σ · C at the same ε (NaN for a
    plan stored without σ). ``memo``: a live view's frame memo (:func:`engine.figures.frames.run_evals`)."""
    rows = []
    labels = fr.series_labels(runs)
    for run in runs:
        if not draws(run.get("algorithm"), FIGURE):  # its registry entry's figures say so
            continue
        setup = PlanRecord.of(run.get("plan")).group_clip
        base_clip = fr._finite(setup.base_clip if setup is not None else None)
        sigma = fr._finite(setup.dpsgd_noise_multiplier if setup is not None else None)
        for e in fr.run_evals(run, memo):
            if e.global_scale is None:
                continue
            clips = e.group_clip
            rows.append({"run_id": run["id"], "run": run_label(run), "series": labels[run["id"]],
                         "algorithm": algorithm_label(run.get("algorithm")), "seed_index": seed_index(run),
                         "step": e.step, "epoch": e.epoch, "threshold": fr._finite(e.global_scale.threshold),
                         "applied_threshold": fr._finite(clips.clip_norms[0] if clips and clips.clip_norms else None),
                         "scale": fr._finite(e.global_scale.scale),
                         "noise_std": fr._finite(clips.noise_std if clips is not None else None),
                         "base_clip": base_clip, "dpsgd_noise_std": sigma * base_clip})
    return pd.DataFrame(rows, columns=GLOBAL_SCALE_COLUMNS)


def _lines(fig, df: pd.DataFrame, value: str, col: int, colors: dict, *, show: bool) -> None:
    """One line per series in panel ``col``: the mean of ``value`` over its seeds at each step, ± s.e."""
    for series, g in df.groupby("series", sort=False):
        m = seed_mean(g, ["step"], value).sort_values("step")
        fig.add_trace(go.Scatter(x=m["step"], y=m[value], mode="lines+markers", name=series, legendgroup=series,
                                 showlegend=show, line=dict(color=colors[series]), marker=dict(size=5),
                                 error_y=dict(type="data", array=m["se"].fillna(0).to_numpy(), thickness=1, width=3),
                                 meta=f"{value}|{series}"), row=1, col=col)


def _reference(fig, df: pd.DataFrame, value: str, col: int, name: str) -> None:
    """A dotted line at each series' reference (C, or DP-SGD's noise std) across the steps it was evaluated at."""
    for series, g in df.groupby("series", sort=False):
        v = g[value].to_numpy(float)
        v = v[np.isfinite(v)]
        if len(v):
            fig.add_trace(go.Scatter(x=[g["step"].min(), g["step"].max()], y=[v[0], v[0]], mode="lines",
                                     name=f"{name} · {series}", showlegend=False, hoverinfo="name+y",
                                     line=dict(color="#888888", dash="dot", width=1.5), meta=f"{value}|{series}"),
                          row=1, col=col)


def fig_global_scale(frame: pd.DataFrame, *, theme: str = "light", title: str = TITLE) -> go.Figure:
    """Z with C dotted (left), the scale C / max(Z, C) (middle), the noise std with DP-SGD's dotted (right)."""
    if frame.empty:
        return empty_figure(title, theme, EMPTY)
    df = escape_columns(frame, "series")
    series = list(dict.fromkeys(df["series"]))
    colors = {s: algo_color("dpsgd_global_adapt", 0) if k == 0 else algo_color("", k) for k, s in enumerate(series)}
    fig, _, _ = facet_grid([esc(p) for p in PANELS], title, theme, max_cols=3, horizontal_spacing=0.08,
                           shared_y=False)
    fig.update_yaxes(matches=None, showticklabels=True)
    _lines(fig, df, "threshold", 1, colors, show=True)
    _reference(fig, df, "base_clip", 1, "C")
    _lines(fig, df, "scale", 2, colors, show=False)
    _lines(fig, df, "noise_std", 3, colors, show=False)
    _reference(fig, df, "dpsgd_noise_std", 3, "DP-SGD's σ · C")
    fig.update_yaxes(title_text="Z", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="C / max(Z, C)", range=[0, 1.05], row=1, col=2)
    fig.update_yaxes(title_text="noise std", rangemode="tozero", row=1, col=3)
    fig.update_xaxes(title_text="step")
    return fig
