"""Audits on Ray (engine.jobs.ray_backend): a real local Ray instance of 2 CPUs, bound to 127.0.0.1.

What is checked against the local executor, bit for bit: every chunk's per-sample losses and confidences (the
scores), the per-sample advantages, and every number of the report (GPR, CIs, null floors, Δ, ε bounds) — for a
plain run, a worker killed in the middle of a chunk (Ray runs it again), and a cancelled run resumed. And: the
instance listens on loopback only; a cancel frees the cluster; the CLI's own instance ends with the CLI.
"""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import ray

from conftest import wait_until
from engine.audit.pa_alooa.config import DEFAULT_RUN, AuditConfig
from engine.audit.pa_alooa.runner import run_audit
from engine.audit.pa_alooa.summary import compact_summary
from engine.config.backend import BACKEND_ENV, BackendConfig
from engine.config.run import AlgorithmConfig, RunConfig
from engine.config.schema import ConfigError
from engine.data import load_dataset
from engine.dp.tiers import preset
from engine.jobs.kinds import execute, execute_all
from engine.jobs.ray_backend import RayChunks, connect, is_loopback, listening_addresses
from engine.jobs.ray_jobs import run_on_ray
from engine.store.db import RunStore
from engine.store.lifecycle import Cancelled

pytestmark = pytest.mark.slow  # a Ray instance: seconds to start, not a privacy invariant (the fast subset skips it)
REPO = Path(__file__).resolve().parent.parent
CPUS = 2


def audit_config(*, epochs=1.0, model="lr", looa_k=2, R=4) -> AuditConfig:
    """Adult, 2R = 8 models in chunks of 2 (4 chunks per algorithm): DP-SGD-S (its realised noise travels too)
    and INO-SGD, with PA-LOOA chunks."""
    run = DEFAULT_RUN.replace(**{"data.name": "adult", "data.max_train": 1500, "model.name": model, "epochs": epochs,
                                 "batch_size": 64, "seed": 11, "threads": 1})
    return AuditConfig(run=run, epsilon=4.0, group_by="attribute", group_attribute="sex", R=R, chunk_models=2,
                       algorithms=(AlgorithmConfig(name="dpsgd_s", group_by="attribute"),
                                   AlgorithmConfig(name="ino", group_by="attribute")),
                       looa_k=looa_k, looa_models=2).validate()


def numbers(report) -> str:
    """The report (or its summary, or any JSON) without its wall times (``*seconds``, ``elapsed``), as canonical
    JSON (NaN compares equal to NaN)."""
    def strip(d):
        if isinstance(d, dict):
            return {k: strip(v) for k, v in d.items() if not (k.endswith("seconds") or k == "elapsed")}
        if isinstance(d, list):
            return [strip(v) for v in d]
        return d
    return json.dumps(strip(report if isinstance(report, (dict, list)) else report.to_dict()), sort_keys=True)


def artifacts(store: RunStore, run_id: int) -> dict:
    """Every chunk's arrays and every per-sample advantage of run ``run_id``."""
    out = {}
    for key in store.artifact_keys(run_id):
        blob = store.get_artifact(run_id, key)
        if key.startswith("chunk/"):
            with np.load(io.BytesIO(blob), allow_pickle=False) as f:
                out[key] = {k: f[k] for k in f.files}
        elif key.startswith("advantage/"):
            out[key] = {"advantage": np.load(io.BytesIO(blob), allow_pickle=False)}
    return out


def assert_same_arrays(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b) and any(k.startswith("chunk/") for k in a)
    for key in a:
        assert sorted(a[key]) == sorted(b[key]), key
        for name in a[key]:
            assert a[key][name].dtype == b[key][name].dtype, (key, name)
            assert np.array_equal(a[key][name], b[key][name], equal_nan=True), (key, name)  # bit for bit


