#!/usr/bin/env bash
# scripts/runs/replicate.sh end to end on the CPU (BUDGET=smoke: a dim-32 model with the Llama-3
# vocabulary, 4 steps, two runs at a time, one document per downstream task): the shards are made
# from tiny Shakespeare (../shared; else the repo's own docs) by the script's tokenize step, and the
# outputs (table, CSV, JSONL logs, PNG, log tarball) are checked for sane numbers. The CPU backend emulates every recipe's formats in
# fp32, so the FP4 runs' losses differ from BF16's by a small excess (the same tokens, other
# arithmetic). Also: the plot script without matplotlib, and errors caught before any training.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
first_file() { for f in "$@"; do [ -n "$f" ] && [ -e "$f" ] && { echo "$f"; return; }; done; }
tok=$(first_file "${TOKENIZER_MODEL:-}" ../shared/data/tokenizer/tokenizer.model .deps/tokenizer.model)
evals=$(first_file "${EVALS:-}" ../shared/data/evals .deps/evals)
if [ -z "$tok" ]; then
  echo "SKIP: no Llama-3 tokenizer.model (TOKENIZER_MODEL, ../shared/data/tokenizer, .deps): replicate.sh not run"
  echo "0 passed, 0 failed"; exit 0
fi
tasks=mmlu:5,hellaswag:10,arc_challenge:25,winogrande:5
[ -z "$evals" ] && { tasks=""; echo "note: no eval data (../shared/data/evals, .deps/evals): downstream evals not checked"; }
cp ./train "$tmp/train" || { echo "FAIL: no ./train (build first)"; echo "0 passed, 1 failed"; exit 1; }
# The corpus: tiny Shakespeare from ../shared (its scenes as documents) where it is there, so that the
# numbers do not move with this repository's docs; else the repo's own docs and scripts.
shakespeare=$(first_file ../shared/data/corpus/tiny_shakespeare.txt)
python3 - "$tmp/corpus.jsonl" "$shakespeare" README.md docs/*.md scripts/*/*.py <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    if sys.argv[2]:
        docs = [d for d in open(sys.argv[2], encoding="utf-8").read().split("\n\n\n") if d.strip()]
        if len(docs) < 20:  # no scene breaks: blocks of 200 lines
            lines = open(sys.argv[2], encoding="utf-8").read().splitlines(keepends=True)
            docs = ["".join(lines[i:i + 200]) for i in range(0, len(lines), 200)]
    else:
        docs = [open(p, encoding="utf-8").read() for p in sys.argv[3:]]
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")
PY
env_common=(TRAIN="$tmp/train" BUDGET=smoke SHARDS="$tmp/shards" CORPUS="$tmp/corpus.jsonl" TOKENIZER="$tok"
            EVALS="$evals" TASKS="$tasks" CKPT_DIR="$tmp/ck" THREADS=1)

t0=$SECONDS
out=$(env "${env_common[@]}" OUT="$tmp/out" GPUS=2 bash scripts/runs/replicate.sh 2>&1); rc=$?
d=$tmp/out/replicate
check "replicate.sh BUDGET=smoke GPUS=2 exits 0 ($((SECONDS - t0))s)" '[ $rc -eq 0 ]' || printf '%s\n' "$out" | tail -n 30
check "the shards were made with the validation split" '[ -s "$tmp/shards/nv_train_000000.bin" ] && [ -s "$tmp/shards/nv_val_000000.bin" ]'
check "two runs at a time: devices 0 and 1 both used" 'echo "$out" | grep -q "training on device 0" && echo "$out" | grep -q "training on device 1"'
check "the checkpoints are deleted after scoring" '[ -z "$(ls -A "$tmp/ck" 2>/dev/null)" ]'
for r in bf16 mxfp4_h32 mxfp4_noh nvfp4_last; do
  j=$d/$r.jsonl
  check "$r.jsonl: 4 training steps" '[ "$(grep -c "\"loss\"" "$j" 2>/dev/null)" -eq 4 ]'
  check "$r.jsonl: validation at steps 2 and 4" '[ "$(grep -o "\"step\": [0-9]*, \"val_loss\"" "$j" | grep -o "[0-9]*" | tr "\n" " ")" = "2 4 " ]'
  if [ -n "$tasks" ]; then
    check "$r.jsonl: downstream scores at the last step" 'grep -q "\"step\": 4, \"eval/hellaswag/acc\"" "$j" && grep -q "eval/arc_challenge/acc_norm" "$j" && grep -q "\"eval/winogrande/n\": 1" "$j" && grep -q "\"eval/mmlu/n\": 57" "$j" && grep -q "eval/mean" "$j"'
  fi
