#!/usr/bin/env python3
"""harness_tasks.py: lm-evaluation-harness task configs over the engine's local task files, for a
machine without internet (the GPU machine) and for checking the engine's prompts against the harness.

    python3 scripts/eval/harness_tasks.py EVAL_DIR OUT_DIR
    python3 scripts/eval/harness_tasks.py EVAL_DIR OUT_DIR --dump TASK SHOTS N   # the harness's requests

EVAL_DIR holds the engine's files (mmlu.jsonl, hellaswag_val.txt, arc_challenge.jsonl,
winogrande.jsonl, as in ../shared/data/evals). OUT_DIR receives each task's data in the field layout
the harness's own task expects, and task YAMLs that `include` the installed harness's YAML for that
task (its prompt, choices, target, metrics, few-shot sampler) and change only where the data comes
from (`dataset_path: json` with local data_files). Tasks: local_mmlu (the group, with the harness's
four categories and 57 subjects as local_mmlu_<subject>), local_hellaswag, local_arc_challenge,
local_winogrande. Run the harness with `--include_path OUT_DIR --tasks local_mmlu,...`.

Reconstructed fields (the engine's files keep the prompt text, not every original field):
- HellaSwag: hellaswag_val.txt has "activity_label: ctx_a ctx_b" with ctx_b not capitalized; ctx_b is
  the text after the last ". " when the context does not end in ".", else empty (data/evals.h says
  why). The harness then applies its own preprocess and ctx_b.capitalize().
- ARC: "Question: {q}" back to question = q; labels A, B, C, ... for the choices.
- WinoGrande: the file has the two partial contexts and the continuation; sentence = "_ " +
  continuation with option_j = context_j gives the harness's doc_to_choice and doc_to_target exactly.
--dump writes the harness's requests of the first N documents as JSONL (ctx0, or ctx0..ctx{n-1} when
the choices' contexts differ, and cont0..cont{n-1}), what tests/unit/test_evals.c checks the engine's prompts
against: tests/data/harness_prompts.jsonl was written by
    harness_tasks.py ../shared/data/evals /tmp/h --dump mmlu 0 1 --dump mmlu 5 1 --dump hellaswag 0 40 \
      --dump arc_challenge 0 40 --dump winogrande 0 40
with lm-evaluation-harness 0.4.13 (the first document of each MMLU subject, 0- and 5-shot, and the
first 40 of the others zero-shot: their few-shot examples come from training splits these files
do not have).
"""
import argparse
import json
import os
import sys


def harness_tasks_dir():
    import lm_eval

    return os.path.join(os.path.dirname(lm_eval.__file__), "tasks")


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def yaml_str(s):
    return json.dumps(s)  # a JSON string is a valid YAML double-quoted scalar


def read_jsonl(path):
    for line in open(path, encoding="utf-8"):
        if line.strip():
            yield json.loads(line)


def local_task(out, name, include, split, rows, extra=""):
    """Writes rows as OUT/name.jsonl and OUT/local_name.yaml: the harness's own task YAML `include`
    with the data from that file as its `split`."""
    path = os.path.join(out, f"{name}.jsonl")
    write_jsonl(path, rows)
    with open(os.path.join(out, f"local_{name}.yaml"), "w") as f:
        f.write(f"include: {yaml_str(include)}\ntask: local_{name}\ndataset_path: json\ndataset_name: null\n")
        f.write(f"dataset_kwargs:\n  data_files:\n    {split}: {yaml_str(path)}\ntraining_split: null\n{extra}")


MMLU_CATEGORIES = ["stem", "other", "social_sciences", "humanities"]


def mmlu(evals, out, hdir):
    rows = list(read_jsonl(os.path.join(evals, "mmlu.jsonl")))
    subjects = []
    for r in rows:
        if r["subject"] not in subjects:
            subjects.append(r["subject"])
    data = os.path.join(out, "mmlu")
    os.makedirs(data, exist_ok=True)
    template = os.path.join(hdir, "mmlu", "default", "_default_template_yaml")
    import yaml

    cat_tasks = {c: [] for c in MMLU_CATEGORIES}
    for s in subjects:
        for split in ("test", "dev"):
            write_jsonl(os.path.join(data, f"{s}.{split}.jsonl"),
                        [{"question": r["question"], "choices": r["choices"], "answer": r["answer"]}
                         for r in rows if r["subject"] == s and r["split"] == split])
        own = yaml.safe_load(open(os.path.join(hdir, "mmlu", "default", f"mmlu_{s}.yaml")))
        cat = own["tag"].replace("mmlu_", "").replace("_tasks", "")
        cat_tasks[cat].append(f"local_mmlu_{s}")
        with open(os.path.join(out, f"local_mmlu_{s}.yaml"), "w") as f:
            f.write(f"include: {yaml_str(template)}\n")
            f.write(f"task: local_mmlu_{s}\n")
            f.write(f"description: {yaml_str(own['description'])}\n")
            f.write("dataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n")
            f.write(f"    test: {yaml_str(os.path.join(data, s + '.test.jsonl'))}\n")
            f.write(f"    dev: {yaml_str(os.path.join(data, s + '.dev.jsonl'))}\n")
    for c in MMLU_CATEGORIES:
        with open(os.path.join(out, f"local_mmlu_{c}.yaml"), "w") as f:
            f.write(f"group: local_mmlu_{c}\ntask:\n")
            for t in cat_tasks[c]:
                f.write(f"  - {t}\n")
            f.write("aggregate_metric_list:\n  - metric: acc\n    weight_by_size: True\n")
    with open(os.path.join(out, "local_mmlu.yaml"), "w") as f:
        f.write("group: local_mmlu\ntask:\n")
        for c in MMLU_CATEGORIES:
            f.write(f"  - local_mmlu_{c}\n")
        f.write("aggregate_metric_list:\n  - metric: acc\n    weight_by_size: True\n")


