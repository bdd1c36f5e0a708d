"""Privacy Imbalance Lab — the dashboard. Navigation only; each view is a thin page in pages/.

    streamlit run app.py          # http://127.0.0.1:8501 (local only, see .streamlit/config.toml)

All computing lives in ``engine/`` (importable without Streamlit); runs execute in background worker
processes started by ``engine.jobs.JobManager`` and stream their metrics into the run store
(``$PRIVACY_LAB_STORE``, default ``~/.privacy-imbalance-lab/runs.sqlite``).
"""
from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent
PAGES = HERE / "pages"

st.set_page_config(page_title="Privacy Imbalance Lab", page_icon=":material/shield_person:", layout="wide")


# The page files are named *_view.py, never after their URL paths: Streamlit 1.67 treats a folder
# named pages/ as a legacy multipage app until app.py has called st.navigation once, so on a fresh
# server a deep link such as /results would otherwise run pages/results.py alone, without this
# navigation (tests/test_browser.py::test_deep_link_on_fresh_server).
lab = [
    st.Page(PAGES / "train_view.py", title="Train / compare", icon=":material/model_training:", url_path="train",
            default=True),
    st.Page(PAGES / "results_view.py", title="Results", icon=":material/insights:", url_path="results"),
    st.Page(PAGES / "runs_view.py", title="Runs", icon=":material/history:", url_path="runs"),
    st.Page(PAGES / "tif_explorer.py", title="TIF explorer", icon=":material/tune:", url_path="tif"),
]
audit = st.Page(PAGES / "audit_view.py", title="Audit", icon=":material/policy:", url_path="audit")

page = st.navigation({"Lab": lab, "Privacy audit": [audit]})

from pages import _common as ui  # noqa: E402 - after set_page_config



@st.fragment(run_every=2.0)
def workers() -> None:
    mgr = ui.manager()
    running = len(mgr.store.list_runs(status="running"))
    queued = len(mgr.store.list_runs(status="queued"))
    st.caption(f"Workers: {running} running · {queued} queued · at most {mgr.max_workers} at once")


with st.sidebar:
    workers()
    st.caption(f"Store: {ui.md(ui.manager().store_path)}")
    st.caption("Theme: ⋮ menu → Settings (light / dark / system).")

page.run()
