#!/usr/bin/env bash
# The sanitizer + fuzz job (CI runs it from .ci/run after the plain build's tests). Four stages, each under
# its own `timeout` and, when FP8T_CI_DEADLINE (epoch seconds) is set, never past that deadline:
#   configure  BUILD_DIR with clang >= 16: -O1 -gline-tables-only, ASan + UBSan (UBSan aborts), the libFuzzer
#              harnesses (FP8T_FUZZ=ON), no CUDA
#   build      only fp8train, fp8t_tests, fp8t_mpi_tests, fp8t_mpi_dead_rank and the fuzz_* harnesses
#   tests      ctest -L "cpu|mpi" but plot_metrics: the CPU and MPI tests and the malformed-input corpus
#              (tests/malformed) under the sanitizers
#   fuzz       tests/fuzz/run_fuzzers.sh: each harness replays tests/fuzz/regressions/<name>/, then fuzzes
#              FP8T_FUZZ_SECONDS; a new failing input is saved there (path and base64 printed) and fails the job
# Usage: tests/fuzz/sanitize.sh [BUILD_DIR]   (default build-asan)
# Env: FP8T_SANITIZE_CXX (the clang++ to use), FP8T_FUZZ_SECONDS (per harness, default 45), FP8T_JOBS (default
# nproc), FP8T_CI_DEADLINE, FP8T_SANITIZE_STAGES (default "configure build tests fuzz": a subset reuses BUILD_DIR).
# Without a clang >= 16 that links libFuzzer it skips with a message, except under CI=true, where it fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD="${1:-build-asan}"
JOBS="${FP8T_JOBS:-$(nproc)}"
FUZZ_SECONDS="${FP8T_FUZZ_SECONDS:-45}"
STAGES=" ${FP8T_SANITIZE_STAGES:-configure build tests fuzz} "
DEADLINE="${FP8T_CI_DEADLINE:-0}"

# Each stage's cap in seconds. Expected on an idle 2-core machine: build ~10-15 min, tests ~10 min, fuzz ~4 min.
CAP_CONFIGURE=300
CAP_BUILD=$((40 * 60))
CAP_TESTS=$((30 * 60))
CAP_FUZZ=$((12 * 60))

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
    command -v "$c"
    return 0
  done
  rm -rf "$probe"
  return 1
}

