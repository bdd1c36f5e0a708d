"""DPSGD-Global-Adapt (Esipova, Ghomi, Luo & Cresswell, ICLR 2023): scale gradients by one global factor instead
of clipping each to its own length, with a threshold Z tracked by a noisy count.

    per step, per model (Z from the steps before; Z' = max(Z, C)):
        ρ ← C / Z'          (one factor for the whole batch)
        Σ_i ρ · clip(g_i, Z')  + N(0, (z_Δ · C)² I)        = Σ_i g_i · C / max(Z', ‖g_i‖): a gradient within Z'
                                                            keeps its direction AND its length relative to the
                                                            others; only those beyond Z' are clipped (to C)
        b ← Σ_i (1[‖g_i‖ ≤ Z] − ½) + N(0, σ_b²)            (Andrew et al. 2021: L2 sensitivity ½)
        Z ← Z · exp(−η (clamp(b / B + ½, 0, 1) − γ))       B the plan's public expected batch, γ the target quantile
    z_Δ = (z^-2 − (2σ_b)^-2)^(-1/2), z DP-SGD's noise multiplier at the same ε: the count and the gradient sum of a
    step together cost one subsampled Gaussian step of multiplier z, so the planned ε holds as planned.

Sensitivity: ρ · ‖clip(g, Z')‖ ≤ (C / Z') · Z' = C for every sample, and ρ is fixed before the batch (from
released counts only), so adding one sample moves the sum by at most C (``contribution_bounds``), the scale of
the noise. Z' ≥ C keeps ρ ≤ 1: with Z below C the step is plain DP-SGD at C (the reference behaves the same way).

Compared with the reference code (layer6ai-labs/fair-dp; read, not copied): it counts the gradients beyond Z,
divides by the realised batch size and moves Z by exp(−η_Z + b̃), so its target fraction and its step size are
one number; here the count is Andrew et al.'s centred count over the public expected batch (the realised size
is not public) with a separate target quantile ``quantile`` and step ``quantile_lr``, and the count is accounted
jointly with the gradient (the reference accounts it as a separate subsampled Gaussian step of its own).
"""
from __future__ import annotations

import numpy as np
import torch

from engine.config.run import RunConfig
from engine.dp import accounting
from engine.dp.accounting import plan_errors
from engine.dp.groups import GroupClipSetup
from engine.dp.mechanisms import Mechanism, default_count_noise_std, tracked_quantile_step

COUNT_SENSITIVITY = 0.5  # the centred count Σ (1[‖g‖ ≤ Z] − ½) moves by ½ when one sample is added or removed


def global_scaling_setup(config: RunConfig, data, plan, *, tier_sizes, group_attribute=None, field: str = "algorithm"):
    """Global-Adapt's set-up before step 1 (its registry entry's ``setup``): σ_b, z_Δ, the initial threshold and the
    public expected batch its count is divided by; the plan is DP-SGD's at the same ε and is kept."""
    algo = config.algorithm
    z = float(plan.noise_multiplier)
    batch = float(plan.expected_batch_size)  # public: the planned tier sizes times the planned rates
    sigma_b = float(algo.count_noise_std or default_count_noise_std(batch, z))
    with plan_errors(f"{field}.count_noise_std"):
        z_delta = accounting.adaptive_clipping_noise_multiplier(noise_multiplier=z, count_noise_std=sigma_b,
                                                                count_sensitivity=COUNT_SENSITIVITY)
    c = float(config.clip_norm)
    return plan, GroupClipSetup(groups=None, group_names=["all"], noise_multiplier=float(z_delta),
                                count_noise_std=sigma_b, initial_clip=float(algo.initial_clip or c), base_clip=c,
                                group_sizes=np.asarray([float(sum(tier_sizes))]), group_size_source="planned",
                                group_size_noise_std=None, expected_group_batch=np.asarray([batch]),
                                dpsgd_noise_multiplier=z, clip_rule="global", c_min=1.0, c_max=None,
                                largest_contribution=c)


