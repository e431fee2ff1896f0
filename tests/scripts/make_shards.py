#!/usr/bin/env python3
"""Writes small llm.c-format token shards (256 x int32 header: magic 20240520, version 1, count; then
uint16 tokens) for tests that train: OUT_DIR/train_000000.bin and OUT_DIR/val_000000.bin.

Usage: make_shards.py OUT_DIR [--train N] [--val N] [--seed S]
The tokens follow a fixed random bigram table over the first 512 ids, so a tiny model's loss falls
quickly below the uniform ln(50257) and the curves of a short run have a shape.
"""
import argparse
import os
import random
import struct


def tokens(n, rng, table):
    out, t = [], 0
    for _ in range(n):
        t = table[t][rng.randrange(4)]
        out.append(t)
    return out


def write(path, toks):
    header = struct.pack("<3i", 20240520, 1, len(toks)) + bytes(4 * 253)
    with open(path + ".tmp", "wb") as f:
        f.write(header + struct.pack(f"<{len(toks)}H", *toks))
    os.replace(path + ".tmp", path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--train", type=int, default=65536)
    p.add_argument("--val", type=int, default=16384)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rng = random.Random(a.seed)
    table = [[rng.randrange(512) for _ in range(4)] for _ in range(512)]  # 4 successors per token
    os.makedirs(a.out, exist_ok=True)
    write(os.path.join(a.out, "train_000000.bin"), tokens(a.train, rng, table))
    write(os.path.join(a.out, "val_000000.bin"), tokens(a.val, rng, table))


if __name__ == "__main__":
    main()
