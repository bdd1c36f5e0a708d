"""DPSGD-F and DPSGD-Global-Adapt (engine.dp.dpsgd_f, engine.dp.global_adapt): each sound.

* Sensitivity (property tests, M models at once, padded batches): adding one sample to a model's batch moves
  that model's weighted, clipped sum by at most the sample's contribution bound, and that bound is at most the
  noise std over the gradient noise multiplier; the count vectors their clips move on have the sensitivity the
  accountant is told (1 for DPSGD-F's per-group counts, ½ for Global-Adapt's centred count).
* Every private estimate is a noised release: the counts carry Gaussian noise of the set-up's σ, drawn from
  the mechanism's own stream, and the gradient noise multiplier is raised so that counts + gradient cost one
  Gaussian step of DP-SGD's multiplier z at the same ε (the planned ε holds as planned).
* They train on the model axis: a stack of models and a PA-ALOOA audit run them.
"""
from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.audit.pa_alooa.config import DEFAULT_RUN, AuditConfig
from engine.audit.pa_alooa.runner import run_audit
from engine.config.run import AlgorithmConfig, ModelConfig, RunConfig, TierConfig, TiersConfig
from engine.config.schema import ConfigError
from engine.dp import accounting
from engine.dp.algorithms import algorithm
from engine.dp.dpsgd_f import ClippingBias
from engine.dp.global_adapt import GlobalScaling
from engine.dp.mechanisms import build_mechanism
from engine.dp.prepare import prepare_data, prepare_privacy
from engine.dp.stacked import StackedModels, sgd_train
from engine.dp.step import PoissonSampler
from engine.figures import talk_frames as tf
from engine.jobs.kinds import execute
from engine.jobs.runs import run_record
from engine.store.db import RunStore
from engine.train.records import PlanRecord

CPU = torch.device("cpu")


@st.composite
def model_batches(draw):
    """M models' batches (padded to one width, random positions), each with one sample z to add: gradients,
    norms spread around the base clip 1 (within, at and far beyond it), groups; float64."""
    m = draw(st.integers(1, 4))
    k = draw(st.integers(1, 4))
    d = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    rows = []
    for _ in range(m):
        n = int(rng.integers(0, 10))
        scale = rng.choice([0.1, 0.9, 1.0, 1.1, 3.0, 50.0], size=n + 1)
        g = rng.normal(size=(n + 1, d))
        g = g / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-12) * scale[:, None]
        rows.append((g[:n], rng.integers(0, k, n), g[n], int(rng.integers(0, k)), int(rng.integers(0, n + 1))))
    width = max(len(r[0]) for r in rows) + 1 + int(rng.integers(0, 3))
    return k, d, rows, width, rng


def _lay(rows, width, rng, with_z: bool):
    """(M, width, d) gradients, (M, width) group of each entry, mask; z inserted at its position when ``with_z``."""
    m, d = len(rows), rows[0][2].shape[0]
    g, grp, mask = np.zeros((m, width, d)), np.zeros((m, width), np.int64), np.zeros((m, width), bool)
    for r, (gr, gp, zg, zk, pos) in enumerate(rows):
        if with_z:
            gr, gp = np.insert(gr, pos, zg, axis=0), np.insert(gp, pos, zk)
        at = np.sort(rng.choice(width, size=len(gp), replace=False))
        g[r, at], grp[r, at], mask[r, at] = gr, gp, True
    return torch.as_tensor(g), torch.as_tensor(grp), torch.as_tensor(mask)


def _sum(mech, g, idx, mask):
    """dp_step's weighted clipped sum (engine.dp.step: ρ_i · g_i · min(1, C_i / ‖g_i‖), padding 0) per model."""
    norms = g.norm(dim=2)
    clip = mech.clip_norms(idx)
    rho = mech.weights(torch.zeros(mask.shape, dtype=torch.float64), clip, mask)
    coef = torch.clamp(clip / torch.clamp(norms, min=1e-12), max=1.0) * mask
    if rho is not None:
        coef = coef * rho
    return torch.einsum("ml,mld->md", coef, g)


def _identity_groups(k, width, grp):
    """A mechanism's sample-index space in which entry (m, l) is the sample m·width + l, of group grp[m, l]."""
    idx = torch.arange(grp.numel()).reshape(grp.shape)
    return idx, grp.reshape(-1).numpy()


