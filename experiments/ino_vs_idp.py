"""INO-SGD vs IDP-SGD: utility imbalance across privacy tiers on paired seeds (issue 11 §1 and §3).

    python experiments/ino_vs_idp.py --quick --json     full MNIST, 2 epochs, 4 paired seeds (~20 min, 2 cores)
    python experiments/ino_vs_idp.py                     the paper's 12 epochs, 5 seeds (CPU overnight / GPU)
    python experiments/ino_vs_idp.py --config experiments/ino_vs_idp_cifar10.json   CIFAR-10 (full mode only)

Every run is an engine RunConfig (the spec's ``base`` + the algorithm + the mode's overrides + the seed)
trained by ``engine.train.loop.train`` into the run store. For each seed, IDP-SGD and each INO-SGD variant share
the seed, hence the initial weights, the Poisson batches and the noise draws (checked on the first steps
before training: ``experiments.pairing``). Reported per evaluation epoch: per-tier and per-class recall and
loss; per tier the recall gain INO − IDP (pp; mean ± s.e. over seeds and per seed) at each epoch, at the end
and as recall AUC; MID onset/duration; final accuracy; Pearson (r, p) of the per-class gain against ε.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import common  # noqa: E402
from experiments.common import finite, mean_se, pm  # noqa: E402
from engine.figures.common_span import common_span
from engine.figures.experiments import fig_gain_by_tier, gain_frame
from engine.figures.export import load_runs
from engine.figures.frames import compared_eval
from engine.figures.training import build_figures

NAME = "ino_vs_idp"


def run_experiment(args) -> tuple[dict, str]:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = common.load_spec(args.config)
    overrides, seeds = common.mode_of(spec, args.mode)
    algos = spec.get("algorithms") or {}
    ref = spec.get("reference", "idp")
    if ref not in algos or len(algos) < 2:
        raise common.ConfigError("algorithms", f"needs the reference {ref!r} and at least one INO-SGD variant")
    labels = {k: spec.get("labels", {}).get(k, k) for k in algos}
    variants = [k for k in algos if k != ref]
    configs = {(k, s): common.run_config(spec["base"], overrides, algorithm=algos[k], seed=s, device=args.device,
                                         threads=args.threads, name=f"{labels[k]} seed {s}")
               for s in seeds for k in algos}
    started = time.time()
    pairing = {v: check_pairs(configs, ref, v, seeds[0]) for v in variants}
    store = common.open_store(common.store_path(args, NAME))
    from experiments.tiered import RunRef

    tag = f"{NAME}-{Path(args.config).stem}-{args.mode}-{int(started)}"
    keys = [(k, s) for s in seeds for k in algos]
    trained = common.train_runs(store, [(configs[key], f"{tag}-seed{key[1]}") for key in keys], reuse=args.reuse,
                                backend=args.backend)
    refs = [RunRef(rid, k, s) for (k, s), (rid, _) in zip(keys, trained)]
    for r in refs:
        sys.stderr.write(f"{labels[r.key]} seed {r.seed}: run {r.run_id} done\n")
    sys.stderr.write(f"[{time.time() - started:7.1f}s] {len(refs)} runs trained\n")

    runs = load_runs(store, [r.run_id for r in refs])
    result, tables = analyse(runs, refs, labels, ref, variants, seeds, configs[(ref, seeds[0])])
    result.update(mode=args.mode, config=str(Path(args.config).name), store=str(store.path), pairing=pairing,
                  wall_seconds=round(time.time() - started, 1), run_ids={f"{r.key}/{r.seed}": r.run_id for r in refs})
    out = common.figures_dir(args, f"{NAME}-{Path(args.config).stem}")
    if out is not None:
        prefix = f"{Path(args.config).stem}_{args.mode}"
        result["figures"] = [str(p) for p in export_figures(out, prefix, runs, refs, result, labels) if p]
    return result, tables


def check_pairs(configs, ref, variant, seed) -> dict:
    from experiments.pairing import check_pairing

    return check_pairing(configs[(ref, seed)], configs[(variant, seed)], steps=3)


def analyse(runs, refs, labels, ref, variants, seeds, ref_config) -> tuple[dict, str]:
    from experiments import tiered

    span = common_span(runs)  # what tiered.frames cuts the histories to (each run: the steps all of them reached)
    th, ch = tiered.frames(runs, refs)
    tiers = tiered.tier_order(th)
    eps = [float(th[th.tier == t]["epsilon"].iloc[0]) for t in tiers]
    points = tiered.epoch_steps(th, ref_config.train_epochs or ref_config.epochs)
    gains = {v: tiered.tier_gains(th, v, ref, seeds, points) for v in variants}
    ev = th.drop_duplicates("step").sort_values("step")
    every = {f"step{int(st)}": int(st) for st in ev["step"]}  # every evaluation: the MID window is early
    curve_epoch = {f"step{int(st)}": float(e) for st, e in zip(ev["step"], ev["epoch"])}
    curves = {v: tiered.tier_gains(th, v, ref, seeds, every) for v in variants}
    for c in curves.values():
        c.pop("auc", None)
    keys = [ref] + variants
    acc = {}
    for k in keys:
        finals = [r for r in runs if any(x.run_id == r["id"] and x.key == k for x in refs)]
        acc[k] = mean_se([100.0 * compared_eval(r, span).overall.accuracy for r in finals])
    per_epoch = {}
    for k in keys:
        rec, loss = tiered.tier_values(th, k, seeds, "recall"), tiered.tier_values(th, k, seeds, "loss")
        crec, closs = tiered.class_values(ch, k, "recall"), tiered.class_values(ch, k, "loss")
        per_epoch[k] = {p: {"step": st, "tier_recall": [finite(x) for x in rec.loc[st]],
                            "tier_loss": [finite(x) for x in loss.loc[st]],
                            "class_recall": [finite(x) for x in crec.loc[st]],
                            "class_loss": [finite(x) for x in closs.loc[st]]} for p, st in points.items()}
    pearson = {v: {p: tiered.class_gain_pearson(ch, v, ref, st) for p, st in points.items()} for v in variants}
    mids = tiered.mid_table(runs, refs, tiers)
    main = variants[0]
    epoch_names = [p for p in points if p != "final"]

    def gain_means(v):
        g = gains[v]
        d = {p: g[p]["mean"] for p in list(points) + ["auc"]}
        d.setdefault("epoch1", None)
        d.setdefault("epoch2", None)
        return d

    result = {
        "epochs": [int(p[5:]) for p in epoch_names],
        "tiers": tiers, "tier_epsilons": eps, "seeds": list(seeds), "n_seeds": len(seeds),
        "ino_variant": main, "labels": labels,
        "recall_gain_by_tier": gain_means(main),
        "recall_gain_se_by_tier": {p: gains[main][p]["se"] for p in gains[main]},
        "overall_accuracy": {"ino": acc[main][0], "idp": acc[ref][0],
                             "ino_se": acc[main][1], "idp_se": acc[ref][1]},
        "pearson": {"r": pearson[main]["final"]["r"], "p": pearson[main]["final"]["p"],
                    "epoch1": {"r": pearson[main]["epoch1"]["r"], "p": pearson[main]["epoch1"]["p"]}
                    if "epoch1" in pearson[main] else None},
        "gain_curve_epochs": curve_epoch,
        "variants": {v: {"recall_gain_by_tier": gain_means(v), "gains": gains[v], "gain_curve": curves[v],
                         "overall_accuracy": {"mean": acc[v][0], "se": acc[v][1], "n": acc[v][2]},
                         "pearson": {p: {"r": x["r"], "p": x["p"]} for p, x in pearson[v].items()},
                         "class_gain": pearson[v]} for v in variants},
        "reference_accuracy": {"mean": acc[ref][0], "se": acc[ref][1], "n": acc[ref][2]},
        "per_epoch": per_epoch, "mid": mids, "evaluation_steps": points,
        "steps": int(th["step"].max()), "compared_over": span.words(), "planned_epochs": ref_config.epochs,
        "trained_epochs": ref_config.train_epochs or ref_config.epochs, "steps_rule": ref_config.steps_rule,
    }
    return result, markdown(result, keys, labels, variants, points)


def markdown(r: dict, keys, labels, variants, points) -> str:
    tiers = r["tiers"]
    n = r["n_seeds"]
    over = [f"Compared {r['compared_over']}.", ""] if r.get("compared_over") else []
    lines = over + [f"Recall gain INO − IDP per tier (pp, mean ± s.e. over n = {n} paired seeds)", "",
             "| variant | point | " + " | ".join(tiers) + " |", "|---|---|" + "---|" * len(tiers)]
    for v in variants:
        for p, g in r["variants"][v]["gains"].items():
            cells = [pm(m, s) for m, s in zip(g["mean"], g["se"])]
            lines.append(f"| {labels[v]} | {p} | " + " | ".join(cells) + " |")
    lines += ["", f"Per-tier recall (%, mean over n = {n} seeds)", "",
              "| algorithm | point | " + " | ".join(tiers) + " |", "|---|---|" + "---|" * len(tiers)]
    for k in keys:
        for p, d in r["per_epoch"][k].items():
            lines.append(f"| {labels[k]} | {p} | " + " | ".join(f"{x:.1f}" for x in d["tier_recall"]) + " |")
    lines += ["", f"Per-tier test loss (mean over n = {n} seeds)", "",
              "| algorithm | point | " + " | ".join(tiers) + " |", "|---|---|" + "---|" * len(tiers)]
    for k in keys:
        for p, d in r["per_epoch"][k].items():
            lines.append(f"| {labels[k]} | {p} | " + " | ".join(f"{x:.3f}" for x in d["tier_loss"]) + " |")
    lines += ["", "Final overall accuracy (%) and Pearson (r, p) of the per-class gain vs ε", "",
              "| algorithm | accuracy | n | Pearson r (end) | p (end) | r (epoch 1) | p (epoch 1) |", "|---|---|---|---|---|---|---|"]
    ra = r["reference_accuracy"]
    lines.append(f"| {labels[keys[0]]} | {pm(ra['mean'], ra['se'])} | {ra['n']} | | | | |")
    for v in variants:
        a, pe = r["variants"][v]["overall_accuracy"], r["variants"][v]["pearson"]
        e1 = pe.get("epoch1", {"r": None, "p": None})
        lines.append(f"| {labels[v]} | {pm(a['mean'], a['se'])} | {a['n']} | {_f(pe['final']['r'])} | "
                     f"{_f(pe['final']['p'], 3)} | {_f(e1['r'])} | {_f(e1['p'], 3)} |")
    lines += ["", "MID (tier test loss above its initial value): runs with a MID / runs, mean onset and duration (epochs)",
              "", "| algorithm | tier | MID runs | onset (epoch) | duration (epochs) | open at the end |",
              "|---|---|---|---|---|---|"]
    for k in keys:
        for row in r["mid"].get(k, []):
            lines.append(f"| {labels[k]} | {row['tier']} | {row['runs_with_mid']}/{row['runs']} | "
                         f"{pm(row['onset_epoch'], row['onset_epoch_se'])} | "
                         f"{pm(row['duration_epochs'], row['duration_epochs_se'])} | {row['still_open']} |")
    return "\n".join(lines) + "\n"


def _f(x, d: int = 2) -> str:
    return "—" if x is None else f"{x:.{d}g}" if d == 3 else f"{x:.{d}f}"


def export_figures(out: Path, prefix: str, runs, refs, result, labels) -> list:
    """PNG figures through the project's builders: the gains per tier (mean ± s.e.; engine.figures.experiments),
    and for seed 0 the engine's MID curves, per-tier recall and per-class recall vs ε."""

    paths = []
    epochs = result["gain_curve_epochs"]
    gains = {v: d["gain_curve"] for v, d in result["variants"].items()}
    frame = gain_frame(gains, labels, result["tiers"], epochs)
    if len(epochs) >= 1:
        paths.append(common.export_png(fig_gain_by_tier(frame), out / f"{prefix}_gain_by_tier.png", width=1000, height=450))
    seed0 = result["seeds"][0]
    ids = [r.run_id for r in refs if r.seed == seed0]
    sel = [r for r in runs if r["id"] in ids]
    for spec in build_figures(sel, names=["mid_curves", "tier_recall", "recall_vs_budget", "recall_gain_time"],
                                    mid_layout="facet", skip_empty=True):
        paths.append(common.export_png(spec.figure, out / f"{prefix}_{spec.name}_seed{seed0}.png", width=1000, height=560))
    return paths


def main(argv=None) -> None:
    common.main(NAME, __doc__, run_experiment, argv)


if __name__ == "__main__":
    main()
