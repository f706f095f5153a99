#!/usr/bin/env bash
# Everything GPU-side in one call, for the GPU machine (no internet: carry .deps/ from scripts/deps.sh fetch):
# build, CPU tests, GPU tests, the HF transformers oracle, the benchmark and the PyTorch peer, then a
# short summary table. Logs go to $OUT (or out/) when set.
#   bash scripts/gpu/gpu_check.sh [build] [tests|gputests] [hf] [bench] [nsys] [benchfp4] [fp4train] [crash] [peer]
# (default: all but crash; gputests skips the CPU tests, which CI runs). BENCH_LAYERS (default 4,8)
# sets the two depths of the engine's and the peer's benchmark.
# FP4_RECIPES (default "mxfp4 nvfp4") lists the benchfp4 runs, each a recipe with optional precision
# keys: FP4_RECIPES="mxfp4 mxfp4:wgrad_2d=off".
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
DEST=${OUT:-out}; OUT=$(mktemp -d); mkdir -p "$DEST"   # logs collect here, then go to $DEST as one tarball
steps=${*:-build tests hf bench benchfp4 fp4train peer}
declare -a summary
note() { summary+=("$1"); echo "== $1"; }
has() { [[ " $steps " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, $(date -u +%Y-%m-%dT%H:%MZ)" | tee -a "$OUT/gpu.txt"

if has build; then
  t0=$SECONDS
  # AUTO_DEPS=0: nothing to install from here; a build without its CUDA backend is a failure here.
  if AUTO_DEPS=0 make -j"$(nproc)" all DEPS=.deps/root CUDNN_FE=.deps/cudnn_fe/include CUDA_HOME=/usr/local/cuda \
       >"$OUT/build.log" 2>&1 && grep -q '^CUDA_BUILD := 1' build/deps.mk; then note "build ok ($((SECONDS - t0))s)"
  else tail -n 40 "$OUT/build.log"; cp "$OUT/build.log" "$DEST/"; note "build FAILED"; exit 1; fi
fi

layers=${BENCH_LAYERS:-4,8}
if has tests || has gputests; then
  export TOKENIZER_MODEL=${TOKENIZER_MODEL:-.deps/tokenizer.model}  # ../shared is not on the GPU machine
  if has tests; then r=$(bash scripts/run_tests.sh 2>&1 | tee "$OUT/cpu_tests.log" | tail -n 1); note "cpu tests: $r"; fi
  for t in build/gpu_tests/gpu_test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    [ -n "${GPU_TESTS:-}" ] && [[ " $GPU_TESTS " != *" ${name#gpu_test_} "* ]] && continue  # e.g. GPU_TESTS="ops fp4_mx"
    timeout 300 "$t" >"$OUT/$name.log" 2>&1; rc=$?
    grep -E "^FAIL|rror" "$OUT/$name.log" | head -n 20
    grep -E "GB/s|TFLOP/s" "$OUT/$name.log" | grep -vi "^ *ok" | tail -n 14
    note "$name: $(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$OUT/$name.log" | tail -n 1 || true) (exit $rc)"
  done
fi

if has hf; then
  for be in cuda cpu; do
    timeout 400 python3 scripts/hf/hf_compare.py --backend $be --device cuda >"$OUT/hf_$be.log" 2>&1
    tail -n 45 "$OUT/hf_$be.log"
    note "hf_compare --backend $be: $(grep -E '^hf_compare:' "$OUT/hf_$be.log" | tail -n 1)"
  done
fi

if has bench; then
  timeout 500 ./train configs/llama3_8b.yaml --bench --layers "$layers" >"$OUT/bench.log" 2>&1
  cat "$OUT/bench.log"
  while read -r l; do note "$l"; done < <(grep '^BENCH' "$OUT/bench.log")
fi

if has nsys; then  # GPU idle time between kernels in the bench (launch gaps, syncs), if Nsight Systems is there
  NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -n 1)
  if [ -n "$NSYS" ]; then
    timeout 400 "$NSYS" profile -o "$OUT/trace" --force-overwrite true ./train configs/llama3_8b.yaml --bench \
      --layers "$layers" ${NSYS_ARGS:-} >"$OUT/nsys_bench.log" 2>&1
    "$NSYS" stats --report cuda_gpu_trace --format csv --output "$OUT/trace" "$OUT/trace.nsys-rep" >/dev/null 2>&1
    python3 scripts/gpu/gap_summary.py "$OUT"/trace*cuda_gpu_trace*.csv 2>&1 | tee "$OUT/gaps.txt"
    note "nsys: $(head -n 1 "$OUT/gaps.txt" | sed 's/^[^:]*: //')"
    rm -f "$OUT"/trace*.nsys-rep "$OUT"/trace*.sqlite; gzip -f "$OUT"/trace*.csv 2>/dev/null
  else note "nsys: not installed"; fi
fi

if has fp4train; then  # the scaled-down recipe comparison on the novels corpus (pre-tokenized in .deps/novels)
  OUT=$OUT SHARDS=.deps/novels timeout 560 bash scripts/gpu/fp4_compare.sh "${FP4_STEPS:-300}" >"$OUT/fp4_compare.log" 2>&1
  tail -n 8 "$OUT/fp4_compare.log"
  while read -r l; do note "FP4TRAIN $l"; done < <(grep -E '^(\| |- )' "$OUT/fp4_compare.log" | tail -n +3)
fi

if has benchfp4; then
  # a spec is a recipe, optionally with precision keys: mxfp4:wgrad_2d=off,hadamard=none
  for spec in ${FP4_RECIPES:-mxfp4 nvfp4}; do
    rc=${spec%%:*}; tag=${spec//[:=,]/_}; extra=()
    if [[ $spec == *:* ]]; then
      IFS=',' read -ra kvs <<<"${spec#*:}"
      for kv in "${kvs[@]}"; do extra+=(--set "precision.$kv"); done
    fi
    timeout 300 ./train configs/llama3_8b.yaml --bench --layers "$layers" --set precision.recipe=$rc "${extra[@]}" \
      >"$OUT/bench_$tag.log" 2>&1
    tail -n 6 "$OUT/bench_$tag.log"
    while read -r l; do note "${extra[*]:+[$spec] }$l"; done < <(grep '^BENCH' "$OUT/bench_$tag.log")
  done
fi

if has crash; then  # crash safety on the GPU: SIGKILLs, resumes, bit-exact losses (mxfp4, so SR is covered)
  CRASH_BACKEND=cuda CRASH_ARGS="--set precision.recipe=mxfp4" CRASH_STEPS=${CRASH_STEPS:-1200} CRASH_KILLS=10 \
    timeout 300 bash tests/system/test_crash.sh >"$OUT/crash_gpu.log" 2>&1
  tail -n 14 "$OUT/crash_gpu.log"
  note "gpu crash test: $(tail -n 1 "$OUT/crash_gpu.log")"
fi

if has peer; then
  timeout 500 python3 scripts/gpu/torch_llama_peer.py --layers "$layers" >"$OUT/peer.log" 2>&1
  tail -n 5 "$OUT/peer.log"
  while read -r l; do note "PEER $l"; done < <(grep '^pytorch' "$OUT/peer.log")
fi

echo; echo "=== summary ($(cat "$OUT/gpu.txt" | tr '\n' ' '))"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
tar czf "$DEST/gpu_check_logs.tgz" -C "$OUT" .
