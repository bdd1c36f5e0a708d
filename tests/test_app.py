"""Streamlit AppTest: every page renders without an exception; a tiny digits comparison launched
through the UI reaches `finished` and shows Plotly charts; invalid inputs show st.error, never a traceback."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from conftest import wait_until
from engine.store.db import RunStore

APP = str(Path(__file__).resolve().parent.parent / "app.py")
PAGES = ["app_pages/train_view.py", "app_pages/results_view.py", "app_pages/runs_view.py",
         "app_pages/tif_explorer.py", "app_pages/audit_view.py"]
TINY = {"dataset": "digits", "max_train": "200", "epochs": "1.0", "batch": "32", "eval_every": "1"}


@pytest.fixture()
def lab(tmp_path, monkeypatch):
    """An AppTest of app.py on a fresh run store; its job manager is shut down afterwards."""
    store = tmp_path / "runs.sqlite"
    monkeypatch.setenv("PRIVACY_LAB_STORE", str(store))
    monkeypatch.setenv("PRIVACY_LAB_PREWARM", "0")
    at = AppTest.from_file(APP, default_timeout=120)
    yield at, RunStore(store)
    from app_pages import _handles

    _handles._manager.clear()  # on_release: the manager stops its scheduler and workers


def errors(at: AppTest) -> list[str]:
    """The st.error texts, markdown escapes removed (user strings are escaped before display)."""
    return [e.value.replace("\\", "") for e in at.error]


def no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def wait_done(store: RunStore, n: int, timeout: float = 120) -> list[dict]:
    """The store's runs once there are ``n`` and none is queued or running."""
    def done():
        runs = store.list_runs()
        return len(runs) >= n and all(r["status"] not in ("queued", "running") for r in runs) and runs

    try:
        return wait_until(done, timeout, f"{n} runs to end", interval=0.25)
    except AssertionError as e:
        raise AssertionError(f"{e}; runs: {[(r['id'], r['status']) for r in store.list_runs()]}") from None


@pytest.mark.slow
def test_every_page_renders_on_an_empty_store(lab):
    at, _ = lab
    at.run()
    no_exception(at)
    assert at.title[0].value == "Train / compare"
    assert at.button(key="launch") is not None and not at.button(key="launch").disabled
    # before any run: what the default comparison shows (the shipped example runs' MID overlay)
    charts = at.get("plotly_chart")
    assert len(charts) == 1 and "example" in charts[0].proto.spec and "INO-SGD" in charts[0].proto.spec
    for page, title in zip(PAGES[1:4], ["Results", "Runs", "TIF explorer"]):
        at.switch_page(page).run()
        no_exception(at)
        assert at.title[0].value == title
    assert not at.error
    at.switch_page(PAGES[4]).run()
    no_exception(at)
    assert "audit" in at.title[0].value.lower()


@pytest.mark.slow
def test_tif_explorer_redraws_from_its_controls(lab):
    at, _ = lab
    at.switch_page(APP).run()
    at.switch_page("app_pages/tif_explorer.py").run()
    no_exception(at)
    assert len(at.get("plotly_chart")) == 3
    at.segmented_control(key="x_shape").set_value("step").run()
    at.slider(key="x_cut").set_value(0.8).run()
    at.radio(key="x_tail_mode").set_value("absolute").run()
    no_exception(at)
    assert len(at.get("plotly_chart")) == 3 and not at.error


