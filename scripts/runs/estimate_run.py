#!/usr/bin/env python3
"""Time and GPU-hours of a training run from measured throughput.

    python3 scripts/runs/estimate_run.py BENCH_LOG [--gpus 32] [--tokens 160e9] [--scaling 0.95]
    python3 scripts/runs/estimate_run.py --tok-per-s 12124 [--gpus 32] ...

BENCH_LOG is the output of `./train CONFIG --bench` (its "BENCH ..." lines: tokens/s/GPU with the
optimizer every step, and amortized over gradient accumulation, which is what a real run with
512 sequences per step sees). --scaling is the multi-GPU efficiency to assume (measure it with the
multi-GPU benchmark; the paper's 32-GPU runs need a value from that, not this default).
"""
import argparse
import re
import sys


def parse_bench(path):
    rates = {}
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        sys.exit(f"error: {path}: {e.strerror}")
    for line in lines:
        # "BENCH <backend> <recipe> optimizer ...": logs from before the recipe was printed are BF16
        m = re.match(r"BENCH (\S+) (?:(\S+) )?optimizer (every step|amortized /\d+)\s*:\s*(\d+) tok/s/GPU", line)
        if m:
            rates[(m.group(2) or "bf16", "amortized" if m.group(3).startswith("amortized") else "every step")] = float(m.group(4))
    if not rates:
        sys.exit(f"error: {path}: no 'BENCH <backend> <recipe> optimizer ...' lines (is it ./train --bench output?)")
    return rates


def fmt_hours(h):
    return f"{h:,.0f} h ({h / 24:,.1f} days)" if h >= 48 else f"{h:,.1f} h"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_log", nargs="?")
    ap.add_argument("--tok-per-s", type=float, help="tokens/s/GPU, instead of a bench log")
    ap.add_argument("--gpus", type=int, default=32)
    ap.add_argument("--tokens", type=float, default=160e9, help="training tokens (the paper: 38,147 x 4,194,304)")
    ap.add_argument("--scaling", type=float, default=1.0, help="multi-GPU scaling efficiency, 0..1")
    a = ap.parse_args()
    if not (0 < a.scaling <= 1):
        sys.exit("error: --scaling must be in (0, 1]")
    if a.tok_per_s:
        rates = {("given", "given"): a.tok_per_s}
    elif a.bench_log:
        rates = parse_bench(a.bench_log)
    else:
        sys.exit("error: give a bench log or --tok-per-s")
    print(f"{a.tokens:.4g} tokens on {a.gpus} GPUs at {a.scaling:.0%} scaling efficiency")
    print("| recipe | optimizer | tok/s/GPU | wall time | GPU-hours |\n|---|---|---|---|---|")
    for (recipe, mode), r in sorted(rates.items()):
        total = r * a.gpus * a.scaling
        hours = a.tokens / total / 3600
        print(f"| {recipe} | {mode} | {r:,.0f} | {fmt_hours(hours)} | {hours * a.gpus:,.0f} |")


if __name__ == "__main__":
    main()
