"""Ghost clipping / book-keeping: per-sample gradient norms and the clipped weighted sum of one live
module's Linear and Conv2d layers, from each layer's input ``a`` and output gradient ``b`` alone
(Li et al. 2022, "ghost clipping"; Bu et al. 2023, "book-keeping"; Opacus' fast gradient clipping).

A layer whose output at position t is W a_t (+ bias), t over T positions (T = 1 for a Linear layer on
(n, d) inputs; the output pixels of a convolution, a_t its unfolded input patch), has the per-sample
weight gradient g_i = Σ_t b_{i,t} a_{i,t}ᵀ = B_iᵀ A_i (A_i: T × d, B_i: T × p). Its norm needs no g_i:

    ‖g_i‖² = Σ_{t,t'} (a_{i,t}·a_{i,t'}) (b_{i,t}·b_{i,t'}) = ⟨A_i A_iᵀ, B_i B_iᵀ⟩      (ghost norm, T² work)

against p·d to materialise g_i; each layer takes the cheaper one (Bu et al.'s mixed ghost clipping:
ghost where 2T² < p·d). The clipped weighted sum Σ_i c_i g_i is then the layer's weight gradient of
the weighted loss Σ_i c_i ℓ_i, i.e. the products (c∘B)ᵀA over the batch (book-keeping: no second
backward pass through the network, the stored forward's a and b are reused), or c·g for the layers
whose g_i were materialised anyway. T = 1 is the factored case ‖g_i‖ = ‖a_i‖·‖b_i‖.

:func:`ghost_rule` gives the rule of a layer type, or None where the trick does not apply (grouped or
string-padded convolutions, non-zero padding modes, every other layer type): those layers keep the
exact per-sample path of :mod:`engine.dp.layerwise`. A rule is ``rule(m, a, b) → (sq, summer)``:
``sq`` (n,) the squared norms of the layer's per-sample parameter gradients, ``summer(c)`` →
{parameter name in the layer: Σ_i c_i g_i}. :func:`conv2d_per_sample_weight_grad` (the exact path's
per-sample conv gradients) lives here too, beside the patches, since both paths use it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def use_ghost(t: int, p: int, d: int) -> bool:
    """Bu et al.'s rule: the ghost norm (2T² per sample) where it is cheaper than g_i (p·d)."""
    return 2 * t * t < p * d


def _factored(a, b):
    """(sq, summer) of Σ_t b_t a_tᵀ for a (n, T, d), b (n, T, p): ghost or materialised by the rule.
    The summer returns (p, d); materialised per-sample gradients are (n, p, d)."""
    n, t, d = a.shape
    p = b.shape[2]
    if t == 1:
        a1, b1 = a[:, 0], b[:, 0]
        return a1.pow(2).sum(1) * b1.pow(2).sum(1), lambda c: (b1 * c[:, None]).T @ a1
    if use_ghost(t, p, d):
        sq = (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(b, b.transpose(1, 2))).sum((1, 2))
        return sq, lambda c: (b * c[:, None, None]).reshape(n * t, p).T @ a.reshape(n * t, d)
    g = torch.bmm(b.transpose(1, 2), a)  # (n, p, d)
    return g.reshape(n, -1).pow(2).sum(1), lambda c: torch.tensordot(c, g, dims=1)


def linear_ghost(m: nn.Linear, a: torch.Tensor, b: torch.Tensor):
    """A Linear layer on (n, ..., d) inputs: the positions are every middle index (T = 1 on (n, d))."""
    n = a.shape[0]
    a3, b3 = a.reshape(n, -1, a.shape[-1]), b.reshape(n, -1, b.shape[-1])
    sq, weight = _factored(a3, b3)
    summers = {"weight": weight}
    if m.bias is not None:
        bs = b3.sum(1)  # (n, p): per-sample bias gradients
        sq = sq + bs.pow(2).sum(1)
        summers["bias"] = lambda c: c @ bs
    return sq, lambda c: {k: f(c) for k, f in summers.items()}


def conv2d_patches(m: nn.Conv2d, a: torch.Tensor, out_hw) -> torch.Tensor:
    """(n, T, kh·kw·c) input patches of a Conv2d, each patch in (kh, kw, c) order (channels last: the
    copy moves runs of kw·c contiguous values; F.unfold's im2col loops over the batch and is slower)."""
    (ph, pw), (sh, sw), (dh, dw) = m.padding, m.stride, m.dilation
    kh, kw = m.kernel_size
    n, c = a.shape[:2]
    oh, ow = out_hw
    a = F.pad(a, (pw, pw, ph, ph)) if (ph or pw) else a
    a = a.permute(0, 2, 3, 1).contiguous()  # (n, H, W, c)
    sn, s_h, s_w, sc = a.stride()
    win = a.as_strided((n, oh, ow, kh, kw, c), (sn, s_h * sh, s_w * sw, s_h * dh, s_w * dw, sc))
    return win.reshape(n, oh * ow, kh * kw * c)


