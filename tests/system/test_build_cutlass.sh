#!/usr/bin/env bash
# CUTLASS in the build (fp4/gemm_cutlass.cu, docs/gemm_cutlass.md): scripts/deps.sh unpacks its
# headers from the nvidia-cutlass wheel kept in .deps/ (also with AUTO_DEPS=0, as on the GPU machine),
# leaves a CUTLASS_HOME of the user's alone, and does not retry a failed download on every make; the
# Makefile compiles that one file with CUTLASS's flags when the headers are there and says so when not.
# Uses a copy of scripts/deps.sh in a scratch tree and a fake wheel (no network, no real CUTLASS).
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ver=$(sed -n 's/^CUTLASS_VERSION=//p' scripts/deps.sh)
check "deps.sh pins a CUTLASS version ($ver)" '[[ $ver =~ ^[0-9]+\.[0-9]+\.[0-9]+ ]]'

# The scratch tree's build step, as the Makefile runs it (the real cuDNN frontend, wherever it is).
fe=$(realpath -m "${CUDNN_FE:-.deps/cudnn_fe/include}")
mkdir -p "$tmp/tree/scripts" "$tmp/tree/.deps" && cp scripts/deps.sh "$tmp/tree/scripts/"
nvcc_path=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
deps_build() { (cd "$tmp/tree" && NVCC="$nvcc_path" CUDNN_FE="$fe" PARQUET=0 BUILD=b "$@" bash scripts/deps.sh build 2>&1); }
python3 - "$tmp/tree/.deps/nvidia_cutlass-$ver-py3-none-any.whl" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr("cutlass_library/source/include/cutlass/cutlass.h", "// fake\n")
    z.writestr("cutlass_library/source/include/cute/tensor.hpp", "// fake\n")
    z.writestr("cutlass_library/source/examples/67/x.cu", "// not a header\n")
EOF
out=$(deps_build env AUTO_DEPS=0)
if grep -q '^CUDA_BUILD := 1' "$tmp/tree/b/deps.mk" 2>/dev/null; then
  check "AUTO_DEPS=0 still unpacks the kept wheel, saying so" \
    '[ -f "$tmp/tree/.deps/cutlass/include/cutlass/cutlass.h" ] && grep -q "unpacking CUTLASS" <<<"$out"'
  check "... its headers only" \
    '[ -f "$tmp/tree/.deps/cutlass/include/cute/tensor.hpp" ] && [ "$(find "$tmp/tree/.deps/cutlass" -type f | wc -l)" -eq 2 ]'
  out=$(deps_build env AUTO_DEPS=0)
  check "headers there: nothing more is done or said" '[ -z "$out" ]'
  rm -rf "$tmp/tree/.deps/cutlass"
  out=$(deps_build env CUTLASS_HOME="$tmp/mine")
  check "a CUTLASS_HOME of the user's is left alone" '[ -z "$out" ] && [ ! -e "$tmp/tree/.deps/cutlass" ]'
  rm -f "$tmp/tree/.deps/"*.whl
  out=$(deps_build env PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_RETRIES=0)
  check "no wheel and no network: one line says why" \
    'grep -q "no CUTLASS: pip could not download it" <<<"$out" && [ -f "$tmp/tree/b/cutlass_fetch_failed" ]'
  out=$(deps_build env PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_RETRIES=0)
  check "... and the next make does not try again" '[ -z "$out" ]'

  # The Makefile: the flags on the two CUTLASS files alone when the headers are there, a note when not.
  mkdir -p "$tmp/cl/include/cutlass" && touch "$tmp/cl/include/cutlass/cutlass.h" "$tmp/cl/include/cutlass/version.h"
  out=$(AUTO_DEPS=0 make -n BUILD="$tmp/b1" CUTLASS_HOME="$tmp/cl" 2>&1)
  line=$(grep -- "-c fp4/gemm_cutlass.cu" <<<"$out")
  check "with headers: gemm_cutlass.cu gets FP4_HAVE_CUTLASS, NDEBUG and the include path" \
    'grep -q -- "-DFP4_HAVE_CUTLASS -DNDEBUG -I$tmp/cl/include --expt-relaxed-constexpr" <<<"$line"'
  line=$(grep -- "-c model/cuda/swiglu_epilogue.cu" <<<"$out")
  check "... and so does swiglu_epilogue.cu (the SwiGLU epilogue)" \
    'grep -q -- "-DFP4_HAVE_CUTLASS -DNDEBUG -I$tmp/cl/include --expt-relaxed-constexpr" <<<"$line"'
  check "... and no other file does" '[ "$(grep -c -- "-DFP4_HAVE_CUTLASS" <<<"$out")" -eq 2 ]'
  out=$(AUTO_DEPS=0 make -n BUILD="$tmp/b2" CUTLASS_HOME="$tmp/none" 2>&1)
  check "without: the stub is built and a note says why" \
    'grep -q -- "-c fp4/gemm_cutlass.cu" <<<"$out" && ! grep -q -- "-DFP4_HAVE_CUTLASS" <<<"$out" &&
     grep -q "note: no CUTLASS in $tmp/none/include" <<<"$out"'
else
  check "no CUDA backend here: deps.sh unpacks no CUTLASS" '[ ! -e "$tmp/tree/.deps/cutlass" ] && [ -z "$out" ]'
  out=$(AUTO_DEPS=0 make -n BUILD="$tmp/b1" 2>&1)
  check "... and make plans no gemm_cutlass object and says nothing of CUTLASS" \
    '! grep -q "gemm_cutlass" <<<"$out" && ! grep -q "CUTLASS" <<<"$out"'
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
