"""The model axis against one model: a private step of M stacked models, per model, against one live model's
private step, timed side by side in one run (interleaved rounds), one torch thread.

    python bench/stacked.py [--models cnn resnet18] [--stacks 4 16] [--batch 256] [--rounds 10] [--json]

Each row is one architecture on MNIST-shaped inputs (1×28×28; ResNet-18 GN on 3×16×16 by default, ``--resnet-side``):
  single_ms            one live model (``ModuleGrads``, the dashboard run), DP-SGD step, default strategy
  stack{M}_ms          M models through ``StackedModels`` (the audit chunk / k-seed path), one dp_step for all M
  stack{M}_per_model   stack{M}_ms / M / single_ms  (target ≤ 0.9: stacking amortises the per-step overhead)
  vmap{M}_per_model    the same through the vmap path (what a stack of CNNs took before the layerwise stack)
Steps are dp_step with the DP-SGD mechanism (clip 1, σ 1) and plain SGD, every model on its own Poisson batch of
expected size ``--batch``; the data are random tensors of the dataset's shape (the timing does not depend on them).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datadir import interleaved_ms  # noqa: E402

from engine.config.run import ModelConfig  # noqa: E402
from engine.dp.grad_sample import ModuleGrads  # noqa: E402
from engine.dp.mechanisms import Clipped  # noqa: E402
from engine.dp.prepare import seeded_model  # noqa: E402
from engine.dp.stacked import StackedModels  # noqa: E402
from engine.dp.step import PoissonSampler, dp_step  # noqa: E402

N = 4096  # samples each model's Poisson batches are drawn from


def live_step(cfg, shape, batch, strategy=None):
    model = seeded_model(cfg, shape, 10, 0)
    grads_of = ModuleGrads(model) if strategy is None else ModuleGrads(model, strategy=strategy)
    return _stepper(grads_of, list(grads_of.params.values()), 1, shape, batch,
                    lambda grads: [setattr(p, "grad", grads[k][0]) for k, p in grads_of.params.items()])


def stacked_step(cfg, shape, batch, m, method="auto"):
    ens = StackedModels(cfg, shape, 10, list(range(m)), "cpu", method=method)
    assert method == "vmap" or ens.method == "layerwise", ens.method

    def apply(grads):
        for k, g in grads.items():
            ens.params[k].sub_(0.01 * g)
    return _stepper(ens, None, m, shape, batch, apply), ens.method


def _stepper(models, params, m, shape, batch, apply):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, *shape, generator=gen)
    y = torch.randint(0, 10, (N,), generator=gen)
    sampler = PoissonSampler(np.ones((m, N), bool), np.full(N, batch / N), torch.device("cpu"), expected_batch=batch)
    mech = Clipped(sample_clip_norms=np.ones(N), noise_std=1.0, n_models=m)
    opt = torch.optim.SGD(params, lr=0.01) if params is not None else None

    def step():
        out = dp_step(models, x, y, sampler, mech, gen)
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        apply(out.grads)
        if opt is not None:
            opt.step()
    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", nargs="+", default=["cnn", "resnet18"])
    ap.add_argument("--stacks", nargs="+", type=int, default=[4, 16])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--resnet-side", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--vmap", action="store_true", help="also time the vmap path (slow)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = {}
    for name in args.models:
        shape = (1, 28, 28) if name == "cnn" else (3, args.resnet_side, args.resnet_side)
        cfg = ModelConfig(name=name)
        steps = {"single": live_step(cfg, shape, args.batch)}
        for m in args.stacks:
            steps[f"stack{m}"], _ = stacked_step(cfg, shape, args.batch, m)
            if args.vmap:
                steps[f"vmap{m}"], _ = stacked_step(cfg, shape, args.batch, m, "vmap")
        ms = interleaved_ms(steps, args.rounds, warmup=2)
        row = {"shape": list(shape), **{f"{k}_ms": v for k, v in ms.items()}}
        for k, v in ms.items():
            if k != "single":
                m = int(k.removeprefix("stack").removeprefix("vmap"))
                row[f"{k}_per_model"] = v / m / ms["single"]
        rows[name] = row
    out = {"rows": rows, "batch": args.batch, "rounds": args.rounds, "threads": torch.get_num_threads(),
           "target_per_model": 0.9}
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return
    print(f"DP-SGD step, expected batch {args.batch} per model, 1 thread, {args.rounds} interleaved rounds")
    for name, row in rows.items():
        print(f"  {name} {tuple(row['shape'])}: single model {row['single_ms']:.1f} ms/step")
        for k, v in row.items():
            if k.endswith("_per_model"):
                label = k[: -len("_per_model")]
                print(f"    {label:<8} {row[label + '_ms']:8.1f} ms/step = {v:.2f}× the single model's step per model"
                      f"{'  (target ≤ 0.9)' if label.startswith('stack') else ''}")


if __name__ == "__main__":
    main()
