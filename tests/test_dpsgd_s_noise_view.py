"""DP-SGD-S's accuracy cost as a result the lab shows (issue 18): its noise z_Δ · max_k C_k against plain DP-SGD's
σ·C at the same ε, per evaluation (``GroupClipPlan.noise_ratio``, the ``noise_ratio`` column of the group-clip
frame, the figure's second panel), and the one sentence the Train page's live view shows when it is large.

* σ (``dpsgd_noise_multiplier``) is plain DP-SGD's at the same ε: ``accounting.plan(mode="dpsgd", …)`` for the
  run's ε, δ, sizes, batch and steps, and the noise multiplier a DP-SGD run of the same config trains with;
* the ratio equals z_Δ · max_k C_k / (σ·C) recomputed from the accountant (z_Δ from the raised plan and σ_b);
* the sentence appears when the ratio is large (c_min = 2: every clip ≥ 2C), not when it is small
  (c_min = c_max = 1: the ratio is z_Δ/σ), not without a DP-SGD-S run, not for plans stored without σ;
* the new field round-trips and a plan stored without it still loads (None);
* the live view adds the figure (and the sentence) only for a comparison with a DP-SGD-S run.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from test_plots import HOSTILE, assert_escaped, hostile_run

from engine.config.run import RunConfig, TierConfig, TiersConfig
from engine.dp import accounting
from engine.figures import talk
from engine.figures import talk_frames as tf
from engine.figures.live import LiveFigures
from engine.figures.training import LIVE_FIGURES, build_figures, live_figure_names
from engine.jobs.kinds import execute
from engine.jobs.runs import run_record
from engine.store.db import RunStore
from engine.train.loop import prepare
from engine.train.records import GroupClipPlan, PlanRecord

APP = str(Path(__file__).resolve().parent.parent / "app.py")
ADULT = RunConfig().replace(**{
    "data.name": "adult", "data.max_train": 2000, "model.name": "lr", "epochs": 1.0, "eval_every": 5,
    "tiers": TiersConfig(assign="random", tiers=(TierConfig(epsilon=1.0, ratio=1.0),)),
    "algorithm.group_by": "attribute", "device": "cpu"})
DPSGD_S = ADULT.replace(**{"algorithm.name": "dpsgd_s"})
LARGE = DPSGD_S.replace(**{"algorithm.c_min": 2.0})  # every clip ≥ 2C: the noise ≥ 2 z_Δ C
PINNED = DPSGD_S.replace(**{"algorithm.c_min": 1.0, "algorithm.c_max": 1.0})  # every clip = C: ratio = z_Δ / σ
DPSGD = ADULT.replace(**{"algorithm.name": "dpsgd"})


def dpsgd_sigma(record: PlanRecord, cfg: RunConfig) -> float:
    """σ of plain DP-SGD at the run's ε, δ, sizes, batch and steps, from the planner itself."""
    return accounting.plan(mode="dpsgd", epsilons=list(record.target_epsilons), delta=cfg.delta,
                           tier_sizes=list(record.tier_sizes), batch_size=cfg.batch_size, clip_norm=cfg.clip_norm,
                           steps=record.steps).noise_multiplier


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One comparison in a store (group "cost"): DP-SGD, DP-SGD-S (defaults), DP-SGD-S with c_min = 2 and with
    c_min = c_max = 1; name → run record (the store's run dict + evaluations)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("noise-view") / "runs.sqlite"
    store = RunStore(path)
    out = {}
    try:
        for name, cfg in (("dpsgd", DPSGD), ("dpsgd_s", DPSGD_S), ("large", LARGE), ("pinned", PINNED)):
            rid = store.create_run(cfg.validate(), group_id="cost")
            execute(store, rid, cfg, kind="train")
            out[name] = run_record(store, rid)
    finally:
        torch.set_num_threads(old)
    out["store"] = path
    return out


# --- σ: DP-SGD's at the same ε, kept by the set-up ---------------------------------------------------------

def test_setup_keeps_dpsgd_sigma_before_the_release_raises_it():
    prep = prepare(DPSGD_S)
    setup, info = prep.privacy.clip_setup, prep.info
    rec = PlanRecord.from_privacy(prep.privacy, prep.data.tiers, steps=prep.plan.steps)
    sigma = dpsgd_sigma(rec, DPSGD_S)
    assert setup.dpsgd_noise_multiplier == sigma == info["dpsgd_noise_multiplier"]
    assert prep.plan.noise_multiplier > sigma  # the released group sizes raised the plan's σ
    assert setup.noise_multiplier > prep.plan.noise_multiplier  # z_Δ above that
    assert prepare(DPSGD).plan.noise_multiplier == sigma  # what a DP-SGD run of the same config trains with
    exact = tuple(int(v) for v in np.bincount(setup.groups))
    declared = prepare(DPSGD_S.replace(**{"algorithm.group_sizes": exact}))
    assert declared.privacy.clip_setup.dpsgd_noise_multiplier == declared.plan.noise_multiplier == sigma


# --- the ratio: one owner, equal to an independent computation ---------------------------------------------

@pytest.mark.slow
def test_ratio_is_dpsgd_s_noise_over_dpsgd_noise_at_the_same_epsilon(trained):
    dp_plan = PlanRecord.of(trained["dpsgd"]["plan"])
    for name in ("dpsgd_s", "large", "pinned"):
        run = trained[name]
        cfg = {"dpsgd_s": DPSGD_S, "large": LARGE, "pinned": PINNED}[name]
        rec = PlanRecord.of(run["plan"])
        g = rec.group_clip
        sigma = dpsgd_sigma(rec, cfg)
        assert g.dpsgd_noise_multiplier == sigma == dp_plan.noise_multiplier
        assert dp_plan.noise_std == pytest.approx(sigma * cfg.clip_norm, rel=1e-12)  # DP-SGD's own noise std
        # z_Δ independently: the plan with the group-size release composed in, then Andrew et al.'s z_Δ
        base = accounting.plan(mode="dpsgd", epsilons=list(rec.target_epsilons), delta=cfg.delta,
                               tier_sizes=list(rec.tier_sizes), batch_size=cfg.batch_size, clip_norm=cfg.clip_norm,
                               steps=rec.steps)
        raised = accounting.plan_with_release(base, g.group_size_noise_std)
        z = accounting.adaptive_clipping_noise_multiplier(noise_multiplier=raised.noise_multiplier,
                                                          count_noise_std=g.count_noise_std)
        assert z == pytest.approx(g.gradient_noise_multiplier, rel=1e-12)
        frame = tf.group_clip_frame([run])
        per_step = frame.drop_duplicates("step").set_index("step")
        assert len(per_step) == len(run["evals"]) >= 3
        for e in run["evals"]:
            expected = z * max(e["group_clip_norms"]) / (sigma * cfg.clip_norm)
            assert g.noise_ratio(e["noise_std"]) == pytest.approx(expected, rel=1e-9)
            assert per_step.at[e["step"], "noise_ratio"] == pytest.approx(expected, rel=1e-9)
            assert per_step.at[e["step"], "noise_multiplier_ratio"] == pytest.approx(z / sigma, rel=1e-12)
    large = tf.group_clip_frame([trained["large"]])["noise_ratio"]
    assert (large >= 2.0).all()  # clips ≥ 2C and z_Δ ≥ σ
    pinned = tf.group_clip_frame([trained["pinned"]])["noise_ratio"]
    z_over_sigma = PlanRecord.of(trained["pinned"]["plan"]).group_clip.noise_multiplier_ratio
    assert 1.0 < z_over_sigma <= 1.06 and np.allclose(pinned, z_over_sigma, rtol=1e-9)


# --- the sentence -------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_sentence_when_the_cost_is_large_with_numbers_from_the_data(trained):
    run = trained["large"]
    frame = tf.group_clip_frame([run, trained["dpsgd"]])
    sentence = tf.noise_cost_sentence(frame)
    last = run["evals"][-1]
    g = PlanRecord.of(run["plan"]).group_clip
    ratio = g.noise_ratio(last["noise_std"])
    assert ratio >= tf.NOISE_RATIO_LARGE
    assert sentence == (f"DP-SGD-S adds {ratio:.1f}× the noise DP-SGD would at the same ε (latest evaluation: "
                        f"largest group clip {max(last['group_clip_norms']) / g.base_clip:.3g} · C, "
                        f"z_Δ/σ = {g.noise_multiplier_ratio:.3g}): expect lower accuracy than DP-SGD.")
    m = re.search(r"adds ([\d.]+)× .* clip ([\d.]+) · C, z_Δ/σ = ([\d.]+)\)", sentence)
    assert float(m.group(1)) == pytest.approx(float(m.group(2)) * float(m.group(3)), abs=0.1)  # their product


@pytest.mark.slow
def test_no_sentence_when_small_or_without_dpsgd_s(trained):
    assert tf.noise_cost_sentence(tf.group_clip_frame([trained["pinned"], trained["dpsgd"]])) is None  # ≈ 1.01×
    assert tf.noise_cost_sentence(tf.group_clip_frame([trained["dpsgd"]])) is None  # no DP-SGD-S run
    assert tf.noise_cost_sentence(tf.group_clip_frame([])) is None
    small = tf.group_clip_frame([trained["dpsgd_s"]])
    latest = small[small.step == small.step.max()]["noise_ratio"].iloc[0]
    threshold = latest + 0.01  # just above what it is: nothing to say; at it: the sentence
    assert tf.noise_cost_sentence(small, threshold=threshold) is None
    assert tf.noise_cost_sentence(small, threshold=latest).startswith("DP-SGD-S adds ")


@pytest.mark.slow
def test_several_series_are_named_and_only_the_costly_ones(trained):
    runs = [trained["dpsgd"], trained["large"], trained["pinned"]]
    frame = tf.group_clip_frame(runs)
    sentence = tf.noise_cost_sentence(frame)
    labels = dict(zip(frame["run_id"], frame["series"]))
    label = labels[trained["large"]["id"]]  # "DP-SGD-S #3": the series is named, once
    assert label.startswith("DP-SGD-S #") and sentence.startswith(f"{label} adds ") and sentence.count(" adds ") == 1
    named = [{**r, "name": "my run"} for r in runs]  # a named run: the algorithm still said
    assert tf.noise_cost_sentence(tf.group_clip_frame(named)).startswith("DP-SGD-S (my run #")


def test_sentence_is_the_mean_over_a_series_seeds():
    runs = []
    for j, clip in enumerate((2.0, 4.0)):
        run = hostile_run(10 + j, "dpsgd_s")
        run["config"] = {**run["config"], "seed": j, "seeds": 2, "seed_index": j}
        run["plan"].update(gradient_noise_multiplier=1.1, dpsgd_noise_multiplier=1.0, base_clip=1.0,
                           clip_groups=["a", "b"])
        for e in run["evals"]:
            e["group_clip_norms"], e["noise_std"] = [clip, 1.0], 1.1 * clip
        runs.append(run)
    sentence = tf.noise_cost_sentence(tf.group_clip_frame(runs))
    assert sentence.startswith("DP-SGD-S adds 3.3× the noise") and "mean over 2 seeds" in sentence  # (2.2 + 4.4) / 2
    assert "largest group clip 3 · C, z_Δ/σ = 1.1)" in sentence


# --- the record: the new field round-trips, old plans load ---------------------------------------------------

@pytest.mark.slow
def test_field_round_trips_and_an_old_plan_loads(trained):
    stored = trained["dpsgd_s"]["plan"]
    rec = PlanRecord.from_dict(stored)
    assert rec.group_clip.dpsgd_noise_multiplier == stored["dpsgd_noise_multiplier"] > 0
    assert json.dumps(rec.to_dict()) == json.dumps(stored)  # exactly the stored JSON, key order included
    assert PlanRecord.from_dict(rec.to_dict()) == rec
    g = GroupClipPlan(gradient_noise_multiplier=1.2, dpsgd_noise_multiplier=1.1, base_clip=2.0, clip_groups=("a",))
    assert GroupClipPlan.from_dict(g.to_dict()) == g and g.to_dict()["dpsgd_noise_multiplier"] == 1.1
    assert g.noise_ratio(1.2 * 2.0 * 3.0) == pytest.approx(1.2 * 3.0 / 1.1)
    # a plan stored before issue 18: no σ — loads (None), round-trips exactly, no ratio anywhere
    old = {k: v for k, v in stored.items() if k != "dpsgd_noise_multiplier"}
    rec_old = PlanRecord.from_dict(old)
    assert rec_old.group_clip is not None and rec_old.group_clip.dpsgd_noise_multiplier is None
    assert json.dumps(rec_old.to_dict()) == json.dumps(old) and "dpsgd_noise_multiplier" not in rec_old.info
    assert rec_old.group_clip.noise_ratio(1.0) is None and rec_old.group_clip.noise_multiplier_ratio is None
    run = {**trained["large"], "plan": {k: v for k, v in trained["large"]["plan"].items()
                                        if k != "dpsgd_noise_multiplier"}}
    frame = tf.group_clip_frame([run])
    assert not frame.empty and frame["noise_ratio"].isna().all() and tf.noise_cost_sentence(frame) is None
    fig = talk.fig_group_clip(frame)  # falls back to the raw noise std
    assert "noise std" in fig.layout.annotations[1].text and not fig.layout.shapes


# --- the figure and the live view --------------------------------------------------------------------------

@pytest.mark.slow
def test_figure_draws_the_ratio_with_dpsgd_at_one(trained):
    runs = [trained["dpsgd"], trained["large"]]
    spec = build_figures(runs, names=["group_clip"])[0]
    frame = tf.group_clip_frame(runs)
    assert spec.name == "group_clip" and list(spec.data.columns) == tf.CLIP_COLUMNS
    assert spec.data.equals(frame) and "noise_ratio" in spec.data
    ratio = [t for t in spec.figure.data if t.xaxis == "x2"]
    assert len(ratio) == 1
    per_step = frame.drop_duplicates("step")
    assert list(ratio[0].y) == pytest.approx(list(per_step["noise_ratio"]))
    assert "DP-SGD at the same ε" in spec.figure.layout.annotations[1].text
    hline = [s for s in spec.figure.layout.shapes if s.y0 == 1.0 and s.y1 == 1.0]
    assert len(hline) == 1 and hline[0].yref == "y2"
    # the talk figure is the same figure
    same = talk.build_talk_figures(runs, names=["group_clip"])[0]
    assert same.figure.to_json() == spec.figure.to_json()


def test_user_text_is_escaped_in_the_ratio_figure():
    run = hostile_run(3, "dpsgd_s")
    run["plan"].update(gradient_noise_multiplier=1.05, dpsgd_noise_multiplier=1.0, base_clip=1.0,
                       clip_groups=[f"{HOSTILE} group {k}" for k in range(3)])
    for e in run["evals"]:
        e["group_clip_norms"], e["noise_std"] = [1.0, 2.0, 3.0], 3.0
    spec = build_figures([run], names=["group_clip"])[0]
    assert_escaped(spec.figure, spec.name)
    assert tf.noise_cost_sentence(spec.data).startswith("DP-SGD-S adds 3.0× the noise")


@pytest.mark.slow
def test_live_view_adds_the_figure_only_with_a_dpsgd_s_run(trained):
    spent = ("individual_epsilon",)  # runs with a formal guarantee: whose privacy they spend, too
    assert live_figure_names([trained["dpsgd"]]) == LIVE_FIGURES + spent
    both = [trained["dpsgd"], trained["large"]]
    assert live_figure_names(both) == LIVE_FIGURES + ("group_clip",) + spent
    live = LiveFigures(("group_clip",))
    partial = [{**r, "evals": r["evals"][:2]} for r in both]
    first = live.update(partial)["group_clip"]
    assert len(first.data) == 2 * 2  # 2 evaluations × 2 groups (Female, Male)
    specs = live.update(both)
    assert specs["group_clip"].data.equals(tf.group_clip_frame(both))
    assert live.builds == 2  # not a curve: built again on new evaluations


@pytest.mark.slow
def test_train_page_shows_the_figure_and_the_sentence(trained, monkeypatch):
    """The page only displays: the figure (key live-group-clip) and the engine's sentence as a warning."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("PRIVACY_LAB_STORE", str(trained["store"]))
    monkeypatch.setenv("PRIVACY_LAB_PREWARM", "0")
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["group"] = "cost"
    try:
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        frame = tf.group_clip_frame([trained[n] for n in ("dpsgd", "dpsgd_s", "large", "pinned")])
        expected = tf.noise_cost_sentence(frame)
        shown = [w.value.replace("\\", "") for w in at.warning]
        assert expected is not None and expected in shown
        # a live chart is an app_pages/_plotly_live.py component (AppTest: "bidi_component"), its figure in proto.json
        assert any("noise vs DP-SGD" in c.proto.json for c in at.get("bidi_component"))
    finally:
        from app_pages import _handles

        _handles._manager.clear()