# OpenMP for that clang. Debian 12's libomp-16-dev (clang 16's omp.h and libomp.so) conflicts with libomp-dev
# (LLVM 14's), which scripts/setup.sh installs; so when the clang cannot build an OpenMP program by itself,
# it gets an installed LLVM libomp: a directory holding only that libomp's omp.h (not its clang's other
# headers), and its library directory. Prints the CMake arguments; fails when no libomp works.
openmp_args() {
  local probe h inc lib
  probe="$(mktemp -d)"
  printf '#include <omp.h>\nint main() { int n = 0;\n#pragma omp parallel reduction(+ : n)\n n += 1;\n return n == omp_get_max_threads() ? 0 : 1; }\n' >"$probe/p.cpp"
  if "$CXX" -fopenmp=libomp "$probe/p.cpp" -o "$probe/p" >/dev/null 2>&1 && "$probe/p"; then
    rm -rf "$probe"
    return 0
  fi
  for h in $(ls -d /usr/lib/llvm-*/lib/clang/*/include/omp.h 2>/dev/null | sort -V -r); do
    lib="${h%%/lib/clang/*}/lib"
    [ -e "$lib/libomp.so" ] || continue
    inc="$BUILD_ABS/openmp-include"
    mkdir -p "$inc"
    ln -sf "$h" "$inc/omp.h"
    if "$CXX" -fopenmp=libomp -isystem "$inc" "$probe/p.cpp" -L"$lib" -Wl,-rpath,"$lib" -o "$probe/p" >/dev/null 2>&1 &&
       "$probe/p"; then
      rm -rf "$probe"
      echo "sanitize: OpenMP from $lib (omp.h: $h)" >&2
      printf '%s\n' "-DCMAKE_CXX_FLAGS=-isystem $inc" "-DCMAKE_EXE_LINKER_FLAGS=-L$lib -Wl,-rpath,$lib"
      return 0
    fi
  done
  rm -rf "$probe"
  echo "sanitize: $CXX cannot build an OpenMP program, and no installed LLVM libomp (libomp-dev) helps" >&2
  return 1
}

if ! CXX="$(find_clang)"; then
  msg="sanitize: no clang++ >= 16 with libFuzzer found (Debian 12: apt-get install clang-16 libclang-rt-16-dev llvm-16; scripts/setup.sh does it)"
  if [ "${CI:-}" = true ]; then
    echo "$msg: the sanitizer job cannot run" >&2
    exit 1
  fi
  echo "$msg: skipping the sanitizer and fuzz tests"
  exit 0
fi
echo "sanitize: $CXX ($("$CXX" -dumpversion)) into $BUILD, -j$JOBS, $(nproc) cores; load:$(uptime | sed 's/.*load average://')"

# ---- the sanitizers' settings for every process the tests and fuzzers start. UBSan aborts on its first
# report (-fno-sanitize-recover=undefined) and, like ASan, prints a symbolized stack.
SYMBOLIZER="$(dirname "$(readlink -f "$CXX")")/llvm-symbolizer"
if [ -x "$SYMBOLIZER" ]; then export ASAN_SYMBOLIZER_PATH="$SYMBOLIZER"; fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=0:print_summary=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:print_summary=1}"

# ---- stages
SUMMARY=()
JOB_START=$(date +%s)
summary() {
  echo "sanitize: stage times (wall):"
  printf '  %s\n' "${SUMMARY[@]}"
  echo "sanitize: total $(($(date +%s) - JOB_START)) s; load:$(uptime | sed 's/.*load average://')"
}
# stage NAME CAP COMMAND...: runs COMMAND under timeout (CAP, or less when the CI deadline is nearer).
stage() {
  local name="$1" limit="$2"
  shift 2
  if [ "$DEADLINE" -gt 0 ]; then
    local left=$((DEADLINE - $(date +%s)))
    if [ "$left" -lt 60 ]; then
      SUMMARY+=("$name: not started, ${left} s left before the CI deadline")
      echo "sanitize: FAILED: no time left for stage $name before the CI deadline (FP8T_CI_DEADLINE)"
      summary
      exit 1
    fi
    [ "$left" -ge "$limit" ] || limit="$left"
  fi
  echo "sanitize: ---- $name (limit ${limit} s)"
  local t0 rc=0
  t0=$(date +%s)
  timeout -k 30 "$limit" "$@" || rc=$?
  local took=$(($(date +%s) - t0))
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    SUMMARY+=("$(printf '%-9s %5d s  KILLED at its %d s limit' "$name" "$took" "$limit")")
    echo "sanitize: FAILED: stage $name ran past its ${limit} s limit and was killed"
    summary
    exit 1
  fi
  SUMMARY+=("$(printf '%-9s %5d s  (limit %d s)%s' "$name" "$took" "$limit" "$([ "$rc" -eq 0 ] || echo ", FAILED: exit $rc")")")
  if [ "$rc" -ne 0 ]; then
    echo "sanitize: FAILED: stage $name exited with $rc"
    summary
    exit "$rc"
  fi
}

if [[ "$STAGES" == *" configure "* ]]; then
  mkdir -p "$BUILD"
  BUILD_ABS="$(cd "$BUILD" && pwd)"
  omp="$(openmp_args)" || { echo "sanitize: FAILED: no OpenMP for $CXX (Debian 12: apt-get install libomp-dev)"; exit 1; }
  OMP_ARGS=()
  if [ -n "$omp" ]; then mapfile -t OMP_ARGS <<<"$omp"; fi
  # RelWithDebInfo with our flags: -O1 keeps ASan's slowdown moderate (omp simd loops still vectorize) and
  # line tables are all a symbolized stack needs; no -DNDEBUG, so assertions stay on.
  stage configure "$CAP_CONFIGURE" cmake -S . -B "$BUILD" -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" -DFP8T_CUDA=OFF -DFP8T_FUZZ=ON \
    -DFP8T_FUZZ_SECONDS="$FUZZ_SECONDS" "${OMP_ARGS[@]}"
fi

if [[ "$STAGES" == *" build "* ]]; then
  # The targets the later stages run, of those this configuration has (MPI and PCRE2 are optional).
  available="$(cmake --build "$BUILD" --target help 2>/dev/null | sed -n 's/^\.\.\. \([^ ]*\).*/\1/p')"
  TARGETS=()
  for t in fp8train fp8t_tests fp8t_mpi_tests fp8t_mpi_dead_rank fuzz_config fuzz_shard fuzz_checkpoint fuzz_bpe; do
    if grep -qx "$t" <<<"$available"; then TARGETS+=("$t"); fi
  done
  # (A generator without a help target, e.g. Ninja, lists nothing: then the default target, the same set.)
  stage build "$CAP_BUILD" cmake --build "$BUILD" -j "$JOBS" ${TARGETS[@]+--target "${TARGETS[@]}"}
fi

if [[ "$STAGES" == *" tests "* ]]; then
  # plot_metrics checks the plotting script, not the trainer, and its two runs take minutes under ASan:
  # plain build only. --timeout: for tests without a TIMEOUT of their own (the Catch2 ones).
  stage tests "$CAP_TESTS" ctest --test-dir "$BUILD" -L "cpu|mpi" -E "^plot_metrics$" --output-on-failure --timeout 900
fi

if [[ "$STAGES" == *" fuzz "* ]]; then
  stage fuzz "$CAP_FUZZ" bash tests/fuzz/run_fuzzers.sh "$BUILD" "$FUZZ_SECONDS"
fi

summary
echo "sanitize: passed"