@settings(max_examples=200, deadline=None)
@given(model_batches(), st.floats(0.05, 5.0), st.integers(0, 2**31))
def test_dpsgd_f_moves_by_at_most_its_group_clip_and_its_counts_by_one(batch, sigma_1, seed):
    k, _, rows, width, rng = batch
    state = rng.bit_generator.state
    g1, grp1, mask1 = _lay(rows, width, rng, with_z=True)
    rng.bit_generator.state = state  # the same positions for the other entries
    g0, grp0, mask0 = _lay(rows, width, rng, with_z=False)
    m = len(rows)
    for g, grp, mask in ((g1, grp1, mask1), (g0, grp0, mask0)):
        assert torch.all(g[~mask] == 0)
    # counts: the exact (m_k, o_k) vectors of the two batches differ by exactly one entry, by 1
    idx1, groups1 = _identity_groups(k, width, grp1)
    idx0, groups0 = _identity_groups(k, width, grp0)
    mech1 = ClippingBias(groups=groups1, n_groups=k, base_clip=1.0, noise_multiplier=1.3, count_noise_std=sigma_1,
                         n_models=m)
    mech0 = ClippingBias(groups=groups0, n_groups=k, base_clip=1.0, noise_multiplier=1.3, count_noise_std=sigma_1,
                         n_models=m)
    c1, c0 = mech1.counts(idx1, g1.norm(dim=2), mask1), mech0.counts(idx0, g0.norm(dim=2), mask0)
    assert torch.all(torch.linalg.norm(c1 - c0, dim=1) <= 1.0 + 1e-12)
    # the gradient release given the released counts: both batches clip with the clips the release set
    mech1.see_batch(idx1, types.SimpleNamespace(norms=g1.norm(dim=2)), mask1, torch.Generator().manual_seed(seed))
    mech0._clips = mech1.group_clips().clone()
    bound = []
    for r, (_, _, _, zk, _) in enumerate(rows):
        bound.append(float(mech1.group_clips()[r, zk]))
    move = torch.linalg.norm(_sum(mech1, g1, idx1, mask1) - _sum(mech0, g0, idx0, mask0), dim=1)
    assert torch.all(move <= torch.as_tensor(bound, dtype=torch.float64) * (1 + 1e-12) + 1e-12)
    # that bound is a contribution bound the noise is scaled to, and the clips stay in [C₀, (1 + K) C₀]
    assert torch.all(mech1.contribution_bounds(idx1)[mask1] <= mech1.noise_std()[:, None].expand(mask1.shape)[mask1]
                     / 1.3 * (1 + 1e-12))
    clips = mech1.group_clips()
    assert torch.all(clips >= 1.0 - 1e-12) and torch.all(clips <= 1.0 + k + 1e-9)


@settings(max_examples=200, deadline=None)
@given(model_batches(), st.lists(st.floats(0.01, 100.0), min_size=4, max_size=4), st.floats(0.1, 5.0))
def test_global_adapt_moves_by_at_most_c_and_its_count_by_a_half(batch, thresholds, base_clip):
    k, _, rows, width, rng = batch
    state = rng.bit_generator.state
    g1, grp1, mask1 = _lay(rows, width, rng, with_z=True)
    rng.bit_generator.state = state
    g0, grp0, mask0 = _lay(rows, width, rng, with_z=False)
    m = len(rows)
    mech = GlobalScaling(base_clip=base_clip, noise_multiplier=0.9, initial=1.0, quantile=0.8, quantile_lr=0.2,
                         count_noise_std=2.0, expected_batch=8.0, n_models=m)
    mech.threshold = torch.as_tensor(thresholds[:m], dtype=torch.float64)  # Z, above and below C
    idx1, _ = _identity_groups(k, width, grp1)
    idx0, _ = _identity_groups(k, width, grp0)
    rho = mech.weights(torch.zeros(mask1.shape, dtype=torch.float64), mech.clip_norms(idx1), mask1)
    assert torch.all((rho >= 0) & (rho <= 1 + 1e-15))
    move = torch.linalg.norm(_sum(mech, g1, idx1, mask1) - _sum(mech, g0, idx0, mask0), dim=1)
    assert torch.all(move <= base_clip * (1 + 1e-12) + 1e-12)
    assert torch.allclose(mech.contribution_bounds(idx1), torch.full(idx1.shape, base_clip, dtype=torch.float64))
    assert torch.allclose(mech.noise_std(), torch.full((m,), 0.9 * base_clip, dtype=torch.float64))
    count_move = (mech.count(g1.norm(dim=2), mask1) - mech.count(g0.norm(dim=2), mask0)).abs()
    assert torch.all(count_move == 0.5)
    # a gradient within Z' keeps its length relative to the others: scaled by C / Z', not clipped
    z_prime = torch.clamp(mech.threshold, min=base_clip)
    s1 = _sum(mech, g1, idx1, mask1)
    for r in range(m):
        inside = mask1[r] & (g1[r].norm(dim=1) <= z_prime[r])
        beyond = mask1[r] & ~inside
        want = (g1[r][inside].sum(0) * base_clip / z_prime[r]
                + (g1[r][beyond] * (base_clip / g1[r][beyond].norm(dim=1))[:, None]).sum(0))
        assert torch.allclose(s1[r], want, rtol=1e-10, atol=1e-12)


