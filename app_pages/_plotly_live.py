"""A Plotly chart that keeps the user's zoom, pan and legend clicks while its figure is redrawn (the Train
page's live charts, refreshed every ~1.5 s).

st.plotly_chart cannot: Streamlit 1.67 hashes the figure into the element's id, key or not, so the browser
mounts a new plot div whenever the data change and ``layout.uirevision`` has nothing to carry the view over
to (streamlit/streamlit#8782). This chart is a Streamlit custom component (components v2, mounted in the
page's DOM, no iframe) whose id comes from its key alone: its one plot div stays across reruns and each new
figure is applied with ``Plotly.react`` (assets/plotly_live/plotly_live.js), which keeps what the user
changed while ``layout.uirevision`` stays the same. A double-click still resets the view (Plotly's default).

plotly.js is the copy the ``plotly`` package ships (the same version that wrote the figure's JSON), served by
the lab's own Streamlit server (no CDN: the lab works offline). The component's JavaScript is sent on every
rerun, so plotly.js (3-5 MB) is not part of it: the page loads it once, as a static file of a v1 component
registration whose folder is the package's own ``package_data`` (Streamlit serves only files inside it).
"""
from __future__ import annotations

from pathlib import Path

import plotly
import plotly.io as pio
import streamlit as st
import streamlit.components.v1 as components_v1
from streamlit import config

PLOTLY_DIR = Path(plotly.__file__).resolve().parent / "package_data"
PLOTLY_FILE = "plotly.min.js"
JS = (Path(__file__).resolve().parent.parent / "assets" / "plotly_live" / "plotly_live.js").read_text(encoding="utf-8")
DEFAULT_HEIGHT = 450  # Plotly's own default height (st.plotly_chart's too)

_render = st.components.v2.component("privacy_lab.plotly_live", js=JS, isolate_styles=False)


def plotly_src() -> str:
    """The URL path the page loads plotly.js from: a file of a v1 component registered on the running server
    (registering again is a no-op; each AppTest run has its own runtime, so it is done on every call)."""
    served = components_v1.declare_component("plotly_js", path=str(PLOTLY_DIR))
    base = (config.get_option("server.baseUrlPath") or "").strip("/")
    prefix = f"/{base}" if base else ""
    # the version in the query: a newer plotly package is not answered from the browser's cache of the old one
    return f"{prefix}/component/{served.name}/{PLOTLY_FILE}?v={plotly.__version__}"


def live_plotly_chart(fig, *, key: str, config: dict, uirevision: str) -> None:
    """``fig`` drawn in a plot element that survives reruns (one per ``key``): a new figure replaces the data
    and keeps the user's view while ``uirevision`` stays the same."""
    if fig.layout.uirevision != uirevision:
        fig.update_layout(uirevision=uirevision)
    # the figure as one JSON string: the browser gets it as plotly.py wrote it (numpy arrays base64-encoded,
    # which this plotly.js decodes), and an unchanged figure is an unchanged string, so it is not redrawn
    _render(key=key, data={"figure": pio.to_json(fig, validate=False), "config": dict(config, responsive=True),
                           "height": int(fig.layout.height or DEFAULT_HEIGHT), "src": plotly_src()})
