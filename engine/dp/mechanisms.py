"""How each algorithm chooses per-sample clip norms C_i, weights ρ_i and the noise — the only
mechanism family, batched over a model axis M (a dashboard run is M = 1, an audit chunk M models).

The step (``engine.dp.step.dp_step``) is shared; an algorithm is a small strategy object whose hooks
take and return torch tensors on the run's device, one row per model:

* :class:`Clipped` — DP-SGD and IDP-SGD: C_i from the plan (per tier), ρ_i = 1.
* :class:`Importance` — INO-SGD: same C_i, ρ_i from ``engine.dp.importance.ino_weights`` per row.
* :class:`GroupAdaptive` — DP-SGD-S: C_i = C_k of the sample's group, C_k = C · clamp(τ S̄_k / mean S̄, c_min,
  c_max) from a (private) tracked quantile of the group's gradient norms; noise scales with max_k C_k.
* :class:`NonPrivate` — the reference: no clipping, no noise.

Hooks: ``see_batch(idx, work, mask, gen)`` (before clipping, with this batch's per-sample work: DPSGD-F
releases its counts here, the non-private reference rule reads the gradients), ``clip_norms(idx (M, L)) → (M, L)``,
``weights(losses, clip, mask) → (M, L) or None`` (None: ρ ≡ 1), ``contribution_bounds(idx) → (M, L)`` (the
largest norm entry i's ρ_i · clip(g_i, C_i) can have), ``noise_std() → (M,)``, ``observe(idx, norms, mask,
gen)`` — called after EVERY step, an empty Poisson batch included — and ``state()``. Each class builds itself
from the privacy preparation (``from_privacy``: ``engine.dp.prepare.prepare_privacy`` gives its inputs); the
algorithm registry (``engine.dp.algorithms``) names which one an algorithm uses (DPSGD-F's and Global-Adapt's
live in ``engine.dp.dpsgd_f`` and ``engine.dp.global_adapt``), and :func:`build_mechanism` is the one factory.

Invariant every private mechanism keeps: adding one sample z changes Σ ρ_i clip(g_i, C_i) by at most its
contribution bound (``contribution_bounds``: C_z, except DPSGD-Global-Adapt's ρ · Z' = C), and the noise std is
noise_multiplier × (the largest contribution bound any sample can get). Every statistic of the batch a
mechanism adapts to (a clip, a threshold) is released with Gaussian noise from its own stream
(``count_generator``) and accounted (``engine.dp.accounting.adaptive_clipping_noise_multiplier``).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from engine.config.algorithms import group_clip_no_dp_reason
from engine.dp.importance import ino_weights, make_tif


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

    def see_batch(self, idx: torch.Tensor, work, mask: torch.Tensor, gen: torch.Generator) -> None:
        """Called before ``clip_norms`` with the batch's per-sample work (``work.norms``: the unclipped norms).
        DPSGD-F releases this batch's noisy counts here; the reference DP-SGD-S rule (not private) reads the
        gradients."""

    def contribution_bounds(self, idx: torch.Tensor) -> torch.Tensor:
        """(M, L) the largest norm batch entry i's ρ_i · clip(g_i, C_i) can have this step: C_i, as ρ ≤ 1 (the
        sensitivity the noise is scaled to; the one-run audit's canaries contribute this much)."""
        return self.clip_norms(idx)

    def count_generator(self, gen: torch.Generator) -> torch.Generator:
        """The noise stream of the mechanism's own releases (counts), seeded once from the step generator's seed
        (as unpredictable as it: secure_rng seeds that from the OS): a run's batches and gradient noise stay
        those of DP-SGD with the same seed, so the two are paired as IDP-SGD and INO-SGD are."""
        if getattr(self, "_counts_gen", None) is None:
            self._counts_gen = torch.Generator(device=gen.device).manual_seed(
                (int(gen.initial_seed()) ^ 0x5EED_C0DE_D95) % (2**63))
        return self._counts_gen

    def observe(self, idx: torch.Tensor, norms: torch.Tensor, mask: torch.Tensor, gen: torch.Generator) -> None:
        """Called after every step (empty batches too) with the unclipped per-sample gradient norms."""

    def state(self) -> dict:
        return {}


