"""Audit scores that resolve leakage: float64 logit confidence, the privacy ordering beyond the CIs, the
null Δ and its "resolved" flag, null claimed ε for algorithms without a formal guarantee, old reports
and checkpoints."""
from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch
from in_process import cli_here
from scipy.special import logsumexp

from engine.audit.pa_alooa import stats
from engine.audit.pa_alooa.config import AuditConfig
from engine.audit.pa_alooa.design import complementary_membership
from engine.audit.pa_alooa.presets import PRESETS, preset
from engine.audit.pa_alooa.report import AuditReport
from engine.audit.pa_alooa.summary import compact_summary, summary_table
from engine.audit.pa_alooa.setup import preview_audit
from engine.audit.pa_alooa.runner import _npz, _unnpz, run_audit
from engine.config.run import AlgorithmConfig, ModelConfig
from engine.config.schema import ConfigError
from engine.data import load_dataset
from engine.dp.mechanisms import NonPrivate
from engine.dp.stacked import StackedModels, sgd_train
from engine.dp.step import PoissonSampler
from engine.jobs.kinds import execute
from engine.store.db import RunStore

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: torch on one thread


def _train_all_members(name, n_models, dataset, steps, lr, seeds=None):
    """``n_models`` non-private models, each trained on the whole training set (Poisson batches of ~64)."""
    n = len(dataset.y_train)
    ens = StackedModels(ModelConfig(name=name), dataset.input_shape, dataset.num_classes,
                        list(seeds if seeds is not None else range(n_models)), CPU)
    sampler = PoissonSampler(np.ones((n_models, n), bool), np.full(n, min(1.0, 64 / n)), CPU,
                             expected_batch=min(1.0, 64 / n) * n)
    sgd_train(ens, dataset.x_train, dataset.y_train, sampler, NonPrivate(n_models, CPU), steps=steps, lr=lr,
              gen=torch.Generator().manual_seed(0))
    return ens


def _tie_rate(a: np.ndarray) -> float:
    """Fraction of scores equal to another model's score of the same sample (what blinds the threshold attack)."""
    s = np.sort(a, 0)
    eq = s[1:] == s[:-1]
    tied = np.zeros_like(a, bool)
    tied[1:] |= eq
    tied[:-1] |= eq
    return float(tied.mean())


