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


def audit_placeholder() -> None:
    st.title("Audit")
    st.info("The privacy audit (PA-ALOOA group privacy risk, LiRA, per-tier ε lower bounds) lands here with the "
            "audit issue: it will add `pages/audit.py`, which replaces this placeholder automatically.")


lab = [
    st.Page(PAGES / "train.py", title="Train / compare", icon=":material/model_training:", url_path="train",
            default=True),
    st.Page(PAGES / "results.py", title="Results", icon=":material/insights:", url_path="results"),
    st.Page(PAGES / "runs.py", title="Runs", icon=":material/history:", url_path="runs"),
    st.Page(PAGES / "tif_explorer.py", title="TIF explorer", icon=":material/tune:", url_path="tif"),
]
audit_file = PAGES / "audit.py"
audit = (st.Page(audit_file, title="Audit", icon=":material/policy:", url_path="audit") if audit_file.exists()
         else st.Page(audit_placeholder, title="Audit", icon=":material/policy:", url_path="audit"))

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
