"""The lab's headline rules (engine/figures/evidence.py), applied by the frames and said by every headline — the
live sentence (engine/figures/headline.py), the Results headline and the talk table (engine/figures/talk_frames.py):

* a comparison with a diverged run gives no winner (the sentence names the run and says the pair is not comparable);
* no "peak" of a single noisy gain curve: the recall AUC gain, or a gain averaged over IDP-SGD's MID window with its
  uncertainty across seeds ("1 seed: no spread");
* identical runs (same config hash and seed) are reruns of one another, marked and counted once.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from engine.figures import evidence, frames, headline, talk
from engine.figures import talk_frames as tf
from engine.jobs.runs import config_hash
from test_plots import make_run, seed_series

REPO = Path(__file__).resolve().parents[1]


def diverging(run: dict, at: int, *, status: str | None = None) -> dict:
    """``run`` with every tier's test loss non-finite from step ``at`` on (a learning rate far too large)."""
    for e in run["evals"]:
        if e["step"] >= at:
            for t in e["tiers"]:
                t["loss"] = math.inf
    if status is not None:
        run["status"] = status
        run["summary"] = {"diverged_step": at} if status == "diverged" else None
    return run


def running(run: dict, upto: int) -> dict:
    """``run`` while it trains: its evaluations up to step ``upto``."""
    run["status"] = "running"
    run["evals"] = [e for e in run["evals"] if e["step"] <= upto]
    return run


# --- 4. a diverged run wins nothing ------------------------------------------------------------------------------

def test_two_diverged_runs_get_no_winner_but_their_steps():
    runs = [diverging(make_run(1, "idp_sample"), 10, status="diverged"),
            diverging(make_run(2, "ino", gain=0.3), 10, status="diverged")]
    text = headline.gain_sentence(headline.private_gain(runs))
    assert text == ("No winner on the ε = 1 tier: INO-SGD #2 diverged at step 10, IDP-SGD (SAMPLE) #1 diverged at "
                    "step 10; a pair with a diverged run is not comparable")


def test_a_run_diverging_while_it_trains_ends_the_lead_at_once():
    """Live: INO-SGD leads on the ε = 1 tier, then IDP-SGD's loss goes non-finite (the lab's one rule, the MID chart's
    badge): the sentence names it, and no leader, though INO-SGD's recall is still ahead."""
    ino, idp = running(make_run(2, "ino", gain=0.3), 50), running(make_run(1, "idp_sample"), 50)
    assert headline.gain_sentence(headline.private_gain([idp, ino])).startswith("INO-SGD ahead by")
    diverging(idp, 30)
    text = headline.gain_sentence(headline.private_gain([idp, ino]))
    assert text.startswith("No winner on the ε = 1 tier: IDP-SGD (SAMPLE) #1 diverged at step 30;"), text
    assert "INO-SGD #2 diverged" not in text and "ahead" not in text


def test_the_results_headline_and_the_talk_table_give_no_gain_for_a_diverged_pair():
    runs = [diverging(make_run(1, "idp_sample"), 10, status="diverged"), make_run(2, "ino", gain=0.3)]
    s = tf.gain_summary(runs)
    assert s["not_comparable"] == ("No winner on the ε = 1 tier: IDP-SGD (SAMPLE) #1 diverged at step 10; a pair "
                                   "with a diverged run is not comparable")
    assert all(math.isnan(s[k]) for k in ("auc_gain", "final_gain", "mid_gain"))
    table = tf.results_table(runs).set_index("algorithm")
    assert table.at["INO-SGD #2", "ε=1 gain vs IDP, AUC (pp)"] == "not comparable (diverged)"
    healthy = tf.gain_summary([make_run(1, "idp_sample"), make_run(2, "ino", gain=0.3)])
    assert healthy["not_comparable"] is None and healthy["auc_gain"] > 0


# --- 5. no peak of one noisy curve ---------------------------------------------------------------------------------

def spiky(run: dict, at: int, by: float) -> dict:
    """``run`` with its ε = 1 tier's recall ``by`` higher at the one evaluation at step ``at`` (one seed's noise)."""
    for e in run["evals"]:
        if e["step"] == at:
            e["tiers"][0]["recall"] += by
    return run


