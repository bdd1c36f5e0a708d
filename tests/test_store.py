"""The SQLite run store: WAL, a writer and readers at once, crash recovery."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from engine.config import RunConfig
from engine.store import RunStore

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
from engine.store import RunStore
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


def test_killed_worker_is_interrupted_and_finished_runs_survive(tmp_path):
    path = tmp_path / "runs.sqlite"
    store = RunStore(path)
    env = dict(os.environ, PRIVACY_LAB_STORE=str(path))
    done = store.create_run(RunConfig().replace(**{"model.name": "lr", "epochs": 1.0}))
    subprocess.run([sys.executable, "-m", "engine", "worker", str(done)], cwd=REPO, env=env, check=True)
    long = store.create_run(RunConfig().replace(**{"model.name": "lr", "epochs": 400.0, "eval_every": 5}))
    proc = subprocess.Popen([sys.executable, "-m", "engine", "worker", str(long)], cwd=REPO, env=env)
    deadline = time.time() + 120
    while len(store.eval_metrics(long)) < 3 and time.time() < deadline:
        time.sleep(0.2)
    assert store.get_run(long)["status"] == "running"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert RunStore(path).mark_dead_runs() == [long]
    run = store.get_run(long)
    assert run["status"] == "interrupted" and str(proc.pid) in run["error"]
    assert len(store.eval_metrics(long)) >= 3  # metrics so far are kept
    finished = store.get_run(done)
    assert finished["status"] == "finished" and finished["summary"]["tiers"]


def test_sigterm_marks_cancelled(tmp_path):
    path = tmp_path / "runs.sqlite"
    store = RunStore(path)
    run_id = store.create_run(RunConfig().replace(**{"model.name": "lr", "epochs": 400.0, "eval_every": 5}))
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--store", str(path), "worker", str(run_id)], cwd=REPO)
    deadline = time.time() + 120
    while len(store.eval_metrics(run_id)) < 2 and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    run = store.get_run(run_id)
    assert run["status"] == "cancelled" and len(store.eval_metrics(run_id)) >= 2


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
