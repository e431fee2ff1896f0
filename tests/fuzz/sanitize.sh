#!/usr/bin/env bash
# The sanitizer job: configures BUILD_DIR with clang, AddressSanitizer + UndefinedBehaviorSanitizer and the
# libFuzzer harnesses (FP8T_FUZZ=ON, no CUDA), builds it, and runs ctest -L "cpu|mpi|fuzz" there: the CPU and
# MPI tests and the malformed-input corpus under the sanitizers, then each harness (tests/fuzz/run_fuzzers.sh).
# Usage: tests/fuzz/sanitize.sh [BUILD_DIR]   (default build-asan)
# Env: FP8T_SANITIZE_CXX (the clang++ to use), FP8T_FUZZ_SECONDS (per harness, default 60), FP8T_JOBS.
# Without a clang >= 16 that links libFuzzer it skips with a message, except under CI=true, where it fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD="${1:-build-asan}"
JOBS="${FP8T_JOBS:-$(nproc)}"

# clang 16 is the first to compile the C++20 lambdas here that capture structured bindings; libFuzzer and
# the sanitizer runtimes come in a package of their own (libclang-rt-N-dev), so linking one proves them.
find_clang() {
  local probe c major
  probe="$(mktemp -d)"
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe/p.cpp"
  for c in "${FP8T_SANITIZE_CXX:-}" clang++-18 clang++-17 clang++-16 clang++; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 || continue
    major="$("$c" -dumpversion | cut -d. -f1)"
    [ "$major" -ge 16 ] 2>/dev/null || continue
    "$c" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" >/dev/null 2>&1 || continue
    rm -rf "$probe"
    echo "$c"
    return 0
  done
  rm -rf "$probe"
  return 1
}

if ! CXX="$(find_clang)"; then
  msg="sanitize: no clang++ >= 16 with libFuzzer found (Debian 12: apt-get install clang-16 libclang-rt-16-dev libomp-16-dev; scripts/setup.sh does it)"
  if [ "${CI:-}" = true ]; then
    echo "$msg: the sanitizer job cannot run" >&2
    exit 1
  fi
  echo "$msg: skipping the sanitizer and fuzz tests"
  exit 0
fi
echo "sanitize: $CXX into $BUILD"

start=$(date +%s)
cmake -S . -B "$BUILD" -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only" -DFP8T_CUDA=OFF -DFP8T_FUZZ=ON \
  -DFP8T_FUZZ_SECONDS="${FP8T_FUZZ_SECONDS:-60}" >/dev/null
cmake --build "$BUILD" -j "$JOBS"
built=$(date +%s)
echo "sanitize: build took $((built - start)) s"
# plot_metrics checks the plotting script, not the trainer, and its two runs take minutes under ASan: plain build only.
ctest --test-dir "$BUILD" -L "cpu|mpi|fuzz" -E "^plot_metrics$" --output-on-failure
echo "sanitize: tests took $(($(date +%s) - built)) s"
