"""The one-run audit in training: canaries are ordinary members of their tier, the bug detector sees a broken tier,
and every formal algorithm's ε̂ stays below its claim (engine.audit.one_run, engine.dp.canaries)."""
import json

import numpy as np
import pytest
from in_process import cli_here
import torch
from hypothesis import given, settings, strategies as st

from engine.audit.one_run.run import Fault, _StepView, design_canaries, run_one_algorithm, run_one_run_audit
from engine.audit.one_run.config import OneRunConfig
from engine.audit.one_run.report import OneRunReport
from engine.config.run import AlgorithmConfig
from engine.config.schema import ConfigError
from engine.dp.canaries import SPARE, GradientCanaries
from engine.dp.grad_sample import ModuleGrads
from engine.dp.dpsgd_f import ClippingBias
from engine.dp.step import PoissonSampler, dp_step
from engine.jobs.kinds import execute
from engine.models.nets import LogisticRegression
from engine.store.db import RunStore
from engine.train.loop import prepare

SMALL = OneRunConfig(canaries=300, input_canaries=40).validate()


def _lr_models(seed=0):
    torch.manual_seed(seed)
    model = LogisticRegression(6, 3).double()
    return ModuleGrads(model), {k: tuple(p.shape) for k, p in model.named_parameters()}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n_can=st.integers(1, 6), spare=st.booleans())
