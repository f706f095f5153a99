// fp4/nvfp4_cta.c: CPU reference of the CTA-local NVFP4 quantizers (see nvfp4_cta.h). Two passes, as
// the producers run: the chunk amaxes (and from them the stripes' outer factors), then each block
// quantized with its chunk's scale and its scale folded with the chunk's correction.
#include "fp4/nvfp4_cta.h"

#include <stdlib.h>

#include "common/common.h"
#include "fp4/hadamard.h"

static void pack16(const uint8_t *c, uint8_t *out) {
  for (int i = 0; i < 8; i++) out[i] = (uint8_t)((c[2 * i] & 15) | (c[2 * i + 1] << 4));
}

static uint8_t nibble(const uint8_t *codes, size_t i) { return (uint8_t)((codes[i / 2] >> (4 * (i & 1))) & 15); }

static uint32_t finite_abs_bits(float x) {
  uint32_t a = nv_abs_bits(x);
  return a < NV_NONFINITE_BITS ? a : 0;
}

// Chunk amaxes a [cr, ck] of x [rows, K] (cr = ceil(rows / 128), ck = ceil(K / 128)), and the outer
// factor of each 256-row stripe (the max of its chunks' factors a / 448).
static float *chunk_amaxes(const float *x, int rows, int K, float *outer) {
  int cr = (rows + CTA_CHUNK - 1) / CTA_CHUNK, ck = (K + CTA_CHUNK - 1) / CTA_CHUNK;
  uint32_t *am = (uint32_t *)xcalloc((size_t)cr * ck + 1, sizeof *am);
  for (int r = 0; r < rows; r++)
    for (int k = 0; k < K; k++) {
      uint32_t a = finite_abs_bits(x[(size_t)r * K + k]), *m = &am[(size_t)(r / CTA_CHUNK) * ck + k / CTA_CHUNK];
      if (a > *m) *m = a;
    }
  float *a = (float *)xmalloc(((size_t)cr * ck + 1) * sizeof *a);
  for (size_t i = 0; i < (size_t)cr * ck; i++) a[i] = fp4_u2f(am[i]);
  for (int t = 0; t < cta_stripes(rows); t++) {
    float m = 0.0f;
    for (int c = 2 * t; c < 2 * t + 2 && c < cr; c++)
      for (int j = 0; j < ck; j++) {
        float f = cta_chunk_factor(a[(size_t)c * ck + j]);
        m = f > m ? f : m;
      }
    outer[t] = m;
  }
  free(am);
  return a;
}

static void check(const char *who, int rows, int K, NvRound rnd) {
  if (rows < 0 || K <= 0 || K % 16) die("%s: rows = %d, K = %d: K must be a positive multiple of 16", who, rows, K);
  if (rnd == NV_SR) philox_check_range(who, (uint64_t)rows * K);
}

// The row copy of x [rows, K] (checked by the callers).
static void quantize_rows(const float *x, int rows, int K, NvRound rnd, PhiloxStream s, uint8_t *codes, uint8_t *scales,
                          float *outer) {
  const int ck = (K + CTA_CHUNK - 1) / CTA_CHUNK;
  float *ca = chunk_amaxes(x, rows, K, outer);
  uint8_t c[16];
  uint32_t w[4] = {0, 0, 0, 0};
  for (int r = 0; r < rows; r++)
    for (int k0 = 0; k0 < K; k0 += 16) {
      size_t i = (size_t)r * K + k0, chunk = (size_t)(r / CTA_CHUNK) * ck + k0 / CTA_CHUNK;
      if (rnd == NV_SR) philox_group16(s, i / 16, w);
      uint8_t bs = nv_quantize_block16(x + i, cta_encode_scale(ca[chunk]), rnd == NV_SR, w, c);
      scales[i / 16] = cta_fold(bs, cta_ratio(cta_chunk_factor(ca[chunk]), outer[r / CTA_STRIPE]));
      pack16(c, codes + i / 2);
    }
  free(ca);
}

void nvfp4_cta_quantize_rows(const float *x, int rows, int K, NvRound rnd, PhiloxStream s, uint8_t *codes,
                             uint8_t *scales, float *outer) {
  check("nvfp4_cta_quantize_rows", rows, K, rnd);
  quantize_rows(x, rows, K, rnd, s, codes, scales, outer);
}

