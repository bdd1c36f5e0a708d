"""Privacy Imbalance Lab — the dashboard. Navigation only; each view is a thin page in app_pages/.

    streamlit run app.py          # http://127.0.0.1:8501 (local only, see .streamlit/config.toml)

All computing lives in ``engine/`` (importable without Streamlit); runs execute in background worker
processes started by ``engine.jobs.manager.JobManager`` and stream their metrics into the run store
(``$PRIVACY_LAB_STORE``, default ``~/.privacy-imbalance-lab/runs.sqlite``).
"""
from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent
# Not pages/: Streamlit runs an app with a pages/ folder beside its main script as a legacy multipage app
# until st.navigation has been called once in the server process, and that mode knows a page only by its file
# name, so a first visit to /train on a fresh server found no page.
PAGES = HERE / "app_pages"

# the favicon ships with the lab (a material icon as page_icon is fetched from the internet: offline, every page
# load failed to get it)
st.set_page_config(page_title="Privacy Imbalance Lab", page_icon=str(HERE / "assets" / "favicon.png"), layout="wide")


# Deep links (/train, /results, /runs, /tif, /audit) open their page, as the first visit of a fresh server
# and on a running one (tests/test_browser.py). The page marked default=True is served at "/" only (its
# url_path is always "", st.Page.url_path), so with Train as the default "/train" matched no page ("Page not
# found", redirect to "/"): "/" is a hidden default page that runs the same file, Train an ordinary page at /train.
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
if (HERE / "pages").is_dir():  # e.g. pages/__pycache__/, which git leaves behind from a checkout before the move
    st.warning("A folder named pages/ beside app.py makes Streamlit treat the lab as a legacy multipage app, so a "
               "first visit to a page's link finds no page: delete it (the pages are in app_pages/).")

from app_pages._handles import manager, started_manager, store_path  # noqa: E402 - after set_page_config
from engine.config.backend import BACKEND_ENV, backend_from_env  # noqa: E402
from engine.config.schema import ConfigError  # noqa: E402
from app_pages._look import home_relative, md  # noqa: E402


@st.fragment(run_every=2.0)
def workers() -> None:
    # a fresh server's first page is drawn before the manager starts (its standby workers import torch on the
    # same cores): the page starts it when it needs it (Train, after its Launch button), else this refresh does
    runs = st.session_state["sidebar-runs"] = st.session_state.get("sidebar-runs", 0) + 1
    mgr = manager() if runs > 1 else started_manager()
    if mgr is None:
        st.caption("Workers: starting…")
        return
    running = len(mgr.store.list_runs(status="running"))
    queued = len(mgr.store.list_runs(status="queued"))
    st.caption(f"Workers: {running} running · {queued} queued · at most {mgr.max_workers} at once")


with st.sidebar:
    workers()
    st.caption(f"Store: {md(home_relative(store_path()))}")
    try:  # where runs train and audits send their chunks ($PRIVACY_LAB_BACKEND: engine.config.backend)
        st.caption(f"Backend: {md(backend_from_env().describe())}")
    except ConfigError as e:
        st.error(f"Backend: {md(e.message)} (set {BACKEND_ENV} and restart the app)")
    st.caption("Theme: ⋮ menu → Settings (light / dark / system).")

page.run()
