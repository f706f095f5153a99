#!/usr/bin/env python3
"""Where one kernel's instructions and warp stalls go, per SASS opcode, from Nsight Compute's source page:
    ncu --section SourceCounters --section WarpStateStats --page source --print-source sass --csv ... > k.csv
    python3 scripts/gpu/ncu_source_mix.py k.csv [--elements N] [--top K]
(scripts/gpu/ncu_producers.sh writes those files with NCU_SOURCE=1.) Prints each opcode's share of the
executed warp instructions (and, with --elements, thread instructions per element), its share of the stall
samples, the stall reasons over all samples, and the K SASS lines with the most samples. --lines K instead
reads a page printed with --print-source cuda,sass from a -lineinfo build and prints instructions per source
file and the K source lines that execute the most (per element with --elements)."""
import argparse
import collections
import csv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--elements", type=float, default=0, help="elements the kernel processed")
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("--lines", type=int, default=0, help="per source line (a cuda,sass page)")
    a = ap.parse_args()
    lines = open(a.csv, errors="replace").read().split("\n")
    if a.lines:
        return by_line(a, lines)
    heads = [i for i, l in enumerate(lines) if l.startswith('"Address","Source"')]
    if not heads:
        raise SystemExit(f"{a.csv}: no source table (run ncu with --page source --print-source sass --csv)")
    rows = list(csv.reader(lines[heads[0]:]))
    hdr = rows[0]
    rows = [r for r in rows[1:] if len(r) == len(hdr)]
    col = {h: i for i, h in enumerate(hdr)}

    def num(r, h):
        try:
            return float(r[col[h]].replace(",", "") or 0)
        except ValueError:
            return 0.0

    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    n_ins = sum(num(r, "Instructions Executed") for r in rows)
    n_smp = sum(num(r, "Warp Stall Sampling (All Samples)") for r in rows) or 1
    ins, smp, why = collections.Counter(), collections.Counter(), collections.Counter()
    for r in rows:
        f = r[col["Source"]].split()
        if not f:
            continue
        op = f[1] if f[0].startswith("@") and len(f) > 1 else f[0]
        ins[op] += num(r, "Instructions Executed")
        smp[op] += num(r, "Warp Stall Sampling (All Samples)")
        for s in stalls:
            why[s] += num(r, s)
    print(f"{a.csv}: {n_ins:,.0f} warp instructions, {n_smp:,.0f} stall samples")
    print(f"{'opcode':34s} {'instr %':>8s} {'per elem':>9s} {'samples %':>10s}")
    for op, v in ins.most_common(24):
        pe = f"{v * 32 / a.elements:9.2f}" if a.elements else f"{'':9s}"
        print(f"{op:34s} {100 * v / n_ins:8.2f} {pe} {100 * smp[op] / n_smp:10.2f}")
    if a.elements:  # the same instructions by kind, per element
        kinds = collections.Counter()
        for op, v in ins.items():
            base = op.split(".")[0]
            kind = ("FMA pipe (FFMA, FADD, FMUL)" if base in ("FFMA", "FADD", "FMUL")
                    else "bytes and bits (LOP3, PRMT)" if base in ("LOP3", "PRMT")
                    else "IMAD (all forms)" if base == "IMAD"
                    else "max (FMNMX, HMNMX2)" if base in ("FMNMX", "HMNMX2")
                    else "the rest")
            kinds[kind] += v
        print("per element by kind:", ", ".join(f"{k} {v * 32 / a.elements:.2f}" for k, v in kinds.most_common()))
    print("stall reasons (% of samples):", ", ".join(f"{s[6:]} {100 * v / n_smp:.1f}" for s, v in why.most_common(8)))
    for r in sorted(rows, key=lambda r: -num(r, "Warp Stall Sampling (All Samples)"))[: a.top]:
        top = sorted(stalls, key=lambda s: -num(r, s))[:2]
        print(f"  {100 * num(r, 'Warp Stall Sampling (All Samples)') / n_smp:5.1f}%  {r[col['Source']][:64]:64s} "
              + ", ".join(f"{s[6:]} {num(r, s):.0f}" for s in top))


def by_line(a, lines):
    """The cuda,sass page: per file ("File Path" rows) a table whose rows with a "Line No" hold the line's
    totals, followed by its SASS rows."""
    per_line, per_file, text = collections.Counter(), collections.Counter(), {}
    name, hdr = None, None
    for r in csv.reader(lines):
        if not r:
            continue
        if r[0] == "File Path":
            name = r[1].rsplit("/", 1)[-1]
        elif r[0] == "Line No":
            hdr = r
        elif hdr and len(r) == len(hdr) and r[0] and name:
            v = float(r[hdr.index("Instructions Executed")].replace(",", "") or 0)
            per_line[(name, int(r[0]))] += v
            per_file[name] += v
            text[(name, int(r[0]))] = r[1].strip()
    if not per_file:
        raise SystemExit(f"{a.csv}: no per-line table (ncu --print-source cuda,sass on a -lineinfo build)")
    scale = 32 / a.elements if a.elements else 1.0
    unit = "thread instructions per element" if a.elements else "warp instructions"
    print(f"{a.csv}: {sum(per_file.values()) * scale:,.2f} {unit} attributed to source lines")
    for f, v in per_file.most_common():
        print(f"  {f:28s} {v * scale:10.2f}")
    for (f, n), v in per_line.most_common(a.lines):
        print(f"  {f}:{n:<5d} {v * scale:8.2f}  {text[(f, n)][:90]}")


if __name__ == "__main__":
    main()
