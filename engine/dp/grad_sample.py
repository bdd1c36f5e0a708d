"""Per-sample gradients of M models behind one interface: :class:`PerSampleGrads` holds one
step's per-sample losses (M, L), gradient norms (M, L) and ``weighted_sum(coef (M, L)) →
{param: (M, *shape)}``. Three forms compute it:

* :class:`ModuleGrads` — one live ``nn.Module`` (M = 1, the dashboard run). Where every trainable
  layer is supported, :class:`LayerwisePerSampleGrads`: one forward pass with hooks that keep each
  trainable layer's input and output, then ``torch.autograd.grad`` of the summed loss with respect
  to the layer *outputs* only — the batch-summed weight gradients that a normal backward computes
  (and we would throw away) are never formed. Linear layers keep their per-sample weight gradients
  factored (g_i = b_i a_iᵀ, so ‖g_i‖ = ‖b_i‖·‖a_i‖ and Σ c_i g_i = (c∘b)ᵀ a): they are never
  materialized. Conv2d uses a grouped convolution or a strided-window einsum; any other trainable
  layer goes through Opacus' per-layer grad samplers. Measured on the Papernot MNIST CNN, batch 256
  (bench/step_overhead.py): this is what brings a private step close to a non-private one.
  Otherwise the module goes through :class:`VmapGrads` with M = 1.
  Its ``strategy`` (one of :data:`STRATEGIES`): "exact", the per-sample path above, or "ghost": every
  layer type with a rule in :mod:`engine.dp.ghost` (Linear, Conv2d with groups = 1 and numeric zero
  padding) gets its per-sample norms from a and b alone — the ghost norm or g_i, whichever is cheaper
  for that layer — and its share of ``weighted_sum(coef)`` as the book-keeping products (coef∘b)ᵀa
  (the weight gradient of the weighted loss Σ coef_i ℓ_i from the stored forward, no second pass);
  every other layer keeps the exact path. The same sums to float round-off
  (tests/test_ghost_clipping.py); :data:`DEFAULT_STRATEGY` is the one ``ModuleGrads`` takes.
* :func:`linear_stack_grads` — the closed form for stacked Flatten → Linear (→ Tanh → Linear)*
  parameters (logistic regression, tanh MLP; the audit's models): a Linear layer's per-sample
  gradient is δ_i a_iᵀ, so ‖g_i‖² = Σ_layers ‖δ_i‖²(‖a_i‖² + 1) and Σ_i c_i g_i = (c ⊙ δ)ᵀ a is one
  batched matmul; feature-major activations (M, features, L), input square norms cached.
* :class:`VmapGrads` — the generic path for stacked parameters of any model: ``vmap`` over models of
  ``vmap(grad(loss))`` over samples with ``functional_call``; if a model cannot be vmapped over
  models, a loop over the models (still per-sample-vmapped) takes over: same results, slower.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from opacus.grad_sample.grad_sample_module import GradSampleModule
from torch import nn
from torch.func import functional_call, grad, vmap

from engine.dp.ghost import conv2d_per_sample_weight_grad, ghost_rule
from engine.models.nets import MLP, LogisticRegression

STRATEGIES = ("exact", "ghost")
DEFAULT_STRATEGY = "exact"


class PerSampleGrads:
    """One step's per-sample quantities of M models: ``losses`` and ``norms`` (M, L) (detached) and
    ``weighted_sum(coef)`` = Σ_i coef[m, i] · g_{m,i} per model, {param name: (M, *shape)}."""

    def __init__(self, losses: torch.Tensor, norms: torch.Tensor, weighted_sum):
        self.losses, self.norms = losses, norms
        self._weighted_sum = weighted_sum

    def weighted_sum(self, coef: torch.Tensor) -> dict:
        return self._weighted_sum(coef)


def _trainable_layers(model):
    return [(name, m) for name, m in model.named_modules()
            if any(p.requires_grad for p in m.parameters(recurse=False))]


def _supported(m) -> bool:
    return isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) or type(m) in GradSampleModule.GRAD_SAMPLERS


def layerwise_supported(model) -> bool:
    return all(_supported(m) for _, m in _trainable_layers(model))


class LayerwisePerSampleGrads:
    """Per-sample gradients of one live module's batch via layer hooks (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, strategy: str = DEFAULT_STRATEGY):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown per-sample strategy {strategy!r}; one of {STRATEGIES}")
        self.model = model
        self.strategy = strategy
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

    def __call__(self, x, y) -> PerSampleGrads:
        """x (L, ...), y (L,) → one model's (M = 1) per-sample gradients."""
        self._active = True
        try:
            logits = self.model(x)
        finally:
            self._active = False
        losses = F.cross_entropy(logits, y, reduction="none")
        backprops = torch.autograd.grad(losses.sum(), self._outputs)
        dense, factored, ghosted, sq = {}, {}, [], 0
        for k, (prefix, m) in enumerate(self.layers):
            a, b = self._inputs[k], backprops[k]
            name = (prefix + ".") if prefix else ""
            rule = ghost_rule(m) if self.strategy == "ghost" else None
            if rule is not None:
                layer_sq, summer = rule(m, a, b)
                sq = sq + layer_sq
                ghosted.append((name, summer))
            elif type(m) is torch.nn.Linear and a.dim() == 2:
                factored[name + "weight"] = (a, b)
                if m.bias is not None:
                    dense[name + "bias"] = b
            elif type(m) is torch.nn.Conv2d and m.groups == 1 and not isinstance(m.padding, str):
                dense[name + "weight"] = conv2d_per_sample_weight_grad(m, a, b)
                if m.bias is not None:
                    dense[name + "bias"] = b.sum((2, 3))
            else:
                sampler = GradSampleModule.GRAD_SAMPLERS[type(m)]
                for p, g in sampler(m, [a], b).items():
                    dense[self.param_names[id(p)]] = g
        self._inputs = [None] * len(self.layers)
        self._outputs = [None] * len(self.layers)
        order = list(self.param_names.values())
        for g in dense.values():
            sq = sq + g.reshape(len(g), -1).pow(2).sum(1)
        for a, b in factored.values():
            sq = sq + a.pow(2).sum(1) * b.pow(2).sum(1)

        def weighted_sum(coef):
            c = coef[0]
            out = {name: torch.tensordot(c, g, dims=1) for name, g in dense.items()}
            out.update({name: (b * c[:, None]).T @ a for name, (a, b) in factored.items()})
            for name, summer in ghosted:
                out.update({name + k: v for k, v in summer(c).items()})
            return {k: out[k].unsqueeze(0) for k in order}

        return PerSampleGrads(losses.detach()[None], torch.sqrt(sq).detach()[None], weighted_sum)


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