class NonPrivate(Mechanism):
    private = False
    formal_dp = False

    @classmethod
    def from_privacy(cls, privacy, *, n_models: int, device, sample_tiers=None) -> "NonPrivate":
        return cls(n_models, device)

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

    @classmethod
    def from_privacy(cls, privacy, *, n_models: int, device, sample_tiers=None) -> "Clipped":
        return cls(sample_clip_norms=privacy.sample_clips, noise_std=privacy.plan.noise_std, n_models=n_models,
                   device=device)

    def clip_norms(self, idx):
        return self._clip[idx]

    def noise_std(self):
        return self._std


class Importance(Clipped):
    """INO-SGD: sort by loss, weight each clipped gradient by the BIF average over its mass
    (float64 on the CPU, one row per model; ``tail_length`` γ for all models or one per model)."""

    def __init__(self, *, sample_clip_norms, noise_std, tail_length, tif, n_models: int = 1, device="cpu",
                 sample_tiers=None, n_tiers: int | None = None):
        super().__init__(sample_clip_norms=sample_clip_norms, noise_std=noise_std, n_models=n_models, device=device)
        self.tail_length = np.broadcast_to(np.asarray(tail_length, dtype=float), (self.n_models,)).copy()
        self.tif = tif
        # Diagnostics for the figures (engine.figures.talk "ino_internals"), per model since its previous
        # evaluation: Σ ρ and the count per tier, Σ (1 − ρ_i) C_i and Σ C_i. They are statistics of the
        # training batches, recorded in the local store only — not part of what the DP guarantee covers.
        self._tiers = None if sample_tiers is None else np.asarray(sample_tiers, dtype=np.int64)
        k = 0 if self._tiers is None else int(n_tiers if n_tiers is not None else self._tiers.max() + 1)
        self._rho_sum, self._rho_n = np.zeros((self.n_models, k)), np.zeros((self.n_models, k))
        self._mass = np.zeros((self.n_models, 2))  # Σ (1 − ρ) C, Σ C

    @classmethod
    def from_privacy(cls, privacy, *, n_models: int, device, sample_tiers=None) -> "Importance":
        return cls(sample_clip_norms=privacy.sample_clips, noise_std=privacy.plan.noise_std,
                   tail_length=privacy.tail_length, tif=build_tif(privacy.algorithm), n_models=n_models, device=device,
                   sample_tiers=sample_tiers, n_tiers=None if sample_tiers is None else len(privacy.plan.sample_rates))

    def weights(self, losses, clip, mask):
        clip_np, mask_np = clip.detach().cpu().numpy(), mask.cpu().numpy()
        rho = ino_weights(losses.detach().cpu().numpy(), clip_np, mask_np, self.tif, self.tail_length)
        self._record(rho, clip_np, mask_np)
        return torch.as_tensor(rho, dtype=losses.dtype, device=losses.device)

    def see_batch(self, idx, work, mask, gen):
        self._idx = idx  # the batch's sample indices, for the per-tier diagnostics of weights()

    def _record(self, rho, clip, mask) -> None:
        c = np.where(mask, clip, 0.0)
        self._mass[:, 0] += ((1.0 - rho) * c).sum(1)
        self._mass[:, 1] += c.sum(1)
        idx, self._idx = getattr(self, "_idx", None), None  # this batch's indices (see_batch), used once
        if self._tiers is not None and idx is not None and tuple(idx.shape) == tuple(mask.shape):
            tiers = self._tiers[idx.cpu().numpy()]
            for m in range(self.n_models):
                t, r = tiers[m][mask[m]], rho[m][mask[m]]
                np.add.at(self._rho_sum[m], t, r)
                np.add.at(self._rho_n[m], t, 1.0)

    def model_state(self, model: int) -> dict:
        """Model ``model``'s mean ρ per tier (null for a tier it did not sample) and the fraction of its
        clip mass down-weighted, since its previous evaluation; then starts a new window for it."""
        n, mass = self._rho_n[model], self._mass[model]
        out = {"ino_rho_by_tier": [float(s / c) if c > 0 else None for s, c in zip(self._rho_sum[model], n)]
               if self._tiers is not None else None,
               "ino_downweighted_fraction": float(mass[0] / mass[1]) if mass[1] > 0 else None}
        self._rho_sum[model], self._rho_n[model], self._mass[model] = 0.0, 0.0, 0.0
        return out

    def state(self) -> dict:
        return self.model_state(0) if self.n_models == 1 else {}


