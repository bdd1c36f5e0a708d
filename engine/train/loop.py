"""The one training loop, readable top to bottom.

    prepare(config)        data, tiers, model(s), plan, mechanism — everything fixed before step 1
                           (engine.dp.prepare: prepare_data + prepare_privacy; build_mechanism, M = seeds)
    for step in 1..T:      engine.dp.step.dp_step, the step the audit's models take too:
        Poisson-sample each training sample with its tier's rate q_i (empty batches allowed)
        per-sample gradients g_i and losses ℓ_i (engine.dp.grad_sample, one batch at a time)
        C_i, ρ_i  ← mechanism                  (the only place algorithms differ)
        sum      = Σ ρ_i · g_i · min(1, C_i/‖g_i‖)  +  N(0, noise_std² I)
        mechanism.observe(...)                 (every step, empty batches included)
        step the optimizer on sum / (expected batch size Σ q_n N_n)
        every eval_every steps: per-tier/per-class metrics, ε spent per tier → store
                               (every model's loss non-finite: stop, nothing can train on)
    each model ends "finished", or "diverged" when a tier's test loss went non-finite or stayed far above its
    start (engine.models.metrics.diverged_at: the one rule, also the MID chart's badge)

"Repeat over k seeds" (``config.seeds = k``) trains k models in this same loop, on the model axis
(M = k): model j starts exactly like a single run with seed ``base + j`` (``seeded_model``), all k share
the data, the tiers, the plan (so ε spent is the same for all), one Poisson sampler of k rows and one
mechanism of k rows, drawn from the one generator of the base seed — so an INO-SGD and an IDP-SGD job
with the same base seed and k see the same batches and noise draws for every model index j. The k = 1
run trains a live module (``ModuleGrads``: layer hooks, the fastest M = 1 form); k > 1 trains stacked
parameters (``engine.dp.stacked.StackedModels``: closed form for LR/MLP, vmap over models for CNNs). The
run's optimizer (SGD with momentum, Adam) updates the stacked tensors: both are elementwise, so this is
exactly k separate optimizers. Each model's evaluations, steps, plan and summary go to its own store row
(``RunStore.create_job``: row j, seed = base + j, seed_index = j).

The records (:mod:`engine.train.records`) are built here, typed — the plan (:func:`plan_record`), each
evaluation (``_Evaluator``), the summary (:func:`summarize`) — and stored as their ``to_dict()``.
"""
from __future__ import annotations

import contextlib
import math
import secrets
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.config.run import ALGORITHM_LABELS, RunConfig
from engine.config.schema import ConfigError
from engine.dp.grad_sample import ModuleGrads
from engine.dp.mechanisms import build_mechanism
from engine.dp.prepare import PreparedData, PrivacyPlan, prepare_data, prepare_privacy, seeded_model, total_steps
from engine.dp.stacked import StackedModels
from engine.dp.step import PoissonSampler, dp_step
from engine.models.metrics import diverged_at, fairness_metrics, group_metrics, mid_markers, predict, recall_auc
from engine.store.lifecycle import NO_STORE, TERMINATED, Cancelled, RunLifecycle, stop_checked_every_step
from engine.train import individual
from engine.train.records import (ClassMetrics, EvalRecord, Fairness, MidMarkers, OverallMetrics, PlanRecord,
                                  RunSummary, TierMetrics, TierSummary)


@dataclass
class Prepared:
    """A run ready to start: its data, privacy plan, model(s) and mechanism (M = config.seeds)."""

    config: RunConfig  # the job's config (base seed, seed_index 0)
    data: PreparedData
    privacy: PrivacyPlan
    model: torch.nn.Module | None  # k = 1: the live module; None for k > 1 (see ``stacked``)
    mechanism: object
    steps: int  # T the privacy plan is made for
    train_steps: int = 0  # steps this run trains (config.train_epochs: the first ones of T); 0: T
    stacked: object | None = None  # k > 1: engine.dp.stacked.StackedModels, model j from seed base + j

    n_models = property(lambda self: self.config.seeds)

    dataset = property(lambda self: self.data.dataset)
    tiers = property(lambda self: self.data.tiers)
    device = property(lambda self: self.data.device)
    plan = property(lambda self: self.privacy.plan)
    sample_rates = property(lambda self: self.privacy.sample_rates)  # per training sample
    expected_batch = property(lambda self: self.privacy.expected_batch)
    tail_length = property(lambda self: self.privacy.tail_length)
    accountant_noise = property(lambda self: self.privacy.accountant_noise)
    info = property(lambda self: self.privacy.info)


