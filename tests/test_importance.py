"""INO-SGD weights: the check vectors, closed forms, and the privacy invariant as a property."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate

from engine.dp.importance import (BetaTIF, PiecewiseLinearTIF, bif, bif_antiderivative, expected_dropped_mass,
                                  importance_weights, ino_weights, make_tif, weights_from_order)
from engine.dp.mechanisms import Clipped, GroupAdaptive, Importance


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


def test_bif_is_the_derivative_of_its_antiderivative():
    tif = make_tif("beta", alpha=2.0, beta=0.5)
    x = np.linspace(0.01, 5.0, 200)
    h = 1e-6
    numeric = (bif_antiderivative(x + h, tif, 2.5) - bif_antiderivative(x - h, tif, 2.5)) / (2 * h)
    np.testing.assert_allclose(bif(x, tif, 2.5), numeric, atol=1e-5)
    assert np.all(bif(x[x >= 2.5], tif, 2.5) == 1.0) and np.all(bif(x, tif, 0.0) == 1.0)


def test_rows_with_padding_equal_one_batch_at_a_time():
    # the check vectors, as rows of one padded batch
    losses = np.array([[0.3, 2.0, 0.1, 1.5, 0.7], [0.9, 0.2, 0.5, 1.1, 0.0], [0.4, 0.1, 0.9, 0.0, 0.0]])
    clips = np.array([[1, 1, 1, 1, 1], [0.5, 1.5, 1.0, 2.0, 1.0], [1, 1, 1, 1, 1]], dtype=float)
    valid = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], dtype=bool)
    for m, (gamma, (a, b)) in enumerate(zip([2.0, 3.0, 10.0], [(1, 1), (2, 2), (1, 1)])):
        rho = ino_weights(losses[m:m + 1], clips[m:m + 1], valid[m:m + 1], make_tif("beta", alpha=a, beta=b), gamma)[0]
        expect = [[0.75, 1, 0.25, 1, 1], [0.97453704, 0.1875, 0.73148148, 1, 0], [0.15, 0.05, 0.25, 0, 0]][m]
        np.testing.assert_allclose(rho, expect, atol=1e-8)
    # random batches with ties, padding anywhere in a row, every TIF shape, one γ per row
    rng = np.random.default_rng(0)
    for shape, kw in [("beta", dict(alpha=2.0, beta=0.5)), ("linear", {}), ("power", dict(power=3.0)),
                      ("step", dict(cut=0.3))]:
        tif = make_tif(shape, **kw)
        losses = rng.integers(0, 6, size=(7, 30)).astype(float) / 3  # many ties
        clips = rng.uniform(0.1, 2.0, size=(7, 30))
        valid = rng.random((7, 30)) < rng.uniform(0, 1, size=(7, 1))
        gammas = rng.uniform(0.0, 25.0, size=7)
        rho = ino_weights(losses, clips, valid, tif, gammas)
        for m in range(7):
            v = valid[m]
            ref = importance_weights(losses[m][v], clips[m][v], tail_length=gammas[m], shape=shape, **kw)
            assert np.array_equal(rho[m][v], ref), (shape, m)
            assert np.all(rho[m][~v] == 0)


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

def rows_weights(mech):
    """A (losses, clips) → ρ function of one batch, through the mechanism's batched (M = 1) hook."""
    def fn(losses, clips):
        n = len(losses)
        rho = mech.weights(torch.as_tensor(np.asarray(losses, dtype=float))[None],
                           torch.as_tensor(np.asarray(clips, dtype=float))[None], torch.ones(1, n, dtype=torch.bool))
        return np.ones(n) if rho is None else rho[0].numpy()
    return fn


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
    assert sensitivity_excess(rows_weights(mech), batch) <= 1e-9


@settings(max_examples=150, deadline=None)
@given(batches())
def test_dpsgd_and_group_adaptive_sensitivity(batch):
    # DP-SGD / IDP-SGD / DP-SGD-S all use ρ = 1 with the sample's own C_i.
    assert sensitivity_excess(rows_weights(Clipped(sample_clip_norms=np.ones(1), noise_std=1)), batch) <= 1e-9
    ga = GroupAdaptive(groups=np.zeros(1, int), n_groups=1, noise_multiplier=1, expected_group_batch=[1],
                       initial=1, tau=1, quantile=0.5, ema=0.9, c_min=0.5, c_max=4, base_clip=1, private=True,
                       quantile_lr=0.2, count_noise_std=1)
    assert sensitivity_excess(rows_weights(ga), batch) <= 1e-9


def _padded(rows, width, rng):
    """Rows of (grads, losses, clips) laid into (M, width) arrays at random positions, with a mask."""
    m, d = len(rows), rows[0][0].shape[1]
    g, lo, c = np.zeros((m, width, d)), np.zeros((m, width)), np.ones((m, width))
    mask = np.zeros((m, width), bool)
    for r, (gr, lr, cr) in enumerate(rows):
        at = np.sort(rng.choice(width, size=len(lr), replace=False))
        g[r, at], lo[r, at], c[r, at], mask[r, at] = gr, lr, cr, True
        lo[r, ~mask[r]] = rng.uniform(-5, 5, size=(~mask[r]).sum())  # padding carries junk losses
    return g, lo, c, mask


