#!/usr/bin/env python3
"""Draws the metrics of one or several runs (RUN_DIR/metrics.jsonl) as PNG files and, with --table, writes a
markdown table of each run's final validation losses against the bf16 run of the same size.

Usage: scripts/plot_metrics.py RUN_DIR [RUN_DIR ...] [--out-dir DIR] [--out PNG] [--table MD] [--smooth 0.9]

Files, in --out-dir (default: the first RUN_DIR); sizes in pixels, P = 600 x 450 per panel:
  loss.png        train loss (EMA) and each validation set, runs overlaid: (1 + sets) P wide, 1 P high, 2 P
                  high when a SIZE-bf16 run is there (the second row: each run relative to it, in %)
  throughput.png  tokens/s and MFU over steps, runs overlaid: 1200 x 450
  memory.png      each run's per-step peak bytes by category, stacked, and the step's total peak:
                  one 600 x 450 panel per run, side by side
  fp8.png         per-layer FP8 amax (log10), scale (log2) and saturated-value counts as heat maps over
                  steps, one column per tensor (input, weight, grad_output): 1800 wide, per FP8 run
                  3 x (100 + 12 x layers) high; only when a run logged FP8 statistics
--out PNG puts the loss figure there instead and draws only it (scripts/bench/convergence.sh).

A run's name is its directory's name, SIZE-MODE: 124m-bf16 (the reference), 124m-bf16-seed2 (the same
with another seed: the noise floor), 124m-fp8, 124m-fp8-lean. Train records carry "loss"; evaluation
records carry "val_loss" (the first validation set) and "val": {name: loss} (every set).
Needs matplotlib (Debian: apt-get install python3-matplotlib; when this python lacks it, Debian's
/usr/bin/python3 is tried).
"""
import argparse
import json
import math
import os
import sys

PANEL_W, PANEL_H, DPI = 600, 450, 100
FP8_TENSORS = ("input", "weight", "grad_output")
# The allocator's categories in DESIGN.md's order (metrics.jsonl writes them sorted by name).
MEM_ORDER = ("parameters", "gradients", "optimizer", "activations", "fp8_cache", "workspace", "comm")


