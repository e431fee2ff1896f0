#!/usr/bin/env bash
# FP8 model state, old against lean, on one GPU in one call: memory plans (bytes of model state per
# parameter, peak, largest micro-batch) and a short training run each (tokens/s, peak GiB), side by side.
# Rows: "base" is FP8_BASE_BIN (an older build, optional: today's FP8 mode before this work), "wide" the
# current build with FP32 gradients and moments, "lean" BF16 gradients and FP8 moments, and "bf16" the BF16
# config, all at the same model and micro-batch, without recompute.
# Usage: scripts/bench/lean_state.sh [MODEL=d48|d12|d24] [B=16] [STEPS=20]
# Env: FP8T_BIN (default build-gpu/fp8train), FP8_BASE_BIN, OUT (default gpu-out), SKIP_PLAN=1, SKIP_BENCH=1.
set -uo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-d48}; B=${2:-16}; STEPS=${3:-20}
BIN=${FP8T_BIN:-build-gpu/fp8train}
OUT=${OUT:-gpu-out}; mkdir -p "$OUT" runs/lean
export NCCL_NVLS_ENABLE=0
case "$MODEL" in
  d12) NAME=gpt2-124m ;; d24) NAME=gpt2-350m ;; d48) NAME=gpt2-1.5b ;;
  *) echo "unknown model $MODEL (d12|d24|d48)"; exit 2 ;;
esac
LEAN=(--set precision.grad_dtype=bf16 --set optim.state_dtype=fp8)
WIDE=(--set precision.grad_dtype=fp32 --set optim.state_dtype=fp32)
COMMON=(--set train.recompute=none --set train.micro_batch="$B")
# name|binary|config|overrides...
rows=()
[ -n "${FP8_BASE_BIN:-}" ] && rows+=("base|$FP8_BASE_BIN|$NAME-fp8|")
rows+=("wide|$BIN|$NAME-fp8|${WIDE[*]}" "lean|$BIN|$NAME-fp8|${LEAN[*]}" "bf16|$BIN|$NAME-bf16|")

if [ "${SKIP_PLAN:-0}" != 1 ]; then
  for row in "${rows[@]}"; do
    IFS='|' read -r name bin cfg extra <<< "$row"
    # shellcheck disable=SC2086
    "$bin" plan --config "configs/$cfg.yaml" "${COMMON[@]}" $extra > "$OUT/plan-$MODEL-$name.txt" 2>&1 \
      || { echo "plan $name failed:"; tail -5 "$OUT/plan-$MODEL-$name.txt"; continue; }
    echo "== plan $MODEL $name: $(grep -E '^(peak|model state|saved for|device capacity)' "$OUT/plan-$MODEL-$name.txt" | tr '\n' ' ')"
  done
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  echo "| $MODEL B=$B | tokens/s | peak GiB | parameters GiB | gradients GiB | optimizer GiB | fp8_cache GiB | activations GiB |"
  echo "|---|---|---|---|---|---|---|---|"
  for row in "${rows[@]}"; do
    IFS='|' read -r name bin cfg extra <<< "$row"
    run="runs/lean/$MODEL-$name-b$B"
    rm -rf "$run"
    # shellcheck disable=SC2086
    "$bin" train --config "configs/$cfg.yaml" "${COMMON[@]}" $extra --set run.out_dir="$run" \
      --set train.total_batch_tokens=0 --set train.max_steps="$STEPS" --set train.eval_every=0 \
      --set train.checkpoint_every=-1 --set 'data.val=""' --set run.log_every=10 > "$run.log" 2>&1 \
      || { echo "train $name failed:"; tail -8 "$run.log"; continue; }
    python3 - "$run/metrics.jsonl" "$MODEL B=$B $name" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
warm = rows[max(3, len(rows) // 3):]
tps = sorted(r["tokens_per_s"] for r in warm)[len(warm) // 2]
g = lambda r, c: r["memory"]["peak"][c] / 2**30
peak = max(r["memory"]["total_peak"] for r in rows) / 2**30
cats = ["parameters", "gradients", "optimizer", "fp8_cache", "activations"]
print(f"| {sys.argv[2]} | {tps:,.0f} | {peak:.2f} | " + " | ".join(f"{max(g(r, c) for r in rows):.2f}" for c in cats) + " |")
PY
  done
fi
