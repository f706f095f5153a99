#!/usr/bin/env bash
# What ptxas gives each CUTLASS kernel for sm_90a (docs/gemm_cutlass.md): registers per thread, spill,
# and the mainloop's pipeline stages (from the kernel's type), for fp4/gemm_cutlass.cu and
# model/cuda/swiglu_epilogue.cu, compiled here with the build's flags (no GPU needed; ~1.5 min on 2 cores).
#   bash scripts/dev/cutlass_resources.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
CUTLASS_HOME=${CUTLASS_HOME:-.deps/cutlass}
NVCC=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
[ -f "$CUTLASS_HOME/include/cutlass/cutlass.h" ] || { echo "cutlass_resources: no CUTLASS in $CUTLASS_HOME (scripts/deps.sh fetch)"; exit 1; }
echo "# cutlass_resources.sh, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $($NVCC --version | tail -n 1)"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for f in fp4/gemm_cutlass.cu model/cuda/swiglu_epilogue.cu; do
  "$NVCC" -O3 -std=c++17 -fmad=false -I. -Xcompiler -fopenmp -DHAVE_CUDA -gencode arch=compute_90a,code=sm_90a \
    -DFP4_HAVE_CUTLASS -DNDEBUG -I"$CUTLASS_HOME/include" --expt-relaxed-constexpr --resource-usage \
    -c "$f" -o "$tmp/o.o" >"$tmp/ptxas.txt" 2>&1
  python3 - "$f" "$tmp/ptxas.txt" <<'PY'
import re, sys
f, log = sys.argv[1], open(sys.argv[2]).read().splitlines()
name = None
for l in log:
    m = re.search(r"Compiling entry function '(\S+)' for 'sm_90a'", l)
    if m: name = m.group(1); continue
    m = re.search(r"(\d+) bytes spill stores", l)
    if m and name: spill = m.group(1); continue
    m = re.search(r"Used (\d+) registers", l)
    if m and name:
        stages = re.search(r"BlockwiseFP8ILi(\d+)", name)
        what = []
        if "Sm90SwigluMx" in name:
            col = re.search(r"Sm90SwigluMxILi\d+ELi(\d+)", name).group(1)
            what.append("SwiGLU epilogue, columns " + ("BLK128x128" if col == "3" else "VEC128"))
        else:
            what.append("fp32 out (Wgrad)" if "MulRnEfE" in name or "MulRnEff" in name else "BF16 out (Fprop, Dgrad)")
        print(f"{f}: {', '.join(what)}: {m.group(1)} registers, {spill} bytes spilled, "
              f"{stages.group(1) if stages else '?'} mainloop stages")
        name = None
PY
done
