#!/usr/bin/env python3
"""Per-layer summary of the "where the time goes" table that `./train --bench` prints: the profiled
step's kernels grouped (GEMMs by use, attention, FP4 quantizers, memory-bound glue, optimizer, head)
and divided by the profiled depth. The head, embedding and optimizer rows are reported per step.

    python3 scripts/gpu/profile_summary.py docs/results/2026-11-30/bf16_bench_b3d7a88.log
    python3 scripts/gpu/profile_summary.py --bound 12000 docs/results/2026-11-30/bf16_bench_b3d7a88.log

--against BASE.log prints, per layer, each row of the table that differs from BASE's (a fusion's rows:
those it replaces and its own) and the whole profiled step's difference, e.g. for `gpu_check.sh fusion`:

    python3 scripts/gpu/profile_summary.py --against bench_fusion_auto.log bench_fusion_on_residual.log

--bound TOKS adds the best step this profile allows at 32 layers, and what reaching TOKS tok/s
would take. The bound keeps only what no fusion removes: every GEMM at the faster of its measured
time and the table's ceiling (the best of cuBLASLt's top algorithms at that shape, timed alone),
attention at --attention-ms per layer (default 3.6: cuDNN forward + backward of one layer timed
alone, docs/formats.md §3 and gpu_test_attention), AdamW moving --opt-bytes per parameter at the
copy ceiling of the table's memory-bound rows (the rate the bench measured on its GPU; 4.28 TB/s, the
H200's, in older logs and where the table has none), and no memory-bound glue, quantizers, launch gaps or embedding at all.
"""
import argparse
import re
import sys

COPY_TBS = 4.28  # the H200's: logs whose table names no memory-bound ceiling


def gemm_floor(rows, pred):
    """Sum of ms over GEMM rows matching pred, each at max(achieved, ceiling) TFLOP/s."""
    t = 0.0
    for k, (ms, ach, ceil) in rows.items():
        if " gemm " in f" {k} " and pred(k):
            t += ms * ach / max(ach, ceil) if ach and ceil else ms
    return t


def read_table(path, args):
    """(layers, {op: ms per step}, {op: (ms, achieved TFLOP/s, ceiling TFLOP/s)}) of the log's last table."""
    layers, rows, full = None, {}, {}
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.match(r"where the time goes: one step at (\d+) layers", line)
        if m:
            layers, rows = int(m.group(1)), {}  # the last table of the file wins
            continue
        m = re.match(r"^(\S.*?)\s{2,}(\d+\.\d+)\s+(\d+\.\d+)\s+\d+\.\d+%(.*)$", line)
        if m and layers and not line.startswith("total"):
            name, ms = m.group(1).strip(), float(m.group(3))
            rows[name] = ms
            copy = re.search(r"[\d.]+ TB/s\s+([\d.]+) TB/s", m.group(4))
            if copy:
                args.copy_tbs = float(copy.group(1))
            rates = re.findall(r"([\d.]+) TFLOP/s", m.group(4))
            full[name] = (ms, float(rates[0]) if rates else 0.0, float(rates[1]) if len(rates) > 1 else 0.0)
    if not layers:
        sys.exit(f"{path}: no 'where the time goes' table")
    return layers, rows, full


def against(base, path, args, threshold=0.01):
    """The rows of path's table that differ from base's by more than threshold ms per layer, per layer."""
    lb, rb, _ = read_table(base, args)
    lp, rp, _ = read_table(path, args)
    if lb != lp:
        sys.exit(f"{path}: profiled at {lp} layers, {base} at {lb}")
    print(f"{path} against {base} (ms per layer, profiled step at {lp} layers):")
    for k in sorted(set(rb) | set(rp), key=lambda k: -abs(rp.get(k, 0.0) - rb.get(k, 0.0))):
        d = (rp.get(k, 0.0) - rb.get(k, 0.0)) / lp
        if abs(d) > threshold:
            print(f"  {k:44s} {rb.get(k, 0.0) / lp:7.3f} -> {rp.get(k, 0.0) / lp:7.3f}  {d:+7.3f}")
    tb, tp = sum(rb.values()), sum(rp.values())
    print(f"  {'the whole step':44s} {tb / lp:7.3f} -> {tp / lp:7.3f}  {(tp - tb) / lp:+7.3f}")


def main(path, args):
    layers, rows, full = read_table(path, args)

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
    if args.bound:
        bound(full, layers, args)


def bound(full, layers, a):
    tokens, L = a.tokens, 32
    gemm_layer = gemm_floor(full, lambda k: "head" not in k) / layers
    head = gemm_floor(full, lambda k: "head" in k)
    opt = a.params * a.opt_bytes / (a.copy_tbs * 1e12) * 1e3
    step_noopt = L * (gemm_layer + a.attention_ms) + head
    att_flop = sum(ms * ach * 1e9 for k, (ms, ach, _) in full.items() if k.startswith("attention")) / layers
    print(f"bound at {L} layers (GEMMs at max(measured, ceiling), attention {a.attention_ms} ms/layer, "
          f"AdamW {a.opt_bytes:g} B/param at {a.copy_tbs:g} TB/s, zero glue):")
    print(f"  GEMMs {gemm_layer:.2f} ms/layer, head {head:.1f} ms, optimizer {opt:.1f} ms")
    for label, step in (("optimizer every step", step_noopt + opt), ("optimizer amortized", step_noopt)):
        print(f"  {label:22s} {step:7.1f} ms/step  {tokens / step * 1e3:8.0f} tok/s/GPU")
    for label, extra in (("optimizer every step", opt), ("optimizer amortized", 0.0)):
        budget = tokens / a.bound * 1e3 - extra - head - L * gemm_layer
        att = budget / L
        rate = f"{att_flop / (att * 1e-3) / 1e12:.0f} causal TFLOP/s" if att > 0 and att_flop else "impossible"
        print(f"  {a.bound:.0f} tok/s, {label}: attention + glue + quantizers <= {att:.2f} ms/layer "
              f"(attention alone at {rate})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--bound", type=float, default=0, help="target tok/s/GPU for the bound (0: no bound)")
    ap.add_argument("--attention-ms", type=float, default=3.6)
    ap.add_argument("--opt-bytes", type=float, default=30.0, help="AdamW bytes per parameter (fp32 p, m, v, grad + BF16 copy)")
    ap.add_argument("--params", type=float, default=8.03e9)
    ap.add_argument("--tokens", type=float, default=8192, help="tokens per step")
    ap.add_argument("--against", help="a bench log to compare each log's rows with, per layer")
    args = ap.parse_args()
    for p in args.logs:
        args.copy_tbs = COPY_TBS  # each log's own table may name its GPU's
        if args.against:
            against(args.against, p, args)
        else:
            main(p, args)
