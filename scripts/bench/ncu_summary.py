#!/usr/bin/env python3
"""Summarise an `ncu --csv --metrics gpu__time_duration.sum` log of a 2-step training run.

Steps end with the AdamW launches; the summary covers the kernels after the first step's AdamW run up
to the end of the second's (the second step, without warm-up or evaluation), grouped by kernel name,
largest total first."""
import csv
import sys
from collections import defaultdict

rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") == "gpu__time_duration.sum":
        rows.append((int(r["ID"]), r["Kernel Name"], float(r["Metric Value"].replace(",", ""))))
rows.sort()
adam = [i for i, (_, name, _) in enumerate(rows) if "adamw" in name]
ends = [a for k, a in enumerate(adam) if k + 1 == len(adam) or adam[k + 1] > a + 8]
if len(ends) < 2:
    sys.exit(f"expected two optimizer steps, found {len(ends)} AdamW groups")
step = rows[ends[0] + 1:ends[1] + 1]
total = sum(t for _, _, t in step)
groups = defaultdict(lambda: [0, 0.0])
for _, name, t in step:
    short = name.split("(")[0].replace("void ", "").replace("fp8t::<unnamed>::", "")[:80]
    groups[short][0] += 1
    groups[short][1] += t
print(f"second step: {len(step)} kernels of {len(rows)}, GPU time {total / 1e6:.2f} ms")
for name, (n, t) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:40]:
    print(f"{t / 1e6:9.3f} ms {100 * t / total:5.1f}% {n:5d}x  {name}")
