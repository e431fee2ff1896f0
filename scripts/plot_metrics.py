#!/usr/bin/env python3
"""Overlays the loss curves of several runs (RUN_DIR/metrics.jsonl) in one PNG and, with --table, writes a
markdown table of each run's final validation losses against the bf16 run of the same size.

Usage: scripts/plot_metrics.py RUN_DIR [RUN_DIR ...] --out PNG [--table MD] [--smooth 0.9]

A run's name is its directory's name, SIZE-MODE: 124m-bf16 (the reference), 124m-bf16-seed2 (the same
with another seed: the noise floor), 124m-fp8, 124m-fp8-lean. Train records carry "loss"; evaluation
records carry "val_loss" (the first validation set) and "val": {name: loss} (every set).
Needs matplotlib (Debian: apt-get install python3-matplotlib).
"""
import argparse
import json
import os
import sys


def read_run(run_dir):
    """(train [(step, loss)], val {set: [(step, loss)]}, set names with the val_loss set first)."""
    train, val, names = [], {}, []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r and r["loss"] is not None:
                train.append((r["step"], r["loss"]))
            sets = r.get("val") or ({"val": r["val_loss"]} if "val_loss" in r else {})
            # "val" is written with sorted keys: the first set of the config is the one equal to val_loss.
            for name in sorted(sets, key=lambda n: sets[n] != r.get("val_loss")):
                if name not in val:
                    names.append(name)
                val.setdefault(name, []).append((r["step"], sets[name]))
    return train, val, names


def ema(values, beta):
    """Bias-corrected exponential moving average, as TensorBoard's smoothing."""
    out, avg = [], 0.0
    for i, v in enumerate(values, 1):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta**i))
    return out


def size_of(name):
    return name.split("-", 1)[0]


def relative(curve, ref):
    """100 * (curve - ref) / ref at the steps both have."""
    ref = dict(ref)
    return [(s, 100 * (v - ref[s]) / ref[s]) for s, v in curve if s in ref]


def plot(runs, set_names, path, beta):
    """Top row: train loss (EMA) and each validation set, runs overlaid. Bottom row, when a SIZE-bf16
    run is there: the same curves relative to it, in %, where differences of a fraction of a percent show."""
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot_metrics: needs matplotlib (Debian: apt-get install python3-matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = ["train"] + set_names
    has_ref = any(size_of(n) + "-bf16" in runs for n in runs)
    fig, axes = plt.subplots(2 if has_ref else 1, len(panels), figsize=(5.5 * len(panels), 8 if has_ref else 4.2),
                             squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    smoothed = {name: list(zip([s for s, _ in t], ema([v for _, v in t], beta))) for name, (t, _, _) in runs.items()}
    for i, (name, (_, val, _)) in enumerate(runs.items()):
        style = dict(color=colors[i % len(colors)], label=name, linewidth=1.3,
                     linestyle="--" if name.endswith("-seed2") else "-")
        curves = [smoothed[name]] + [val.get(s, []) for s in set_names]
        ref_name = size_of(name) + "-bf16"
        ref_val = runs[ref_name][1] if ref_name in runs else {}
        ref = [smoothed.get(ref_name, [])] + [ref_val.get(s, []) for s in set_names]
        for col, (curve, ref_curve) in enumerate(zip(curves, ref)):
            marker = dict(marker=".", markersize=4) if col > 0 else {}
            if curve:
                axes[0][col].plot(*zip(*curve), **style, **marker)
            if has_ref and curve and ref_curve and name != ref_name:
                axes[1][col].plot(*zip(*relative(curve, ref_curve)), **style, **marker)
    sizes = sorted({size_of(n) for n in runs})
    ref_label = sizes[0] + "-bf16" if len(sizes) == 1 else "SIZE-bf16"
    for col, panel in enumerate(panels):
        title = f"train loss (EMA {beta})" if panel == "train" else f"validation: {panel}"
        axes[0][col].set_title(title)
        axes[0][col].set_ylabel("loss")
        if has_ref:
            axes[1][col].set_title(f"{title}, vs {ref_label}")
            axes[1][col].set_ylabel("% vs bf16 seed 1337")
            axes[1][col].axhline(0, color="black", linewidth=0.8)
    for ax in axes.flat:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def pct(x):
    return f"{x:+.2f}%"


def table(runs, set_names):
    """Markdown: final loss per set, the gap to SIZE-bf16, and per size the bf16 seed spread."""
    final = {name: {s: v[s][-1][1] for s in set_names if s in v} for name, (_, v, _) in runs.items()}
    if not any(size_of(n) + "-bf16" in final for n in final):  # nothing to compare against
        lines = ["| run | " + " | ".join(set_names) + " |", "|" + "---|" * (len(set_names) + 1)]
        for name, losses in final.items():
            cells = [f"{losses[s]:.4f}" if s in losses else "-" for s in set_names]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"
    head = ["run"] + [c for s in set_names for c in (s, f"{s} vs bf16")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, losses in final.items():
        ref = final.get(size_of(name) + "-bf16", {})
        cells = [name]
        for s in set_names:
            loss = losses.get(s)
            cells.append(f"{loss:.4f}" if loss is not None else "-")
            ok = loss is not None and s in ref and name != size_of(name) + "-bf16"
            cells.append(pct(100 * (loss - ref[s]) / ref[s]) if ok else "")
        lines.append("| " + " | ".join(cells) + " |")
    for size in dict.fromkeys(size_of(n) for n in final):
        a, b = final.get(size + "-bf16"), final.get(size + "-bf16-seed2")
        if not a or not b:
            continue
        cells = [f"seed spread {size}"]
        for s in set_names:
            cells += ["", f"{100 * abs(a[s] - b[s]) / a[s]:.2f}%" if s in a and s in b else ""]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("X vs bf16: (X - SIZE-bf16) / SIZE-bf16 at the last evaluation; seed spread: "
                 "|bf16 seed 1337 - bf16 seed 1338| / bf16 seed 1337.")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", required=True, metavar="PNG")
    p.add_argument("--table", metavar="MD")
    p.add_argument("--smooth", type=float, default=0.9, help="EMA factor of the train loss (0 = raw)")
    args = p.parse_args()
    runs, set_names = {}, []
    for d in args.runs:
        name = os.path.basename(os.path.normpath(d))
        if name in runs:
            sys.exit(f"plot_metrics: two runs are named {name}")
        runs[name] = read_run(d)
        set_names += [s for s in runs[name][2] if s not in set_names]
    plot(runs, set_names, args.out, args.smooth)
    print(f"plot_metrics: wrote {args.out}")
    if args.table:
        text = table(runs, set_names)
        with open(args.table, "w") as f:
            f.write(text)
        print(text, end="")


if __name__ == "__main__":
    main()
