"""Repeat over k seeds: k models trained together on the model axis of one job (engine.train.loop, M = k).

Model j starts exactly like a single run with seed base + j; the stacked optimizer is k optimizers; an
INO-SGD and an IDP-SGD job with the same base seed see the same batches and noise draws per model index
(pairing by seed_index); ε spent is the k = 1 run's; every model's records go to its own store row.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import engine.train.loop as train_mod
from engine.config.run import OptimizerConfig, RunConfig
from engine.jobs.kinds import execute
from engine.store.db import RunStore
from engine.train.loop import make_optimizer, prepare, train

DIGITS = RunConfig().replace(**{"data.max_train": 300, "epochs": 2.0, "batch_size": 50, "eval_every": 3,
                                "device": "cpu"})


def _state(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("model", ["lr", "cnn"])
def test_model_j_starts_like_a_single_run_with_seed_base_plus_j(model, one_thread):
    cfg = DIGITS.replace(**{"model.name": model, "seeds": 3, "seed": 11})
    prep = prepare(cfg)
    assert prep.model is None and prep.stacked.n_models == 3 and prep.mechanism.n_models == 3
    assert prep.stacked.closed_form == (model == "lr")
    for j in range(3):
        single = prepare(cfg.replace(seeds=1, seed=11 + j)).model
        ours = _state(prep.stacked.module(j))
        theirs = _state(single)
        assert ours.keys() == theirs.keys()
        for k in theirs:
            assert torch.equal(ours[k], theirs[k]), (j, k)
    # and the models really differ from one another
    assert not torch.equal(_state(prep.stacked.module(0))[next(iter(theirs))], _state(prep.stacked.module(1))[next(iter(theirs))])


def test_a_row_config_prepares_its_whole_job():
    cfg = DIGITS.replace(**{"model.name": "lr", "seeds": 3, "seed": 4})
    row = cfg.seed_configs()[2]
    assert (row.seed, row.seed_index, row.seeds) == (6, 2, 3)
    prep = prepare(row)
    assert prep.config == cfg and prep.config.seed == 4  # data, tiers, plan: the base seed's
    torch.testing.assert_close(prep.stacked.module(2).fc.weight, prepare(cfg).stacked.module(2).fc.weight, rtol=0, atol=0)


@pytest.mark.parametrize("opt", [OptimizerConfig(name="sgd", lr=0.3, momentum=0.9),
                                 OptimizerConfig(name="sgd", lr=0.5, momentum=0.0),
                                 OptimizerConfig(name="adam", lr=0.01)])
def test_the_stacked_optimizer_equals_k_separate_optimizers(opt):
    cfg = RunConfig(optimizer=opt)
    gen = torch.Generator().manual_seed(3)
    k, shapes = 4, {"w": (5, 7), "b": (5,)}
    init = {n: torch.randn((k, *s), generator=gen, dtype=torch.float64) for n, s in shapes.items()}
    stacked = {n: v.clone() for n, v in init.items()}  # plain leaf tensors, as StackedModels keeps them
    separate = [{n: torch.nn.Parameter(v[j].clone()) for n, v in init.items()} for j in range(k)]
    opt_stacked = make_optimizer(cfg, list(stacked.values()))
    opts = [make_optimizer(cfg, list(p.values())) for p in separate]
    for _ in range(6):
        grads = {n: torch.randn((k, *s), generator=gen, dtype=torch.float64) for n, s in shapes.items()}
        opt_stacked.zero_grad(set_to_none=True)
        for n, p in stacked.items():
            p.grad = grads[n]
        opt_stacked.step()
        for j, (o, p) in enumerate(zip(opts, separate)):
            o.zero_grad(set_to_none=True)
            for n, t in p.items():
                t.grad = grads[n][j]
            o.step()
    for j in range(k):
        for n in shapes:
            torch.testing.assert_close(stacked[n][j], separate[j][n].detach(), rtol=1e-12, atol=1e-14)
    assert not torch.allclose(stacked["w"], init["w"])  # the optimizer did move them


class _Recorder:
    """Records every step's batches (dp_step's idx/mask) and every Gaussian noise draw of one run."""

    def __init__(self, monkeypatch):
        self.batches, self.noise = [], []
        real_step, real_randn = train_mod.dp_step, torch.randn

        def step(*a, **kw):
            out = real_step(*a, **kw)
            self.batches.append((out.idx.clone(), out.mask.clone()))
            return out

        def randn(*a, **kw):
            out = real_randn(*a, **kw)
            self.noise.append(out.clone())
            return out

        monkeypatch.setattr(train_mod, "dp_step", step)
        monkeypatch.setattr(torch, "randn", randn)


def _run(cfg, monkeypatch):
    rec = _Recorder(monkeypatch)
    result = train(cfg)
    monkeypatch.undo()
    return result, rec


def test_ino_and_idp_jobs_are_paired_by_seed_index(monkeypatch, one_thread):
    base = DIGITS.replace(**{"model.name": "lr", "seeds": 3, "seed": 7})
    ino, rec_ino = _run(base.replace(**{"algorithm.name": "ino"}), monkeypatch)
    idp, rec_idp = _run(base.replace(**{"algorithm.name": "idp_sample"}), monkeypatch)
    steps = len(rec_ino.batches)
    assert steps == prepare(base).steps > 5 and len(rec_idp.batches) == steps
    # the SAME batches, step by step, for every model index j — and different batches across j
    for (i1, m1), (i2, m2) in zip(rec_ino.batches, rec_idp.batches):
        assert i1.shape[0] == 3 and torch.equal(i1, i2) and torch.equal(m1, m2)
    assert any(not torch.equal(i[0][m[0]], i[1][m[1]]) for i, m in rec_ino.batches)
    # the same noise draws (one (3, ...) tensor per parameter per step), different across j
    assert len(rec_ino.noise) == len(rec_idp.noise) == 2 * steps  # LR: weight and bias
    for a, b in zip(rec_ino.noise, rec_idp.noise):
        assert a.shape[0] == 3 and torch.equal(a, b)
    assert not torch.equal(rec_ino.noise[0][0], rec_ino.noise[0][1])
    # yet the algorithms trained different models (INO weights the clipped gradients)
    assert not torch.allclose(ino.per_seed[0].model.fc.weight, idp.per_seed[0].model.fc.weight)
    # ε spent: identical for the k models and equal to the k = 1 run's (the same plan)
    single = train(base.replace(**{"algorithm.name": "idp_sample", "seeds": 1}))
    want = [t["epsilon_spent"] for t in single.summary["tiers"]]
    for result in (ino, idp):
        assert [r.config.seed for r in result.per_seed] == [7, 8, 9]
        assert [r.config.seed_index for r in result.per_seed] == [0, 1, 2]
        for r in result.per_seed:
            assert [t["epsilon_spent"] for t in r.summary["tiers"]] == want
            assert r.summary["seed"] == r.config.seed and r.summary["seeds"] == 3
            for e in r.evals:  # finite metrics at every evaluation
                assert math.isfinite(e["overall"]["loss"]) and 0 <= e["overall"]["accuracy"] <= 1
                assert all(math.isfinite(t["recall"]) and math.isfinite(t["loss"]) for t in e["tiers"])
        assert len({round(r.summary["loss"], 9) for r in result.per_seed}) == 3  # three different models


def test_each_model_of_a_job_is_evaluated_like_a_single_model(one_thread):
    """The evaluation of model j in a k-seed run is the single-model evaluation of its parameters."""
    from engine.models.metrics import group_metrics, predict

    cfg = DIGITS.replace(**{"model.name": "cnn", "seeds": 2, "algorithm.name": "dpsgd", "epochs": 1.0})
    result = train(cfg)
    prep = prepare(cfg.replace(seeds=1))
    ds = prep.dataset
    for r in result.per_seed:
        logp = predict(r.model, ds.x_test)
        overall, tiers, _, _ = group_metrics(ds.y_test.numpy(), logp, prep.tiers.test, 3, ds.num_classes)
        last = r.evals[-1]
        assert last["overall"]["accuracy"] == pytest.approx(overall["accuracy"], abs=1e-9)
        assert last["overall"]["loss"] == pytest.approx(overall["loss"], rel=1e-4)
        assert [t["recall"] for t in last["tiers"]] == pytest.approx([t["recall"] for t in tiers], abs=1e-9)


def test_a_k_seed_run_streams_each_model_into_its_own_row(tmp_path, one_thread):
    store = RunStore(tmp_path / "runs.sqlite")
    cfg = DIGITS.replace(**{"model.name": "lr", "seeds": 3, "seed": 2, "algorithm.name": "ino"})
    ids = store.create_job(cfg.seed_configs(), group_id="g")
    result = execute(store, ids[0], cfg, kind="train")
    for j, rid in enumerate(ids):
        run = store.get_run(rid)
        assert run["status"] == "finished" and run["job_id"] == ids[0]
        assert (run["seed"], run["seed_index"], run["seeds"]) == (2 + j, j, 3)
        assert RunConfig.from_dict(run["config"]) == cfg.seed_configs()[j]
        assert run["plan"] == result.plan and run["total_steps"] == run["step"] == result.summary["steps"]
        stored, own = dict(run["summary"]), dict(result.per_seed[j].summary)
        # each model's own individual ε per group (nested: compared whole), the flat numbers to float precision
        assert stored.pop("individual_epsilon") == own.pop("individual_epsilon")
        assert stored == pytest.approx(own)
        evals = store.eval_metrics(rid)
        assert [e["overall"] for e in evals] == [e["overall"] for e in result.per_seed[j].evals]
        steps = store.step_metrics(rid)
        assert [s["step"] for s in steps] == list(range(1, result.summary["steps"] + 1))
    # the rows hold different models' records; the batch sizes are each model's own
    assert store.eval_metrics(ids[0])[-1]["overall"] != store.eval_metrics(ids[1])[-1]["overall"]
    assert [s["batch_size"] for s in store.step_metrics(ids[0])] != [s["batch_size"] for s in store.step_metrics(ids[1])]
    # a run id whose job has the wrong number of rows is refused, naming the field
    lone = store.create_run(cfg)
    from engine.config.schema import ConfigError

    with pytest.raises(ConfigError) as e:
        execute(store, lone, cfg, kind="train")
    assert e.value.field == "seeds"


def test_dpsgd_s_and_adam_train_k_seeds(one_thread):
    cfg = DIGITS.replace(**{"model.name": "lr", "seeds": 2, "algorithm.name": "dpsgd_s", "optimizer.name": "adam",
                            "optimizer.lr": 0.05})
    result = train(cfg)
    assert len(result.per_seed) == 2
    for r in result.per_seed:
        assert r.evals[-1]["overall"]["loss"] < r.evals[0]["overall"]["loss"]  # it learns
        assert r.summary["accuracy"] > 0.2  # chance: 0.1
        assert len(r.evals[-1]["group_clip_norms"]) == 3 and np.isfinite(r.evals[-1]["noise_std"])
    # each row records its own model's group clips (the models see different batches, so their trackers
    # differ), and its noise std is that model's z · max_k C_k
    clips = [r.evals[-1]["group_clip_norms"] for r in result.per_seed]
    assert clips[0] != clips[1]
    ratios = [r.evals[-1]["noise_std"] / max(c) for r, c in zip(result.per_seed, clips)]
    assert ratios[0] == pytest.approx(ratios[1], rel=1e-9)


def test_an_audit_refuses_seeds():
    from engine.audit.pa_alooa.config import AuditConfig
    from engine.config.schema import ConfigError

    for key in ("seeds", "seed_index"):
        with pytest.raises(ConfigError) as e:
            AuditConfig.from_dict({"run": {key: 2}})
        assert e.value.field == f"run.{key}"