done
check "table.md: a row per recipe, BF16 first" '[ "$(grep -c "^| \(BF16\|MXFP4\|NVFP4\)[^|]* | [0-9]* |" "$d/table.md")" -eq 4 ] && grep "^| [BMN]" "$d/table.md" | head -n 1 | grep -q "^| BF16 | 4 |"'
if [ -n "$tasks" ]; then
  check "table.md: ranks here / in the paper for the loss, the four tasks and their mean" \
    'grep -q "^| recipe | train loss | mmlu | hellaswag | winogrande | arc_challenge | mean of four |" "$d/table.md" && [ "$(grep -c "^| [A-Z][^|]* | [0-9] / [0-9] |\( [0-9] / [0-9] |\)\{5\}$" "$d/table.md")" -eq 4 ] && grep -q "^| MXFP4 + H32 | [0-9] / 3 | [0-9] / 4 | [0-9] / 1 | [0-9] / 1 | [0-9] / 1 | [0-9] / 1 |$" "$d/table.md"'
fi
# recipe,status,steps,tokens,train_loss,train_excess_pct,val_loss,... ; the CPU emulates the formats:
# every FP4 run's losses differ from BF16's (it was quantized) by a small excess (it saw the same tokens)
sane=$(python3 - "$d/results.csv" "$tasks" "$d"/{bf16,mxfp4_h32,mxfp4_noh,nvfp4_last}.jsonl <<'PY'
import csv, json, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
# each run's logged training losses at full precision, by its label (replicate.sh's LABEL): the CSV
# rounds to 4 decimals, and 4 steps of a dim-32 model can move a quantized run's loss by less than that
files = dict(zip(("BF16", "MXFP4 + row SR + H32", "MXFP4 + row SR (no Hadamard)", "NVFP4"), sys.argv[3:]))
def losses(label):
    path = files["NVFP4" if label.startswith("NVFP4") else label]
    return [json.loads(l)["loss"] for l in open(path) if '"loss"' in l]
logged = [losses(r["recipe"]) for r in rows]
bad = []
if len(rows) != 4: bad.append(f"{len(rows)} rows")
for r in rows:
    if r["status"] != "ok" or r["steps"] != "4" or r["tokens"] != "256": bad.append(f"{r['recipe']}: status/steps/tokens")
    for k in ("train_loss", "val_loss"):
        v = float(r[k])
        if not (math.isfinite(v) and 5 < v < 13): bad.append(f"{r['recipe']}: {k} {v}")  # ~ln(128256) = 11.76
    if float(r["tok_per_s"]) <= 0: bad.append("tok/s")
    if sys.argv[2]:
        for k in ("hellaswag_acc", "hellaswag_acc_norm", "arc_challenge_acc", "arc_challenge_acc_norm", "winogrande_acc"):
            if not 0 <= float(r[k]) <= 1: bad.append(f"{r['recipe']}: {k} {r[k]}")
        if r["hellaswag_n"] != "1" or r["winogrande_acc_norm"] != "": bad.append("n / winogrande acc_norm")
for i, r in enumerate(rows[1:], 1):
    # (the smoke model has 2 blocks, so "last 2 blocks BF16" is all BF16 and must equal it)
    all_bf16 = "last 2 blocks BF16" in r["recipe"]
    if (logged[i] == logged[0]) != all_bf16:
        bad.append(f"{r['recipe']}: losses {logged[i]} vs BF16's {logged[0]}")
    for k in ("train_excess_pct", "val_excess_pct"):
        if not abs(float(r[k])) < 2: bad.append(f"{r['recipe']}: {k} {r[k]}")
print("; ".join(bad) or "ok")
PY
)
check "results.csv: sane numbers, FP4 losses within 2% of BF16's but not equal ($sane)" '[ "$sane" = ok ]'
check "table.md: excess column, orderings and timings" 'grep -q "| +0.00% |" "$d/table.md" && grep -q "^- final train loss: " "$d/table.md" && grep -q "^| nvfp4_last | [0-9]* | [0-9]* | ok |" "$d/table.md"'
check "logs.tar.gz: stdout logs, per-run CSVs and configs" 'tar -tzf "$d/logs.tar.gz" | grep -q "logs/bf16.log" && tar -tzf "$d/logs.tar.gz" | grep -q "logs/nvfp4_last.csv" && tar -tzf "$d/logs.tar.gz" | grep -q "logs/mxfp4_h32.config.yaml"'
check "at most 8 files come back from \$OUT" '[ "$(ls "$d" | wc -l)" -le 8 ]'
if python3 -c "import matplotlib" 2>/dev/null; then
  check "replicate.png is a PNG of some size" '[ "$(head -c 4 "$d/replicate.png" | tail -c 3)" = PNG ] && [ "$(stat -c %s "$d/replicate.png")" -gt 20000 ]'
