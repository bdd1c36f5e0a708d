"""Background job manager: every run is a separate worker process; the run store is the truth.

The dashboard (and anything else) submits runs with :meth:`JobManager.submit`; they go into the
store as ``queued`` with a ``group_id`` (one comparison = one group). A scheduler thread then

* starts queued runs while fewer than ``max_workers`` runs are ``running`` in the store
  (default ``max(2, cores - 1)``), oldest first;
* reaps its own worker processes: a worker that exits while its run is still active is marked
  ``interrupted`` (killed by a signal, e.g. ``kill -9`` or the OOM killer) or ``failed`` (non-zero
  exit) with the reason, and the last lines of its log;
* calls :meth:`RunStore.mark_dead_runs` at start-up and every few seconds, so runs left
  ``running`` by a process that no longer exists (a crash of a previous app) become ``interrupted``.

A worker is ``python -m engine --store STORE worker RUN_ID --threads 1`` (``engine.jobs.worker``), started
with :class:`subprocess.Popen` — never a multiprocessing child, which would re-import the
Streamlit script. To keep the click → first live point latency low (a cold worker spends ~3 s
importing torch and ~1 s planning), the manager keeps one *standby* process per worker slot (at
most ``MAX_STANDBYS``; ``python -m engine.jobs.standby``, ``PRIVACY_LAB_PREWARM=0`` turns them off) that has already
imported the engine and waits on its stdin, so that every run of a comparison that starts at the
click starts warm. :meth:`JobManager.hint` lets the UI tell them the configs the user is looking at;
standby i prepares config i ahead of time (data, tiers, privacy plan, model — what
``engine.train.loop.prepare`` returns, which is deterministic). On launch a run goes to the standby
prepared for its config (else any ready one), which runs exactly the worker's code (``engine.jobs.worker``),
using the prepared state if the run's config is the hinted one. If no standby is ready the cold
command above is used. A standby exits when its stdin closes, i.e. when the manager's process goes
away; fresh ones are started a few seconds after each launch once no run trains (or while runs wait in the
queue, for the next wave): importing torch beside a training run slows it down.

Cancel (:meth:`JobManager.cancel`) first records the request and the step it was asked at in the store
(``RunStore.request_cancel``: the pages say "cancelling…" from it at once), then sends SIGTERM to the worker
(its training loop stops at the next step boundary; the run ends ``cancelled``), escalates to SIGKILL after a
grace period (the scheduler does, for a cancel that does not wait), and marks a queued run ``cancelled``
directly. Once the worker is gone the run keeps what it logged up to the recorded step, nothing trained after
the click (``RunStore.cut_at_cancel``). Nothing here calls Streamlit: the UI polls the store.

Only queued runs that carry a ``group_id`` are picked up: ``python -m engine run`` creates its own
run (no group) and trains it in-process, so the scheduler must not start it a second time.

A train config with ``seeds = k > 1`` is one job of k rows (``RunStore.create_job``): only its leader
(row 0) is started — by one worker that trains the k models together — and it counts as one running
worker. The replicas (rows 1..k-1) are never started on their own. Cancel of any row stops the job;
status and pid changes reach every row (the store writes them job-wide); :meth:`JobManager.delete`
deletes the whole job (all k rows: the seeds of one job are one experiment, and a worker still writing
into a row must never lose it under its feet).
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
import weakref
from pathlib import Path

from engine.jobs.estimates import busy_elsewhere, run_time_estimate, start_seconds
from engine.jobs.kinds import job_kind
from engine.store.db import ACTIVE, ENDED, RunStore
from engine.store.lifecycle import CANCELLED_BEFORE_START, CANCELLED_BY_USER
from engine.store.liveness import pid_alive

DEAD_CHECK_SECONDS = 3.0
TICK_SECONDS = 0.2
MAX_STANDBYS = 3  # pre-imported workers kept at most (each holds torch and a prepared run: ~0.4–0.6 GB)
STANDBY_DELAY_SECONDS = 2.0  # after a launch, let the new worker start before warming the next standby (for a queued run)
CANCEL_GRACE_SECONDS = 3.0

_MANAGERS: "weakref.WeakSet[JobManager]" = weakref.WeakSet()


def default_max_workers() -> int:
    """One-thread workers at once: one core left to the dashboard, but never fewer than two, so that a
    comparison's two runs (the default IDP-SGD vs INO-SGD) train side by side on a 2-core machine —
    run one after the other, INO-SGD would start only after IDP-SGD's whole run."""
    return max(2, (os.cpu_count() or 1) - 1)


