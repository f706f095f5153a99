// fp4/fp8_embed.h: MXFP4 embedded in FP8 E4M3 + cuBLASLt block scales, so Hopper's FP8 tensor cores
// run MXFP4 numerics (BRIEF §4; layouts verified by shared/probes/mx_embed_probe.cu).
//
// For every 128-element group along K (VEC128: one row x 128 K, for activations and gradients) or
// 128x128 tile (BLK128x128: 128 rows x 128 K, for weights), E_t = the largest block exponent e in it:
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
  int E = (int)(c >> 1);                             // q = sig/8 * 2^(E-1); q = 0.5 has E = 0
  uint32_t sig = (E && (c & 1u)) ? 12u : 8u;
  int B = E + ((int)b - 127 - Et + 6) + 6;           // biased E4M3 exponent, <= 15 (384 at most)
  if (B >= 1) return (uint8_t)(s | ((uint32_t)B << 3) | (sig & 7u));
  int sh = 1 - B < 5 ? 1 - B : 5;                    // subnormal: sig * 2^-sh in units of 2^-9, RNE
  uint32_t r = sig >> sh, rem = sig & ((1u << sh) - 1u), half = 1u << (sh - 1);
  r += (rem > half) || (rem == half && (r & 1u));    // r == 8 is 2^-6, correctly the next normal
  return (uint8_t)(s | r);
}

static inline FP4_HD float mx_embed_scale(int Et, float scale_mul) { return fp4_ldexp(scale_mul, Et - 6); }

static inline FP4_HD size_t mx_vec128_scale_count(int rows, int K) { return (size_t)((K + 127) / 128) * rows; }
static inline FP4_HD int mx_blk128_l4(int K) { return ((K + 127) / 128 + 3) / 4 * 4; }
static inline FP4_HD size_t mx_blk128_scale_count(int rows, int K) { return (size_t)((rows + 127) / 128) * mx_blk128_l4(K); }

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
