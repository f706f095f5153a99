// fp4/mxfp4.h: MXFP4 quantization (OCP MX: 32-element blocks, one E8M0 scale each).
//
// Scale conventions (MxScale):
//   MX_SCALE_UP   the paper's encode-centric scale: e = ceil(log2 amax), q = E2M1(6 z / 2^e) of the
//                 exact quotient (mx_prescale), value = q * 2^e / 6. Nothing clips; the 1/6 per operand
//                 (1/36 per product) belongs in the GEMM's alpha (mx_unit() = 1/6).
//   MX_SCALE_DOWN OCP: e = floor(log2 amax) - 2, q = E2M1(z / 2^e) (values above 6 * 2^e clip),
//                 value = q * 2^e (mx_unit() = 1).
// e is clamped to the E8M0 range [-127, 127]; an all-zero block gets e = -127 and zero codes.
// Weights: 2D 32x32 tiles share one scale; with the 0.87 rule (MX_SCALE_UP only) the tile uses
// 2^(e-1) instead of 2^e when amax_T / 2^e < 0.87 (trading clipping of the largest values for
// resolution). W and W^T come out of one producer with identical codes.
//
// Rounding of elements (MxRound): RNE, or SR with Philox bits (philox.h layout; element index =
// row-major index in the [rows, K] input). Scales are never stochastically rounded.
//
// Special values: a block (or weight tile) holding a NaN gets scale byte 0xFF (E8M0 NaN: every element
// of the block decodes to NaN) and all-zero codes. +-Inf is treated as a huge finite value: the
// scale saturates at 2^127 and the Inf element at +-6 (its finite neighbours keep their codes).
//
// Layout: X [rows, K] row-major, blocks along K (K % 32 == 0). Packed codes [rows, K/2] bytes, element
// k in the low nibble of byte k/2 when k is even, the high nibble when odd; scales [rows, K/32] E8M0.
// "Column" copies (for Wgrad) quantize along rows instead and are stored transposed: [K, rows/2]
// codes and [K, rows/32] scales, i.e. the K-contiguous layout of X^T that a TN GEMM consumes.
#pragma once
#include <stddef.h>

#include "fp4/e2m1.h"
#include "fp4/philox.h"

typedef enum { MX_SCALE_UP = 0, MX_SCALE_DOWN = 1 } MxScale;
typedef enum { MX_RNE = 0, MX_SR = 1 } MxRound;

#define MX_RULE_087 0.87f

static inline FP4_HD float mx_unit(MxScale mode) { return mode == MX_SCALE_UP ? 1.0f / 6.0f : 1.0f; }

// Scale exponent of a block from the bits of its amax (amax >= 0, not NaN; Inf -> 127).
static inline FP4_HD int mx_scale_exp(float amax, MxScale mode) {
  if (!(amax > 0.0f)) return -127;
  if (amax > 3.4028234663852886e38f) return 127;
  int e = mode == MX_SCALE_UP ? fp4_ceil_log2(amax) : fp4_floor_log2(amax) - 2;
  return fp4_imin(fp4_imax(e, -127), 127);
}

// The weight-tile exponent: mx_scale_exp plus the 0.87 rule.
static inline FP4_HD int mx_weight_exp(float amax, MxScale mode, int rule087) {
  int e = mx_scale_exp(amax, mode);
  if (mode == MX_SCALE_UP && rule087 && e > -127 && fp4_ldexp(amax, -e) < MX_RULE_087) e -= 1;
  return e;
}

// |x| as raw bits: integer max over these is the amax, and a result > 0x7f800000 means a NaN was seen.
static inline FP4_HD uint32_t mx_abs_bits(float x) { return fp4_f2u(x) & 0x7fffffffu; }
#define MX_NAN_BITS 0x7f800000u