def new_group_id(prefix: str = "cmp") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def standby_command(store_path: str | os.PathLike, threads: int = 1, ready: str | os.PathLike | None = None) -> list[str]:
    """The command line of a standby for the run store at ``store_path`` (``ready``: the file it creates once
    warm)."""
    return [sys.executable, "-m", "engine.jobs.standby", "--store", str(store_path), "--threads", str(threads)] + \
        (["--ready", str(ready)] if ready else [])


def worker_command(store_path: str | os.PathLike, run_id: int, threads: int = 1) -> list[str]:
    """The cold worker command line (also what "copy as CLI command" shows for a queued run)."""
    return [sys.executable, "-m", "engine", "--store", str(store_path), "worker", str(run_id), "--threads", str(threads)]


# Workers run at this niceness (or nicer): on a 2-core machine the app server and the browser then get the
# CPU first, so the live view keeps refreshing while the runs train (the runs lose little: they wait only
# while the UI works).
WORKER_NICENESS = 10


def lower_priority(pid: int, niceness: int = WORKER_NICENESS) -> None:
    """Set the niceness of process ``pid`` to at least ``niceness`` (idempotent; best effort where not
    supported). :func:`_spawn` does it for every worker and standby the manager starts."""
    try:
        if os.getpriority(os.PRIO_PROCESS, pid) < niceness:
            os.setpriority(os.PRIO_PROCESS, pid, niceness)
    except (AttributeError, OSError):
        pass


def _spawn(cmd: list[str], **popen) -> subprocess.Popen:
    """A worker or standby process, started at WORKER_NICENESS."""
    proc = subprocess.Popen(cmd, cwd=_repo_root(), env=_child_env(), start_new_session=True, **popen)
    lower_priority(proc.pid)
    return proc


def _config_json(run: dict) -> str | None:
    """A run row's config as the canonical JSON the standby hints use (None if it cannot be read, or its kind
    has nothing a standby prepares)."""
    try:
        kind = job_kind(run["kind"])
        return kind.parse(run["config"]).to_json() if kind.standby_prepare is not None else None
    except Exception:  # noqa: BLE001 - only picks the best standby; the worker reports real errors
        return None


