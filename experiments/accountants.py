"""What a tighter accountant buys the most private tier: the MNIST paper tiers planned under RDP and under PLD.

    python experiments/accountants.py --quick --json     both plans (2 and 12 epochs), 2 epochs trained, 3 seeds
    python experiments/accountants.py --backend ray      the 12-epoch plan trained to its end, 2 seeds (~30 min)
    python experiments/accountants.py --smoke            digits, seconds (the tests)

The runs are §1's (``ino_vs_idp.json``'s base: the MNIST CNN, class tiers ε = 1 / 2 / 3, SAMPLE, expected batch
512), IDP-SGD and INO-SGD Beta(1, 1) on paired seeds, each plan made under each accountant (``accountant`` of the
run config): the same ε per tier, so PLD's plan gives the ε = 1 tier a larger rate and every tier less noise.
Reported per (plan, accountant, algorithm): the ε = 1 tier's q and the plan's σ*, its recall (%) at epochs 1 and
2 and at the end (mean ± s.e. over seeds), and its MID (the tier's test loss above its initial value): depth (the
largest excess, mean over seeds) and length in epochs (``experiments.tiered.mid_table``; a MID still open at the
last evaluation lasts until it, and is counted as open).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import common  # noqa: E402
from experiments.common import finite, mean_se, pm  # noqa: E402
from engine.figures.export import load_runs

NAME = "accountants"


def run_experiment(args) -> tuple[dict, str]:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = common.load_spec_sections(args.config, ("modes",))
    source = common.load_spec(str(Path(args.config).parent / spec["runs_of"]))
    overrides, seeds = common.mode_of(spec, args.mode)
    plans = overrides.pop("plans")
    algos = {k: source["algorithms"][k] for k in spec["algorithms"]}
    labels = {k: source["labels"][k] for k in algos}
    settings = [(int(p["epochs"]), acc) for p in plans for acc in spec["accountants"]]
    configs = {}
    for p in plans:
        for acc in spec["accountants"]:
            extra = {**overrides, **p, "accountant": acc}
            for s in seeds:
                for k in algos:
                    configs[(int(p["epochs"]), acc, k, s)] = common.run_config(
                        source["base"], extra, algorithm=algos[k], seed=s, device=args.device, threads=args.threads,
                        name=f"{labels[k]} {acc} plan {p['epochs']} ep seed {s}")
    started = time.time()
    store = common.open_store(common.store_path(args, NAME))
    keys = list(configs)
    tag = f"{NAME}-{args.mode}-{int(started)}"
    trained = common.train_runs(store, [(configs[key], f"{tag}-{key[0]}-{key[1]}-seed{key[3]}") for key in keys],
                                reuse=args.reuse, backend=args.backend)
    sys.stderr.write(f"[{time.time() - started:7.1f}s] {len(trained)} runs trained\n")

    ids = {key: rid for key, (rid, _) in zip(keys, trained)}
    runs = {r["id"]: r for r in load_runs(store, list(ids.values()))}
    rows = [row for (plan_epochs, acc) in settings for k in algos
            for row in [analyse([runs[ids[(plan_epochs, acc, k, s)]] for s in seeds], seeds, k)]
            if row.update(plan_epochs=plan_epochs, accountant=acc, algorithm=k) or True]
    result = {"rows": rows, "seeds": list(seeds), "mode": args.mode, "labels": labels,
              "wall_seconds": round(time.time() - started, 1), "store": str(store.path),
              "run_ids": {"/".join(map(str, key)): rid for key, rid in ids.items()}}
    return result, markdown(result)


def analyse(runs: list[dict], seeds: list[int], key: str) -> dict:
    """The ε = 1 (smallest ε) tier of one algorithm's seeds under one plan."""
    from experiments import tiered

    refs = [tiered.RunRef(r["id"], key, s) for r, s in zip(runs, seeds)]
    th, _ = tiered.frames(runs, refs)
    tier = tiered.tier_order(th)[0]
    config = runs[0]["config"]
    points = tiered.epoch_steps(th, config.get("train_epochs") or config["epochs"])
    plan = runs[0]["plan"]
    k = list(plan["tier_names"]).index(tier)
    recall = {p: mean_se([100.0 * float(tiered.tier_at(th, key, s, st, [tier])[0]) for s in seeds])
              for p, st in points.items() if p in ("epoch1", "epoch2", "final")}
    depth = []
    for s in seeds:
        loss = th[(th.seed == s) & (th.tier == tier)].sort_values("step")["loss"].to_numpy(float)
        depth.append(max(0.0, float(loss.max() - loss[0])))
    mid = next(row for row in tiered.mid_table(runs, refs, [tier])[key] if row["tier"] == tier)
    return {"tier": tier, "sample_rate": plan["sample_rates"][k], "noise_multiplier": plan["noise_multiplier"],
            "epsilon_planned": plan["epsilons"][k], "steps": plan["steps"],
            "recall": {p: {"mean": finite(m), "se": finite(se), "n": n} for p, (m, se, n) in recall.items()},
            "mid_depth": {"mean": finite(mean_se(depth)[0]), "se": finite(mean_se(depth)[1])},
            "mid_runs": mid["runs_with_mid"], "mid_open_at_end": mid["still_open"],
            "mid_length_epochs": {"mean": mid["duration_epochs"], "se": mid["duration_epochs_se"]}}


def markdown(r: dict) -> str:
    n = len(r["seeds"])
    lines = [f"The ε = 1 tier under each plan and accountant (recall %, mean ± s.e. over n = {n} seeds; MID depth: "
             "the largest test-loss excess over its initial value; length in epochs)", "",
             "| plan | accountant | algorithm | q (ε = 1) | σ* | recall epoch 1 | epoch 2 | end | MID depth | "
             "MID length | MID runs (open at the end) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        rec = row["recall"]
        cell = [pm(rec[p]["mean"], rec[p]["se"] or 0) if p in rec and rec[p]["mean"] is not None
                else "—" for p in ("epoch1", "epoch2", "final")]
        lines.append(f"| {row['plan_epochs']} ep (T = {row['steps']}) | {row['accountant']} | "
                     f"{r['labels'][row['algorithm']]} | {row['sample_rate']:.5f} | {row['noise_multiplier']:.4f} | "
                     + " | ".join(cell) + f" | {pm(row['mid_depth']['mean'], row['mid_depth']['se'], 3)} | "
                     f"{pm(row['mid_length_epochs']['mean'], row['mid_length_epochs']['se'])} | "
                     f"{row['mid_runs']}/{n} ({row['mid_open_at_end']}) |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    common.main(NAME, __doc__, run_experiment, argv)


if __name__ == "__main__":
    main()
