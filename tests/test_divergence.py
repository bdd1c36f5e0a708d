"""Divergence is a run state: a run whose test loss goes non-finite or stays far above its start ends *diverged*
(not *finished*) — in the store, on the CLI, the Runs page and Results (left out of the headline unless chosen) —
by the lab's one rule (engine.models.metrics.diverged_step, also the MID chart's badge). Valid settings far from what
works (RunConfig.advisories: a learning rate far outside what the optimizer trains with, a data folder that does not
exist) are warned about before the run, by the field and on the CLI, never refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config.run import RunConfig
from engine.config.schema import ConfigError
from engine.figures import frames
from engine.figures.bands import diverged_units
from engine.jobs.kinds import execute
from engine.store.db import RunStore
from in_process import cli_here
from test_app import no_exception
from test_common_span import stored
from test_plots import make_run

REPO = Path(__file__).resolve().parents[1]
TINY = {"data": {"name": "digits", "max_train": 300}, "model": {"name": "lr"}, "epochs": 3.0}


def test_a_run_at_a_huge_learning_rate_ends_diverged_and_the_chart_agrees(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    cfg = RunConfig.from_dict({**TINY, "optimizer": {"lr": 1e6}})
    rid = store.create_run(cfg)
    execute(store, rid, cfg, kind="train")
    run = store.get_run(rid)
    assert run["status"] == "diverged" and run["finished_at"] is not None
    step = run["summary"]["diverged_step"]
    assert step is not None and step > 0
    # the MID chart's badge reads the same rule from the same evaluations
    hist = frames.tier_history([{**run, "evals": store.eval_metrics(rid)}]).assign(unit="u")
    assert diverged_units(hist) == {"u": step}
    healthy = RunConfig.from_dict(TINY)
    ok = store.create_run(healthy)
    execute(store, ok, healthy, kind="train")
    assert store.get_run(ok)["status"] == "finished" and "diverged_step" not in store.get_run(ok)["summary"]


def test_every_model_non_finite_stops_the_run_early(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    cfg = RunConfig.from_dict({**TINY, "model": {"name": "mlp"}, "epochs": 20.0, "eval_every": 1,
                               "optimizer": {"lr": 1e37, "momentum": 0.9}, "seeds": 2})  # weights overflow: inf
    ids = store.create_job(cfg.seed_configs())
    execute(store, ids[0], cfg.job_config(), kind="train")
    for rid in ids:
        run = store.get_run(rid)
        assert run["status"] == "diverged"
        assert run["summary"]["steps"] < run["total_steps"]  # it stopped: nothing could train on
        assert run["summary"]["diverged_step"] == run["summary"]["steps"]
    with pytest.raises(ConfigError, match="optimizer.lr: must be"):
        RunConfig.from_dict({**TINY, "optimizer": {"lr": 1e300}}).validate()  # torch's float32 update would raise


def test_the_cli_says_diverged_and_warns_about_the_learning_rate_before(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**TINY, "optimizer": {"lr": 1e6}}))
    out = cli_here("run", path, store=tmp_path / "runs.sqlite")
    assert out.returncode == 0, out.stderr
    assert "warning: optimizer.lr: 1e+06 is far above the learning rates SGD trains with (up to about 50): " \
           "expect the run to diverge" in out.stderr
    head = next(line for line in out.stdout.splitlines() if line.startswith("run 1"))
    assert head.startswith("run 1: ") and " — diverged at step " in head and "broken model" in head
    listed = cli_here("list", "--json", store=tmp_path / "runs.sqlite")
    assert json.loads(listed.stdout)[0]["status"] == "diverged"
    shown = cli_here("show", "1", store=tmp_path / "runs.sqlite")
    assert "run 1 [diverged]" in shown.stdout and "diverged at step" in shown.stdout
    low = RunConfig.from_dict({**TINY, "optimizer": {"name": "adam", "lr": 1e-9}}).advisories()
    assert [(e.field, "barely move" in e.message) for e in low] == [("optimizer.lr", True)]
    assert RunConfig.from_dict({**TINY, "optimizer": {"lr": 4.0}}).advisories() == []


@pytest.mark.slow
def test_results_leave_a_diverged_run_out_unless_chosen_and_say_so(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    idp, ino, bad = make_run(1, "idp_sample"), make_run(2, "ino"), make_run(3, "ino")
    bad["status"] = "diverged"
    for e in bad["evals"][5:]:
        for t in e["tiers"]:
            t["loss"] = float("nan")
    stored(tmp_path / "runs.sqlite", [idp, ino, bad])
    store = RunStore(tmp_path / "runs.sqlite")
    store.set_summary(3, {"diverged_step": 50})
    monkeypatch.setenv("PRIVACY_LAB_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("PRIVACY_LAB_PREWARM", "0")
    at = AppTest.from_file(str(REPO / "app_pages" / "results_view.py"), default_timeout=120)
    at.run()
    no_exception(at)
    assert at.multiselect(key="runs").value == ["IDP-SGD (SAMPLE) #1", "INO-SGD #2"]
    assert "INO-SGD #3" not in at.multiselect(key="runs").options
    left = [c.value.replace("\\", "") for c in at.caption if c.value.startswith("Left out")]
    assert left and left[0].startswith("Left out: INO-SGD #3 diverged")
    at.session_state["all"] = True
    at.run()
    at.multiselect(key="runs").set_value(["IDP-SGD (SAMPLE) #1", "INO-SGD #3"]).run()
    no_exception(at)
    said = [w.value.replace("\\", "") for w in at.warning]
    assert any(w.startswith("INO-SGD #3 diverged at step 50: a tier's test loss went non-finite") for w in said), said


def test_a_far_learning_rate_is_warned_about_by_its_field_and_launch_stays_enabled(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from test_app import TINY as SMALL
    from test_app import column_of

    monkeypatch.setenv("PRIVACY_LAB_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("PRIVACY_LAB_PREWARM", "0")
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=120)
    at.query_params.update({**SMALL, "lr": "1000000"})
    at.run()
    no_exception(at)
    said = [w.value.replace("\\", "") for w in at.warning if "Learning rate" in w.value]
    # a long message goes under the field's row (FieldSlots.NARROW), once
    assert said == ["**Learning rate**: 1e+06 is far above the learning rates SGD trains with (up to about 50): "
                    "expect the run to diverge"], [w.value for w in at.warning]
    assert not column_of(at, "lr").error
    assert not at.button(key="launch").disabled
    from app_pages import _handles

    _handles._manager.clear()


def test_a_data_folder_that_does_not_exist_is_said_before_the_run(tmp_path):
    path = tmp_path / "c.json"
    missing = tmp_path / "no-such-folder"
    path.write_text(json.dumps({**TINY, "data": {"name": "digits", "max_train": 300, "data_dir": str(missing)}}))
    out = cli_here("run", path, store=tmp_path / "runs.sqlite")
    assert out.returncode == 0, out.stderr
    assert f"warning: data.data_dir: '{missing}' does not exist: digits is read from the lab's shipped copy if it " \
           "has one (else it will not load)" in out.stderr
    assert RunConfig.from_dict({**TINY, "data": {"name": "digits", "data_dir": str(tmp_path)}}).advisories() == []
