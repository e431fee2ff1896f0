#!/usr/bin/env bash
# Per-kernel time of one optimizer step under Nsight Compute (kernel durations only, clocks left alone).
# Usage: scripts/bench/profile_step.sh CONFIG MICRO_BATCH [extra --set args...]
# Prints the kernels grouped by name, largest total first, and writes the raw CSV to $OUT (or ./gpu-out).
set -euo pipefail
cfg=$1; b=$2; shift 2
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
BIN=${FP8T_BIN:-build-gpu/fp8train}
T=$(awk '/seq_len:/ {print $2}' "$cfg")
name=$(basename "$cfg" .yaml)-b$b
rm -rf "runs/profile-$name"
# One micro-step per optimizer step, two steps; the second is the one summarised (first has warm-up).
ncu --csv --print-units base --metrics gpu__time_duration.sum --clock-control none --cache-control none \
  "$BIN" train --config "$cfg" --set train.micro_batch="$b" --set train.total_batch_tokens=$((b * T)) \
  --set train.max_steps=2 --set train.eval_every=1000000 --set train.checkpoint_every=-1 \
  --set run.out_dir="runs/profile-$name" "$@" > "$OUT/ncu-$name.csv" 2> "$OUT/ncu-$name.err" || {
  tail -20 "$OUT/ncu-$name.err"; exit 1; }
python3 "$(dirname "$0")/ncu_summary.py" "$OUT/ncu-$name.csv" | tee "$OUT/profile-$name.txt"
