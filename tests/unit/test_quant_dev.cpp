// tests/unit/test_quant_dev.cpp: the GPU producers' per-block rules (fp4/quant_dev.cuh: mx_block32_dev and its
// FP8 path mx_block32_acc + mx_embed_word4,
// nv_block16_dev, written for Hopper's FMA pipe) against the C references (mx_quantize_block32,
// nv_quantize_block16), compiled for the host, where every PTX-only step has an exact host form. The
// GPU tests hold the kernels to the same references on the H200; this one runs in CI, so a rewrite
// of a rule is checked before it reaches a GPU. C++ because the device forms are templates.
//   - the scalar rules on the BF16 magnitudes (the producers' inputs) times all 256 random bytes
//     for SR, at prescales that put them on each part of the E2M1 grid;
//   - whole blocks: random values of several kinds (any bits with NaN/Inf, small integers and the
//     E2M1 ties, narrow and wide exponent spreads, subnormals), both MX scale modes, RNE and SR;
//     NVFP4 with random tensor scales.
// QUANT_DEV_EXHAUSTIVE=1 adds the exhaustive checks quant_dev.cuh's proofs cite: fp4_rne_code ==
// e2m1_rne_mag on every non-negative non-NaN float (2^31 values, seconds), and fp4_sr_acc ==
// e2m1_sr_mag on every such float x all 256 random bytes, both for the first nibble of a word and
// for one after 0xFFF (2 x 5.5e11 cases, about 6 core-hours; QUANT_DEV_SR_STEP=k checks every
// k-th float only).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4/quant_dev.cuh"
#include "tests/mx_near.h"

static int passed, failed;
static void check(int ok, const char *what, long bad, long total) {
  if (ok) passed++;
  else failed++, printf("FAIL: ");
  if (!ok || total) printf("%s: %ld of %ld differ\n", what, bad, total);
}

static uint64_t g_state = 0x9E3779B97F4A7C15ull;
static uint32_t next32(void) {  // xorshift64*
  g_state ^= g_state >> 12, g_state ^= g_state << 25, g_state ^= g_state >> 27;
  return (uint32_t)((g_state * 0x2545F4914F6CDD1Dull) >> 32);
}
static float bf16_of(uint32_t bits16) { return fp4_u2f(bits16 << 16); }

static float value(int kind) {
  static const float grid[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f,
                               2.0f, 2.5f,  3.0f, 3.5f,  4.0f, 5.0f,  6.0f};
  uint32_t u = next32();
  float sign = u & 0x80000000u ? -1.0f : 1.0f;
  switch (kind) {
    case 0:
      return fp4_u2f(u);  // any bits
    case 1:
      return sign * grid[u % 15] * (float)(1 << (next32() % 4));  // ties and grid points
    case 2:
      return bf16_of((u & 0x807fu) | ((120u + (u >> 20) % 16) << 7));  // narrow exponent spread
    case 3:
      return bf16_of((u & 0x807fu) | ((1u + (u >> 20) % 254) << 7));  // any finite BF16
    default:
      return sign * fp4_u2f(u & 0x007fffffu);  // subnormals
  }
}

// The exhaustive checks (QUANT_DEV_EXHAUSTIVE=1). Bit patterns 0 .. 0x7F800000: +0 up to +Inf.
static void exhaustive(void) {
  const uint32_t top = 0x7F800000u;
  long bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static, 1 << 20)
  for (int64_t b = 0; b <= (int64_t)top; b++) bad += fp4_rne_code(fp4_u2f((uint32_t)b)) != e2m1_rne_mag((uint32_t)b);
  check(bad == 0, "exhaustive: fp4_rne_code == e2m1_rne_mag on every non-negative float", bad, (long)top + 1);

  const char *st = getenv("QUANT_DEV_SR_STEP");
  const int64_t step = st && atoll(st) > 0 ? atoll(st) : 1;
  const float first = FP4_SR_ACC0, after = fp4_fma(FP4_SR_M + 0xFFF, 16.0f, FP4_SR_HORNER);
  bad = 0;
  long total = 0;
#pragma omp parallel for reduction(+ : bad, total) schedule(dynamic, 1 << 16)
  for (int64_t b = 0; b <= (int64_t)top; b += step) {
    const float y = fp4_u2f((uint32_t)b);
    for (uint32_t r = 0; r < 256; r++) {
      const uint32_t want = e2m1_sr_mag((uint32_t)b, r);
      const float p = fp4_sr_dither(r | 0xA5A5A500u, 0);  // the other bytes hold junk
      // first nibble: acc' = M + 128, result M + code; after 0xFFF: M + 16 * 0xFFF + code
      const uint32_t c0 = (uint32_t)fp4_sr_acc(y, p, first) - 8388616u;
      const uint32_t c1 = (uint32_t)fp4_sr_acc(y, p, after) - 8388616u - 16u * 0xFFFu;
      bad += (c0 != want) + (c1 != want), total += 2;
    }
  }
  check(bad == 0, "exhaustive: fp4_sr_acc == e2m1_sr_mag, every (QUANT_DEV_SR_STEP-th) float x 256 bytes", bad, total);
}

