"""Figures of the TIF explorer (frames from :mod:`engine.tools.tif_explorer`): the TIF, the BIF over a sampled
batch with each item's ρ coloured by tier, and the mean ρ per tier. Tier names are escaped."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.dp.importance import bif
from engine.figures.scaffold import base_figure, empty_figure, escape_columns, tier_color


def bif_curve(batch: pd.DataFrame, tif, tail_length: float, points: int = 400) -> pd.DataFrame:
    """The BIF on [0, 1.02·max(Γ, γ)] (Γ: the batch's clip mass), for drawing behind the items."""
    total = float(batch["mass_end"].iloc[-1]) if not batch.empty else 0.0
    xs = np.linspace(0, max(total, tail_length) * 1.02, points)
    return pd.DataFrame({"x": xs, "bif": bif(xs, tif, tail_length)})


def fig_tif(tif, *, theme: str = "light", title: str = "Tail importance function TIF(u)") -> go.Figure:
    u = np.linspace(0, 1, 201)
    y = np.asarray(tif(u), dtype=float)
    fig = base_figure(title, theme)
    fig.add_trace(go.Scatter(x=u, y=y, mode="lines", name="TIF(u)", fill="tozeroy", line=dict(color="#d62728", width=3)))
    fig.add_annotation(text=f"dropped: 1 − ∫TIF = {tif.dropped_fraction:.3f}", x=0.02, y=0.97, xref="paper",
                       yref="paper", showarrow=False, xanchor="left", yanchor="top")
    fig.update_xaxes(title_text="u = clip mass / γ", range=[0, 1])
    fig.update_yaxes(title_text="weight", range=[-0.02, 1.05])
    return fig


def fig_bif_batch(batch: pd.DataFrame, tif, tail_length: float, *, theme: str = "light",
                  title: str = "BIF over a sampled batch: each item's ρ (coloured by tier)") -> go.Figure:
    if batch.empty:
        return empty_figure(title, theme, "the sampled batch is empty")
    fig = base_figure(title, theme)
    curve = bif_curve(batch, tif, tail_length)
    fig.add_trace(go.Scatter(x=curve["x"], y=curve["bif"], mode="lines", name="BIF(x)", line=dict(color="#888", width=2),
                             hoverinfo="skip"))
    for (tier, k), g in escape_columns(batch, "tier").groupby(["tier", "tier_index"], sort=False):
        fig.add_trace(go.Scatter(
            x=g["mass_center"], y=g["rho"], mode="markers", name=f"{tier}",
            marker=dict(color=tier_color(int(k)), size=9, line=dict(width=1, color="white")),
            customdata=np.stack([g["loss"], g["clip_norm"]], axis=1),
            hovertemplate="loss %{customdata[0]:.3f}, C %{customdata[1]:.3f}<br>ρ = %{y:.3f}<extra>" + tier + "</extra>"))
    fig.add_vline(x=tail_length, line=dict(color="#d62728", dash="dash"), annotation_text="γ (tail length)",
                  annotation_position="top right")
    fig.update_xaxes(title_text="cumulative clip mass x (items sorted by loss, lowest first)")
    fig.update_yaxes(title_text="ρ (importance weight)", range=[-0.03, 1.08])
    return fig


def fig_tier_rho(tiers: pd.DataFrame, *, theme: str = "light", title: str = "Mean ρ per tier") -> go.Figure:
    if tiers.empty:
        return empty_figure(title, theme, "the sampled batch is empty")
    fig = base_figure(title, theme)
    tiers = escape_columns(tiers, "tier")
    fig.add_trace(go.Bar(x=tiers["tier"], y=tiers["mean_rho"], marker_color=[tier_color(int(k)) for k in tiers["tier_index"]],
                         text=[f"{v:.2f} (n={n})" for v, n in zip(tiers["mean_rho"], tiers["items"])],
                         textposition="outside", showlegend=False))
    fig.update_yaxes(title_text="mean ρ in the batch", range=[0, 1.15])
    return fig
