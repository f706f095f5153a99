#!/usr/bin/env python3
"""compare_harness.py: the engine's downstream scoring against lm-evaluation-harness itself, on one
checkpoint, document by document.

    python3 scripts/eval/compare_harness.py --show WORK/compare.json     # a saved comparison's table
    python3 scripts/eval/compare_harness.py --ckpt CKPT --config CFG [--tasks mmlu:0,hellaswag:0,...]
        [--evals DIR] [--tokenizer tokenizer.model] [--limit N] [--seq T] [--batch B]
        [--device cuda|cpu] [--dtype float32|bfloat16] [--work DIR] [--train ./train]

1. The checkpoint becomes a Hugging Face model (scripts/hf/export_hf.py, fp32 weights) with a fast
   tokenizer built from the same tokenizer.model (transformers' TikTokenConverter: byte-level BPE
   with Llama-3's split pattern and <|begin_of_text|> = 128000 as BOS).
2. The harness runs the tasks over the local files (scripts/eval/harness_tasks.py: the harness's own
   task YAMLs, local data) with the HF model: add_bos_token=True (the engine frames every context
   with BOS, as its models are trained), max_length = T (both keep the last T+1 tokens of a long
   request), log_samples for the per-document log-likelihoods. One harness call per shot count.
3. `./train CFG --eval-only` scores the same tasks from the same checkpoint (checkpoint.init_from,
   eval.samples for its per-document results, batch.seq_len = T).
4. Per task: the documents both scored; how many get the same acc choice (and acc_norm choice,
   where the task has it); the two accuracies; the largest difference of a per-choice
   log-likelihood; and the documents whose choice differs, each with its top-two margin (a choice can
   only flip where the two best scores are closer than the numerical difference of the two
   implementations). Printed as a table and written to WORK/compare.json.

With --limit both take the first N documents of each task (of each MMLU subject: the harness limits
each subtask of its group, and the engine's eval.limit does the same for MMLU); with --mmlu-subjects
the harness runs only those subjects and the documents both scored are compared. Few-shot examples of
HellaSwag, ARC and WinoGrande differ by design (the local files have no training split, so the
harness samples them from the evaluated file with its own seeded sampler, the engine from the same
file with its seed), so with shots those tasks agree only in aggregate: the table's s.e. column, the
binomial standard error of the harness's figure, is the yardstick; MMLU's (the first k dev questions
of the subject) are the harness's own.
"""
import argparse
import math
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts", "hf"))

NORM = {"mmlu": False, "hellaswag": True, "winogrande": False, "arc_challenge": True}


def log(msg):
    print(f"compare_harness: {msg}", flush=True)


def hf_tokenizer(model_path, out):
    """A fast HF tokenizer equal to the engine's tiktoken-format one."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    pat = open(os.path.join(os.path.dirname(model_path), "pat_str.txt")).read().strip() \
        if os.path.exists(os.path.join(os.path.dirname(model_path), "pat_str.txt")) else \
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    special = ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(254)]
    conv = TikTokenConverter(vocab_file=model_path, pattern=pat, additional_special_tokens=special)
    tok = PreTrainedTokenizerFast(tokenizer_object=conv.converted(), bos_token="<|begin_of_text|>",
                                  eos_token="<|end_of_text|>")
    if tok.convert_tokens_to_ids("<|begin_of_text|>") != 128000:
        raise SystemExit("compare_harness: the converted tokenizer does not put <|begin_of_text|> at 128000")
    tok.save_pretrained(out)


def export(ckpt, work, tokenizer):
    import export_hf

    hf = os.path.join(work, "hf")
    if not os.path.exists(os.path.join(hf, "model.safetensors")):
        export_hf.export(ckpt, hf, dtype="fp32", log=log)
        hf_tokenizer(tokenizer, hf)
    return hf


def run_harness(hf, tdir, tasks, shots, limit, seq, batch, device, dtype, work, subjects):
    """{task: {doc_key: [loglik per choice]}} from the harness's logged samples."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    names = []
    for t in tasks:  # MMLU: the group, or only the subjects asked for
        names += [f"local_mmlu_{s}" for s in subjects] if t == "mmlu" and subjects else [f"local_{t}"]
    t0 = time.time()
    res = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={hf},tokenizer={hf},dtype={dtype},add_bos_token=True,max_length={seq}",
        tasks=names, num_fewshot=shots, limit=limit or None, batch_size=batch, device=device,
        log_samples=True, task_manager=TaskManager(include_path=tdir), random_seed=0, numpy_random_seed=0,
        torch_random_seed=0, fewshot_random_seed=1234)
    log(f"harness {shots}-shot {','.join(tasks)}: {time.time() - t0:.0f}s")
    out = {}
    for key, samples in res["samples"].items():
        task = key.replace("local_", "")
        group = "mmlu" if task.startswith("mmlu_") else task
        subject = task[5:] if group == "mmlu" else None
        d = out.setdefault(group, {})
        for s in samples:
            resp = s.get("filtered_resps") or s["resps"]
            ll = [float(r[0][0] if isinstance(r[0], (list, tuple)) else r[0]) for r in resp]
            d[(subject, int(s["doc_id"]))] = ll
    scores = {k.replace("local_", ""): v for k, v in res["results"].items()}
    with open(os.path.join(work, f"harness_{shots}shot.json"), "w") as f:
        json.dump(scores, f, indent=1, default=str)
    return out, scores


