// fp4/gemm_cutlass.cu: fp4/gemm_cutlass.h's GEMM, an instantiation of CUTLASS's Hopper FP8 GEMM
// with blockwise scaling (the collective of its example 67: TMA-fed, warp-specialized, persistent;
// per 128-deep K block the wgmma sums go to a block accumulator that is promoted into the fp32 result
// as acc += block * (sa * sb)), on our operands as they are:
// - A [M,K] and B [N,K] E4M3, K contiguous (CUTLASS's RowMajor A, ColumnMajor B);
// - VEC128 scales scale[(k/128) * rows + r]: granularity 1 along the rows, 128 along K, rows
//   contiguous (CUTLASS's "MN-major" scale layout, stride rows);
// - BLK128x128 scales scale[(r/128) * L4 + k/128]: granularity 128 x 128, K contiguous ("K-major"),
//   the row-block stride L4 = mx_blk128_l4(K) (ceil(K/128) padded to 4) given to the layout by hand,
//   as CUTLASS's own helper would take ceil(K/128);
// - the epilogue is our tree of CUTLASS's epilogue nodes: alpha * acc rounded to the out type, then
//   + beta * out in fp32 and rounded again (cuBLASLt's arithmetic, found on the H200: docs/gemm_wgmma.md);
//   with beta == 0 out is not read (CUTLASS's beta * C node skips the load then).
// The tile scheduler is CUTLASS's persistent one (every output tile by one CTA over all of K: no
// split-K, no stream-K, no atomics), so the reduction order is fixed and results are bit-identical run
// to run. The promotion is an explicit fused multiply-add (below, replacing CUTLASS's accumulator
// helper), as in our former own kernel (docs/gemm_wgmma.md).
//
// The kernels are Hopper-only: CUTLASS compiles their bodies for sm_90a and a stub for other targets
// (its ENABLE_SM90_KERNEL_LEVEL guard), and fp4_gemm_cutlass_available() asks for a cc 9.0 device.
// Without CUTLASS's headers (FP4_HAVE_CUTLASS unset: scripts/deps.sh did not find them) the file is
// the stub alone.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "fp4/gemm_cutlass.h"

#ifdef FP4_HAVE_CUTLASS
#include "fp4/gemm_cutlass.cuh"

namespace {
using namespace fp4_cutlass;

// The kernel (fp4/gemm_cutlass.cuh's), for the two scale-pair/out combinations the linear uses: BF16 out
// with a VEC128 A and a BLK128x128 B (Fprop, Dgrad), and fp32 out with a BLK128x128 A and a VEC128 B
// (Wgrad), which runs transposed, out^T = B . A^T into a column-major out^T (the same bytes as out
// row-major), so that its VEC128 scales fall on the accumulator's rows as in Fprop: the kernel built for
// that pair directly, one scale per accumulator column, ran at 0.74-0.75x cuBLASLt on an H100, this one
// at 0.81-0.84x (docs/gemm_cutlass.md). Each product a b is the same either way round and so is the
// promotion's sa sb, so the bits stay cuBLASLt's (gpu_test_fp4_gemm on an H100); the tuner still checks
// them on every shape before it takes a configuration. (Two-CTA clusters along M or N and
// the ping-pong schedule with 64-row tiles won no shape of an 8B block against cuBLASLt on an H100:
// removed on 2026-12-05.)
void run_pair(void *out, const void *src, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K, float alpha,
              float beta, int raster, int swizzle) {
  using ColMajor = cutlass::layout::ColumnMajor;
  if (out_fp32)
    run<Kernel<float, EpilogueTree<float>, float, ColMajor>>(out, src, B, A, N, M, K, alpha, beta, raster, swizzle);
  else run<Kernel<cutlass::bfloat16_t>>(out, src, A, B, M, N, K, alpha, beta, raster, swizzle);
}

struct Cfg {
  int raster, swizzle;  // raster 0: along M, 1: along N
  const char *name;
};
// The search space: both raster orders and a swizzle of 1 or 4 tiles (CUTLASS's tile scheduler groups
// the raster into strips of that many tiles for L2 reuse).
const Cfg CFGS[] = {
    {0, 1, "128x128c1/M1"},
    {1, 1, "128x128c1/N1"},
    {0, 4, "128x128c1/M4"},
    {1, 4, "128x128c1/N4"},
};
constexpr int NCFG = sizeof CFGS / sizeof CFGS[0];
// The first TUNED_* of them have run on hardware and may be chosen by the tuner, per out type: all four
// of each, with cuBLASLt's bits on every shape of tests/gpu/gpu_test_fp4_gemm.cu on an H100 (BF16
// 2026-12-05 at 1426fc8; fp32, the transposed Wgrad of run_pair, at 0ec0a68). The tuner still keeps one
// only where its result has cuBLASLt's bits on that very call, and only where it is faster (on the H100:
// nowhere, docs/gemm_cutlass.md). FP4_CUTLASS_TUNED=N in the environment overrides both counts (0:
// cuBLASLt everywhere).
constexpr int TUNED_BF16 = 4, TUNED_F32 = 4;
int tuned_count(int out_fp32) {
  const char *e = getenv("FP4_CUTLASS_TUNED");
  const int t = e ? atoi(e) : out_fp32 ? TUNED_F32 : TUNED_BF16;
  return t < 0 ? 0 : t > NCFG ? NCFG : t;
}

}  // namespace
#endif  // FP4_HAVE_CUTLASS

