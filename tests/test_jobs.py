"""The job manager: separate worker processes, a concurrency limit with a queue, cancel, dead-worker
detection (kill -9, start-up recovery), reattaching from a second manager, the warm standby."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import wait_until
from engine.config.run import RunConfig
from engine.jobs.estimates import eta_seconds
from engine.jobs.manager import WORKER_NICENESS, JobManager, default_max_workers, standby_command, worker_command
from engine.store.db import RunStore

TINY = RunConfig().replace(**{"data.max_train": 200, "epochs": 1.0, "batch_size": 32, "eval_every": 1})
LONG = RunConfig().replace(**{"epochs": 200.0, "eval_every": 5})  # minutes of work: always cancelled or killed


def status(store, rid):
    return store.get_run(rid)["status"]


@pytest.fixture()
def managers(tmp_path):
    made = []

    def make(**kw):
        kw.setdefault("prewarm", False)
        m = JobManager(tmp_path / "runs.sqlite", **kw)
        made.append(m)
        return m

    yield make
    for m in made:
        m.shutdown(cancel_running=True)


def test_defaults_and_worker_command(tmp_path):
    assert default_max_workers() == max(2, (os.cpu_count() or 1) - 1)
    cmd = worker_command(tmp_path / "s.sqlite", 7)
    assert cmd[:3] == [sys.executable, "-m", "engine"] and cmd[-4:] == ["worker", "7", "--threads", "1"]


@pytest.mark.slow
def test_queue_cancel_kill_and_reattach(managers):
    mgr = managers(max_workers=1)
    store = mgr.store
    a, b, c = mgr.submit([LONG, LONG.replace(**{"algorithm.name": "idp_sample"}), TINY], group_id="g-queue")
    wait_until(lambda: store.get_run(a)["status"] == "running" and store.get_run(a)["step"] > 0, what="run a to train")
    # at most one worker: the others wait in the queue, shown as queued
    assert status(store, b) == "queued" and status(store, c) == "queued" and mgr.queue_position(c) == 2
    assert eta_seconds(store.get_run(a)) is not None
    # a worker yields the CPU to the app and the browser
    assert os.getpriority(os.PRIO_PROCESS, store.get_run(a)["pid"]) >= WORKER_NICENESS
    # a queued run is cancelled without ever starting
    assert mgr.cancel(c) == "cancelled" and store.get_run(c)["pid"] is None
    # a second manager on the same store (a new app process / a refreshed page) sees the running run
    # without starting it again, and can cancel it: the worker really stops, metrics are kept
    other = managers(max_workers=1)
    other.tick()
    assert status(store, a) == "running" and status(store, b) == "queued"
    pid_a = store.get_run(a)["pid"]
    assert other.cancel(a) == "cancelled", store.get_run(a)["error"]
    assert wait_until(lambda: not _alive(pid_a), 10, "worker a to exit")
    assert store.eval_metrics(a), "metrics logged before the cancel are kept"
    # the queue moves on; kill -9 of that worker marks its run interrupted, with the reason
    wait_until(lambda: store.get_run(b)["status"] == "running" and store.get_run(b)["step"] > 0, what="run b to train")
    os.kill(store.get_run(b)["pid"], signal.SIGKILL)
    run_b = wait_until(lambda: (r := store.get_run(b))["status"] == "interrupted" and r, 15, "run b interrupted")
    assert "SIGKILL" in run_b["error"] or "ended without finishing" in run_b["error"]
    assert [r["status"] for r in store.list_runs(group_id="g-queue")] == ["cancelled", "interrupted", "cancelled"]


def _alive(pid: int) -> bool:
    from engine.store.liveness import pid_alive

    return pid_alive(pid)


def test_dead_running_runs_are_marked_interrupted_at_startup(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    rid = store.create_run(TINY, group_id="g-dead")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.start_run(rid, pid=dead.pid, total_steps=10)
    mgr = JobManager(store.path, autostart=False, prewarm=False)
    assert mgr.recovered == [rid]
    run = store.get_run(rid)
    assert run["status"] == "interrupted" and str(dead.pid) in run["error"]
    mgr.shutdown()


def test_runs_without_a_group_are_left_to_their_owner(tmp_path):
    # `python -m engine run` creates its own queued run (no group) and trains it in-process
    store = RunStore(tmp_path / "runs.sqlite")
    rid = store.create_run(TINY)
    mgr = JobManager(store.path, autostart=False, prewarm=False)
    mgr.tick()
    assert status(store, rid) == "queued" and not mgr.owns(rid)
    mgr.shutdown()


@pytest.mark.slow
def test_standbys_warm_every_slot_and_finish_like_cold_workers_and_errors_fail_cleanly(managers, tmp_path):
    mgr = managers(max_workers=2, prewarm=True)
    store = mgr.store
    other = TINY.replace(seed=1)
    mgr.hint([other, TINY])  # what the Train page does while the user looks at the form: one per worker slot
    wait_until(lambda: len(mgr._standbys) == 2 and all(p.poll() is None for p in mgr._standbys)
             and set(mgr._hinted) == {TINY.to_json(), other.to_json()}, 60, "two hinted standbys")
    pid_of = dict(zip(mgr._hinted, [p.pid for p in mgr._standbys]))  # each standby prepares its own config
    assert all(os.getpriority(os.PRIO_PROCESS, pid) >= WORKER_NICENESS for pid in pid_of.values())
    # each standby says when it is warm (the estimate's warm start): both, once imported
    wait_until(lambda: mgr.standbys_ready() == 2, 90, "two warm standbys")
    markers = [p.ready_path for p in mgr._standbys]
    # (a standby reads its hint before the run line, so the run always finds what it prepared)
    warm, warm_other = mgr.submit([TINY, other], group_id="g-warm")
    runs = wait_until(lambda: (rs := [store.get_run(i) for i in (warm, warm_other)])
                    and all(r["status"] not in ("queued", "running") for r in rs) and rs, 120, "the warm runs")
    assert [r["status"] for r in runs] == ["finished", "finished"]
    assert runs[0]["pid"] == pid_of[TINY.to_json()] and runs[1]["pid"] == pid_of[other.to_json()]
    assert not any(m.exists() for m in markers)  # a standby that took a run is no longer counted as ready
    warm_waits = [r["started_at"] - r["created_at"] for r in runs]

    cold_mgr = JobManager(tmp_path / "cold.sqlite", max_workers=1, prewarm=False)
    try:
        bad = TINY.replace(**{"batch_size": 5000})  # larger than the data: the worker's prepare() refuses it
        cold, failed = cold_mgr.submit([TINY, bad], group_id="g-cold")
        cruns = wait_until(lambda: (rs := [cold_mgr.store.get_run(i) for i in (cold, failed)])
                         and all(r["status"] not in ("queued", "running") for r in rs) and rs, 120, "the cold runs")
    finally:
        cold_mgr.shutdown(cancel_running=True)
    assert [r["status"] for r in cruns] == ["finished", "failed"]
    assert cold_mgr.standbys_ready() == 0
    assert cruns[0]["pid"] not in pid_of.values()
    # the split the estimate's warm start makes (estimates.WARM_START_MAX_SECONDS), as a comparison that holds on a
    # loaded machine too: a warm standby starts its run sooner than a cold worker, which imports torch first
    assert max(warm_waits) < cruns[0]["started_at"] - cruns[0]["created_at"]
    assert "batch_size" in cruns[1]["error"]
    s1, s2 = runs[0]["summary"], cruns[0]["summary"]
    assert s1["steps"] == s2["steps"] and s1["accuracy"] == s2["accuracy"]
    assert [t["recall"] for t in s1["tiers"]] == [t["recall"] for t in s2["tiers"]]
    assert [e["overall"] for e in store.eval_metrics(warm)] == \
        [e["overall"] for e in cold_mgr.store.eval_metrics(cold)]
    assert mgr.log_path(warm).exists()


@pytest.mark.slow
def test_closing_standbys_lets_a_warm_one_exit_and_kills_one_still_warming_up(tmp_path):
    """A warm standby reads its stdin's EOF and exits by itself (code 0, no run or store touched); one still
    importing would only read it after its imports, and has touched nothing yet, so it is killed at once.
    Either way no ready marker is left behind (the estimate would count it as warm)."""
    store = tmp_path / "runs.sqlite"

    def spawn(name):
        proc = subprocess.Popen(standby_command(store, 1, tmp_path / name), stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc.ready_path = tmp_path / name
        return proc

    warm = spawn("warm.ready")
    wait_until(lambda: warm.ready_path.exists() or warm.poll() is not None, 120, "a warm standby")
    cold = spawn("cold.ready")
    assert not cold.ready_path.exists()  # a standby imports for seconds before it is warm
    JobManager._close_standbys([warm, cold])
    assert warm.poll() == 0 and cold.poll() == -signal.SIGKILL
    assert not warm.ready_path.exists() and not cold.ready_path.exists() and not store.exists()


@pytest.mark.slow
def test_a_standby_prepares_the_queued_run_next_in_line(managers):
    """While a comparison's first runs train, a standby prepares the queued run next in line (not only what
    the UI hints), so that run starts warm, on the standby that prepared it."""
    mgr = managers(max_workers=1, prewarm=True)
    store = mgr.store
    nxt = TINY.replace(seed=3)
    mgr.hint([TINY])  # the form shows another config
    first, queued = mgr.submit([LONG, nxt], group_id="g-next")
    wait_until(lambda: status(store, first) == "running", 60, "the first run")
    want = RunConfig.from_dict(store.get_run(queued)["config"]).to_json()
    pid = wait_until(lambda: next((p.pid for p, h in zip(mgr._standbys, mgr._hinted) if h == want and p.poll() is None),
                                None), 90, "a standby hinted with the queued run's config")
    assert mgr.cancel(first) == "cancelled"
    run = wait_until(lambda: (r := store.get_run(queued))["status"] == "finished" and r, 120, "the queued run")
    assert run["pid"] == pid


@pytest.mark.slow
def test_no_standby_imports_beside_a_training_run_with_nothing_queued_and_they_warm_once_it_ends(managers):
    """Standbys importing torch beside a run slowed it 3x on 2 cores (and with it the next launch's estimate):
    while runs train and nothing waits in the queue, none starts; once the runs end, the slots warm again."""
    from engine.jobs.manager import STANDBY_DELAY_SECONDS

    mgr = managers(max_workers=1, prewarm=True)
    store = mgr.store
    wait_until(lambda: mgr.standbys_ready() == 1, 90, "a warm standby")
    (rid,) = mgr.submit([LONG], group_id="g-alone")
    wait_until(lambda: status(store, rid) == "running", 60, "the run")
    time.sleep(STANDBY_DELAY_SECONDS + 2.0)  # what is checked is an absence: past the delay after which one would start
    assert status(store, rid) == "running" and not [p for p in mgr._standbys if p.poll() is None]
    assert mgr.cancel(rid) == "cancelled"
    wait_until(lambda: mgr.standbys_ready() == 1, 90, "the standby warm again after the run")


def test_submit_refuses_an_unknown_kind_before_queueing(tmp_path):
    from engine.config.schema import ConfigError

    mgr = JobManager(tmp_path / "runs.sqlite", autostart=False, prewarm=False)
    with pytest.raises(ConfigError) as e:
        mgr.submit([TINY], kind="nope")
    assert e.value.field == "kind" and mgr.store.list_runs() == []
    mgr.shutdown()


def test_resume_requeues_an_ended_grouped_run(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    rid = store.create_run(TINY, group_id="g-resume")
    store.start_run(rid, pid=999_999, total_steps=10)
    store.set_status(rid, "cancelled", error="cancelled by the user")
    mgr = JobManager(store.path, autostart=False, prewarm=False)
    mgr.resume(rid)
    run = store.get_run(rid)
    assert run["status"] == "queued" and run["pid"] is None
    lone = store.create_run(TINY)
    store.set_status(lone, "failed", error="x")
    with pytest.raises(ValueError, match="no group"):
        mgr.resume(lone)
    mgr.shutdown()


# --- k-seed jobs: one worker, k rows -------------------------------------------------------------

SEEDS3 = TINY.replace(**{"model.name": "lr", "seeds": 3, "seed": 5})
LONG_LR = RunConfig().replace(**{"model.name": "lr", "epochs": 4000.0, "eval_every": 50})


def _rows(store, ids):
    return [store.get_run(i) for i in ids]


@pytest.mark.slow
def test_a_k_seed_job_is_one_worker_writing_k_rows(managers):
    mgr = managers(max_workers=2)
    store = mgr.store
    ids = mgr.submit([SEEDS3], group_id="g-seeds")
    assert len(ids) == 3 and store.job_rows(ids[2]) == ids and store.leader_of(ids[1]) == ids[0]
    runs = wait_until(lambda: (rs := _rows(store, ids)) and all(r["status"] == "finished" for r in rs) and rs,
                    120, "the job to finish")
    assert len({r["pid"] for r in runs}) == 1  # one worker process trained the three models
    for j, r in enumerate(runs):
        assert (r["seed"], r["seed_index"], r["seeds"], r["job_id"]) == (5 + j, j, 3, ids[0])
        assert RunConfig.from_dict(r["config"]) == SEEDS3.seed_configs()[j]
        assert r["plan"] == runs[0]["plan"] and r["summary"]["seed"] == 5 + j
        assert len(store.eval_metrics(r["id"])) == r["total_steps"] + 1  # eval_every = 1, step 0 included
        assert len(store.step_metrics(r["id"])) == r["total_steps"]
    assert len({r["summary"]["loss"] for r in runs}) == 3
    # a replica is never started on its own, even when it is the only queued row of its group
    # the whole job cancelled from the start (created queued, the manager's scheduler could start its leader
    # before the test cancelled it: CI saw the replica running once) ...
    lone = store.create_job(SEEDS3.seed_configs(), group_id="g-rule", status="cancelled")
    store._write("UPDATE runs SET status='queued' WHERE id=?", (lone[1],))  # ... but one row queued again
    mgr.tick()
    assert store.get_run(lone[1])["status"] == "queued" and not mgr.owns(lone[1]) and lone[1] not in mgr._procs


@pytest.mark.slow
def test_k_seed_jobs_count_as_one_worker_cancel_any_row_kill_and_delete(managers):
    mgr = managers(max_workers=2)
    store = mgr.store
    job = mgr.submit([LONG_LR.replace(seeds=3)], group_id="g-cancel")
    single = mgr.submit([LONG_LR], group_id="g-cancel")
    # three running rows are one worker: the single run gets the second worker
    wait_until(lambda: all(r["status"] == "running" and r["step"] > 0 for r in _rows(store, job + single)), 120,
             "the job and the single run to train")
    assert len({r["pid"] for r in _rows(store, job)}) == 1 and mgr.owns(job[2])
    pid = store.get_run(job[0])["pid"]
    # Cancel on a replica row stops the job: every row is cancelled, the metrics so far are kept
    assert mgr.cancel(job[2]) == "cancelled"
    assert wait_until(lambda: not _alive(pid), 10, "the job's worker to exit")
    runs = _rows(store, job)
    assert [r["status"] for r in runs] == ["cancelled"] * 3 and len({r["error"] for r in runs}) == 1
    assert all(store.eval_metrics(i) for i in job)
    assert store.get_run(single[0])["status"] == "running"
    mgr.cancel(single[0])
    # kill -9 of a job's worker: every row becomes interrupted
    killed = mgr.submit([LONG_LR.replace(seeds=2, seed=9)], group_id="g-kill")
    assert mgr.queue_position(killed[1]) == mgr.queue_position(killed[0]) == 1
    wait_until(lambda: all(r["status"] == "running" and r["step"] > 0 for r in _rows(store, killed)), 120,
             "the second job to train")
    os.kill(store.get_run(killed[1])["pid"], signal.SIGKILL)
    wait_until(lambda: all(r["status"] == "interrupted" for r in _rows(store, killed)), 15, "both rows interrupted")
    # deleting any row deletes the job (all its rows, their metrics and logs)
    assert sorted(mgr.delete(killed[1])) == killed
    assert all(store.get_run(i) is None and store.eval_metrics(i) == [] for i in killed)
    assert store.get_run(single[0]) is not None


def test_a_dead_job_worker_found_by_another_manager_interrupts_every_row(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    ids = store.create_job(SEEDS3.seed_configs(), group_id="g-dead")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.set_pid(ids[0], dead.pid)
    for rid in ids:
        store.start_run(rid, pid=dead.pid, total_steps=10)
    mgr = JobManager(store.path, autostart=False, prewarm=False)
    assert sorted(mgr.recovered) == ids
    assert all(r["status"] == "interrupted" and str(dead.pid) in r["error"] for r in _rows(store, ids))
    mgr.resume(ids[2])  # resuming a row queues its whole job, from its leader
    assert [r["status"] for r in _rows(store, ids)] == ["queued"] * 3 and all(r["pid"] is None for r in _rows(store, ids))
    mgr.shutdown()


def test_submit_expands_a_dict_config_with_seeds(tmp_path):
    mgr = JobManager(tmp_path / "runs.sqlite", autostart=False, prewarm=False)
    ids = mgr.submit([TINY.to_dict() | {"seeds": 2}, TINY.to_dict()], group_id="g-dict")
    runs = _rows(mgr.store, ids)
    assert [(r["seed_index"], r["seeds"], r["job_id"]) for r in runs] == [(0, 2, ids[0]), (1, 2, ids[0]), (0, 1, None)]
    from engine.config.schema import ConfigError

    with pytest.raises(ConfigError) as e:
        mgr.submit([TINY, TINY.to_dict() | {"seeds": 99}], group_id="g-bad")
    assert e.value.field == "seeds" and mgr.store.list_runs(group_id="g-bad") == []  # nothing queued
    mgr.shutdown()

