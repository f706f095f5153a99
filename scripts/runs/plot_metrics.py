#!/usr/bin/env python3
"""Plot and tabulate training logs: loss curves, validation points and downstream eval scores from
train's JSONL logs.

Each log line is one JSON object with a "step" and any of "loss", "val_loss", "tok_per_s" and eval
metrics named "eval/<task>/<metric>" (e.g. "eval/hellaswag/acc_norm", with "eval/<task>/n" the
number of documents). Lines without a "step", and non-numeric values (e.g. "event"), are skipped.
Several logs (one per run) are overlaid, labelled by file name, or by --labels.

    python3 scripts/runs/plot_metrics.py runs/bf16/log.jsonl runs/mxfp4/log.jsonl --out plots/cmp
    # writes plots/cmp_loss.png and, if the logs have eval metrics, plots/cmp_evals.png

    python3 scripts/runs/plot_metrics.py a.jsonl b.jsonl --labels bf16,mxfp4 --combined --out plots/cmp \\
        --table plots/cmp.md --csv plots/cmp.csv --run-csv-dir plots --last 50 --smooth 20
    # one figure plots/cmp.png (loss curves with validation points, loss excess over the first run
    # (or --baseline), final downstream scores with binomial error bars, throughput), a markdown
    # table and a CSV of the final numbers, and each log as a CSV (step, loss, ..., one column a key)

The tables need only the standard library. Plots need matplotlib: without it the tables (and
CSVs) are still written, a one-line error says that no PNG was written, and the exit status is 3.
"""
import argparse
import csv
import json
import math
import os
import re
import statistics
import sys

CHANCE = {"mmlu": 0.25, "hellaswag": 0.25, "arc_challenge": 0.25, "winogrande": 0.5}  # ARC-C: most have 4 choices


def read_log(path):
    """Returns {key: [(step, value), ...]} for every numeric key except "step" (later lines win
    for a step logged twice, e.g. after a resume)."""
    series = {}
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        sys.exit(f"error: {path}: {e.strerror}")
    with f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"error: {path}:{lineno}: not JSON ({e})")
            if not isinstance(rec, dict) or "step" not in rec:
                continue
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    series.setdefault(k, {})[rec["step"]] = v
    return {k: sorted(d.items()) for k, d in series.items()}