def test_the_sensitivity_check_fails_for_a_global_threshold_without_its_scale():
    """The property test can fail: clipping at the threshold Z' without scaling by ρ = C / Z' moves the sum by
    up to Z' > C (here 5 with C = 1)."""

    class Unscaled(GlobalScaling):
        def weights(self, losses, clip, mask):
            return None

    mech = Unscaled(base_clip=1.0, noise_multiplier=1.0, initial=10.0, quantile=0.5, quantile_lr=0.2,
                    count_noise_std=1.0, expected_batch=4.0)
    g = torch.tensor([[[3.0, 4.0], [0.0, 0.0]]], dtype=torch.float64)
    idx, with_z, without = torch.tensor([[0, 1]]), torch.tensor([[True, False]]), torch.tensor([[False, False]])
    move = torch.linalg.norm(_sum(mech, g, idx, with_z) - _sum(mech, g, idx, without), dim=1)
    assert float(move[0]) == pytest.approx(5.0) and float(move[0]) > mech.base_clip
    assert float(torch.linalg.norm(_sum(GlobalScaling(base_clip=1.0, noise_multiplier=1.0, initial=10.0, quantile=0.5,
                                                      quantile_lr=0.2, count_noise_std=1.0, expected_batch=4.0),
                                        g, idx, with_z))) == pytest.approx(0.5)


def test_the_count_releases_carry_the_set_ups_noise_from_their_own_stream():
    """Released − exact counts are N(0, σ²) with the mechanism's σ (sample std within 5 % over 8000 draws), and
    the draws come from the count stream: the step generator's state is untouched."""
    rng = np.random.default_rng(0)
    m, width, k = 40, 12, 5
    groups = rng.integers(0, k, m * width)
    idx = torch.arange(m * width).reshape(m, width)
    norms = torch.as_tensor(rng.uniform(0, 2, (m, width)))
    mask = torch.as_tensor(rng.random((m, width)) < 0.8)
    f = ClippingBias(groups=groups, n_groups=k, base_clip=1.0, noise_multiplier=1.0, count_noise_std=3.5, n_models=m)
    a = GlobalScaling(base_clip=1.0, noise_multiplier=1.0, initial=1.0, quantile=0.7, quantile_lr=0.2,
                      count_noise_std=2.5, expected_batch=10.0, n_models=m)
    gen = torch.Generator().manual_seed(7)
    before = gen.get_state().clone()
    f_err, a_err = [], []
    for _ in range(20):
        f.see_batch(idx, types.SimpleNamespace(norms=norms), mask, gen)
        f_err.append((f.released - f.counts(idx, norms, mask)).flatten())
    for _ in range(200):
        a.threshold = torch.ones(m, dtype=torch.float64)  # the count is about Z before the update
        exact = a.count(norms, mask)
        a.observe(idx, norms, mask, gen)
        a_err.append(a.released - exact)
    assert torch.equal(gen.get_state(), before)
    f_err, a_err = torch.cat(f_err), torch.cat(a_err)
    assert len(f_err) == len(a_err) == 8000
    assert abs(float(f_err.std()) / 3.5 - 1) < 0.05 and abs(float(f_err.mean())) < 3.5 * 0.05
    assert abs(float(a_err.std()) / 2.5 - 1) < 0.05 and abs(float(a_err.mean())) < 2.5 * 0.05


