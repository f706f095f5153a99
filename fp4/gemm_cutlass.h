// fp4/gemm_cutlass.h: the FP8-embedded MXFP4 GEMM on CUTLASS's Hopper blockwise-scaled FP8 kernel
// (fp4/gemm_cutlass.cu), the kernel beside cuBLASLt's block-scaled GEMM (fp4_gemm_fp8), with its
// operands and semantics (fp4/gemm_fp4.h, TN):
//   out[M,N] = alpha * sum_k A[m,k] sa B[n,k] sb + beta * out       out BF16 (out_fp32 = 0) or fp32
// CUTLASS promotes the FP8 MMAs' sums into fp32 once per 128 of K, as cuBLASLt does, and its
// epilogue here rounds alpha * acc to the out type before adding beta * out in fp32 (cuBLASLt's
// arithmetic, docs/gemm_wgmma.md): the same sums in the same order, so the same bits are expected; the
// tuner (fp4_gemm_fp8_on) keeps it only where they are, per shape (docs/gemm_cutlass.md).
//
// Built only when scripts/deps.sh found CUTLASS's headers (.deps/cutlass/include, CUTLASS_HOME) and
// only for sm_90a (the sm_100a pass compiles CUTLASS's stub); elsewhere every call says why not.
#pragma once

#include "fp4/gemm_fp4.h"

#ifdef __cplusplus
extern "C" {
#endif

// 1 when this build has the kernel and the current device is cc 9.0.
int fp4_gemm_cutlass_available(void);
// NULL if the kernel takes this GEMM with out in BF16 (out_fp32 0) or fp32 (1), else why not. It takes
// the scale pairs and outputs the FP4 linear uses by default: VEC128 A x BLK128x128 B into BF16
// (Fprop, Dgrad) and BLK128x128 A x VEC128 B into fp32 (Wgrad with wgrad_2d: dy); others go to
// cuBLASLt. Shapes: N % 8 (BF16) or N % 4 (fp32), K % 16, M % 4 for a VEC128 A and N % 4 for a
// VEC128 B (their scales come by TMA); 16-byte aligned pointers. Any K (a partial last 128-block reads
// zeros past K).
const char *fp4_gemm_cutlass_unsupported(int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K);
// Runs configuration cfg (0 .. fp4_gemm_cutlass_configs() - 1). Dies naming the reason when
// unsupported. Queued on cuda_stream(); no host sync, no allocation (the kernel needs no workspace:
// checked). src: beta's matrix (fp4_gemm_fp8_src; NULL: out).
void fp4_gemm_cutlass_cfg(void *out, const void *src, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K,
                          float alpha, float beta, int cfg);
// The number of configurations of the per-shape search (0 when the kernel is not built): the kernel
// (tile 128x128, cooperative, one-CTA cluster) with a raster order and a swizzle. *tuned (if not
// NULL): how many of them, the first ones, have run on hardware for this out type (BF16 or fp32) and
// may be chosen by the tuner (fp4_gemm_fp8_on): a training run is not where a kernel runs first.
int fp4_gemm_cutlass_configs(int out_fp32, int *tuned);
// "128x128c1/N4": tile, cluster (c1: one CTA), raster (M or N: the order the persistent CTAs walk
// tiles in) and swizzle.
const char *fp4_gemm_cutlass_cfg_name(int cfg);

#ifdef __cplusplus
}
#endif
