"""Issue 62: the extra training time of individual ε — measuring the panel's gradient norms at the default checkpoint
cadence (``engine.dp.individual_panel``) and accounting them (``engine.dp.individual``) — against a plain run.

For the default digits config and the MNIST CNN config (the demo's model and data), each with its default algorithm
(INO-SGD): blocks of K training steps (K = ``checkpoint_every(panel, expected batch)``, the proposed cadence) without
and with one ``PanelTracker.measure`` + a per-class ``summary`` (the panel's ε), interleaved (round r times one block of
each), on the same model as it trains. Prints the median block times and their ratio (goal ≤ 1.15), the same
ratio from the parts' medians, the cost of one measurement and of one summary, and the tracker's one-off set-up
(its ratio grids, per tier); ``--json`` one line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datadir import use_shared_data  # noqa: E402

from engine.config.run import RunConfig  # noqa: E402
from engine.dp import individual  # noqa: E402
from engine.dp.individual_panel import PANEL_PER_GROUP, PanelTracker  # noqa: E402
from engine.dp.step import PoissonSampler, dp_step  # noqa: E402
from engine.train.loop import make_optimizer, model_axis, prepare, step_generator  # noqa: E402

CONFIGS = {"digits": {}, "mnist_cnn": {"data.name": "mnist", "model.name": "cnn"}}


def bench(name: str, fields: dict, rounds: int) -> dict:
    prep = prepare(RunConfig().replace(**fields))
    ds, mech, plan = prep.dataset, prep.mechanism, prep.plan
    models = model_axis(prep)
    x, y = ds.x_train.to(prep.device), ds.y_train.to(prep.device)
    n = len(y)
    gen = step_generator(prep.config, prep.device)
    sampler = PoissonSampler(np.ones((1, n), bool), prep.sample_rates, prep.device, expected_batch=prep.expected_batch)
    optimizer = make_optimizer(prep.config, models.params)
    individual.ratio_grid_rdp.cache_clear()
    t0 = time.perf_counter()
    tracker = PanelTracker.for_run(privacy=prep.privacy, sample_tiers=prep.tiers.train,
                                   panel_groups=ds.y_train.numpy(), delta=prep.config.delta, seed=prep.config.seed,
                                   steps=prep.steps)
    grid_s = time.perf_counter() - t0
    panel, every = tracker.panel, tracker.every
    step_no = [0]
    parts = {"measure": [], "epsilons": []}

    def train(k: int) -> None:
        for _ in range(k):
            out = dp_step(models.grads_of, x, y, sampler, mech, gen)
            optimizer.zero_grad(set_to_none=True)
            models.set_grads(out.grads)
            optimizer.step()
            step_no[0] += 1

    def measure() -> None:
        t = time.perf_counter()
        tracker.measure(step_no[0], models.grads_of, mech, x, y)
        t1 = time.perf_counter()
        tracker.summary(step_no[0], ds.y_train.numpy(), [str(c) for c in range(ds.num_classes)])
        t2 = time.perf_counter()
        parts["measure"].append(t1 - t)
        parts["epsilons"].append(t2 - t1)

    train(3)  # warm-up
    measure()
    plain, measured = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        train(every)
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        train(every)
        measure()
        measured.append(time.perf_counter() - t)
    p, m = statistics.median(plain), statistics.median(measured)
    return {"config": name, "algorithm": prep.config.algorithm.name, "model": type(prep.model).__name__,
            "n_train": n, "panel": len(panel), "panel_per_group": PANEL_PER_GROUP,
            "expected_batch": prep.expected_batch, "checkpoint_every": every, "steps": prep.steps,
            "checkpoints_per_run": -(-prep.steps // every), "rounds": rounds, "block_plain_s": p,
            "block_measured_s": m, "ratio": m / p, "ms_per_step": 1000 * p / every,
            # each round's own ratio (its two blocks ran back to back), their median
            "ratio_paired": statistics.median(b / a for a, b in zip(plain, measured)),
            # the same from the parts' own medians: less exposed to a loaded machine's block-to-block swings
            "ratio_from_parts": 1 + sum(statistics.median(v) for v in parts.values()) / p,
            **{f"{k}_ms": 1000 * statistics.median(v) for k, v in parts.items()},
            "grid_s_once": grid_s, "tiers": len(plan.sample_rates)}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    use_shared_data()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    rows = [bench(name, CONFIGS[name], args.rounds) for name in args.configs]
    if args.json:
        print(json.dumps({"rows": rows, "threads": args.threads}, sort_keys=True))
        return
    for r in rows:
        print(f"{r['config']} ({r['algorithm']}, {r['model']}, n={r['n_train']}, expected batch {r['expected_batch']:.0f}, "
              f"{args.threads} thread(s)): panel {r['panel']} samples, a checkpoint every {r['checkpoint_every']} "
              f"steps ({r['checkpoints_per_run']} a run of {r['steps']} steps)")
        print(f"  {r['rounds']} interleaved blocks: plain {r['block_plain_s']:.3f} s ({r['ms_per_step']:.2f} ms/step), "
              f"with the measurement {r['block_measured_s']:.3f} s → ratio {r['ratio']:.3f} (goal ≤ 1.15; median of the "
              f"rounds' own ratios {r['ratio_paired']:.3f}, from the parts' medians {r['ratio_from_parts']:.3f})")
        print(f"  one measurement {r['measure_ms']:.0f} ms (norms, ratios, checkpoint), the per-class summary "
              f"{r['epsilons_ms']:.1f} ms; the tracker's set-up (ratio grids) once {r['grid_s_once']:.2f} s for "
              f"{r['tiers']} tiers")


if __name__ == "__main__":
    main()
