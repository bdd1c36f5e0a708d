"""DP-SGD-S (issue 8): bounded relative clips, soundness of the private quantile, the public group
sizes and their accounting, the NaN cases, accuracy at the same ε as DP-SGD, and null ε for runs
without a formal guarantee in every output."""
import copy
import csv
import io
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config.run import AlgorithmConfig, ModelConfig, RunConfig, TierConfig, TiersConfig
from engine.config.schema import ConfigError
from engine.dp import accounting
from engine.dp.grad_sample import PerSampleGrads
from engine.dp.mechanisms import (COUNT_NOISE_COST, COUNT_NOISE_PER_Z, GroupAdaptive, build_mechanism,
                                  default_count_noise_std)
from engine.dp.prepare import prepare_data, prepare_privacy
from engine.dp.stacked import StackedModels, sgd_train
from engine.dp.step import PoissonSampler, dp_step
from engine.jobs.kinds import execute
from engine.train.loop import prepare, train

CPU = torch.device("cpu")
LR = RunConfig().replace(**{"model.name": "lr", "epochs": 2.0, "device": "cpu", "algorithm.name": "dpsgd_s"})


# --------------------------------------------------------------------------------------------
# the mechanism: sensitivity ≤ max_k C_k, clips in [c_min·C, c_max·C] whatever the norms
# --------------------------------------------------------------------------------------------

class _Vectors:
    """A 'model' whose per-sample gradients are fixed vectors (one row per sample index)."""

    def __init__(self, grads):
        self.g = torch.as_tensor(np.asarray(grads, dtype=np.float64))

    def per_sample(self, x, y, idx, mask):
        rows = self.g[idx[0]]  # (L, d)
        norms = rows.norm(dim=1)[None] * mask
        return PerSampleGrads(torch.zeros_like(norms), norms, lambda coef: {"w": (coef[0] @ rows)[None]})


class _Fixed:
    """A sampler that always returns the same batch (all valid entries)."""

    def __init__(self, idx):
        self.idx = torch.as_tensor([idx], dtype=torch.long)
        self.expected_batch_tensor = torch.ones(1, dtype=torch.float64)

    def sample(self, gen):
        return self.idx, torch.ones_like(self.idx, dtype=torch.bool)


def _mech(k, c_min, c_max, private=True, rule="quantile", count_noise=3.0, groups=None, base=1.0):
    return GroupAdaptive(groups=np.arange(64) % k if groups is None else groups, n_groups=k, noise_multiplier=0.0,
                         expected_group_batch=np.ones(k), initial=1.0, tau=1.0, quantile=0.75, ema=0.9, c_min=c_min,
                         c_max=c_max, base_clip=base, private=private, quantile_lr=0.2, count_noise_std=count_noise,
                         clip_rule=rule)


norm_values = st.one_of(st.just(0.0), st.floats(1e-8, 1e8), st.just(math.inf), st.just(math.nan))


@settings(max_examples=80, deadline=None)
@given(k=st.integers(1, 4), c_min=st.floats(0.05, 2.0), spread=st.floats(1.0, 20.0), private=st.booleans(),
       base=st.floats(0.01, 100.0),
       history=st.lists(st.lists(st.tuples(st.integers(0, 63), norm_values), max_size=12), max_size=25),
       batch=st.lists(st.tuples(st.integers(0, 3), st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=3)),
                      max_size=10),
       z=st.tuples(st.integers(0, 3), st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=3)))
