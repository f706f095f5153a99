// fp4/gemm_fp4.h: the three GEMM back ends of the FP4 linear layers (recipe.h's FP4GemmBackend).
//
// Row-major, everything TN (both operands contiguous along K, as cuBLASLt's FP8/FP4 kernels need):
//   out[M,N] = alpha * A[M,K] . B[N,K]^T + beta * out          out BF16 (out_fp32 = 0) or fp32
// The three uses in a linear layer (X [T,in] activations, W [out,in] weights, dY [T,out]):
//   Fprop  Y[T,out]   = X . W^T      A = X [T,in]      (VEC128)  B = W [out,in]   (BLK128x128)
//   Dgrad  dX[T,in]   = dY . W       A = dY [T,out]    (VEC128)  B = W^T [in,out] (BLK128x128, W's codes)
//   Wgrad  dW[out,in] = dY^T . X     A = dY^T [out,T]  (VEC128)  B = X^T [in,T]   (VEC128), blocks along T;
//          with Recipe.wgrad_2d one of the two in BLK128x128 instead (cuBLASLt runs VEC128 x VEC128 at
//          ~880 TFLOP/s, a BLK128x128 operand at ~1050-1250; docs/results_fp4.md)
// i.e. Fprop: (Y, X, W, M=T, N=out, K=in); Dgrad: (dX, dY, W^T, M=T, N=in, K=out); Wgrad: (dW, dY^T,
// X^T, M=out, N=in, K=T, out_fp32, beta = 1 to accumulate).
//
// Back ends:
//   fp4_gemm_fp8        Hopper: MXFP4 embedded in FP8 E4M3 with cuBLASLt block scales (fp8_embed.h),
//                       on the FP8 tensor cores. Either operand may be BLK128x128, not both (cuBLASLt
//                       has no 2D x 2D mode; our B is the operand it calls "A").
//   fp4_gemm_reference_*  any GPU: BF16 operands that equal the FP4 values up to a per-tensor factor
//                       (q * 2^e for MXFP4, q * e4m3(bs) for NVFP4), then gemm_bf16. Exact products,
//                       fp32 accumulation: the yardstick the fast paths are tested against.
//   fp4_gemm_native     Blackwell (cc >= 100): CUDA_R_4F_E2M1 operands with VEC16_UE4M3 scales.
//                       Compiled for sm_100a, UNTESTED on hardware (there is no Blackwell here).
//
// Constraints (checked, dying with a message that names the value): M % 4 == 0, N % 8 == 0 (every out
// row 16-byte aligned), K % 16 == 0 for FP8 (K % 32 for packed FP4); pointers 16-byte aligned. The
// reference path adds gemm_bf16's M, N, K % 8. Whether cuBLASLt takes a K that is not a multiple of
// 128 (a partial last 128-group) is asked with fp4_gemm_fp8_supported rather than assumed.
//
// All calls queue work on cuda_stream() without host syncs, except: the first call of a shape builds
// its plan (allocates, and with autotuning times candidates); scratch buffers grow on first use of
// a larger size.
// Autotuning follows gemm.h: on unless GEMM_AUTOTUNE=0 (then heuristic #0, the reproducible choice).
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "fp4/fp4_common.h"
#include "fp4/recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

// An MXFP4 operand in the Hopper FP8 embedding (fp8_embed.h): E4M3 bytes [rows, K] and float scales,
// VEC128 (scale[(k/128)*rows + r]) or BLK128x128 (scale[(r/128)*L4 + k/128]). The value of element
// (r, k) is e4m3 * scale; with scale_mul = 1 at embedding, alpha = mx_unit()^2 (1/36) gives the MXFP4
// product.
typedef struct {
  const uint8_t *e4m3;
  const float *scale;
  int blk128;
} Fp8Operand;

// A packed FP4 operand: codes [rows, K/2] (element k in the low nibble of byte k/2 when k is even),
// scales row-major [rows, K/32] E8M0 (MXFP4) or [rows, K/16] E4M3 (NVFP4). NVFP4's tensor scales go
// into the GEMM's alpha (nvfp4.h: nv_gemm_alpha / nvfp4_gemm_alpha_cuda).
typedef struct {
  const uint8_t *codes;
  const uint8_t *scales;
} Fp4Operand;

