#!/usr/bin/env bash
# One device call for a speed change: build this tree and a base tree, run every GPU test, then in the time left
# the same-call A/B (ab_builds.sh) of GPT-2 1.5B (fp8_all, fp8), BF16 mode (this tree), GPT-2 124M (fp8_all, fp8).
# The base is a source tree made on the development machine and carried, e.g. for main before the change:
#   mkdir -p .ab-base/main && git archive REV | tar -x -C .ab-base/main     (.ab-base/ is in .git/info/exclude)
# then `run` with carry [".ab-base", "data/brown"]: bash scripts/bench/ab_session.sh
# Env: AB_BASE (default .ab-base/main), LIMIT (seconds for the whole call, default 588), OUT.
# Measured with it (eleventh session): build ~103 s, base ~70 s, GPU tests ~66 s, 1.5B rows ~42 s a run.
export NCCL_NVLS_ENABLE=0 FP8T_SKIP_APT=1 FP8T_SKIP_DATA=1 FP8T_BUILD_DIR=build-gpu FP8T_JOBS=16
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
BASE_DIR=${AB_BASE:-.ab-base/main}
S=$(date +%s); el() { echo $(( $(date +%s) - S )); }
left() { echo $(( ${LIMIT:-588} - $(el) )); }
bash scripts/setup.sh > "$OUT/setup.log" 2>&1; echo "setup rc $? at $(el)s"; grep -E "error" "$OUT/setup.log" | head -5
(cd "$BASE_DIR" && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFP8T_TESTS=OFF > /dev/null &&
 cmake --build build -j16 --target fp8train > "$OUT/build-base.log" 2>&1); echo "base rc $? at $(el)s"
build-gpu/tests/fp8t_gpu_tests > "$OUT/gpu_tests.log" 2>&1; echo "gpu tests rc $? at $(el)s"
grep -E "FAILED|failed|passed" "$OUT/gpu_tests.log" | tail -8
B=$BASE_DIR/build/fp8train; N=build-gpu/fp8train
timeout "$(left)" env OUT="$OUT/a" bash scripts/bench/ab_builds.sh d48 16 15 1 "fp8_all fp8" base=$B new=$N | tail -5
echo "at $(el)s"
[ "$(left)" -gt 50 ] && timeout "$(left)" env OUT="$OUT/b" SKIP_CAP=1 ROWS=bf16 FP8T_BIN=$N \
  bash scripts/bench/memory_wall.sh d48 80 16 15 | tail -1
echo "at $(el)s"
[ "$(left)" -gt 60 ] && timeout "$(left)" env OUT="$OUT/c" bash scripts/bench/ab_builds.sh d12 32 20 1 "fp8_all fp8" \
  base=$B new=$N | tail -5
echo "end at $(el)s"
