"""One rule for comparing runs (engine/figures/common_span.py): a cancelled run beside a finished one is compared
over the steps both reached, everywhere a compared number is shown, and the number says so in words.

The case from the tour: an IDP-SGD run cancelled at step 901 of 1406 beside a finished INO-SGD run whose recall
curve is the same over those steps. Each run's own recall AUC (normalised over its own length) gave INO-SGD a large
"gain"; over the steps both reached there is none.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from engine.figures import frames, talk, talk_frames, training
from engine.figures.common_span import common_span
from engine.figures.sweep_frame import sweep_frame
from engine.models.metrics import recall_auc
from test_plots import make_run

PLAN = 1406
REPO = Path(__file__).resolve().parents[1]


def recall_at(step: int, k: int) -> float:
    """The same recall curve for both algorithms: rising with the step, tier k a little higher."""
    return min(1.0, 0.1 + 0.6 * step / PLAN + 0.05 * k)


def run(run_id: int, algorithm: str, steps: list[int], *, status: str, plan: int = PLAN, shift: float = 0.0) -> dict:
    """A run record in the store's shape (test_plots.make_run) whose recalls follow :func:`recall_at` (+ ``shift``
    on every tier), planned for ``plan`` steps and stopped at ``steps[-1]``."""
    r = make_run(run_id, algorithm, steps=steps, status=status)
    for e in r["evals"]:
        for k, t in enumerate(e["tiers"]):
            t["recall"] = recall_at(e["step"], k) + shift
        for c in e["classes"]:
            c["recall"] = recall_at(e["step"], 0) + shift
        e["overall"]["accuracy"] = recall_at(e["step"], 1) + shift
    r["total_steps"], r["step"] = plan, steps[-1]
    return r


def case_one() -> list[dict]:
    """INO-SGD finished (1406 steps); IDP-SGD cancelled at step 901 (64 %), on the same evaluation grid."""
    ino = run(2, "ino", list(range(0, PLAN, 50)) + [PLAN], status="finished")
    idp = run(1, "idp_sample", list(range(0, 901, 50)) + [901], status="cancelled")
    return [idp, ino]


def own_length_gain(runs) -> float:
    """What the lab showed before: each run's recall AUC over its own length (pp), INO − IDP on ε=1."""
    idp, ino = runs
    area = [recall_auc([e["step"] for e in r["evals"]], [e["tiers"][0]["recall"] for e in r["evals"]]) for r in (ino, idp)]
    return 100 * (area[0] - area[1])


def test_the_span_of_a_cancelled_and_a_finished_run():
    idp, ino = case_one()
    span = common_span([idp, ino])
    assert span.share == pytest.approx(901 / PLAN)
    assert span.limit(1) == 901 and span.limit(2) == 901 and span.cut == (2,)
    assert span.words() == "over steps 0–901, which both runs reached; IDP-SGD (SAMPLE) #1 was cancelled at 64 %"
    kept = span.keep(frames.tier_history([idp, ino]))
    assert kept[kept.run_id == 2]["step"].max() == 900 and kept[kept.run_id == 1]["step"].max() == 901


def test_the_gain_over_the_steps_both_reached_not_over_each_runs_own_length():
    runs = case_one()
    assert own_length_gain(runs) > 5  # the misleading number: each AUC over its own run's length
    gain = talk_frames.gain_summary(runs)
    assert abs(gain["auc_gain"]) < 0.1 and abs(gain["final_gain"]) < 0.1
    assert gain["span"] == common_span(runs).words()
    table = talk_frames.results_table(runs)
    column = next(c for c in table.columns if "gain vs IDP, AUC" in c)
    ino_row = table[table["algorithm"].str.startswith("INO")].iloc[0]
    assert abs(float(ino_row[column].split()[0])) < 0.1
    pg = talk_frames.paired_gains(runs)
    assert (pg["gain_auc"].abs() < 0.1).all() and (pg["gain_final"].abs() < 0.1).all()
    by_class = frames.recall_gain_by_class(runs)
    assert (by_class["gain"].abs() < 0.01).all() and len(by_class) == 10
    final = frames.final_table(runs).set_index("run_id")
    assert final.at[2, "steps"] == 900 and final.at[1, "steps"] == 901
    assert final.at[2, "accuracy"] == pytest.approx(recall_at(900, 1))


def test_every_comparison_figure_says_its_span():
    runs = case_one()
    words = common_span(runs).words()
    specs = {s.name: s for s in training.build_figures(runs, names=training.RESULT_FIGURES)}
    for name in ("recall_vs_budget", "recall_gain_class", "recall_auc", "overall_bars", "mid_summary"):
        assert words in specs[name].figure.layout.title.text, name
    auc = specs["recall_auc"].data.set_index(["run_id", "tier"])
    assert auc.at[(1, "ε=1"), "recall_auc"] == pytest.approx(auc.at[(2, "ε=1"), "recall_auc"], abs=1e-3)
    for spec in talk.build_talk_figures(runs, names=["privacy_frontier", "results_table"]):
        assert words in spec.figure.layout.title.text, spec.name
    # the curves over training show each run as far as it went: not cut
    mid = training.build_figures(runs, names=["tier_recall"])[0].data
    assert mid[mid.run_id == 2]["step"].max() == PLAN


