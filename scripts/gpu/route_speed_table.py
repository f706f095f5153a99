#!/usr/bin/env python3
"""The speed table of docs/replication.md from `gpu_check.sh benchroutes` logs.

    python3 scripts/gpu/route_speed_table.py [--gpu NAME] docs/results/DATE/bench_route_*_COMMIT.log

Each log is `./train configs/paper/ROUTE.yaml --bench ...`; its route is the name after bench_route_
(the commit suffix removed). Prints, in the paper's row order, each route's label (the config's first
line), the GPU's (--gpu, default H200: the logs do not name it) tokens/s/GPU and BF16-equivalent MFU with the optimizer every step and amortized over
512 sequences, the paper's GB200 tokens/s/GPU (the config's header comment), and the ratios amortized /
GB200 and amortized / the BF16 route's amortized figure (when its log is among the inputs). A route
whose bench did not finish gets a row that says so (and a line on stderr), the others theirs.
"""
import os
import re
import sys

ORDER = ["bf16", "nvfp4_all", "nvfp4_last4_bf16", "nvfp4_global", "mxfp4_rowsr_noh", "nvfp4_cta", "nvfp4_cta_h16",
         "hybrid_depth_27_5", "hybrid_operand_h16_plain", "hybrid_operand_h32", "mxfp4_rowsr_h32"]
GPU = "H200"  # the logs do not name their GPU: --gpu NAME (gpu_check.sh passes nvidia-smi's)
CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "paper")


def bench(path):
    """[(tok/s, MFU %) every step, amortized], or None (said on stderr) when the bench did not finish."""
    text = open(path).read()
    out = []
    for what in ("optimizer every step", r"optimizer amortized /\d+"):
        m = re.search(what + r"\s*:\s+(\d+) tok/s/GPU\s+MFU\s+([\d.]+)%", text)
        if not m:
            print(f"{path}: no BENCH line for '{what}' (did the bench finish?): its row says so", file=sys.stderr)
            return None
        out.append((int(m.group(1)), m.group(2)))
    return out


def paper(route):
    head = open(os.path.join(CONFIGS, route + ".yaml")).read(2000)
    label = re.search(r'route "([^"]+)"', head).group(1)
    gb200 = int(re.search(r"GB200 table and endpoint table: ([\d,]+)", head).group(1).replace(",", ""))
    return label, gb200


def main():
    global GPU
    args = sys.argv[1:]
    if len(args) >= 2 and args[0] == "--gpu":
        GPU, args = args[1], args[2:]
    if not args:
        sys.exit(__doc__)
    rows = {}
    for path in args:
        m = re.match(r"bench_route_(.+?)(?:_[0-9a-f]{7})?\.log$", os.path.basename(path))
        if not m or m.group(1) not in ORDER:
            sys.exit(f"{path}: not a bench_route_ROUTE[_commit].log of a configs/paper route")
        rows[m.group(1)] = bench(path)
    bf16 = (rows.get("bf16") or [None, (None, None)])[1][0]
    gpu = GPU
    print(f"| route | {gpu}, optimizer every step | {gpu}, amortized over 512 sequences | GB200 (paper) "
          f"| {gpu} amortized / GB200 | {gpu} amortized / BF16 |")
    print("|---|---|---|---|---|---|")
    for route in ORDER:
        if route not in rows:
            continue
        label, gb200 = paper(route)
        if rows[route] is None:
            print(f"| {label} | no result | no result | {gb200:,} | - | - |")
            continue
        (e, em), (a, am) = rows[route]
        print(f"| {label} | {e:,} ({em}%) | {a:,} ({am}%) | {gb200:,} | {a / gb200:.2f} | "
              + (f"{a / bf16:.2f} |" if bf16 else "- |"))


if __name__ == "__main__":
    main()
