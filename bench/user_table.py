"""A researcher's table at scale (issue 61): a generated CSV of 1,000,000 rows × 40 columns (27 numeric, 10
categorical of 2–30 categories, a binary label, a 4-valued sensitive attribute and a 3-valued budget column) loaded
through ``engine.data.user_table.load_user_table``:

* first load: a fresh process, empty cache: hash, parse, encode, write the cache;
* cached load: another fresh process, same file and schema: hash, map the cached arrays (no parse); then the
  time of a first pass over every value (the mapped pages read in), said beside it;
* peak memory: the first process's peak RSS minus its RSS just before the load (after its imports), against the
  encoded tensors' bytes (x_train + x_test float32, y int64).

Goals: first ≤ 30 s, cached ≤ 2 s, memory ≤ 3× the encoded tensors. Everything is written in a temporary folder
(the CSV and the data folder's cache). ``--rows`` for a smaller run, ``--json`` for one line.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
N_NUMERIC = 27
CARDINALITIES = (2, 3, 4, 5, 6, 8, 10, 12, 20, 30)
GOALS = {"first_s": 30.0, "cached_s": 2.0, "memory_ratio": 3.0}

CHILD = r"""
import json, resource, sys, time
import pyarrow, pyarrow.csv, pyarrow.compute, sklearn.model_selection  # the load's lazy imports: in the baseline
from engine.config.run import MAX_TIERS
from engine.data.user_table import load_user_table, parse_count

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

schema, root = json.loads(sys.argv[1]), sys.argv[2]
before = rss()
t0 = time.perf_counter()
t = load_user_table(schema, max_tiers=MAX_TIERS, data_dir=root)
seconds = time.perf_counter() - t0
ds = t.dataset
t1 = time.perf_counter()
float(ds.x_train.sum()) + float(ds.x_test.sum())  # a first pass over every value (a cached load's pages come in)
first_pass = time.perf_counter() - t1
encoded = sum(x.numel() * x.element_size() for x in (ds.x_train, ds.x_test, ds.y_train, ds.y_test))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "first_pass": first_pass, "parses": parse_count(), "rss_before": before, "peak_rss": peak,
                  "encoded_bytes": encoded, "features": t.preview.encoded_features, "rows": t.preview.rows,
                  "tiers": len(t.tiers.epsilons)}))
"""


def write_table(path: Path, rows: int, seed: int = 0) -> None:
    """The generated CSV, written by Arrow in blocks of 100,000 rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rng = np.random.default_rng(seed)
    block = 100_000
    with pacsv.CSVWriter(path, schema=_schema(pa)) as w:
        for start in range(0, rows, block):
            n = min(block, rows - start)
            cols = {f"num{k}": np.round(rng.normal(k, 1 + k, n), 4) for k in range(N_NUMERIC)}
            for k, card in enumerate(CARDINALITIES):
                cols[f"cat{k}"] = np.char.add(f"c{k}_", rng.integers(0, card, n).astype(str))
            cols["group"] = np.array(["a", "b", "c", "d"])[rng.choice(4, n, p=[0.6, 0.25, 0.1, 0.05])]
            cols["eps"] = np.array([1.0, 2.0, 3.0])[rng.choice(3, n, p=[0.09, 0.37, 0.54])]
            cols["label"] = (cols["num0"] + rng.normal(0, 1, n) > 0).astype(np.int64)
            w.write_table(pa.table(cols, schema=_schema(pa)))


def _schema(pa):
    fields = [(f"num{k}", pa.float64()) for k in range(N_NUMERIC)]
    fields += [(f"cat{k}", pa.string()) for k in range(len(CARDINALITIES))]
    fields += [("group", pa.string()), ("eps", pa.float64()), ("label", pa.int64())]
    return pa.schema(fields)


def child(schema: dict, root: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(schema), str(root)], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"load failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="user-table-bench-") as tmp:
        root = Path(tmp)
        path = root / "big.csv"
        t0 = time.perf_counter()
        write_table(path, args.rows)
        gen_s = time.perf_counter() - t0
        csv_mib = path.stat().st_size / 2**20
        schema = {"file": path.name, "label": "label", "attributes": ["group"], "budget": "eps"}
        first = child(schema, root)
        cached = child(schema, root)
        if cached["parses"] != 0:
            sys.exit("the second load parsed the file: the cache was not used")
    grown = first["peak_rss"] - first["rss_before"]
    out = {
        "rows": first["rows"], "columns": N_NUMERIC + len(CARDINALITIES) + 3, "encoded_features": first["features"],
        "tiers": first["tiers"], "csv_mib": round(csv_mib, 1), "generate_s": round(gen_s, 1), "first_s": round(first["seconds"], 2),
        "cached_s": round(cached["seconds"], 2), "cached_first_pass_s": round(cached["first_pass"], 2), "encoded_mib": round(first["encoded_bytes"] / 2**20, 1),
        "peak_rss_mib": round(first["peak_rss"] / 2**20, 1), "load_growth_mib": round(grown / 2**20, 1),
        "memory_ratio": round(grown / first["encoded_bytes"], 2), "goals": GOALS,
    }
    if args.json:
        print(json.dumps(out))
        return
    print(f"{out['rows']:,} rows × {out['columns']} columns → {out['encoded_features']} encoded features, "
          f"{out['tiers']} budget tiers (CSV of {out['csv_mib']} MiB generated in {out['generate_s']} s)")
    print(f"first load (parse + encode + cache): {out['first_s']} s (goal ≤ {GOALS['first_s']:g} s)")
    print(f"cached load (hash + map the cached arrays, no parse): {out['cached_s']} s (goal ≤ {GOALS['cached_s']:g} s); "
          f"then a first pass over every value (their pages read in): {out['cached_first_pass_s']} s")
    print(f"memory: the load grew RSS by {out['load_growth_mib']} MiB (peak {out['peak_rss_mib']} MiB) for "
          f"{out['encoded_mib']} MiB of encoded tensors: {out['memory_ratio']}× (goal ≤ {GOALS['memory_ratio']:g}×)")


if __name__ == "__main__":
    main()
