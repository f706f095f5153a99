// tests/unit/test_ops.c: every CPU op of model/ops.h against a direct double-precision formula written
// here, on random inputs. Backward ops are checked against central differences of those double
// formulas (d/dx of sum(dout * f(x))), so they are tested against the math, not against a second
// copy of the same derivation.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/ops.h"
#include "tests/test.h"

static Rng rng;

static float *randn(size_t n, float scale) {
  float *x = xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(&rng);
  return x;
}

static double *to_double(const float *x, size_t n) {
  double *d = xmalloc(n * sizeof(double));
  for (size_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

// One CHECK per array: max_i |got - want| / (atol + rtol |want|) must be <= 1. Prints the worst.
static void check_array(const char *what, const float *got, const double *want, size_t n, double atol, double rtol) {
  double worst = 0, abs_err = 0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs(got[i] - want[i]) / (atol + rtol * fabs(want[i]));
    if (!(e <= worst)) worst = e, at = i, abs_err = fabs(got[i] - want[i]);
  }
  printf("  %-40s n=%-5zu max |err| %.2e (%.2f of tolerance)\n", what, n, abs_err, worst);
  CHECK(worst <= 1.0, "%s: element %zu: got %.9g, want %.9g", what, at, got[at], want[at]);
}

// ---- central differences of a scalar double function ------------------------------------------

typedef double (*ScalarFn)(void *ctx);

// d f / d x[i] for every i, by central differences with step h (x is restored).
static double *fd_grad(ScalarFn f, void *ctx, double *x, size_t n, double h) {
  double *g = xmalloc(n * sizeof(double));
  for (size_t i = 0; i < n; i++) {
    double x0 = x[i];
    x[i] = x0 + h;
    double fp = f(ctx);
    x[i] = x0 - h;
    double fm = f(ctx);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

static double dot_d(const double *a, const double *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

// ---- matmul --------------------------------------------------------------------------------------

static void test_matmul(void) {
  TEST_SECTION("matmul");
  // odd sizes: tails of the 4-token tiles and of the 64-wide output blocks
  const int N = 13, I = 37, O = 70;
  float *x = randn((size_t)N * I, 1), *w = randn((size_t)O * I, 1), *dy = randn((size_t)N * O, 1);
  double *xd = to_double(x, (size_t)N * I), *wd = to_double(w, (size_t)O * I), *dyd = to_double(dy, (size_t)N * O);
  float *y = xmalloc((size_t)N * O * sizeof(float));
  matmul_forward(y, x, w, N, I, O);
  double *want = xcalloc((size_t)N * O, sizeof(double));
  for (int n = 0; n < N; n++)
    for (int o = 0; o < O; o++) want[n * O + o] = dot_d(xd + n * I, wd + o * I, I);
  check_array("forward y = x W^T", y, want, (size_t)N * O, 1e-5, 1e-5);

  // dx = dy W (overwrite, then accumulate onto a random start), dW += dy^T x
  float *dx = randn((size_t)N * I, 1), *dx0 = xmalloc((size_t)N * I * sizeof(float));
  memcpy(dx0, dx, (size_t)N * I * sizeof(float));
  float *dw = randn((size_t)O * I, 1);
  double *dw_want = to_double(dw, (size_t)O * I);
  matmul_backward(dx, dw, dy, x, w, N, I, O, 0);
  double *dx_want = xcalloc((size_t)N * I, sizeof(double));
  for (int n = 0; n < N; n++)
    for (int o = 0; o < O; o++)
      for (int i = 0; i < I; i++) dx_want[n * I + i] += dyd[n * O + o] * wd[o * I + i];
  for (int o = 0; o < O; o++)
    for (int n = 0; n < N; n++)
      for (int i = 0; i < I; i++) dw_want[o * I + i] += dyd[n * O + o] * xd[n * I + i];
  check_array("backward dx = dy W", dx, dx_want, (size_t)N * I, 1e-5, 1e-5);
  check_array("backward dW += dy^T x", dw, dw_want, (size_t)O * I, 1e-5, 1e-5);

  memcpy(dx, dx0, (size_t)N * I * sizeof(float));
  matmul_backward(dx, NULL, dy, x, w, N, I, O, 1);
  for (size_t i = 0; i < (size_t)N * I; i++) dx_want[i] += dx0[i];
  check_array("backward dx += dy W (accumulate)", dx, dx_want, (size_t)N * I, 1e-5, 1e-5);
  free(x), free(w), free(dy), free(xd), free(wd), free(dyd), free(y), free(want), free(dx), free(dx0), free(dw);
  free(dw_want), free(dx_want);
}

// ---- RMSNorm -------------------------------------------------------------------------------------

typedef struct {
  int N, D;
  double *x, *w, *dy, eps;
} NormCtx;

static void naive_rmsnorm(double *y, double *rstd, const double *x, const double *w, int N, int D, double eps) {
  for (int n = 0; n < N; n++) {
    double ms = dot_d(x + n * D, x + n * D, D) / D, r = 1 / sqrt(ms + eps);
    if (rstd) rstd[n] = r;
    for (int i = 0; i < D; i++) y[n * D + i] = x[n * D + i] * r * w[i];
  }
}

static double norm_objective(void *p) {
  NormCtx *c = p;
  double *y = xmalloc((size_t)c->N * c->D * sizeof(double));
  naive_rmsnorm(y, NULL, c->x, c->w, c->N, c->D, c->eps);
  double s = dot_d(y, c->dy, (size_t)c->N * c->D);
  free(y);
  return s;
}

static void test_rmsnorm(void) {
  TEST_SECTION("rmsnorm");
  const int N = 9, D = 70;
  const float eps = 1e-5f;
  float *x = randn((size_t)N * D, 2), *w = randn(D, 1), *dy = randn((size_t)N * D, 1);
  for (int i = 0; i < D; i++) w[i] += 1;
  NormCtx c = {N, D, to_double(x, (size_t)N * D), to_double(w, D), to_double(dy, (size_t)N * D), eps};
  float *y = xmalloc((size_t)N * D * sizeof(float)), *rstd = xmalloc(N * sizeof(float));
  double *yd = xmalloc((size_t)N * D * sizeof(double)), *rd = xmalloc(N * sizeof(double));
  rmsnorm_forward(y, rstd, x, w, N, D, eps);
  naive_rmsnorm(yd, rd, c.x, c.w, N, D, eps);
  check_array("forward y", y, yd, (size_t)N * D, 1e-6, 1e-5);
  check_array("forward rstd", rstd, rd, N, 0, 1e-6);

  // backward accumulates: start dx, dw from random values and compare the increments
  float *dx = randn((size_t)N * D, 1), *dw = randn(D, 1);
  double *dx_want = to_double(dx, (size_t)N * D), *dw_want = to_double(dw, D);
  rmsnorm_backward(dx, dw, dy, x, w, rstd, N, D);
  double *gx = fd_grad(norm_objective, &c, c.x, (size_t)N * D, 1e-5), *gw = fd_grad(norm_objective, &c, c.w, D, 1e-5);
  for (int i = 0; i < N * D; i++) dx_want[i] += gx[i];
  for (int i = 0; i < D; i++) dw_want[i] += gw[i];
  check_array("backward dx += (vs finite diff.)", dx, dx_want, (size_t)N * D, 1e-5, 1e-4);
  check_array("backward dw += (vs finite diff.)", dw, dw_want, D, 1e-5, 1e-4);
  free(x), free(w), free(dy), free(c.x), free(c.w), free(c.dy), free(y), free(rstd), free(yd), free(rd), free(dx);
  free(dw), free(dx_want), free(dw_want), free(gx), free(gw);
}

// ---- RoPE ----------------------------------------------------------------------------------------

// transformers' default + _compute_llama3_parameters, written the way HF writes it (whole-vector
// where() steps), in double.
static void hf_inv_freq(double *out, int hd, double theta, int scaling, double factor, double lo, double hi,
                        double orig) {
  for (int i = 0; i < hd / 2; i++) {
    double inv = 1.0 / pow(theta, (double)(2 * i) / hd);
    if (scaling) {
      double low_wl = orig / lo, high_wl = orig / hi, wl = 2 * M_PI / inv;
      double inv_l = wl > low_wl ? inv / factor : inv;
      double smooth = (orig / wl - lo) / (hi - lo);
      double smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l;
      int medium = !(wl < high_wl) && !(wl > low_wl);
      inv = medium ? smoothed : inv_l;
    }
    out[i] = inv;
  }
}

static void naive_rope(double *x, const double *inv_freq, int B, int T, int nh, int hd) {
  int half = hd / 2;
  for (int n = 0; n < B * T; n++)
    for (int h = 0; h < nh; h++)
      for (int i = 0; i < half; i++) {
        double *v = x + ((size_t)n * nh + h) * hd, a = (n % T) * inv_freq[i];
        double x1 = v[i], x2 = v[i + half];
        v[i] = x1 * cos(a) - x2 * sin(a);
        v[i + half] = x2 * cos(a) + x1 * sin(a);
      }
}

static void test_rope(void) {
  TEST_SECTION("rope: Llama-3.1 inv_freq (hd 128, theta 500000, factor 8, low 1, high 4, orig 8192)");
  LlamaConfig c;
  if (llama_preset("llama3_8b", &c)) die("no llama3_8b preset");
  CHECK(c.rope_scaling == 1 && c.rope_theta == 500000.0f && c.rope_factor == 8.0f && c.rope_low_freq_factor == 1.0f &&
            c.rope_high_freq_factor == 4.0f && c.rope_original_max_pos == 8192 && llama_head_dim(&c) == 128,
        "llama3_8b preset RoPE fields");
  float inv[64];
  double want[64];
  rope_inv_freq(inv, 128, &c);
  hf_inv_freq(want, 128, 500000, 1, 8, 1, 4, 8192);
  check_array("inv_freq (scaled) vs HF formula", inv, want, 64, 0, 1e-6);
  // The three bands: wavelength 2 pi 500000^(i/64) < 2048 (i <= 28) kept, > 8192 (i >= 35)
  // divided by 8, i = 29..34 interpolated.
  int kept = 0, divided = 0, medium = 0;
  for (int i = 0; i < 64; i++) {
    double base = 1.0 / pow(500000.0, i / 64.0), wl = 2 * M_PI / base;
    if (wl < 2048) kept += fabs(inv[i] - base) <= 1e-6 * base;
    else if (wl > 8192) divided += fabs(inv[i] - base / 8) <= 1e-6 * base / 8;
    else medium += inv[i] < base && inv[i] > base / 8;
  }
  printf("  bands: %d kept, %d divided by 8, %d interpolated\n", kept, divided, medium);
  CHECK(kept == 29 && divided == 29 && medium == 6, "bands %d/%d/%d, want 29/29/6", kept, divided, medium);
  CHECK_NEAR(inv[0], 1.0, 0);
  c.rope_scaling = 0;
  rope_inv_freq(inv, 128, &c);
  hf_inv_freq(want, 128, 500000, 0, 0, 0, 0, 0);
  check_array("inv_freq (unscaled) vs 1/theta^(2i/hd)", inv, want, 64, 0, 1e-6);

  for (int scaled = 0; scaled <= 1; scaled++) {
    TEST_SECTION(scaled ? "rope forward/backward, scaled (orig 64: 1 frequency kept, 2 interpolated, 5 divided)"
                        : "rope forward/backward, unscaled");
    const int B = 2, T = 11, nh = 3, hd = 16;
    LlamaConfig s = c;
    s.rope_theta = 10000, s.rope_scaling = scaled, s.rope_original_max_pos = 64;
    s.rope_factor = 4, s.rope_low_freq_factor = 1, s.rope_high_freq_factor = 4;
    float cos_t[11 * 8], sin_t[11 * 8];
    rope_tables(cos_t, sin_t, T, hd, &s);
    double fr[8];
    hf_inv_freq(fr, hd, 10000, scaled, 4, 1, 4, 64);
    size_t n = (size_t)B * T * nh * hd;
    float *x = randn(n, 1), *y = randn(n, 1);
    double *want_f = to_double(x, n), *want_b = to_double(y, n), neg[8];
    float *rx = xmalloc(n * sizeof(float)), *rty = xmalloc(n * sizeof(float)), *back = xmalloc(n * sizeof(float));
    memcpy(rx, x, n * sizeof(float));
    rope_forward(rx, cos_t, sin_t, NULL, B, T, nh, hd);
    naive_rope(want_f, fr, B, T, nh, hd);
    check_array("forward vs naive rotation", rx, want_f, n, 1e-6, 1e-5);
    // The backward is the transpose: rotation by -angle, so <R x, y> = <x, R^T y> and R^T R x = x.
    memcpy(rty, y, n * sizeof(float));
    rope_backward(rty, cos_t, sin_t, NULL, B, T, nh, hd);
    for (int i = 0; i < hd / 2; i++) neg[i] = -fr[i];
    naive_rope(want_b, neg, B, T, nh, hd);
    check_array("backward vs naive rotation by -angle", rty, want_b, n, 1e-6, 1e-5);
    double lhs = 0, rhs = 0;
    for (size_t i = 0; i < n; i++) lhs += (double)rx[i] * y[i], rhs += (double)x[i] * rty[i];
    CHECK_NEAR(lhs, rhs, 1e-4);
    memcpy(back, rx, n * sizeof(float));
    rope_backward(back, cos_t, sin_t, NULL, B, T, nh, hd);
    double *xd = to_double(x, n);
    check_array("backward(forward(x)) = x", back, xd, n, 1e-6, 1e-6);
    free(x), free(y), free(want_f), free(want_b), free(rx), free(rty), free(back), free(xd);
  }
}

// ---- attention -----------------------------------------------------------------------------------

typedef struct {
  int B, T, H, KV, hd;
  double *q, *k, *v, *dout;
} AttnCtx;

// softmax(q k^T / sqrt(hd) + causal mask) v with the full [T, T] score matrix; query head h reads
// kv head h / (H / KV).
static void naive_attention(double *out, double *lse, const AttnCtx *c) {
  const int B = c->B, T = c->T, H = c->H, KV = c->KV, hd = c->hd, qs = H * hd, ks = KV * hd;
  double *s = xmalloc((size_t)T * T * sizeof(double));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      int g = h / (H / KV);
      for (int t = 0; t < T; t++)
        for (int j = 0; j < T; j++)
          s[t * T + j] = j > t
                             ? -INFINITY  // the causal mask
                             : dot_d(c->q + (b * T + t) * qs + h * hd, c->k + (b * T + j) * ks + g * hd, hd) / sqrt(hd);
      for (int t = 0; t < T; t++) {
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < T; j++) mx = fmax(mx, s[t * T + j]);
        for (int j = 0; j < T; j++) sum += exp(s[t * T + j] - mx);
        if (lse) lse[(b * H + h) * T + t] = mx + log(sum);
        double *o = out + (b * T + t) * qs + h * hd;
        for (int i = 0; i < hd; i++) o[i] = 0;
        for (int j = 0; j < T; j++) {
          double p = exp(s[t * T + j] - mx) / sum;
          for (int i = 0; i < hd; i++) o[i] += p * c->v[(b * T + j) * ks + g * hd + i];
        }
      }
    }
  free(s);
}

static double attn_objective(void *p) {
  AttnCtx *c = p;
  size_t n = (size_t)c->B * c->T * c->H * c->hd;
  double *o = xmalloc(n * sizeof(double));
  naive_attention(o, NULL, c);
  double r = dot_d(o, c->dout, n);
  free(o);
  return r;
}

static void test_attention(void) {
  TEST_SECTION("attention (causal, GQA 4 query heads on 2 kv heads)");
  const int B = 2, T = 9, H = 4, KV = 2, hd = 8;
  const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
  float *q = randn(nq, 1), *k = randn(nk, 1), *v = randn(nk, 1), *dout = randn(nq, 1);
  AttnCtx c = {B, T, H, KV, hd, to_double(q, nq), to_double(k, nk), to_double(v, nk), to_double(dout, nq)};
  float *out = xmalloc(nq * sizeof(float)), *lse = xmalloc((size_t)B * H * T * sizeof(float));
  double *out_d = xmalloc(nq * sizeof(double)), *lse_d = xmalloc((size_t)B * H * T * sizeof(double));
  attention_forward(out, lse, q, k, v, NULL, B, T, H, KV, hd);
  naive_attention(out_d, lse_d, &c);
  check_array("forward out vs naive softmax", out, out_d, nq, 1e-6, 1e-5);
  check_array("forward lse", lse, lse_d, (size_t)B * H * T, 1e-6, 1e-6);

  // Causal: changing keys/values at positions > 4 of sequence 0 leaves its rows 0..4 unchanged.
  // GQA: changing kv head 1 leaves query heads 0 and 1 (which read kv head 0) unchanged.
  float *k2 = xmalloc(nk * sizeof(float)), *v2 = xmalloc(nk * sizeof(float)), *out2 = xmalloc(nq * sizeof(float));
  float *lse2 = xmalloc((size_t)B * H * T * sizeof(float));
  memcpy(k2, k, nk * sizeof(float)), memcpy(v2, v, nk * sizeof(float));
  for (int t = 5; t < T; t++)
    for (int i = 0; i < KV * hd; i++) k2[t * KV * hd + i] += 1, v2[t * KV * hd + i] -= 1;
  attention_forward(out2, lse2, q, k2, v2, NULL, B, T, H, KV, hd);
  int same_past = !memcmp(out2, out, (size_t)5 * H * hd * sizeof(float));
  int changed_future = memcmp(out2 + 5 * H * hd, out + 5 * H * hd, (size_t)4 * H * hd * sizeof(float)) != 0;
  CHECK(same_past && changed_future, "causal mask: past rows unchanged %d, later rows changed %d", same_past,
        changed_future);
  memcpy(k2, k, nk * sizeof(float)), memcpy(v2, v, nk * sizeof(float));
  for (int n = 0; n < B * T; n++)
    for (int i = hd; i < 2 * hd; i++) k2[n * KV * hd + i] *= 2, v2[n * KV * hd + i] += 1;  // kv head 1
  attention_forward(out2, lse2, q, k2, v2, NULL, B, T, H, KV, hd);
  int heads01_same = 1, heads23_changed = 1;
  for (int n = 0; n < B * T; n++) {
    heads01_same &= !memcmp(out2 + n * H * hd, out + n * H * hd, 2 * hd * sizeof(float));
    heads23_changed &= memcmp(out2 + n * H * hd + 2 * hd, out + n * H * hd + 2 * hd, 2 * hd * sizeof(float)) != 0;
  }
  CHECK(heads01_same && heads23_changed, "GQA mapping: heads 0,1 unchanged %d, heads 2,3 changed %d", heads01_same,
        heads23_changed);

  float *dq = xmalloc(nq * sizeof(float)), *dk = xmalloc(nk * sizeof(float)), *dv = xmalloc(nk * sizeof(float));
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, NULL, B, T, H, KV, hd);
  double *gq = fd_grad(attn_objective, &c, c.q, nq, 1e-5), *gk = fd_grad(attn_objective, &c, c.k, nk, 1e-5);
  double *gv = fd_grad(attn_objective, &c, c.v, nk, 1e-5);
  check_array("backward dq (vs finite diff.)", dq, gq, nq, 1e-5, 1e-4);
  check_array("backward dk (vs finite diff.)", dk, gk, nk, 1e-5, 1e-4);
  check_array("backward dv (vs finite diff.)", dv, gv, nk, 1e-5, 1e-4);
  free(q), free(k), free(v), free(dout), free(c.q), free(c.k), free(c.v), free(c.dout), free(out), free(lse);
  free(out_d), free(lse_d), free(k2), free(v2), free(out2), free(lse2), free(dq), free(dk), free(dv), free(gq);
  free(gk), free(gv);
}

// ---- SwiGLU, residual, embedding -------------------------------------------------------------------

static void test_swiglu(void) {
  TEST_SECTION("swiglu");
  const size_t n = 257;
  float *g = randn(n, 3), *u = randn(n, 1), *dy = randn(n, 1), *y = xmalloc(n * sizeof(float));
  float *dg = xmalloc(n * sizeof(float)), *du = xmalloc(n * sizeof(float));
  double *want = xmalloc(n * sizeof(double)), *want_dg = xmalloc(n * sizeof(double));
  double *want_du = xmalloc(n * sizeof(double));
  swiglu_forward(y, g, u, n);
  swiglu_backward(dg, du, dy, g, u, n);
  const double h = 1e-6;
  for (size_t i = 0; i < n; i++) {
    double x = g[i], silu = x / (1 + exp(-x));
    want[i] = silu * u[i];
    // d/dgate by a central difference of silu in double; d/dup = silu
    double sp = (x + h) / (1 + exp(-(x + h))), sm = (x - h) / (1 + exp(-(x - h)));
    want_dg[i] = dy[i] * u[i] * (sp - sm) / (2 * h);
    want_du[i] = dy[i] * silu;
  }
  check_array("forward silu(g) * u", y, want, n, 1e-6, 1e-6);
  check_array("backward dgate (vs finite diff.)", dg, want_dg, n, 1e-6, 1e-5);
  check_array("backward dup", du, want_du, n, 1e-6, 1e-6);
  free(g), free(u), free(dy), free(y), free(dg), free(du), free(want), free(want_dg), free(want_du);
}

static void test_residual_embedding(void) {
  TEST_SECTION("residual, embedding");
  const size_t n = 100;
  float *a = randn(n, 1), *b = randn(n, 1), *y = xmalloc(n * sizeof(float));
  double *want = xmalloc(n * sizeof(double));
  residual_forward(y, a, b, n);
  for (size_t i = 0; i < n; i++) want[i] = (double)a[i] + b[i];
  check_array("residual a + b", y, want, n, 1e-7, 1e-7);
  residual_forward(a, a, b, n);  // in place, as out may alias a
  check_array("residual in place", a, want, n, 1e-7, 1e-7);

  const int V = 7, D = 70, N = 12;
  const int tok[12] = {3, 0, 6, 3, 3, 1, 6, 2, 0, 5, 3, 4};  // repeats exercise the backward's sums
  float *table = randn((size_t)V * D, 1), *out = xmalloc((size_t)N * D * sizeof(float));
  embedding_forward(out, tok, table, N, D, V);
  int rows_ok = 1;
  for (int i = 0; i < N; i++) rows_ok &= !memcmp(out + i * D, table + tok[i] * D, D * sizeof(float));
  CHECK(rows_ok, "embedding rows are copies of the table rows");
  float *dout = randn((size_t)N * D, 1), *dtable = randn((size_t)V * D, 1);
  double *dwant = to_double(dtable, (size_t)V * D);
  for (int i = 0; i < N; i++)
    for (int d = 0; d < D; d++) dwant[tok[i] * D + d] += dout[i * D + d];
  embedding_backward(dtable, dout, tok, N, D);
  check_array("embedding backward dtable +=", dtable, dwant, (size_t)V * D, 1e-6, 1e-6);
  free(a), free(b), free(y), free(want), free(table), free(out), free(dout), free(dtable), free(dwant);
}

// ---- output head + cross-entropy ------------------------------------------------------------------

static void test_crossentropy(void) {
  TEST_SECTION("head + cross-entropy");
  const int N = 11, D = 8, V = 23, IGN = -100;
  const int tg[11] = {4, IGN, 0, 22, 7, IGN, 7, 13, 1, IGN, 19};
  float *x = randn((size_t)N * D, 1), *w = randn((size_t)V * D, 1);
  double *xd = to_double(x, (size_t)N * D), *wd = to_double(w, (size_t)V * D);
  const float dloss = 0.37f;
  // naive: full logits in double, mean over the 8 counted targets, d(logits) = (p - onehot) dloss/8
  double loss = 0, *dlg = xcalloc((size_t)N * V, sizeof(double)), *dx_want = xcalloc((size_t)N * D, sizeof(double));
  double *dw_want = xcalloc((size_t)V * D, sizeof(double));
  int count = 8;
  for (int n = 0; n < N; n++) {
    if (tg[n] == IGN) continue;
    double lg[23], mx = -INFINITY, sum = 0;
    for (int v = 0; v < V; v++) lg[v] = dot_d(xd + n * D, wd + v * D, D), mx = fmax(mx, lg[v]);
    for (int v = 0; v < V; v++) sum += exp(lg[v] - mx);
    loss += (mx + log(sum) - lg[tg[n]]) / count;
    for (int v = 0; v < V; v++) dlg[n * V + v] = (exp(lg[v] - mx) / sum - (v == tg[n])) * dloss / count;
  }
  for (int n = 0; n < N; n++)
    for (int v = 0; v < V; v++)
      for (int d = 0; d < D; d++) {
        dx_want[n * D + d] += dlg[n * V + v] * wd[v * D + d];
        dw_want[v * D + d] += dlg[n * V + v] * xd[n * D + d];
      }

  float *scratch = xmalloc((size_t)N * V * sizeof(float));
  float *dx = xmalloc((size_t)N * D * sizeof(float)), *dw = xcalloc((size_t)V * D, sizeof(float));
  float l_only = head_crossentropy(NULL, NULL, scratch, x, w, tg, N, D, V, N, IGN, 0);
  float l = head_crossentropy(dx, dw, scratch, x, w, tg, N, D, V, N, IGN, dloss);
  CHECK_NEAR(l_only, loss, 1e-5);
  CHECK(l == l_only, "loss with and without gradients: %.9g vs %.9g", l, l_only);
  check_array("dx", dx, dx_want, (size_t)N * D, 1e-7, 1e-5);
  check_array("dW", dw, dw_want, (size_t)V * D, 1e-7, 1e-5);
  int ignored_zero = 1;
  for (int n = 0; n < N; n++)
    if (tg[n] == IGN)
      for (int d = 0; d < D; d++) ignored_zero &= dx[n * D + d] == 0.0f;
  CHECK(ignored_zero, "ignored targets give exactly zero d(hidden)");

  // Chunked == unchunked, bit for bit: rows are independent and dW adds tokens in order.
  for (int chunk = 1; chunk <= 5; chunk += 2) {
    float *dx_c = xmalloc((size_t)N * D * sizeof(float)), *dw_c = xcalloc((size_t)V * D, sizeof(float));
    float l_c = head_crossentropy(dx_c, dw_c, scratch, x, w, tg, N, D, V, chunk, IGN, dloss);
    int same = l_c == l && !memcmp(dx_c, dx, (size_t)N * D * sizeof(float)) &&
               !memcmp(dw_c, dw, (size_t)V * D * sizeof(float));
    CHECK(same, "chunk %d differs from unchunked (loss %.9g vs %.9g)", chunk, l_c, l);
    free(dx_c), free(dw_c);
  }
  // dW accumulates across calls
  head_crossentropy(dx, dw, scratch, x, w, tg, N, D, V, 4, IGN, dloss);
  for (size_t i = 0; i < (size_t)V * D; i++) dw_want[i] *= 2;
  check_array("dW accumulates over two calls", dw, dw_want, (size_t)V * D, 1e-7, 1e-5);

  // every target ignored: loss 0, zero gradients, no NaN
  int all_ign[11];
  for (int n = 0; n < N; n++) all_ign[n] = IGN;
  memset(dw, 0, (size_t)V * D * sizeof(float));
  float l0 = head_crossentropy(dx, dw, scratch, x, w, all_ign, N, D, V, 3, IGN, dloss);
  int zeros = 1;
  for (int i = 0; i < N * D; i++) zeros &= dx[i] == 0.0f;
  for (int i = 0; i < V * D; i++) zeros &= dw[i] == 0.0f;
  CHECK(l0 == 0.0f && zeros, "all targets ignored: loss %g, gradients all zero %d", l0, zeros);
  free(x), free(w), free(xd), free(wd), free(dlg), free(dx_want), free(dw_want), free(scratch), free(dx), free(dw);
}

// head_rows_nll computes the head only for the asked rows; a row's loss must be the same bits whatever
// else is asked (and in any order, repeated rows included), and equal -log softmax computed directly.
static void test_rows_nll(void) {
  TEST_SECTION("head_rows_nll: only the asked rows, bit-identical however they are asked");
  const int N = 9, D = 16, V = 40;
  float *x = randn((size_t)N * D, 1.0f), *w = randn((size_t)V * D, 0.3f), *scratch = randn((size_t)N * V, 1.0f);
  int all_rows[9], all_tg[9];
  for (int n = 0; n < N; n++) all_rows[n] = n, all_tg[n] = (n * 7 + 3) % V;
  int rows[5] = {7, 2, 2, 0, 7}, tg[5] = {all_tg[7], all_tg[2], 11, all_tg[0], all_tg[7]};
  float a[9], b[5];
  head_rows_nll(a, scratch, x, w, all_rows, all_tg, N, D, V, 4);
  head_rows_nll(b, scratch, x, w, rows, tg, 5, D, V, 2);
  int same = 1, positive = 1;
  for (int n = 0; n < N; n++) positive &= a[n] > 0.0f;
  for (int i = 0; i < 5; i++)
    if (i != 2) same &= !memcmp(&a[rows[i]], &b[i], sizeof(float));
  CHECK(same && positive, "asked rows bit-identical to all rows %d, losses > 0 %d", same, positive);
  double z = 0, lg11 = 0;  // row 2, target 11, in double
  for (int v = 0; v < V; v++) {
    double l = 0;
    for (int k = 0; k < D; k++) l += (double)x[2 * D + k] * w[(size_t)v * D + k];
    z += exp(l);
    if (v == 11) lg11 = l;
  }
  CHECK_NEAR(b[2], log(z) - lg11, 1e-5);
  free(x), free(w), free(scratch);
}

static void test_ops_table(void) {
  TEST_SECTION("CPU backend table");
  const Ops *o = cpu_backend_open();
  int complete = o->alloc && o->release && o->zero && o->upload && o->download && o->acts_to_f32 && o->embed_fwd &&
                 o->embed_bwd && o->rmsnorm_fwd && o->rmsnorm_bwd && o->matmul_fwd && o->matmul_bwd && o->rope_fwd &&
                 o->rope_bwd && o->attention_fwd && o->attention_bwd && o->swiglu_fwd && o->swiglu_bwd &&
                 o->residual_fwd && o->head_ce && o->set_grad_overwrite && o->head_nll;
  CHECK(complete, "every CPU table entry is set");
  CHECK(o->act_bytes == 4 && !strcmp(o->name, "cpu"), "cpu table: %s, act_bytes %d", o->name, o->act_bytes);
  CHECK(o->ctx != NULL, "the CPU table carries its instance (ctx)");

  // Two instances keep their own state: gradient overwrite on in one leaves the other adding.
  const Ops *p = cpu_backend_open();
  CHECK(p != o && p->ctx != o->ctx, "each cpu_backend_open is a new instance");
  const int N = 2, D = 8;
  float x[16], w[8], dout[16], dx[16], rstd[2], dw_o[8], dw_p[8];
  for (int i = 0; i < N * D; i++) x[i] = 0.1f * (i + 1), dout[i] = 0.05f * (i % 5) - 0.1f;
  for (int i = 0; i < D; i++) w[i] = 1.0f + 0.01f * i, dw_o[i] = dw_p[i] = 100.0f;
  rmsnorm_forward(dx, rstd, x, w, N, D, 1e-5f);
  o->set_grad_overwrite(o->ctx, 1);
  o->rmsnorm_bwd(o->ctx, dx, dw_o, dout, x, w, rstd, N, D);
  p->rmsnorm_bwd(p->ctx, dx, dw_p, dout, x, w, rstd, N, D);
  int separate = 1;
  for (int i = 0; i < D; i++) separate &= fabsf(dw_o[i]) < 50.0f && dw_p[i] > 50.0f;
  CHECK(separate, "overwrite in one instance (dw[0] %g), adding in the other (dw[0] %g)", dw_o[0], dw_p[0]);
  o->set_grad_overwrite(o->ctx, 0);
}

int main(void) {
  rng_seed(&rng, 1234);
  test_matmul();
  test_rmsnorm();
  test_rope();
  test_attention();
  test_swiglu();
  test_residual_embedding();
  test_crossentropy();
  test_rows_nll();
  test_ops_table();
  TEST_END();
}
