"""How each algorithm chooses per-sample clip norms C_i, weights ρ_i and the noise.

The training loop (``engine.train``) is shared; an algorithm is a small strategy object:

* :class:`Clipped` — DP-SGD and IDP-SGD: C_i from the plan (per tier), ρ_i = 1.
* :class:`Importance` — INO-SGD: same C_i, ρ_i from ``engine.importance`` over the batch.
* :class:`GroupAdaptive` — DP-SGD-S: C_i = C_k of the sample's group, tracked from a
  (private) quantile of the group's gradient norms; noise scales with max_k C_k.
* :class:`NonPrivate` — the reference: no clipping, no noise.

Invariant every private mechanism keeps: adding one sample z changes Σ ρ_i clip(g_i, C_i)
by at most C_z, and the noise std is noise_multiplier × (the largest C any sample can get).
"""
from __future__ import annotations

import numpy as np

from engine.importance import make_tif, weights_from_order


class Mechanism:
    private = True
    formal_dp = True

    def clip_norms(self, batch_idx: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def weights(self, losses: np.ndarray, clip_norms: np.ndarray) -> np.ndarray:
        return np.ones(len(losses))

    def noise_std(self) -> float:
        raise NotImplementedError

    def observe(self, batch_idx: np.ndarray, grad_norms: np.ndarray, rng: np.random.Generator) -> None:
        """Called after each step with the batch's unclipped per-sample gradient norms."""

    def state(self) -> dict:
        return {}


class NonPrivate(Mechanism):
    private = False
    formal_dp = False

    def clip_norms(self, batch_idx):
        return np.full(len(batch_idx), np.inf)

    def noise_std(self):
        return 0.0


class Clipped(Mechanism):
    """DP-SGD / IDP-SGD: per-tier clip norms and one noise std, both from the plan."""

    def __init__(self, *, sample_clip_norms: np.ndarray, noise_std: float):
        self._clip = np.asarray(sample_clip_norms, dtype=float)
        self._noise_std = float(noise_std)

    def clip_norms(self, batch_idx):
        return self._clip[batch_idx]

    def noise_std(self):
        return self._noise_std


class Importance(Clipped):
    """INO-SGD: sort by loss, weight each clipped gradient by the BIF average over its mass."""

    def __init__(self, *, sample_clip_norms, noise_std, tail_length: float, tif):
        super().__init__(sample_clip_norms=sample_clip_norms, noise_std=noise_std)
        self.tail_length = float(tail_length)
        self.tif = tif

    def weights(self, losses, clip_norms):
        order = np.argsort(np.asarray(losses, dtype=float), kind="stable")
        return weights_from_order(order, clip_norms, self.tif, self.tail_length)


class GroupAdaptive(Mechanism):
    """DP-SGD-S: group k's clip C_k = max(τ · S̄_k, C_min), S̄_k an EMA of a tracked quantile.

    Private mode (default) tracks the quantile as Andrew et al. (2021): each step releases,
    per group, Σ_i (1[‖g_i‖ ≤ S_k] − ½) + N(0, σ_b²) (every sample is in one group, so the
    vector has L2 sensitivity ½), estimates the clipped fraction b̃_k by dividing by the
    expected group batch q·N_k, and updates S_k ← S_k · exp(−η (b̃_k − quantile)). The gradient
    noise multiplier is raised to z_Δ so both releases together cost what z alone would.
    Non-private mode replaces the release by the exact batch quantile: no formal guarantee.
    """

    def __init__(self, *, groups: np.ndarray, n_groups: int, noise_multiplier: float, expected_group_batch,
                 initial: float, tau: float, quantile: float, ema: float, min_clip: float,
                 private: bool, quantile_lr: float, count_noise_std: float):
        self.groups = np.asarray(groups)
        self.noise_multiplier = float(noise_multiplier)
        self.expected = np.maximum(np.asarray(expected_group_batch, dtype=float), 1e-12)
        self.estimate = np.full(n_groups, float(initial))  # S_k, raw tracker
        self.smoothed = self.estimate.copy()  # S̄_k
        self.tau, self.quantile, self.ema, self.min_clip = tau, quantile, ema, min_clip
        self.private = True  # the gradient release is always private; ``formal_dp`` says if the whole run is
        self.formal_dp = bool(private)
        self.quantile_lr, self.count_noise_std = quantile_lr, count_noise_std

    def group_clips(self) -> np.ndarray:
        return np.maximum(self.tau * self.smoothed, self.min_clip)

    def clip_norms(self, batch_idx):
        return self.group_clips()[self.groups[batch_idx]]

    def noise_std(self):
        return self.noise_multiplier * float(self.group_clips().max())

    def observe(self, batch_idx, grad_norms, rng):
        g = self.groups[batch_idx]
        k = len(self.estimate)
        if self.formal_dp:
            below = (grad_norms <= self.estimate[g]).astype(float) - 0.5
            released = np.bincount(g, weights=below, minlength=k) + rng.normal(0.0, self.count_noise_std, k)
            frac = released / self.expected + 0.5
            self.estimate = self.estimate * np.exp(-self.quantile_lr * (frac - self.quantile))
        else:
            for j in range(k):
                norms = grad_norms[g == j]
                if len(norms):
                    self.estimate[j] = float(np.quantile(norms, self.quantile))
        self.smoothed = self.ema * self.smoothed + (1 - self.ema) * self.estimate

    def state(self):
        return {"group_clip_norms": self.group_clips().tolist()}


def build_tif(algo):
    return make_tif(algo.tif, alpha=algo.alpha, beta=algo.beta, power=algo.power, cut=algo.step_cut, knots=algo.knots)


def resolve_tail_length(algo, expected_clip_mass: float) -> float:
    """γ in absolute clip-mass units, fixed once before training (never per batch)."""
    if algo.tail_length is not None:
        return float(algo.tail_length)
    return float(algo.tail_fraction) * float(expected_clip_mass)


def default_count_noise_std(expected_batch: float) -> float:
    # Andrew et al. (2021) use σ_b = expected batch / 20.
    return max(expected_batch / 20.0, 1.0)
