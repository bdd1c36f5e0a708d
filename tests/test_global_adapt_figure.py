"""DPSGD-Global-Adapt's own figure (issue 58, point 8a): its threshold Z, its scale C / max(Z, C) and its noise were
drawn nowhere. Each evaluation records Z and the scale (``GlobalScaling.model_state`` → ``EvalRecord.global_scale``,
read only: the step's numbers do not change), the registry lists ``global_scale`` as the algorithm's own figure, and
the live view, the talk figures and the exports build it from a real run: one row per evaluation, Z moving, the
scale C / max(Z, C), the noise z_Δ · C of the plan, DP-SGD's σ · C beside it."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from engine.config.run import RunConfig
from engine.dp.algorithms import draws
from engine.dp.global_adapt import GlobalScaling
from engine.figures import talk, training
from engine.figures.global_scale import EMPTY, GLOBAL_SCALE_COLUMNS, PANELS, fig_global_scale, global_scale_frame
from engine.jobs.kinds import execute
from engine.jobs.runs import run_record
from engine.store.db import RunStore
from engine.train.loop import mechanism_state
from engine.train.records import EvalRecord, GlobalScaleState, PlanRecord
from test_plots import assert_escaped, hostile_run, make_run

C = 1.0


def mechanism(n_models: int = 2) -> GlobalScaling:
    return GlobalScaling(base_clip=C, noise_multiplier=1.3, initial=0.5, quantile=0.5, quantile_lr=0.5,
                         count_noise_std=2.0, expected_batch=8.0, n_models=n_models)


def test_each_model_records_its_threshold_and_scale_and_recording_changes_nothing():
    mech = mechanism()
    gen = torch.Generator().manual_seed(0)
    for k in range(12):  # the threshold moves with the released counts (norms beyond it: it rises)
        norms = torch.full((2, 8), 3.0 + k, dtype=torch.float64)
        mech.observe(torch.zeros((2, 8), dtype=torch.long), norms, torch.ones((2, 8), dtype=torch.float64), gen)
    before = mech.threshold.clone()
    for m in range(2):
        record = EvalRecord(**EvalRecord.mechanism_fields(mechanism_state(mech, m)))
        z = float(mech.threshold[m])
        assert record.global_scale == GlobalScaleState(threshold=z, scale=C / max(z, C))
        assert record.group_clip.clip_norms == (max(z, C),) and record.group_clip.noise_std == pytest.approx(1.3 * C)
        assert EvalRecord.from_dict(record.to_dict()) == record  # stored and read back as it was
    assert torch.equal(mech.threshold, before)  # reading the state moved nothing
    assert float(before.max()) > 1.0 and mech.model_state(0)["global_scale"] < 1.0  # Z beyond C: scaled down


def test_the_registry_lists_the_figure_and_the_live_view_builds_it_for_global_adapt_only():
    assert draws("dpsgd_global_adapt", "global_scale") and not draws("dpsgd", "global_scale")
    assert "global_scale" in talk.TALK_FIGURES and "global_scale" in training.DRAWN_LIVE_FIGURES
    ga, dp = make_run(1, "dpsgd_global_adapt"), make_run(2, "dpsgd")
    assert "global_scale" in training.live_figure_names([dp, ga])
    assert "global_scale" not in training.live_figure_names([dp])


def test_the_figure_draws_z_the_scale_and_the_noise_in_three_panels():
    steps = [0, 10, 20]
    rows = [{"run_id": 1, "run": "DPSGD-Global-Adapt #1", "series": "DPSGD-Global-Adapt #1",
             "algorithm": "DPSGD-Global-Adapt", "seed_index": 0, "step": s, "epoch": s / 10, "threshold": z,
             "applied_threshold": max(z, C), "scale": C / max(z, C), "noise_std": 1.4, "base_clip": C,
             "dpsgd_noise_std": 1.2} for s, z in zip(steps, [0.5, 1.5, 3.0])]
    fig = fig_global_scale(pd.DataFrame(rows, columns=GLOBAL_SCALE_COLUMNS))
    assert [a.text for a in fig.layout.annotations] == list(PANELS)
    by_meta = {t.meta: t for t in fig.data}
    assert list(by_meta["threshold|DPSGD-Global-Adapt #1"].y) == [0.5, 1.5, 3.0]
    assert np.allclose(by_meta["scale|DPSGD-Global-Adapt #1"].y, [1.0, 1 / 1.5, 1 / 3.0])
    assert list(by_meta["base_clip|DPSGD-Global-Adapt #1"].y) == [C, C]  # C dotted across the steps
    assert list(by_meta["dpsgd_noise_std|DPSGD-Global-Adapt #1"].y) == [1.2, 1.2]
    assert {t.xaxis for t in fig.data} == {"x", "x2", "x3"}
    empty = fig_global_scale(pd.DataFrame(columns=GLOBAL_SCALE_COLUMNS))
    assert not empty.data and empty.layout.annotations[0].text.startswith("select a DPSGD-Global-Adapt run")
    assert EMPTY.startswith("select")


def test_a_real_global_adapt_run_is_drawn_from_its_evaluations(tmp_path, one_thread):
    """Two seeds of a Global-Adapt run on digits (trained on the model axis, one row per seed): a frame row per
    evaluation and seed with what the mechanism recorded, built by the live view's and the talk figures' paths."""
    store = RunStore(tmp_path / "runs.sqlite")
    cfg = RunConfig().replace(**{"data.name": "digits", "model.name": "lr", "epochs": 2.0, "batch_size": 64,
                                 "eval_every": 5, "seeds": 2, "device": "cpu", "threads": 1,
                                 "algorithm.name": "dpsgd_global_adapt", "algorithm.initial_clip": 0.2})
    ids = store.create_job(cfg.seed_configs(), group_id="ga")
    execute(store, ids[0], cfg, kind="train")
    runs = [run_record(store, i) for i in ids]
    frame = global_scale_frame(runs)
    assert len(frame) == sum(len(r["evals"]) for r in runs) and set(frame["run_id"]) == set(ids)
    plan = PlanRecord.of(runs[0]["plan"]).group_clip
    assert np.allclose(frame["applied_threshold"], np.maximum(frame["threshold"], plan.base_clip))
    assert np.allclose(frame["scale"], plan.base_clip / frame["applied_threshold"])
    assert np.allclose(frame["noise_std"], plan.gradient_noise_multiplier * plan.base_clip)
    assert np.allclose(frame["dpsgd_noise_std"], plan.dpsgd_noise_multiplier * plan.base_clip)
    assert frame["threshold"].nunique() > 2  # Z moves over training
    (live,) = training.build_figures(runs, names=["global_scale"])
    (shown,) = talk.build_talk_figures(runs, names=["global_scale"])
    assert live.data.equals(frame) and shown.data.equals(frame)
    assert len([t for t in shown.figure.data if t.meta.startswith("threshold|")]) == 1  # one series, its mean


def hostile_global_adapt(run_id: int = 4) -> dict:
    """A Global-Adapt run named with markup whose evaluations carry what its mechanism records."""
    run = hostile_run(run_id, "dpsgd_global_adapt")
    for k, e in enumerate(run["evals"]):
        z = 0.5 + 0.3 * k
        e.update({"group_clip_norms": [max(z, C)], "noise_std": 1.4, "global_threshold": z,
                  "global_scale": C / max(z, C)})
    return run


def test_user_text_is_escaped_in_the_figure():
    runs = [hostile_global_adapt()]
    for spec in (*training.build_figures(runs, names=["global_scale"]),
                 *talk.build_talk_figures(runs, names=["global_scale"])):
        assert not spec.data.empty
        assert_escaped(spec.figure, spec.name)