def _one_tier(epsilon: float, **fields) -> RunConfig:
    tiers = TiersConfig(assign="random", tiers=(TierConfig(epsilon=epsilon, ratio=1.0),))
    return RunConfig().replace(**{"data.name": "digits", "batch_size": 64, "epochs": 2.0, "tiers": tiers,
                                  "algorithm.group_by": "class", "device": "cpu", "eval_every": 10**6, **fields})


@pytest.fixture(scope="module")
def digits():
    cfg = _one_tier(8.0)
    return cfg, prepare_data(cfg)


@pytest.mark.parametrize("name, sensitivity", [("dpsgd_f", 1.0), ("dpsgd_global_adapt", 0.5)])
@pytest.mark.parametrize("epsilon", [1.0, 8.0])
def test_counts_and_gradient_together_cost_dpsgds_step(digits, name, sensitivity, epsilon):
    """z_g^-2 + (Δ_b / σ_b)^2 = z^-2 with z DP-SGD's multiplier at the same ε, whose ε over the plan's steps is
    at most the target; the set-up's gradient multiplier is above z (the counts are paid for in noise)."""
    _, data = digits
    cfg = _one_tier(epsilon, **{"algorithm.name": name})
    privacy = prepare_privacy(cfg, data, steps=50)
    dpsgd = prepare_privacy(cfg.replace(**{"algorithm.name": "dpsgd"}), data, steps=50)
    s, z = privacy.clip_setup, float(dpsgd.plan.noise_multiplier)
    assert s.dpsgd_noise_multiplier == pytest.approx(z, rel=1e-12) and s.noise_multiplier > z
    assert s.noise_multiplier ** -2 + (sensitivity / s.count_noise_std) ** 2 == pytest.approx(z ** -2, rel=1e-10)
    assert s.noise_multiplier <= 1.05 * z + 1e-12 or cfg.algorithm.count_noise_std is not None  # the default σ
    plan = privacy.plan
    spent = accounting.epsilon(noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rates[0],
                               steps=plan.steps, delta=cfg.delta)
    assert spent <= epsilon * (1 + 1e-9) and privacy.formal_dp
    mech = build_mechanism(privacy=privacy, members=np.ones((1, data.n_train), bool), device=CPU)
    assert mech.formal_dp and math.isclose(float(mech.noise_multiplier), s.noise_multiplier)


def test_a_count_noise_too_small_to_pay_for_is_refused_by_its_field(digits):
    cfg, data = digits
    for name in ("dpsgd_f", "dpsgd_global_adapt"):
        with pytest.raises(ConfigError) as e:
            prepare_privacy(cfg.replace(**{"algorithm.name": name, "algorithm.count_noise_std": 1e-3}), data,
                            steps=50)
        assert e.value.field == "algorithm.count_noise_std" and "count_noise_std" in e.value.message


@pytest.mark.parametrize("name, field, value", [("dpsgd_f", "group_by", "zodiac"), ("dpsgd_f", "count_noise_std", -1.0),
                                               ("dpsgd_global_adapt", "quantile", 1.5),
                                               ("dpsgd_global_adapt", "quantile_lr", 0.0),
                                               ("dpsgd_global_adapt", "initial_clip", -2.0),
                                               ("dpsgd_global_adapt", "count_noise_std", 0.0)])
def test_their_fields_are_validated_by_name(name, field, value):
    """The config fields each reads are checked by its spec, the error naming the field."""
    with pytest.raises(ConfigError) as e:
        RunConfig().replace(**{"algorithm.name": name, f"algorithm.{field}": value}).validate()
    assert e.value.field == f"algorithm.{field}"


