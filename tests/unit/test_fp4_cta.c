// tests/unit/test_fp4_cta.c: the CTA-local NVFP4 CPU reference (fp4/nvfp4_cta.c) against the definitions
// of fp4/nvfp4_cta.h, recomputed here independently in double: chunk scales, stripe outer factors,
// folded block scales, codes at the nearest E2M1 point; then the edge cases (zero tiles and stripes,
// outlier rows, subnormal block scales, tiny and huge tensors where the factors underflow or the
// encode scale overflows, partial chunks and stripes, NaN), the weights' common factor and 2^-9 floor,
// W and W^T sharing codes, the column copy with fixed-sign and plain H16, SR, and the GEMM identity
// C = alpha_i beta_j sum_k (q bs)_A (q bs)_B against the dequantized product in fp64.
#include <math.h>
#include <stdlib.h>

#include "common/common.h"
#include "fp4/hadamard.h"
#include "fp4/nvfp4_cta.h"
#include "tests/test.h"

static uint8_t nib(const uint8_t *codes, size_t i) { return (uint8_t)((codes[i / 2] >> (4 * (i & 1))) & 15); }

static const PhiloxStream S0 = {{0, 0}, 0, 0, 0};

static void fill_normal(float *x, size_t n, uint64_t seed, float scale) {
  Rng r;
  rng_seed(&r, seed);
  for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(&r);
}

// rows x K normal values (a fresh allocation).
static float *normal_matrix(int rows, int K, uint64_t seed) {
  float *x = xmalloc((size_t)rows * K * sizeof *x);
  fill_normal(x, (size_t)rows * K, seed, 1.0f);
  return x;
}

