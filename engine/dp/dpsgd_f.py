"""DPSGD-F (Xu, Du & Wu 2021): a group's clip grows with its share of clipped gradients, read from counts that
every step releases with noise.

    per step, per model, on its Poisson batch B (groups: the config's ``group_by``, engine.dp.groups):
        m_k, o_k ← #{i ∈ B_k: ‖g_i‖ > C₀},  #{i ∈ B_k: ‖g_i‖ ≤ C₀}       one sample moves one of the 2K entries by 1:
        m̃_k, õ_k ← max(0, m_k + N(0, σ₁²)),  max(0, o_k + N(0, σ₁²))     L2 sensitivity Δ_b = 1
        r_k ← m̃_k / (m̃_k + õ_k)     (1 when both are 0: a group with no count is taken as all clipped)
        C_k ← C₀ · (1 + r_k / mean_j r_j)     (C₀ for every group when none clips; always in [C₀, (1 + K) C₀])
        Σ_i clip(g_i, C_{k(i)}) + N(0, (z_g · max_k C_k)² I)
    z_g = (z^-2 − σ₁^-2)^(-1/2), z DP-SGD's noise multiplier at the same ε: the counts and the gradient sum of a
    step together cost one subsampled Gaussian step of multiplier z (accounting.adaptive_clipping_noise_multiplier
    with Δ_b = 1), so the planned ε holds as planned.

The clips of a step come from that step's released counts, as in the paper: the gradient release adapts to
them (an adaptive composition on one batch). Given the released counts the clips are fixed, and adding one
sample moves the clipped sum by at most its group's C_k ≤ max_k C_k, the scale of the noise. The counts'
noise is drawn from the mechanism's own stream (``Mechanism.count_generator``), so a DPSGD-F run shares its
batches and gradient noise with the DP-SGD run of the same seed.

Compared with the reference codes (layer6ai-labs/fair-dp, ruayz/fair-privacy; read, not copied): they account the
counts as a separate subsampled Gaussian step of multiplier σ₁ (a looser bound than the joint step here) and
round the noisy counts down to integers (here they are only floored at 0).
"""
from __future__ import annotations

import numpy as np
import torch

from engine.config.run import RunConfig
from engine.dp import accounting
from engine.dp.accounting import plan_errors
from engine.dp.groups import GroupClipSetup, sample_groups
from engine.dp.mechanisms import COUNT_NOISE_PER_Z, Mechanism

COUNT_SENSITIVITY = 1.0  # L2 sensitivity of the released (m_k, o_k) vector under adding or removing one sample


def default_counts_noise_std(noise_multiplier: float) -> float:
    """σ₁ when the config leaves ``count_noise_std`` unset: the smallest σ₁ at which the counts cost at most 5 %
    more gradient noise (z_g ≤ 1.05 z: σ₁ = 2 Δ_b · 1.64 z, the floor DP-SGD-S's σ_b has at Δ_b = ½), and at
    least 1."""
    return max(2.0 * COUNT_SENSITIVITY * COUNT_NOISE_PER_Z * float(noise_multiplier), 1.0)


def clipping_bias_setup(config: RunConfig, data, plan, *, tier_sizes, group_attribute=None, field: str = "algorithm"):
    """DPSGD-F's set-up before step 1 (its registry entry's ``setup``): its groups, σ₁ and z_g; the plan is
    DP-SGD's at the same ε and is kept (the counts are paid for by raising the gradient noise, not ε)."""
    algo = config.algorithm
    groups, names, _ = sample_groups(algo.group_by, data.dataset, data.tiers, attribute=group_attribute,
                                     field=f"{field}.group_by")
    z = float(plan.noise_multiplier)
    sigma_1 = float(algo.count_noise_std or default_counts_noise_std(z))
    with plan_errors(f"{field}.count_noise_std"):
        z_g = accounting.adaptive_clipping_noise_multiplier(noise_multiplier=z, count_noise_std=sigma_1,
                                                            count_sensitivity=COUNT_SENSITIVITY)
    k = len(names)
    return plan, GroupClipSetup(groups=groups, group_names=names, noise_multiplier=float(z_g), count_noise_std=sigma_1,
                                initial_clip=float(config.clip_norm), base_clip=float(config.clip_norm),
                                group_sizes=np.zeros(0), group_size_source=None, group_size_noise_std=None,
                                expected_group_batch=np.zeros(0), dpsgd_noise_multiplier=z, clip_rule="bias",
                                c_min=1.0, c_max=float(1 + k))


