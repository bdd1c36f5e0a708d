"""Batched training of many small models at once: the audit's model ensembles.

An audit trains 2R models (and a few more for PA-LOOA) that differ only in their training
set, initialisation and randomness. Training them one after another is the bottleneck, so
this module trains a *chunk* of M models in lock-step, in one process:

* parameters of the M models are stacked (``torch.func.stack_module_state``) and every
  tensor carries a leading model axis;
* each model draws its **own Poisson batch** from its **own member list** with the per-sample
  rates q_i of its tier (:class:`PoissonSampler`, exact Poisson sampling through geometric
  gaps, O(batch) work per model instead of O(n)); batches of different sizes are padded to a
  fixed-size index tensor with a mask, and padded entries get coefficient exactly 0;
* per-sample gradients per model: ``vmap`` over models of ``vmap(grad(loss))`` over samples
  with ``functional_call`` (the generic path: any model, e.g. the CNNs), or, for the linear
  stacks of ``engine.models`` (logistic regression, tanh MLP), an exact closed form that never
  materialises them: a Linear layer's per-sample gradient is the outer product δ_i a_iᵀ, so
  ‖g_i‖² = Σ_layers ‖δ_i‖²(‖a_i‖² + 1) and Σ_i c_i g_i = (c ⊙ δ)ᵀ a is one batched matmul;
* the same mechanisms as ``engine.mechanisms``, vectorised over models: per-tier clip norms
  C_i (DP-SGD, IDP-SGD), INO-SGD importance weights (:func:`batched_importance_weights`, the
  very definition of ``engine.importance``), DP-SGD-S group-adaptive clipping with the private
  quantile tracker; each model gets its **own Gaussian noise**; the noisy sum is divided by
  the model's expected batch size and applied by plain SGD, exactly like ``engine.train``;
* if a model cannot be vmapped over models, a sequential loop over the models of the chunk
  (still per-sample-vmapped) takes over: same results, slower.

Memory stays bounded by chunking: :func:`models_per_chunk` sizes a chunk from the per-model
working set so that the step's tensors fit ``budget_bytes`` (default 1 GiB; the audit keeps the
whole process under 4 GiB). CUDA is used when available.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

from engine.models import MLP, LogisticRegression, build_model
from engine.train import Cancelled  # noqa: F401 - raised when should_stop() turns true

DEFAULT_BUDGET_BYTES = 1 << 30  # per-chunk working set of one training step


# --------------------------------------------------------------------------------------------
# INO-SGD weights, batched over models
# --------------------------------------------------------------------------------------------

def batched_importance_weights(losses, clip_norms, valid, tif, tail_lengths) -> np.ndarray:
    """INO-SGD weights for M batches at once, ``(M, L)`` in input order; 0 where ``valid`` is False.

    Row m is exactly ``engine.importance.importance_weights`` of the valid entries of row m
    (same definition: stable sort by loss — ties keep position —, clip masses laid end to end,
    exact interval averages of BIF(x) = TIF(x/γ) on [0, γ), 1 beyond, via the closed-form
    antiderivative F(x) = γ·G(min(x/γ, 1)) + max(x − γ, 0)). Padded entries must come after the
    valid ones of their row (as :class:`PoissonSampler` lays them out): they are given loss +inf
    and clip mass 0, so they sort last and take no mass. ``tail_lengths``: γ per model (or one).
    """
    losses = np.asarray(losses, dtype=float)
    valid = np.asarray(valid, dtype=bool)
    c = np.where(valid, np.asarray(clip_norms, dtype=float), 0.0)
    if losses.ndim != 2 or c.shape != losses.shape or valid.shape != losses.shape:
        raise ValueError("losses, clip_norms and valid must be (M, L) arrays of one shape")
    if np.any(c[valid] <= 0) or not np.all(np.isfinite(c)):
        raise ValueError("clip norms of valid entries must be finite and > 0")
    gamma = np.broadcast_to(np.asarray(tail_lengths, dtype=float).reshape(-1, 1), (losses.shape[0], 1))
    keyed = np.where(valid, losses, np.inf)
    order = np.argsort(keyed, axis=1, kind="stable")
    c_sorted = np.take_along_axis(c, order, axis=1)
    ends = np.cumsum(c_sorted, axis=1)
    starts = ends - c_sorted
    with np.errstate(invalid="ignore", divide="ignore"):
        rho_sorted = (_antiderivative(ends, tif, gamma) - _antiderivative(starts, tif, gamma)) / c_sorted
    rho_sorted = np.where(np.take_along_axis(valid, order, axis=1), np.clip(rho_sorted, 0.0, 1.0), 0.0)
    rho = np.empty_like(rho_sorted)
    np.put_along_axis(rho, order, rho_sorted, axis=1)
    return rho


def _antiderivative(x, tif, gamma):
    """engine.importance.bif_antiderivative with one γ per row (γ → 0: BIF ≡ 1)."""
    g = np.broadcast_to(gamma, x.shape)
    pos = g > 0
    safe = np.where(pos, g, 1.0)
    tail = safe * tif.integral(np.minimum(x / safe, 1.0)) + np.maximum(x - safe, 0.0)
    return np.where(pos, tail, x)


# --------------------------------------------------------------------------------------------
# Mechanisms, vectorised over the models of a chunk (engine.mechanisms, one row per model)
# --------------------------------------------------------------------------------------------

class BatchedMechanism:
    private = True
    formal_dp = True

    def clip_norms(self, idx: torch.Tensor) -> torch.Tensor:
        """(M, L) clip norm of each batch entry."""
        raise NotImplementedError

    def weights(self, losses: torch.Tensor, clip: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        """(M, L) ρ, or None for ρ ≡ 1."""
        return None

    def noise_std(self) -> torch.Tensor:
        """(M,) std of the Gaussian noise added to each model's clipped sum."""
        raise NotImplementedError

    def observe(self, idx, norms, mask, gen) -> None:
        """After each step, with the unclipped per-sample gradient norms."""

    def state(self) -> dict:
        return {}


