"""The measurement behind individual ε (:mod:`engine.dp.individual`): a fixed, seeded panel of training samples per
group, and at each checkpoint their per-sample gradient norms, in the batch or not, turned into step ratios.

    choose_panel(groups, seed, per_group=PANEL_PER_GROUP)        sorted sample indices: per group all its samples
                                                                 if it has at most ``per_group``, else a seeded draw
    panel_norms(models, x, y, panel)                             (M, n) unclipped per-sample gradient norms, by the
                                                                 step's own per-sample path (``models.per_sample``)
    panel_sensitivities(mechanism, panel, norms)                 (M, n) contribution bounds s, (M,) noise std, the
                                                                 count release's noise multiplier (∞: none)
    panel_ratios(mechanism, panel, norms, tier_noise_multipliers) (M, n) u = σ_k / σ_eff for IndividualAccountant
    checkpoint_every(panel_size, expected_batch)                 the cadence that keeps the measurement near 10 %
    PanelTracker.for_run(...)                                    all of it for one run: measure at checkpoints,
                                                                 summarise per group at evaluations

Sensitivity of a sample at a step, per mechanism (what adding or removing it can move the released sum by):

* DP-SGD, IDP-SGD, DP-SGD-S, DPSGD-F: min(‖g‖, C_i), C_i its clip this step (its tier's, or its group's);
* DPSGD-Global-Adapt: ρ · min(‖g‖, Z'), ρ = C / Z' fixed before the batch;
* INO-SGD: NOT ρ_i · min(‖g_i‖, C_i). Adding sample i at its place in the loss order shifts every later item's
  mass by C_i and raises their weights; the weighted sum moves by ρ_i·clip(g_i) plus those raises, at most
  ρ_i·a_i + (1 − ρ_i)·C_i (a_i = min(‖g_i‖, C_i); the raises telescope to (1 − ρ_i)·C_i when the batch's mass
  passes the tail γ: ``engine.dp.importance``'s sensitivity argument). That bound falls as ρ_i grows, and ρ_i is
  smallest at the front of the order (ρ_min = F(C_i) / C_i): a panel sample's place in a batch it is not in is
  unknown, so ρ_min is used, which is sound for every batch. INO-SGD's individual ε is hence never below
  DP-SGD's at the same norms.

DPSGD-F, DP-SGD-S and Global-Adapt also release a count on the same batch (sensitivity Δ_b, noise σ_b); every
sample in the batch moves it whatever its gradient, so it enters every sample's step as a Gaussian of noise
multiplier σ_b / Δ_b (``engine.dp.individual.step_ratios``). Clips and thresholds that move are taken as they stand
at the checkpoint.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from engine.dp import dpsgd_f, global_adapt
from engine.dp.importance import bif_antiderivative
from engine.dp.individual import IndividualAccountant, IndividualEpsilonSummary, step_ratios, summarize
from engine.dp.mechanisms import GroupAdaptive, Importance

#: panel samples per group (all of a smaller group's samples)
PANEL_PER_GROUP = 256
#: the measurement's share of the training time the default cadence aims at
MEASURE_BUDGET = 0.10
#: a panel sample's norm costs about this share of one batch sample's training step (no clipped sum, no noise, no
#: optimizer): 0.4-0.9 measured by bench/individual_overhead.py (digits and MNIST CNN, a loaded 2-core machine),
#: ~0.7 for the MNIST CNN's norms alone at any chunk of 64-512
MEASURE_COST = 0.75
_CHUNK = 256  # panel samples differentiated at once (memory: one batch's per-sample work)


def choose_panel(groups, seed: int, per_group: int = PANEL_PER_GROUP) -> np.ndarray:
    """Sorted indices of the panel: for each group label in ``groups`` (n,), all its samples if it has at most
    ``per_group``, else ``per_group`` of them drawn without replacement by a generator seeded with ``seed``."""
    groups = np.asarray(groups)
    if int(per_group) < 1:
        raise ValueError(f"per_group must be ≥ 1, got {per_group!r}")
    rng = np.random.default_rng([int(seed), 0x1D1])  # a stream of its own: the run's other draws are unchanged
    chosen = []
    for g in np.unique(groups):
        members = np.flatnonzero(groups == g)
        chosen.append(members if len(members) <= per_group else rng.choice(members, size=int(per_group),
                                                                            replace=False))
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def panel_norms(models, x: torch.Tensor, y: torch.Tensor, panel, *, chunk: int = _CHUNK) -> torch.Tensor:
    """(M, n) the unclipped per-sample gradient norms of the panel's samples under each of the M models, computed
    by ``models.per_sample`` — the per-sample path the DP step clips (``ModuleGrads`` or ``StackedModels``)."""
    m = int(getattr(models, "n_models", 1))
    ix = torch.as_tensor(np.asarray(panel, dtype=np.int64), device=x.device)
    out = []
    for a in range(0, len(ix), chunk):
        idx = ix[a:a + chunk].expand(m, -1)
        mask = torch.ones(idx.shape, dtype=torch.bool, device=x.device)
        out.append(models.per_sample(x, y, idx, mask).norms.detach().to(torch.float64))
    return torch.cat(out, 1) if out else torch.zeros((m, 0), dtype=torch.float64, device=x.device)


def count_noise_multiplier(mechanism) -> float:
    """σ_b / Δ_b of the count the mechanism releases on each batch (∞: none): DPSGD-F's per-group counts (Δ_b = 1),
    DP-SGD-S's and Global-Adapt's centred counts (Δ_b = ½)."""
    if isinstance(mechanism, dpsgd_f.ClippingBias):
        return mechanism.count_noise_std / dpsgd_f.COUNT_SENSITIVITY
    if isinstance(mechanism, (global_adapt.GlobalScaling, GroupAdaptive)):
        return mechanism.count_noise_std / global_adapt.COUNT_SENSITIVITY
    return math.inf


def panel_sensitivities(mechanism, panel, norms: torch.Tensor):
    """((M, n) each panel sample's contribution bound s at this step, (M,) the step's noise std, σ_b / Δ_b of its
    count release) as numpy float64, from the mechanism's state at the checkpoint (module docstring)."""
    if not mechanism.private or not mechanism.formal_dp:
        raise ValueError("individual ε needs a mechanism with a formal DP guarantee")
    norms = norms.to(torch.float64)
    idx = torch.as_tensor(np.asarray(panel, dtype=np.int64), device=norms.device).expand(norms.shape)
    clip = mechanism.clip_norms(idx).to(torch.float64)
    # a norm that is not a number (a model whose weights diverged) counts at its bound: never below what it spent,
    # and the run ends *diverged* by the loop's own rule instead of failing here
    norms = torch.where(torch.isfinite(norms), norms, clip)
    a = torch.minimum(norms, clip).cpu().numpy()
    clip = clip.cpu().numpy()
    if isinstance(mechanism, Importance):
        gamma = mechanism.tail_length.reshape(-1, 1)
        rho = np.clip(bif_antiderivative(clip, mechanism.tif, gamma) / clip, 0.0, 1.0)  # the front of the order
        s = rho * a + (1.0 - rho) * clip
    else:
        mask = torch.ones(idx.shape, dtype=torch.bool, device=norms.device)
        rho = mechanism.weights(torch.zeros_like(norms), torch.as_tensor(clip, device=norms.device), mask)
        s = a if rho is None else rho.to(torch.float64).cpu().numpy() * a
    return s, mechanism.noise_std().to(torch.float64).cpu().numpy(), count_noise_multiplier(mechanism)


