// fp4/fp8_embed.h: MXFP4 embedded in FP8 E4M3 + cuBLASLt block scales, so Hopper's FP8 tensor cores
// run MXFP4 numerics (docs/formats.md §3; layouts verified by ../shared/probes/mx_embed_probe.cu).
//
// For every 128-element group along K (VEC128: one row x 128 K, for activations and gradients) or
// 128x128 tile (BLK128x128: 128 rows x 128 K, for weights, and for one Wgrad operand when
// Recipe.wgrad_2d asks), E_t = the largest block exponent e in it:
//   E4M3 value = q * 2^(e - E_t + 6)      (q the E2M1 value, e its 32-block's exponent)
//   float scale = scale_mul * 2^(E_t - 6)
// so E4M3 * scale = q * 2^e * scale_mul. Use scale_mul = 1 and put mx_unit()^2 (1/36 for the paper's
// scales) in the GEMM alpha for operands exactly equal to the MXFP4 values; scale_mul = 1/6 is the
// probe's convention (alpha 1, scale = fl(2^(E_t-6)/6)).
// Exactness: q * 2^d is a multiple of 2^(d-1) with at most 2 significant bits and at most 384, so it is
// an exact E4M3 value while d >= -8, i.e. while e >= E_t - 14 (spread <= 14). Below that it is rounded
// to nearest even on E4M3's subnormal grid 2^-9: the error is at most 2^-10 in E4M3 units, i.e.
// 2^(E_t - 16) in units of q * 2^e, which is under 2^-17 of the group's largest |q * 2^e| (>= 3 * 2^E_t
// with MX_SCALE_UP, >= 4 * 2^E_t with MX_SCALE_DOWN; values that small mostly round to 0).
// NaN blocks (scale byte 0xFF) embed as E4M3 NaN 0x7F and do not count towards E_t; a group with no
// finite block gets E_t = -127.
//
// Layouts (the ones cuBLASLt accepted in the probe; K need not be a multiple of 128, the last group is
// then partial):
//   E4M3 bytes [rows, K] row-major (K-contiguous).
//   VEC128:     scale[(k / 128) * rows + r]                        (mx_vec128_scale_count entries)
//   BLK128x128: scale[(r / 128) * L4 + k / 128], L4 = ceil(K/128) rounded up to a multiple of 4; the
//               padding entries are written as 0            (mx_blk128_scale_count entries)
#pragma once
#include <stddef.h>

#include "fp4/e2m1.h"

static inline FP4_HD int mx_embed_exp_of(uint8_t b) { return b == 0xFF ? -127 : (int)b - 127; }

// E4M3 byte of q * 2^d, d = e - Et + 6, built from bits: equal to e4m3_encode_rne(q * 2^d) (the CPU
// test checks every code and d), but a dozen integer operations instead of a general encoder, since
// the producers run it per element. The significand of q is 1.0 or 1.5 (sig = 8 or 12 in eighths).
static inline FP4_HD uint8_t mx_embed_value(uint8_t code, uint8_t b, int Et) {
  if (b == 0xFF) return 0x7F;
  uint32_t s = (code & 8u) << 4, c = code & 7u;
  if (c == 0) return (uint8_t)s;
  int E = (int)(c >> 1);  // q = sig/8 * 2^(E-1); q = 0.5 has E = 0
  uint32_t sig = (E && (c & 1u)) ? 12u : 8u;
  int B = E + ((int)b - 127 - Et + 6) + 6;  // biased E4M3 exponent, <= 15 (384 at most)
  if (B >= 1) return (uint8_t)(s | ((uint32_t)B << 3) | (sig & 7u));
  int sh = 1 - B < 5 ? 1 - B : 5;  // subnormal: sig * 2^-sh in units of 2^-9, RNE
  uint32_t r = sig >> sh, rem = sig & ((1u << sh) - 1u), half = 1u << (sh - 1);
  r += (rem > half) || (rem == half && (r & 1u));  // r == 8 is 2^-6, correctly the next normal
  return (uint8_t)(s | r);
}

