#!/usr/bin/env bash
# Run tracking (docs/logging.md): the tiny CPU run with logging.file, logging.tensorboard and a
# validation loss is killed (SIGKILL) inside the save of its step-8 checkpoint, after it logged step
# 8, and resumed from step 4 (so steps 5-8 are logged twice in the JSONL), with a NaN injected at
# step 10 (a skipped step). Oracles: tensorboard's own readers (event_file_loader per file,
# EventAccumulator over the folder) and wandb's (`wandb leet inspect --json` of the offline runs).
#  - the event files: two, one per process, no step in both; every scalar equals the JSONL's number
#    (the later line where a step was logged twice) in float32, and nothing else is there;
#  - scripts/wandb_follow.py with WANDB_MODE=offline, once following the first run while it trains
#    (--pid) and once after the resumed run ended: two offline runs with one run id, every number of
#    the JSONL in W&B at its step and key once, the config from the header's YAML;
#  - a run with downstream tasks: every eval/ metric in the event files as in the JSONL;
#  - the MFU conventions in the log's header.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export PYTHONPATH=.deps/py${PYTHONPATH:+:$PYTHONPATH} WANDB_MODE=offline WANDB_SILENT=true WANDB_DIR=$tmp/wb \
  WANDB_CONFIG_DIR=$tmp/wbconfig WANDB_CACHE_DIR=$tmp/wbcache WANDB_DATA_DIR=$tmp/wbdata
mkdir -p "$tmp/wb"

C=(configs/tiny.yaml --set parallel.threads=2 --set schedule.total_steps=16 --set schedule.warmup_steps=2
   --set logging.interval=1 --set eval.interval=4 --set eval.batches=2 --set checkpoint.dir="$tmp/ck"
   --set checkpoint.interval=4 --set logging.file="$tmp/m.jsonl" --set logging.tensorboard="$tmp/tb")
# The first run, and the follower beside it; the run is killed once its step-8 save is under way
# (the logs of step 8 reached the disk before it began; a synchronous save, so that no later step is logged).
TRAIN_CKPT_SLOW_MS=300 ./train "${C[@]}" --set checkpoint.async=false >"$tmp/a.out" 2>&1 &
pid=$!
python3 scripts/wandb_follow.py "$tmp/m.jsonl" --pid $pid --poll 0.1 >"$tmp/follow_a.out" 2>&1 &
fpid=$!
wait_until "[ -e $tmp/ck/ckpt_00000008.bin.tmp ] || ! kill -0 $pid 2>/dev/null"
kill -KILL $pid 2>/dev/null; wait $pid 2>/dev/null
wait $fpid; frc=$?
check "the first run was killed inside its step-8 save" '[ ! -e "$tmp/ck/ckpt_00000008.bin" ] && [ -e "$tmp/ck/ckpt_00000004.bin" ]'
check "the follower of the first run stopped once the run was gone" '[ $frc -eq 0 ] && grep -q "up to step 8" "$tmp/follow_a.out"'
TRAIN_INJECT_NAN_AT=10 ./train "${C[@]}" --resume >"$tmp/b.out" 2>&1; rc=$?
check "the resumed run completes from step 4" '[ $rc -eq 0 ] && grep -q "at step 4" "$tmp/b.out"'
python3 scripts/wandb_follow.py "$tmp/m.jsonl" --once >"$tmp/follow_b.out" 2>&1; rc=$?
check "the follower after the run's end continues its W&B run" '[ $rc -eq 0 ] && grep -q "up to step 16" "$tmp/follow_b.out"'

# A run with downstream tasks (a random model with the Llama-3 vocabulary: the wiring, not accuracy).
./train configs/tiny.yaml --set model.vocab_size=128256 --set model.max_seq_len=128 --set batch.seq_len=128 \
  --set batch.micro_batch=4 --set batch.global_batch=4 --set data.tokenizer=../shared/data/tokenizer/tokenizer.model \
  --set eval.dir=../shared/data/evals --set eval.limit=4 --set eval.tasks=hellaswag:0,winogrande:0 \
  --set eval.interval=2 --set schedule.total_steps=2 --set schedule.warmup_steps=1 --set parallel.threads=2 --set logging.file="$tmp/e.jsonl" \
  --set logging.tensorboard="$tmp/etb" >"$tmp/e.out" 2>&1; rc=$?
check "the run with downstream tasks completes" '[ $rc -eq 0 ]'

# What the readers find: one line per check, "1 description" or "0 description".
python3 - "$tmp" >"$tmp/checks.txt" 2>"$tmp/checks.err" <<'EOF'
import glob, json, math, os, subprocess, sys
import numpy as np
from tensorboard.backend.event_processing import event_accumulator, event_file_loader

tmp = sys.argv[1]
def say(ok, what):
    print(1 if ok else 0, what)

def jsonl(path):
    """The records, and each number at its (tag, step): KEY, or EVENT/KEY; the later line wins."""
    recs = [json.loads(l) for l in open(path) if l.strip()]
    nums = {}
    for r in recs:
        if "step" not in r:
            continue
        for k, v in r.items():
            if k not in ("step", "event") and isinstance(v, (int, float)) and not isinstance(v, bool):
                nums[(f"{r['event']}/{k}" if "event" in r else k, r["step"])] = v
    return recs, nums

