#!/usr/bin/env bash
# Every full configuration of issue 11 in one go on a CUDA machine (hours on one GPU; CPU: overnight and more).
#   PRIVACY_LAB_DATA_DIR=/path/to/data experiments/run_full.sh [OUT_DIR]
# The data folder needs mnist/ and adult/ (the engine fetches or finds them) and, for §3, the user-supplied
# cifar10/cifar-10-python.tar.gz and cifar100/cifar-100-python.tar.gz (checksum-verified by the loaders;
# a missing tarball skips that configuration with the loader's one-line message). Each script writes its runs to
# OUT_DIR/<name>.sqlite, its JSON line to OUT_DIR/<name>.json, its tables to OUT_DIR/<name>.md and its PNGs to
# OUT_DIR/figures/. --reuse makes a rerun continue where a killed one stopped (finished runs are kept).
set -u
cd "$(dirname "$0")/.."
OUT="${1:-experiments/out/full}"
mkdir -p "$OUT/figures"
DEVICE="${DEVICE:-cuda}"
if [ "$DEVICE" = cuda ] && ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "run_full.sh: no CUDA device visible; set DEVICE=cpu to run the full modes on the CPU anyway" >&2
  exit 2
fi
status=0
run() {  # run NAME SCRIPT [ARGS...]
  local name="$1"; shift
  echo "== $name: $* ($(date -u +%H:%M:%S))" >&2
  local t0=$SECONDS
  if python "$@" --full --json --reuse --device "$DEVICE" --store "$OUT/$name.sqlite" --figures "$OUT/figures" \
      --markdown "$OUT/$name.md" > "$OUT/$name.json"; then
    echo "== $name done in $((SECONDS - t0)) s" >&2
  else
    echo "== $name FAILED (exit $?) after $((SECONDS - t0)) s" >&2
    status=1
  fi
}
run ino_vs_idp experiments/ino_vs_idp.py
run ino_vs_idp_cifar10 experiments/ino_vs_idp.py --config experiments/ino_vs_idp_cifar10.json
run ino_vs_idp_cifar100fv experiments/ino_vs_idp.py --config experiments/ino_vs_idp_cifar100fv.json
run pareto experiments/pareto.py
run group_risk experiments/group_risk.py
exit $status