def prepare(config: RunConfig) -> Prepared:
    """Everything fixed before step 1 of ``config``'s job (a per-seed row config prepares its whole job:
    data, tiers and plan use the base seed ``seed - seed_index``; model j its own seed ``base + j``)."""
    config.validate()
    config = config.job_config()
    data = prepare_data(config)
    n = data.n_train
    if config.batch_size > n:
        raise ConfigError("batch_size", f"must be at most the training set size {n}, got {config.batch_size}")
    ds = data.dataset
    k = config.seeds
    model = stacked = None
    if k == 1:
        model = seeded_model(config.model, ds.input_shape, ds.num_classes, config.seed).to(data.device)
    else:
        stacked = StackedModels(config.model, ds.input_shape, ds.num_classes, [c.seed for c in config.seed_configs()],
                                data.device)
    steps = total_steps(config, n)
    privacy = prepare_privacy(config, data, steps=steps)
    mechanism = build_mechanism(privacy=privacy, members=np.ones((k, n), bool), device=data.device,
                                sample_tiers=data.tiers.train)
    return Prepared(config=config, data=data, privacy=privacy, model=model, mechanism=mechanism, steps=steps,
                    train_steps=config.trained_steps(n), stacked=stacked)


def step_generator(config: RunConfig, device) -> torch.Generator:
    """The generator of a run's Poisson sampling and noise: seeded by ``config.seed``, or with
    ``secure_rng`` from the OS's entropy (as Opacus' secure mode; the run is then not reproducible)."""
    seed = secrets.randbits(63) if config.secure_rng else config.seed
    return torch.Generator(device=device).manual_seed(seed)


# --- the models of the model axis ------------------------------------------------------------

