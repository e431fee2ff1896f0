#!/usr/bin/env bash
# Same-call A/B of builds: memory_wall.sh's speed rows (bf16 | fp8 | fp8_all) with each binary, the binaries
# interleaved within every round, so that the machine's call-to-call spread (~1.5%) drops out of the ratios.
# Prints every run, then per row the median tokens/s of each binary and its ratio to the first binary's.
# Usage: scripts/bench/ab_builds.sh MODEL B STEPS ROUNDS "ROWS" LABEL=BIN [LABEL=BIN ...]
#   e.g. scripts/bench/ab_builds.sh d48 16 20 2 "fp8_all bf16" base=.ab-base/main/build/fp8train new=build-gpu/fp8train
# Env: OUT (default gpu-out): each run's table line and log go there; ACCUM as memory_wall.sh's.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 6 ] || { sed -n 2,7p "$0"; exit 2; }
MODEL=$1; B=$2; STEPS=$3; ROUNDS=$4; ROWS=$5; shift 5
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
labels=(); bins=()
for pair in "$@"; do
  labels+=("${pair%%=*}"); bins+=("${pair#*=}")
  [ -x "${pair#*=}" ] || { echo "ab_builds: ${pair#*=} is not an executable (LABEL=BIN)"; exit 2; }
done
results="$OUT/ab-$MODEL-b$B.tsv"; : > "$results"
echo "| row | build | round | tokens/s | peak GiB | queue ms | wait ms |"
echo "|---|---|---|---|---|---|---|"
for ((round = 1; round <= ROUNDS; ++round)); do
  for row in $ROWS; do
    # Alternate the order between rounds so neither build always runs first.
    order=$(seq 0 $((${#bins[@]} - 1))); ((round % 2 == 0)) && order=$(echo "$order" | tac)
    for i in $order; do
      line=$(SKIP_CAP=1 ROWS=$row FP8T_BIN="${bins[$i]}" OUT="$OUT" bash scripts/bench/memory_wall.sh "$MODEL" 80 "$B" \
             "$STEPS" 2>&1 | grep "^| $row |")
      cp "runs/wall/$MODEL-$row-b$B.log" "$OUT/ab-$MODEL-$row-b$B-${labels[$i]}-r$round.log" 2>/dev/null
      tps=$(echo "$line" | awk -F'|' '{gsub(/[ ,]/, "", $3); print $3}')
      peak=$(echo "$line" | awk -F'|' '{gsub(/ /, "", $4); print $4}')
      qw=$(echo "$line" | awk -F'|' '{gsub(/ /, "", $5); gsub(/ /, "", $6); print $5 " | " $6}')
      echo "| $row | ${labels[$i]} | $round | ${tps:-failed} | ${peak:--} | ${qw:-- | -} |"
      printf '%s\t%s\t%s\t%s\n' "$row" "${labels[$i]}" "${tps:-nan}" "${peak:-nan}" >> "$results"
    done
  done
done
echo
python3 - "$results" "${labels[@]}" <<'PY'
import statistics, sys
path, labels = sys.argv[1], sys.argv[2:]
runs = {}
for line in open(path):
    row, label, tps, peak = line.rstrip("\n").split("\t")
    runs.setdefault(row, {}).setdefault(label, []).append(float(tps))
print("| row | " + " | ".join(f"{l} median tokens/s" for l in labels) + " | " +
      " | ".join(f"{l}/{labels[0]}" for l in labels[1:]) + " |")
print("|---" * (1 + 2 * len(labels) - 1) + "|")
for row, by_label in runs.items():
    med = {l: statistics.median(v) for l, v in by_label.items()}
    base = med.get(labels[0], float("nan"))
    print(f"| {row} | " + " | ".join(f"{med.get(l, float('nan')):,.0f}" for l in labels) + " | " +
          " | ".join(f"{med.get(l, float('nan')) / base:.4f}" for l in labels[1:]) + " |")
PY
