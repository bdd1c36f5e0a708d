"""PA-ALOOA audit speed: 2R = 400 DP-SGD (ε = 10) logistic-regression models on Adult, sex as the group.

1. The full audit (``engine.audit.pa_alooa.runner.run_audit``): the 400 models trained as batched ensembles,
   every training sample scored under every model, then all statistics (per-sample advantage, GPR
   with bootstrap CIs, Δ, null floor, PA-GA, PA-GBA, LiRA, per-tier ε lower bound). Wall time and
   the process' peak resident memory (measured before step 2 runs).
2. The sequential baseline: the same models trained one after another with Opacus' PrivacyEngine
   (Poisson sampling, same noise multiplier, clip norm, expected batch, steps and learning rate), each
   then scored on the training set and the test set like the audit does. A few models are timed
   and the time is extrapolated to 400.

speedup_vs_sequential = (400 × Opacus seconds per model) / (the audit's training + scoring seconds);
speedup_end_to_end adds the same statistics time to both sides. Also times ``sample_advantage`` on
400 × 30000 (the timing that used to be a test).
3. The same audit again with the statistics on one thread (``engine.audit.pa_alooa.stats.set_threads(1)``; the
   first run uses the default, every CPU this process may use): ``stats_seconds_1_thread``, and the check
   that both runs' reports are equal (``same_numbers``).

Targets (issue 17): statistics ≤ 3 s, the whole audit ≤ 10 s, end to end ≥ 8× the sequential loop;
earlier: training + scoring ≥ 20×, ≤ 4 GiB.

    python bench/audit.py [--json] [--threads N] [--algorithms dpsgd,dpsgd_s] [--sequential-models 3]
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datadir import use_shared_data  # noqa: E402

from engine.audit.pa_alooa import stats  # noqa: E402
from engine.audit.pa_alooa.config import DEFAULT_RUN, AuditConfig  # noqa: E402
from engine.audit.pa_alooa.design import complementary_membership  # noqa: E402
from engine.audit.pa_alooa.setup import prepare_audit  # noqa: E402
from engine.audit.pa_alooa.runner import run_audit  # noqa: E402
from engine.audit.pa_alooa.summary import summary_table  # noqa: E402
from engine.config.run import AlgorithmConfig, ModelConfig  # noqa: E402


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def opacus_one_model(setup, row: int, seed: int) -> float:
    """Train + score one model with Opacus exactly as the audit would; returns its wall time."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from engine.models.nets import build_model

    cfg, ds = setup.config.run, setup.dataset
    algo = setup.algos[0]
    plan = algo.plan
    t0 = time.perf_counter()
    members = np.flatnonzero(setup.membership[row])
    torch.manual_seed(seed)
    model = build_model(ModelConfig(name=cfg.model.name), ds.input_shape, ds.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.optimizer.lr)
    loader = DataLoader(TensorDataset(ds.x_train[members], ds.y_train[members]), batch_size=cfg.batch_size)
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(module=model, optimizer=opt, data_loader=loader,
                                             noise_multiplier=plan.noise_multiplier, max_grad_norm=cfg.clip_norm,
                                             poisson_sampling=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    steps = 0
    while steps < setup.steps:
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            steps += 1
            if steps >= setup.steps:
                break
    with torch.no_grad():  # the audit's scoring: loss and confidence on every training sample, test predictions
        logits = model(ds.x_train)
        torch.nn.functional.cross_entropy(logits, ds.y_train, reduction="none")
        torch.logsumexp(logits, 1)
        model(ds.x_test).argmax(1)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON line")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both sides (default 1: robust on a "
                                                           "shared 2-core machine; see the README)")
    ap.add_argument("--R", type=int, default=200)
    ap.add_argument("--algorithms", default="dpsgd", help="comma-separated; the speedup uses the first")
    ap.add_argument("--sequential-models", type=int, default=3)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    use_shared_data()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    names = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    algos = tuple(AlgorithmConfig(name=a, group_by="attribute") for a in names)
    run = DEFAULT_RUN.replace(**{"data.name": "adult", "model.name": "lr", "epochs": 2.0, "batch_size": 256,
                                 "optimizer.lr": 1.0, "delta": 1e-5, "clip_norm": 1.0, "seed": 0,
                                 "threads": args.threads, "device": args.device})
    config = AuditConfig(run=run, epsilon=10.0, group_by="attribute", group_attribute="sex", algorithms=algos,
                         R=args.R, looa_k=0).validate()
    t0 = time.perf_counter()
    from engine.data import load_dataset

    load_dataset("adult")  # one-off per process (same for both sides): not part of the audit time
    load_seconds = time.perf_counter() - t0

    t0 = time.perf_counter()
    results = run_audit(config).to_dict()  # the stored results dict (summary_table reads either)
    audit_seconds = time.perf_counter() - t0
    rss = peak_rss_gib()
    first = results["algorithms"][0]
    per_model = first["train_seconds"] / results["n_models"]

    # the sequential Opacus loop on a few of the same models
    setup = prepare_audit(config.replace(algorithms=algos[:1]))
    opacus_one_model(setup, 0, 0)  # warm-up (lazy imports, first-call overheads)
    seq = [opacus_one_model(setup, r, r) for r in range(1, 1 + args.sequential_models)]
    seq_per_model = float(np.median(seq))
    sequential_seconds = seq_per_model * results["n_models"]
    speedup = sequential_seconds / first["train_seconds"]
    speedup_e2e = (sequential_seconds + first["stats_seconds"]) / (first["train_seconds"] + first["stats_seconds"])

    # the statistics on one thread: the same audit again (measured after the peak RSS above); every number of
    # each algorithm's report but its timings must be the same
    threads = stats.set_threads(1)
    try:
        one_thread = run_audit(config).to_dict()
    finally:
        stats.set_threads(threads)

    def numbers(a):
        return json.dumps({k: v for k, v in a.items() if not k.endswith("_seconds")}, sort_keys=True)

    same = [numbers(a) for a in results["algorithms"]] == [numbers(a) for a in one_thread["algorithms"]]
    stats_1 = one_thread["algorithms"][0]["stats_seconds"]

    # the statistic that used to be timed in a test
    m = complementary_membership(30000, 200, seed=0)
    s = np.random.default_rng(0).normal(size=m.shape) + m
    t0 = time.perf_counter()
    stats.sample_advantage(s, m, threshold="in_sample")
    adv_seconds = time.perf_counter() - t0

    out = {"audit_seconds": round(audit_seconds, 2), "speedup_vs_sequential": round(speedup, 1),
           "peak_rss_gib": round(rss, 3), "speedup_end_to_end": round(speedup_e2e, 1),
           "train_seconds": round(first["train_seconds"], 2), "stats_seconds": round(first["stats_seconds"], 2),
           "ensemble_seconds_per_model": round(per_model, 4), "opacus_seconds_per_model": round(seq_per_model, 3),
           "sequential_seconds_extrapolated": round(sequential_seconds, 1), "n_models": results["n_models"],
           "n_train": results["n_train"], "steps_per_model": results["steps_per_model"], "threads": args.threads,
           "device": results["device"], "data_load_seconds": round(load_seconds, 2),
           "sample_advantage_400x30000_seconds": round(adv_seconds, 2),
           "stats_threads": threads, "stats_seconds_1_thread": round(stats_1, 2), "same_numbers": same,
           "targets": {"audit_seconds": 10, "stats_seconds": 3, "speedup_end_to_end": 8,
                       "speedup_vs_sequential": 20, "peak_rss_gib": 4},
           "gpr": {a["key"]: {"groups": {g: round(v["mean"], 4) for g, v in a["gpr"]["groups"].items()},
                              "delta_pp": round(a["gpr"]["delta"]["value"], 3),
                              "delta_ci": [round(a["gpr"]["delta"]["low"], 3), round(a["gpr"]["delta"]["high"], 3)],
                              "null_floor": round(a["null_floor"], 4), "accuracy": round(a["accuracy"]["mean"], 4)}
                   for a in results["algorithms"]}}
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(summary_table(results))
        print(f"audit {audit_seconds:.1f} s (target ≤ 10 s): training+scoring {first['train_seconds']:.1f} s "
              f"({per_model * 1000:.1f} ms/model), statistics {first['stats_seconds']:.1f} s on {threads} threads "
              f"(target ≤ 3 s; {stats_1:.1f} s on 1 thread, same numbers: {same}); peak RSS {rss:.2f} GiB "
              f"(target ≤ 4)")
        print(f"Opacus sequential: {seq_per_model:.2f} s/model (median of {len(seq)}) → {sequential_seconds:.0f} s "
              f"for {results['n_models']} models; speedup {speedup:.1f}× (target ≥ 20×), "
              f"end to end {speedup_e2e:.1f}× (target ≥ 8×)")
        print(f"sample_advantage 400 × 30000 (in-sample): {adv_seconds:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