def test_clips_bounded_and_sensitivity_at_most_max_clip(k, c_min, spread, private, base, history, batch, z):
    c_max = c_min * spread
    mech = _mech(k, c_min, c_max, private=private, base=base)
    gen = torch.Generator().manual_seed(0)
    lo, hi = c_min * base * (1 - 1e-12), c_max * base * (1 + 1e-12)
    for entries in history:  # arbitrary norm sequences, empty batches included
        idx = torch.as_tensor([[i for i, _ in entries] or [0]], dtype=torch.long)
        norms = torch.as_tensor([[v for _, v in entries] or [0.0]], dtype=torch.float64)
        mask = torch.as_tensor([[True] * len(entries) or [False]])
        mech.observe(idx, norms, mask, gen)
        clips = mech.group_clips()
        assert torch.isfinite(clips).all() and bool((clips >= lo).all()) and bool((clips <= hi).all())
    # one sample z added to the batch: the clipped sum moves by at most C_{k(z)} ≤ max_k C_k
    groups = np.array([g % k for g, _ in batch] + [z[0] % k])
    mech.groups = torch.as_tensor(groups)
    grads = [v for _, v in batch] + [z[1]]
    n = len(batch)
    with_z, without = copy.deepcopy(mech), copy.deepcopy(mech)
    a = dp_step(_Vectors(grads), None, None, _Fixed(list(range(n + 1))), with_z, gen).grads["w"][0]
    b = dp_step(_Vectors(grads), None, None, _Fixed(list(range(n)) or [0]), without, gen).grads["w"][0] \
        if n else torch.zeros(3, dtype=torch.float64)
    c_z = float(mech.group_clips()[0, groups[-1]])
    assert float((a - b).norm()) <= c_z * (1 + 1e-9) + 1e-9
    assert c_z <= float(mech.group_clips().max()) <= hi


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 5), base=st.lists(st.tuples(st.integers(0, 4), st.floats(0, 10)), max_size=12),
       z_group=st.integers(0, 4), z_norm=st.floats(0, 10))
def test_count_release_has_l2_sensitivity_one_half(k, base, z_group, z_norm):
    """The per-group clipped counts Σ_i (1[‖g_i‖ ≤ S_k] − ½): adding one sample moves one coordinate by ½, so
    the vector's L2 sensitivity is ½ whatever the groups (the accounting's 2σ_b). Read back from the
    estimate's update with σ_b = 0 (exp(−η (counts / e + ½ − quantile)), e large so nothing clamps)."""
    def counts(entries):
        mech = _mech(k, 0.5, 4.0, count_noise=1e-300)
        mech.expected = torch.full_like(mech.expected, 1e3)
        idx = torch.as_tensor([[g % k for g, _ in entries] or [0]], dtype=torch.long)
        mech.groups = torch.arange(64) % k
        norms = torch.as_tensor([[v for _, v in entries] or [0.0]], dtype=torch.float64)
        mask = torch.as_tensor([[True] * len(entries) or [False]])
        mech.observe(idx, norms, mask, torch.Generator().manual_seed(0))
        return (-torch.log(mech.estimate[0]) / 0.2 - 0.5 + 0.75) * 1e3
    diff = counts(base + [(z_group, z_norm)]) - counts(base)
    assert float(diff.norm()) == pytest.approx(0.5, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(z=st.floats(0.05, 50.0), batch=st.floats(1.0, 1e4))
def test_default_count_noise_costs_at_most_five_percent_and_the_pair_is_one_gaussian(z, batch):
    """Default σ_b = max(expected batch / 20, 1.64 z, 1): z_Δ ≤ 1.05 z (exactly 1.05 z when the z term rules),
    and (z_Δ, 2σ_b) compose to exactly the plan's z (Andrew et al. 2021, Thm 1: the accounting is tight)."""
    sb = default_count_noise_std(batch, z)
    assert sb >= max(batch / 20, 1.0) and sb >= COUNT_NOISE_PER_Z * z * (1 - 1e-12)
    z_delta = accounting.adaptive_clipping_noise_multiplier(noise_multiplier=z, count_noise_std=sb)
    assert z < z_delta <= COUNT_NOISE_COST * z * (1 + 1e-9)
    assert z_delta ** -2 + (2 * sb) ** -2 == pytest.approx(z ** -2, rel=1e-9)
    if COUNT_NOISE_PER_Z * z >= max(batch / 20, 1.0):
        assert z_delta == pytest.approx(COUNT_NOISE_COST * z, rel=1e-9)


def test_noisy_fraction_is_clamped():
    """A huge count noise cannot move S_k by more than the clamped fraction allows per step."""
    mech = _mech(2, 0.5, 4.0, count_noise=1e9)
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        before = mech.estimate.clone()
        mech.observe(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1), torch.zeros(1, 1, dtype=torch.bool), gen)
        ratio = (mech.estimate / before).numpy()
        assert np.all(ratio >= math.exp(-0.2 * 0.25) * (1 - 1e-12)) and np.all(ratio <= math.exp(0.2 * 0.75) * (1 + 1e-12))


