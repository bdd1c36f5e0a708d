"""M models of one architecture with stacked parameters: the audit's chunks of models.

An audit trains 2R models (and a few more for PA-LOOA) that differ only in their training set,
initialisation and randomness; a chunk of them trains in lock-step in one process:

* parameters of the M models are stacked (``torch.func.stack_module_state``): every tensor
  carries a leading model axis; model m is initialised exactly like a dashboard run with
  ``seed = init_seeds[m]`` (:func:`seeded_model`); a k-seed dashboard run (``engine.train.loop``, M = k)
  trains such a stack with its own optimizer, which updates the stacked tensors in place;
* per-sample gradients come from ``engine.dp.grad_sample``: the closed form for Linear/Tanh stacks
  (logistic regression, tanh MLP), else the layerwise path with the M models run as one network
  (``engine.dp.layerwise.StackedLayers``: the CNNs, ResNet-18 GN), else vmap over models;
* :func:`sgd_train` runs ``engine.dp.step.dp_step`` — the same step a dashboard run takes — and plain
  SGD θ_m ← θ_m − lr · grad_m;
* :meth:`StackedModels.score` gives every model's per-sample loss, logit-scaled confidence and
  prediction.
"""
from __future__ import annotations

import copy
import math

import torch
from torch.func import stack_module_state

from engine.dp.grad_sample import (
    DEFAULT_STRATEGY,
    PerSampleGrads,
    StackedLayers,
    VmapGrads,
    linear_stack_grads,
    linear_stack_layers,
)
from engine.dp.prepare import seeded_model
from engine.dp.step import dp_step
from engine.store.lifecycle import Cancelled


