"""Results that opens fast while a run trains (issue 59, point 3): its figures are built once per state of the
selection — each run's id, status and last evaluation — so a run training between two evaluations, or a widget
change, builds nothing again, and a new evaluation is drawn at once (never a stale figure)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.config.run import RunConfig
from engine.store.db import RunStore
from test_plots import make_run

PAGE = str(Path(__file__).resolve().parents[1] / "app_pages" / "results_view.py")


def _store_with_a_comparison_and_a_running_run(path) -> tuple[RunStore, int]:
    """Two finished runs (IDP-SGD, INO-SGD) of one comparison and a third still training (this process; another
    seed, so not a rerun of the second), each with the evaluations of test_plots' records."""
    store = RunStore(path)
    ids = []
    for algorithm, status, steps in (("idp_sample", "finished", list(range(0, 301, 10))),
                                     ("ino", "finished", list(range(0, 301, 10))),
                                     ("ino", "running", list(range(0, 151, 10)))):
        cfg = RunConfig().replace(**{"algorithm.name": algorithm, "seed": 7 if status == "running" else 0})
        rid = store.create_run(cfg, group_id="cmp-fast")
        store.start_run(rid, pid=os.getpid(), total_steps=300)
        for e in make_run(rid, algorithm, steps=steps, status=status)["evals"]:
            store.log_eval(rid, e["step"], {k: v for k, v in e.items() if k != "step"})
        store.update_progress(rid, steps[-1])
        if status == "finished":
            store.finish_runs({rid: {}})
        ids.append(rid)
    return store, ids[-1]


def test_the_figures_key_changes_with_an_evaluation_not_with_steps_between_them():
    from app_pages.results_view import selection_key  # noqa: PLC0415 - the page module runs Streamlit at import

    run = make_run(3, "ino", steps=[0, 10, 20], status="running")
    before = selection_key([run])
    assert selection_key([dict(run, step=27, updated_at=1e9)]) == before  # trained on, no new evaluation
    grown = dict(run, evals=run["evals"] + [dict(run["evals"][-1], step=30)])
    assert selection_key([grown]) != before
    assert selection_key([dict(run, status="cancelled")]) != before
    assert selection_key([dict(run, cancel_step=15)]) != before


@pytest.fixture()
def page(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVACY_LAB_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("PRIVACY_LAB_PREWARM", "0")
    store, running = _store_with_a_comparison_and_a_running_run(tmp_path / "runs.sqlite")
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.query_params["all"] = "true"  # the running run is in the selection
    return at, store, running


def span_note(at) -> str:
    return " ".join(w.value for w in at.warning if "Compared over" in w.value)


def test_results_with_a_run_still_training_draws_its_new_evaluation_and_keeps_every_section(page):
    at, store, running = page
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [s.value for s in at.subheader][:2] == ["MID and the INO gain of the most private tier",
                                                   "Who pays for privacy?"]
    assert "steps 0–150" in span_note(at), span_note(at)
    # the run trains on between two evaluations: the same figures (from the cache), the same span
    store.update_progress(running, 155)
    at.run()
    assert not at.exception and "steps 0–150" in span_note(at)
    # its next evaluation is drawn at once: the cache is keyed by it
    e = make_run(running, "ino", steps=[160], status="running")["evals"][0]
    store.log_eval(running, 160, {k: v for k, v in e.items() if k != "step"})
    at.run()
    assert not at.exception and "steps 0–160" in span_note(at), span_note(at)
    # the export's options rerun only their fragment; the page keeps its sections
    at.number_input(key="pack_w").set_value(1200).run()
    assert not at.exception and "Export" in [s.value for s in at.subheader]
