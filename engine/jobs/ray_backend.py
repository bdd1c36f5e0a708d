"""Ray as the execution backend (``engine.config.backend``): the connection, and an audit's chunks as Ray tasks
(a training run or a one-run audit runs whole as one task: ``engine.jobs.ray_jobs``).

    chunk_executor(backend)   the executor for a backend: LocalChunks (local) or RayChunks (ray)
    RayChunks                 each chunk a Ray task running ``engine.audit.pa_alooa.executor.train_chunk``; the driver
                              (the job's worker process) checkpoints what the tasks return and advances the run's
                              progress in the store, so the dashboard reads a Ray run like a local one
    chunk_task_bytes(setup)   the memory a chunk task asks its node for (its working set and its copy of the
                              data); a chunk no node can hold fails the audit with one line instead of waiting
    connect(backend)          ray.init for the backend: an instance on this machine bound to 127.0.0.1, or the
                              cluster at its address
    listening_addresses()     (pid, address) of every listening socket this process and its children hold

Exactness: a task gets the setup (shipped once per audit: ``ray.put``), its algorithm, its models' membership
rows, seeds and generator seed, and runs at the driver's torch threads, so its result is bit for bit what the
local executor computes; results are placed by chunk index (``engine.audit.pa_alooa.runner``), never by arrival. A task
whose worker dies is run again by Ray (``max_retries``) from the same inputs: the same numbers. Cancel (SIGTERM,
or ``should_stop``) cancels the pending tasks with ``ray.cancel(force=True)``; the finished chunks stay
checkpointed, so running the run again resumes.

Safety: an instance started here binds every server it starts (GCS, raylet, object manager, workers) to
127.0.0.1, starts no dashboard and sends no usage statistics; ``listening_addresses`` lets a test check it. To
use a cluster, start it yourself (README: "Runs and audits on Ray", "On a cluster") and keep its ports inside a trusted network.
"""
from __future__ import annotations

import ipaddress
import os
import sys
from typing import Iterator

from engine.audit.pa_alooa.executor import ChunkTask, LocalChunks, train_chunk
from engine.config.backend import BackendConfig
from engine.config.schema import ConfigError
from engine.store.lifecycle import Cancelled

LOOPBACK = "127.0.0.1"
OBJECT_STORE_BYTES = 1 << 30  # an instance started here: the setup of one audit (MNIST: ~0.2 GB) and its results
MAX_RETRIES = 3  # a chunk whose worker died is run again up to this many times
POLL_SECONDS = 0.5  # how often the driver looks at should_stop (and lets a SIGTERM in) while tasks run


def chunk_executor(backend: BackendConfig):
    """The chunk executor of ``backend``: :class:`LocalChunks` or :class:`RayChunks`."""
    return RayChunks(backend) if backend.kind == "ray" else LocalChunks()


def connect(backend: BackendConfig, *, num_cpus: int | None = None) -> bool:
    """Make sure this process is connected to Ray as ``backend`` says; True when this call started it (then the
    caller shuts it down). An instance started here listens on 127.0.0.1 only (checked)."""
    if backend.local_instance:
        _loopback_only()
    try:
        import ray
    except ImportError:
        raise ConfigError("backend", "the ray backend needs Ray on this machine: pip install ray==2.60.0 psutil "
                                     "(or the package's [ray] extra)") from None

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage reports (and no internet needed)
    common = dict(namespace="privacy-lab", log_to_driver=False)
    try:
        if backend.local_instance:
            ray.init(num_cpus=num_cpus, _node_ip_address=LOOPBACK, include_dashboard=False,
                     object_store_memory=OBJECT_STORE_BYTES, **common)
        else:
            ray.init(address=backend.address, **common)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = "a Ray instance on this machine" if backend.local_instance else f"the Ray cluster at {backend.address}"
        raise ConfigError("backend", f"cannot start or reach {where}: {str(e).splitlines()[0]}") from None
    if backend.local_instance and not is_loopback(ray.util.get_node_ip_address()):
        ray.shutdown()
        raise ConfigError("backend", f"the Ray instance would listen on {ray.util.get_node_ip_address()}, beyond "
                                     f"{LOOPBACK}: not started")
    return True