extern "C" int fp4_gemm_cutlass_available(void) {
#ifdef FP4_HAVE_CUTLASS
  static int avail = -1;
  if (avail < 0) avail = cuda_device_cc() == 90;
  return avail;
#else
  return 0;
#endif
}

extern "C" const char *fp4_gemm_cutlass_unsupported(int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K) {
#ifndef FP4_HAVE_CUTLASS
  return "this build has no CUTLASS (scripts/deps.sh found no headers: .deps/cutlass/include or CUTLASS_HOME)";
#endif
  if (!fp4_gemm_cutlass_available()) return "needs an sm_90 GPU (Hopper) and this build's sm_90a code";
  if (!out_fp32 && (A.blk128 || !B.blk128)) return "BF16 out is built for VEC128 A x BLK128x128 B only";
  if (out_fp32 && (!A.blk128 || B.blk128)) return "fp32 out is built for BLK128x128 A x VEC128 B only";
  if (M <= 0 || N <= 0 || K <= 0 || K % 16) return "needs K % 16 == 0 (TMA row strides)";
  if (N % (out_fp32 ? 4 : 8)) return "needs out rows of whole 16 bytes (N % 8 in BF16, N % 4 in fp32)";
  if (!A.blk128 && M % 4) return "a VEC128 A needs M % 4 == 0 (its scales come by TMA)";
  if (!B.blk128 && N % 4) return "a VEC128 B needs N % 4 == 0 (its scales come by TMA)";
  if (((uintptr_t)A.e4m3 | (uintptr_t)B.e4m3 | (uintptr_t)A.scale | (uintptr_t)B.scale) % 16)
    return "operands and scales must be 16-byte aligned";
  return NULL;
}

extern "C" int fp4_gemm_cutlass_configs(int out_fp32, int *tuned) {
#ifdef FP4_HAVE_CUTLASS
  if (tuned) *tuned = tuned_count(out_fp32);
  return NCFG;
#else
  (void)out_fp32;
  if (tuned) *tuned = 0;
  return 0;
#endif
}

extern "C" const char *fp4_gemm_cutlass_cfg_name(int cfg) {
#ifdef FP4_HAVE_CUTLASS
  if (cfg >= 0 && cfg < NCFG) return CFGS[cfg].name;
#endif
  return "none";
}

extern "C" void fp4_gemm_cutlass_cfg(void *out, const void *src, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N,
                                     int K, float alpha, float beta, int cfg) {
  const char *why = fp4_gemm_cutlass_unsupported(out_fp32, A, B, M, N, K);
  if (why) die("fp4_gemm_cutlass: M=%d, N=%d, K=%d: %s", M, N, K, why);
  if (((uintptr_t)out | (uintptr_t)src) % 16) die("fp4_gemm_cutlass: out and src must be 16-byte aligned");
#ifdef FP4_HAVE_CUTLASS
  if (cfg < 0 || cfg >= NCFG) die("fp4_gemm_cutlass: configuration %d is not one of the %d this build has", cfg, NCFG);
  const Cfg c = CFGS[cfg];
  run_pair(out, src, out_fp32, A, B, M, N, K, alpha, beta, c.raster, c.swizzle);
#endif
}