def panel_ratios(mechanism, panel, norms: torch.Tensor, tier_noise_multipliers) -> np.ndarray:
    """(M, n) each panel sample's step ratio u = σ_k / σ_eff (``engine.dp.individual.step_ratios``);
    ``tier_noise_multipliers`` (n,): its tier's planned σ_k."""
    s, noise_std, count = panel_sensitivities(mechanism, panel, norms)
    return step_ratios(s, noise_std[:, None], np.asarray(tier_noise_multipliers, dtype=np.float64)[None, :], count)


def checkpoint_every(panel_size: int, expected_batch: float, *, budget: float = MEASURE_BUDGET) -> int:
    """Steps between two measurements of the panel: measuring n samples costs about ``MEASURE_COST`` · n / B training
    steps (B the expected batch), so every ⌈MEASURE_COST · n / (budget · B)⌉ steps keeps it near ``budget`` of the
    training time."""
    if not panel_size:
        return 1
    return max(1, math.ceil(MEASURE_COST * int(panel_size) / (float(budget) * float(expected_batch))))


class PanelTracker:
    """What the training loop holds for individual ε: the panel, one :class:`IndividualAccountant` per model, the
    cadence. ``measure(step, grads_of, mechanism, x, y)`` after ``step`` optimizer steps (step 0 before the first)
    when ``due(step)``; ``summary(step, groups, names, model=j)`` at any evaluation. :meth:`for_run` builds it from
    the run's privacy preparation (None where there is nothing to account: no formal guarantee).

    The measurement only reads: per-sample norms by ``grads_of.per_sample`` (no parameter's ``.grad`` is written)
    and the mechanism's clips, weights and noise std as they stand (no state moves, no random number is drawn)."""

    def __init__(self, *, panel, panel_tiers, sample_rates, noise_multipliers, delta: float, releases=(),
                 run_accountant: str = "rdp", n_models: int = 1, every: int, planned_steps: int,
                 per_group: int = PANEL_PER_GROUP):
        self.panel = np.asarray(panel, dtype=np.int64)
        self.tiers = np.asarray(panel_tiers, dtype=np.int64)
        self.sigma = np.asarray(noise_multipliers, dtype=np.float64)[self.tiers]
        self.every, self.planned_steps, self.per_group = int(every), int(planned_steps), int(per_group)
        self.accountants = [IndividualAccountant(tiers=self.tiers, sample_rates=sample_rates,
                                                 noise_multipliers=noise_multipliers, delta=delta, releases=releases,
                                                 run_accountant=run_accountant) for _ in range(int(n_models))]

    @classmethod
    def for_run(cls, *, privacy, sample_tiers, panel_groups, delta: float, seed: int, steps: int, n_models: int = 1,
                per_group: int = PANEL_PER_GROUP, budget: float = MEASURE_BUDGET) -> "PanelTracker | None":
        """The tracker of a run: ``privacy`` its ``engine.dp.prepare.PrivacyPlan``, ``sample_tiers`` (n,) each training
        sample's tier, ``panel_groups`` (n,) the labels the panel is drawn per (e.g. the class, or a cell id of class ×
        attribute), ``steps`` the plan's T (the share of the promise is of the tier's ε at T)."""
        if privacy.plan is None or not privacy.formal_dp:
            return None
        plan = privacy.plan
        panel = choose_panel(panel_groups, seed, per_group)
        return cls(panel=panel, panel_tiers=np.asarray(sample_tiers)[panel], sample_rates=plan.sample_rates,
                   noise_multipliers=plan.noise_multipliers, delta=delta, releases=plan.release_noise_multipliers,
                   run_accountant=plan.accountant, n_models=n_models, planned_steps=steps, per_group=per_group,
                   every=checkpoint_every(len(panel), privacy.expected_batch, budget=budget))

    def due(self, step: int) -> bool:
        return int(step) % self.every == 0

    def measure(self, step: int, grads_of, mechanism, x: torch.Tensor, y: torch.Tensor) -> None:
        """Measure the panel's norms under each model and record them as the checkpoint at ``step``."""
        u = panel_ratios(mechanism, self.panel, panel_norms(grads_of, x, y, self.panel), self.sigma)
        for acc, row in zip(self.accountants, u):
            acc.checkpoint(step, row)

    def epsilons(self, step: int, model: int = 0) -> np.ndarray:
        """(n,) the panel's individual ε after ``step`` steps under model ``model``."""
        return self.accountants[model].epsilons(step)

    def summary(self, step: int, groups, group_names, *, model: int = 0) -> IndividualEpsilonSummary:
        """The per-group summary after ``step`` steps: ``groups`` (n_train,) a group index per TRAINING sample (class,
        tier, attribute value…) into ``group_names``."""
        return summarize(self.accountants[model], step, self.planned_steps, np.asarray(groups)[self.panel],
                         group_names, panel_per_group=self.per_group)
