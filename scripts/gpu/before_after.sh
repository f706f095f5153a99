#!/usr/bin/env bash
# The benchmark of an earlier commit beside this tree's, in one call (a change that must not cost
# speed, e.g. a layout redesign): the earlier tree (a `git archive` unpacked under .deps/, which is
# carried to the GPU machine) is built with its own Makefile into its own ./train, then
# `./train configs/llama3_8b.yaml --bench` runs for each recipe in the order now, before, now, so
# that drift over the call shows (ORDER="now before now before ..." for more runs). The BENCH lines are
# printed last, then the mean of each side per recipe and line. On the GPU machine, after a build
# of this tree (scripts/gpu/gpu_check.sh build). Logs go to $OUT (or out/).
#   git archive REV | (mkdir -p .deps/before_src && tar -x -C .deps/before_src)   # here, before the call
#   bash scripts/gpu/before_after.sh [src=.deps/before_src] [recipes="bf16 mxfp4"] [layers=4,8]
set -u
cd "$(dirname "$0")/../.." || exit 1
export NCCL_NVLS_ENABLE=0
src=${1:-.deps/before_src} recipes=${2:-bf16 mxfp4} layers=${3:-4,8} dest=${OUT:-out} root=$PWD
case $dest in /*) ;; *) dest=$root/$dest ;; esac
mkdir -p "$dest"
[ -x train ] || { echo "build ./train first (scripts/gpu/gpu_check.sh build)"; exit 1; }
[ -f "$src/Makefile" ] || { echo "$src: no source tree there (git archive REV | tar -x -C $src)"; exit 1; }
ln -sfn "$root/.deps" "$src/.deps"  # its build takes the same carried dependencies
t0=$SECONDS
(cd "$src" && AUTO_DEPS=0 make -j"$(nproc)" train DEPS=.deps/root CUDNN_FE=.deps/cudnn_fe/include \
  CUDA_HOME=/usr/local/cuda NVFLAGS="-O3 -std=c++17 -fmad=false -I. -MMD -MP -Xcompiler -fopenmp -DHAVE_CUDA -gencode arch=compute_90a,code=sm_90a" \
  >"$dest/before_build.log" 2>&1) || { tail -n 30 "$dest/before_build.log"; exit 1; }
echo "before: built in $((SECONDS - t0)) s"
i=0
for rc in $recipes; do
  for t in ${ORDER:-now before now}; do
    i=$((i + 1))
    bin=./train dir=.
    [ "$t" = before ] && bin=./train dir=$src
    (cd "$dir" && timeout 200 $bin configs/llama3_8b.yaml --bench --layers "$layers" --set precision.recipe="$rc") \
      >"$dest/bench_${i}_${t}_$rc.log" 2>&1
  done
done
for f in "$dest"/bench_*_*.log; do grep '^BENCH' "$f" | sed "s|^|$(basename "$f" .log) |"; done | tee "$dest/bench_lines.txt"
# mean per (side, recipe, way): the way is "every step" or "amortized"
awk '{side=$1; sub(/^bench_[0-9]+_/, "", side); way=($6 == "every") ? "every step" : "amortized";
      v=$0; sub(/ tok\/s.*/, "", v); sub(/.* /, "", v); k=side " " way; s[k]+=v; n[k]++}
     END {for (k in s) printf "MEAN %-22s %-10s %8.0f tok/s/GPU over %d runs\n", k, "", s[k]/n[k], n[k]}' \
  "$dest/bench_lines.txt" | sort
