"""How long jobs take and where they wait, as the pages show it: ``engine.jobs.estimates`` (the run-time
estimate before a launch, the smoothed ETA while a run trains) and ``engine.jobs.manager.queue_positions``
(one place per queued job, shared by every row of a k-seed job)."""
from __future__ import annotations

import pytest

from engine.config.run import DataConfig, RunConfig
import numpy as np

from engine.jobs.estimates import (FALLBACK_START_SECONDS, FALLBACK_WARM_START_SECONDS, SmoothEta, format_seconds,
                                   run_time_estimate, seconds_per_sample, start_seconds)
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
    done = _row(status="finished", total_steps=50, created_at=1.0, started_at=1.0, finished_at=6.0,
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


def test_the_start_is_measured_from_each_launchs_first_run_and_added_once_per_wave():
    assert start_seconds([]) == (FALLBACK_START_SECONDS, False)
    # two launches: the first waited 3 s for its first run (its second run queued 10 s behind it: not a start),
    # the second 5 s; a third launch 4 s. The median of the launches' first waits: 4 s
    rows = [_row(id=1, group_id="a", created_at=0.0, started_at=3.0), _row(id=2, group_id="a", created_at=0.0,
                                                                         started_at=10.0),
            _row(id=3, group_id="b", created_at=20.0, started_at=25.0), _row(id=4, group_id="c", created_at=40.0,
                                                                           started_at=44.0)]
    assert start_seconds(rows) == (4.0, True)
    cfg = RunConfig(data=DataConfig(name="digits"), batch_size=10)
    done = _row(status="finished", total_steps=50, created_at=1.0, started_at=3.0, finished_at=8.0, group_id="d",
                config={"data": {"name": "digits"}, "model": {"name": "auto"}, "batch_size": 10})
    jobs = [(cfg, 20, 10.0)] * 3  # 2 s of training each (5 s / 500 samples × 200), started 2 s after Launch
    assert run_time_estimate(jobs, [done], workers=3)[0] == pytest.approx(2.0 + 2.0)  # one wave
    assert run_time_estimate(jobs, [done], workers=2)[0] == pytest.approx(3.0 + 2 * 2.0)  # two waves


def _true_run(rate: float, total: int, start: float, eval_every: int, eval_pause: float, seed: int = 0,
              slower_from: int | None = None, slower: float = 1.0):
    """(time, step) of a run as a viewer polling every 0.5 s sees it: ``rate`` steps/s (``slower`` × fewer from
    step ``slower_from`` on: the machine got busier), an evaluation pause every ``eval_every`` steps, the row's step
    updated in batches of 5; and the time it really ends."""
    rng = np.random.default_rng(seed)
    t, step, times = start, 0, []
    while step < total:  # the time each step ends
        now_rate = rate / slower if slower_from is not None and step >= slower_from else rate
        t += rng.exponential(1 / now_rate)
        step += 1
        if step % eval_every == 0:
            t += eval_pause
        times.append(t)
    end, seen, now = times[-1], [], start + 0.5
    while now < end:
        done = int(np.searchsorted(times, now, side="right"))
        seen.append((now, done - done % 5))
        now += 0.5
    return seen, end


def _watch(seen, total: int, eval_every: int) -> list[tuple]:
    """(time, step, ETA shown) of each reading a viewer's SmoothEta gives for a run seen as ``seen``."""
    eta, shown = SmoothEta(), []
    for now, step in seen:
        got = eta(_row(step=step, total_steps=total, started_at=1000.0, config={"eval_every": eval_every}), now=now)
        if got is not None:
            shown.append((now, step, got))
    return shown


def test_the_live_eta_ignores_the_start_counts_down_and_stays_near_the_truth():
    """The issue's swing (82 min → 3 min in 15 s) came from a rate measured from ``started_at``: the worker's
    start and first evaluation counted as steps. Here a run that starts 20 s before its first step (at
    4 steps/s, an evaluation pause of 2 s every 40 steps): every ETA after the first evaluation (and 10 s or more
    before the end) is within 1.3× of the time really left; it counts down and rises only to re-anchor, rarely."""
    seen, end = _true_run(rate=4.0, total=600, start=1020.0, eval_every=40, eval_pause=2.0)
    shown = _watch(seen, 600, 40)
    assert shown and shown[0][1] > 0  # none before the run has moved on since the first sighting
    rises = [(a, b) for a, b in zip(shown, shown[1:]) if b[2] > a[2]]
    assert len(rises) <= 5, rises  # re-anchors (at an evaluation, or a countdown fallen far below the rate's ETA)
    assert sum(b[2] < a[2] for a, b in zip(shown, shown[1:])) > 0.9 * (len(shown) - 1)  # it moves, downwards
    after = [(now, got) for now, step, got in shown if step >= 40 and end - now > 10]
    ratios = [got / (end - now) for now, got in after]
    assert len(after) > 100 and 0.7 <= min(ratios) and max(ratios) <= 1.3, (min(ratios), max(ratios))
    # the rate from started_at would have said (600 − 20) / (20 / 20 s) ≈ 580 s at step 20, ~3× the truth
    assert SmoothEta()(_row(step=11, status="finished"), now=end) is None


def test_the_live_eta_follows_a_machine_that_gets_busier_and_never_stands_still():
    """The machine gets 2× slower at step 300 (load from elsewhere). The tour saw "7.1 min" for 90 s: an ETA kept
    from rising stood still while the rate's ETA sat a little above it (here it stood 23.5 s). Now it moves at
    every reading, and four evaluations after the slowdown it is within 1.3× of the time really left."""
    seen, end = _true_run(rate=4.0, total=600, start=1020.0, eval_every=40, eval_pause=2.0, slower_from=300,
                          slower=2.0)
    shown = _watch(seen, 600, 40)
    still, since = 0.0, shown[0][0]
    for a, b in zip(shown, shown[1:]):
        since = since if b[2] == a[2] else b[0]
        still = max(still, b[0] - since)
    assert still <= 2.5, still
    late = [(now, got) for now, step, got in shown if step >= 460 and end - now > 10]
    ratios = [got / (end - now) for now, got in late]
    assert late and 0.7 <= min(ratios) and max(ratios) <= 1.3, (min(ratios), max(ratios))


def test_the_live_eta_re_anchors_once_when_a_run_really_slows_down():
    eta = SmoothEta()
    eta(_row(step=10), now=1010.0)
    first = eta(_row(step=20), now=1020.0)  # 1 step/s: 80 s left
    assert first == pytest.approx(80.0)
    # a slow moment does not raise the ETA: it counts down with the clock
    assert eta(_row(step=21), now=1022.0) == pytest.approx(first - 2.0)
    slowed = eta(_row(step=22), now=1060.0)  # 12 steps in 50 s: 78 × 50/12 ≈ 325 s, far above the last shown
    assert slowed == pytest.approx(78 * 50 / 12)
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


def test_a_launch_that_finds_a_warm_standby_is_estimated_from_warm_starts_and_a_cold_one_from_cold():
    """Measured on the development machine: a run handed to a ready standby started 0.3 s after Launch, a cold
    worker 6–8 s after (it imports torch); one median over both missed each by far (the default comparison's
    1.0 s launch was estimated at 11.3 s)."""
    rows = [_row(id=i, group_id=f"g{i}", created_at=10.0 * i, started_at=10.0 * i + w)
            for i, w in enumerate([6.4, 0.3, 0.25, 7.7, 0.35])]
    assert start_seconds(rows, warm=True) == (pytest.approx(0.3), True)
    assert start_seconds(rows, warm=False) == (pytest.approx(7.05), True)
    assert start_seconds(rows) == (pytest.approx(0.35), True)  # not known: the median of every launch
    assert start_seconds(rows[1:3], warm=False) == (FALLBACK_START_SECONDS, False)  # no cold start measured yet
    assert start_seconds(rows[:1], warm=True) == (FALLBACK_WARM_START_SECONDS, False)
    cfg = RunConfig(data=DataConfig(name="digits"), batch_size=10)
    done = _row(status="finished", total_steps=50, created_at=1.0, started_at=3.0, finished_at=8.0, group_id="d",
                config={"data": {"name": "digits"}, "model": {"name": "auto"}, "batch_size": 10})
    history = rows + [done]  # d: a 2 s wait, counted cold
    jobs = [(cfg, 20, 10.0)] * 3  # 2 s of training each
    warm = run_time_estimate(jobs, history, workers=2, ready_standbys=2)
    cold = run_time_estimate(jobs, history, workers=2, ready_standbys=1)  # the first wave needs two
    assert warm[0] == pytest.approx(3.0 + 0.3 + 0.3) and "warm worker is ready" in warm[1]
    assert cold[0] == pytest.approx(3.0 + 6.4 + 0.3) and "cold start" in cold[1]  # the second wave starts warm
    no_prewarm = run_time_estimate(jobs, history, workers=2, ready_standbys=0, prewarm=False)
    assert no_prewarm[0] == pytest.approx(3.0 + 2 * 6.4)


def test_a_first_estimate_without_history_reflects_the_machines_load_now():
    """No run of this dataset and model measured yet: the rough per-core constant is slowed by the machine's load
    (the tour: 1.6 min said, 9.2 min taken at a load of 7–8.5 on 2 cores). Two runs on 2 workers beside 6 other
    busy processes share 2 cores 8 ways: 4× as long, the rough start too. A measured rate holds the load it was
    measured under and is kept."""
    from engine.jobs.estimates import busy_elsewhere, contention

    cfg = RunConfig(data=DataConfig(name="digits"), batch_size=10)
    jobs = [(cfg.replace(**{"algorithm.name": a}), 20, 10.0) for a in ("ino", "idp_sample")]
    quiet, how = run_time_estimate(jobs, [], workers=2, others=0.0, cores=2)
    busy, busy_how = run_time_estimate(jobs, [], workers=2, others=6.0, cores=2)
    assert busy == pytest.approx(4 * quiet) and "× 4.0 for the machine's load now (6.0 other busy processes)" in busy_how
    assert "load" not in how
    assert run_time_estimate(jobs, [], workers=2, others=1.0, cores=4)[0] == pytest.approx(quiet)  # cores to spare
    done = _row(status="finished", total_steps=50, created_at=1.0, started_at=1.0, finished_at=6.0, group_id="d",
                config={"data": {"name": "digits"}, "model": {"name": "auto"}, "batch_size": 10})
    assert run_time_estimate(jobs, [done], workers=2, others=6.0, cores=2) == \
        run_time_estimate(jobs, [done], workers=2, others=0.0, cores=2)
    assert contention(2, 0.5, 2) == pytest.approx(1.25) and contention(1, 0.0, 2) == 1.0
    assert busy_elsewhere(10**6) == 0.0 and busy_elsewhere(0) >= 0.0
