#!/usr/bin/env python3
"""Issue 30's speed targets from one GPU call's logs: the engine's bench beside both PyTorch peers, each
with the optimizer every step and amortized over accumulation.

    python3 scripts/gpu/speed_targets.py LOG...

LOG: any of `./train --bench` logs (their `BENCH <backend> <recipe> ...` lines), `torch_peers.py` logs
(`PEER pytorch-<kind> ...`) or a gpu_check.sh summary holding both. Every figure must come from the same
call (docs/: compare only within one call); a line seen twice with other numbers is refused. Prints one
row per run (tok/s/GPU both ways) and the targets:
  - mxfp4 at least 15,000 tok/s/GPU every step and 17,500 amortized;
  - mxfp4 at least 1.25x the torchao float8 peer every step (amortized beside it);
  - bf16 at least 1.10x compiled PyTorch (pytorch-bf16), both ways.
A target whose runs are missing from the logs is listed as such, not passed.
"""
import re
import sys

LINE = re.compile(r"^(BENCH \S+|PEER) (\S+) optimizer (every step|amortized /\d+)\s*:\s+(\d+) tok/s/GPU")


def read(paths):
    runs = {}  # name -> {"every": tok/s, "amortized": tok/s}
    for path in paths:
        for line in open(path, errors="replace"):
            m = LINE.match(line.strip())
            if not m:
                continue
            name = m.group(2) if m.group(1) == "PEER" else "engine " + m.group(2)
            way = "every" if m.group(3) == "every step" else "amortized"
            v = int(m.group(4))
            if runs.setdefault(name, {}).get(way, v) != v:
                sys.exit(f"{path}: {name} {way}: {v} tok/s, another log says {runs[name][way]}: not one call's figures")
            runs[name][way] = v
    return runs


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    runs = read(sys.argv[1:])
    if not runs:
        sys.exit("no BENCH or PEER lines in " + ", ".join(sys.argv[1:]))
    print("| run | every step tok/s/GPU | amortized tok/s/GPU |\n|---|---|---|")
    cell = lambda r, way: f"{r[way]:,}" if way in r else "-"
    for name, r in runs.items():
        print(f"| {name} | {cell(r, 'every')} | {cell(r, 'amortized')} |")
    mx, bf = runs.get("engine mxfp4", {}), runs.get("engine bf16", {})
    f8, tb = runs.get("pytorch-float8-tensorwise", {}), runs.get("pytorch-bf16", {})
    rows = []

    def target(what, have, want, fmt):
        if have is None:
            rows.append((what, "not in the logs", fmt(want), "MISSING"))
        else:
            rows.append((what, fmt(have), fmt(want), "met" if have >= want else "MISSED"))

    num = lambda v: f"{v:,.0f}"
    ratio = lambda v: f"{v:.3f}x"
    both = lambda a, b, way: a[way] / b[way] if way in a and way in b else None
    target("mxfp4, optimizer every step", mx.get("every"), 15000, num)
    target("mxfp4, amortized", mx.get("amortized"), 17500, num)
    target("mxfp4 / torchao float8 peer, every step", both(mx, f8, "every"), 1.25, ratio)
    for way in ("every", "amortized"):
        target(f"bf16 / compiled PyTorch, {'every step' if way == 'every' else 'amortized'}", both(bf, tb, way), 1.10,
               ratio)
    amort = both(mx, f8, "amortized")
    print("\n| target | measured | wanted | |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if amort is not None:
        print(f"\n(mxfp4 / torchao float8 peer, amortized: {amort:.3f}x)")
    missed = sum(r[3] != "met" for r in rows)
    print(f"\nspeed targets: {len(rows) - missed} met, {missed} not met")


if __name__ == "__main__":
    main()
