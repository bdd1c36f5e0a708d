"""The SQLite run store: WAL, a writer and readers at once, crash recovery."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import wait_until
from engine.config.run import RunConfig
from engine.store.db import RunStore
from engine.store.errors import StoreError

REPO = Path(__file__).resolve().parents[1]


def test_wal_and_round_trip(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    cfg = RunConfig()
    run_id = store.create_run(cfg, group_id="g1")
    run = store.get_run(run_id)
    assert run["status"] == "queued" and RunConfig.from_dict(run["config"]) == cfg
    assert run["versions"]["torch"] and run["seed"] == 0
    store.log_eval(run_id, 0, {"overall": {"accuracy": 0.1}})
    store.log_steps(run_id, [(1, 2.3, 120), (2, 2.2, 130)])
    assert store.eval_metrics(run_id)[0]["overall"]["accuracy"] == 0.1
    assert [s["batch_size"] for s in store.step_metrics(run_id)] == [120, 130]
    assert store.get_run(run_id)["step"] == 2
    assert store.list_runs(group_id="g1")[0]["id"] == run_id
    store.delete_run(run_id)
    assert store.get_run(run_id) is None and store.eval_metrics(run_id) == []


WRITER = """
import sys
from engine.store.db import RunStore
store = RunStore(sys.argv[1])
for step in range(300):
    store.log_eval(1, step, {"x": step})
    store.log_steps(1, [(step, 1.0, 10)])
"""


def test_writer_and_reader_concurrently(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    store.create_run(RunConfig())
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(store.path)], cwd=REPO)
    seen = []
    while proc.poll() is None:
        evals = store.eval_metrics(1)
        seen.append(len(evals))
        assert [e["x"] for e in evals] == list(range(len(evals)))  # a consistent prefix, never torn
    assert proc.returncode == 0
    assert len(store.eval_metrics(1)) == 300 and len(seen) > 1


@pytest.mark.slow
def test_killed_worker_is_interrupted_and_finished_runs_survive(tmp_path):
    path = tmp_path / "runs.sqlite"
    store = RunStore(path)
    env = dict(os.environ, PRIVACY_LAB_STORE=str(path))
    done = store.create_run(RunConfig().replace(**{"model.name": "lr", "epochs": 1.0}))
    subprocess.run([sys.executable, "-m", "engine", "worker", str(done)], cwd=REPO, env=env, check=True)
    long = store.create_run(RunConfig().replace(**{"model.name": "lr", "epochs": 400.0, "eval_every": 5}))
    proc = subprocess.Popen([sys.executable, "-m", "engine", "worker", str(long)], cwd=REPO, env=env)
    wait_until(lambda: len(store.eval_metrics(long)) >= 3, 120, "three evaluations of the long run")
    assert store.get_run(long)["status"] == "running"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert RunStore(path).mark_dead_runs() == [long]
    run = store.get_run(long)
    assert run["status"] == "interrupted" and str(proc.pid) in run["error"]
    assert len(store.eval_metrics(long)) >= 3  # metrics so far are kept
    finished = store.get_run(done)
    assert finished["status"] == "finished" and finished["summary"]["tiers"]


@pytest.mark.slow
def test_sigterm_marks_cancelled(tmp_path):
    path = tmp_path / "runs.sqlite"
    store = RunStore(path)
    run_id = store.create_run(RunConfig().replace(**{"model.name": "lr", "epochs": 400.0, "eval_every": 5}))
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--store", str(path), "worker", str(run_id)], cwd=REPO)
    wait_until(lambda: len(store.eval_metrics(run_id)) >= 2, 120, "two evaluations of the run")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    run = store.get_run(run_id)
    assert run["status"] == "cancelled" and len(store.eval_metrics(run_id)) >= 2


@pytest.mark.slow
def test_failed_run_records_error(tmp_path):
    path = tmp_path / "runs.sqlite"
    store = RunStore(path)
    run_id = store.create_run({"delta": 5})
    out = subprocess.run([sys.executable, "-m", "engine", "--store", str(path), "worker", str(run_id)], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    run = store.get_run(run_id)
    assert run["status"] == "failed" and "delta" in run["error"]
    assert json.loads(json.dumps(run["config"]))["delta"] == 5


# --- k-seed jobs: one row per seed, job-wide status -------------------------------------------------

SEEDS = RunConfig().replace(**{"model.name": "lr", "seeds": 3, "seed": 10})


def test_a_group_of_jobs_is_written_whole_or_not_at_all(tmp_path):
    """A comparison or sweep (several jobs) lands in one transaction: a reader sees all of its rows or none."""
    store = RunStore(tmp_path / "runs.sqlite")
    ids = store.create_jobs([[RunConfig()], SEEDS.seed_configs(), [RunConfig().replace(seed=5)]],
                            group_id="g", names=["a", "b", "c"])
    runs = [store.get_run(i) for i in ids]
    assert [(r["name"], r["job_id"] == ids[1]) for r in runs] == \
        [("a", False), ("b", True), ("b", True), ("b", True), ("c", False)]
    # a write that fails at the group's fourth row (a real SQLite trigger) leaves none of the group behind
    with sqlite3.connect(store.path) as db:
        db.execute("CREATE TRIGGER fourth BEFORE INSERT ON runs WHEN (SELECT COUNT(*) FROM runs WHERE group_id='h') = 3 "
                   "BEGIN SELECT RAISE(ABORT, 'disk gone'); END")
    with pytest.raises(StoreError, match="disk gone"):  # the store's one-line error, naming sqlite's
        store.create_jobs([[RunConfig()], SEEDS.seed_configs()], group_id="h")
    assert store.list_runs(group_id="h") == [] and len(store.list_runs(group_id="g")) == 5


def test_create_job_rows_and_job_wide_status(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    single = store.create_run(RunConfig(), group_id="g")
    ids = store.create_job(SEEDS.seed_configs(), group_id="g")
    assert ids == [single + 1, single + 2, single + 3]
    runs = [store.get_run(i) for i in ids]
    assert [(r["job_id"], r["seed"], r["seed_index"], r["seeds"]) for r in runs] == \
        [(ids[0], 10, 0, 3), (ids[0], 11, 1, 3), (ids[0], 12, 2, 3)]
    assert store.get_run(single)["job_id"] is None and store.job_rows(single) == [single]
    assert store.job_rows(ids[1]) == ids and store.leader_of(ids[2]) == ids[0] and store.job_rows(999) == []
    # status and pid reach every row of the job, never another run
    store.set_pid(ids[0], 4242)
    store.set_status(ids[2], "running")
    assert [(r["status"], r["pid"]) for r in map(store.get_run, ids)] == [("running", 4242)] * 3
    assert store.get_run(single)["status"] == "queued" and store.get_run(single)["pid"] is None
    # each row's steps and evaluations in one transaction; each row finishes with its own summary
    store.log_progress({i: [(1, 0.5 + j, 10 + j), (2, 0.4, 11)] for j, i in enumerate(ids)},
                       {i: (2, {"overall": {"accuracy": j / 10}}) for j, i in enumerate(ids)})
    assert [store.get_run(i)["step"] for i in ids] == [2, 2, 2]
    assert [store.eval_metrics(i)[0]["overall"]["accuracy"] for i in ids] == [0.0, 0.1, 0.2]
    assert [store.step_metrics(i)[0]["batch_size"] for i in ids] == [10, 11, 12]
    store.finish_runs({i: {"seed": 10 + j} for j, i in enumerate(ids)})
    assert [(r["status"], r["summary"]["seed"]) for r in map(store.get_run, ids)] == \
        [("finished", 10), ("finished", 11), ("finished", 12)]
    assert sorted(store.delete_job(ids[1])) == ids
    assert all(store.get_run(i) is None and store.eval_metrics(i) == [] for i in ids)
    assert store.get_run(single) is not None and store.delete_job(single) == [single]


OLD_SCHEMA = """
CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL DEFAULT 'train',
    name TEXT NOT NULL DEFAULT '', algorithm TEXT NOT NULL DEFAULT '', group_id TEXT, config_json TEXT NOT NULL,
    status TEXT NOT NULL, error TEXT, seed INTEGER, pid INTEGER, host TEXT, created_at REAL NOT NULL,
    started_at REAL, finished_at REAL, updated_at REAL, step INTEGER NOT NULL DEFAULT 0, total_steps INTEGER,
    plan_json TEXT, summary_json TEXT, versions_json TEXT);