@pytest.mark.parametrize("name", ["dpsgd_f", "dpsgd_global_adapt"])
def test_a_stack_of_models_trains_each_on_its_own_half(digits, one_thread, name):
    """The model axis: 3 models on different halves, 40 steps; finite parameters, each model's own clips (and
    thresholds), and every model better than chance."""
    cfg, data = digits
    cfg = cfg.replace(**{"algorithm.name": name, "model.name": "lr"})
    n = data.n_train
    privacy = prepare_privacy(cfg, data, steps=40, tier_sizes=[max(1, s // 2) for s in data.tiers.sizes])
    rng = np.random.default_rng(0)
    members = rng.random((3, n)) < 0.5
    mech = build_mechanism(privacy=privacy, members=members, device=CPU)
    ens = StackedModels(ModelConfig(name="lr"), data.dataset.input_shape, 10, [0, 1, 2], "cpu")
    sgd_train(ens, data.dataset.x_train, data.dataset.y_train,
              PoissonSampler(members, privacy.sample_rates, CPU, expected_batch=privacy.expected_batch),
              mech, steps=40, lr=1.0, gen=torch.Generator().manual_seed(0))
    assert all(torch.isfinite(v).all() for v in ens.params.values())
    rows = [mech.model_state(r)["group_clip_norms"] for r in range(3)]
    assert rows[0] != rows[1] != rows[2]
    _, _, preds = ens.score(data.dataset.x_test, data.dataset.y_test)
    acc = (preds == data.dataset.y_test.numpy()[None, :]).mean(1)
    assert acc.min() > 0.3, acc


def test_a_pa_alooa_audit_runs_both_beside_dpsgd():
    """A tiny digits audit with DP-SGD and both baselines: one report each, finite Δ and accuracy above chance."""
    cfg = AuditConfig(run=DEFAULT_RUN.replace(**{"data.name": "digits", "epochs": 2.0, "batch_size": 64,
                                                 "threads": 1}),
                      group_by="class", R=3, epsilon=4.0, n_boot=100, looa_k=0,
                      algorithms=tuple(AlgorithmConfig(name=n) for n in ("dpsgd", "dpsgd_f", "dpsgd_global_adapt")))
    report = run_audit(cfg)
    labels = [a.label for a in report.algorithms]
    assert labels == [algorithm(n).label for n in ("dpsgd", "dpsgd_f", "dpsgd_global_adapt")]
    for a in report.algorithms:
        assert a.formal_dp and math.isfinite(a.delta.value) and a.accuracy.mean > 0.3


@pytest.mark.slow
def test_dpsgd_fs_clips_and_noise_cost_are_drawn_and_said_with_its_name(tmp_path, one_thread, shared_data):
    """DPSGD-F draws the group-clip figure (its registry entry's figures), Global-Adapt does not: its runs' rows carry
    its label, the noise ratio is its noise z_g · max_k C_k over DP-SGD's σ·C at the same ε, and the live sentence
    names DPSGD-F (not DP-SGD-S) with that ratio."""
    store = RunStore(tmp_path / "runs.sqlite")
    base = RunConfig().replace(**{
        "data.name": "adult", "data.max_train": 2000, "model.name": "lr", "epochs": 1.0, "eval_every": 5,
        "tiers": TiersConfig(assign="random", tiers=(TierConfig(epsilon=1.0, ratio=1.0),)),
        "algorithm.group_by": "attribute", "device": "cpu"})
    runs = {}
    for name in ("dpsgd", "dpsgd_f", "dpsgd_global_adapt"):
        cfg = base.replace(**{"algorithm.name": name})
        rid = store.create_run(cfg.validate(), group_id="baselines")
        execute(store, rid, cfg, kind="train")
        runs[name] = run_record(store, rid)
    frame = tf.group_clip_frame(list(runs.values()))
    assert not frame.empty and set(frame["algorithm"]) == {algorithm("dpsgd_f").label}
    plan = PlanRecord.of(runs["dpsgd_f"]["plan"])
    sigma_c = plan.group_clip.dpsgd_noise_multiplier * plan.group_clip.base_clip
    assert plan.group_clip.dpsgd_noise_multiplier == PlanRecord.of(runs["dpsgd"]["plan"]).noise_multiplier
    per_step = frame.drop_duplicates(["run_id", "step"])
    assert np.allclose(per_step["noise_ratio"], per_step["noise_std"] / sigma_c, rtol=1e-12)
    top = frame.groupby("step")["clip_norm"].max().to_numpy()
    assert np.allclose(per_step["noise_std"].to_numpy(), plan.group_clip.gradient_noise_multiplier * top, rtol=1e-9)
    latest = float(per_step["noise_ratio"].iloc[-1])
    sentence = tf.noise_cost_sentence(frame, threshold=latest)
    assert sentence.startswith(f"{algorithm('dpsgd_f').label} adds {latest:.1f}× the noise DP-SGD would")
