"""One run's store lifecycle, the bottom of the orchestration (every job kind runs inside exactly one).

    store_lifecycle(store, id)   start → finished / cancelled / failed with the message; yields a RunLifecycle
    RunLifecycle                 the store side of one run: start (every row of its job), progress, finish
    Cancelled, sigterm_cancels   how a run is stopped: SIGTERM (the job manager's Cancel) raises Cancelled;
                                 Ctrl-C (KeyboardInterrupt) of a foreground command ends it cancelled too
    stop_checked_every_step      a loop that checks for a stop every step: SIGTERM only raises its flag there
    error_line(e)                the one line the CLI and a worker print for an error a user can act on

Status bookkeeping. Inside :func:`store_lifecycle` SIGTERM raises :class:`Cancelled`; on the way out a run
that is still active (queued / running) is marked ``cancelled`` (Cancelled, Ctrl-C), or ``failed`` with the error's
one-line message (``field: message`` for a ConfigError, ``Type: message`` otherwise); the exception
propagates. A run already ended by its own code (finished) is left as it is. The status write is retried
and never replaces the error being raised (``RunStore.try_set_status``); the store applies it to every row
of a k-seed job. The job kinds themselves (what runs inside) are :mod:`engine.jobs.kinds`'.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sqlite3

from engine.config.schema import ConfigError
from engine.data.errors import DataError
from engine.store.db import ACTIVE, resolve_store_path
from engine.store.errors import StoreError


class Cancelled(Exception):
    """Raised inside the loop when the caller asks the run to stop."""


INTERRUPTED = "interrupted (Ctrl-C)"  # why a run stopped by Ctrl-C ended (its row's error, the CLI's line)
# why a cancelled run ended when the user stopped it (its row's error): the job manager's Cancel of a queued run, of
# a running one ("… at step N"), and the worker's own line when the signal reaches it first
CANCELLED_BEFORE_START = "cancelled before it started"
CANCELLED_BY_USER = "cancelled by the user"
TERMINATED = "terminated by signal"


def stopped_by_user(error: str | None) -> bool:
    """Whether a cancelled run's error says the user stopped it (the words above), not something else."""
    return any(words in (error or "") for words in (CANCELLED_BEFORE_START, CANCELLED_BY_USER, TERMINATED))


class StopFlag:
    """Raised by SIGTERM inside :func:`stop_checked_every_step`: the loop stops at its next step boundary, never
    inside a store write or a half-applied step, and knows the step it stopped at."""

    def __init__(self):
        self.checked = False  # a loop checks ``requested`` every step (else SIGTERM raises Cancelled at once)
        self.requested = False


_STOP = StopFlag()


@contextlib.contextmanager
def stop_checked_every_step():
    """Inside the block SIGTERM only raises the yielded flag's ``requested``: the caller checks it every step (a
    training step is tens of milliseconds; an evaluation inside the block delays the stop by its own length).
    Outside it (planning, the summary) SIGTERM raises Cancelled at once, as before."""
    was = _STOP.checked
    _STOP.checked, _STOP.requested = True, False
    try:
        yield _STOP
    finally:
        _STOP.checked = was


@contextlib.contextmanager
def sigterm_cancels():
    """Inside the block SIGTERM (the job manager's Cancel) raises Cancelled, so the run ends as
    'cancelled' with its metrics kept instead of dying mid-write (inside :func:`stop_checked_every_step` it
    raises the loop's flag instead)."""

    def on_term(signum, frame):
        if _STOP.checked:
            _STOP.requested = True
            return
        raise Cancelled(TERMINATED)

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


