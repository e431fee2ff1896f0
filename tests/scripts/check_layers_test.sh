#!/usr/bin/env bash
# scripts/check_layers.py: the tree as it is passes; a copy with one deliberate crossing include (the model's
# ops reaching up into the trainer, a kernel including a Tensor, the product including the lab) fails, naming
# the file, the line, the layer and the header.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$root/scripts/check_layers.py" "$root"
cp -r "$root/src" "$root/kernels" "$work/"
python3 "$root/scripts/check_layers.py" "$work"
printf '#include "train/trainer.h"\n' >> "$work/src/ops/add.cpp"
line=$(wc -l < "$work/src/ops/add.cpp")
if out=$(python3 "$root/scripts/check_layers.py" "$work"); then
  echo "check_layers_test: a crossing include passed the check"; exit 1
fi
printf '%s\n' "$out"
grep -q "^src/ops/add.cpp:$line: ops may not include train/trainer.h" <<< "$out" ||
  { echo "check_layers_test: the message does not name src/ops/add.cpp:$line and the header"; exit 1; }
# A kernel that includes a Tensor header crosses too.
printf '#include "core/tensor.h"\n' >> "$work/kernels/elementwise.cu"
out=$(python3 "$root/scripts/check_layers.py" "$work") && exit 1
grep -q "^kernels/elementwise.cu:[0-9]*: kernels may not include core/tensor.h" <<< "$out" ||
  { echo "check_layers_test: the kernel's crossing was not named"; exit 1; }
# Nothing in the product includes the lab (kernels/lab/: variants kept for comparison, linked only by tests).
printf '#include "kernels/lab/attention_wgmma_backward_variants.cuh"\n' >> "$work/kernels/attention.cu"
out=$(python3 "$root/scripts/check_layers.py" "$work") && exit 1
grep -q "^kernels/attention.cu:[0-9]*: kernels may not include kernels/lab/attention_wgmma_backward_variants.cuh" \
  <<< "$out" || { echo "check_layers_test: the product's include of the lab was not named"; exit 1; }
echo "check_layers_test: passed"
