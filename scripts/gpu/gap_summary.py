#!/usr/bin/env python3
"""Idle time between GPU operations in an Nsight Systems trace: how much of a step the GPU waits
for the host (launch gaps, synchronizations) rather than computes. Reads the CSV that
`nsys stats --report cuda_gpu_trace --format csv` prints.

    nsys profile -o trace ./train configs/llama3_8b.yaml --bench --layers 4,8
    nsys stats --report cuda_gpu_trace --format csv --output . trace.nsys-rep   # trace_cuda_gpu_trace.csv
    python3 scripts/gpu/gap_summary.py trace_cuda_gpu_trace.csv

Gaps longer than --max-gap-ms (default 5) are the host's own pauses between timed steps (syncs,
timers, printing) and are left out; the rest is time the GPU could have been busy.
"""
import argparse
import csv
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--max-gap-ms", type=float, default=5.0)
    a = ap.parse_args()
    ops = []
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.strip() and not l.startswith(("Processing", "NOTICE", "WARNING"))]
    for row in csv.DictReader(lines):
        try:
            s, d = float(row["Start (ns)"]), float(row["Duration (ns)"])
        except (KeyError, ValueError):
            continue
        ops.append((s, s + d, row.get("Name", "?")))
    if not ops:
        sys.exit(f"{a.csv}: no GPU operations (is it nsys's cuda_gpu_trace CSV?)")
    ops.sort()
    busy = gaps = 0.0
    bins = {"<2us": [0, 0.0], "2-10us": [0, 0.0], "10-100us": [0, 0.0], "0.1-1ms": [0, 0.0], ">1ms": [0, 0.0]}
    worst = []
    end, prev = ops[0][1], ops[0][2]
    busy = ops[0][1] - ops[0][0]
    for s, e, name in ops[1:]:
        g = s - end
        if g > 0 and g < a.max_gap_ms * 1e6:
            gaps += g
            us = g / 1e3
            key = "<2us" if us < 2 else "2-10us" if us < 10 else "10-100us" if us < 100 else "0.1-1ms" if us < 1000 else ">1ms"
            bins[key][0] += 1
            bins[key][1] += g
            worst.append((g, prev, name))
        busy += max(0.0, e - max(s, end))
        if e > end:
            end, prev = e, name
    print(f"{a.csv}: {len(ops)} GPU operations, busy {busy / 1e6:.1f} ms, idle gaps under {a.max_gap_ms} ms "
          f"{gaps / 1e6:.1f} ms ({100 * gaps / (busy + gaps):.2f}% of busy + gaps)")
    for k, (n, t) in bins.items():
        print(f"  gaps {k:9s} {n:7d}  {t / 1e6:8.2f} ms")
    print("longest gaps (us, after -> before):")
    for g, p, n in sorted(worst, reverse=True)[:12]:
        print(f"  {g / 1e3:8.1f}  {p[:60]} -> {n[:60]}")


if __name__ == "__main__":
    main()
