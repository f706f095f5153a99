#!/usr/bin/env bash
# End-to-end checks of ./train (CPU backend): a run stopped after N steps and resumed gives
# bit-identical losses to an uninterrupted run; SIGTERM saves a checkpoint; bad CLI input and a
# mismatched checkpoint are refused with clear errors.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
common=(--set schedule.total_steps=12 --set schedule.warmup_steps=3 --set parallel.threads=2 --set logging.interval=1)

./train configs/tiny.yaml "${common[@]}" --set logging.file="$tmp/full.jsonl" >"$tmp/full.out" 2>&1; rc=$?
check "uninterrupted run succeeds" '[ $rc -eq 0 ] && [ -s "$tmp/full.jsonl" ]'
./train configs/tiny.yaml "${common[@]}" --set checkpoint.dir="$tmp/ck" --set checkpoint.interval=3 \
  --set logging.file="$tmp/part.jsonl" --max-steps 7 >"$tmp/a.out" 2>&1
check "first half saves a checkpoint at step 7" '[ -f "$tmp/ck/ckpt_00000007.bin" ]'
./train configs/tiny.yaml "${common[@]}" --set checkpoint.dir="$tmp/ck" --set checkpoint.interval=3 \
  --set logging.file="$tmp/part.jsonl" --resume >"$tmp/b.out" 2>&1
check "resume reports step 7" 'grep -q "at step 7" "$tmp/b.out"'
losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$1"; }
check "12 losses logged in each run" '[ "$(losses "$tmp/full.jsonl" | wc -l)" -eq 12 ] && [ "$(losses "$tmp/part.jsonl" | wc -l)" -eq 12 ]'
check "resumed losses are bit-identical to the uninterrupted run" 'diff <(losses "$tmp/full.jsonl") <(losses "$tmp/part.jsonl")'
check "keep-last-3 pruning leaves 3 checkpoints" '[ "$(ls "$tmp/ck"/ckpt_*.bin | wc -l)" -eq 3 ]'
check "a training run stages its saves in host memory" 'grep -q "^checkpoint staging: " "$tmp/b.out"'
out=$(./train configs/tiny.yaml "${common[@]}" --set checkpoint.dir="$tmp/ck" --resume --eval-only 2>&1); rc=$?
check "--eval-only resumes the last checkpoint and stages nothing (it never saves)" \
  '[ $rc -eq 0 ] && echo "$out" | grep -q "at step 12" && ! echo "$out" | grep -q "checkpoint staging"'

cp -r "$tmp/ck" "$tmp/ckmb"
out=$(./train configs/tiny.yaml "${common[@]}" --set schedule.total_steps=14 --set checkpoint.dir="$tmp/ckmb" \
  --set batch.micro_batch=4 --resume 2>&1); rc=$?
check "a resume may change the micro-batch at the same global batch, and says what that changes" \
  '[ $rc -eq 0 ] && echo "$out" | grep -q "batch.micro_batch 8 -> 4 at global batch 16" && [ -f "$tmp/ckmb/ckpt_00000014.bin" ]'
out=$(./train configs/tiny.yaml "${common[@]}" --set checkpoint.dir="$tmp/ckmb" --set batch.micro_batch=4 \
  --set batch.global_batch=8 --resume 2>&1)
check "... not the global batch" 'echo "$out" | grep -q "batch.global_batch: checkpoint has 16, this run has 8"'
out=$(./train configs/tiny.yaml --set checkpoint.dir="$tmp/ck" --set model.dim=128 --resume 2>&1)
check "a checkpoint of another model is refused, naming the field" 'echo "$out" | grep -q "model.dim: checkpoint has 64, this run has 128"'
out=$(./train configs/tiny.yaml --set optim.lr=fast 2>&1); rc=$?
check "bad --set value names the key" '[ $rc -ne 0 ] && echo "$out" | grep -q "optim.lr"'
out=$(./train configs/tiny.yaml --bogus 2>&1)
check "unknown flag is refused" 'echo "$out" | grep -q "unknown or incomplete option"'
printf 'model:\n  preset: tiny\n  n_heads: 5\n' >"$tmp/bad.yaml"
out=$(./train "$tmp/bad.yaml" 2>&1)
check "inconsistent heads are refused naming file and key" 'echo "$out" | grep -q "bad.yaml" && echo "$out" | grep -q "n_heads"'

