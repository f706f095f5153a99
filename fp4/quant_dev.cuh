// fp4/quant_dev.cuh: device forms of the MXFP4 / NVFP4 block rules (mx_quantize_block32 of mxfp4.h,
// nv_quantize_block16 of nvfp4.h) for the producers. Each element goes through the very same FP4_HD
// steps as the reference (prescale, e2m1_rne_mag / e2m1_sr_mag, e2m1_sign); only the packing differs:
// the magnitudes are summed straight into the packed word (m << 4j) and the sign bits are moved there
// from the float with one shift and mask ((bits >> (28 - 4j)) & (8 << 4j) is e2m1_sign(x) << 4j), so
// the nibbles, which never overlap, come out identical with fewer instructions per element.
// FP4_HD like the rules they mirror, so a host build can hold them to the references.
#pragma once
#include "fp4/mxfp4.h"
#include "fp4/nvfp4.h"

// Sign bit of x in bit 3 of nibble j: e2m1_sign(x) << (4 * j).
static inline FP4_HD uint32_t fp4_sign_nibble(float x, int j) {
  return (fp4_f2u(x) >> (28 - 4 * j)) & (8u << (4 * j));
}

// 8 random bits of element i from the Philox words w (philox_byte(w, i)).
static inline FP4_HD uint32_t fp4_rbyte(const uint32_t *w, int i) { return (w[i >> 2] >> (8 * (i & 3))) & 0xffu; }

// mx_quantize_block32, bit for bit: 32 values -> 4 packed words pk, returns the E8M0 byte.
template <bool SR>
static inline FP4_HD uint8_t mx_block32_dev(const float *v, MxScale mode, const uint32_t *rnd, uint32_t *pk) {
  uint32_t am = 0;
FP4_UNROLL
  for (int i = 0; i < 32; i++) am = am > mx_abs_bits(v[i]) ? am : mx_abs_bits(v[i]);
  if (am > MX_NAN_BITS) {
    pk[0] = pk[1] = pk[2] = pk[3] = 0;
    return 0xFF;
  }
  const int e = mx_scale_exp(fp4_u2f(am), mode);
FP4_UNROLL
  for (int w = 0; w < 4; w++) {
    uint32_t mag = 0, sgn = 0;
FP4_UNROLL
    for (int j = 0; j < 8; j++) {
      const int i = 8 * w + j;
      const uint32_t a = fp4_f2u(mx_prescale(fabsf(v[i]), e, mode));
      mag += (SR ? e2m1_sr_mag(a, fp4_rbyte(rnd, i)) : e2m1_rne_mag(a)) << (4 * j);
      sgn |= fp4_sign_nibble(v[i], j);
    }
    pk[w] = mag | sgn;
  }
  return e8m0_encode(e);
}

// nv_quantize_block16 + pack16, bit for bit: 16 values -> 2 packed words (element 2i in the low nibble
// of byte i), returns the E4M3 block scale. inv != 0 is nv_encode's nonzero case.
template <bool SR>
static inline FP4_HD uint8_t nv_block16_dev(const float *v, float s_enc, const uint32_t *rnd, uint32_t *out) {
  uint32_t am = 0;
FP4_UNROLL
  for (int i = 0; i < 16; i++) am = am > nv_abs_bits(v[i]) ? am : nv_abs_bits(v[i]);
  const uint8_t bs = nv_block_scale(am, s_enc);
  const float inv = nv_elem_inv(bs, s_enc);
  uint32_t pk[2] = {0, 0};  // bs == 0 or NaN: every code 0
  if (inv != 0.0f) {
FP4_UNROLL
    for (int w = 0; w < 2; w++) {
      uint32_t mag = 0, sgn = 0;
FP4_UNROLL
      for (int j = 0; j < 8; j++) {
        const int i = 8 * w + j;
        const uint32_t a = fp4_f2u(FP4_MUL(fabsf(v[i]), inv));
        mag += (SR ? e2m1_sr_mag(a, fp4_rbyte(rnd, i)) : e2m1_rne_mag(a)) << (4 * j);
        sgn |= fp4_sign_nibble(v[i], j);
      }
      pk[w] = mag | sgn;
    }
  }
  out[0] = pk[0], out[1] = pk[1];
  return bs;
}
