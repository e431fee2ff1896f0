#!/usr/bin/env bash
# The memory wall on one GPU in one call: what fits at a memory cap, and whether it trains there.
# 1. `fp8train plan --memory-gib CAP` for BF16 mode and the FP8 storages (no recompute): the largest
#    micro-batch of each and its ratio to BF16 mode's.
# 2. Two training steps of each at that micro-batch with run.memory_limit_gib = CAP (the claim measured,
#    not projected): exit status, peak GiB, tokens/s.
# 3. Unless SKIP_SPEED=1: tokens/s and peak of each at micro-batch B (default 16), STEPS steps.
# Usage: scripts/bench/memory_wall.sh [MODEL=d48|d12|d24] [CAP_GIB=80] [B=16] [STEPS=15]
# Env: FP8T_BIN (default build/fp8train), OUT (default gpu-out), ROWS (default "bf16 fp8 fp8_all"),
# SKIP_CAP=1 (only the speed rows), SKIP_SPEED=1 (only the capped rows), ACCUM=N (the speed rows take N
# micro-steps per optimizer step; default 1).
set -uo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-d48}; CAP=${2:-80}; B=${3:-16}; STEPS=${4:-15}
BIN=${FP8T_BIN:-build/fp8train}
OUT=${OUT:-gpu-out}; mkdir -p "$OUT" runs/wall
case "$MODEL" in
  d12) NAME=gpt2-124m ;; d24) NAME=gpt2-350m ;; d48) NAME=gpt2-1.5b ;;
  *) echo "unknown model $MODEL (d12|d24|d48)"; exit 2 ;;
esac
COMMON=(--set train.recompute=none)
ACCUM=${ACCUM:-1}
T=$(awk '/seq_len:/ {print $2}' "configs/$NAME-fp8.yaml")  # the speed rows' tokens per micro-step: B * T
RUN=(--set train.total_batch_tokens=0 --set train.eval_every=0 --set train.checkpoint_every=-1
     --set 'data.val=""' --set run.log_every=1)
# name -> config and overrides. bf16 is BF16 mode (FP32 master, gradients and moments, BF16 activations).
row_args() {
  case "$1" in
    bf16) echo "configs/$NAME-bf16.yaml --set precision.grad_dtype=fp32 --set optim.state_dtype=fp32" ;;
    fp8) echo "configs/$NAME-fp8.yaml --set precision.fp8.activation_storage=fp8" ;;
    fp8_all) echo "configs/$NAME-fp8.yaml --set precision.fp8.activation_storage=fp8_all" ;;
    *) echo "unknown row $1" >&2; return 1 ;;
  esac
}
summary() {  # metrics.jsonl -> "tokens/s peak_GiB queue_ms wait_ms" (medians over the warm steps)
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
warm = rows[max(1, len(rows) // 3):] or rows
med = lambda k: sorted(r[k] for r in warm)[len(warm) // 2] if all(k in r for r in warm) else float("nan")
peak = max(r["memory"]["total_peak"] for r in rows) / 2**30
print(f"{med('tokens_per_s'):,.0f} {peak:.2f} {med('queue_ms'):.1f} {med('wait_ms'):.1f}")
PY
}

declare -A MAXMB
[ "${SKIP_CAP:-0}" = 1 ] || {
echo "| $MODEL, cap $CAP GiB | largest micro-batch (plan) | vs bf16 | saved/sequence | trains 2 steps there | peak GiB | tokens/s |"
echo "|---|---|---|---|---|---|---|"
for name in ${ROWS:-bf16 fp8 fp8_all}; do
  # shellcheck disable=SC2046
  "$BIN" plan --config $(row_args "$name") "${COMMON[@]}" --memory-gib "$CAP" > "$OUT/plan-$MODEL-$name-cap$CAP.txt" 2>&1 \
    || { echo "plan $name failed:"; tail -5 "$OUT/plan-$MODEL-$name-cap$CAP.txt"; continue; }
  mb=$(sed -n 's/.*largest micro_batch that fits: \([0-9]*\).*/\1/p' "$OUT/plan-$MODEL-$name-cap$CAP.txt")
  saved=$(sed -n 's/^saved for backward: \([^,]*\) per sequence.*/\1/p' "$OUT/plan-$MODEL-$name-cap$CAP.txt")
  MAXMB[$name]=$mb
  ratio="-"
  [ -n "${MAXMB[bf16]:-}" ] && [ "${MAXMB[bf16]}" -gt 0 ] && ratio=$(python3 -c "print(f'{$mb / ${MAXMB[bf16]}:.2f}x')")
  run="runs/wall/$MODEL-$name-cap$CAP"; rm -rf "$run"
  # shellcheck disable=SC2046
  if "$BIN" train --config $(row_args "$name") "${COMMON[@]}" "${RUN[@]}" --set train.micro_batch="$mb" \
       --set run.memory_limit_gib="$CAP" --set train.max_steps=2 --set run.out_dir="$run" > "$run.log" 2>&1; then
    read -r tps peak _ <<< "$(summary "$run/metrics.jsonl")"
    echo "| $name | $mb | $ratio | $saved | yes | $peak | $tps |"
  else
    echo "| $name | $mb | $ratio | $saved | NO: $(grep -m1 -o 'error.*' "$run.log" | cut -c1-160) | - | - |"
  fi
done
}

[ "${SKIP_SPEED:-0}" = 1 ] && exit 0
echo
# queue / wait ms: the host's time queueing a step's forward and backward, then waiting for the device (metrics.jsonl).
echo "| $MODEL, micro-batch $B, $STEPS steps | tokens/s | peak GiB | queue ms | wait ms |"
echo "|---|---|---|---|---|"
for name in ${ROWS:-bf16 fp8 fp8_all}; do
  run="runs/wall/$MODEL-$name-b$B"; rm -rf "$run"
  # shellcheck disable=SC2046
  if "$BIN" train --config $(row_args "$name") "${COMMON[@]}" "${RUN[@]}" --set train.micro_batch="$B" \
       --set train.total_batch_tokens=$((ACCUM > 1 ? ACCUM * B * T : 0)) \
       --set train.max_steps="$STEPS" --set run.out_dir="$run" > "$run.log" 2>&1; then
    read -r tps peak queue wait <<< "$(summary "$run/metrics.jsonl")"
    echo "| $name | $tps | $peak | $queue | $wait |"
  else
    echo "| $name | failed: $(grep -m1 -o 'error.*' "$run.log" | cut -c1-160) | - | - | - |"
  fi
done
