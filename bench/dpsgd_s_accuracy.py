"""DP-SGD vs DP-SGD-S test accuracy at the same ε, lr and epochs (closing-note table of issue 8).

    PYTHONPATH=<checkout> python bench/dpsgd_s_accuracy.py [--seeds 0 1] [--out table.json]

One tier holding every sample (ε = 1 and 10); DP-SGD-S groups by class (digits, MNIST) or by the
sensitive attribute (Adult: sex). Uses only config fields that exist before and after issue 8, so
the same script measures both checkouts. Ran on a loaded 2-core machine: read accuracies, not times.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from engine.config import RunConfig, TierConfig, TiersConfig
from engine.train import train

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
                                  "tiers": tiers, "seed": seed, "device": "cpu", "eval_every": 10**6})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS))
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for setting in args.settings:
        for eps in (1.0, 10.0):
            for algo in ("dpsgd", "dpsgd_s"):
                for seed in args.seeds:
                    t0 = time.time()
                    r = train(config(setting, algo, eps, seed))
                    clips = r.evals[-1].get("group_clip_norms")
                    rows.append({"setting": setting, "epsilon": eps, "algorithm": algo, "seed": seed,
                                 "accuracy": r.summary["accuracy"], "seconds": time.time() - t0,
                                 "final_group_clips": clips})
                    print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
