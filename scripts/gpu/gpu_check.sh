#!/usr/bin/env bash
# Everything GPU-side in one call, for the GPU machine (no internet: carry .deps/ from scripts/deps.sh fetch):
# build, CPU tests, GPU tests, the HF transformers oracle, the benchmark and the PyTorch peer, then a
# short summary table. Logs go to $OUT (or out/) when set.
# build: the binaries of `scripts/gpu/prebuilt.sh pack` where .prebuilt was carried for this very tree (no
# make; docs/build.md), else make.
#   bash scripts/gpu/gpu_check.sh [build] [tests|gputests] [hf] [bench] [docmask] [benchown] [nsys] [benchfp4] [fp4train] [crash] [peer]
#                                 [probe] [replicate] [harness] [benchroutes] [repro] [benchdet] [nvtx] [ckptstall] [dgraddiag] [attnpeer] [clocks]
#                                 [fusion]
# (default: build tests hf bench benchfp4 fp4train repro peer; benchown: the MXFP4 bench
# with precision.fp4_gemm fp8_cublaslt, fp8_cutlass and fp8 (tuned per shape); gputests skips the CPU tests, which CI
# runs; ncuown, ablate and owntrain went with our own GEMM on 2026-12-05, docs/gemm_wgmma.md). probe: the
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
# (ROUTES: a subset of the configs; ROUTE_LAYERS 2,4; ROUTE_STEPS 10: with 3 the optimizer's share is noise), for docs/replication.md's speed table.
# repro (default): two processes sharing one record of GEMM choices log the same losses bit for bit, and so
# does a run resumed at step 15 (small preset, MXFP4, 30 steps; REPRO_GEMMS "auto fp8"); benchdet: the 8B
# bench with parallel.deterministic true and false, their tok/s ratio and each part's share of the cost
# (attention backward, GEMMs) from the per-kernel tables (docs/determinism.md). nvtx (not default): what the
# NVTX ranges of logging.nvtx cost, the bench with them off and on, alternating NVTX_ROUNDS (2) times, then
# once each under Nsight Systems when it is there, with the ranges' summary (docs/logging.md). ckptstall (not
# default): ./train --bench-save at 8B shapes with CKPT_LAYERS (4) layers: the stall of an asynchronous checkpoint
# save (state copied into pinned host memory) and its background write, extrapolated per rank of 1-8 (target: under
# 1 s per rank; docs/checkpoint_format.md). fusion (not default): the MXFP4 8B bench with each precision.fusion setting
# of FUSION_MODES in one call (default "auto on:residual on:swiglu_epilogue on"; on:NAME narrows on to one fusion,
# FP4_FUSIONS): each fusion's rows of the per-kernel table and the profiled step's time per layer against the first.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
DEST=${OUT:-out}; OUT=$(mktemp -d); mkdir -p "$DEST"   # logs collect here, then go to $DEST as one tarball
# cuDNN: the build links the newest cuDNN 9 on the machine (scripts/deps.sh newest_cudnn: 9.19 from
# PyTorch's wheel on the H200 machine, against 9.14 in the system paths); the benches print the version
# they loaded ("cuDNN N loaded at run time"). CUDNN_LIBDIR=system builds against the linker's instead.
steps=${*:-build tests hf bench benchfp4 fp4train repro peer}
declare -a summary
# each step's logs also go to $DEST as it ends, so that a call cut off by its time limit keeps them
note() {
  summary+=("$1"); echo "== $1"
  cp -f "$OUT"/*.log "$OUT"/*.txt "$DEST"/ 2>/dev/null || true
}
has() { [[ " $steps " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, $(date -u +%Y-%m-%dT%H:%MZ)" | tee -a "$OUT/gpu.txt"

# binaries carried from the development machine for this very tree (scripts/gpu/prebuilt.sh pack): no build,
# where they unpack and ./train loads here (else make, below, which rebuilds them)
if has build && ! has tests && [ -z "${BUILD_TARGETS:-}" ] && [ -f .prebuilt/stamp ] &&
  env_line=$(bash scripts/gpu/prebuilt.sh unpack 2>"$OUT/prebuilt.log") &&
  (eval "$env_line" && ./train --help >/dev/null 2>>"$OUT/prebuilt.log" ||
    { echo "./train does not load here" >>"$OUT/prebuilt.log"; false; }); then
  eval "$env_line"
  note "build: prebuilt binaries ($(head -n 1 .prebuilt/stamp | cut -d' ' -f2))"
elif has build; then
  [ -f .prebuilt/stamp ] && note "build: prebuilt binaries not used: $(tail -n 1 "$OUT/prebuilt.log" 2>/dev/null ||
    echo "the CPU tests or BUILD_TARGETS ask for a build")"
  t0=$SECONDS
  # AUTO_DEPS=0: nothing to install from here; a build without its CUDA backend is a failure here.
  # CUDA_ARCHS=90a: Hopper's code alone (sm_100a is compile-checked by every other build, CI's included);
  # BUILD_TARGETS (default all): fewer make targets for a short call, e.g. "train build/gpu_tests/gpu_test_fused"
  if AUTO_DEPS=0 make -j"$(nproc)" ${BUILD_TARGETS:-all} CUDA_ARCHS="${CUDA_ARCHS:-90a}" DEPS=.deps/root CUDNN_FE=.deps/cudnn_fe/include CUDA_HOME=/usr/local/cuda \
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

if has hf; then  # HF_BACKENDS (cuda cpu) and HF_SCRIPTS (compare doc_mask) pick a subset
  for be in ${HF_BACKENDS:-cuda cpu}; do
    if [[ " ${HF_SCRIPTS:-compare doc_mask} " == *" compare "* ]]; then
      timeout 400 python3 scripts/hf/hf_compare.py --backend $be --device cuda >"$OUT/hf_$be.log" 2>&1
      tail -n 45 "$OUT/hf_$be.log"
      note "hf_compare --backend $be: $(grep -E '^hf_compare:' "$OUT/hf_$be.log" | tail -n 1)"
    fi
    if [[ " ${HF_SCRIPTS:-compare doc_mask} " == *" doc_mask "* ]]; then
      # document masking against HF given the explicit 4D mask and position_ids
      timeout 400 python3 scripts/hf/hf_doc_mask.py --backend $be --device cuda >"$OUT/hf_doc_mask_$be.log" 2>&1
      tail -n 8 "$OUT/hf_doc_mask_$be.log"
      note "hf_doc_mask --backend $be: $(grep -E '^hf_doc_mask:' "$OUT/hf_doc_mask_$be.log" | tail -n 1)"
    fi
  done
fi

if has bench; then
  timeout 500 ./train configs/llama3_8b.yaml --bench --layers "$layers" >"$OUT/bench.log" 2>&1
  cat "$OUT/bench.log"
  while read -r l; do note "$l"; done < <(grep '^BENCH' "$OUT/bench.log")
fi

if has docmask; then  # document masking's cost at the 8B shapes: attention alone beside causal, then a training step
  timeout 300 ./train configs/llama3_8b.yaml --bench-attention >"$OUT/bench_attention.log" 2>&1
  cat "$OUT/bench_attention.log"
  while read -r l; do note "$l"; done < <(grep '^BENCH attention' "$OUT/bench_attention.log")
  for dm in none block_causal; do  # the step beside plain causal's, in the same call
    log=$OUT/bench_docmask.log; [ $dm = none ] && log=$OUT/bench_docmask_none.log
    timeout 500 ./train configs/llama3_8b.yaml --bench --layers "$layers" --set model.doc_mask=$dm >"$log" 2>&1
    grep -E "attention (fwd|bwd)" "$log"
    while read -r l; do note "doc_mask=$dm: $l"; done < <(grep '^BENCH' "$log")
  done
fi

if has attnpeer; then  # issue 30: the engine's cuDNN attention beside PyTorch's at the 8B shape, one call
  for d in true false; do
    timeout 300 ./train configs/llama3_8b.yaml --bench-attention --set parallel.deterministic=$d \
      >"$OUT/bench_attention_det_$d.log" 2>&1
    rc=$?; grep -E '^(bench: cuDNN|\| attention |\| plain causal)' "$OUT/bench_attention_det_$d.log"
    note "attention, engine, deterministic $d (fwd ms, bwd ms, fwd+bwd ms, TFLOP/s fwd, bwd, both): $(grep '^| plain causal |' "$OUT/bench_attention_det_$d.log" || echo "no result (exit $rc)")"
    note "attention, engine, deterministic $d, back to back: $(grep '^| plain causal, ' "$OUT/bench_attention_det_$d.log" || echo "no result")"
  done
  timeout 300 python3 scripts/gpu/attention_peer.py >"$OUT/attention_peer.log" 2>&1
  tail -n 4 "$OUT/attention_peer.log"
  note "$(grep '^PEER attention' "$OUT/attention_peer.log" || echo "attention peer: no PEER line (attention_peer.log)")"
  # and inside PyTorch's own training step (compiled HF blocks, 2 layers, torch.profiler), as the
  # engine's bench table reports its attention inside its step: cuDNN's SDPA alone, then PyTorch's default
  for sd in cudnn default; do
    timeout 300 python3 scripts/gpu/torch_peers.py --precision bf16 --layers 2,4 --attention-profile --sdpa $sd \
      >"$OUT/attention_in_step_torch_$sd.log" 2>&1
    while read -r l; do note "SDPA $sd: $l"; done < <(grep '^PEER attention in step' "$OUT/attention_in_step_torch_$sd.log" ||
      echo "no PEER line: $(tail -n 1 "$OUT/attention_in_step_torch_$sd.log")")
  done
fi

if has clocks; then  # issue 30.1: the attention backward alone 464 TFLOP/s, inside the step 381 (same kernel, one call)
  # SM clock and power sampled by nvidia-smi every 20 ms while each runs; the busy samples (over 200 W)
  # give the median clock the attention ran at alone, and the one of the training step around it.
  busy() { python3 -c 'import sys, statistics as s
r = [tuple(map(float, l.split(","))) for l in open(sys.argv[1]) if l.count(",") == 1 and "N/A" not in l]
b = [x for x in r if x[1] > 200]
print(f"median {s.median(x[0] for x in b):.0f} MHz, {s.median(x[1] for x in b):.0f} W over {len(b)} busy samples of {len(r)}" if b else "no busy samples")' "$1"; }
  for what in attention step; do
    nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 20 >"$OUT/clocks_$what.csv" 2>/dev/null &
    smi=$!
    # attention: CLOCKS_ATTN_STEPS (200) calls per form, about 1 s each: the default 10 gave 5 busy samples
    if [ $what = attention ]; then timeout 300 ./train configs/llama3_8b.yaml --bench-attention \
      --bench-steps "${CLOCKS_ATTN_STEPS:-200}" >"$OUT/clocks_$what.log" 2>&1
    else timeout 300 ./train configs/llama3_8b.yaml --bench --layers "$layers" --set precision.recipe=mxfp4 >"$OUT/clocks_$what.log" 2>&1; fi
    kill $smi 2>/dev/null; wait $smi 2>/dev/null
    busy "$OUT/clocks_$what.csv" >"$OUT/clocks_$what.txt" 2>&1
    note "SM clock while busy, $what$([ $what = step ] && echo " (MXFP4 8B bench)" || echo " alone (--bench-attention)"): $(cat "$OUT/clocks_$what.txt")"
  done
  grep -E 'attention (fwd|bwd)' "$OUT/clocks_step.log"
fi

if has fusion; then  # issue 30.3: the MXFP4 8B step with format-aware fusion settings (precision.fusion), one call
  # (auto: the fusions measured faster; on: also the residual epilogue and the SwiGLU epilogue; on:NAME[,NAME]: `on`
  # narrowed to those (FP4_FUSIONS), each measured alone against auto, the first setting). Per setting: the rows
  # it changes, and the profiled step's total (4 layers at BENCH_LAYERS 2,4) against the first setting's, per layer.
  base=
  for spec in ${FUSION_MODES:-auto on:residual on:swiglu_epilogue on}; do
    f=${spec%%:*}; only=; [[ $spec == *:* ]] && only=${spec#*:}; tag=${spec//[:,]/_}
    FP4_FUSIONS=${only:-residual,swiglu_epilogue} timeout 300 ./train configs/llama3_8b.yaml --bench \
      --layers "$layers" --set precision.recipe=mxfp4 --set precision.fusion=$f >"$OUT/bench_fusion_$tag.log" 2>&1
    grep -E "^(residual|swiglu (fwd|bwd)|rmsnorm fwd)|gemm fwd(\+res|\+swiglu)? (o|up|down) |quant x fwd|quant dy dual" \
      "$OUT/bench_fusion_$tag.log"
    tot=$(awk '/^where the time goes: one step at/ {n = $8} /^total / {t = $2} END {if (t) print t, n}' "$OUT/bench_fusion_$tag.log")
    if [ -n "$tot" ]; then
      read -r t n <<<"$tot"; [ -z "$base" ] && base=$t && bspec=$spec
      note "fusion $spec: profiled step $t ms at $n layers; $(awk -v t="$t" -v b="$base" -v n="$n" \
        'BEGIN {printf "%+.3f ms per layer", (t - b) / n}') against $bspec"
    fi
    note "fusion $spec: $(grep '^per layer' "$OUT/bench_fusion_$tag.log" | head -n 1 || echo "no result")"
    while read -r l; do note "fusion $spec: $l"; done < <(grep '^BENCH' "$OUT/bench_fusion_$tag.log")
  done
fi

if has benchown; then  # the MXFP4 step with cuBLASLt's block-scaled GEMM beside CUTLASS's and the tuned choice
  # (the tuned run chooses among CUTLASS's configurations that have run, fp4/gemm_cutlass.cu's TUNED_BF16
  # and TUNED_F32; FP4_CUTLASS_TUNED=N overrides both)
  for g in fp8_cublaslt fp8_cutlass fp8; do
    timeout 300 ./train configs/llama3_8b.yaml --bench --layers "$layers" \
      --set precision.recipe=mxfp4 --set precision.fp4_gemm=$g >"$OUT/bench_$g.log" 2>&1
    grep -E "gemm (fwd|dgrad|wgrad) (q|gate|down) " "$OUT/bench_$g.log"
    [ "$g" = fp8 ] && sed -n '/^FP8 GEMM kernel per shape/,$p' "$OUT/bench_$g.log" | head -n 16
    while read -r l; do note "fp4_gemm=$g: $l"; done < <(grep '^BENCH' "$OUT/bench_$g.log")
  done
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

if has nvtx; then  # what logging.nvtx's ranges cost: the same bench without and with them, in one call
  for ((i = 1; i <= ${NVTX_ROUNDS:-2}; i++)); do
    for nv in false true; do
      timeout 300 ./train configs/llama3_8b.yaml --bench --layers "$layers" --set logging.nvtx=$nv \
        >"$OUT/bench_nvtx_${nv}_$i.log" 2>&1
      while read -r l; do note "nvtx=$nv ($i): $l"; done < <(grep '^BENCH' "$OUT/bench_nvtx_${nv}_$i.log")
    done
  done
  # Without a profiler attached a range costs a test of a function pointer; under one it is recorded.
  NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -n 1)
  if [ -n "$NSYS" ]; then
    for nv in false true; do
      timeout 400 "$NSYS" profile -t cuda,nvtx -o "$OUT/nvtx_$nv" --force-overwrite true ./train configs/llama3_8b.yaml \
        --bench --layers "$layers" --set logging.nvtx=$nv >"$OUT/nsys_nvtx_$nv.log" 2>&1
      while read -r l; do note "nsys, nvtx=$nv: $l"; done < <(grep '^BENCH' "$OUT/nsys_nvtx_$nv.log")
    done
    "$NSYS" stats --report nvtx_sum --format csv --output "$OUT/nvtx_ranges" "$OUT/nvtx_true.nsys-rep" >/dev/null 2>&1 ||
      "$NSYS" stats --report nvtxsum --format csv --output "$OUT/nvtx_ranges" "$OUT/nvtx_true.nsys-rep" >/dev/null 2>&1
    head -n 40 "$OUT"/nvtx_ranges*.csv 2>/dev/null | tee "$OUT/nvtx_ranges.txt"
    note "nvtx under nsys: $(grep -c . "$OUT/nvtx_ranges.txt" 2>/dev/null || echo 0) lines of range summary (nvtx_ranges.txt)"
    rm -f "$OUT"/nvtx_*.nsys-rep "$OUT"/nvtx_*.sqlite
  else note "nvtx under nsys: not installed"; fi
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
    timeout 240 ./train "$cfg" --bench --layers "${ROUTE_LAYERS:-2,4}" --bench-steps "${ROUTE_STEPS:-10}" \
      >"$OUT/bench_route_$tag.log" 2>&1
    tail -n 3 "$OUT/bench_route_$tag.log"
    while read -r l; do note "[$tag] $l"; done < <(grep '^BENCH' "$OUT/bench_route_$tag.log")
  done
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | sed 's/NVIDIA //; s/ .*//')
  python3 scripts/gpu/route_speed_table.py --gpu "${gpu_name:-GPU}" "$OUT"/bench_route_*.log 2>&1 |
    tee "$OUT/route_speed_table.txt"
  note "route speed table (route_speed_table.txt): $(grep -c '^| [^r-]' "$OUT/route_speed_table.txt") routes"
fi

if has crash; then  # crash safety on the GPU: SIGKILLs, resumes, bit-exact losses (mxfp4, so SR is covered)
  CRASH_BACKEND=cuda CRASH_ARGS="--set precision.recipe=mxfp4" CRASH_STEPS=${CRASH_STEPS:-1200} CRASH_KILLS=10 \
    timeout 300 bash tests/system/test_crash.sh >"$OUT/crash_gpu.log" 2>&1
  tail -n 14 "$OUT/crash_gpu.log"
  note "gpu crash test: $(tail -n 1 "$OUT/crash_gpu.log")"
fi

if has ckptstall; then  # asynchronous checkpoints at 8B shapes: the stall per save, the background write
  timeout 600 ./train configs/llama3_8b.yaml --bench-save --layers "${CKPT_LAYERS:-4}" \
    --set checkpoint.dir=/tmp/ckptstall >"$OUT/ckptstall.log" 2>&1; rc=$?
  grep -E '^(\||the params)' "$OUT/ckptstall.log"
  note "ckptstall: $(grep '^BENCHSAVE' "$OUT/ckptstall.log" || echo "no BENCHSAVE line (exit $rc)")"
fi

if has repro; then  # bit-reproducible by default (docs/determinism.md): two processes, then a resume
  # small preset, MXFP4, 30 steps, default settings: runs a and b are separate processes sharing one
  # record of GEMM choices (a records, b reuses), c stops at step 15 and a fourth process resumes it
  # to 30. Every logged loss and gradient norm must equal run a's. Per back end: auto (fp8_cublaslt on
  # Hopper) and fp8 (per shape cuBLASLt or CUTLASS's, a choice recorded too). Then, for contrast and
  # not asserted, two runs with parallel.deterministic false.
  rd=$OUT/repro; mkdir -p "$rd"
  R=(configs/small.yaml --set parallel.backend=cuda --set precision.recipe=mxfp4 --set data.train=synthetic
     --set data.val= --set eval.interval=0 --set logging.interval=1 --set schedule.total_steps=30
     --set schedule.warmup_steps=10 --set checkpoint.interval=0 --set checkpoint.resume=false)
  losses() { awk 'match($0, /"step": [0-9]+, "loss": [^,]+, "lr": [^,]+, "grad_norm": [^,}]+/) {
    print substr($0, RSTART, RLENGTH) }' "$1"; }
  first_diff() { paste -d'|' "$1" "$2" | awk -F'|' '$1 != $2 { print NR; exit }'; }  # the first differing step
  declare -A lines
  for g in ${REPRO_GEMMS:-auto fp8}; do
    P=("${R[@]}" --set precision.fp4_gemm=$g --set parallel.gemm_plans="$rd/plans_$g")
    for r in a b; do
      timeout 300 ./train "${P[@]}" --set checkpoint.dir= --set logging.file="$rd/$g.$r.jsonl" >"$rd/$g.$r.out" 2>&1
      lines[$r]=$(grep -c . "$rd/plans_$g" 2>/dev/null)  # the record's entries + 2 after each run
    done
    timeout 300 ./train "${P[@]}" --set checkpoint.dir="$rd/ck_$g" --set logging.file="$rd/$g.c.jsonl" --max-steps 15 \
      >"$rd/$g.c1.out" 2>&1
    timeout 300 ./train "${P[@]}" --set checkpoint.dir="$rd/ck_$g" --set logging.file="$rd/$g.c.jsonl" --resume \
      >"$rd/$g.c2.out" 2>&1
    for r in a b c; do losses "$rd/$g.$r.jsonl" >"$rd/$g.$r.txt"; done
    n=$(grep -c . "$rd/$g.a.txt"); rec=$(grep -o 'recorded in [^ ]* ([0-9]*' "$rd/$g.b.out" | grep -o '[0-9]*$')
    ab=$(cmp -s "$rd/$g.a.txt" "$rd/$g.b.txt" && echo identical || echo "DIFFER from step $(first_diff "$rd/$g.a.txt" "$rd/$g.b.txt")")
    if ! grep -q "resumed from .* at step 15" "$rd/$g.c2.out"; then ac="NOT RESUMED at step 15"
    else ac=$(cmp -s "$rd/$g.a.txt" "$rd/$g.c.txt" && echo identical ||
      echo "DIFFER from step $(first_diff "$rd/$g.a.txt" "$rd/$g.c.txt")"); fi
    grep -h '^determinism:' "$rd/$g.a.out" "$rd/$g.b.out"
    tail -n 2 "$rd/$g.a.out" "$rd/$g.b.out" "$rd/$g.c2.out"
    v=FAIL; [ "$n" -eq 30 ] && [ "$ab" = identical ] && [ "$ac" = identical ] && [ "${rec:-0}" -gt 0 ] && v=PASS
    note "repro fp4_gemm=$g: $v ($n steps; a vs b $ab; a vs resumed at 15 $ac; b reused ${rec:-no} recorded choices and added $((${lines[b]:-0} - ${lines[a]:-0})); $(tail -n 1 "$rd/$g.a.txt" | grep -o '"loss": [^,]*'))"
  done
  for r in a b; do
    timeout 300 ./train "${R[@]}" --set parallel.deterministic=false --set checkpoint.dir= \
      --set logging.file="$rd/nd.$r.jsonl" >"$rd/nd.$r.out" 2>&1
    losses "$rd/nd.$r.jsonl" >"$rd/nd.$r.txt"
  done
  d=$(first_diff "$rd/nd.a.txt" "$rd/nd.b.txt")
  note "repro parallel.deterministic=false (contrast, not asserted): ${d:+the two runs differ from step $d}${d:-the two runs agree}"
  cp "$rd"/*.out "$rd"/*.txt "$rd"/plans_* "$DEST/" 2>/dev/null || true
fi

if has benchdet; then  # what the default costs at 8B shapes: parallel.deterministic true (recorded GEMMs) vs false
  for d in true false; do
    extra=(); [ $d = true ] && extra=(--set parallel.gemm_plans="$OUT/plans_8b")
    timeout 500 ./train configs/llama3_8b.yaml --bench --layers "$layers" --set parallel.deterministic=$d "${extra[@]}" \
      >"$OUT/bench_det_$d.log" 2>&1
    grep -E '^determinism:|^BENCH|^(attention bwd|gemm wgrad head|total) ' "$OUT/bench_det_$d.log"
  done
  # tok/s of the optimizer-every-step figure, and from each profiled step (the per-kernel table at the
  # second depth) the ms/step of the attention backward, of all GEMMs and of the whole step
  tps() { grep 'optimizer every step' "$1" | grep -o '[0-9]* tok/s' | grep -o '^[0-9]*'; }
  ms() { awk -v want="$2" '/^where the time goes/ { on = 1; next } on { split(substr($0, 23), f, " ")
    if (substr($0, 1, length(want)) == want) s += want == "total" ? f[1] : f[2]; if ($1 == "total") on = 0 }
    END { printf "%.3f", s }' "$1"; }
  share() { awk -v a="$1" -v b="$2" -v s="$3" 'BEGIN { if (s > 0) printf "%+.2f%% of the step", 100 * (a - b) / s }'; }
  t=$(tps "$OUT/bench_det_true.log"); f=$(tps "$OUT/bench_det_false.log")
  at=$(ms "$OUT/bench_det_true.log" "attention bwd"); af=$(ms "$OUT/bench_det_false.log" "attention bwd")
  gt=$(ms "$OUT/bench_det_true.log" "gemm "); gf=$(ms "$OUT/bench_det_false.log" "gemm ")
  st=$(ms "$OUT/bench_det_true.log" total); sf=$(ms "$OUT/bench_det_false.log" total)
  note "benchdet: deterministic ${t:-?} vs non-deterministic ${f:-?} tok/s/GPU: $(awk -v t="${t:-0}" -v f="${f:-0}" \
    'BEGIN { if (f > 0) printf "ratio %.4f, cost %.2f%% (target <= 2%%)", t / f, 100 * (1 - t / f); else print "?" }')"
  note "benchdet, profiled step: $st vs $sf ms; attention bwd $at vs $af ms ($(share "$at" "$af" "$sf")); GEMMs $gt vs $gf ms ($(share "$gt" "$gf" "$sf"))"
  for d in true false; do
    while read -r l; do note "benchdet deterministic=$d: $l"; done < <(grep -E '^(attention bwd|gemm wgrad head) ' \
      "$OUT/bench_det_$d.log")
  done
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
  # issue 30's targets from this call's engine benches (bench: bf16, benchfp4: bench_mxfp4) and both peers
  if ls "$OUT"/bench.log "$OUT"/bench_mxfp4.log >/dev/null 2>&1; then
    python3 scripts/gpu/speed_targets.py "$OUT"/bench.log "$OUT"/bench_mxfp4.log "$OUT"/peer_*.log \
      >"$OUT/speed_targets.txt" 2>&1
    cat "$OUT/speed_targets.txt"
    note "$(tail -n 1 "$OUT/speed_targets.txt")"
  fi
fi

if has probe; then
  bash scripts/eval/harness_wheels.sh probe 2>&1 | tee "$OUT/probe.txt"
  note "harness probe: $(tr '\n' ' ' <"$OUT/probe.txt")"
fi

if has dgraddiag; then  # the paper's Dgrad diagnostic on the replication's MXFP4 + H32 model (docs/formats.md 7)
  # DIAG_STEPS (128) steps of scripts/runs/replicate.sh keeping the checkpoint, then DIAG_BATCHES (3)
  # micro-batches through its BF16 backward, MXFP4 and CTA-local Dgrads against the unquantized one
  dck=/dev/shm/dgrad_diag_ckpt
  RECIPES=mxfp4_h32 STEPS=${DIAG_STEPS:-128} VAL_POINTS=2 TASKS= KEEP_CKPT=1 CKPT_DIR=$dck GPUS=1 PACK=0 \
    CORPUS=${CORPUS:-.deps/novels.jsonl.zst} TOKENIZER=${TOKENIZER:-${TOKENIZER_MODEL:-.deps/tokenizer.model}} OUT=$OUT/diag_train \
    timeout 300 bash scripts/runs/replicate.sh >"$OUT/dgrad_diag_train.log" 2>&1
  ck=$(ls $dck/mxfp4_h32/ckpt_*.bin 2>/dev/null | tail -n 1)
  if [ -n "$ck" ]; then
    timeout 400 ./train configs/replicate/base.yaml --set data.train=runs/novels/nv_train_000000.bin --set data.val= \
      --set eval.interval=0 --set precision.recipe=bf16 --set checkpoint.dir= --set checkpoint.resume=false \
      --set checkpoint.init_from="$ck" --dgrad-diagnostic "${DIAG_BATCHES:-3}" >"$OUT/dgrad_diag_replicate.log" 2>&1
    tail -n 6 "$OUT/dgrad_diag_replicate.log"
    note "dgrad diagnostic ($ck): $(grep '^DGRAD_DIAG' "$OUT/dgrad_diag_replicate.log" || echo 'no summary line')"
  else note "dgrad diagnostic: no checkpoint (see dgrad_diag_train.log)"; fi
  rm -rf "$dck"
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
tar czf "$DEST/gpu_check_logs.tgz" --exclude="*.bin" --exclude="ck_*" -C "$OUT" .  # logs only: checkpoints are GBs
