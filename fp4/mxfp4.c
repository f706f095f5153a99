// fp4/mxfp4.c: CPU reference of the MXFP4 quantizers (see mxfp4.h). Plain loops over the FP4_HD
// block rules that the CUDA producers also call, so both give the same bytes.
#include "fp4/mxfp4.h"

#include <stdlib.h>

#include "common/common.h"
#include "fp4/hadamard.h"

static void check(const char *who, int rows, int K) {
  if (rows < 0 || K <= 0 || K % 32) die("%s: rows = %d, K = %d: K must be a positive multiple of 32", who, rows, K);
}

// Packs 32 codes into 16 bytes, element 2i in the low nibble of byte i.
static void pack32(const uint8_t *codes, uint8_t *out) {
  for (int i = 0; i < 16; i++) out[i] = (uint8_t)((codes[2 * i] & 15) | (codes[2 * i + 1] << 4));
}

// Stores mx_quantize_block32's words as the packed bytes (byte order fixed, independent of the host).
static void store_words(const uint32_t *pk, uint8_t *out) {
  for (int i = 0; i < 16; i++) out[i] = (uint8_t)(pk[i / 4] >> (8 * (i % 4)));
}

void mx_quantize_rows(const float *x, int rows, int K, MxScale mode, MxRound rnd, PhiloxStream s, uint8_t *codes,
                      uint8_t *scales) {
  check("mx_quantize_rows", rows, K);
  if (rnd == MX_SR) philox_check_range("mx_quantize_rows", (uint64_t)rows * K);
  uint32_t w[8], pk[4];
  for (size_t i = 0; i < (size_t)rows * K; i += 32) {
    if (rnd == MX_SR) {
      philox_group16(s, i / 16, w);
      philox_group16(s, i / 16 + 1, w + 4);
    }
    scales[i / 32] = mx_quantize_block32(x + i, mode, rnd == MX_SR, w, pk);
    store_words(pk, codes + i / 2);
  }
}

void mx_quantize_cols(const float *x, int rows, int K, int hadamard, MxScale mode, uint8_t *codes, uint8_t *scales) {
  check("mx_quantize_cols", rows, K);
  if (rows % 32) die("mx_quantize_cols: rows = %d must be a multiple of 32 (blocks run along rows)", rows);
  float v[32];
  uint32_t pk[4];
  for (int k = 0; k < K; k++)
    for (int r0 = 0; r0 < rows; r0 += 32) {
      for (int i = 0; i < 32; i++) v[i] = x[(size_t)(r0 + i) * K + k];
      if (hadamard) fp4_h32(v);
      scales[(size_t)k * (rows / 32) + r0 / 32] = mx_quantize_block32(v, mode, 0, NULL, pk);
      store_words(pk, codes + (size_t)k * (rows / 2) + r0 / 2);
    }
}

void mx_quantize_weight(const float *w, int N, int K, MxScale mode, int rule087, uint8_t *codes, uint8_t *scales,
                        uint8_t *codes_t, uint8_t *scales_t) {
  check("mx_quantize_weight", N, K);
  if (N % 32) die("mx_quantize_weight: N = %d must be a multiple of 32 (32x32 tiles)", N);
  uint8_t *c = xmalloc(32 * 32);
  for (int n0 = 0; n0 < N; n0 += 32)
    for (int k0 = 0; k0 < K; k0 += 32) {
      uint32_t am = 0;
      for (int i = 0; i < 32; i++)
        for (int j = 0; j < 32; j++) {
          uint32_t a = mx_abs_bits(w[(size_t)(n0 + i) * K + k0 + j]);
          am = a > am ? a : am;
        }
      uint8_t b = 0xFF;
      if (am <= MX_NAN_BITS) {
        int e = mx_weight_exp(fp4_u2f(am), mode, rule087);
        b = e8m0_encode(e);
        for (int i = 0; i < 32; i++)
          for (int j = 0; j < 32; j++)
            c[i * 32 + j] = e2m1_encode_rne(mx_prescale(w[(size_t)(n0 + i) * K + k0 + j], e, mode));
      } else {
        for (int i = 0; i < 32 * 32; i++) c[i] = 0;
      }
      for (int i = 0; i < 32; i++) {
        if (codes) {
          pack32(c + i * 32, codes + (size_t)(n0 + i) * (K / 2) + k0 / 2);
          scales[(size_t)(n0 + i) * (K / 32) + k0 / 32] = b;
        }
        if (codes_t) {
          uint8_t col[32];
          for (int j = 0; j < 32; j++) col[j] = c[j * 32 + i];
          pack32(col, codes_t + (size_t)(k0 + i) * (N / 2) + n0 / 2);
          scales_t[(size_t)(k0 + i) * (N / 32) + n0 / 32] = b;
        }
      }
    }
  free(c);
}

void mx_dequantize(const uint8_t *codes, const uint8_t *scales, int rows, int K, MxScale mode, float *out) {
  check("mx_dequantize", rows, K);
  for (size_t i = 0; i < (size_t)rows * K; i++) {
    uint8_t b = codes[i / 2];
    out[i] = mx_decode((i & 1) ? b >> 4 : b & 15, scales[i / 32], mode);
  }
}