class RunLifecycle:
    """The store side of one job (a no-op without a store): its rows, start, streamed progress, finish, and
    why it ended. A train job of k seeds has k rows (leader first); every other job one."""

    def __init__(self, store, run_id: int | None):
        self.store, self.run_id = store, run_id
        self.active = store is not None and run_id is not None
        self._rows: list[int] | None = None

    @property
    def rows(self) -> list[int]:
        """The job's row ids in seed order ([] without a store)."""
        if self._rows is None:
            self._rows = self.store.job_rows(self.run_id) if self.active else []
        return self._rows

    def start(self, *, total_steps: int | None = None, plan: dict | None = None) -> None:
        """Every row of the job is running in this process, with its step total and plan record."""
        if self.active:
            for rid in self.rows:
                self.store.start_run(rid, pid=os.getpid(), total_steps=total_steps, plan=plan)

    def progress(self, step: int) -> None:
        """The job's step count so far (the dashboard's progress bar)."""
        if self.active:
            self.store.update_progress(self.run_id, step)

    def finish(self, *summaries: dict, statuses=None) -> None:
        """The job ended by its own code: row j keeps ``summaries[j]`` (one per row, written in one transaction)
        and ends as ``statuses[j]`` (``finished`` or ``diverged``; default all finished)."""
        if self.active:
            if len(summaries) != len(self.rows):
                raise ValueError(f"{len(summaries)} summaries for the {len(self.rows)} rows of run {self.run_id}")
            ended = dict(zip(self.rows, statuses)) if statuses is not None else None
            self.store.finish_runs(dict(zip(self.rows, summaries)), ended)

    def ended(self, status: str, error: str) -> None:
        """Record why the run ended, unless its own code already ended it."""
        if not self.active:
            return
        try:
            run = self.store.get_run(self.run_id)
        except Exception:  # noqa: BLE001 - the store itself failing: still try the status write below
            run = None
        if run is not None and run["status"] not in ACTIVE:
            return
        if status == "cancelled":  # a Cancel's click step recorded: what was trained after it goes first, so that no
            try:                   # reader sees the run cancelled with steps past the click (the manager cuts again)
                self.store.cut_at_cancel(self.run_id)
            except Exception:  # noqa: BLE001 - the status write below is what must happen
                pass
        self.store.try_set_status(self.run_id, status, error=error)


NO_STORE = RunLifecycle(None, None)  # a job run without a store (tests, experiments without one)


def error_message(e: BaseException) -> str:
    """The one line a failed run keeps: ``field: message`` for a ConfigError or a StoreError (already
    one line naming what is wrong), ``Type: message`` for anything else."""
    return str(e) if isinstance(e, (ConfigError, StoreError)) else f"{type(e).__name__}: {e}"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def error_line(e: BaseException, *, store_path=None) -> str | None:
    """The one line a command prints for an error a user can act on (the CLI and a worker: ``error: <line>``,
    exit 2): a ConfigError, StoreError or DataError as it reads; an ``sqlite3.Error`` naming the run store; an
    OSError with its file. None for anything else (a bug: its traceback must be seen)."""
    if isinstance(e, (ConfigError, StoreError, DataError)):
        return _one_line(e)
    if isinstance(e, sqlite3.Error):
        return f"run store {resolve_store_path(store_path)}: {type(e).__name__}: {_one_line(e)}"
    if isinstance(e, OSError):
        where = f" ({e.filename})" if getattr(e, "filename", None) and str(e.filename) not in str(e) else ""
        return f"{type(e).__name__}: {_one_line(e)}{where}"
    return None


@contextlib.contextmanager
def store_lifecycle(store, run_id: int | None, *, sigterm: bool = True):
    """The lifecycle of run ``run_id`` (see the module docstring); yields its :class:`RunLifecycle`.
    ``sigterm``: SIGTERM raises Cancelled inside the block (main thread only: workers and the CLI)."""
    life = RunLifecycle(store, run_id)
    try:
        with sigterm_cancels() if sigterm else contextlib.nullcontext():
            yield life
    except Cancelled as e:
        life.ended("cancelled", str(e))
        raise
    except KeyboardInterrupt:  # Ctrl-C of a foreground command: the user stopped it, as Cancel does
        life.ended("cancelled", INTERRUPTED)
        raise
    except BaseException as e:  # noqa: BLE001 - record why, then let it propagate
        life.ended("failed", error_message(e))
        raise