def hellaswag(evals, out, hdir):
    lines = open(os.path.join(evals, "hellaswag_val.txt"), encoding="utf-8").read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    rows = []
    for d in range(len(lines) // 6):
        l = [x.rstrip("\r") for x in lines[6 * d: 6 * d + 6]]
        label, _, ctx = l[0].partition(": ")
        if ctx.endswith("."):
            ctx_a, ctx_b = ctx, ""
        else:
            cut = ctx.rfind(". ")
            ctx_a, ctx_b = (ctx[:cut + 1], ctx[cut + 2:]) if cut >= 0 else (ctx, "")
        rows.append({"activity_label": label, "ctx_a": ctx_a, "ctx_b": ctx_b, "endings": l[2:6], "label": l[1]})
    local_task(out, "hellaswag", os.path.join(hdir, "hellaswag", "hellaswag.yaml"), "validation", rows)


def arc(evals, out, hdir):
    rows = []
    for d in read_jsonl(os.path.join(evals, "arc_challenge.jsonl")):
        q = d["query"][len("Question: "):] if d["query"].startswith("Question: ") else d["query"]
        labels = [chr(ord("A") + j) for j in range(len(d["choices"]))]
        rows.append({"question": q, "choices": {"text": d["choices"], "label": labels}, "answerKey": labels[d["gold"]]})
    local_task(out, "arc_challenge", os.path.join(hdir, "arc", "arc_easy.yaml"), "test", rows,
               "validation_split: null\ntag: []\n")


def winogrande(evals, out, hdir):
    rows = [{"sentence": "_ " + d["continuation"], "option1": d["context_options"][0],
             "option2": d["context_options"][1], "answer": str(d["gold"] + 1)}
            for d in read_jsonl(os.path.join(evals, "winogrande.jsonl"))]
    local_task(out, "winogrande", os.path.join(hdir, "winogrande", "default.yaml"), "validation", rows)


def write_tasks(evals, out):
    os.makedirs(out, exist_ok=True)
    hdir = harness_tasks_dir()
    mmlu(evals, out, hdir)
    hellaswag(evals, out, hdir)
    arc(evals, out, hdir)
    winogrande(evals, out, hdir)


def harness_task(out, name):
    """The harness's Task object for local_<name> (a group's subtasks for mmlu, in order)."""
    from lm_eval.tasks import TaskManager, get_task_dict

    tm = TaskManager(include_path=out)
    d = get_task_dict([f"local_{name}"], tm)

    def leaves(x):
        for v in x.values():
            if isinstance(v, dict):
                yield from leaves(v)
            else:
                yield v

    return list(leaves(d))


def dump(out, task, shots, n, f):
    """The harness's requests (context, continuation) of the first n documents of task."""
    for t in harness_task(out, task):
        t.set_fewshot_seed(1234)
        docs = list(t.test_docs() if t.has_test_docs() else t.validation_docs())
        name = t.config.task.replace("local_", "")
        for i, doc in enumerate(docs[:n]):
            ctx = t.fewshot_context(doc, shots)
            reqs = t.construct_requests(doc=doc, ctx=ctx, metadata=(name, i, 0))
            pairs = [list(r.arguments) for r in reqs]
            # flat, for the C test's one-string-field JSON reader: ctx0 (every choice's context when
            # they share it, else ctx0..ctx{n-1}) and cont0..cont{n-1}
            row = {"task": name, "shots": shots, "doc": i, "n": len(pairs)}
            same = len(set(p[0] for p in pairs)) == 1
            for j, (ctx, cont) in enumerate(pairs):
                if j == 0 or not same:
                    row[f"ctx{j}"] = ctx
                row[f"cont{j}"] = cont
            f.write(json.dumps(row) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("evals")
    ap.add_argument("out")
    ap.add_argument("--dump", nargs=3, action="append", metavar=("TASK", "SHOTS", "N"),
                    help="the first N documents (of each subject, for mmlu); may repeat")
    a = ap.parse_args()
    write_tasks(os.path.abspath(a.evals), os.path.abspath(a.out))
    for task, shots, n in a.dump or []:
        dump(os.path.abspath(a.out), task, int(shots), int(n), sys.stdout)


if __name__ == "__main__":
    main()
