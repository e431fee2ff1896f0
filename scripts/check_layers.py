#!/usr/bin/env python3
"""The layer rules of src/ and kernels/ (DESIGN.md, "Layers"), checked over every #include "dir/file".

Each layer may include its own headers and those of the layers it lists, nothing else:

    base     core/{check,cuda_check,dtype,launch_limits,crc32c,adamw_math,add_run}.h: checks, dtypes, limits, math
    kernels  raw pointers, sizes and streams (never a Tensor)
    lab      kernels/lab/: kernel variants kept for comparison; no layer includes it (tests and benchmarks do)
    core     Tensor, allocator, devices, tensor utilities (fill, add, cast: through kernels on CUDA)
    data     token shards, tokenizer
    config   YAML -> structs and their checks (reads shard headers, so above data)
    autograd the tape (never CUDA, never an op)
    fp8      scaling recipes, FP8 tensor state, saved activations
    ops      differentiable ops: CPU references and CUDA launchers
    nn       the model
    optim    AdamW, schedules
    dist     communicators, ZeRO
    train    trainer, checkpoints, planner, import/export
    cli      subcommands

kernels/ is reached only through core/, fp8/, ops/ and dist/ (the communicator's stream): the trainer and
the model go through ops. Build step `check_layers` runs this before the library compiles, so a crossing include fails
the build. Usage: check_layers.py [ROOT] (default: the repository holding this script). Exit 1 lists every
crossing as FILE:LINE: LAYER may not include HEADER (LAYER may include: ...).
"""
import os
import re
import sys

BASE_FILES = {"core/check.h", "core/cuda_check.h", "core/dtype.h", "core/launch_limits.h", "core/crc32c.h",
              "core/adamw_math.h", "core/add_run.h"}

ALLOWED = {
    "base": set(),
    "kernels": {"base"},
    "lab": {"base", "kernels"},
    "core": {"base", "kernels"},
    "data": {"base", "core"},
    "config": {"base", "core", "data"},
    "autograd": {"base", "core"},
    "fp8": {"base", "kernels", "core", "config"},
    "ops": {"base", "kernels", "core", "config", "autograd", "fp8"},
    "nn": {"base", "core", "config", "autograd", "fp8", "ops"},
    "optim": {"base", "core", "config", "autograd", "fp8", "ops", "nn"},
    "dist": {"base", "kernels", "core", "config", "data", "autograd", "fp8", "ops", "nn", "optim"},
    "train": {"base", "core", "config", "data", "autograd", "fp8", "ops", "nn", "optim", "dist"},
    "cli": {"base", "core", "config", "data", "autograd", "fp8", "ops", "nn", "optim", "dist", "train"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE = re.compile(r"\.(h|hpp|cpp|cu|cuh)$")


def layer_of_header(path):
    """The layer a header named as in an #include belongs to (None: not one of ours)."""
    if path in BASE_FILES:
        return "base"
    top = path.split("/", 1)[0]
    if path.startswith("kernels/lab/"):
        return "lab"
    if top == "kernels":
        return "kernels"
    return top if top in ALLOWED and "/" in path else None


def layer_of_file(rel):
    """The layer of a source file, by its path under the repository."""
    parts = rel.split("/")
    if parts[0] == "kernels":
        return "lab" if len(parts) > 2 and parts[1] == "lab" else "kernels"
    if parts[0] == "src" and len(parts) > 2:
        inner = "/".join(parts[1:])
        return "base" if inner in BASE_FILES else parts[1]
    return None


def crossings(root):
    found = []
    for top in ("src", "kernels"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if not SOURCE.search(name):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                layer = layer_of_file(rel)
                if layer not in ALLOWED:
                    continue
                with open(full, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = layer_of_header(m.group(1))
                        if target is None or target == layer or target in ALLOWED[layer]:
                            continue
                        found.append(f"{rel}:{lineno}: {layer} may not include {m.group(1)} ({layer} may include: "
                                     f"{', '.join(sorted(ALLOWED[layer])) or 'nothing else'})")
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bad = crossings(root)
    for line in bad:
        print(line)
    if bad:
        print(f"check_layers: {len(bad)} include(s) cross the layers (scripts/check_layers.py lists the rules)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
