"""The Train page's live view controls, now drawn inside the live view's fragment, keep their URL parameters
(Streamlit AppTest on a store holding a finished comparison; issue 59, point 1): ``xaxis``, ``smooth`` and
``mid_layout`` from the URL set the controls and the charts, and an invalid one is warned about by name."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.store.db import RunStore

APP = str(Path(__file__).resolve().parent.parent / "app.py")
GROUP = "cmp-view-url"


@pytest.fixture()
def comparison(tmp_path, monkeypatch):
    """An AppTest of app.py on a store holding the shipped example runs as one finished comparison."""
    from engine.tools.demo import example_runs

    path = tmp_path / "runs.sqlite"
    monkeypatch.setenv("PRIVACY_LAB_STORE", str(path))
    monkeypatch.setenv("PRIVACY_LAB_PREWARM", "0")
    store = RunStore(path)
    for run in example_runs():
        rid = store.create_run(run["config"], group_id=GROUP)
        store.start_run(rid, pid=os.getpid(), total_steps=run["total_steps"], plan=run["plan"])
        for e in run["evals"]:
            store.log_eval(rid, e["step"], e)
        store.update_progress(rid, run["total_steps"])
        store.finish_run(rid, {})
    yield AppTest.from_file(APP, default_timeout=180)
    from app_pages import _handles

    _handles._manager.clear()


def stats(at: AppTest) -> str:
    return " ".join(c.value for c in at.caption if "figures built" in c.value)


@pytest.mark.slow
def test_view_controls_keep_their_url_parameters(comparison):
    at = comparison
    at.query_params.update({"group": GROUP, "xaxis": "epochs", "smooth": "0.5", "mid_layout": "overlay"})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="xaxis").value == "epoch"
    assert at.slider(key="smooth").value == 0.5
    assert "page runs 1 · view runs 1" in stats(at)
    fresh = AppTest.from_file(APP, default_timeout=180)
    fresh.query_params.update({"group": GROUP, "xaxis": "sideways"})
    fresh.run()
    assert not fresh.exception, [e.value for e in fresh.exception]
    warned = " ".join(w.value for w in fresh.warning)
    assert "URL parameter **xaxis**" in warned and "not a valid value" in warned, warned
    assert fresh.selectbox(key="xaxis").value == "step"
