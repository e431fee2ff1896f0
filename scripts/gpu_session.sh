#!/usr/bin/env bash
# One GPU-machine session: build, GPU tests, a GPU training smoke run, and side-by-side benchmarks.
# Usage (on the GPU machine, repo root): scripts/gpu_session.sh [MODEL:B:PRECS ...], e.g. d12:32:bf16,fp8 d48:16:bf16
# Environment: SKIP_TESTS=1, PARITY=1 (loss parity runs), PLAN=1 (memory plans), FIT=1 (run the largest
# micro-batch the plans found), ATTN=1 (attention bench), PROFILE=1 (per-kernel profiles at 1.5B's width),
# STEPS (benchmark steps, default 30), PEER_MODE (default compile), BUDGET (seconds for the whole script, default 560).
# Logs go to $OUT (or ./gpu-out). Keeps NCCL_NVLS_ENABLE=0.
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export FP8T_BIN=${FP8T_BIN:-build-gpu/fp8train}
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 \
  && cmake --build build-gpu -j16 > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log" "$OUT/cmake.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  ctest --test-dir build-gpu -L gpu --output-on-failure --timeout 300 > "$OUT/gpu_tests.log" 2>&1
  grep -E "tests passed|FAILED|Failed|assertions" "$OUT/gpu_tests.log" | tail -15
fi
# Loss parity (PARITY=1): the default job's model (head size 64) in BF16 on the GPU for 200 steps, to
# compare with the same run on the CPU in FP32; and the 6-layer model in BF16 and FP8 for 1,000 steps.
if [ "${PARITY:-0}" = 1 ]; then
  rm -rf runs/parity-gpu-bf16 runs/parity6
  build-gpu/fp8train train --config configs/tiny-cpu.yaml --set run.device=cuda --set precision.compute=bf16 \
    --set model.n_head=2 --set train.max_steps=200 --set train.eval_every=50 --set run.out_dir=runs/parity-gpu-bf16 \
    > "$OUT/parity-gpu-bf16.log" 2>&1 && cp runs/parity-gpu-bf16/metrics.jsonl "$OUT/parity-gpu-bf16.jsonl"
  tail -2 "$OUT/parity-gpu-bf16.log"
  mkdir -p runs/parity6
  FP8T_BIN=build-gpu/fp8train bash scripts/bench/loss_parity.sh configs/small-6l.yaml runs/parity6/run \
    "bf16:--set precision.compute=bf16" "fp8:--set precision.compute=fp8" \
    "fp8all:--set precision.compute=fp8 --set precision.fp8.activation_storage=fp8_all" 2>&1 | tee "$OUT/parity6.txt"
fi
# Memory plans (PLAN=1): saved-for-backward bytes and the largest micro-batch, GPT-2 124M, BF16 and FP8
# (fp8 and fp8_all activation storage).
if [ "${PLAN:-0}" = 1 ]; then
  for args in "configs/gpt2-124m-bf16.yaml" "configs/gpt2-124m-fp8.yaml" \
              "configs/gpt2-124m-fp8.yaml --set precision.fp8.activation_storage=fp8_all"; do
    echo "== plan $args" | tee -a "$OUT/plan.txt"
    build-gpu/fp8train plan --config $args 2>&1 | tail -5 | tee -a "$OUT/plan.txt"
  done
fi
# Largest micro-batch check (FIT=1, after PLAN=1): two steps of GPT-2 124M at the micro-batch the
# plan says is the largest that fits, BF16 and FP8 with fp8_all storage, with their peak memory.
if [ "${FIT:-0}" = 1 ]; then
  for args in "configs/gpt2-124m-bf16.yaml" "configs/gpt2-124m-fp8.yaml --set precision.fp8.activation_storage=fp8_all"; do
    b=$(grep -A6 "== plan $args\$" "$OUT/plan.txt" | grep -o "largest micro_batch that fits: [0-9]*" | grep -o "[0-9]*$" | head -1)
    [ -n "$b" ] || { echo "FIT: no plan for $args"; continue; }
    rm -rf runs/fit
    echo "== fit $args at micro_batch $b" | tee -a "$OUT/fit.txt"
    build-gpu/fp8train train --config $args --set train.micro_batch=$b --set train.total_batch_tokens=0 \
      --set train.max_steps=2 --set train.eval_every=0 --set train.checkpoint_every=-1 --set 'data.val=""' \
      --set run.out_dir=runs/fit 2>&1 | grep -E "step|rror|memory" | tail -4 | tee -a "$OUT/fit.txt"
  done
fi
# Attention kernels alone (ATTN=1): the [.bench] throughput case against the CPU-checked kernels.
if [ "${ATTN:-0}" = 1 ]; then
  build-gpu/tests/fp8t_gpu_tests "attention throughput" 2>&1 | grep "^attention" | tee "$OUT/attention_bench.txt"
fi
# Per-kernel profiles (PROFILE=1): GPT-2 1.5B's width (C 1600, B 16) with 4 layers instead of 48, BF16 and
# FP8, without recompute as in the benchmarks: per-layer kernel times are those of the full model (multiply by
# 12), in a fraction of Nsight's time.
if [ "${PROFILE:-0}" = 1 ]; then
  for cfg in configs/gpt2-1.5b-bf16.yaml configs/gpt2-1.5b-fp8.yaml; do
    OUT="$OUT" bash scripts/bench/profile_step.sh "$cfg" 16 --set model.n_layer=4 --set train.recompute=none 2>&1 | head -45 | tee -a "$OUT/profile.txt"
  done
fi
# Benchmarks: each argument is MODEL:B:PRECISIONS, e.g. d12:32:bf16,fp8 (variants: bf16+ln, fp8+all)
for spec in "$@"; do
  IFS=: read -r model b precs <<< "$spec"
  left=$(( ${BUDGET:-560} - ($(date +%s) - t0) )); [ "$left" -lt 60 ] && { echo "skip $spec: ${left}s left"; continue; }
  OUTDIR=runs/bench timeout "$left" bash scripts/bench/gpt2_vs_torch.sh "$model" "$b" "${STEPS:-30}" "${precs//,/ }" \
    "${PEER_MODE:-compile}" 2>&1 | tee -a "$OUT/bench.txt"
done
echo "total: $(( $(date +%s) - t0 )) s"