def _repo_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def _child_env() -> dict:
    env = dict(os.environ)
    root = _repo_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _exit_reason(pid: int, rc: int, log_tail: str) -> tuple[str, str]:
    """(status, error) for a worker that exited while its run was still active."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return "interrupted", f"worker process {pid} was killed by {name}"
    msg = f"worker process {pid} exited with code {rc} without finishing the run"
    if log_tail:
        msg += f": {log_tail}"
    return ("failed" if rc else "interrupted"), msg


def _tail(path: Path, lines: int = 1, limit: int = 400) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    rows = [r.strip() for r in text.splitlines() if r.strip()]
    return " | ".join(rows[-lines:])[-limit:]


class JobManager:
    """Queue, start, watch and cancel worker processes for one run store."""

    def __init__(self, store_path: str | os.PathLike | None = None, *, max_workers: int | None = None,
                 prewarm: bool | None = None, threads: int = 1, autostart: bool = True):
        self.store = RunStore(store_path)
        self.store_path = str(self.store.path)
        self.max_workers = int(max_workers) if max_workers else default_max_workers()
        if prewarm is None:
            prewarm = os.environ.get("PRIVACY_LAB_PREWARM", "1") not in ("0", "false", "no")
        self.prewarm = bool(prewarm)
        self.threads = int(threads)
        self.log_dir = Path(self.store_path).parent / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._lock_path = Path(self.store_path + ".jobs.lock")
        self._procs: dict[int, subprocess.Popen] = {}
        self._cancelling: dict[int, tuple] = {}  # run id → (worker pid, when to SIGKILL it) of a cancel under way
        self._standbys: list[subprocess.Popen] = []  # pre-imported workers, at most one per worker slot
        self._hints: tuple[str, ...] = ()  # the configs (canonical JSON) the UI expects next
        self._hinted: list[str | None] = []  # what each standby has been told to prepare
        self._mutex = threading.RLock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._last_dead_check = 0.0
        self._last_launch = 0.0
        self._thread: threading.Thread | None = None
        self.recovered = self.store.mark_dead_runs()  # start-up: runs left 'running' by a dead process
        self._last_dead_check = time.time()
        _MANAGERS.add(self)
        if autostart:
            self.start()

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="privacy-lab-jobs", daemon=True)
        self._thread.start()

    def shutdown(self, *, cancel_running: bool = False, timeout: float = 5.0) -> None:
        """Stop the scheduler and the standby. Running workers keep running unless cancel_running."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with self._mutex:
            if cancel_running:
                for run_id in list(self._procs):
                    self.cancel(run_id, wait=True)
            self._kill_standbys()
            self._reap()  # record the exit of workers that already ended (no zombies left behind)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown(cancel_running=True)

    def kick(self) -> None:
        """Schedule now instead of at the next tick."""
        self._wake.set()

    # --- submitting -------------------------------------------------------------------------
    def submit(self, configs, *, group_id: str | None = None, kind: str = "train", names=None) -> list[int]:
        """Queue one run per config (RunConfig / AuditConfig or its dict) of a registered ``kind`` under one
        group; returns the run ids — k of them, in seed order, for a train config with ``seeds = k`` (one job:
        one worker, one row per seed; ``names[k]`` names every row of config k). An unknown kind or an
        invalid ``seeds`` raises ConfigError before anything is queued."""
        job = job_kind(kind)
        group_id = group_id or new_group_id(job.group_prefix)
        jobs = [job.rows(cfg) for cfg in configs]
        ids = self.store.create_jobs(jobs, kind=kind, group_id=group_id, status="queued", names=names)
        self.kick()
        return ids

    # --- cancel / delete -----------------------------------------------------------------------
    def cancel(self, run_id: int, *, wait: bool = True, grace: float = CANCEL_GRACE_SECONDS,
               step: int | None = None) -> str:
        """Stop a run: a queued one is marked cancelled; a running one has its request recorded at once (at
        ``step``, the step the user saw when they clicked, else the stored one), then its worker gets SIGTERM
        (SIGKILL after ``grace`` seconds). ``wait=False`` returns at once (the scheduler finishes the cancel).

        Returns the run's status afterwards. Metrics logged up to the recorded step are kept.
        """
        with self._mutex:
            run = self.store.get_run(run_id)
            if run is None:
                raise KeyError(f"no run {run_id}")
            if run["job_id"] is not None and run["job_id"] != run_id:  # a replica: stop its job's worker
                run_id = run["job_id"]
                run = self.store.get_run(run_id) or run
            if run["status"] not in ACTIVE:
                return run["status"]
            proc = self._procs.get(run_id)
            pid = proc.pid if proc is not None else run["pid"]
            if run["status"] == "queued" and not pid:
                self.store.set_status(run_id, "cancelled", error=CANCELLED_BEFORE_START)
                return "cancelled"
            self.store.request_cancel(run_id, step)
            self._cancelling[run_id] = (pid, time.time() + grace)
        if pid:
            try:
                os.kill(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass
        if wait:
            deadline = time.time() + grace
            while time.time() < deadline and self._alive(run_id, pid):
                time.sleep(0.05)
            if self._alive(run_id, pid):
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
                deadline = time.time() + 2.0
                while time.time() < deadline and self._alive(run_id, pid):
                    time.sleep(0.05)
            self._finish_cancel(run_id)
        else:
            self.kick()
        return self.store.get_run(run_id)["status"]

    def _alive(self, run_id: int, pid) -> bool:
        proc = self._procs.get(run_id)
        if proc is not None:
            return proc.poll() is None
        return bool(pid) and pid_alive(int(pid))

    def _finish_cancel(self, run_id: int) -> None:
        """The worker of a cancelled run is gone: the run ends cancelled at its recorded step, nothing after it."""
        with self._mutex:
            run = self.store.get_run(run_id)
            at = run["cancel_step"] if run is not None and run.get("cancel_step") is not None else \
                run["step"] if run is not None else 0
            if run is not None and run["status"] in ("queued", "running", "cancelled"):
                # (cancelled: the worker stopped itself at the signal, "terminated by signal at step N" with N its
                # own last step: the row says the click's step, what is kept, and where the worker stopped)
                stopped = re.search(r"at step (\d+)", run["error"] or "") if run["status"] == "cancelled" else None
                after = f" (its worker stopped at step {stopped.group(1)})" if stopped and \
                    int(stopped.group(1)) != at else ""
                self.store.set_status(run_id, "cancelled", error=f"{CANCELLED_BY_USER} at step {at}{after}")
            elif run is not None and run["status"] in ("failed", "interrupted"):
                # the worker raised while it was being stopped (e.g. the signal landed inside a store
                # write), or died of the signal before its handler was set (and another manager reaped
                # it): the user asked for a cancel, so that is what the run is
                self.store.set_status(run_id, "cancelled", error=f"{CANCELLED_BY_USER} at step {at} "
                                                                f"(the worker reported: {run['error']})")
            if run is not None and run["status"] not in ENDED:  # (a run that finished before the signal keeps it all)
                self.store.cut_at_cancel(run_id)
            proc = self._procs.pop(run_id, None)
            if proc is not None:
                proc.poll()
            self._cancelling.pop(run_id, None)

    def _watch_cancels(self) -> None:
        """Cancels that did not wait: SIGKILL a worker still alive after its grace period; finish the cancel of a
        worker this manager does not own once it is gone (its own are finished by :meth:`_reap`)."""
        now = time.time()
        for run_id, (pid, deadline) in list(self._cancelling.items()):
            if run_id in self._procs and self._procs[run_id].poll() is not None:
                continue  # exited: _reap finishes it
            if not self._alive(run_id, pid):
                self._finish_cancel(run_id)
            elif now > deadline:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, TypeError, ValueError):
                    pass

    def resume(self, run_id: int) -> None:
        """Queue an ended run again (e.g. a cancelled audit that resumes from its checkpoints); a row of a
        k-seed job queues the whole job."""
        run_id = self.store.leader_of(run_id)
        run = self.store.get_run(run_id)
        if run is None:
            raise KeyError(f"no run {run_id}")
        if run["status"] in ACTIVE:
            return
        if not run["group_id"]:
            raise ValueError(f"run {run_id} has no group: it belongs to the process that created it")
        self.store.set_pid(run_id, None)
        self.store.set_status(run_id, "queued")
        self.kick()

    def delete(self, run_id: int) -> list[int]:
        """Delete a run (cancelling it first if it is active) — for a row of a k-seed job, all k rows of
        the job. Returns the ids deleted."""
        run = self.store.get_run(run_id)
        if run is not None and run["status"] in ACTIVE:
            self.cancel(run_id, wait=True)
        deleted = self.store.delete_job(run_id)
        for rid in deleted or [run_id]:
            try:
                (self.log_dir / f"run-{rid}.log").unlink()
            except OSError:
                pass
        return deleted

    def log_path(self, run_id: int) -> Path:
        return self.log_dir / f"run-{run_id}.log"

    # --- scheduling -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the scheduler must survive a locked/broken store
                pass
            self._wake.wait(TICK_SECONDS)
            self._wake.clear()

    def tick(self) -> None:
        """One scheduling round (also callable directly, e.g. from tests)."""
        with self._mutex, self._file_lock() as locked:
            self._reap()
            self._watch_cancels()
            if time.time() - self._last_dead_check > DEAD_CHECK_SECONDS:
                self._last_dead_check = time.time()
                own = {p.pid for p in self._procs.values()}  # our own children: _reap() knows the exact reason
                self.store.mark_dead_runs(is_alive=lambda pid: int(pid) in own or pid_alive(int(pid)))
            if not locked:
                return
            running = len([r for r in self.store.list_runs(status="running") if _is_leader(r)])  # workers, not rows
            queued = [r for r in reversed(self.store.list_runs(status="queued"))
                      if r["group_id"] and not r["pid"] and _is_leader(r)]
            while queued and running < self.max_workers and not self._stop.is_set():
                self._launch(queued.pop(0))
                running += 1
            # Standbys warm while nothing trains, or while runs wait in the queue (they are that wave's start).
            # Beside runs with nothing queued they would only compete with them: measured on 2 cores, two standbys
            # importing torch made the runs they overlapped train 3x slower (2.2 s instead of 0.75 s), and the
            # store's per-sample rate, hence the next launch's estimate, 3x too high.
            if self.prewarm and not self._stop.is_set() and time.time() - self._last_launch > STANDBY_DELAY_SECONDS \
                    and (queued or running == 0):
                # the queued runs next in line are prepared first (then what the UI hints)
                self._ensure_standbys(tuple(_config_json(r) for r in queued[: self._pool_size()]))

    class _Lock:
        def __init__(self, path: Path):
            self.path, self.fd = path, None

        def __enter__(self):
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError:
                if self.fd is not None:
                    os.close(self.fd)
                    self.fd = None
                return False

        def __exit__(self, *exc):
            if self.fd is not None:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)

    def _file_lock(self):
        """Cross-process lock so two apps on one store never start the same queued run twice."""
        return self._Lock(self._lock_path)

    def _reap(self) -> None:
        for run_id, proc in list(self._procs.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del self._procs[run_id]
            if run_id in self._cancelling:
                self._finish_cancel(run_id)
                continue
            run = self.store.get_run(run_id)
            if run is not None and run["status"] in ACTIVE:
                status, error = _exit_reason(proc.pid, rc, _tail(self.log_path(run_id)))
                self.store.set_status(run_id, status, error=error)

    def _launch(self, run: dict) -> None:
        # The run (its row, as the tick read it) is claimed (pid first, then status, so mark_dead_runs never
        # sees 'running' without a pid) before the worker can touch it: a worker that fails at once then
        # has the last word.
        run_id = run["id"]
        proc = self._take_standby(_config_json(run))
        if proc is not None:
            self._claim(run_id, proc.pid)
            try:
                proc.stdin.write(f"run {run_id} {self.log_path(run_id)}\n".encode())
                proc.stdin.flush()
                proc.stdin.close()
            except (BrokenPipeError, OSError, ValueError):  # the standby died: fall back to a cold start
                proc.kill()
                proc = None
        if proc is None:
            with open(self.log_path(run_id), "ab") as log:
                proc = _spawn(worker_command(self.store_path, run_id, self.threads), stdin=subprocess.DEVNULL,
                              stdout=log, stderr=subprocess.STDOUT)
            self._claim(run_id, proc.pid)
        self._procs[run_id] = proc
        self._last_launch = time.time()

    def _claim(self, run_id: int, pid: int) -> None:
        self.store.set_pid(run_id, pid)
        self.store.set_status(run_id, "running")

    # --- standbys (pre-imported workers) ---------------------------------------------------------
    def _take_standby(self, config_json: str | None = None):
        """A ready standby, preferably the one that prepared ``config_json``; None if none is alive."""
        alive = [i for i, p in enumerate(self._standbys) if p.poll() is None]
        if not alive:
            self._standbys, self._hinted = [], []
            return None
        pick = next((i for i in alive if config_json is not None and self._hinted[i] == config_json), alive[0])
        proc = self._standbys.pop(pick)
        self._hinted.pop(pick)
        _forget_ready(proc)
        return proc

    def _ensure_standbys(self, queued_next: tuple = ()) -> None:
        """One live standby per worker slot; each hinted with a config no other standby prepares: the
        configs of ``queued_next`` (the queued runs next in line) first, then the UI's hints."""
        targets = tuple(dict.fromkeys(h for h in (*queued_next, *self._hints) if h))[: self._pool_size()]
        for i in reversed(range(len(self._standbys))):  # drop the dead
            if self._standbys[i].poll() is not None:
                _forget_ready(self._standbys[i])
                del self._standbys[i], self._hinted[i]
        while len(self._standbys) < self._pool_size():
            ready = self.log_dir / f"standby-{uuid.uuid4().hex[:12]}.ready"
            with open(self.log_dir / "standby.log", "ab") as err:
                proc = _spawn(standby_command(self.store_path, self.threads, ready), stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=err)
            proc.ready_path = ready
            self._standbys.append(proc)
            self._hinted.append(None)
        wanted = [h for h in targets if h not in self._hinted]
        for i, proc in enumerate(list(self._standbys)):
            if self._hinted[i] in targets or not wanted:
                continue
            text = wanted.pop(0)
            try:
                proc.stdin.write(b"hint " + text.encode("utf-8") + b"\n")
                proc.stdin.flush()
                self._hinted[i] = text
            except (BrokenPipeError, OSError, ValueError):
                self._close_standbys([proc])

    def _pool_size(self) -> int:
        """Standbys to keep: one per worker slot, at most MAX_STANDBYS."""
        return min(self.max_workers, MAX_STANDBYS)

    def hint(self, configs) -> None:
        """Tell the standbys which run configs are likely next (e.g. the form on the Train page).

        Standby i prepares config i ahead of time (data, tiers, privacy plan, model), so a launch of
        exactly that config skips the preparation. Purely a speed-up: nothing is queued or stored.
        """
        texts = []
        for cfg in list(configs)[: self._pool_size()]:
            texts.append(cfg.to_json() if hasattr(cfg, "to_json") else json.dumps(cfg, sort_keys=True,
                                                                                 separators=(",", ":")))
        with self._mutex:
            self._hints = tuple(texts)
        self.kick()

    def _kill_standbys(self) -> None:
        procs, self._standbys, self._hinted = self._standbys, [], []
        self._close_standbys(procs)

    def standbys_ready(self) -> int:
        """How many standbys are alive and warm (imported, warmed up): a run handed to one starts in a fraction of
        a second; one still importing keeps its run waiting nearly a cold start."""
        with self._mutex:
            return sum(1 for p in self._standbys if p.poll() is None and _is_ready(p))

    def run_time_estimate(self, jobs, kind: str = "train") -> tuple[float, str] | None:
        """:func:`engine.jobs.estimates.run_time_estimate` for ``jobs`` launched now: this store's history, this
        manager's workers, and whether the first wave finds warm standbys (later ones do when it prewarms)."""
        history = self.store.list_runs(kind=kind)
        # the lab's own busy workers (one per job, not per seed row) are in the load average: not "others"
        running = len([r for r in self.store.list_runs(status="running") if _is_leader(r)])
        return run_time_estimate(jobs, history, self.max_workers, ready_standbys=self.standbys_ready(),
                                 prewarm=self.prewarm, others=busy_elsewhere(running))

    def start_estimate(self, kind: str) -> tuple[float, bool]:
        """(seconds from Launch to the first step of a ``kind`` job launched now, measured?): warm when a standby
        is ready (:func:`engine.jobs.estimates.start_seconds`)."""
        return start_seconds(self.store.list_runs(kind=kind), warm=self.standbys_ready() > 0)

    @staticmethod
    def _close_standbys(procs, grace: float = 1.0) -> None:
        """End standbys that hold no run: all at once, within one ``grace`` period (not one per standby). A
        standby reads its stdin only once warm, so one still warming up would see the EOF only after its
        imports; it has touched nothing yet (no run, no store, no file but its log), so it is killed at once.
        A warm one gets the EOF and exits by itself (killed if it has not within ``grace``)."""
        waiting = []
        for proc in procs:
            warm = _is_ready(proc)
            _forget_ready(proc)
            try:
                proc.stdin.close()  # EOF: a warm standby exits by itself
            except OSError:
                pass
            if warm:
                waiting.append(proc)
            elif proc.poll() is None:
                proc.kill()
        deadline = time.monotonic() + grace
        for proc in waiting:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        for proc in procs:
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                pass

    # --- queries for the UI ----------------------------------------------------------------------------
    def active_runs(self) -> list[dict]:
        return [r for r in self.store.list_runs() if r["status"] in ACTIVE]

    def queue_position(self, run_id: int) -> int | None:
        """1 for the next job to start; a replica row has its job's position (:func:`queue_positions`)."""
        return queue_positions(self.store.list_runs(status="queued")).get(run_id)

    def owns(self, run_id: int) -> bool:
        return self.store.leader_of(run_id) in self._procs


def queue_positions(runs: list[dict]) -> dict[int, int]:
    """Run id → 1-based place in the queue, from one ``list_runs`` read: queued jobs in the order the
    scheduler starts them (oldest leader first); every row of a k-seed job has its job's place."""
    leaders = sorted(r["id"] for r in runs if r["status"] == "queued" and _is_leader(r))
    place = {rid: i + 1 for i, rid in enumerate(leaders)}
    return {r["id"]: place[lead] for r in runs if r["status"] == "queued"
            and (lead := r["job_id"] if r.get("job_id") is not None else r["id"]) in place}


def _is_ready(proc) -> bool:
    path = getattr(proc, "ready_path", None)
    return path is not None and path.exists()


def _forget_ready(proc) -> None:
    """A standby taken for a run or closed is no longer a ready one: its marker goes."""
    path = getattr(proc, "ready_path", None)
    if path is not None:
        try:
            path.unlink()
        except OSError:
            pass


def _is_leader(run: dict) -> bool:
    """A row a worker runs: a single run, or row 0 of a k-seed job (its replicas are never started)."""
    return run.get("job_id") is None or run["job_id"] == run["id"]


def shutdown_all(*, cancel_running: bool = False) -> None:
    for m in list(_MANAGERS):
        try:
            m.shutdown(cancel_running=cancel_running)
        except Exception:  # noqa: BLE001
            pass


atexit.register(shutdown_all)
