// fp4/nvfp4.h: NVFP4 quantization (16-element blocks with an E4M3 scale each, plus one fp32 tensor
// scale), the TE-style recipe of docs/formats.md §1-2, bit-identical on CPU (nvfp4.c) and GPU (nvfp4.cu).
//
// Scales (amax = the tensor amax, a_b = the block amax):
//   s_enc = 6 * 448 / amax                       tensor encode scale (fp32, one division)
//   bs    = e4m3_rne(a_b / 6 * s_enc)            block scale byte (two roundings, in that order)
//   inv   = min(s_enc / fp32(bs), FLT_MAX)       per-block reciprocal (one division per block)
//   q     = E2M1(x * inv)                        element code, RNE or SR
//   value = q * fp32(bs) / s_enc                 (q * fp32(bs) is exact; then one division)
// q is docs/formats.md §1's E2M1(x / (fp32(bs) / s_enc)) computed, as Transformer Engine does, with a multiply
// by a per-block reciprocal instead of a correctly rounded division per element (which would add ~10
// instructions per element to producers that are already near their compute/bandwidth balance). The
// two differ only when x / (bs / s_enc) lies within an ulp or so of an E2M1 rounding threshold.
// Edge cases, all defined by the FP4_HD rules below and tested on both sides:
//   amax == 0 (an all-zero tensor), or amax not finite: s_enc = 1. amax so tiny that 2688 / amax
//     overflows: s_enc = FLT_MAX.
//   a_b / 6 * s_enc >= 448 (only when the amax handed in is smaller than the true one, e.g. stale):
//     bs saturates at 448 (0x7E) and the block's large elements at +-6.
//   bs == 0 (a block below 2^-10 of the E4M3 range relative to amax, e.g. all zeros): every code of
//     the block is 0 and the block dequantizes to 0.
//   NaN or +-Inf anywhere in a block: bs = 0x7F (E4M3 NaN) and every code 0, so the whole block
//     dequantizes to NaN and a GEMM on it yields NaN (the trainer's non-finite check sees it). The
//     tensor amax skips non-finite elements, so one bad value does not wipe the tensor's other
//     blocks. (MXFP4 treats Inf as a huge finite value instead; that would make NVFP4's s_enc 0.)
//
// Layouts (as mxfp4.h): X [rows, K] row-major, blocks along K (K % 16 == 0). Codes [rows, K/2]
// bytes, element 2i in the low nibble of byte i; scales [rows, K/16] E4M3 bytes. "Column" copies
// (for Wgrad) quantize down the columns of X [rows, K] (the token dimension, rows % 16 == 0) and are
// stored transposed: codes [K, rows/2], scales [K, rows/16], the K-contiguous layout of X^T that a
// TN GEMM consumes. Weights W [N, K] use 16x16 tiles (one scale per tile, from the tile amax); the
// producer writes W (codes [N, K/2], scales [N, K/16]) and W^T (codes [K, N/2], scales [K, N/16])
// with identical codes element for element; the tile scale is repeated in every row's 1x16 block
// scales, so all copies are ordinary 1x16-scaled tensors.
//
// Rounding: RNE or SR (gradients). SR bits come from Philox (philox.h layout); the element index is
// the row-major index in the tensor being rounded: [rows, K] for a row copy, the transposed
// [K, rows] for a column copy (give each copy its own tensor id in the PhiloxStream).
//
// Hadamard (column copies for Wgrad, rot = FP4_ROT_H16 or FP4_ROT_H16_PLAIN of hadamard.h; 0 or
// FP4_ROT_NONE: none): each 16-block down a column is first rotated by the fixed-sign R16 = (1/4) H16 D
// or the plain (1/4) H16; dY and X both get it, so (R dY)^T (R X) = dY^T X. The tensor amax is then
// the amax of the rotated values (nvfp4_amax_hadamard).
//
// GEMMs on Hopper (no FP4 tensor cores): an E2M1 value times an E4M3 scale has at most 6
// significant bits and lies in [2^-10, 2688], so q * fp32(bs) is exact in BF16. The BF16 GEMM runs on
// those "unscaled" operands (nvfp4_dequant_bf16_unscaled) and takes the tensor scales in alpha:
//   A_deq B_deq^T = alpha * (q_A bs_A)(q_B bs_B)^T,  alpha = 1 / (s_enc_A * s_enc_B)   (nvfp4_gemm_alpha).
#pragma once
#include <stddef.h>

