#!/usr/bin/env bash
# Generates the variants, builds bench.cu with nvcc alone (no CMake; ~15 s) and runs it. From the repo root:
#   bash tools/pair_bench/run.sh [ROWS COLS ROUNDS]
# Env: OUT (default gpu-out): the binary and the generated header go to $OUT/pair_bench. Needs an sm_90 GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${OUT:-gpu-out}/pair_bench
mkdir -p "$dir"
python3 tools/pair_bench/variants.py kernels/fp8_cast_pair.cu "$dir/variants.cuh"
# The kernels' registers as ptxas reports them (spill stores only where there are any), then the bench.
nvcc -O3 -std=c++20 -arch=sm_90a --expt-relaxed-constexpr -DFP8T_CUDA_SM90A -I. -Isrc -I"$dir" \
  tools/pair_bench/bench.cu -o "$dir/bench" -Xptxas -v 2>&1 |
  sed -nE 's/.*Compiling entry function .*(pair_[a-z0-9_]+)ILNS.*/\1:/p; s/.*(Used [0-9]+ registers).*/  \1/p; s/.*([1-9][0-9]* bytes spill stores).*/  \1/p'
"$dir/bench" "$@"