int main(void) {
  // The block scale's fast path (exponent straight from the amax bits) against the reference
  // composition (mx_scale_exp, mx_block_mul, e8m0_encode) on every non-negative float and NaN.
  {
    long bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static, 1 << 20)
    for (int64_t b = 0; b <= 0x7FFFFFFF; b++) {
      const float m = fp4_u2f((uint32_t)b);
      for (int mode = 0; mode < 2; mode++) {
        float c;
        const uint8_t got = mx_block32_scale_of(m, (MxScale)mode, &c);
        uint8_t want = 0xFF;
        float cw = 0.0f;
        if ((uint32_t)b <= MX_NAN_BITS) {
          const int e = mx_scale_exp(m, (MxScale)mode);
          want = e8m0_encode(e), cw = mx_block_mul(e, (MxScale)mode);
        }
        bad += got != want || fp4_f2u(c) != fp4_f2u(cw);
      }
    }
    check(bad == 0, "mx_block32_scale_of == reference scale on every non-negative float and NaN, both modes", bad,
          2L << 31);
  }
  // The prescale folded into the rounding for BF16 inputs (mx_acc4_bf16), for every BF16 magnitude (NaN
  // excluded: its block takes the NaN path), every block exponent and both scale modes: RNE's three
  // magic adds are equal (so mx_acc4's FMA form gives BF16 values the codes of the rounded product
  // fl(|x| c), as before it was made exact for floats); SR's three saturated halves are equal except
  // where y is subnormal (a last-bit difference), and there the SR step's results are, for all 256
  // random bytes, at the first nibble and after 0xFFF. mx_acc4's SR product rounded up is fl(|x| c)
  // too, except where that is subnormal, and there the SR codes agree for all 256 bytes.
  {
    long bad = 0, total = 0, subn = 0;
    const float after = fp4_fma(FP4_SR_M + 0xFFF, 16.0f, FP4_SR_HORNER);
    for (int mode = 0; mode < 2; mode++)
      for (int e = -127; e <= 127; e++) {
        const float c = mx_block_mul(e, (MxScale)mode), ch = c * 0.5f;
        if (c == 0.0f) continue;  // the reference rule's blocks
        for (uint32_t h = 0; h <= 0x7F80u; h++) {
          const float x = bf16_of(h), y = FP4_MUL(x, c);
          const float mk[3] = {4194304.0f, 8388608.0f, 16777216.0f}, sk[3] = {0.0f, -1.0f, -2.0f};
          float s_ref[3], s_fold[3];
          int diff = 0, sdiff = 0;
          for (int i = 0; i < 3; i++) {
            diff |= fp4_f2u(FP4_ADD(y, mk[i])) != fp4_f2u(fp4_fma(x, c, mk[i]));
            s_ref[i] = fp4_fma_sat(y, 0.5f, sk[i]), s_fold[i] = fp4_fma_sat(x, ch, sk[i]);
            sdiff |= fp4_f2u(s_ref[i]) != fp4_f2u(s_fold[i]);
          }
          const float yu = fp4_mul_ru(x, c);
          if (fp4_f2u(yu) != fp4_f2u(y)) {
            diff |= !(y < 1.17549435e-38f);
            for (uint32_t r = 0; r < 256; r++) diff |= e2m1_sr_mag(fp4_f2u(yu), r) != e2m1_sr_mag(fp4_f2u(y), r);
          }
          if (sdiff) {
            subn++;
            diff |= !(y < 1.17549435e-38f);  // only subnormal y may differ here
            for (uint32_t r = 0; r < 256; r++) {
              const float p = fp4_sr_dither(r, 0);
              diff |= fp4_f2u(fp4_sr_acc3(s_ref[0], s_ref[1], s_ref[2], p, FP4_SR_ACC0)) !=
                      fp4_f2u(fp4_sr_acc3(s_fold[0], s_fold[1], s_fold[2], p, FP4_SR_ACC0));
              diff |= fp4_f2u(fp4_sr_acc3(s_ref[0], s_ref[1], s_ref[2], p, after)) !=
                      fp4_f2u(fp4_sr_acc3(s_fold[0], s_fold[1], s_fold[2], p, after));
            }
          }
          bad += diff, total++;
        }
      }
    check(bad == 0 && subn > 0, "prescale folded into RNE/SR: every BF16 magnitude x every scale x both modes", bad,
          total);
  }

  // Scalar rule: every BF16 magnitude up to 6 * 2^k, k = -2, 0, 2, through a one-value block so that the
  // whole device path (amax, scale, prescale, rounding, packing) runs. The block's other 31 values
  // are 6 * 2^k, which fixes the scale, so the probe lands anywhere on the grid.
  long bad = 0, total = 0;
  for (uint32_t h = 0; h < 0x7f80u; h++)
    for (int k = -2; k <= 2; k += 2) {
      float v[32];
      for (int i = 0; i < 32; i++) v[i] = ldexpf(6.0f, k);
      v[h % 32] = bf16_of(h);
      if (fabsf(v[h % 32]) > ldexpf(6.0f, k)) continue;  // would move the scale: blocks below cover it
      uint32_t rnd[8];
      for (int i = 0; i < 8; i++) rnd[i] = next32();
      for (int mode = 0; mode < 2; mode++) {
        uint32_t a[4], b[4];
        uint8_t sa = mx_quantize_block32(v, (MxScale)mode, 0, rnd, a),
                sb = mx_block32_dev<false>(v, (MxScale)mode, rnd, b);
        bad += sa != sb || memcmp(a, b, sizeof a), total++;
      }
    }
  check(bad == 0, "MX RNE, every BF16 magnitude at 3 scales, both scale modes", bad, total);

  bad = 0, total = 0;
  for (uint32_t h = 0; h < 0x7f80u; h += 7)
    for (int r = 0; r < 256; r++) {
      float v[32];
      for (int i = 0; i < 32; i++) v[i] = 6.0f;
      v[r % 32] = bf16_of(h);
      if (fabsf(v[r % 32]) > 6.0f) continue;
      uint32_t rnd[8];
      for (int i = 0; i < 8; i++) rnd[i] = next32();
      ((uint8_t *)rnd)[r % 32] = (uint8_t)r;  // this element's byte takes every value
      uint32_t a[4], b[4];
      uint8_t sa = mx_quantize_block32(v, MX_SCALE_UP, 1, rnd, a), sb = mx_block32_dev<true>(v, MX_SCALE_UP, rnd, b);
      bad += sa != sb || memcmp(a, b, sizeof a), total++;
    }
  check(bad == 0, "MX SR, BF16 magnitudes x all 256 random bytes", bad, total);

  // Float values (not BF16) next to every threshold of the rules, every e (tests/mx_near.h), under RNE
  // and SR: the device forms give the reference's codes, which are those of the exact quotient
  // (tests/unit/test_fp4_mx.c): the packed RNE and SR blocks, their FP8 accumulators, and the RNE words
  // of the fp32 weight producer (mx_rne_words).
  {
    long bad = 0, total = 0;
    for (int e = -127; e <= 127; e++)
      for (int k = 0; k < MX_NEAR_KINDS; k++)
        for (int sr = 0; sr < 2; sr++) {
          float v[32];
          uint32_t rnd[8], a[4], b[4];
          mx_near_block(e, k, v, rnd);
          const uint8_t sa = mx_quantize_block32(v, MX_SCALE_UP, sr, rnd, a);
          const uint8_t sb =
              sr ? mx_block32_dev<true>(v, MX_SCALE_UP, rnd, b) : mx_block32_dev<false>(v, MX_SCALE_UP, rnd, b);
          int diff = sa != sb || memcmp(a, b, sizeof a);
          float acc[8], c;
          sr ? mx_block32_acc<true>(v, MX_SCALE_UP, rnd, acc) : mx_block32_acc<false>(v, MX_SCALE_UP, rnd, acc);
          for (int q = 0; q < 8; q++)
            diff |= (sr ? mx_acc_codes4<true>(acc[q]) : mx_acc_codes4<false>(acc[q])) !=
                    ((a[q >> 1] >> (16 * (q & 1))) & 0x7777u);
          mx_block32_scale(v, MX_SCALE_UP, &c);
          if (!sr && c != 0.0f) {
            mx_rne_words(v, c, b);
            diff |= memcmp(a, b, sizeof a) != 0;
          }
          bad += diff, total++;
        }
    check(bad == 0, "MX float blocks near every threshold, every e: device RNE/SR, FP8 accumulators, weight words", bad,
          total);
  }

  // Whole blocks.
  long bad_mx = 0, bad_nv = 0, n_mx = 0, n_nv = 0, bad_fp8 = 0, n_fp8 = 0, n_bf16 = 0;
  for (long it = 0; it < 400000; it++) {
    float v[32];
    const int kind = (int)(it % 5);
    for (int i = 0; i < 32; i++) v[i] = value(next32() % 8 == 0 ? (int)(next32() % 5) : kind);
    uint32_t rnd[8];
    for (int i = 0; i < 8; i++) rnd[i] = next32();
    for (int mode = 0; mode < 2; mode++)
      for (int sr = 0; sr < 2; sr++) {
        uint32_t a[4], b[4];
        uint8_t sa = mx_quantize_block32(v, (MxScale)mode, sr, rnd, a);
        uint8_t sb =
            sr ? mx_block32_dev<true>(v, (MxScale)mode, rnd, b) : mx_block32_dev<false>(v, (MxScale)mode, rnd, b);
        bad_mx += sa != sb || memcmp(a, b, sizeof a), n_mx++;
        float cw;
        if (!sr && sa != 0xFF && (mx_block32_scale(v, (MxScale)mode, &cw), cw != 0.0f)) {
          mx_rne_words(v, cw, b);  // the fp32 weight producer's words
          bad_mx += memcmp(a, b, sizeof a) != 0;
        }
        // The FP8 path (code accumulators, sign bytes, mx_embed_word4) against mx_embed_value of the
        // reference's signed codes, at a group exponent 0..20 above the block's (the embedding's
        // normal range and its subnormal and flush-to-zero cases).
        float acc[8];
        uint8_t sc =
            sr ? mx_block32_acc<true>(v, (MxScale)mode, rnd, acc) : mx_block32_acc<false>(v, (MxScale)mode, rnd, acc);
        const int Et = mx_embed_exp_of(sa) + (int)(next32() % 21);
        const MxEmbedLut L = mx_embed_lut(sa, Et);
        int diff = sc != sa;
        for (int k = 0; k < 8; k++) {
          const uint32_t codes = sr ? mx_acc_codes4<true>(acc[k]) : mx_acc_codes4<false>(acc[k]);
          const uint32_t word =
              k % 2 ? mx_embed_word4(L, codes, fp4_sign_bytes4(v + 4 * k))
                    : mx_embed_word4(
                          L, codes,
                          fp4_sign_bytes4_bf16((fp4_f2u(v[4 * k]) >> 16) | (fp4_f2u(v[4 * k + 1]) & 0xFFFF0000u),
                                               (fp4_f2u(v[4 * k + 2]) >> 16) | (fp4_f2u(v[4 * k + 3]) & 0xFFFF0000u)));
          for (int j = 0; j < 4; j++) {
            const int i = 4 * k + j;
            diff |= (uint8_t)(word >> (8 * j)) != mx_embed_value(mx_code_of(a, i), sa, Et);
          }
        }
        // BF16 blocks (kinds 1-3 hold BF16 values unless a random kind-0/4 value was mixed in): the
        // folded accumulators of the row producers.
        bool is16 = sc != 0xFF;
        for (int i = 0; i < 32; i++) is16 = is16 && (fp4_f2u(v[i]) & 0xFFFFu) == 0;
        float c = 0.0f;
        mx_block32_scale(v, (MxScale)mode, &c);
        if (is16 && c != 0.0f) {
          for (int k = 0; k < 8; k++) {
            const float f = sr ? mx_acc4_bf16<true>(v + 4 * k, c, c * 0.5f, rnd[k])
                               : mx_acc4_bf16<false>(v + 4 * k, c, c * 0.5f, 0);
            diff |= fp4_f2u(f) != fp4_f2u(acc[k]);
          }
          n_bf16++;
        }
        bad_fp8 += diff, n_fp8++;
      }
    float s_enc = nv_encode_scale(fabsf(value(3)) + 1e-3f);
    if (!(s_enc > 0.0f) || fp4_isnan(s_enc) || isinf(s_enc)) s_enc = 1.0f;
    for (int half = 0; half < 2; half++)
      for (int sr = 0; sr < 2; sr++) {
        uint8_t codes[16];
        uint32_t out[2], ref[2] = {0, 0};
        uint8_t ba = nv_quantize_block16(v + 16 * half, s_enc, sr, rnd + 4 * half, codes);
        uint8_t bb = sr ? nv_block16_dev<true>(v + 16 * half, s_enc, rnd + 4 * half, out)
                        : nv_block16_dev<false>(v + 16 * half, s_enc, rnd + 4 * half, out);
        for (int i = 0; i < 16; i++) ref[i >> 3] |= (uint32_t)(codes[i] & 15) << (4 * (i & 7));
        bad_nv += ba != bb || ref[0] != out[0] || ref[1] != out[1], n_nv++;
      }
  }
  check(bad_mx == 0, "MX blocks (5 kinds, both scale modes, RNE and SR)", bad_mx, n_mx);
  check(bad_fp8 == 0, "MX blocks -> FP8 embedding from code accumulators and sign bytes (half through BF16 words)",
        bad_fp8, n_fp8);
  check(n_bf16 > 10000, "BF16 blocks among them, whose folded accumulators were checked too", 0, n_bf16);
  check(bad_nv == 0, "NVFP4 blocks (5 kinds, random tensor scales, RNE and SR)", bad_nv, n_nv);
  const char *ex = getenv("QUANT_DEV_EXHAUSTIVE");
  if (ex && atoi(ex)) exhaustive();
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
