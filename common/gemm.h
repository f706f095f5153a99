// common/gemm.h: BF16 GEMMs on the GPU through cuBLASLt, with a per-shape plan cache and autotuning.
//
// Row-major language throughout: every matrix is row-major and its leading dimension is its row
// length. out[M,N] = alpha * op(A) op(B) + beta * out, with op(A) [M,K] and op(B) [K,N]:
//   a_t = 0: A stored [M,K];  a_t = 1: A stored [K,M] (op(A) = A^T).
//   b_t = 0: B stored [K,N];  b_t = 1: B stored [N,K] (op(B) = B^T).
// A and B are BF16; out is BF16 (out_fp32 = 0) or fp32 (out_fp32 = 1); accumulation is fp32.
//
// The three uses of a linear layer (N tokens, W [out,in]):
//   forward  Y[N,out]  = X[N,in] W^T         gemm_bf16(Y,0,  X,0,  W,1, N,out,in, 1, 0)
//   dgrad    dX[N,in] (+)= dY[N,out] W        gemm_bf16(dX,0, dY,0, W,0, N,in,out, 1, acc ? 1 : 0)
//            or, with Wt = W^T [in,out] stored  gemm_bf16(dX,0, dY,0, Wt,1, N,in,out, 1, acc ? 1 : 0)
//            (the forward's layout, both operands contiguous along K: 15-20% faster on an H200;
//            the CUDA backend keeps such copies, see ops_cuda.h)
//   wgrad    dW[out,in] += dY^T X  (fp32)    gemm_bf16(dW,1, dY,1, X,0, out,in,N, 1, 1)
//
// Requirements (checked, with a message naming the offending value): M, N, K positive multiples of
// 8 and the three pointers 16-byte aligned, so every row starts 16-byte aligned as cuBLASLt's
// tensor-core kernels need. Work is queued on cuda_stream(); one host thread, one device.
//
// The first call of a shape (layout, out type, M, N, K, beta != 0, pointer alignment) builds its
// cuBLASLt descriptors, asks the heuristic for up to 8 algorithms, times each on the call's own
// buffers and keeps the fastest. That call allocates and synchronizes; later calls of the shape do
// neither. GEMM_AUTOTUNE=0 in the environment skips the timing and keeps heuristic #0, the
// reproducible choice (timing can pick different algorithms, hence different roundings, from run
// to run; a given algorithm is bit-reproducible).
#pragma once
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

void gemm_bf16(void *out, int out_fp32, const void *A, int a_t, const void *B, int b_t, int M, int N, int K,
               float alpha, float beta);

// Benchmark use only (allocates, synchronizes): the best rate in TFLOP/s (2*M*N*K flops per call)
// among the heuristic's top 8 algorithms at this shape, timed on freshly allocated random buffers,
// independently of the plan cache. beta is 1 when out_fp32 (the accumulating wgrad, the only fp32
// use), else 0.
double gemm_ceiling_tflops(int out_fp32, int a_t, int b_t, int M, int N, int K);

// One line per cached shape: calls so far, the algorithm kept, its measured rate and heuristic #0's.
void gemm_shape_report(FILE *f);

// Frees the plans, the workspace and the cuBLASLt handle (a later gemm_bf16 starts afresh).
void gemm_shutdown(void);

#ifdef __cplusplus
}
#endif
