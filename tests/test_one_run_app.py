"""The Audit page's one-run section (Streamlit AppTest): it renders with the engine's defaults, refuses an
invalid value with one error and a disabled Launch, shows a finished one-run audit from the store (figure,
table, a sentence per algorithm) and launches a tiny one through the page's job manager up to its figure."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app_pages import _one_run as one_run
from conftest import wait_until
from engine.audit.one_run.config import OneRunConfig
from engine.store.db import RunStore

try:
    from . import test_one_run_figures as figs
except ImportError:  # pytest's rootdir-relative import mode
    import test_one_run_figures as figs

PAGE = str(Path(__file__).resolve().parents[1] / "app_pages" / "audit_view.py")


@pytest.fixture(autouse=True)
def _no_leftover_workers(monkeypatch):
    monkeypatch.setenv("PRIVACY_LAB_PREWARM", "0")
    yield
    from engine.jobs.manager import shutdown_all

    shutdown_all(cancel_running=True)


def _app(**params) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.query_params.update({"section": "one_run", **params})
    return at


def _text(elements) -> str:
    return " ".join(e.value.replace("\\", "") for e in elements)  # the page escapes Markdown


@pytest.mark.slow
def test_the_radio_opens_the_one_run_section_with_the_engine_defaults():
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception and not at.error
    assert at.radio(key="a_section").value == one_run.PA_ALOOA and at.button(key="a_launch")
    at.radio(key="a_section").set_value(one_run.ONE_RUN).run()
    assert not at.exception and not at.error
    assert at.query_params["section"] == "one_run"
    assert not [b for b in at.button if b.key == "a_launch"]  # the PA-ALOOA form is not shown
    assert at.selectbox(key="o_dataset").value == "digits" and at.selectbox(key="o_tiers").value == "paper"
    assert at.multiselect(key="o_algos").value == ["dpsgd", "idp_sample", "idp_scale", "ino", "dpsgd_s"]
    assert at.number_input(key="o_canaries").value == 500 and at.number_input(key="o_beta").value == 0.05
    plan = _text(at.caption)
    assert "5 run(s) × 112 steps" in plan and "ε=1, ε=2, ε=3" in plan and "500 gradient" in plan
    assert not at.button(key="o_launch").disabled
    assert any("No one-run audits yet" in i.value for i in at.info)


@pytest.mark.parametrize("widget, value, words", [
    ("o_beta", 0.7, "β"),
    ("o_epochs", -1.0, "Epochs"),
    ("o_canaries", -5, "Gradient canaries per tier"),
])
def test_an_invalid_value_gets_one_error_and_a_disabled_launch(widget, value, words):
    at = _app().run()
    assert not at.exception and not at.error and not at.button(key="o_launch").disabled
    at.number_input(key=widget).set_value(value).run()
    assert not at.exception
    assert len(at.error) == 1 and _text(at.error).startswith(words), _text(at.error)
    assert "run." not in _text(at.error)  # the form's words, not config paths
    assert at.button(key="o_launch").disabled


def test_no_canaries_and_no_algorithms_are_refused():
    at = _app().run()
    at.number_input(key="o_canaries").set_value(0).run()
    assert not at.error and not at.button(key="o_launch").disabled  # input canaries alone are an audit
    at.number_input(key="o_inputs").set_value(0).run()
    assert len(at.error) == 1 and "no canaries" in _text(at.error) and "input_canaries" not in _text(at.error)
    assert at.button(key="o_launch").disabled
    at.number_input(key="o_inputs").set_value(50).run()
    at.multiselect(key="o_algos").set_value([]).run()
    assert len(at.error) == 1 and _text(at.error).startswith("Algorithms")
    assert at.button(key="o_launch").disabled


@pytest.mark.slow
def test_a_finished_one_run_audit_shows_its_figure_table_and_verdicts():
    report = figs.make_report(broken=True)
    store = RunStore()  # the page's store (conftest: a temporary file)
    rid = store.create_run(OneRunConfig().to_dict(), kind="one_run", status="queued", name="hand-built")
    store.finish_runs({rid: report.to_dict()})
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.query_params["one_run"] = str(rid)  # a link to it opens the one-run section
    at.run()
    assert not at.exception
    assert at.radio(key="a_section").value == one_run.ONE_RUN and at.selectbox(key="o_pick").value == rid
    (chart,) = at.get("plotly_chart")
    assert "Claimed vs empirical" in chart.proto.spec
    words = _text(at.markdown) + " " + _text(at.error)
    assert "DP-SGD: every tier's ε̂ stays below its claimed ε" in words
    assert "IDP-SGD (SAMPLE) — BROKEN: tier ε=2's ε̂ 2.65 (white-box, Steinke and f-DP) exceeds its claimed 2.00" in words
    assert "Non-private SGD: no formal DP (ε̂ shown without a claim)" in words
    assert len(at.error) == 1  # the broken algorithm, nothing else
    (table,) = [d.value for d in at.dataframe]
    assert list(table.columns) == list(one_run.TABLE_COLUMNS)
    assert not {"algorithm", "kind", "formal_dp", "exceeds_claim"} & set(table.columns)  # internal columns hidden
    assert len(table) == len(report.frame())
    broken = table[table["verdict"].str.startswith("BROKEN")]
    assert list(zip(broken["label"], broken["tier"], broken["epsilon_hat"])) == [("IDP-SGD (SAMPLE)", "ε=2", 2.6)]
    assert list(broken["epsilon_hat_fdp"]) == [2.65]  # the f-DP bound beside Steinke's, from the same guesses
    assert table["epsilon_hat_fdp"].notna().all()
    assert table[table["label"] == "Non-private SGD"]["epsilon"].isna().all()
    assert any(b.label == "Results (JSON)" for b in at.get("download_button"))


def test_progress_words_say_where_a_run_is():
    from app_pages._status import one_run_progress_text as words

    run = {"id": 7, "status": "running", "total_steps": 560, "step": 112}
    assert words(run, {}, lambda r: 30.0).startswith("training step 112/560")
    assert "left" in words(run, {}, lambda r: 30.0)
    assert words({**run, "step": 560}, {}, lambda r: None) == "scoring the canaries…"
    assert words({"id": 7, "status": "queued", "total_steps": None, "step": 0}, {7: 2}) == "queued (#2 in the queue)"
    done = {"id": 7, "status": "finished", "total_steps": 560, "step": 500, "started_at": 100.0, "finished_at": 190.0}
    assert words(done, {}).startswith("every run trained, its canaries scored · took")
    assert words({**done, "status": "cancelled"}, {}).startswith("stopped at step 500/560")


@pytest.mark.slow
def test_launch_a_tiny_one_run_audit_until_its_figure():
    at = _app().run()
    at.number_input(key="o_epochs").set_value(1.0).run()
    at.number_input(key="o_canaries").set_value(50).run()
    at.number_input(key="o_inputs").set_value(20).run()
    at.multiselect(key="o_algos").set_value(["dpsgd"]).run()
    assert not at.exception and not at.error
    at.button(key="o_launch").click().run()
    assert not at.exception
    store = RunStore()
    (run,) = store.list_runs(kind="one_run")
    assert [a["name"] for a in run["config"]["algorithms"]] == ["dpsgd"] and run["config"]["canaries"] == 50
    assert at.query_params["one_run"] == str(run["id"])
    wait_until(lambda: store.get_run(run["id"])["status"] not in ("queued", "running"), 150, "the audit to end",
               interval=0.5)
    assert store.get_run(run["id"])["status"] == "finished", store.get_run(run["id"])["error"]
    at.run()
    assert not at.exception and not at.error
    assert len(at.get("plotly_chart")) == 1
    assert "DP-SGD: every tier's ε̂ stays below its claimed ε (white-box and black-box" in _text(at.markdown)


# --- the collusion study as a preset (issue 58, point 8b) --------------------------------------------------------------

def test_the_collusion_preset_builds_one_valid_audit_per_setting():
    from engine.audit.one_run.presets import COLLUSION_SETTINGS, PRESETS, preset, study_setting
    from engine.config.schema import ConfigError

    study = preset("collusion")
    assert PRESETS["collusion"] is study and len(study.configs) == len(COLLUSION_SETTINGS) == 4
    for (setting, others), cfg in zip(study.settings, study.configs):
        again = OneRunConfig.from_json(cfg.to_json()).validate()  # stored and read back: still valid, the same
        assert again == cfg and study_setting(again) == (study, setting)
        tiers = cfg.run.tiers.tiers
        assert (tiers[0].name, tiers[0].epsilon, tiers[0].classes) == ("ε=1", 1.0, (2, 5, 9))  # the fixed tier
        assert tuple(t.epsilon for t in tiers[1:]) == others  # the others' budgets, varied
        assert sorted(c for t in tiers for c in t.classes) == list(range(10))
        assert [a.name for a in cfg.algorithms] == ["idp_sample"] and cfg.canaries > 0
    assert study_setting(OneRunConfig()) is None and study_setting(OneRunConfig(name="collusion · nope")) is None
    with pytest.raises(ConfigError, match="unknown one-run preset"):
        preset("nope")


def _finished_study(store, settings_hat: dict) -> list[int]:
    """The collusion study's audits in one comparison, finished with hand-built reports (ε̂ of the ε=1 tier)."""
    from engine.audit.one_run.presets import preset

    study = preset("collusion")
    ids = store.create_jobs([[c.to_dict()] for c in study.configs], kind="one_run", group_id="onerun-study",
                            names=[c.name for c in study.configs])
    reports = {}
    for (setting, _), rid in zip(study.settings, ids):
        if setting in settings_hat:
            algo = figs.algorithm("idp_sample", "idp_sample", "IDP-SGD (SAMPLE)", [1.0, 2.0, 3.0],
                                  [settings_hat[setting], 0.5, 0.6], tiers=("ε=1", "a", "b"))
            reports[rid] = figs.OneRunReport(dataset="digits", delta=1e-5, beta=0.05, canaries=500, input_canaries=0,
                                             algorithms=(algo,)).to_dict()
    store.finish_runs(reports)
    return ids