def test_the_gain_summary_has_no_peak_and_says_one_seed_has_no_spread():
    runs = [make_run(1, "idp_sample"), spiky(make_run(2, "ino", gain=0.01), 40, 0.466)]
    s = tf.gain_summary(runs)
    assert not [k for k in s if "peak" in k], s  # the +46.6 pp spike of one evaluation is no headline
    assert s["auc_spread"] == "1 seed: no spread" and s["mid_spread"] == "1 seed: no spread"
    # the gain in IDP-SGD's MID window (steps 10–50 of make_run's ε = 1 tier) is the mean over its evaluations
    gain = frames.recall_gain_over_time(runs)
    g = gain[(gain.tier == "ε=1") & (gain.step >= 10) & (gain.step < 60)]
    assert s["mid_window"] == (10, 60)
    assert s["mid_gain"] == pytest.approx(100 * g["gain"].mean())
    assert s["mid_gain"] < 100 * 0.466 / 2  # averaged, the spike no longer dominates


def test_the_mid_window_gain_carries_its_spread_over_seeds():
    gains = [0.05, 0.10, 0.20]
    runs = seed_series(1, "idp_sample", 3, offsets=[0, 0.01, 0.02]) + \
        seed_series(4, "ino", 3, offsets=[0, 0.01, 0.02], gains=gains)
    s = tf.gain_summary(runs)
    gain = frames.recall_gain_over_time(runs)
    per_pair = [100 * g[(g.step >= s["mid_window"][0]) & (g.step < s["mid_window"][1])]["gain"].mean()
                for _, g in gain[gain.tier == "ε=1"].groupby("ino_run_id")]
    assert s["mid_gain"] == pytest.approx(np.mean(per_pair))
    se = float(np.std(per_pair, ddof=1) / math.sqrt(3))
    assert s["mid_se"] == pytest.approx(se)
    assert s["mid_spread"] == f"± {se:.1f} pp (s.e. over 3 paired seeds)"


def test_the_one_seed_gain_table_names_no_best_evaluation():
    from engine.figures.bands import gain_spread_words, recall_gain_spread

    runs = [make_run(1, "idp_sample"), spiky(make_run(2, "ino", gain=0.01), 40, 0.466)]
    words = gain_spread_words(recall_gain_spread(frames.recall_gain_over_time(runs)))
    assert words and all("best" not in w and "1 seed: no spread" in w for w in words), words
    assert words[0].startswith("ε=1 (INO #2 − IDP-SGD (SAMPLE) #1): gain +")  # averaged over its evaluations


def test_the_gain_charts_note_gives_no_winner_to_a_diverged_pair():
    from engine.figures import training

    runs = [diverging(make_run(1, "idp_sample"), 10, status="diverged"), make_run(2, "ino", gain=0.3)]
    (spec,) = training.build_figures(runs, names=["recall_gain_time"])
    note = next(a.text for a in spec.figure.layout.annotations if a.name == "gain_spread")
    assert "no winner: IDP-SGD (SAMPLE) #1 diverged at step 10; a pair with a diverged run is not comparable" in note
    assert "beyond the seed spread" not in note and "gain +" not in note


# --- 6. reruns count once -----------------------------------------------------------------------------------------

def comparison(first: int, group: str, *, seed: int = 0) -> list[dict]:
    """One IDP-SGD vs INO-SGD comparison (ids first, first + 1) of seed ``seed`` in ``group``."""
    runs = [make_run(first, "idp_sample", group=group), make_run(first + 1, "ino", group=group, gain=0.2)]
    for r in runs:
        r["config"]["seed"] = seed
    return runs


def test_identical_runs_are_reruns_of_one_another():
    a, b = comparison(11, "a"), comparison(13, "b")
    assert config_hash(a[0]) == config_hash(b[0]) and config_hash(a[0]) != config_hash(a[1])
    assert evidence.reruns(a + b) == {13: 11, 14: 12}
    other = comparison(13, "b", seed=1)  # another seed: new evidence
    assert evidence.reruns(a + other) == {}
    a[0]["evals"], a[0]["status"] = a[0]["evals"][:5], "cancelled"  # the first stopped short: its rerun is kept
    assert evidence.reruns(a + b) == {11: 13, 14: 12}


