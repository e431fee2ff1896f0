#!/usr/bin/env bash
# Issue 16's four rows (tokens/s against llm.c's bars) for one or more builds, each row interleaved across the builds
# in ab_builds.sh rounds: GPT-2 124M B=32 FP8 (CUDA graph, FP8 lm_head), 124M B=32 BF16 mode (CUDA graph), 1.5B B=16
# FP8 (CUDA graph, FP8 lm_head: the 124M FP8 row's options since 2026-12-05) and 1.5B B=16 BF16 mode (no graph); FP8
# rows with activation_storage fp8 (memory_wall.sh's fp8 row) and fast accumulation in dgrad and wgrad
# (precision.fp8.fast_accum, the default since 2026-12-06; passed so that binaries from before that default run it too;
# a binary older than the option fails these FP8 rows). Prints each row's
# ab_builds.sh table, then every build's tokens/s against the bar.
# Usage: scripts/bench/issue16_rows.sh LABEL=BIN [LABEL=BIN ...]   e.g. main=build-gpu/fp8train
# Env: OUT (default gpu-out), ROUNDS (default 1), STEPS_124M (30), STEPS_1_5B (15; BF16 mode takes 12),
# ROWS (default "124m_fp8 124m_bf16 15b_fp8 15b_bf16"), DRY_RUN=1 (print the ab_builds.sh commands only),
# CARD (e.g. H200: stop with exit 3 before any run unless nvidia-smi's first GPU name contains it; the bars are H200's).
# About 1 min per 124M run and 45 s per 1.5B run on an H200: four rows of two builds, one round, ~7 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { sed -n 2,10p "$0"; exit 2; }
OUT=${OUT:-gpu-out}; mkdir -p "$OUT/issue16"
ROUNDS=${ROUNDS:-1}; S124=${STEPS_124M:-30}; S15=${STEPS_1_5B:-15}
ROWS=${ROWS:-"124m_fp8 124m_bf16 15b_fp8 15b_bf16"}
declare -A BAR=([124m_fp8]=696000 [124m_bf16]=557000 [15b_fp8]=75000 [15b_bf16]=52600)
GRAPH='--set train.cuda_graph=true'
FP8_HEAD='--set "precision.fp8.layers=[qkv,proj,fc,fc2,lm_head]"'
# Fast accumulation in the FP8 GEMMs (the default since 2026-12-06, docs/perf-notes.md, thirty-eighth session).
FAST_ACCUM='--set "precision.fp8.fast_accum=[forward,dgrad,wgrad]"'

# LABEL=BIN with extra arguments: a wrapper under OUT that execs BIN with them appended.
wrap() {
  local label=$1 bin=$2 extra=$3 w
  w=$(realpath "$OUT/issue16")/w-$label-$4
  printf '#!/bin/bash\nexec %s "$@" %s\n' "$(realpath "$bin")" "$extra" > "$w"
  chmod +x "$w"
  echo "$label=$w"
}
for pair in "$@"; do
  [ -x "${pair#*=}" ] || { echo "issue16_rows: ${pair#*=} is not an executable (LABEL=BIN)"; exit 2; }
done
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
echo "issue16_rows: GPU ${gpu:-unknown (no nvidia-smi)}"
if [ -n "${CARD:-}" ] && [[ "$gpu" != *"$CARD"* ]]; then
  echo "issue16_rows: CARD=$CARD asked for, this GPU is ${gpu:-unknown}: no rows run"
  exit 3
fi
summary=$OUT/issue16/summary.tsv; : > "$summary"
for row in $ROWS; do
  case "$row" in
    124m_fp8) args=(d12 32 "$S124" "$ROUNDS" fp8); extra="$GRAPH $FP8_HEAD $FAST_ACCUM" ;;
    124m_bf16) args=(d12 32 "$S124" "$ROUNDS" bf16); extra="$GRAPH" ;;
    15b_fp8) args=(d48 16 "$S15" "$ROUNDS" fp8); extra="$GRAPH $FP8_HEAD $FAST_ACCUM" ;;
    15b_bf16) args=(d48 16 $((S15 > 12 ? 12 : S15)) "$ROUNDS" bf16); extra="" ;;
    *) echo "issue16_rows: unknown row $row (124m_fp8 124m_bf16 15b_fp8 15b_bf16)"; exit 2 ;;
  esac
  builds=()
  for pair in "$@"; do
    if [ -n "$extra" ]; then builds+=("$(wrap "${pair%%=*}" "${pair#*=}" "$extra" "$row")"); else builds+=("$pair"); fi
  done
  echo "## $row (bar ${BAR[$row]})"
  if [ "${DRY_RUN:-0}" = 1 ]; then
    echo "OUT=$OUT/issue16/$row bash scripts/bench/ab_builds.sh ${args[*]} ${builds[*]}"
    continue
  fi
  OUT="$OUT/issue16/$row" bash scripts/bench/ab_builds.sh "${args[@]}" "${builds[@]}" | tee "$OUT/issue16/$row.txt" |
    tail -n $(( $# + 3 ))
  # ab_builds.sh's per-run table: the median tokens/s of each label in this row.
  for pair in "$@"; do
    label=${pair%%=*}
    tps=$(awk -F'|' -v l=" $label " '$3 == l && $5 ~ /[0-9]/ {gsub(/ /, "", $5); print $5}' "$OUT/issue16/$row.txt" |
          sort -n | awk '{v[NR] = $1} END {if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}')
    printf '%s\t%s\t%s\t%s\n' "$row" "$label" "${tps:-nan}" "${BAR[$row]}" >> "$summary"
  done
done
[ "${DRY_RUN:-0}" = 1 ] && exit 0
echo
echo "| row | build | tokens/s | bar | tokens/s / bar |"
echo "|---|---|---|---|---|"
awk -F'\t' '{printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, ($3 == "nan" ? "-" : sprintf("%.3f", $3 / $4))}' \
  "$summary"
