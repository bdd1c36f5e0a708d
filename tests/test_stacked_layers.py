"""The stacked layerwise path (engine.dp.layerwise.StackedLayers, what StackedModels uses for the CNNs and
ResNet-18 GN) against the M models run one by one through the single-model path, in float64.

Per-sample losses and norms, the clipped weighted sums and ``dp_step``'s output of a stack equal those of
each model alone (``ModuleGrads``, its own batch row) to 1e-10 relative, for LR, MLP, the CNN with both
first-layer paddings, the CIFAR CNN and ResNet-18 GN, with mixed clips, padding anywhere in a row, empty
rows, INO weights and both per-sample strategies; the privacy invariant (one more sample in one model's
batch moves that model's sum by at most its C_z, and no other model's) holds on the stack; a model the
path cannot run as a stack falls back to vmap.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import stack_module_state

from engine.config.run import ModelConfig
from engine.dp import layerwise
from engine.dp.grad_sample import STRATEGIES, ModuleGrads
from engine.dp.importance import make_tif
from engine.dp.layerwise import StackedLayers
from engine.dp.mechanisms import Clipped, Importance
from engine.dp.stacked import StackedModels
from engine.dp.step import dp_step

pytestmark = pytest.mark.usefixtures("one_thread")
POOL = 12  # samples the batches are drawn from
M = 3  # models in the stack
CONFIGS = {"lr": (ModelConfig(name="lr"), (1, 8, 8)),
           "mlp": (ModelConfig(name="mlp", hidden=(12, 6)), (1, 8, 8)),
           "cnn": (ModelConfig(name="cnn"), (1, 28, 28)),
           "cnn_padding2": (ModelConfig(name="cnn", cnn_padding=2), (1, 28, 28)),
           "cifar_cnn": (ModelConfig(name="cnn"), (3, 8, 8)),
           "resnet18": (ModelConfig(name="resnet18"), (3, 8, 8))}
_CACHE: dict = {}


def _setup(name: str):
    """({strategy: (the float64 stack, [each model alone])}, x, y) — built once per model."""
    if name not in _CACHE:
        cfg, shape = CONFIGS[name]
        out = {}
        for s in STRATEGIES:
            stack = StackedModels(cfg, shape, 10, [5, 6, 7], "cpu", method="layerwise", strategy=s)
            assert stack.method == "layerwise"
            alone = [ModuleGrads(stack.module(j).double(), strategy=s) for j in range(M)]
            stack.params = {k: v.double() for k, v in stack.params.items()}
            out[s] = (stack, alone)
        g = torch.Generator().manual_seed(3)
        x = torch.randn(POOL, *shape, generator=g, dtype=torch.float64)
        _CACHE[name] = (out, x, torch.randint(0, 10, (POOL,), generator=g))
    return _CACHE[name]


class _Fixed:
    """A sampler that always returns the same (rows, L) batch; expected batch 1 (the step returns the raw sum)."""

    def __init__(self, idx, mask):
        self.idx, self.mask = torch.as_tensor(idx, dtype=torch.long), torch.as_tensor(mask, dtype=torch.bool)
        self.expected_batch_tensor = torch.ones(len(idx), dtype=torch.float64)

    def sample(self, gen):
        return self.idx, self.mask


def _mechanism(kind, clips, gamma, n_models):
    if kind == "dpsgd":
        return Clipped(sample_clip_norms=clips, noise_std=0.0, n_models=n_models)
    return Importance(sample_clip_norms=clips, noise_std=0.0, tail_length=gamma, n_models=n_models,
                      tif=make_tif("beta", alpha=2.0, beta=1.0))


@st.composite
def batches(draw, max_len=6):
    """M rows of one padded batch (repeats allowed, padding anywhere, a row may be empty), per-sample clips at
    three levels around the norms (some items clipped, some not), DP-SGD or INO-SGD."""
    length = draw(st.integers(1, max_len))
    idx = [draw(st.lists(st.integers(0, POOL - 1), min_size=length, max_size=length)) for _ in range(M)]
    mask = [draw(st.lists(st.booleans(), min_size=length, max_size=length)) for _ in range(M)]
    levels = draw(st.lists(st.floats(0.01, 20.0), min_size=3, max_size=3))
    clips = np.asarray(levels)[np.random.default_rng(draw(st.integers(0, 2**31))).integers(0, 3, POOL)]
    return idx, mask, clips, draw(st.sampled_from(["dpsgd", "ino"])), draw(st.floats(0.01, 20.0))


def _flat(grads, j):
    return torch.cat([g[j].reshape(-1) for g in grads.values()])


def _check_stack_equals_each_model(name, strategy, batch):
    idx, mask, clips, kind, gamma = batch
    (stack, alone), x, y = _setup(name)[0][strategy], *_setup(name)[1:]
    gen = torch.Generator().manual_seed(0)
    out = dp_step(stack, x, y, _Fixed(idx, mask), _mechanism(kind, clips, gamma, M), gen)
    work = stack.per_sample(x, y, torch.as_tensor(idx), torch.as_tensor(mask))
    for j in range(M):
        one = dp_step(alone[j], x, y, _Fixed([idx[j]], [mask[j]]), _mechanism(kind, clips, gamma, 1), gen)
        want, got = _flat(one.grads, 0), _flat(out.grads, j)
        assert float((got - want).norm()) <= 1e-10 * float(want.norm()), (name, strategy, j)
        valid = torch.as_tensor(mask[j])
        if valid.any():
            own = alone[j].per_sample(x, y, torch.as_tensor([idx[j]]), valid[None])
            torch.testing.assert_close(work.losses[j][valid], own.losses[0][valid], rtol=1e-10, atol=0)
            torch.testing.assert_close(work.norms[j][valid], own.norms[0][valid], rtol=1e-10, atol=0)
        else:
            assert float(got.abs().max()) == 0.0


@settings(max_examples=12, deadline=None)
@given(batch=batches())
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", ["lr", "mlp", "cnn", "cnn_padding2", "cifar_cnn"])
def test_the_stack_equals_each_model_alone(name, strategy, batch):
    _check_stack_equals_each_model(name, strategy, batch)


@pytest.mark.slow
@settings(max_examples=2, deadline=None)
@given(batch=batches(max_len=3))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_stack_equals_each_model_alone_resnet18_groupnorm(strategy, batch):
    _check_stack_equals_each_model("resnet18", strategy, batch)


def test_the_check_is_not_trivial():
    """The models of the stack differ, some items clip and some not, and INO drops mass: a stack that mixed up
    its models, its rows or its coefficients would fail the equality above."""
    (stack, alone), x, y = _setup("cnn")[0]["ghost"], *_setup("cnn")[1:]
    idx, mask = [list(range(6))] * M, [[True] * 5 + [False]] * M
    work = stack.per_sample(x, y, torch.as_tensor(idx), torch.as_tensor(mask))
    assert not torch.allclose(work.norms[0, :5], work.norms[1, :5])
    clips = np.full(POOL, float(work.norms[:, :5].median()))
    assert (work.norms[:, :5] > clips[0]).any() and (work.norms[:, :5] < clips[0]).any()
    _check_stack_equals_each_model("cnn", "ghost", (idx, mask, clips, "ino", 3.0 * clips[0]))
    mech = _mechanism("dpsgd", clips, 1.0, M)
    stacked = dp_step(stack, x, y, _Fixed(idx, mask), mech, torch.Generator().manual_seed(0))
    first = dp_step(alone[0], x, y, _Fixed(idx[:1], mask[:1]), _mechanism("dpsgd", clips, 1.0, 1),
                    torch.Generator().manual_seed(0))
    gap = float((_flat(stacked.grads, 1) - _flat(first.grads, 0)).norm())  # model 1 against model 0
    assert gap > 1e-3 * float(_flat(first.grads, 0).norm())


@settings(max_examples=20, deadline=None)
@given(batch=batches(max_len=5), model=st.integers(0, M - 1), z=st.integers(0, POOL - 1), pos=st.integers(0, 5))
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_one_more_sample_moves_only_its_models_sum_by_at_most_its_clip(name, strategy, batch, model, z, pos):
    idx, mask, clips, kind, gamma = batch
    (stack, _), x, y = _setup(name)[0][strategy], *_setup(name)[1:]
    rows = [[i for i, v in zip(r, k) if v] for r, k in zip(idx, mask)]
    with_z = [list(r) for r in rows]
    with_z[model].insert(min(pos, len(rows[model])), z)

    def summed(rows):
        length = max(1, max(len(r) for r in rows))
        ix = [r + [0] * (length - len(r)) for r in rows]
        ok = [[True] * len(r) + [False] * (length - len(r)) for r in rows]
        return dp_step(stack, x, y, _Fixed(ix, ok), _mechanism(kind, clips, gamma, M), torch.Generator().manual_seed(0))

    a, b = summed(with_z), summed(rows)
    for j in range(M):
        moved = float((_flat(a.grads, j) - _flat(b.grads, j)).norm())
        if j == model:
            assert moved <= clips[z] * (1 + 1e-9) + 1e-12
        else:
            assert moved <= 1e-10 * (float(_flat(b.grads, j).norm()) + 1e-300)


def test_passes_do_not_change_a_number(monkeypatch):
    """A stack split into passes of one model each gives the numbers of one pass over all models."""
    (stack, _), x, y = _setup("cifar_cnn")[0]["exact"], *_setup("cifar_cnn")[1:]
    idx, mask = torch.randint(0, POOL, (M, 5), generator=torch.Generator().manual_seed(1)), torch.ones(M, 5, dtype=torch.bool)
    coef = torch.rand(M, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    whole = stack.per_sample(x, y, idx, mask)
    monkeypatch.setattr(layerwise, "ELEMENTS_PER_PASS", 1)
    parts = stack.per_sample(x, y, idx, mask)
    assert torch.equal(whole.norms, parts.norms) and torch.equal(whole.losses, parts.losses)
    a, b = whole.weighted_sum(coef), parts.weighted_sum(coef)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=0)


class _MixesTheBatch(nn.Module):
    """Centres each feature over the batch: fine for one model, wrong for a stack (it would mix models)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        h = x.flatten(1)
        return self.fc(h - h.mean(0, keepdim=True))