// The value handed to the E2M1 rounding: 6 z / 2^e (UP) or z / 2^e (DOWN), -e in [-127, 127], as a
// float that the E2M1 rules (e2m1.h) round exactly as they would round the exact quotient, so that
// q = Q_E2M1(6 z / s_b) (docs/formats.md §1) for float z, not only for BF16 z.
//   t = z 2^-e is exact (a power-of-two scaling) unless subnormal, and then |6 t| < 6 * 2^-126 gives
//   code 0 under every rule, as the exact value does. DOWN returns t.
//   UP: 6 t needs up to 26 significant bits. Rounded to nearest it can land on a threshold that the
//   exact value does not reach (z = 0x3d955555, e = -2: 6 t = 1.74999994 rounds to the tie 1.75, code 4
//   instead of 3). So 6 t is rounded to odd: an inexact product becomes whichever of its two float
//   neighbours has an odd last bit (the error fma(t, 6, -p) is exact, its sign says which side). Every
//   threshold the rules compare with (RNE's 0.25 .. 5, SR's lo + (2 r + 1) / 512 of a step, the grid
//   points) has at most 12 significant bits, so it is never that odd float, and every comparison with
//   it comes out as for the exact 6 t. For BF16 z (8 bits) 6 t is exact: the product itself.
static inline FP4_HD float mx_prescale(float z, int e, MxScale mode) {
  const float t = fp4_ldexp(z, -e);
  if (mode == MX_SCALE_DOWN) return t;
  const float p = FP4_MUL(t, 6.0f), err = fp4_fma(t, 6.0f, -p);
  const uint32_t u = fp4_f2u(p);
  if (err == 0.0f || (u & 1u) || (u & 0x7fffffffu) >= 0x7f800000u) return p;  // exact, odd, or Inf/NaN
  // else the neighbour toward 6 t, in magnitude: up where the error has p's sign
  return fp4_u2f((err > 0.0f) == (p > 0.0f) ? u + 1u : u - 1u);
}

// Quantizes one 32-block v[0..31] (fp32). rnd: 8 Philox words (bytes 0..31 = elements 0..31), used
// only when sr. Writes the 32 codes packed as 4 little-endian words (code i at bits 4*(i%8) of word
// i/8, i.e. the packed byte layout) and returns the E8M0 byte (0xFF for a NaN block, codes then 0).
// Per element: mx_prescale of |z| (rounding is sign-symmetric), the magnitude code from its bits
// (e2m1.h), the sign bit of z, and an add into the packed word (the nibbles do not overlap, so + is |).
static inline FP4_HD uint8_t mx_quantize_block32(const float *v, MxScale mode, int sr, const uint32_t *rnd,
                                                 uint32_t *pk) {
  uint32_t am = 0;
  FP4_UNROLL
  for (int i = 0; i < 32; i++) am = am > mx_abs_bits(v[i]) ? am : mx_abs_bits(v[i]);
  FP4_UNROLL
  for (int w = 0; w < 4; w++) pk[w] = 0;
  if (am > MX_NAN_BITS) return 0xFF;
  int e = mx_scale_exp(fp4_u2f(am), mode);
  FP4_UNROLL
  for (int i = 0; i < 32; i++) {
    uint32_t a = fp4_f2u(mx_prescale(fabsf(v[i]), e, mode));
    uint32_t m = sr ? e2m1_sr_mag(a, (rnd[i >> 2] >> (8 * (i & 3))) & 0xffu) : e2m1_rne_mag(a);
    pk[i >> 3] += (e2m1_sign(v[i]) | m) << (4 * (i & 7));
  }
  return e8m0_encode(e);
}

static inline FP4_HD uint8_t mx_code_of(const uint32_t *pk, int i) {
  return (uint8_t)((pk[i >> 3] >> (4 * (i & 7))) & 15u);
}

// Dequantized value of a code under scale byte b: q * 2^e (MX_SCALE_DOWN), or q * 2^e / 6 rounded once
// (MX_SCALE_UP), formed as (q * 2^(e-2)) / 1.5: q * 2^(e-2) is exact for every code and e in [-127, 127]
// (2 significant bits, between 2^-130 and 1.5 * 2^127), where q * 2^e overflows for e = 126, 127 (a
// valid -6.107e37 quantizes to code 0xE at e = 126 and decodes to -4 * 2^126 / 6 = -5.67e37, not -Inf).
static inline FP4_HD float mx_decode(uint8_t code, uint8_t b, MxScale mode) {
  if (b == 0xFF) return fp4_u2f(0x7fc00000u);
  const int e = (int)b - 127;
  if (mode == MX_SCALE_UP) return FP4_DIV(fp4_ldexp(e2m1_decode(code), e - 2), 1.5f);
  return fp4_ldexp(e2m1_decode(code), e);
}

