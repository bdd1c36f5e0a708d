"""Benchmark the individualized-DP planner (engine.dp.accounting.plan).

Times SAMPLE and SCALE planning for 3 and 10 privacy tiers at T=3000 steps,
N=60000, B=600, δ=1e-5 — median of several cold runs (all accounting caches
cleared before each run).  `--json` prints a single JSON line instead of a table.

    python bench/planner.py [--repeats 5] [--json]
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

N, B, T, DELTA = 60000, 600, 3000, 1e-5
SETUPS = {
    3: (1.0, 2.0, 3.0),
    10: tuple(1.0 + 0.5 * k for k in range(10)),
}
TARGET_SAMPLE_3_S = 1.0


def time_plan(mode: str, eps: tuple[float, ...], repeats: int) -> tuple[float, acc.Plan]:
    sizes = (N // len(eps),) * len(eps)
    times, p = [], None
    for _ in range(repeats):
        acc.clear_caches()
        t0 = time.perf_counter()
        p = acc.plan(mode=mode, epsilons=eps, delta=DELTA, tier_sizes=sizes,
                     batch_size=B, clip_norm=1.0, steps=T)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="cold runs per case (median reported)")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    args = ap.parse_args(argv)
    # warm the interpreter/numpy once (not the accounting caches)
    acc.plan(mode="sample", epsilons=(1.0, 2.0), delta=DELTA, tier_sizes=(100, 100),
             batch_size=10, clip_norm=1.0, steps=10)
    results = {}
    for mode in ("sample", "scale"):
        for n, eps in SETUPS.items():
            med, p = time_plan(mode, eps, max(1, args.repeats))
            results[f"{mode}_{n}_tiers_s"] = round(med, 4)
            results[f"{mode}_{n}_tiers_sigma"] = round(p.noise_multiplier, 6)
    results.update(N=N, B=B, T=T, delta=DELTA, repeats=args.repeats,
                   sample_3_tiers_under_target=results["sample_3_tiers_s"] < TARGET_SAMPLE_3_S)
    if args.json:
        print(json.dumps(results))
    else:
        print(f"planner timing (N={N}, B={B}, T={T}, delta={DELTA}, median of {args.repeats} cold runs)")
        for mode in ("sample", "scale"):
            for n in SETUPS:
                print(f"  {mode.upper():6s} {n:2d} tiers: {results[f'{mode}_{n}_tiers_s'] * 1e3:8.1f} ms"
                      f"   sigma*={results[f'{mode}_{n}_tiers_sigma']:.5f}")
        ok = "OK" if results["sample_3_tiers_under_target"] else "SLOW"
        print(f"  target SAMPLE 3 tiers < {TARGET_SAMPLE_3_S:g} s: {ok}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
