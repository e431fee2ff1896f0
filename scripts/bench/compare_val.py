"""Compare validation-loss trajectories of several runs (metrics.jsonl files); the first is the reference."""
import json
import sys


def val_losses(path):
    return {r["step"]: r["val_loss"] for r in map(json.loads, open(path)) if "val_loss" in r}


runs = [(p, val_losses(p)) for p in sys.argv[1:]]
ref_path, ref = runs[0]
for step in sorted(ref):
    cells = [f"{v[step]:.4f}" if step in v else "-" for _, v in runs]
    print(f"step {step:6d}  " + "  ".join(cells))
last = max(ref)
for path, v in runs:
    if last in v:
        print(f"PARITY {path} final_val={v[last]:.4f} rel_diff={(v[last] - ref[last]) / ref[last]:+.4%}")
