#!/usr/bin/env bash
# scripts/plot_metrics.py on real runs (CTest label cpu): a few steps of tiny-cpu (FP32) and tiny-cpu-fp8
# on synthetic shards, then the plots of both. Every PNG must exist with the pixel size that the
# script's documentation gives (read from its IHDR chunk) and must not be blank.
# Usage: tests/scripts/plot_metrics_test.sh FP8TRAIN_BINARY
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$(realpath "${1:?usage: $0 FP8TRAIN_BINARY}")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fp8t-plot-test.XXXXXX")
trap '[ "${FP8T_KEEP_PLOTS:-0}" = 1 ] && echo "kept $WORK" || rm -rf "$WORK"' EXIT
cd "$ROOT"

# A python with matplotlib (and Pillow, which it needs): the first python3, else Debian's.
PY=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c "import matplotlib, PIL" 2>/dev/null; then PY=$p && break; fi
done
if [ -z "$PY" ]; then
  echo "FAIL: no python3 with matplotlib: apt-get install python3-matplotlib (scripts/setup.sh does)"
  exit 1
fi

"$PY" tests/scripts/make_shards.py "$WORK/data"
for config in tiny-cpu tiny-cpu-fp8; do
  extra=()
  [ $config = tiny-cpu-fp8 ] && extra=(--set precision.fp8.monitor_every=2)
  "$BIN" train --config "configs/$config.yaml" --set run.out_dir="$WORK/$config" \
    --set data.train="$WORK/data/train_*.bin" --set data.val="$WORK/data/val_*.bin" --set model.vocab_size=512 \
    --set train.max_steps=6 --set train.eval_every=3 --set train.eval_steps=2 --set run.log_every=3 \
    "${extra[@]}" >"$WORK/$config.log" 2>&1 ||
    { cat "$WORK/$config.log"; echo "FAIL: training $config"; exit 1; }
done

"$PY" scripts/plot_metrics.py "$WORK/tiny-cpu" "$WORK/tiny-cpu-fp8" --out-dir "$WORK/plots"

# The expected sizes, from plot_metrics.py's documentation: P = 600 x 450 per panel.
"$PY" - "$WORK" <<'PY' || exit 1
import json, os, struct, sys
work = sys.argv[1]
fp8 = [json.loads(l).get("fp8") for l in open(os.path.join(work, "tiny-cpu-fp8", "metrics.jsonl"))]
layers = len(next(f for f in fp8 if f))
assert layers == 16, f"{layers} FP8 linears in tiny-cpu-fp8's metrics, expected 4 blocks x (qkv, proj, fc, fc2)"
expected = {
    "loss.png": (2 * 600, 450),          # train + one validation set; no SIZE-bf16 run, so one row
    "throughput.png": (1200, 450),
    "memory.png": (2 * 600, 450),        # one panel per run
    "fp8.png": (1800, 3 * (100 + 12 * layers)),  # one FP8 run
}
failed = False
for name, (w, h) in expected.items():
    path = os.path.join(work, "plots", name)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        print(f"FAIL: {name} missing or empty")
        failed = True
        continue
    with open(path, "rb") as f:
        head = f.read(24)
    # PNG signature, then the IHDR chunk: length, b"IHDR", width, height (big-endian).
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        print(f"FAIL: {name} is not a PNG")
        failed = True
        continue
    got = struct.unpack(">II", head[16:24])
    status = "ok" if got == (w, h) else "FAIL"
    print(f"{status}: {name} {got[0]} x {got[1]} px, expected {w} x {h}, {os.path.getsize(path)} bytes")
    failed |= got != (w, h)
sys.exit(1 if failed else 0)
PY

# Not blank: the data behind the heat maps and the stack is there (every FP8 amax and scale finite,
# the main memory categories non-zero), and every figure has the colours of something drawn.
"$PY" - "$WORK" <<'PY'
import math, os, sys
from PIL import Image
sys.path.insert(0, "scripts")
import plot_metrics
work = sys.argv[1]
failed = False
steps, layers, grids = plot_metrics.fp8_grid(plot_metrics.read_records(os.path.join(work, "tiny-cpu-fp8")))
if steps != list(range(1, 7)):
    print(f"FAIL: FP8 statistics at steps {steps}, expected 1..6")
    failed = True
for (key, tensor), rows in grids.items():
    bad = sum(not math.isfinite(v) for row in rows for v in row)
    if key != "saturated" and bad:
        print(f"FAIL: {bad} of {len(layers) * len(steps)} {tensor} {key} cells have no value")
        failed = True
for run in ("tiny-cpu", "tiny-cpu-fp8"):
    mem = [r["memory"]["peak"] for r in plot_metrics.read_records(os.path.join(work, run)) if "memory" in r]
    for cat in ("parameters", "gradients", "optimizer", "activations"):
        if not mem or not all(m.get(cat, 0) > 0 for m in mem):
            print(f"FAIL: {run}: no {cat} bytes to stack in some step")
            failed = True
least = {"loss.png": 8, "throughput.png": 8, "memory.png": 8, "fp8.png": 64}
for name, n in least.items():
    colors = Image.open(os.path.join(work, "plots", name)).convert("RGB").getcolors(maxcolors=1 << 24)
    print(f"{'ok' if len(colors) >= n else 'FAIL'}: {name} has {len(colors)} colours (at least {n})")
    failed |= len(colors) < n
sys.exit(1 if failed else 0)
PY
echo "PASS: plot_metrics.py draws loss, throughput, memory and FP8 heat maps"
