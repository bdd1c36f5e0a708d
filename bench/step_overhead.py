"""Per-step cost of the private algorithms against non-private SGD and Opacus' DP-SGD.

Papernot MNIST CNN, batch 256, the same 256 samples every step; the methods are timed
interleaved (round-robin) so machine noise hits them alike. Prints median ms/step and ratios;
with --json one line {"ratios": {...}, "ms_per_step": {...}, ...}.
The engine's private steps run with the default per-sample strategy (``engine.dp.grad_sample``) and,
suffixed ``_exact`` / ``_ghost``, with the other one; Opacus with its per-sample hooks and with its fast
gradient clipping ("opacus_ghost"). Targets: INO-SGD ≤ 1.10× non-private and ≤ 1.05× IDP-SGD; with "ghost" the
default, INO-SGD ≤ 1.25× non-private (issue 39).

The per-layer table (``layers`` in --json) is the measurement behind the default: each Linear/Conv2d layer's
per-sample norms and clipped sum timed both ways — the ghost norm from the Gram matrices (2T² per sample) and
the materialised per-sample gradient g_i (p·d) — beside the form Bu et al.'s rule (``engine.dp.ghost.use_ghost``)
picks for it; ``rule_is_faster`` says whether the rule picked the faster one.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datadir import interleaved_ms, use_shared_data  # noqa: E402

from engine.config.run import RunConfig  # noqa: E402
from engine.dp.grad_sample import DEFAULT_STRATEGY, STRATEGIES, ModuleGrads  # noqa: E402
from engine.dp.step import PoissonSampler, dp_step  # noqa: E402
from engine.train.loop import prepare  # noqa: E402

ENGINE = {"dpsgd": "DP-SGD", "idp_sample": "IDP-SGD", "ino": "INO-SGD", "dpsgd_s": "DP-SGD-S"}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    use_shared_data()
    warnings.filterwarnings("ignore")
    base = RunConfig().replace(**{"data.name": "mnist", "model.name": "cnn", "batch_size": args.batch,
                                  "epochs": 1.0, "optimizer.lr": 0.1})
    steps = {}
    batch_idx = np.random.default_rng(0).choice(60000, size=args.batch, replace=False)
    other = [s for s in STRATEGIES if s != DEFAULT_STRATEGY]
    for algo in ["nonprivate", *ENGINE]:
        prep = prepare(base.replace(**{"algorithm.name": algo}))
        steps[algo] = engine_step(prep, batch_idx)  # the default per-sample strategy
        for strategy in other if algo != "nonprivate" else ():
            steps[f"{algo}_{strategy}"] = engine_step(prepare(base.replace(**{"algorithm.name": algo})), batch_idx,
                                                      strategy)
    steps["opacus"] = opacus_step(prep, batch_idx, args.batch)
    steps["opacus_ghost"] = opacus_step(prep, batch_idx, args.batch, mode="ghost")
    layers = layer_table(prep, batch_idx, args.rounds)
    ms = interleaved_ms(steps, args.rounds)
    ratios = {f"{k}_vs_nonprivate": v / ms["nonprivate"] for k, v in ms.items() if k != "nonprivate"}
    ratios["ino_vs_idp"] = ms["ino"] / ms["idp_sample"]
    out = {"ratios": ratios, "ms_per_step": ms, "batch": args.batch, "rounds": args.rounds,
           "threads": torch.get_num_threads(), "device": "cpu", "default_strategy": DEFAULT_STRATEGY,
           "layers": layers}
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return
    print(f"Papernot CNN, MNIST, batch {args.batch}, {args.rounds} interleaved rounds, {torch.get_num_threads()} threads;"
          f" per-sample strategy {DEFAULT_STRATEGY} (the others suffixed)")
    for k, v in ms.items():
        print(f"  {k:<18} {v:8.2f} ms/step  ({v / ms['nonprivate']:.2f}× non-private)")
    print(f"  INO-SGD / IDP-SGD = {ratios['ino_vs_idp']:.3f}  (target ≤ 1.05)")
    print(f"  INO-SGD / non-private = {ratios['ino_vs_nonprivate']:.3f}  (target ≤ 1.25 with ghost by default; Opacus "
          f"{ratios['opacus_vs_nonprivate']:.2f}, Opacus fast gradient clipping {ratios['opacus_ghost_vs_nonprivate']:.2f})")
    for strategy in other:
        print(f"  INO-SGD ({strategy}) / non-private = {ratios[f'ino_{strategy}_vs_nonprivate']:.3f}")
    print("  per layer (norms + clipped sum, ms): ghost norm | materialised g_i | the rule's pick")
    for row in layers:
        print(f"    {row['layer']:<14} T={row['T']:<4} p·d={row['pd']:<6} {row['ghost_ms']:7.2f} | {row['materialised_ms']:7.2f}"
              f" | {row['rule']}{'' if row['rule_is_faster'] else '  (the slower one)'}")


def engine_step(prep, batch_idx, strategy=DEFAULT_STRATEGY):
    """One full optimizer step of the engine's loop (``engine.dp.step.dp_step``) on a fixed batch:
    the sampler's members are the batch, each with rate 1; per-sample work by ``strategy``
    (``engine.dp.grad_sample.STRATEGIES``: the exact per-sample path or ghost clipping / book-keeping)."""
    model, mech = prep.model, prep.mechanism
    x, y = prep.dataset.x_train, prep.dataset.y_train
    members = np.zeros((1, len(y)), bool)
    members[0, batch_idx] = True
    sampler = PoissonSampler(members, np.ones(len(y)), torch.device("cpu"), expected_batch=len(batch_idx))
    grads_of = ModuleGrads(model, strategy=strategy)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)

    def step():
        out = dp_step(grads_of, x, y, sampler, mech, gen)
        opt.zero_grad(set_to_none=True)
        for k, p in grads_of.params.items():
            p.grad = out.grads[k][0]
        opt.step()

    return step


def layer_table(prep, batch_idx, rounds):
    """Each Linear/Conv2d layer of the run's model on the bench's batch: the ghost norm and the materialised g_i
    (norms and the clipped sum, timed interleaved), and the form ``use_ghost`` picks."""
    from engine.dp.ghost import conv2d_patches, conv2d_per_sample_weight_grad, use_ghost
    from engine.dp.layerwise import trainable_layers

    model = prep.model
    x, y = prep.dataset.x_train[batch_idx], prep.dataset.y_train[batch_idx]
    layers = [(n, m) for n, m in trainable_layers(model) if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
    seen = {}
    hooks = [m.register_forward_hook(lambda mod, i, o, n=n: seen.__setitem__(n, (i[0].detach(), o)))
             for n, m in layers]
    loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum")
    for h in hooks:
        h.remove()
    grads = torch.autograd.grad(loss, [seen[n][1] for n, _ in layers])
    c = torch.rand(len(y))
    rows = []
    for (name, m), b in zip(layers, grads):
        a = seen[name][0]
        n = len(a)
        if isinstance(m, torch.nn.Conv2d):
            t, p, d = b.shape[2] * b.shape[3], b.shape[1], a.shape[1] * m.kernel_size[0] * m.kernel_size[1]

            def ghost(m=m, a=a, b=b):
                pa, bb = conv2d_patches(m, a, b.shape[2:]), b.reshape(n, b.shape[1], -1).transpose(1, 2)
                sq = (torch.bmm(pa, pa.transpose(1, 2)) * torch.bmm(bb, bb.transpose(1, 2))).sum((1, 2))
                return sq, (bb * c[:, None, None]).reshape(-1, bb.shape[2]).T @ pa.reshape(-1, pa.shape[2])

            def materialised(m=m, a=a, b=b):
                g = conv2d_per_sample_weight_grad(m, a, b).reshape(n, -1)
                return g.pow(2).sum(1), c @ g
        else:
            t, p, d = 1, b.shape[1], a.shape[1]

            def ghost(a=a, b=b):
                return a.pow(2).sum(1) * b.pow(2).sum(1), (b * c[:, None]).T @ a

            def materialised(a=a, b=b):
                g = torch.bmm(b[:, :, None], a[:, None, :]).reshape(n, -1)
                return g.pow(2).sum(1), c @ g
        ms = interleaved_ms({"ghost": ghost, "materialised": materialised}, rounds)
        rule = "ghost" if t == 1 or use_ghost(t, p, d) else "materialised"  # T = 1: the factored norm is exact
        other = "materialised" if rule == "ghost" else "ghost"
        rows.append({"layer": name, "T": t, "pd": p * d, "ghost_ms": ms["ghost"], "materialised_ms": ms["materialised"],
                     "rule": rule, "rule_is_faster": ms[rule] <= ms[other]})
    return rows


def opacus_step(prep, batch_idx, batch, mode="hooks"):
    """Opacus' DP-SGD step on the same batch: ``mode`` "hooks" (per-sample gradients) or "ghost" (its fast
    gradient clipping: ghost norms, then a second backward pass of the rescaled loss)."""
    from opacus import PrivacyEngine

    from engine.models.nets import build_model

    torch.manual_seed(0)
    model = build_model(prep.config.model, prep.dataset.input_shape, prep.dataset.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = prep.dataset.x_train[batch_idx], prep.dataset.y_train[batch_idx]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)
    crit = torch.nn.CrossEntropyLoss()
    made = PrivacyEngine().make_private(module=model, optimizer=opt, data_loader=loader, criterion=crit,
                                        noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False,
                                        grad_sample_mode=mode)
    model, opt = made[0], made[1]
    if mode == "ghost":
        crit = made[2]  # DPLossFastGradientClipping: its backward() runs both passes

    def step():
        opt.zero_grad(set_to_none=True)
        crit(model(x), y).backward()
        opt.step()

    return step


if __name__ == "__main__":
    main()