class _LiveModel:
    """k = 1: one live module; per-sample gradients by its layer hooks (``ModuleGrads``)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.grads_of = ModuleGrads(model)  # what dp_step differentiates
        self.params = list(self.grads_of.params.values())  # what the optimizer updates

    def set_grads(self, grads: dict) -> None:
        for k, p in self.grads_of.params.items():
            p.grad = grads[k][0]

    def log_probs(self, x: torch.Tensor) -> list:
        return [predict(self.model, x)]

    def module(self, j: int) -> torch.nn.Module:
        return self.model


class _StackedModels:
    """k > 1: stacked parameters (``engine.dp.stacked.StackedModels``); the optimizer updates the stacked
    tensors themselves (leading model axis), which is exactly k optimizers of one model each."""

    def __init__(self, stacked):
        self.stacked = stacked
        self.grads_of = stacked
        self.params = list(stacked.params.values())

    def set_grads(self, grads: dict) -> None:
        for k, p in self.stacked.params.items():
            p.grad = grads[k]

    @torch.no_grad()
    def log_probs(self, x: torch.Tensor, *, batch: int = 4096) -> list:
        chunk = max(64, batch // self.stacked.n_models)
        out = [torch.log_softmax(self.stacked.logits(x[a:a + chunk]), dim=-1) for a in range(0, len(x), chunk)]
        return list(torch.cat(out, 1).cpu().numpy())

    def module(self, j: int) -> torch.nn.Module:
        return self.stacked.module(j)


def model_axis(prep: Prepared):
    """The models ``prep`` trains, behind what the loop needs: ``grads_of`` (for dp_step), ``params`` (for
    the optimizer), ``set_grads(step grads)``, ``log_probs(x)`` (one (n, classes) array per model), ``module(j)``."""
    return _LiveModel(prep.model) if prep.stacked is None else _StackedModels(prep.stacked)


# --- the loop ---------------------------------------------------------------------------------

@dataclass
class RunResult:
    """One model's run: its records typed (``plan_record``, ``eval_records``, ``run_summary``) and as the store
    keeps them (``plan``, ``evals``, ``summary``: their ``to_dict()``), its trained model."""

    config: RunConfig  # this model's config (seed = base + seed_index)
    plan_record: PlanRecord
    eval_records: list  # EvalRecord, in step order
    run_summary: RunSummary
    model: torch.nn.Module
    per_seed: list = field(default_factory=list, repr=False)  # every model's RunResult, this one first (k = 1: [self])
    plan: dict | None = field(default=None, repr=False)  # the stored JSON of each record (None: from the record)
    evals: list | None = field(default=None, repr=False)
    summary: dict | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.plan is None:
            self.plan = self.plan_record.to_dict()
        if self.evals is None:
            self.evals = [e.to_dict() for e in self.eval_records]
        if self.summary is None:
            self.summary = self.run_summary.to_dict()


def train(config: RunConfig, *, life: RunLifecycle = NO_STORE, progress: bool = False, should_stop=None,
          prepared: Prepared | None = None) -> RunResult:
    """Train one run — with ``config.seeds = k`` its k models together — inside its lifecycle ``life``
    (:func:`engine.jobs.kinds.execute` opens it: the job's rows, start, finish; none: no store). The
    metrics of model j stream into row j of the job. Returns model 0's result; ``.per_seed`` holds all k."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    prep = prepared or prepare(config)
    config = prep.config  # the job's config
    k = prep.n_models
    mech, ds, device = prep.mechanism, prep.dataset, prep.device
    models = model_axis(prep)
    rows = _job_rows(life, k)
    store = life.store
    x_train, y_train = ds.x_train.to(device), ds.y_train.to(device)
    n = len(y_train)
    gen = step_generator(config, device)  # Poisson sampling, the noise, the quantile tracker's noise
    sampler = PoissonSampler(np.ones((k, n), bool), prep.sample_rates, device, expected_batch=prep.expected_batch)
    optimizer = make_optimizer(config, models.params)
    accountant = prep.privacy.accountant(config.delta)  # None without a formal guarantee: ε spent is null
    last = prep.train_steps or prep.steps
    eval_every = config.eval_every or max(1, last // 25)
    evaluator = _Evaluator(prep)
    tracker = evaluator.tracker = individual.run_tracker(prep)  # individual ε's panel; None: none to account
    plan = plan_record(prep)
    plan_dict = plan.to_dict()
    life.start(total_steps=last, plan=plan_dict)
    evals, stored, pending = [[] for _ in range(k)], [[] for _ in range(k)], [[] for _ in range(k)]
    started = time.time()
    last_flush = started

    def flush(step=None, metrics=None):
        if rows:
            store.log_progress({rid: pending[j] for j, rid in enumerate(rows)},
                               {rid: (step, metrics[j]) for j, rid in enumerate(rows)} if metrics else None)
        for p in pending:
            p.clear()

    def record_eval(step):
        es = evaluator(models, step, accountant, time.time() - started)
        ds = [e.to_dict() for e in es]
        for j, (e, d) in enumerate(zip(es, ds)):
            evals[j].append(e)
            stored[j].append(d)
        flush(step, ds)

    if tracker is not None:  # the panel's norms before step 1
        tracker.measure(0, models.grads_of, mech, x_train, y_train)
    record_eval(0)
    bar = _progress_bar(last, config.label) if progress else None
    # SIGTERM (Cancel) is checked every step, at its boundary; the terminal's bar line is cleared also when stopped
    with stop_checked_every_step() as stop, contextlib.closing(bar) if bar is not None else contextlib.nullcontext():
        for step in range(1, last + 1):
            if stop.requested:
                raise Cancelled(f"{TERMINATED} at step {step - 1}")
            if should_stop is not None and should_stop():
                raise Cancelled(f"stopped at step {step - 1}")
            out = dp_step(models.grads_of, x_train, y_train, sampler, mech, gen)
            optimizer.zero_grad(set_to_none=True)
            models.set_grads(out.grads)
            optimizer.step()
            if accountant is not None:
                accountant.step()
            if tracker is not None and tracker.due(step):
                tracker.measure(step, models.grads_of, mech, x_train, y_train)
            for j, (loss, size) in enumerate(zip(out.mean_losses(), out.batch_sizes.tolist())):
                pending[j].append((step, loss, int(size)))
            if bar is not None:
                bar.update(1)
            if step % eval_every == 0 or step == last:
                record_eval(step)
                last_flush = time.time()
                if all(not math.isfinite(e[-1].overall.loss) for e in evals):
                    break  # every model's weights went non-finite: it cannot train on; it ends diverged
            elif rows and time.time() - last_flush > 0.5:
                flush()  # keeps the UI's progress bar live between evaluations
                last_flush = time.time()
    seconds = time.time() - started
    configs = config.seed_configs()
    summaries = [summarize(prep, evals[j], seconds, seed_config=configs[j]) for j in range(k)]
    summary_dicts = [s.to_dict() for s in summaries]
    life.finish(*summary_dicts, statuses=[run_status(s) for s in summaries])
    results = [RunResult(config=configs[j], plan_record=plan, eval_records=evals[j], run_summary=summaries[j],
                         model=models.module(j), plan=plan_dict, evals=stored[j], summary=summary_dicts[j])
               for j in range(k)]
    for r in results:
        r.per_seed = results
    return results[0]


def _job_rows(life: RunLifecycle, k: int) -> list[int]:
    """Row ids of the job in seed order: exactly ``k`` of them (one per model), or [] without a store."""
    rows = life.rows
    if life.active and len(rows) != k:
        raise ConfigError("seeds", f"run {life.run_id} has {len(rows)} row(s) in the store for {k} seeds; create "
                                   "k-seed runs with JobManager.submit or RunStore.create_job(config.seed_configs())")
    return rows


def make_optimizer(config: RunConfig, params):
    """The run's optimizer over ``params`` (a module's parameters, or the stacked tensors of k models)."""
    params = params.parameters() if isinstance(params, torch.nn.Module) else params
    o = config.optimizer
    if o.name == "adam":
        return torch.optim.Adam(params, lr=o.lr)
    return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum)


def _progress_bar(total, label):
    from tqdm import tqdm

    return tqdm(total=total, desc=label, unit="step", leave=False)


def plan_record(prep: Prepared, **preview) -> PlanRecord:
    """The run's plan record (what the store keeps as its plan: ``to_dict()``). Without a formal guarantee
    ``epsilons`` is None and ``formal_dp_reason`` says why; DP-SGD-S records what it uses (``group_clip``: z_Δ,
    count noise, base clip, c_min/c_max, public group sizes) instead of a noise std and clips (those change
    every step and are in each evaluation: ``EvalRecord.group_clip``); a ``secure_rng`` run is not
    reproducible. ``preview``: the preview's fields (n_train, algorithm, seeds)."""
    table = prep.data.dataset.meta.get("table")  # a researcher's table: its sha256, size and schema (rerun checks)
    return PlanRecord.from_privacy(prep.privacy, prep.tiers, steps=prep.steps, trained_steps=prep.train_steps,
                                   secure_rng=prep.config.secure_rng, **preview,
                                   **({"extra": {"table": table}} if table else {}))


def preview(config) -> PlanRecord:
    """Validate a run config with the data (exactly like the worker will) and return its plan record, with
    ``n_train``, ``algorithm`` and ``seeds`` (models the job trains, each on this plan: the plan of a k-seed
    job is the plan of one seed). ``.private`` is False for the non-private reference (no planner fields).

    Raises ``ConfigError`` (or ``DataError``) with the engine's message."""
    seeds = config.validate().seeds
    prep = prepare(config.job_config().replace(seeds=1) if seeds > 1 else config)  # the same plan, one model built
    return plan_record(prep, n_train=prep.data.n_train, algorithm=config.algorithm.name, seeds=seeds)


class _Evaluator:
    """Test-set metrics per tier and class; per-tier metrics on a fixed training subsample
    when tiers are per-sample (random/explicit) and so undefined on test data."""

    def __init__(self, prep: Prepared):
        ds = prep.dataset
        self.prep = prep
        self.x, self.y = ds.x_test.to(prep.device), ds.y_test.numpy()
        self.tier_split = "test"
        self.tier_groups = prep.tiers.test
        self.sensitive = None
        self.tracker, self.groupings = None, individual.groupings(prep)  # tracker: set by train()
        attr = ds.default_sensitive
        if ds.num_classes == 2 and attr is not None and attr in ds.sensitive_test:
            self.sensitive = np.asarray(ds.sensitive_test[attr]).astype(str)
        if self.tier_groups is None:
            self.tier_split = "train"
            rng = np.random.default_rng(prep.config.seed + 7)
            n = len(ds.y_train)
            self.sub = np.sort(rng.choice(n, size=min(n, 5000), replace=False))
            self.x_sub = ds.x_train[self.sub].to(prep.device)
            self.y_sub = ds.y_train.numpy()[self.sub]
            self.tier_sub = prep.tiers.train[self.sub]

    def __call__(self, models, step, accountant, elapsed) -> list[EvalRecord]:
        """One evaluation record per model of ``models`` (``model_axis``)."""
        prep, ds = self.prep, self.prep.dataset
        k = len(prep.tiers.epsilons)
        spent = [float(e) for e in accountant.epsilons()] if accountant is not None else [None] * k
        subs = models.log_probs(self.x_sub) if self.tier_groups is None else None
        records = []
        for m, logp in enumerate(models.log_probs(self.x)):
            overall, tiers, classes, pred = group_metrics(self.y, logp, self.tier_groups, k, ds.num_classes)
            if subs is not None:
                _, tiers, _, _ = group_metrics(self.y_sub, subs[m], self.tier_sub, k, ds.num_classes)
            fairness = None
            if self.sensitive is not None:
                fairness = Fairness(**fairness_metrics(self.y, pred, self.sensitive))
            records.append(EvalRecord(
                step=step, epoch=step * prep.expected_batch / len(ds.y_train), elapsed=elapsed,
                overall=OverallMetrics(**overall),
                tiers=tuple(TierMetrics(name=prep.tiers.names[j], epsilon=prep.tiers.epsilons[j],
                                        epsilon_spent=spent[j], **t) for j, t in enumerate(tiers)),
                classes=tuple(ClassMetrics(name=ds.class_names[c], **cm) for c, cm in enumerate(classes)),
                tier_split=self.tier_split, fairness=fairness,
                individual_epsilon=None if self.tracker is None else individual.summaries(
                    self.tracker, prep, step, m, self.groupings),
                **EvalRecord.mechanism_fields(mechanism_state(prep.mechanism, m))))
        return records


def mechanism_state(mechanism, model: int) -> dict:
    """``mechanism.state()`` of one model of the axis: its ``model_state(model)`` when the mechanism has
    one and trains several models, else the state it reports (for M > 1: over all models)."""
    if mechanism.n_models > 1 and hasattr(mechanism, "model_state"):
        return mechanism.model_state(model)
    return mechanism.state()


def run_status(summary: RunSummary) -> str:
    """How a model's run ended by its own code: ``diverged`` when its summary records a divergence, else
    ``finished``."""
    return "diverged" if summary.diverged_step is not None else "finished"


def summarize(prep: Prepared, evals: list[EvalRecord], seconds: float, *,
              seed_config: RunConfig | None = None) -> RunSummary:
    """One model's summary from its evaluations (step order): the last one's metrics, per tier the recall AUC
    over the run and the MID markers, the step it diverged from (the lab's one rule,
    :func:`engine.models.metrics.diverged_at`, None when it did not); the model's seed (a k-seed job: also its
    index and k); the steps it trained (fewer than planned when every model diverged)."""
    last = evals[-1]
    steps = [e.step for e in evals]
    losses = [[t.loss for t in e.tiers] for e in evals]
    mids = mid_markers(losses, steps)
    tiers = tuple(TierSummary(name=t.name, epsilon=t.epsilon, epsilon_spent=t.epsilon_spent, recall=t.recall,
                              accuracy=t.accuracy, loss=t.loss,
                              recall_auc=recall_auc(steps, [e.tiers[j].recall for e in evals]),
                              mid=MidMarkers(**mids[j]))
                  for j, t in enumerate(last.tiers))
    config = seed_config or prep.config
    several = config.seeds > 1
    return RunSummary(
        algorithm=prep.config.algorithm.name,
        label=prep.config.label or ALGORITHM_LABELS[prep.config.algorithm.name],
        steps=last.step, planned_steps=prep.steps, seconds=seconds,
        formal_dp=prep.privacy.formal_dp, formal_dp_reason=prep.privacy.formal_dp_reason,
        accuracy=last.overall.accuracy, balanced_accuracy=last.overall.balanced_accuracy, loss=last.overall.loss,
        tiers=tiers, class_recall=tuple(c.recall for c in last.classes), fairness=last.fairness,
        seed=config.seed, seed_index=config.seed_index if several else None, seeds=config.seeds if several else None,
        diverged_step=diverged_at(steps, losses), individual_epsilon=last.individual_epsilon)
