"""Tests for engine.audit.pa_alooa.stats (membership-audit statistics)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import mannwhitneyu, norm

from engine.audit.pa_alooa.design import complementary_membership
from engine.audit.pa_alooa.stats import (
    auc,
    bootstrap_gpr,
    epsilon_lower_bound,
    gpr_delta,
    group_privacy_risk,
    lira_by_group,
    lira_scores,
    logit_confidence,
    null_distribution,
    null_floor,
    pa_ga,
    pa_gba,
    pa_looa,
    per_group_epsilon_lower_bound,
    roc_curve_points,
    roc_summary,
    sample_advantage,
    tpr_at_fpr,
)
from engine.audit.pa_alooa.stats.inputs import _split_models
from engine.audit.pa_alooa.stats.thresholds import _best_threshold

R = 200  # 2R = 400 models
N_SAMPLES = 2000


def true_adv(sigma):
    """TV distance between N(1, s^2) and N(0, s^2) = best threshold advantage."""
    return 2 * norm.cdf(1 / (2 * sigma)) - 1


def ks_floor(n_pos, n_neg):
    """Asymptotic mean of the one-sided two-sample KS statistic
    (sup of a Brownian bridge has mean sqrt(pi/8))."""
    return math.sqrt(math.pi / 8) * math.sqrt(1 / n_pos + 1 / n_neg)


def selection_allowance(R_):
    # Held-out picks t on one half (R/2 members vs R/2 non-members per sample):
    # the expected loss of the selected rule vs the optimal one is a fraction of
    # that half's selection-noise scale (measured ~0.15x for Gaussians); allow 0.25x.
    return 0.25 * ks_floor(R_ // 2, R_ // 2)


@pytest.fixture(scope="module")
def membership():
    return complementary_membership(N_SAMPLES, R, seed=11)


def gaussian_scores(mem, sigma, seed):
    rng = np.random.default_rng(seed)
    sig = np.broadcast_to(np.asarray(sigma, dtype=float), (mem.shape[1],))
    return mem * 1.0 + sig[None, :] * rng.standard_normal(mem.shape)


# --------------------------------------------------------------------------- #
# design
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("n", [1, 2, 7, 10, 101])
@pytest.mark.parametrize("R_", [1, 3, 4])
def test_complementary_membership_invariants(n, R_):
    m = complementary_membership(n, R_, seed=3)
    assert m.shape == (2 * R_, n) and m.dtype == bool
    assert np.all(m.sum(axis=0) == R_)
    assert np.all(m[0::2] ^ m[1::2])
    sizes = m.sum(axis=1)
    for r in range(R_):
        assert abs(int(sizes[2 * r]) - int(sizes[2 * r + 1])) == n % 2
        if n % 2:  # the extra sample alternates sides
            assert sizes[2 * r] > sizes[2 * r + 1] if r % 2 == 0 else sizes[2 * r] < sizes[2 * r + 1]
    np.testing.assert_array_equal(m, complementary_membership(n, R_, seed=3))


def test_complementary_membership_is_random():
    m = complementary_membership(1000, 50, seed=0)
    # each sample lands in row 2r with prob 1/2, independently across r
    frac = m[0::2].mean(axis=0)
    assert abs(frac.mean() - 0.5) < 0.01
    assert not np.array_equal(m[0], m[2])


# --------------------------------------------------------------------------- #
# sample_advantage: exactness
# --------------------------------------------------------------------------- #
def brute_force_in_sample(s, m):
    out = np.empty(s.shape[1])
    for i in range(s.shape[1]):
        si, mi = s[:, i], m[:, i]
        P, N = mi.sum(), (~mi).sum()
        if P == 0 or N == 0:
            out[i] = np.nan
            continue
        best = 0.0  # t = +inf
        for t in np.unique(si):
            pred = si >= t
            best = max(best, (pred & mi).sum() / P - (pred & ~mi).sum() / N)
        out[i] = best
    return out


@st.composite
def small_problem(draw):
    M = draw(st.integers(2, 12))
    n = draw(st.integers(1, 6))
    levels = draw(st.integers(1, 5))  # few levels -> many ties
    s = np.array(draw(st.lists(st.integers(0, levels), min_size=M * n, max_size=M * n)), float).reshape(M, n)
    m = np.array(draw(st.lists(st.booleans(), min_size=M * n, max_size=M * n))).reshape(M, n)
    return s, m


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problem())
def test_in_sample_matches_brute_force(prob):
    s, m = prob
    got = sample_advantage(s, m, threshold="in_sample")
    exp = brute_force_in_sample(s, m)
    np.testing.assert_allclose(got, exp, atol=1e-12, equal_nan=True)
    ok = ~np.isnan(got)
    assert np.all((got[ok] >= 0) & (got[ok] <= 1))


def brute_force_held_out_direction(sa, ma, sb, mb):
    """Best rule (highest threshold among ties) on a, evaluated on b; the cut is
    placed midway between the lowest included and the next distinct score."""
    out = np.empty(sa.shape[1])
    for i in range(sa.shape[1]):
        P, N = ma[:, i].sum(), (~ma[:, i]).sum()
        best, bt = 0.0, None
        levels = np.unique(sa[:, i])[::-1]
        for k, t in enumerate(levels):
            pred = sa[:, i] >= t
            v = (pred & ma[:, i]).sum() / P - (pred & ~ma[:, i]).sum() / N
            if v > best + 1e-12:
                best = v
                bt = (t + levels[k + 1]) / 2 if k + 1 < len(levels) else -np.inf
        pb = np.zeros(sb.shape[0], bool) if bt is None else sb[:, i] >= bt
        Pb, Nb = mb[:, i].sum(), (~mb[:, i]).sum()
        out[i] = (pb & mb[:, i]).sum() / Pb - (pb & ~mb[:, i]).sum() / Nb
    return out


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 5), st.integers(1, 6), st.integers(1, 4), st.integers(0, 2**31))
def test_held_out_matches_brute_force(R_, n, levels, seed):
    # integer-valued scores with ties; B may hold levels unseen in A
    rng = np.random.default_rng(seed)
    m = complementary_membership(n, R_, seed=seed)
    s = rng.integers(0, levels + 1, size=m.shape).astype(float)
    got = sample_advantage(s, m, threshold="held_out", seed=seed)
    ia, ib = _split_models(m, np.random.default_rng(seed), R_)
    exp = 0.5 * (brute_force_held_out_direction(s[ia], m[ia], s[ib], m[ib])
                 + brute_force_held_out_direction(s[ib], m[ib], s[ia], m[ia]))
    np.testing.assert_allclose(got, exp, atol=1e-12)
    assert np.all((got >= -1) & (got <= 1))


def test_in_sample_edge_cases():
    s = np.array([[1.0, 0.0, 5.0], [1.0, 0.0, 5.0], [0.0, 1.0, 5.0]])
    m = np.array([[True, True, True], [False, False, True], [False, False, True]])
    adv = sample_advantage(s, m)
    # col0: member score 1 tied with a non-member 1 -> best is t=1: 1 - 1/2
    assert adv[0] == pytest.approx(0.5)
    assert adv[1] == 0.0  # member scores lower: no positive rule
    assert np.isnan(adv[2])  # no non-member
    # infinite scores are fine (loss = inf -> score = -inf)
    s2 = np.array([[np.inf], [-np.inf], [-np.inf], [np.inf]])
    m2 = np.array([[True], [False], [False], [False]])
    assert sample_advantage(s2, m2)[0] == pytest.approx(2 / 3)  # t=+inf: TPR 1, FPR 1/3
    with pytest.raises(ValueError):
        sample_advantage(np.full((2, 2), np.nan), np.ones((2, 2), bool))
    with pytest.raises(ValueError):
        sample_advantage(s, m, threshold="nope")


def test_held_out_with_infinite_scores():
    m = complementary_membership(5, 4, seed=0)
    s = np.where(m, np.inf, -np.inf)
    np.testing.assert_allclose(sample_advantage(s, m, threshold="held_out"), 1.0)
    np.testing.assert_allclose(sample_advantage(-s, m, threshold="held_out"), 0.0)


# --------------------------------------------------------------------------- #
# sample_advantage: Gaussian mechanism
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 4.0])
def test_gaussian_mechanism_advantage(membership, sigma):
    s = gaussian_scores(membership, sigma, seed=int(sigma * 100))
    truth = true_adv(sigma)
    ho = sample_advantage(s, membership, threshold="held_out", seed=1)
    ins = sample_advantage(s, membership, threshold="in_sample")
    se = ho.std(ddof=1) / math.sqrt(ho.size)
    # held-out is unbiased for the *selected* rule, so conservative: never
    # above the truth beyond sampling error, below it by at most selection loss.
    assert ho.mean() <= truth + 4 * se
    assert ho.mean() >= truth - 4 * se - selection_allowance(R)
    # in-sample is optimistic
    se_in = ins.std(ddof=1) / math.sqrt(ins.size)
    assert ins.mean() > truth + 4 * se_in
    assert ins.mean() > ho.mean()
    assert ins.mean() < truth + 2 * ks_floor(R, R)
    assert np.all((ins >= 0) & (ins <= 1))
    assert ho.min() < ins.min() + 1e-12  # held-out is noisier / can dip


def test_held_out_unbiased_for_selected_rule(membership):
    """Oracle check: E[held-out] == E[true advantage of the selected thresholds]."""
    sigma = 1.0
    s = gaussian_scores(membership, sigma, seed=5)
    ho = sample_advantage(s, membership, threshold="held_out", seed=3)
    ia, ib = _split_models(membership, np.random.default_rng(3), R)

    def true_adv_of(t):
        a = np.where(np.isnan(t), 0.0, norm.sf((t - 1) / sigma) - norm.sf(t / sigma))
        return a

    _, ta = _best_threshold(s[ia], membership[ia], want_threshold=True)
    _, tb = _best_threshold(s[ib], membership[ib], want_threshold=True)
    oracle = 0.5 * (true_adv_of(ta) + true_adv_of(tb))
    diff = ho - oracle
    se = diff.std(ddof=1) / math.sqrt(diff.size)
    assert abs(diff.mean()) < 4 * se
    assert oracle.mean() <= true_adv(sigma)


def test_null_floor(membership):
    rng = np.random.default_rng(0)
    s = gaussian_scores(membership, 1.0, seed=9)
    f_in = null_floor(s, membership, threshold="in_sample", seed=1)
    f_ho = null_floor(s, membership, threshold="held_out", seed=1)
    theory = ks_floor(R, R)  # ~0.0627 for 200 vs 200
    assert 0.04 < f_in < 0.09
    assert 0.8 * theory < f_in < 1.05 * theory  # discrete KS sits slightly below the limit
    # held-out on pure-noise scores: per-sample spread gives the tolerance
    noise = rng.standard_normal(membership.shape)
    ho_null = sample_advantage(noise, membership, threshold="held_out")
    tol = 4 * ho_null.std(ddof=1) / math.sqrt(ho_null.size)
    assert abs(ho_null.mean()) < tol
    assert abs(f_ho) < tol
    # permutation keeps R members per sample and is deterministic in seed
    assert null_floor(s, membership, threshold="in_sample", seed=1) == f_in
    f2 = null_floor(s, membership, threshold="in_sample", n_perm=3, seed=2)
    assert abs(f2 - f_in) < 0.01


def test_null_floor_unpaired_design():
    rng = np.random.default_rng(4)
    M, n = 40, 300
    m = np.zeros((M, n), bool)
    for i in range(n):
        m[rng.choice(M, 15, replace=False), i] = True
    s = rng.standard_normal((M, n))
    f = null_floor(s, m, threshold="in_sample", seed=0)
    assert 0.5 * ks_floor(15, 25) < f < 1.2 * ks_floor(15, 25)


def test_randomized_response_advantage():
    m = complementary_membership(3000, 50, seed=2)
    rng = np.random.default_rng(8)
    for eps in (0.5, 1.0, 2.0):
        p1 = math.exp(eps) / (1 + math.exp(eps))
        bit = np.where(m, rng.random(m.shape) < p1, rng.random(m.shape) < 1 - p1).astype(float)
        ho = sample_advantage(bit, m, threshold="held_out", seed=0)
        ins = sample_advantage(bit, m, threshold="in_sample")
        truth = math.tanh(eps / 2)
        se = ho.std(ddof=1) / math.sqrt(ho.size)
        assert ho.mean() <= truth + 4 * se
        assert ho.mean() >= truth - 4 * se - selection_allowance(50)
        assert ins.mean() >= ho.mean()


# --------------------------------------------------------------------------- #
# groups
# --------------------------------------------------------------------------- #
def test_group_privacy_risk_analytic(membership):
    sigmas = {"a": 1.0, "b": 2.0, "c": 4.0}
    groups = np.array(["a", "b", "c"])[np.arange(N_SAMPLES) % 3]
    sig = np.array([sigmas[g] for g in groups])
    s = gaussian_scores(membership, sig, seed=21)
    adv = sample_advantage(s, membership, threshold="held_out", seed=0)
    gpr = group_privacy_risk(adv, groups)
    assert list(gpr) == ["a", "b", "c"] and all(isinstance(k, str) for k in gpr)
    for g, sg in sigmas.items():
        a = adv[groups == g]
        se = a.std(ddof=1) / math.sqrt(a.size)
        assert true_adv(sg) - 4 * se - selection_allowance(R) <= gpr[g] <= true_adv(sg) + 4 * se
    d = gpr_delta(gpr)
    assert d == pytest.approx((max(gpr.values()) - min(gpr.values())) * 100)
    d_true = (true_adv(1.0) - true_adv(4.0)) * 100
    assert abs(d - d_true) < 100 * (selection_allowance(R) + 0.02)

    bs = bootstrap_gpr(adv, groups, n_boot=400, seed=0)
    for g in sigmas:
        r = bs["groups"][g]
        assert r["low"] <= r["mean"] <= r["high"]
        assert r["mean"] == pytest.approx(gpr[g])
        a = adv[groups == g]
        width = 2 * 1.96 * a.std(ddof=1) / math.sqrt(a.size)
        assert 0.7 * width < r["high"] - r["low"] < 1.3 * width
    # Δ: the plug-in beside it; groups this far apart leave the bias correction little to do
    assert bs["delta"]["plug_in"] == pytest.approx(d)
    assert bs["delta"]["low"] <= bs["delta"]["value"] <= bs["delta"]["high"]
    assert abs(bs["delta"]["value"] - d) < 0.1 * (bs["delta"]["high"] - bs["delta"]["low"])
    assert bootstrap_gpr(adv, groups, n_boot=50, seed=3) == bootstrap_gpr(adv, groups, n_boot=50, seed=3)


def test_group_privacy_risk_int_groups_and_nan():
    adv = np.array([0.1, 0.3, np.nan, 0.5])
    g = np.array([1, 1, 2, 2])
    gpr = group_privacy_risk(adv, g)
    assert gpr == {1: pytest.approx(0.2), 2: pytest.approx(0.5)}
    assert all(type(k) is int for k in gpr)
    assert gpr_delta(gpr) == pytest.approx(30.0)


# --------------------------------------------------------------------------- #
# baselines
# --------------------------------------------------------------------------- #
def test_pa_looa_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = rng.integers(0, 4, size=rng.integers(1, 8)).astype(float)
        b = rng.integers(0, 4, size=rng.integers(1, 8)).astype(float)
        best = 0.0
        for t in np.unique(np.r_[a, b]):
            best = max(best, (a >= t).mean() - (b >= t).mean())
        assert pa_looa(a, b) == pytest.approx(best)
    assert pa_looa([1.0, 2.0], [0.0, -1.0]) == 1.0


def test_pa_ga_and_gba():
    m = complementary_membership(1000, 20, seed=1)
    rng = np.random.default_rng(2)
    # per-sample offsets: a global threshold cannot exploit them, a per-sample one can
    offs = 3 * rng.standard_normal(1000)
    s = m * 1.0 + offs[None, :] + 0.5 * rng.standard_normal(m.shape)
    ga = pa_ga(s, m)
    sa = np.nanmean(sample_advantage(s, m, threshold="held_out"))
    assert 0 <= ga < sa
    # without offsets the global attack recovers the (homogeneous) truth
    s0 = m * 1.0 + 0.5 * rng.standard_normal(m.shape)
    assert abs(pa_ga(s0, m) - true_adv(0.5)) < 0.05
    groups = np.where(np.arange(1000) < 500, "x", "y")
    s1 = m * np.where(groups == "x", 1.0, 0.0)[None, :] + 0.5 * rng.standard_normal(m.shape)
    gba = pa_gba(s1, m, groups)
    assert abs(gba["x"] - true_adv(0.5)) < 0.05
    assert gba["y"] < 0.1


# --------------------------------------------------------------------------- #
# LiRA / ROC
# --------------------------------------------------------------------------- #
def test_logit_confidence_finite():
    c = logit_confidence(np.array([0.0, 0.5, 1.0, 0.9]))
    assert np.all(np.isfinite(c))
    assert c[1] == 0.0 and c[3] == pytest.approx(math.log(9))
    assert c[0] == pytest.approx(-c[2]) and c[0] < -20


def test_roc_and_auc_match_mann_whitney():
    rng = np.random.default_rng(1)
    s = rng.integers(0, 5, size=300).astype(float)  # ties
    y = rng.random(300) < 0.4
    fpr, tpr = roc_curve_points(s, y)
    assert fpr[0] == tpr[0] == 0 and fpr[-1] == tpr[-1] == 1
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
    assert len(fpr) == len(np.unique(s)) + 1
    U = mannwhitneyu(s[y], s[~y]).statistic
    assert auc(fpr, tpr) == pytest.approx(U / (y.sum() * (~y).sum()))


def test_lira_detects_shift_and_null():
    m = complementary_membership(500, 16, seed=3)
    rng = np.random.default_rng(3)
    base = 2 * rng.standard_normal(500)  # per-sample difficulty
    conf = base[None, :] + 1.0 * m + rng.standard_normal(m.shape)
    lira = lira_scores(conf, m)
    assert lira.shape == m.shape and np.all(np.isfinite(lira))
    fpr, tpr = roc_curve_points(lira, m)
    a = auc(fpr, tpr)
    assert a > 0.65
    # per-sample calibration beats the raw confidence
    f0, t0 = roc_curve_points(conf, m)
    assert a > auc(f0, t0) + 0.05
    ts = [tpr_at_fpr(fpr, tpr, x) for x in (0.0, 0.001, 0.01, 0.1, 0.5, 1.0)]
    assert all(x <= y for x, y in zip(ts, ts[1:])) and ts[-1] == 1.0
    null = lira_scores(base[None, :] + rng.standard_normal(m.shape), m)
    fn, tn = roc_curve_points(null, m)
    assert abs(auc(fn, tn) - 0.5) < 0.02

    groups = np.where(np.arange(500) % 2 == 0, "even", "odd")
    res = lira_by_group(lira, m, groups)
    assert set(res) == {"even", "odd"}
    for r in res.values():
        assert r["auc"] > 0.6
        assert 0 <= r["tpr_at_0.1%"] <= r["tpr_at_1%"] <= 1


@pytest.mark.parametrize("seed", range(4))
def test_roc_summary_equals_the_whole_curves_numbers(seed, monkeypatch):
    """roc_summary folds the curve piece by piece: its AUC, TPR at 0.1 % / 1 % FPR and thinned ROC are those of
    the whole curve of roc_curve_points (the envelope on the log grid from half the smallest positive FPR)."""
    from engine.audit.pa_alooa.stats import baselines

    rng = np.random.default_rng(seed)
    n = 4000
    y = rng.random(n) < 0.3 + 0.1 * seed
    s = rng.standard_normal(n) + 1.5 * y
    if seed % 2:
        s = np.round(s * 4) / 4  # ties, across positives and negatives
    s[rng.random(n) < 0.05] = np.nan
    monkeypatch.setattr(baselines, "_BLOCK_ELEMS", 97)  # dozens of pieces
    got = roc_summary(s, y, roc_points=40)
    fpr, tpr = roc_curve_points(s, y)
    assert got["auc"] == pytest.approx(auc(fpr, tpr), rel=1e-12)
    assert got["tpr_at_0.1%"] == tpr_at_fpr(fpr, tpr, 0.001) and got["tpr_at_1%"] == tpr_at_fpr(fpr, tpr, 0.01)
    grid = np.unique(np.r_[np.logspace(-5, 0, 40), 1.0])
    env = np.maximum.accumulate(tpr)[np.searchsorted(fpr, grid, side="right") - 1]
    keep = grid >= max(fpr[fpr > 0].min(), 1e-5) / 2
    assert got["roc"] == {"fpr": grid[keep].tolist(), "tpr": env[keep].tolist()}
    assert "roc" not in roc_summary(s, y)


def test_lira_leave_one_out_definition():
    rng = np.random.default_rng(0)
    m = complementary_membership(3, 3, seed=0)
    c = rng.standard_normal(m.shape)
    out = lira_scores(c, m)
    mi, j = 2, 1
    others = np.arange(6) != mi
    mu_in = c[others & m[:, j], j].mean()
    mu_out = c[others & ~m[:, j], j].mean()
    res = np.where(m, c - np.nanmean(np.where(m, c, np.nan), axis=0), c - np.nanmean(np.where(~m, c, np.nan), axis=0))
    var = (res**2).sum() / (res.size - 6)
    exp = ((c[mi, j] - mu_out) ** 2 - (c[mi, j] - mu_in) ** 2) / (2 * var)
    assert out[mi, j] == pytest.approx(exp)


# --------------------------------------------------------------------------- #
# empirical epsilon
# --------------------------------------------------------------------------- #
def rr_counts(eps, n, rng):
    p = math.exp(eps) / (1 + math.exp(eps))
    tp = rng.binomial(n, p)
    fp = rng.binomial(n, 1 - p)
    return tp, n - tp, fp, n - fp


def test_epsilon_lower_bound_randomized_response():
    rng = np.random.default_rng(0)
    lb = epsilon_lower_bound(*rr_counts(1.0, 100_000, rng), delta=0.0)
    assert 0.5 < lb <= 1.0
    for seed in range(20):
        r = np.random.default_rng(100 + seed)
        for n in (100, 2000, 50_000):
            assert epsilon_lower_bound(*rr_counts(1.0, n, r), delta=1e-5) <= 1.0
    noise = epsilon_lower_bound(*rr_counts(0.0, 100_000, rng), delta=0.0)
    assert noise < 0.03
    # perfect attack with few trials is still bounded by the sample size
    assert 0 < epsilon_lower_bound(100, 0, 0, 100, delta=0.0) < 6
    assert epsilon_lower_bound(0, 100, 0, 100, delta=0.0) == 0.0
    # more confidence -> smaller bound; delta lowers it
    c = rr_counts(1.0, 5000, np.random.default_rng(1))
    assert epsilon_lower_bound(*c, delta=0, confidence=0.99) < epsilon_lower_bound(*c, delta=0, confidence=0.9)
    assert epsilon_lower_bound(*c, delta=0.1) < epsilon_lower_bound(*c, delta=0.0)


def test_epsilon_lower_bound_coverage():
    """The bound is a 95% statement: exceedance of the true ε must be rare."""
    rng = np.random.default_rng(7)
    lbs = np.array([epsilon_lower_bound(*rr_counts(1.0, 1000, rng), delta=0.0) for _ in range(400)])
    assert np.mean(lbs > 1.0) <= 0.05  # observed ~1% (CP + Bonferroni is conservative)
    assert np.median(lbs) > 0.6


def test_per_group_epsilon_lower_bound():
    m = complementary_membership(2000, 20, seed=5)
    rng = np.random.default_rng(5)
    groups = np.where(np.arange(2000) < 1000, "lo", "hi")
    eps_g = np.where(groups == "lo", 0.5, 2.0)[None, :]
    p1 = np.exp(eps_g) / (1 + np.exp(eps_g))
    bit = np.where(m, rng.random(m.shape) < p1, rng.random(m.shape) < 1 - p1).astype(float)
    res = per_group_epsilon_lower_bound(bit, m, groups, delta=1e-5, seed=0)
    assert res["lo"]["epsilon_lb"] <= 0.5 and res["hi"]["epsilon_lb"] <= 2.0
    assert res["hi"]["epsilon_lb"] > 1.5
    assert res["lo"]["epsilon_lb"] > 0.3
    for r in res.values():
        assert r["tp"] + r["fn"] + r["fp"] + r["tn"] == 1000 * 20  # half of 40 models
        assert r["tp"] + r["fn"] == r["fp"] + r["tn"]
        assert r["tpr"] > r["fpr"]
    # pure noise -> ~0
    noise = per_group_epsilon_lower_bound(rng.standard_normal(m.shape), m, groups, delta=1e-5)
    assert all(r["epsilon_lb"] < 0.1 for r in noise.values())


# --------------------------------------------------------------------------- #
# the design's pairs, handed down
# --------------------------------------------------------------------------- #
def test_the_design_hands_its_pairs_to_the_statistics():
    """The audit tells the statistics its R (``pairs=``): the numbers are those the matrix's own pair structure
    gives, ``pairs=0`` splits the models without regard to pairs, and a matrix that is not the design's R pairs
    is refused rather than silently split some other way."""
    rng = np.random.default_rng(4)
    R_ = 6
    m = complementary_membership(300, R_, seed=2)
    s = rng.standard_normal(m.shape) + 0.8 * m
    groups = np.where(np.arange(300) % 3 == 0, "a", "b")
    told = sample_advantage(s, m, threshold="held_out", seed=1, pairs=R_)
    np.testing.assert_array_equal(told, sample_advantage(s, m, threshold="held_out", seed=1))
    plain = sample_advantage(s, m, threshold="held_out", seed=1, pairs=0)
    assert not np.array_equal(told, plain)  # a plain split of the 12 models is another split
    null_told = null_distribution(s, m, groups, threshold="held_out", n_perm=3, seed=2, pairs=R_)
    assert null_told == null_distribution(s, m, groups, threshold="held_out", n_perm=3, seed=2)
    eps_told = per_group_epsilon_lower_bound(s, m, groups, delta=1e-5, seed=3, pairs=R_)
    assert eps_told == per_group_epsilon_lower_bound(s, m, groups, delta=1e-5, seed=3)
    for wrong in (R_ - 1, R_ + 1):
        with pytest.raises(ValueError, match="complementary pairs"):
            sample_advantage(s, m, threshold="held_out", pairs=wrong)
    broken = m.copy()
    broken[1, 0] = broken[0, 0]  # sample 0 in both models of pair 0: not the design
    with pytest.raises(ValueError, match="complementary pairs"):
        null_distribution(s, broken, groups, n_perm=1, pairs=R_)


@settings(max_examples=60, deadline=None)
@given(k=st.integers(0, 5000), extra=st.integers(0, 5000), alpha=st.floats(1e-6, 0.5),
       mu=st.floats(1e-3, 20.0), eps=st.floats(0.0, 50.0), size=st.integers(2, 500), ci=st.floats(0.5, 0.999))
def test_the_scipy_kernels_called_directly_are_scipy_stats_to_the_bit(k, extra, alpha, mu, eps, size, ci):
    """Clopper-Pearson (``stats.epsilon._cp_upper``), the Gaussian mechanism's δ(ε) (``one_run.bound``) and the paired
    t interval (``controls.compare``) call scipy.special's kernels, not scipy.stats (whose import costs ~0.5 s in
    every process): the very numbers scipy.stats.beta.ppf, norm.cdf and t.ppf give."""
    from scipy import stats as sps

    from engine.audit.one_run.bound import gaussian_delta
    from engine.audit.pa_alooa.controls.compare import _t_interval
    from engine.audit.pa_alooa.stats.epsilon import _cp_upper

    n = k + extra
    got = _cp_upper(np.array([k, 0, n]), np.array([n, n, n]), alpha)
    want = [1.0 if kk >= n else sps.beta.ppf(1.0 - alpha, kk + 1.0, max(n - kk, 1e-300)) for kk in (k, 0, n)]
    assert got.tolist() == [float(w) for w in want]
    assert gaussian_delta(mu, eps) == float(sps.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * sps.norm.cdf(-eps / mu - mu / 2))
    units = np.random.default_rng(size).normal(size=size)
    est = _t_interval(units, ci)
    half = float(sps.t.ppf((1 + ci) / 2, size - 1) * units.std(ddof=1) / math.sqrt(size))
    assert (est.low, est.high) == (float(units.mean()) - half, float(units.mean()) + half)