def test_finished_runs_are_compared_over_their_whole_length():
    ino = run(2, "ino", list(range(0, PLAN, 50)) + [PLAN], status="finished", shift=0.02)
    idp = run(1, "idp_sample", list(range(0, PLAN, 50)) + [PLAN], status="finished")
    span = common_span([idp, ino])
    assert span.share == 1.0 and not span.cut and span.words() is None
    gain = talk_frames.gain_summary([idp, ino])
    assert gain["auc_gain"] == pytest.approx(2.0, abs=1e-9) and gain["span"] is None
    spec = training.build_figures([idp, ino], names=["recall_auc"])[0]
    assert spec.figure.layout.title.text == training.RECALL_AUC_TITLE


def test_runs_of_different_plans_are_compared_over_the_same_share_of_each():
    long = run(2, "ino", list(range(0, 2001, 100)), status="finished", plan=2000)
    short = run(1, "idp_sample", list(range(0, 501, 50)), status="interrupted", plan=1000)
    span = common_span([short, long])
    assert span.share == pytest.approx(0.5) and span.limit(2) == 1000 and span.steps is None
    assert span.words() == ("over the first 50 % of each run's planned steps, which both runs reached; "
                            "IDP-SGD (SAMPLE) #1 was interrupted at 50 %")
    running = run(3, "ino", list(range(0, 301, 50)), status="running", plan=1000)
    assert "INO-SGD #3 is still running at 30 %" in common_span([short, long, running]).words()
    assert "all 3 runs" in common_span([short, long, running]).words()


def test_a_sweep_cell_is_compared_with_its_reference_over_the_steps_both_reached():
    idp, ino = case_one()
    idp["group_id"] = ino["group_id"] = "sweep-alpha-beta-1"
    ino["config"]["algorithm"]["alpha"], ino["config"]["algorithm"]["beta"] = 2.0, 3.0
    f = sweep_frame([idp, ino], x_param="alpha", y_param="beta")
    assert len(f) == 1 and abs(f["gain"].iloc[0]) < 0.1 and not math.isnan(f["gain"].iloc[0])


def stored(path, runs: list[dict]) -> list[int]:
    """The synthetic runs written into a real run store (SQLite) as a worker would leave them: their ids."""
    from engine.store.db import RunStore

    store = RunStore(path)
    ids = []
    for r in runs:
        rid = store.create_run(r["config"], group_id=r["group_id"])
        store.start_run(rid, pid=0, total_steps=r["total_steps"], plan=r["plan"])
        for e in r["evals"]:
            store.log_eval(rid, e["step"], e)
        store.update_progress(rid, r["step"])
        store.set_status(rid, r["status"])
        ids.append(rid)
    return ids


def test_the_cli_export_names_the_span(tmp_path):
    from in_process import cli_here

    ids = stored(tmp_path / "runs.sqlite", case_one())
    out = cli_here("export", *ids, "--format", "csv", "--out", tmp_path / "out", store=tmp_path / "runs.sqlite")
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip() == ("note: the figures compare the runs over steps 0–901, which both runs reached; "
                                  "IDP-SGD (SAMPLE) #1 was cancelled at 64 %")
    auc = pd.read_csv(tmp_path / "out" / "runs-1-2_recall_auc.csv").set_index(["run_id", "tier"])
    assert len(auc) == 6  # 2 runs × 3 tiers, each over the steps both reached: the same area
    assert auc.at[(1, "ε=1"), "recall_auc"] == pytest.approx(auc.at[(2, "ε=1"), "recall_auc"], abs=1e-3)


def test_the_results_page_says_the_span_and_shows_the_gain_over_it(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from test_app import no_exception

    stored(tmp_path / "runs.sqlite", case_one())
    monkeypatch.setenv("PRIVACY_LAB_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("PRIVACY_LAB_PREWARM", "0")
    at = AppTest.from_file(str(REPO / "app_pages" / "results_view.py"), default_timeout=120)
    at.session_state["all"] = True  # "Include unfinished": the cancelled IDP-SGD run beside the finished INO-SGD run
    at.run()
    no_exception(at)
    note = [w.value for w in at.warning if "Compared over steps 0–901" in w.value]
    assert len(note) == 1 and "IDP-SGD (SAMPLE) #1 was cancelled at 64 %" in note[0].replace("\\", "")
    gain = next(m for m in at.metric if m.label.startswith("INO gain"))
    assert gain.value == "0.0 pp"


def test_a_cancelled_run_is_counted_up_to_the_click_even_before_the_store_drops_what_came_after():
    """Issue 59: the worker trains on while the Cancel reaches it; the run row records the click's step
    (``cancel_step``) and nothing after it is compared — here still in the record (a run still "cancelling…")."""
    idp = run(1, "idp_sample", list(range(0, 1001, 100)), status="running")
    idp["cancel_step"] = 650  # the click; evaluations at 700..1000 came after it
    ino = run(2, "ino", list(range(0, PLAN + 1, 100)), status="finished")
    span = common_span([idp, ino])
    assert span.limit(1) == 600 and span.limit(2) == 600 and 1 in span.cut
    assert span.last(training_records(idp), 1).step == 600
    alone = common_span([idp])
    assert alone.limit(1) == 600 and alone.cut == (1,)
    kept = alone.keep(pd.DataFrame({"run_id": [1] * 11, "step": list(range(0, 1001, 100))}))
    assert kept["step"].max() == 600


def training_records(r):
    """The run's evaluations as records with a ``step`` (what Span.last reads)."""
    return [type("E", (), {"step": e["step"]})() for e in r["evals"]]
