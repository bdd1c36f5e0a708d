"""The privacy audit: configuration, invariants, CLI, store, resume (the training pipeline: tests/test_step.py)."""
from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from in_process import cli_here

from conftest import wait_until
from engine.audit.pa_alooa.config import DEFAULT_RUN, AuditConfig
from engine.audit.pa_alooa.report import AuditReport
from engine.audit.pa_alooa.summary import compact_summary, summary_table
from engine.audit.pa_alooa.setup import prepare_audit
from engine.audit.pa_alooa.runner import run_audit
from engine.config.run import AlgorithmConfig, DataConfig, RunConfig, TierConfig, TiersConfig
from engine.config.schema import ConfigError
from engine.jobs.kinds import execute, run_queued
from engine.store.artifacts import load_array
from engine.store.db import RunStore
from engine.store.lifecycle import Cancelled

REPO = Path(__file__).resolve().parents[1]

# A tiny digits audit: ~1 s per algorithm.
TINY = AuditConfig(run=DEFAULT_RUN.replace(**{"data.name": "digits", "epochs": 2.0, "batch_size": 64, "threads": 1}),
                   group_by="class", R=3, epsilon=2.0, algorithms=(AlgorithmConfig(name="dpsgd"),), n_boot=100,
                   looa_k=1, looa_models=3)


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
    cfg = TINY.replace(**{"run.tiers": TiersConfig(assign="class", tiers=(
        TierConfig(epsilon=1.0, classes=tuple(range(5))), TierConfig(epsilon=3.0, classes=tuple(range(5, 10)))))},
                       algorithms=(AlgorithmConfig(name="ino", alpha=2.0, tail_fraction=0.25),
                                   AlgorithmConfig(name="dpsgd_s", group_by="class")))
    back = AuditConfig.from_json(cfg.to_json())
    assert back == cfg and back.to_json() == cfg.to_json()
    short = AuditConfig.from_dict({"algorithms": ["dpsgd", "nonprivate"], "R": 4})
    assert [a.name for a in short.algorithms] == ["dpsgd", "nonprivate"] and short.R == 4
    assert AuditConfig().validate() is not None  # the defaults are valid


def test_config_contains_a_run_config_with_the_audit_defaults():
    cfg = AuditConfig()
    assert isinstance(cfg.run, RunConfig) and cfg.run.data.name == "adult" and cfg.run.model.name == "lr"
    assert (cfg.run.epochs, cfg.run.batch_size, cfg.run.optimizer.lr, cfg.epsilon, cfg.R) == (2.0, 256, 1.0, 10.0, 16)
    assert cfg.run.tiers is None and cfg.to_dict()["run"]["tiers"] is None
    assert "algorithm" not in cfg.to_dict()["run"] and "dataset" not in cfg.to_dict()
    # a run object only needs what differs from the audit's defaults, one level deep
    part = AuditConfig.from_dict({"run": {"data": {"max_train": 500}, "epochs": 3.0}})
    assert part.run.data == DataConfig(name="adult", max_train=500) and part.run.epochs == 3.0
    assert part.run.batch_size == 256 and part.run.model.name == "lr"
    one = TINY.run_for(AlgorithmConfig(name="ino"), TiersConfig())
    assert one.algorithm.name == "ino" and one.tiers == TiersConfig() and one.data == TINY.run.data