#ifdef __cplusplus
extern "C" {
#endif

// CPU reference. x: [rows, K] fp32 (the GPU producers read BF16: pass the BF16 values as floats).
// Row copy: codes [rows, K/2], scales [rows, K/32]. s is only used for MX_SR.
void mx_quantize_rows(const float *x, int rows, int K, MxScale mode, MxRound rnd, PhiloxStream s, uint8_t *codes,
                      uint8_t *scales);
// Column copy (RNE): optionally H32 along rows (hadamard = 1), then blocks along rows; rows % 32 == 0.
// Output transposed: codes [K, rows/2], scales [K, rows/32].
void mx_quantize_cols(const float *x, int rows, int K, int hadamard, MxScale mode, uint8_t *codes, uint8_t *scales);
// Weights W [N, K], 32x32 tiles (N, K multiples of 32). Outputs W (codes [N, K/2], scales [N, K/32])
// and W^T (codes [K, N/2], scales [K, N/32]); either pair may be NULL. RNE always.
void mx_quantize_weight(const float *w, int N, int K, MxScale mode, int rule087, uint8_t *codes, uint8_t *scales,
                        uint8_t *codes_t, uint8_t *scales_t);
// out [rows, K] = mx_decode of every element.
void mx_dequantize(const uint8_t *codes, const uint8_t *scales, int rows, int K, MxScale mode, float *out);

#ifdef __cplusplus
}
#endif

// ---- CUDA producers (fp4/mxfp4.cu). All read BF16 (weights: fp32 or BF16), run one kernel on
// cuda_stream(), and are bit-identical to the CPU reference above (+ fp8_embed.h for FP8 outputs).
#ifdef __CUDACC__
#include <cuda_bf16.h>
// An output of a producer: packed MXFP4 (q = [rows, K/2] codes, e8m0 = [rows, K/32]) when fp8 == 0;
// the Hopper FP8 embedding (q = [rows, K] E4M3, scale = VEC128 for activations/gradients or
// BLK128x128 for weights, see fp8_embed.h; scale_mul as there) when fp8 == 1. q == NULL: not wanted.
// blk128: the dual producer's FP8 column copy in BLK128x128 (a Wgrad 2D operand; Recipe.wgrad_2d)
// instead of VEC128; the weight producers always write BLK128x128 and ignore it. rounded (may be
// NULL; with blk128): a device counter the dual producer adds to for every nonzero 32-block more than
// 14 binades below its tile's largest, i.e. outside the embedding's exact range (fp8_embed.h).
typedef struct {
  uint8_t *q;
  uint8_t *e8m0;
  float *scale;
  int fp8;
  float scale_mul;
  int blk128;
  unsigned long long *rounded;
} MxOut;

// Row copy of x [rows, K], blocks along K (K % 32 == 0).
void mx_quantize_rows_cuda(const __nv_bfloat16 *x, int rows, int K, MxScale mode, MxRound rnd, PhiloxStream s,
                           MxOut out);
// One pass over x [rows, K] in 128x128 tiles emitting both the row copy (RNE or SR, as
// mx_quantize_rows) and the column copy (RNE, optional H32 along rows, as mx_quantize_cols); either
// may be skipped (q == NULL). rows % 32 == 0 and K % 32 == 0. The "one backward producer per dY":
// row = SR copy for Dgrad, col = H32 copy for Wgrad. With X and rnd = MX_RNE: Fprop copy + Wgrad copy.
// col.blk128 (FP8 only): the column copy as mx_quantize_cols + mx_embed_blk128 (one exponent per
// 128x128 tile); the row copy must then be FP8 or not wanted.
void mx_quantize_dual_cuda(const __nv_bfloat16 *x, int rows, int K, MxScale mode, MxRound row_rnd, PhiloxStream s,
                           MxOut row, int hadamard, MxOut col);
// Column copy of x [rows, K] packed, one 32-block per thread: codes [K, rows/2], E8M0 [K, rows/32],
// with the fixed-sign H16 or H32 along rows (hadamard 0, 16 or 32), or the plain H16 without signs
// (MX_HADAMARD_H16_PLAIN), and RNE or SR (SR bits indexed by the element's place in that [K, rows]
// tensor). The cases the dual producer does not cover (H16, SR on the column copy); with RNE,
// mx_quantize_cols. rows % 32 == 0.
#define MX_HADAMARD_H16_PLAIN (-16)
void mx_quantize_cols_cuda(const __nv_bfloat16 *x, int rows, int K, MxScale mode, int hadamard, MxRound rnd,
                           PhiloxStream s, uint8_t *codes, uint8_t *e8m0);
// Weights W [N, K] (N, K multiples of 32) -> W and W^T (as mx_quantize_weight); either may be skipped.
void mx_quantize_weight_cuda(const float *w, int N, int K, MxScale mode, int rule087, MxOut wq, MxOut wtq);
void mx_quantize_weight_bf16_cuda(const __nv_bfloat16 *w, int N, int K, MxScale mode, int rule087, MxOut wq, MxOut wtq);
#endif