#include "fp4/e2m1.h"
#include "fp4/philox.h"

typedef enum { NV_RNE = 0, NV_SR = 1 } NvRound;

#define NV_AMAX_SCALE 2688.0f  // 6 (E2M1 max) * 448 (E4M3 max)
#define NV_FLT_MAX 3.4028234663852886e38f
#define NV_SCALE_NAN 0x7Fu  // E4M3 NaN: the block scale of a block holding NaN or Inf
#define NV_NONFINITE_BITS 0x7f800000u

// |x| as raw bits; integer max over these is the amax (order-independent, so deterministic), and a
// result >= NV_NONFINITE_BITS means an Inf or NaN was seen.
static inline FP4_HD uint32_t nv_abs_bits(float x) { return fp4_f2u(x) & 0x7fffffffu; }

// The tensor encode scale s_enc from the tensor amax.
static inline FP4_HD float nv_encode_scale(float amax) {
  if (!(amax > 0.0f) || !(amax <= NV_FLT_MAX)) return 1.0f;  // all-zero tensor, NaN or Inf amax
  float s = FP4_DIV(NV_AMAX_SCALE, amax);
  return s <= NV_FLT_MAX ? s : NV_FLT_MAX;
}

// The E4M3 block scale byte from the bits of the block amax (nv_abs_bits max over the block).
static inline FP4_HD uint8_t nv_block_scale(uint32_t amax_bits, float s_enc) {
  if (amax_bits >= NV_NONFINITE_BITS) return (uint8_t)NV_SCALE_NAN;
  return e4m3_encode_rne(FP4_MUL(FP4_DIV(fp4_u2f(amax_bits), 6.0f), s_enc));  // saturates at 448
}

// What a block's elements are multiplied by before E2M1 rounding: s_enc / fp32(bs), clamped to
// FLT_MAX (a tiny tensor amax with a tiny block scale would overflow it, and x * Inf would turn 0
// into a NaN whose sign bit differs between x86 and CUDA). 0 stands for "every code of this block
// is 0" (a zero or NaN block scale).
static inline FP4_HD float nv_elem_inv(uint8_t bs, float s_enc) {
  if (bs == 0 || bs == NV_SCALE_NAN) return 0.0f;
  float inv = FP4_DIV(s_enc, e4m3_decode(bs));
  return inv < NV_FLT_MAX ? inv : NV_FLT_MAX;
}

// One element's code. r8: its 8 SR bits (philox_byte), ignored for RNE. |x| * inv (finite x, 0 < inv <=
// FLT_MAX: never NaN, +-Inf saturates to +-6) is the same rounding as x * inv up to the sign, which
// comes from x; the magnitude code is e2m1.h's bit-level rule.
static inline FP4_HD uint8_t nv_encode(float x, float inv, int sr, uint32_t r8) {
  if (inv == 0.0f) return 0;
  uint32_t a = fp4_f2u(FP4_MUL(fabsf(x), inv));
  return (uint8_t)(e2m1_sign(x) | (sr ? e2m1_sr_mag(a, r8 & 0xffu) : e2m1_rne_mag(a)));
}

// q * fp32(bs), the operand of the Hopper BF16 GEMM: exact in fp32 and in BF16. NaN scale -> NaN.
static inline FP4_HD float nv_decode_unscaled(uint8_t code, uint8_t bs) {
  if ((bs & 0x7Fu) == 0x7Fu) return fp4_u2f(0x7fc00000u);
  return FP4_MUL(e2m1_decode(code), e4m3_decode(bs));
}

