"""The job kinds: one registry above every kind of job, and the one way a job runs (inside one lifecycle).

    JOB_KINDS / job_kind(name)   kind → JobKind: "train" (a training run, k seeds on the model axis), "audit"
                                 (PA-ALOOA) and "one_run" (per-tier empirical ε from one run per algorithm)
    execute(store, id, config)   run a parsed config as run ``id`` of its kind, inside the store's lifecycle, on
                                 the backend (engine.config.backend: local, or Ray — see below)
    execute_all(store, jobs)     several runs (a sweep, an experiment's runs): one after another locally; on Ray all
                                 at once, one task each
    run_queued(store, id)        the worker entry: read the run's kind and config from the store, execute
                                 (a row of a k-seed job runs its whole job, from its leader row)

A :class:`JobKind` carries everything that differs between kinds, so no code above or beside it branches on
a kind's name: how its stored config is parsed, which store rows a config is (one per seed of a train job),
the job config a re-run starts from, how it runs (``run(config, life=…)``: it never opens a lifecycle of its
own), its preview before launch, what a standby prepares ahead of time, the RunConfig its models train with
(its dataset), its group-id prefix and its summary table. The lifecycle itself (status, SIGTERM, why a run
ended) is :mod:`engine.store.lifecycle`'s. Every job — dashboard, CLI, experiments, benches — runs through
:func:`execute` or :func:`run_queued`.

On the Ray backend a training run and a one-run audit run whole as one Ray task (``engine.jobs.ray_jobs``: the
process here stays the run's driver and writes what the task reports); an audit stays here and sends its chunks
of models to Ray (``engine.jobs.ray_backend``). ``JobKind.run`` itself is always the local code: the Ray task
runs it.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Callable
from urllib.parse import quote

from engine.audit.pa_alooa.config import AuditConfig
from engine.audit.one_run.run import preview_one_run, run_one_run_audit
from engine.audit.one_run.config import OneRunConfig
from engine.audit.one_run.report import one_run_table
from engine.audit.pa_alooa.summary import summary_table
from engine.audit.pa_alooa.setup import preview_audit
from engine.audit.pa_alooa.runner import run_audit
from engine.config.backend import BackendConfig, backend_from_env
from engine.config.run import RunConfig
from engine.config.schema import ConfigError
from engine.jobs.ray_backend import POLL_SECONDS, chunk_executor, connect
from engine.jobs.ray_jobs import run_on_ray
from engine.store.lifecycle import sigterm_cancels, store_lifecycle
from engine.train.loop import prepare, preview, train
from engine.train.records import tier_table


@dataclass(frozen=True)
class JobKind:
    """One kind of job: everything the layers above need to know about it."""

    name: str
    load: Callable[[dict], object]  # the stored config dict → its typed config, not validated (raises ConfigError)
    rows: Callable[[object], list]  # a config (or its dict) → the configs of its store rows (one per seed)
    job_config: Callable[[object], object]  # a row's config → the config its whole job runs from (a re-run)
    run: Callable[..., object]  # run(config, *, life, progress, prepared, should_stop, backend) → result
    preview: Callable[[object], object]  # what the job will do, before launch (raises ConfigError / DataError)
    run_config: Callable[[object], RunConfig]  # the RunConfig its models train with (its dataset, model, …)
    summary_table: Callable[[dict], str]  # the stored summary → text (``python -m engine show``)
    group_prefix: str  # the group id of jobs submitted together ("cmp-…", "audit-…")
    algorithms: Callable[[object], list]  # the AlgorithmConfigs the job trains with (a run: one; an audit: each)
    no_dp_note: Callable[[list, str | None], str]  # (labels without formal DP, a run's reason) → the warning text
    # (run id, group id) → (the dashboard page a run of this kind is watched on, the link that opens it there)
    watch: Callable[[int, str | None], tuple[str, str]] = lambda run_id, group: _watch_comparison(group)
    standby_prepare: Callable[[object], object] | None = None  # config → what a warm worker prepares ahead
    whole_on_ray: bool = True  # on Ray: the job is one task (False: it sends its own parts there, as an audit)

    def parse(self, stored: dict):
        """The stored config dict → a validated config (raises ConfigError naming the field)."""
        return self.load(stored).validate()

    def dataset_name(self, config) -> str:
        return self.run_config(config).data.name


def _watch_comparison(group: str | None) -> tuple[str, str]:
    """A training run is watched with its comparison on the Train page."""
    return "Train", f"train?group={quote(group or '')}"


def _train_note(labels: list, reason: str | None) -> str:
    if not labels:
        return ""
    return f"no formal DP guarantee: {reason}" if reason else "no formal DP guarantee"


def _audit_note(labels: list, reason: str | None) -> str:
    return f"includes algorithms without formal DP: {', '.join(labels)}" if labels else ""


def seed_rows(config) -> list:
    """The store rows of a train config: one per seed (``RunConfig.seed_configs``); a dict is parsed
    (and validated) when it asks for more than one seed, else stored as given."""
    if isinstance(config, dict):
        if config.get("seeds", 1) == 1 and config.get("seed_index", 0) == 0:
            return [config]
        config = RunConfig.from_dict(config).validate()
    return config.seed_configs() if hasattr(config, "seed_configs") else [config]


def _run_train(config, *, life, progress=False, prepared=None, should_stop=None, backend=None):
    return train(config, life=life, progress=progress, prepared=prepared, should_stop=should_stop)


def _run_audit(config, *, life, progress=False, prepared=None, should_stop=None, backend=None):
    """An audit's chunks on ``backend``, else the one $PRIVACY_LAB_BACKEND names (local by default)."""
    executor = chunk_executor(backend or backend_from_env())
    try:
        return run_audit(config, life=life, progress=progress, should_stop=should_stop, executor=executor)
    finally:
        executor.close()