@pytest.mark.slow
def test_launch_a_tiny_comparison_through_the_ui(lab):
    at, store = lab
    for k, v in TINY.items():
        at.query_params[k] = v
    at.run()
    no_exception(at)
    assert at.number_input(key="max_train").value == 200
    assert at.multiselect(key="algos").value == ["idp_sample", "ino"]
    assert len(at.get("dataframe")) >= 1  # the privacy plan is shown before launching
    at.button(key="launch").click().run()
    no_exception(at)
    runs = wait_done(store, 2)
    assert sorted(r["algorithm"] for r in runs) == ["idp_sample", "ino"]
    assert [r["status"] for r in runs] == ["finished", "finished"], [r["error"] for r in runs]
    assert len({r["group_id"] for r in runs}) == 1 and len({r["seed"] for r in runs}) == 1
    at.run()
    no_exception(at)
    # the live charts are app_pages/_plotly_live.py components (AppTest: "bidi_component"), the others st.plotly_chart
    assert len(at.get("plotly_chart")) + len(at.get("bidi_component")) >= 5, [e.type for e in at.main]
    badges = " ".join(m.value for m in at.markdown)
    assert badges.count("finished") >= 2
    # the comparison is persistent: Results and Runs show it
    at.switch_page("app_pages/results_view.py").run()
    no_exception(at)
    assert len(at.multiselect(key="runs").value) == 2 and len(at.get("plotly_chart")) >= 5
    at.switch_page("app_pages/runs_view.py").run()
    no_exception(at)
    assert len(at.dataframe[0].value) == 2


def warnings(at: AppTest) -> list[str]:
    return [w.value.replace("\\", "") for w in at.warning]


@pytest.mark.parametrize("text, message", [
    (json.dumps({"assign": "class", "tiers": [{"epsilon": -1.0, "classes": list(range(10))}]}), "tiers.tiers[0].epsilon"),
    ("{not json", "not valid JSON"),
    ("[" * 100_000, "tiers"),  # deeper than the JSON decoder recurses
    ('{"assign": "class", "tiers": [{"epsilon": ' + "9" * 5000 + '}]}', "tiers"),  # an int too long to convert
    ("[1, 2]", "tiers"),
    ('{"assign": "class", "tiers": [{"epsilon": 1, "classes": "0123456789"}]}', "tiers.tiers[0].classes"),
])
@pytest.mark.slow
def test_an_invalid_tiers_url_is_warned_about_and_the_preset_used(lab, text, message):
    at, _ = lab
    at.query_params["tiers"] = text
    at.run()
    no_exception(at)
    named = [w for w in warnings(at) if "URL parameter **tiers**" in w]
    assert named and message in named[0] and "using the preset" in named[0], warnings(at)
    assert "tiers" not in at.query_params  # dropped from the URL, but not silently
    assert not at.button(key="launch").disabled  # the preset is valid


def test_a_class_in_no_tier_is_an_error(lab):
    at, _ = lab
    # the URL's tiers parse, but leave classes without a tier: the engine's data-dependent check
    at.query_params["tiers"] = json.dumps({"assign": "class", "tiers": [{"epsilon": 1.0, "classes": [0, 1, 2]}]})
    at.run()
    no_exception(at)
    assert any("assigned to no tier" in e for e in errors(at)), errors(at)
    assert at.button(key="launch").disabled


def test_invalid_url_values_are_warned_about_by_name(lab):
    at, _ = lab
    at.query_params.update({"epochs": "abc", "algos": ["bogus"], "model": "gpt", "group": "nope", "epoch": "4"})
    at.run()
    no_exception(at)
    text = " ".join(warnings(at))
    for param in ("epochs", "algos", "model"):
        assert f"URL parameter **{param}**" in text and "not a valid value" in text, (param, text)
    assert "URL parameter **epoch**: is not a setting of this page; ignored" in text, text  # a typo of epochs
    assert not at.button(key="launch").disabled  # the defaults are used
    at.query_params.clear()
    from engine.tools.demo import DEFAULT_TRAIN  # the Train page's defaults

    at.query_params.update({"epochs": str(DEFAULT_TRAIN.epochs), "dataset": DEFAULT_TRAIN.dataset,
                            "algos": ["IDP-SGD (SAMPLE)", "INO-SGD"]})
    at.run()  # defaults, which Streamlit drops from the URL: nothing to warn about
    no_exception(at)
    assert not [w for w in warnings(at) if "URL parameter" in w], warnings(at)
    for page, params, name in (("app_pages/runs_view.py", {"kind": "banana"}, "kind"),
                               ("app_pages/tif_explorer.py", {"x_batch": "2", "x_shape": "zigzag"}, "x_batch")):
        at.switch_page(page)
        at.query_params.clear()
        at.query_params.update(params)
        at.run()
        no_exception(at)
        assert any(f"URL parameter **{name}**" in w for w in warnings(at)), (page, warnings(at))


