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


# Deep links (/train, /results, /runs, /tif, /audit) must open their page on a fresh and on a running server
# (tests/test_browser.py::test_deep_links). Two Streamlit 1.67 behaviours stand in the way:
# - the page marked default=True is served at "/" only: its url_path is always "" (st.Page.url_path), so
#   "/train" matched no page ("Page not found", redirect to "/"). So "/" is a hidden default page that runs the
#   same file, and Train is an ordinary page at /train.
# - until app.py has called st.navigation once in this server process, a folder named pages/ makes
#   Streamlit treat the app as a legacy multipage app, which knows a page only by its file name. The page
#   files are named *_view.py, never after their URL paths, and pages/<url path>.py are tiny entries that
#   hand over to this navigation (pages/_common.legacy_entry), so a first visit to /tif finds a page.
TRAIN = dict(title="Train / compare", icon=":material/model_training:")
home = st.Page(PAGES / "train_view.py", url_path="home", default=True, visibility="hidden", **TRAIN)
train = st.Page(PAGES / "train_view.py", url_path="train", **TRAIN)
lab = [
    home, train,
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
