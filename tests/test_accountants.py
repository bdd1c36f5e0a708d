"""The accountants behind one interface (engine.dp.accountants): each reproduces its library's own number, PLD
is never looser than RDP, every accountant's searches end on the safe side and close to tight, and a name the
registry does not know is refused with the choices."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.dp import accounting
from engine.dp.accountants import ACCOUNTANTS, get_accountant

DELTA = 1e-5
# (q, σ, T) → ε under RDP and under PLD, the table (both from dp-accounting 0.6.0: its RDP orders differ
# from Opacus', so the lab's RDP, Opacus', is within 0.02 of that column)
REFERENCE = [((256 / 60000, 1.0, 234), 0.93, 0.39),    # MNIST, 1 epoch
             ((256 / 60000, 1.0, 2812), 1.44, 1.21),   # MNIST, 12 epochs
             ((256 / 30162, 1.0, 2356), 2.59, 2.34)]   # Adult, 20 epochs


@pytest.mark.parametrize("setting,rdp,pld", REFERENCE)
def test_each_accountant_reproduces_its_librarys_number(setting, rdp, pld):
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant
    from opacus.accountants import PRVAccountant

    q, sigma, steps = setting
    assert get_accountant("rdp").epsilon(q, sigma, steps, DELTA) == accounting.epsilon(
        sample_rate=q, noise_multiplier=sigma, steps=steps, delta=DELTA)
    prv = PRVAccountant()
    prv.history = [(sigma, q, steps)]
    assert get_accountant("prv").epsilon(q, sigma, steps, DELTA) == pytest.approx(prv.get_epsilon(DELTA), rel=1e-12)
    lib = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    lib.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    assert get_accountant("pld").epsilon(q, sigma, steps, DELTA) == pytest.approx(lib.get_epsilon(DELTA), rel=1e-12)
    # and the published figures, to two digits
    assert get_accountant("rdp").epsilon(q, sigma, steps, DELTA) == pytest.approx(rdp, abs=0.02)
    assert get_accountant("pld").epsilon(q, sigma, steps, DELTA) == pytest.approx(pld, abs=0.006)


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(q=st.floats(1e-3, 0.2), sigma=st.floats(0.6, 4.0), steps=st.integers(1, 1500))
def test_pld_and_prv_are_never_looser_than_rdp(q, sigma, steps):
    rdp = get_accountant("rdp").epsilon(q, sigma, steps, DELTA)
    assert get_accountant("pld").epsilon(q, sigma, steps, DELTA) <= rdp * (1 + 1e-9)
    assert get_accountant("prv").epsilon(q, sigma, steps, DELTA) <= rdp * (1 + 1e-9) + 0.02  # PRV's ε error bound


SEARCHES = [("rdp", 0.5), ("rdp", 2.0), ("rdp", 8.0),  # PLD and PRV: 20-60 ε evaluations of 0.3-2 s a search
            pytest.param("pld", 2.0, marks=pytest.mark.slow), pytest.param("prv", 2.0, marks=pytest.mark.slow)]


@pytest.mark.parametrize("name,target", SEARCHES)
def test_the_searches_end_on_the_safe_side_and_close_to_tight(name, target):
    acc = get_accountant(name)
    q, steps = 0.004, 1000
    sigma = acc.noise_multiplier(target, q, steps, DELTA)
    assert acc.epsilon(q, sigma, steps, DELTA) <= target
    assert acc.epsilon(q, sigma * (1 - 1e-3), steps, DELTA) > target  # tight: a little less noise breaks it
    rate = acc.sample_rate(target, sigma, steps, DELTA)
    assert rate == pytest.approx(q, rel=2e-3)  # the rate the σ was searched for, back again
    assert acc.epsilon(rate, sigma, steps, DELTA) <= target
    assert acc.epsilon(min(1.0, rate * (1 + 1e-3)), sigma, steps, DELTA) > target


@pytest.mark.slow
def test_a_tighter_accountant_buys_the_most_private_tier_a_higher_rate():
    """The issue's case: the MNIST paper plan's ε = 1 tier (σ 1.007, T 1406) gets q 0.0033 under RDP; the same
    promise allows more under PLD."""
    rdp, pld = get_accountant("rdp"), get_accountant("pld")
    q_rdp = rdp.sample_rate(1.0, 1.007, 1406, DELTA)
    q_pld = pld.sample_rate(1.0, 1.007, 1406, DELTA)
    assert q_rdp == pytest.approx(0.0033, rel=0.05)
    assert q_pld > 1.4 * q_rdp


def test_edges_and_refusals():
    for name in ACCOUNTANTS:
        acc = get_accountant(name)
        assert acc.epsilon(0.01, 1.0, 0, DELTA) == 0.0
        assert acc.epsilon(0.0, 1.0, 100, DELTA) == 0.0
        assert math.isinf(acc.epsilon(0.01, 0.0, 100, DELTA))
        with pytest.raises(ValueError):
            acc.epsilon(1.5, 1.0, 10, DELTA)
    with pytest.raises(ValueError, match="rdp, prv, pld"):
        get_accountant("moments")