// ---- Hopper FP8 path.
void fp4_gemm_fp8(void *out, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K, float alpha, float beta);
// The same with beta's matrix read from src (same type and shape as out; src == out or NULL: out itself):
// out = alpha * A.B^T + beta * src, e.g. a residual stream added in the epilogue. In place, cuBLASLt rounds
// alpha * acc to out's type before adding beta * out in fp32 (docs/gemm_wgmma.md), so with beta = 1 this
// has exactly the bits of the GEMM into a temporary followed by the residual add src + tmp. With C apart
// from D its bits differ, so src is copied into out first (an extra pass: CUTLASS reads src in its epilogue).
void fp4_gemm_fp8_src(void *out, const void *src, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K,
                      float alpha, float beta);
// 1 if cuBLASLt offers an algorithm for this shape and scale-mode pair, else 0 (builds and caches the
// plan: it is the query to make before relying on an unusual shape, e.g. K % 128 != 0).
int fp4_gemm_fp8_supported(int out_fp32, int a_blk128, int b_blk128, int M, int N, int K);
// Benchmark (allocates, synchronizes): best TFLOP/s (2*M*N*K per call) of the heuristic's top
// candidates on random operands. Like gemm_ceiling_tflops: out_fp32 = 1 times the Wgrad form (fp32
// out, beta = 1: accumulating), 0 the Fprop/Dgrad form (BF16 out, beta = 0).
double fp4_gemm_fp8_tflops(int M, int N, int K, int a_blk128, int b_blk128, int out_fp32);

// Benchmark operands (allocates; queued on cuda_stream()): random E4M3 values in [-6, 6) (never NaN:
// tensor-core power, hence clocks, depends on the data) and unit scales; free with the twin.
Fp8Operand fp4_bench_operand(int rows, int K, int blk128, uint32_t seed);
void fp4_bench_operand_free(Fp8Operand o);

// ---- The FP8 embedding on the fastest kernel (fp4/gemm_fp8_select.cu): cuBLASLt's block-scaled GEMM
// or CUTLASS's (fp4/gemm_cutlass.h), per shape. FP8_KERNEL_TUNED times them on the shape's first call
// (its own operands, scratch copies of out) and keeps CUTLASS's only where the result has cuBLASLt's
// exact bits and it is faster, so the timing-dependent choice never changes a result; a build without
// CUTLASS (or a GPU other than cc 9.0) keeps cuBLASLt everywhere. CUBLASLT and CUTLASS force one.
// Returns the kernel that ran: 0 cuBLASLt, 2 CUTLASS's (1 was our own wgmma kernel, removed on
// 2026-12-05: docs/gemm_wgmma.md) (Fp8Kernel: fp4/recipe.h). The choices are kept per process (reset:
// the next call of a shape tunes again).
typedef struct {
  int key[7];                // out_fp32, A blk128, B blk128, M, N, K, beta != 0
  int kernel;                // 0: cuBLASLt; 2: CUTLASS's, configuration cutlass_cfg
  int cutlass_cfg;           // CUTLASS's fastest with cuBLASLt's bits (when ms_cutlass > 0)
  double ms_lt, ms_cutlass;  // per call at tuning (0: not timed)
  const char *why;           // why cuBLASLt was kept without a comparison, or NULL
  const char *why_cutlass;   // why CUTLASS's kernel was no candidate, or NULL
  long calls;
} Fp8Choice;
// src: beta's matrix, as fp4_gemm_fp8_src (NULL: out).
int fp4_gemm_fp8_on(Fp8Kernel kernel, void *out, const void *src, int out_fp32, Fp8Operand A, Fp8Operand B, int M,
                    int N, int K, float alpha, float beta);
int fp4_gemm_fp8_choice_count(void);
const Fp8Choice *fp4_gemm_fp8_choice_at(int i);
void fp4_gemm_fp8_choices_reset(void);
// The table of choices (nothing when there are none).
void fp4_gemm_fp8_choices_report(FILE *f);

// ---- Exact reference path (BF16 GEMM on dequantized operands).
// From the FP8 embedding: operand = bf16(e4m3 * scale). Exact when the scales are powers of two
// (scale_mul = 1, the engine's convention) and the values lie in BF16's range [2^-133, 2^128);
// otherwise (e.g. scale_mul = 1/6) each operand is rounded to BF16 once.
void fp4_gemm_reference_fp8(void *out, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K, float alpha,
                            float beta);
// From packed FP4: operands q * 2^e (MXFP4, exact; put mx_unit()^2 in alpha) or q * e4m3(bs) (NVFP4,
// exact; put nv_gemm_alpha in alpha). alpha_dev (may be NULL): a device float multiplied into alpha,
// e.g. nvfp4_gemm_alpha_cuda's output (the tensor amaxes stay on the device: then the BF16 GEMM runs
// here through cuBLASLt's device pointer mode, with the same fp32 accumulation, and no host sync).
void fp4_gemm_reference_packed(void *out, int out_fp32, FP4Format fmt, Fp4Operand A, Fp4Operand B, int M, int N, int K,
                               float alpha, float beta, const float *alpha_dev);