def _loopback_only() -> None:
    """Before Ray starts an instance here: its node address is 127.0.0.1, so every server it starts binds there.
    ``ray.init(_node_ip_address="127.0.0.1")`` alone is not enough: Ray replaces a loopback node address by the
    machine's outward one unless its single-node mode is on (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when
    ray is imported, by this process and by every process the instance starts). Ray's token authentication
    stays as Ray sets it up for a new local instance (on: a token in ~/.ray/auth_token)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # ray was imported before: the value it read then
        constants.ENABLE_RAY_CLUSTER = False


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP, IPv4-mapped IPv6 included) is a loopback address."""
    ip = ipaddress.ip_address(address.strip("[]"))
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _train_chunk_task(setup, a, members, seeds, gen_seed, score_idx, threads):
    """One chunk on a Ray worker, at the driver's torch threads (the same kernels: the same numbers)."""
    import torch

    torch.set_num_threads(threads)
    return train_chunk(setup, a, members, list(seeds), gen_seed, None, None, score_idx=score_idx)


def chunk_task_bytes(setup) -> int:
    """The memory one chunk task asks its node for (Ray's ``memory`` resource, so a node runs no more chunks at
    once than it holds): the chunk's step working set, as the audit sized the chunk
    (``AuditSetup.chunk_bytes``), and the dataset's tensors, which each task unpickles into its own copy."""
    ds = setup.dataset
    data = sum(t.element_size() * t.nelement() for t in (ds.x_train, ds.y_train, ds.x_test, ds.y_test))
    return int(setup.chunk_bytes + data)


class RayChunks:
    """Chunks as Ray tasks of one CPU each (and one GPU when the audit's device is CUDA)."""

    name = "ray"

    def __init__(self, backend: BackendConfig, *, num_cpus: int | None = None, max_retries: int = MAX_RETRIES):
        self.backend, self.num_cpus, self.max_retries = backend, num_cpus, max_retries
        self.started = False
        self._setup = None  # (setup, its object ref): shipped once per audit
        self._remote = None

    def _ship(self, setup):
        import ray

        if self._setup is None or self._setup[0] is not setup:
            self._setup = (setup, ray.put(setup))
        return self._setup[1]

    def _task(self, setup):
        import ray

        gpus = 1 if setup.device.type == "cuda" else 0
        if gpus and ray.cluster_resources().get("GPU", 0) < 1:
            raise ConfigError("run.device", f"the audit asks for {setup.device}, but no node of the Ray cluster has "
                                            "a GPU")
        memory = chunk_task_bytes(setup)
        largest = max((n["Resources"].get("memory", 0) for n in ray.nodes() if n.get("Alive")), default=0)
        if memory > largest:  # Ray would keep such a task pending for ever
            raise ConfigError("chunk_models", f"one chunk of {min(setup.chunk_models, setup.n_models)} models needs "
                                              f"about {memory / 2**30:.2f} GiB, but no node of the Ray cluster has "
                                              f"that much memory for tasks (the most: {largest / 2**30:.2f} GiB); "
                                              "choose fewer models per chunk")
        if self._remote is None:
            self._remote = ray.remote(_train_chunk_task)
        return self._remote.options(num_cpus=1, num_gpus=gpus, memory=memory, max_retries=self.max_retries)

    def run(self, setup, a, tasks, prog, should_stop) -> Iterator[tuple[ChunkTask, tuple]]:
        import ray
        import torch

        self.started |= connect(self.backend, num_cpus=self.num_cpus)
        task, setup_ref, a_ref = self._task(setup), self._ship(setup), ray.put(a)
        threads = torch.get_num_threads()
        refs = {task.remote(setup_ref, a_ref, t.members, t.seeds, t.gen_seed, t.score_idx, threads): t for t in tasks}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=POLL_SECONDS)
                if should_stop is not None and should_stop():
                    raise Cancelled("stopped")
                for ref in done:
                    result = ray.get(ref)
                    prog.advance(setup.steps)  # a chunk's progress: its steps, once it is done
                    yield refs[ref], result
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def close(self) -> None:
        """Shut down the instance this executor started (a cluster keeps running)."""
        if self.started:
            import ray

            ray.shutdown()
            self.started = False


def listening_addresses(pid: int | None = None) -> list[tuple[int, str, str]]:
    """(pid, ip, port) of every listening TCP socket of process ``pid`` (default: this one) and its children."""
    import psutil

    root = psutil.Process(pid or os.getpid())
    procs = [root, *root.children(recursive=True)]
    out = []
    for p in procs:
        try:
            conns = p.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out += [(p.pid, c.laddr.ip, str(c.laddr.port)) for c in conns if c.status == psutil.CONN_LISTEN]
    return out
