#!/usr/bin/env bash
# The cost of the exactness rule (docs/architecture.md): ./train as built (no contraction,
# -fmad=false), then the same code with contraction (a second build in build_fmad, sm_90a only),
# each running `./train configs/llama3_8b.yaml --bench` at precision.recipe (default mxfp4), in the
# order exact, contracted, exact so that drift over the call shows. Logs go to $OUT (or out/);
# the BENCH lines are printed last. On the GPU machine, after a build (scripts/gpu/gpu_check.sh build).
#   bash scripts/gpu/exactness_ab.sh [recipe] [layers]
set -u
cd "$(dirname "$0")/../.." || exit 1
export NCCL_NVLS_ENABLE=0
recipe=${1:-mxfp4} layers=${2:-4,8} dest=${OUT:-out}
mkdir -p "$dest"
[ -x train ] || { echo "build ./train first (scripts/gpu/gpu_check.sh build)"; exit 1; }
cp train "$dest/train_exact"
AUTO_DEPS=0 make -j"$(nproc)" train BUILD=build_fmad DEPS=.deps/root CUDNN_FE=.deps/cudnn_fe/include \
  CUDA_HOME=/usr/local/cuda NVFLAGS="-O3 -std=c++17 -I. -MMD -MP -Xcompiler -fopenmp -DHAVE_CUDA -gencode arch=compute_90a,code=sm_90a" \
  >"$dest/fmad_build.log" 2>&1 || { tail -n 20 "$dest/fmad_build.log"; exit 1; }
mv train "$dest/train_fmad"
cp "$dest/train_exact" train  # ./train is the exact build again afterwards
i=0
for t in exact fmad exact; do
  i=$((i + 1))
  timeout 240 "$dest/train_$t" configs/llama3_8b.yaml --bench --layers "$layers" --set precision.recipe="$recipe" \
    >"$dest/bench_${i}_$t.log" 2>&1
done
rm -f "$dest/train_exact" "$dest/train_fmad"
for f in "$dest"/bench_[123]_*.log; do grep '^BENCH' "$f" | sed "s|^|$(basename "$f" .log) |"; done
