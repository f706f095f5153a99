#!/usr/bin/env bash
# Document masking through ./train (model.doc_mask, model.doc_positions, model.bos_id): the keys are
# documented and checked, a training run with them differs from one without (the synthetic corpus's
# BOS, id 0, starts its documents), and --bench-attention times plain causal beside document-masked attention.
# The math itself is tested in tests/unit/test_doc_mask.c and test_gradcheck.c, and against HF
# transformers by scripts/hf/hf_doc_mask.py.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

./train --help-config >"$tmp/keys" 2>&1
check "--help-config documents model.doc_mask, doc_positions and bos_id" \
  'grep -q "^model.doc_mask .*none|block_causal" "$tmp/keys" && grep -q "^model.doc_positions .*continue|restart" "$tmp/keys" && grep -q "^model.bos_id .*128000" "$tmp/keys"'

./train configs/tiny.yaml --set model.doc_mask=block_causal --print-config >"$tmp/bad" 2>&1; rc=$?
check "a BOS outside the vocabulary is refused, naming model.bos_id (exit $rc)" \
  '[ $rc -ne 0 ] && grep -q "model.bos_id: 128000 is not a token id (model.vocab_size is 512)" "$tmp/bad"'
./train configs/tiny.yaml --set model.doc_mask=blocky --print-config >"$tmp/bad2" 2>&1; rc=$?
check "an unknown doc_mask is refused with the allowed values (exit $rc)" \
  '[ $rc -ne 0 ] && grep -q "model.doc_mask" "$tmp/bad2" && grep -q "block_causal" "$tmp/bad2"'
./train configs/tiny.yaml --set model.doc_mask=block_causal --set model.bos_id=1 --print-config >"$tmp/cfg" 2>&1
check "the effective config carries the keys" \
  'grep -q "doc_mask: block_causal" "$tmp/cfg" && grep -q "bos_id: 1$" "$tmp/cfg"'

run() {  # run NAME [--set ...]: 4 steps of the tiny model on the synthetic corpus
  local name=$1; shift
  ./train configs/tiny.yaml --set schedule.total_steps=4 --set schedule.warmup_steps=1 --set eval.interval=0 \
    --set parallel.threads=2 "$@" >"$tmp/$name.log" 2>&1
}
run plain
run docs --set model.doc_mask=block_causal --set model.doc_positions=restart --set model.bos_id=0
loss() { grep -o '^step *4/4 | loss [0-9.]*' "$tmp/$1.log" | awk '{print $NF}'; }
check "training with document masking runs 4 steps ($(loss docs), without: $(loss plain))" \
  '[ -n "$(loss docs)" ] && [ -n "$(loss plain)" ]'
check "and its losses differ from the run without" '[ "$(loss docs)" != "$(loss plain)" ]'

./train configs/tiny.yaml --bench-attention --bench-steps 3 --set parallel.threads=2 >"$tmp/bench" 2>&1; rc=$?
check "--bench-attention prints plain causal beside document-masked (exit $rc)" \
  '[ $rc -eq 0 ] && grep -q "^BENCH attention cpu plain causal" "$tmp/bench" && grep -q "^BENCH attention cpu document-masked .*x plain" "$tmp/bench"'
check "--bench-attention says how many documents and what share of the causal pairs" \
  'grep -q "^documents: log-normal lengths (mean 1000, sigma 1.0), 4 draws of 8 rows: .* of the causal (query, key) pairs" "$tmp/bench"'
check "--bench-attention times plain causal back to back too (the GPU busy throughout, as in a step)" \
  'grep -Eq "^\| plain causal, 3 pairs back to back \| - \| - \| [0-9.]+ \| -, -, [0-9.e+-]+ \|$" "$tmp/bench"'
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
