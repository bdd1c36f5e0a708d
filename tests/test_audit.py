"""The privacy audit: configuration, invariants, CLI, store, resume (the training pipeline: tests/test_step.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.audit.config import AuditConfig
from engine.audit.report import compact_summary
from engine.audit.runner import load_array, prepare_audit, run_audit
from engine.config import AlgorithmConfig, ConfigError, TierConfig, TiersConfig
from engine.store import RunStore
from engine.train import Cancelled

REPO = Path(__file__).resolve().parents[1]

# A tiny digits audit: ~1 s per algorithm.
TINY = AuditConfig(dataset="digits", group_by="class", R=3, epochs=2.0, batch_size=64, epsilon=2.0,
                   algorithms=(AlgorithmConfig(name="dpsgd"),), n_boot=100, looa_k=1, looa_models=3, threads=1)


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------

def test_config_json_round_trip_and_shorthand():
    cfg = TINY.replace(tiers=TiersConfig(assign="class", tiers=(TierConfig(epsilon=1.0, classes=tuple(range(5))),
                                                                 TierConfig(epsilon=3.0, classes=tuple(range(5, 10))))),
                       algorithms=(AlgorithmConfig(name="ino", alpha=2.0, tail_fraction=0.25),
                                   AlgorithmConfig(name="dpsgd_s", group_by="class")))
    back = AuditConfig.from_json(cfg.to_json())
    assert back == cfg and back.to_json() == cfg.to_json()
    short = AuditConfig.from_dict({"algorithms": ["dpsgd", "nonprivate"], "R": 4})
    assert [a.name for a in short.algorithms] == ["dpsgd", "nonprivate"] and short.R == 4
    assert AuditConfig().validate() is not None  # the defaults are valid


@pytest.mark.parametrize("changes, field", [
    ({"R": 1}, "R"),
    ({"epsilon": 0.0}, "epsilon"),
    ({"epsilon": float("inf")}, "epsilon"),
    ({"delta": 1.0}, "delta"),
    ({"batch_size": 0}, "batch_size"),
    ({"epochs": -1.0}, "epochs"),
    ({"lr": 0.0}, "lr"),
    ({"model": "resnet18"}, "model"),
    ({"dataset": "nope"}, "dataset"),
    ({"threshold": "both"}, "threshold"),
    ({"group_by": "age"}, "group_by"),
    ({"n_boot": 1}, "n_boot"),
    ({"confidence": 1.5}, "confidence"),
    ({"algorithms": ()}, "algorithms"),
    ({"algorithms": (AlgorithmConfig(name="ino", alpha=-1.0),)}, "algorithms[0].alpha"),
    ({"algorithms": (AlgorithmConfig(name="dpsgd"), AlgorithmConfig(name="dpsgd_s", quantile=1.5))},
     "algorithms[1].quantile"),
    ({"tiers": TiersConfig(tiers=(TierConfig(epsilon=-1.0, classes=(0,)),))}, "tiers.tiers[0].epsilon"),
    ({"looa_k": 2, "looa_models": 1}, "looa_models"),
])
def test_invalid_configs_name_the_field(changes, field):
    with pytest.raises(ConfigError) as e:
        TINY.replace(**changes).validate()
    assert e.value.field == field


@pytest.mark.parametrize("text, field", [
    ('{"R": 4, "colour": 1}', "colour"),
    ('{"algorithms": ["sgd"]}', "algorithms[0]"),
    ('{"algorithms": [{"name": "ino", "gamma": 1}]}', "algorithms[0].gamma"),
    ("[1, 2]", "config"),
    ("{not json", "config"),
])
def test_invalid_json_names_the_field(text, field):
    with pytest.raises(ConfigError) as e:
        AuditConfig.from_json(text)
    assert e.value.field == field


@pytest.mark.parametrize("changes, field", [
    ({"group_by": "attribute"}, "group_by"),  # digits has no sensitive attribute
    ({"batch_size": 1000}, "batch_size"),  # larger than a half
    ({"algorithms": (AlgorithmConfig(name="dpsgd_s", group_by="attribute"),)}, "algorithms[0].group_by"),
    ({"tiers": TiersConfig(tiers=(TierConfig(epsilon=1.0, classes=(0, 1)),))}, "tiers.tiers"),  # 2..9: no tier
])
def test_data_dependent_errors(changes, field):
    with pytest.raises(ConfigError) as e:
        prepare_audit(TINY.replace(**changes))
    assert e.value.field == field


# --------------------------------------------------------------------------------------------
# audits: invariants, CLI and store, checkpoint / resume
# --------------------------------------------------------------------------------------------

def test_membership_invariant():
    setup = prepare_audit(TINY.replace(R=5))
    mem = setup.membership
    assert mem.shape == (10, setup.n)
    assert np.all(mem.sum(0) == 5)  # each sample is a member of exactly R of the 2R models
    assert np.all(mem[0::2] != mem[1::2])  # complementary halves


def test_dp_audit_invariants_lower_bound_below_claimed():
    cfg = TINY.replace(R=4, epochs=6.0, tiers=TiersConfig(), algorithms=(AlgorithmConfig(name="idp_sample"),
                                                             AlgorithmConfig(name="nonprivate")))
    res = run_audit(cfg)
    assert [a["key"] for a in res["algorithms"]] == ["idp_sample", "nonprivate"]
    idp, nonpriv = res["algorithms"]
    assert len(idp["epsilon"]["tiers"]) == 3
    for t in idp["epsilon"]["tiers"]:
        assert t["claimed"] <= t["target"] * (1 + 1e-9) and t["claimed"] >= 0.99 * t["target"]
        assert 0.0 <= t["lower_bound"] <= t["claimed"]  # never above the guarantee
        assert t["tp"] + t["fn"] + t["fp"] + t["tn"] > 0
    assert all(t["claimed"] is None for t in nonpriv["epsilon"]["tiers"])
    for a in res["algorithms"]:
        for g in res["group_names"]:
            gp = a["gpr"]["groups"][g]
            assert 0.0 <= gp["low"] <= gp["mean"] <= gp["high"] <= 1.0
        assert 0.0 <= a["null_floor"] <= 1.0 and 0.5 < a["accuracy"]["mean"] <= 1.0  # chance: 0.1
        assert sum(sum(c) for c in a["histogram"]["counts"].values()) == res["n_train"]
        d = a["gpr"]["delta"]["value"]
        gprs = [a["gpr"]["groups"][g]["mean"] for g in res["group_names"]]
        assert d == pytest.approx((max(gprs) - min(gprs)) * 100)
        assert 0.0 <= a["lira"]["groups"]["0"]["auc"] <= 1.0


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)


def _cli(*args, timeout=240):
    env = _env()
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_cli_end_to_end_through_the_store(tmp_path):
    cfg = TINY.replace(algorithms=(AlgorithmConfig(name="dpsgd"), AlgorithmConfig(name="dpsgd_s", group_by="class")),
                       threshold="held_out")
    path = tmp_path / "audit.json"
    path.write_text(cfg.to_json())
    store_path = tmp_path / "store.sqlite"
    out = _cli("--store", str(store_path), "audit", str(path), "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    store = RunStore(store_path)
    run = store.get_run(summary["run_id"])
    assert run["kind"] == "audit" and run["status"] == "finished"
    assert run["config"] == cfg.to_dict()
    assert [a["key"] for a in summary["algorithms"]] == ["dpsgd", "dpsgd_s"]
    assert summary["n_models"] == 6
    assert summary["algorithms"] == compact_summary(run["summary"])["algorithms"]
    adv = load_array(store.get_artifact(run["id"], "advantage/dpsgd"))
    assert adv.shape == (run["summary"]["n_train"],)
    finite = adv[np.isfinite(adv)]
    assert finite.min() >= -1 and finite.max() <= 1  # held-out may dip below 0 by noise
    assert len(store.artifact_keys(run["id"])) >= 1 + 2 * 2  # meta + ALOOA and LOOA chunks of each algorithm
    bad = tmp_path / "bad.json"
    bad.write_text('{"R": 0}')
    out = _cli("--store", str(store_path), "audit", str(bad))
    assert out.returncode == 2 and out.stderr.strip() == "error: R: must be an integer in 2..100000, got 0"


def test_checkpoint_resume_gives_the_uninterrupted_results(tmp_path):
    cfg = TINY.replace(chunk_models=2, looa_k=0)  # 6 models → 3 chunks
    store = RunStore(tmp_path / "s.sqlite")
    run_id = store.create_run(cfg.to_dict(), kind="audit", group_id="g")
    stop = lambda: any(k.startswith("chunk/") for k in store.artifact_keys(run_id))  # noqa: E731
    with pytest.raises(Cancelled):
        run_audit(cfg, store=store, run_id=run_id, should_stop=stop)
    run = store.get_run(run_id)
    assert run["status"] == "cancelled"
    first = store.get_artifact(run_id, "chunk/dpsgd/aloo/0")
    assert first is not None and store.get_artifact(run_id, "chunk/dpsgd/aloo/1") is None
    resumed = run_audit(cfg, store=store, run_id=run_id)
    assert store.get_run(run_id)["status"] == "finished"
    assert store.get_artifact(run_id, "chunk/dpsgd/aloo/0") == first  # not retrained
    fresh = run_audit(cfg)
    for a, b in zip(resumed["algorithms"], fresh["algorithms"]):
        assert a["gpr"] == b["gpr"] and a["accuracy"] == b["accuracy"] and a["null_floor"] == b["null_floor"]
    # a different configuration must not pick up these checkpoints
    with pytest.raises(ConfigError):
        run_audit(cfg.replace(seed=1), store=store, run_id=run_id)


def test_worker_runs_a_queued_audit_and_sigterm_cancels(tmp_path):
    store_path = tmp_path / "w.sqlite"
    store = RunStore(store_path)
    quick = store.create_run(TINY.to_dict(), kind="audit", group_id="g")
    out = _cli("--store", str(store_path), "worker", str(quick))
    assert out.returncode == 0, out.stderr
    assert store.get_run(quick)["status"] == "finished"
    # a long audit, terminated while it trains
    slow_cfg = TINY.replace(R=400, epochs=20.0, batch_size=16, looa_k=0, chunk_models=50)
    slow = store.create_run(slow_cfg.to_dict(), kind="audit", group_id="g")
    env = _env()
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--store", str(store_path), "worker", str(slow)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and (store.get_run(slow)["step"] or 0) == 0:
            assert proc.poll() is None
            time.sleep(0.1)
        assert store.get_run(slow)["status"] == "running"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    run = store.get_run(slow)
    assert run["status"] == "cancelled" and "signal" in run["error"]
