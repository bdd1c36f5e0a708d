"""engine.models.nets: the CNN's max-pool through PyTorch's channels-last kernels equals nn.MaxPool2d to the bit; the CNN computes
in channels-last memory with the numbers of its NCHW layers."""
import pytest
import torch
from torch import nn

from engine.models.nets import MaxPool2d, PapernotCNN


def _batch(shape, dtype, seed=0):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    x[0, 0, 1:5, 1:5] = 0.5  # ties: every window of this block holds several maxima
    x[-1, -1, :3, :3] = torch.tanh(torch.tensor(50.0, dtype=dtype))  # saturated tanh: ties at 1
    x[1 % shape[0], 0, 2, 2] = float("nan")  # a NaN wins its windows, as in nn.MaxPool2d
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kernel,stride,padding", [(2, 1, 0), (2, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_values_and_gradients_equal_nn_maxpool_to_the_bit(dtype, kernel, stride, padding):
    for shape in ((5, 3, 9, 9), (2, 16, 14, 14), (3, 1, 6, 7)):
        x = _batch(shape, dtype)
        ours, ref = MaxPool2d(kernel, stride, padding), nn.MaxPool2d(kernel, stride, padding)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        y, y_ref = ours(a), ref(b)
        assert y.is_contiguous() and torch.equal(y.nan_to_num(7.0), y_ref.nan_to_num(7.0))
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
        (ga,), (gb,) = torch.autograd.grad(y, a, g), torch.autograd.grad(y_ref, b, g)
        assert ga.is_contiguous() and torch.equal(ga.nan_to_num(7.0), gb.nan_to_num(7.0))
        with torch.no_grad():  # evaluation
            assert torch.equal(ours(x).nan_to_num(7.0), ref(x).nan_to_num(7.0))


def test_under_torch_func_it_is_nn_maxpool():
    """The vmap fallback's per-sample gradients (torch.func) see nn.MaxPool2d's own forward."""
    x = _batch((4, 2, 8, 8), torch.float64)
    w = torch.randn(2, 2, 1, 1, dtype=torch.float64)

    def loss(weight, sample, pool):
        return pool(torch.nn.functional.conv2d(sample[None], weight)).sum()

    ours = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, None))(w, x, MaxPool2d(2, 1))
    ref = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, None))(w, x, nn.MaxPool2d(2, 1))
    assert torch.equal(ours.nan_to_num(7.0), ref.nan_to_num(7.0))


def test_the_cnn_pools_with_it():
    net = PapernotCNN(1, 28, 10)
    pools = [m for m in net.modules() if isinstance(m, nn.MaxPool2d)]
    assert len(pools) == 2 and all(type(m) is MaxPool2d for m in pools)


@pytest.mark.parametrize("height,padding", [(28, None), (28, 2), (8, None)])
def test_the_cnn_runs_channels_last_with_the_values_and_gradients_of_its_nchw_layers(height, padding):
    """From the first convolution's output on the CNN computes in channels-last memory (the pools and the second
    convolution need no conversions); in float64 its logits and parameter gradients equal those of its own layers
    run one after the other on NCHW tensors (through nn.MaxPool2d), and its second convolution sees a
    channels-last input."""
    torch.manual_seed(0)
    net = PapernotCNN(1, height, 10, padding).double()
    x = torch.randn(6, 1, height, height, dtype=torch.float64)
    seen = []
    net.features[3].register_forward_hook(lambda m, inputs, out: seen.append(inputs[0]))
    y = net(x)
    grads = torch.autograd.grad(y.square().sum(), list(net.parameters()))
    nchw = nn.Sequential(*[nn.MaxPool2d(m.kernel_size, m.stride) if isinstance(m, nn.MaxPool2d) else m
                           for m in net.features], *net.classifier)
    y_ref = nchw(x)
    refs = torch.autograd.grad(y_ref.square().sum(), list(net.parameters()))
    assert seen[0].is_contiguous(memory_format=torch.channels_last) and not seen[0].is_contiguous()
    assert torch.allclose(y, y_ref, rtol=1e-12, atol=1e-13)
    for g, r in zip(grads, refs):
        assert torch.allclose(g, r, rtol=1e-12, atol=1e-13)