def test_old_flat_audit_configs_still_load():
    """Audit configs stored before the nested run config (the flat shape) load as the same audit."""
    old = {"dataset": "digits", "data_dir": None, "max_train": 300, "model": "mlp", "hidden": [8, 4], "lr": 0.5,
           "epochs": 3.0, "batch_size": 32, "delta": 1e-6, "clip_norm": 2.0, "seed": 3, "device": "cpu",
           "threads": 1, "tiers": {"assign": "class", "tiers": [{"epsilon": 1.0, "classes": [0, 1, 2, 3, 4]},
                                                                 {"epsilon": 2.0, "classes": [5, 6, 7, 8, 9]}]},
           "epsilon": 10.0, "group_by": "class", "group_attribute": None, "algorithms": ["dpsgd", {"name": "ino"}],
           "R": 4, "threshold": "held_out", "n_boot": 100, "confidence": 0.9, "null_perms": 1, "looa_k": 0,
           "looa_models": 16, "chunk_models": None, "memory_budget_gib": 1.0, "name": "old"}
    cfg = AuditConfig.from_dict(old).validate()
    run = cfg.run
    assert (run.data.name, run.data.max_train, run.model.name, run.model.hidden) == ("digits", 300, "mlp", (8, 4))
    assert (run.optimizer.lr, run.epochs, run.batch_size, run.delta, run.clip_norm) == (0.5, 3.0, 32, 1e-6, 2.0)
    assert (run.seed, run.device, run.threads) == (3, "cpu", 1)
    assert [t.epsilon for t in run.tiers.tiers] == [1.0, 2.0] and run.tiers.tiers[1].classes == (5, 6, 7, 8, 9)
    assert (cfg.R, cfg.threshold, cfg.confidence, cfg.name) == (4, "held_out", 0.9, "old")
    assert [a.name for a in cfg.algorithms] == ["dpsgd", "ino"]
    assert AuditConfig.from_dict(cfg.to_dict()) == cfg  # and it is written in the nested shape from now on
    flat_default = AuditConfig.from_dict({"dataset": "digits", "tiers": None, "epsilon": 2.0})
    assert flat_default.run.tiers is None and flat_default.epsilon == 2.0 and flat_default.run.epochs == 2.0
    with pytest.raises(ConfigError) as e:  # mixing the shapes is refused, naming the flat key
        AuditConfig.from_dict({"run": {}, "lr": 0.1})
    assert e.value.field == "lr" and "run.optimizer.lr" in e.value.message


@pytest.mark.parametrize("changes, field", [
    ({"R": 1}, "R"),
    ({"epsilon": 0.0}, "epsilon"),
    ({"epsilon": float("inf")}, "epsilon"),
    ({"run.delta": 1.0}, "run.delta"),
    ({"run.batch_size": 0}, "run.batch_size"),
    ({"run.epochs": -1.0}, "run.epochs"),
    ({"run.optimizer.lr": 0.0}, "run.optimizer.lr"),
    ({"run.model.name": "resnet18"}, "run.model.name"),
    ({"run.data.name": "nope"}, "run.data.name"),
    ({"threshold": "both"}, "threshold"),
    ({"score": "probability"}, "score"),
    ({"null_perms": 0}, "null_perms"),
    ({"group_by": "age"}, "group_by"),
    ({"n_boot": 1}, "n_boot"),
    ({"confidence": 1.5}, "confidence"),
    ({"algorithms": ()}, "algorithms"),
    ({"algorithms": (AlgorithmConfig(name="ino", alpha=-1.0),)}, "algorithms[0].alpha"),
    ({"algorithms": (AlgorithmConfig(name="dpsgd"), AlgorithmConfig(name="dpsgd_s", quantile=1.5))},
     "algorithms[1].quantile"),
    ({"run.tiers": TiersConfig(tiers=(TierConfig(epsilon=-1.0, classes=(0,)),))}, "run.tiers.tiers[0].epsilon"),
    ({"looa_k": 2, "looa_models": 1}, "looa_models"),
    ({"run.optimizer.momentum": 0.5}, "run.optimizer.momentum"),  # the ensembles train with plain SGD
    ({"run.data.max_train": 5}, "run.data.max_train"),
])
def test_invalid_configs_name_the_field(changes, field):
    with pytest.raises(ConfigError) as e:
        TINY.replace(**changes).validate()
    assert e.value.field == field


@pytest.mark.parametrize("text, field", [
    ('{"R": 4, "colour": 1}', "colour"),
    ('{"algorithms": ["sgd"]}', "algorithms[0]"),
    ('{"algorithms": [{"name": "ino", "gamma": 1}]}', "algorithms[0].gamma"),
    ('{"run": {"data": {"name": 3}}}', "run.data.name"),
    ('{"run": {"optimizer": {"lr": "fast"}}}', "run.optimizer.lr"),
    ('{"run": {"algorithm": {"name": "ino"}}}', "run.algorithm"),
    ('{"run": {"epoch": 2}}', "run.epoch"),
    ('{"run": 5}', "run"),
    ('{"algorithms": ["dpsgd", {"name": "dpsgd_s", "tau": "x"}]}', "algorithms[1].tau"),
    ("[1, 2]", "config"),
    ("{not json", "config"),
])
def test_invalid_json_names_the_field(text, field):
    with pytest.raises(ConfigError) as e:
        AuditConfig.from_json(text)
    assert e.value.field == field