@pytest.fixture(scope="module")
def ray_instance(tmp_path_factory):
    """One local instance for the module; Ray's token file goes to a temporary home."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(tmp_path_factory.mktemp("ray-home")))
        mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # (connect sets it too; put back after the module)
        assert connect(BackendConfig("ray"), num_cpus=CPUS)
        try:
            yield
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    """The local run of :func:`audit_config`: its report and its stored arrays."""
    store = RunStore(tmp_path_factory.mktemp("local") / "runs.sqlite")
    config = audit_config()
    run_id = store.create_run(config.to_dict(), kind="audit")
    report = execute(store, run_id, config, kind="audit")
    return numbers(report), artifacts(store, run_id), numbers(compact_summary(report))


def test_everything_the_ray_instance_starts_listens_on_loopback_only(ray_instance):
    listening = listening_addresses()
    names = {psutil.Process(pid).name() for pid, _, _ in listening}
    assert any("gcs_server" in n for n in names) and any("raylet" in n for n in names), names
    beyond = [(pid, ip, port) for pid, ip, port in listening if not is_loopback(ip)]
    assert beyond == []
    assert ray.util.get_node_ip_address() == "127.0.0.1"


def test_an_audit_on_ray_equals_the_local_one_bit_for_bit(ray_instance, local_reference, tmp_path, monkeypatch):
    """Through the worker's entry (execute, kind "audit") with $PRIVACY_LAB_BACKEND=ray: chunks on the instance."""
    ref_numbers, ref_arrays, _ = local_reference
    store = RunStore(tmp_path / "runs.sqlite")
    config = audit_config()
    run_id = store.create_run(config.to_dict(), kind="audit")
    monkeypatch.setenv(BACKEND_ENV, "ray")
    report = execute(store, run_id, config, kind="audit")
    assert numbers(report) == ref_numbers
    assert_same_arrays(artifacts(store, run_id), ref_arrays)
    row = store.get_run(run_id)
    assert row["status"] == "finished" and row["step"] == row["total_steps"] > 0  # the driver wrote the progress
    assert ray.is_initialized()  # the instance it found was not its own: still running


