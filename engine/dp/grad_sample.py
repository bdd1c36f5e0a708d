"""Per-sample gradients of M models behind one interface (:class:`engine.dp.per_sample.PerSampleGrads`):
one step's per-sample losses (M, L), gradient norms (M, L) and ``weighted_sum(coef (M, L)) →
{param: (M, *shape)}``. The forms that compute it, fastest first:

* :func:`linear_stack_grads` — the closed form for stacked Flatten → Linear (→ Tanh → Linear)*
  parameters (logistic regression, tanh MLP; the audit's tabular models): a Linear layer's per-sample
  gradient is δ_i a_iᵀ, so ‖g_i‖² = Σ_layers ‖δ_i‖²(‖a_i‖² + 1) and Σ_i c_i g_i = (c ⊙ δ)ᵀ a is one
  batched matmul; feature-major activations (M, features, L), input square norms cached.
* the layerwise path (:mod:`engine.dp.layerwise`): one forward pass, gradients with respect to the
  layer outputs only, one per-sample rule per layer type, strategy "exact" or "ghost" — for one live
  module (:class:`ModuleGrads`, M = 1, the dashboard run) and for M stacked models run as one network
  (:class:`engine.dp.layerwise.StackedLayers`, used by ``engine.dp.stacked.StackedModels``: the CNNs and
  ResNet-18 GN of audit chunks and k-seed jobs).
* :class:`VmapGrads` — the fallback for any model the layerwise path does not cover: ``vmap`` over models
  of ``vmap(grad(loss))`` over samples with ``functional_call``; if a model cannot be vmapped over models,
  a loop over the models (still per-sample-vmapped) takes over: same results, slower.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from engine.dp.layerwise import (
    LayerwisePerSampleGrads,
    StackedLayers,
    layer_supported,
    trainable_layers,
)
from engine.dp.per_sample import DEFAULT_STRATEGY, STRATEGIES, PerSampleGrads
from engine.models.nets import MLP, LogisticRegression

__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", "LayerwisePerSampleGrads", "ModuleGrads", "PerSampleGrads",
           "StackedLayers", "VmapGrads", "layerwise_supported", "linear_stack_grads", "linear_stack_layers"]


def layerwise_supported(model) -> bool:
    return all(layer_supported(m) for _, m in trainable_layers(model))


class VmapGrads:
    """Per-sample gradients of M models with stacked parameters (any architecture ``base``, e.g. on
    the meta device): vmap over models of vmap(grad(loss)) over samples, or a loop over the models
    when vmap over models fails (``sequential`` then stays True)."""

    def __init__(self, base: nn.Module):
        self.base = base
        self.sequential = False

        def loss_one(p, b, xi, yi):
            out = functional_call(base, (p, b), (xi.unsqueeze(0),))
            loss = F.cross_entropy(out, yi.unsqueeze(0))
            return loss, loss.detach()

        self._per_sample = vmap(grad(loss_one, has_aux=True), in_dims=(None, None, 0, 0))

    def __call__(self, params: dict, buffers: dict, xb: torch.Tensor, yb: torch.Tensor) -> PerSampleGrads:
        """params/buffers: {name: (M, ...)}; xb (M, L, ...), yb (M, L)."""
        ps = self._per_sample
        grads = losses = None
        if not self.sequential:
            try:
                grads, losses = vmap(ps, in_dims=(0, 0, 0, 0))(params, buffers, xb, yb)
            except (RuntimeError, NotImplementedError, ValueError):
                self.sequential = True  # fall back to a loop over the models
        if self.sequential:
            m = yb.shape[0]
            per = [ps({k: v[i] for k, v in params.items()}, {k: v[i] for k, v in buffers.items()}, xb[i], yb[i])
                   for i in range(m)]
            grads = {k: torch.stack([g[k] for g, _ in per]) for k in params}
            losses = torch.stack([l for _, l in per])
        m, length = yb.shape
        norms = torch.sqrt(sum((g.reshape(m, length, -1) ** 2).sum(-1) for g in grads.values()))

        def weighted_sum(coef):
            return {k: torch.einsum("ml,ml...->m...", coef, g) for k, g in grads.items()}

        return PerSampleGrads(losses.detach(), norms.detach(), weighted_sum)

    def logits(self, params: dict, buffers: dict, x: torch.Tensor) -> torch.Tensor:
        """(M, n, classes) logits of every model on the same inputs."""
        fwd = lambda p, b, xx: functional_call(self.base, (p, b), (xx,))  # noqa: E731
        if not self.sequential:
            try:
                return vmap(fwd, in_dims=(0, 0, None))(params, buffers, x)
            except (RuntimeError, NotImplementedError, ValueError):
                self.sequential = True
        m = next(iter(params.values())).shape[0]
        return torch.stack([fwd({k: v[i] for k, v in params.items()}, {k: v[i] for k, v in buffers.items()}, x)
                            for i in range(m)])


class ModuleGrads:
    """Per-sample gradients of one live ``nn.Module`` (M = 1) for a padded (1, L) batch: the
    layerwise hooks where they apply (``method`` "auto" or "layerwise"), else (or "vmap") VmapGrads."""

    n_models = 1

    def __init__(self, model: nn.Module, *, method: str = "auto", strategy: str = DEFAULT_STRATEGY):
        self.model = model
        self.params = dict(model.named_parameters())
        use_vmap = method == "vmap" or (method == "auto" and not layerwise_supported(model))
        self._layerwise = None if use_vmap else LayerwisePerSampleGrads(model, strategy)
        self._vmap = VmapGrads(model) if use_vmap else None

    def per_sample(self, x, y, idx, mask) -> PerSampleGrads:
        valid = mask[0]
        k, length = int(valid.sum()), valid.numel()
        if k == 0:  # an empty Poisson batch: nothing to differentiate
            zeros = torch.zeros(1, length, dtype=x.dtype, device=x.device)
            return PerSampleGrads(zeros, zeros, lambda coef: {n: torch.zeros_like(p).unsqueeze(0)
                                                              for n, p in self.params.items()})
        ix = idx[0] if k == length else idx[0][valid]
        xb, yb = x.index_select(0, ix), y.index_select(0, ix)
        if self._layerwise is not None:
            work = self._layerwise(xb, yb)
        else:
            params = {n: p.detach().unsqueeze(0) for n, p in self.params.items()}
            buffers = {n: b.detach().unsqueeze(0) for n, b in self.model.named_buffers()}
            work = self._vmap(params, buffers, xb.unsqueeze(0), yb.unsqueeze(0))
        return work if k == length else _scatter_row(work, valid)

    def loss_grads(self, x, y, idx, mask):
        """Gradient of the summed batch loss (no per-sample work): ({name: (1, *shape)}, losses (1, L))."""
        valid = mask[0]
        k, length = int(valid.sum()), valid.numel()
        if k == 0:
            return ({n: torch.zeros_like(p).unsqueeze(0) for n, p in self.params.items()},
                    torch.zeros(1, length, dtype=x.dtype, device=x.device))
        ix = idx[0] if k == length else idx[0][valid]
        per = F.cross_entropy(self.model(x.index_select(0, ix)), y.index_select(0, ix), reduction="none")
        grads = torch.autograd.grad(per.sum(), list(self.params.values()))
        losses = per.detach()[None]
        if k < length:
            losses = torch.zeros(1, length, dtype=x.dtype, device=x.device).masked_scatter_(mask[:1], losses)
        return {n: g.unsqueeze(0) for n, g in zip(self.params, grads)}, losses


def _scatter_row(work: PerSampleGrads, valid: torch.Tensor) -> PerSampleGrads:
    """One model's per-sample quantities of its valid entries, laid back into its padded (1, L) row."""
    losses = torch.zeros(1, valid.numel(), dtype=work.losses.dtype, device=work.losses.device)
    norms = torch.zeros_like(losses)
    losses[0, valid], norms[0, valid] = work.losses[0], work.norms[0]
    return PerSampleGrads(losses, norms, lambda coef: work.weighted_sum(coef[:, valid]))


