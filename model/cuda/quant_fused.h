// model/cuda/quant_fused.h: format-aware fusion (docs/formats.md §4). The ops that make an FP4 linear's input, RMSNorm
// and SwiGLU, run inside the MXFP4 dual producer (fp4/mx_dual.cuh) that quantizes that input: each BF16
// value is formed in registers exactly as rmsnorm.cu / swiglu.cu form it (rmsnorm_value, swiglu_value
// in ops_cuda.h) and goes straight into the Fprop row copy (RNE) and the Wgrad column copy (RNE, H32 or
// none); the BF16 tensor itself is never written or read back. The bytes equal rmsnorm / swiglu followed
// by mx_quantize_dual_cuda (gpu_test_fused).
//   rmsnorm: x [rows, K] BF16, rstd [rows] (rmsnorm_forward_cuda with out = NULL), w [K] fp32.
//   swiglu:  gate, up [rows, K] BF16.
// rows % 32 == 0, K % 32 == 0, pointers 16-byte aligned; row / col as mx_quantize_dual_cuda's (either
// may be skipped).
#pragma once
#include <cuda_bf16.h>

#include "fp4/mxfp4.h"

void mx_quantize_dual_rmsnorm_cuda(const __nv_bfloat16 *x, const float *rstd, const float *w, int rows, int K,
                                   MxScale mode, MxOut row, int hadamard, MxOut col);
void mx_quantize_dual_swiglu_cuda(const __nv_bfloat16 *gate, const __nv_bfloat16 *up, int rows, int K, MxScale mode,
                                  MxOut row, int hadamard, MxOut col);
