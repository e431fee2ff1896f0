#!/usr/bin/env bash
# Side-by-side benchmark on one GPU: our trainer (one or more precisions) and the PyTorch peer
# (torch.compile BF16) on the same GPT-2 shapes, in the same session. Prints tokens/s, model
# TFLOP/s (6N + 12·L·C·T per token), peak GiB and the ratios against the peer.
# Usage: scripts/bench/gpt2_vs_torch.sh [MODEL=d12|d48] [B=32] [STEPS=30] ["bf16 fp8"] [PEER_MODE=compile]
# Needs: $FP8T_BIN (default build/fp8train, a CUDA build), data/brown/train_*.bin, and the peer at
# $PEER (default .carry/bench/torch_gpt2.py, a copy of ../shared/bench/torch_gpt2.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-d12}; B=${2:-32}; STEPS=${3:-30}; PRECS=${4:-bf16}; PEER_MODE=${5:-compile}
PEER=${PEER:-.carry/bench/torch_gpt2.py}
BIN=${FP8T_BIN:-build/fp8train}
OUTDIR=${OUTDIR:-runs/bench}
T=1024
case "$MODEL" in
  d12) NAME=gpt2-124m ;;
  d48) NAME=gpt2-1.5b ;;
  *) echo "unknown model $MODEL (d12|d48)"; exit 2 ;;
esac
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUTDIR"
rows=()
for PREC in $PRECS; do
  # A precision may carry variants: bf16+ln (train.recompute layernorm), fp8+all (FP8 storage of
  # attention's qkv and the GELU input too), +tune / +notune (run.gemm_autotune), combinable (fp8+all+ln).
  BASE=${PREC%%+*}
  VARIANT=(--set train.recompute=none)
  [[ $PREC =~ \+ln(\+|$) ]] && VARIANT=(--set train.recompute=layernorm)
  [[ $PREC == *+all* ]] && VARIANT+=(--set precision.fp8.activation_storage=fp8_all)
  [[ $PREC == *+tune* ]] && VARIANT+=(--set run.gemm_autotune=true)
  [[ $PREC == *+notune* ]] && VARIANT+=(--set run.gemm_autotune=false)
  RUN="$OUTDIR/$MODEL-$PREC-b$B"
  rm -rf "$RUN"
  "$BIN" train --config "configs/$NAME-$BASE.yaml" --set run.out_dir="$RUN" --set train.micro_batch="$B" \
    --set train.total_batch_tokens=0 --set train.max_steps="$STEPS" --set train.eval_every=0 \
    --set train.checkpoint_every=-1 --set 'data.val=""' --set run.log_every=10 "${VARIANT[@]}" \
    > "$RUN.log" 2>&1 || { echo "fp8train $PREC failed:"; tail -20 "$RUN.log"; continue; }
  rows+=("$PREC $(python3 - "$RUN/metrics.jsonl" "$STEPS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
steps = int(sys.argv[2]); warm = rows[max(3, steps // 3):]
mid = lambda xs: sorted(xs)[len(xs) // 2]
tps = mid([r["tokens_per_s"] for r in warm])
peak = max(r["memory"]["total_peak"] for r in rows) / 2**30
act = max(r["memory"]["peak"]["activations"] for r in rows) / 2**30
print(f"{tps:.0f} {peak:.2f} {mid([r.get('mfu', 0) for r in warm]) * 989.4:.1f} {act:.2f}")
PY
)")
done
PEER_LINE=""
if [ "$PEER_MODE" != none ]; then
  PEER_LINE=$(python3 "$PEER" "$MODEL" "$PEER_MODE" "$B" "$T" "$STEPS" 2>&1 | grep RESULT | tail -1 || true)
fi
python3 - "$MODEL" "$B" "$PEER_MODE" "$PEER_LINE" "${rows[@]}" <<'PY'
import re, sys
model, B, pmode, peer = sys.argv[1:5]
print("| model, micro-batch | run | tokens/s | model TFLOP/s | peak GiB | activations peak GiB |")
print("|---|---|---|---|---|---|")
ours = [r.split() for r in sys.argv[5:]]
for prec, tps, gib, tf, act in ours:
    print(f"| {model} B={B} | fp8train {prec} | {float(tps):,.0f} | {float(tf):.0f} | {float(gib):.1f} | {float(act):.1f} |")
if peer:
    ptps = float(re.search(r"tok/s=(\d+)", peer).group(1)); pgib = float(re.search(r"peak_GiB=([\d.]+)", peer).group(1))
    ptf = float(re.search(r"TFLOPs=([\d.]+)", peer).group(1))
    print(f"| {model} B={B} | torch {pmode} | {ptps:,.0f} | {ptf:.0f} | {pgib:.1f} | - |")
    for prec, tps, gib, tf, act in ours:
        print(f"RATIO {model} B={B} fp8train-{prec}/torch-{pmode}: tokens/s x{float(tps)/ptps:.3f}, peak memory x{float(gib)/pgib:.3f}")
if len(ours) > 1:
    base = ours[0]
    for prec, tps, gib, tf, act in ours[1:]:
        print(f"RATIO {model} B={B} fp8train-{prec}/fp8train-{base[0]}: tokens/s x{float(tps)/float(base[1]):.3f}, "
              f"peak x{float(gib)/float(base[2]):.3f}, activations x{float(act)/float(base[4]):.3f}")
PY