# SIGTERM: the run saves a checkpoint at the next step boundary and exits 0.
./train configs/tiny.yaml --set schedule.total_steps=100000 --set parallel.threads=2 --set checkpoint.dir="$tmp/sig" \
  --set logging.interval=1 >"$tmp/sig.out" 2>&1 &
pid=$!; wait_for "$tmp/sig.out" '^step *2/'; kill -TERM $pid; wait $pid; rc=$?
check "SIGTERM exits cleanly" '[ $rc -eq 0 ]'
check "SIGTERM leaves a checkpoint" 'ls "$tmp/sig"/ckpt_*.bin >/dev/null 2>&1'
out=$(./train configs/llama3_8b.yaml --dry-run 2>&1)
check "llama3_8b has 8,030,261,248 parameters" 'echo "$out" | grep -q "8030261248 parameters (525336576 embedding)"'
check "llama3_8b costs 57.91 GFLOP/token at seq 8192" 'echo "$out" | grep -q "57.91 GFLOP/token at seq 8192"'
# --bench of a route that mixes formats by depth (the paper's 27/5 hybrid, scaled to 8 tiny blocks):
# each kind of block is timed alone at both depths (a 2-layer model cannot hold blocks 6-8)
out=$(./train configs/paper/hybrid_depth_27_5.yaml --bench --layers 1,2 --bench-steps 1 --set parallel.backend=cpu \
  --set model.preset=tiny --set model.n_layers=8 --set batch.seq_len=32 --set batch.micro_batch=1 \
  --set precision.blocks=mxfp4:6-8 2>&1); rc=$?
check "--bench of a depth hybrid times each kind of block and weights it by its blocks" \
  '[ $rc -eq 0 ] && echo "$out" | grep -q "mixes formats by depth: 5 blocks nvfp4_cta, 3 blocks mxfp4 of 8" &&
   [ "$(echo "$out" | grep -c "^| \(nvfp4_cta\|mxfp4\) | [12] |")" -eq 4 ] && echo "$out" | grep -q "^BENCH cpu nvfp4_cta optimizer every step"'
# with the FP8 embedding of the MXFP4 blocks (Hopper's choice), the CTA-local blocks alone take the reference GEMM
out=$(./train configs/paper/hybrid_depth_27_5.yaml --bench --layers 1,2 --bench-steps 1 --set parallel.backend=cpu \
  --set model.preset=tiny --set model.n_layers=8 --set batch.seq_len=32 --set batch.micro_batch=1 \
  --set precision.blocks=mxfp4:6-8 --set precision.fp4_gemm=fp8 2>&1); rc=$?
check "--bench of a depth hybrid with fp4_gemm fp8 times its CTA-local blocks alone" \
  '[ $rc -eq 0 ] && echo "$out" | grep -q "^BENCH cpu nvfp4_cta optimizer every step"'
# a BF16 end block alone drops the route's contraction overrides; an NVFP4 kind alone drops fp8_cutlass
for extra in "precision.dgrad=nvfp4_cta precision.bf16_last_blocks=1" "precision.blocks=nvfp4:2-2 precision.hadamard=none precision.fp4_gemm=fp8_cutlass"; do
  sets=(); for kv in $extra; do sets+=(--set "$kv"); done
  out=$(./train configs/tiny.yaml --bench --layers 1,2 --bench-steps 1 --set parallel.backend=cpu --set precision.recipe=mxfp4 "${sets[@]}" 2>&1); rc=$?
  check "--bench of mxfp4 with $extra times each kind alone" \
    '[ $rc -eq 0 ] && echo "$out" | grep -q "mixes formats by depth" && echo "$out" | grep -q "^BENCH cpu mxfp4 optimizer every step"'
