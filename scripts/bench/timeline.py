#!/usr/bin/env python3
"""Where a running step's device time goes, from a CUPTI timeline (tools/timeline, scripts/bench/timeline.sh).

Steps end with an AdamW kernel (a name containing "adamw"): step k spans from the end of step k-1's last AdamW
kernel to the end of its own. For every step after the first SKIP (default 2) the script takes the union of the
activities' intervals (kernels, memsets, memcpys, on any stream) and prints the medians of:
  step ms (the window), busy ms (the device runs something), idle ms (window - busy), the sums of kernel, memset
  and memcpy durations, the activity count, and the idle gaps by length (< 2 us, 2-10 us, 10-100 us, >= 100 us:
  count and ms).
Then the time per category (issue 16's: FP8 and BF16 GEMMs, attention, FP8 casts/saves/restores, LayerNorm,
optimizer, ..., memsets, idle) as medians over the steps with their share of the step; for the median step, the
ten longest gaps with the activities before and after them, and its kernels grouped by name, largest total first.
Usage: scripts/bench/timeline.py TIMELINE.csv [SKIP]"""
import csv
import statistics
import sys
from collections import defaultdict

BUCKETS = [(0, 2e3, "< 2 us"), (2e3, 1e4, "2-10 us"), (1e4, 1e5, "10-100 us"), (1e5, float("inf"), ">= 100 us")]


def load(path):
    acts = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            acts.append((int(r["start_ns"]), int(r["end_ns"]), r["kind"], r["name"]))
    acts.sort()
    return acts


def steps_of(acts):
    """(begin, end) windows, one per optimizer step: consecutive AdamW kernels form one group (ZeRO may launch
    several), and a window ends at its group's last end."""
    ends, last = [], None
    for i, (s, e, kind, name) in enumerate(acts):
        if kind == "kernel" and "adamw" in name.lower():
            if last is not None and last == i - 1:
                ends[-1] = max(ends[-1], e)
            else:
                ends.append(e)
            last = i
    return list(zip(ends, ends[1:]))


def analyse(acts, begin, end):
    inside = [a for a in acts if a[1] > begin and a[0] < end]
    busy, gaps = 0, []
    cur_s, cur_e, prev = None, None, None
    for s, e, kind, name in inside:
        s, e = max(s, begin), min(e, end)
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
                gaps.append((s - cur_e, prev, name))
            elif s > begin:
                gaps.append((s - begin, "(step start)", name))
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
        prev = name
    if cur_e is not None:
        busy += cur_e - cur_s
        if cur_e < end:
            gaps.append((end - cur_e, prev, "(step end)"))
    sums = defaultdict(int)
    for s, e, kind, _ in inside:
        sums[kind] += min(e, end) - max(s, begin)
    r = {"step ms": (end - begin) / 1e6, "busy ms": busy / 1e6, "idle ms": (end - begin - busy) / 1e6,
         "kernel ms": sums["kernel"] / 1e6, "memset ms": sums["memset"] / 1e6, "memcpy ms": sums["memcpy"] / 1e6,
         "activities": len(inside)}
    for lo, hi, label in BUCKETS:
        sel = [g for g, _, _ in gaps if lo <= g < hi]
        r[f"gaps {label}"] = len(sel)
        r[f"gaps {label} ms"] = sum(sel) / 1e6
    return r, gaps, inside


# Kernel name -> category, first match wins (names as CUPTI reports them, demangled). cuBLASLt's Hopper kernels
# ("nvjet_sm90_...") carry "q" in their type letters for FP8 operands ("qqtst", "qrtst"); the others are BF16.
CATEGORIES = [
    ("attention", lambda n: "attention" in n),
    ("FP8 GEMM", lambda n: n.startswith("nvjet_sm90_q")),
    ("BF16 GEMM", lambda n: n.startswith(("nvjet", "sm90_xmma_gemm", "cublasLt::", "cutlass"))),
    ("FP8 casts, saves, restores", lambda n: any(k in n for k in ("cast", "save_rows", "dequantize", "fp8_",
                                                                   "transpose", "amax", "scale_from", "gelu_pair"))),
    ("LayerNorm", lambda n: "layernorm" in n),
    ("optimizer, grad norm", lambda n: any(k in n for k in ("adamw", "sum_squares", "global_norm"))),
    ("loss, embedding", lambda n: "cross_entropy" in n or "embedding" in n),
]