class ClippingBias(Mechanism):
    """DPSGD-F's step for M models (module docstring): group clips from this batch's noisy clipped counts."""

    def __init__(self, *, groups, n_groups: int, base_clip: float, noise_multiplier: float, count_noise_std: float,
                 n_models: int = 1, device="cpu"):
        super().__init__(n_models, device)
        self.groups = torch.as_tensor(np.asarray(groups, dtype=np.int64), device=self.device)
        self.k = int(n_groups)
        self.base_clip, self.noise_multiplier = float(base_clip), float(noise_multiplier)
        self.count_noise_std = float(count_noise_std)
        if not (self.count_noise_std > 0 and self.noise_multiplier > 0 and self.base_clip > 0):
            raise ValueError("DPSGD-F needs a positive base clip, noise multiplier and count noise")
        # before the first batch (and for a caller that skips see_batch) every group has the clip C₀
        self._clips = torch.full((self.n_models, self.k), self.base_clip, dtype=torch.float64, device=self.device)
        self.released = None  # (M, 2K) the last released noisy counts (m̃ then õ, before the floor at 0)

    @classmethod
    def from_privacy(cls, privacy, *, n_models: int, device, sample_tiers=None) -> "ClippingBias":
        s = privacy.clip_setup
        return cls(groups=s.groups, n_groups=len(s.group_names), base_clip=s.base_clip,
                   noise_multiplier=s.noise_multiplier, count_noise_std=s.count_noise_std, n_models=n_models,
                   device=device)

    def counts(self, idx: torch.Tensor, norms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(M, 2K) the exact counts of each model's batch: group k's gradients longer than C₀ (m_k), then those
        within it (o_k). Every valid entry adds 1 to exactly one of them: the vector's L2 sensitivity is 1."""
        g = self.groups[idx]
        over = (norms.to(torch.float64) > self.base_clip)
        slot = torch.where(over, g, g + self.k)
        return torch.zeros((self.n_models, 2 * self.k), dtype=torch.float64, device=self.device).scatter_add_(
            1, slot, mask.to(torch.float64))

    def clips_from_counts(self, released: torch.Tensor) -> torch.Tensor:
        """(M, K) C_k = C₀ (1 + r_k / mean_j r_j) from released counts (M, 2K): post-processing only."""
        m, o = released[:, : self.k].clamp(min=0.0), released[:, self.k:].clamp(min=0.0)
        b = m + o
        r = torch.where(b > 0, m / torch.where(b > 0, b, torch.ones_like(b)), torch.ones_like(b))
        mean = r.mean(dim=1, keepdim=True)
        ratio = torch.where(mean > 0, r / torch.where(mean > 0, mean, torch.ones_like(mean)), torch.zeros_like(r))
        return self.base_clip * (1.0 + ratio)

    def see_batch(self, idx, work, mask, gen):
        # the release: this batch's counts plus N(0, σ₁²) per entry, from the mechanism's own stream
        noise = torch.randn((self.n_models, 2 * self.k), generator=self.count_generator(gen), device=self.device,
                            dtype=torch.float64)
        self.released = self.counts(idx, work.norms, mask) + self.count_noise_std * noise
        self._clips = self.clips_from_counts(self.released)

    def group_clips(self) -> torch.Tensor:
        """(M, K) this step's clip norm of each group."""
        return self._clips

    def clip_norms(self, idx):
        return torch.gather(self._clips, 1, self.groups[idx])

    def noise_std(self):
        return self.noise_multiplier * self._clips.max(dim=1).values

    def state(self):
        return {"group_clip_norms": self._clips.mean(0).tolist(), "noise_std": float(self.noise_std().mean())}

    def model_state(self, model: int) -> dict:
        """``state()`` of model ``model`` of the axis alone (a k-seed run stores one row per model)."""
        clips = self._clips[model]
        return {"group_clip_norms": clips.tolist(), "noise_std": float(self.noise_multiplier * clips.max())}