def test_a_gradient_canary_adds_exactly_its_weighted_clip_at_its_coordinate(seed, n_can, spare):
    """Σ coef_i g_i with canaries = the plain samples' sum + coef_j · norm_j · e_{c_j}; a canary's norm is what the
    mechanism clips, so adding one changes the clipped sum by at most its clip C_j (the mechanisms' invariant).
    With spare slots e_{c_j} is slot c_j of the extra entry SPARE, and the model's own sums are the plain ones."""
    rng = np.random.default_rng(seed)
    models, shapes = _lr_models(seed)
    n = 10
    x, y = torch.as_tensor(rng.standard_normal((n, 6))), torch.as_tensor(rng.integers(0, 3, n))
    coords = rng.permutation(n_can) if spare else rng.choice(21, size=n_can, replace=False)
    norms = rng.uniform(1.0, 3.0, n_can)
    wrapped = GradientCanaries(models, n_inputs=n, coords=coords, norms=norms, param_shapes=shapes, device="cpu",
                               spare=spare)
    idx = torch.as_tensor(np.concatenate([rng.choice(n, 4, replace=False), n + np.arange(n_can)]))[None, :]
    mask = torch.ones_like(idx, dtype=torch.bool)
    mask[0, -1] = bool(rng.random() < 0.5)  # the last canary may be a padded entry
    coef = torch.as_tensor(rng.uniform(0, 1, idx.shape))
    work = wrapped.per_sample(x, y, idx, mask)
    plain = models.per_sample(x, y, idx[:, :4], mask[:, :4]).weighted_sum(coef[:, :4])
    got = work.weighted_sum(coef * mask)
    flat_got = torch.cat([got[k].reshape(-1) for k in shapes])
    flat_plain = torch.cat([plain[k].reshape(-1) for k in shapes])
    diff = (flat_got - flat_plain).numpy()
    if spare:  # no canary reaches the model's coordinates; each one is in its own slot
        np.testing.assert_allclose(diff, 0.0, atol=1e-12)
        assert set(got) == set(shapes) | {SPARE} and got[SPARE].shape == (1, n_can)
        diff = got[SPARE].reshape(-1).numpy()
    want = np.zeros(n_can if spare else 21)
    for j in range(n_can):
        want[coords[j]] += float(coef[0, 4 + j] * mask[0, 4 + j]) * norms[j]
    np.testing.assert_allclose(diff, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(work.norms[0, 4:][mask[0, 4:]], torch.as_tensor(norms)[mask[0, 4:]])
    # canaries rank above every plain sample's loss (INO-SGD weighs them as much as any sample can be)
    assert bool((work.losses[0, 4:][mask[0, 4:]] > work.losses[0, :4].max()).all())


def test_the_step_divisor_is_public_whoever_is_in():
    """The expected batch the noisy sum is divided by must not reveal which canaries are in."""
    rates = np.full(20, 0.1)
    a = np.ones((1, 20), bool)
    b = a.copy()
    b[0, 15:] = False
    fixed = rates[:15].sum() + 0.5 * rates[15:].sum()
    sa = PoissonSampler(a, rates, "cpu", expected_batch=fixed)
    sb = PoissonSampler(b, rates, "cpu", expected_batch=fixed)
    assert float(sa.expected_batch_tensor) == float(sb.expected_batch_tensor) == pytest.approx(fixed)
    assert (a * rates).sum() != (b * rates).sum()  # what a divisor summed over the members would have said


def test_canaries_are_fixed_by_the_seed_and_input_canaries_carry_a_wrong_label_of_their_tier():
    prep = prepare(SMALL.run_for(AlgorithmConfig(name="dpsgd")))
    a, b = design_canaries(SMALL, prep), design_canaries(SMALL, prep)
    assert np.array_equal(a.coords, b.coords) and np.array_equal(a.grad_in, b.grad_in)
    assert 0.35 < a.grad_in.mean() < 0.65 and len(np.unique(a.coords)) == a.n_grad == 3 * 300
    y_test = prep.dataset.y_test.numpy()
    assert np.all(a.label != y_test[a.source])
    for k, tier in enumerate(SMALL.run.tiers.tiers):
        assert set(a.label[a.input_tier == k]) <= set(tier.classes)
    other = design_canaries(SMALL.replace(**{"run.seed": 1}), prep)
    assert not np.array_equal(a.grad_in, other.grad_in)


@pytest.mark.slow
def test_bug_detector_a_tier_whose_noise_is_divided_by_4_is_caught():
    """The point of the feature: IDP-SGD whose ε = 1 tier gets 4× its clip under the same noise (its noise divided
    by 4, unaccounted) must show ε̂ > 1 on that tier; the same run without the bug stays below every claim."""
    cfg = OneRunConfig(canaries=1200, input_canaries=0).validate()
    algo = AlgorithmConfig(name="idp_sample")
    prep = prepare(cfg.run_for(algo))
    can = design_canaries(cfg, prep)
    broken, _, _ = run_one_algorithm(cfg, algo, "idp", can, fault=Fault(tier=0, sensitivity_factor=4.0))
    for method in ("steinke", "fdp"):  # both bounds catch it (issue 42), from the same guesses
        assert broken.tiers[0].bound("white", method).epsilon_hat > broken.tiers[0].epsilon
    sound, _, _ = run_one_algorithm(cfg, algo, "idp", can)
    for t in sound.tiers:
        assert t.white.epsilon_hat <= t.epsilon and t.white_fdp.epsilon_hat <= t.epsilon
    assert sound.tiers[0].white.epsilon_hat < broken.tiers[0].white.epsilon_hat


@pytest.mark.slow
def test_bug_detector_a_tier_whose_sampling_rate_is_quadrupled_is_caught():
    """The issue's other bug: the ε = 1 tier sampled at 4× its planned rate (the accountant and the auditor's
    likelihood ratio still assume the planned one). Its canaries' spare slots see it; the sound run does not."""
    cfg = OneRunConfig(canaries=1200, input_canaries=0).validate()
    assert cfg.canary_slots == "spare"
    algo = AlgorithmConfig(name="idp_sample")
    prep = prepare(cfg.run_for(algo))
    can = design_canaries(cfg, prep)
    broken, _, _ = run_one_algorithm(cfg, algo, "idp", can, fault=Fault(tier=0, rate_factor=4.0))
    sound, _, _ = run_one_algorithm(cfg, algo, "idp", can)
    assert broken.tiers[0].white.epsilon_hat > broken.tiers[0].epsilon >= sound.tiers[0].white.epsilon_hat


@pytest.mark.slow
def test_spare_slots_see_more_than_model_coordinates():
    """The canaries' own slots take the other samples' gradients out of the score: on the broken tier ε̂ is higher
    than with canaries at model coordinates (same seed, same bug)."""
    algo = AlgorithmConfig(name="idp_sample")
    got = {}
    for slots in ("spare", "model"):
        cfg = OneRunConfig(canaries=1200, input_canaries=0, canary_slots=slots).validate()
        prep = prepare(cfg.run_for(algo))
        broken, _, _ = run_one_algorithm(cfg, algo, "idp", design_canaries(cfg, prep),
                                         fault=Fault(tier=0, sensitivity_factor=4.0))
        got[slots] = broken.tiers[0].white.epsilon_hat
    assert got["spare"] > got["model"]


def test_soundness_every_formal_algorithm_stays_below_its_claim_and_non_formal_runs_have_no_claim():
    cfg = SMALL.replace(algorithms=SMALL.algorithms + (AlgorithmConfig(name="nonprivate"),)).validate()
    report = run_one_run_audit(cfg)
    assert OneRunReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report
    f = report.frame()
    formal = f[f.formal_dp]
    assert set(formal.algorithm) == {"dpsgd", "idp_sample", "idp_scale", "ino", "dpsgd_s"}
    assert len(formal) == 5 * 3 * 2  # algorithms × tiers × kinds
    assert (formal.epsilon_hat <= formal.epsilon).all() and (formal.epsilon_hat_fdp <= formal.epsilon).all()
    assert formal.epsilon_hat_fdp.notna().all()  # the f-DP bound beside every Steinke bound
    assert not report.violations().shape[0]
    ref = f[f.algorithm == "nonprivate"]
    assert len(ref) == 6 and ref.epsilon.isna().all() and not ref.exceeds_claim.any()
    idp = [a for a in report.algorithms if a.key == "idp_sample"][0]
    assert [t.epsilon for t in idp.tiers] == pytest.approx([1.0, 2.0, 3.0], rel=1e-6)


def test_the_claimed_epsilon_is_the_runs_accountants():
    """Under ``run.accountant = "pld"`` each tier's claimed ε is PLD's for the mechanism the run trained (its plan's
    q and σ after T steps): within its target, where RDP would put the same mechanism above it."""
    from engine.dp.accountants import get_accountant
    from engine.train.loop import preview

    one = (AlgorithmConfig(name="idp_sample"),)
    cfg = SMALL.replace(algorithms=one, input_canaries=0, **{"run.epochs": 2.0, "run.accountant": "pld"}).validate()
    report = run_one_run_audit(cfg)
    [algo] = report.algorithms
    claimed = [t.epsilon for t in algo.tiers]
    assert claimed == pytest.approx([1.0, 2.0, 3.0], rel=1e-3) and all(c <= e for c, e in zip(claimed, (1, 2, 3)))
    f = report.frame()
    assert (f.epsilon_hat <= f.epsilon).all()
    plan = preview(cfg.run_for(one[0]))  # the plan the run trained with
    T = plan.steps
    for q, z, c in zip(plan.sample_rates, plan.noise_multipliers, claimed):
        assert c == pytest.approx(get_accountant("pld").epsilon(q, z, T, cfg.run.delta), rel=1e-9)
        assert get_accountant("rdp").epsilon(q, z, T, cfg.run.delta) > c * 1.01


def test_one_kind_of_canary_alone():
    """Black-box only (no gradient canaries) and white-box only both run, each reporting only its own kind."""
    one = (AlgorithmConfig(name="dpsgd"),)
    black = run_one_run_audit(SMALL.replace(canaries=0, algorithms=one, **{"run.epochs": 2.0}).validate())
    white = run_one_run_audit(SMALL.replace(input_canaries=0, algorithms=one, **{"run.epochs": 2.0}).validate())
    assert set(black.frame().kind) == {"black"} and set(white.frame().kind) == {"white"}
    assert all(t.white is None for t in black.algorithms[0].tiers)


def test_config_errors_name_the_field():
    for bad, field in (({"canaries": 0, "input_canaries": 0}, "canaries"), ({"beta": 0.7}, "beta"),
                       ({"canary_norm": 0.5}, "canary_norm"), ({"white_score": "max"}, "white_score"),
                       ({"run": {"algorithm": {"name": "ino"}}}, "run.algorithm"),
                       ({"run": {"tiers": None}}, "run.tiers")):
        with pytest.raises(ConfigError) as e:
            OneRunConfig.from_dict(bad).validate()
        assert e.value.field == field
    with pytest.raises(ConfigError) as e:
        OneRunConfig.from_dict({"canary_slots": "weights"}).validate()
    assert e.value.field == "canary_slots"
    too_many = SMALL.replace(canaries=100_000, canary_slots="model")  # more than the model has coordinates
    prep = prepare(too_many.run_for(AlgorithmConfig(name="dpsgd")))
    with pytest.raises(ConfigError) as e:
        design_canaries(too_many, prep)
    assert e.value.field == "canaries" and "coordinates" in e.value.message
    assert design_canaries(too_many.replace(canary_slots="spare"), prep).n_grad == 3 * 100_000  # slots of their own
    assert OneRunConfig.from_dict(SMALL.to_dict()) == SMALL


def test_job_kind_stores_the_report_and_the_cli_prints_it(tmp_path):
    store = RunStore(tmp_path / "s.db")
    cfg = OneRunConfig(algorithms=(AlgorithmConfig(name="dpsgd"),), canaries=100, input_canaries=20,
                       run=SMALL.run.replace(epochs=2.0)).validate()
    run_id = store.create_run(cfg.to_dict(), kind="one_run", status="queued", name="t")
    report = execute(store, run_id, cfg, kind="one_run")
    run = store.get_run(run_id)
    assert run["status"] == "finished" and OneRunReport.from_dict(run["summary"]) == report
    env = {"PRIVACY_LAB_STORE": str(tmp_path / "s.db")}
    shown = cli_here("show", run_id, env=env)
    assert shown.returncode == 0 and "claimed ε" in shown.stdout and "DP-SGD" in shown.stdout
    bad = cli_here("one-run-audit", "--set", "beta=3", env=env)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "beta" in bad.stderr


def test_the_auditor_scores_with_the_clips_and_noise_the_step_applied():
    """DPSGD-F sets its clips from this batch's noisy counts inside dp_step: the noise std and the canaries' bounds
    the one-run auditor scores a step with are those dp_step applied (read when it asks for the noise std), not the
    clips before the step (C₀ for every group at the first)."""
    models, _ = _lr_models()
    x, y = torch.randn(8, 6, dtype=torch.float64) * 5, torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    mech = ClippingBias(groups=np.array([0, 1] * 4), n_groups=2, base_clip=0.5, noise_multiplier=1.0,
                        count_noise_std=1.0)
    before = mech.noise_std().clone()
    view = _StepView(mech, torch.tensor([[6, 7]]))
    dp_step(models, x, y, PoissonSampler(np.ones((1, 8), bool), np.ones(8), "cpu", expected_batch=8.0), view,
            torch.Generator().manual_seed(3))
    std, bounds = view.applied()
    assert torch.equal(std, mech.noise_std()) and not torch.equal(std, before)
    assert torch.equal(bounds, mech.clip_norms(torch.tensor([[6, 7]])))
    assert view.applied()[0] is not std  # forgotten: read afresh after a non-private step