def test_reference_rule_follows_group_mean_gradients():
    """fair-privacy's rule: C_k = C · min(c_max, ‖batch mean g‖ / ‖group k mean g‖) from this batch."""
    grads = [[3.0, 0, 0], [1.0, 0, 0], [0, 0.5, 0], [0, 0.5, 0]]  # group 0: mean (2,0,0); group 1: (0,.5,0)
    mech = _mech(2, 0.5, 4.0, rule="reference", groups=np.array([0, 0, 1, 1]), base=2.0)
    assert mech.formal_dp is False
    mech.see_batch(torch.arange(4)[None], _Vectors(grads).per_sample(None, None, torch.arange(4)[None],
                                                                      torch.ones(1, 4, dtype=torch.bool)),
                   torch.ones(1, 4, dtype=torch.bool), torch.Generator())
    whole = math.hypot(4.0, 1.0) / 4
    expect = [2.0 * whole / 2.0, 2.0 * min(4.0, whole / 0.5)]
    np.testing.assert_allclose(mech.group_clips()[0].numpy(), expect)
    assert float(mech.noise_std()[0]) == 0.0  # noise_multiplier 0 here; the std is z · max_k C_k
    mech.observe(torch.arange(4)[None], torch.ones(1, 4), torch.ones(1, 4, dtype=torch.bool), torch.Generator())
    np.testing.assert_allclose(mech.state()["group_clip_norms"], expect)  # the evaluation records this step's clips


# --------------------------------------------------------------------------------------------
# configuration and accounting
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, field", [
    ({"c_min": 2.0, "c_max": 1.0}, "algorithm.c_min"),
    ({"c_max": math.inf}, "algorithm.c_max"),
    ({"c_min": 0.0}, "algorithm.c_min"),
    ({"c_min": math.nan}, "algorithm.c_min"),
    ({"clip_rule": "median"}, "algorithm.clip_rule"),
    ({"group_sizes": (10, 0)}, "algorithm.group_sizes[1]"),
    ({"group_sizes": ()}, "algorithm.group_sizes"),
    ({"group_size_noise_std": -1.0}, "algorithm.group_size_noise_std"),
])
def test_config_refuses(changes, field):
    with pytest.raises(ConfigError) as e:
        AlgorithmConfig(name="dpsgd_s", **changes).validate()
    assert e.value.field == field


def test_config_json_round_trip():
    cfg = LR.replace(**{"algorithm.group_sizes": (1, 2, 3), "algorithm.clip_rule": "reference", "algorithm.c_max": 2})
    assert RunConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("eps", [1.0, 10.0])
def test_release_composed_into_the_plan(eps):
    base = accounting.plan(mode="dpsgd", epsilons=[eps], delta=1e-5, tier_sizes=[1000], batch_size=50,
                           clip_norm=1.0, steps=300)
    sigma_n = accounting.release_noise_multiplier_default(noise_multiplier=base.noise_multiplier,
                                                          sample_rate=base.sample_rates[0], steps=300)
    p = accounting.plan_with_release(base, sigma_n)
    assert 0.99 * eps <= p.epsilons[0] <= eps
    assert base.noise_multiplier < p.noise_multiplier <= 1.03 * base.noise_multiplier  # the default release is cheap
    assert p.release_noise_multipliers == (sigma_n,)
    acc = accounting.TierAccountant(sample_rates=p.sample_rates, noise_multiplier=p.noise_multiplier, delta=1e-5,
                                    releases=p.release_noise_multipliers)
    assert 0 < acc.epsilons()[0] < eps  # the release alone, before step 1
    acc.step(300)
    assert acc.epsilons()[0] == pytest.approx(p.epsilons[0], rel=1e-12)
    # without the release the same noise multiplier spends less
    assert accounting.epsilon(sample_rate=p.sample_rates[0], noise_multiplier=p.noise_multiplier, steps=300,
                              delta=1e-5) < p.epsilons[0]


