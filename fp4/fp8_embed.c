// fp4/fp8_embed.c: CPU reference of the FP8 embedding of MXFP4 (see fp8_embed.h).
#include "fp4/fp8_embed.h"

#include "common/common.h"

static void check(const char *who, int rows, int K) {
  if (rows < 0 || K <= 0 || K % 32) die("%s: rows = %d, K = %d: K must be a positive multiple of 32", who, rows, K);
}

static uint8_t code_at(const uint8_t *codes, size_t r, int K, int k) {
  uint8_t b = codes[r * (K / 2) + k / 2];
  return (k & 1) ? b >> 4 : b & 15;
}

// Embeds rows [r0, r1) x K-group l with exponent Et.
static void embed_group(const uint8_t *codes, const uint8_t *scales, int r0, int r1, int K, int l, int Et,
                        uint8_t *fp8) {
  int k1 = (l + 1) * 128 < K ? (l + 1) * 128 : K;
  for (int r = r0; r < r1; r++)
    for (int k = l * 128; k < k1; k++)
      fp8[(size_t)r * K + k] = mx_embed_value(code_at(codes, r, K, k), scales[(size_t)r * (K / 32) + k / 32], Et);
}

static int group_exp(const uint8_t *scales, int r0, int r1, int K, int l) {
  int nb = K / 32, Et = -127;
  for (int r = r0; r < r1; r++)
    for (int b = 4 * l; b < 4 * l + 4 && b < nb; b++) {
      int e = mx_embed_exp_of(scales[(size_t)r * nb + b]);
      Et = e > Et ? e : Et;
    }
  return Et;
}

void mx_embed_vec128(const uint8_t *codes, const uint8_t *scales, int rows, int K, float scale_mul, uint8_t *fp8,
                     float *scale) {
  check("mx_embed_vec128", rows, K);
  int L = (K + 127) / 128;
  for (int r = 0; r < rows; r++)
    for (int l = 0; l < L; l++) {
      int Et = group_exp(scales, r, r + 1, K, l);
      scale[(size_t)l * rows + r] = mx_embed_scale(Et, scale_mul);
      embed_group(codes, scales, r, r + 1, K, l, Et, fp8);
    }
}

void mx_embed_blk128(const uint8_t *codes, const uint8_t *scales, int rows, int K, float scale_mul, uint8_t *fp8,
                     float *scale) {
  check("mx_embed_blk128", rows, K);
  int L = (K + 127) / 128, L4 = mx_blk128_l4(K);
  for (int t = 0; t * 128 < rows; t++) {
    int r0 = t * 128, r1 = r0 + 128 < rows ? r0 + 128 : rows;
    for (int l = 0; l < L4; l++) {
      if (l >= L) {
        scale[(size_t)t * L4 + l] = 0.0f;
        continue;
      }
      int Et = group_exp(scales, r0, r1, K, l);
      scale[(size_t)t * L4 + l] = mx_embed_scale(Et, scale_mul);
      embed_group(codes, scales, r0, r1, K, l, Et, fp8);
    }
  }
}