class GroupAdaptive(Mechanism):
    """DP-SGD-S: sample i in group k gets the clip C_k, one (S_k, S̄_k) state per model; the noise
    std is noise_multiplier · max_k C_k (with clip_rule "quantile" ≤ noise_multiplier · c_max · C).

    ``clip_rule="quantile"`` (the lab's rule, bounded and relative): C_k = C · clamp(τ · S̄_k / mean_j S̄_j,
    c_min, c_max), S̄_k the EMA (momentum ``ema``) of a tracked quantile S_k of group k's gradient norms.
    Private mode (default) tracks S_k as Andrew et al. (2021): each step releases, per model and group,
    Σ_i (1[‖g_i‖ ≤ S_k] − ½) + N(0, σ_b²) (every sample is in one group, so the vector has L2 sensitivity
    ½; its noise comes from a stream of its own, see ``count_generator``) — also on an empty batch —, estimates the clipped fraction b̃_k by dividing by the group's PUBLIC
    expected count per step (``expected_group_batch``: declared or noisily released sizes, never the exact
    N_k) and clamping to [0, 1], and updates S_k ← S_k · exp(−η (b̃_k − quantile)). The gradient noise
    multiplier is raised to z_Δ so both releases together cost what z alone would. Non-private mode
    replaces the release by the exact batch quantile (numpy's linear interpolation; unchanged on an empty
    group): no formal guarantee.

    ``clip_rule="reference"`` (ruayz/fair-privacy's DP-SGD-S, for comparison): at each step, from this
    batch's unclipped gradients, C_k = C · min(c_max, ‖mean of the batch's g_i‖ / ‖mean of group k's g_i‖)
    (c_max plays the reference's ``scale``; a group absent from the batch gets c_max, as the reference's
    1e-6 norm does). The reference adds one scalar N(0, σ²) to every coordinate of these unclipped sums,
    which bounds no sensitivity; it is left out here. Not private: no formal guarantee.
    """

    _S_RANGE = (1e-100, 1e100)  # S_k is kept in this range so that ratios stay finite under any norms

    def __init__(self, *, groups, n_groups: int, noise_multiplier: float, expected_group_batch, initial: float,
                 tau: float, quantile: float, ema: float, c_min: float, c_max: float, base_clip: float,
                 private: bool, quantile_lr: float, count_noise_std: float, clip_rule: str = "quantile",
                 n_models: int = 1, device="cpu"):
        exp = np.broadcast_to(np.asarray(expected_group_batch, dtype=np.float64), (int(n_models), int(n_groups)))
        if not np.all(exp >= 1.0):  # engine.dp.prepare refuses such groups with a ConfigError naming them
            raise ValueError(f"every group needs an expected count per step >= 1, got {exp.min():g}")
        super().__init__(exp.shape[0], device)
        self.groups = torch.as_tensor(np.asarray(groups, dtype=np.int64), device=self.device)
        self.k = int(n_groups)
        self.expected = torch.as_tensor(exp.copy(), dtype=torch.float64, device=self.device)
        self.estimate = torch.full((self.n_models, self.k), float(initial), dtype=torch.float64, device=self.device)
        self.smoothed = self.estimate.clone()  # S̄_k
        self.noise_multiplier = float(noise_multiplier)
        self.tau, self.quantile, self.ema = float(tau), float(quantile), float(ema)
        self.c_min, self.c_max, self.base_clip = float(c_min), float(c_max), float(base_clip)
        self.clip_rule = clip_rule
        self.private_quantile = bool(private)
        # the gradient release is always noised; the clips are private only from a privately tracked quantile
        self.formal_dp = group_clip_no_dp_reason(private_quantile=bool(private), clip_rule=clip_rule) is None
        self.quantile_lr, self.count_noise_std = float(quantile_lr), float(count_noise_std)
        self._batch_clips = None  # the reference rule's clips of the current batch
        # Σ over the steps so far of each model's max_k C_k (the noise std is noise_multiplier times it), and the
        # steps counted: what the noise-matched control of DP-SGD-S is matched to (``realised_noise_multiplier``)
        self._max_clip_sum = torch.zeros(self.n_models, dtype=torch.float64, device=self.device)
        self._steps_seen = 0

    @classmethod
    def from_privacy(cls, privacy, *, n_models: int, device, sample_tiers=None) -> "GroupAdaptive":
        a, s = privacy.algorithm, privacy.clip_setup
        return cls(groups=s.groups, n_groups=len(s.group_names), noise_multiplier=s.noise_multiplier,
                   expected_group_batch=s.expected_group_batch, initial=s.initial_clip, tau=a.tau, quantile=a.quantile,
                   ema=a.ema, c_min=a.c_min, c_max=a.c_max, base_clip=s.base_clip, private=a.private_quantile,
                   quantile_lr=a.quantile_lr, count_noise_std=s.count_noise_std, clip_rule=a.clip_rule,
                   n_models=n_models, device=device)

    def group_clips(self) -> torch.Tensor:
        """(M, K) current clip norm of each group."""
        if self.clip_rule == "reference":
            if self._batch_clips is None:
                return torch.full((self.n_models, self.k), self.base_clip * self.c_max, dtype=torch.float64,
                                  device=self.device)
            return self._batch_clips
        ratio = self.tau * self.smoothed / self.smoothed.mean(dim=1, keepdim=True)
        return self.base_clip * torch.clamp(ratio, min=self.c_min, max=self.c_max)

    def see_batch(self, idx, work, mask, gen):
        if self.clip_rule != "reference":
            return
        g = self.groups[idx]
        sums, counts = [], []
        for j in range(self.k):
            sel = (mask & (g == j)).to(work.norms.dtype)
            sums.append(work.weighted_sum(sel))
            counts.append(sel.sum(1).to(torch.float64))
        n_all = torch.stack(counts, 1).sum(1)  # (M,)
        sq_all = torch.zeros(self.n_models, dtype=torch.float64, device=self.device)
        for name in sums[0]:
            whole = sum(s[name] for s in sums).to(torch.float64)
            sq_all += whole.reshape(self.n_models, -1).pow(2).sum(1)
        mean_all = torch.sqrt(sq_all) / n_all.clamp(min=1)
        clips = torch.empty((self.n_models, self.k), dtype=torch.float64, device=self.device)
        for j in range(self.k):
            sq = sum(v.to(torch.float64).reshape(self.n_models, -1).pow(2).sum(1) for v in sums[j].values())
            mean_j = torch.sqrt(sq) / counts[j].clamp(min=1)
            ratio = torch.where((counts[j] > 0) & (mean_j > 0), mean_all / mean_j.clamp(min=1e-300),
                                torch.full_like(mean_j, self.c_max))
            clips[:, j] = self.base_clip * torch.clamp(torch.nan_to_num(ratio, nan=self.c_max), max=self.c_max)
        self._batch_clips = clips

    def clip_norms(self, idx):
        return torch.gather(self.group_clips(), 1, self.groups[idx])

    def noise_std(self):
        return self.noise_multiplier * self.group_clips().max(dim=1).values

    def realised_noise_multiplier(self) -> torch.Tensor:
        """(M,) each model's noise std divided by the base clip C, averaged over the steps observed so far:
        noise_multiplier · mean_t max_k C_k(t) / C (nan before the first step)."""
        return self.noise_multiplier * self._max_clip_sum / (self.base_clip * max(self._steps_seen, 0) or math.nan)

    def observe(self, idx, norms, mask, gen):
        # this step's clips, before they move: those set this step's noise std (dp_step read noise_std() already)
        self._max_clip_sum += self.group_clips().max(dim=1).values
        self._steps_seen += 1
        if self.clip_rule == "reference":  # its clips come from each batch (see_batch), nothing to track
            return
        g = self.groups[idx]  # (M, L)
        norms = norms.to(torch.float64)
        if self.private_quantile:
            below = ((norms <= torch.gather(self.estimate, 1, g)).to(torch.float64) - 0.5) * mask
            counts = torch.zeros_like(self.estimate).scatter_add_(1, g, below)
            noise = torch.randn(self.estimate.shape, generator=self.count_generator(gen), device=self.device,
                                dtype=torch.float64)
            self.estimate = tracked_quantile_step(self.estimate, counts + self.count_noise_std * noise,
                                                  expected=self.expected, quantile=self.quantile, lr=self.quantile_lr)
        else:
            for j in range(self.k):
                sel = mask & (g == j)
                vals = torch.where(sel, norms, torch.full_like(norms, math.inf)).sort(dim=1).values
                cnt = sel.sum(1)
                pos = self.quantile * (cnt - 1).clamp(min=0).to(torch.float64)  # numpy's linear quantile
                lo, hi = pos.floor().long(), pos.ceil().long()
                vlo, vhi = vals.gather(1, lo[:, None])[:, 0], vals.gather(1, hi[:, None])[:, 0]
                q = vlo + (vhi - vlo) * (pos - lo)
                self.estimate[:, j] = torch.where((cnt > 0) & torch.isfinite(q), q, self.estimate[:, j])
        self.estimate = torch.clamp(self.estimate, *self._S_RANGE)
        self.smoothed = self.ema * self.smoothed + (1 - self.ema) * self.estimate

    def state(self):
        clips = self.group_clips()
        return {"group_clip_norms": clips.mean(0).tolist(),
                "noise_std": float((self.noise_multiplier * clips.max(dim=1).values).mean())}

    def model_state(self, model: int) -> dict:
        """``state()`` of model ``model`` of the axis alone (a k-seed run stores one row per model)."""
        clips = self.group_clips()[model]
        return {"group_clip_norms": clips.tolist(), "noise_std": float(self.noise_multiplier * clips.max())}


