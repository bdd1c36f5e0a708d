"""The run store: one SQLite file (WAL mode) shared by training workers and the UI.

A worker process writes; any number of readers (Streamlit sessions, the CLI) read at the
same time — WAL lets readers see the last committed state without blocking the writer.
Every write is its own short transaction, so a crash loses at most the write in flight,
never a finished run's results.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path

STATUSES = ("queued", "running", "finished", "failed", "cancelled", "interrupted")
ACTIVE = ("queued", "running")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL DEFAULT 'train',
    name TEXT NOT NULL DEFAULT '',
    algorithm TEXT NOT NULL DEFAULT '',
    group_id TEXT,
    config_json TEXT NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    seed INTEGER,
    pid INTEGER,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    updated_at REAL,
    step INTEGER NOT NULL DEFAULT 0,
    total_steps INTEGER,
    plan_json TEXT,
    summary_json TEXT,
    versions_json TEXT
);
CREATE TABLE IF NOT EXISTS step_metrics (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    step INTEGER NOT NULL,
    train_loss REAL,
    batch_size INTEGER,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE IF NOT EXISTS eval_metrics (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    step INTEGER NOT NULL,
    metrics_json TEXT NOT NULL,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE IF NOT EXISTS artifacts (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX IF NOT EXISTS runs_status ON runs(status);
"""


def default_store_path() -> Path:
    env = os.environ.get("PRIVACY_LAB_STORE")
    if env:
        return Path(env)
    return Path.home() / ".privacy-imbalance-lab" / "runs.sqlite"