def test_dpsgd_s_plan_meets_the_budget_and_records_what_it_uses():
    prep = prepare(LR)  # paper tiers ε = 1, 2, 3; groups = tiers; sizes released with noise
    plan, info = prep.plan, prep.info
    assert plan.release_noise_multipliers and info["group_size_source"] == "released"
    assert all(0.99 * 1.0 <= e <= 1.0 for e in plan.epsilons)  # DP-SGD plan: every tier at the strictest ε
    exact = np.bincount(prep.privacy.clip_setup.groups)
    assert not np.array_equal(np.asarray(info["group_sizes"]), exact)  # noisy, not the private sizes
    np.testing.assert_allclose(info["expected_group_batch"], np.asarray(info["group_sizes"]) * plan.sample_rates[0])
    dp = prepare(LR.replace(**{"algorithm.name": "dpsgd"})).plan
    assert plan.noise_multiplier > dp.noise_multiplier
    assert info["gradient_noise_multiplier"] > plan.noise_multiplier  # z_Δ
    assert info["count_noise_std"] == default_count_noise_std(plan.expected_batch_size, plan.noise_multiplier)
    assert info["gradient_noise_multiplier"] <= COUNT_NOISE_COST * plan.noise_multiplier * (1 + 1e-9)
    result = train(LR.replace(epochs=0.3))
    rec = result.plan
    assert rec["noise_std"] is None and rec["clip_norms"] is None  # per step, not one number
    assert rec["c_min"] == 0.5 and rec["c_max"] == 4.0 and rec["base_clip"] == 1.0
    assert rec["formal_dp"] is True and rec["formal_dp_reason"] is None
    assert all(math.isfinite(e["noise_std"]) for e in result.evals)
    assert all(0.5 <= c <= 4.0 for e in result.evals for c in e["group_clip_norms"])
    spent = result.summary["tiers"][0]["epsilon_spent"]
    assert spent == pytest.approx(rec["epsilons"][0], rel=1e-9) and 0.99 <= spent <= 1.0  # the release included
    declared = prepare(LR.replace(**{"algorithm.group_sizes": tuple(int(v) for v in exact)}))
    assert declared.plan.release_noise_multipliers == () and declared.plan.noise_multiplier == dp.noise_multiplier
    assert declared.info["group_size_source"] == "declared"
    with pytest.raises(ConfigError) as e:
        prepare(LR.replace(**{"algorithm.group_sizes": (5, 5)}))
    assert e.value.field == "algorithm.group_sizes"


# --------------------------------------------------------------------------------------------
# the NaN cases: a group of one sample, a group absent from an audit half
# --------------------------------------------------------------------------------------------

def _one_sample_tier(n):
    assignment = tuple([0] * (n - 1) + [1])
    return TiersConfig(assign="explicit", assignment=assignment,
                       tiers=(TierConfig(epsilon=5.0, name="many"), TierConfig(epsilon=5.0, name="single")))


def test_group_of_one_sample_is_refused_by_name():
    cfg = LR.replace(tiers=_one_sample_tier(1437))
    with pytest.raises(ConfigError) as e:
        prepare(cfg.replace(**{"algorithm.group_sizes": (1436, 1)}))
    assert e.value.field == "algorithm.group_by" and "'single'" in e.value.message and "< 1" in e.value.message
    for seed in range(3):  # released sizes: refused by name, or (noise said it is bigger) trains without NaN
        try:
            out = train(cfg.replace(seed=seed, epochs=1.0))
        except ConfigError as err:
            assert err.field == "algorithm.group_by" and "'single'" in err.message
        else:
            assert math.isfinite(out.summary["loss"]) and all(np.isfinite(e["group_clip_norms"]).all() for e in out.evals)


def test_audit_refuses_a_group_too_small_for_a_half():
    from engine.audit.pa_alooa.config import AuditConfig
    from engine.audit.pa_alooa.setup import prepare_audit

    run = LR.replace(tiers=_one_sample_tier(1437))
    algo = AlgorithmConfig(name="dpsgd_s", group_by="tier", group_sizes=(1436, 8))  # (B / (N/2)) · 8/2 < 1
    with pytest.raises(ConfigError) as e:
        prepare_audit(AuditConfig(run=run, algorithms=(algo,), R=2, group_by="tier"))
    assert e.value.field == "algorithms[0].group_by" and "'single'" in e.value.message