def tracked_quantile_step(estimate: torch.Tensor, released: torch.Tensor, *, expected, quantile: float,
                          lr: float) -> torch.Tensor:
    """Andrew et al.'s (2021) geometric step of a privately tracked quantile S of gradient norms, from the released
    centred count Σ_i (1[‖g_i‖ ≤ S] − ½) + N(0, σ_b²): the fraction within S, b̃ = clamp(count / E + ½, 0, 1) over
    the PUBLIC expected count E, and S ← S · exp(−η (b̃ − quantile)). The one rule of DP-SGD-S's per-group clips and
    DPSGD-Global-Adapt's threshold (post-processing of the release only)."""
    frac = torch.clamp(released / expected + 0.5, 0.0, 1.0)
    return estimate * torch.exp(-lr * (frac - quantile))


def build_tif(algo):
    return make_tif(algo.tif, alpha=algo.alpha, beta=algo.beta, power=algo.power, cut=algo.step_cut, knots=algo.knots)


COUNT_NOISE_COST = 1.05  # the default σ_b raises the gradient noise multiplier by at most this factor (z_Δ / z)
# the smallest σ_b / z with z_Δ / z ≤ COUNT_NOISE_COST: z_Δ = z (1 − (z / 2σ_b)²)^(-1/2) (Andrew et al. 2021, Thm 1)
COUNT_NOISE_PER_Z = 1.0 / (2.0 * math.sqrt(1.0 - COUNT_NOISE_COST ** -2))  # ≈ 1.64