def ray_workers_running(function: str) -> list[psutil.Process]:
    """Ray workers running ``function`` right now (Ray titles a busy worker ray::<function>)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if function in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def ray_chunk_workers() -> list[psutil.Process]:
    return ray_workers_running("_train_chunk_task")


def test_a_worker_killed_in_the_middle_of_a_chunk_is_run_again_with_identical_results(ray_instance):
    config = audit_config(epochs=90.0, model="mlp", looa_k=0, R=2)  # 4 chunks of about a second each
    expected = numbers(run_audit(config))
    result, killed, seen = {}, [], set()

    def audit():
        result["report"] = run_audit(config, executor=RayChunks(BackendConfig("ray")))

    thread = threading.Thread(target=audit)
    thread.start()
    deadline = time.time() + 300
    while not killed and thread.is_alive() and time.time() < deadline:
        for worker in ray_chunk_workers():
            seen.add(worker.pid)
            time.sleep(0.1)  # inside the chunk, not at its start; if it ended meanwhile, the next chunk is tried
            try:
                if "_train_chunk_task" in " ".join(worker.cmdline()):
                    os.kill(worker.pid, signal.SIGKILL)
                    killed.append(worker.pid)
                    break
            except psutil.Error:
                continue
        time.sleep(0.02)
    thread.join(600)
    assert killed, f"no chunk was caught running (chunk workers seen: {sorted(seen)}; the audit ended: {'report' in result})"
    assert not psutil.pid_exists(killed[0]) or psutil.Process(killed[0]).status() == psutil.STATUS_ZOMBIE
    assert numbers(result["report"]) == expected


def test_each_chunk_task_asks_ray_for_its_memory_and_a_chunk_no_node_holds_fails_in_one_line(ray_instance):
    """While chunks run, the instance's free ``memory`` resource is down by the tasks' requests (the chunk's working
    set and its copy of the data: ``chunk_task_bytes``); a chunk larger than every node's memory ends the audit
    with one line before anything trains, instead of a task pending for ever."""
    from engine.audit.pa_alooa.chunks import largest_batch, per_model_step_bytes
    from engine.audit.pa_alooa.setup import prepare_audit
    from engine.jobs.ray_backend import chunk_task_bytes

    config = audit_config(epochs=90.0, model="mlp", looa_k=0, R=2)
    setup = prepare_audit(config)
    want = chunk_task_bytes(setup)
    data = sum(t.element_size() * t.nelement() for t in (setup.dataset.x_train, setup.dataset.y_train,
                                                         setup.dataset.x_test, setup.dataset.y_test))
    assert want == setup.chunk_bytes + data and setup.chunk_bytes > 0
    total = ray.cluster_resources()["memory"]
    used = set()
    thread = threading.Thread(target=run_audit, args=(config,), kwargs={"executor": RayChunks(BackendConfig("ray"))})
    thread.start()
    while thread.is_alive():
        used.add(round(total - ray.available_resources().get("memory", total)))
        time.sleep(0.02)
    thread.join()
    assert want in used or 2 * want in used, (want, sorted(used))  # one or two chunks at a time on 2 CPUs
    assert used <= {0, want, 2 * want}

    node = max(n["Resources"]["memory"] for n in ray.nodes() if n["Alive"])
    run = DEFAULT_RUN.replace(**{"data.name": "mnist", "data.max_train": 1000, "model.name": "cnn", "epochs": 1.0,
                                 "batch_size": 64, "seed": 1, "threads": 1})
    per = per_model_step_bytes(run.model, (1, 28, 28), 10, largest_batch(64))
    R = int(node // per) // 2 + 1  # 2R models in one chunk: more than the node holds
    big = AuditConfig(run=run, epsilon=4.0, group_by="class", R=R, chunk_models=2 * R, looa_k=0,
                      algorithms=(AlgorithmConfig(name="dpsgd"),)).validate()
    started = time.time()
    with pytest.raises(ConfigError) as e:
        run_audit(big, executor=RayChunks(BackendConfig("ray")))
    assert e.value.field == "chunk_models" and "no node of the Ray cluster has that much memory" in str(e.value)
    assert "\n" not in str(e.value) and time.time() - started < 60


def test_a_cancel_drops_the_pending_chunks_and_the_run_resumes_to_the_same_numbers(
        ray_instance, local_reference, tmp_path, monkeypatch):
    ref_numbers, ref_arrays, _ = local_reference
    store = RunStore(tmp_path / "runs.sqlite")
    config = audit_config()
    run_id = store.create_run(config.to_dict(), kind="audit")
    monkeypatch.setenv(BACKEND_ENV, "ray")

    def after_the_first_chunk() -> bool:
        return any(k.startswith("chunk/") for k in store.artifact_keys(run_id))

    with pytest.raises(Cancelled):
        execute(store, run_id, config, kind="audit", should_stop=after_the_first_chunk)
    assert store.get_run(run_id)["status"] == "cancelled"
    kept = [k for k in store.artifact_keys(run_id) if k.startswith("chunk/")]
    assert 1 <= len(kept) < len([k for k in ref_arrays if k.startswith("chunk/")])
    wait_until(lambda: ray.available_resources().get("CPU", 0) == CPUS, 120, "the cancelled tasks' CPUs back")
    report = execute(store, run_id, config, kind="audit")  # the same run again: resumes from its chunks
    assert numbers(report) == ref_numbers
    assert_same_arrays(artifacts(store, run_id), ref_arrays)


def test_the_cli_on_its_own_ray_instance_gives_the_local_numbers_and_takes_it_down(
        ray_instance, local_reference, tmp_path):
    *_, ref_summary = local_reference
    cfg = tmp_path / "audit.json"
    cfg.write_text(audit_config().to_json())

    def servers() -> set[int]:
        return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] and "gcs_server" in p.info["name"]}

    before = servers()  # the fixture's instance
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(REPO))
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "engine", "--store", str(tmp_path / "runs.sqlite"), "--backend", "ray",
                          "audit", str(cfg), "--json"], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    got.pop("run_id")
    assert numbers(got) == ref_summary
    wait_until(lambda: not servers() - before, 60, "the CLI's Ray instance to end")
    assert servers() == before  # its instance ended with it; the fixture's runs on


# --- training runs and sweeps on Ray (engine.jobs.ray_jobs: the whole run one task, its records relayed) -------

def train_config(*, seeds=2, algorithm="ino", epochs=1.0, seed=3) -> RunConfig:
    """Adult, logistic regression, ``seeds`` models on the model axis: a few seconds."""
    return RunConfig().replace(**{"data.name": "adult", "data.max_train": 1200, "model.name": "lr", "epochs": epochs,
                                  "batch_size": 64, "algorithm.name": algorithm, "eval_every": 3, "seed": seed,
                                  "seeds": seeds, "threads": 1},
                              tiers=preset("two_tier_attribute", load_dataset("adult"))).validate()


def stored_run(store: RunStore, run_id: int) -> str:
    """Everything the store holds of a run's job without wall times or ids: per row its status, steps, plan,
    summary, every step's loss and batch, every evaluation."""
    def row(rid):
        r = store.get_run(rid)
        return {"status": r["status"], "step": r["step"], "total_steps": r["total_steps"], "plan": r["plan"],
                "summary": r["summary"], "evals": store.eval_metrics(rid),
                "steps": [(s["step"], s["train_loss"], s["batch_size"]) for s in store.step_metrics(rid)]}
    return numbers({"rows": [row(rid) for rid in store.job_rows(run_id)]})


