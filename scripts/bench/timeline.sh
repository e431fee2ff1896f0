#!/usr/bin/env bash
# The device's timeline of a running training job: builds the CUPTI injection library (tools/timeline), runs
# `fp8train train` with it (one micro-step per optimizer step), then scripts/bench/timeline.py on the recording:
# per step the busy and idle device time, and the idle gaps between activities by length (what a per-kernel
# profile such as profile_step.sh cannot show).
# Usage: scripts/bench/timeline.sh CONFIG MICRO_BATCH STEPS [extra --set args...]   (STEPS >= 4: two are skipped)
# Env: FP8T_BIN (default build-gpu/fp8train), OUT (default gpu-out), CUDA_HOME (default /usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 3 ] || { sed -n 2,7p "$0"; exit 2; }
cfg=$1; b=$2; steps=$3; shift 3
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
BIN=${FP8T_BIN:-build-gpu/fp8train}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
lib=""
for d in "$CUDA_HOME/extras/CUPTI/lib64" "$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib"; do
  if [ -e "$d/libcupti.so" ]; then lib=$d; break; fi
done
[ -n "$lib" ] || { echo "timeline: no libcupti.so under $CUDA_HOME (set CUDA_HOME)"; exit 2; }
inc=$CUDA_HOME/include; [ -e "$inc/cupti.h" ] || inc=$CUDA_HOME/extras/CUPTI/include
so=$(realpath "$OUT")/libfp8t_timeline.so
g++ -std=c++20 -O2 -fPIC -shared -I"$inc" tools/timeline/timeline_inject.cpp -L"$lib" -Wl,-rpath,"$lib" -lcupti \
  -o "$so"
T=$(awk '/seq_len:/ {print $2}' "$cfg")
name=$(basename "$cfg" .yaml)-b$b
# Runs of one config with different extra args get their own files: a checksum of the args names them.
[ $# -eq 0 ] || name=$name-$(printf '%s\n' "$@" | cksum | cut -d' ' -f1)
rm -rf "runs/timeline-$name"
CUDA_INJECTION64_PATH=$so FP8T_TIMELINE_OUT="$OUT/timeline-$name.csv" \
  "$BIN" train --config "$cfg" --set train.micro_batch="$b" --set train.total_batch_tokens=$((b * T)) \
  --set train.max_steps="$steps" --set train.eval_every=1000000 --set train.checkpoint_every=-1 \
  --set run.out_dir="runs/timeline-$name" "$@" > "$OUT/timeline-$name.log" 2>&1 || {
  tail -20 "$OUT/timeline-$name.log"; exit 1; }
grep -m1 "timeline:" "$OUT/timeline-$name.log" || true
[ $# -eq 0 ] || echo "timeline-$name: extra args $*"
python3 "$(dirname "$0")/timeline.py" "$OUT/timeline-$name.csv" 2 | tee "$OUT/timeline-$name.txt"
