"""Tests for engine.dp.accounting: Opacus agreement, planner invariants, live accountant."""

import itertools
import json
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from engine.dp import accounting as acc
from engine.dp import fast_rdp
from engine.dp.accounting import Plan, PlanError, TierAccountant

ORDERS = RDPAccountant.DEFAULT_ALPHAS


def opacus_eps(q, sigma, steps, delta):
    """Ground truth, straight from Opacus."""
    return opacus_eps_of_rdp(compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=ORDERS), delta)


def opacus_eps_of_rdp(rdp, delta):
    """Opacus' ε of per-order RDP values (its get_privacy_spent over its default orders)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps, _ = get_privacy_spent(orders=ORDERS, rdp=rdp, delta=delta)
    return float(eps)


# ---------------------------------------------------------------- fast path vs Opacus

GRID_Q = (1e-3, 0.01, 0.05, 0.3)
GRID_SIGMA = (0.7, 1.0, 2.35, 5.0)
GRID_T = (1, 100, 3000)
GRID_DELTA = (1e-5, 1e-3)


def test_fast_rdp_matches_opacus_per_order():
    qs, sigmas = zip(*itertools.product(GRID_Q, GRID_SIGMA))
    fast = fast_rdp.rdp(np.array(qs), np.array(sigmas))  # all (q, σ) at once
    for k, (q, s) in enumerate(zip(qs, sigmas)):
        exact = np.asarray(compute_rdp(q=q, noise_multiplier=s, steps=1, orders=ORDERS))
        # below ~1e-13 both are floating-point noise of Opacus' own alternating series
        np.testing.assert_allclose(fast[k], exact, rtol=1e-6, atol=1e-13, err_msg=f"q={q} sigma={s}")
        np.testing.assert_allclose(fast_rdp.rdp(q, s)[0], fast[k], rtol=1e-12, atol=0)


def test_fast_epsilon_matches_opacus_and_never_smaller():
    for q, s in itertools.product(GRID_Q, GRID_SIGMA):
        rdp1 = np.asarray(compute_rdp(q=q, noise_multiplier=s, steps=1, orders=ORDERS))
        # Opacus' T steps are T times its one step, to the bit (its compute_rdp multiplies), so the truth for every
        # T and δ is read off one step's RDP: two compute_rdp calls per (q, σ) instead of seven (this test's time)
        T = GRID_T[-1]
        assert np.array_equal(np.asarray(compute_rdp(q=q, noise_multiplier=s, steps=T, orders=ORDERS)), rdp1 * T)
        for T, d in itertools.product(GRID_T, GRID_DELTA):
            exact = opacus_eps_of_rdp(rdp1 * T, d)
            fast = float(fast_rdp.epsilon(q, s, T, d)[0])
            assert fast >= exact, (q, s, T, d, fast, exact)
            assert abs(fast - exact) <= 1e-6 * exact, (q, s, T, d, fast, exact)
            assert exact == pytest.approx(acc._opacus_eps_from_rdp(rdp1 * T, d), rel=1e-15)


def test_fast_epsilon_full_batch_and_vectorized_rates():
    for s in (0.7, 2.0, 10.0):
        assert fast_rdp.epsilon(1.0, s, 50, 1e-5)[0] == pytest.approx(opacus_eps(1.0, s, 50, 1e-5), rel=1e-8)
    qs = np.array([1e-4, 0.02, 0.5, 1.0])
    many = fast_rdp.epsilon(qs, 1.3, 200, 1e-5)
    for q, e in zip(qs, many):
        assert e >= opacus_eps(float(q), 1.3, 200, 1e-5)
        assert e == pytest.approx(opacus_eps(float(q), 1.3, 200, 1e-5), rel=1e-6)


def test_epsilon_is_opacus_and_matches_rdp_accountant():
    e = acc.epsilon(sample_rate=0.01, noise_multiplier=1.1, steps=500, delta=1e-5)
    assert e == opacus_eps(0.01, 1.1, 500, 1e-5)
    ra = RDPAccountant()
    for _ in range(500):
        ra.step(noise_multiplier=1.1, sample_rate=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert e == pytest.approx(ra.get_epsilon(delta=1e-5), rel=1e-12)
    assert acc.epsilon(sample_rate=0.01, noise_multiplier=1.1, steps=0, delta=1e-5) == 0.0


# ---------------------------------------------------------------- noise multiplier search


def test_dpsgd_reference_sigma():
    p = acc.plan(mode="dpsgd", epsilons=(1, 2, 3), delta=1e-5, tier_sizes=(20000,) * 3,
                 batch_size=600, clip_norm=1.0, steps=3000)
    assert p.noise_multiplier == pytest.approx(2.35909, rel=1e-3)
    assert p.sample_rates == (0.01, 0.01, 0.01)
    assert p.clip_norms == (1.0, 1.0, 1.0)
    assert p.noise_std == p.noise_multiplier
    assert p.expected_batch_size == pytest.approx(600)


@pytest.mark.parametrize("eps,q,T,d", [(1.0, 0.01, 3000, 1e-5), (8.0, 256 / 60000, 2000, 1e-5),
                                        (0.5, 0.05, 100, 1e-3), (3.0, 1.0, 10, 1e-5)])
def test_noise_multiplier_for_is_smallest_and_tight(eps, q, T, d):
    s = acc.noise_multiplier_for(epsilon=eps, sample_rate=q, steps=T, delta=d)
    e = opacus_eps(q, s, T, d)
    assert 0.999 * eps <= e <= eps
    assert opacus_eps(q, s * (1 - 1e-3), T, d) > eps  # a visibly smaller σ breaks the budget


# ---------------------------------------------------------------- planner invariants

SETUPS = {
    "3x20000": dict(epsilons=(1.0, 2.0, 3.0), tier_sizes=(20000,) * 3, batch_size=600, steps=3000),
    "unsorted": dict(epsilons=(3.0, 1.0, 2.0), tier_sizes=(20000,) * 3, batch_size=600, steps=3000),
    "10tiers": dict(epsilons=tuple(1.0 + 0.5 * k for k in range(10)), tier_sizes=(6000,) * 10,
                    batch_size=600, steps=3000),
    "unequal": dict(epsilons=(1.0, 2.0, 3.0), tier_sizes=(32400, 22200, 5400), batch_size=600, steps=3000),
    "mnist": dict(epsilons=(0.5, 2.0, 8.0), tier_sizes=(32400, 22200, 5400), batch_size=256, steps=2000),
}


def check_plan(p: Plan, mode, epsilons, tier_sizes, batch_size, steps, delta, clip_norm):
    n = len(epsilons)
    assert p.mode == mode and p.steps == steps and p.delta == delta
    assert p.target_epsilons == tuple(float(e) for e in epsilons)
    assert p.tier_sizes == tuple(tier_sizes)
    assert len(p.sample_rates) == len(p.clip_norms) == len(p.epsilons) == n
    assert p.noise_std == pytest.approx(p.noise_multiplier * clip_norm, rel=1e-12)
    assert p.expected_batch_size == pytest.approx(sum(q * m for q, m in zip(p.sample_rates, tier_sizes)), rel=1e-12)
    e_min = min(epsilons)
    for k in range(n):
        z = p.noise_std / p.clip_norms[k]  # σ*·C/C_n
        got = opacus_eps(p.sample_rates[k], z, steps, delta)
        assert got == pytest.approx(p.epsilons[k], rel=1e-9)
        assert got <= epsilons[k] * (1 + 1e-12), (k, got, epsilons[k])
        tight = mode != "dpsgd" or epsilons[k] == e_min
        if tight and p.sample_rates[k] < 1.0:  # q capped at 1 is reported, not tight
            assert got >= 0.99 * epsilons[k], (mode, k, got, epsilons[k])
    if mode == "dpsgd":
        assert len(set(p.sample_rates)) == 1 and len(set(p.clip_norms)) == 1
        assert p.sample_rates[0] == pytest.approx(batch_size / sum(tier_sizes))
    if mode == "scale":
        assert all(q == pytest.approx(batch_size / sum(tier_sizes)) for q in p.sample_rates)
        assert all(c >= clip_norm for c in p.clip_norms)
        order = sorted(range(n), key=lambda k: epsilons[k])
        cs = [p.clip_norms[k] for k in order]
        assert all(a <= b for a, b in zip(cs, cs[1:]))
        assert all(p.clip_norms[k] == clip_norm for k in range(n) if epsilons[k] == e_min)
    if mode == "sample":
        assert all(c == clip_norm for c in p.clip_norms)
        if not any(q == 1.0 for q in p.sample_rates):
            assert abs(p.expected_batch_size - batch_size) <= 1e-3 * batch_size
        order = sorted(range(n), key=lambda k: epsilons[k])
        qs = [p.sample_rates[k] for k in order]
        assert all(a <= b for a, b in zip(qs, qs[1:]))
        for i, j in itertools.combinations(range(n), 2):
            if epsilons[i] == epsilons[j]:
                assert p.sample_rates[i] == p.sample_rates[j]


@pytest.mark.parametrize("mode", acc.MODES)
@pytest.mark.parametrize("setup", list(SETUPS))
def test_plan_invariants(mode, setup):
    kw = SETUPS[setup]
    p = acc.plan(mode=mode, delta=1e-5, clip_norm=1.0, **kw)
    check_plan(p, mode, delta=1e-5, clip_norm=1.0, **kw)


def test_sample_reference_shape_and_tier_order():
    a = acc.plan(mode="sample", epsilons=(1, 2, 3), delta=1e-5, tier_sizes=(20000,) * 3,
                 batch_size=600, clip_norm=1.0, steps=3000)
    b = acc.plan(mode="sample", epsilons=(3, 1, 2), delta=1e-5, tier_sizes=(20000,) * 3,
                 batch_size=600, clip_norm=1.0, steps=3000)
    assert a.sample_rates[0] < 0.01 < a.sample_rates[2]
    assert a.noise_multiplier < 2.35909  # SAMPLE needs less noise than DP-SGD at the same B
    assert b.sample_rates == (a.sample_rates[2], a.sample_rates[0], a.sample_rates[1])
    assert b.noise_multiplier == a.noise_multiplier


def test_equal_epsilons_share_rate_and_clip():
    kw = dict(epsilons=(1.0, 2.0, 1.0, 2.0), delta=1e-5, tier_sizes=(5000, 10000, 20000, 1000),
              batch_size=300, clip_norm=0.5, steps=500)
    for mode in acc.MODES:
        p = acc.plan(mode=mode, **kw)
        check_plan(p, mode, kw["epsilons"], kw["tier_sizes"], 300, 500, 1e-5, 0.5)
        assert p.sample_rates[0] == p.sample_rates[2] and p.sample_rates[1] == p.sample_rates[3]
        assert p.clip_norms[0] == p.clip_norms[2] and p.clip_norms[1] == p.clip_norms[3]


@pytest.mark.parametrize("eps", [(2.0,), (1.5, 1.5, 1.5)])
def test_single_or_equal_tiers_reduce_to_dpsgd(eps):
    kw = dict(epsilons=eps, delta=1e-5, tier_sizes=(60000 // len(eps),) * len(eps),
              batch_size=256, clip_norm=2.0, steps=2000)
    ref = acc.plan(mode="dpsgd", **kw)
    for mode in ("scale", "sample"):
        p = acc.plan(mode=mode, **kw)
        assert p.mode == mode
        assert (p.noise_multiplier, p.sample_rates, p.clip_norms, p.noise_std, p.epsilons) == (
            ref.noise_multiplier, ref.sample_rates, ref.clip_norms, ref.noise_std, ref.epsilons)


def test_sample_rate_capped_at_one_is_reported():
    p = acc.plan(mode="sample", epsilons=(1.0, 8.0), delta=1e-5, tier_sizes=(100, 100),
                 batch_size=150, clip_norm=1.0, steps=10)
    assert p.sample_rates[1] == 1.0 and p.epsilons[1] < 8.0
    assert p.notes and "capped" in p.notes[0] and "tier 1" in p.notes[0]
    check_plan(p, "sample", (1.0, 8.0), (100, 100), 150, 10, 1e-5, 1.0)


def test_plan_to_dict_is_json_ready():
    p = acc.plan(mode="scale", epsilons=(1, 3), delta=1e-5, tier_sizes=(100, 300),
                 batch_size=40, clip_norm=1.0, steps=100)
    d = json.loads(json.dumps(p.to_dict()))
    for k in ("mode", "noise_multiplier", "sample_rates", "clip_norms", "noise_std", "epsilons",
              "target_epsilons", "delta", "steps", "tier_sizes", "expected_batch_size"):
        assert k in d
    assert d["clip_norms"] == list(p.clip_norms) and d["mode"] == "scale"


# ---------------------------------------------------------------- live accountant


@pytest.mark.parametrize("mode", acc.MODES)
def test_tier_accountant_matches_plan(mode):
    p = acc.plan(mode=mode, epsilons=(1, 2, 3), delta=1e-5, tier_sizes=(32400, 22200, 5400),
                 batch_size=600, clip_norm=1.0, steps=3000)
    ta = TierAccountant(sample_rates=p.sample_rates, noise_multiplier=p.noise_multiplier,
                        delta=1e-5, noise_multipliers=p.noise_multipliers if mode == "scale" else None)
    assert ta.steps == 0 and ta.epsilons() == [0.0, 0.0, 0.0]
    ta.step()
    ta.step(999)
    mid = ta.epsilons()
    ta.step(2000)
    assert ta.steps == 3000
    assert ta.epsilons() == pytest.approx(list(p.epsilons), rel=1e-12)
    assert all(m < e for m, e in zip(mid, ta.epsilons()))
    if mode == "scale":  # the UI's own σ*·C/C_n gives the same numbers
        ta2 = TierAccountant(sample_rates=p.sample_rates, noise_multiplier=p.noise_multiplier, delta=1e-5,
                             noise_multipliers=[p.noise_multiplier * 1.0 / c for c in p.clip_norms])
        ta2.step(3000)
        assert ta2.epsilons() == pytest.approx(list(p.epsilons), rel=1e-9)


# ---------------------------------------------------------------- adaptive clipping


def test_adaptive_clipping_noise_multiplier():
    z = acc.adaptive_clipping_noise_multiplier(noise_multiplier=1.0, count_noise_std=5.0)
    assert z == pytest.approx((1.0 - 1.0 / 100.0) ** -0.5)
    assert z > 1.0
    # composition check: 1/z^2 = 1/z_Δ^2 + 1/(2σ_b)^2
    assert 1 / z**2 + 1 / 10.0**2 == pytest.approx(1.0)
    with pytest.raises(PlanError, match="count_noise_std"):
        acc.adaptive_clipping_noise_multiplier(noise_multiplier=2.0, count_noise_std=1.0)
    with pytest.raises(PlanError, match="count_noise_std"):
        acc.adaptive_clipping_noise_multiplier(noise_multiplier=2.0, count_noise_std=0.5)


# ---------------------------------------------------------------- errors

BASE = dict(mode="sample", epsilons=(1, 2), delta=1e-5, tier_sizes=(100, 100), batch_size=10,
            clip_norm=1.0, steps=10)


@pytest.mark.parametrize("override,word", [
    (dict(mode="fancy"), "mode"),
    (dict(epsilons=(1, 0)), "epsilons"),
    (dict(epsilons=(1, -2)), "epsilons"),
    (dict(epsilons=(1, float("nan"))), "epsilons"),
    (dict(epsilons=(1, float("inf"))), "epsilons"),
    (dict(epsilons=()), "epsilons"),
    (dict(epsilons=(0.1, 1)), "epsilons"),  # below the RDP floor at δ=1e-5
    (dict(delta=0.0), "delta"),
    (dict(delta=1.0), "delta"),
    (dict(tier_sizes=(100, 0)), "tier_sizes"),
    (dict(tier_sizes=(100,)), "tier_sizes"),
    (dict(batch_size=0), "batch_size"),
    (dict(batch_size=201), "batch_size"),
    (dict(clip_norm=0.0), "clip_norm"),
    (dict(clip_norm=float("inf")), "clip_norm"),
    (dict(steps=0), "steps"),
    (dict(steps=2.5), "steps"),
])
def test_plan_errors(override, word):
    with pytest.raises(PlanError, match=word):
        acc.plan(**{**BASE, **override})


def test_other_errors():
    assert issubclass(PlanError, ValueError)
    with pytest.raises(PlanError, match="sample_rate"):
        acc.noise_multiplier_for(epsilon=1.0, sample_rate=1.5, steps=10, delta=1e-5)
    with pytest.raises(PlanError, match="epsilon"):
        acc.noise_multiplier_for(epsilon=0.01, sample_rate=0.1, steps=10, delta=1e-5)
    with pytest.raises(PlanError, match="delta"):
        acc.epsilon(sample_rate=0.1, noise_multiplier=1.0, steps=10, delta=0)
    with pytest.raises(PlanError, match="noise_multipliers"):
        TierAccountant(sample_rates=(0.1, 0.2), noise_multiplier=1.0, delta=1e-5, noise_multipliers=(1.0,))
    with pytest.raises(PlanError, match="sample_rates"):
        TierAccountant(sample_rates=(0.0,), noise_multiplier=1.0, delta=1e-5)
    with pytest.raises(PlanError, match="batch_size"):
        # SAMPLE: loosest tier alone at q = 1 already exceeds B
        acc.plan(mode="sample", epsilons=(0.5, 50.0), delta=1e-5, tier_sizes=(1000, 1000),
                 batch_size=100, clip_norm=1.0, steps=1)


# ---------------------------------------------------------------- property test


@st.composite
def setups(draw):
    n = draw(st.integers(1, 4))
    eps = tuple(draw(st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0]), min_size=n, max_size=n)))
    sizes = tuple(draw(st.lists(st.integers(50, 20000), min_size=n, max_size=n)))
    N = sum(sizes)
    B = draw(st.integers(1, max(1, N // 20)))
    T = draw(st.sampled_from([10, 100, 500, 2000]))
    mode = draw(st.sampled_from(acc.MODES))
    return mode, eps, sizes, B, T


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setups())
def test_plan_property(s):
    mode, eps, sizes, B, T = s
    try:
        p = acc.plan(mode=mode, epsilons=eps, delta=1e-5, tier_sizes=sizes, batch_size=B,
                     clip_norm=1.0, steps=T)
    except PlanError as e:  # only SAMPLE's genuine "looser tiers alone exceed B" may fail
        assert mode == "sample" and "batch_size" in str(e)
        assume(False)
    check_plan(p, mode, eps, sizes, B, T, 1e-5, 1.0)