@settings(max_examples=150, deadline=None)
@given(st.lists(batches(), min_size=2, max_size=4), st.sampled_from(["beta", "linear", "power", "step", "piecewise"]),
       ALPHA_BETA, ALPHA_BETA, st.integers(0, 2**31))
def test_ino_sensitivity_batched_over_models_with_mixed_masks(draws, shape, a, b, seed):
    """The same invariant through the batched hook: M > 1 models, each its own batch, γ and padding."""
    tif = make_tif(shape, alpha=a, beta=b, power=a, cut=min(b / 10, 1.0), knots=((0, 0), (0.5, min(a, b) / 10), (1, 1)))
    rng = np.random.default_rng(seed)
    m = len(draws)
    d = max(bt[0].shape[1] for bt in draws)
    pad = lambda v: np.pad(v, ((0, 0), (0, d - v.shape[1])))  # noqa: E731 - one gradient dimension for all rows
    gammas = rng.uniform(0.01, 20.0, size=m)
    mech = Importance(sample_clip_norms=np.ones(1), noise_std=1.0, tail_length=gammas, tif=tif, n_models=m)
    base_rows, with_rows, cz = [], [], []
    for grads, losses, clips, z_grad, z_loss, z_clip, pos in draws:
        grads, z_grad = pad(grads), np.pad(z_grad, (0, d - len(z_grad)))
        base_rows.append((grads, losses, clips))
        with_rows.append((np.insert(grads, pos, z_grad, axis=0), np.insert(losses, pos, z_loss),
                          np.insert(clips, pos, z_clip)))
        cz.append(z_clip)
    width = max(len(r[1]) for r in with_rows) + int(rng.integers(0, 3))

    def sums(rows):
        g, lo, c, mask = _padded(rows, width, rng)
        rho = mech.weights(torch.as_tensor(lo), torch.as_tensor(c), torch.as_tensor(mask)).numpy()
        assert np.all(rho[~mask] == 0)
        norms = np.linalg.norm(g, axis=2)
        coef = rho * np.minimum(1.0, c / np.maximum(norms, 1e-12)) * mask
        return np.einsum("ml,mld->md", coef, g)

    excess = np.linalg.norm(sums(with_rows) - sums(base_rows), axis=1) - np.asarray(cz)
    assert np.all(excess <= 1e-9)


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
    # ... and so can the batched hook: the same batch as one row of two, with γ = 10 for both models
    mech = Importance(sample_clip_norms=np.ones(1), noise_std=1.0, tail_length=10.0, tif=Decreasing(), n_models=2)

    def row0(losses, clips):
        lo = torch.as_tensor(np.stack([losses, np.zeros(len(losses))]))
        c = torch.as_tensor(np.stack([clips, np.ones(len(clips))]))
        mask = torch.as_tensor(np.stack([np.ones(len(losses), bool), np.arange(len(losses)) < 2]))
        return mech.weights(lo, c, mask)[0].numpy()

    assert sensitivity_excess(row0, batch) == pytest.approx(0.35)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 3))
def test_ino_diagnostics_are_the_windows_mean_rho_per_tier_and_down_weighted_mass(seed, m):
    """Importance records, per model and since its previous evaluation, the mean ρ of each tier's batch items
    and Σ(1 − ρ_i)C_i / ΣC_i — recomputed here from the weights it returned; a read starts a new window."""
    rng = np.random.default_rng(seed)
    n, k = 40, 3
    tiers = rng.integers(0, k, n)
    clips = rng.choice([0.5, 1.0, 2.0], n)
    mech = Importance(sample_clip_norms=clips, noise_std=1.0, tail_length=3.0, tif=make_tif("beta", alpha=1, beta=3),
                      n_models=m, sample_tiers=tiers, n_tiers=k)
    sums, counts, mass = np.zeros((m, k)), np.zeros((m, k)), np.zeros((m, 2))
    for _ in range(3):  # three steps in one window
        idx = torch.as_tensor(rng.integers(0, n, (m, 12)))
        mask = torch.as_tensor(rng.random((m, 12)) < 0.8)
        losses = torch.as_tensor(rng.random((m, 12)), dtype=torch.float64)
        mech.see_batch(idx, None, mask, torch.Generator())
        clip = mech.clip_norms(idx)
        rho = mech.weights(losses, clip, mask).numpy()
        for r in range(m):
            for i in np.flatnonzero(mask[r].numpy()):
                t = tiers[int(idx[r, i])]
                sums[r, t] += rho[r, i]
                counts[r, t] += 1
                mass[r] += [(1 - rho[r, i]) * clips[int(idx[r, i])], clips[int(idx[r, i])]]
    for r in range(m):
        got = mech.model_state(r)
        want = [sums[r, t] / counts[r, t] if counts[r, t] else None for t in range(k)]
        for g, w in zip(got["ino_rho_by_tier"], want):
            assert (g is None and w is None) or g == pytest.approx(w, rel=1e-9)
        assert got["ino_downweighted_fraction"] == pytest.approx(mass[r, 0] / mass[r, 1], rel=1e-9)
        assert 0.0 <= got["ino_downweighted_fraction"] <= 1.0
        again = mech.model_state(r)  # a new window: nothing seen since
        assert again["ino_rho_by_tier"] == [None] * k and again["ino_downweighted_fraction"] is None
