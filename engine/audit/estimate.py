"""An audit's runtime estimate before it starts (the page shows it beside the launch button).

    estimate = Σ over algorithms of (2R + PA-LOOA models) × steps per model × per-model-step cost

The per-model-step cost is measured, not guessed: one chunk of the audit's own size trains for a few
steps of each distinct mechanism (the same ``engine.dp.step.dp_step`` the audit runs, on the audit's
device), and its wall time is divided by models × steps. Statistics (bootstrap, null permutations)
are not included; they add seconds to a minute per algorithm on 2R = 400 and 30 000 samples.
"""
from __future__ import annotations

import time

import torch

from engine.audit import controls
from engine.audit.chunks import on_device
from engine.dp.mechanisms import build_mechanism
from engine.dp.stacked import StackedModels, sgd_train
from engine.dp.step import PoissonSampler

_PROBE_STEPS = 3


def estimate_runtime(setup, *, probe_steps: int = _PROBE_STEPS) -> dict:
    """``{"seconds", "model_steps", "per_model_step_seconds": {algorithm key: s}, "how"}`` for a
    prepared audit (:func:`engine.audit.runner.prepare_audit`)."""
    cfg = setup.config
    ds, dev = setup.dataset, setup.device
    x, y = on_device(ds.x_train, dev), on_device(ds.y_train, dev)
    k = max(1, min(setup.chunk_models, setup.n_models))
    members = setup.membership[:k]
    looa = (cfg.looa_k + 1) * cfg.looa_models if cfg.looa_k else 0
    per_step, cache, total, model_steps = {}, {}, 0.0, 0
    for a in setup.algos:
        kind = (a.algo.name, a.formal_dp)
        if kind not in cache:
            ens = StackedModels(cfg.run.model, ds.input_shape, ds.num_classes, list(range(k)), dev)
            sampler = PoissonSampler(members, a.sample_rates, dev)
            mech = build_mechanism(privacy=a.privacy, members=members, device=dev)
            gen = torch.Generator(device=dev).manual_seed(0)
            sgd_train(ens, x, y, sampler, mech, steps=1, lr=cfg.run.optimizer.lr, gen=gen)  # warm-up
            t0 = time.perf_counter()
            sgd_train(ens, x, y, sampler, mech, steps=probe_steps, lr=cfg.run.optimizer.lr, gen=gen)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            cache[kind] = (time.perf_counter() - t0) / (k * probe_steps)
        per_step[a.key] = cache[kind]
        n_models = setup.n_models + looa
        model_steps += n_models * setup.steps
        total += cache[kind] * n_models * setup.steps
    pilot = ""
    if cfg.controls:  # the accuracy-matched control's ε search: at most max_pilot_runs() trainings of a few models
        dpsgd = next(a for a in setup.algos if a.algo.name == "dpsgd")
        pilot_steps = controls.max_pilot_runs() * controls.pilot_models(setup.n_models) * setup.steps
        model_steps += pilot_steps
        total += per_step[dpsgd.key] * pilot_steps
        pilot = f" + {pilot_steps:,} for the accuracy-matched control's ε search"
    how = (f"{model_steps:,} model-steps ({len(setup.algos)} algorithms × {setup.n_models + looa} models × "
           f"{setup.steps} steps{pilot}) × a per-model-step cost measured on {probe_steps} steps of a {k}-model "
           f"chunk on {dev}; training only")
    return {"seconds": float(total), "model_steps": int(model_steps),
            "per_model_step_seconds": {key: float(v) for key, v in per_step.items()}, "how": how}
