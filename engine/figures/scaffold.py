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

import copy
import functools
import html
import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from engine.dp.algorithms import ALGORITHM_REGISTRY

THEMES = ("light", "dark", "presentation")

# Algorithms / runs, each also with its own marker (ALGORITHM_SYMBOLS): each algorithm's colour and marker are
# its registry entry's (engine.dp.algorithms; how they were picked: engine.config.algorithms).
ALGORITHM_COLORS = {
    **{name: a.colour for name, a in ALGORITHM_REGISTRY.items()},
    # DP-SGD-S's controls (audits): DP-SGD re-planned at DP-SGD-S's noise / accuracy (ΔE ≥ 11 from the above)
    "dpsgd_noise_matched": "#004488",
    "dpsgd_accuracy_matched": "#CC6677",
}
ALGORITHM_SYMBOLS = {name: a.symbol for name, a in ALGORITHM_REGISTRY.items()}
EXTRA_COLORS = ("#AA4499", "#88CCEE", "#DDCC77", "#CC6677", "#4B0082", "#2F4F4F", "#8B4513", "#5F9EA0")
# Tiers sorted by ε, the most private first and most salient: Okabe–Ito (colour-blind safe), a set apart
# from the algorithm colours.
TIER_COLORS = ("#D55E00", "#0072B2", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
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
    out = df.copy(deep=False)  # copy-on-write: replacing a column never touches ``df``
    for c in columns:
        if c in out.columns and len(out):
            values = out[c].unique()
            mapping = {v: v if v is None or (isinstance(v, float) and math.isnan(v)) else esc(v) for v in values}
            out[c] = out[c].map(mapping) if any(k != v for k, v in mapping.items()) else out[c]
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


def algo_symbol(algorithm: str) -> str:
    return ALGORITHM_SYMBOLS.get(algorithm, "circle")


def tier_color(k: int) -> str:
    return TIER_COLORS[k % len(TIER_COLORS)]


def rgba(color: str, alpha: float) -> str:
    """``#rrggbb`` → ``rgba(r, g, b, alpha)`` (band fills)."""
    c = color.lstrip("#")
    return f"rgba({int(c[0:2], 16)}, {int(c[2:4], 16)}, {int(c[4:6], 16)}, {alpha})"


def group_color(k: int) -> str:
    return GROUP_COLORS[k % len(GROUP_COLORS)]


# --- themes ---------------------------------------------------------------------------------------

def template(theme: str = "light") -> go.layout.Template:
    """The plot template of a theme (cached: building a Template costs ~50 ms)."""
    if theme not in THEMES:
        raise ValueError(f"unknown theme {theme!r}; allowed: {', '.join(THEMES)}")
    return _template(theme)


def _template_json(theme: str) -> dict:
    """:func:`template` as the plain JSON Plotly stores in a figure's layout; a copy for each figure (a figure may
    change its own template)."""
    return copy.deepcopy(_template_json_of(theme))


@functools.lru_cache(maxsize=None)
def _template_json_of(theme: str) -> dict:
    return template(theme).to_plotly_json()


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
    layout = {"title": dict(text=esc(title), x=0.01, xanchor="left", y=0.98, yanchor="top")}
    if legend == "top":
        layout["legend"] = dict(orientation="h", yanchor="bottom", y=1.02, x=1, xanchor="right")
    if fig is None:
        # the layout exactly as Plotly's validation stores it (the template's own JSON), without validating the
        # template's every default again for each figure: ~12 ms of each new figure (a live refresh builds
        # several), the same figure JSON (tests/test_plots.py)
        return go.Figure(layout={"template": _template_json(theme), **layout}, _validate=False)
    return fig.update_layout(template=template(theme), **layout)


# Plotly draws a multi-line title with its last line where a one-line title would sit and the lines before
# it above (plotly.js ignores yanchor for multi-line titles: plotly/plotly.js#6472), so a wrapped title's
# first line is cut at the top of the figure unless the title moves down by this much (measured: the same
# for 2, 3 and 4 lines of a 17 px title)
MULTILINE_TITLE_SHIFT_PX = 16
ANNOTATION_LINE_PX = 16  # one more line of an 11 px annotation above the plot


def _wrap_words(text: str, width: int) -> list[str]:
    """``text`` (escaped) broken at spaces into lines of at most ``width`` characters (a longer word stays
    whole); an entity holds no space, so no break lands inside one."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + [line]


def wrap_words(text: str, width: int) -> list[str]:
    """``text`` (escaped) as lines of at most ``width`` characters, broken at spaces only (whole words; a longer
    word stays whole on a line of its own): what a figure's own notes are cut into, since Plotly clips a text
    longer than its figure instead of wrapping it."""
    return _wrap_words(text, width)


def _entity_safe(text: str, at: int) -> int:
    """``at`` moved back to before an HTML entity (``&lt;``) it would cut."""
    amp = text.rfind("&", 0, at)
    return amp if amp >= 0 and ";" in text[amp:at + 8] and ";" not in text[amp:at] else at


def fit_line(text: str, width: int) -> str:
    """``text`` (escaped) on one line of at most ``width`` characters: as it is when it fits, else cut at a word
    (or, for one long word, at ``width``; never inside an entity) and ended with "…"."""
    if len(text) <= width:
        return text
    cut = text.rfind(" ", 0, width)
    cut = cut if cut > width // 2 else _entity_safe(text, width - 1)
    return text[:cut].rstrip(" ·—-:,") + "…"


def wrap_title(fig: go.Figure, width: int, *, note_width: int | None = None) -> go.Figure:
    """A copy for a figure drawn in a narrow column, whose title is broken into lines of at most ``width``
    characters and (``note_width``) whose notes above the plot (left-anchored paper annotations, e.g. the gain
    summary in words) into lines of at most ``note_width``: Plotly clips a title or an annotation longer than
    its figure instead of wrapping it. The top margin grows by the added lines. The input figure (the one
    exported) is not changed; a figure whose texts fit is returned as it is."""
    text = fig.layout.title.text or ""
    title_lines = _wrap_words(text, width) if len(text) > width and "<br>" not in text else None
    notes, added, below = [], 0, 0
    for k, a in enumerate(fig.layout.annotations):
        above = a.xref == "paper" and a.yref == "paper" and a.xanchor == "left" and (a.y or 0) >= 1
        # a note under the plot (:func:`notes_below`): the figure grows at the bottom instead
        under = a.xref == "paper" and a.yref == "paper" and a.xanchor == "left" and a.yanchor == "top" and \
            (a.y or 0) < 0
        lines = (a.text or "").split("<br>")
        if note_width and (above or under) and any(len(line) > note_width for line in lines):
            wrapped = [w for line in lines for w in _wrap_words(line, note_width)]
            notes.append((k, "<br>".join(wrapped)))
            if under:
                below += len(wrapped) - len(lines)
            else:
                added += len(wrapped) - len(lines)
    if title_lines is None and not notes:
        return fig
    out = go.Figure(fig)
    top = out.layout.margin.t if out.layout.margin.t is not None else 80
    if title_lines is not None:
        height = out.layout.height or 450  # Plotly's default height
        y = out.layout.title.y if out.layout.title.y is not None else 0.98
        out.update_layout(title_text="<br>".join(title_lines), title_y=y - MULTILINE_TITLE_SHIFT_PX / height)
        top += 20 * (len(title_lines) - 1)
    for k, note in notes:
        out.layout.annotations[k].text = note
    top += ANNOTATION_LINE_PX * added
    out.update_layout(margin_t=top)
    if below:  # the plot keeps its height: the bottom margin and the figure grow by the added lines
        grow = NOTE_LINE_PX * below
        out.update_layout(margin_b=(out.layout.margin.b or 50) + grow, height=(out.layout.height or 450) + grow)
    return out


# --- many series: the legend beside the plot, notes below it, the plot's own height kept --------------------

# A legend listed down the right of the plot: Plotly widens the right margin to fit it, so however many entries
# it has it never covers the plot, its title or a note (a horizontal legend above the plot grew into the title
# with 12 entries; one below it into the notes).
LEGEND_BESIDE = dict(orientation="v", x=1.02, xanchor="left", y=1.0, yanchor="top", title=None)
NOTE_LINE_PX = 16  # one line of an 11 px note
BELOW_X_TITLE_PX = 58  # from the plot's bottom edge, past its tick labels and x-axis title
PANEL_GAP_PX = 90  # between stacked panels: the upper one's x-axis title and the lower one's panel title


def notes_below(lines: list[str], *, plot_px: int, top_px: int = 80, name: str = "below") -> tuple[dict | None, dict]:
    """(the annotation of ``lines`` — escaped text — under the plot and its x-axis title, or None; the layout
    that keeps the plot area ``plot_px`` tall: the bottom margin and the figure's height grow by the lines).
    Notes above a plot had squeezed it into a thin strip as pairs were added; here the figure grows instead."""
    bottom = BELOW_X_TITLE_PX + NOTE_LINE_PX * len(lines) + 14
    layout = dict(margin=dict(t=top_px, b=bottom), height=top_px + plot_px + bottom)
    if not lines:
        return None, layout
    note = dict(text="<br>".join(lines), name=name, xref="paper", yref="paper", x=0, xanchor="left",
                y=-BELOW_X_TITLE_PX / plot_px, yanchor="top", align="left", showarrow=False, font=dict(size=11))
    return note, layout


def stacked_panels(n: int, panel_px: int) -> tuple[int, float]:
    """(plot-area height in px, vertical spacing as a fraction of it) of ``n`` panels stacked in one column, each
    ``panel_px`` tall with :data:`PANEL_GAP_PX` between them."""
    total = n * panel_px + (n - 1) * PANEL_GAP_PX
    return total, (PANEL_GAP_PX / total if n > 1 else 0.0)


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
               vertical_spacing=None, legend: str = "bottom", shared_y: bool = True) -> tuple[go.Figure, int, int]:
    """One panel per title (titles are already-escaped text), shared y axes unless ``shared_y=False``;
    returns (figure, rows, cols). Panel ``i`` sits at ``row = i // cols + 1, col = i % cols + 1`` (its axes
    are ``x{i+1}``/``y{i+1}``, ``x``/``y`` for i = 0).
    """
    rows, cols = facets(len(panel_titles), max_cols)
    if not shared_y:
        horizontal_spacing = max(horizontal_spacing, 0.07)  # room for each panel's own tick labels
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=list(panel_titles), shared_yaxes=shared_y,
                        horizontal_spacing=horizontal_spacing,
                        vertical_spacing=vertical_spacing if vertical_spacing is not None else 0.12,
                        figure=base_figure(title, theme, legend=legend))
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


# --- plans: a figure's data and structure as plain values, rendered once, patched live --------------------

@dataclass
class Trace:
    """One scatter trace of a plan: a stable ``key`` (the trace's ``meta``), its data, its panel, and every
    other go.Scatter property (``style``: plain values)."""
    key: str
    x: object
    y: object
    style: dict
    panel: int = 0


@dataclass
class Span:
    """A shaded x interval (a MID span) on a panel."""
    key: str
    x0: float
    x1: float
    color: str
    opacity: float = 0.12
    panel: int = 0


@dataclass
class Plan:
    """What a curve figure shows, before any Plotly object exists. :func:`render` builds the figure;
    :mod:`engine.figures.live` patches a rendered one when only the data parts (trace x/y, span ends,
    per-panel y ranges, note texts) changed, i.e. when :meth:`structure` is unchanged.

    ``panels``: escaped panel titles of a facet grid (None: one panel). ``notes``: add_annotation kwargs
    (escaped text). ``empty``: the message of an empty figure."""
    title: str
    traces: list = field(default_factory=list)
    spans: list = field(default_factory=list)
    panels: list | None = None
    notes: list = field(default_factory=list)
    hlines: list = field(default_factory=list)
    x_title: str = ""
    y_title: str = ""
    y_range: list | None = None
    y_rangemode: str | None = None
    y_ranges: dict = field(default_factory=dict)
    shared_y: bool = True
    max_cols: int = 3
    vertical_spacing: float | None = None
    height: int | None = None
    layout: dict = field(default_factory=dict)
    empty: str | None = None

    def structure(self) -> str:
        """Everything but the data parts, as canonical JSON: equal structures render equal figures up to data."""
        return json.dumps({
            "title": self.title, "panels": self.panels, "empty": self.empty, "hlines": self.hlines,
            "traces": [(t.key, t.panel, t.style) for t in self.traces],
            "spans": [(s.key, s.panel, s.color, s.opacity) for s in self.spans],
            "notes": [{k: v for k, v in n.items() if k != "text"} for n in self.notes],
            "axes": [self.x_title, self.y_title, self.y_range, self.y_rangemode, sorted(self.y_ranges), self.shared_y, self.max_cols,
                     self.vertical_spacing, self.height, self.layout],
        }, sort_keys=True, default=str)


# A curve is drawn with at most this many points (a chart is ~1 000 px wide): the browser's cost of a live
# refresh (JSON, redraw) then stays flat however long a run evaluates; the frames keep every point.
MAX_DRAWN_POINTS = 400


def drawn_points(n: int) -> np.ndarray | None:
    """Indices of the points drawn of a curve of ``n`` points: None (all) up to :data:`MAX_DRAWN_POINTS`,
    else evenly spaced ones, the first and last included. It depends on ``n`` only, so the traces of one
    curve (line, band edges, raw) keep the same points and stay aligned."""
    if n <= MAX_DRAWN_POINTS:
        return None
    return np.unique(np.linspace(0, n - 1, MAX_DRAWN_POINTS).round().astype(np.int64))


def drawn(values):
    """``values`` (a trace's x or y) as drawn: thinned by :func:`drawn_points`."""
    if values is None:
        return values
    idx = drawn_points(len(values))
    return values if idx is None else np.asarray(values)[idx]


def axis_name(axis: str, panel: int) -> str:
    """Layout key of a panel's axis: ``yaxis`` for panel 0, ``yaxis3`` for panel 2."""
    return f"{axis}axis" if panel == 0 else f"{axis}axis{panel + 1}"


def render(plan: Plan, theme: str = "light") -> go.Figure:
    """The figure of a plan."""
    if plan.empty is not None:
        return empty_figure(plan.title, theme, plan.empty)
    if plan.panels is None:
        fig, cols = base_figure(plan.title, theme), 1
    else:
        fig, rows, cols = facet_grid(plan.panels, plan.title, theme, max_cols=plan.max_cols, shared_y=plan.shared_y,
                                     vertical_spacing=plan.vertical_spacing)

    def loc(p):
        return {} if plan.panels is None else {"row": p // cols + 1, "col": p % cols + 1}

    traces = [go.Scatter(x=drawn(t.x), y=drawn(t.y), meta=t.key, **t.style) for t in plan.traces]
    if plan.panels is None:
        fig.add_traces(traces)
    elif traces:
        fig.add_traces(traces, rows=[t.panel // cols + 1 for t in plan.traces],
                       cols=[t.panel % cols + 1 for t in plan.traces])
    for s in plan.spans:
        fig.add_vrect(x0=s.x0, x1=s.x1, fillcolor=s.color, opacity=s.opacity, line_width=0, layer="below",
                      **loc(s.panel))
    for h in plan.hlines:
        fig.add_hline(**h)
    for n in plan.notes:
        fig.add_annotation(**n)
    fig.update_xaxes(title_text=plan.x_title)
    if plan.panels is None:
        fig.update_yaxes(title_text=plan.y_title)
    else:
        fig.update_yaxes(title_text=plan.y_title, col=1)
    if plan.y_range is not None:
        fig.update_yaxes(range=plan.y_range)
    if plan.y_rangemode is not None:
        fig.update_yaxes(rangemode=plan.y_rangemode)
    for p, r in plan.y_ranges.items():
        fig.layout[axis_name("y", p)].range = r
    if plan.height:
        fig.update_layout(height=plan.height)
    if plan.layout:
        fig.update_layout(**plan.layout)
    return fig