else
  check "no matplotlib: table.md says that no PNG was written" 'grep -q "matplotlib is not installed" "$d/table.md" && [ ! -e "$d/replicate.png" ]'
fi

# plot_metrics.py without matplotlib: tables written, a clear one-line error, exit status 3
mkdir -p "$tmp/nompl/matplotlib"; echo 'raise ImportError("no matplotlib here")' >"$tmp/nompl/matplotlib/__init__.py"
out=$(PYTHONPATH="$tmp/nompl" python3 scripts/runs/plot_metrics.py "$d/bf16.jsonl" "$d/mxfp4_h32.jsonl" --labels a,b \
      --table "$tmp/t.md" --combined --out "$tmp/p" 2>&1); rc=$?
check "plot_metrics.py without matplotlib: exit 3, says so, writes the table" '[ $rc -eq 3 ] && echo "$out" | grep -q "matplotlib is not installed" && grep -q "^| b | 4 |" "$tmp/t.md" && [ ! -e "$tmp/p.png" ]'

# errors before any training, each naming the problem
out=$(env "${env_common[@]}" OUT="$tmp/o2" RECIPES="bf16 fp8" bash scripts/runs/replicate.sh 2>&1); rc=$?
check "an unknown recipe is refused" '[ $rc -ne 0 ] && echo "$out" | grep -q "unknown recipe .fp8."'
out=$(env "${env_common[@]}" OUT="$tmp/o2" TASKS=hellaswag:10 EVALS="$tmp/nothing" bash scripts/runs/replicate.sh 2>&1); rc=$?
check "missing eval data is refused before training" '[ $rc -ne 0 ] && echo "$out" | grep -q "no folder $tmp/nothing" && ! echo "$out" | grep -q "training on"'
out=$(env "${env_common[@]}" OUT="$tmp/o2" SHARDS="$tmp/none" CORPUS="$tmp/none.jsonl" bash scripts/runs/replicate.sh 2>&1); rc=$?
check "missing shards and corpus are refused" '[ $rc -ne 0 ] && echo "$out" | grep -q "no shards in $tmp/none"'
out=$(env "${env_common[@]}" OUT="$tmp/o2" BUDGET=huge bash scripts/runs/replicate.sh 2>&1); rc=$?
check "an unknown budget is refused" '[ $rc -ne 0 ] && echo "$out" | grep -q "BUDGET=huge: expected default, short or smoke"'
# In parts: the paper's seven other routes into the same OUT; the first four's logs stay and the
# table, CSV and plot cover all eleven, in the paper's row order.
out=$(env "${env_common[@]}" OUT="$tmp/out" GPUS=2 \
  RECIPES="nvfp4_all nvfp4_global nvfp4_cta nvfp4_cta_h16 hybrid_depth hybrid_op_h16p hybrid_op_h32" \
  bash scripts/runs/replicate.sh 2>&1); rc=$?
check "a second part (the seven other routes) exits 0" '[ $rc -eq 0 ]' || printf '%s\n' "$out" | tail -n 20
check "the first part's logs are kept" '[ -s "$d/bf16.jsonl" ] && [ -s "$d/mxfp4_h32.jsonl" ] && [ -s "$d/nvfp4_cta.jsonl" ]'
check "results.csv holds both parts (the 11 routes, BF16 first)" \
  '[ "$(tail -n +2 "$d/results.csv" | wc -l)" -eq 11 ] && sed -n 2p "$d/results.csv" | grep -q "^BF16,"'
check "the depth hybrid ran CTA-local then MXFP4 (blocks 2-2 in the 2-block smoke model)" \
  'tar -xzOf "$d/logs.tar.gz" logs/hybrid_depth.log | grep -q "route fprop=auto dgrad=auto wgrad=auto blocks=mxfp4:2-2"'
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
