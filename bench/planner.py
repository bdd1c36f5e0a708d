"""Benchmark the individualized-DP planner (engine.dp.accounting.plan) under each accountant.

Times SAMPLE and SCALE planning for 3 and 10 privacy tiers at T=3000 steps,
N=60000, B=600, δ=1e-5, under RDP, PLD and PRV (``accountant=``) — median of several
cold runs (all accounting caches cleared before each run, the persistent plan cache off). Targets: SAMPLE with 3 tiers
under 1 s with RDP, under 2 s with PLD. `--json` prints a single JSON line instead of a table.

    python bench/planner.py [--repeats 3] [--json] [--accountants rdp,pld,prv]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.dp import accounting as acc  # noqa: E402
from engine.dp import plan_cache  # noqa: E402

# cold runs: no plan from the persistent cache (bench/plan_preview.py times it)
os.environ[plan_cache.ENV_VAR] = plan_cache.OFF

N, B, T, DELTA = 60000, 600, 3000, 1e-5
SETUPS = {
    3: (1.0, 2.0, 3.0),
    10: tuple(1.0 + 0.5 * k for k in range(10)),
}
TARGET_SAMPLE_3_S = {"rdp": 1.0, "pld": 2.0}
# the reference settings (Poisson-subsampled Gaussian, δ = 1e-5, B = 256): (name, q, σ, T)
REFERENCE = (("MNIST, 1 epoch", 256 / 60000, 1.0, 234), ("MNIST, 12 epochs", 256 / 60000, 1.0, 2812),
             ("Adult, 20 epochs", 256 / 30162, 1.0, 2356))


def reference_table(names) -> list[dict]:
    """ε of each reference setting under each accountant (engine.dp.accountants)."""
    from engine.dp.accountants import get_accountant

    return [{"setting": label, "q": q, "sigma": sigma, "steps": steps,
             **{name: round(get_accountant(name).epsilon(q, sigma, steps, DELTA), 4) for name in names}}
            for label, q, sigma, steps in REFERENCE]


def time_plan(mode: str, eps: tuple[float, ...], repeats: int, accountant: str = "rdp") -> tuple[float, acc.Plan]:
    sizes = (N // len(eps),) * len(eps)
    times, p = [], None
    for _ in range(repeats):
        acc.clear_caches()
        t0 = time.perf_counter()
        p = acc.plan(mode=mode, epsilons=eps, delta=DELTA, tier_sizes=sizes,
                     batch_size=B, clip_norm=1.0, steps=T, accountant=accountant)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="cold runs per case (median reported)")
    ap.add_argument("--accountants", default="rdp,pld,prv", help="comma-separated accountants to time")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    args = ap.parse_args(argv)
    names = [a for a in args.accountants.split(",") if a]
    # warm the interpreter/numpy and the libraries' imports once (not the accounting caches)
    for name in names:
        acc.plan(mode="sample", epsilons=(1.0, 2.0), delta=DELTA, tier_sizes=(100, 100),
                 batch_size=10, clip_norm=1.0, steps=10, accountant=name)
    results = {}
    for name in names:
        for mode in ("sample", "scale"):
            for n, eps in SETUPS.items():
                med, p = time_plan(mode, eps, max(1, args.repeats), name)
                key = f"{mode}_{n}_tiers" if name == "rdp" else f"{name}_{mode}_{n}_tiers"
                results[f"{key}_s"] = round(med, 4)
                results[f"{key}_sigma"] = round(p.noise_multiplier, 6)
    results.update(N=N, B=B, T=T, delta=DELTA, repeats=args.repeats, reference=reference_table(names))
    for name, target in TARGET_SAMPLE_3_S.items():
        key = "sample_3_tiers_s" if name == "rdp" else f"{name}_sample_3_tiers_s"
        if key in results:
            results["sample_3_tiers_under_target" if name == "rdp" else f"{name}_sample_3_tiers_under_target"] = \
                results[key] < target
    if args.json:
        print(json.dumps(results))
    else:
        print(f"planner timing (N={N}, B={B}, T={T}, delta={DELTA}, median of {args.repeats} cold runs)")
        for name in names:
            for mode in ("sample", "scale"):
                for n in SETUPS:
                    key = f"{mode}_{n}_tiers" if name == "rdp" else f"{name}_{mode}_{n}_tiers"
                    print(f"  {name:3s} {mode.upper():6s} {n:2d} tiers: {results[f'{key}_s'] * 1e3:9.1f} ms"
                          f"   sigma*={results[f'{key}_sigma']:.5f}")
        for name, target in TARGET_SAMPLE_3_S.items():
            flag = "sample_3_tiers_under_target" if name == "rdp" else f"{name}_sample_3_tiers_under_target"
            if flag in results:
                print(f"  target {name} SAMPLE 3 tiers < {target:g} s: {'OK' if results[flag] else 'SLOW'}")
        print(f"reference ε (δ = {DELTA:g}, B = 256): " + " / ".join(names))
        for row in results["reference"]:
            print(f"  {row['setting']:18s} q={row['q']:.5f} σ={row['sigma']:g} T={row['steps']:5d}: "
                  + " / ".join(f"{row[n]:.4f}" for n in names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