def category(kind, name):
    if kind != "kernel":
        return kind + "s"  # memsets, memcpys
    n = short(name)
    for label, match in CATEGORIES:
        if match(n):
            return label
    return "other kernels"


def by_category(inside, begin, end, idle_ms):
    t = defaultdict(float)
    for s, e, kind, name in inside:
        t[category(kind, name)] += (min(e, end) - max(s, begin)) / 1e6
    t["idle"] = idle_ms
    return t


def short(name):
    if name.startswith("("):  # a step boundary, not a kernel
        return name
    # The namespace first: "(anonymous namespace)::" holds a parenthesis too.
    name = name.replace("(anonymous namespace)::", "").replace("void ", "")
    name = name.replace("fp8t::kernels::", "").replace("fp8t::", "")
    # The argument list starts at the first "(" outside the template arguments, which keep theirs (enum values print
    # as "(Fp8CastInput)2"), so each instance of a kernel template is a name of its own.
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0 and i > 0:
            name = name[:i]
            break
    return name[:110]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    skip = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    acts = load(sys.argv[1])
    # Window i covers step i + 2 (step 1 has no AdamW before it), so steps 1..skip are windows before skip - 1.
    windows = steps_of(acts)[max(skip - 1, 0):]
    if not windows:
        sys.exit(f"timeline: no complete step after the first {skip} in {sys.argv[1]} (steps end with an AdamW kernel)")
    results = [analyse(acts, b, e) for b, e in windows]
    keys = list(results[0][0].keys())
    print(f"{len(windows)} steps (after the first {skip}); medians:")
    print("| " + " | ".join(keys) + " |")
    print("|---" * len(keys) + "|")
    print("| " + " | ".join(f"{statistics.median(r[k] for r, _, _ in results):.3f}".rstrip("0").rstrip(".")
                             for k in keys) + " |")
    cats = [by_category(inside, b, e, r["idle ms"]) for (r, _, inside), (b, e) in zip(results, windows)]
    step_ms = statistics.median(r["step ms"] for r, _, _ in results)
    labels = sorted({k for c in cats for k in c}, key=lambda k: -statistics.median(c.get(k, 0.0) for c in cats))
    print("\nby category (medians over the steps; kernels on several streams can overlap, so shares may sum past 100%)")
    print("| category | ms per step | share of step |")
    print("|---|---|---|")
    for k in labels:
        ms = statistics.median(c.get(k, 0.0) for c in cats)
        print(f"| {k} | {ms:.2f} | {100 * ms / step_ms:.1f}% |")
    steps = sorted(range(len(results)), key=lambda i: results[i][0]["step ms"])
    r, gaps, inside = results[steps[len(steps) // 2]]
    print(f"\nmedian step ({r['step ms']:.2f} ms): the ten longest gaps")
    for g, before, after in sorted(gaps, key=lambda x: -x[0])[:10]:
        print(f"  {g / 1e3:9.1f} us  after {short(before)}  before {short(after)}")
    groups = defaultdict(lambda: [0, 0])
    sizes = defaultdict(lambda: [0, 0])  # memsets and memcpys by size ("N bytes")
    for s, e, kind, name in inside:
        key = short(name) if kind == "kernel" else kind
        groups[key][0] += 1
        groups[key][1] += e - s
        if kind != "kernel":
            sizes[f"{kind} {name}"][0] += 1
            sizes[f"{kind} {name}"][1] += e - s
    print("\nmedian step: activities by name, largest total first")
    for name, (n, t) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"  {t / 1e6:8.3f} ms  {n:5d}x  {name}")
    print("\nmedian step: memsets and memcpys by size, largest total first")
    for name, (n, t) in sorted(sizes.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"  {t / 1e6:8.3f} ms  {n:5d}x  {name}")


if __name__ == "__main__":
    main()