class BatchedNonPrivate(BatchedMechanism):
    private = False
    formal_dp = False

    def __init__(self, n_models: int, device):
        self.m, self.device = n_models, device

    def clip_norms(self, idx):
        return torch.full(idx.shape, math.inf, device=idx.device)

    def noise_std(self):
        return torch.zeros(self.m, device=self.device)


class BatchedClipped(BatchedMechanism):
    """DP-SGD / IDP-SGD: per-sample (per-tier) clip norms from the plan, one noise std."""

    def __init__(self, *, sample_clip_norms, noise_std: float, n_models: int, device):
        self._clip = torch.as_tensor(np.asarray(sample_clip_norms, dtype=np.float32), device=device)
        self._std = torch.full((n_models,), float(noise_std), device=device)

    def clip_norms(self, idx):
        return self._clip[idx]

    def noise_std(self):
        return self._std


class BatchedImportance(BatchedClipped):
    """INO-SGD: ρ from :func:`batched_importance_weights` (float64, on the CPU, like the engine)."""

    def __init__(self, *, sample_clip_norms, noise_std, n_models, device, tail_lengths, tif):
        super().__init__(sample_clip_norms=sample_clip_norms, noise_std=noise_std, n_models=n_models, device=device)
        self.tail_lengths = np.broadcast_to(np.asarray(tail_lengths, dtype=float), (n_models,)).copy()
        self.tif = tif

    def weights(self, losses, clip, mask):
        rho = batched_importance_weights(losses.detach().cpu().numpy(), clip.detach().cpu().numpy(),
                                         mask.cpu().numpy(), self.tif, self.tail_lengths)
        return torch.as_tensor(rho, dtype=losses.dtype, device=losses.device)


