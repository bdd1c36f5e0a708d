"""DP-SGD vs DP-SGD-S test accuracy at the same ε, lr and epochs (closing-note table of issue 8).

    PYTHONPATH=<checkout> python bench/dpsgd_s_accuracy.py [--seeds 0 1] [--out table.json]
    python bench/dpsgd_s_accuracy.py --compare before.json after.json     # one before/after table

One tier holding every sample (ε = 1 and 10); DP-SGD-S groups by class (digits, MNIST) or by the
sensitive attribute (Adult: sex). Uses only config fields that exist before and after issue 8, so
the same script measures both checkouts. Per DP-SGD-S run it also records, over ~10 evaluations,
the mean of max_k C_k / C and mean_k C_k / C and the fraction of groups at c_min or c_max. Ran on a
loaded 2-core machine: read accuracies, not times.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from engine.config.run import RunConfig, TierConfig, TiersConfig
from engine.train.loop import train

SETTINGS = {  # name: (data, max_train, model, epochs, group_by)
    "digits CNN": ("digits", None, "cnn", 10.0, "class"),
    "Adult LR": ("adult", None, "lr", 2.0, "attribute"),
    "MNIST-10k LR": ("mnist", 10000, "lr", 5.0, "class"),
}


def config(setting: str, algo: str, eps: float, seed: int) -> RunConfig:
    data, max_train, model, epochs, group_by = SETTINGS[setting]
    tiers = TiersConfig(assign="random", tiers=(TierConfig(epsilon=eps, ratio=1.0, name=f"ε={eps:g}"),))
    return RunConfig().replace(**{"data.name": data, "data.max_train": max_train, "model.name": model,
                                  "epochs": epochs, "algorithm.name": algo, "algorithm.group_by": group_by,
                                  "tiers": tiers, "seed": seed, "device": "cpu"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS))
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs="+", metavar="JSON", help="print one table of saved runs (label = file name)")
    args = ap.parse_args()
    if args.compare:
        import pathlib

        print(table({pathlib.Path(f).stem: json.load(open(f)) for f in args.compare}))
        return
    torch.set_num_threads(1)
    rows = []
    for setting in args.settings:
        for eps in (1.0, 10.0):
            for algo in ("dpsgd", "dpsgd_s"):
                for seed in args.seeds:
                    t0 = time.time()
                    cfg = config(setting, algo, eps, seed)
                    r = train(cfg.replace(eval_every=max(1, cfg.planned_steps(_n_train(cfg)) // 10)))
                    clips = [np.asarray(e.group_clip.clip_norms) / cfg.clip_norm for e in r.eval_records
                             if e.group_clip is not None and e.group_clip.clip_norms]
                    row = {"setting": setting, "epsilon": eps, "algorithm": algo, "seed": seed,
                           "accuracy": r.run_summary.accuracy, "seconds": time.time() - t0,
                           "final_group_clips": clips[-1].tolist() if clips else None}
                    if clips:
                        a = cfg.algorithm
                        row.update(max_clip=float(np.mean([c.max() for c in clips])),
                                   mean_clip=float(np.mean([c.mean() for c in clips])),
                                   clamped=float(np.mean([np.mean((c <= a.c_min * (1 + 1e-9)) |
                                                                  (c >= a.c_max * (1 - 1e-9))) for c in clips])))
                    rows.append(row)
                    print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(table({"": rows}))


def _n_train(cfg) -> int:
    from engine.dp.prepare import prepare_data

    return prepare_data(cfg).n_train


def _mean_se(values):
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.3f} ± {v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0:.3f}"


def table(runs: dict) -> str:
    """Markdown: per setting and ε, DP-SGD and DP-SGD-S accuracy (mean ± standard error over seeds), the
    gap in points (paired by seed), and DP-SGD-S's mean max_k C_k / C, mean_k C_k / C and clamped fraction;
    one DP-SGD-S column group per entry of ``runs`` (label → rows)."""
    head = "| setting | ε | n | DP-SGD |" + "".join(
        f" DP-SGD-S {k} | gap pts {k} | max C_k/C {k} | mean C_k/C {k} | clamped {k} |" for k in runs)
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    first = next(iter(runs.values()))
    for setting in dict.fromkeys(r["setting"] for r in first):
        for eps in sorted({r["epsilon"] for r in first if r["setting"] == setting}):
            def pick(rows, algo):
                return {r["seed"]: r for r in rows if (r["setting"], r["epsilon"], r["algorithm"]) == (setting, eps, algo)}
            dp = pick(first, "dpsgd")
            line = f"| {setting} | {eps:g} | {len(dp)} | {_mean_se([r['accuracy'] for r in dp.values()])} |"
            for rows in runs.values():
                s = pick(rows, "dpsgd_s")
                d = pick(rows, "dpsgd")
                seeds = sorted(set(s) & set(d))
                gap = [100 * (s[k]["accuracy"] - d[k]["accuracy"]) for k in seeds]
                stat = (lambda key: f"{np.mean([s[k][key] for k in seeds]):.2f}" if seeds and key in s[seeds[0]] else "–")
                line += (f" {_mean_se([s[k]['accuracy'] for k in seeds])} | {np.mean(gap):+.1f} ± "
                         f"{np.std(gap, ddof=1) / np.sqrt(len(gap)) if len(gap) > 1 else 0:.1f} | "
                         f"{stat('max_clip')} | {stat('mean_clip')} | {stat('clamped')} |")
            lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
