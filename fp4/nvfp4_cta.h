// fp4/nvfp4_cta.h: CTA-local NVFP4, the paper's third scale contract (docs/formats.md §5): E2M1 values
// with per-16 E4M3 block scales, and in place of NVFP4's one fp32 tensor scale, fp32 outer factors
// per 256-row stripe of each GEMM operand, fixed along K and applied once per output element after
// the whole accumulation:  C_ij = alpha_{i/256} beta_{j/256} sum_k (q bs)_A[i,k] (q bs)_B[j,k].
// The definitions follow the paper's released producers (MrHuff/mfu-fp4-training,
// fp4_runtime/TK_quantisation/nvfp4_CTA_local_v4, scale numerator 448; docs/formats.md §5 cites them).
//
// A producer CTA owns a 128 x 128 chunk c of the carrier (rows, and 128 of K) with amax a_c:
//   S_c   = 448 / a_c                        chunk encode scale (1 for an all-zero chunk; at most FLT_MAX)
//   sg_c  = a_c / 448                        chunk factor
// Activations and gradients (row copies; decode-centric, the rule of nvfp4.h with S_c for s_enc):
//   bs    = e4m3_rne(a_b / 6 * S_c)          block scale (a_b: the 16-block's amax; at most 74.7)
//   q     = E2M1(x * min(S_c / bs, FLT_MAX)) RNE, or SR for the dY copy Dgrad reads
// The outer factor of a stripe of 256 rows is the largest chunk factor over the stripe, across all of
// K:  alpha_i = max_c sg_c = (stripe amax) / 448. Each block's scale then carries its chunk's relative
// correction, folded in with a second E4M3 rounding (the codes stay as the chunk scale made them):
//   bs'   = e4m3_rne(fp32(bs) * (sg_c / alpha_i))        (sg_c / alpha_i = 0 where alpha_i = 0)
//   value = q * fp32(bs') * alpha_i                       (q * bs' is exact in BF16, as in NVFP4)
// Weights W [N, K] (2D16: one 16x16 tile per scale, shared by W and W^T, encode-centric):
//   mult  = e4m3_rne(min(6 / (a_t * S_c), FLT_MAX))      (448 for an all-zero tile)
//   q     = E2M1_RNE(w * fp32(mult) * S_c),  bs = e4m3_rne(1 / fp32(mult))
//   g     = max_c sg_c = amax(W) / 448       one common factor for both orientations
//   bs'   = e4m3_rne(fp32(bs) * (sg_c / g)), raised to 2^-9 (the smallest E4M3) where that rounds a
//           nonzero scale with a nonzero ratio to 0, so no tile of a weight vanishes
// The outer factors stay fp32: folding them into E4M3 made small gradient blocks underflow (the
// paper's first design). A non-finite element makes its block's scale the E4M3 NaN (0x7F) and its
// codes 0, as nvfp4.h does; chunk amaxes skip non-finite values.
//
// Layouts (as nvfp4.h): a row copy of x [rows, K] (K % 16 == 0) is codes [rows, K/2], scales
// [rows, K/16] and outer [cta_stripes(rows)]; a column copy (the Wgrad operands, rows % 16 == 0) is
// the row copy of x^T [K, rows], optionally rotated first by R16 along the tokens (fixed-sign or plain,
// fp4_rotate16), with its chunks and stripes taken in that transposed space (outer [cta_stripes(K)]);
// a weight is W (codes [N, K/2], scales [N, K/16], outer [cta_stripes(N)]) and W^T (codes [K, N/2],
// scales [K, N/16], outer [cta_stripes(K)]) with identical codes, every outer entry g.
// SR bits: Philox (philox.h), element index = row-major index in the tensor being rounded.
#pragma once
#include <stddef.h>

#include "fp4/nvfp4.h"

#define CTA_SCALE_NUM 448.0f  // the chunk encode scale's numerator (the released route's setting)
#define CTA_CHUNK 128         // a producer CTA's chunk: 128 rows x 128 of K
#define CTA_STRIPE 256        // rows per outer factor (the GEMM tile's rows)
#define CTA_E4M3_MIN 0x01u    // 2^-9, the floor of a weight's folded scale

static inline FP4_HD int cta_stripes(int rows) { return (rows + CTA_STRIPE - 1) / CTA_STRIPE; }

// S_c from the chunk amax (finite by construction: amaxes skip non-finite values).
static inline FP4_HD float cta_encode_scale(float a_c) {
  if (!(a_c > 0.0f) || !(a_c <= NV_FLT_MAX)) return 1.0f;
  float s = FP4_DIV(CTA_SCALE_NUM, a_c);
  return s <= NV_FLT_MAX ? s : NV_FLT_MAX;
}

static inline FP4_HD float cta_chunk_factor(float a_c) { return FP4_DIV(a_c, CTA_SCALE_NUM); }

// The chunk's correction inside its stripe: sg_c / outer, 0 where the stripe is all zeros.
static inline FP4_HD float cta_ratio(float sg_c, float outer) { return outer > 0.0f ? FP4_DIV(sg_c, outer) : 0.0f; }

// bs' of an activation or gradient block (a NaN scale stays NaN).
static inline FP4_HD uint8_t cta_fold(uint8_t bs, float ratio) {
  if (bs == NV_SCALE_NAN) return bs;
  return e4m3_encode_rne(FP4_MUL(e4m3_decode(bs), ratio));
}

// bs' of a weight tile: as cta_fold, with the 2^-9 floor.
static inline FP4_HD uint8_t cta_fold_weight(uint8_t bs, float ratio) {
  uint8_t f = cta_fold(bs, ratio);
  return f == 0 && bs != 0 && ratio > 0.0f ? (uint8_t)CTA_E4M3_MIN : f;
}