def test_a_rerun_pair_is_counted_once_and_drawn_marked():
    runs = comparison(11, "a") + comparison(13, "b")
    assert [(i["id"], j["id"]) for i, j in frames.pair_runs(runs)] == [(12, 11)]
    text = headline.gain_sentence(headline.private_gain(runs))
    assert "mean of" not in text and "(1 seed: no spread)" in text, text  # not "mean of 2 paired seeds ± 0.0"
    s = tf.gain_summary(runs)
    assert s["pairs"] == 1 and s["auc_spread"] == "1 seed: no spread"
    # the talk figures: one row per piece of evidence; the frontier's "runs of one algorithm" count each once
    table = tf.results_table(runs)
    assert list(table["algorithm"]) == ["IDP-SGD (SAMPLE) #11", "INO-SGD #12"] and list(table["runs"]) == [1, 1]
    front = tf.frontier_frame(runs)
    assert set(front[front.kind == "mean"]["n"]) == {1}
    # the curves may still show the reruns, marked
    hist = frames.tier_history(runs)
    assert set(hist[hist.run_id == 14]["run"]) == {"INO-SGD #14 (rerun of #12)"}
    assert set(hist[hist.run_id == 12]["run"]) == {"INO-SGD #12"}
    assert evidence.rerun_note(runs) == ("IDP-SGD (SAMPLE) #13 is a rerun of #11, INO-SGD #14 is a rerun of #12 (same "
                                         "config and seed: the same curves); each is counted once in the seed counts, "
                                         "the means and the gains.")
    assert evidence.rerun_note(comparison(11, "a") + comparison(13, "b", seed=1)) is None
    specs = {s.name: s for s in talk.build_talk_figures(runs, names=["results_table"])}
    assert len(specs["results_table"].data) == 2


# --- the Results page displays what the engine says ----------------------------------------------------------------

def results_page(tmp_path, monkeypatch, runs, *, unfinished: bool = False):
    from streamlit.testing.v1 import AppTest

    from test_app import no_exception
    from test_common_span import stored

    stored(tmp_path / "runs.sqlite", runs)
    monkeypatch.setenv("PRIVACY_LAB_STORE", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("PRIVACY_LAB_PREWARM", "0")
    at = AppTest.from_file(str(REPO / "app_pages" / "results_view.py"), default_timeout=120)
    at.session_state["all"] = unfinished
    at.session_state["runs"] = [f"{'IDP-SGD (SAMPLE)' if r['algorithm'] == 'idp_sample' else 'INO-SGD'} #{k}"
                                for k, r in enumerate(runs, start=1)]
    at.run()
    no_exception(at)
    return at


def test_the_results_headline_shows_no_peak_and_counts_a_rerun_once(tmp_path, monkeypatch):
    runs = comparison(1, "a") + comparison(3, "b")
    spiky(runs[1], 40, 0.466), spiky(runs[3], 40, 0.466)
    at = results_page(tmp_path, monkeypatch, runs)
    labels = [m.label for m in at.metric]
    assert not [x for x in labels if "Peak" in x or "peak" in x], labels
    mid = next(m for m in at.metric if m.label.startswith("INO gain in IDP-SGD's MID"))
    assert "1 seed: no spread" in mid.help.replace("\\", "")
    mid_count = next(m for m in at.metric if m.label.startswith("MID of tier"))
    assert mid_count.value == "2/2 runs"  # the reruns' MIDs are the same MIDs, counted once
    notes = [c.value.replace("\\", "") for c in at.caption if "rerun of" in c.value]
    assert len(notes) == 1 and "INO-SGD #4 is a rerun of #2" in notes[0], notes


def test_the_results_headline_gives_no_winner_to_a_diverged_pair(tmp_path, monkeypatch):
    runs = [diverging(make_run(1, "idp_sample"), 10, status="diverged"), make_run(2, "ino", gain=0.3)]
    at = results_page(tmp_path, monkeypatch, runs, unfinished=True)
    gain = next(m for m in at.metric if m.label.startswith("INO gain"))
    assert gain.value == "—"
    said = [w.value.replace("\\", "") for w in at.warning if "No winner" in w.value]
    assert len(said) == 1 and "IDP-SGD (SAMPLE) #1 diverged at step 10" in said[0], [w.value for w in at.warning]


def test_a_rerun_stopped_short_does_not_cut_the_comparison():
    from engine.figures.common_span import common_span

    runs = comparison(11, "a") + comparison(13, "b")
    for r in runs[2:]:  # the rerun cancelled halfway: the same curves as far as it got
        r["evals"], r["status"] = r["evals"][:6], "cancelled"
    assert evidence.reruns(runs) == {13: 11, 14: 12}
    span = common_span(runs)
    assert span.words() is None and span.runs == 2
    assert tf.gain_summary(runs)["span"] is None
    whole = tf.gain_summary(comparison(11, "a"))
    assert tf.gain_summary(runs)["auc_gain"] == pytest.approx(whole["auc_gain"])