// CTA-local NVFP4 (nvfp4_cta.h): acc [M, N] fp32 = A~ B~^T on the unscaled operands (q * bs', exact
// in BF16): the BF16 reference GEMM, or with native = 1 Blackwell's FP4 GEMM (NVFP4 scales, alpha 1);
// then one epilogue pass out (+)= acc * (outer_a[i / 256] * outer_b[j / 256]) (BF16 RNE or fp32; with
// accumulate the sum is formed in fp32 before the rounding, as cuBLASLt's beta = 1). acc: a device
// workspace of M * N floats. K % 32 == 0.
void fp4_gemm_cta(void *out, int out_fp32, int native, Fp4Operand A, const float *outer_a, Fp4Operand B,
                  const float *outer_b, int M, int N, int K, int accumulate, float *acc);

// Dequantizers behind the reference path (device buffers, cuda_stream(); out is __nv_bfloat16*).
// fp8 [rows, K] with VEC128 or BLK128x128 scales -> bf16(e4m3 * scale). K % 16 == 0.
void fp4_dequant_fp8_bf16(const uint8_t *e4m3, const float *scale, int blk128, int rows, int K, void *out);
// packed MXFP4 -> q * 2^e exactly (0xFF scale: NaN). K % 32 == 0.
void fp4_dequant_mx_bf16(const uint8_t *codes, const uint8_t *e8m0, int rows, int K, void *out);

// ---- Blackwell native FP4 path (UNTESTED on hardware).
// 1 when the current device has cc >= 10.0 and the sm_100a code is in this build.
int fp4_gemm_native_available(void);
// fmt FMT_MXFP4: E8M0 scales are re-based into UE4M3 (exact for the 18 powers of two 2^-9..2^8): a
// kernel finds each operand's largest block exponent Emax, stores 2^(e - Emax + 8), and alpha takes
// 2^(Emax_A - 8) * 2^(Emax_B - 8) on the device; blocks more than 2^17 below the operand's largest
// become 0. Put mx_unit()^2 in alpha as on the other paths. fmt FMT_NVFP4: the E4M3 scales are used as they are. The
// effective alpha is alpha * (*alpha_dev if alpha_dev) * the MXFP4 re-basing, computed on the device (no sync). K % 32
// == 0.
void fp4_gemm_native(void *out, int out_fp32, FP4Format fmt, Fp4Operand A, Fp4Operand B, int M, int N, int K,
                     float alpha, float beta, const float *alpha_dev);

// The scale swizzle of the native path (cuBLAS docs 3.1.4.4.2, "1D block scaling factors layout"):
// scales of an operand with `rows` rows and n_cols 16-blocks along K go into 512-byte tiles of 128
// rows x 4 scale columns, tiles row-major over (r/128, c/4), inside a tile at (r%32)*16 + (r%128/32)*4
// + c%4 (fp4_swizzled_offset); padding rows/columns are written as 0.
//   from_e8m0 = 0: in = E4M3 bytes [rows, n_cols], copied.
//   from_e8m0 = 1: in = E8M0 bytes [rows, n_cols/2] (one per 32), each written to both of its
//                  16-blocks as UE4M3 2^(b - *max_b + 8) (0 below 2^-9, 0x7F for the NaN byte 0xFF),
//                  *max_b being the operand's largest E8M0 byte as fp4_scale_max_e8m0 writes it.
// Exposed for the GPU test, which checks them on any GPU.
size_t fp4_swizzled_scale_bytes(int rows, int n_cols);
static inline FP4_HD size_t fp4_swizzled_offset(int r, int c, int n_cols) {
  size_t tiles_per_row = (size_t)(n_cols + 3) / 4;
  return ((size_t)(r / 128) * tiles_per_row + (size_t)(c / 4)) * 512 + (size_t)(r % 32) * 16 +
         (size_t)((r % 128) / 32) * 4 + (size_t)(c % 4);
}
// *max_b = the largest E8M0 byte of e8m0[0..n) other than the NaN byte 0xFF (0 if none).
void fp4_scale_max_e8m0(const uint8_t *e8m0, size_t n, int *max_b);
void fp4_swizzle_scales(const uint8_t *in, int rows, int n_cols, int from_e8m0, const int *max_b, uint8_t *out);

// Frees plans, scratch buffers and the cuBLASLt handle.
void fp4_gemm_shutdown(void);

#ifdef __cplusplus
}
#endif
