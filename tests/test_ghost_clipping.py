"""Ghost clipping / book-keeping (engine.dp.ghost) against the exact per-sample path, through the step.

Both strategies of ``ModuleGrads`` give the same per-sample norms and the same clipped, weighted sum
Σ_i ρ_i min(1, C_i/‖g_i‖) g_i, to 1e-10 relative in float64, whatever the batch: padded entries, mixed
per-sample clips (clipped and unclipped items), INO weights; and the privacy invariant (adding one
sample moves the sum by at most its C_z) holds on both.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from engine.config.run import ModelConfig
from engine.dp.ghost import ghost_rule, use_ghost
from engine.dp.grad_sample import STRATEGIES, LayerwisePerSampleGrads, ModuleGrads
from engine.dp.importance import ino_weights, make_tif
from engine.dp.mechanisms import Clipped, Importance
from engine.dp.step import dp_step
from engine.models.nets import build_model

pytestmark = pytest.mark.usefixtures("one_thread")
POOL = 16  # samples each model's batches are drawn from


class _SeqNet(nn.Module):
    """Linear layers on (n, T, d) inputs (T = 8 positions): one materialises g_i, one takes the ghost norm."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.out = nn.Linear(8, 16), nn.Linear(16, 64), nn.Linear(64, 10)

    def forward(self, x):
        h = torch.tanh(self.b(torch.tanh(self.a(x.reshape(len(x), 8, 8)))))
        return self.out(h.mean(1))


class _Fallbacks(nn.Module):
    """Layers the trick does not cover next to ones it does: a grouped and a 'same'-padded conv and a
    GroupNorm keep the exact path, the plain conv and Linear layers go ghost."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3, padding="same")
        self.c2 = nn.Conv2d(4, 4, 3, groups=2)
        self.gn = nn.GroupNorm(2, 4)
        self.c3 = nn.Conv2d(4, 6, 3, stride=2, dilation=(1, 2), padding=(1, 2))
        self.fc = nn.Linear(6 * 3 * 3, 10)

    def forward(self, x):
        h = torch.tanh(self.gn(self.c2(torch.tanh(self.c1(x)))))
        return self.fc(torch.tanh(self.c3(h)).flatten(1))


SHAPES = {"lr": (1, 8, 8), "mlp": (1, 8, 8), "cnn": (1, 28, 28), "cifar_cnn": (3, 8, 8), "resnet18": (3, 8, 8),
          "seq_linear": (1, 8, 8), "fallbacks": (1, 8, 8)}


def _model(name: str) -> nn.Module:
    torch.manual_seed(7)
    if name == "seq_linear":
        return _SeqNet().double()
    if name == "fallbacks":
        return _Fallbacks().double()
    cfg = {"lr": ModelConfig(name="lr"), "mlp": ModelConfig(name="mlp", hidden=(24, 12)),
           "cnn": ModelConfig(name="cnn"), "cifar_cnn": ModelConfig(name="cnn"),
           "resnet18": ModelConfig(name="resnet18")}[name]
    return build_model(cfg, SHAPES[name], 10).double()


_CACHE: dict = {}


def _setup(name: str):
    """(ModuleGrads per strategy on one float64 model, x, y) — built once per model."""
    if name not in _CACHE:
        model = _model(name)
        g = torch.Generator().manual_seed(3)
        x = torch.randn(POOL, *SHAPES[name], generator=g, dtype=torch.float64)
        y = torch.randint(0, 10, (POOL,), generator=g)
        _CACHE[name] = ({s: ModuleGrads(model, strategy=s) for s in STRATEGIES}, x, y)
    return _CACHE[name]


class _Fixed:
    """A sampler that always returns the same (1, L) batch and mask; expected batch 1 (the raw sum)."""

    def __init__(self, idx, mask):
        self.idx, self.mask = torch.as_tensor([idx], dtype=torch.long), torch.as_tensor([mask], dtype=torch.bool)
        self.expected_batch_tensor = torch.ones(1, dtype=torch.float64)

    def sample(self, gen):
        return self.idx, self.mask


def _mechanism(kind, clips, tif_shape, gamma):
    if kind == "dpsgd":
        return Clipped(sample_clip_norms=clips, noise_std=0.0)
    return Importance(sample_clip_norms=clips, noise_std=0.0, tail_length=gamma, tif=make_tif(tif_shape, alpha=2.0,
                                                                                              beta=1.0, power=2.0))


def _summed(models, x, y, idx, mask, mech):
    """The step's clipped, weighted sum (noise 0, expected batch 1) as one flat float64 vector."""
    out = dp_step(models, x, y, _Fixed(idx, mask), mech, torch.Generator().manual_seed(0))
    return torch.cat([g[0].reshape(-1) for g in out.grads.values()]), out