class _WithBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).flatten(1))


class _ReflectPadded(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 4, 3, padding=1, padding_mode="reflect"), nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.tanh(self.conv(x)).flatten(1))


def _params(cls):
    models = []
    for s in range(M):
        torch.manual_seed(s)
        models.append(cls())
    return models[0], dict(stack_module_state(models)[0])


@pytest.mark.parametrize("cls", [_MixesTheBatch, _WithBatchNorm, _ReflectPadded])
def test_a_model_the_stack_cannot_run_falls_back(cls):
    base, params = _params(cls)
    assert StackedLayers.supports(base, {k: v.detach() for k, v in params.items()}, (1, 8, 8), M) is None


def test_the_lab_models_take_the_fastest_path_they_can():
    shape = (1, 28, 28)
    assert StackedModels(ModelConfig(name="lr"), shape, 10, [0, 1], "cpu").method == "closed_form"
    assert StackedModels(ModelConfig(name="cnn"), shape, 10, [0, 1], "cpu").method == "layerwise"
    assert StackedModels(ModelConfig(name="resnet18"), (3, 8, 8), 10, [0, 1], "cpu").method == "layerwise"
    assert StackedModels(ModelConfig(name="cnn"), shape, 10, [0, 1], "cpu", method="vmap").method == "vmap"
    with pytest.raises(ValueError):
        StackedModels(ModelConfig(name="cnn"), shape, 10, [0, 1], "cpu", method="fast")
