"""White-box gradient canaries ("Dirac" canaries, Steinke, Nasr & Jagielski 2023 §6) inside the one private step.

A canary is one more sample of the step's index space — the sampler draws it with its tier's rate q_k, the
mechanism gives it its tier's clip C_k (and INO-SGD its weight, DP-SGD-S its group's clip) — whose per-sample
gradient is not computed from an input but fixed: ``norm`` × the unit vector e_c of one coordinate c (a distinct
coordinate per canary). The coordinates are either the model's own parameters (``spare=False``: the canaries also
push the weights) or **spare slots**: one more gradient entry, :data:`SPARE`, of m coordinates that no input
reaches. ``dp_step`` noises it like every parameter (it noises every entry of the sums), so the release is the
same mechanism, one coordinate per canary wider; but no other sample's gradient adds to a canary's coordinate, so
the auditor's score holds the canary and the noise only: on MNIST it reaches what a perfect attack on the run's
mechanism reaches (bench/one_run_audit.py, its mechanism ceiling). :class:`GradientCanaries` wraps the step's ``models`` (anything ``engine.dp.step.dp_step``
accepts) so that ``dp_step`` itself does not change:

    index space   [0, n_inputs)         ordinary samples (the training set, then any input canaries)
                  [n_inputs, n_inputs+m) gradient canaries, canary j at n_inputs + j
    per_sample    the wrapped models' per-sample work on the ordinary entries (canary entries masked out), with
                  the canaries' norms (``norm_j``) and losses laid into their slots; weighted_sum(coef) adds
                  coef_j · norm_j · e_{c_j} for every canary entry — exactly what its clipped, weighted gradient is
    loss_grads    (non-private reference) the summed-loss gradient plus norm_j · e_{c_j} per canary entry

A canary's loss is the batch's highest ordinary loss + 1, so it ranks last (highest) in INO-SGD's sort: its
weight is as large as any sample's can be (the worst case an adversary can craft); the sensitivity bound of every
mechanism holds whatever the losses are. The auditor's score of canary j is Σ_t (noisy update_t)[c_j]
(:meth:`GradientCanaries.observe_update`): the coordinate the canary would push, summed over the run.
"""
from __future__ import annotations

import numpy as np
import torch

from engine.dp.grad_sample import PerSampleGrads

SPARE = "audit_canary_slots"  # the spare slots' entry in the step's gradients; not a parameter of any model