// The same as BF16 bits: the value is exact in BF16 (low 16 fp32 bits zero), so this is a truncation
// that loses nothing; the NaN is the canonical 0x7FC0.
static inline FP4_HD uint16_t nv_decode_unscaled_bf16(uint8_t code, uint8_t bs) {
  return (uint16_t)(fp4_f2u(nv_decode_unscaled(code, bs)) >> 16);
}

// The full dequantized value q * fp32(bs) / s_enc.
static inline FP4_HD float nv_decode(uint8_t code, uint8_t bs, float s_enc) {
  return FP4_DIV(nv_decode_unscaled(code, bs), s_enc);
}

// alpha of a GEMM on unscaled operands: 1 / (s_enc_a * s_enc_b), as (1/s_enc_a) * (1/s_enc_b) so it
// cannot overflow (one rounding more than the exact product; the fp32 accumulator rounds anyway).
static inline FP4_HD float nv_gemm_alpha(float amax_a, float amax_b) {
  return FP4_MUL(FP4_DIV(1.0f, nv_encode_scale(amax_a)), FP4_DIV(1.0f, nv_encode_scale(amax_b)));
}

// Quantizes one 16-block v[0..15] (fp32) with tensor scale s_enc. rnd: 4 Philox words (byte i for
// element i), used only when sr. Writes 16 codes (one per byte) and returns the block scale byte.
static inline FP4_HD uint8_t nv_quantize_block16(const float *v, float s_enc, int sr, const uint32_t *rnd,
                                                 uint8_t *codes) {
  uint32_t am = 0;
  FP4_UNROLL
  for (int i = 0; i < 16; i++) am = am > nv_abs_bits(v[i]) ? am : nv_abs_bits(v[i]);
  uint8_t bs = nv_block_scale(am, s_enc);
  float inv = nv_elem_inv(bs, s_enc);
  if (inv == 0.0f) {  // zero or NaN block scale: all codes 0 (nv_encode's first case, hoisted)
    FP4_UNROLL
    for (int i = 0; i < 16; i++) codes[i] = 0;
    return bs;
  }
  FP4_UNROLL
  for (int i = 0; i < 16; i++) codes[i] = nv_encode(v[i], inv, sr, sr ? philox_byte(rnd, (uint32_t)i) : 0u);
  return bs;
}

#ifdef __cplusplus
extern "C" {
#endif

// CPU reference. Inputs are fp32 (the GPU producers read BF16: pass the BF16 values as floats).
// amax arguments are tensor amaxes as from nvfp4_amax / nvfp4_amax_hadamard (any value is allowed:
// see the edge cases above). s is used only for NV_SR.

// Max |x| over the finite elements of x[0..n) (0 when there are none).
float nvfp4_amax(const float *x, size_t n);
// Max |R x| over the finite values, R (rot: FP4_ROT_H16 or FP4_ROT_H16_PLAIN) applied to each 16-block
// down each column of x [rows, K] (rows % 16 == 0).
float nvfp4_amax_hadamard(const float *x, int rows, int K, int rot);
// Row copy of x [rows, K]: codes [rows, K/2], scales [rows, K/16].
void nvfp4_quantize_rows(const float *x, int rows, int K, float amax, NvRound rnd, PhiloxStream s, uint8_t *codes,
                         uint8_t *scales);
// Column copy of x [rows, K] (rows % 16 == 0, any K > 0), rotated first by rot (FP4_ROT_*):
// codes [K, rows/2], scales [K, rows/16].
void nvfp4_quantize_cols(const float *x, int rows, int K, int rot, float amax, NvRound rnd, PhiloxStream s,
                         uint8_t *codes, uint8_t *scales);
// Weights W [N, K] (N, K multiples of 16), 16x16 tiles, RNE: W and W^T; either pair may be NULL.
void nvfp4_quantize_weight(const float *w, int N, int K, float amax, uint8_t *codes, uint8_t *scales, uint8_t *codes_t,
                           uint8_t *scales_t);
// The 16x16 tile of W [N, K] at (n0, k0): its amax bits (every element, NaN and Inf included), and the
// writing of its 256 codes c (row-major in the tile) and scale byte bs into W's rows and W^T's rows
// (either pair NULL) as nvfp4_quantize_weight lays them out. Shared with the CTA-local weights.
uint32_t nvfp4_tile_amax_bits(const float *w, int K, int n0, int k0);
void nvfp4_put_tile(const uint8_t *c, uint8_t bs, int N, int K, int n0, int k0, uint8_t *codes, uint8_t *scales,
                    uint8_t *codes_t, uint8_t *scales_t);
// out [rows, K] = nv_decode of every element (the NVFP4 value).
void nvfp4_dequantize(const uint8_t *codes, const uint8_t *scales, int rows, int K, float amax, float *out);
// out [rows, K] = BF16 bits of q * fp32(bs) (nv_decode_unscaled_bf16).
void nvfp4_dequantize_unscaled_bf16(const uint8_t *codes, const uint8_t *scales, int rows, int K, uint16_t *out);

#ifdef __cplusplus
}
#endif

