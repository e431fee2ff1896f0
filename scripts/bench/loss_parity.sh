#!/usr/bin/env bash
# Loss parity runs: the same config and seed in several precisions/devices, then a table of the
# validation losses and their relative differences against the first run.
# Usage: scripts/bench/loss_parity.sh CONFIG OUTDIR "name:--set a=b --set c=d" ["name2:..."] ...
# Prints one line per eval step per run and "PARITY name final_val=... rel_diff=...".
set -euo pipefail
cd "$(dirname "$0")/../.."
CFG=$1; OUTDIR=$2; shift 2
BIN=${FP8T_BIN:-build/fp8train}
export NCCL_NVLS_ENABLE=0
runs=()
for spec in "$@"; do
  name=${spec%%:*}; sets=${spec#*:}
  # shellcheck disable=SC2086
  "$BIN" train --config "$CFG" --set run.out_dir="$OUTDIR/$name" $sets > "$OUTDIR-$name.log" 2>&1 \
    || { tail -20 "$OUTDIR-$name.log"; exit 1; }
  runs+=("$OUTDIR/$name/metrics.jsonl")
done
python3 scripts/bench/compare_val.py "${runs[@]}"
