#!/usr/bin/env bash
# Everything GPU-side in one call, for the GPU machine (no internet: carry .deps/ from scripts/deps.sh fetch):
# build, CPU tests, GPU tests, the HF transformers oracle, the benchmark and the PyTorch peer, then a
# short summary table. Logs go to $OUT (or out/) when set.
#   bash scripts/gpu/gpu_check.sh [build] [tests|gputests] [hf] [bench] [benchown] [ncuown] [ablate] [owntrain] [nsys] [benchfp4] [fp4train] [crash] [peer]
#                                 [probe] [replicate] [harness] [benchroutes]
# (default: all but benchown, ncuown, ablate, owntrain, crash, probe, replicate and harness; benchown: the MXFP4 bench
# with precision.fp4_gemm fp8_cublaslt, fp8_own and fp8 (tuned per shape); ncuown: Nsight Compute on
# the own GEMM's configurations; gputests skips the CPU tests, which CI runs). probe: the
# Python and the lm-evaluation-harness dependencies it lacks (scripts/eval/harness_wheels.sh).
# replicate: scripts/runs/replicate.sh into $OUT/replicate with its environment knobs (BUDGET, SCALE,
# TASK_LIMIT, ...), from the carried .deps/novels.jsonl.zst, .deps/evals and .deps/tokenizer.model.
# harness: lm-evaluation-harness (.deps/harness_pack_PYVER.tar.xz, scripts/eval/harness_wheels.sh) against
# ./train --eval-only on one checkpoint (scripts/eval/compare_harness.py): the MXFP4 + H32 replication
# model trained for HARNESS_STEPS (200) unless /dev/shm/harness_ckpt still has it, then each run of
# HARNESS_RUNS, "name=task:shots,...[@limit]" (default: the four tasks zero-shot, all documents). BENCH_LAYERS (default 4,8)
# sets the two depths of the engine's and the peer's benchmark; GPU_TEST_TIMEOUT (300) each GPU test's limit in seconds.
# FP4_RECIPES (default "mxfp4 nvfp4") lists the benchfp4 runs, each a recipe with optional precision
# keys: FP4_RECIPES="mxfp4 mxfp4:wgrad_2d=off". benchroutes: ./train --bench of each configs/paper route
# (ROUTES: a subset of the configs; ROUTE_LAYERS 2,4; ROUTE_STEPS 3), for docs/replication.md's speed table.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
DEST=${OUT:-out}; OUT=$(mktemp -d); mkdir -p "$DEST"   # logs collect here, then go to $DEST as one tarball
steps=${*:-build tests hf bench benchfp4 fp4train peer}
declare -a summary
# each step's logs also go to $DEST as it ends, so that a call cut off by its time limit keeps them
note() {
  summary+=("$1"); echo "== $1"
  cp -f "$OUT"/*.log "$OUT"/*.txt "$DEST"/ 2>/dev/null || true
}
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
    timeout "${GPU_TEST_TIMEOUT:-300}" "$t" >"$OUT/$name.log" 2>&1; rc=$?
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

if has benchown; then  # the MXFP4 step with cuBLASLt's block-scaled GEMM beside our own wgmma GEMM
  for g in fp8_cublaslt fp8_own fp8; do
    timeout 300 ./train configs/llama3_8b.yaml --bench --layers "$layers" --set precision.recipe=mxfp4 \
      --set precision.fp4_gemm=$g >"$OUT/bench_$g.log" 2>&1
    grep -E "gemm (fwd|dgrad|wgrad) (q|gate|down) " "$OUT/bench_$g.log"
    [ "$g" = fp8 ] && sed -n '/^FP8 GEMM kernel per shape/,$p' "$OUT/bench_$g.log" | head -n 16
    while read -r l; do note "fp4_gemm=$g: $l"; done < <(grep '^BENCH' "$OUT/bench_$g.log")
  done
fi

if has ncuown; then  # Nsight Compute on one 8B fprop per own configuration (gpu_test_fp4_gemm --profile)
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
  if [ -n "$NCU" ]; then
    # every kernel of the run (operand set-up, ours, cuBLASLt's): cuBLASLt's beside ours, same sections
    timeout 400 "$NCU" --clock-control none --launch-count 60 --section SpeedOfLight --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats \
      --section Occupancy build/gpu_tests/gpu_test_fp4_gemm --profile >"$OUT/ncu_own.txt" 2>&1
    grep -E "^  [A-Za-z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Issued Warp|No Eligible|Stall|Registers Per|Executed Ipc A" \
      "$OUT/ncu_own.txt" | grep -vE "fill|init|rng|quant|embed" | head -n 100
    # the stall reasons of ours and cuBLASLt's (the warp states per issued instruction)
    timeout 300 "$NCU" --clock-control none --kernel-name regex:'wgmma_gemm|nvjet' --launch-skip 4 --launch-count 5 \
      --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
      build/gpu_tests/gpu_test_fp4_gemm --profile >"$OUT/ncu_stalls.txt" 2>&1
    awk '/wgmma_gemm|nvjet/{print substr($0, 1, 90)} /stalled/ && $NF + 0 >= 0.1' "$OUT/ncu_stalls.txt" | head -n 80
    note "ncu own: $(grep -c 'wgmma_gemm_kernel' "$OUT/ncu_own.txt") own kernels profiled, $(grep -cE '^  [A-Za-z_].*\(' "$OUT/ncu_own.txt") in all (ncu_own.txt)"
  else note "ncu: not installed"; fi
fi

if has ablate; then  # what bounds our pipelined GEMM: its rate with one part of the work left out at a time
  # the SM clock and the power drawn, every 100 ms, beside the ablation's time-stamped lines
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,power.limit --format=csv,noheader -lms 100 \
    >"$OUT/ablate_clocks.txt" 2>&1 & smi=$!
  timeout 260 build/gpu_tests/gpu_test_fp4_gemm --ablate >"$OUT/ablate.log" 2>&1
  kill $smi 2>/dev/null
  cat "$OUT/ablate.log"
  note "ablate: $(tail -n 1 "$OUT/ablate.log")"
fi

if has owntrain; then  # training with our GEMM: bit-identical run to run and to cuBLASLt's (tiny, small)
  timeout 300 bash scripts/gpu/own_gemm_train.sh >"$OUT/own_gemm_train.log" 2>&1
  tail -n 12 "$OUT/own_gemm_train.log"
  note "own GEMM training: $(tail -n 1 "$OUT/own_gemm_train.log")"
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

if has benchroutes; then  # each route of the paper's tables (configs/paper, one config per route) at 8B shapes
  for cfg in ${ROUTES:-configs/paper/*.yaml}; do
    tag=$(basename "$cfg" .yaml)
    timeout 240 ./train "$cfg" --bench --layers "${ROUTE_LAYERS:-2,4}" --bench-steps "${ROUTE_STEPS:-3}" \
      >"$OUT/bench_route_$tag.log" 2>&1
    tail -n 3 "$OUT/bench_route_$tag.log"
    while read -r l; do note "[$tag] $l"; done < <(grep '^BENCH' "$OUT/bench_route_$tag.log")
  done
fi

if has crash; then  # crash safety on the GPU: SIGKILLs, resumes, bit-exact losses (mxfp4, so SR is covered)
  CRASH_BACKEND=cuda CRASH_ARGS="--set precision.recipe=mxfp4" CRASH_STEPS=${CRASH_STEPS:-1200} CRASH_KILLS=10 \
    timeout 300 bash tests/system/test_crash.sh >"$OUT/crash_gpu.log" 2>&1
  tail -n 14 "$OUT/crash_gpu.log"
  note "gpu crash test: $(tail -n 1 "$OUT/crash_gpu.log")"
fi

if has peer; then  # both PyTorch peers, each both ways (optimizer every step, amortized over accumulation)
  timeout "${PEER_TIMEOUT:-500}" python3 scripts/gpu/torch_peers.py --precision bf16 --layers "$layers" \
    >"$OUT/peer_bf16.log" 2>&1
  tail -n 6 "$OUT/peer_bf16.log"
  if ls .deps/torchao-*.whl >/dev/null 2>&1 && bash scripts/gpu/peer_wheels.sh unpack >"$OUT/peer_unpack.log" 2>&1; then
    PYTHONPATH=.deps/torchao_py timeout "${PEER_TIMEOUT:-500}" python3 scripts/gpu/torch_peers.py --precision float8 \
      --layers "$layers" >"$OUT/peer_float8.log" 2>&1
    tail -n 6 "$OUT/peer_float8.log"
  else note "peer float8: no torchao (carry .deps/torchao-*.whl: scripts/gpu/peer_wheels.sh fetch)"; fi
  while read -r l; do note "$l"; done < <(grep -h '^PEER' "$OUT"/peer_*.log)
fi

if has probe; then
  bash scripts/eval/harness_wheels.sh probe 2>&1 | tee "$OUT/probe.txt"
  note "harness probe: $(tr '\n' ' ' <"$OUT/probe.txt")"
fi

if has replicate; then
  CORPUS=${CORPUS:-.deps/novels.jsonl.zst} EVALS=${EVALS:-.deps/evals} TOKENIZER=${TOKENIZER:-.deps/tokenizer.model} \
    OUT=$DEST timeout "${REPLICATE_TIMEOUT:-540}" bash scripts/runs/replicate.sh >"$OUT/replicate.log" 2>&1; rc=$?
  tail -n 30 "$OUT/replicate.log"
  note "replicate (exit $rc): $(grep -c '' "$DEST/replicate/table.md" 2>/dev/null || echo no) lines of table.md"
fi

if has harness; then
  bash scripts/eval/harness_wheels.sh unpack 2>&1 | tail -n 3 | tee "$OUT/harness_unpack.log"
  hck=/dev/shm/harness_ckpt ck=$(ls /dev/shm/harness_ckpt/mxfp4_h32/ckpt_*.bin 2>/dev/null | tail -n 1)
  if [ -z "$ck" ]; then
    CORPUS=.deps/novels.jsonl.zst TOKENIZER=.deps/tokenizer.model RECIPES=mxfp4_h32 TASKS= KEEP_CKPT=1 CKPT_DIR=$hck \
      BUDGET=short GPUS=1 STEPS=${HARNESS_STEPS:-200} PACK=0 OUT=$OUT/harness_train timeout 300 \
      bash scripts/runs/replicate.sh >"$OUT/harness_train.log" 2>&1
    ck=$(ls $hck/mxfp4_h32/ckpt_*.bin 2>/dev/null | tail -n 1)
    note "harness model: ${ck:-none} ($(grep -o 'trained in [0-9]*s: .*' "$OUT/harness_train.log" | head -n 1))"
  fi
  for run in ${HARNESS_RUNS:-zero=mmlu:0,hellaswag:0,winogrande:0,arc_challenge:0}; do
    name=${run%%=*} spec=${run#*=} lim=0
    [[ $spec == *@* ]] && lim=${spec#*@} spec=${spec%@*}
    work=/dev/shm/harness_$name   # the HF export (fp32) stays on the machine
    PYTHONPATH=.deps/harness_py timeout "${HARNESS_TIMEOUT:-400}" python3 scripts/eval/compare_harness.py --ckpt "$ck" \
      --config configs/replicate/base.yaml --set data.train=runs/novels/nv_train_000000.bin --tasks "$spec" \
      --limit "$lim" --seq 1024 --evals .deps/evals --tokenizer .deps/tokenizer.model --device cuda --work "$work" \
      >"$OUT/harness_$name.log" 2>&1; rc=$?
    mkdir -p "$DEST/harness_$name"
    cp "$work"/compare.json "$work"/harness_*shot.json "$work"/engine_*shot.log "$DEST/harness_$name/" 2>/dev/null
    cp "$OUT/harness_$name.log" "$DEST/harness_$name/"
    tail -n 16 "$OUT/harness_$name.log"
    while read -r l; do note "HARNESS[$name] $l"; done < <(grep -E '^(task|mmlu|hellaswag|winogrande|arc_challenge) ' "$OUT/harness_$name.log")
    note "harness $name: exit $rc, $(grep -o 'harness [0-9]*-shot [a-z_,]*: [0-9]*s\|engine [0-9]*-shot [a-z_:0-9,]*: [0-9]*s' "$OUT/harness_$name.log" | tr '\n' ';')"
  done
fi

echo; echo "=== summary ($(cat "$OUT/gpu.txt" | tr '\n' ' '))"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
tar czf "$DEST/gpu_check_logs.tgz" -C "$OUT" .