# --------------------------------------------------------------------------------------------
# the score
# --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_logit_confidence_is_float64_stable_and_rarely_tied():
    ds = load_dataset("adult", seed=0, max_train=2000)
    ens = _train_all_members("lr", 4, ds, steps=1000, lr=10.0)  # well fit: large margins
    loss, conf, _ = ens.score(ds.x_train, ds.y_train, chunk=512)
    assert loss.dtype == np.float64 and conf.dtype == np.float64
    z = ens.logits(ds.x_train).detach().double().numpy()  # (M, n, C)
    y = ds.y_train.numpy()
    zy = np.take_along_axis(z, y[None, :, None], 2)[..., 0]
    others = z.copy()
    np.put_along_axis(others, y[None, :, None], -np.inf, 2)
    ref = zy - logsumexp(others, axis=2)  # z_y − logsumexp_{j≠y} z_j, float64
    np.testing.assert_allclose(conf, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(loss, logsumexp(z, axis=2) - zy, rtol=1e-12, atol=1e-12)
    # what the audit scored before: the float32 loss, exactly 0 for a large part of a well-fit model's samples
    z32 = torch.as_tensor(z, dtype=torch.float32)
    loss32 = (torch.logsumexp(z32, -1) - z32.gather(-1, torch.as_tensor(y).view(1, -1, 1).expand(4, -1, 1))[..., 0])
    assert (loss32.numpy() == 0).mean() > 0.2 and _tie_rate(loss32.numpy()) > 0.2
    assert _tie_rate(conf) < 0.01  # the logit confidence keeps them apart
    # margins beyond what log(p) − log(1 − p) from a probability can represent (it saturates near 27.6)
    assert np.isfinite(conf).all() and np.abs(conf).max() > 40 > stats.logit_confidence(1.0)


# --------------------------------------------------------------------------------------------
# the ordering and the null Δ
# --------------------------------------------------------------------------------------------

def _quick(epsilon, algorithms, **changes):
    return PRESETS["quick"].replace(epsilon=epsilon, algorithms=tuple(AlgorithmConfig(name=a) for a in algorithms),
                                    R=32, n_boot=300, null_perms=5, **changes)


@pytest.mark.slow
def test_quick_config_orders_nonprivate_above_eps10_above_eps1_beyond_the_cis():
    """One GPR over all training samples (group_by tier with one tier), its bootstrap CI per algorithm."""
    hi = run_audit(_quick(10.0, ("nonprivate", "dpsgd"), group_by="tier"))
    lo = run_audit(_quick(1.0, ("dpsgd",), group_by="tier"))
    (g,) = hi.group_names
    nonpriv, eps10 = hi.algorithm("nonprivate").gpr[g], hi.algorithm("dpsgd").gpr[g]
    (g1,) = lo.group_names
    eps1 = lo.algorithm("dpsgd").gpr[g1]
    assert nonpriv.low > eps10.high, (nonpriv, eps10)
    assert eps10.low > eps1.high, (eps10, eps1)
    assert eps1.low > lo.algorithm("dpsgd").null_groups[g1]  # still above its own null floor
    for a in hi.algorithms + lo.algorithms:
        assert a.resolved is None  # one group: no Δ to resolve


@pytest.mark.slow
def test_null_delta_flags_a_delta_that_the_permutations_reach():
    """Per class: non-private leakage differs between digits beyond the null Δ spread (resolved); models that
    all trained on the identical full data have no membership signal, so their Δ is not resolved."""
    res = run_audit(_quick(10.0, ("nonprivate",)))
    a = res.algorithm("nonprivate")
    assert a.resolved is True and a.delta.low > a.null_delta.high
    assert set(a.null_groups) == set(res.group_names) and all(abs(v) < 0.02 for v in a.null_groups.values())
    for g in res.group_names:
        assert a.gpr[g].value > a.null_groups[g]  # every digit above its own floor
    # the identical-data null: 2R models on the same data, labelled with the audit's membership design
    ds = load_dataset("digits", seed=0)
    M = 32
    ens = _train_all_members("lr", M, ds, steps=300, lr=0.5)
    _, conf, _ = ens.score(ds.x_train, ds.y_train)
    mem = complementary_membership(len(ds.y_train), M // 2, seed=0)
    groups = ds.y_train.numpy().astype(str)
    adv = stats.sample_advantage(conf, mem, threshold="held_out", seed=0)
    boot = stats.bootstrap_gpr(adv, groups, n_boot=300, seed=0)
    null = stats.null_distribution(conf, mem, groups, threshold="held_out", n_perm=10, seed=1)
    assert null["delta"]["low"] <= null["delta"]["value"] <= null["delta"]["high"]
    assert stats.delta_resolved(boot["delta"]["low"], null["delta"]["high"]) is False
    assert stats.delta_resolved(None, 1.0) is None


# --------------------------------------------------------------------------------------------
# no formal guarantee → claimed ε null everywhere
# --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_non_formal_algorithms_have_null_claimed_epsilon_in_every_output(tmp_path):
    cfg = PRESETS["quick"].replace(R=3, n_boot=50, null_perms=2, looa_k=1, looa_models=2, **{"run.epochs": 2.0},
                                   algorithms=(AlgorithmConfig(name="nonprivate"),
                                               AlgorithmConfig(name="dpsgd_s", group_by="class",
                                                               private_quantile=False),
                                               AlgorithmConfig(name="dpsgd")))
    store = RunStore(tmp_path / "s.sqlite")
    run_id = store.create_run(cfg.to_dict(), kind="audit", group_id="g")
    rep = execute(store, run_id, cfg, kind="audit")
    nonpriv, dps, dp = rep.algorithms
    assert not nonpriv.formal_dp and not dps.formal_dp and dp.formal_dp
    assert "no formal DP" in dps.label
    for a in (nonpriv, dps):
        assert all(t.claimed is None for t in a.epsilon) and a.claimed_epsilons() == (None,)
        assert a.plan is None or all(p["epsilon"] is None for p in a.plan)
    assert dp.epsilon[0].claimed == pytest.approx(10.0, rel=0.01)
    assert AuditReport.from_dict(json.loads(json.dumps(rep.to_dict()))) == rep
    summ = compact_summary(rep)
    claimed = {a["key"]: [t["claimed"] for t in a["epsilon"]] for a in summ["algorithms"]}
    assert claimed["nonprivate"] == [None] and claimed["dpsgd_s"] == [None] and claimed["dpsgd"][0] > 9
    table = summary_table(rep).splitlines()
    for line in table:
        if line.startswith(("Non-private", "DP-SGD-S")):
            assert line.rstrip().endswith("/—"), line
    eps = rep.epsilon_frame().set_index("algorithm")
    assert eps.loc[["nonprivate", "dpsgd_s"], "claimed"].isna().all() and eps.loc["dpsgd", "claimed"] > 9
    delta = rep.delta_frame().set_index("algorithm")
    assert delta.loc[[nonpriv.label, dps.label], "claimed ε"].isna().all() and delta.loc[dp.label, "claimed ε"] == "10"
    assert delta.loc[dps.label, "formal DP"] == "no"
    # the stored summary and the CSV exports (the figures' data)
    stored = AuditReport.from_dict(store.get_run(run_id)["summary"])
    assert [t.claimed for t in stored.algorithm("dpsgd_s").epsilon] == [None]
    from engine.figures.audit import build_audit_figures
    from engine.figures.export import csv_bytes

    specs = {sp.name: sp for sp in build_audit_figures(store.get_run(run_id)["summary"])}  # what the page exports
    rows = list(csv.DictReader(io.StringIO(csv_bytes(specs["epsilon_bounds"].data).decode())))
    by_algo = {r["algorithm"]: r["claimed"] for r in rows}
    assert by_algo["nonprivate"] == "" and by_algo["dpsgd_s"] == "" and float(by_algo["dpsgd"]) > 9
    rows = list(csv.DictReader(io.StringIO(csv_bytes(specs["delta_table"].data).decode())))
    assert [r["claimed ε"] for r in rows] == ["", "", "10"]
    # the Runs page's DP column: not "formal DP" for an audit holding algorithms without a guarantee
    from engine.jobs.runs import dp_note, formal_dp

    rec = store.get_run(run_id)
    assert formal_dp(rec) is False and dp_note(rec) == f"includes algorithms without formal DP: {nonpriv.label}, " \
                                                       f"{dps.label}"
    old = {"kind": "audit", "config": cfg.to_dict(), "plan": {}}  # planned before the plan said so: from the config
    assert formal_dp(old) is False and dp_note(old) == "includes algorithms without formal DP: Non-private SGD, DP-SGD-S"
    only_dp = {"kind": "audit", "config": cfg.replace(algorithms=(AlgorithmConfig(name="dpsgd"),)).to_dict()}
    assert formal_dp(only_dp) is True and dp_note(only_dp) == ""


# --------------------------------------------------------------------------------------------
# old reports and checkpoints; presets; the estimate
# --------------------------------------------------------------------------------------------

def test_a_version_1_report_loads_without_the_null_fields():
    v1 = {"kind": "audit", "version": 1, "config": {"dataset": "digits", "R": 3}, "dataset": "digits", "n_train": 6,
          "R": 3, "n_models": 6, "threshold": "in_sample", "group_by": "class", "group_names": ["a", "b"],
          "group_sizes": {"a": 4, "b": 2}, "tier_names": ["all"], "tier_sizes": [6],
          "algorithms": [{"key": "dpsgd", "formal_dp": True,
                          "gpr": {"groups": {"a": {"mean": 0.1, "low": 0.05, "high": 0.2},
                                             "b": {"mean": 0.2, "low": 0.1, "high": 0.3}},
                                  "delta": {"value": 10.0, "low": 1.0, "high": 20.0}},
                          "null_floor": 0.06,
                          "epsilon": {"tiers": [{"name": "all", "claimed": 2.0, "target": 2.0, "lower_bound": 0.1}]}}]}
    r = AuditReport.from_dict(v1)
    a = r.algorithms[0]
    assert r.version == 1 and r.score is None
    assert a.null_groups == {} and a.null_delta is None and a.resolved is None
    assert AuditReport.from_dict(r.to_dict()) == r
    assert compact_summary(v1)["algorithms"][0]["resolved"] is None
    assert "loss (float32)" in summary_table(v1) and "0.1000/0.060" in summary_table(v1)  # the overall floor
    assert r.gpr_frame()["null_floor"].eq(0.06).all()
    assert r.delta_frame()["resolved"].isna().all()


def test_version_1_float32_checkpoints_resume(tmp_path):
    cfg = PRESETS["quick"].replace(R=2, n_boot=50, null_perms=2, looa_k=1, looa_models=2, chunk_models=2,
                                   algorithms=(AlgorithmConfig(name="dpsgd"),), **{"run.epochs": 2.0})
    store = RunStore(tmp_path / "c.sqlite")
    run_id = store.create_run(cfg.to_dict(), kind="audit", group_id="g")
    fresh = execute(store, run_id, cfg, kind="audit")
    # rewrite the checkpoints as version 1 left them: float32, PA-LOOA chunks with losses only
    meta = json.loads(store.get_artifact(run_id, "audit/meta"))
    store.put_artifact(run_id, "audit/meta", json.dumps({**meta, "version": 1}).encode())
    for key in store.artifact_keys(run_id):
        if key.startswith("chunk/"):
            got = _unnpz(store.get_artifact(run_id, key))
            arrays = {"losses": got["losses"].astype(np.float32)}
            if "/aloo/" in key:
                arrays.update(confs=got["confs"].astype(np.float32), preds=got["preds"])
            store.put_artifact(run_id, key, _npz(**arrays))
    old = store.get_artifact(run_id, "chunk/dpsgd/aloo/0")
    resumed = execute(store, run_id, cfg, kind="audit")
    assert store.get_artifact(run_id, "chunk/dpsgd/aloo/0") == old  # loaded, not retrained
    assert "confs" in _unnpz(store.get_artifact(run_id, "chunk/dpsgd/looa/0"))  # retrained: it had no confidences
    a, b = resumed.algorithms[0], fresh.algorithms[0]
    assert a.accuracy == b.accuracy
    assert {g: e.value for g, e in a.gpr.items()} == pytest.approx({g: e.value for g, e in b.gpr.items()}, abs=0.05)
    newer = json.dumps({**meta, "version": 99}).encode()
    store.put_artifact(run_id, "audit/meta", newer)
    with pytest.raises(ConfigError, match="newer"):
        execute(store, run_id, cfg, kind="audit")


def test_presets_are_valid_audits_and_the_estimate_is_measured():
    from engine.audit.pa_alooa.estimate import STATS_SECONDS_PER_MODEL_SAMPLE

    for name, cfg in PRESETS.items():
        assert isinstance(cfg, AuditConfig) and cfg.validate() is cfg
        assert AuditConfig.from_json(cfg.to_json()) == cfg
    paper = preset("adult-paper")
    assert (paper.run.epochs, paper.run.optimizer.lr, paper.run.clip_norm, 2 * paper.R) == (20.0, 0.1, 5.0, 400)
    assert preset("mnist-paper").run.data.max_train == 10_000 and preset("mnist-paper").group_by == "class"
    with pytest.raises(ConfigError, match="quick"):
        preset("nope")
    cfg = preset("quick").replace(R=4, **{"run.epochs": 1.0})
    pv = preview_audit(cfg, estimate=True)
    est = pv["estimate"]
    assert est["model_steps"] == 2 * 8 * pv["steps_per_model"]
    assert est["seconds"] > 0 and set(est["per_model_step_seconds"]) == {"nonprivate", "dpsgd"}
    assert est["train_seconds"] == pytest.approx(sum(v * 8 * pv["steps_per_model"]
                                                     for v in est["per_model_step_seconds"].values()))
    # the statistics: a rate per model, sample and algorithm (engine.audit.pa_alooa.estimate)
    assert est["stats_seconds"] == pytest.approx(STATS_SECONDS_PER_MODEL_SAMPLE * 2 * 8 * pv["n_train"])
    assert est["seconds"] == pytest.approx(est["train_seconds"] + est["stats_seconds"])
    assert "measured" in est["how"]


def test_cli_takes_a_preset_and_refuses_a_bad_one_in_one_line(tmp_path):
    def cli(*args):  # in this process (tests/in_process.py)
        return cli_here("--store", tmp_path / "s.sqlite", "audit", *args)

    out = cli("--preset", "nope")
    assert out.returncode == 2 and out.stderr.strip().startswith("error: preset: unknown preset 'nope'; known: quick")
    cfg = tmp_path / "a.json"
    cfg.write_text("{}")
    out = cli(str(cfg), "--preset", "quick")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "not both" in out.stderr
