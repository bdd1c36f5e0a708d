"""Per-tier empirical ε from ONE training run per algorithm (Steinke, Nasr & Jagielski 2023), with canaries that
are ordinary members of their tier.

    canaries ← per tier k: m gradient canaries (white-box) and m input canaries (black-box), each in with prob ½
    for each algorithm:
        prepare(run)                          the data, tiers, plan and model of a dashboard run
        extend the index space by the canaries: rate q_k, clip C_k, INO-SGD's weights, DP-SGD-S's group of tier k
            — the mechanism is built by the one factory from the extended per-sample arrays: no special path
        for t in 1..T: dp_step on the models with the gradient canaries (engine.dp.canaries.GradientCanaries)
            white-box score_j += noisy update_t at canary j's coordinate (the auditor sees every update; by
                default a spare slot no input's gradient reaches: OneRunConfig.canary_slots)
        black-box score_j = logit-scaled confidence of input canary j's (wrong) label on the final model
        per tier: ε̂ from the same guesses, by Steinke et al.'s bound (engine.audit.one_run.bound) and by the f-DP
            bound (engine.audit.one_run.fdp), next to the accountant's ε_k after T steps

The divisor of the noisy sum is public: the training set's Σ q_i plus ½ Σ q_j over the canaries (the
expected batch whatever the canaries' coin flips were). Input canaries are test examples with a label of their
tier that is not their true class; the test examples left measure accuracy. ε̂ above a tier's claimed ε means the
implementation breaks its guarantee (with probability ≥ 1 − β): :class:`Fault` builds exactly such a bug,
for the bug-detector test and bench (never reachable from a config).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import torch

from engine.config.job import algorithm_keys
from engine.audit.one_run.bound import epsilon_lower_bound
from engine.audit.one_run.fdp import fdp_epsilon_lower_bound
from engine.audit.one_run.config import OneRunConfig
from engine.audit.one_run.report import AlgorithmOneRun, OneRunReport, TierBound
from engine.config.run import ALGORITHM_LABELS
from engine.config.schema import ConfigError
from engine.dp.canaries import SPARE, GradientCanaries
from engine.dp.mechanisms import build_mechanism
from engine.dp.step import PoissonSampler, dp_step
from engine.store.lifecycle import NO_STORE, Cancelled, RunLifecycle
from engine.train.loop import make_optimizer, model_axis, prepare, step_generator


@dataclass(frozen=True)
class Fault:
    """A deliberately broken mechanism that the accountant does not know about — what the one-run audit must catch:
    tier ``tier``'s samples (canaries included) drawn at ``rate_factor`` × their planned rate, or clipped at
    ``sensitivity_factor`` × their planned clip under the same noise (that tier's noise divided by the factor; not for
    DP-SGD-S, whose clips are its own)."""

    tier: int
    rate_factor: float = 1.0
    sensitivity_factor: float = 1.0


@dataclass
class Canaries:
    """The canaries of one audit, fixed before any run (the same for every algorithm)."""

    grad_tier: np.ndarray  # (mg,) tier of each gradient canary
    grad_in: np.ndarray  # (mg,) bool: in the training set
    coords: np.ndarray  # (mg,) distinct parameter coordinates
    grad_donor: np.ndarray  # (mg,) a training sample of the same tier (its DP-SGD-S group)
    input_tier: np.ndarray  # (mi,)
    input_in: np.ndarray  # (mi,)
    source: np.ndarray  # (mi,) test index of each input canary
    label: np.ndarray  # (mi,) its label: a class of its tier, not its true class
    input_donor: np.ndarray  # (mi,)

    @property
    def n_grad(self) -> int:
        return len(self.grad_tier)

    @property
    def n_input(self) -> int:
        return len(self.input_tier)


def design_canaries(config: OneRunConfig, prep) -> Canaries:
    """Draw the canaries from ``config.run.seed``: their tiers, coin flips, coordinates and input examples."""
    rng = np.random.default_rng([int(config.run.seed), 0xCA7A])
    ds, tiers = prep.dataset, prep.tiers
    k_tiers = len(tiers.epsilons)
    train_tier = np.asarray(tiers.train)
    n_params = sum(p.numel() for p in prep.model.parameters())
    mg = config.canaries * k_tiers
    spare = config.canary_slots == "spare"
    if not spare and mg > n_params:
        raise ConfigError("canaries", f"{config.canaries} gradient canaries per tier need {mg} distinct parameter "
                                      f"coordinates; the model has {n_params}: lower canaries")
    y_test = ds.y_test.numpy()
    per_tier = min(config.input_canaries, len(y_test) // (2 * k_tiers))
    classes_of = _tier_classes(config, ds.num_classes, k_tiers)
    pool = rng.permutation(len(y_test))
    src, lab, ti, used = [], [], [], 0
    for k in range(k_tiers):
        got = 0
        while got < per_tier and used < len(pool):
            i = int(pool[used])
            used += 1
            choices = [c for c in classes_of[k] if c != y_test[i]]
            if choices:
                src.append(i)
                lab.append(int(rng.choice(choices)))
                ti.append(k)
                got += 1
    grad_tier = np.repeat(np.arange(k_tiers), config.canaries)
    input_tier = np.asarray(ti, dtype=np.int64)
    return Canaries(grad_tier=grad_tier, grad_in=rng.random(mg) < 0.5,
                    coords=np.arange(mg) if spare else np.sort(rng.choice(n_params, size=mg, replace=False)),
                    grad_donor=_donors(rng, train_tier, grad_tier), input_tier=input_tier,
                    input_in=rng.random(len(ti)) < 0.5, source=np.asarray(src, dtype=np.int64),
                    label=np.asarray(lab, dtype=np.int64), input_donor=_donors(rng, train_tier, input_tier))


def _tier_classes(config: OneRunConfig, num_classes: int, k_tiers: int) -> list:
    t = config.run.tiers
    if t.assign == "class":
        return [list(tier.classes) for tier in t.tiers]
    return [list(range(num_classes))] * k_tiers


def _donors(rng, train_tier: np.ndarray, canary_tier: np.ndarray) -> np.ndarray:
    out = np.zeros(len(canary_tier), dtype=np.int64)
    for k in np.unique(canary_tier):
        sel = canary_tier == k
        members = np.flatnonzero(train_tier == k)
        out[sel] = rng.choice(members, size=int(sel.sum())) if len(members) else 0
    return out


def _extended_privacy(prep, tier_of: np.ndarray, donors: np.ndarray, labels_by_slot):
    """The run's PrivacyPlan with one per-sample entry more for each canary (its tier's rate and clip, its group)."""
    p = prep.privacy
    if p.plan is None:
        rates = np.concatenate([p.sample_rates, np.full(len(tier_of), p.sample_rates[0])])
        return dataclasses.replace(p, sample_rates=rates)
    q, c = np.asarray(p.plan.sample_rates, float), np.asarray(p.plan.clip_norms, float)
    out = dataclasses.replace(p, sample_rates=np.concatenate([p.sample_rates, q[tier_of]]),
                              sample_clips=np.concatenate([p.sample_clips, c[tier_of]]))
    if p.clip_setup is not None and p.clip_setup.groups is not None:
        s = p.clip_setup
        group = np.asarray(s.groups)[donors]  # the group of a sample of the same tier ...
        if p.algorithm.group_by == "tier":
            group = tier_of
        elif p.algorithm.group_by == "class":  # ... or, by class, the canary's own label
            group = np.where(labels_by_slot >= 0, labels_by_slot, group)
        out = dataclasses.replace(out, clip_setup=dataclasses.replace(s, groups=np.concatenate([s.groups, group])))
    return out


class _StepView:
    """The mechanism as ``dp_step`` sees it, noting what a step applied: a private step calls ``noise_std()`` once,
    when its clips are final (DPSGD-F sets them from this batch's counts in ``see_batch``) and before ``observe``
    moves them (DP-SGD-S, Global-Adapt), so the canaries' contribution bounds are read at that moment too."""

    def __init__(self, mech, slots):
        self._mech, self._slots, self._applied = mech, slots, None

    def __getattr__(self, name):
        return getattr(self._mech, name)

    def noise_std(self):
        std = self._mech.noise_std()
        self._applied = (std, self._mech.contribution_bounds(self._slots))
        return std

    def applied(self):
        """(noise std, the canary slots' contribution bounds) of the step just taken (a non-private step asks for
        no noise std: its zero noise and its unbounded clips, read now), then forgets them."""
        out, self._applied = self._applied, None
        return out if out is not None else (self._mech.noise_std(), self._mech.contribution_bounds(self._slots))


def run_one_algorithm(config: OneRunConfig, algorithm, key: str, can: Canaries | None = None, *,
                      fault: Fault | None = None, should_stop=None, on_step=None, prep=None):
    """One run of ``algorithm`` with the canaries: (its AlgorithmOneRun, white scores, black scores). ``prep``: this
    algorithm's untrained ``prepare(config.run_for(algorithm))``, when the caller has it already."""
    run = config.run_for(algorithm)
    prep = prep or prepare(run)
    if can is None:
        can = design_canaries(config, prep)
    ds, dev = prep.dataset, prep.device
    n = prep.data.n_train
    tier_of = np.concatenate([can.input_tier, can.grad_tier])
    donors = np.concatenate([can.input_donor, can.grad_donor])
    labels = np.concatenate([can.label, np.full(can.n_grad, -1)])
    privacy = _extended_privacy(prep, tier_of, donors, labels)
    planned = privacy  # what the accountant and the auditor know (a Fault changes what runs, not this)
    all_tiers = np.concatenate([np.asarray(prep.tiers.train), tier_of])
    if fault is not None and fault.sensitivity_factor != 1.0 and privacy.sample_clips is not None:
        clips = privacy.sample_clips.copy()
        clips[all_tiers == fault.tier] *= fault.sensitivity_factor
        privacy = dataclasses.replace(privacy, sample_clips=clips)
    mech = build_mechanism(privacy=privacy, members=np.ones((1, n + len(tier_of)), bool), device=dev,
                           sample_tiers=all_tiers)
    rates = np.asarray(privacy.sample_rates, dtype=np.float64).copy()
    public_batch = float(rates[:n].sum() + 0.5 * rates[n:].sum())
    planned_rates = rates[n + can.n_input:].copy()  # what the auditor's likelihood ratio assumes
    if fault is not None and fault.rate_factor != 1.0:
        rates[all_tiers == fault.tier] = np.minimum(1.0, rates[all_tiers == fault.tier] * fault.rate_factor)
    members = np.concatenate([np.ones(n, bool), can.input_in, can.grad_in])[None, :]
    sampler = PoissonSampler(members, rates, dev, expected_batch=public_batch)
    models = model_axis(prep)
    clip = privacy.sample_clips
    if privacy.clip_setup is not None:  # moving clips (DP-SGD-S: up to c_max · C): a canary at least that long
        grad_norms = np.full(can.n_grad, privacy.clip_setup.largest_clip * config.canary_norm)
    elif clip is None:
        grad_norms = np.full(can.n_grad, run.clip_norm * config.canary_norm)
    else:
        grad_norms = clip[n + can.n_input:] * config.canary_norm
    shapes = {k: tuple(p.shape) for k, p in models.grads_of.params.items()}
    wrapped = GradientCanaries(models.grads_of, n_inputs=n + can.n_input, coords=can.coords, norms=grad_norms,
                               param_shapes=shapes, device=dev, spare=config.canary_slots == "spare")
    x_test, y_test = ds.x_test, ds.y_test
    x = torch.cat([ds.x_train, x_test[can.source]]).to(dev)
    y = torch.cat([ds.y_train, torch.as_tensor(can.label, dtype=ds.y_train.dtype)]).to(dev)
    gen = step_generator(run, dev)
    optimizer = make_optimizer(run, models.params)
    steps = prep.train_steps or prep.steps
    fixed_clips = None if planned.sample_clips is None else torch.as_tensor(
        planned.sample_clips[n + can.n_input:][None, :], device=dev)
    norm_cap = torch.as_tensor(grad_norms, device=dev)  # a canary contributes at most its own norm
    slots = torch.arange(n + can.n_input, n + can.n_input + can.n_grad, device=dev)[None, :]
    view = _StepView(mech, slots)
    started = time.time()
    for step in range(1, steps + 1):
        if should_stop is not None and should_stop():
            raise Cancelled(f"stopped at step {step - 1} of {key}")
        # this step's noise std and (moving) clips, as dp_step applied them (``_StepView``); planned clips otherwise
        out = dp_step(wrapped, x, y, sampler, view, gen)
        std, moving_clips = view.applied()
        canary_clips = fixed_clips if fixed_clips is not None and planned.clip_setup is None else moving_clips
        wrapped.observe_update(out.grads, sampler.expected_batch_tensor,  # back to the noisy sum's units
                               noise_std=std, rates=planned_rates, clips=torch.clamp(canary_clips, max=norm_cap))
        optimizer.zero_grad(set_to_none=True)
        models.set_grads({k: g for k, g in out.grads.items() if k != SPARE})  # the spare slots train nothing
        optimizer.step()
        if on_step is not None:
            on_step(step)
    seconds = time.time() - started
    white = np.zeros(0)
    if can.n_grad:
        noised = privacy.plan is not None  # the likelihood ratio needs the step's noise; the reference has none
        use = wrapped.likelihood if config.white_score == "likelihood" and noised else wrapped.scores / norm_cap
        white = use[0].cpu().numpy()
    model = models.module(0)
    logp = _log_probs(model, x[n:n + can.n_input]) if can.n_input else np.zeros((0, ds.num_classes))
    black = _logit_confidence(logp, can.label)
    keep = np.setdiff1d(np.arange(len(y_test)), can.source)
    acc = float(np.mean(_log_probs(model, x_test[keep].to(dev)).argmax(1) == y_test.numpy()[keep]))
    accountant = prep.privacy.accountant(run.delta)
    claimed = None
    if accountant is not None:
        accountant.step(steps)
        claimed = [float(e) for e in accountant.epsilons()]
    tiers = []
    for k, name in enumerate(prep.tiers.names):
        bounds = {}  # TierBound's fields: kind + "" (Steinke's bound) or "_fdp" → this tier's OneRunBound
        for kind, scores, tier_of, included in (("white", white, can.grad_tier, can.grad_in),
                                                 ("black", black, can.input_tier, can.input_in)):
            sel = tier_of == k
            if len(scores) and np.any(sel):
                for suffix, bound in (("", epsilon_lower_bound), ("_fdp", fdp_epsilon_lower_bound)):
                    bounds[kind + suffix] = bound(scores[sel], included[sel], delta=run.delta, beta=config.beta)
        tiers.append(TierBound(tier=str(name), epsilon=None if claimed is None else claimed[k], **bounds))
    result = AlgorithmOneRun(key=key, algorithm=algorithm.name, label=ALGORITHM_LABELS.get(algorithm.name, key),
                             formal_dp=bool(prep.privacy.formal_dp), formal_dp_reason=prep.privacy.formal_dp_reason,
                             tiers=tuple(tiers), accuracy=acc, steps=steps, seconds=seconds)
    return result, white, black


def _hat(bound) -> str:
    return "–" if bound is None else f"{bound.epsilon_hat:.2f}"


@torch.no_grad()
def _log_probs(model, x, batch: int = 1024) -> np.ndarray:
    model.eval()
    out = [torch.log_softmax(model(x[i:i + batch]).double(), 1) for i in range(0, len(x), batch)]
    model.train()
    return torch.cat(out).cpu().numpy() if out else np.zeros((0, 0))


def _logit_confidence(logp: np.ndarray, label: np.ndarray) -> np.ndarray:
    """log p_y − log(1 − p_y) of each row's ``label`` (the audit's membership score), stable in float64."""
    if len(label) == 0:
        return np.zeros(0)
    ly = logp[np.arange(len(label)), label]
    rest = logp.copy()
    rest[np.arange(len(label)), label] = -np.inf
    return ly - np.logaddexp.reduce(rest, axis=1)


def preview_one_run(config: OneRunConfig) -> dict:
    """What the one-run audit will train, before launch: steps per run, canaries per tier (raises ConfigError)."""
    config.validate()
    prep = prepare(config.run_for(config.algorithms[0]))
    can = design_canaries(config, prep)
    steps = prep.train_steps or prep.steps
    return {"kind": "one_run", "steps_per_run": steps, "runs": len(config.algorithms),
            "total_steps": steps * len(config.algorithms), "tier_names": list(prep.tiers.names),
            "canaries": config.canaries, "input_canaries": can.n_input // max(len(prep.tiers.names), 1),
            "n_train": prep.data.n_train}


def run_one_run_audit(config: OneRunConfig, *, life: RunLifecycle = NO_STORE, progress: bool = False,
                      should_stop=None, fault: Fault | None = None) -> OneRunReport:
    """Every algorithm of ``config`` once, with the same canaries, inside ``life``; returns the report (also the
    stored summary: a partial one after each algorithm)."""
    config.validate()
    if config.run.threads is not None:
        torch.set_num_threads(config.run.threads)
    first = prepare(config.run_for(config.algorithms[0]))
    can = design_canaries(config, first)
    steps = first.train_steps or first.steps
    total = steps * len(config.algorithms)
    keys = algorithm_keys(config)
    plan = {"kind": "one_run", "steps_per_run": steps, "tier_names": list(first.tiers.names),
            "formal_dp": all(a.no_formal_dp_reason is None for a in config.algorithms),  # the registry's rule
            "no_formal_dp": [ALGORITHM_LABELS.get(a.name, a.name) for a in config.algorithms
                             if a.no_formal_dp_reason is not None]}
    life.start(total_steps=total, plan=plan)
    per_tier_inputs = can.n_input // max(len(first.tiers.names), 1)
    report = OneRunReport(dataset=config.run.data.name, delta=config.run.delta, beta=config.beta,
                          canaries=config.canaries, input_canaries=per_tier_inputs)
    if per_tier_inputs < config.input_canaries:
        report = dataclasses.replace(report, notes=(f"input canaries capped at {per_tier_inputs} per tier (half the "
                                                    f"test set; asked {config.input_canaries})",))
    last = [time.time()]
    done = [0]

    def on_step(step):
        if time.time() - last[0] > 0.5:
            life.progress(done[0] + step)
            last[0] = time.time()

    results = []
    for k, (algorithm, key) in enumerate(zip(config.algorithms, keys)):
        got, _, _ = run_one_algorithm(config, algorithm, key, can, fault=fault, should_stop=should_stop,
                                      on_step=on_step, prep=first if k == 0 else None)  # first: prepared above
        results.append(got)
        done[0] += steps
        report = dataclasses.replace(report, algorithms=tuple(results))
        if progress:
            print(f"{got.label}: " + ", ".join(f"{t.tier} ε̂ {_hat(t.white)} (f-DP {_hat(t.white_fdp)})"
                                               for t in got.tiers), flush=True)
        if life.active:
            life.progress(done[0])
            life.store.set_summary(life.run_id, dataclasses.replace(report, partial=True).to_dict())
    life.finish(report.to_dict())
    return report
