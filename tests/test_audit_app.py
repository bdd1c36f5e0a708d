"""The dashboard's Audit page (Streamlit AppTest): renders, rejects invalid input with st.error, and runs a
tiny audit in a background worker up to its charts."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.store.db import RunStore

PAGE = str(Path(__file__).resolve().parents[1] / "app_pages" / "audit_view.py")


@pytest.fixture(autouse=True)
def _no_leftover_workers(monkeypatch):
    monkeypatch.setenv("PRIVACY_LAB_PREWARM", "0")
    yield
    from engine.jobs.manager import shutdown_all

    shutdown_all(cancel_running=True)


def _app() -> AppTest:
    return AppTest.from_file(PAGE, default_timeout=120)


@pytest.mark.slow
def test_page_renders_with_defaults():
    at = _app().run()
    assert not at.exception
    assert not at.error
    assert at.title[0].value == "Privacy audit"
    assert at.selectbox(key="a_dataset").value == "adult"
    assert at.multiselect(key="a_algos").value == ["idp_sample", "ino", "dpsgd_s", "dpsgd"]
    assert at.selectbox(key="a_tiers").value != "single ε"  # tiered ε: IDP-SGD is not DP-SGD
    assert at.selectbox(key="a_threshold").value == "held_out"
    assert any("Estimated runtime" in c.value and "measured" in c.value for c in at.caption), \
        [c.value for c in at.caption]
    assert not at.button(key="a_launch").disabled


def test_a_preset_replaces_the_settings_and_shows_its_estimate():
    from engine.audit.pa_alooa.presets import PRESETS, settings

    at = _app().run()
    at.selectbox(key="a_preset").set_value("quick").run()
    assert not at.exception and not at.error
    shown = " ".join(i.value.replace("\\", "") for i in at.info)
    assert "Preset quick runs digits, LR, 30 epochs" in shown and "Non-private SGD, DP-SGD; one tier at ε = 10" in shown
    assert any("Estimated runtime" in c.value and "400 models" in c.value for c in at.caption)
    assert not at.button(key="a_launch").disabled
    # what the page shows is what runs: the form's fields (adult, sex, four algorithms) are gone, the preset's
    # settings are shown in their place
    keys = {w.key for kind in ("selectbox", "multiselect", "number_input", "toggle", "slider") for w in at.get(kind)}
    assert keys.isdisjoint({"a_dataset", "a_attr", "a_algos", "a_R", "a_epochs", "a_controls", "a_tail"}), keys
    table = next(d.value for d in at.dataframe if list(d.value.columns) == ["setting", "value"])
    rows = dict(zip(table["setting"], table["value"]))
    assert rows == dict(settings(PRESETS["quick"]))
    assert rows["dataset"].startswith("digits") and rows["algorithms"] == "Non-private SGD, DP-SGD"
    assert rows["R"].startswith("200 ") and rows["groups (GPR per …)"] == "class"
    at.selectbox(key="a_preset").set_value(at.selectbox(key="a_preset").options[0]).run()  # back to custom
    assert not at.exception and not at.error
    assert at.selectbox(key="a_dataset").value == "adult"
    assert not [d for d in at.dataframe if list(d.value.columns) == ["setting", "value"]]


@pytest.mark.parametrize("widget, value, message", [
    ("a_batch", 100000, "batch_size"),  # larger than half the training set
    ("a_max_train", 5, "max_train"),  # too few samples for an audit
])
def test_invalid_input_shows_an_error_not_a_traceback(widget, value, message):
    at = _app().run()
    at.number_input(key=widget).set_value(value).run()
    assert not at.exception
    assert at.error and message in at.error[0].value.replace("\\", "")  # the UI escapes Markdown
    assert at.button(key="a_launch").disabled


def test_invalid_url_values_are_warned_about_by_name():
    at = _app()
    at.query_params.update({"a_R": "1", "a_threshold": "sideways", "a_dataset": "adult"})
    at.run()
    assert not at.exception and not at.error
    text = " ".join(w.value.replace("\\", "") for w in at.warning)
    assert "URL parameter **a_R**" in text and "URL parameter **a_threshold**" in text, text
    assert "a_dataset" not in text  # the default: dropped by Streamlit, but nothing was wrong with it
    assert not at.button(key="a_launch").disabled


@pytest.mark.slow
def test_the_audit_plans_under_the_accountant_of_its_link():
    """``?a_accountant=pld``: the form's Accountant is PLD and the audit's plan is PLD's: the same claims (each
    within its target) with less noise than the default RDP plan of the same settings."""

    def plan_of(at):
        at.run()
        assert not at.exception and not at.error
        (plan,) = [d.value for d in at.dataframe if "ε claimed" in d.value.columns]
        return plan.dropna(subset=["ε claimed", "σ"]).reset_index(drop=True)

    rdp = plan_of(_app())
    at = _app()
    at.query_params.update({"a_accountant": "pld"})
    pld = plan_of(at)
    assert at.selectbox(key="a_accountant").value == "pld"
    assert len(pld) == len(rdp) > 0 and list(pld["algorithm"]) == list(rdp["algorithm"])
    assert (pld["σ"] < rdp["σ"]).all()
    assert (pld["ε claimed"] <= rdp["ε claimed"] * (1 + 1e-3)).all()


@pytest.mark.slow
def test_paper_tiers_render_and_no_algorithms_disables_launch():
    at = _app().run()
    at.selectbox(key="a_dataset").set_value("digits").run()
    at.selectbox(key="a_tiers").set_value("paper").run()
    assert not at.exception and not at.error
    at.multiselect(key="a_algos").set_value([]).run()
    assert not at.exception
    assert at.button(key="a_launch").disabled


@pytest.mark.slow
def test_launch_a_tiny_audit_until_its_charts(tmp_path):
    at = _app().run()
    at.selectbox(key="a_dataset").set_value("digits").run()
    at.number_input(key="a_R").set_value(2).run()
    at.number_input(key="a_epochs").set_value(1.0).run()
    at.number_input(key="a_batch").set_value(64).run()
    at.number_input(key="a_looa").set_value(0).run()
    at.multiselect(key="a_algos").set_value(["dpsgd", "nonprivate"]).run()
    assert not at.exception and not at.error
    at.button(key="a_launch").click().run()
    assert not at.exception
    store = RunStore()
    (run,) = store.list_runs(kind="audit")
    assert run["group_id"] and run["config"]["R"] == 2
    deadline = time.time() + 150
    while time.time() < deadline and store.get_run(run["id"])["status"] in ("queued", "running"):
        time.sleep(0.5)
    assert store.get_run(run["id"])["status"] == "finished", store.get_run(run["id"])["error"]
    at.run()
    assert not at.exception and not at.error
    charts = at.get("plotly_chart")
    assert len(charts) >= 6  # GPR bars, Δ table, accuracy, ε bounds, LiRA ROC, histogram (+ baselines)
    from engine.audit.pa_alooa.report import as_report

    report = as_report(store.get_run(run["id"])["summary"])
    at_floor = all(e.low <= a.null_groups[g] for a in report.algorithms for g, e in a.gpr.items())
    warned = any("null floor" in w.value for w in at.warning)
    assert warned == at_floor, (at_floor, [w.value for w in at.warning])  # 2R = 4 models of 1 epoch
    at.query_params["audit"] = "999999"  # a link to an audit that is not in this store
    at.run()
    assert not at.exception
    assert any("URL parameter **audit**" in w.value.replace("\\", "") for w in at.warning), [w.value for w in at.warning]
    assert at.selectbox(key="a_pick").value == run["id"]
    assert "audit" not in at.query_params  # dropped from the URL, but not silently


@pytest.mark.slow
def test_controls_switch_refuses_without_dpsgd_and_a_finished_audit_shows_its_verdict():
    from engine.audit.pa_alooa.config import DEFAULT_RUN, AuditConfig
    from engine.config.run import AlgorithmConfig
    from engine.jobs.kinds import execute

    at = _app().run()
    at.multiselect(key="a_algos").set_value(["dpsgd_s", "ino"]).run()
    at.toggle(key="a_controls").set_value(True).run()
    assert not at.exception
    assert at.error and "controls" in at.error[0].value and "dpsgd" in at.error[0].value.replace("\\", "")
    assert at.button(key="a_launch").disabled
    at.multiselect(key="a_algos").set_value(["dpsgd_s", "dpsgd"]).run()
    assert not at.exception and not at.error and not at.button(key="a_launch").disabled
    assert any("controls are planned while the audit runs" in c.value for c in at.caption)
    # a finished audit with the controls (run in this process, into the page's store)
    cfg = AuditConfig(run=DEFAULT_RUN.replace(**{"data.name": "digits", "epochs": 2.0, "batch_size": 64,
                                                 "threads": 1}),
                      group_by="class", R=2, epsilon=2.0, n_boot=50, null_perms=2, looa_k=0, controls=True,
                      algorithms=(AlgorithmConfig(name="dpsgd"), AlgorithmConfig(name="dpsgd_s", group_by="class")))
    store = RunStore()
    rid = store.create_run(cfg.to_dict(), kind="audit", status="queued", name="controls")
    report = execute(store, rid, cfg, kind="audit")
    at.query_params["audit"] = str(rid)
    at.run()
    assert not at.exception and not at.error
    from engine.audit.pa_alooa.verdict import delta_verdict

    texts = [m.value.replace("\\", "") for m in at.markdown]
    head = next(t for t in texts if t.startswith("**Verdict:**"))  # the Δ verdict first, then DP-SGD-S's
    assert head == "**Verdict:** " + delta_verdict(report)[0], head
    verdict = " ".join(texts)
    assert "vs noise-matched DP-SGD" in verdict and "DP-SGD-S" in verdict
    frames = [d.value for d in at.dataframe]
    table = next(f for f in frames if "comparison" in f.columns)
    assert set(table["comparison"]) == {c.b_label for c in report.comparisons}
    assert list(table.columns) == ["comparison", "quantity", "value", "low", "high", "unpaired", "answer"]
    delta = next(f for f in frames if "Δ (pp)" in f.columns)  # the Δ table, full width, with the accuracy cost
    assert list(delta["algorithm"]) == [a.label for a in report.algorithms]
    assert "accuracy − DP-SGD (points)" in delta.columns and "noise × DP-SGD" in delta.columns
    # every column of the Δ table has a column config (label, format, a width that fits its header)
    (proto,) = [d.proto for d in at.dataframe if "Δ (pp)" in d.value.columns]
    import json

    config = json.loads(proto.columns)
    assert set(delta.columns) <= set(config), set(delta.columns) - set(config)
    assert list(proto.column_order) == [c for c in config if c in delta.columns]
    assert config["_index"] == {"hidden": True}  # no internal index column
    for name in delta.columns:
        c = config[name]
        assert c.get("label") and c.get("width"), (name, c)
        if isinstance(c["width"], int):
            assert c["width"] >= 7 * len(c["label"]), (name, c)