class BatchedGroupAdaptive(BatchedMechanism):
    """DP-SGD-S (engine.mechanisms.GroupAdaptive) with one (S_k, S̄_k) state per model.

    Private mode: per model and group, release Σ_i (1[‖g_i‖ ≤ S_k] − ½) + N(0, σ_b²), estimate
    the clipped fraction with the model's expected group batch and update S_k geometrically;
    the gradient noise is z_Δ · max_k C_k. Non-private mode: the exact batch quantile.
    """

    def __init__(self, *, groups, n_groups: int, noise_multiplier: float, expected_group_batch, initial: float,
                 tau: float, quantile: float, ema: float, min_clip: float, private: bool, quantile_lr: float,
                 count_noise_std: float, device):
        self.groups = torch.as_tensor(np.asarray(groups, dtype=np.int64), device=device)
        self.k = int(n_groups)
        exp = np.maximum(np.asarray(expected_group_batch, dtype=np.float64), 1e-12)  # (M, K)
        self.expected = torch.as_tensor(exp, dtype=torch.float64, device=device)
        m = exp.shape[0]
        self.estimate = torch.full((m, self.k), float(initial), dtype=torch.float64, device=device)
        self.smoothed = self.estimate.clone()
        self.noise_multiplier = float(noise_multiplier)
        self.tau, self.quantile, self.ema, self.min_clip = tau, quantile, ema, min_clip
        self.formal_dp = bool(private)
        self.quantile_lr, self.count_noise_std = quantile_lr, count_noise_std

    def group_clips(self) -> torch.Tensor:
        return torch.clamp(self.tau * self.smoothed, min=self.min_clip)

    def clip_norms(self, idx):
        gc = self.group_clips().to(torch.float32)
        return torch.gather(gc, 1, self.groups[idx])

    def noise_std(self):
        return (self.noise_multiplier * self.group_clips().max(dim=1).values).to(torch.float32)

    def observe(self, idx, norms, mask, gen):
        g = self.groups[idx]  # (M, L)
        norms = norms.to(torch.float64)
        if self.formal_dp:
            below = ((norms <= torch.gather(self.estimate, 1, g)).to(torch.float64) - 0.5) * mask
            counts = torch.zeros_like(self.estimate).scatter_add_(1, g, below)
            noise = torch.randn(self.estimate.shape, generator=gen, device=self.estimate.device,
                                dtype=torch.float64)
            frac = (counts + self.count_noise_std * noise) / self.expected + 0.5
            self.estimate = self.estimate * torch.exp(-self.quantile_lr * (frac - self.quantile))
        else:
            for j in range(self.k):
                sel = mask & (g == j)
                vals = torch.where(sel, norms, torch.full_like(norms, math.inf)).sort(dim=1).values
                cnt = sel.sum(1)
                pos = self.quantile * (cnt - 1).clamp(min=0).to(torch.float64)  # numpy's linear quantile
                lo = pos.floor().long()
                hi = pos.ceil().long()
                vlo = vals.gather(1, lo[:, None])[:, 0]
                vhi = vals.gather(1, hi[:, None])[:, 0]
                q = vlo + (vhi - vlo) * (pos - lo)
                self.estimate[:, j] = torch.where(cnt > 0, q, self.estimate[:, j])
        self.smoothed = self.ema * self.smoothed + (1 - self.ema) * self.estimate

    def state(self):
        return {"group_clip_norms": self.group_clips().mean(0).tolist()}


# --------------------------------------------------------------------------------------------
# Poisson sampling, per model, with per-sample rates
# --------------------------------------------------------------------------------------------

