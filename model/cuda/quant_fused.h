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
// SwiGLU's backward inside the dY producers of gate and up: dgate and dup (swiglu_backward_cuda's values,
// never written in BF16) computed from dout, gate and up [rows, K] in one read, each quantized as
// mx_quantize_dual_cuda would quantize it: its row copy (row_rnd, with its own stream s_gate / s_up) and
// its RNE column copy (H32 or none). The FP8 embedding only (the FP8 GEMM path's VEC128 rows, VEC128 or
// BLK128x128 columns, both pairs alike); returns 0 and does nothing for other outputs.
int mx_quantize_dual2_swiglu_bwd_cuda(const __nv_bfloat16 *dout, const __nv_bfloat16 *gate, const __nv_bfloat16 *up,
                                      int rows, int K, MxScale mode, MxRound row_rnd, int hadamard, PhiloxStream s_gate,
                                      MxOut row_gate, MxOut col_gate, PhiloxStream s_up, MxOut row_up, MxOut col_up);
