"""What every figure of the lab shares: themes, palettes, the base and the empty figure, facet grids,
tables, the :class:`FigureSpec` a figure travels in (UI, CLI export, presentation packs), and the one
escaping rule for user text.

**Escaping.** Plotly renders a subset of HTML in titles, legends, hover text, tick labels, annotations
and table cells (``<a href>``, ``<b>``, ``<br>``, ``<sup>`` …) and fills ``%{…}`` placeholders in
hover/text templates. Run names, tier, group and class names and error strings are user text, so each
figure builder passes them through :func:`esc` (or :func:`escape_columns` for a frame) where they enter
the figure; :func:`base_figure` escapes the title. The tidy frames themselves keep the raw text (CSV).
"""
from __future__ import annotations

import functools
import html
import math
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

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
GROUP_COLORS = ("#3a86ff", "#e4572e", "#06a77d", "#8338ec", "#f0a202", "#ff006e", "#6c757d", "#2b2d42",
                "#17becf", "#bcbd22")


@dataclass
class FigureSpec:
    name: str  # file stem
    title: str
    figure: go.Figure
    data: pd.DataFrame  # what the figure shows (CSV export)


# --- user text ------------------------------------------------------------------------------------

def esc(text) -> str:
    """User text made inert for Plotly: ``<``, ``>``, ``&`` as entities, no ``%{…}`` placeholder."""
    return html.escape(str(text), quote=False).replace("%{", "%&#123;")


def escape_columns(df: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """A copy of ``df`` with the named text columns escaped (missing values stay missing)."""
    out = df.copy()
    for c in columns:
        if c in out.columns:
            out[c] = [v if v is None or (isinstance(v, float) and math.isnan(v)) else esc(v) for v in out[c]]
    return out


# --- colours --------------------------------------------------------------------------------------

def run_colors(runs: list[dict]) -> dict[int, str]:
    """Run id → colour: the algorithm's colour for its first run, distinct extra colours after."""
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


def colors_from_frame(df: pd.DataFrame) -> dict:
    """:func:`run_colors` for the runs of a tidy frame (columns run_id, algorithm)."""
    runs = [{"id": rid, "algorithm": algo} for rid, algo in dict.fromkeys(zip(df["run_id"], df["algorithm"]))]
    return run_colors(runs)


def algo_color(algorithm: str, k: int = 0) -> str:
    return ALGORITHM_COLORS.get(algorithm, EXTRA_COLORS[k % len(EXTRA_COLORS)])


def tier_color(k: int) -> str:
    return TIER_COLORS[k % len(TIER_COLORS)]


def group_color(k: int) -> str:
    return GROUP_COLORS[k % len(GROUP_COLORS)]


# --- themes ---------------------------------------------------------------------------------------

def template(theme: str = "light") -> go.layout.Template:
    """The plot template of a theme (cached: building a Template costs ~50 ms)."""
    if theme not in THEMES:
        raise ValueError(f"unknown theme {theme!r}; allowed: {', '.join(THEMES)}")
    return _template(theme)


@functools.lru_cache(maxsize=None)
def _template(theme: str) -> go.layout.Template:
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


# --- figures --------------------------------------------------------------------------------------

def base_figure(title: str, theme: str, fig: go.Figure | None = None, *, legend: str = "bottom") -> go.Figure:
    """A themed figure with an (escaped) title; ``legend="top"`` puts the legend above the plot, right."""
    fig = fig if fig is not None else go.Figure()
    fig.update_layout(template=template(theme),
                      title=dict(text=esc(title), x=0.01, xanchor="left", y=0.98, yanchor="top"))
    if legend == "top":
        fig.update_layout(legend=dict(orientation="h", yanchor="bottom", y=1.02, x=1, xanchor="right"))
    return fig


def empty_figure(title: str, theme: str, message: str, *, legend: str = "bottom") -> go.Figure:
    """A figure that says why there is nothing to show (the message is escaped: it may be an error)."""
    fig = base_figure(title, theme, legend=legend)
    fig.add_annotation(text=esc(message), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def facets(n: int, max_cols: int = 3) -> tuple[int, int]:
    """(rows, cols) of a grid of ``n`` panels, at most ``max_cols`` a row."""
    cols = max(1, min(n, max_cols))
    return max(1, math.ceil(n / cols)), cols


def facet_grid(panel_titles: list[str], title: str, theme: str, *, max_cols: int = 3, horizontal_spacing=0.04,
               vertical_spacing=None, legend: str = "bottom") -> tuple[go.Figure, int, int]:
    """One panel per title (titles are already-escaped text), shared y axes; returns (figure, rows, cols).

    Panel ``i`` sits at ``row = i // cols + 1, col = i % cols + 1``.
    """
    rows, cols = facets(len(panel_titles), max_cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=list(panel_titles), shared_yaxes=True,
                        horizontal_spacing=horizontal_spacing,
                        vertical_spacing=vertical_spacing if vertical_spacing is not None else 0.12)
    base_figure(title, theme, fig, legend=legend)
    return fig, rows, cols


def _cell(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return esc(v) if isinstance(v, str) else v


def fig_table(df: pd.DataFrame, *, theme: str = "light", title: str = "MID summary") -> go.Figure:
    """A frame as a Plotly table (headers and text cells escaped)."""
    fig = base_figure(title, theme)
    dark = theme == "dark"
    cells = [[_cell(v) for v in df[c]] for c in df]
    fig.add_trace(go.Table(
        header=dict(values=[esc(c) for c in df.columns], fill_color="#262730" if dark else "#eef1f6",
                    font=dict(color="#fafafa" if dark else "#111", size=13), align="left"),
        cells=dict(values=cells, fill_color="#0e1117" if dark else "white",
                   font=dict(color="#fafafa" if dark else "#111", size=12), align="left")))
    fig.update_layout(height=max(250, 60 + 28 * (len(df) + 2)))
    return fig
