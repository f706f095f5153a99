#!/usr/bin/env python3
"""The GPU's SM clock and power during each line of `gpu_test_fp4_gemm --ablate`.

usage: ablate_clocks.py ABLATE_LOG CLOCKS_TXT
ABLATE_LOG: the ablation's output, each line ending in the time of day it was printed (the end of
its measurement; the line before's time is its start). CLOCKS_TXT: `nvidia-smi --query-gpu=
timestamp,clocks.sm,power.draw,power.limit --format=csv,noheader -lms 100` over the same run
(gpu_check.sh ablate writes both). Prints each line with the mean clock and power of the samples
inside its window (nvidia-smi's power is a running average, so it lags the clock), the energy per
flop that makes (W / TFLOP/s = pJ/flop) and the share of the dense FP8 peak at that clock the rate
is (SMS SMs x 8192 flop per SM per cycle; SMS 132 unless --sms N).
"""
import re
import sys
from datetime import datetime


def seconds(hms):
    h, m, s = hms.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def main():
    args = sys.argv[1:]
    sms = 132
    if len(args) == 4 and args[0] == "--sms":
        sms, args = int(args[1]), args[2:]
    if len(args) != 2:
        sys.exit(__doc__)
    samples = []
    for line in open(args[1]):
        f = [x.strip() for x in line.split(",")]
        if len(f) < 3 or not f[1].endswith("MHz"):
            continue
        t = datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f")
        samples.append((t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6, float(f[1].split()[0]),
                        float(f[2].split()[0])))
    if not samples:
        sys.exit(f"{args[1]}: no clock samples")
    prev = None
    for line in open(args[0]):
        m = re.match(r"(.*\S)\s+(\d\d:\d\d:\d\d\.\d\d\d)$", line.rstrip())
        if not m:
            continue
        end = seconds(m.group(2))
        if prev is not None:
            win = [s for s in samples if prev <= s[0] <= end]
            if win:
                clk = sum(s[1] for s in win) / len(win)
                pw = sum(s[2] for s in win) / len(win)
                tf = float(m.group(1).split()[-1])  # the line's TFLOP/s, its last field before the time
                peak = sms * 8192 * clk * 1e6 / 1e12
                print(f"{m.group(1):<72} {clk:6.0f} MHz {pw:5.0f} W {pw / tf:5.2f} pJ/flop {100 * tf / peak:4.0f}% of peak"
                      f" ({len(win)} samples)")
            else:
                print(f"{m.group(1):<72}   (no sample in its {1000 * (end - prev):.0f} ms)")
        prev = end


if __name__ == "__main__":
    main()