static const double GRID[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

// Distance from y (>= 0) to the nearest E2M1 magnitude.
static double grid_dist(double y) {
  double d = 1e300;
  for (int i = 0; i < 8; i++) d = fmin(d, fabs(y - GRID[i]));
  return d;
}

// A quantized row copy: codes, scales and outer factors of x [rows, K].
typedef struct {
  int rows, K;
  uint8_t *codes, *scales;
  float *outer;
} Q;

static Q q_new(int rows, int K) {
  Q q = {rows, K, xcalloc((size_t)rows * K / 2 + 1, 1), xcalloc((size_t)rows * K / 16 + 1, 1),
         xcalloc((size_t)cta_stripes(rows) + 1, sizeof(float))};
  return q;
}
static void q_free(Q *q) { free(q->codes), free(q->scales), free(q->outer); }

static void done(Q *q, float *x, float *d) { q_free(q), free(x), free(d); }

static Q rows_rne(const float *x, int rows, int K) {
  Q q = q_new(rows, K);
  nvfp4_cta_quantize_rows(x, rows, K, NV_RNE, S0, q.codes, q.scales, q.outer);
  return q;
}

// The definitions, recomputed in double (fp32 where the definition rounds to fp32): returns the number
// of violations and prints the first. Checks every outer factor, every folded scale and every code.
static int check_definition(const float *x, const Q *q, const char *what) {
  const int rows = q->rows, K = q->K, cr = (rows + 127) / 128, ck = (K + 127) / 128;
  double *ca = calloc((size_t)cr * ck, sizeof *ca);
  for (int r = 0; r < rows; r++)
    for (int k = 0; k < K; k++) {
      double a = fabs((double)x[(size_t)r * K + k]);
      if (isfinite(a) && a > ca[(r / 128) * ck + k / 128]) ca[(r / 128) * ck + k / 128] = a;
    }
  int bad = 0;
  for (int t = 0; t < cta_stripes(rows); t++) {
    double m = 0;
    for (int c = 2 * t; c < 2 * t + 2 && c < cr; c++)
      for (int j = 0; j < ck; j++) m = fmax(m, ca[c * ck + j]);
    float want = (float)m / 448.0f;
    if (q->outer[t] != want && bad++ == 0)
      printf("  %s: stripe %d outer %.9g, want %.9g\n", what, t, q->outer[t], want);
  }
  for (int r = 0; r < rows; r++)
    for (int k0 = 0; k0 < K; k0 += 16) {
      double ac = ca[(r / 128) * ck + k0 / 128];
      float s_c = ac > 0 ? (float)(448.0 / ac) : 1.0f;  // one rounding of the quotient, as the definition
      if (ac > 0 && !(448.0 / ac <= 3.4028234663852886e38)) s_c = 3.4028234663852886e38f;
      double ab = 0;
      int nonfinite = 0;
      for (int i = 0; i < 16; i++) {
        float v = x[(size_t)r * K + k0 + i];
        if (!isfinite(v)) nonfinite = 1;
        else ab = fmax(ab, fabs(v));
      }
      uint8_t got = q->scales[((size_t)r * K + k0) / 16];
      if (nonfinite) {
        if (got != 0x7F && bad++ == 0)
          printf("  %s: row %d block %d holds a NaN/Inf, scale 0x%02x\n", what, r, k0, got);
        continue;
      }
      uint8_t bs = e4m3_encode_rne((float)(ab / 6.0f) * s_c);
      float outer = q->outer[r / 256], sg = (float)ac / 448.0f;
      float ratio = outer > 0 ? sg / outer : 0.0f;
      uint8_t want = e4m3_encode_rne(e4m3_decode(bs) * ratio);
      if (got != want && bad++ == 0)
        printf("  %s: row %d block %d scale 0x%02x, want 0x%02x (bs 0x%02x, ratio %.9g)\n", what, r, k0, got, want, bs,
               ratio);
      for (int i = 0; i < 16; i++) {
        float v = x[(size_t)r * K + k0 + i];
        uint8_t c = nib(q->codes, (size_t)r * K + k0 + i);
        if (bs == 0) {
          if (c != 0 && bad++ == 0) printf("  %s: zero-scale block, code %d\n", what, c);
          continue;
        }
        double y = fabs(v) * (double)s_c / e4m3_decode(bs);  // the exact scaled magnitude
        double got_mag = e2m1_decode(c & 7), d = fabs(y - got_mag), best = y >= 6 ? 0 : grid_dist(y);
        if (y >= 6) d = got_mag == 6 ? 0 : 1;  // saturation
        int sign_ok = (c & 8) == ((v < 0 && c != 0) ? 8 : 0) || (c & 7) == 0;
        if ((d > best + 1e-6 * fmax(1, y) || !sign_ok) && bad++ == 0)
          printf("  %s: x %.9g scaled %.9g: code %d (%.3g), nearest at distance %.3g\n", what, v, y, c, got_mag, best);
      }
    }
  free(ca);
  return bad;
}

static void test_definition_random(void) {
  TEST_SECTION("rows: outer factors, folded scales and codes as defined (random, partial chunks and stripes)");
  const int shapes[][2] = {{256, 128}, {300, 208}, {16, 16}, {513, 400}, {128, 4096}};
  for (int s = 0; s < 5; s++) {
    int rows = shapes[s][0], K = shapes[s][1];
    float *x = xmalloc((size_t)rows * K * sizeof *x);
    fill_normal(x, (size_t)rows * K, 7 + s, 1.0f);
    for (int r = 0; r < rows; r += 37) x[(size_t)r * K + (r % K)] *= 50.0f;  // spread the chunk amaxes
    Q q = rows_rne(x, rows, K);
    int bad = check_definition(x, &q, "random");
    CHECK(bad == 0, "%dx%d: %d violations of the definition", rows, K, bad);
    CHECK(cta_stripes(rows) == (rows + 255) / 256, "stripes of %d rows", rows);
    q_free(&q);
    free(x);
  }
}

static void test_zero(void) {
  TEST_SECTION("zero tensor, zero chunk, zero stripe");
  const int rows = 512, K = 256;
  float *x = xcalloc((size_t)rows * K, sizeof *x), *d = xmalloc((size_t)rows * K * sizeof *d);
  Q q = rows_rne(x, rows, K);
  int nz = 0;
  for (size_t i = 0; i < (size_t)rows * K / 16; i++) nz += q.scales[i] != 0;
  CHECK(q.outer[0] == 0.0f && q.outer[1] == 0.0f && nz == 0, "all-zero: outer %g %g, %d nonzero scales", q.outer[0],
        q.outer[1], nz);
  nvfp4_cta_dequantize(q.codes, q.scales, q.outer, rows, K, d);
  int nzv = 0;
  for (size_t i = 0; i < (size_t)rows * K; i++) nzv += d[i] != 0.0f || signbit(d[i]);
  CHECK(nzv == 0, "all-zero dequantizes to +0 everywhere (%d others)", nzv);
  q_free(&q);
  // stripe 0 nonzero only in its first chunk (rows 0-127, K 0-127): the other chunks' blocks are 0,
  // stripe 1 stays all zero
  fill_normal(x, 128 * (size_t)K, 3, 1.0f);
  for (int r = 0; r < 128; r++)
    for (int k = 128; k < K; k++) x[(size_t)r * K + k] = 0.0f;
  q = rows_rne(x, rows, K);
  CHECK(q.outer[1] == 0.0f && q.outer[0] > 0.0f, "zero stripe 1: outer %g, stripe 0 %g", q.outer[1], q.outer[0]);
  nvfp4_cta_dequantize(q.codes, q.scales, q.outer, rows, K, d);
  nzv = 0;
  for (int r = 0; r < rows; r++)
    for (int k = 0; k < K; k++)
      if (r >= 128 || k >= 128) nzv += d[(size_t)r * K + k] != 0.0f;
  CHECK(nzv == 0, "zero chunks dequantize to 0 (%d nonzero)", nzv);
  CHECK(check_definition(x, &q, "zero chunks") == 0, "zero chunks: definition");
  done(&q, x, d);
}

// One outlier row in stripe 0: its outer factor is the outlier's, the other chunks of the stripe carry
// corrections < 1 (their small blocks get subnormal or zero scales), stripe 1 does not notice.
static void test_outlier_row(void) {
  TEST_SECTION("outlier row: stripe factor, corrections, subnormal and zero scales, other stripes untouched");
  const int rows = 512, K = 256;
  float *x = normal_matrix(rows, K, 11), *d = xmalloc((size_t)rows * K * sizeof *d);
  for (int k = 0; k < 16; k++) x[(size_t)5 * K + k] = 3e4f * (k % 2 ? -1.0f : 1.0f);  // row 5, chunk (0, 0)
  Q q = rows_rne(x, rows, K);
  CHECK(q.outer[0] == 3e4f / 448.0f, "stripe 0 outer %.9g, want 3e4/448 = %.9g", q.outer[0], 3e4f / 448.0f);
  CHECK(check_definition(x, &q, "outlier") == 0, "outlier: definition");
  // chunk (1, 0) (rows 128-255) has amax ~4, ratio ~4/3e4: its scales fold to E4M3 subnormals (or 0)
  int sub = 0, zero = 0, normal = 0;
  for (int r = 128; r < 256; r++)
    for (int b = 0; b < 8; b++) {
      uint8_t s = q.scales[(size_t)r * (K / 16) + b];
      sub += s > 0 && s < 0x08, zero += s == 0, normal += s >= 0x08;
    }
  printf("  chunk (1, 0) under the outlier: %d normal, %d subnormal, %d zero scales\n", normal, sub, zero);
  CHECK(sub > 0, "no subnormal E4M3 scales under a 3e4 outlier");
  // the values those scales give: the code's error at the unfolded scale (at most one E2M1 unit times
  // bs / S_c = bs * ratio * alpha < (2^-6 + 2^-10) alpha) plus the fold's (half an E4M3 step, 2^-10,
  // times |q| <= 6, times alpha)
  nvfp4_cta_dequantize(q.codes, q.scales, q.outer, rows, K, d);
  double worst = 0;
  for (int r = 128; r < 256; r++)
    for (int k = 0; k < K; k++) {
      uint8_t s = q.scales[(size_t)r * (K / 16) + k / 16];
      if (s == 0 || s >= 0x08) continue;
      double e = fabs(d[(size_t)r * K + k] - x[(size_t)r * K + k]);
      worst = fmax(worst, e);
    }
  double bound = (ldexp(1.0, -6) + 7.0 * ldexp(1.0, -10)) * q.outer[0] * 1.01;
  CHECK(worst <= bound, "subnormal-scale blocks: worst error %.4g > bound %.4g", worst, bound);
  // stripe 1 (rows 256-511) quantized alone gives the same bytes
  Q q1 = rows_rne(x + (size_t)256 * K, 256, K);
  CHECK(!memcmp(q1.codes, q.codes + (size_t)256 * K / 2, (size_t)256 * K / 2) &&
            !memcmp(q1.scales, q.scales + (size_t)256 * K / 16, (size_t)256 * K / 16) && q1.outer[0] == q.outer[1],
        "stripe 1 depends on stripe 0's outlier");
  q_free(&q1), q_free(&q);
  free(x), free(d);
}

// Relative L2 error of the dequantized values against x.
static double rel_l2(const float *x, const float *d, size_t n) {
  double e = 0, s = 0;
  for (size_t i = 0; i < n; i++) e += ((double)d[i] - x[i]) * ((double)d[i] - x[i]), s += (double)x[i] * x[i];
  return sqrt(e / s);
}

static void test_range(void) {
  TEST_SECTION("tiny and huge tensors: the fp32 outer factors carry the magnitude");
  const int rows = 256, K = 128;
  const float mags[] = {1e-30f, 1e-20f, 1e-8f, 1.0f, 1e10f, 1e30f, 3e37f};
  float *x = xmalloc((size_t)rows * K * sizeof *x), *d = xmalloc((size_t)rows * K * sizeof *d);
  for (int m = 0; m < 7; m++) {
    fill_normal(x, (size_t)rows * K, 5, 1.0f);
    for (size_t i = 0; i < (size_t)rows * K; i++) x[i] *= mags[m] / 4.0f;
    Q q = rows_rne(x, rows, K);
    nvfp4_cta_dequantize(q.codes, q.scales, q.outer, rows, K, d);
    double e = rel_l2(x, d, (size_t)rows * K);
    int finite = 1;
    for (size_t i = 0; i < (size_t)rows * K; i++) finite &= isfinite(d[i]);
    printf("  magnitude %.0e: outer %.4g, rel L2 %.4f\n", mags[m], q.outer[0], e);
    CHECK(finite && e > 0.02 && e < 0.2, "magnitude %g: rel L2 %.4f (finite %d)", mags[m], e, finite);
    CHECK(check_definition(x, &q, "range") == 0, "magnitude %g: definition", mags[m]);
    q_free(&q);
  }
  // a chunk amax below 448 * FLT_MIN: its factor is an fp32 subnormal, and 448 / amax overflows to FLT_MAX
  for (size_t i = 0; i < (size_t)rows * K; i++) x[i] = (i % 3 ? 1.0f : -1.0f) * 1e-39f;
  Q q = rows_rne(x, rows, K);
  CHECK(cta_encode_scale(1e-39f) == NV_FLT_MAX, "S_c of a 1e-39 chunk: %g", cta_encode_scale(1e-39f));
  CHECK(q.outer[0] > 0.0f && q.outer[0] < 1.2e-38f, "subnormal outer factor %g", q.outer[0]);
  nvfp4_cta_dequantize(q.codes, q.scales, q.outer, rows, K, d);
  int finite = 1;
  for (size_t i = 0; i < (size_t)rows * K; i++) finite &= isfinite(d[i]) && fabs(d[i]) <= 2e-39;
  CHECK(finite, "a subnormal tensor dequantizes to finite values of its size");
  done(&q, x, d);
}

static void test_nonfinite(void) {
  TEST_SECTION("NaN and Inf: their block's scale is the E4M3 NaN, the chunk and stripe ignore them");
  const int rows = 128, K = 64;
  float *x = normal_matrix(rows, K, 9), *d = xmalloc((size_t)rows * K * sizeof *d);
  Q a = rows_rne(x, rows, K);
  x[3] = NAN, x[(size_t)70 * K + 40] = INFINITY;
  Q b = rows_rne(x, rows, K);
  CHECK(b.scales[0] == 0x7F && b.scales[(size_t)70 * 4 + 2] == 0x7F, "NaN/Inf blocks: 0x%02x 0x%02x", b.scales[0],
        b.scales[70 * 4 + 2]);
  CHECK(check_definition(x, &b, "nonfinite") == 0, "nonfinite: definition");
  int same = 1;
  for (size_t i = 0; i < (size_t)rows * K / 16; i++)
    if (i != 0 && i != (size_t)70 * 4 + 2) same &= a.scales[i] == b.scales[i];
  CHECK(same || a.outer[0] != b.outer[0], "the other blocks changed");
  nvfp4_cta_dequantize(b.codes, b.scales, b.outer, rows, K, d);
  CHECK(isnan(d[0]) && isnan(d[15]) && !isnan(d[16]), "a NaN block dequantizes to NaN, its neighbour does not");
  q_free(&a), q_free(&b);
  free(x), free(d);
}

static void test_weights(void) {
  TEST_SECTION("2D16 weights: one common factor, W and W^T share codes, encode-centric tiles, the 2^-9 floor");
  const int N = 272, K = 160;  // partial chunks both ways
  float *w = xmalloc((size_t)N * K * sizeof *w), *d = xmalloc((size_t)N * K * sizeof *d),
        *dt = xmalloc((size_t)N * K * sizeof *dt);
  fill_normal(w, (size_t)N * K, 21, 0.02f);
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) w[(size_t)(16 + i) * K + 32 + j] = 0.0f;  // a zero tile
  w[(size_t)3 * K + 7] = 5.0f;                                             // chunk (0, 0)'s amax, the tensor's
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) w[(size_t)(144 + i) * K + 128 + j] = 1e-9f;  // a tiny tile in a tiny chunk
  for (int i = 128; i < 256; i++)
    for (int j = 128; j < K; j++)
      if (i < 144 || i >= 160) w[(size_t)i * K + j] = 0.0f;
  uint8_t *c = xcalloc((size_t)N * K / 2, 1), *s = xcalloc((size_t)N * K / 16, 1);
  uint8_t *ct = xcalloc((size_t)N * K / 2, 1), *st = xcalloc((size_t)N * K / 16, 1);
  float *o = xcalloc(cta_stripes(N), sizeof(float)), *ot = xcalloc(cta_stripes(K), sizeof(float));
  nvfp4_cta_quantize_weight(w, N, K, c, s, o, ct, st, ot);
  float g = 5.0f / 448.0f;
  int same_g = o[0] == g && o[1] == g && ot[0] == g;
  CHECK(same_g, "common factor: %.9g %.9g %.9g, want amax/448 = %.9g", o[0], o[1], ot[0], g);
  int codes_t = 1, scales_t = 1;
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) {
      codes_t &= nib(c, (size_t)n * K + k) == nib(ct, (size_t)k * N + n);
      scales_t &= s[((size_t)n * K + k) / 16] == st[((size_t)k * N + n) / 16];
    }
  CHECK(codes_t && scales_t, "W^T's codes and scales are W's transposed");
  nvfp4_cta_dequantize(c, s, o, N, K, d);
  nvfp4_cta_dequantize(ct, st, ot, K, N, dt);
  int tr = 1;
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) tr &= d[(size_t)n * K + k] == dt[(size_t)k * N + n];
  CHECK(tr, "W^T dequantizes to W transposed, bit for bit");
  // a zero tile: multiplier 448, stored scale e4m3(1/448) = 2^-9, every code 0, every value 0
  int zc = 1;
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++)
      zc &= nib(c, (size_t)(16 + i) * K + 32 + j) == 0 && d[(size_t)(16 + i) * K + 32 + j] == 0;
  CHECK(zc && s[(size_t)16 * (K / 16) + 2] == 0x01, "a zero tile: codes 0, values 0, scale 0x%02x (want 0x01)",
        s[16 * (K / 16) + 2]);
  // the tiny tile: its chunk has S_c = 448 / 1e-9 and ratio (1e-9/448) / g ~ 2e-10, so fp32(bs) * ratio
  // rounds to 0 in E4M3 and the floor keeps it at 2^-9
  uint8_t tiny = s[(size_t)144 * (K / 16) + 8];
  CHECK(tiny == CTA_E4M3_MIN, "tiny tile's folded scale 0x%02x, want the 2^-9 floor", tiny);
  // the encode-centric tile rule, by hand, for the tile holding the amax
  float s_c = cta_encode_scale(5.0f);
  uint8_t mult = e4m3_encode_rne(6.0f / (5.0f * s_c));
  CHECK(mult == cta_weight_mult(fp4_f2u(5.0f), s_c) &&
            s[0] == cta_fold_weight(e4m3_encode_rne(1.0f / e4m3_decode(mult)), 1.0f),
        "amax tile: mult 0x%02x, scale 0x%02x", mult, s[0]);
  // every tile: codes are E2M1_RNE(w * mult * S_c) (so |w * coeff| rounds to the nearest grid point)
  int bad = 0;
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) {
      float v = w[(size_t)n * K + k];
      uint32_t am = 0;
      for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
          uint32_t a = nv_abs_bits(w[(size_t)(n / 16 * 16 + i) * K + k / 16 * 16 + j]);
          am = a > am ? a : am;
        }
      float ca = 0;
      for (int i = n / 128 * 128; i < N && i < n / 128 * 128 + 128; i++)
        for (int j = k / 128 * 128; j < K && j < k / 128 * 128 + 128; j++) ca = fmaxf(ca, fabsf(w[(size_t)i * K + j]));
      float sc = cta_encode_scale(ca), coeff = e4m3_decode(cta_weight_mult(am, sc)) * sc;
      double y = fabs((double)(v * coeff));
      double gm = e2m1_decode(nib(c, (size_t)n * K + k) & 7);
      if ((y >= 6 ? gm != 6 : fabs(y - gm) > grid_dist(y) + 1e-9) && bad++ == 0)
        printf("  w[%d][%d] = %g: code %g for %g\n", n, k, v, gm, y);
    }
  CHECK(bad == 0, "%d weight codes off the encode-centric rule", bad);
  double e = rel_l2(w, d, (size_t)N * K);
  printf("  weights rel L2 %.4f\n", e);
  CHECK(e > 0.02 && e < 0.2, "weights rel L2 %.4f", e);
  free(w), free(d), free(dt), free(c), free(s), free(ct), free(st), free(o), free(ot);
}

