"""Charts on the pages: a Plotly chart with its export menu (PNG, SVG, PDF, HTML, CSV), figures kept between
refreshes so the browser redraws only what changed, and the lab's shipped example runs (Results shows them
before any run of the user's has finished; Train previews their MID chart).

(Helper modules of app_pages/ start with "_": app.py's navigation names the pages, these never are.)
"""
from __future__ import annotations

import time
from typing import Callable

import streamlit as st

from app_pages._plotly_live import live_plotly_chart
from engine.figures import export
from engine.figures.scaffold import FigureSpec, apply_theme, wrap_title
from engine.figures.training import build_figures
from engine.jobs.runs import algorithm_label

# about what a half-width column of the wide layout shows of a 17 px title on a laptop screen (1280 px)
NARROW_TITLE_CHARS = 52
WIDE_TITLE_CHARS = 100  # a full-width chart's title (17 px) on a laptop screen: a longer one is wrapped too
NARROW_NOTE_CHARS = 62  # the same column's 11 px notes above a plot (the gain summary in words), from its left axis
PLOT_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def view_revision(*units) -> str:
    """A live chart's ``uirevision`` from what its axes mean (the comparison, the x unit, the layout): a kept view
    belongs to its units, so zoom, pan and legend clicks survive refreshes while these stay the same, and the
    chart re-ranges when any of them changes (a zoom on steps 14..36 means nothing on an ε axis)."""
    return "|".join(str(u) for u in units)


def chart(spec: FigureSpec, *, key: str, export_key: str | None = None, height: int | None = None,
          uirevision: str | None = None, narrow: bool = False) -> None:
    """A Plotly chart (in a keyed container, so tests and the browser can find it) with an export menu.
    ``uirevision`` (the live charts): while it stays the same, a redrawn figure keeps the user's zoom, pan and
    legend clicks; such a chart is drawn by app_pages/_plotly_live.py, whose plot survives reruns (an
    st.plotly_chart is mounted afresh whenever its figure changes, losing the view). ``narrow``: the chart sits
    in a half-width column, so its title and its notes above the plot are wrapped for the page (Plotly clips
    them); the export keeps one line."""
    with st.container(key=f"chart-{key}"):
        fig = spec.figure
        if height:
            fig.update_layout(height=height)
        if narrow:
            fig = wrap_title(fig, NARROW_TITLE_CHARS, note_width=NARROW_NOTE_CHARS)
        else:
            fig = wrap_title(fig, WIDE_TITLE_CHARS)
        if uirevision is not None:
            live_plotly_chart(fig, key=f"plot-{key}", config=PLOT_CONFIG, uirevision=uirevision)
        else:
            st.plotly_chart(fig, theme=None, key=f"plot-{key}", config=PLOT_CONFIG)
        if export_key is not None:
            export_menu(spec, key=export_key)


def export_menu(spec: FigureSpec, *, key: str, width: int = 1200, height: int = 700, scale: float = 2.0) -> None:
    ok, reason = export.static_export_available()
    with st.popover("Export", icon=":material/download:", key=f"pop-{key}"):
        cols = st.columns(5)
        for col, fmt in zip(cols, ("png", "svg", "pdf")):
            col.download_button(fmt.upper(), data=_deferred(spec.figure, fmt, width, height, scale), disabled=not ok,
                                file_name=f"{spec.name}.{fmt}", mime=export.MIME[fmt], key=f"dl-{key}-{fmt}",
                                on_click="ignore")
        cols[3].download_button("HTML", data=lambda f=spec.figure: export.html_bytes(f), file_name=f"{spec.name}.html",
                                mime=export.MIME["html"], key=f"dl-{key}-html", on_click="ignore")
        cols[4].download_button("CSV", data=lambda d=spec.data: export.csv_bytes(d), file_name=f"{spec.name}.csv",
                                mime=export.MIME["csv"], key=f"dl-{key}-csv", on_click="ignore")
        if not ok:
            st.caption(reason)


def _deferred(fig, fmt, width, height, scale):
    def make() -> bytes:  # exported figures use the light theme (slides), whatever the app theme is
        return export.figure_bytes(apply_theme(fig, "light"), fmt, width=width, height=height, scale=scale)
    return make


# --- figures kept between refreshes ---------------------------------------------------------------------------

def staggered(seconds: float, name: str, computes: dict[str, Callable[[], object]], *, unless_changed) -> dict:
    """{key: compute()} kept in the session under ``name``: each value is computed again at most every
    ``seconds`` and at most one per call (the oldest due one), so the redraws they cause are spread over
    refreshes instead of landing on one; all at once on the first call, for a new set of keys, or when
    ``unless_changed`` (any comparable value, e.g. the figure options) differs from the last call's."""
    now = time.monotonic()
    kept = st.session_state.get(name)
    if kept is None or kept["changed"] != unless_changed or set(kept["values"]) != set(computes):
        kept = {"changed": unless_changed, "at": {k: now for k in computes},
                "values": {k: f() for k, f in computes.items()}}
    else:
        due = [k for k in computes if now - kept["at"][k] >= seconds]
        if due:
            k = min(due, key=kept["at"].get)
            kept["values"][k], kept["at"][k] = computes[k](), now
    st.session_state[name] = kept
    return dict(kept["values"])


def cached_figures(name: str, signature: tuple, build: Callable[[], list]) -> dict:
    """name → FigureSpec, rebuilt only when ``signature`` changes (else the browser gets the same figures
    and does not redraw them on a refresh)."""
    cached = st.session_state.get(name)
    if cached is not None and cached[0] == signature:
        return cached[1]
    specs = {s.name: s for s in build()}
    st.session_state[name] = (signature, specs)
    return specs


# --- the shipped example runs ---------------------------------------------------------------------------------

def example_runs() -> list[dict] | None:
    """The lab's shipped example comparison (run records), each named "example …"; None if not shipped."""
    try:
        from engine.tools.demo import example_runs as load

        records = load()
    except (ImportError, OSError, ValueError, KeyError):  # not in this build, or its JSON is missing / unreadable
        return None
    out = []
    for r in records:
        r = dict(r)
        name = r.get("name") or algorithm_label(r.get("algorithm", ""))
        r["name"] = name if name.lower().startswith("example") else f"example · {name}"
        out.append(r)
    return out


@st.cache_resource(show_spinner=False)
def example_preview(theme: str) -> FigureSpec | None:
    """The example runs' MID overlay (the most private tier, IDP-SGD vs INO-SGD, mean ± s.e. over seeds): what
    the default comparison shows, for the Train page before any run (it also loads the chart code in the
    browser, so a first launch draws its live charts sooner). None if not shipped."""
    runs = example_runs()
    if not runs:
        return None
    return build_figures(runs, names=["mid_curves"], theme=theme, mid_layout="overlay")[0]