void nvfp4_cta_quantize_cols(const float *x, int rows, int K, int rot, NvRound rnd, PhiloxStream s, uint8_t *codes,
                             uint8_t *scales, float *outer) {
  if (rows <= 0 || K <= 0 || rows % 16)
    die("nvfp4_cta_quantize_cols: rows = %d, K = %d: rows must be a positive multiple of 16 (blocks run down columns)",
        rows, K);
  if (rot != FP4_ROT_NONE && rot != FP4_ROT_H16 && rot != FP4_ROT_H16_PLAIN)
    die("nvfp4_cta_quantize_cols: rotation %d is none, H16 or plain H16", rot);
  check("nvfp4_cta_quantize_cols", K, rows, rnd);
  float *xt = (float *)xmalloc((size_t)rows * K * sizeof *xt), v[16];
  for (int k = 0; k < K; k++)
    for (int r0 = 0; r0 < rows; r0 += 16) {
      for (int i = 0; i < 16; i++) v[i] = x[(size_t)(r0 + i) * K + k];
      fp4_rotate16(v, rot);
      for (int i = 0; i < 16; i++) xt[(size_t)k * rows + r0 + i] = v[i];
    }
  quantize_rows(xt, K, rows, rnd, s, codes, scales, outer);
  free(xt);
}

void nvfp4_cta_quantize_weight(const float *w, int N, int K, uint8_t *codes, uint8_t *scales, float *outer,
                               uint8_t *codes_t, uint8_t *scales_t, float *outer_t) {
  check("nvfp4_cta_quantize_weight", N, K, NV_RNE);
  if (N % 16) die("nvfp4_cta_quantize_weight: N = %d must be a multiple of 16 (16x16 tiles)", N);
  const int ck = (K + CTA_CHUNK - 1) / CTA_CHUNK, ns = cta_stripes(N);
  float *stripe = (float *)xmalloc((size_t)ns * sizeof *stripe);
  float *ca = chunk_amaxes(w, N, K, stripe), g = 0.0f;
  for (int t = 0; t < ns; t++) g = stripe[t] > g ? stripe[t] : g;  // amax(W) / 448
  free(stripe);
  uint8_t c[16 * 16];
  for (int n0 = 0; n0 < N; n0 += 16)
    for (int k0 = 0; k0 < K; k0 += 16) {
      size_t chunk = (size_t)(n0 / CTA_CHUNK) * ck + k0 / CTA_CHUNK;
      float s_c = cta_encode_scale(ca[chunk]);
      uint8_t mult = cta_weight_mult(nvfp4_tile_amax_bits(w, K, n0, k0), s_c);
      float coeff = cta_weight_coeff(mult, s_c);
      uint8_t bs = cta_fold_weight(cta_weight_scale(mult), cta_ratio(cta_chunk_factor(ca[chunk]), g));
      for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) c[i * 16 + j] = nv_encode(w[(size_t)(n0 + i) * K + k0 + j], coeff, 0, 0);
      nvfp4_put_tile(c, bs, N, K, n0, k0, codes, scales, codes_t, scales_t);
    }
  if (outer)
    for (int t = 0; t < ns; t++) outer[t] = g;
  if (outer_t)
    for (int t = 0; t < cta_stripes(K); t++) outer_t[t] = g;
  free(ca);
}

void nvfp4_cta_dequantize_unscaled(const uint8_t *codes, const uint8_t *scales, int rows, int K, float *out) {
  if (rows < 0 || K <= 0 || K % 16)
    die("nvfp4_cta_dequantize_unscaled: rows = %d, K = %d: K must be a positive multiple of 16", rows, K);
  for (size_t i = 0; i < (size_t)rows * K; i++) out[i] = nv_decode_unscaled(nibble(codes, i), scales[i / 16]);
}

void nvfp4_cta_dequantize(const uint8_t *codes, const uint8_t *scales, const float *outer, int rows, int K,
                          float *out) {
  nvfp4_cta_dequantize_unscaled(codes, scales, rows, K, out);
  for (int r = 0; r < rows; r++)
    for (int k = 0; k < K; k++) out[(size_t)r * K + k] = FP4_MUL(out[(size_t)r * K + k], outer[r / CTA_STRIPE]);
}

void nvfp4_cta_apply_outer(float *c, int M, int N, const float *alpha, const float *beta) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      c[(size_t)i * N + j] =
          FP4_MUL(c[(size_t)i * N + j], cta_outer_product(alpha[i / CTA_STRIPE], beta[j / CTA_STRIPE]));
}
