"""Peak resident memory of one training worker: INO-SGD, Papernot CNN, full MNIST.

Runs ``python -m engine run`` as a child process (one thread, like the dashboard's workers)
and reads the child's peak RSS from getrusage. Target ≤ 1 GiB. ``--json`` prints one line.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    env = dict(os.environ)
    shared = REPO.parent / "shared" / "data"
    env.setdefault("PRIVACY_LAB_DATA_DIR", str(shared))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "mnist_ino.json"
        cfg.write_text(json.dumps({"data": {"name": "mnist"}, "model": {"name": "cnn"},
                                   "algorithm": {"name": "ino"}, "epochs": args.epochs, "batch_size": 256,
                                   "optimizer": {"lr": 1.0}, "threads": 1}))
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "engine", "--store", str(Path(tmp) / "runs.sqlite"), "run",
                               str(cfg), "--json"], cwd=REPO, env=env, capture_output=True, text=True)
        seconds = time.time() - t0
        if proc.returncode != 0:
            sys.exit(f"worker failed:\n{proc.stderr[-2000:]}")
    peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 ** 2  # ru_maxrss is KiB on Linux
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    out = {"peak_rss_gib": round(peak_gib, 3), "target_gib": 1.0, "seconds": round(seconds, 1),
           "steps": summary["steps"], "accuracy": round(summary["accuracy"], 4)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"INO-SGD worker on full MNIST ({summary['steps']} steps, accuracy {summary['accuracy']:.3f}): "
              f"peak RSS {peak_gib:.3f} GiB (target ≤ 1 GiB), {seconds:.1f} s")


if __name__ == "__main__":
    main()
