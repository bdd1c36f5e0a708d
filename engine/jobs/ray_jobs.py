"""Whole jobs on Ray: a training run (or a one-run audit) as one Ray task, its lifecycle relayed to the driver.

    run_on_ray(run, config, *, life, backend, device)   run ``run(config, life=…)`` (a job kind's run) as one Ray
                                                        task; the store writes it makes reach ``life`` here

How a run's records reach the store. The driver is the process that opened the run's lifecycle (a job
manager's worker, the CLI, an experiment): it keeps the run's pid, its SIGTERM and its status bookkeeping, so
the job manager's cancel and reattach work as for a local run. The task runs the job's ordinary code with a
:class:`RelayedLife` in place of the store's lifecycle: every call the code makes on it (``start``,
``progress``, ``finish``) or on its ``store`` (``log_progress``, ``set_summary``, ``update_progress``,
``put_artifact``) is yielded back, in order, as a streaming-generator item; the driver applies exactly those
calls (an allow-list) to its own lifecycle and store. So the store stays the dashboard's single source of
truth and the live view reads a run on the cluster like a local one. The task's return value comes back last.

Exactness: the task runs the same code from the same config at the driver's torch threads (set in the thread
that trains), so its numbers are bit for bit a local run's. A run is not retried when its worker dies (its
streamed steps are already in the store; a second pass would write them twice): it fails, naming the cause,
and the Rerun button runs it again. Cancel (SIGTERM, or ``should_stop``) cancels the task with
``ray.cancel(force=True)``: the worker process ends at once; the rows end "cancelled" with what was streamed.
Resources: one CPU; one GPU when the config's device is "cuda" (ConfigError("run.device") when no node has
one) or "auto" on a cluster that has GPUs. Data: the task loads its dataset itself, from the driver's data
folder (``$PRIVACY_LAB_DATA_DIR`` set to that path on the worker), so a cluster's nodes need it at that path.
"""
from __future__ import annotations

import copy
import pickle
import queue
import threading
import traceback

from engine.config.backend import BackendConfig
from engine.config.schema import ConfigError
from engine.data.files import ENV_VAR as DATA_ENV
from engine.data.files import data_dir
from engine.jobs.ray_backend import POLL_SECONDS, connect
from engine.store.lifecycle import Cancelled, error_message

LIFE_CALLS = frozenset({"start", "progress", "finish"})  # what a job calls on its lifecycle
STORE_CALLS = frozenset({"log_progress", "set_summary", "update_progress", "put_artifact"})  # … and on life.store


class RayJobError(RuntimeError):
    """The Ray task running a job was lost (its worker died, the cluster went away): the run fails with it."""


class _Calls:
    """Records each call of an allowed method as (target, method, args, kwargs) for the driver to apply."""

    def __init__(self, outbox, target: str, names: frozenset):
        self._outbox, self._target, self._names = outbox, target, names

    def __getattr__(self, name):
        if name.startswith("_") or name not in self._names:
            raise AttributeError(f"{name!r} is not relayed from a Ray task (relayed: {', '.join(sorted(self._names))})")
        # A copy as of the call: the caller may reuse what it passed (the loop clears its pending steps right
        # after log_progress returns), and the task serialises the call only later, when it yields it.
        return lambda *args, **kwargs: self._outbox.put(copy.deepcopy((self._target, name, args, kwargs)))


class RelayedLife(_Calls):
    """A job's lifecycle inside its Ray task: the rows, id and activity of the driver's, calls relayed."""

    def __init__(self, outbox, run_id, rows, active):
        super().__init__(outbox, "life", LIFE_CALLS)
        self.run_id, self.rows, self.active = run_id, list(rows), active
        self.store = _Calls(outbox, "store", STORE_CALLS) if active else None


def _portable(e: BaseException) -> BaseException:
    """``e`` with its traceback on the worker as a note, as it can cross to the driver (pickled)."""
    try:
        e.add_note("on the Ray worker:\n" + "".join(traceback.format_exception(e)).rstrip())
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - an exception that does not pickle: its one line
        return RayJobError(error_message(e))


