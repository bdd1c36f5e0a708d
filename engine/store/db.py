"""The run store: one SQLite file (WAL mode) shared by training workers and the UI.

A worker process writes; any number of readers (Streamlit sessions, the CLI) read at the
same time — WAL lets readers see the last committed state without blocking the writer.
Every write is its own short transaction, so a crash loses at most the write in flight,
never a finished run's results.

Failing safely:

* ``RunStore(path, readonly=True)`` opens the file with ``mode=ro`` and writes nothing (no schema,
  no pragma); the read commands (``list``, ``show``, ``export``) and the dashboard's read paths use it.
  A missing store is an error there, never silently created.
* Every SQLite/OS failure (a corrupt, truncated or zeroed file, a read-only file or folder, a directory
  in the store's place, a full disk, a lock held too long) becomes one :class:`StoreError` whose
  message names the file and what to do.
* A run left ``running`` by a worker that no longer exists on this host is *shown* as ``interrupted``
  by a read-only store (nothing written) and *recorded* as such by :meth:`RunStore.mark_dead_runs`,
  which writers call (the dashboard's job manager, ``python -m engine run``). Runs of other hosts are
  left alone; finished runs are never touched. A pid now held by a process younger than the run
  (the pid was reused) counts as gone.
* Terminal status writes (failed / cancelled / interrupted) are retried a few times with a short
  backoff so that the original error survives a transient failure; on a full disk the writer first
  frees the small reserve file it keeps beside the store (``<store>-reserve``, 64 KiB), so that the
  run can still be marked failed. :meth:`RunStore.try_set_status` never raises, so the caller can
  still report the original error.

Jobs of k seeds. A train config with ``seeds = k > 1`` is ONE job (one worker trains the k models
together) stored as k rows (:meth:`RunStore.create_job`): row j holds model j's config (seed = base + j,
seed_index = j), evaluations, steps, plan and summary; every row has ``job_id`` = the id of row 0 (the
*leader*, the only row the job manager starts). Status and pid writes (:meth:`set_status`,
:meth:`set_pid`) apply to every row of the job; :meth:`job_rows` lists them; :meth:`delete_job` deletes
them all. Single runs have ``job_id`` NULL. Stores made before the column existed get it on first
write-open (all their runs are single runs).
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path

from engine.store.errors import StoreError, store_error
from engine.store.liveness import dead_message, pid_alive, this_host, worker_gone

__all__ = ["ACTIVE", "ENDED", "STATUSES", "RunStore", "StoreError", "default_store_path", "pid_alive", "resolve_store_path",
           "worker_gone"]

STATUSES = ("queued", "running", "finished", "diverged", "failed", "cancelled", "interrupted")
# ended by its own code: ``finished`` (its plan trained) or ``diverged`` (its plan trained, or cut short, with a loss
# that went non-finite or stayed far above its start: engine.models.metrics.diverged_step); both keep a summary
ENDED = ("finished", "diverged")
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
    host TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    updated_at REAL,
    step INTEGER NOT NULL DEFAULT 0,
    total_steps INTEGER,
    plan_json TEXT,
    summary_json TEXT,
    versions_json TEXT,
    job_id INTEGER,
    cancel_requested_at REAL,
    cancel_step INTEGER
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


STATUS_RETRY_DELAYS = (0.05, 0.2, 0.5, 1.0)  # seconds between tries of a terminal status write
RESERVE_BYTES = 64 << 10  # disk space a writer keeps next to the store (<store>-reserve) for the last word


def resolve_store_path(path: str | os.PathLike | None = None) -> Path:
    """The store file for ``path`` (a file, or a folder holding ``runs.sqlite``), else the default.
    Touches nothing."""
    p = Path(path) if path is not None else default_store_path()
    if p.suffix == "" and (p.is_dir() or not p.exists()):
        p = p / "runs.sqlite"  # a folder was given
    return p


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
    """The run store at ``path`` (a file or a folder; default :func:`default_store_path`).

    ``readonly=False`` (writers): creates the file, its folder and the schema when missing.
    ``readonly=True`` (readers): the file must exist and be a run store; nothing is ever written.
    Either raises :class:`StoreError` with a one-line message naming the file.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, readonly: bool = False):
        self.path = resolve_store_path(path)
        self.readonly = bool(readonly)
        self._immutable = False  # read-only fallback for a WAL store in a read-only folder (see _open)
        if self.path.is_dir():
            raise StoreError(f"run store {self.path} is a directory, not a store file: remove or rename it, "
                             "or pass another --store", self.path)
        if self.readonly:
            if not self.path.exists():
                raise StoreError(f"no run store at {self.path}: run `privacy-lab run CONFIG` to create one, "
                                 "or point --store / $PRIVACY_LAB_STORE at an existing store", self.path)
            with self._connect() as db:
                has_runs = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='runs'").fetchone()
            if not has_runs:
                raise StoreError(f"{self.path} is not a run store (it has no runs table): pass the right --store, "
                                 "or move the file aside", self.path)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise store_error(self.path, e) from e
        if self.path.exists() and self.path.stat().st_size:  # look (read-only) before writing anything
            self.readonly = True
            try:
                with self._connect() as db:
                    tables = {r["name"] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            finally:
                self.readonly = False
            if tables and "runs" not in tables:  # never add our tables to someone else's database
                raise StoreError(f"{self.path} is an SQLite file but not a run store (no runs table): pass another "
                                 "--store", self.path)
        with self._connect() as db:
            db.executescript(_SCHEMA)
            columns = {r["name"] for r in db.execute("PRAGMA table_info(runs)")}
            if "host" not in columns:  # stores made before the host was recorded
                db.execute("ALTER TABLE runs ADD COLUMN host TEXT")
            if "job_id" not in columns:  # stores made before k-seed jobs: every run is a single run
                db.execute("ALTER TABLE runs ADD COLUMN job_id INTEGER")
            for column, sql_type in (("cancel_requested_at", "REAL"), ("cancel_step", "INTEGER")):
                if column not in columns:  # stores made before Cancel recorded the click (see request_cancel)
                    db.execute(f"ALTER TABLE runs ADD COLUMN {column} {sql_type}")
            db.execute("CREATE INDEX IF NOT EXISTS runs_job ON runs(job_id)")
        self._keep_reserve()

    @classmethod
    def open_readonly(cls, path: str | os.PathLike | None = None) -> "RunStore":
        return cls(path, readonly=True)

    def _open(self) -> sqlite3.Connection:
        if not self.readonly:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
            db.execute("PRAGMA foreign_keys=ON")
            return db
        uri = "file:" + urllib.parse.quote(str(self.path.resolve())) + "?mode=ro"
        if self._immutable:
            uri += "&immutable=1"
        db = sqlite3.connect(uri, uri=True, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        except sqlite3.OperationalError as e:
            # A WAL store in a read-only folder without its -shm file cannot be opened mode=ro; when no
            # -wal file holds uncheckpointed commits, the main file is the whole store: read it immutable.
            wal = Path(str(self.path) + "-wal")
            db.close()
            if self._immutable or "unable to open" not in str(e) or (wal.exists() and wal.stat().st_size > 0):
                raise
            self._immutable = True
            return self._open()
        return db

    @contextmanager
    def _connect(self):
        try:
            db = self._open()
        except (sqlite3.Error, OSError) as e:
            raise store_error(self.path, e) from e
        try:
            yield db
        except sqlite3.Error as e:
            raise store_error(self.path, e) from e
        finally:
            db.close()

    @contextmanager
    def _transaction(self):
        """One short write transaction (BEGIN IMMEDIATE … COMMIT); yields the connection."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                # A signal (e.g. SIGTERM → Cancelled) can land right after COMMIT: only roll back an
                # open transaction, so the original exception is the one that propagates.
                if db.in_transaction:
                    try:
                        db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # closing the connection rolls back as well; keep the original error
                raise

    def _write(self, sql: str, args=()) -> sqlite3.Cursor:
        with self._transaction() as db:
            return db.execute(sql, args)

    # --- runs -------------------------------------------------------------------------
    def create_run(self, config, *, kind: str = "train", group_id: str | None = None,
                   status: str = "queued", name: str | None = None) -> int:
        """Register a run. ``config`` is a RunConfig (or any object with to_json/to_dict) or a dict."""
        return self.create_job([config], kind=kind, group_id=group_id, status=status, name=name)[0]

    def create_job(self, configs, *, kind: str = "train", group_id: str | None = None,
                   status: str = "queued", name: str | None = None) -> list[int]:
        """Register one job as one row per config (a k-seed train job: ``RunConfig.seed_configs()``), in one
        transaction; returns the row ids, the leader (the row a worker runs) first. One config: a single run
        (``job_id`` NULL), exactly :meth:`create_run`."""
        return self.create_jobs([configs], kind=kind, group_id=group_id, status=status, names=[name])

    def create_jobs(self, jobs, *, kind: str = "train", group_id: str | None = None,
                    status: str = "queued", names=None) -> list[int]:
        """Register several jobs (each a list of configs, as for :meth:`create_job`; ``names[k]`` names job
        k's rows) in one transaction, so a reader never sees part of a group (a comparison or a sweep);
        returns every row id, job by job, each leader first."""
        jobs = [[self._row(config, kind, group_id, status, names[k] if names else None) for config in configs]
                for k, configs in enumerate(jobs)]
        if not all(jobs):
            raise ValueError("a job needs at least one config")
        versions, now = json.dumps(package_versions()), time.time()
        sql = ("INSERT INTO runs (kind, name, algorithm, group_id, config_json, status, seed, created_at, updated_at,"
               " versions_json, job_id) VALUES (?,?,?,?,?,?,?,?,?,?,?)")
        ids = []
        if not jobs:
            return ids
        with self._transaction() as db:
            for rows in jobs:
                leader = int(db.execute(sql, rows[0] + (now, now, versions, None)).lastrowid)
                ids.append(leader)
                if len(rows) > 1:
                    db.execute("UPDATE runs SET job_id=? WHERE id=?", (leader, leader))
                    ids += [int(db.execute(sql, r + (now, now, versions, leader)).lastrowid) for r in rows[1:]]
        return ids

    @staticmethod
    def _row(config, kind, group_id, status, name):
        """The ``runs`` columns one config fills (its canonical JSON and the fields listed beside it)."""
        if hasattr(config, "to_json"):
            config_json, cfg = config.to_json(), config.to_dict()
        else:
            cfg = dict(config)
            config_json = json.dumps(cfg, sort_keys=True, separators=(",", ":"))
        algorithm = (cfg.get("algorithm") or {}).get("name", "") if isinstance(cfg.get("algorithm"), dict) else ""
        label = name if name is not None else (cfg.get("name") or "")
        return (kind, label, algorithm, group_id, config_json, status, cfg.get("seed"))

    _JOB = "(id=? OR (job_id IS NOT NULL AND job_id=(SELECT job_id FROM runs WHERE id=?)))"  # every row of run ?'s job

    def job_rows(self, run_id: int) -> list[int]:
        """The row ids of ``run_id``'s job, leader (seed_index 0) first: [run_id] for a single run, [] if
        there is no such run."""
        with self._connect() as db:
            rows = db.execute(f"SELECT id FROM runs WHERE {self._JOB} ORDER BY id", (run_id, run_id)).fetchall()
        return [int(r["id"]) for r in rows]

    def leader_of(self, run_id: int) -> int:
        """The row that stands for ``run_id``'s job (its worker, cancel, queue position): the job's first row."""
        rows = self.job_rows(run_id)
        return rows[0] if rows else run_id

    def start_run(self, run_id: int, *, pid: int, total_steps: int | None = None, plan: dict | None = None) -> None:
        """The run is running in process ``pid`` of this host (recorded, so a dead worker is noticed)."""
        self._write(
            "UPDATE runs SET status='running', pid=?, host=?, started_at=?, updated_at=?, total_steps=?,"
            " plan_json=?, error=NULL, cancel_requested_at=NULL, cancel_step=NULL WHERE id=?",
            (pid, this_host(), time.time(), time.time(), total_steps,
             json.dumps(plan) if plan is not None else None, run_id),
        )

    def set_pid(self, run_id: int, pid: int | None) -> None:
        """The worker process of ``run_id`` — and of every other row of its job."""
        self._write(f"UPDATE runs SET pid=?, host=?, updated_at=? WHERE {self._JOB}",
                    (pid, this_host() if pid else None, time.time(), run_id, run_id))

    def set_status(self, run_id: int, status: str, error: str | None = None) -> None:
        """Set a run's status (and error text) — and that of every other row of its job (a k-seed job runs,
        ends, is cancelled or fails as one). A terminal status (failed, cancelled, interrupted) is retried a
        few times with a short backoff before the :class:`StoreError` is raised."""
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        done = None if status in ACTIVE else time.time()
        args = (status, error, done, time.time(), run_id, run_id)
        sql = ("UPDATE runs SET status=?, error=COALESCE(?, error), finished_at=COALESCE(?, finished_at),"
               f" updated_at=? WHERE {self._JOB}")
        if status in ACTIVE or status in ENDED:
            self._write(sql, args)
            return
        for delay in STATUS_RETRY_DELAYS:
            try:
                self._write(sql, args)
                return
            except StoreError as e:
                if "locked" in str(e):  # the connection already waited 30 s for the lock
                    raise
                time.sleep(delay)
                self._free_wal()
        self._write(sql, args)

    def try_set_status(self, run_id: int, status: str, error: str | None = None) -> bool:
        """:meth:`set_status` (with its retries) that never raises a :class:`StoreError`: for recording
        why a run ended while another error is propagating. False when even the retries failed."""
        try:
            self.set_status(run_id, status, error=error)
            return True
        except StoreError:
            return False

    @property
    def _reserve(self) -> Path:
        return self.path.with_name(self.path.name + "-reserve")

    def _keep_reserve(self) -> None:
        try:
            if not self._reserve.exists():
                with open(self._reserve, "wb") as f:
                    f.write(bytes(RESERVE_BYTES))
        except OSError:  # best effort (a full or read-only disk)
            try:
                self._reserve.unlink()
            except OSError:
                pass

    def _free_wal(self) -> None:
        """On a full disk: give back the reserve, then move the WAL into the main file and truncate it,
        which frees the few pages a status update needs. Best effort."""
        if self.readonly:
            return
        try:
            self._reserve.unlink()
            return
        except OSError:
            pass
        try:
            with self._connect() as db:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except StoreError:
            pass

    def finish_run(self, run_id: int, summary: dict) -> None:
        self._write("UPDATE runs SET status='finished', summary_json=?, finished_at=?, updated_at=? WHERE id=?",
                    (json.dumps(summary), time.time(), time.time(), run_id))

    def finish_runs(self, summaries: dict, statuses: dict | None = None) -> None:
        """Finish several rows at once ({run_id: summary}, e.g. the k rows of a job) in one transaction, each as
        ``statuses[run_id]`` (one of :data:`ENDED`; default ``finished``): one model of a job may diverge while
        the others train."""
        now = time.time()
        statuses = statuses or {}
        if any(v not in ENDED for v in statuses.values()):
            raise ValueError(f"a run ends as one of {', '.join(ENDED)}, not {sorted(set(statuses.values()))}")
        with self._transaction() as db:
            db.executemany("UPDATE runs SET status=?, summary_json=?, finished_at=?, updated_at=? WHERE id=?",
                           [(statuses.get(rid, "finished"), json.dumps(s), now, now, int(rid))
                            for rid, s in summaries.items()])

    def set_summary(self, run_id: int, summary: dict) -> None:
        self._write("UPDATE runs SET summary_json=?, updated_at=? WHERE id=?", (json.dumps(summary), time.time(), run_id))

    def update_progress(self, run_id: int, step: int) -> None:
        self._write("UPDATE runs SET step=?, updated_at=? WHERE id=?", (step, time.time(), run_id))

    def request_cancel(self, run_id: int, step: int | None = None) -> int:
        """Record a Cancel of ``run_id``'s job at once (every row; the first request wins): when it was asked
        and the step it was asked at — ``step``, the step the user saw when they clicked, else the row's stored
        step. The pages say "cancelling…" from it; :meth:`cut_at_cancel` later drops what was trained after it.
        Returns the step recorded."""
        with self._transaction() as db:
            row = db.execute("SELECT step, cancel_step FROM runs WHERE id=?", (run_id,)).fetchone()
            if row is None:
                return 0
            if row["cancel_step"] is not None:
                return int(row["cancel_step"])
            at = int(row["step"] if step is None else min(int(step), int(row["step"])))
            db.execute(f"UPDATE runs SET cancel_requested_at=?, cancel_step=?, updated_at=? WHERE {self._JOB}",
                       (time.time(), at, time.time(), run_id, run_id))
        return at

    def cut_at_cancel(self, run_id: int) -> int | None:
        """A cancelled job keeps what it logged up to its Cancel's step, nothing after (steps a worker trained
        while the request reached it are not counted: not drawn, not compared; an audit's checkpoints, artifacts,
        are what it resumes from and stay). Every row; returns the step, None when no Cancel was recorded. Call it
        once the worker is gone."""
        with self._transaction() as db:
            row = db.execute("SELECT cancel_step FROM runs WHERE id=?", (run_id,)).fetchone()
            if row is None or row["cancel_step"] is None:
                return None
            at = int(row["cancel_step"])
            ids = [int(r["id"]) for r in db.execute(f"SELECT id FROM runs WHERE {self._JOB}", (run_id, run_id))]
            marks = ",".join("?" * len(ids))
            db.execute(f"DELETE FROM step_metrics WHERE run_id IN ({marks}) AND step>?", (*ids, at))
            db.execute(f"DELETE FROM eval_metrics WHERE run_id IN ({marks}) AND step>?", (*ids, at))
            db.execute(f"UPDATE runs SET step=MIN(step, ?) WHERE id IN ({marks})", (at, *ids))
        return at

    def delete_run(self, run_id: int) -> None:
        """Delete this one row (:meth:`delete_job` deletes all rows of its job)."""
        self._write("DELETE FROM runs WHERE id=?", (run_id,))

    def delete_job(self, run_id: int) -> list[int]:
        """Delete every row of ``run_id``'s job (one row for a single run); returns the ids deleted."""
        ids = self.job_rows(run_id)
        if ids:
            self._write(f"DELETE FROM runs WHERE id IN ({','.join('?' * len(ids))})", ids)
        return ids

    def get_run(self, run_id: int) -> dict | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        return self._view(_row(row)) if row else None

    def list_runs(self, *, kind: str | None = None, group_id: str | None = None,
                  status: str | None = None) -> list[dict]:
        sql, args = "SELECT * FROM runs WHERE 1=1", []
        for col, val in (("kind", kind), ("group_id", group_id), ("status", status)):
            if val is not None:
                sql += f" AND {col}=?"
                args.append(val)
        with self._connect() as db:
            rows = db.execute(sql + " ORDER BY id DESC", args).fetchall()
        runs = [self._view(_row(r)) for r in rows]
        return runs if status is None else [r for r in runs if r["status"] == status]

    def _view(self, run: dict) -> dict:
        """A read-only store cannot record a dead worker: it shows the run as interrupted instead."""
        if self.readonly and worker_gone(run):
            run.update(status="interrupted", error=dead_message(run) + " (not yet recorded in the store)")
        return run

    # --- metrics ----------------------------------------------------------------------
    def log_steps(self, run_id: int, rows) -> None:
        """rows: iterable of (step, train_loss, batch_size)."""
        rows = [(run_id, int(s), float(l) if l is not None else None, int(b)) for s, l, b in rows]
        if not rows:
            return
        with self._transaction() as db:
            db.executemany("INSERT OR REPLACE INTO step_metrics VALUES (?,?,?,?)", rows)
            db.execute("UPDATE runs SET step=MAX(step, ?), updated_at=? WHERE id=?",
                       (max(r[1] for r in rows), time.time(), run_id))

    def log_progress(self, steps: dict, evals: dict | None = None) -> None:
        """Steps and evaluations of several rows in one transaction (a k-seed job's rows appear together):
        ``steps`` {run_id: [(step, train_loss, batch_size), ...]}, ``evals`` {run_id: (step, metrics)}."""
        rows = [(int(rid), int(s), float(l) if l is not None else None, int(b))
                for rid, entries in steps.items() for s, l, b in entries]
        evals = evals or {}
        if not rows and not evals:
            return
        last = {}
        for rid, s, _, _ in rows:
            last[rid] = max(s, last.get(rid, s))
        now = time.time()
        with self._transaction() as db:
            db.executemany("INSERT OR REPLACE INTO step_metrics VALUES (?,?,?,?)", rows)
            db.executemany("INSERT OR REPLACE INTO eval_metrics VALUES (?,?,?)",
                           [(int(rid), int(step), json.dumps(m)) for rid, (step, m) in evals.items()])
            db.executemany("UPDATE runs SET step=MAX(step, ?), updated_at=? WHERE id=?",
                           [(s, now, rid) for rid, s in last.items()])

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
        """Runs left 'running' by a process of this host that no longer exists become 'interrupted'
        (only while still 'running': a run that finished meanwhile is never touched)."""
        dead = []
        for run in self.list_runs(status="running"):
            if worker_gone(run, is_alive):
                cur = self._write("UPDATE runs SET status='interrupted', error=?, finished_at=?, updated_at=?"
                                  " WHERE id=? AND status='running'",
                                  (dead_message(run), time.time(), time.time(), run["id"]))
                if cur.rowcount:
                    dead.append(run["id"])
        return dead


def _row(row: sqlite3.Row) -> dict:
    d = dict(row)
    d.setdefault("job_id", None)  # a store made before k-seed jobs, opened read-only
    for key in ("config_json", "plan_json", "summary_json", "versions_json"):
        value = d.pop(key)
        d[key[:-5]] = json.loads(value) if value else None
    cfg = d["config"] if isinstance(d["config"], dict) else {}
    d["seeds"], d["seed_index"] = cfg.get("seeds", 1), cfg.get("seed_index", 0)  # row j of a k-seed job
    return d