def default_count_noise_std(expected_batch: float, noise_multiplier: float) -> float:
    """σ_b of DP-SGD-S's per-group clipped-count release: Andrew et al.'s (2021) σ_b = expected batch / 20, but
    never below COUNT_NOISE_PER_Z · z (≈ 1.64 z), the level at which the count release costs at most 5 % more
    gradient noise (z_Δ ≤ 1.05 z; without that floor it could cost up to z / √(3/4), 15 %), and at least 1.

    Not per group: the K group counts share the release (L2 sensitivity ½ for the whole vector), and a σ_b
    sized for each group's ~B/K samples (min_k E n_k / 20) measured no better — the clip spread max_k C_k / C
    comes from the groups' true gradient norms, not from this noise, at σ_b / E n_k ≈ 0.5 — and paid up to 5 %
    more gradient noise (bench/dpsgd_s_accuracy.py; docs/RESULTS.md). σ_b / E n_k well above 1 does hurt."""
    return max(float(expected_batch) / 20.0, COUNT_NOISE_PER_Z * float(noise_multiplier), 1.0)


def build_mechanism(*, privacy, members, device, sample_tiers=None) -> Mechanism:
    """The mechanism of ``privacy`` (an ``engine.dp.prepare.PrivacyPlan``) for M models whose training
    sets are the rows of ``members`` ((M, n) bool; a dashboard run: one row, all True): its algorithm's
    registered factory (``privacy.entry.mechanism``, engine.dp.algorithms). ``sample_tiers`` (tier index per
    training sample) lets INO-SGD record its mean ρ per tier for the figures."""
    m = np.atleast_2d(np.asarray(members, dtype=bool)).shape[0]
    return privacy.entry.mechanism(privacy, n_models=m, device=device, sample_tiers=sample_tiers)