def _job_task(run, config, context, threads):
    """The Ray task: ``run(config, life=RelayedLife)`` in a thread, each relayed call and then ("result", value)
    or ("error", exception) yielded as they happen."""
    outbox = queue.SimpleQueue()
    life = RelayedLife(outbox, *context)

    def body():
        import torch

        torch.set_num_threads(threads)  # in the thread that trains (OpenMP's thread count is per thread)
        try:
            outbox.put(("result", run(config, life=life)))
        except BaseException as e:  # noqa: BLE001 - sent to the driver, which raises it there
            outbox.put(("error", _portable(e)))
        finally:
            outbox.put(None)

    threading.Thread(target=body, name="privacy-lab-job", daemon=True).start()
    while (item := outbox.get()) is not None:
        yield item


def _gpus(device: str) -> int:
    import ray

    have = ray.cluster_resources().get("GPU", 0) >= 1
    if device == "cuda" and not have:
        raise ConfigError("run.device", "the run asks for cuda, but no node of the Ray cluster has a GPU")
    return 1 if device == "cuda" or (device == "auto" and have) else 0


def run_on_ray(run, config, *, life, backend: BackendConfig, device: str = "auto", should_stop=None,
               num_cpus: int | None = None, progress: bool = False, label: str = "run"):
    """``run(config, life=…)`` as one Ray task on ``backend`` (module doc); its return value. The calls it makes on
    its lifecycle are applied to ``life``, in order, as they arrive; its exception is raised here. ``progress``: a
    progress bar here, on the driver (the task's own would print on the worker), fed by the relayed calls."""
    import ray
    import torch

    started = connect(backend, num_cpus=num_cpus)
    try:
        # the worker reads the data where the driver does: the same folder, at the same path on every node
        data = {"env_vars": {DATA_ENV: str(data_dir())}}
        task = ray.remote(_job_task).options(num_cpus=1, num_gpus=_gpus(device), max_retries=0,
                                             num_returns="streaming", runtime_env=data)
        items = task.remote(run, config, (life.run_id, life.rows, life.active), torch.get_num_threads())
        return _drain(items, life, should_stop, _Bar(label) if progress else None)
    finally:
        if started:
            ray.shutdown()


class _Bar:
    """A job's progress bar on the driver: its total from the relayed ``start``, its position from the relayed
    steps (``log_progress``) and ``progress`` calls, each shown as it arrives (they come a few times a second)."""

    def __init__(self, label: str):
        self.label, self.bar = label, None

    def see(self, name: str, args, kwargs) -> None:
        from tqdm import tqdm

        if name == "start" and kwargs.get("total_steps") and self.bar is None:
            self.bar = tqdm(total=kwargs["total_steps"], desc=self.label, unit="step", leave=False, mininterval=0,
                             miniters=1)
        elif self.bar is not None and name in ("progress", "log_progress") and args:
            step = args[0] if name == "progress" else max((s for rows in args[0].values() for s, *_ in rows),
                                                          default=self.bar.n)
            if step > self.bar.n:
                self.bar.update(step - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _drain(items, life, should_stop, bar: _Bar | None = None):
    """Apply the task's relayed calls to ``life`` until its result; cancel the task if this ends first."""
    import ray

    ended = False
    try:
        while True:
            ready, _ = ray.wait([items], timeout=POLL_SECONDS)  # returns at least every POLL_SECONDS: SIGTERM gets in
            if should_stop is not None and should_stop():
                raise Cancelled("stopped")
            if not ready:
                continue
            try:
                item = ray.get(next(items))
            except StopIteration:
                ended = True
                raise RayJobError("the Ray task ended without a result") from None
            except ray.exceptions.RayError as e:
                ended = True
                raise RayJobError(f"the Ray task running the job was lost: {str(e).strip().splitlines()[0]}") from None
            if item[0] == "result":
                ended = True
                return item[1]
            if item[0] == "error":
                ended = True
                raise item[1]
            target, name, args, kwargs = item
            allowed = LIFE_CALLS if target == "life" else STORE_CALLS if target == "store" else ()
            if name not in allowed:
                raise RayJobError(f"the Ray task sent {target}.{name}, which is not relayed")
            getattr(life if target == "life" else life.store, name)(*args, **kwargs)
            if bar is not None:
                bar.see(name, args, kwargs)
    finally:
        if bar is not None:
            bar.close()
        if not ended:
            ray.cancel(items, force=True)