def run_engine(args, tasks, shots, work):
    """{task: {doc_key: [loglik per choice]}} from ./train --eval-only's eval.samples."""
    sdir = os.path.join(work, f"engine_{shots}shot")
    spec = ",".join(f"{t}:{shots}" for t in tasks)
    cmd = [args.train, args.config] + [x for kv in args.set for x in ("--set", kv)] + ["--eval-only", "--set", "checkpoint.dir=", "--set", "checkpoint.resume=false",
           "--set", f"checkpoint.init_from={args.ckpt}", "--set", "eval.interval=0", "--set", f"eval.tasks={spec}",
           "--set", f"eval.dir={args.evals}", "--set", f"eval.limit={args.engine_limit}",
           "--set", f"eval.samples={sdir}", "--set", f"data.tokenizer={args.tokenizer}", "--set", "data.val=",
           "--set", f"batch.seq_len={args.seq}", "--set", f"batch.micro_batch={args.engine_batch}",
           "--set", f"batch.global_batch={args.engine_batch}", "--set", "precision.recipe=bf16"]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    open(os.path.join(work, f"engine_{shots}shot.log"), "w").write(r.stdout + r.stderr)
    if r.returncode:
        raise SystemExit(f"compare_harness: ./train --eval-only failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    log(f"engine {shots}-shot {spec}: {time.time() - t0:.0f}s")
    out = {}
    for t in tasks:
        d = out.setdefault(t, {})
        seen = {}
        for line in open(os.path.join(sdir, f"{t}.jsonl")):
            s = json.loads(line)
            subject = s.get("subject")
            i = seen.get(subject, 0)  # MMLU: the document's index within its subject
            seen[subject] = i + 1
            d[(subject, i) if subject else (None, s["doc"])] = (s["logp"], s["gold"])
    return out


def choice_lengths(evals, task):
    """len(choice) per document, for acc_norm (HellaSwag, ARC), in the engine's document order."""

    from harness_tasks import read_jsonl

    out = []
    if task == "arc_challenge":
        out = [[len(c) for c in d["choices"]] for d in read_jsonl(os.path.join(evals, "arc_challenge.jsonl"))]
    elif task == "hellaswag":
        from lm_eval.tasks.hellaswag.utils import preprocess

        lines = open(os.path.join(evals, "hellaswag_val.txt"), encoding="utf-8").read().split("\n")
        for d in range(len(lines) // 6):
            out.append([len(preprocess(e.rstrip("\r"))) for e in lines[6 * d + 2: 6 * d + 6]])
    return out


def argmax(v):
    return max(range(len(v)), key=lambda j: (v[j], -j))  # the first maximum, as np.argmax


def compare(task, shots, ours, theirs, lengths):
    keys = sorted(set(ours) & set(theirs), key=lambda k: (k[0] or "", k[1]))
    same = same_norm = right_o = right_t = right_on = right_tn = 0
    worst = 0.0
    flips = []
    for k in keys:
        lo, gold = ours[k]
        lt = theirs[k]
        worst = max(worst, max(abs(a - b) for a, b in zip(lo, lt)))
        po, pt = argmax(lo), argmax(lt)
        same += po == pt
        right_o += po == gold
        right_t += pt == gold
        if po != pt:
            top = sorted(lt, reverse=True)
            flips.append({"doc": list(k), "ours": po, "harness": pt, "harness_margin": top[0] - top[1]})
        if NORM[task] and lengths:
            n = lengths[k[1]]
            qo, qt = argmax([a / b for a, b in zip(lo, n)]), argmax([a / b for a, b in zip(lt, n)])
            same_norm += qo == qt
            right_on += qo == gold
            right_tn += qt == gold
    n = len(keys)
    row = {"task": task, "shots": shots, "docs": n, "same_choice": same, "acc_engine": right_o / n if n else 0,
           "acc_harness": right_t / n if n else 0, "max_abs_dloglik": worst, "flips": flips[:20]}
    if NORM[task]:
        row.update(same_choice_norm=same_norm, acc_norm_engine=right_on / n if n else 0,
                   acc_norm_harness=right_tn / n if n else 0)
    return row


def print_table(rows):
    """The comparison table, one line per (task, shots), then the totals over them (documents, same acc
    choice) and the largest margin of a document whose choice differs."""
    print(f"\n{'task':<14} {'shots':>5} {'docs':>6} {'same acc choice':>16} {'acc engine':>10} {'acc harness':>11} "
          f"{'same norm choice':>17} {'norm engine':>11} {'norm harness':>12} {'max |dloglik|':>13} {'s.e.':>6}")
    for r in rows:
        norm = (f"{r['same_choice_norm']:>17} {r['acc_norm_engine']:>11.4f} {r['acc_norm_harness']:>12.4f}"
                if "same_choice_norm" in r else f"{'-':>17} {'-':>11} {'-':>12}")
        # the binomial standard error of the harness's figure (acc_norm where there is one): the yardstick
        # for engine-vs-harness gaps when the few-shot examples differ by design
        p = r.get("acc_norm_harness", r["acc_harness"])
        se = math.sqrt(p * (1 - p) / r["docs"]) if r["docs"] else 0.0
        print(f"{r['task']:<14} {r['shots']:>5} {r['docs']:>6} {r['same_choice']:>16} {r['acc_engine']:>10.4f} "
              f"{r['acc_harness']:>11.4f} {norm} {r['max_abs_dloglik']:>13.2e} {se:>6.3f}")
        for fl in r["flips"][:3]:
            print(f"    differs: doc {fl['doc']}: engine {fl['ours']}, harness {fl['harness']} "
                  f"(harness's top-two margin {fl['harness_margin']:.2e})")
    margins = [fl["harness_margin"] for r in rows for fl in r["flips"]]
    print(f"{'all':<14} {'':>5} {sum(r['docs'] for r in rows):>6} {sum(r['same_choice'] for r in rows):>16}"
          f"   (largest top-two margin of a differing document: {max(margins) if margins else 0:.2e})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--show", metavar="COMPARE_JSON", help="print the table of a saved compare.json and exit")
    ap.add_argument("--ckpt")
    ap.add_argument("--config", help="the config the checkpoint was trained with")
    ap.add_argument("--tasks", default="mmlu:0,hellaswag:0,winogrande:0,arc_challenge:0",
                    help="task:shots list; e.g. mmlu:5,hellaswag:10,winogrande:5,arc_challenge:25 for the paper's")
    ap.add_argument("--evals", default=os.path.join(ROOT, "..", "shared", "data", "evals"))
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "..", "shared", "data", "tokenizer", "tokenizer.model"))
    ap.add_argument("--limit", type=int, default=0, help="documents per task (per subject for the harness's MMLU)")
    ap.add_argument("--mmlu-subjects", default="", help="comma-separated: run the harness on these subjects only")
    ap.add_argument("--seq", type=int, default=2048, help="T: tokens per row, both sides (<= model.max_seq_len)")
    ap.add_argument("--batch", type=int, default=32, help="the harness's batch size")
    ap.add_argument("--engine-batch", type=int, default=16, help="the engine's micro-batch for the eval")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--work", default="out/compare_harness")
    ap.add_argument("--train", default=os.path.join(ROOT, "train"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="more config overrides for ./train (the checkpoint's model keys, say); may repeat")
    args = ap.parse_args()
    if args.show:
        print_table(json.load(open(args.show)))
        return
    if not args.ckpt or not args.config:
        ap.error("--ckpt and --config are required (or --show COMPARE_JSON)")
    args.evals, args.tokenizer = os.path.abspath(args.evals), os.path.abspath(args.tokenizer)
    args.ckpt = os.path.abspath(args.ckpt)
    args.engine_limit = args.limit  # the same documents: MMLU's limit is per subject on both sides
    os.makedirs(args.work, exist_ok=True)
    import harness_tasks

    tdir = os.path.join(os.path.abspath(args.work), "tasks")
    harness_tasks.write_tasks(args.evals, tdir)
    hf = export(args.ckpt, os.path.abspath(args.work), args.tokenizer)
    by_shots = {}
    for item in args.tasks.split(","):
        t, _, k = item.partition(":")
        if t not in NORM:
            raise SystemExit(f"compare_harness: unknown task {t} (mmlu, hellaswag, winogrande, arc_challenge)")
        by_shots.setdefault(int(k or 0), []).append(t)
    rows = []
    for shots, tasks in sorted(by_shots.items()):
        theirs, _ = run_harness(hf, tdir, tasks, shots, args.limit, args.seq, args.batch, args.device, args.dtype,
                                os.path.abspath(args.work), [s for s in args.mmlu_subjects.split(",") if s])
        ours = run_engine(args, tasks, shots, os.path.abspath(args.work))
        for t in tasks:
            rows.append(compare(t, shots, ours.get(t, {}), theirs.get(t, {}), choice_lengths(args.evals, t)))
        # after every shot count, so that a run stopped by its time limit keeps what it compared
        json.dump(rows, open(os.path.join(args.work, "compare.json"), "w"), indent=1)
    print_table(rows)


if __name__ == "__main__":
    main()