class StackedModels:
    """M models of one architecture, parameters stacked along a leading model axis. ``method``: "auto" (the
    closed form where it applies, else the layerwise stack where it applies, else vmap), "layerwise" (auto
    without the closed form) or "vmap"; ``strategy``: the layerwise path's per-sample strategy."""

    def __init__(self, model_cfg, input_shape, num_classes: int, init_seeds, device, *, method: str = "auto",
                 strategy: str = DEFAULT_STRATEGY):
        if method not in ("auto", "layerwise", "vmap"):
            raise ValueError(f"unknown per-sample method {method!r}")
        self.device = torch.device(device)
        self.input_shape = tuple(input_shape)
        self.num_classes = int(num_classes)
        models = [seeded_model(model_cfg, self.input_shape, num_classes, s) for s in init_seeds]
        self.n_models = len(models)
        params, buffers = stack_module_state(models)
        self.params = {k: v.detach().to(self.device) for k, v in params.items()}
        self.buffers = {k: v.detach().to(self.device) for k, v in buffers.items()}
        self.layers = linear_stack_layers(models[0]) if method == "auto" else None
        base = copy.deepcopy(models[0]).to("meta")
        self._vmap = VmapGrads(base)
        self._stacked = StackedLayers.supports(base, self.params, self.input_shape, self.n_models, strategy) \
            if self.layers is None and method != "vmap" else None

    @property
    def closed_form(self) -> bool:
        return self.layers is not None

    @property
    def method(self) -> str:
        """The per-sample path this stack takes: "closed_form", "layerwise" or "vmap"."""
        return "closed_form" if self.closed_form else "layerwise" if self._stacked is not None else "vmap"

    @property
    def sequential(self) -> bool:
        """True once vmap over models failed and a loop over the models took over."""
        return self._vmap.sequential

    @sequential.setter
    def sequential(self, value: bool) -> None:
        self._vmap.sequential = bool(value)

    def module(self, m: int) -> torch.nn.Module:
        """Model ``m`` as a live module (a copy of its current parameters and buffers)."""
        model = copy.deepcopy(self._vmap.base)  # on the meta device: no memory, no random numbers
        state = {k: v[m].detach().clone() for k, v in {**self.params, **self.buffers}.items()}
        model.load_state_dict(state, assign=True)
        return model

    def param_count(self) -> int:
        return sum(int(v[0].numel()) for v in self.params.values())

    # --- per-sample gradients (the interface engine.dp.step.dp_step uses) -----------------------
    def per_sample(self, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor) -> PerSampleGrads:
        if self._stacked is not None:
            return self._stacked(self.params, x, y, idx, mask)
        flat = idx.reshape(-1)
        xb = x.index_select(0, flat).reshape(idx.shape + x.shape[1:])  # (M, L, ...)
        yb = y.index_select(0, flat).reshape(idx.shape)
        if self.closed_form:
            return linear_stack_grads(self.params, self.layers, xb, yb, self._input_sqnorms(x)[idx])
        return self._vmap(self.params, self.buffers, xb, yb)

    def loss_grads(self, x, y, idx, mask):
        """Gradient of each model's summed batch loss: ({name: (M, *shape)}, losses (M, L))."""
        work = self.per_sample(x, y, idx, mask)
        return work.weighted_sum(mask.to(work.losses.dtype)), work.losses

    def _input_sqnorms(self, x: torch.Tensor) -> torch.Tensor:
        """‖x_i‖² of every sample of ``x``, computed once per dataset tensor (saves one pass per step)."""
        key = (x.data_ptr(), tuple(x.shape))
        if getattr(self, "_sq_key", None) != key:
            self._sq_key = key
            self._sq = (x.reshape(len(x), -1).double() ** 2).sum(-1).to(x.dtype)
        return self._sq

    # --- evaluation -------------------------------------------------------------------------
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(M, n, classes) logits of every model on the same inputs (x: (n, ...))."""
        if self.closed_form:
            wn, bn = self.layers[0]
            w = self.params[wn]  # (M, out, in): the first layer of all models as one GEMM on the shared inputs
            h = (x.reshape(len(x), -1) @ w.reshape(-1, w.shape[-1]).T).reshape(len(x), self.n_models, -1)
            h = h.transpose(0, 1) + self.params[bn].unsqueeze(1)
            for wn, bn in self.layers[1:]:
                h = torch.tanh(h)
                h = torch.baddbmm(self.params[bn].unsqueeze(1), h, self.params[wn].transpose(1, 2))
            return h
        if self._stacked is not None:
            return self._stacked.logits(self.params, x)
        return self._vmap.logits(self.params, self.buffers, x)

    @torch.no_grad()
    def score(self, x: torch.Tensor, y: torch.Tensor, *, chunk: int = 4096):
        """Per model and sample: cross-entropy loss and logit-scaled confidence of the true class
        log p_y − log(1 − p_y) = z_y − logsumexp_{j≠y} z_j (stable), both (M, n) float64 numpy computed
        from the logits in float64 (a float32 loss of a well-fit model is exactly 0 for a quarter to a half of
        the samples; in float64 ties are rare), and the predictions (M, n) int64 numpy."""
        losses, confs, preds = [], [], []
        for a in range(0, len(y), chunk):
            z = self.logits(x[a:a + chunk]).double().transpose(1, 2).contiguous()  # (M, C, n): class-major
            preds.append(_argmax_classes(z).cpu())
            yy = y[a:a + chunk].reshape(1, 1, -1).expand(z.shape[0], 1, -1)
            zy = z.gather(1, yy).squeeze(1)
            losses.append((_lse(z) - zy).cpu())
            confs.append((zy - _lse(z.scatter(1, yy, -math.inf))).cpu())
        return (torch.cat(losses, 1).numpy(), torch.cat(confs, 1).numpy(), torch.cat(preds, 1).numpy())


def _argmax_classes(z: torch.Tensor) -> torch.Tensor:
    """argmax over dim 1 of (M, C, n), first maximum on ties (= torch.argmax), as C elementwise passes:
    much faster on CPU than a reduction over a strided dimension."""
    best = z[:, 0].clone()
    arg = torch.zeros_like(best, dtype=torch.long)
    for c in range(1, z.shape[1]):
        better = z[:, c] > best
        best = torch.where(better, z[:, c], best)
        arg.masked_fill_(better, c)
    return arg


def _lse(z: torch.Tensor) -> torch.Tensor:
    """logsumexp over dim 1 of (M, C, n) (rows of n stay contiguous: fast for few classes)."""
    top = z.amax(1, keepdim=True)  # finite whenever a column has one finite entry (C ≥ 2)
    return (top + torch.log(torch.exp(z - top).sum(1, keepdim=True))).squeeze(1)


def sgd_train(models: StackedModels, x: torch.Tensor, y: torch.Tensor, sampler, mechanism, *, steps: int, lr: float,
              gen: torch.Generator, should_stop=None, on_step=None) -> None:
    """Train all models for ``steps`` steps of ``engine.dp.step.dp_step`` and plain SGD (in place)."""
    for step in range(1, steps + 1):
        if should_stop is not None and should_stop():
            raise Cancelled(f"stopped at step {step - 1} of {steps}")
        out = dp_step(models, x, y, sampler, mechanism, gen)
        for k, g in out.grads.items():
            models.params[k].add_(g, alpha=-lr)
        if on_step is not None:
            on_step(step)