@st.composite
def steps(draw, max_len=10):
    """A padded batch of the pool (repeats allowed, padding anywhere), per-sample clips at three levels
    spread around the norms (so some items are clipped and some not), and a mechanism."""
    length = draw(st.integers(1, max_len))
    idx = draw(st.lists(st.integers(0, POOL - 1), min_size=length, max_size=length))
    mask = draw(st.lists(st.booleans(), min_size=length, max_size=length))
    levels = draw(st.lists(st.floats(0.01, 20.0), min_size=3, max_size=3))
    clips = np.asarray(levels)[np.random.default_rng(draw(st.integers(0, 2**31))).integers(0, 3, POOL)]
    kind = draw(st.sampled_from(["dpsgd", "ino"]))
    return idx, mask, clips, kind, draw(st.sampled_from(["beta", "linear", "power"])), draw(st.floats(0.01, 20.0))


def _check_equal(name, step):
    idx, mask, clips, kind, tif_shape, gamma = step
    models, x, y = _setup(name)
    sums, outs = {}, {}
    for s in STRATEGIES:
        sums[s], outs[s] = _summed(models[s], x, y, idx, mask, _mechanism(kind, clips, tif_shape, gamma))
    exact, ghost = sums["exact"], sums["ghost"]
    assert torch.equal(outs["exact"].losses[outs["exact"].mask], outs["ghost"].losses[outs["ghost"].mask])
    scale = float(exact.norm())
    assert float((ghost - exact).norm()) <= 1e-10 * scale, (name, float((ghost - exact).norm()), scale)
    if not any(mask):
        assert scale == 0.0 and float(ghost.abs().max()) == 0.0
    # the norms and the coefficients dp_step built from them agree too
    valid = torch.as_tensor([mask])
    if valid.any():
        work = {s: models[s].per_sample(x, y, torch.as_tensor([idx]), valid) for s in STRATEGIES}
        torch.testing.assert_close(work["ghost"].norms[valid], work["exact"].norms[valid], rtol=1e-12, atol=0)
    return exact


@settings(max_examples=25, deadline=None)
@given(step=steps())
@pytest.mark.parametrize("name", ["lr", "mlp", "cnn", "cifar_cnn", "seq_linear", "fallbacks"])
def test_ghost_sum_equals_the_per_sample_path(name, step):
    _check_equal(name, step)


@pytest.mark.slow
@settings(max_examples=4, deadline=None)
@given(step=steps(max_len=4))
def test_ghost_sum_equals_the_per_sample_path_resnet18_groupnorm(step):
    _check_equal("resnet18", step)


def test_ino_weights_and_clipping_really_vary_in_the_check():
    """The coefficients of the equality check are not trivial: INO drops mass, some items clip, some do not."""
    models, x, y = _setup("cnn")
    idx, mask = list(range(10)), [True] * 8 + [False] * 2
    work = models["ghost"].per_sample(x, y, torch.as_tensor([idx]), torch.as_tensor([mask]))
    norms = work.norms[0, :8].numpy()
    clips = np.full(POOL, float(np.median(norms)))
    rho = ino_weights(work.losses.numpy(), clips[idx][None], np.array([mask]), make_tif("beta", alpha=2.0, beta=1.0),
                      5.0 * clips[0])
    assert rho[0, :8].min() < 1 and np.all(rho[0, 8:] == 0)
    assert (norms > clips[0]).any() and (norms < clips[0]).any()
    _check_equal("cnn", (idx, mask, clips, "ino", "beta", 5.0 * clips[0]))


def test_each_layer_takes_the_cheaper_form_and_the_rest_falls_back():
    """Bu et al.'s rule on the MNIST CNN: conv1 (T = 196, p·d = 16·64) materialises g_i, conv2 (T = 25,
    p·d = 32·256) takes the ghost norm; layers without a rule keep the exact path."""
    cnn = _model("cnn")
    c1, c2 = cnn.features[0], cnn.features[3]
    assert not use_ghost(14 * 14, 16, 1 * 8 * 8) and use_ghost(5 * 5, 32, 16 * 4 * 4)
    assert ghost_rule(c1) is not None and ghost_rule(cnn.classifier[1]) is not None
    fb = _Fallbacks()
    assert ghost_rule(fb.c1) is None and ghost_rule(fb.c2) is None and ghost_rule(fb.gn) is None
    assert ghost_rule(fb.c3) is not None
    with pytest.raises(ValueError):
        LayerwisePerSampleGrads(fb, "fast")


# --------------------------------------------------------------------------------------------
# the privacy invariant on both strategies: one more sample moves the sum by at most its C_z
# --------------------------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(step=steps(max_len=8), z=st.integers(0, POOL - 1), pos=st.integers(0, 8))
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_step_sensitivity_at_most_cz(name, strategy, step, z, pos):
    idx, mask, clips, kind, tif_shape, gamma = step
    valid = [i for i, v in zip(idx, mask) if v]
    pos = min(pos, len(valid))
    models, x, y = _setup(name)
    with_z = valid[:pos] + [z] + valid[pos:]
    a, _ = _summed(models[strategy], x, y, with_z, [True] * len(with_z), _mechanism(kind, clips, tif_shape, gamma))
    b, _ = _summed(models[strategy], x, y, valid or [0], [True] * len(valid) or [False],
                   _mechanism(kind, clips, tif_shape, gamma))
    assert float((a - b).norm()) <= clips[z] * (1 + 1e-9) + 1e-12