def _run_one_run(config, *, life, progress=False, prepared=None, should_stop=None, backend=None):
    return run_one_run_audit(config, life=life, progress=progress, should_stop=should_stop)


JOB_KINDS: dict[str, JobKind] = {
    "train": JobKind(
        "train", load=RunConfig.from_dict, rows=seed_rows,
        job_config=lambda c: c.job_config(), run=_run_train, preview=preview, run_config=lambda c: c,
        summary_table=tier_table, group_prefix="cmp", algorithms=lambda c: [c.algorithm], no_dp_note=_train_note,
        standby_prepare=prepare),
    "audit": JobKind(
        "audit", load=AuditConfig.from_dict, rows=lambda c: [c], job_config=lambda c: c,
        run=_run_audit, preview=lambda c: preview_audit(c, estimate=True), run_config=lambda c: c.run,
        summary_table=summary_table, group_prefix="audit", algorithms=lambda c: list(c.algorithms),
        no_dp_note=_audit_note, whole_on_ray=False, watch=lambda run_id, group: ("Audit", f"audit?audit={run_id}")),
    "one_run": JobKind(
        "one_run", load=OneRunConfig.from_dict, rows=lambda c: [c], job_config=lambda c: c,
        run=_run_one_run, preview=preview_one_run, run_config=lambda c: c.run, summary_table=one_run_table,
        group_prefix="onerun", algorithms=lambda c: list(c.algorithms), no_dp_note=_audit_note,
        watch=lambda run_id, group: ("Audit", f"audit?one_run={run_id}")),
}


def job_kind(name) -> JobKind:
    """The registered kind ``name``; ConfigError("kind", …) naming the known kinds otherwise."""
    kind = JOB_KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ConfigError("kind", f"unknown job kind {name!r}; known: {', '.join(JOB_KINDS)}")
    return kind


def rerun_of(run: dict):
    """What re-running the stored ``run`` queues: (its kind, the config of its whole job — a row of a k-seed job
    gives the job's base config, seed_index 0). The CLI's ``rerun`` and the Runs page's Rerun button."""
    job = job_kind(run["kind"])
    return job, job.job_config(job.parse(run["config"]))