def column_of(at: AppTest, key: str):
    """The innermost column holding the number input ``key`` (where its error message belongs)."""
    return min((c for c in at.columns if any(n.key == key for n in c.number_input)), key=lambda c: len(c.number_input))


@pytest.mark.slow
def test_an_out_of_range_setting_disables_launch_and_says_why_next_to_the_field(lab):
    at, _ = lab
    at.query_params.update({"max_train": "100", "batch": "500"})
    at.run()
    no_exception(at)
    beside = [e.value.replace("\\", "") for e in column_of(at, "batch").error]
    assert any("at most the training set size 100, got 500" in e for e in beside), (beside, errors(at))
    assert not column_of(at, "epochs").error  # only the bad field is marked
    assert at.button(key="launch").disabled
    note = " ".join(c.value.replace("\\", "") for c in at.caption)
    assert "Launch is disabled until this is fixed: Batch size (see its message below, by the field)" in note, note
    assert "must be at most" not in note  # the message itself is said once, next to the field
    at.number_input(key="batch").set_value(32).run()  # fixed: the message goes, Launch is enabled
    no_exception(at)
    assert not column_of(at, "batch").error and not at.button(key="launch").disabled
    assert any(c.value.startswith("about ") for c in at.caption), [c.value for c in at.caption]  # the estimate


@pytest.mark.slow
def test_no_formal_dp_is_flagged_before_launch(lab):
    at, _ = lab
    at.query_params.update({**TINY, "algos": ["DP-SGD-S"], "private_q": "false"})
    at.run()
    no_exception(at)
    assert at.multiselect(key="algos").value == ["dpsgd_s"]
    assert any("no formal DP guarantee" in w.value for w in at.warning), [w.value for w in at.warning]


def test_rows_to_tiers_rejects_two_budgets_in_one_tier():
    from engine.config.run import PAPER_TIERS, TiersConfig
    from engine.config.schema import ConfigError
    from engine.data import load_dataset
    from app_pages import _tiers as tiers
    from engine.config.run import parse_tiers_param

    ds = load_dataset("digits")
    base = TiersConfig(tiers=PAPER_TIERS)
    rows = tiers.tiers_to_rows(base, ds)
    assert tiers.rows_to_tiers(rows, base) == base  # the table round-trips the paper tiers
    rows.loc[0, "ε"] = 5.0  # class 0 is in tier 3 (ε = 3)
    with pytest.raises(ConfigError, match="two different ε"):
        tiers.rows_to_tiers(rows, base)
    assert parse_tiers_param(tiers.tiers_to_param(base)) == base  # the URL form round-trips


def _row(**kw) -> dict:
    run = {"id": 1, "status": "running", "step": 0, "total_steps": 100, "started_at": 1000.0, "finished_at": None,
           "error": None, "name": "", "algorithm": "ino", "config": {}, "group_id": "g", "plan": None, "summary": None}
    run.update(kw)
    return run


def test_progress_and_status_words_come_from_the_one_row():
    from app_pages import _status as status

    assert status.state_words(_row(status="cancelled", error="cancelled by the user at step 40")) == "cancelled by you"
    assert status.state_words(_row(status="cancelled", error="cancelled before it started")) == "cancelled by you"
    assert status.state_words(_row(status="cancelled", error="terminated by signal")) == "cancelled by you"
    assert status.state_words(_row(status="interrupted", error="worker process 7 ended")) == \
        "interrupted (worker stopped)"
    # an ended run never shows an ETA, whatever step its row last recorded
    done = _row(status="finished", step=40, finished_at=1030.0)
    text = status.progress_text(done, {})
    assert "step 100/100" in text and "took 30 s" in text and "left" not in text
    running = _row(step=25)  # the ETA is the caller's (the live view: its session's engine SmoothEta)
    assert "step 25/100 · about 60 s left" in status.progress_text(running, {}, eta=lambda r: 60.0)
    queued = _row(id=5, status="queued")
    assert "#2 in the queue" in status.progress_text(queued, {3: 1, 5: 2})  # places: engine.jobs.manager
    assert "in the queue" not in status.progress_text(queued, {})