def new_job(store: RunStore, config: RunConfig, **kw) -> int:
    return store.create_job(config.seed_configs(), **kw)[0]


@pytest.fixture(scope="module")
def local_train(tmp_path_factory):
    store = RunStore(tmp_path_factory.mktemp("train-local") / "runs.sqlite")
    run_id = new_job(store, train_config())
    execute(store, run_id, train_config(), kind="train", backend=BackendConfig())
    return stored_run(store, run_id)


def test_a_training_run_on_ray_writes_the_store_exactly_as_a_local_run(ray_instance, local_train, tmp_path, capsys):
    """Two seeds on the model axis, run as one Ray task: every step, evaluation, plan and summary the driver
    wrote from what the task relayed equals the local run's; the rows name this process (the driver) as pid.
    With ``progress`` (the CLI's), the driver shows the run's bar from the relayed steps, up to its last."""
    store = RunStore(tmp_path / "runs.sqlite")
    run_id = new_job(store, train_config())
    result = execute(store, run_id, train_config(), kind="train", backend=BackendConfig("ray"), progress=True)
    total = store.get_run(run_id)["total_steps"]
    bar = capsys.readouterr().err
    assert f"{train_config().label}: " in bar and f" 0/{total} " in bar and f" {total}/{total} " in bar, bar[-500:]
    assert stored_run(store, run_id) == local_train
    assert '"status": "finished"' in local_train and len(store.job_rows(run_id)) == 2
    assert all(store.get_run(rid)["pid"] == os.getpid() for rid in store.job_rows(run_id))
    assert [numbers(r.summary) for r in result.per_seed] == [numbers(store.get_run(rid)["summary"])
                                                              for rid in store.job_rows(run_id)]
    assert ray.is_initialized()


def test_a_sweep_on_ray_equals_the_local_sweep(ray_instance, tmp_path):
    """Four configurations (two algorithms × two seeds) at once on the 2-CPU instance, through execute_all;
    each run's store record equals the same sweep's one after another on the local backend."""
    configs = [train_config(seeds=1, algorithm=a, seed=s) for a in ("idp_sample", "ino") for s in (1, 2)]
    got = {}
    for name, backend in (("local", BackendConfig()), ("ray", BackendConfig("ray"))):
        store = RunStore(tmp_path / f"{name}.sqlite")
        ids = [store.create_run(c, group_id=f"sweep-{i}") for i, c in enumerate(configs)]
        results = execute_all(store, list(zip(ids, configs)), kind="train", backend=backend)
        assert [r.config.seed for r in results] == [1, 2, 1, 2]
        got[name] = [stored_run(store, rid) for rid in ids]
    assert got["ray"] == got["local"]
    assert len(set(got["local"])) == 4  # four different runs, not one repeated


def ray_job_workers() -> list[psutil.Process]:
    return ray_workers_running("_job_task")