@pytest.mark.parametrize("changes, field", [
    ({"group_by": "attribute"}, "group_by"),  # digits has no sensitive attribute
    ({"run.batch_size": 1000}, "run.batch_size"),  # larger than a half
    ({"algorithms": (AlgorithmConfig(name="dpsgd_s", group_by="attribute"),)}, "algorithms[0].group_by"),
    ({"run.tiers": TiersConfig(tiers=(TierConfig(epsilon=1.0, classes=(0, 1)),))}, "run.tiers.tiers"),  # 2..9: none
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
    assert mem.shape == (10, setup.n) == (setup.n_models, setup.n) and setup.config.n_models == 10  # 2R, one count
    assert np.all(mem.sum(0) == 5)  # each sample is a member of exactly R of the 2R models
    assert np.all(mem[0::2] != mem[1::2])  # complementary halves


def test_dp_audit_invariants_lower_bound_below_claimed():
    cfg = TINY.replace(R=4, algorithms=(AlgorithmConfig(name="idp_sample"), AlgorithmConfig(name="nonprivate")),
                       **{"run.epochs": 6.0, "run.tiers": TiersConfig()})
    res = run_audit(cfg)
    assert [a.key for a in res.algorithms] == ["idp_sample", "nonprivate"]
    idp, nonpriv = res.algorithms
    assert len(idp.epsilon) == 3
    for t in idp.epsilon:
        assert t.claimed <= t.target * (1 + 1e-9) and t.claimed >= 0.99 * t.target
        assert 0.0 <= t.lower_bound <= t.claimed  # never above the guarantee
        assert t.tp + t.fn + t.fp + t.tn > 0
    assert all(t.claimed is None for t in nonpriv.epsilon)
    for a in res.algorithms:
        for g in res.group_names:
            gp = a.gpr[g]
            assert -1.0 <= gp.low <= gp.value <= gp.high <= 1.0  # held-out (the default) may dip below 0
            assert abs(a.null_groups[g]) <= 1.0
        assert abs(a.null_floor) <= 1.0 and 0.5 < a.accuracy.mean <= 1.0  # chance: 0.1
        assert a.null_delta.low <= a.null_delta.value <= a.null_delta.high and a.resolved in (True, False)
        assert sum(sum(c) for c in a.histogram.counts.values()) == res.n_train
        gprs = [a.gpr[g].value for g in res.group_names]
        assert a.delta_plug_in == pytest.approx((max(gprs) - min(gprs)) * 100)  # Δ: bias-corrected from it
        assert 0.0 <= a.delta.low <= a.delta.value <= a.delta.high
        assert 0.0 <= a.lira["0"].auc <= 1.0
    _check_report_round_trip_and_frames(res)


def _check_report_round_trip_and_frames(res: AuditReport):
    d = res.to_dict()
    assert AuditReport.from_dict(d) == res
    assert AuditReport.from_dict(json.loads(json.dumps(d))) == res  # what the store gives back
    assert d["kind"] == "audit" and d["version"] == 3 and [a["key"] for a in d["algorithms"]] == \
        [a.key for a in res.algorithms]
    # the results-dict shape the figures and pages read today
    a0 = d["algorithms"][0]
    assert set(a0) >= {"key", "name", "label", "formal_dp", "algorithm", "plan", "info", "gpr", "null_floor",
                       "advantage_mean", "baselines", "accuracy", "lira", "epsilon", "histogram", "train_seconds",
                       "stats_seconds"}
    assert set(a0["gpr"]) == {"groups", "delta", "n_boot", "ci"} and set(a0["lira"]) == {"groups", "roc"}
    assert set(a0["gpr"]["delta"]) == {"value", "low", "high", "plug_in"}  # version 3: Δ bias-corrected
    n_alg, n_groups = len(res.algorithms), len(res.group_names)
    gpr = res.gpr_frame()
    assert len(gpr) == n_alg * n_groups and gpr["gpr"].between(-1, 1).all()
    assert list(res.delta_frame()["algorithm"]) == [a.label for a in res.algorithms]
    assert len(res.epsilon_frame()) == sum(len(a.epsilon) for a in res.algorithms)
    assert (res.accuracy_frame().query("group == 'all'")["accuracy"] > 0.5).all()
    hist = res.histogram_frame()
    assert hist.groupby("algorithm")["count"].sum().eq(res.n_train).all()
    roc = res.roc_frame()
    assert set(roc["group"]) == set(res.group_names) and roc["fpr"].between(0, 1).all()
    assert (res.baselines_frame()["attack"] == "PA-GA (one threshold per model)").sum() == n_alg
    # the figures built from the stored dict show the report's frames
    from engine.figures.audit import build_audit_figures

    frames = {"gpr_bars": "gpr", "delta_table": "delta", "accuracy": "accuracy", "epsilon_bounds": "epsilon",
              "lira_roc": "roc", "advantage_hist": "histogram", "baselines": "baselines",
                  "paired_differences": "comparison"}
    for spec in build_audit_figures(d):
        pd.testing.assert_frame_equal(spec.data, getattr(res, f"{frames[spec.name]}_frame")())


def test_stored_results_dicts_load_as_reports():
    """A partial summary (a running audit) and results with fields this version does not know still load."""
    algo = {"key": "dpsgd", "name": "dpsgd", "label": "DP-SGD", "formal_dp": True, "algorithm": {"name": "dpsgd"},
            "plan": None, "info": {},
            "gpr": {"groups": {"a": {"mean": 0.1, "low": 0.05, "high": 0.2}, "b": {"mean": None, "low": None,
                                                                                    "high": None}},
                    "delta": {"value": 3.0, "low": 1.0, "high": 5.0}, "n_boot": 100, "ci": 0.95},
            "null_floor": 0.01, "advantage_mean": 0.1,
            "baselines": {"pa_ga": 0.02, "pa_gba": {"a": 0.03, "b": 0.01},
                          "pa_looa": [{"index": 7, "group": "a", "looa_advantage": 0.5, "aloo_advantage": 0.4}],
                          "looa_models": 6, "looa_models_per_record": 4},
            "accuracy": {"mean": 0.8, "std": 0.01, "min": 0.79, "max": 0.81, "groups": {"a": 0.7}},
            "lira": {"groups": {"a": {"auc": 0.6, "tpr_at_0.1%": 0.0, "tpr_at_1%": 0.02}},
                     "roc": {"a": {"fpr": [0.01, 1.0], "tpr": [0.02, 1.0]}}},
            "epsilon": {"tiers": [{"name": "all", "claimed": 2.0, "target": 2.0, "lower_bound": 0.3, "tpr": 0.1,
                                   "fpr": 0.05, "tp": 1, "fn": 9, "fp": 1, "tn": 19, "new_field": 1}],
                        "confidence": 0.95, "delta": 1e-5},
            "histogram": {"edges": [0.0, 0.5, 1.0], "counts": {"a": [3, 1], "b": [2, 0]}}}
    partial = {"kind": "audit", "version": 1, "config": {"dataset": "digits", "R": 3}, "dataset": "digits",
               "n_train": 6, "R": 3, "n_models": 6, "steps_per_model": 5, "threshold": "in_sample",
               "group_by": "class", "group_names": ["a", "b"], "group_sizes": {"a": 4, "b": 2},
               "tier_names": ["all"], "tier_sizes": [6], "device": "cpu", "chunk_models": 6,
               "algorithms": [algo], "seconds": 1.5, "partial": True}
    r = AuditReport.from_dict(partial)
    assert r.partial and r.train_seconds is None and r.algorithm("dpsgd").gpr["b"].value is None
    assert r.algorithms[0].baselines.pa_looa[0].index == 7 and r.algorithms[0].epsilon[0].lower_bound == 0.3
    assert r.audit_config.run.data.name == "digits" and r.audit_config.R == 3  # flat config: migrated
    assert AuditReport.from_dict(r.to_dict()) == r
    assert "new_field" not in r.to_dict()["algorithms"][0]["epsilon"]["tiers"][0]
    assert "PA-ALOOA on digits" in summary_table(partial) and "[partial]" in summary_table(partial)
    assert compact_summary(partial)["algorithms"][0]["gpr"] == {"a": 0.1, "b": None}
    assert len(r.gpr_frame()) == 2 and len(r.baselines_frame()) == 2 + 1 + 2 + 1
    with pytest.raises(KeyError, match="dpsgd"):
        r.algorithm("ino")


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)


def _cli(*args):
    return cli_here(*args)  # in this process (tests/in_process.py); SIGTERM of a worker below is a real process


@pytest.mark.slow
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
    # its figures and their data export like a training run's (no training curves: the audit's own)
    out = _cli("--store", str(store_path), "export", str(run["id"]), "--format", "html", "--format", "csv",
               "--out", str(tmp_path / "export"))
    assert out.returncode == 0, out.stderr
    written = sorted(Path(p).name for p in out.stdout.split())
    assert f"runs-{run['id']}_gpr_bars.html" in written and f"runs-{run['id']}_delta_table.csv" in written, written
    assert all((tmp_path / "export" / n).stat().st_size > 0 for n in written)
    bad = tmp_path / "bad.json"
    bad.write_text('{"R": 0}')
    out = _cli("--store", str(store_path), "audit", str(bad))
    assert out.returncode == 2 and out.stderr.strip() == "error: R: must be an integer in 2..100000, got 0"
    # --set changes a field of the file's (or a preset's) config, typed and validated like the file
    out = _cli("--store", str(store_path), "audit", str(path), "--set", "R=2", "--set", "run.model.name=mlp", "--json")
    assert out.returncode == 0, out.stderr
    run = store.get_run(json.loads(out.stdout.strip().splitlines()[-1])["run_id"])
    assert run["config"] == cfg.replace(R=2, run=cfg.run.replace(**{"model.name": "mlp"})).to_dict()
    assert run["summary"]["n_models"] == 4
    out = _cli("--store", str(store_path), "audit", "--preset", "quick", "--set", "R=1")
    assert out.returncode == 2 and out.stderr.strip() == "error: R: must be an integer in 2..100000, got 1"


def test_checkpoint_resume_gives_the_uninterrupted_results(tmp_path):
    cfg = TINY.replace(chunk_models=2, looa_k=0)  # 6 models → 3 chunks
    store = RunStore(tmp_path / "s.sqlite")
    run_id = store.create_run(cfg.to_dict(), kind="audit", group_id="g")
    stop = lambda: any(k.startswith("chunk/") for k in store.artifact_keys(run_id))  # noqa: E731
    with pytest.raises(Cancelled):
        execute(store, run_id, cfg, kind="audit", should_stop=stop)
    run = store.get_run(run_id)
    assert run["status"] == "cancelled"
    first = store.get_artifact(run_id, "chunk/dpsgd/aloo/0")
    assert first is not None and store.get_artifact(run_id, "chunk/dpsgd/aloo/1") is None
    resumed = execute(store, run_id, cfg, kind="audit")
    assert store.get_run(run_id)["status"] == "finished"
    assert store.get_artifact(run_id, "chunk/dpsgd/aloo/0") == first  # not retrained
    fresh = run_audit(cfg)
    for a, b in zip(resumed.algorithms, fresh.algorithms):
        assert a.gpr == b.gpr and a.accuracy == b.accuracy and a.null_floor == b.null_floor
    assert store.get_run(run_id)["summary"] == resumed.to_dict()
    # a different configuration must not pick up these checkpoints
    with pytest.raises(ConfigError):
        execute(store, run_id, cfg.replace(**{"run.seed": 1}), kind="audit")


def test_an_old_flat_audit_in_a_store_resumes_from_its_checkpoints(tmp_path):
    flat = {"dataset": "digits", "epochs": 2.0, "batch_size": 64, "threads": 1, "group_by": "class", "R": 3,
            "epsilon": 2.0, "algorithms": ["dpsgd"], "n_boot": 100, "looa_k": 0, "chunk_models": 2}
    cfg = AuditConfig.from_dict(flat).validate()
    store = RunStore(tmp_path / "old.sqlite")
    run_id = store.create_run(flat, kind="audit", group_id="g")
    with pytest.raises(Cancelled):
        execute(store, run_id, cfg, kind="audit",
                should_stop=lambda: any(k.startswith("chunk/") for k in store.artifact_keys(run_id)))
    meta = json.loads(store.get_artifact(run_id, "audit/meta"))
    meta["config"] = flat  # what an audit written before the nested config left in its store
    store.put_artifact(run_id, "audit/meta", json.dumps(meta).encode())
    first = store.get_artifact(run_id, "chunk/dpsgd/aloo/0")
    report = run_queued(store, run_id)  # the worker entry
    assert store.get_run(run_id)["status"] == "finished" and report.n_models == 6
    assert store.get_artifact(run_id, "chunk/dpsgd/aloo/0") == first  # resumed, not retrained


@pytest.mark.slow
def test_worker_runs_a_queued_audit_and_sigterm_cancels(tmp_path):
    store_path = tmp_path / "w.sqlite"
    store = RunStore(store_path)
    quick = store.create_run(TINY.to_dict(), kind="audit", group_id="g")
    out = _cli("--store", str(store_path), "worker", str(quick))
    assert out.returncode == 0, out.stderr
    assert store.get_run(quick)["status"] == "finished"
    # a long audit, terminated while it trains
    slow_cfg = TINY.replace(R=400, looa_k=0, chunk_models=50, **{"run.epochs": 20.0, "run.batch_size": 16})
    slow = store.create_run(slow_cfg.to_dict(), kind="audit", group_id="g")
    env = _env()
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--store", str(store_path), "worker", str(slow)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def trains():
            assert proc.poll() is None
            return (store.get_run(slow)["step"] or 0) > 0

        wait_until(trains, 120, "the audit to train", interval=0.1)
        assert store.get_run(slow)["status"] == "running"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    run = store.get_run(slow)
    assert run["status"] == "cancelled" and "signal" in run["error"]


@pytest.mark.slow
def test_a_foreground_audit_stopped_by_cancel_says_so_in_one_line_naming_it(tmp_path):
    """`privacy-lab audit` stopped by SIGTERM (what `privacy-lab cancel` from another shell sends first): the audit is
    cancelled with what it computed so far, and the command prints one line naming it and exits 128 + SIGTERM (no
    traceback)."""
    store_path = tmp_path / "runs.sqlite"
    store = RunStore(store_path)
    cfg = tmp_path / "audit.json"
    long = TINY.replace(R=400, looa_k=0, chunk_models=50, **{"run.epochs": 20.0, "run.batch_size": 16})
    cfg.write_text(long.to_json())
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--store", str(store_path), "audit", str(cfg), "--json"],
                            cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: store.list_runs() and (store.list_runs()[0]["step"] or 0) > 0, 120, "the audit to train")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143
        lines = [line for line in proc.stderr.read().splitlines() if line.strip()]
        assert len(lines) == 1 and re.fullmatch(r"stopped: terminated by signal( at step \d+)?; run 1 is recorded as "
                                                r"cancelled, with what it logged so far", lines[0]), lines
    finally:
        if proc.poll() is None:
            proc.kill()
    assert store.get_run(1)["status"] == "cancelled" and "signal" in store.get_run(1)["error"]