def test_group_absent_from_a_model_half_trains_without_nan(one_thread):
    """The audit's chunk path: a group with no member in a model's half still gets bounded clips and
    finite parameters (its counts are normalised by the public expected count, not by zero)."""
    cfg = LR.replace(**{"data.max_train": 400, "algorithm.group_by": "class", "batch_size": 64})
    data = prepare_data(cfg)
    n = data.n_train
    privacy = prepare_privacy(cfg, data, steps=30, tier_sizes=[max(1, s // 2) for s in data.tiers.sizes])
    members = np.zeros((2, n), bool)
    members[0, ::2] = True
    members[1, 1::2] = True
    labels = data.dataset.y_train.numpy()
    members[0, labels == 3] = False  # class 3 absent from model 0's half
    mech = build_mechanism(privacy=privacy, members=members, device=CPU)
    ens = StackedModels(ModelConfig(name="lr"), data.dataset.input_shape, 10, [0, 1], "cpu")
    sgd_train(ens, data.dataset.x_train, data.dataset.y_train, PoissonSampler(members, privacy.sample_rates, CPU,
                                                                                expected_batch=privacy.expected_batch),
              mech, steps=30, lr=1.0, gen=torch.Generator().manual_seed(0))
    assert all(torch.isfinite(v).all() for v in ens.params.values())
    clips = mech.group_clips()
    assert bool((clips >= 0.5 - 1e-12).all()) and bool((clips <= 4.0 + 1e-12).all())


# --------------------------------------------------------------------------------------------
# accuracy at the same ε, lr and epochs (short runs)
# --------------------------------------------------------------------------------------------

def _mean_accuracy(cfg, seeds=(0, 1, 2)):
    return float(np.mean([train(cfg.replace(seed=s)).summary["accuracy"] for s in seeds]))


def _one_tier(data, eps, max_train=None, model="lr", epochs=5.0, group_by="class"):
    tiers = TiersConfig(assign="random", tiers=(TierConfig(epsilon=eps, ratio=1.0),))
    return RunConfig().replace(**{"data.name": data, "data.max_train": max_train, "model.name": model, "epochs": epochs,
                                  "tiers": tiers, "algorithm.group_by": group_by, "device": "cpu", "eval_every": 10**6})


@pytest.mark.slow
@pytest.mark.parametrize("case", ["adult LR ε=1", "digits CNN paper tiers ×10", "digits CNN ε=10 class groups"])
def test_accuracy_within_two_points_of_dpsgd(case, one_thread, shared_data):
    """Issue 8's acceptance where it holds (seeds 0–2, paired: same init, batches and gradient noise). Not met
    (docs/RESULTS.md, bench/dpsgd_s_accuracy.py): MNIST-10k LR (−6 / −3 points at ε = 1 / 10) and the digits
    CNN at ε = 1 (−15 to −20), where the noise σ·max_k C_k follows a clip spread max_k C_k ≈ 1.25–1.7 C."""
    if case.startswith("adult"):
        base = _one_tier("adult", 1.0, epochs=1.0, group_by="attribute")
    elif case.endswith("class groups"):
        base = _one_tier("digits", 10.0, model="cnn", epochs=10.0)
    else:  # the lab's default digits run (CNN, 10 epochs, groups = tiers) at ε = 10, 20, 30
        tiers = TiersConfig(tiers=tuple(TierConfig(epsilon=10.0 * t.epsilon, classes=t.classes, name=t.name)
                                        for t in RunConfig().tiers.tiers))
        base = RunConfig().replace(**{"tiers": tiers, "device": "cpu", "eval_every": 10**6})
    dp = _mean_accuracy(base.replace(**{"algorithm.name": "dpsgd"}))
    s = _mean_accuracy(base.replace(**{"algorithm.name": "dpsgd_s"}))
    assert s >= dp - 0.02, (case, dp, s)


def test_with_every_clip_at_c_dpsgd_s_trains_as_dpsgd(one_thread, shared_data):
    """Where the gap remains it is the clip spread, not the rest of the machinery: on MNIST-10k LR at ε = 1
    (DP-SGD-S's largest gap on LR) the same DP-SGD-S run with c_min = c_max = 1 — private quantile, released
    group sizes, z_Δ all still paid — is within 1 point of DP-SGD."""
    base = _one_tier("mnist", 1.0, max_train=10000)
    dp = _mean_accuracy(base.replace(**{"algorithm.name": "dpsgd"}), seeds=(0, 1))
    pinned = _mean_accuracy(base.replace(**{"algorithm.name": "dpsgd_s", "algorithm.c_min": 1.0,
                                            "algorithm.c_max": 1.0}), seeds=(0, 1))
    assert pinned >= dp - 0.01, (dp, pinned)


# --------------------------------------------------------------------------------------------
# runs without a formal guarantee: ε spent / planned ε null in every output, and the label says why
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, why", [
    ({"algorithm.private_quantile": False}, "non-private quantile"),
    ({"algorithm.clip_rule": "reference"}, "reference clip rule"),
    ({"algorithm.name": "nonprivate"}, "non-private SGD"),
])
@pytest.mark.slow
def test_null_epsilon_everywhere(changes, why, tmp_path, capsys):
    from engine import cli
    from engine.figures.export import configs_json, load_runs, metrics_csv
    from engine.store.db import RunStore

    cfg = LR.replace(epochs=0.5, **changes)
    path = tmp_path / "runs.sqlite"
    store = RunStore(path)
    rid = store.create_run(cfg)
    out = execute(store, rid, cfg, kind="train")
    assert out.plan["formal_dp"] is False and why in out.plan["formal_dp_reason"]
    assert out.plan.get("epsilons") is None
    assert out.summary["formal_dp"] is False and why in out.summary["formal_dp_reason"]
    assert all(t["epsilon_spent"] is None for t in out.summary["tiers"])
    assert all(t["epsilon_spent"] is None for e in store.eval_metrics(rid) for t in e["tiers"])
    run = store.get_run(rid)
    assert run["plan"].get("epsilons") is None and all(t["epsilon_spent"] is None for t in run["summary"]["tiers"])
    assert cli.main(["--store", str(path), "show", str(rid)]) == 0
    shown = capsys.readouterr().out
    assert f"no formal DP guarantee: {out.summary['formal_dp_reason']}" in shown
    tier_lines = [line for line in shown.splitlines() if line.startswith("ε=")]
    assert len(tier_lines) == 3 and all(line.split()[2] == "—" for line in tier_lines)
    assert cli.main(["--store", str(path), "show", str(rid), "--json"]) == 0
    shown_json = json.loads(capsys.readouterr().out)
    assert all(t["epsilon_spent"] is None for t in shown_json["summary"]["tiers"])
    rec = load_runs(store, [rid])
    exported = json.loads(configs_json(rec))[0]
    assert exported["summary"]["formal_dp_reason"] == out.summary["formal_dp_reason"]
    assert all(t["epsilon_spent"] is None for t in exported["summary"]["tiers"])
    rows = [r for r in csv.DictReader(io.StringIO(metrics_csv(rec[0]).decode())) if r["metric"] == "epsilon_spent"]
    assert rows and all(r["value"] == "" for r in rows)
    # the labels say why, and the ε-spent figure names the run instead of drawing a curve
    from engine.figures import frames, training
    from engine.jobs.runs import dp_note, run_label

    note = dp_note(rec[0])
    assert note.startswith("non-private") if changes.get("algorithm.name") == "nonprivate" else \
        note == f"no formal DP guarantee: {out.summary['formal_dp_reason']}"
    fig = training.fig_epsilon_spent(frames.tier_history(rec), notes={run_label(rec[0]): note})
    texts = " ".join(a.text for a in fig.layout.annotations)
    assert "ε spent null" in texts and run_label(rec[0]) in texts


def test_plan_preview_shows_what_dpsgd_s_uses():
    from app_pages._plans import _plan_caption, plan_frame
    from engine.train.loop import preview

    p = preview(LR)
    assert p.noise_std is None and p.clip_norms is None and p.formal_dp is True and p.formal_dp_reason is None
    assert p.noise_multipliers == (p.group_clip.gradient_noise_multiplier,) * 3  # σ per tier: z_Δ
    assert [t.noise_multiplier for t in p.tiers] == list(p.noise_multipliers) and p.tiers[0].clip_norm is None
    caption = _plan_caption(p)
    assert "z_Δ" in caption and "[0.5, 4] × C = 1" in caption and "released with noise" in caption
    frame = plan_frame(p)
    assert list(frame["σ (noise mult.)"]) == [round(p.group_clip.gradient_noise_multiplier, 4)] * 3
    loose = preview(LR.replace(**{"algorithm.clip_rule": "reference"}))
    assert loose.formal_dp is False and "reference clip rule" in loose.formal_dp_reason and loose.epsilons is None
    assert plan_frame(loose)["ε planned"].isna().all()