done
# Downstream tasks through ./train (a random model with the Llama-3 vocabulary: the wiring, not accuracy).
ev=(configs/tiny.yaml --set model.vocab_size=128256 --set model.max_seq_len=128 --set batch.seq_len=128
    --set batch.micro_batch=4 --set batch.global_batch=4 --set data.tokenizer=../shared/data/tokenizer/tokenizer.model
    --set eval.dir=../shared/data/evals --set eval.limit=4 --set logging.file="$tmp/eval.jsonl")
out=$(./train "${ev[@]}" --set eval.tasks=hellaswag:0,arc_challenge:1,winogrande:0 --eval-only 2>&1)
check "--eval-only scores the three tasks" 'echo "$out" | grep -q "hellaswag 0-shot: acc .*acc_norm" && echo "$out" | grep -q "arc_challenge 1-shot" && echo "$out" | grep -q "winogrande 0-shot: acc"'
check "eval results are logged beside the loss" 'grep -q "\"eval/hellaswag/acc_norm\"" "$tmp/eval.jsonl" && grep -q "\"eval/winogrande/acc\"" "$tmp/eval.jsonl"'
out=$(./train "${ev[@]}" --set eval.tasks=mmlu_pro:5 --eval-only 2>&1)
check "an unknown task is refused naming eval.tasks" 'echo "$out" | grep -q "eval.tasks: unknown task .mmlu_pro."'
out=$(./train "${ev[@]}" --set eval.tasks=paper --set eval.samples="$tmp/samples" --eval-only 2>&1)
check "eval.tasks paper scores the paper's four tasks with its shots" \
  'echo "$out" | grep -q "mmlu 5-shot: acc" && echo "$out" | grep -q "hellaswag 10-shot" && echo "$out" | grep -q "winogrande 5-shot" && echo "$out" | grep -q "arc_challenge 25-shot"'
check "... and prints them as one table with their mean" \
  'echo "$out" | grep -q "^mmlu  *5 acc " && echo "$out" | grep -q "^arc_challenge  *25 acc_norm" && echo "$out" | grep -q "^mean  *0\.[0-9]*$"'
check "MMLU's categories and subjects are logged" 'grep -q "\"eval/mmlu_stem/acc\"" "$tmp/eval.jsonl" && grep -q "\"eval/mmlu_abstract_algebra/acc\"" "$tmp/eval.jsonl"'
check "eval.samples holds each task's documents" \
  '[ "$(wc -l <"$tmp/samples/mmlu.jsonl")" -eq 228 ] && grep -q "\"subject\": \"abstract_algebra\", \"gold\": 1, \"pred\": [0-3], \"logp\": \[" "$tmp/samples/mmlu.jsonl" && grep -q "pred_norm" "$tmp/samples/hellaswag.jsonl"'