def linear_stack_layers(model: nn.Module):
    """[(weight, bias) names] if the model is Flatten → Linear (→ Tanh → Linear)*, else None."""
    if isinstance(model, LogisticRegression):
        return [("fc.weight", "fc.bias")]
    if isinstance(model, MLP):
        layers, expect_linear = [], True
        mods = list(model.net.named_children())
        if not mods or not isinstance(mods[0][1], nn.Flatten):
            return None
        for name, mod in mods[1:]:
            if expect_linear and isinstance(mod, nn.Linear) and mod.bias is not None:
                layers.append((f"net.{name}.weight", f"net.{name}.bias"))
            elif not expect_linear and isinstance(mod, nn.Tanh):
                pass
            else:
                return None
            expect_linear = not expect_linear
        return layers if not expect_linear else None
    return None


def linear_stack_grads(params: dict, layers, xb: torch.Tensor, yb: torch.Tensor,
                       x_sqnorms: torch.Tensor) -> PerSampleGrads:
    """Exact per-sample losses, gradient norms and weighted sums of M stacked Linear/Tanh stacks.

    ``params`` {name: (M, ...)}, ``layers`` from :func:`linear_stack_layers`, xb (M, L, ...), yb (M, L),
    ``x_sqnorms`` (M, L) = ‖x_i‖². Feature-major layout: activations are (M, features, L), so the
    softmax over the few classes and every per-sample reduction run over contiguous rows of length L.
    """
    m, length = yb.shape
    xt = xb.reshape(m, length, -1)  # (M, L, D): inputs, sample-major (the weight-gradient matmul uses it as is)
    acts = [xt.transpose(1, 2)]  # (M, D, L)
    last = len(layers) - 1
    for j, (wn, bn) in enumerate(layers):
        z = torch.baddbmm(params[bn].unsqueeze(2), params[wn], acts[j])  # (M, out, L)
        if j < last:
            acts.append(torch.tanh(z))
    logits = z  # (M, C, L)
    top = logits.amax(1, keepdim=True)
    e = torch.exp(logits - top)
    tot = e.sum(1, keepdim=True)
    lse = top + torch.log(tot)
    yi = yb.unsqueeze(1)  # (M, 1, L)
    losses = (lse - logits.gather(1, yi)).squeeze(1)
    delta = e / tot  # softmax − onehot: dℓ_i/dz_i
    delta.scatter_add_(1, yi, -torch.ones_like(yi, dtype=delta.dtype))
    deltas = [None] * len(layers)
    deltas[last] = delta
    for j in range(last, 0, -1):
        d = torch.bmm(params[layers[j][0]].transpose(1, 2), deltas[j])  # (M, in, L)
        deltas[j - 1] = d * (1.0 - acts[j] * acts[j])
    act_sq = [x_sqnorms] + [(a * a).sum(1) for a in acts[1:]]
    sq = sum((d * d).sum(1) * (a2 + 1.0) for d, a2 in zip(deltas, act_sq))

    def weighted_sum(coef):
        out = {}
        for j, ((wn, bn), d) in enumerate(zip(layers, deltas)):
            dc = d * coef.unsqueeze(1)  # (M, out, L)
            out[wn] = torch.bmm(dc, xt if j == 0 else acts[j].transpose(1, 2))
            out[bn] = dc.sum(2)
        return out

    return PerSampleGrads(losses.detach(), torch.sqrt(sq).detach(), weighted_sum)