def smooth(values, window):
    """Trailing moving average (window 1 = raw), so noisy train loss stays readable."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def tasks_of(series):
    """{task: [metric, ...]} of the eval/<task>/<metric> keys (without the document count n)."""
    out = {}
    for k in series:
        m = re.fullmatch(r"eval/([^/]+)/([^/]+)", k)
        # the tasks themselves, not MMLU's per-subject and per-category keys (eval/mmlu_<group>/acc)
        if m and m.group(2) != "n" and not m.group(1).startswith("mmlu_"):
            out.setdefault(m.group(1), []).append(m.group(2))
    return {t: sorted(ms) for t, ms in out.items()}


def summarize(s, last_n):
    """The final numbers of one run."""
    r = {}
    loss = s.get("loss", [])
    if loss:
        final = loss[-1][0]
        tail = [v for st, v in loss if st > final - last_n]
        r["steps"] = final
        r["train_loss"] = sum(tail) / len(tail)
    if s.get("tokens"):
        r["tokens"] = s["tokens"][-1][1]
    if s.get("val_loss"):
        r["val_step"], r["val_loss"] = s["val_loss"][-1]
    if s.get("val_loss_eval"):
        r["val_loss_eval"] = s["val_loss_eval"][-1][1]
    tps = [v for _, v in s.get("tok_per_s", [])]
    if tps:
        # the median skips the first steps (autotuning, allocation) and the step after each
        # validation pass (its interval includes the pass)
        r["tok_per_s"] = statistics.median(tps[len(tps) // 10:] or tps)
    for task, metrics in tasks_of(s).items():
        for m in metrics:
            r[f"{task}/{m}"] = s[f"eval/{task}/{m}"][-1][1]
        if s.get(f"eval/{task}/n"):
            r[f"{task}/n"] = int(s[f"eval/{task}/n"][-1][1])
    return r


def excess(x, base):
    return 100.0 * (x - base) / base if x is not None and base else None


def fmt(v, spec):
    return "—" if v is None else format(v, spec)


def write_tables(runs, summaries, base_idx, args):
    base = summaries[base_idx]
    tasks = []
    for _, s in runs:
        for t in tasks_of(s):
            if t not in tasks:
                tasks.append(t)
    order = {"mmlu": 0, "hellaswag": 1, "winogrande": 2, "arc_challenge": 3}
    tasks.sort(key=lambda t: (order.get(t, 9), t))
    has_eval_val = any("val_loss_eval" in r for r in summaries)

    cols = ["recipe", "steps", f"train loss (mean of last {args.last})", "excess", "val loss", "excess"]
    if has_eval_val:
        cols += ["val loss, eval pass", "excess"]
    for t in tasks:
        n = max((r.get(f"{t}/n", 0) for r in summaries), default=0)
        norm = any(f"{t}/acc_norm" in r for r in summaries)
        cols.append(f"{t} acc{' / acc_norm' if norm else ''} (n={n})")
    cols.append("tok/s")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    rows_csv = []
    for i, ((label, _), r) in enumerate(zip(runs, summaries)):
        if not r:
            lines.append(f"| {label} | FAILED |" + " |" * (len(cols) - 2))
            rows_csv.append({"recipe": label, "status": "failed"})
            continue
        is_base = i == base_idx
        ex_t = excess(r.get("train_loss"), base.get("train_loss"))
        ex_v = excess(r.get("val_loss"), base.get("val_loss"))
        ex_e = excess(r.get("val_loss_eval"), base.get("val_loss_eval"))
        cells = [label, fmt(r.get("steps"), "d"), fmt(r.get("train_loss"), ".4f"),
                 "—" if is_base else fmt(ex_t, "+.2f") + ("%" if ex_t is not None else ""),
                 fmt(r.get("val_loss"), ".4f"),
                 "—" if is_base else fmt(ex_v, "+.2f") + ("%" if ex_v is not None else "")]
        if has_eval_val:
            cells += [fmt(r.get("val_loss_eval"), ".4f"),
                      "—" if is_base else fmt(ex_e, "+.2f") + ("%" if ex_e is not None else "")]
        for t in tasks:
            acc, norm = r.get(f"{t}/acc"), r.get(f"{t}/acc_norm")
            cell = fmt(acc, ".3f")
            if any(f"{t}/acc_norm" in q for q in summaries):
                cell += " / " + fmt(norm, ".3f")
            cells.append(cell)
        cells.append(fmt(r.get("tok_per_s"), ",.0f"))
        lines.append("| " + " | ".join(cells) + " |")
        row = {"recipe": label, "status": "ok", "steps": r.get("steps"), "tokens": r.get("tokens"),
               "train_loss": r.get("train_loss"), "train_excess_pct": None if is_base else ex_t,
               "val_loss": r.get("val_loss"), "val_excess_pct": None if is_base else ex_v,
               "val_loss_eval": r.get("val_loss_eval"), "val_eval_excess_pct": None if is_base else ex_e,
               "tok_per_s": r.get("tok_per_s")}
        for t in tasks:
            for m in ("acc", "acc_norm", "n"):
                row[f"{t}_{m}"] = r.get(f"{t}/{m}")
        rows_csv.append(row)
    table = "\n".join(lines) + "\n"
    print(table, end="")
    if args.table:
        _mkdir_for(args.table)
        with open(args.table, "w", encoding="utf-8") as f:
            f.write(table)
        print(f"wrote {args.table}")
    if args.csv:
        _mkdir_for(args.csv)
        keys = []
        for row in rows_csv:
            keys += [k for k in row if k not in keys]
        with open(args.csv, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for row in rows_csv:
                w.writerow({k: ("" if row.get(k) is None else
                                f"{row[k]:.6g}" if isinstance(row[k], float) else row[k]) for k in keys})
        print(f"wrote {args.csv}")


def write_run_csv(path, series):
    """One log as a wide CSV: one row per step, one column per key (empty where not logged)."""
    keys = sorted(series, key=lambda k: (k.startswith("eval/"), k))
    rows = {}
    for k in keys:
        for st, v in series[k]:
            rows.setdefault(st, {})[k] = v
    _mkdir_for(path)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["step"] + keys)
        for st in sorted(rows):
            w.writerow([st] + [("" if k not in rows[st] else f"{rows[st][k]:.9g}") for k in keys])


def _mkdir_for(path):
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)


def loss_ylim(curves, first_val=None):
    """A y-range that shows the end of training (where the recipes differ) and every validation
    point, not the first steps' loss of ~ln(vocab)."""
    lo, hi = math.inf, -math.inf
    for steps, vals in curves:
        if not steps:
            continue
        cut = steps[0] + 0.1 * (steps[-1] - steps[0])
        if first_val is not None:
            cut = min(cut, first_val)
        tail = [v for st, v in zip(steps, vals) if st >= cut] or list(vals)
        lo, hi = min(lo, min(tail)), max(hi, max(tail))
    if not math.isfinite(lo):
        return None
    pad = 0.05 * (hi - lo) if hi > lo else 0.05 * abs(hi) + 1e-3
    return lo - pad, hi + pad


