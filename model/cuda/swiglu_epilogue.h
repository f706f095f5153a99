// model/cuda/swiglu_epilogue.h: SwiGLU and the MXFP4 producers of the down projection's input inside the up
// projection's GEMM epilogue (issue 30 point 3; docs/gemm_cutlass.md "Fusions at the GEMM's boundary").
//
// One CUTLASS kernel (fp4/gemm_cutlass.cuh's blockwise FP8 GEMM, 128 x 128 tiles) computes
//   up = bf16(alpha * A . B^T)                      written to `up` as fp4_gemm_cutlass_cfg writes it,
//   h  = bf16(silu(gate) * up)                      per element, swiglu_value's bits, never written,
// and, per 128 x 128 tile of h in shared memory, runs the dual producer of fp4/mx_dual.cuh on it: h's
// row copy (down's Fprop operand, RNE, FP8 with VEC128 scales) and its column copy (down's Wgrad operand,
// RNE, H32 or none, VEC128 or BLK128x128), the bytes mx_quantize_dual_swiglu_cuda writes from gate and
// up (gpu_test_swiglu_epilogue checks them). It saves that producer's read of up (gate it still reads) and a launch.
//   A [M, K] (x, VEC128 scales), B [N, K] (W_up, BLK128x128 scales), gate and up [M, N] BF16;
//   M, N multiples of 128 (whole tiles: the producer's 128-column groups); row: FP8 (VEC128), col: FP8.
#pragma once
#include <cuda_bf16.h>

#include "fp4/gemm_fp4.h"
#include "fp4/mxfp4.h"

#ifdef __cplusplus
extern "C" {
#endif

// NULL where the kernel runs these arguments, else why not (no CUTLASS, not Hopper, shapes, outputs).
const char *swiglu_epilogue_unsupported(Fp8Operand A, Fp8Operand B, int M, int N, int K, MxOut row, MxOut col);
// The tiles run along M with swizzle 1 (fp4/gemm_cutlass.cu's first configuration); along N with swizzle 4
// the BLK128x128 column scales came out wrong at 384 x 1024 x 512 on an H100 (2026-12-05, 2 of 125 checks),
// so that configuration is not offered. The epilogue's threads read gate from global memory per subtile.
void up_gemm_swiglu_mx_cuda(__nv_bfloat16 *up, const __nv_bfloat16 *gate, Fp8Operand A, Fp8Operand B, int M, int N,
                            int K, float alpha, MxScale mode, MxOut row, int hadamard, MxOut col);

#ifdef __cplusplus
}
#endif