def pyplot():
    """matplotlib.pyplot on the Agg backend; re-runs the script under /usr/bin/python3 (Debian's
    python3-matplotlib) when this interpreter has no matplotlib, e.g. a pyenv or venv python."""
    try:
        import matplotlib
    except ImportError:
        system = "/usr/bin/python3"
        if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system):
            os.execv(system, [system] + sys.argv)
        sys.exit("plot_metrics: needs matplotlib (Debian: apt-get install python3-matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure(plt, cols, rows_px, **kw):
    """A figure exactly cols x PANEL_W by sum(rows_px) pixels when saved at DPI."""
    return plt.subplots(len(rows_px), cols, figsize=(cols * PANEL_W / DPI, sum(rows_px) / DPI), dpi=DPI,
                        squeeze=False, gridspec_kw={"height_ratios": rows_px}, **kw)


def save(fig, path):
    fig.savefig(path, dpi=DPI)  # no bbox_inches="tight": the pixel size stays the documented one
    print(f"plot_metrics: wrote {path}")


def finish_step_axes(plt, fig, axes, path):
    """Step on every x axis, a grid, a legend where there are lines; then save and close."""
    for ax in axes.flat:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def read_records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(records):
    """(train [(step, loss)], val {set: [(step, loss)]}, set names with the val_loss set first)."""
    train, val, names = [], {}, []
    for r in records:
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


def plot_loss(plt, runs, set_names, path, beta):
    """Top row: train loss (EMA) and each validation set, runs overlaid. Bottom row, when a SIZE-bf16
    run is there: the same curves relative to it, in %, where differences of a fraction of a percent show."""
    panels = ["train"] + set_names
    has_ref = any(size_of(n) + "-bf16" in runs for n in runs)
    fig, axes = figure(plt, len(panels), [PANEL_H] * (2 if has_ref else 1))
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
    finish_step_axes(plt, fig, axes, path)


def plot_throughput(plt, records, path):
    """tokens/s and MFU (%) per step, runs overlaid. CPU runs log no MFU: the panel says so."""
    fig, axes = figure(plt, 2, [PANEL_H])
    tps_ax, mfu_ax = axes[0]
    for name, recs in records.items():
        steps = [r for r in recs if "tokens_per_s" in r]
        tps_ax.plot([r["step"] for r in steps], [r["tokens_per_s"] for r in steps], label=name, linewidth=1.2)
        mfu = [r for r in steps if r.get("mfu") is not None]
        if mfu:
            mfu_ax.plot([r["step"] for r in mfu], [100 * r["mfu"] for r in mfu], label=name, linewidth=1.2)
    tps_ax.set_title("throughput")
    tps_ax.set_ylabel("tokens/s (all ranks)")
    mfu_ax.set_title("model FLOPs utilisation")
    mfu_ax.set_ylabel("MFU (%)")
    if not mfu_ax.get_lines():
        mfu_ax.text(0.5, 0.5, "no MFU in these runs\n(CPU runs log none)", ha="center", va="center",
                    transform=mfu_ax.transAxes, color="gray")
    finish_step_axes(plt, fig, axes, path)


def plot_memory(plt, records, path):
    """Per run: each category's peak bytes within the step (rank 0's allocator), stacked, in MiB, and
    the step's total peak as a line. Categories peak at different moments, so the stack can exceed it."""
    fig, axes = figure(plt, len(records), [PANEL_H])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (name, recs) in zip(axes[0], records.items()):
        mem = [r for r in recs if "memory" in r]
        steps = [r["step"] for r in mem]
        names = set().union(*(r["memory"]["peak"] for r in mem)) if mem else set()
        cats = [c for c in MEM_ORDER if c in names] + sorted(names - set(MEM_ORDER))
        cats = [c for c in cats if any(r["memory"]["peak"].get(c, 0) for r in mem)]
        if cats:
            ys = [[r["memory"]["peak"].get(c, 0) / 2**20 for r in mem] for c in cats]
            ax.stackplot(steps, ys, labels=cats, colors=[colors[i % len(colors)] for i in range(len(cats))],
                         alpha=0.85)
            ax.plot(steps, [r["memory"]["total_peak"] / 2**20 for r in mem], color="black", linewidth=1.2,
                    label="total peak")
            ax.legend(fontsize=7, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no memory records", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"memory by category: {name}")
        ax.set_xlabel("step")
        ax.set_ylabel("peak within the step (MiB)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def fp8_grid(recs):
    """(steps, layer names, {(metric, tensor): rows x steps}) from the records' "fp8" objects; amax as
    log10 and scale as log2; NaN where a value is missing, zero, or non-finite (written as a string)."""
    recs = [r for r in recs if r.get("fp8")]
    layers = list(dict.fromkeys(layer for r in recs for layer in r["fp8"]))
    steps = [r["step"] for r in recs]

    def value(r, layer, tensor, key):
        v = r["fp8"].get(layer, {}).get(tensor, {}).get(key)
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            return math.nan
        if key == "saturated":
            return float(v)
        return (math.log10 if key == "amax" else math.log2)(v) if v > 0 else math.nan

    grids = {(key, t): [[value(r, layer, t, key) for r in recs] for layer in layers]
             for key in ("amax", "scale", "saturated") for t in FP8_TENSORS}
    return steps, layers, grids


def plot_fp8(plt, records, path):
    """Per FP8 run, three rows (amax, scale, saturated) by three columns (input, weight, grad_output) of
    heat maps: layers down, steps across. Grey cells: no value (or a non-finite amax)."""
    runs = {name: fp8_grid(recs) for name, recs in records.items() if any(r.get("fp8") for r in recs)}
    if not runs:
        return False
    rows_px = [h for _, layers, _ in runs.values() for h in [100 + 12 * len(layers)] * 3]
    fig, axes = figure(plt, len(FP8_TENSORS), rows_px)
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_bad("lightgrey")
    labels = {"amax": "log10 amax", "scale": "log2 scale", "saturated": "saturated values"}
    for i, (name, (steps, layers, grids)) in enumerate(runs.items()):
        for j, key in enumerate(("amax", "scale", "saturated")):
            for col, tensor in enumerate(FP8_TENSORS):
                ax = axes[3 * i + j][col]
                extent = (steps[0] - 0.5, steps[-1] + 0.5, len(layers) - 0.5, -0.5)
                im = ax.imshow(grids[(key, tensor)], aspect="auto", interpolation="nearest", cmap=cmap,
                               extent=extent)
                fig.colorbar(im, ax=ax, pad=0.01).ax.tick_params(labelsize=6)
                ax.set_title(f"{name}: {tensor} {labels[key]}", fontsize=8)
                ax.set_yticks(range(len(layers)))
                ax.set_yticklabels(layers if col == 0 else [], fontsize=5)
                ax.tick_params(axis="x", labelsize=6)
                if j == 2:
                    ax.set_xlabel("step", fontsize=7)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)
    return True


def pct(x):
    return f"{x:+.2f}%"


def table(runs, set_names):
    """Markdown: final loss per set, the gap to SIZE-bf16, and per size the bf16 seed spread."""
    final = {name: {s: v[s][-1][1] for s in set_names if s in v} for name, (_, v, _) in runs.items()}
    if not any(size_of(n) + "-bf16" in final for n in final):  # nothing to compare against
        lines = ["| run | " + " | ".join(set_names) + " |", "|" + "---|" * (len(set_names) + 1)]
        for name, losses_ in final.items():
            cells = [f"{losses_[s]:.4f}" if s in losses_ else "-" for s in set_names]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"
    head = ["run"] + [c for s in set_names for c in (s, f"{s} vs bf16")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, losses_ in final.items():
        ref = final.get(size_of(name) + "-bf16", {})
        cells = [name]
        for s in set_names:
            loss = losses_.get(s)
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
    p.add_argument("--out-dir", metavar="DIR", help="where the PNG files go (default: the first RUN_DIR)")
    p.add_argument("--out", metavar="PNG", help="draw only the loss figure, to PNG")
    p.add_argument("--table", metavar="MD")
    p.add_argument("--smooth", type=float, default=0.9, help="EMA factor of the train loss (0 = raw)")
    args = p.parse_args()
    plt = pyplot()
    records, runs, set_names = {}, {}, []
    for d in args.runs:
        name = os.path.basename(os.path.normpath(d))
        if name in runs:
            sys.exit(f"plot_metrics: two runs are named {name}")
        records[name] = read_records(d)
        runs[name] = losses(records[name])
        set_names += [s for s in runs[name][2] if s not in set_names]
    if args.out:
        plot_loss(plt, runs, set_names, args.out, args.smooth)
    else:
        out = args.out_dir or args.runs[0]
        os.makedirs(out, exist_ok=True)
        plot_loss(plt, runs, set_names, os.path.join(out, "loss.png"), args.smooth)
        plot_throughput(plt, records, os.path.join(out, "throughput.png"))
        plot_memory(plt, records, os.path.join(out, "memory.png"))
        if not plot_fp8(plt, records, os.path.join(out, "fp8.png")):
            print("plot_metrics: no FP8 statistics in these runs (precision.compute: fp8 logs them): no fp8.png")
    if args.table:
        text = table(runs, set_names)
        with open(args.table, "w") as f:
            f.write(text)
        print(text, end="")


if __name__ == "__main__":
    main()