def conv2d_per_sample_weight_grad(m: torch.nn.Conv2d, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(n, out, in, kh, kw) per-sample weight gradients of a Conv2d from its input a and output grad b.

    F.unfold's im2col loops over the batch on CPU; these two forms are vectorized (measured
    2.3× and 1.3× faster on the Papernot CNN's conv1 and conv2 at batch 256)."""
    n, c = a.shape[:2]
    kh, kw = m.kernel_size
    (ph, pw), (sh, sw) = m.padding, m.stride
    if m.dilation == (1, 1) and c <= 4 and b.is_contiguous():
        # Few input channels: one grouped convolution with the batch as groups, the output
        # gradients as kernels (dilated by the stride), cropped to the kernel size. (A channels-last b, as
        # in the Papernot CNN, would first be copied to NCHW kernels: the einsum below reads it as it is,
        # measured 1.2-1.9 ms less per MNIST CNN step at 1 and 2 threads.)
        o, oh, ow = b.shape[1:]
        w = F.conv2d(a.transpose(0, 1), b.reshape(n * o, 1, oh, ow), padding=(ph, pw), dilation=(sh, sw), groups=n)
        return w[:, :, :kh, :kw].reshape(c, n, o, kh, kw).permute(1, 2, 0, 3, 4)
    if m.dilation == (1, 1):
        # A strided view of the padded input as (n, c, kh, kw, oh, ow) windows, contracted by einsum.
        a = F.pad(a, (pw, pw, ph, ph)) if (ph or pw) else a
        st = a.stride()
        windows = a.as_strided((n, c, kh, kw, b.shape[2], b.shape[3]), (st[0], st[1], st[2], st[3], st[2] * sh, st[3] * sw))
        return torch.einsum("bohw,bcijhw->bocij", b, windows)
    cols = F.unfold(a, m.kernel_size, dilation=m.dilation, padding=m.padding, stride=m.stride)
    return torch.bmm(b.flatten(2), cols.transpose(1, 2)).view(n, *m.weight.shape)


def conv2d_ghost(m: nn.Conv2d, a: torch.Tensor, b: torch.Tensor):
    """A Conv2d (groups = 1, numeric zero padding): g_i = B_iᵀ A_i over the T output pixels. The ghost
    norm from the patch Gram where the rule says so; else g_i materialised — by
    :func:`conv2d_per_sample_weight_grad` where the input has few channels (the patches would be kh·kw times the
    input), else patches @ B."""
    n, o = b.shape[:2]
    kh, kw = m.kernel_size
    c = a.shape[1]
    if not use_ghost(b.shape[2] * b.shape[3], o, c * kh * kw) and m.dilation == (1, 1) and c <= 4:
        g = conv2d_per_sample_weight_grad(m, a, b).reshape(n, -1)  # (n, o·c·kh·kw)
        sq = g.pow(2).sum(1)
        weight = lambda cf: torch.tensordot(cf, g, dims=1).view(m.weight.shape)  # noqa: E731
    else:
        patches = conv2d_patches(m, a, b.shape[2:])  # (n, T, kh·kw·c)
        sq, w = _factored(patches, b.reshape(n, o, -1).transpose(1, 2))
        weight = lambda cf: w(cf).reshape(o, kh, kw, c).permute(0, 3, 1, 2).contiguous()  # noqa: E731
    summers = {"weight": weight}
    if m.bias is not None:
        bs = b.sum((2, 3))
        sq = sq + bs.pow(2).sum(1)
        summers["bias"] = lambda cf: cf @ bs
    return sq, lambda cf: {k: f(cf) for k, f in summers.items()}


def ghost_rule(m: nn.Module):
    """The ghost/book-keeping rule of this layer, or None (the layer keeps the exact per-sample path)."""
    if type(m) is nn.Linear:
        return linear_ghost
    if (type(m) is nn.Conv2d and m.groups == 1 and not isinstance(m.padding, str)
            and m.padding_mode == "zeros"):
        return conv2d_ghost
    return None
