"""How long jobs take and where they wait, as the pages show it: ``engine.jobs.estimates`` (the run-time
estimate before a launch, the smoothed ETA while a run trains) and ``engine.jobs.manager.queue_positions``
(one place per queued job, shared by every row of a k-seed job)."""
from __future__ import annotations

import pytest

from engine.config.run import DataConfig, RunConfig
from engine.jobs.estimates import SmoothEta, format_seconds, run_time_estimate, seconds_per_sample
from engine.jobs.manager import queue_positions
from engine.store.db import RunStore


def _row(**kw) -> dict:
    run = {"id": 1, "status": "running", "step": 0, "total_steps": 100, "started_at": 1000.0, "finished_at": None,
           "error": None, "name": "", "algorithm": "ino", "config": {}, "group_id": "g", "plan": None, "summary": None}
    run.update(kw)
    return run


def test_run_time_estimate_uses_this_machines_finished_runs():
    cfg = RunConfig(data=DataConfig(name="digits"), batch_size=10)
    first, how = seconds_per_sample(cfg, [])
    assert first > 0 and "rough" in how
    done = _row(status="finished", total_steps=50, started_at=1.0, finished_at=6.0,
                config={"data": {"name": "digits"}, "model": {"name": "auto"}, "batch_size": 10})
    other_data = dict(done, config={"data": {"name": "mnist"}, "model": {"name": "auto"}, "batch_size": 10},
                      finished_at=600.0)
    rate, how = seconds_per_sample(cfg, [done, other_data])  # only runs of the same dataset and model count
    assert rate == pytest.approx(5.0 / 500) and "measured" in how and "from 1 finished run" in how
    # a 2-seed job (two rows, one worker training both models in 4 s) is one measurement, at its rate
    job = [dict(done, id=7, job_id=7, finished_at=5.0, config=dict(done["config"], seeds=2)),
           dict(done, id=8, job_id=7, finished_at=5.0, config=dict(done["config"], seeds=2, seed_index=1))]
    rate, how = seconds_per_sample(cfg, job)
    assert rate == pytest.approx(4.0 / (50 * 10 * 2)) and "from 1 finished run" in how
    jobs = [(cfg.replace(**{"algorithm.name": a}), 20, 10.0) for a in ("ino", "idp_sample")]
    assert run_time_estimate(jobs, [done], workers=1)[0] == pytest.approx(4.0)  # 2 × 20 × 10 × 0.01
    assert run_time_estimate(jobs, [done], workers=2)[0] == pytest.approx(2.0)
    # no expected batch (a sweep's cells): the config's batch size; k seeds train k models
    assert run_time_estimate([(cfg.replace(seeds=3), 20, None)], [done], workers=4)[0] == pytest.approx(6.0)
    assert run_time_estimate([], [done], workers=1) is None


def test_the_eta_is_smoothed_over_refreshes():
    eta = SmoothEta(alpha=0.3)
    assert eta(_row(step=10), now=1010.0) == pytest.approx(90.0)  # 1 step/s so far
    # one slow refresh (1 step in 5 s): the raw rate would say 0.2 step/s, the smoothed one moves only part way
    smoothed = eta(_row(step=11), now=1015.0)
    assert 89 / 1.0 < smoothed < 89 / 0.2 and smoothed == pytest.approx(89 / (0.3 * 0.2 + 0.7 * 1.0))
    assert eta(_row(step=11, status="finished"), now=1016.0) is None
    assert format_seconds(30) == "30 s" and format_seconds(150) == "2.5 min" and format_seconds(None) == "—"


def test_queue_places_count_jobs_not_seed_rows(tmp_path):
    """A lone run, a 3-seed job (three rows, one worker), another lone run: places 1, 2, 3 — the seed
    replicas of the job share its place instead of pushing the last run to #5."""
    store = RunStore(tmp_path / "runs.sqlite")
    cfg = RunConfig(data=DataConfig(name="digits")).validate()
    ids = store.create_jobs([[cfg], cfg.replace(seeds=3).validate().seed_configs(), [cfg]], group_id="g")
    lone, job, last = ids[0], ids[1:4], ids[4]
    places = queue_positions(store.list_runs(status="queued"))
    assert places == {lone: 1, job[0]: 2, job[1]: 2, job[2]: 2, last: 3}
    store.set_status(lone, "running")  # the first job starts: everyone behind it moves up one place
    places = queue_positions(store.list_runs(status="queued"))
    assert places == {job[0]: 1, job[1]: 1, job[2]: 1, last: 2}
