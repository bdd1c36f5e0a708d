"""Audits beyond one machine: the same PA-ALOOA audit through the local executor and through Ray on this
machine, side by side in one run, and what the measured figures project for a cluster.

    python bench/scaleout.py [--R 50] [--cpus N] [--json]

Measured (Adult LR, DP-SGD at ε = 10, 2R models in chunks of ``--chunk`` models):
  local_seconds / ray_seconds   the audit's wall time on each executor (Ray: a local instance of ``--cpus`` CPUs,
                                started before the clock runs; its start-up is reported apart)
  identical                     the Ray audit's per-sample scores (every chunk's losses and confidences, bit for
                                bit) and its report's numbers (GPR, CIs, null floors, Δ, ε bounds) equal the local's
  task_overhead_ms              the median round trip of an empty Ray task
  setup_bytes, chunk_bytes_in / chunk_bytes_out   what Ray ships: the setup once per audit; per chunk its
                                arguments and its result
  projection                    wall time on N single-CPU workers from those figures: statistics (on the
                                driver) + ceil(chunks / N) × (chunk train time + overhead)
  mnist_cnn_paper               the paper's MNIST CNN audit (mnist-paper with the CNN, 2R = 400, five algorithms):
                                its model-steps, the per-model-step cost measured here (a few probe steps of
                                one chunk) and its projected training time on 1, 8 and 64 CPU workers, through
                                the stack's layerwise path (what the audit takes) and, as ``..._vmap``, through
                                vmap over models (what it took before issue 39)
``--paper-only`` measures the last alone.
On 2 cores the two executors are expected near parity (the local one already runs a chunk at a time).
"""
from __future__ import annotations

import argparse
import io
import json
import math
import pickle
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datadir import use_shared_data  # noqa: E402

from engine.audit.pa_alooa.config import DEFAULT_RUN, AuditConfig  # noqa: E402
from engine.audit.pa_alooa.estimate import estimate_runtime  # noqa: E402
from engine.audit.pa_alooa.presets import preset  # noqa: E402
from engine.audit.pa_alooa.setup import prepare_audit  # noqa: E402
from engine.config.backend import BACKEND_ENV, BackendConfig  # noqa: E402
from engine.config.run import AlgorithmConfig  # noqa: E402
from engine.jobs.kinds import execute  # noqa: E402
from engine.jobs.ray_backend import connect  # noqa: E402
from engine.store.db import RunStore  # noqa: E402


def numbers(report) -> str:
    def strip(d):
        if isinstance(d, dict):
            return {k: strip(v) for k, v in d.items() if not k.endswith("seconds")}
        return [strip(v) for v in d] if isinstance(d, list) else d
    return json.dumps(strip(report.to_dict()), sort_keys=True)


def chunk_arrays(store: RunStore, run_id: int) -> dict:
    out = {}
    for key in store.artifact_keys(run_id):
        if key.startswith("chunk/"):
            with np.load(io.BytesIO(store.get_artifact(run_id, key)), allow_pickle=False) as f:
                out[key] = {k: f[k] for k in f.files}
    return out