class GlobalScaling(Mechanism):
    """Global-Adapt's step for M models (module docstring): one threshold Z per model, tracked privately."""

    _Z_RANGE = (1e-100, 1e100)  # Z is kept in this range so that ρ stays finite under any norms

    def __init__(self, *, base_clip: float, noise_multiplier: float, initial: float, quantile: float,
                 quantile_lr: float, count_noise_std: float, expected_batch: float, n_models: int = 1, device="cpu"):
        super().__init__(n_models, device)
        self.base_clip, self.noise_multiplier = float(base_clip), float(noise_multiplier)
        self.quantile, self.quantile_lr = float(quantile), float(quantile_lr)
        self.count_noise_std, self.expected_batch = float(count_noise_std), float(expected_batch)
        if not (self.base_clip > 0 and self.noise_multiplier > 0 and self.count_noise_std > 0
                and self.expected_batch > 0 and float(initial) > 0):
            raise ValueError("DPSGD-Global-Adapt needs a positive clip, noise, count noise, batch and initial Z")
        self.threshold = torch.full((self.n_models,), float(initial), dtype=torch.float64, device=self.device)  # Z
        self.released = None  # (M,) the last released noisy count

    @classmethod
    def from_privacy(cls, privacy, *, n_models: int, device, sample_tiers=None) -> "GlobalScaling":
        a, s = privacy.algorithm, privacy.clip_setup
        return cls(base_clip=s.base_clip, noise_multiplier=s.noise_multiplier, initial=s.initial_clip,
                   quantile=a.quantile, quantile_lr=a.quantile_lr, count_noise_std=s.count_noise_std,
                   expected_batch=float(s.expected_group_batch[0]), n_models=n_models, device=device)

    def scale_threshold(self) -> torch.Tensor:
        """(M,) Z' = max(Z, C): what each model clips at before scaling by ρ = C / Z'."""
        return torch.clamp(self.threshold, min=self.base_clip)

    def clip_norms(self, idx):
        return self.scale_threshold()[:, None].expand(idx.shape)

    def weights(self, losses, clip, mask):
        rho = (self.base_clip / self.scale_threshold()).to(losses.dtype)
        return rho[:, None].expand(mask.shape) * mask

    def contribution_bounds(self, idx):
        return torch.full(idx.shape, self.base_clip, dtype=torch.float64, device=self.device)

    def noise_std(self):
        return torch.full((self.n_models,), self.noise_multiplier * self.base_clip, dtype=torch.float64,
                          device=self.device)

    def count(self, norms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(M,) the exact centred count Σ_i (1[‖g_i‖ ≤ Z] − ½) of each model's batch (sensitivity ½)."""
        below = (norms.to(torch.float64) <= self.threshold[:, None]).to(torch.float64) - 0.5
        return (below * mask).sum(1)

    def observe(self, idx, norms, mask, gen):
        noise = torch.randn(self.n_models, generator=self.count_generator(gen), device=self.device,
                            dtype=torch.float64)
        self.released = self.count(norms, mask) + self.count_noise_std * noise
        self.threshold = torch.clamp(tracked_quantile_step(self.threshold, self.released, expected=self.expected_batch,
                                                           quantile=self.quantile, lr=self.quantile_lr), *self._Z_RANGE)

    def state(self):
        """What an evaluation records (over all models of the axis: their means): the threshold Z' = max(Z, C) each
        gradient is clipped at (``group_clip_norms``), the noise std, the tracked Z (``global_threshold``) and the
        scale C / Z' (``global_scale``). Read only: recording changes no number of the step."""
        applied = self.scale_threshold()
        return {"group_clip_norms": [float(applied.mean())], "noise_std": self.noise_multiplier * self.base_clip,
                "global_threshold": float(self.threshold.mean()),
                "global_scale": float((self.base_clip / applied).mean())}

    def model_state(self, model: int) -> dict:
        """``state()`` of model ``model`` of the axis alone (a k-seed run stores one row per model)."""
        applied = float(self.scale_threshold()[model])
        return {"group_clip_norms": [applied], "noise_std": self.noise_multiplier * self.base_clip,
                "global_threshold": float(self.threshold[model]), "global_scale": self.base_clip / applied}