class PoissonSampler:
    """Each model m includes each of its members i independently with probability q_i.

    Members are grouped by their rate (one group per distinct q, i.e. per tier); within a
    group the gaps between selected positions are geometric(q), so a draw costs O(batch)
    random numbers. ``sample`` returns ``idx`` (M, L) sample indices — valid entries first,
    ascending (the engine's batch order) — and ``mask`` (M, L); padded entries hold index 0
    and mask False. L is the largest batch of this step (at least 1).
    """

    def __init__(self, members: np.ndarray, sample_rates: np.ndarray, device):
        members = np.asarray(members, dtype=bool)
        rates = np.asarray(sample_rates, dtype=np.float64)
        self.m, self.n = members.shape
        self.device = device
        self.parts = []
        for q in np.unique(rates[members.any(0)]) if members.any() else []:
            sel = members & (rates == q)[None, :]
            counts = sel.sum(1)
            width = max(int(counts.max()), 1)
            lists = np.zeros((self.m, width), dtype=np.int64)
            for r in range(self.m):
                ix = np.flatnonzero(sel[r])
                lists[r, : len(ix)] = ix
            self.parts.append((float(q), torch.as_tensor(lists, device=device),
                               torch.as_tensor(counts, device=device)))
        self.expected_batch = (members * rates[None, :]).sum(1)  # Σ_i∈members q_i, per model

    def sample(self, gen: torch.Generator):
        idx_parts, ok_parts = [], []
        for q, lists, counts in self.parts:
            width = lists.shape[1]
            if q >= 1.0:
                pos = torch.arange(width, device=self.device).expand(self.m, width)
            else:
                mean = q * width
                draws = int(mean + 8.0 * math.sqrt(mean * (1 - q) + 1.0) + 16)
                log1mq = math.log1p(-q)
                gaps = self._gaps(gen, draws, log1mq)
                pos = gaps.cumsum(1) - 1
                while bool((pos[:, -1] < counts).any()):  # rare: not past the end yet
                    more = self._gaps(gen, draws, log1mq).cumsum(1) + pos[:, -1:]
                    pos = torch.cat([pos, more], 1)
            ok = pos < counts[:, None]
            idx_parts.append(torch.gather(lists, 1, pos.clamp(max=width - 1)))
            ok_parts.append(ok)
        if not idx_parts:
            return (torch.zeros(self.m, 1, dtype=torch.long, device=self.device),
                    torch.zeros(self.m, 1, dtype=torch.bool, device=self.device))
        if len(idx_parts) == 1:  # one rate: positions ascend, so the valid entries are already a sorted prefix
            key, ok = idx_parts[0], ok_parts[0]
        else:
            idx = torch.cat(idx_parts, 1)
            ok = torch.cat(ok_parts, 1)
            key = torch.where(ok, idx, torch.full_like(idx, self.n))  # valid first, ascending
            key, order = key.sort(dim=1)
            ok = torch.gather(ok, 1, order)
        length = max(int(ok.sum(1).max()), 1)
        idx = torch.where(ok[:, :length], key[:, :length], torch.zeros_like(key[:, :length]))
        return idx, ok[:, :length]

    def _gaps(self, gen, draws, log1mq):
        u = 1.0 - torch.rand((self.m, draws), generator=gen, device=self.device, dtype=torch.float64)  # (0, 1]
        return torch.floor(torch.log(u) / log1mq).long() + 1


# --------------------------------------------------------------------------------------------
# The stacked models
# --------------------------------------------------------------------------------------------

def _linear_stack(model: nn.Module):
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


@dataclass
class StepWork:
    """One step's per-sample quantities of M models: losses, gradient norms and the sum."""

    losses: torch.Tensor  # (M, L)
    norms: torch.Tensor  # (M, L)
    _finish: object

    def weighted_sum(self, coef: torch.Tensor) -> dict:
        """Σ_i coef[m, i] · g_{m,i} per model: {param name: (M, *shape)}."""
        return self._finish(coef)