class GradientCanaries:
    """``models`` with m gradient canaries at indices ``n_inputs + j``; see the module docstring.

    ``coords`` (m,): each canary's flat coordinate into the parameters in ``param_shapes`` order (one model's
    shapes, without the model axis), or with ``spare`` its slot in :data:`SPARE` (which then has ``max(coords)+1``
    slots); ``norms`` (m,): each canary's gradient norm (at least its tier's clip, so clipping leaves it at
    exactly C_k). The caller takes :data:`SPARE` out of the step's gradients before the optimizer sees them."""

    def __init__(self, models, *, n_inputs: int, coords, norms, param_shapes: dict, device, spare: bool = False):
        self.models = models
        self.n_inputs = int(n_inputs)
        self.spare = bool(spare)
        coords = np.asarray(coords, dtype=np.int64)
        if self.spare:
            self._spare_size = int(coords.max(initial=-1)) + 1
            param_shapes = {SPARE: (self._spare_size,)}
        sizes = [int(np.prod(s)) for s in param_shapes.values()]
        if len(np.unique(coords)) != len(coords) or coords.min(initial=0) < 0 or coords.max(initial=-1) >= sum(sizes):
            raise ValueError(f"canary coordinates must be distinct and in [0, {sum(sizes)})")
        self.m = len(coords)
        self.device = torch.device(device)
        self.norms = torch.as_tensor(np.asarray(norms, dtype=np.float64), device=self.device)
        # per parameter: (its name, the canaries in it, their offsets inside it)
        offsets = np.cumsum([0] + sizes)
        self._by_param = []
        for k, name in enumerate(param_shapes):
            sel = np.flatnonzero((coords >= offsets[k]) & (coords < offsets[k + 1]))
            if len(sel):
                self._by_param.append((name, torch.as_tensor(sel, device=self.device),
                                       torch.as_tensor(coords[sel] - offsets[k], device=self.device)))
        self.scores = None  # (M, m): Σ over steps of the noisy update at each canary's coordinate

    # --- what dp_step calls ---------------------------------------------------------------------
    def per_sample(self, x, y, idx, mask) -> PerSampleGrads:
        if self.m == 0:  # input canaries only: every index is an ordinary sample
            return self.models.per_sample(x, y, idx, mask)
        canary, plain_idx, plain_mask = self._split(idx, mask)
        work = self.models.per_sample(x, y, plain_idx, plain_mask)
        on = canary & mask
        j = (idx - self.n_inputs).clamp(min=0, max=max(self.m - 1, 0))
        norms = torch.where(on, self.norms[j].to(work.norms.dtype), work.norms)
        losses = _canary_losses(work.losses, plain_mask, on)

        def weighted_sum(coef):
            sums = work.weighted_sum(coef * plain_mask)
            return self._add_canaries(sums, coef * on, j)

        return PerSampleGrads(losses, norms, weighted_sum)

    def loss_grads(self, x, y, idx, mask):
        if self.m == 0:
            return self.models.loss_grads(x, y, idx, mask)
        canary, plain_idx, plain_mask = self._split(idx, mask)
        sums, losses = self.models.loss_grads(x, y, plain_idx, plain_mask)
        on = canary & mask
        j = (idx - self.n_inputs).clamp(min=0, max=max(self.m - 1, 0))
        losses = _canary_losses(losses, plain_mask, on)
        return self._add_canaries(sums, on.to(self.norms.dtype), j), losses

    # --- the auditor's view ---------------------------------------------------------------------
    def observe_update(self, grads: dict, scale, *, noise_std=None, rates=None, clips=None) -> None:
        """The auditor's view of one step: x_j = the noisy sum at canary j's coordinate (``StepResult.grads``,
        {name: (M, *shape)}, times ``scale`` (M,), the step's divisor). Two scores accumulate:

        * ``scores``: Σ_t x_j — the coordinate the canary pushes, summed over the run;
        * ``likelihood``: Σ_t log(1 − q_j + q_j·exp((a·x_j − a²/2)/s²)), the log likelihood ratio of "canary j
          is in" for a Poisson-subsampled Gaussian step (rate q_j = ``rates``, contribution a = its clip
          ``clips`` (M, m), noise std s = ``noise_std`` (M,)): the most powerful test of one step (Neyman–Pearson),
          given when the step is noised (s > 0)."""
        any_grad = next(iter(grads.values()))
        n_models = any_grad.shape[0]
        if self.scores is None:
            self.scores = torch.zeros((n_models, self.m), dtype=torch.float64, device=self.device)
            self.likelihood = torch.zeros_like(self.scores)
        scale = torch.as_tensor(scale, dtype=torch.float64, device=self.device).reshape(-1, 1)
        x = torch.zeros_like(self.scores)
        for name, which, local in self._by_param:
            x[:, which] = grads[name].reshape(n_models, -1)[:, local].to(torch.float64)
        x = x * scale
        self.scores += x
        if noise_std is not None and rates is not None and clips is not None:
            s = torch.as_tensor(noise_std, dtype=torch.float64, device=self.device).reshape(-1, 1)
            if bool((s > 0).all()):
                q = torch.as_tensor(rates, dtype=torch.float64, device=self.device).reshape(1, -1)
                a = torch.as_tensor(clips, dtype=torch.float64, device=self.device)
                z = (a * x - a * a / 2) / (s * s)
                self.likelihood += torch.logaddexp(torch.log1p(-q.clamp(max=1 - 1e-12)), torch.log(q) + z)

    # --- helpers --------------------------------------------------------------------------------
    def _split(self, idx, mask):
        canary = idx >= self.n_inputs
        plain_mask = mask & ~canary
        return canary, torch.where(canary, torch.zeros_like(idx), idx), plain_mask

    def _add_canaries(self, sums: dict, coef: torch.Tensor, j: torch.Tensor) -> dict:
        """sums + Σ_entries coef · norm_j · e_{c_j}: each canary's weighted contribution scattered into its
        coordinate (coef is 0 on every entry that is not a canary)."""
        if self.m == 0:
            return sums
        n_models = coef.shape[0]
        if self.spare:  # the slots start at zero: no input's gradient reaches them
            like = next(iter(sums.values()))
            sums = {**sums, SPARE: torch.zeros((n_models, self._spare_size), dtype=like.dtype,
                                              device=like.device)}
        per_canary = torch.zeros((n_models, self.m), dtype=torch.float64, device=self.device)
        per_canary.scatter_add_(1, j, coef.to(torch.float64) * self.norms[j])
        out = dict(sums)
        for name, which, local in self._by_param:
            s = out[name]
            flat = s.reshape(n_models, -1).clone()
            flat[:, local] += per_canary[:, which].to(s.dtype)
            out[name] = flat.reshape(s.shape)
        return out


def _canary_losses(losses: torch.Tensor, plain_mask: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """``losses`` with every canary entry (``on``) at its row's highest ordinary loss + 1 (1 in a row without one)."""
    top = torch.where(plain_mask, losses, torch.full_like(losses, -torch.inf)).amax(1, keepdim=True)
    return torch.where(on, torch.where(torch.isfinite(top), top, torch.zeros_like(top)) + 1.0, losses)