@pytest.mark.slow  # two audits
def test_the_report_is_the_same_on_one_thread_and_with_its_statistics_side_by_side(monkeypatch):
    """With more than one statistics thread the analysis runs LiRA, the ε bound and PA-GA / PA-GBA on a helper
    thread beside the per-sample advantage, its bootstrap and the null (``parallel.beside``): the report equals the
    one-thread report in every number, and the helper thread did run."""
    from engine.audit.pa_alooa import stats

    ran_on = []
    lira = stats.lira_scores
    monkeypatch.setattr(stats, "lira_scores", lambda *a, **k: ran_on.append(threading.current_thread().name)
                        or lira(*a, **k))
    cfg = TINY.replace(R=4, group_by="attribute", **{"run.data.name": "adult", "run.epochs": 1.0,
                                                     "run.model.name": "lr", "run.batch_size": 256},
                       group_attribute="sex")

    def numbers():  # every number but the timings
        def drop(v):
            if isinstance(v, dict):
                return {k: drop(x) for k, x in v.items() if k != "seconds" and not k.endswith("_seconds")}
            return [drop(x) for x in v] if isinstance(v, list) else v
        return json.dumps(drop(run_audit(cfg).to_dict()), sort_keys=True)

    old = stats.set_threads(1)
    try:
        one = numbers()
        stats.set_threads(3)
        three = numbers()
    finally:
        stats.set_threads(old)
    assert one == three
    assert ran_on[0] == threading.main_thread().name and ran_on[-1].startswith("audit-stats-beside")


def test_beside_returns_both_and_raises_what_either_raises():
    from engine.audit.pa_alooa import parallel

    def name():
        return threading.current_thread().name

    old = parallel.set_threads(2)
    try:
        front, back = parallel.beside(name, name)
        assert front == threading.main_thread().name and back.startswith("audit-stats-beside")
        with pytest.raises(ZeroDivisionError):
            parallel.beside(lambda: 1 / 0, name)
        with pytest.raises(KeyError):
            parallel.beside(name, lambda: {}["x"])
        parallel.set_threads(1)
        assert parallel.beside(name, name) == (threading.main_thread().name,) * 2  # one thread: one after the other
    finally:
        parallel.set_threads(old)
