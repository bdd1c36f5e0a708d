"""What a lab process costs before it does anything: the CPU seconds of starting each kind of process the lab
and its tests start by the dozen (a training worker, a CLI command), side by side with the same process made to
import what the engine no longer imports at its start (the ``opacus`` package, ``scipy.stats``), interleaved.

    python bench/process_start.py [--rounds 5] [--json]

Rows (each a fresh ``python``, this checkout on its path; CPU = user + system seconds of the child):
  worker_imports          ``import engine.jobs.worker, engine.train.loop`` (what a training worker loads)
  worker_imports_before   the same after ``import opacus, scipy.stats``: the engine's start before 2026-12-07
                          (Opacus' RDP analysis came through the package, the audit's quantiles through scipy.stats)
  cli_plan                ``python -m engine plan`` of the default digits config (imports the whole CLI, loads digits)
  cli_plan_before         the same with ``opacus`` and ``scipy.stats`` imported first
``saved_*`` = before − now. ``opacus_imported`` / ``scipy_stats_imported``: whether a worker's imports pulled them in
(they should not).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from datadir import use_shared_data  # noqa: E402

BEFORE = "import opacus, scipy.stats; "
WORKER = "import engine.jobs.worker, engine.train.loop"
PLAN = "import sys; from engine.cli import main; sys.argv = ['privacy-lab', 'plan', sys.argv[1]]; main()"


def cpu_of(code: str, *args: str) -> float:
    """User + system CPU seconds of one fresh interpreter running ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    use_shared_data()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "digits.json"
        config.write_text("{}")  # the default run config (digits)
        rows = {"worker_imports": (WORKER,), "worker_imports_before": (BEFORE + WORKER,),
                "cli_plan": (PLAN, str(config)), "cli_plan_before": (BEFORE + PLAN, str(config))}
        times: dict = {k: [] for k in rows}
        for _ in range(args.rounds):  # interleaved: the machine's speed moves within minutes
            for k, call in rows.items():
                times[k].append(cpu_of(*call))
    probe = subprocess.run([sys.executable, "-c", WORKER + "; import sys; print(int('opacus' in sys.modules), "
                            "int('scipy.stats' in sys.modules))"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                           check=True, capture_output=True, text=True).stdout.split()
    out = {f"{k}_cpu_s": round(statistics.median(v), 3) for k, v in times.items()}
    out.update({"saved_worker_cpu_s": round(out["worker_imports_before_cpu_s"] - out["worker_imports_cpu_s"], 3),
                "saved_cli_plan_cpu_s": round(out["cli_plan_before_cpu_s"] - out["cli_plan_cpu_s"], 3),
                "opacus_imported": probe[0] == "1", "scipy_stats_imported": probe[1] == "1", "rounds": args.rounds})
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    print(f"CPU seconds of a fresh process, median of {args.rounds} interleaved rounds")
    for k in rows:
        print(f"  {k:<24} {out[k + '_cpu_s']:.2f} s")
    print(f"  saved per worker start: {out['saved_worker_cpu_s']:.2f} s; per CLI plan: {out['saved_cli_plan_cpu_s']:.2f} s")
    print(f"  a worker's imports pull in opacus: {out['opacus_imported']}, scipy.stats: {out['scipy_stats_imported']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
