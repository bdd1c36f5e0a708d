"""How each algorithm chooses per-sample clip norms C_i, weights ρ_i and the noise — the only
mechanism family, batched over a model axis M (a dashboard run is M = 1, an audit chunk M models).

The step (``engine.step.dp_step``) is shared; an algorithm is a small strategy object whose hooks
take and return torch tensors on the run's device, one row per model:

* :class:`Clipped` — DP-SGD and IDP-SGD: C_i from the plan (per tier), ρ_i = 1.
* :class:`Importance` — INO-SGD: same C_i, ρ_i from ``engine.importance.ino_weights`` per row.
* :class:`GroupAdaptive` — DP-SGD-S: C_i = C_k of the sample's group, tracked from a
  (private) quantile of the group's gradient norms; noise scales with max_k C_k.
* :class:`NonPrivate` — the reference: no clipping, no noise.

Hooks: ``clip_norms(idx (M, L)) → (M, L)``, ``weights(losses, clip, mask) → (M, L) or None``
(None: ρ ≡ 1), ``noise_std() → (M,)``, ``observe(idx, norms, mask, gen)`` — called after EVERY
step, an empty Poisson batch included — and ``state()``. :func:`build_mechanism` is the one
factory; the privacy preparation (``engine.prepare.prepare_privacy``) gives it its inputs.

Invariant every private mechanism keeps: adding one sample z changes Σ ρ_i clip(g_i, C_i)
by at most C_z, and the noise std is noise_multiplier × (the largest C any sample can get).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from engine.importance import ino_weights, make_tif


class Mechanism:
    private = True
    formal_dp = True

    def __init__(self, n_models: int, device):
        self.n_models = int(n_models)
        self.device = torch.device(device)

    def clip_norms(self, idx: torch.Tensor) -> torch.Tensor:
        """(M, L) clip norm C_i of each batch entry (float64)."""
        raise NotImplementedError

    def weights(self, losses: torch.Tensor, clip: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        """(M, L) ρ, or None for ρ ≡ 1."""
        return None

    def noise_std(self) -> torch.Tensor:
        """(M,) std of the Gaussian noise added to each model's clipped sum (float64)."""
        raise NotImplementedError

    def observe(self, idx: torch.Tensor, norms: torch.Tensor, mask: torch.Tensor, gen: torch.Generator) -> None:
        """Called after every step (empty batches too) with the unclipped per-sample gradient norms."""

    def state(self) -> dict:
        return {}


class NonPrivate(Mechanism):
    private = False
    formal_dp = False

    def clip_norms(self, idx):
        return torch.full(idx.shape, math.inf, dtype=torch.float64, device=idx.device)

    def noise_std(self):
        return torch.zeros(self.n_models, dtype=torch.float64, device=self.device)


class Clipped(Mechanism):
    """DP-SGD / IDP-SGD: per-sample (per-tier) clip norms and one noise std, both from the plan."""

    def __init__(self, *, sample_clip_norms, noise_std: float, n_models: int = 1, device="cpu"):
        super().__init__(n_models, device)
        self._clip = torch.as_tensor(np.asarray(sample_clip_norms, dtype=np.float64), device=self.device)
        self._std = torch.full((self.n_models,), float(noise_std), dtype=torch.float64, device=self.device)

    def clip_norms(self, idx):
        return self._clip[idx]

    def noise_std(self):
        return self._std


class Importance(Clipped):
    """INO-SGD: sort by loss, weight each clipped gradient by the BIF average over its mass
    (float64 on the CPU, one row per model; ``tail_length`` γ for all models or one per model)."""

    def __init__(self, *, sample_clip_norms, noise_std, tail_length, tif, n_models: int = 1, device="cpu"):
        super().__init__(sample_clip_norms=sample_clip_norms, noise_std=noise_std, n_models=n_models, device=device)
        self.tail_length = np.broadcast_to(np.asarray(tail_length, dtype=float), (self.n_models,)).copy()
        self.tif = tif

    def weights(self, losses, clip, mask):
        rho = ino_weights(losses.detach().cpu().numpy(), clip.detach().cpu().numpy(), mask.cpu().numpy(),
                          self.tif, self.tail_length)
        return torch.as_tensor(rho, dtype=losses.dtype, device=losses.device)


