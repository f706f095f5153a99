#!/usr/bin/env bash
# The build's cost on this machine (docs/gemm_cutlass.md): wall and CPU seconds and peak memory of
# the CUTLASS files alone (gemm_cutlass.cu, swiglu_epilogue.cu), after a clean `make -j2` of a copy of the tree with and without
# CUTLASS (CUTLASS_HOME=none). Run it on an otherwise idle machine; it prints one line per build.
#   bash scripts/dev/build_cost.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x /usr/bin/time ] || { echo "build_cost: needs GNU time (/usr/bin/time)"; exit 1; }
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "# build_cost.sh, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, commit $commit$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
git ls-files -z | xargs -0 cp --parents -t "$tmp" 2>/dev/null || true
git ls-files -z --others --exclude-standard | xargs -0 -r cp --parents -t "$tmp"
ln -s "$PWD/.deps" "$tmp/.deps"
measure() {  # label, command...: wall s, CPU s (all processes), peak memory of the largest process
  local label=$1; shift
  /usr/bin/time -f "%e %U %S %M" -o "$tmp/time.txt" "$@" >"$tmp/$label.log" 2>&1 || { tail -n 20 "$tmp/$label.log"; exit 1; }
  read -r wall user sys rss <"$tmp/time.txt"
  printf '%-34s wall %7.1f s  cpu %7.1f s  peak %5.2f GB\n' "$label" "$wall" "$(echo "$user + $sys" | bc)" \
    "$(echo "scale=2; $rss / 1048576" | bc)"
}
cd "$tmp"
measure "make -j2 (CUTLASS_HOME=none)" make -j2 all CUTLASS_HOME=none
rm -rf build
measure "make -j2 (with CUTLASS)" make -j2 all
rm -f build/fp4/gemm_cutlass.cu.o
measure "fp4/gemm_cutlass.cu.o alone" make build/fp4/gemm_cutlass.cu.o
rm -f build/model/cuda/swiglu_epilogue.cu.o
measure "model/cuda/swiglu_epilogue.cu.o alone" make build/model/cuda/swiglu_epilogue.cu.o