def _run(job: JobKind, config, *, life, backend: BackendConfig | None = None, progress=False, prepared=None,
         should_stop=None):
    """``job``'s run of ``config`` inside ``life``, on ``backend`` (None: $PRIVACY_LAB_BACKEND's, read here, inside
    the lifecycle, so a bad value fails the run, said in its row): here, or as one Ray task (module doc)."""
    backend = backend or backend_from_env()
    if backend.kind == "ray" and job.whole_on_ray:
        run_config = job.run_config(config)
        return run_on_ray(job.run, config, life=life, backend=backend, device=run_config.device,
                          should_stop=should_stop, progress=progress, label=run_config.label)
    return job.run(config, life=life, progress=progress, prepared=prepared, should_stop=should_stop, backend=backend)


def execute(store, run_id: int | None, config, *, kind: str, progress: bool = False, prepared=None,
            should_stop=None, backend: BackendConfig | None = None, sigterm: bool = True):
    """Run the parsed ``config`` as run ``run_id`` of ``kind`` (any row of its job) inside the store's one
    lifecycle, on ``backend`` (default: $PRIVACY_LAB_BACKEND's); without a store (``store`` None) the job runs and
    nothing is recorded. ``sigterm``: SIGTERM cancels it (main thread only)."""
    job = job_kind(kind)
    with store_lifecycle(store, run_id, sigterm=sigterm) as life:
        return _run(job, config, life=life, backend=backend, progress=progress, prepared=prepared,
                    should_stop=should_stop)


def execute_all(store, jobs: list, *, kind: str, backend: BackendConfig | None = None) -> list:
    """Run ``jobs`` [(run_id, parsed config)] of ``kind``; their results in order. Locally one after another (the
    first error stops them); on Ray all at once, each its own task driven by a thread here, so the cluster runs as
    many as it has CPUs for. Every run ends in the store as it would alone; the first error is raised once all
    have ended. SIGTERM or Ctrl-C cancels them all (each row: "cancelled")."""
    try:
        backend = backend or backend_from_env()
    except ConfigError:  # a bad $PRIVACY_LAB_BACKEND: the first run fails with it in its row (as execute does)
        backend = None
    started = None  # None: one after another; else whether the connect here started the instance
    if backend is not None and backend.kind == "ray" and len(jobs) > 1:
        with contextlib.suppress(ConfigError):  # Ray cannot start or be reached: the first run fails saying so
            started = connect(backend)  # once, for all of them
    if started is None:
        return [execute(store, rid, config, kind=kind, backend=backend) for rid, config in jobs]
    results, errors = [None] * len(jobs), [None] * len(jobs)
    stop = threading.Event()

    def one(i, rid, config):
        try:
            results[i] = execute(store, rid, config, kind=kind, backend=backend, should_stop=stop.is_set, sigterm=False)
        except BaseException as e:  # noqa: BLE001 - recorded in its row by its lifecycle; raised below
            errors[i] = e

    threads = [threading.Thread(target=one, args=(i, rid, c), name=f"privacy-lab-run-{rid}", daemon=True)
               for i, (rid, c) in enumerate(jobs)]
    try:
        main = threading.current_thread() is threading.main_thread()
        with sigterm_cancels() if main else contextlib.nullcontext():
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(POLL_SECONDS)  # returns, so SIGTERM / Ctrl-C get in
    except BaseException:
        stop.set()  # each run's task is cancelled by its own thread; their rows end "cancelled"
        for t in threads:
            t.join()
        raise
    finally:
        if started:
            import ray

            ray.shutdown()
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


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
    with store_lifecycle(store, run_id) as life:
        job = job_kind(run["kind"])
        config = job.parse(run["config"])
        ready = prepared(config) if prepared is not None and job.standby_prepare is not None else None
        return _run(job, config, life=life, progress=progress, prepared=ready)