def plot_combined(plt, runs, summaries, base_idx, args):
    fig, axes = plt.subplots(2, 2, figsize=(14, 9.5))
    (ax_loss, ax_ex), (ax_ev, ax_tps) = axes
    base_label, base = runs[base_idx]
    curves = []
    for i, (label, s) in enumerate(runs):
        color = f"C{i % 10}"
        if s.get("loss"):
            steps, vals = zip(*s["loss"])
            sm = smooth(list(vals), args.smooth)
            curves.append((steps, sm))
            ax_loss.plot(steps, sm, color=color, lw=1.2, label=f"{label} train")
        if s.get("val_loss"):
            steps, vals = zip(*s["val_loss"])
            curves.append((steps, vals))
            ax_loss.plot(steps, vals, color=color, ls="--", marker="o", ms=4, label=f"{label} val")
    vsteps = [s["val_loss"][0][0] for _, s in runs if s.get("val_loss")]
    lim = loss_ylim(curves, min(vsteps) if vsteps else None)
    if lim:
        ax_loss.set_ylim(*lim)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (nats/token)")
    sm_txt = f", train smoothed over {args.smooth} steps" if args.smooth > 1 else ""
    ax_loss.set_title(f"training loss and held-out validation loss{sm_txt}")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8, ncol=2)

    # loss excess over the baseline, in % (the paper's measure), as a function of the step
    b_train = dict(base.get("loss", []))
    b_sm = {}
    if b_train:
        st = sorted(b_train)
        b_sm = dict(zip(st, smooth([b_train[k] for k in st], args.smooth)))
    b_val = dict(base.get("val_loss", []))
    for i, (label, s) in enumerate(runs):
        if i == base_idx:
            continue
        color = f"C{i % 10}"
        if s.get("loss") and b_sm:
            steps, vals = zip(*s["loss"])
            sm = dict(zip(steps, smooth(list(vals), args.smooth)))
            xs = [st for st in steps if st in b_sm]
            ax_ex.plot(xs, [100 * (sm[x] - b_sm[x]) / b_sm[x] for x in xs], color=color, lw=1.2, label=f"{label} train")
        if s.get("val_loss") and b_val:
            pts = [(st, v) for st, v in s["val_loss"] if st in b_val]
            if pts:
                xs, vs = zip(*pts)
                ax_ex.plot(xs, [100 * (v - b_val[x]) / b_val[x] for x, v in pts], color=color, ls="--", marker="o",
                           ms=4, label=f"{label} val")
    ax_ex.axhline(0, color="k", lw=0.8)
    n_steps = max((s["loss"][-1][0] for _, s in runs if s.get("loss")), default=0)
    ax_ex.set_xlim(0.1 * n_steps, n_steps * 1.01)  # the first steps' ratio is noise around the init
    ax_ex.set_xlabel("step")
    ax_ex.set_ylabel(f"loss excess over {base_label} (%)")
    ax_ex.set_title(f"loss excess over {base_label} (%)")
    ax_ex.text(0.01, 0.02, "paper, final train loss at 160B tokens: NVFP4 last 4 blocks BF16 +0.87%, "
               "MXFP4 + row SR + H32 +2.11%,\nMXFP4 + row SR without Hadamard +6.53%", transform=ax_ex.transAxes,
               fontsize=7.5, va="bottom", color="0.3")
    ax_ex.grid(alpha=0.3)
    if ax_ex.get_legend_handles_labels()[0]:
        ax_ex.legend(fontsize=8, ncol=2)

    # final downstream scores, with the binomial standard error sqrt(p(1-p)/n)
    groups = []
    for label, s in runs:
        for t, ms in tasks_of(s).items():
            for m in ms:
                if (t, m) not in groups:
                    groups.append((t, m))
    order = {"mmlu": 0, "hellaswag": 1, "winogrande": 2, "arc_challenge": 3}
    groups.sort(key=lambda g: (order.get(g[0], 9), g[0], g[1]))
    if groups:
        width = 0.8 / max(1, len(runs))
        for i, ((label, _), r) in enumerate(zip(runs, summaries)):
            xs, ys, es = [], [], []
            for gi, (t, m) in enumerate(groups):
                v, n = r.get(f"{t}/{m}"), r.get(f"{t}/n")
                if v is None:
                    continue
                xs.append(gi - 0.4 + width * (i + 0.5))
                ys.append(v)
                es.append(math.sqrt(max(v * (1 - v), 1e-9) / n) if n else 0)
            ax_ev.bar(xs, ys, width, yerr=es, capsize=2, color=f"C{i % 10}", label=label)
        for gi, (t, m) in enumerate(groups):
            if t in CHANCE:
                ax_ev.hlines(CHANCE[t], gi - 0.45, gi + 0.45, colors="k", linestyles=":", lw=1)
        ns = {t: max((r.get(f"{t}/n", 0) for r in summaries), default=0) for t, _ in groups}
        ax_ev.set_xticks(range(len(groups)))
        ax_ev.set_xticklabels([f"{t}\n{m} (n={ns[t]})" for t, m in groups], fontsize=8)
        ax_ev.set_ylabel("accuracy")
        ax_ev.set_title("downstream at the last step (dotted: chance; bars: ±1 binomial s.e.)")
        ax_ev.grid(alpha=0.3, axis="y")
        ax_ev.legend(fontsize=8)
    else:
        ax_ev.text(0.5, 0.5, "no eval/<task>/<metric> keys in the logs", ha="center", va="center")
        ax_ev.axis("off")

    tps = [(label, r.get("tok_per_s")) for (label, _), r in zip(runs, summaries)]
    tps = [(l, v) for l, v in tps if v]
    if tps:
        colors = [f"C{i % 10}" for i, ((_, _), r) in enumerate(zip(runs, summaries)) if r.get("tok_per_s")]
        ax_tps.bar(range(len(tps)), [v for _, v in tps], color=colors)
        for i, (_, v) in enumerate(tps):
            ax_tps.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8 if len(tps) <= 6 else 6)
        ax_tps.set_xticks(range(len(tps)))
        # slanted and anchored at their right end, so that 11 routes' names do not run into each other
        ax_tps.set_xticklabels([l for l, _ in tps], fontsize=8 if len(tps) <= 6 else 7, rotation=30, ha="right",
                               rotation_mode="anchor")
        ax_tps.set_ylabel("tokens/s (median over steps)")
        ax_tps.set_title("training throughput")
        ax_tps.grid(alpha=0.3, axis="y")
    else:
        ax_tps.axis("off")
    if args.title:
        fig.suptitle(args.title, fontsize=10)
    fig.tight_layout()
    path = args.out + ".png"
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def plot_separate(plt, runs, args):
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

    metrics = sorted({k for _, s in runs for k in s if k.startswith("eval/") and not k.endswith("/n")})
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", help="JSONL log files")
    ap.add_argument("--labels", help="comma-separated run labels (default: the file names)")
    ap.add_argument("--out", default="metrics", help="output prefix (default: metrics -> metrics_loss.png, ...)")
    ap.add_argument("--smooth", type=int, default=1, help="moving-average window for the train loss")
    ap.add_argument("--combined", action="store_true", help="one figure PREFIX.png: losses, excess, downstream, tok/s")
    ap.add_argument("--no-plot", action="store_true", help="tables and CSVs only")
    ap.add_argument("--table", help="write the final numbers as a markdown table to this file")
    ap.add_argument("--csv", help="write the final numbers as CSV to this file")
    ap.add_argument("--run-csv-dir", help="write each log as a CSV (same name, .csv) into this folder")
    ap.add_argument("--baseline", help="label of the run the excess is measured against (default: the first)")
    ap.add_argument("--last", type=int, default=50, help="final train loss = mean over the last N steps (default 50)")
    ap.add_argument("--title", help="figure title (--combined)")
    ap.add_argument("--allow-missing", action="store_true",
                    help="a missing or empty log is a FAILED row instead of an error")
    args = ap.parse_args()
    if args.smooth < 1 or args.last < 1:
        sys.exit("error: --smooth and --last must be >= 1")

    labels = args.labels.split(",") if args.labels else [os.path.basename(p) for p in args.logs]
    if len(labels) != len(args.logs):
        sys.exit(f"error: --labels has {len(labels)} names for {len(args.logs)} logs")
    runs = []
    for label, p in zip(labels, args.logs):
        if args.allow_missing and (not os.path.exists(p) or os.path.getsize(p) == 0):
            runs.append((label, {}))
        else:
            runs.append((label, read_log(p)))
    summaries = [summarize(s, args.last) if s.get("loss") else {} for _, s in runs]
    base_idx = 0
    if args.baseline:
        if args.baseline not in labels:
            sys.exit(f"error: --baseline {args.baseline}: not one of the labels ({', '.join(labels)})")
        base_idx = labels.index(args.baseline)

    if args.run_csv_dir:
        for p, (_, s) in zip(args.logs, runs):
            if s:
                path = os.path.join(args.run_csv_dir, os.path.splitext(os.path.basename(p))[0] + ".csv")
                write_run_csv(path, s)
                print(f"wrote {path}")
    if args.table or args.csv:
        write_tables(runs, summaries, base_idx, args)
    if args.no_plot:
        return

    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        print("error: matplotlib is not installed (pip install matplotlib): no PNG written"
              + (" (the tables were written)" if args.table or args.csv else ""), file=sys.stderr)
        sys.exit(3)
    _mkdir_for(args.out)
    plotted = [(label, s) for label, s in runs if s]
    if not plotted:
        sys.exit("error: no run has any logged step: nothing to plot")
    if args.combined:
        keep = [i for i, (_, s) in enumerate(runs) if s]
        b = keep.index(base_idx) if base_idx in keep else 0
        plot_combined(plt, plotted, [summaries[i] for i in keep], b, args)
    else:
        plot_separate(plt, plotted, args)


if __name__ == "__main__":
    main()
