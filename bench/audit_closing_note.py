"""The closing note's audit table (issue 8): for Adult (groups: sex) and MNIST-10k (groups: the digits) at
ε = 1 and 10 — accuracy, GPR per group with its CI and null floor, Δ with its CI and the null Δ spread,
resolved — for non-private SGD, DP-SGD and DP-SGD-S, and each audit's wall time at 2R = 400.

    python bench/audit_closing_note.py [--training paper|default] [--datasets adult,mnist] [--out DIR]

``paper`` trains as the adult-paper / mnist-paper presets (20 epochs, lr 0.1, C 5, batch 256);
``default`` as the audit's defaults (2 epochs, lr 1, C 1). Each (dataset, ε, algorithm) is its own audit
(non-private once per dataset: it does not depend on ε), so each wall time is one algorithm's 400 models
plus its statistics. Not a test; timings depend on the machine's load.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from engine.audit.pa_alooa.config import DEFAULT_RUN
from engine.audit.pa_alooa.presets import PRESETS
from engine.config.run import AlgorithmConfig
from engine.config.schema import ConfigError


def _cfg(dataset: str, training: str, epsilon: float, algo: AlgorithmConfig):
    base = PRESETS["adult-paper" if dataset == "adult" else "mnist-paper"]
    if training == "default":
        base = base.replace(run=DEFAULT_RUN.replace(**{"data.name": base.run.data.name,
                                                       "data.max_train": base.run.data.max_train}))
    return base.replace(epsilon=epsilon, algorithms=(algo,), looa_k=0, name="")


def _row(dataset, epsilon, report, seconds):
    a = report.algorithms[0]
    return {"dataset": dataset, "epsilon": epsilon, "algorithm": a.label, "formal_dp": a.formal_dp,
            "claimed": [t.claimed for t in a.epsilon], "accuracy": a.accuracy.mean,
            "gpr": {g: [e.value, e.low, e.high] for g, e in a.gpr.items()}, "null_groups": a.null_groups,
            "delta": [a.delta.value, a.delta.low, a.delta.high],
            "null_delta": None if a.null_delta is None else [a.null_delta.low, a.null_delta.high],
            "resolved": a.resolved, "seconds": seconds, "steps": report.steps_per_model, "n_train": report.n_train}


def table(path) -> str:
    """The rows of a results file as a Markdown table."""
    def ci(v):
        return "—" if v is None or v[0] is None else f"{v[0]:.4f} [{v[1]:.4f}, {v[2]:.4f}]"

    lines = ["| data | ε | algorithm | acc | GPR per group [95 % CI] (own null floor) | Δ pp [CI] | null Δ | resolved "
             "| wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for line in Path(path).read_text().splitlines():
        r = json.loads(line)
        if "error" in r:
            lines.append(f"| {r['dataset']} | {r['epsilon']:g} | {r['algorithm']} | error: {r['error']} |||||| ")
            continue
        gpr = "; ".join(f"{g}: {ci(v)} ({r['null_groups'].get(g, float('nan')):+.4f})" for g, v in r["gpr"].items())
        d, nd = r["delta"], r["null_delta"]
        lines.append(f"| {r['dataset']} | {r['epsilon']:g} | {r['algorithm']} | {r['accuracy']:.3f} | {gpr} | "
                     f"{d[0]:.2f} [{d[1]:.2f}, {d[2]:.2f}] | [{nd[0]:.2f}, {nd[1]:.2f}] | "
                     f"{'yes' if r['resolved'] else 'no'} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from engine.audit.pa_alooa.runner import run_audit

    p = argparse.ArgumentParser()
    p.add_argument("--training", choices=("paper", "default"), default="paper")
    p.add_argument("--datasets", default="adult,mnist")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--algorithms", default="nonprivate,dpsgd,dpsgd_s")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--table", help="print a results file (.jsonl) as a Markdown table and exit")
    args = p.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"audit_closing_note_{args.training}.jsonl"  # appended to
    for ds in args.datasets.split(","):
        by = "attribute" if ds == "adult" else "class"
        cells = [(10.0, AlgorithmConfig(name="nonprivate"))]
        for eps in (10.0, 1.0):
            cells += [(eps, AlgorithmConfig(name="dpsgd")), (eps, AlgorithmConfig(name="dpsgd_s", group_by=by))]
        for eps, algo in [c for c in cells if c[1].name in args.algorithms.split(",")]:
            cfg = _cfg(ds, args.training, eps, algo)
            t0 = time.time()
            try:
                row = _row(ds, eps, run_audit(cfg), time.time() - t0)
            except ConfigError as e:
                row = {"dataset": ds, "epsilon": eps, "algorithm": algo.name, "error": str(e)}
            row["training"] = args.training
            with path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
