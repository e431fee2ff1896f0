#!/usr/bin/env bash
# Data-parallel check on N GPUs of one host: ZeRO stages 0/1/2 on N ranks and a 1-GPU baseline, same
# config and seed; prints loss agreement, optimizer bytes per GPU and tokens/s scaling.
# Usage: scripts/bench/dp_scaling.sh [NGPU=2] [CONFIG=configs/gpt2-124m-bf16.yaml] [B=16] [STEPS=50]
set -uo pipefail
cd "$(dirname "$0")/../.."
N=${1:-2}; CFG=${2:-configs/gpt2-124m-bf16.yaml}; B=${3:-16}; STEPS=${4:-50}
BIN=${FP8T_BIN:-build/fp8train}
export NCCL_NVLS_ENABLE=0
mkdir -p runs/dp
COMMON=(--config "$CFG" --set train.micro_batch="$B" --set train.total_batch_tokens=0 --set train.max_steps="$STEPS"
        --set 'data.val=""' --set run.log_every=10 --set train.checkpoint_every=-1 --set distributed.timeout_s=120)
timeout 180 "$BIN" train "${COMMON[@]}" --set run.out_dir=runs/dp/one > runs/dp-one.log 2>&1 || tail -5 runs/dp-one.log
for z in 0 1 2; do
  timeout 180 mpirun -np "$N" --allow-run-as-root -x NCCL_NVLS_ENABLE=0 "$BIN" train "${COMMON[@]}" \
    --set distributed.zero_stage=$z --set run.out_dir=runs/dp/z$z > runs/dp-z$z.log 2>&1 || tail -8 runs/dp-z$z.log
done
python3 - "$N" "$STEPS" <<'PY'
import json, sys, os
n, steps = int(sys.argv[1]), int(sys.argv[2])
def load(name):
    p = f"runs/dp/{name}/metrics.jsonl"
    return [json.loads(l) for l in open(p) if '"loss"' in l] if os.path.exists(p) else []
runs = {k: load(k) for k in ["one", "z0", "z1", "z2"]}
mid = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")
for k, rows in runs.items():
    if not rows: print(f"{k}: no metrics"); continue
    warm = rows[max(3, steps // 3):]
    print(f"{k}: final loss {rows[-1]['loss']:.4f}, tokens/s {mid([r['tokens_per_s'] for r in warm]):,.0f}, "
          f"optimizer bytes/GPU {rows[-1]['memory']['current']['optimizer']:,}, peak GiB {max(r['memory']['total_peak'] for r in rows)/2**30:.1f}")
if runs["z0"] and runs["one"]:
    s = mid([r['tokens_per_s'] for r in runs["z0"][steps//3:]]) / mid([r['tokens_per_s'] for r in runs["one"][steps//3:]])
    print(f"SCALING {n} GPUs / 1 GPU (stage 0): x{s:.3f}")
for z in ["z1", "z2"]:
    if runs["z0"] and runs[z]:
        d = max(abs(a['loss'] - b['loss']) for a, b in zip(runs["z0"], runs[z]))
        print(f"AGREE {z} vs z0: max |loss diff| over {len(runs[z])} steps = {d:.2e}; optimizer bytes ratio "
              f"{runs[z][-1]['memory']['current']['optimizer'] / runs['z0'][-1]['memory']['current']['optimizer']:.3f}")
PY
