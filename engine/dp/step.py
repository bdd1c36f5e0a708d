"""The one private training step, for M models at once (a dashboard run is M = 1).

    dp_step(models, x, y, sampler, mechanism, gen) → StepResult
        idx, mask ← Poisson batch of each model (its own members, per-sample rates q_i)
        non-private: gradient of the summed batch loss (no per-sample work)
        private:     per-sample losses ℓ and gradients g (``models.per_sample``)
                     C, ρ ← mechanism (see_batch, clip_norms, weights);  sum_m = Σ_i ρ_i · g_i · min(1, C_i/‖g_i‖)
                     sum_m += N(0, std_m² I), std_m = mechanism.noise_std() with THIS step's C
                     mechanism.observe(...)      — always, an empty batch included
        grad_m = sum_m / B_m, B_m the expected batch fixed before step 1 (the plan's Σ_k q_k N_k): never a sum
                 over this dataset's members, which would differ between neighbouring datasets

``models`` is anything with ``per_sample(x, y, idx, mask) → engine.dp.grad_sample.PerSampleGrads`` and
``loss_grads(x, y, idx, mask) → ({param: (M, *shape)}, losses (M, L))``: one live module
(``engine.dp.grad_sample.ModuleGrads``) or stacked parameters (``engine.dp.stacked.StackedModels``). The
caller applies the gradients (the dashboard's optimizer, the audit's plain SGD).

:class:`PoissonSampler` draws each model's batch: exact Poisson sampling through geometric gaps,
O(batch) work per model instead of O(n); batches of different sizes are padded to one index
tensor with a mask, and padded entries get coefficient exactly 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


class PoissonSampler:
    """Each model m includes each of its members i independently with probability q_i.

    Members are grouped by their rate (one group per distinct q, i.e. per tier); within a
    group the gaps between selected positions are geometric(q), so a draw costs O(batch)
    random numbers. ``sample`` returns ``idx`` (M, L) sample indices — valid entries first,
    ascending (the engine's batch order) — and ``mask`` (M, L); padded entries hold index 0
    and mask False. L is the largest batch of this step (at least 1).

    ``expected_batch`` ((M,) or one number) is each model's divisor, and must be fixed before training: the
    plan's expected batch (``engine.dp.prepare.PrivacyPlan.expected_batch``), not Σ_{i∈members} q_i. That sum
    changes when one sample is added or removed, which the accounted mechanism (the Poisson-subsampled Gaussian
    under add/remove adjacency, ``engine.dp.accounting``) does not allow for: the step's output would move by
    more than the sample's own clipped contribution. The one-run audit's divisor is the public Σ q_i over the
    training set plus ½ Σ q_j over its canaries, members with probability ½.
    """

    def __init__(self, members: np.ndarray, sample_rates: np.ndarray, device, *, expected_batch):
        members = np.atleast_2d(np.asarray(members, dtype=bool))
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
        self.expected_batch = np.broadcast_to(np.asarray(expected_batch, dtype=np.float64), (self.m,)).copy()
        if not np.all(self.expected_batch > 0):
            raise ValueError(f"expected_batch must be > 0, got {expected_batch!r}")
        self.expected_batch_tensor = torch.as_tensor(self.expected_batch, device=device)

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


@dataclass
class StepResult:
    grads: dict  # {param name: (M, *shape)}: the noisy sum divided by each model's expected batch
    losses: torch.Tensor  # (M, L) per-sample losses (padded entries: undefined)
    idx: torch.Tensor  # (M, L) sample index of each batch entry
    mask: torch.Tensor  # (M, L) valid batch entries

    @property
    def batch_sizes(self) -> torch.Tensor:
        return self.mask.sum(1)

    def mean_losses(self) -> list[float]:
        """Mean training loss of each model's batch (nan for an empty batch)."""
        m = self.mask.to(self.losses.dtype)
        tot = (self.losses * m).sum(1) / m.sum(1)
        return [float(v) for v in tot]


def dp_step(models, x: torch.Tensor, y: torch.Tensor, sampler: PoissonSampler, mechanism,
            gen: torch.Generator) -> StepResult:
    """One step of (noisy, clipped, weighted) SGD gradients for M models; see the module docstring."""
    idx, mask = sampler.sample(gen)
    if not mechanism.private:
        sums, losses = models.loss_grads(x, y, idx, mask)
    else:
        work = models.per_sample(x, y, idx, mask)
        losses, norms = work.losses, work.norms
        mechanism.see_batch(idx, work, mask, gen)
        clip = mechanism.clip_norms(idx)
        rho = mechanism.weights(losses, clip, mask)
        coef = torch.clamp(clip.to(norms.dtype) / torch.clamp(norms, min=1e-12), max=1.0) * mask
        if rho is not None:
            coef = coef * rho
        sums = work.weighted_sum(coef)
        del work  # per-sample gradients live for one batch only
        std = mechanism.noise_std()  # before observe(): this step's clip norms set the sensitivity
        for s in sums.values():  # in place: a stack's sums are M models' worth of parameters
            noise = torch.randn(s.shape, generator=gen, device=s.device, dtype=s.dtype)
            s.add_(noise.mul_(std.to(s.dtype).reshape((-1,) + (1,) * (s.dim() - 1))))
        mechanism.observe(idx, norms, mask, gen)
    denom = sampler.expected_batch_tensor
    # a private step's sums are its own (the noise went in in place): divided in place too; autograd's
    # gradients of the non-private step may be views, so those are divided into new tensors
    divide = torch.Tensor.div_ if mechanism.private else torch.div
    grads = {k: divide(s, denom.to(s.dtype).reshape((-1,) + (1,) * (s.dim() - 1))) for k, s in sums.items()}
    return StepResult(grads=grads, losses=losses, idx=idx, mask=mask)
