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

from engine.audit.config import DEFAULT_RUN, AuditConfig
from engine.audit.runner import run_audit
from engine.audit.summary import compact_summary
from engine.config.backend import BACKEND_ENV, BackendConfig
from engine.config.run import AlgorithmConfig
from engine.jobs.kinds import execute
from engine.jobs.ray_backend import RayChunks, connect, is_loopback, listening_addresses
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
    """The report (or its summary) without its wall times, as canonical JSON (NaN compares equal to NaN)."""
    def strip(d):
        if isinstance(d, dict):
            return {k: strip(v) for k, v in d.items() if not k.endswith("seconds")}
        if isinstance(d, list):
            return [strip(v) for v in d]
        return d
    return json.dumps(strip(report if isinstance(report, dict) else report.to_dict()), sort_keys=True)


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


def ray_chunk_workers() -> list[psutil.Process]:
    """Ray workers running a chunk right now (Ray titles a busy worker ray::<function>)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "_train_chunk_task" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_a_worker_killed_in_the_middle_of_a_chunk_is_run_again_with_identical_results(ray_instance):
    config = audit_config(epochs=30.0, model="mlp", looa_k=0, R=2)  # chunks of a few seconds each
    expected = numbers(run_audit(config))
    result, killed = {}, []

    def audit():
        result["report"] = run_audit(config, executor=RayChunks(BackendConfig("ray")))

    thread = threading.Thread(target=audit)
    thread.start()
    deadline = time.time() + 300
    while not killed and thread.is_alive() and time.time() < deadline:
        busy = ray_chunk_workers()
        if busy:
            time.sleep(0.3)  # inside the chunk, not at its start
            if busy[0].is_running() and "_train_chunk_task" in " ".join(busy[0].cmdline()):
                os.kill(busy[0].pid, signal.SIGKILL)
                killed.append(busy[0].pid)
        time.sleep(0.05)
    thread.join(600)
    assert killed, "no chunk was caught running"
    assert not psutil.pid_exists(killed[0]) or psutil.Process(killed[0]).status() == psutil.STATUS_ZOMBIE
    assert numbers(result["report"]) == expected


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
    deadline = time.time() + 120  # the cancelled tasks give their CPUs back
    while ray.available_resources().get("CPU", 0) < CPUS and time.time() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == CPUS
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
    deadline = time.time() + 60
    while servers() - before and time.time() < deadline:
        time.sleep(0.2)
    assert servers() == before  # its instance ended with it; the fixture's runs on