static void test_cols(void) {
  TEST_SECTION("column copy: the row copy of x^T, after fixed-sign or plain H16 along the tokens");
  const int rows = 272, K = 48;
  float *x = xmalloc((size_t)rows * K * sizeof *x), *xt = xmalloc((size_t)rows * K * sizeof *xt);
  fill_normal(x, (size_t)rows * K, 31, 1.0f);
  for (int rot = 0; rot < 3; rot++) {
    for (int k = 0; k < K; k++)
      for (int r0 = 0; r0 < rows; r0 += 16) {
        float v[16];
        for (int i = 0; i < 16; i++) v[i] = x[(size_t)(r0 + i) * K + k];
        if (rot == 1) fp4_h16(v);
        if (rot == 2) {  // (1/4) H16 written out: H[i][j] = (-1)^popcount(i & j)
          float u[16];
          for (int i = 0; i < 16; i++) {
            double acc = 0;
            for (int j = 0; j < 16; j++) acc += (__builtin_popcount(i & j) & 1 ? -1.0 : 1.0) * v[j];
            u[i] = (float)(acc / 4);
          }
          for (int i = 0; i < 16; i++) v[i] = u[i];
        }
        for (int i = 0; i < 16; i++) xt[(size_t)k * rows + r0 + i] = v[i];
      }
    Q a = q_new(K, rows);
    nvfp4_cta_quantize_cols(x, rows, K, rot, NV_RNE, S0, a.codes, a.scales, a.outer);
    int bad = check_definition(xt, &a, rot == 0 ? "cols" : rot == 1 ? "cols H16" : "cols plain H16");
    CHECK(bad == 0, "rotation %d: the column copy is not the row copy of the rotated x^T (%d)", rot, bad);
    CHECK(cta_stripes(K) == 1 && a.outer[0] > 0, "column copy's outer factors cover the features");
    q_free(&a);
  }
  // plain H16 is its own inverse up to the 1/16: applied twice to dyadic data it gives the data back
  float v[16], v0[16];
  for (int i = 0; i < 16; i++) v0[i] = v[i] = (float)(i * 3 - 20) / 8;
  fp4_h16_plain(v), fp4_h16_plain(v);
  int back = 1;
  for (int i = 0; i < 16; i++) back &= v[i] == v0[i];
  CHECK(back, "plain H16 applied twice is the identity");
  free(x), free(xt);
}

