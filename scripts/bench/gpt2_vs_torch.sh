#!/usr/bin/env bash
# Side-by-side benchmark on one GPU: our trainer and the PyTorch peer (torch.compile BF16) on the
# same GPT-2 shapes, in the same session. Prints tokens/s, model TFLOP/s, peak GiB and our/peer ratios.
# Usage: scripts/bench/gpt2_vs_torch.sh [MODEL=d12|d48] [B] [STEPS] [PRECISION=bf16|fp8] [PEER_MODE=compile]
# Needs: build/fp8train (CUDA build), data/brown/train_*.bin, the peer script at $PEER
# (default .carry/bench/torch_gpt2.py, a copy of ../shared/bench/torch_gpt2.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-d12}; B=${2:-32}; STEPS=${3:-30}; PREC=${4:-bf16}; PEER_MODE=${5:-compile}
PEER=${PEER:-.carry/bench/torch_gpt2.py}
BIN=${FP8T_BIN:-build/fp8train}
OUTDIR=${OUTDIR:-runs/bench}
T=1024
case "$MODEL" in
  d12) CFG=configs/gpt2-124m-$PREC.yaml ;;
  d48) CFG=configs/gpt2-1.5b-$PREC.yaml ;;
  *) echo "unknown model $MODEL (d12|d48)"; exit 2 ;;
esac
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUTDIR"
RUN="$OUTDIR/$MODEL-$PREC-b$B"
rm -rf "$RUN"
"$BIN" train --config "$CFG" --set run.out_dir="$RUN" --set train.micro_batch="$B" \
  --set train.total_batch_tokens=0 --set train.max_steps="$STEPS" --set train.eval_every=0 \
  --set train.checkpoint_every=0 --set 'data.val=""' --set run.log_every=10 --set train.checkpoint_every=100000 \
  > "$RUN.log" 2>&1 || { tail -20 "$RUN.log"; exit 1; }
OURS=$(python3 - "$RUN/metrics.jsonl" "$STEPS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
steps = int(sys.argv[2]); warm = rows[max(3, steps // 3):]
tps = sorted(r["tokens_per_s"] for r in warm)[len(warm) // 2]
peak = max(r["memory"]["total_peak"] for r in rows) / 2**30
mfu = sorted(r.get("mfu", 0) for r in warm)[len(warm) // 2]
print(f"{tps:.0f} {peak:.2f} {mfu*989.4:.1f} {rows[-1]['loss']:.4f}")
PY
)
PEER_LINE=$(python3 "$PEER" "$MODEL" "$PEER_MODE" "$B" "$T" "$STEPS" 2>&1 | grep RESULT | tail -1)
python3 - "$MODEL" "$PREC" "$B" "$OURS" "$PEER_LINE" "$PEER_MODE" <<'PY'
import sys, re
model, prec, B, ours, peer, pmode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5], sys.argv[6]
ptps = float(re.search(r"tok/s=(\d+)", peer).group(1)); pgib = float(re.search(r"peak_GiB=([\d.]+)", peer).group(1))
ptf = float(re.search(r"TFLOPs=([\d.]+)", peer).group(1))
tps, gib, tf = float(ours[0]), float(ours[1]), float(ours[2])
print(f"| {model} B={B} | fp8train {prec} | {tps:,.0f} | {tf:.0f} | {gib:.1f} |")
print(f"| {model} B={B} | torch {pmode} bf16 | {ptps:,.0f} | {ptf:.0f} | {pgib:.1f} |")
print(f"RATIO {model} B={B} {prec}/torch-{pmode}: tokens/s x{tps/ptps:.3f}, peak memory x{gib/pgib:.3f}")
PY
