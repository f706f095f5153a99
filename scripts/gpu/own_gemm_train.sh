#!/usr/bin/env bash
# Training with our own Hopper FP8 GEMM (fp4/gemm_wgmma.cu) on real activations and gradients, for
# the GPU machine (scripts/gpu/gpu_check.sh owntrain): the tiny and small presets (synthetic data)
# train OWN_STEPS (40) MXFP4 steps with precision.fp4_gemm fp8_cublaslt, fp8_own and fp8_own again.
# Asserts, per preset: every run completes and logs every step; the two fp8_own runs log the same
# loss, lr and gradient norm at every step, bit for bit (no atomics in our reduction order); and
# our run logs cuBLASLt's run, bit for bit (every GEMM of every step, Fprop, Dgrad and Wgrad, in the
# shapes each preset has: partial tiles and partial K blocks in tiny; since the accumulating BF16
# epilogue rounds as cuBLASLt's does, docs/gemm_wgmma.md). Prints both runs side by side and the
# first step where they differ, if any.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
steps=${OWN_STEPS:-40}
# step, loss, lr and grad_norm of every logged step, as printed (%.9g: a float's exact value)
losses() {
  awk 'match($0, /"step": [0-9]+, "loss": [^,]+, "lr": [^,]+, "grad_norm": [^,}]+/) { print substr($0, RSTART, RLENGTH) }' "$1"
}
for preset in tiny small; do
  C=(configs/$preset.yaml --set parallel.backend=cuda --set precision.recipe=mxfp4 --set logging.interval=1
     --set eval.interval=0 --set schedule.total_steps=$steps --set schedule.warmup_steps=$((steps / 4))
     --set parallel.deterministic=true
     --set data.train=synthetic --set data.val=synthetic --set checkpoint.dir= --set checkpoint.interval=0
     --set checkpoint.resume=false)
  for run in fp8_cublaslt fp8_own fp8_own2; do
    ./train "${C[@]}" --set precision.fp4_gemm=${run%2} --set logging.file="$tmp/$preset.$run.jsonl" \
      >"$tmp/$preset.$run.out" 2>&1
    rc=$?
    losses "$tmp/$preset.$run.jsonl" >"$tmp/$preset.$run.txt"
    check "$preset, $run: the run completes and logs all $steps steps" \
      '[ $rc -eq 0 ] && [ "$(wc -l <"$tmp/$preset.$run.txt")" -eq $steps ]'
    [ $rc -eq 0 ] || tail -n 5 "$tmp/$preset.$run.out"
  done
  check "$preset: our kernel's two runs log the same losses and gradient norms bit for bit" \
    'cmp -s "$tmp/$preset.fp8_own.txt" "$tmp/$preset.fp8_own2.txt"'
  # worst relative loss difference over the steps, and the first step whose loss, and whose gradient
  # norm, differ at all
  read -r worst first firstg < <(paste -d' ' "$tmp/$preset.fp8_cublaslt.txt" "$tmp/$preset.fp8_own.txt" | tr -d ',' | awk '
    { d = $4 - $12; d = d < 0 ? -d : d; r = d / ($4 < 0 ? -$4 : $4); if (r > w) w = r
      if (!f && $4 != $12) f = $2
      if (!g && $8 != $16) g = $2 }
    END { printf "%.3g %s %s\n", w + 0, f ? f : "none", g ? g : "none" }')
  echo "$preset: step, loss with cuBLASLt, with ours; gradient norm with cuBLASLt, with ours:"
  paste -d' ' "$tmp/$preset.fp8_cublaslt.txt" "$tmp/$preset.fp8_own.txt" | tr -d ',' |
    awk '{ printf "  %3d %12s %12s %12s %12s\n", $2, $4, $12, $8, $16 }'
  echo "$preset: own vs cuBLASLt: worst relative loss difference $worst, first step whose loss differs $first, whose gradient norm differs $firstg"
  check "$preset: our kernel's run logs cuBLASLt's losses and gradient norms bit for bit (worst loss difference $worst)" \
    '[ -s "$tmp/$preset.fp8_own.txt" ] && cmp -s "$tmp/$preset.fp8_cublaslt.txt" "$tmp/$preset.fp8_own.txt"'
done
echo "$pass passed, $fail failed"