// A weight tile's encode multiplier byte from its amax bits and the chunk's S_c (NaN for a
// non-finite tile).
static inline FP4_HD uint8_t cta_weight_mult(uint32_t amax_bits, float s_c) {
  if (amax_bits >= NV_NONFINITE_BITS) return (uint8_t)NV_SCALE_NAN;
  if (amax_bits == 0) return 0x7Eu;  // 448
  float d = FP4_DIV(6.0f, FP4_MUL(fp4_u2f(amax_bits), s_c));
  return e4m3_encode_rne(d <= NV_FLT_MAX ? d : NV_FLT_MAX);
}

// The stored scale of a weight tile: e4m3(1 / mult) (NaN stays NaN; a zero multiplier, which
// 6 / (a_t S_c) >= 6 / 448 rules out, would give 448).
static inline FP4_HD uint8_t cta_weight_scale(uint8_t mult) {
  if (mult == NV_SCALE_NAN) return mult;
  return e4m3_encode_rne(FP4_DIV(1.0f, e4m3_decode(mult)));
}

// What a weight tile's elements are multiplied by before RNE: fp32(mult) * S_c (0 for a NaN tile).
static inline FP4_HD float cta_weight_coeff(uint8_t mult, float s_c) {
  if (mult == NV_SCALE_NAN) return 0.0f;
  return FP4_MUL(e4m3_decode(mult), s_c);
}

// The fp32 product of two outer factors, applied to an fp32 accumulator: acc * (alpha * beta).
static inline FP4_HD float cta_outer_product(float alpha, float beta) { return FP4_MUL(alpha, beta); }

#ifdef __cplusplus
extern "C" {
#endif

// CPU reference (fp32 inputs; the GPU producers read BF16: pass BF16 values as floats).
void nvfp4_cta_quantize_rows(const float *x, int rows, int K, NvRound rnd, PhiloxStream s, uint8_t *codes,
                             uint8_t *scales, float *outer);
// rot: FP4_ROT_NONE, FP4_ROT_H16 or FP4_ROT_H16_PLAIN (hadamard.h), along the rows (tokens).
void nvfp4_cta_quantize_cols(const float *x, int rows, int K, int rot, NvRound rnd, PhiloxStream s, uint8_t *codes,
                             uint8_t *scales, float *outer);
// Either (codes, scales, outer) triple may be NULL.
void nvfp4_cta_quantize_weight(const float *w, int N, int K, uint8_t *codes, uint8_t *scales, float *outer,
                               uint8_t *codes_t, uint8_t *scales_t, float *outer_t);
// out [rows, K] = q * fp32(bs') (exact; the GEMM operand before the outer factors), or times outer.
void nvfp4_cta_dequantize_unscaled(const uint8_t *codes, const uint8_t *scales, int rows, int K, float *out);
void nvfp4_cta_dequantize(const uint8_t *codes, const uint8_t *scales, const float *outer, int rows, int K, float *out);
// c [M, N] *= alpha[i / 256] * beta[j / 256]: the outer factors after a GEMM on unscaled operands.
void nvfp4_cta_apply_outer(float *c, int M, int N, const float *alpha, const float *beta);

#ifdef __cplusplus
}
#endif

// ---- CUDA (fp4/nvfp4_cta.cu). Device pointers; asynchronous on cuda_stream(), no host sync. The
// outputs are the CPU reference's bytes and factors (tests/gpu/gpu_test_fp4_cta.cu). scratch: device
// words for the chunk amaxes, nvfp4_cta_scratch_words(carrier rows, carrier row length) of them (a row
// copy's carrier is [rows, K], a column copy's [K, rows], a weight's [N, K]).
#ifdef __CUDACC__
#include <cuda_bf16.h>

size_t nvfp4_cta_scratch_words(int rows, int K);
void nvfp4_cta_quantize_rows_cuda(const __nv_bfloat16 *x, int rows, int K, NvRound rnd, PhiloxStream s, uint8_t *codes,
                                  uint8_t *scales, float *outer, uint32_t *scratch);
void nvfp4_cta_quantize_cols_cuda(const __nv_bfloat16 *x, int rows, int K, int rot, NvRound rnd, PhiloxStream s,
                                  uint8_t *codes, uint8_t *scales, float *outer, uint32_t *scratch);
// Passes (2) and the fold of (3) of a row copy of x [rows, K] whose codes, unfolded block scales (bs)
// and chunk amaxes (scratch, one word per 128 x 128 chunk, row-major) another producer wrote in one read
// of x (fp4/cta_mx_dual.h): the stripes' outer factors, then each scale folded in place. Touches the
// scales only.
void nvfp4_cta_rows_finish_cuda(const uint32_t *scratch, int rows, int K, uint8_t *scales, float *outer);
// outer (W's factors) is required; the W^T triple may be NULL.
void nvfp4_cta_quantize_weight_cuda(const float *w, int N, int K, uint8_t *codes, uint8_t *scales, float *outer,
                                    uint8_t *codes_t, uint8_t *scales_t, float *outer_t, uint32_t *scratch);
void nvfp4_cta_quantize_weight_bf16_cuda(const __nv_bfloat16 *w, int N, int K, uint8_t *codes, uint8_t *scales,
                                         float *outer, uint8_t *codes_t, uint8_t *scales_t, float *outer_t,
                                         uint32_t *scratch);
// The epilogue: out = acc [M, N] * (alpha[i / 256] * beta[j / 256]), to BF16 (RNE) or to fp32; with
// accumulate the product is added to out first (in fp32, then rounded); exactly one of out_bf16, out_f32.
void nvfp4_cta_apply_outer_cuda(const float *acc, int M, int N, const float *alpha, const float *beta,
                                __nv_bfloat16 *out_bf16, float *out_f32, int accumulate);
#endif
