"""Per-sample gradients for one batch at a time.

Two implementations with the same interface ``fn(params, x, y) -> (PerSampleGrads, losses)``:

* :class:`LayerwisePerSampleGrads` (default where it applies): one forward pass with hooks
  that keep each trainable layer's input and output, then ``torch.autograd.grad`` of the summed
  loss with respect to the layer *outputs* only — the batch-summed weight gradients that a
  normal backward computes (and we would throw away) are never formed. Linear layers keep their
  per-sample weight gradients factored (g_i = b_i a_iᵀ, so ‖g_i‖ = ‖b_i‖·‖a_i‖ and
  Σ c_i g_i = (c∘b)ᵀ a): they are never materialized. Conv2d uses unfold + bmm; any other
  trainable layer goes through Opacus' per-layer grad samplers. Measured on the Papernot MNIST
  CNN, batch 256 (bench/step_overhead.py): this is what brings a private step close to the
  cost of a non-private one.
* :func:`vmap_per_sample_grads`: ``torch.func.vmap(grad(...))``, generic fallback for models
  with a trainable layer type Opacus has no grad sampler for.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from opacus.grad_sample.grad_sample_module import GradSampleModule
from torch.func import functional_call, grad, vmap


class PerSampleGrads:
    """Per-sample gradients of one batch: ``dense[name]`` is (b, *shape); ``factored[name]`` is
    (a, b) with the sample's gradient b_iᵀ a_i (a: (b, in), b: (b, out))."""

    def __init__(self, dense: dict | None = None, factored: dict | None = None, order: list | None = None):
        self.dense = dense or {}
        self.factored = factored or {}
        self.order = order or list(self.dense) + list(self.factored)

    def sq_norms(self) -> torch.Tensor:
        total = 0
        for g in self.dense.values():
            total = total + g.reshape(len(g), -1).pow(2).sum(1)
        for a, b in self.factored.values():
            total = total + a.pow(2).sum(1) * b.pow(2).sum(1)
        return total

    def weighted_sum(self, coef: torch.Tensor) -> dict:
        out = {}
        for name, g in self.dense.items():
            out[name] = torch.tensordot(coef, g, dims=1)
        for name, (a, b) in self.factored.items():
            out[name] = (b * coef[:, None]).T @ a
        return {k: out[k] for k in self.order}

    def sample(self, i: int) -> dict:
        """Sample i's full gradient (tests and debugging)."""
        out = {k: g[i] for k, g in self.dense.items()}
        out.update({k: torch.outer(b[i], a[i]) for k, (a, b) in self.factored.items()})
        return out


def _trainable_layers(model):
    return [(name, m) for name, m in model.named_modules()
            if any(p.requires_grad for p in m.parameters(recurse=False))]


def _supported(m) -> bool:
    return isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) or type(m) in GradSampleModule.GRAD_SAMPLERS


def layerwise_supported(model) -> bool:
    return all(_supported(m) for _, m in _trainable_layers(model))


class LayerwisePerSampleGrads:
    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.layers = _trainable_layers(model)
        self.param_names = {id(p): f"{name}.{pname}" if name else pname
                            for name, m in self.layers for pname, p in m.named_parameters(recurse=False)}
        self._inputs: list = [None] * len(self.layers)
        self._outputs: list = [None] * len(self.layers)
        for k, (_, m) in enumerate(self.layers):
            m.register_forward_hook(self._hook(k))
        self._active = False

    def _hook(self, k):
        def hook(module, inputs, output):
            if self._active:
                self._inputs[k] = inputs[0].detach()
                self._outputs[k] = output
        return hook

    def __call__(self, params, x, y):
        # ``params`` are the model's own parameters (kept for interface parity with vmap).
        self._active = True
        try:
            logits = self.model(x)
        finally:
            self._active = False
        losses = F.cross_entropy(logits, y, reduction="none")
        backprops = torch.autograd.grad(losses.sum(), self._outputs)
        out = PerSampleGrads(order=list(self.param_names.values()))
        for k, (prefix, m) in enumerate(self.layers):
            a, b = self._inputs[k], backprops[k]
            name = (prefix + ".") if prefix else ""
            if type(m) is torch.nn.Linear and a.dim() == 2:
                out.factored[name + "weight"] = (a, b)
                if m.bias is not None:
                    out.dense[name + "bias"] = b
            elif type(m) is torch.nn.Conv2d and m.groups == 1 and not isinstance(m.padding, str):
                out.dense[name + "weight"] = conv2d_per_sample_weight_grad(m, a, b)
                if m.bias is not None:
                    out.dense[name + "bias"] = b.sum((2, 3))
            else:
                sampler = GradSampleModule.GRAD_SAMPLERS[type(m)]
                for p, g in sampler(m, [a], b).items():
                    out.dense[self.param_names[id(p)]] = g
        self._inputs = [None] * len(self.layers)
        self._outputs = [None] * len(self.layers)
        return out, losses.detach()


def conv2d_per_sample_weight_grad(m: torch.nn.Conv2d, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(n, out, in, kh, kw) per-sample weight gradients of a Conv2d from its input a and output grad b.

    F.unfold's im2col loops over the batch on CPU; these two forms are vectorized (measured
    2.3× and 1.3× faster on the Papernot CNN's conv1 and conv2 at batch 256)."""
    n, c = a.shape[:2]
    kh, kw = m.kernel_size
    (ph, pw), (sh, sw) = m.padding, m.stride
    if m.dilation == (1, 1) and c <= 4:
        # Few input channels: one grouped convolution with the batch as groups, the output
        # gradients as kernels (dilated by the stride), cropped to the kernel size.
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


def vmap_per_sample_grads(model: torch.nn.Module):
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def loss_one(params, x, y):
        out = functional_call(model, (params, buffers), (x.unsqueeze(0),))
        loss = F.cross_entropy(out, y.unsqueeze(0))
        return loss, loss.detach()

    fn = vmap(grad(loss_one, has_aux=True), in_dims=(None, 0, 0))

    def per_sample(params, x, y):
        grads, losses = fn(params, x, y)
        return PerSampleGrads(dense=grads), losses

    return per_sample


def per_sample_grad_fn(model: torch.nn.Module, *, method: str = "auto"):
    """``method``: "auto" (layerwise where supported, else vmap), "layerwise" or "vmap"."""
    if method == "vmap" or (method == "auto" and not layerwise_supported(model)):
        return vmap_per_sample_grads(model)
    return LayerwisePerSampleGrads(model)