def test_cancelling_a_training_run_on_ray_ends_its_task_and_keeps_what_was_streamed(ray_instance, tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    config = train_config(seeds=1, epochs=200.0)  # minutes: it is cancelled long before
    run_id = store.create_run(config)

    def some_steps_streamed() -> bool:
        return len(store.step_metrics(run_id)) >= 20

    with pytest.raises(Cancelled):
        execute(store, run_id, config, kind="train", backend=BackendConfig("ray"), should_stop=some_steps_streamed)
    row = store.get_run(run_id)
    assert row["status"] == "cancelled" and len(store.step_metrics(run_id)) >= 20 and store.eval_metrics(run_id)
    wait_until(lambda: ray_job_workers() == [] and ray.available_resources().get("CPU", 0) == CPUS, 120,
               "the task's worker gone and its CPU back")


def test_an_error_in_the_ray_task_fails_the_run_with_its_one_line(ray_instance, tmp_path):
    """A config only the data can refuse (a CNN on German Credit's tabular rows passes validate; prepare, on the
    Ray worker, refuses it) fails as it does locally: the same exception type, status and one-line message."""
    messages = {}
    for name, backend in (("local", BackendConfig()), ("ray", BackendConfig("ray"))):
        store = RunStore(tmp_path / f"{name}.sqlite")
        config = train_config(seeds=1).replace(**{"data.name": "german_credit", "model.name": "cnn"})
        run_id = store.create_run(config)
        with pytest.raises(Exception) as info:
            execute(store, run_id, config, kind="train", backend=backend)
        messages[name] = (type(info.value).__name__, store.get_run(run_id)["status"], store.get_run(run_id)["error"])
    assert messages["ray"] == messages["local"] and messages["local"][1] == "failed", messages


def test_a_run_asking_for_a_gpu_the_cluster_lacks_fails_with_one_line(ray_instance, tmp_path):
    if ray.cluster_resources().get("GPU", 0):
        pytest.skip("this instance has a GPU")
    store = RunStore(tmp_path / "runs.sqlite")
    config = train_config(seeds=1).replace(device="cuda")
    run_id = store.create_run(config)
    with pytest.raises(ConfigError, match="run.device: .*no node of the Ray cluster has a GPU"):
        execute(store, run_id, config, kind="train", backend=BackendConfig("ray"))
    assert store.get_run(run_id)["status"] == "failed" and "no node" in store.get_run(run_id)["error"]


def local_and_ray(main, argv, tmp_path, capsys, monkeypatch) -> tuple[dict, list]:
    """An experiment script's JSON result run with ``--backend local`` and with ``--backend ray`` (each into its
    own store), and the configs of the runs that went to Ray as tasks."""
    from engine.jobs import kinds

    tasks = []

    def counted(run, config, **kw):
        tasks.append(config)
        return run_on_ray(run, config, **kw)

    monkeypatch.setattr(kinds, "run_on_ray", counted)
    got = {}
    for name in ("local", "ray"):
        main([*argv, "--backend", name, "--store", str(tmp_path / f"{name}.sqlite")])
        got[name] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return got, tasks


def test_an_experiment_with_backend_ray_gives_the_local_result(ray_instance, tmp_path, capsys, monkeypatch):
    """``experiments/pareto.py --smoke --backend ray`` trains its four runs at once on the instance, each a Ray task;
    its result (accuracy and imbalance per setting, over seeds) equals the script's local result."""
    from experiments import pareto

    got, tasks = local_and_ray(pareto.main, ["--smoke", "--json", "--no-figures"], tmp_path, capsys, monkeypatch)
    assert len(got["local"]["run_ids"]) == 4 and len(tasks) == 4  # the local four ran here, the Ray four as tasks
    assert numbers(got["ray"]["settings"]) == numbers(got["local"]["settings"])
    assert [s["kind"] for s in got["local"]["settings"]] == ["reference", "ino"]


def test_a_tif_search_on_ray_proposes_and_finds_what_the_local_one_does(ray_instance, tmp_path, capsys, monkeypatch):
    """``experiments/tif_search.py --smoke --backend ray``, 4 trials in 2 rounds of 2 (the second round proposed by
    TPE from the first's results): each round's runs at once as Ray tasks; the trials, their numbers and the answer
    equal the local search's."""
    from experiments import tif_search

    got, tasks = local_and_ray(tif_search.main, ["--smoke", "--json", "--no-figures", "--trials", "4", "--parallel", "2"],
                               tmp_path, capsys, monkeypatch)
    assert sorted(c.name for c in tasks) == sorted(f"{k} seed 0" for k in ("reference", "trial0", "trial1", "trial2",
                                                                             "trial3"))
    assert numbers(got["ray"]["trials"]) == numbers(got["local"]["trials"]) and len(got["local"]["trials"]) == 4
    assert numbers(got["ray"]["best"]) == numbers(got["local"]["best"])


def test_the_task_reads_the_data_folder_the_driver_names(ray_instance, tmp_path, monkeypatch):
    """The instance's workers were started with the shared data folder; a driver naming another folder (here an
    empty one) gets its own folder read on the worker: the run fails naming that folder, as it does locally."""
    config = train_config(seeds=1).replace(tiers=preset("two_tier_attribute", load_dataset("german_credit")),
                                           **{"data.name": "german_credit"}).validate()  # not shipped in assets/
    empty = tmp_path / "no-data"
    empty.mkdir()
    monkeypatch.setenv("PRIVACY_LAB_DATA_DIR", str(empty))
    errors = {}
    for name, backend in (("local", BackendConfig()), ("ray", BackendConfig("ray"))):
        store = RunStore(tmp_path / f"{name}.sqlite")
        run_id = store.create_run(config)
        with pytest.raises(Exception):
            execute(store, run_id, config, kind="train", backend=backend)
        errors[name] = store.get_run(run_id)["error"]
    assert str(empty) in errors["local"] and errors["ray"] == errors["local"], errors


def test_the_dashboards_workers_run_their_training_runs_on_ray(tmp_path, monkeypatch):
    """Under PRIVACY_LAB_BACKEND=ray the job manager's worker is the run's driver: a comparison of two runs
    (one short, one long) streams into the store while on Ray (the live view reads it), the short one ends as it
    does locally, Cancel ends the long one "cancelled" and the Ray processes its worker started end with it."""
    from engine.jobs.manager import JobManager

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # Ray's token file
    monkeypatch.setenv(BACKEND_ENV, "ray")
    short, long = train_config(seeds=1), train_config(seeds=1, epochs=200.0, algorithm="idp_sample")
    local = RunStore(tmp_path / "local.sqlite")
    local_id = local.create_run(short)
    execute(local, local_id, short, kind="train", backend=BackendConfig())
    mgr = JobManager(tmp_path / "runs.sqlite", max_workers=2, prewarm=False)
    try:
        store = mgr.store
        a, b = mgr.submit([short, long], group_id="cmp-ray")

        def streaming_while_running():
            row = store.get_run(b)
            return row["status"] == "running" and len(store.step_metrics(b)) >= 20 and row

        row = wait_until(streaming_while_running, 240, "the long run to stream steps from Ray")
        worker = psutil.Process(row["pid"])
        started = [p for p in worker.children(recursive=True) if p.name() in ("raylet", "gcs_server")]
        assert started, "the worker started a Ray instance"
        done = wait_until(lambda: (r := store.get_run(a))["status"] == "finished" and r, 240, "the short run")
        assert numbers(done["summary"]) == numbers(local.get_run(local_id)["summary"])
        assert store.eval_metrics(a) and numbers(store.eval_metrics(a)) == numbers(local.eval_metrics(local_id))
        assert mgr.cancel(b) == "cancelled" and store.get_run(b)["status"] == "cancelled"
        assert wait_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in started),
                          60, "the worker's Ray processes to end")
    finally:
        mgr.shutdown(cancel_running=True)