def same_arrays(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(sorted(a[k]) == sorted(b[k]) and all(
        a[k][n].dtype == b[k][n].dtype and np.array_equal(a[k][n], b[k][n], equal_nan=True) for n in a[k]) for k in a)


def main() -> int:
    import os

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--R", type=int, default=50)
    ap.add_argument("--chunk", type=int, default=20, help="models per chunk (the audit's chunk_models)")
    ap.add_argument("--cpus", type=int, default=os.cpu_count(), help="the local Ray instance's CPUs")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--paper-only", action="store_true", help="only the paper's MNIST CNN projection")
    args = ap.parse_args()
    use_shared_data()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    run = DEFAULT_RUN.replace(**{"data.name": "adult", "model.name": "lr", "epochs": 2.0, "batch_size": 256,
                                 "optimizer.lr": 1.0, "clip_norm": 1.0, "seed": 0, "threads": 1})
    config = AuditConfig(run=run, epsilon=10.0, group_by="attribute", group_attribute="sex", R=args.R,
                         chunk_models=args.chunk, algorithms=(AlgorithmConfig(name="dpsgd", group_by="attribute"),),
                         looa_k=0).validate()
    out = {} if args.paper_only else executors(config, args)
    paper = preset("mnist-paper")
    paper = paper.replace(run=paper.run.replace(**{"model.name": "cnn", "threads": 1}))
    ps = prepare_audit(paper)
    for method, key in (("auto", "mnist_cnn_paper"), ("vmap", "mnist_cnn_paper_vmap")):
        est = estimate_runtime(ps, method=method)
        per_step = statistics.median(est["per_model_step_seconds"].values())
        model_steps = est["model_steps"]
        out[key] = {"model_steps": int(model_steps), "per_model_step_ms": round(1000 * per_step, 3),
                    "n_models": ps.n_models * len(ps.algos), "steps_per_model": ps.steps,
                    "projected_train_hours": {str(n): round(model_steps * per_step / n / 3600, 2) for n in (1, 8, 64)}}
    out["mnist_cnn_paper_speedup"] = round(out["mnist_cnn_paper_vmap"]["per_model_step_ms"]
                                           / out["mnist_cnn_paper"]["per_model_step_ms"], 2)
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0 if out.get("identical", True) else 1


def executors(config, args) -> dict:
    """The same audit through the local executor and through Ray, side by side (see the module docstring)."""
    import os

    import ray

    setup = prepare_audit(config)
    tmp = Path(__import__("tempfile").mkdtemp(prefix="scaleout-"))
    out = {"R": args.R, "n_models": setup.n_models, "chunk_models": setup.chunk_models, "cpus": args.cpus}

    results = {}
    for name in ("local", "ray"):
        store = RunStore(tmp / f"{name}.sqlite")
        run_id = store.create_run(config.to_dict(), kind="audit")
        if name == "ray":
            os.environ["HOME"] = str(tmp)  # Ray's token file: not in the user's home
            t0 = time.perf_counter()
            connect(BackendConfig("ray"), num_cpus=args.cpus)
            out["ray_start_seconds"] = round(time.perf_counter() - t0, 2)
        os.environ[BACKEND_ENV] = name
        t0 = time.perf_counter()
        report = execute(store, run_id, config, kind="audit")
        out[f"{name}_seconds"] = round(time.perf_counter() - t0, 2)
        results[name] = (report, chunk_arrays(store, run_id))
    (lr, la), (rr, ra) = results["local"], results["ray"]
    out["identical"] = numbers(lr) == numbers(rr) and same_arrays(la, ra)
    out["stats_seconds"] = round(lr.stats_seconds, 2)
    chunks = len(la)
    chunk_train = lr.train_seconds / chunks
    out["chunks"] = chunks
    out["chunk_train_seconds"] = round(chunk_train, 3)

    @ray.remote(num_cpus=1)
    def nothing():
        return None

    ray.get(nothing.remote())
    trips = []
    for _ in range(30):
        t0 = time.perf_counter()
        ray.get(nothing.remote())
        trips.append(time.perf_counter() - t0)
    overhead = statistics.median(trips)
    out["task_overhead_ms"] = round(1000 * overhead, 2)
    out["setup_bytes"] = len(pickle.dumps(setup, protocol=5))
    first = next(iter(la.values()))
    lo, hi = 0, setup.chunk_models
    out["chunk_bytes_in"] = len(pickle.dumps((setup.membership[lo:hi], tuple(range(hi - lo)), 0), protocol=5))
    out["chunk_bytes_out"] = int(sum(v.nbytes for v in first.values()))
    out["projection"] = {str(n): round(lr.stats_seconds + math.ceil(chunks / n) * (chunk_train + overhead), 1)
                         for n in (1, 2, 8, 64)}
    ray.shutdown()
    return out


if __name__ == "__main__":
    sys.exit(main())
