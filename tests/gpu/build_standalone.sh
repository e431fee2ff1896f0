#!/usr/bin/env bash
# Builds fp8t_gpu_tests from core/, ops/cpu/, kernels/ and tests/gpu/ alone, without the rest of the
# library: for checking the CUDA backend while other parts of the tree are mid-change.
# Usage: tests/gpu/build_standalone.sh OUT_DIR [JOBS] [ARCH]
set -euo pipefail
out=${1:?usage: build_standalone.sh OUT_DIR [JOBS] [ARCH]}
jobs=${2:-4}
arch=${3:-90a}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out/obj"
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
cxxflags="-std=c++20 -O2 -fopenmp -Wall -Wextra -DFP8T_HAVE_CUDA -I$root/src -I$root -I/usr/local/cuda/include"
cuflags="-std=c++20 -O3 -DFP8T_HAVE_CUDA -I$root/src -I$root --expt-relaxed-constexpr -lineinfo -gencode=arch=compute_${arch},code=sm_${arch}"
srcs=$(ls "$root"/src/core/*.cpp "$root"/src/ops/cpu/*.cpp "$root"/src/ops/cuda_ops.cpp "$root"/kernels/*.cu \
          "$root"/tests/gpu/*.cpp)
for s in $srcs; do echo "$s"; done | xargs -P "$jobs" -I{} bash -c '
  s={}; o='"$out"'/obj/$(echo "${s#'"$root"'/}" | tr / _).o
  if [[ $s == *.cu ]]; then '"$nvcc $cuflags"' -c "$s" -o "$o"; else g++ '"$cxxflags"' -c "$s" -o "$o"; fi'
g++ -fopenmp -o "$out/fp8t_gpu_tests" "$out"/obj/*.o -L/usr/local/cuda/lib64 -lcublasLt -lcudart -lCatch2 -lfmt
echo "built $out/fp8t_gpu_tests"