// The embedding of a whole block at once: its 8 magnitude bytes as a lookup table in two words (byte m =
// mx_embed_value(m, b, Et)) plus the sign bit to OR in (0x80 per byte; 0 for a NaN block, whose every
// byte is 0x7F). When every nonzero magnitude is an E4M3 normal (d = e - Et + 6 >= -5, nearly always)
// the table is the byte pattern [0, t, t+8, t+12 | t+16, t+20, t+24, t+28], t = (d + 6) << 3 (exponent
// field of 0.5 * 2^d; 1.0 is one exponent up, 1.5 adds mantissa 4, ...); otherwise it is filled entry by
// entry. mx_embed_lookup4 then embeds 4 codes (nibbles of sel, element j in nibble j) into 4 bytes: on
// the GPU two byte permutes (PRMT), one for the magnitudes and one for the signs. The CPU test checks
// lookup == mx_embed_value for every scale byte, group exponent and code.
typedef struct {
  uint32_t lo, hi, sign;
} MxEmbedLut;

static inline FP4_HD MxEmbedLut mx_embed_lut(uint8_t b, int Et) {
  MxEmbedLut L;
  int d = (int)b - 127 - Et + 6;
  if (b == 0xFF) {
    L.lo = L.hi = 0x7F7F7F7Fu, L.sign = 0;
  } else if (d >= -5) {
    uint32_t t = (uint32_t)(d + 6) << 3;  // in [8, 96]: no carries between bytes below
    L.lo = t * 0x01010100u + 0x0C080000u, L.hi = t * 0x01010101u + 0x1C181410u, L.sign = 0x80808080u;
  } else {
    L.lo = L.hi = 0, L.sign = 0x80808080u;
    for (int m = 1; m < 8; m++) {
      uint32_t v = mx_embed_value((uint8_t)m, b, Et);
      if (m < 4) L.lo |= v << (8 * m);
      else L.hi |= v << (8 * (m - 4));
    }
  }
  return L;
}

static inline FP4_HD uint32_t mx_embed_lookup4(MxEmbedLut L, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t mag = __byte_perm(L.lo, L.hi, sel & 0x7777u);          // byte j = table[code_j & 7]
  uint32_t sgn = __byte_perm(0x8000u, 0u, (sel >> 3) & 0x1111u);  // byte j = code_j & 8 ? 0x80 : 0
  return mag | (sgn & L.sign);
#else
  uint32_t w = 0;
  for (int j = 0; j < 4; j++) {
    uint32_t c = (sel >> (4 * j)) & 15u, m = c & 7u;
    uint32_t v = ((m < 4 ? L.lo >> (8 * m) : L.hi >> (8 * (m - 4))) & 0xFFu) | (((c & 8u) << 4) & L.sign);
    w |= v << (8 * j);
  }
  return w;
#endif
}

static inline FP4_HD float mx_embed_scale(int Et, float scale_mul) { return fp4_ldexp(scale_mul, Et - 6); }

static inline FP4_HD size_t mx_vec128_scale_count(int rows, int K) { return (size_t)((K + 127) / 128) * rows; }
static inline FP4_HD int mx_blk128_l4(int K) { return ((K + 127) / 128 + 3) / 4 * 4; }
static inline FP4_HD size_t mx_blk128_scale_count(int rows, int K) {
  return (size_t)((rows + 127) / 128) * mx_blk128_l4(K);
}

#ifdef __cplusplus
extern "C" {
#endif
// From packed MXFP4 (codes [rows, K/2], E8M0 scales [rows, K/32]) to E4M3 [rows, K] + float scales.
void mx_embed_vec128(const uint8_t *codes, const uint8_t *scales, int rows, int K, float scale_mul, uint8_t *fp8,
                     float *scale);
void mx_embed_blk128(const uint8_t *codes, const uint8_t *scales, int rows, int K, float scale_mul, uint8_t *fp8,
                     float *scale);
#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
// The same conversions on device buffers (for MXFP4 kept packed and embedded later), on cuda_stream().
void mx_embed_vec128_cuda(const uint8_t *codes, const uint8_t *scales, int rows, int K, float scale_mul, uint8_t *fp8,
                          float *scale);
void mx_embed_blk128_cuda(const uint8_t *codes, const uint8_t *scales, int rows, int K, float scale_mul, uint8_t *fp8,
                          float *scale);
#endif