class Ensemble:
    """M models of one architecture, parameters stacked along a leading model axis.

    Model m is initialised exactly like ``engine.train.prepare`` initialises a run with
    ``seed = init_seeds[m]`` (``torch.manual_seed(seed)`` then ``build_model``).
    """

    def __init__(self, model_cfg, input_shape, num_classes: int, init_seeds, device, *, fast: bool = True):
        self.device = torch.device(device)
        self.input_shape = tuple(input_shape)
        self.num_classes = int(num_classes)
        models = []
        for s in init_seeds:
            # = torch.manual_seed(s) for the CPU initialisation, without re-seeding every accelerator
            # (which costs ~0.6 ms a call in Python stack formatting)
            torch.random.default_generator.manual_seed(int(s))
            models.append(build_model(model_cfg, self.input_shape, num_classes))
        self.m = len(models)
        params, buffers = stack_module_state(models)
        self.params = {k: v.detach().to(self.device) for k, v in params.items()}
        self.buffers = {k: v.detach().to(self.device) for k, v in buffers.items()}
        self.base = copy.deepcopy(models[0]).to("meta")
        self.layers = _linear_stack(models[0]) if fast else None
        self.sequential = False  # set when vmap over models is not possible
        self._ps = None

    @property
    def fast(self) -> bool:
        return self.layers is not None

    def param_count(self) -> int:
        return sum(int(v[0].numel()) for v in self.params.values())

    # --- per-sample gradients ---------------------------------------------------------------
    def per_sample(self, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor) -> StepWork:
        flat = idx.reshape(-1)
        xb = x.index_select(0, flat).reshape(idx.shape + x.shape[1:])  # (M, L, ...)
        yb = y.index_select(0, flat).reshape(idx.shape)
        if self.fast:
            return self._per_sample_linear(xb, yb, self._input_sqnorms(x)[idx])
        return self._per_sample_generic(xb, yb)

    def _input_sqnorms(self, x: torch.Tensor) -> torch.Tensor:
        """‖x_i‖² of every sample of ``x``, computed once per dataset tensor (saves one pass per step)."""
        key = (x.data_ptr(), tuple(x.shape))
        if getattr(self, "_sq_key", None) != key:
            self._sq_key = key
            self._sq = (x.reshape(len(x), -1).double() ** 2).sum(-1).to(x.dtype)
        return self._sq

    def _per_sample_linear(self, xb, yb, x_sqnorms) -> StepWork:
        """Exact per-sample losses, gradient norms and clipped sums of a Linear/Tanh stack.

        Feature-major layout: activations are (M, features, L), so the softmax over the few
        classes and every per-sample reduction run over contiguous rows of length L.
        """
        m, length = yb.shape
        xt = xb.reshape(m, length, -1)  # (M, L, D): inputs, sample-major (the weight-gradient matmul uses it as is)
        acts = [xt.transpose(1, 2)]  # (M, D, L)
        last = len(self.layers) - 1
        for j, (wn, bn) in enumerate(self.layers):
            z = torch.baddbmm(self.params[bn].unsqueeze(2), self.params[wn], acts[j])  # (M, out, L)
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
        deltas = [None] * len(self.layers)
        deltas[last] = delta
        for j in range(last, 0, -1):
            d = torch.bmm(self.params[self.layers[j][0]].transpose(1, 2), deltas[j])  # (M, in, L)
            deltas[j - 1] = d * (1.0 - acts[j] * acts[j])
        act_sq = [x_sqnorms] + [(a * a).sum(1) for a in acts[1:]]
        sq = sum((d * d).sum(1) * (a2 + 1.0) for d, a2 in zip(deltas, act_sq))
        norms = torch.sqrt(sq)

        def finish(coef):
            out = {}
            for j, ((wn, bn), d) in enumerate(zip(self.layers, deltas)):
                dc = d * coef.unsqueeze(1)  # (M, out, L)
                out[wn] = torch.bmm(dc, xt if j == 0 else acts[j].transpose(1, 2))
                out[bn] = dc.sum(2)
            return out

        return StepWork(losses.detach(), norms.detach(), finish)

    def _single_fn(self):
        if self._ps is None:
            base = self.base

            def loss_one(p, b, xi, yi):
                out = functional_call(base, (p, b), (xi.unsqueeze(0),))
                loss = F.cross_entropy(out, yi.unsqueeze(0))
                return loss, loss.detach()

            self._ps = vmap(grad(loss_one, has_aux=True), in_dims=(None, None, 0, 0))
        return self._ps

    def _per_sample_generic(self, xb, yb) -> StepWork:
        ps = self._single_fn()
        grads = losses = None
        if not self.sequential:
            try:
                grads, losses = vmap(ps, in_dims=(0, 0, 0, 0))(self.params, self.buffers, xb, yb)
            except (RuntimeError, NotImplementedError, ValueError):
                self.sequential = True  # fall back to a loop over the models of the chunk
        if self.sequential:
            per = [ps({k: v[i] for k, v in self.params.items()}, {k: v[i] for k, v in self.buffers.items()},
                      xb[i], yb[i]) for i in range(self.m)]
            grads = {k: torch.stack([g[k] for g, _ in per]) for k in self.params}
            losses = torch.stack([l for _, l in per])
        m, length = yb.shape
        norms = torch.sqrt(sum((g.reshape(m, length, -1) ** 2).sum(-1) for g in grads.values()))

        def finish(coef):
            return {k: torch.einsum("ml,ml...->m...", coef, g) for k, g in grads.items()}

        return StepWork(losses.detach(), norms.detach(), finish)

    # --- evaluation -------------------------------------------------------------------------
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(M, n, classes) logits of every model on the same inputs (x: (n, ...))."""
        if self.fast:
            wn, bn = self.layers[0]
            w = self.params[wn]  # (M, out, in): the first layer of all models as one GEMM on the shared inputs
            h = (x.reshape(len(x), -1) @ w.reshape(-1, w.shape[-1]).T).reshape(len(x), self.m, -1).transpose(0, 1)
            h = h + self.params[bn].unsqueeze(1)
            for wn, bn in self.layers[1:]:
                h = torch.tanh(h)
                h = torch.baddbmm(self.params[bn].unsqueeze(1), h, self.params[wn].transpose(1, 2))
            return h
        fwd = lambda p, b, xx: functional_call(self.base, (p, b), (xx,))  # noqa: E731
        if not self.sequential:
            try:
                return vmap(fwd, in_dims=(0, 0, None))(self.params, self.buffers, x)
            except (RuntimeError, NotImplementedError, ValueError):
                self.sequential = True
        return torch.stack([fwd({k: v[i] for k, v in self.params.items()},
                                {k: v[i] for k, v in self.buffers.items()}, x) for i in range(self.m)])

    @torch.no_grad()
    def score(self, x: torch.Tensor, y: torch.Tensor, *, chunk: int = 4096):
        """Per model and sample: cross-entropy loss and logit-scaled confidence of the true class
        log p_y − log(1 − p_y) = z_y − logsumexp_{j≠y} z_j (stable), both (M, n) float32 numpy,
        and the predictions (M, n) int64 numpy."""
        losses, confs, preds = [], [], []
        for a in range(0, len(y), chunk):
            z = self.logits(x[a:a + chunk]).float().transpose(1, 2).contiguous()  # (M, C, n): class-major
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


# --------------------------------------------------------------------------------------------
# The batched training loop (engine.train's loop, one row per model)
# --------------------------------------------------------------------------------------------

def train_ensemble(ens: Ensemble, x: torch.Tensor, y: torch.Tensor, sampler: PoissonSampler,
                   mechanism: BatchedMechanism, *, steps: int, lr: float, expected_batch, gen: torch.Generator,
                   should_stop=None, on_step=None) -> None:
    """Train all models of ``ens`` for ``steps`` steps of noisy clipped SGD (in place).

    Per step and model m: Poisson batch (``sampler``), per-sample losses ℓ and gradient norms,
    C_i and ρ_i from ``mechanism``, Σ ρ_i g_i min(1, C_i/‖g_i‖) + N(0, std_m² I), divided by
    ``expected_batch[m]``, then θ_m ← θ_m − lr · that. Non-private: the plain gradient of the
    summed batch loss over the expected batch size, no noise.
    """
    device = ens.device
    denom = torch.as_tensor(np.asarray(expected_batch, dtype=np.float32), device=device)
    for step in range(1, steps + 1):
        if should_stop is not None and should_stop():
            raise Cancelled(f"stopped at step {step - 1} of {steps}")
        idx, mask = sampler.sample(gen)
        work = ens.per_sample(x, y, idx, mask)
        maskf = mask.to(work.losses.dtype)
        if not mechanism.private:
            summed = work.weighted_sum(maskf)
        else:
            clip = mechanism.clip_norms(idx)
            rho = mechanism.weights(work.losses, clip, mask)
            coef = torch.clamp(clip / torch.clamp(work.norms, min=1e-12), max=1.0) * maskf
            if rho is not None:
                coef = coef * rho
            summed = work.weighted_sum(coef)
            std = mechanism.noise_std()  # before observe(): this step's clip norms set the sensitivity
            for k, s in summed.items():
                noise = torch.randn(s.shape, generator=gen, device=device, dtype=s.dtype)
                s.add_(noise * std.reshape((-1,) + (1,) * (s.dim() - 1)))
            mechanism.observe(idx, work.norms, mask, gen)
        for k, s in summed.items():
            ens.params[k].sub_(lr * s / denom.reshape((-1,) + (1,) * (s.dim() - 1)))
        if on_step is not None:
            on_step(step)


# --------------------------------------------------------------------------------------------
# Memory planning
# --------------------------------------------------------------------------------------------

def per_model_step_bytes(model_cfg, input_shape, num_classes: int, batch: float, *, fast: bool | None = None) -> int:
    """Rough upper estimate of one model's working set in one training step (bytes)."""
    model = build_model(model_cfg, tuple(input_shape), num_classes)
    features = int(math.prod(input_shape))
    params = sum(p.numel() for p in model.parameters())
    is_fast = _linear_stack(model) is not None if fast is None else fast
    if is_fast:
        widths = [features] + [m.out_features for m in model.modules() if isinstance(m, nn.Linear)]
        per_sample = features + 4 * sum(widths)
    else:
        acts = _activation_elems(model, input_shape)
        per_sample = features + 3 * params + 6 * acts  # materialised per-sample grads + vmap(grad) intermediates
    return int(4 * (per_sample * batch + 4 * params) + 4096)


