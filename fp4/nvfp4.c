// fp4/nvfp4.c: CPU reference of the NVFP4 quantizers (see nvfp4.h). Plain loops over the FP4_HD
// block rules that the CUDA producers also call, so both give the same bytes.
#include "fp4/nvfp4.h"

#include "common/common.h"
#include "fp4/hadamard.h"

static void check(const char *who, int rows, int K) {
  if (rows < 0 || K <= 0 || K % 16) die("%s: rows = %d, K = %d: K must be a positive multiple of 16", who, rows, K);
}

// Column copies: blocks run down the columns, so rows % 16 == 0 and K is free.
static void check_cols(const char *who, int rows, int K) {
  if (rows < 0 || K <= 0 || rows % 16)
    die("%s: rows = %d, K = %d: rows must be a multiple of 16 (blocks run down columns), K positive", who, rows, K);
}

static void check_sr(const char *who, NvRound rnd, size_t n) {
  if (rnd == NV_SR) philox_check_range(who, n);
}

// Packs 16 codes into 8 bytes, element 2i in the low nibble of byte i.
static void pack16(const uint8_t *codes, uint8_t *out) {
  for (int i = 0; i < 8; i++) out[i] = (uint8_t)((codes[2 * i] & 15) | (codes[2 * i + 1] << 4));
}

static uint8_t nibble(const uint8_t *codes, size_t i) { return (uint8_t)((codes[i / 2] >> (4 * (i & 1))) & 15); }

float nvfp4_amax(const float *x, size_t n) {
  uint32_t am = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t a = nv_abs_bits(x[i]);
    if (a < NV_NONFINITE_BITS && a > am) am = a;
  }
  return fp4_u2f(am);
}

static void check_rot(const char *who, int rot) {
  if (rot != FP4_ROT_NONE && rot != FP4_ROT_H16 && rot != FP4_ROT_H16_PLAIN)
    die("%s: rotation %d is none (0), H16 (1) or plain H16 (2)", who, rot);
}

float nvfp4_amax_hadamard(const float *x, int rows, int K, int rot) {
  check_cols("nvfp4_amax_hadamard", rows, K);
  check_rot("nvfp4_amax_hadamard", rot);
  uint32_t am = 0;
  float v[16];
  for (int r0 = 0; r0 < rows; r0 += 16)
    for (int k = 0; k < K; k++) {
      for (int i = 0; i < 16; i++) v[i] = x[(size_t)(r0 + i) * K + k];
      fp4_rotate16(v, rot);
      for (int i = 0; i < 16; i++) {
        uint32_t a = nv_abs_bits(v[i]);
        if (a < NV_NONFINITE_BITS && a > am) am = a;
      }
    }
  return fp4_u2f(am);
}

void nvfp4_quantize_rows(const float *x, int rows, int K, float amax, NvRound rnd, PhiloxStream s, uint8_t *codes,
                         uint8_t *scales) {
  check("nvfp4_quantize_rows", rows, K);
  size_t n = (size_t)rows * K;
  check_sr("nvfp4_quantize_rows", rnd, n);
  const float s_enc = nv_encode_scale(amax);
  uint8_t c[16];
  uint32_t w[4];
  // K % 16 == 0, so block b is elements 16b..16b+15 of the whole tensor: Philox group b.
  for (size_t i = 0; i < n; i += 16) {
    if (rnd == NV_SR) philox_group16(s, i / 16, w);
    scales[i / 16] = nv_quantize_block16(x + i, s_enc, rnd == NV_SR, w, c);
    pack16(c, codes + i / 2);
  }
}

void nvfp4_quantize_cols(const float *x, int rows, int K, int rot, float amax, NvRound rnd, PhiloxStream s,
                         uint8_t *codes, uint8_t *scales) {
  check_cols("nvfp4_quantize_cols", rows, K);
  check_rot("nvfp4_quantize_cols", rot);
  check_sr("nvfp4_quantize_cols", rnd, (size_t)rows * K);
  const float s_enc = nv_encode_scale(amax);
  float v[16];
  uint8_t c[16];
  uint32_t w[4];
  for (int k = 0; k < K; k++)
    for (int r0 = 0; r0 < rows; r0 += 16) {
      for (int i = 0; i < 16; i++) v[i] = x[(size_t)(r0 + i) * K + k];
      fp4_rotate16(v, rot);
      size_t e = (size_t)k * rows + r0;  // index of element 0 of the block in the transposed [K, rows]
      if (rnd == NV_SR) philox_group16(s, e / 16, w);
      scales[e / 16] = nv_quantize_block16(v, s_enc, rnd == NV_SR, w, c);
      pack16(c, codes + e / 2);
    }
}

uint32_t nvfp4_tile_amax_bits(const float *w, int K, int n0, int k0) {
  uint32_t am = 0;
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      uint32_t a = nv_abs_bits(w[(size_t)(n0 + i) * K + k0 + j]);
      am = a > am ? a : am;
    }
  return am;
}

void nvfp4_put_tile(const uint8_t *c, uint8_t bs, int N, int K, int n0, int k0, uint8_t *codes, uint8_t *scales,
                    uint8_t *codes_t, uint8_t *scales_t) {
  for (int i = 0; i < 16; i++) {
    if (codes) {
      pack16(c + i * 16, codes + (size_t)(n0 + i) * (K / 2) + k0 / 2);
      scales[(size_t)(n0 + i) * (K / 16) + k0 / 16] = bs;
    }
    if (codes_t) {
      uint8_t col[16];
      for (int j = 0; j < 16; j++) col[j] = c[j * 16 + i];
      pack16(col, codes_t + (size_t)(k0 + i) * (N / 2) + n0 / 2);
      scales_t[(size_t)(k0 + i) * (N / 16) + n0 / 16] = bs;
    }
  }
}

void nvfp4_quantize_weight(const float *w, int N, int K, float amax, uint8_t *codes, uint8_t *scales, uint8_t *codes_t,
                           uint8_t *scales_t) {
  check("nvfp4_quantize_weight", N, K);
  if (N % 16) die("nvfp4_quantize_weight: N = %d must be a multiple of 16 (16x16 tiles)", N);
  const float s_enc = nv_encode_scale(amax);
  uint8_t c[16 * 16];
  for (int n0 = 0; n0 < N; n0 += 16)
    for (int k0 = 0; k0 < K; k0 += 16) {
      uint8_t bs = nv_block_scale(nvfp4_tile_amax_bits(w, K, n0, k0), s_enc);
      float inv = nv_elem_inv(bs, s_enc);
      for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) c[i * 16 + j] = nv_encode(w[(size_t)(n0 + i) * K + k0 + j], inv, 0, 0);
      nvfp4_put_tile(c, bs, N, K, n0, k0, codes, scales, codes_t, scales_t);
    }
}

void nvfp4_dequantize(const uint8_t *codes, const uint8_t *scales, int rows, int K, float amax, float *out) {
  check("nvfp4_dequantize", rows, K);
  const float s_enc = nv_encode_scale(amax);
  for (size_t i = 0; i < (size_t)rows * K; i++) out[i] = nv_decode(nibble(codes, i), scales[i / 16], s_enc);
}

void nvfp4_dequantize_unscaled_bf16(const uint8_t *codes, const uint8_t *scales, int rows, int K, uint16_t *out) {
  check("nvfp4_dequantize_unscaled_bf16", rows, K);
  for (size_t i = 0; i < (size_t)rows * K; i++) out[i] = nv_decode_unscaled_bf16(nibble(codes, i), scales[i / 16]);
}
