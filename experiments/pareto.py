"""Pareto sweep: how aggressive a TIF buys how much balance at what accuracy (issue 11 §2).

    python experiments/pareto.py --quick    MNIST, 2 epochs, 2 paired seeds, γ ∈ {0.25, 0.5, 1} × β ∈ {1, 3}
    python experiments/pareto.py            12 epochs, 5 seeds, γ ∈ {0.25, 0.5, 1, 2} × β ∈ {1, 3}

INO-SGD with BIF = Beta CDF(x/γ; 1, β) for each (γ as a fraction of the expected batch clip mass, β), every
setting on the same seeds as the IDP-SGD reference (the run settings of ``base_from``, the ino_vs_idp
spec). Per setting, mean ± s.e. over seeds: overall test accuracy, the imbalance (recall of the least private
tier minus the most private tier, pp) and the most private tier's recall AUC (%), at the end and at epoch 1.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import common  # noqa: E402
from experiments.common import ConfigError, mean_se, pm  # noqa: E402
from engine.figures.common_span import common_span
from engine.figures.experiments import PARETO_COLUMNS, fig_pareto
from engine.figures.export import load_runs
from engine.figures.frames import compared_eval

NAME = "pareto"


def settings(spec: dict, sweep_over: dict) -> list[tuple[str, dict]]:
    sweep = {**spec.get("sweep", {}), **sweep_over}
    tails, betas = sweep.get("tail_fraction", [0.5]), sweep.get("beta", [1.0])
    if not isinstance(tails, list) or not isinstance(betas, list) or not tails or not betas:
        raise ConfigError("sweep", "tail_fraction and beta must be non-empty lists")
    out = [("reference", dict(spec.get("reference", {"name": "idp_sample"})))]
    for b in betas:
        for t in tails:
            out.append((f"ino_t{t:g}_b{b:g}", {"name": "ino", "idp_mode": "sample", "tif": "beta",
                                               "alpha": sweep.get("alpha", 1.0), "beta": b, "tail_fraction": t}))
    return out


def run_experiment(args) -> tuple[dict, str]:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = common.load_spec_sections(args.config, ("modes",))
    base_from = spec.get("base_from")
    if not isinstance(base_from, str):
        raise ConfigError("base_from", "must name the spec whose base run settings the sweep uses")
    base = common.load_spec(str(Path(args.config).resolve().parent / base_from))["base"]
    raw = dict(spec["modes"].get(args.mode) or {})
    if args.mode not in spec["modes"]:
        raise ConfigError("mode", f"this experiment has no {args.mode} mode")
    sweep_over = {k[6:]: raw.pop(k) for k in list(raw) if k.startswith("sweep.")}
    overrides, seeds = common.mode_of({"modes": {args.mode: raw}}, args.mode)
    grid = settings(spec, sweep_over)
    store = common.open_store(common.store_path(args, NAME))
    started = time.time()
    from experiments.tiered import RunRef

    keys = [(key, s) for s in seeds for key, _ in grid]
    configs = {(key, s): common.run_config(base, overrides, algorithm=algo, seed=s, device=args.device,
                                           threads=args.threads, name=f"{key} seed {s}")
               for s in seeds for key, algo in grid}
    trained = common.train_runs(store, [(configs[k], f"{NAME}-{args.mode}-{int(started)}-seed{k[1]}") for k in keys],
                                reuse=args.reuse, backend=args.backend)
    refs = [RunRef(rid, key, s) for (key, s), (rid, _) in zip(keys, trained)]
    for r in refs:
        sys.stderr.write(f"{r.key} seed {r.seed}: run {r.run_id}\n")
    sys.stderr.write(f"[{time.time() - started:7.1f}s] {len(refs)} runs trained\n")

    runs = load_runs(store, [r.run_id for r in refs])
    reference = configs[("reference", seeds[-1])]
    result = analyse(runs, refs, grid, seeds, reference.train_epochs or reference.epochs)
    result.update(mode=args.mode, store=str(store.path), wall_seconds=round(time.time() - started, 1),
                  run_ids={f"{r.key}/{r.seed}": r.run_id for r in refs})
    out = common.figures_dir(args, NAME)
    if out is not None:
        import pandas as pd


        frame = pd.DataFrame([{c: row.get(c) for c in PARETO_COLUMNS} for row in result["settings"]],
                             columns=PARETO_COLUMNS)
        result["figures"] = [str(p) for p in [common.export_png(fig_pareto(frame), out / f"{NAME}_{args.mode}_imbalance_vs_accuracy.png",
                                                                width=1100, height=500)] if p]
    return result, markdown(result)


def analyse(runs, refs, grid, seeds, epochs) -> dict:
    import numpy as np

    from experiments import tiered

    span = common_span(runs)  # what tiered.frames cuts the histories to
    th, _ = tiered.frames(runs, refs)
    tiers = tiered.tier_order(th)  # most private first
    points = tiered.epoch_steps(th, epochs)
    acc = {}
    for run in runs:
        ref = next(r for r in refs if r.run_id == run["id"])
        acc.setdefault(ref.key, []).append(100.0 * compared_eval(run, span).overall.accuracy)
    def per_seed(key):
        gap = {p: [] for p in ("final", "epoch1")}
        for s in seeds:
            for p in gap:
                rec = tiered.tier_at(th, key, s, points.get(p, points["final"]), tiers)
                gap[p].append(100.0 * (rec[-1] - rec[0]))
        aucs = [100.0 * tiered.tier_auc(th, key, s, tiers)[0] for s in seeds]
        return np.array(gap["final"]), np.array(gap["epoch1"]), np.array(aucs)

    ref_gap, ref_gap1, ref_auc = per_seed("reference")
    rows = []
    for key, algo in grid:
        gap, gap1, aucs = per_seed(key)
        a, ase, n = mean_se(acc[key])
        row = {"setting": key, "kind": "reference" if key == "reference" else "ino",
               "tail_fraction": algo.get("tail_fraction"), "beta": algo.get("beta"), "accuracy": a, "accuracy_se": ase,
               "n": n}
        # levels (mean ± s.e. over seeds) and paired changes against the IDP-SGD run of the same seed
        for name, v, ref in (("imbalance", gap, ref_gap), ("imbalance_epoch1", gap1, ref_gap1),
                             ("auc_private", aucs, ref_auc)):
            row[name], row[f"{name}_se"], _ = mean_se(v)
            row[f"{name}_change"], row[f"{name}_change_se"], _ = mean_se(v - ref)
        rows.append(row)
    return {"tiers": tiers, "seeds": list(seeds), "n_seeds": len(seeds), "settings": rows,
            "compared_over": span.words()}


def markdown(r: dict) -> str:
    over = [f"Compared {r['compared_over']}.", ""] if r.get("compared_over") else []
    lines = over + [f"Pareto sweep (mean ± s.e. over n = {r['n_seeds']} seeds; imbalance = recall {r['tiers'][-1]} − "
             f"{r['tiers'][0]} in pp; AUC: {r['tiers'][0]} recall AUC in %)", "",
             "| setting | γ (tail_fraction) | β | accuracy (%) | imbalance (end) | imbalance (epoch 1) | AUC most private |"
             " paired change vs IDP: imbalance (end) | imbalance (epoch 1) | AUC |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["settings"]:
        lines.append(f"| {'IDP-SGD' if row['kind'] == 'reference' else 'INO-SGD'} | {row['tail_fraction'] or '—'} | "
                     f"{row['beta'] or '—'} | {pm(row['accuracy'], row['accuracy_se'])} | "
                     f"{pm(row['imbalance'], row['imbalance_se'])} | {pm(row['imbalance_epoch1'], row['imbalance_epoch1_se'])} | "
                     f"{pm(row['auc_private'], row['auc_private_se'])} | "
                     f"{pm(row['imbalance_change'], row['imbalance_change_se'])} | "
                     f"{pm(row['imbalance_epoch1_change'], row['imbalance_epoch1_change_se'])} | "
                     f"{pm(row['auc_private_change'], row['auc_private_change_se'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    common.main(NAME, __doc__, run_experiment, argv)


if __name__ == "__main__":
    main()