def _activation_elems(model, input_shape) -> int:
    total = 0

    def hook(_m, _i, out):
        nonlocal total
        if isinstance(out, torch.Tensor):
            total += out.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    with torch.no_grad():
        model(torch.zeros((1,) + tuple(input_shape)))
    for h in handles:
        h.remove()
    return total


CACHE_TARGET_BYTES = 32 << 20  # a step's working set that stays in cache: ~1.7× faster per model than 400 at once


def models_per_chunk(model_cfg, input_shape, num_classes: int, batch: float, *,
                     budget_bytes: int = DEFAULT_BUDGET_BYTES, cap: int = 512,
                     cache_bytes: int | None = CACHE_TARGET_BYTES, min_models: int = 8) -> int:
    """How many models one chunk trains at once: as many as keep one step's tensors within
    ``cache_bytes`` (gather → forward → backward then reuse cached data; measured on Adult LR:
    9 ms/model in chunks of 50–100 vs 15 ms/model with 400 at once), at least ``min_models``,
    never more than ``budget_bytes`` allows (the hard memory bound) nor ``cap``. ``cache_bytes=None``
    (GPUs: per-step launch overhead dominates there) fills the budget."""
    max_batch = batch + 6 * math.sqrt(batch) + 16  # Poisson batches: the largest of the step
    per = max(per_model_step_bytes(model_cfg, input_shape, num_classes, max_batch), 1)
    hard = max(1, budget_bytes // per)
    want = hard if cache_bytes is None else max(min_models, cache_bytes // per)
    return int(max(1, min(cap, hard, want)))


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
