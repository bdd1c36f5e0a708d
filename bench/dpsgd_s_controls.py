"""DP-SGD-S against DP-SGD and its two controls (issue 18's docs/RESULTS.md table): for Adult (groups: sex) and
MNIST-10k (groups: the digits) at ε = 1 and 10, one audit per (dataset, ε) with DP-SGD, DP-SGD-S and
``controls`` on (noise-matched and accuracy-matched DP-SGD), all on the same 2R splits, so Δ and GPR differences
are paired.

    python bench/dpsgd_s_controls.py [--R 200] [--datasets adult,mnist] [--epsilons 10,1] [--threads N]
                                     [--out bench/results/dpsgd_s_controls.jsonl] [--markdown FILE]

Training as the adult-paper / mnist-paper presets (LR, 20 epochs, lr 0.1, C 5, batch 256); PA-LOOA off.
Prints one JSON line per audit (the audit's compact summary with its verdict and wall time) and appends it to
``--out``; ``--markdown`` writes the tables docs/RESULTS.md shows. Not a test; wall times depend on the load.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from engine.audit.pa_alooa.presets import PRESETS
from engine.audit.pa_alooa.report import AuditReport
from engine.audit.pa_alooa.runner import run_audit
from engine.audit.pa_alooa.summary import compact_summary
from engine.audit.pa_alooa.verdict import verdict_lines
from engine.config.run import AlgorithmConfig
from engine.config.schema import ConfigError


def audit_config(dataset: str, epsilon: float, R: int):
    base = PRESETS["adult-paper" if dataset == "adult" else "mnist-paper"]
    group_by = "attribute" if dataset == "adult" else "class"
    return base.replace(epsilon=float(epsilon), R=int(R), looa_k=0, controls=True, name="",
                        algorithms=(AlgorithmConfig(name="dpsgd"), AlgorithmConfig(name="dpsgd_s", group_by=group_by)))


def _ci(e, spec=".2f") -> str:
    return "—" if e is None or e.value is None else f"{e.value:{spec}} [{e.low:{spec}}, {e.high:{spec}}]"


def markdown(rows: list[dict]) -> str:
    """The algorithms table and the paired-comparisons table, then each audit's verdict."""
    out = ["| data | ε | algorithm | σ | ε (accountant) | accuracy % [95 % CI] | Δ pp [95 % CI] | resolved |",
           "|---|---|---|---|---|---|---|---|"]
    comp = ["| data | ε | DP-SGD-S − | Δ diff pp [paired CI] | unpaired CI | accuracy diff (points) [CI] | "
            "GPR diff per group, pp [paired CI] |", "|---|---|---|---|---|---|---|"]
    verdicts = []
    for row in rows:
        r = AuditReport.from_dict(row["report"])
        name = "Adult (sex)" if r.dataset == "adult" else "MNIST-10k (digits)"
        eps = row["epsilon"]
        for a in r.algorithms:
            sigma = a.control.noise_multiplier if a.control is not None else (
                a.realised_noise_multiplier if a.realised_noise_multiplier is not None else
                (a.plan[0]["noise_multiplier"] if a.plan else None))
            claimed = a.control.epsilon if a.control is not None else (a.epsilon[0].claimed if a.epsilon else None)
            note = " (realised z_Δ · mean max C_k / C)" if a.realised_noise_multiplier is not None else ""
            out.append(f"| {name} | {eps:g} | {a.label} | {sigma:.3f}{note} | {claimed:.3g} | {_ci(a.accuracy_ci)} | "
                       f"{_ci(a.delta)} | {'—' if a.resolved is None else ('yes' if a.resolved else 'no')} |")
        for c in r.comparisons:
            groups = "; ".join(f"{g}: {_ci(e)}" for g, e in c.groups.items())
            comp.append(f"| {name} | {eps:g} | {c.b_label} | {_ci(c.delta)} | "
                        f"[{c.delta_unpaired.low:.2f}, {c.delta_unpaired.high:.2f}] | {_ci(c.accuracy)} | {groups} |")
        verdicts.append(f"* **{name}, ε = {eps:g}** (2R = {r.n_models}, {row['seconds']:.0f} s): "
                        + " ".join(verdict_lines(r)))
    return "\n".join(out) + "\n\n" + "\n".join(comp) + "\n\n" + "\n".join(verdicts) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--R", type=int, default=200)
    p.add_argument("--datasets", default="adult,mnist")
    p.add_argument("--epsilons", default="10,1")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="bench/results/dpsgd_s_controls.jsonl")
    p.add_argument("--markdown", default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    try:
        for dataset in args.datasets.split(","):
            for eps in (float(e) for e in args.epsilons.split(",")):
                t0 = time.time()
                report = run_audit(audit_config(dataset, eps, args.R))
                row = {"dataset": dataset, "epsilon": eps, "R": args.R, "seconds": time.time() - t0,
                       "threads": torch.get_num_threads(), "summary": compact_summary(report),
                       "report": report.to_dict()}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "report"}, sort_keys=True), flush=True)
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                with open(args.out, "a") as f:
                    f.write(json.dumps(row, sort_keys=True) + "\n")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
