#!/usr/bin/env bash
# Trains the same small Llama-3-architecture model on the same tokens with several precision
# recipes and prints the final losses against BF16 (the paper's comparison, scaled down).
# The full scaled-down replication (downstream evals, plot, 2-GPU mode) is scripts/runs/replicate.sh.
#   bash scripts/gpu/fp4_compare.sh [STEPS] [TOKENIZER_DIR] [CORPUS]
# Defaults: 300 steps of 32 x 1024 tokens (~10M tokens, half an epoch of the novels corpus) on the
# "small" preset (12 blocks, dim 1024, 135M parameters in the blocks, Llama-3 vocabulary).
set -u
cd "$(dirname "$0")/../.."
steps=${1:-300}
tok=${2:-../shared/data/tokenizer}
corpus=${3:-../shared/data/corpus/novels.jsonl.zst}
shards=${SHARDS:-runs/novels}   # where the tokenized corpus goes (kept between runs)
out=${OUT:-out}/fp4_compare; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
[ -f "$shards/nv_train_000000.bin" ] || ./train tokenize --tokenizer "$tok/tokenizer.model" --input "$corpus" \
  --output "$shards/nv" --val-docs 3 --quiet || exit 1
common=(--set model.preset=small --set batch.seq_len=1024 --set batch.micro_batch=16 --set batch.global_batch=32
        --set schedule.type=cosine --set schedule.warmup_steps=30 --set schedule.total_steps="$steps"
        --set optim.lr=6e-4 --set data.train="$shards/nv_train_000000.bin" --set data.val="$shards/nv_val_000000.bin"
        --set eval.interval="$steps" --set eval.batches=16 --set logging.interval=1 --set parallel.backend=cuda)
runs=("bf16|--set precision.recipe=bf16"
      "mxfp4 (row SR + H32)|--set precision.recipe=mxfp4"
      "mxfp4, no Hadamard|--set precision.recipe=mxfp4 --set precision.hadamard=none"
      "mxfp4, Wgrad operands both VEC128|--set precision.recipe=mxfp4 --set precision.wgrad_2d=off"
      "mxfp4, Wgrad x in 128x128 tiles|--set precision.recipe=mxfp4 --set precision.wgrad_2d=x"
      "nvfp4, last 2 blocks BF16|--set precision.recipe=nvfp4 --set precision.bf16_last_blocks=2")
printf '| recipe | final train loss (mean of last 50 steps) | val loss | excess vs BF16 | tok/s |\n|---|---|---|---|---|\n' >"$out/table.md"
base=""; notes=()
for r in "${runs[@]}"; do
  name=${r%%|*}; args=${r#*|}; tag=$(echo "$name" | tr -c 'a-z0-9' '_')
  # shellcheck disable=SC2086
  ./train configs/tiny.yaml "${common[@]}" $args --set logging.file="$out/$tag.jsonl" >"$out/$tag.log" 2>&1 || {
    tail -n 20 "$out/$tag.log"; echo "| $name | FAILED | | | |" >>"$out/table.md"; continue; }
  read -r loss val tps < <(python3 - "$out/$tag.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
tr = [r for r in rows if "loss" in r]
va = [r["val_loss"] for r in rows if "val_loss" in r]
last = [r["loss"] for r in tr if r["step"] > tr[-1]["step"] - 50]
print(f'{sum(last)/len(last):.4f} {va[-1] if va else float("nan"):.4f} {tr[-1]["tok_per_s"]:.0f}')
PY
)
  [ -z "$base" ] && base=$loss
  excess=$(python3 -c "print(f'{100*($loss-$base)/$base:+.2f}%')")
  echo "| $name | $loss | $val | $excess | $tps |" >>"$out/table.md"
  tiles=$(grep -h "^FP8 Wgrad tiles" "$out/$tag.log" | head -n 1)
  [ -n "$tiles" ] && notes+=("- $name: $tiles")
done
[ ${#notes[@]} -gt 0 ] && { echo; printf '%s\n' "${notes[@]}"; } >>"$out/table.md"
cat "$out/table.md"