// ---- CUDA (fp4/nvfp4.cu). Device pointers; every call is asynchronous on cuda_stream(), with no host
// sync. The tensor amax stays on the device: an amax kernel writes it (a float, reduced with an
// integer atomicMax over |x| bits, so the result is deterministic), and the quantizers read it.
// Outputs are bit-identical to the CPU reference above.
#ifdef __CUDACC__
#include <cuda_bf16.h>

// *amax = max |x| over finite elements (the kernel zeroes *amax first).
void nvfp4_amax_cuda(float *amax, const __nv_bfloat16 *x, size_t n);
void nvfp4_amax_f32_cuda(float *amax, const float *x, size_t n);
// *amax = the amax of R (rot) applied down the columns of x [rows, K] (rows % 16 == 0).
void nvfp4_amax_hadamard_cuda(float *amax, const __nv_bfloat16 *x, int rows, int K, int rot);

// Row copy (as nvfp4_quantize_rows). K % 16 == 0.
void nvfp4_quantize_rows_cuda(const __nv_bfloat16 *x, int rows, int K, const float *amax, NvRound rnd, PhiloxStream s,
                              uint8_t *codes, uint8_t *scales);
// Column copy rotated by rot (as nvfp4_quantize_cols): the Wgrad producer. rows % 16 == 0, any K.
void nvfp4_quantize_cols_cuda(const __nv_bfloat16 *x, int rows, int K, int rot, const float *amax, NvRound rnd,
                              PhiloxStream s, uint8_t *codes, uint8_t *scales);
// Weights (as nvfp4_quantize_weight), from the fp32 master or a BF16 copy; either output pair may be NULL.
void nvfp4_quantize_weight_cuda(const float *w, int N, int K, const float *amax, uint8_t *codes, uint8_t *scales,
                                uint8_t *codes_t, uint8_t *scales_t);
void nvfp4_quantize_weight_bf16_cuda(const __nv_bfloat16 *w, int N, int K, const float *amax, uint8_t *codes,
                                     uint8_t *scales, uint8_t *codes_t, uint8_t *scales_t);

// out [rows, K] BF16 = q * fp32(bs), exactly (as nvfp4_dequantize_unscaled_bf16). K % 16 == 0.
void nvfp4_dequant_bf16_unscaled(const uint8_t *codes, const uint8_t *scales, int rows, int K, __nv_bfloat16 *out);
// *alpha = nv_gemm_alpha(*amax_a, *amax_b), on the device (for cuBLASLt's device pointer mode).
void nvfp4_gemm_alpha_cuda(float *alpha, const float *amax_a, const float *amax_b);
#endif