def package_versions() -> dict:
    import platform

    out = {"python": platform.python_version()}
    for mod in ("torch", "opacus", "numpy", "scipy", "sklearn"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - versions are informational
            pass
    return out


class RunStore:
    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_store_path()
        if self.path.suffix == "" and (self.path.is_dir() or not self.path.exists()):
            self.path = self.path / "runs.sqlite"  # a folder was given
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @contextmanager
    def _connect(self):
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
            db.execute("PRAGMA foreign_keys=ON")
            yield db
        finally:
            db.close()

    def _write(self, sql: str, args=()) -> sqlite3.Cursor:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                cur = db.execute(sql, args)
                db.execute("COMMIT")
            except BaseException:
                # A signal (e.g. SIGTERM → Cancelled) can land right after COMMIT: only roll back an
                # open transaction, so the original exception is the one that propagates.
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            return cur

    # --- runs -------------------------------------------------------------------------
    def create_run(self, config, *, kind: str = "train", group_id: str | None = None,
                   status: str = "queued", name: str | None = None) -> int:
        """Register a run. ``config`` is a RunConfig (or any object with to_json/to_dict) or a dict."""
        if hasattr(config, "to_json"):
            config_json = config.to_json()
            cfg = config.to_dict()
        else:
            cfg = dict(config)
            config_json = json.dumps(cfg, sort_keys=True, separators=(",", ":"))
        algorithm = (cfg.get("algorithm") or {}).get("name", "") if isinstance(cfg.get("algorithm"), dict) else ""
        label = name if name is not None else (cfg.get("name") or "")
        cur = self._write(
            "INSERT INTO runs (kind, name, algorithm, group_id, config_json, status, seed, created_at, updated_at,"
            " versions_json) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (kind, label, algorithm, group_id, config_json, status, cfg.get("seed"), time.time(), time.time(),
             json.dumps(package_versions())),
        )
        return int(cur.lastrowid)

    def start_run(self, run_id: int, *, pid: int, total_steps: int | None = None, plan: dict | None = None) -> None:
        self._write(
            "UPDATE runs SET status='running', pid=?, started_at=?, updated_at=?, total_steps=?, plan_json=?,"
            " error=NULL WHERE id=?",
            (pid, time.time(), time.time(), total_steps, json.dumps(plan) if plan is not None else None, run_id),
        )

    def set_pid(self, run_id: int, pid: int | None) -> None:
        self._write("UPDATE runs SET pid=?, updated_at=? WHERE id=?", (pid, time.time(), run_id))

    def set_status(self, run_id: int, status: str, error: str | None = None) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        done = None if status in ACTIVE else time.time()
        self._write("UPDATE runs SET status=?, error=COALESCE(?, error), finished_at=COALESCE(?, finished_at),"
                    " updated_at=? WHERE id=?", (status, error, done, time.time(), run_id))

    def finish_run(self, run_id: int, summary: dict) -> None:
        self._write("UPDATE runs SET status='finished', summary_json=?, finished_at=?, updated_at=? WHERE id=?",
                    (json.dumps(summary), time.time(), time.time(), run_id))

    def set_summary(self, run_id: int, summary: dict) -> None:
        self._write("UPDATE runs SET summary_json=?, updated_at=? WHERE id=?", (json.dumps(summary), time.time(), run_id))

    def update_progress(self, run_id: int, step: int) -> None:
        self._write("UPDATE runs SET step=?, updated_at=? WHERE id=?", (step, time.time(), run_id))

    def delete_run(self, run_id: int) -> None:
        self._write("DELETE FROM runs WHERE id=?", (run_id,))

    def get_run(self, run_id: int) -> dict | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        return _row(row) if row else None

    def list_runs(self, *, kind: str | None = None, group_id: str | None = None,
                  status: str | None = None) -> list[dict]:
        sql, args = "SELECT * FROM runs WHERE 1=1", []
        for col, val in (("kind", kind), ("group_id", group_id), ("status", status)):
            if val is not None:
                sql += f" AND {col}=?"
                args.append(val)
        with self._connect() as db:
            rows = db.execute(sql + " ORDER BY id DESC", args).fetchall()
        return [_row(r) for r in rows]

    # --- metrics ----------------------------------------------------------------------
    def log_steps(self, run_id: int, rows) -> None:
        """rows: iterable of (step, train_loss, batch_size)."""
        rows = [(run_id, int(s), float(l) if l is not None else None, int(b)) for s, l, b in rows]
        if not rows:
            return
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT OR REPLACE INTO step_metrics VALUES (?,?,?,?)", rows)
            db.execute("UPDATE runs SET step=MAX(step, ?), updated_at=? WHERE id=?",
                       (max(r[1] for r in rows), time.time(), run_id))
            db.execute("COMMIT")

    def log_eval(self, run_id: int, step: int, metrics: dict) -> None:
        self._write("INSERT OR REPLACE INTO eval_metrics VALUES (?,?,?)", (run_id, int(step), json.dumps(metrics)))

    def eval_metrics(self, run_id: int, *, after_step: int = -1) -> list[dict]:
        with self._connect() as db:
            rows = db.execute("SELECT step, metrics_json FROM eval_metrics WHERE run_id=? AND step>? ORDER BY step",
                              (run_id, after_step)).fetchall()
        return [dict(json.loads(r["metrics_json"]), step=r["step"]) for r in rows]

    def step_metrics(self, run_id: int) -> list[dict]:
        with self._connect() as db:
            rows = db.execute("SELECT step, train_loss, batch_size FROM step_metrics WHERE run_id=? ORDER BY step",
                              (run_id,)).fetchall()
        return [dict(r) for r in rows]

    # --- artifacts (audit checkpoints, per-sample arrays) -----------------------------
    def put_artifact(self, run_id: int, key: str, value: bytes) -> None:
        self._write("INSERT OR REPLACE INTO artifacts VALUES (?,?,?)", (run_id, key, sqlite3.Binary(value)))

    def get_artifact(self, run_id: int, key: str) -> bytes | None:
        with self._connect() as db:
            row = db.execute("SELECT value FROM artifacts WHERE run_id=? AND key=?", (run_id, key)).fetchone()
        return bytes(row["value"]) if row else None

    def artifact_keys(self, run_id: int) -> list[str]:
        with self._connect() as db:
            rows = db.execute("SELECT key FROM artifacts WHERE run_id=? ORDER BY key", (run_id,)).fetchall()
        return [r["key"] for r in rows]

    # --- recovery ---------------------------------------------------------------------
    def mark_dead_runs(self, is_alive=None) -> list[int]:
        """Runs left 'running' by a process that no longer exists become 'interrupted'."""
        is_alive = is_alive or pid_alive
        dead = []
        for run in self.list_runs(status="running"):
            if not run["pid"] or not is_alive(run["pid"]):
                dead.append(run["id"])
                self.set_status(run["id"], "interrupted",
                                error=f"worker process {run['pid']} ended without finishing the run")
        return dead


def pid_alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited child not yet reaped) is not alive
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _row(row: sqlite3.Row) -> dict:
    d = dict(row)
    for key in ("config_json", "plan_json", "summary_json", "versions_json"):
        value = d.pop(key)
        d[key[:-5]] = json.loads(value) if value else None
    return d
