"""The one DP pipeline: Poisson sampling, per-sample gradients of M models, the step, and a dashboard
run against the audit's chunk path (the same code with M = 1)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine.config.run import ModelConfig, RunConfig, TierConfig, TiersConfig
from engine.dp.grad_sample import ModuleGrads
from engine.dp.importance import importance_weights, make_tif
from engine.dp.mechanisms import Clipped, GroupAdaptive, Importance, NonPrivate, build_mechanism
from engine.dp.prepare import seeded_model
from engine.dp.stacked import StackedModels, sgd_train
from engine.dp.step import PoissonSampler, dp_step
from engine.train.loop import prepare, train

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def digits():
    from engine.data import load_dataset

    return load_dataset("digits")


# --------------------------------------------------------------------------------------------
# Poisson sampling
# --------------------------------------------------------------------------------------------

def test_poisson_sampler_rates_and_layout():
    rng = np.random.default_rng(1)
    n = 400
    members = rng.random((6, n)) < 0.5
    rates = np.where(np.arange(n) < 100, 0.05, 0.3)  # two tiers
    s = PoissonSampler(members, rates, CPU, expected_batch=1.0)
    gen = torch.Generator().manual_seed(0)
    hits = np.zeros((6, n))
    steps = 400
    for _ in range(steps):
        idx, mask = s.sample(gen)
        i, m = idx.numpy(), mask.numpy()
        for r in range(6):
            sel = i[r][m[r]]
            assert np.all(np.diff(sel) > 0)  # ascending, no repeats: the engine's batch order
            assert members[r, sel].all()  # only the model's own members
            assert not m[r][m[r].sum():].any()  # valid entries first, padding after
            hits[r, sel] += 1
    freq = hits / steps
    for q in (0.05, 0.3):
        sel = members & (rates == q)[None, :]
        assert abs(freq[sel].mean() - q) < 4 * np.sqrt(q * (1 - q) / (steps * sel.sum())) + 1e-3
    assert np.all(freq[~members] == 0)
    np.testing.assert_allclose(s.expected_batch, 1.0)  # the divisor it was given, whoever the members are
    with pytest.raises(ValueError):
        PoissonSampler(members, rates, CPU, expected_batch=0.0)


# --------------------------------------------------------------------------------------------
# per-sample gradients: closed form, vmap over models, the per-model loop, the live module
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", [ModelConfig(name="lr"), ModelConfig(name="mlp", hidden=(24, 12))])
def test_closed_form_per_sample_gradients_match_vmap(model, digits):
    ds = digits
    fast = StackedModels(model, ds.input_shape, 10, [3, 4, 5], "cpu")
    slow = StackedModels(model, ds.input_shape, 10, [3, 4, 5], "cpu", method="vmap")
    assert fast.closed_form and not slow.closed_form
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, len(ds.y_train), (3, 25), generator=g)
    mask = torch.rand(3, 25, generator=g) < 0.8
    a, b = fast.per_sample(ds.x_train, ds.y_train, idx, mask), slow.per_sample(ds.x_train, ds.y_train, idx, mask)
    torch.testing.assert_close(a.losses, b.losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.norms, b.norms, rtol=1e-5, atol=1e-6)
    coef = torch.rand(3, 25, generator=g) * mask
    sa, sb = a.weighted_sum(coef), b.weighted_sum(coef)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fast.logits(ds.x_test), slow.logits(ds.x_test), rtol=1e-5, atol=1e-5)
    # the per-model loop (where vmap over models cannot apply) agrees too
    slow.sequential = True
    c = slow.per_sample(ds.x_train, ds.y_train, idx, mask)
    torch.testing.assert_close(c.norms, b.norms, rtol=1e-5, atol=1e-6)
    sc = c.weighted_sum(coef)
    for k in sb:
        torch.testing.assert_close(sc[k], sb[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(slow.logits(ds.x_test), fast.logits(ds.x_test), rtol=1e-5, atol=1e-5)


def test_vmap_over_models_matches_the_live_module_layerwise_path():
    """Stacked CNNs (vmap over models of vmap(grad)) == one live module's layerwise hooks, model by model."""
    cfg = RunConfig().replace(**{"model.name": "cnn", "algorithm.name": "dpsgd", "data.max_train": 200,
                                 "batch_size": 20, "device": "cpu"})
    prep = prepare(cfg)
    ens = StackedModels(cfg.model, prep.dataset.input_shape, 10, [cfg.seed, cfg.seed + 1], "cpu")
    assert not ens.closed_form
    x, y = prep.dataset.x_train, prep.dataset.y_train
    idx = torch.stack([torch.arange(0, 40, 2), torch.arange(1, 41, 2)])
    mask = torch.ones_like(idx, dtype=torch.bool)
    work = ens.per_sample(x, y, idx, mask)
    coef = torch.clamp(0.5 / work.norms, max=1.0)
    summed = work.weighted_sum(coef)
    live = ModuleGrads(prep.model)  # built with the run's seed: the same init as stacked model 0
    ref = live.per_sample(x, y, idx[:1], mask[:1])
    torch.testing.assert_close(work.norms[:1], ref.norms, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(work.losses[:1], ref.losses, rtol=1e-5, atol=1e-6)
    ref_sum = ref.weighted_sum(coef[:1])
    for k in ref_sum:
        torch.testing.assert_close(summed[k][:1], ref_sum[k], rtol=1e-4, atol=1e-6)


def test_live_module_row_with_padding_anywhere(digits):
    """A padded (1, L) row (invalid entries anywhere) gives the valid entries' values, zeros elsewhere."""
    ds = digits
    for method in ("layerwise", "vmap"):
        live = ModuleGrads(seeded_model(ModelConfig(name="mlp", hidden=(8,)), ds.input_shape, 10, 0), method=method)
        idx = torch.tensor([[5, 0, 9, 0, 2]])
        mask = torch.tensor([[True, False, True, False, True]])
        padded = live.per_sample(ds.x_train, ds.y_train, idx, mask)
        compact = live.per_sample(ds.x_train, ds.y_train, idx[:, mask[0]], torch.ones(1, 3, dtype=torch.bool))
        torch.testing.assert_close(padded.norms[mask], compact.norms[0])
        assert torch.all(padded.norms[~mask] == 0) and torch.all(padded.losses[~mask] == 0)
        coef = torch.tensor([[0.5, 7.0, 0.25, 7.0, 1.0]])
        a, b = padded.weighted_sum(coef), compact.weighted_sum(coef[:, mask[0]])
        for k in a:
            torch.testing.assert_close(a[k], b[k])
        sums, losses = live.loss_grads(ds.x_train, ds.y_train, idx, mask)
        torch.testing.assert_close(losses[mask], compact.losses[0])
        ones = compact.weighted_sum(torch.ones(1, 3))
        for k in sums:
            torch.testing.assert_close(sums[k], ones[k], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------
# the step, M ∈ {1, 3}
# --------------------------------------------------------------------------------------------

def _one_by_one(model, x, y, clip, rho):
    """Σ_i ρ_i g_i min(1, C_i/‖g_i‖) from plain per-sample backward passes (float64 accumulation)."""
    total = {k: torch.zeros_like(p, dtype=torch.float64) for k, p in model.named_parameters()}
    for i in range(len(y)):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        g = {k: p.grad.double() for k, p in model.named_parameters()}
        norm = float(torch.sqrt(sum((v ** 2).sum() for v in g.values())))
        c = rho[i] * min(1.0, clip[i] / norm)
        assert c * norm <= rho[i] * clip[i] * (1 + 1e-9)  # each item adds at most ρ_i C_i ≤ C_i
        for k in total:
            total[k] += c * g[k]
    return total


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("algo", ["dpsgd", "ino"])
def test_step_is_the_clipped_weighted_sum_over_the_expected_batch(m, algo, digits):
    ds = digits
    n = len(ds.y_train)
    rng = np.random.default_rng(m)
    members = rng.random((m, n)) < 0.6
    rates = np.where(np.arange(n) % 3 == 0, 0.02, 0.04)
    clips = np.where(np.arange(n) % 3 == 0, 0.3, 0.8)
    model_cfg = ModelConfig(name="mlp", hidden=(12,))
    seeds = [11 + r for r in range(m)]
    tif = make_tif("beta", alpha=2.0, beta=1.0)
    mech = Clipped(sample_clip_norms=clips, noise_std=0.0, n_models=m) if algo == "dpsgd" else \
        Importance(sample_clip_norms=clips, noise_std=0.0, tail_length=np.linspace(2.0, 6.0, m), tif=tif, n_models=m)
    sampler = PoissonSampler(members, rates, CPU, expected_batch=(members * rates).sum(1))
    # M = 1 goes through the live module's layerwise path (the dashboard's), M = 3 through the stacked models
    models = ModuleGrads(seeded_model(model_cfg, ds.input_shape, 10, seeds[0])) if m == 1 else \
        StackedModels(model_cfg, ds.input_shape, 10, seeds, "cpu")
    out = dp_step(models, ds.x_train, ds.y_train, sampler, mech, torch.Generator().manual_seed(0))
    assert out.mask.shape[0] == m
    for r in range(m):
        ix = out.idx[r][out.mask[r]]
        assert len(ix) > 0 and members[r, ix.numpy()].all()
        net = seeded_model(model_cfg, ds.input_shape, 10, seeds[r]).double()
        x, y = ds.x_train[ix].double(), ds.y_train[ix]
        losses = torch.nn.functional.cross_entropy(net(x), y, reduction="none").detach().numpy()
        np.testing.assert_allclose(out.losses[r][out.mask[r]].numpy(), losses, rtol=1e-5)
        rho = np.ones(len(ix)) if algo == "dpsgd" else \
            importance_weights(losses, clips[ix.numpy()], tail_length=mech.tail_length[r], alpha=2.0, beta=1.0)
        if algo == "ino":
            assert rho.min() < 1  # the tail really drops mass
        ref = _one_by_one(net, x, y, clips[ix.numpy()], rho)
        for k, g in out.grads.items():
            torch.testing.assert_close(g[r].double() * sampler.expected_batch[r], ref[k], rtol=2e-4, atol=1e-6)


def test_noise_is_per_model_with_the_plan_std(digits):
    """Zero clip-norm mass aside, the step adds N(0, std_m²) per coordinate, independently per model."""
    ds = digits
    n = len(ds.y_train)
    members = np.zeros((3, n), bool)
    members[:, :50] = True
    mech = Clipped(sample_clip_norms=np.full(n, 1e-9), noise_std=2.0, n_models=3)  # clipped sums ≈ 0
    sampler = PoissonSampler(members, np.full(n, 0.5), CPU, expected_batch=(members * 0.5).sum(1))
    models = StackedModels(ModelConfig(name="lr"), ds.input_shape, 10, [1, 1, 1], "cpu")
    out = dp_step(models, ds.x_train, ds.y_train, sampler, mech, torch.Generator().manual_seed(0))
    w = out.grads["fc.weight"] * torch.as_tensor(sampler.expected_batch, dtype=torch.float32)[:, None, None]
    assert abs(float(w.std()) - 2.0) < 0.15
    assert not torch.allclose(w[0], w[1]) and not torch.allclose(w[1], w[2])


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("private", [True, False])
def test_dpsgd_s_releases_its_quantile_on_an_empty_batch(m, private, digits):
    """DP-SGD-S's observe() runs on every step: on an empty Poisson batch the private count release
    still happens (the estimate moves: here σ_b = 0, so by exactly exp(−η(½ − quantile))); the
    non-private batch quantile keeps the estimate. Either way the EMA S̄ takes its step."""
    ds = digits
    n = len(ds.y_train)
    members = np.ones((m, n), bool)
    members[-1] = False
    members[-1, :3] = True  # the last model: 3 members with q = 0.01 → mostly empty batches
    rates = np.full(n, 0.01)
    groups = np.arange(n) % 2
    mech = GroupAdaptive(groups=groups, n_groups=2, noise_multiplier=0.0,
                         expected_group_batch=[5.0, 5.0], initial=1.0, tau=1.0, quantile=0.75, ema=0.5, c_min=0.5,
                         c_max=4.0, base_clip=1.0, private=private, quantile_lr=0.2, count_noise_std=0.0, n_models=m)
    sampler = PoissonSampler(members, rates, CPU, expected_batch=(members * rates).sum(1))
    models = ModuleGrads(seeded_model(ModelConfig(name="lr"), ds.input_shape, 10, 0)) if m == 1 else \
        StackedModels(ModelConfig(name="lr"), ds.input_shape, 10, list(range(m)), "cpu")
    gen = torch.Generator().manual_seed(0)
    seen_empty = False
    for _ in range(40):
        before, smooth_before = mech.estimate.clone(), mech.smoothed.clone()
        out = dp_step(models, ds.x_train, ds.y_train, sampler, mech, gen)
        row = m - 1
        if out.mask[row].any():
            continue
        seen_empty = True
        if private:
            expect = before[row] * np.exp(-0.2 * (0.5 - 0.75))
            torch.testing.assert_close(mech.estimate[row], expect, rtol=1e-12, atol=0)
        else:
            assert torch.equal(mech.estimate[row], before[row])
        torch.testing.assert_close(mech.smoothed[row], 0.5 * smooth_before[row] + 0.5 * mech.estimate[row])
        assert all(float(g[row].abs().max()) == 0.0 for g in out.grads.values())  # no samples, no noise (z = 0)
    assert seen_empty


def test_dpsgd_s_count_noise_keeps_the_step_stream_paired(digits):
    """DP-SGD-S draws its count-release noise from a stream of its own (seeded from the step generator's
    seed): with every clip at C (c_min = c_max = 1) and DP-SGD's noise multiplier it takes DP-SGD's very
    steps under one seed (same batches, same gradient noise) while its private estimate still moves; and
    the count stream is reproducible from the seed."""
    ds = digits
    n = len(ds.y_train)
    rates = np.full(n, 0.05)
    model = ModuleGrads(seeded_model(ModelConfig(name="lr"), ds.input_shape, 10, 0))

    def steps(mech, seed=3):
        gen, sampler = torch.Generator().manual_seed(seed), PoissonSampler(np.ones((1, n), bool), rates, CPU,
                                                                       expected_batch=rates.sum())
        return [dp_step(model, ds.x_train, ds.y_train, sampler, mech, gen).grads for _ in range(15)]

    def adaptive():
        return GroupAdaptive(groups=ds.y_train.numpy(), n_groups=10, noise_multiplier=1.3,
                             expected_group_batch=np.full(10, 0.05 * n / 10), initial=0.3, tau=1.0, quantile=0.75,
                             ema=0.9, c_min=1.0, c_max=1.0, base_clip=1.0, private=True, quantile_lr=0.2,
                             count_noise_std=3.0)

    dp = steps(Clipped(sample_clip_norms=np.ones(n), noise_std=1.3))
    s_mech = adaptive()
    s = steps(s_mech)
    for a, b in zip(dp, s):
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-7)
    assert not torch.allclose(s_mech.estimate, torch.full_like(s_mech.estimate, 0.3))  # the release ran
    again = adaptive()
    steps(again)
    assert torch.equal(again.estimate, s_mech.estimate)
    other = adaptive()
    steps(other, seed=4)
    assert not torch.equal(other.estimate, s_mech.estimate)


# --------------------------------------------------------------------------------------------
# a dashboard run and the audit's chunk path are one pipeline
# --------------------------------------------------------------------------------------------

def _quiet(privacy):
    """The same privacy preparation with every noise switched off."""
    if privacy.plan is None:
        return privacy
    out = dataclasses.replace(privacy, plan=dataclasses.replace(privacy.plan, noise_std=0.0))
    if privacy.clip_setup is not None:
        out.clip_setup = dataclasses.replace(privacy.clip_setup, noise_multiplier=0.0, count_noise_std=0.0)
    return out


@pytest.mark.parametrize("algo", ["nonprivate", "dpsgd", "ino", "dpsgd_s"])
def test_dashboard_run_equals_the_audit_chunk_path(algo):
    """Full batch (q = 1), noise off: engine.train.loop (live module, its optimizer) and the audit's chunk
    trainer (stacked parameters, plain SGD) take the very same steps."""
    cfg = RunConfig().replace(**{"model.name": "mlp", "model.hidden": (16,), "data.max_train": 120,
                                 "batch_size": 120, "epochs": 6.0, "algorithm.name": algo, "clip_norm": 0.05,
                                 "tiers": TiersConfig(tiers=(TierConfig(epsilon=50.0, classes=tuple(range(10))),)),
                                 "eval_every": 1000, "device": "cpu", "algorithm.group_by": "class",
                                 "individual_epsilon": False})  # noise off below: nothing to account per sample
    prep = prepare(cfg)
    n = len(prep.dataset.y_train)
    assert np.all(prep.sample_rates == 1.0) and prep.steps == 6 and n == 120
    quiet = _quiet(prep.privacy)
    everyone = np.ones((1, n), bool)
    prep.mechanism = build_mechanism(privacy=quiet, members=everyone, device=CPU)
    theirs = torch.cat([p.detach().flatten() for p in train(cfg, prepared=prep).model.parameters()])

    ds = prep.dataset
    ens = StackedModels(cfg.model, ds.input_shape, ds.num_classes, [cfg.seed], "cpu")
    mech = build_mechanism(privacy=quiet, members=everyone, device=CPU)
    sgd_train(ens, ds.x_train, ds.y_train, PoissonSampler(everyone, prep.sample_rates, CPU, expected_batch=prep.expected_batch), mech,
              steps=prep.steps,
              lr=cfg.optimizer.lr, gen=torch.Generator().manual_seed(0))
    ours = torch.cat([v[0].flatten() for v in ens.params.values()])
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(ours, torch.cat([p.detach().flatten() for p in
                                               seeded_model(cfg.model, ds.input_shape, 10, cfg.seed).parameters()]))
    if algo == "dpsgd_s":
        np.testing.assert_allclose(mech.group_clips().numpy(), prep.mechanism.group_clips().numpy(), rtol=1e-6)
        assert not np.allclose(mech.group_clips().numpy(), cfg.clip_norm)  # the clips did adapt (one per class)


def test_stacked_models_learn_and_dp_members_differ(digits):
    ds = digits
    n = len(ds.y_train)
    members = np.ones((3, n), bool)
    q = np.full(n, 64 / n)
    out = {}
    for name in ("nonprivate", "dpsgd"):
        ens = StackedModels(ModelConfig(name="lr"), ds.input_shape, 10, [7, 7, 7], "cpu")  # identical inits
        sampler = PoissonSampler(members, q, CPU, expected_batch=(members * q).sum(1))
        mech = NonPrivate(3, "cpu") if name == "nonprivate" else \
            Clipped(sample_clip_norms=np.ones(n), noise_std=1.0, n_models=3)
        sgd_train(ens, ds.x_train, ds.y_train, sampler, mech, steps=150, lr=1.0, gen=torch.Generator().manual_seed(1))
        _, _, pred = ens.score(ds.x_test, ds.y_test)
        acc = (pred == ds.y_test.numpy()[None, :]).mean(1)
        assert np.all(acc > 0.7), (name, acc)  # chance is 0.1
        out[name] = ens.params["fc.weight"]
    w = out["dpsgd"]
    assert not torch.allclose(w[0], w[1]) and not torch.allclose(w[1], w[2])  # own batches and noise
    assert not torch.allclose(out["nonprivate"][0], out["nonprivate"][1])  # own Poisson batches


# --------------------------------------------------------------------------------------------
# the normaliser: fixed before training, the same for neighbouring datasets
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ["dpsgd", "idp_sample"])
def test_one_more_sample_moves_the_step_by_exactly_its_clipped_contribution_over_the_plans_batch(algorithm):
    """Datasets D and D' = D + z (add/remove adjacency): the noiseless step of each, every member in its batch
    (rate 1, the same batch order), differ by exactly z's clipped contribution over the plan's expected batch. A
    divisor summed over the members (|D| against |D| + 1 here) would move every other sample's share too."""
    cfg = RunConfig().replace(**{"data.name": "digits", "model.name": "lr", "epochs": 1.0, "batch_size": 64,
                                 "algorithm.name": algorithm})
    if algorithm == "idp_sample":
        cfg = cfg.replace(tiers=TiersConfig(tiers=(TierConfig(epsilon=1.0, classes=tuple(range(5))),
                                                   TierConfig(epsilon=3.0, classes=tuple(range(5, 10))))))
    prep = prepare(cfg)
    model = prep.model.double()
    x, y = prep.dataset.x_train[:40].double(), prep.dataset.y_train[:40]
    clips = np.asarray(prep.privacy.sample_clips if prep.privacy.sample_clips is not None
                       else np.full(len(prep.dataset.y_train), cfg.clip_norm))[:40]
    with pytest.raises(TypeError):
        PoissonSampler(np.ones((1, 40), bool), np.ones(40), CPU)  # no divisor stated: refused
    z = 17
    d, d_plus = np.ones((1, 40), bool), np.ones((1, 40), bool)
    d[0, z] = False

    def step(members):
        sampler = PoissonSampler(members, np.ones(40), CPU, expected_batch=prep.expected_batch)
        out = dp_step(ModuleGrads(model), x, y, sampler, Clipped(sample_clip_norms=clips, noise_std=0.0),
                      torch.Generator().manual_seed(0))
        return torch.cat([g[0].reshape(-1) for g in out.grads.values()])

    work = ModuleGrads(model).per_sample(x, y, torch.tensor([[z]]), torch.tensor([[True]]))
    coef = torch.clamp(torch.as_tensor(clips[z:z + 1]) / work.norms[0], max=1.0)[None]
    own = torch.cat([g[0].reshape(-1) for g in work.weighted_sum(coef).values()]) / prep.expected_batch
    assert float(own.norm()) > 1e-3 and float(own.norm()) <= clips[z] / prep.expected_batch * (1 + 1e-12)
    torch.testing.assert_close(step(d_plus) - step(d), own, rtol=1e-9, atol=1e-12)
    assert prep.expected_batch == pytest.approx(cfg.batch_size, rel=1e-4)  # the plan's, not the 40 members'
