#!/usr/bin/env python3
"""Per-layer summary of the "where the time goes" table that `./train --bench` prints: the profiled
step's kernels grouped (GEMMs by use, attention, FP4 quantizers, memory-bound glue, optimizer, head)
and divided by the profiled depth. The head, embedding and optimizer rows are reported per step.

    python3 scripts/profile_summary.py docs/results/2026-11-30_bf16_bench_b3d7a88.log
"""
import re
import sys


def main(path):
    layers, rows = None, {}
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.match(r"where the time goes: one step at (\d+) layers", line)
        if m:
            layers, rows = int(m.group(1)), {}  # the last table of the file wins
            continue
        m = re.match(r"^(\S.*?)\s{2,}(\d+\.\d+)\s+(\d+\.\d+)\s+\d+\.\d+%", line)
        if m and layers and not line.startswith("total"):
            rows[m.group(1).strip()] = float(m.group(3))
    if not layers:
        sys.exit(f"{path}: no 'where the time goes' table")

    def total(pred):
        return sum(v for k, v in rows.items() if pred(k))

    per_step = lambda k: "head" in k or k.startswith(("embed", "adamw", "grad sumsq", "zero"))
    groups = [
        ("GEMM forward", lambda k: "gemm fwd" in k),
        ("GEMM dgrad", lambda k: "gemm dgrad" in k),
        ("GEMM wgrad", lambda k: "gemm wgrad" in k),
        ("attention", lambda k: k.startswith("attention")),
        ("FP4 quantizers", lambda k: " quant " in f" {k} "),
        ("memory-bound glue", lambda k: k.split()[0] in ("rmsnorm", "swiglu", "residual", "rope", "transpose")),
    ]
    print(f"{path}: profiled step at {layers} layers, {sum(rows.values()):.1f} ms")
    print("per layer (ms):")
    for name, pred in groups:
        print(f"  {name:20s} {total(lambda k: pred(k) and not per_step(k)) / layers:7.2f}")
    print("per step (ms):")
    print(f"  {'output head':20s} {total(lambda k: 'head' in k):7.2f}")
    print(f"  {'optimizer':20s} {total(lambda k: k.startswith(('adamw', 'grad sumsq'))):7.2f}")
    print(f"  {'embedding, zero':20s} {total(lambda k: k.startswith(('embed', 'zero'))):7.2f}")
    for k in sorted(rows, key=rows.get, reverse=True):
        if " quant " in f" {k} ":
            print(f"  quantizer {k:28s} {rows[k] / layers:7.3f} per layer")


if __name__ == "__main__":
    for p in sys.argv[1:] or sys.exit(__doc__):
        main(p)
