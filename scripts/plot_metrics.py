#!/usr/bin/env python3
"""Plot training logs: loss curves and downstream eval scores from train's JSONL logs.

Each log line is one JSON object with a "step" and any of "loss", "val_loss" and eval metrics named
"eval/<task>/<metric>" (e.g. "eval/hellaswag/acc_norm"). Several logs (one per run) are overlaid,
labelled by file name, or by --labels.

    python3 scripts/plot_metrics.py runs/bf16/log.jsonl runs/mxfp4/log.jsonl --out plots/cmp
    # writes plots/cmp_loss.png and, if the logs have eval metrics, plots/cmp_evals.png
"""
import argparse
import json
import math
import os
import sys


def read_log(path):
    """Returns {key: [(step, value), ...]} for every numeric key except "step"."""
    series = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"error: {path}:{lineno}: not JSON ({e})")
            if "step" not in rec:
                continue
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    series.setdefault(k, []).append((rec["step"], v))
    return series


def smooth(values, window):
    """Trailing moving average (window 1 = raw), so noisy train loss stays readable."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", help="JSONL log files")
    ap.add_argument("--labels", help="comma-separated run labels (default: the file names)")
    ap.add_argument("--out", default="metrics", help="output prefix (default: metrics -> metrics_loss.png, ...)")
    ap.add_argument("--smooth", type=int, default=1, help="moving-average window for the train loss")
    args = ap.parse_args()

    labels = args.labels.split(",") if args.labels else [os.path.basename(p) for p in args.logs]
    if len(labels) != len(args.logs):
        sys.exit(f"error: --labels has {len(labels)} names for {len(args.logs)} logs")
    runs = [(label, read_log(p)) for label, p in zip(labels, args.logs)]

    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("error: matplotlib is not installed (pip install matplotlib); no plots written")

    if os.path.dirname(args.out):
        os.makedirs(os.path.dirname(args.out), exist_ok=True)

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (label, s) in enumerate(runs):
        color = f"C{i % 10}"
        if "loss" in s:
            steps, vals = zip(*s["loss"])
            ax.plot(steps, smooth(list(vals), args.smooth), color=color, lw=1, label=f"{label} train")
        if "val_loss" in s:
            steps, vals = zip(*s["val_loss"])
            ax.plot(steps, vals, color=color, ls="--", marker="o", ms=3, label=f"{label} val")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out + "_loss.png", dpi=120)
    print(f"wrote {args.out}_loss.png")

    metrics = sorted({k for _, s in runs for k in s if k.startswith("eval/")})
    if not metrics:
        print("no eval/<task>/<metric> keys in the logs: no eval plot")
        return
    cols = min(3, len(metrics))
    rows = (len(metrics) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.5 * rows), squeeze=False)
    for ax, key in zip(axes.flat, metrics):
        for i, (label, s) in enumerate(runs):
            if key in s:
                steps, vals = zip(*s[key])
                ax.plot(steps, vals, color=f"C{i % 10}", marker="o", ms=3, label=label)
        ax.set_title(key[len("eval/"):])
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    axes.flat[0].legend()
    fig.tight_layout()
    fig.savefig(args.out + "_evals.png", dpi=120)
    print(f"wrote {args.out}_evals.png")


if __name__ == "__main__":
    main()