CREATE TABLE eval_metrics (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE, step INTEGER NOT NULL,
    metrics_json TEXT NOT NULL, PRIMARY KEY (run_id, step));
"""


def test_a_store_made_before_jobs_is_read_and_migrated(tmp_path):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(OLD_SCHEMA)
        for k in range(2):
            db.execute("INSERT INTO runs (config_json, status, seed, created_at, group_id) VALUES (?,?,?,?,?)",
                       (RunConfig().replace(seed=k).to_json(), "finished", k, time.time(), "old"))
    before = path.read_bytes()
    ro = RunStore(path, readonly=True)  # a reader changes nothing and sees every run as a single run
    assert [(r["job_id"], r["seeds"], r["seed_index"]) for r in ro.list_runs()] == [(None, 1, 0)] * 2
    assert path.read_bytes() == before
    store = RunStore(path)  # a writer adds the column; the old runs stay single runs
    with sqlite3.connect(path) as db:
        assert "job_id" in {r[1] for r in db.execute("PRAGMA table_info(runs)")}
    assert [store.job_rows(r["id"]) for r in store.list_runs()] == [[2], [1]]
    store.set_status(1, "cancelled")
    assert [r["status"] for r in store.list_runs()] == ["finished", "cancelled"]
    ids = store.create_job(SEEDS.seed_configs(), group_id="new")
    assert store.job_rows(ids[0]) == ids and RunConfig.from_dict(store.get_run(1)["config"]) == RunConfig()
    assert RunStore(path).job_rows(ids[2]) == ids  # reopening migrates nothing twice