static void test_sr(void) {
  TEST_SECTION("SR: reproducible per stream, unbiased given the folded scales");
  const int rows = 64, K = 64, draws = 400;
  float *x = xmalloc((size_t)rows * K * sizeof *x), *d = xmalloc((size_t)rows * K * sizeof *d);
  double *mean = xcalloc((size_t)rows * K, sizeof *mean);
  fill_normal(x, (size_t)rows * K, 41, 1.0f);
  Q a = q_new(rows, K), b = q_new(rows, K);
  PhiloxStream s1 = philox_stream(5, 1, 0, 2, 3), s2 = philox_stream(5, 1, 1, 2, 3);
  nvfp4_cta_quantize_rows(x, rows, K, NV_SR, s1, a.codes, a.scales, a.outer);
  nvfp4_cta_quantize_rows(x, rows, K, NV_SR, s1, b.codes, b.scales, b.outer);
  CHECK(!memcmp(a.codes, b.codes, (size_t)rows * K / 2), "same stream, other codes");
  nvfp4_cta_quantize_rows(x, rows, K, NV_SR, s2, b.codes, b.scales, b.outer);
  CHECK(memcmp(a.codes, b.codes, (size_t)rows * K / 2), "another micro-batch, the same codes");
  CHECK(!memcmp(a.scales, b.scales, (size_t)rows * K / 16), "SR changed the scales");
  // E[q] * S_c^-1 * bs = x exactly (round-up never clips: |x| * S_c / bs <= 6); folding the scale
  // is deterministic, so the mean of the unscaled, unfolded values tends to x
  for (int t = 0; t < draws; t++) {
    nvfp4_cta_quantize_rows(x, rows, K, NV_SR, philox_stream(5, 1, t, 2, 3), b.codes, b.scales, b.outer);
    nvfp4_cta_dequantize(b.codes, b.scales, b.outer, rows, K, d);
    for (size_t i = 0; i < (size_t)rows * K; i++) mean[i] += (double)d[i] / draws;
  }
  nvfp4_cta_dequantize(a.codes, a.scales, a.outer, rows, K, d);
  double e1 = 0, em = 0, s = 0;
  for (size_t i = 0; i < (size_t)rows * K; i++)
    e1 += pow(d[i] - x[i], 2), em += pow(mean[i] - x[i], 2), s += (double)x[i] * x[i];
  e1 = sqrt(e1 / s), em = sqrt(em / s);
  printf("  one draw rel L2 %.4f, mean of %d draws %.4f\n", e1, draws, em);
  // the mean keeps only the folding's bias (a second E4M3 rounding of each scale, at most 2^-4 relative)
  CHECK(em < 0.5 * e1 && em < 0.07, "SR mean %.4f vs one draw %.4f", em, e1);
  q_free(&a), q_free(&b);
  free(x), free(d), free(mean);
}