class GroupAdaptive(Mechanism):
    """DP-SGD-S: group k's clip C_k = max(τ · S̄_k, C_min), S̄_k an EMA of a tracked quantile,
    one (S_k, S̄_k) state per model.

    Private mode (default) tracks the quantile as Andrew et al. (2021): each step releases,
    per model and group, Σ_i (1[‖g_i‖ ≤ S_k] − ½) + N(0, σ_b²) (every sample is in one group, so
    the vector has L2 sensitivity ½) — also on an empty batch —, estimates the clipped fraction
    b̃_k by dividing by the model's expected group batch Σ_{i∈k} q_i, and updates
    S_k ← S_k · exp(−η (b̃_k − quantile)). The gradient noise multiplier is raised to z_Δ so both
    releases together cost what z alone would. Non-private mode replaces the release by the exact
    batch quantile (numpy's linear interpolation; unchanged on an empty group): no formal guarantee.
    """

    def __init__(self, *, groups, n_groups: int, noise_multiplier: float, expected_group_batch, initial: float,
                 tau: float, quantile: float, ema: float, min_clip: float, private: bool, quantile_lr: float,
                 count_noise_std: float, device="cpu"):
        exp = np.maximum(np.atleast_2d(np.asarray(expected_group_batch, dtype=np.float64)), 1e-12)  # (M, K)
        super().__init__(exp.shape[0], device)
        self.groups = torch.as_tensor(np.asarray(groups, dtype=np.int64), device=self.device)
        self.k = int(n_groups)
        self.expected = torch.as_tensor(exp, dtype=torch.float64, device=self.device)
        self.estimate = torch.full((self.n_models, self.k), float(initial), dtype=torch.float64, device=self.device)
        self.smoothed = self.estimate.clone()  # S̄_k
        self.noise_multiplier = float(noise_multiplier)
        self.tau, self.quantile, self.ema, self.min_clip = tau, quantile, ema, min_clip
        self.formal_dp = bool(private)  # the gradient release is always private; formal_dp says if the whole run is
        self.quantile_lr, self.count_noise_std = quantile_lr, count_noise_std

    def group_clips(self) -> torch.Tensor:
        """(M, K) current clip norm of each group."""
        return torch.clamp(self.tau * self.smoothed, min=self.min_clip)

    def clip_norms(self, idx):
        return torch.gather(self.group_clips(), 1, self.groups[idx])

    def noise_std(self):
        return self.noise_multiplier * self.group_clips().max(dim=1).values

    def observe(self, idx, norms, mask, gen):
        g = self.groups[idx]  # (M, L)
        norms = norms.to(torch.float64)
        if self.formal_dp:
            below = ((norms <= torch.gather(self.estimate, 1, g)).to(torch.float64) - 0.5) * mask
            counts = torch.zeros_like(self.estimate).scatter_add_(1, g, below)
            noise = torch.randn(self.estimate.shape, generator=gen, device=self.device, dtype=torch.float64)
            frac = (counts + self.count_noise_std * noise) / self.expected + 0.5
            self.estimate = self.estimate * torch.exp(-self.quantile_lr * (frac - self.quantile))
        else:
            for j in range(self.k):
                sel = mask & (g == j)
                vals = torch.where(sel, norms, torch.full_like(norms, math.inf)).sort(dim=1).values
                cnt = sel.sum(1)
                pos = self.quantile * (cnt - 1).clamp(min=0).to(torch.float64)  # numpy's linear quantile
                lo, hi = pos.floor().long(), pos.ceil().long()
                vlo, vhi = vals.gather(1, lo[:, None])[:, 0], vals.gather(1, hi[:, None])[:, 0]
                q = vlo + (vhi - vlo) * (pos - lo)
                self.estimate[:, j] = torch.where(cnt > 0, q, self.estimate[:, j])
        self.smoothed = self.ema * self.smoothed + (1 - self.ema) * self.estimate

    def state(self):
        return {"group_clip_norms": self.group_clips().mean(0).tolist()}


def build_tif(algo):
    return make_tif(algo.tif, alpha=algo.alpha, beta=algo.beta, power=algo.power, cut=algo.step_cut, knots=algo.knots)


def default_count_noise_std(expected_batch: float) -> float:
    # Andrew et al. (2021) use σ_b = expected batch / 20.
    return max(expected_batch / 20.0, 1.0)


def build_mechanism(*, privacy, members, device) -> Mechanism:
    """The mechanism of ``privacy`` (an ``engine.prepare.PrivacyPlan``) for M models whose training
    sets are the rows of ``members`` ((M, n) bool; a dashboard run: one row, all True)."""
    members = np.atleast_2d(np.asarray(members, dtype=bool))
    m = members.shape[0]
    algo = privacy.algorithm
    if privacy.plan is None:
        return NonPrivate(m, device)
    clips = privacy.sample_clips
    if algo.name in ("dpsgd", "idp_sample", "idp_scale"):
        return Clipped(sample_clip_norms=clips, noise_std=privacy.plan.noise_std, n_models=m, device=device)
    if algo.name == "ino":
        return Importance(sample_clip_norms=clips, noise_std=privacy.plan.noise_std, tail_length=privacy.tail_length,
                          tif=build_tif(algo), n_models=m, device=device)
    if algo.name == "dpsgd_s":
        s = privacy.dpsgd_s
        k = len(s.group_names)
        onehot = np.zeros((len(s.groups), k))
        onehot[np.arange(len(s.groups)), s.groups] = 1.0
        expected_groups = (members * privacy.sample_rates[None, :]) @ onehot  # (M, K) Σ q_i over members of group k
        return GroupAdaptive(groups=s.groups, n_groups=k, noise_multiplier=s.noise_multiplier,
                             expected_group_batch=expected_groups, initial=s.initial_clip, tau=algo.tau,
                             quantile=algo.quantile, ema=algo.ema, min_clip=algo.min_clip,
                             private=algo.private_quantile, quantile_lr=algo.quantile_lr,
                             count_noise_std=s.count_noise_std, device=device)
    raise ValueError(f"no mechanism for algorithm {algo.name!r}")
