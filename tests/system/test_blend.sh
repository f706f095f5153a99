#!/usr/bin/env bash
# Weighted blends end to end (CPU backend, docs/data.md "Blends"): two sources tokenized by ./train
# tokenize (this repository's docs as prose, its C sources as code; two synthetic languages when no
# Llama-3 tokenizer.model is found) train with a 0.75/0.25 blend. A run killed (SIGKILL, once it logs
# a step past its checkpoint) and resumed logs the uninterrupted run's losses bit for bit; the JSONL has
# tokens/prose and tokens/code at every step, 3:1 exactly (4 rows a step); the checkpoint's "blend"
# section (read here from docs/checkpoint_format.md's layout) holds the per-source counts; the step-4
# checkpoint continues on 2 ranks with the same per-source tokens at every step; a checkpoint of other
# weights, of one source, or a one-source checkpoint for a blend is refused, naming what changed; bad
# weights are refused naming data.train, in the --set and the YAML list forms.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

first_file() { for f in "$@"; do [ -n "$f" ] && [ -e "$f" ] && { echo "$f"; return; }; done; }
tok=$(first_file "${TOKENIZER_MODEL:-}" ../shared/data/tokenizer/tokenizer.model .deps/tokenizer.model)
if [ -n "$tok" ]; then
  # .txt inputs: each file one document
  mkdir -p "$tmp/in_prose" "$tmp/in_code"
  for f in README.md docs/*.md; do cp "$f" "$tmp/in_prose/$(basename "$f").txt"; done
  for f in data/*.c run/*.c; do cp "$f" "$tmp/in_code/$(basename "$f").txt"; done
  tokenize() { ./train tokenize --tokenizer "$tok" $(printf -- '--input %s ' "$tmp/in_$1"/*.txt) --output "$tmp/$1/$1" \
    --zstd 0 --quiet; }
  tokenize prose && tokenize code; rc=$?
  check "./train tokenize writes the two sources" '[ $rc -eq 0 ] && [ -s "$tmp/prose/prose_train_000000.bin" ] && [ -s "$tmp/code/code_train_000000.bin" ]'
  prose="$tmp/prose/prose_train_*.bin" code="$tmp/code/code_train_*.bin" vocab=128256
else
  echo "note: no Llama-3 tokenizer.model (TOKENIZER_MODEL, ../shared/data/tokenizer, .deps): blending two synthetic sources"
  prose=synthetic code=synthetic vocab=512
fi
blend="prose=0.75:$prose,code=0.25:$code"
# 4 rows a step (micro-batch 2, 2 accumulated) of 32 tokens: 3 prose rows and 1 code row each step
C=(configs/tiny.yaml --set parallel.backend=cpu --set parallel.threads=2 --set model.vocab_size=$vocab
   --set batch.micro_batch=2 --set batch.global_batch=4 --set batch.seq_len=32 --set schedule.total_steps=8
   --set schedule.warmup_steps=2 --set logging.interval=1 --set eval.interval=0)

./train "${C[@]}" --set data.train="$blend" --set logging.file="$tmp/full.jsonl" >"$tmp/full.out" 2>&1; rc=$?
check "the blended run succeeds" '[ $rc -eq 0 ] && [ "$(grep -c "\"loss\"" "$tmp/full.jsonl")" -eq 8 ]'
check "the banner lists each source with its weight and tokens/epoch" \
  'grep -q "^data: a blend of 2 sources" "$tmp/full.out" && grep -Eq "^  prose +weight 0.7500, [0-9]+ tokens/epoch" "$tmp/full.out" && grep -Eq "^  code +weight 0.2500, " "$tmp/full.out"'

# Killed once it logs step 5 (its newest checkpoint is step 4: saves are synchronous here, so the
# step-4 file is complete before step 5 runs), then resumed to the end.
R=("${C[@]}" --set data.train="$blend" --set checkpoint.dir="$tmp/ck" --set checkpoint.interval=2
   --set checkpoint.async=false --set logging.file="$tmp/part.jsonl")
./train "${R[@]}" >"$tmp/a.out" 2>&1 &
pid=$!; wait_until "grep -q '^step *5/' '$tmp/a.out' 2>/dev/null || ! kill -0 $pid 2>/dev/null"
kill -KILL $pid 2>/dev/null; killed=$?; wait $pid 2>/dev/null
check "the first run is killed at step 5" '[ $killed -eq 0 ] && [ -f "$tmp/ck/ckpt_00000004.bin" ] && ! [ -f "$tmp/ck/ckpt_00000008.bin" ]'
cp -r "$tmp/ck" "$tmp/ck4"  # the step-4 checkpoint, for the 2-rank resume and the refusals
./train "${R[@]}" --resume >"$tmp/b.out" 2>&1; rc=$?
check "the resumed run continues from step 4 to the end" '[ $rc -eq 0 ] && grep -q "resumed from .*ckpt_00000004.bin at step 4" "$tmp/b.out"'

# compare KIND A.jsonl B.jsonl: "same" when the steps both logs have agree in KIND: losses (bit for
# bit, all 8 steps), near (losses within 1e-3), tokens (tokens/prose and tokens/code); a resumed
# run appends, so the later line of a step wins.
compare() {
  python3 - "$@" <<'PY'
import json, sys
def read(p):
    d = {}
    for line in open(p):
        j = json.loads(line)
        if "loss" in j and "event" not in j: d[j["step"]] = j
    return d
kind, a, b = sys.argv[1], read(sys.argv[2]), read(sys.argv[3])
steps = sorted(set(a) & set(b))
if kind == "losses": ok = len(steps) == 8 and all(a[s]["loss"] == b[s]["loss"] for s in steps)
elif kind == "near": ok = len(steps) >= 4 and max(abs(a[s]["loss"] - b[s]["loss"]) for s in steps) < 1e-3
else: ok = len(steps) >= 4 and all(a[s][k] == b[s][k] for s in steps for k in ("tokens/prose", "tokens/code"))
print("same" if ok else "differ: " + str([(s, a[s].get("loss"), b[s].get("loss")) for s in steps][:4]))
PY
}
out=$(compare losses "$tmp/full.jsonl" "$tmp/part.jsonl")
check "killed and resumed, the losses equal the uninterrupted run's bit for bit ($out)" '[ "$out" = same ]'
ratio=$(python3 - "$tmp/full.jsonl" <<'PY'
import json, sys
ok = 0
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "loss" not in j or "event" in j: continue
    p, c = j.get("tokens/prose"), j.get("tokens/code")
    ok += p == 96 * j["step"] and c == 32 * j["step"] and p + c == j["tokens"]
print(ok)
PY
)
check "every step logs tokens/prose and tokens/code in ratio 3:1 exactly (96 and 32 a step; $ratio of 8 steps)" '[ "$ratio" = 8 ]'
out=$(compare tokens "$tmp/full.jsonl" "$tmp/part.jsonl")
check "the resumed run's per-source tokens equal the uninterrupted run's ($out)" '[ "$out" = same ]'

# The "blend" section of the step-4 checkpoint, read from the documented layout.
sec=$(python3 - "$tmp/ck4/ckpt_00000004.bin" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack_from("<I", b, 12)[0]
for i in range(n):
    e = 64 + 96 * i
    name = b[e:e + 64].split(b"\0")[0].decode()
    off, size = struct.unpack_from("<QQ", b, e + 64)
    if name != "blend": continue
    version, k = struct.unpack_from("<II", b, off)
    out = ["%d %d %d" % (size, version, k)]
    for s in range(k):
        q = off + 8 + 64 * s
        nm = b[q:q + 32].split(b"\0")[0].decode()
        w, nw, samples, tokens = struct.unpack_from("<dQQQ", b, q + 32)
        out.append("%s %g %d %d" % (nm, w, samples, tokens))
    print(" | ".join(out))
PY
)
check "the checkpoint's blend section holds each source's counts at step 4 ($sec)" \
  '[ "$sec" = "4104 1 2 | prose 0.75 12 384 | code 0.25 4 128" ]'

# The step-4 checkpoint continues on 2 ranks (micro-batch 2 each, no accumulation): the same rows.
LOG_DIR="$tmp/l2" scripts/runs/launch_local.sh 2 "${C[@]}" --set parallel.threads=1 --set batch.global_batch=4 \
  --set data.train="$blend" --set checkpoint.dir="$tmp/ck4" --set logging.file="$tmp/w2.jsonl" --resume >/dev/null 2>&1; rc=$?
check "the step-4 checkpoint resumes on 2 ranks" '[ $rc -eq 0 ] && grep -q "re-sharding the optimizer state from 1 to 2 ranks" "$tmp/l2/rank_0.log"'
out=$(compare tokens "$tmp/full.jsonl" "$tmp/w2.jsonl")
check "... with the uninterrupted run's per-source tokens at every step ($out)" '[ "$out" = same ]'
out=$(compare near "$tmp/full.jsonl" "$tmp/w2.jsonl")
check "... and its losses within 1e-3 (the same rows; sums in another order) ($out)" '[ "$out" = same ]'

# Refusals. The checkpoint copies are untouched: each run stops before its first step.
rm -rf "$tmp/ck4"/rank_* "$tmp/ck4"/manifest_*  # back to the one-process checkpoints
out=$(./train "${C[@]}" --set data.train="prose=0.5:$prose,code=0.5:$code" --set checkpoint.dir="$tmp/ck4" --resume 2>&1); rc=$?
check "a checkpoint of other weights is refused, naming the source and both weights" \
  '[ $rc -ne 0 ] && echo "$out" | grep -q "does not match this run: data.train: source .prose. has weight 0.75 in the checkpoint, 0.5 in this run"'
out=$(./train "${C[@]}" --set data.train="$prose" --set checkpoint.dir="$tmp/ck4" --resume 2>&1); rc=$?
check "a blend's checkpoint is refused by a one-source run" \
  '[ $rc -ne 0 ] && echo "$out" | grep -q "data.train: the checkpoint blends 2 sources (prose 0.75, code 0.25), this run reads one source"'
./train "${C[@]}" --set data.train="$prose" --set checkpoint.dir="$tmp/one" --max-steps 1 >/dev/null 2>&1
out=$(./train "${C[@]}" --set data.train="$blend" --set checkpoint.dir="$tmp/one" --resume 2>&1); rc=$?
check "a one-source checkpoint is refused by a blend" \
  '[ $rc -ne 0 ] && echo "$out" | grep -q "data.train: the checkpoint read one source, this run blends 2 sources (prose 0.75, code 0.25)"'
out=$(./train "${C[@]}" --set data.train="prose=0.75:$prose,code=-0.25:$code" 2>&1); rc=$?
check "a negative weight is refused, naming data.train and the source" \
  '[ $rc -ne 0 ] && echo "$out" | grep -q "data.train: source 2 (.code.): weight -0.25 is not a positive finite number"'
# configs/tiny.yaml with data.train as a YAML list
python3 - "$prose" "$code" >"$tmp/list.yaml" <<'PY'
import sys
block = '  train:\n    - {path: "%s", weight: 3, name: prose}\n    - {path: "%s", weight: 1, name: code}\n' % tuple(sys.argv[1:])
print(open("configs/tiny.yaml").read().replace("  train: synthetic\n", block), end="")
PY
./train "$tmp/list.yaml" "${C[@]:1}" --set logging.file="$tmp/list.jsonl" --max-steps 2 >/dev/null 2>&1
check "the YAML list form (weights 3 and 1) trains to the string form's losses" \
  'diff <(grep -o "\"loss\": [^,]*" "$tmp/list.jsonl") <(grep -o "\"loss\": [^,]*" "$tmp/full.jsonl" | head -n 2)'
printf 'data:\n  train:\n    - {path: "%s", weight: 3}\n    - {path: "%s", weight: 0}\n' "$prose" "$code" >"$tmp/bad.yaml"
out=$(./train "$tmp/bad.yaml" 2>&1); rc=$?
check "a zero weight in the YAML list is refused, naming file, line and entry" \
  '[ $rc -ne 0 ] && echo "$out" | grep -q "bad.yaml:4: data.train\[1\].weight: expected a positive finite number, got .0."'
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