out=$(./train configs/tiny.yaml --set eval.tasks=winogrande:5 2>&1)
check "eval.tasks without data.tokenizer is refused" 'echo "$out" | grep -q "eval.tasks: needs data.tokenizer"'
for f in configs/paper/*.yaml; do
  out=$(./train "$f" --dry-run 2>&1)
  check "$f loads: the paper's 8B at 57.91 GFLOP/token" 'echo "$out" | grep -q "8030261248 parameters.*57.91 GFLOP/token"'
  check "$f names its row of the paper's tables and prints its contract" \
    'head -n 2 "$f" | grep -q "route \"" && echo "$out" | grep -q "^route [a-z0-9_]*: blocks 1-"'
  check "$f: the paper's settings (decay on every parameter, selective recompute, seed 42)" \
    'grep -q "decay_norms: true" "$f" && grep -q "recompute: selective_\(8\|32\)" "$f" && grep -q "^seed: 42" "$f"'
done
check "configs/paper holds the paper's 11 routes" '[ "$(ls configs/paper/*.yaml | wc -l)" -eq 11 ]'
out=$(./train configs/paper/hybrid_depth_27_5.yaml --dry-run 2>&1)
check "the depth hybrid's contract: CTA-local in 1-27, MXFP4 in 28-32" \
  'echo "$out" | grep -q "blocks 1-27: Fprop nvfp4_cta .*; blocks 28-32: Fprop mxfp4"'
out=$(./train configs/paper/hybrid_operand_h16_plain.yaml --dry-run 2>&1)
check "the operand hybrid's contract: MXFP4 Fprop and Wgrad, CTA-local Dgrad, plain H16" \
  'echo "$out" | grep -q "Fprop mxfp4 .*| Dgrad nvfp4_cta .*| Wgrad mxfp4 .*plain H16"'

# Mixed routes on the CPU backend: they train, resume bit for bit, and a checkpoint of another route is refused.
R=(configs/tiny.yaml --set parallel.backend=cpu --set schedule.total_steps=24 --set logging.interval=1 --set precision.recipe=mxfp4
   --set precision.dgrad=nvfp4_cta --set precision.hadamard=h16_plain --set checkpoint.dir="$tmp/route" --set checkpoint.interval=12)
./train "${R[@]}" --set logging.file="$tmp/route_full.jsonl" >/dev/null 2>&1; rc=$?
rm -f "$tmp/route/ckpt_00000024.bin"
./train "${R[@]}" --set logging.file="$tmp/route_part.jsonl" --resume >"$tmp/route.out" 2>&1
check "the operand hybrid trains on the CPU and resumes bit for bit" \
  '[ $rc -eq 0 ] && grep -q "at step 12" "$tmp/route.out" && diff <(losses "$tmp/route_full.jsonl" | tail -n 12) <(losses "$tmp/route_part.jsonl")'
out=$(./train "${R[@]}" --set precision.dgrad=auto --resume 2>&1)
check "a checkpoint of another route is refused, naming the keys" \
  'echo "$out" | grep -q "precision.blocks/fprop/dgrad/wgrad/hadamard: checkpoint has route .fprop=auto dgrad=nvfp4_cta"'
out=$(./train configs/tiny.yaml --set precision.recipe=nvfp4_cta --set precision.hadamard=h32 2>&1)
check "an impossible mix is refused at config check, naming the key" 'echo "$out" | grep -q "precision.hadamard: h32 with an NVFP4 Wgrad"'
d0=$(./train configs/tiny.yaml --set parallel.backend=cpu --set schedule.total_steps=20 --set optim.weight_decay=0.5 2>&1 | grep "step  *20/" | grep -o "loss [0-9.]*")
d1=$(./train configs/tiny.yaml --set parallel.backend=cpu --set schedule.total_steps=20 --set optim.weight_decay=0.5 --set optim.decay_norms=true 2>&1 | grep "step  *20/" | grep -o "loss [0-9.]*")
check "optim.decay_norms decays the RMSNorm weights too (another loss)" '[ -n "$d0" ] && [ -n "$d1" ] && [ "$d0" != "$d1" ]'
# The paper's Dgrad diagnostic on the CPU (a tiny random model: 2 micro-batches x 2 blocks x 3 components).
out=$(./train configs/tiny.yaml --set parallel.backend=cpu --dgrad-diagnostic 2 --dgrad-draws 2 2>&1); rc=$?
check "the Dgrad diagnostic reports 12 comparisons and a finite geometric mean" \
  '[ $rc -eq 0 ] && echo "$out" | grep -Eq "^DGRAD_DIAG comparisons 12, CTA-local lower in [0-9]+, geometric mean E_MX/E_CTA [0-9]+\.[0-9]+ "'
check "... with a row per block and component" '[ "$(echo "$out" | grep -c "^| [12] | \(QKV\|O\|FFN\) | [0-9]")" -eq 6 ]'
out=$(./train configs/tiny.yaml --set parallel.backend=cpu --set precision.recipe=mxfp4 --dgrad-diagnostic 1 2>&1); rc=$?
check "the diagnostic refuses an FP4 recipe, saying what to do" '[ $rc -ne 0 ] && echo "$out" | grep -q "precision.recipe=bf16"'
echo "$pass passed, $fail failed"
