"""INO-SGD weights: the check vectors, closed forms, and the privacy invariant as a property."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import integrate

from engine.importance import (BetaTIF, PiecewiseLinearTIF, bif_antiderivative, expected_dropped_mass,
                               importance_weights, make_tif, weights_from_order)
from engine.mechanisms import Clipped, GroupAdaptive, Importance


def test_check_vectors():
    np.testing.assert_allclose(
        importance_weights([0.3, 2.0, 0.1, 1.5, 0.7], [1] * 5, tail_length=2, alpha=1, beta=1),
        [0.75, 1, 0.25, 1, 1], atol=1e-12)
    np.testing.assert_allclose(
        importance_weights([0.9, 0.2, 0.5, 1.1], [0.5, 1.5, 1.0, 2.0], tail_length=3, alpha=2, beta=2),
        [0.97453704, 0.1875, 0.73148148, 1], atol=1e-8)
    np.testing.assert_allclose(
        importance_weights([0.4, 0.1, 0.9], [1] * 3, tail_length=10, alpha=1, beta=1), [0.15, 0.05, 0.25], atol=1e-12)


def test_ties_broken_by_position():
    rho = importance_weights([1.0, 1.0, 1.0], [1, 1, 1], tail_length=3, shape="linear")
    assert rho[0] < rho[1] < rho[2]


@pytest.mark.parametrize("shape,kw", [("beta", dict(alpha=2.5, beta=0.7)), ("beta", dict(alpha=0.5, beta=3)),
                                      ("linear", {}), ("power", dict(power=3.0)), ("step", dict(cut=0.3)),
                                      ("piecewise", dict(knots=((0, 0), (0.2, 0.1), (0.7, 0.1), (1, 0.9))))])
def test_closed_form_matches_quadrature(shape, kw):
    tif = make_tif(shape, **kw)
    gamma = 2.7
    for x in (0.0, 0.3, 1.9, 2.7, 4.0):
        numeric, _ = integrate.quad(lambda u: tif(min(u / gamma, 1.0)) if u < gamma else 1.0, 0, x,
                                    points=[gamma * 0.2, gamma * 0.3, gamma * 0.7], limit=200)
        assert bif_antiderivative(np.array([x]), tif, gamma)[0] == pytest.approx(numeric, abs=1e-7)


def test_dropped_mass_beta():
    assert expected_dropped_mass(BetaTIF(2.0, 3.0), 5.0) == pytest.approx(5.0 * 2 / 5)


def test_tail_to_zero_gives_ones():
    rho = importance_weights(np.random.default_rng(0).random(50), np.full(50, 1.3), tail_length=1e-12)
    np.testing.assert_allclose(rho, 1.0, atol=1e-11)


@pytest.mark.parametrize("knots", [((0, 0.5), (1, 0.2)), ((0, 0), (1, 1.2)), ((0, -0.1), (1, 1)), ((0.1, 0), (1, 1))])
def test_invalid_custom_tif_rejected(knots):
    with pytest.raises(ValueError):
        PiecewiseLinearTIF(knots)


# --- the privacy invariant --------------------------------------------------------------------

def weighted_sum(grads, losses, clips, weight_fn):
    rho = weight_fn(losses, clips)
    norms = np.linalg.norm(grads, axis=1)
    scale = np.minimum(1.0, clips / np.maximum(norms, 1e-12))
    return (rho * scale) @ grads


def sensitivity_excess(weight_fn, draw_batch):
    """max over insert positions of ‖S(D ∪ {z}) − S(D)‖ − C_z (≤ 0 when the invariant holds)."""
    grads, losses, clips, z_grad, z_loss, z_clip, pos = draw_batch
    base = weighted_sum(grads, losses, clips, weight_fn)
    g2 = np.insert(grads, pos, z_grad, axis=0)
    l2 = np.insert(losses, pos, z_loss)
    c2 = np.insert(clips, pos, z_clip)
    return np.linalg.norm(weighted_sum(g2, l2, c2, weight_fn) - base) - z_clip


@st.composite
def batches(draw):
    n = draw(st.integers(0, 12))
    d = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    clip_levels = rng.uniform(0.2, 3.0, size=3)
    clips = clip_levels[rng.integers(0, 3, n)]
    losses = rng.choice(rng.uniform(0, 2, size=max(1, n // 2 + 1)), size=n)  # repeated values: ties
    grads = rng.normal(size=(n, d))
    grads = grads / np.linalg.norm(grads, axis=1, keepdims=True) * clips[:, None]  # unit direction × C_i
    z = rng.normal(size=d)
    z_clip = float(clip_levels[rng.integers(0, 3)])
    z_grad = z / np.linalg.norm(z) * z_clip * draw(st.sampled_from([1.0, 5.0]))  # also unclipped (norm > C)
    z_loss = float(losses[rng.integers(0, n)]) if n and draw(st.booleans()) else float(rng.uniform(0, 2))
    pos = draw(st.integers(0, n))
    return grads, losses, clips, z_grad, z_loss, z_clip, pos


ALPHA_BETA = st.floats(0.1, 10.0)


@settings(max_examples=300, deadline=None)
@given(batches(), st.sampled_from(["beta", "linear", "power", "step", "piecewise"]), ALPHA_BETA, ALPHA_BETA,
       st.floats(0.01, 20.0))
def test_ino_sensitivity_at_most_cz(batch, shape, a, b, gamma):
    tif = make_tif(shape, alpha=a, beta=b, power=a, cut=min(b / 10, 1.0),
                   knots=((0, 0), (0.5, min(a, b) / 10), (1, 1)))
    mech = Importance(sample_clip_norms=np.ones(1), noise_std=1.0, tail_length=gamma, tif=tif)
    assert sensitivity_excess(mech.weights, batch) <= 1e-9


@settings(max_examples=150, deadline=None)
@given(batches())
def test_dpsgd_and_group_adaptive_sensitivity(batch):
    # DP-SGD / IDP-SGD / DP-SGD-S all use ρ = 1 with the sample's own C_i.
    assert sensitivity_excess(Clipped(sample_clip_norms=np.ones(1), noise_std=1).weights, batch) <= 1e-9
    ga = GroupAdaptive(groups=np.zeros(1, int), n_groups=1, noise_multiplier=1, expected_group_batch=[1],
                       initial=1, tau=1, quantile=0.5, ema=0.9, min_clip=0.01, private=True, quantile_lr=0.2,
                       count_noise_std=1)
    assert sensitivity_excess(ga.weights, batch) <= 1e-9


def test_non_increasing_tif_breaks_the_invariant():
    """The property test can fail: a decreasing importance function (favouring low-loss items,
    bypassing validation) exceeds C_z for some batch."""

    class Decreasing:
        def integral(self, v):
            v = np.clip(v, 0, 1)
            return v - 0.5 * v * v  # TIF(u) = 1 − u

    def weights(losses, clips):
        return weights_from_order(np.argsort(losses, kind="stable"), clips, Decreasing(), 10.0)

    # z (lowest loss, opposite direction) pushes the others to lower weights: ‖Δ‖ = 0.95 + 0.4 > C_z = 1.
    grads = np.tile([1.0, 0.0], (4, 1))
    batch = (grads, np.array([1.0, 2.0, 3.0, 4.0]), np.ones(4), np.array([-1.0, 0.0]), 0.0, 1.0, 0)
    assert sensitivity_excess(weights, batch) == pytest.approx(0.35)
