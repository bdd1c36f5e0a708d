"""Paired seeds: do two runs of one seed start from the same weights and draw the same batches and noise?

``check_pairing(a, b, steps)`` prepares both configs with the engine (``engine.train.loop.prepare``), compares
the initial weights, then runs ``steps`` real training steps of each (``engine.dp.step.dp_step`` with the
run's own generator ``engine.train.loop.step_generator`` and optimizer) and compares, at every step, the Poisson
batch (indices and mask) and the generator's state afterwards: equal states mean both runs consumed the same
random numbers, so the Gaussian noise vectors were the same draws too (scaled by each run's own σ·C).
IDP-SGD and INO-SGD on the same SAMPLE plan have the same per-sample rates and parameter shapes, and
INO-SGD's weights draw no random numbers, so their pairs are exact; the check makes that a fact, not a hope.
"""
from __future__ import annotations

import numpy as np
import torch
from engine.dp.grad_sample import ModuleGrads
from engine.dp.step import PoissonSampler, dp_step
from engine.train.loop import make_optimizer, prepare, step_generator


def check_pairing(config_a, config_b, *, steps: int = 3) -> dict:
    preps = [prepare(c) for c in (config_a, config_b)]
    state = [{k: v.detach().clone() for k, v in p.model.state_dict().items()} for p in preps]
    same_init = state[0].keys() == state[1].keys() and all(torch.equal(state[0][k], state[1][k]) for k in state[0])
    same_rates = bool(np.array_equal(preps[0].sample_rates, preps[1].sample_rates))
    live = []
    for p in preps:
        ds = p.dataset
        x, y = ds.x_train.to(p.device), ds.y_train.to(p.device)
        n = len(y)
        live.append(dict(prep=p, x=x, y=y, gen=step_generator(p.config, p.device),
                         sampler=PoissonSampler(np.ones((1, n), bool), p.sample_rates, p.device,
                                                expected_batch=p.expected_batch),
                         grads=ModuleGrads(p.model), opt=make_optimizer(p.config, p.model)))
    same_batches = same_rng = True
    differ_grads = False
    for _ in range(int(steps)):
        outs = []
        for r in live:
            out = dp_step(r["grads"], r["x"], r["y"], r["sampler"], r["prep"].mechanism, r["gen"])
            r["opt"].zero_grad(set_to_none=True)
            for k, prm in r["grads"].params.items():
                prm.grad = out.grads[k][0]
            r["opt"].step()
            outs.append(out)
        same_batches &= bool(torch.equal(outs[0].idx, outs[1].idx) and torch.equal(outs[0].mask, outs[1].mask))
        same_rng &= bool(torch.equal(live[0]["gen"].get_state(), live[1]["gen"].get_state()))
        differ_grads |= any(not torch.equal(outs[0].grads[k], outs[1].grads[k]) for k in outs[0].grads)
    return {"same_init": bool(same_init), "same_rates": same_rates, "same_batches": same_batches,
            "same_random_numbers": same_rng, "gradients_differ": differ_grads, "steps": int(steps),
            "paired": bool(same_init and same_rates and same_batches and same_rng)}
