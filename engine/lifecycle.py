"""What a run is to the run store, for every kind of job: one registry, one lifecycle.

    JOB_KINDS / job_kind(name)   kind → JobKind(parse, run, summary_table): "train" and "audit"
    store_lifecycle(store, id)   start → finished / cancelled / failed with the message
    execute(store, id, config)   run a parsed config as run ``id`` of its kind, inside the lifecycle
    run_queued(store, id)        the worker entry: read the run's kind and config from the store, execute
                                 (a row of a k-seed job runs its whole job, from its leader row)

Status bookkeeping. Inside :func:`store_lifecycle` SIGTERM (the job manager's Cancel) raises
:class:`~engine.train.Cancelled`; on the way out a run that is still active (queued / running) is
marked ``cancelled`` (Cancelled), or ``failed`` with the error's one-line message (``field: message``
for a ConfigError, ``Type: message`` otherwise); the exception propagates. A run already ended by
its own code (finished, or marked by an inner lifecycle) is left as it is. The status write is
retried and never replaces the error being raised (``RunStore.try_set_status``); the store applies it
to every row of a k-seed job.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable

from engine.config import ConfigError
from engine.store import ACTIVE


@dataclass(frozen=True)
class JobKind:
    """One kind of job: how its stored config is parsed, how it runs, how its summary prints."""

    name: str
    parse: Callable[[dict], object]  # the stored config dict → a validated config (raises ConfigError)
    run: Callable[..., object]  # run(config, *, store, run_id, progress, prepared) → result
    summary_table: Callable[[dict], str]  # the stored summary → text (``python -m engine show``)


def _parse_train(d: dict):
    from engine.config import RunConfig

    return RunConfig.from_dict(d).validate()


def _run_train(config, *, store=None, run_id=None, progress=False, prepared=None):
    from engine.train import train

    return train(config, store=store, run_id=run_id, progress=progress, prepared=prepared)


def _train_table(summary: dict) -> str:
    from engine.cli import tier_table

    return tier_table(summary)


def _parse_audit(d: dict):
    from engine.audit.config import AuditConfig

    return AuditConfig.from_dict(d).validate()


def _run_audit(config, *, store=None, run_id=None, progress=False, prepared=None):
    from engine.audit.runner import run_audit

    return run_audit(config, store=store, run_id=run_id, progress=progress)


def _audit_table(summary: dict) -> str:
    from engine.audit.report import summary_table

    return summary_table(summary)


JOB_KINDS: dict[str, JobKind] = {
    "train": JobKind("train", _parse_train, _run_train, _train_table),
    "audit": JobKind("audit", _parse_audit, _run_audit, _audit_table),
}


def job_kind(name) -> JobKind:
    """The registered kind ``name``; ConfigError("kind", …) naming the known kinds otherwise."""
    kind = JOB_KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ConfigError("kind", f"unknown job kind {name!r}; known: {', '.join(JOB_KINDS)}")
    return kind


class RunLifecycle:
    """The store side of one run (a no-op without a store): start, finish, and why it ended."""

    def __init__(self, store, run_id: int | None):
        self.store, self.run_id = store, run_id
        self.active = store is not None and run_id is not None

    def start(self, *, total_steps: int | None = None, plan: dict | None = None) -> None:
        if self.active:
            self.store.start_run(self.run_id, pid=os.getpid(), total_steps=total_steps, plan=plan)

    def finish(self, summary: dict) -> None:
        if self.active:
            self.store.finish_run(self.run_id, summary)

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
        self.store.try_set_status(self.run_id, status, error=error)


def error_message(e: BaseException) -> str:
    """The one line a failed run keeps: ``field: message`` for a ConfigError or a StoreError (already
    one line naming what is wrong), ``Type: message`` for anything else."""
    from engine.store import StoreError

    return str(e) if isinstance(e, (ConfigError, StoreError)) else f"{type(e).__name__}: {e}"


@contextlib.contextmanager
def store_lifecycle(store, run_id: int | None, *, sigterm: bool = True):
    """The lifecycle of run ``run_id`` (see the module docstring); yields its :class:`RunLifecycle`.
    ``sigterm``: SIGTERM raises Cancelled inside the block (main thread only: workers and the CLI)."""
    from engine.train import Cancelled, sigterm_cancels

    life = RunLifecycle(store, run_id)
    try:
        with sigterm_cancels() if sigterm else contextlib.nullcontext():
            yield life
    except Cancelled as e:
        life.ended("cancelled", str(e))
        raise
    except BaseException as e:  # noqa: BLE001 - record why, then let it propagate
        life.ended("failed", error_message(e))
        raise


def execute(store, run_id: int, config, *, kind: str, progress: bool = False, prepared=None):
    """Run the parsed ``config`` as run ``run_id`` of ``kind`` in the store, inside its lifecycle."""
    job = job_kind(kind)
    with store_lifecycle(store, run_id):
        return job.run(config, store=store, run_id=run_id, progress=progress, prepared=prepared)


def run_queued(store, run_id: int, *, progress: bool = False, prepared: Callable | None = None):
    """The worker entry: run (or resume) the stored run ``run_id``. ``prepared(config)`` may return a
    ready preparation of exactly that config (the standby worker's head start), or None."""
    run = store.get_run(run_id)
    if run is None:
        raise ConfigError("run_id", f"no run {run_id} in {store.path}")
    if run.get("job_id") is not None and run["job_id"] != run_id:  # a replica row: its job runs from row 0
        replica, run_id = run_id, run["job_id"]
        run = store.get_run(run_id)
        if run is None:
            raise ConfigError("run_id", f"run {replica} is a seed of job {run_id}, which is no longer in {store.path}")
    with store_lifecycle(store, run_id):
        job = job_kind(run["kind"])
        config = job.parse(run["config"])
        ready = prepared(config) if prepared is not None and job.name == "train" else None
        return job.run(config, store=store, run_id=run_id, progress=progress, prepared=ready)
