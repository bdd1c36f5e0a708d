"""Models that adapt to the data's input shape. All are DP-compatible (no BatchNorm)."""
from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.config.run import MAX_MODEL_PARAMS, ModelConfig, check_hidden
from engine.config.schema import ConfigError


class LogisticRegression(nn.Module):
    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, x):
        return self.fc(self.flatten(x))


class MLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int, hidden=(64,)):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:  # integers (engine.config.run.check_hidden)
            layers += [nn.Linear(width, h), nn.Tanh()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def _conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _max_pool(pool: nn.MaxPool2d, x: torch.Tensor, return_indices: bool = False):
    """``pool``'s max-pool of ``x`` in the memory format ``x`` has (the kernel follows it)."""
    return F.max_pool2d(x, pool.kernel_size, pool.stride, pool.padding, pool.dilation, ceil_mode=pool.ceil_mode,
                        return_indices=return_indices)


class _ChannelsLastPool(torch.autograd.Function):
    """Max-pool of an NCHW batch through PyTorch's channels-last kernels, forward and backward, NCHW in and out."""

    @staticmethod
    def forward(ctx, x, pool):
        xc = x.contiguous(memory_format=torch.channels_last)
        y, idx = _max_pool(pool, xc, return_indices=True)
        ctx.save_for_backward(xc, idx)
        ctx.pool = pool
        return y.contiguous()

    @staticmethod
    def backward(ctx, grad):
        xc, idx = ctx.saved_tensors
        p = ctx.pool
        pair = nn.modules.utils._pair
        gx = torch.ops.aten.max_pool2d_with_indices_backward(
            grad.contiguous(memory_format=torch.channels_last), xc, pair(p.kernel_size), pair(p.stride),
            pair(p.padding), pair(p.dilation), p.ceil_mode, idx)
        return gx.contiguous(), None


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` through PyTorch's channels-last kernels on a 4-d batch. On one CPU thread the NCHW
    max-pool with indices was ~40 % of a CNN step: the CNN's first pool at batch 256 took 21 ms forward and
    backward, 8.5 ms so, copies included. The same kernel logic picks the same maximum (the first in the window;
    a NaN wins), so values and gradients equal ``nn.MaxPool2d``'s to the bit (tests/test_models.py). Under
    torch.func transforms (the vmap fallback) it is ``nn.MaxPool2d`` itself."""

    def forward(self, x):
        if (x.dim() != 4 or self.return_indices or torch._C._functorch.is_functorch_wrapped_tensor(x)
                or x.is_contiguous(memory_format=torch.channels_last)):  # (channels last already, PapernotCNN's)
            return super().forward(x)
        if not (torch.is_grad_enabled() and x.requires_grad):  # evaluation: the forward kernel alone
            return _max_pool(self, x.contiguous(memory_format=torch.channels_last)).contiguous()
        return _ChannelsLastPool.apply(x, self)


class PapernotCNN(nn.Module):
    """Papernot et al. (2021) tanh CNN for MNIST: conv 16 8×8 s2 → tanh → maxpool 2 s1 →
    conv 32 4×4 s2 → tanh → maxpool 2 s1 → fc 32 → tanh → fc. On small inputs (digits 8×8)
    the kernels shrink so every layer still sees at least one position. ``padding``: the first conv's
    padding on inputs of at least 16×16 (default 3; the INO-SGD reference code uses 2)."""

    def __init__(self, in_channels: int, height: int, num_classes: int, padding: int | None = None):
        super().__init__()
        k1, p1 = (8, 3 if padding is None else padding) if height >= 16 else (3, 1)
        k2, s2 = (4, 2) if height >= 16 else (2, 1)
        s = height
        s = _conv_out(s, k1, 2, p1)
        s = _conv_out(s, 2, 1, 0)
        s = _conv_out(s, k2, s2, 0)
        s = _conv_out(s, 2, 1, 0)
        if s < 1:
            raise ConfigError("model.name", f"the CNN does not fit {height}×{height} inputs")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, k1, 2, padding=p1), nn.Tanh(), MaxPool2d(2, 1),
            nn.Conv2d(16, 32, k2, s2), nn.Tanh(), MaxPool2d(2, 1),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * s * s, 32), nn.Tanh(), nn.Linear(32, num_classes))

    def forward(self, x):
        if x.dim() != 4 or torch._C._functorch.is_functorch_wrapped_tensor(x):  # (the vmap fallback)
            return self.classifier(self.features(x))
        # Channels last from the first convolution's output on: the pools, the second convolution and their
        # backward then run PyTorch's channels-last kernels with no conversion in between (Flatten puts the
        # features back in NCHW order for the classifier). Each step ~3 ms faster (bench/README.md).
        h = self.features[0](x).contiguous(memory_format=torch.channels_last)
        for layer in itertools.islice(self.features, 1, None):
            h = layer(h)
        return self.classifier(h)


class CifarCNN(nn.Module):
    """[32,32,M,64,64,M,128,128,M] 3×3 tanh convs → fc 128 → tanh → fc (Papernot et al. CIFAR)."""

    def __init__(self, in_channels: int, height: int, num_classes: int):
        super().__init__()
        layers: list[nn.Module] = []
        c, s = in_channels, height
        for v in (32, 32, "M", 64, 64, "M", 128, 128, "M"):
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
                s //= 2
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.Tanh()]
                c = v
        if s < 1:
            raise ConfigError("model.name", f"the CIFAR CNN needs inputs of at least 8×8, got {height}×{height}")
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(128 * s * s, 128), nn.Tanh(), nn.Linear(128, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


def resnet18(in_channels: int, num_classes: int) -> nn.Module:
    """A CIFAR-style ResNet-18 made DP-compatible: BatchNorm → GroupNorm by Opacus' ModuleValidator."""
    from opacus.validators import ModuleValidator

    net = _ResNet18(in_channels, num_classes)
    net = ModuleValidator.fix(net)
    errors = ModuleValidator.validate(net, strict=False)
    if errors:  # pragma: no cover - ModuleValidator.fix handles BatchNorm
        raise RuntimeError(f"ResNet-18 is not DP-compatible: {errors}")
    return net


class _BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.short(x))


class _ResNet18(nn.Module):
    def __init__(self, in_channels, num_classes):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, c = [], 64
        for cout, stride in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)):
            layers.append(_BasicBlock(c, cout, stride))
            c = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        return self.fc(torch.flatten(self.pool(self.layers(x)), 1))


def resolve_model_name(cfg: ModelConfig, input_shape: tuple) -> str:
    if cfg.name != "auto":
        return cfg.name
    return "cnn" if len(input_shape) == 3 else "lr"


def build_model(cfg: ModelConfig, input_shape: tuple, num_classes: int) -> nn.Module:
    """Build the configured model for this input shape; ConfigError if it does not fit."""
    name = resolve_model_name(cfg, input_shape)
    features = int(math.prod(input_shape))
    if name == "lr":
        return LogisticRegression(features, num_classes)
    if name == "mlp":
        hidden = check_hidden(cfg.hidden, "model.hidden")
        widths = (features, *hidden, num_classes)
        weights = sum((a + 1) * b for a, b in zip(widths, widths[1:]))
        if weights > MAX_MODEL_PARAMS:
            raise ConfigError("model.hidden", f"this MLP has {weights:,} weights on {features}-feature inputs, "
                                              f"over the limit of {MAX_MODEL_PARAMS:,}")
        return MLP(features, num_classes, hidden)
    if len(input_shape) != 3:
        raise ConfigError("model.name", f"{name} needs image inputs (C×H×W), got shape {tuple(input_shape)}")
    c, h, w = input_shape
    if h != w:
        raise ConfigError("model.name", f"{name} needs square images, got {h}×{w}")
    if name == "cnn":
        return PapernotCNN(c, h, num_classes, cfg.cnn_padding) if c == 1 else CifarCNN(c, h, num_classes)
    if name == "resnet18":
        if h < 8:
            raise ConfigError("model.name", f"resnet18 needs images of at least 8×8, got {h}×{w}")
        return resnet18(c, num_classes)
    raise ConfigError("model.name", f"unknown model {name!r}")