def tb_scalars(folder):
    """{(tag, step): value} over the folder by EventAccumulator, and the (tag, step)s seen twice."""
    acc = event_accumulator.EventAccumulator(folder, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    out, twice = {}, []
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            if (tag, e.step) in out:
                twice.append((tag, e.step))
            out[(tag, e.step)] = e.value
    return out, twice

def compare(tb, nums):
    """The tags missing either way, and the values that are not the JSONL number in float32."""
    missing = sorted(set(nums) ^ set(tb))
    wrong = [(k, tb[k], nums[k]) for k in set(nums) & set(tb) if np.float32(tb[k]) != np.float32(nums[k])]
    return missing, wrong

recs, nums = jsonl(f"{tmp}/m.jsonl")
say(sum(r.get("event") == "header" for r in recs) == 2, "the JSONL has a header record per process")
say(any(r.get("event") == "resumed" and r["step"] == 4 for r in recs), "the JSONL marks the resume at step 4")
say(("skipped/in_a_row", 10) in nums and ("val_loss", 16) in nums and ("loss", 16) in nums,
    "the JSONL has the skipped step 10, the validation losses and the last step")
hdr = [r for r in recs if r.get("event") == "header"][0]
say("mfu = the paper's: 6(N - N_emb) + 12 L H d_head S" in hdr["mfu_conventions"] and "989 TFLOP/s" in
    hdr["mfu_conventions"] and "mfu_own_peak" in hdr["mfu_conventions"], "the header states both MFU conventions")

files = sorted(glob.glob(f"{tmp}/tb/events.out.tfevents.*"))
steps = []
for f in files:
    s = set()
    for e in event_file_loader.EventFileLoader(f).Load():
        if e.HasField("summary"):
            s.add(e.step)
        elif e.file_version != "brain.Event:2":
            s.add(-1)
    steps.append(s)
say(len(files) == 2, f"two event files, one per process ({len(files)})")
if len(files) == 2:
    say(max(steps[0]) == 4 and min(steps[1]) == 5 and max(steps[1]) == 16 and not steps[0] & steps[1],
        f"the first file was cut at the resumed step 4, the second holds 5-16: no step in both "
        f"({sorted(steps[0])}, {sorted(steps[1])})")
tb, twice = tb_scalars(f"{tmp}/tb")
say(not twice, f"no scalar twice at a step ({twice[:3]})")
missing, wrong = compare(tb, nums)
say(not missing and not wrong and len(tb) > 90,
    f"every TensorBoard scalar is the JSONL's number ({len(tb)} scalars; missing either way {missing[:4]}, "
    f"different {wrong[:3]})")

# W&B's offline runs, read back by wandb's own reader
def inspect(path):
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", path], capture_output=True,
                         text=True, timeout=120)
    return [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
runs = sorted(glob.glob(f"{tmp}/wb/wandb/offline-run-*/run-*.wandb"))
say(len(runs) == 2, f"two offline W&B runs, one per follower ({len(runs)})")
state = json.load(open(f"{tmp}/m.jsonl.wandb.json"))
ids, hist, twice, cfg, last = [], {}, [], {}, []
for path in runs:
    top = -1
    for r in inspect(path):
        if r.get("type") == "run":
            ids.append(r["run"]["run_id"])
            cfg = cfg or r["run"].get("config", {}).get("update", {})
        if r.get("type") == "history":
            step = r["history"]["step"]["num"]
            step = int(step)
            top = max(top, step)
            for k, v in r["history"]["item"].items():
                if k.startswith("_"):
                    continue
                if (k, step) in hist:
                    twice.append((k, step))
                hist[(k, step)] = v
    last.append(top)
say(len(set(ids)) == 1 and ids[0] == state["run_id"],
    f"both are the one W&B run kept beside the log ({ids}, {state.get('run_id')})")
say(len(last) == 2 and last[0] == 8 and last[1] == 16, f"the second continues after the first's last step ({last})")
say(not twice, f"no key twice at a step in W&B ({twice[:3]})")
# W&B cannot rewrite a step: it keeps the first values of the steps a resume logs again (docs/logging.md)
first, seen, replay_to = {}, -1, -1
for r in recs:
    if r.get("event") == "resumed":
        replay_to = seen
    if "step" not in r or r["step"] <= replay_to:
        continue
    seen = max(seen, r["step"])
    for k, v in r.items():
        if k not in ("step", "event") and isinstance(v, (int, float)) and not isinstance(v, bool):
            first[(f"{r['event']}/{k}" if "event" in r else k, r["step"])] = v
missing = sorted(set(first) ^ set(hist))
wrong = [(k, hist[k], first[k]) for k in set(first) & set(hist) if float(hist[k]) != float(first[k])]
say(not missing and not wrong and set(first) == set(nums),
    f"W&B holds every number of the JSONL, a repeated step's first ({len(hist)}; missing either way {missing[:4]}, "
    f"different {wrong[:3]})")
say(cfg.get("model", {}).get("dim") == 64 and cfg.get("schedule", {}).get("total_steps") == 16 and
    cfg.get("logging", {}).get("tensorboard") == f"{tmp}/tb" and cfg.get("backend") == "cpu",
    "the W&B config is the run's effective config from the header")

recs, nums = jsonl(f"{tmp}/e.jsonl")
tb, twice = tb_scalars(f"{tmp}/etb")
missing, wrong = compare(tb, nums)
evals = [k for k in tb if k[0].startswith("eval/")]
say(not twice and not missing and not wrong and ("eval/mean", 2) in tb and ("eval/hellaswag/acc_norm", 2) in tb,
    f"every evaluation metric is in TensorBoard as in the JSONL ({len(evals)} eval scalars; missing {missing[:4]}, "
    f"different {wrong[:3]})")
EOF
rc=$?
[ $rc -ne 0 ] && tail -n 5 "$tmp/checks.err"
check "the readers ran (exit $rc)" '[ $rc -eq 0 ] && [ -s "$tmp/checks.txt" ]'
while read -r ok what; do check "$what" "[ $ok = 1 ]"; done <"$tmp/checks.txt"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
