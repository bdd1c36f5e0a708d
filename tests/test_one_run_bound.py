"""The one-run ε lower bound (engine.audit.one_run.bound) against mechanisms whose ε is known exactly: truth first."""
import math

import numpy as np
import pytest

from engine.audit.one_run.bound import (count_correct, epsilon_from_count, epsilon_lower_bound, gaussian_delta,
                                        gaussian_epsilon, gaussian_mu, gaussian_scores, guess_grid, p_value,
                                        expected_subsampled_bound, subsampled_scores)
from engine.dp.accounting import epsilon

BETA = 0.05


def test_gaussian_epsilon_inverts_its_delta_and_mu_inverts_epsilon():
    for mu in (0.3, 1.0, 2.5):
        eps = gaussian_epsilon(mu, 1e-5)
        assert gaussian_delta(mu, eps) == pytest.approx(1e-5, rel=1e-6)
        assert gaussian_mu(eps, 1e-5) == pytest.approx(mu, rel=1e-6)
    assert gaussian_epsilon(0.0, 1e-5) == 0.0


def test_p_value_grows_with_epsilon_and_the_bound_sits_where_it_crosses_beta():
    m, r, v = 1000, 200, 150
    ps = [p_value(m, r, v, e, 1e-5) for e in np.linspace(0, 3, 31)]
    assert all(b >= a - 1e-15 for a, b in zip(ps, ps[1:]))
    eps = epsilon_from_count(m, r, v, delta=1e-5, beta=BETA)
    assert 0 < eps < 3
    assert p_value(m, r, v, eps, 1e-5) == pytest.approx(BETA, rel=1e-3)
    assert p_value(m, r, v, eps * 0.99, 1e-5) < BETA  # every smaller ε is rejected
    assert epsilon_from_count(m, r, r // 2, delta=1e-5, beta=BETA) == 0.0  # chance level: nothing rejected


def test_the_delta_term_only_lowers_the_bound():
    m, r, v = 1000, 100, 90
    assert epsilon_from_count(m, r, v, delta=1e-3, beta=BETA) < epsilon_from_count(m, r, v, delta=0.0, beta=BETA)


def test_guesses_are_fixed_before_the_answers():
    rng = np.random.default_rng(3)
    scores = rng.standard_normal(400)
    a, b = rng.random(400) < 0.5, rng.random(400) < 0.5
    assert guess_grid(400) == guess_grid(400)
    for kp, km in guess_grid(400):
        order = np.argsort(-scores, kind="stable")
        chosen = set(order[:kp]) | (set(order[400 - km:]) if km else set())
        # the counted canaries are the same whoever is in; only the count changes
        assert count_correct(scores, a, kp, km) + count_correct(scores, ~a, kp, km) == len(chosen)
    assert count_correct(scores, b, 10, 10) <= 20


def test_the_binomial_kernels_are_scipys_and_the_grids_skip_changes_no_bound():
    """p_value calls scipy.stats.binom's own kernels: the same numbers as binom.sf and binom.pmf. A guess pair not
    rejected at the best ε̂ so far is not searched: the bound is still the largest of every pair's own ε̂, from the
    first pair that reaches it."""
    from scipy import stats

    from engine.audit.one_run.bound import _boost

    for r, p in ((1, 0.5), (37, 0.2), (1000, 0.5), (1000, 0.9), (5000, 1 - 1e-9)):
        ks = np.arange(0, r + 1)
        assert np.array_equal(_boost._binom_pmf(ks.astype(np.float64), r, p), stats.binom.pmf(ks, r, p))
        assert np.array_equal(_boost._binom_sf(ks[:-1], r, p), stats.binom.sf(ks[:-1], r, p))  # v - 1 of 1 <= v <= r
    rng = np.random.default_rng(3)
    for mu, delta in ((0.5, 1e-5), (2.0, 1e-5), (2.0, 0.0), (4.0, 1e-5)):
        scores, included = gaussian_scores(mu, 1000, rng)
        got = epsilon_lower_bound(scores, included, delta=delta, beta=BETA)
        pairs = guess_grid(1000)
        each = [epsilon_from_count(1000, kp + km, count_correct(scores, included, kp, km), delta=delta,
                                   beta=BETA / len(pairs)) for kp, km in pairs]
        assert got.epsilon_hat == max(each) > 0
        assert (got.k_plus, got.k_minus) == pairs[each.index(max(each))]


def _violations(truth: float, draw, trials: int, delta: float) -> float:
    rng = np.random.default_rng(11)
    bad = 0
    for _ in range(trials):
        scores, included = draw(rng)
        bad += epsilon_lower_bound(scores, included, delta=delta, beta=BETA).epsilon_hat > truth
    return bad / trials


def test_randomized_response_truth_the_bound_holds_and_is_sharp():
    """ε-DP randomized response (δ = 0): each canary's score is its membership, flipped with prob 1/(1 + e^ε). The
    bound is exact for it: ε̂ exceeds ε in at most a β fraction of seeds and comes within 25 % of ε at m = 5000."""
    eps = 2.0
    flip = 1 / (1 + math.exp(eps))

    def draw(rng, m=1000):
        included = rng.random(m) < 0.5
        shown = included ^ (rng.random(m) < flip)
        return shown + 1e-3 * rng.random(m), included  # tiny jitter: a fixed tie order that ignores membership
    assert _violations(eps, draw, 200, 0.0) <= BETA + 0.03
    got = epsilon_lower_bound(*draw(np.random.default_rng(5), 5000), delta=0.0, beta=BETA).epsilon_hat
    assert 0.75 * eps < got < 1.1 * eps  # sharp; soundness is the violation rate above


# μ = 1.5 in the fast subset; the other two regimes in the full suite
@pytest.mark.parametrize("mu", [pytest.param(0.5, marks=pytest.mark.slow), 1.5, pytest.param(3.0, marks=pytest.mark.slow)])
def test_gaussian_truth_the_bound_never_exceeds_the_true_epsilon(mu):
    """The Gaussian mechanism (scores N(μ·1[in], 1)) is exactly (ε(δ), δ)-DP for every δ: over 150 seeds the bound
    exceeds the true ε at δ in at most a β fraction (it is in fact far below: the bound is conservative)."""
    delta = 1e-5
    truth = gaussian_epsilon(mu, delta)
    assert _violations(truth, lambda rng: gaussian_scores(mu, 1000, rng), 150, delta) <= BETA


def test_gaussian_truth_the_bound_approaches_the_truth_as_m_grows():
    mu, delta = 2.0, 1e-5
    truth = gaussian_epsilon(mu, delta)
    rng = np.random.default_rng(2)
    means = [np.mean([epsilon_lower_bound(*gaussian_scores(mu, m, rng), delta=delta, beta=BETA).epsilon_hat
                      for _ in range(8)]) for m in (100, 1000, 10000)]
    assert means[0] < means[1] < means[2] < truth
    assert means[2] > 0.3 * truth  # 3.6 of 10.0: the δ term and m bound how close one run can come


def test_bad_scores_are_refused():
    with pytest.raises(ValueError):
        epsilon_lower_bound([0.0, np.nan], [True, False], delta=1e-5)
    with pytest.raises(ValueError):
        epsilon_lower_bound([0.0, 1.0], [True], delta=1e-5)


def test_subsampled_gaussian_truth_the_bound_stays_below_the_accountants_epsilon():
    """The mechanism DP-SGD composes (rate q, σ, T steps), with the most powerful per-step score: over many seeds
    ε̂ exceeds the accountant's ε no more often than β, and it rises with the mechanism's leakage (σ smaller)."""
    q, steps, m = 0.05, 40, 800
    for sigma in (0.6, 1.0):
        truth = epsilon(sample_rate=q, noise_multiplier=sigma, steps=steps, delta=1e-5)
        rate = _violations(truth, lambda rng: subsampled_scores(q, sigma, steps, m, rng), trials=40, delta=1e-5)
        assert rate <= BETA
    strong = expected_subsampled_bound(q, 0.6, steps, m, delta=1e-5, trials=4)
    weak = expected_subsampled_bound(q, 2.0, steps, m, delta=1e-5, trials=4)
    assert strong > weak >= 0.0 and strong > 0.2