// C = apply_outer(A_unscaled B_unscaled^T) against the product of the dequantized operands in fp64.
static void test_gemm_identity(void) {
  TEST_SECTION("GEMM: alpha_i beta_j applied after accumulation equals the dequantized product (fp64)");
  const int M = 300, N = 272, K = 160;
  float *a = xmalloc((size_t)M * K * sizeof *a), *b = xmalloc((size_t)N * K * sizeof *b);
  fill_normal(a, (size_t)M * K, 51, 1.0f), fill_normal(b, (size_t)N * K, 52, 0.05f);
  for (int k = 0; k < K; k++) a[(size_t)260 * K + k] *= 100.0f;  // stripes with other factors
  Q qa = rows_rne(a, M, K);
  uint8_t *cb = xcalloc((size_t)N * K / 2, 1), *sb = xcalloc((size_t)N * K / 16, 1);
  float *ob = xcalloc(cta_stripes(N), sizeof(float));
  nvfp4_cta_quantize_weight(b, N, K, cb, sb, ob, NULL, NULL, NULL);
  float *au = xmalloc((size_t)M * K * sizeof *au), *bu = xmalloc((size_t)N * K * sizeof *bu);
  float *ad = xmalloc((size_t)M * K * sizeof *ad), *bd = xmalloc((size_t)N * K * sizeof *bd);
  nvfp4_cta_dequantize_unscaled(qa.codes, qa.scales, M, K, au), nvfp4_cta_dequantize_unscaled(cb, sb, N, K, bu);
  nvfp4_cta_dequantize(qa.codes, qa.scales, qa.outer, M, K, ad), nvfp4_cta_dequantize(cb, sb, ob, N, K, bd);
  float *c = xmalloc((size_t)M * N * sizeof *c);
  double worst = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float acc = 0;  // fp32 accumulation of exact products, as a tensor core does
      for (int k = 0; k < K; k++) acc += au[(size_t)i * K + k] * bu[(size_t)j * K + k];
      c[(size_t)i * N + j] = acc;
    }
  nvfp4_cta_apply_outer(c, M, N, qa.outer, ob);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double ref = 0, mag = 0;
      for (int k = 0; k < K; k++) {
        double p = (double)ad[(size_t)i * K + k] * bd[(size_t)j * K + k];
        ref += p, mag += fabs(p);
      }
      worst = fmax(worst, fabs(c[(size_t)i * N + j] - ref) / (mag > 0 ? mag : 1));
    }
  printf("  worst |C - ref| / sum |products|: %.3g\n", worst);
  CHECK(worst < 1e-5, "outer factors after accumulation differ from the dequantized product: %.3g", worst);
  CHECK(qa.outer[1] > 10 * qa.outer[0], "the outlier stripe's factor %.4g vs %.4g", qa.outer[1], qa.outer[0]);
  q_free(&qa);
  free(a), free(b), free(cb), free(sb), free(ob), free(au), free(bu), free(ad), free(bd), free(c);
}

int main(void) {
  test_definition_random();
  test_zero();
  test_outlier_row();
  test_range();
  test_nonfinite();
  test_weights();
  test_cols();
  test_sr();
  test_gemm_identity();
  TEST_END();
}