def test_a_training_task_whose_worker_dies_fails_the_run_naming_it_and_keeps_the_streamed_steps(ray_instance,
                                                                                                  tmp_path):
    """Not retried (a second pass would write the streamed steps twice): the run fails with one line saying the
    Ray task was lost; what streamed before stays."""
    store = RunStore(tmp_path / "runs.sqlite")
    config = train_config(seeds=1, epochs=200.0)
    run_id = store.create_run(config)
    killed = []

    def kill_once_streaming() -> bool:
        if not killed and len(store.step_metrics(run_id)) >= 20:
            workers = ray_job_workers()
            assert len(workers) == 1
            workers[0].kill()
            killed.append(workers[0].pid)
        return False

    with pytest.raises(Exception) as info:
        execute(store, run_id, config, kind="train", backend=BackendConfig("ray"), should_stop=kill_once_streaming)
    row = store.get_run(run_id)
    assert killed and type(info.value).__name__ == "RayJobError"
    assert row["status"] == "failed" and "the Ray task running the job was lost: The worker died" in row["error"]
    assert "\n" not in row["error"] and len(store.step_metrics(run_id)) >= 20


def test_a_one_run_audit_on_ray_stores_the_local_report(ray_instance, tmp_path):
    """The one-run audit runs whole as one task (two algorithms): the report it returns and the summary it wrote
    through the relayed store are the local audit's."""
    from engine.audit.one_run.config import OneRunConfig

    config = OneRunConfig(algorithms=(AlgorithmConfig(name="dpsgd"), AlgorithmConfig(name="ino")), canaries=100,
                          input_canaries=20).validate()
    config = config.replace(run=config.run.replace(epochs=2.0)).validate()
    got = {}
    for name, backend in (("local", BackendConfig()), ("ray", BackendConfig("ray"))):
        store = RunStore(tmp_path / f"{name}.sqlite")
        run_id = store.create_run(config.to_dict(), kind="one_run", status="queued", name=name)
        report = execute(store, run_id, config, kind="one_run", backend=backend)
        assert store.get_run(run_id)["status"] == "finished"
        got[name] = (numbers(report), numbers(store.get_run(run_id)["summary"]))
    assert got["ray"] == got["local"] and got["local"][0] == got["local"][1]
