#!/usr/bin/env bash
# Runs the libFuzzer harnesses of an FP8T_FUZZ=ON build. Per harness: every saved input in
# tests/fuzz/regressions/<name>/ first (each must pass now), then SECONDS of fuzzing from a copy of
# tests/fuzz/corpus/<name>/ (the seeds are never modified). A crash, leak, timeout or OOM fails the
# run; its input is kept in regressions/<name>/ and printed as base64, so a CI log alone can restore it.
# Usage: tests/fuzz/run_fuzzers.sh BUILD_DIR [SECONDS] [NAME...]
#   SECONDS defaults to 60; NAMEs default to every fuzz_* harness in BUILD_DIR/tests/fuzz.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
if [ $# -lt 1 ]; then
  sed -n '2,8p' "$0" >&2
  exit 2
fi
BUILD="$(cd "$1" && pwd)"
SECONDS_EACH="${2:-60}"
shift $(( $# >= 2 ? 2 : 1 ))
NAMES=("$@")
if [ ${#NAMES[@]} -eq 0 ]; then
  for bin in "$BUILD"/tests/fuzz/fuzz_*; do
    [ -x "$bin" ] && [ -f "$bin" ] && NAMES+=("${bin##*/fuzz_}")
  done
fi
if [ ${#NAMES[@]} -eq 0 ]; then
  echo "run_fuzzers: no fuzz_* harness in $BUILD/tests/fuzz (configure with -DFP8T_FUZZ=ON and build)" >&2
  exit 2
fi

# Leaks count; UBSan already aborts (-fno-sanitize-recover) and should say where.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
# One input may take 30 s (a hang, reported as timeout-*), and 2 GiB (oom-*).
FUZZ_FLAGS=(-timeout=30 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1)
# Outer bounds, should libFuzzer itself not stop: a replayed input, and a whole fuzzing run.
REPLAY_LIMIT=120
FUZZ_LIMIT=$((SECONDS_EACH + 120))

WORK="$(mktemp -d "${TMPDIR:-/tmp}/fp8t_fuzz_run.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# Prints the input so it can be recreated from a log: base64 -d > FILE.
show_input() {
  local f="$1"
  if [ "$(stat -c %s "$f")" -le 8192 ]; then
    echo "---- base64 of ${f##*/} (base64 -d to restore) ----"
    base64 -w 100 "$f"
    echo "----"
  fi
}

failed=()
for name in "${NAMES[@]}"; do
  bin="$BUILD/tests/fuzz/fuzz_$name"
  if [ ! -x "$bin" ]; then
    echo "run_fuzzers: $bin is not built" >&2
    failed+=("$name (not built)")
    continue
  fi
  dict=()
  [ -f "$HERE/$name.dict" ] && dict=(-dict="$HERE/$name.dict")
  regress="$HERE/regressions/$name"

  # 1. Replay: every input that once crashed must now be handled.
  replayed=0
  bad=0
  if [ -d "$regress" ]; then
    for f in "$regress"/*; do
      [ -f "$f" ] || continue
      case "${f##*/}" in README* | .*) continue ;; esac
      replayed=$((replayed + 1))
      if ! timeout -k 5 "$REPLAY_LIMIT" "$bin" "${FUZZ_FLAGS[@]}" "$f" >"$WORK/replay.log" 2>&1; then
        echo "run_fuzzers: $name: regression ${f#"$HERE/"} fails (or ran past ${REPLAY_LIMIT} s):"
        tail -n 40 "$WORK/replay.log"
        bad=$((bad + 1))
      fi
    done
  fi
  echo "run_fuzzers: $name: $replayed regression input(s) replayed, $bad failing"
  if [ "$bad" -gt 0 ]; then
    failed+=("$name ($bad regression input(s))")
    continue  # fuzzing would only find the same crash again
  fi

  # 2. Fuzz from a copy of the seeds (plus the fixed regressions) for SECONDS_EACH.
  corpus="$WORK/$name/corpus"
  artifacts="$WORK/$name/artifacts"
  mkdir -p "$corpus" "$artifacts"
  if [ -d "$HERE/corpus/$name" ]; then cp "$HERE/corpus/$name"/* "$corpus"/ 2>/dev/null || true; fi
  if [ -d "$regress" ]; then cp "$regress"/* "$corpus"/ 2>/dev/null || true; fi
  rm -f "$corpus"/README*
  echo "run_fuzzers: $name: fuzzing ${SECONDS_EACH}s from $(ls "$corpus" | wc -l) seed(s)"
  rc=0
  timeout -k 10 "$FUZZ_LIMIT" "$bin" "${FUZZ_FLAGS[@]}" "${dict[@]}" -max_total_time="$SECONDS_EACH" \
    -artifact_prefix="$artifacts/" "$corpus" >"$WORK/$name/fuzz.log" 2>&1 || rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "run_fuzzers: $name: still running after ${FUZZ_LIMIT} s: killed"; fi
  grep -E "^(stat::number_of_executed_units|stat::new_units_added|Done )" "$WORK/$name/fuzz.log" | tr '\n' ' ' || true
  echo
  found=()
  for f in "$artifacts"/*; do
    [ -f "$f" ] || continue
    case "${f##*/}" in slow-unit-*) continue ;; esac  # slow under a loaded machine is no finding
    found+=("$f")
  done
  if [ "$rc" -ne 0 ] || [ ${#found[@]} -gt 0 ]; then
    echo "run_fuzzers: $name: libFuzzer exited with $rc; its log ends:"
    tail -n 60 "$WORK/$name/fuzz.log"
    mkdir -p "$regress"
    for f in "${found[@]}"; do
      cp "$f" "$regress/"
      echo "run_fuzzers: $name: NEW FAILING INPUT kept as $regress/${f##*/} (reproduce: $bin $regress/${f##*/})"
      show_input "$f"
    done
    failed+=("$name (libFuzzer exit $rc, ${#found[@]} input(s) kept)")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "run_fuzzers: FAILED: ${failed[*]}"
  exit 1
fi
echo "run_fuzzers: ${#NAMES[@]} harness(es) clean: ${NAMES[*]}"