def test_the_one_run_section_offers_the_collusion_study_and_says_what_it_found():
    at = _app().run()
    assert at.selectbox(key="o_preset").value == one_run.FORM and "collusion study" in at.selectbox(key="o_preset").options
    at.selectbox(key="o_preset").set_value("collusion").run()
    assert not at.exception and not at.error
    assert not [w for w in at.number_input if w.key == "o_epochs"]  # the study's settings replace the form
    (settings,) = [d.value for d in at.dataframe if "setting" in d.value.columns]
    assert list(settings["setting"]) == ["equal", "paper", "looser", "loosest"]
    assert "Does my tier's risk depend on the others' budgets?" in _text(at.caption)
    assert "4 one-run audits" in at.button(key="o_launch").label and not at.button(key="o_launch").disabled

    store = RunStore()  # the page's store (conftest: a temporary file)
    ids = _finished_study(store, {"equal": 0.41, "paper": 0.38})  # two of four settings finished
    at = _app(one_run=str(ids[1])).run()
    assert not at.exception
    (info,) = [i.value.replace("\\", "") for i in at.info if "study" in i.value]
    assert "the ε=1 tier's one-run ε̂ moves from 0.41 to 0.38" in info and "(1, 1) to (2, 3)" in info
    assert "2 of 4 settings finished" in info and "holding in every setting" in info


def test_the_study_sentence_without_a_gpr_says_when_a_setting_breaks_the_claim():
    import pandas as pd

    from engine.audit.one_run.presets import preset, study_rows
    from engine.figures.experiments import COLLUSION_COLUMNS, collusion_sentence

    study = preset("collusion")

    def report(hat):
        algo = figs.algorithm("idp_sample", "idp_sample", "IDP-SGD (SAMPLE)", [1.0, 2.0, 3.0], [hat, 0.5, 0.6],
                              tiers=("ε=1", "a", "b"))
        return figs.OneRunReport(dataset="digits", delta=1e-5, beta=0.05, canaries=500, input_canaries=0,
                                 algorithms=(algo,))

    rows = study_rows(study, {"equal": report(0.4), "loosest": report(1.2), "paper": report(0.5)})
    assert [r["setting"] for r in rows] == ["equal", "paper", "loosest"]  # the study's order, finished ones only
    sentence = collusion_sentence(pd.DataFrame(rows, columns=COLLUSION_COLUMNS))
    assert "from 0.40 to 1.20" in sentence and "(1, 1) to (4, 8)" in sentence
    assert "above its claimed ε = 1 in loosest: the claim is broken" in sentence and "GPR" not in sentence
