#!/usr/bin/env bash
# The LayerNorm codes kernel variants (perf-notes, thirtieth session): run from the repository root after
# `git apply docs/wip/ln-codes-variants.patch`; 1.5B FP8 t3 / r3 / t4, one round (~4 min on a fresh H200).
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../.."; mkdir -p .carry; export PATH=$PATH:/usr/local/cuda/bin
O=$OUT; W=/tmp/w3; L=$W/logs; mkdir -p $L
S=$(date +%s); el() { echo $(( $(date +%s) - S )); }
trap 'tar czf $O/logs.tgz -C /tmp w3' EXIT
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DFP8T_TESTS=OFF > $L/cmake.log 2>&1
cmake --build build-gpu -j16 --target fp8train > $L/build.log 2>&1; echo "build rc $? at $(el)s"
N=$(realpath build-gpu/fp8train)
for v in t3 t4 r3; do printf '#!/bin/bash\nFP8T_LAB_LN_CODES=%s exec %s "$@"\n' $v $N > .carry/w-$v; chmod +x .carry/w-$v; done
OUT=$W/ab timeout $((235 - $(el))) bash scripts/bench/ab_builds.sh d48 16 12 1 fp8 t3=.carry/w-t3 r3=.carry/w-r3 \
  t4=.carry/w-t4 > $L/ab.txt 2>&1; tail -8 $L/ab.txt; echo "at $(el)s"
for f in $W/ab/*.log; do echo "$(basename $f): $(grep -E 'step' $f | tail -1 | cut -c1-100)"; done