def test_every_job_kind_has_its_view_and_progress_line():
    """The page-side table beside the job-kind registry (issue 41): every kind has a view, whose progress line
    says the queue place, the step and the time left, and a finished run's duration or end."""
    from app_pages import _status as status
    from engine.jobs.kinds import JOB_KINDS

    assert set(status.KIND_VIEWS) == set(JOB_KINDS)
    for kind, view in status.KIND_VIEWS.items():
        queued = _row(id=5, status="queued", step=0, total_steps=None)
        assert "#2 in the queue" in view.progress(queued, {5: 2}, lambda r: None), kind
        running = _row(id=5, status="running", step=25, total_steps=100)
        line = view.progress(running, {}, lambda r: 60.0)
        assert "step 25/100" in line and "about 60 s left" in line, (kind, line)
        done = _row(id=5, status="finished", step=100, total_steps=100, started_at=10.0, finished_at=70.0)
        assert view.progress(done, {}, lambda r: None), kind
    assert [v.resume for v in status.KIND_VIEWS.values()] == [k == "audit" for k in status.KIND_VIEWS]


def test_staggered_redraws_each_at_most_every_interval_and_one_per_refresh(monkeypatch):
    from app_pages import _charts as charts

    clock, calls = [100.0], []
    monkeypatch.setattr(charts.st, "session_state", {})
    monkeypatch.setattr(charts.time, "monotonic", lambda: clock[0])

    def refresh(t, changed="a"):
        clock[0] = t
        return charts.staggered(3.0, "k", {n: (lambda n=n: calls.append((t, n)) or (n, t)) for n in "xyz"},
                                 unless_changed=changed)

    assert refresh(100.0) == {"x": ("x", 100.0), "y": ("y", 100.0), "z": ("z", 100.0)}  # the first: all
    refresh(101.0), refresh(102.9)
    assert len(calls) == 3  # none due yet
    for t in (103.0, 103.5, 104.0, 104.5):  # due together: one per refresh, oldest first
        refresh(t)
    assert calls[3:] == [(103.0, "x"), (103.5, "y"), (104.0, "z")]
    refresh(106.0)
    assert calls[-1] == (106.0, "x")  # x again 3 s after its last redraw: the redraws stay spread
    got = refresh(106.1, changed="b")  # a change: all at once
    assert calls[-3:] == [(106.1, "x"), (106.1, "y"), (106.1, "z")] and got["z"] == ("z", 106.1)


@pytest.mark.slow
def test_runs_page_rerun_button_queues_a_new_comparison(tmp_path, monkeypatch):
    from engine.config.run import DataConfig, ModelConfig, RunConfig
    from engine.jobs.kinds import execute

    monkeypatch.setenv("PRIVACY_LAB_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("PRIVACY_LAB_PREWARM", "0")
    store = RunStore(tmp_path / "runs.sqlite")
    cfg = RunConfig(data=DataConfig(name="digits", max_train=200), model=ModelConfig(name="lr"), epochs=1.0)
    (rid,) = store.create_job(cfg.seed_configs(), status="queued", group_id="cmp-original")
    execute(store, rid, cfg.job_config(), kind="train")
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app_pages" / "runs_view.py"), default_timeout=60)
    at.session_state["runs-table"] = {"selection": {"rows": [0], "columns": [], "cells": []}}
    at.run()
    no_exception(at)
    at.button(key=f"rerun-{rid}").click().run()
    no_exception(at)
    runs = store.list_runs()
    assert len(runs) == 2
    new = next(r for r in runs if r["id"] != rid)
    assert new["config"] == store.get_run(rid)["config"] and new["group_id"] not in (None, "cmp-original")
    assert any(f"Queued as run {new['id']} in a new comparison" in s.value for s in at.success)
    from engine.jobs.manager import shutdown_all

    shutdown_all(cancel_running=True)
