// tests/gpu/gpu_test_ops.cu: the CUDA backend's operations table (model/cuda/ops_cuda.cu and the kernel
// files) against the CPU references of model/ops.h, op by op at small odd shapes and at 8B-like
// shapes, then a whole 2-layer model run by both backends, then the speed of every memory-bound
// kernel at N = 8192 tokens (the profiler's table, against the 4.28 TB/s copy bandwidth).
//
// The references get the same BF16-rounded inputs as the GPU, so what remains is the GPU's own
// rounding. Tolerances are relative to the reference's L2 norm:
// - ops whose output is rounded once to BF16 after fp32 math (rmsnorm, rope, swiglu): the unit
//   roundoff 2^-9 = 1.95e-3 bounds each element's relative error, so the norm-relative error is
//   below it; TOL_BF16 = 4e-3 leaves a 2x margin and still catches any wrong term (errors of order
//   1e-1 and more). Ops with two roundings in a row (head_ce's dlogits, then dx) get 1e-2.
// - fp32 results from BF16 inputs (rmsnorm's dw, the loss, rstd): only fp32 summation order
//   differs, ~sqrt(terms) * 6e-8; tolerances 1e-5 to 1e-4.
// - pure copies and adds (embedding, residual, AdamW with the CPU's rounding order): exact.
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/adamw.h"
#include "common/gemm.h"
#include "model/llama.h"
#include "model/ops.h"
#include "model/cuda/ops_cuda.h"
#include "tests/test.h"
#include "tests/gpu/gpu_ops_util.h"

typedef __nv_bfloat16 bf16;

static const double TOL_BF16 = 4e-3, TOL_BF16_TWICE = 1e-2;

// ---- helpers (and tests/gpu/gpu_ops_util.h) ---------------------------------------------------------

static float *copy_of(const float *x, size_t n) {
  float *y = (float *)xmalloc(n * sizeof(float));
  memcpy(y, x, n * sizeof(float));
  return y;
}

static void check_rel(const char *what, const float *got, const float *ref, size_t n, double tol) {
  double e = rel_err(got, ref, n);
  printf("  %-52s n=%-9zu rel err %.2e (tol %.0e)\n", what, n, e, tol);
  CHECK(e <= tol, "%s: relative error %.3e > %.0e", what, e, tol);
}

// got == ref bit for bit; prints the first difference.
static void check_exact(const char *what, const float *got, const float *ref, size_t n) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (memcmp(&got[i], &ref[i], sizeof(float)) && !bad++) first = i;
  printf("  %-52s n=%-9zu %zu elements differ\n", what, n, bad);
  CHECK(bad == 0, "%s: %zu of %zu differ, first at %zu: got %.9g, want %.9g", what, bad, n, first, got[first],
        ref[first]);
}

// Differences a - b (for accumulated outputs: the part an op added).
static float *minus(const float *a, const float *b, size_t n) {
  float *d = (float *)xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) d[i] = a[i] - b[i];
  return d;
}

// A fresh bound parameter buffer of n floats holding h (the BF16 shadow refreshed).
static float *bind_params(const float *h, size_t n) {
  float *p = dev_f32(h, n);
  G->bind_params(p, n);
  G->params_changed();
  return p;
}

// ---- embedding ----------------------------------------------------------------------------------

static void test_embedding(int N, int D, int V, int distinct) {
  char what[96];
  float *table = randn((size_t)V * D, 1.0f, 0), *dout = randn((size_t)N * D, 1.0f, 1);
  float *dtable0 = randn((size_t)V * D, 1.0f, 0);
  int *tok = (int *)xmalloc(N * sizeof(int));
  for (int n = 0; n < N; n++) tok[n] = (int)(rng_u64(&rng) % distinct) * (V / distinct);  // many repeats
  tok[N - 1] = V - 1;
  int *d_tok = dev_int(tok, N);
  float *d_table = dev_f32(table, (size_t)V * D);

  float *ref = (float *)xmalloc((size_t)N * D * sizeof(float));
  embedding_forward(ref, tok, table, N, D, V);
  for (size_t i = 0; i < (size_t)N * D; i++) ref[i] = bf16r(ref[i]);
  void *d_out = G->alloc((size_t)N * D * sizeof(bf16));
  G->embed_fwd(d_out, d_tok, d_table, N, D, V);
  float *got = host_bf16(d_out, (size_t)N * D);
  snprintf(what, sizeof what, "embed fwd N=%d D=%d V=%d (= bf16(table row))", N, D, V);
  check_exact(what, got, ref, (size_t)N * D);

  // backward: same adds in the same (position) order as the CPU, so the same bits
  float *dref = copy_of(dtable0, (size_t)V * D);
  embedding_backward(dref, dout, tok, N, D);
  void *d_dout = dev_bf16(dout, (size_t)N * D);
  float *d_dt = dev_f32(dtable0, (size_t)V * D);
  G->embed_bwd(d_dt, d_dout, d_tok, N, D);
  float *dgot = host_f32(d_dt, (size_t)V * D);
  snprintf(what, sizeof what, "embed bwd N=%d D=%d, %d distinct ids", N, D, distinct);
  check_exact(what, dgot, dref, (size_t)V * D);
  G->upload(d_dt, dtable0, (size_t)V * D * sizeof(float));
  G->embed_bwd(d_dt, d_dout, d_tok, N, D);
  float *dgot2 = host_f32(d_dt, (size_t)V * D);
  CHECK(!memcmp(dgot, dgot2, (size_t)V * D * sizeof(float)), "embed bwd N=%d D=%d: two runs differ", N, D);

  G->release(d_out), G->release(d_dout), G->release(d_dt), G->release(d_table), G->release(d_tok);
  free(table), free(dout), free(dtable0), free(tok), free(ref), free(got), free(dref), free(dgot), free(dgot2);
}

// ---- rmsnorm ------------------------------------------------------------------------------------

static void test_rmsnorm(int N, int D) {
  char what[96];
  const size_t nd = (size_t)N * D;
  float *x = randn(nd, 1.0f, 1), *w = randn(D, 0.1f, 0), *dout = randn(nd, 1.0f, 1), *dx0 = randn(nd, 1.0f, 1);
  float *dw0 = randn(D, 1.0f, 0);
  for (int i = 0; i < D; i++) w[i] += 1.0f;
  float *out = (float *)xmalloc(nd * sizeof(float)), *rstd = (float *)xmalloc(N * sizeof(float));
  rmsnorm_forward(out, rstd, x, w, N, D, 1e-5f);

  void *d_x = dev_bf16(x, nd), *d_out = G->alloc(nd * sizeof(bf16));
  float *d_w = dev_f32(w, D), *d_rstd = (float *)G->alloc(N * sizeof(float));
  G->rmsnorm_fwd(d_out, d_rstd, d_x, d_w, N, D, 1e-5f);
  float *got = host_bf16(d_out, nd), *rgot = host_f32(d_rstd, N);
  snprintf(what, sizeof what, "rmsnorm fwd N=%d D=%d: out", N, D);
  check_rel(what, got, out, nd, TOL_BF16);
  snprintf(what, sizeof what, "rmsnorm fwd N=%d D=%d: rstd", N, D);
  check_rel(what, rgot, rstd, N, 1e-5);

  // backward: dx and dw accumulate; both start from random values
  float *dx = copy_of(dx0, nd), *dw = copy_of(dw0, D);
  rmsnorm_backward(dx, dw, dout, x, w, rstd, N, D);
  void *d_dout = dev_bf16(dout, nd), *d_dx = dev_bf16(dx0, nd);
  float *d_dw = dev_f32(dw0, D);
  G->upload(d_rstd, rstd, N * sizeof(float));  // the same rstd for both
  G->rmsnorm_bwd(d_dx, d_dw, d_dout, d_x, d_w, d_rstd, N, D);
  float *dxg = host_bf16(d_dx, nd), *dwg = host_f32(d_dw, D);
  snprintf(what, sizeof what, "rmsnorm bwd N=%d D=%d: dx (+= onto random dx)", N, D);
  check_rel(what, dxg, dx, nd, TOL_BF16);
  float *inc_g = minus(dwg, dw0, D), *inc_c = minus(dw, dw0, D);
  snprintf(what, sizeof what, "rmsnorm bwd N=%d D=%d: dw increment", N, D);
  check_rel(what, inc_g, inc_c, D, 1e-4);
  // a second call adds again, to the same bits as the first added (deterministic dw)
  G->upload(d_dw, dw0, D * sizeof(float));
  G->rmsnorm_bwd(d_dx, d_dw, d_dout, d_x, d_w, d_rstd, N, D);
  float *dwg2 = host_f32(d_dw, D);
  CHECK(!memcmp(dwg, dwg2, D * sizeof(float)), "rmsnorm bwd N=%d D=%d: dw differs between two runs", N, D);

  G->release(d_x), G->release(d_out), G->release(d_w), G->release(d_rstd), G->release(d_dout), G->release(d_dx),
      G->release(d_dw);
  free(x), free(w), free(dout), free(dx0), free(dw0), free(out), free(rstd), free(got), free(rgot), free(dx), free(dw);
  free(dxg), free(dwg), free(dwg2), free(inc_g), free(inc_c);
}

// ---- rope ---------------------------------------------------------------------------------------

static void test_rope(int B, int T, int heads, int hd) {
  char what[96];
  LlamaConfig c;
  memset(&c, 0, sizeof c);
  c.rope_theta = 500000.0f, c.rope_scaling = 1, c.rope_factor = 8, c.rope_low_freq_factor = 1;
  c.rope_high_freq_factor = 4, c.rope_original_max_pos = 32;
  const size_t half = hd / 2, n = (size_t)B * T * heads * hd;
  float *cs = (float *)xmalloc(T * half * sizeof(float)), *sn = (float *)xmalloc(T * half * sizeof(float));
  rope_tables(cs, sn, T, hd, &c);
  float *d_cos = dev_f32(cs, T * half), *d_sin = dev_f32(sn, T * half);
  float *x = randn(n, 1.0f, 1), *ref = copy_of(x, n), *bref = copy_of(x, n);
  rope_forward(ref, cs, sn, B, T, heads, hd);
  rope_backward(bref, cs, sn, B, T, heads, hd);
  void *d_x = dev_bf16(x, n);
  G->rope_fwd(d_x, d_cos, d_sin, B, T, heads, hd);
  float *got = host_bf16(d_x, n);
  snprintf(what, sizeof what, "rope fwd B=%d T=%d heads=%d hd=%d", B, T, heads, hd);
  check_rel(what, got, ref, n, TOL_BF16);
  G->rope_bwd(d_x, d_cos, d_sin, B, T, heads, hd);  // undoes the forward
  float *back = host_bf16(d_x, n);
  snprintf(what, sizeof what, "rope bwd(fwd(x)) = x, hd=%d", hd);
  check_rel(what, back, x, n, 2 * TOL_BF16);
  void *d_x2 = dev_bf16(x, n);
  G->rope_bwd(d_x2, d_cos, d_sin, B, T, heads, hd);
  float *bgot = host_bf16(d_x2, n);
  snprintf(what, sizeof what, "rope bwd B=%d T=%d heads=%d hd=%d", B, T, heads, hd);
  check_rel(what, bgot, bref, n, TOL_BF16);
  G->release(d_cos), G->release(d_sin), G->release(d_x), G->release(d_x2);
  free(cs), free(sn), free(x), free(ref), free(bref), free(got), free(back), free(bgot);
}

// ---- swiglu and residual ------------------------------------------------------------------------

// `offset` elements past an aligned allocation: offset 1 makes every pointer misaligned (the
// element-by-element path).
static void test_swiglu(size_t n, int offset) {
  char what[96];
  float *g = randn(n, 2.0f, 1), *u = randn(n, 1.0f, 1), *dout = randn(n, 1.0f, 1);
  float *out = (float *)xmalloc(n * sizeof(float)), *dg = (float *)xmalloc(n * sizeof(float));
  float *du = (float *)xmalloc(n * sizeof(float));
  swiglu_forward(out, g, u, n);
  swiglu_backward(dg, du, dout, g, u, n);
  float *pad[5];
  const float *src[5] = {g, u, dout, g, g};
  void *dv[5];
  for (int i = 0; i < 5; i++) {  // gate, up, dout, then two outputs' worth of space
    pad[i] = (float *)xmalloc((n + offset) * sizeof(float));
    for (size_t j = 0; j < n + offset; j++) pad[i][j] = j >= (size_t)offset ? src[i][j - offset] : 0.0f;
    dv[i] = dev_bf16(pad[i], n + offset);
  }
  bf16 *d_g = (bf16 *)dv[0] + offset, *d_u = (bf16 *)dv[1] + offset, *d_d = (bf16 *)dv[2] + offset;
  bf16 *d_o1 = (bf16 *)dv[3] + offset, *d_o2 = (bf16 *)dv[4] + offset;
  G->swiglu_fwd(d_o1, d_g, d_u, n);
  float *got = host_bf16(d_o1, n);
  snprintf(what, sizeof what, "swiglu fwd n=%zu%s", n, offset ? " (misaligned)" : "");
  check_rel(what, got, out, n, TOL_BF16);
  G->swiglu_bwd(d_o1, d_o2, d_d, d_g, d_u, n);
  float *dgg = host_bf16(d_o1, n), *dug = host_bf16(d_o2, n);
  snprintf(what, sizeof what, "swiglu bwd n=%zu%s: dgate", n, offset ? " (misaligned)" : "");
  check_rel(what, dgg, dg, n, TOL_BF16);
  snprintf(what, sizeof what, "swiglu bwd n=%zu%s: dup", n, offset ? " (misaligned)" : "");
  check_rel(what, dug, du, n, TOL_BF16);
  for (int i = 0; i < 5; i++) G->release(dv[i]), free(pad[i]);
  free(g), free(u), free(dout), free(out), free(dg), free(du), free(got), free(dgg), free(dug);
}

static void test_residual(size_t n) {
  char what[96];
  float *a = randn(n, 1.0f, 1), *b = randn(n, 1.0f, 1), *ref = (float *)xmalloc(n * sizeof(float));
  residual_forward(ref, a, b, n);
  for (size_t i = 0; i < n; i++) ref[i] = bf16r(ref[i]);
  void *d_a = dev_bf16(a, n), *d_b = dev_bf16(b, n);
  G->residual_fwd(d_a, d_a, d_b, n);  // out aliases a, as the graph may do
  float *got = host_bf16(d_a, n);
  snprintf(what, sizeof what, "residual n=%zu, out = a (= bf16(a + b))", n);
  check_exact(what, got, ref, n);
  G->release(d_a), G->release(d_b);
  free(a), free(b), free(ref), free(got);
}

// ---- head + cross-entropy -----------------------------------------------------------------------

static void test_head_ce(int N, int D, int V, int n_ignored, int chunk) {
  char what[120];
  const int ignore = -100;
  const float dloss = 0.5f;
  float *x = randn((size_t)N * D, 1.0f, 1), *w = randn((size_t)V * D, 1.0f / sqrtf((float)D), 0);
  float *dw0 = randn((size_t)V * D, 0.01f, 0);
  float *wr = (float *)xmalloc((size_t)V * D * sizeof(float));
  for (size_t i = 0; i < (size_t)V * D; i++) wr[i] = bf16r(w[i]);  // what the GPU's GEMMs see
  int *tg = (int *)xmalloc(N * sizeof(int));
  for (int n = 0; n < N; n++) tg[n] = (int)(rng_u64(&rng) % V);
  for (int k = 0; k < n_ignored; k++) tg[(k * 7 + 3) % N] = ignore;

  float *dx = (float *)xmalloc((size_t)N * D * sizeof(float)), *dw = copy_of(dw0, (size_t)V * D);
  float *scratch = (float *)xmalloc((size_t)N * V * sizeof(float));
  float loss = head_crossentropy(dx, dw, scratch, x, wr, tg, N, D, V, N, ignore, dloss);

  cuda_head_ce_set_chunk(chunk);
  float *d_w = bind_params(w, (size_t)V * D), *d_dw = dev_f32(dw0, (size_t)V * D);
  void *d_x = dev_bf16(x, (size_t)N * D), *d_dx = G->alloc((size_t)N * D * sizeof(bf16));
  int *d_tg = dev_int(tg, N);
  float lg = G->head_ce(d_dx, d_dw, NULL, d_x, d_w, d_tg, N, D, V, 32, ignore, dloss);
  float *dxg = host_bf16(d_dx, (size_t)N * D), *dwg = host_f32(d_dw, (size_t)V * D);
  printf("  head_ce N=%d D=%d V=%d chunk %s%d, %d ignored: loss %.6f (cpu %.6f)\n", N, D, V, chunk ? "" : "auto ",
         chunk, n_ignored, lg, loss);
  CHECK(fabs(lg - loss) <= 1e-4 * fabs(loss), "head_ce loss %.7f vs cpu %.7f", lg, loss);
  snprintf(what, sizeof what, "head_ce N=%d D=%d V=%d: dx", N, D, V);
  check_rel(what, dxg, dx, (size_t)N * D, TOL_BF16_TWICE);
  float *inc_g = minus(dwg, dw0, (size_t)V * D), *inc_c = minus(dw, dw0, (size_t)V * D);
  snprintf(what, sizeof what, "head_ce N=%d D=%d V=%d: dW increment", N, D, V);
  check_rel(what, inc_g, inc_c, (size_t)V * D, TOL_BF16_TWICE);
  float lf = G->head_ce(NULL, NULL, NULL, d_x, d_w, d_tg, N, D, V, 32, ignore, dloss);  // loss only
  CHECK(fabs(lf - lg) <= 1e-6 * fabs(lg), "head_ce loss without gradients %.7f vs with %.7f", lf, lg);
  {  // per-token losses (head_nll) against the CPU's, and their mean against the loss
    float *nll_c = (float *)xmalloc(N * sizeof(float)), *nll_g = (float *)xmalloc(N * sizeof(float));
    head_token_nll(nll_c, scratch, x, wr, tg, N, D, V, N, ignore);
    G->head_nll(nll_g, NULL, d_x, d_w, d_tg, N, D, V, 32, ignore);
    double worst = 0, sum = 0;
    int counted = 0, zero_ok = 1;
    for (int n = 0; n < N; n++) {
      worst = fmax(worst, fabs(nll_g[n] - nll_c[n]));
      if (tg[n] == ignore) zero_ok &= nll_g[n] == 0.0f;
      else sum += nll_g[n], counted++;
    }
    CHECK(worst <= 1e-3 && zero_ok, "head_nll: worst |gpu - cpu| %.3g (ignored positions zero: %d)", worst, zero_ok);
    CHECK(fabs(sum / counted - lg) <= 1e-5 * fabs(lg), "head_nll mean %.7f vs head_ce loss %.7f", sum / counted, lg);
    printf("  head_nll: worst |gpu - cpu| per token %.2e\n", worst);
    free(nll_c), free(nll_g);
  }
  {  // overwrite mode (first backward after llama_zero_grad): dW is the increment itself
    G->upload(d_dw, dw0, (size_t)V * D * sizeof(float));
    G->set_grad_overwrite(1);
    G->head_ce(d_dx, d_dw, NULL, d_x, d_w, d_tg, N, D, V, 32, ignore, dloss);
    G->set_grad_overwrite(0);
    float *dwo = host_f32(d_dw, (size_t)V * D);
    snprintf(what, sizeof what, "head_ce N=%d D=%d V=%d: dW in overwrite mode", N, D, V);
    check_rel(what, dwo, inc_c, (size_t)V * D, TOL_BF16_TWICE);
    free(dwo);
  }

  if (n_ignored == 0) {  // every target ignored: zero loss, zero dx, dW untouched
    for (int n = 0; n < N; n++) tg[n] = ignore;
    G->upload(d_tg, tg, N * sizeof(int));
    G->upload(d_dw, dw0, (size_t)V * D * sizeof(float));
    float l0 = G->head_ce(d_dx, d_dw, NULL, d_x, d_w, d_tg, N, D, V, 32, ignore, dloss);
    float *dx0 = host_bf16(d_dx, (size_t)N * D), *dw00 = host_f32(d_dw, (size_t)V * D);
    double dx_abs = 0;
    for (size_t i = 0; i < (size_t)N * D; i++) dx_abs += fabs(dx0[i]);
    CHECK(l0 == 0.0f && dx_abs == 0.0, "head_ce, all targets ignored: loss %g, sum |dx| %g (want 0, 0)", l0, dx_abs);
    CHECK(!memcmp(dw00, dw0, (size_t)V * D * sizeof(float)), "head_ce, all targets ignored: dW changed");
    free(dx0), free(dw00);
  }
  cuda_head_ce_set_chunk(0);
  G->release(d_w), G->release(d_dw), G->release(d_x), G->release(d_dx), G->release(d_tg);
  free(x), free(w), free(dw0), free(wr), free(tg), free(dx), free(dw), free(scratch), free(dxg), free(dwg), free(inc_g);
  free(inc_c);
}

// ---- the linear entry (through common/gemm.h with the BF16 shadow of W) ------------------------------

static void test_matmul(int N, int in, int out_dim) {
  char what[96];
  float *x = randn((size_t)N * in, 1.0f, 1), *w = randn((size_t)out_dim * in, 0.05f, 0), *dy = randn((size_t)N * out_dim, 1.0f, 1);
  float *dx0 = randn((size_t)N * in, 1.0f, 1), *dw0 = randn((size_t)out_dim * in, 1.0f, 0);
  float *wr = (float *)xmalloc((size_t)out_dim * in * sizeof(float));
  for (size_t i = 0; i < (size_t)out_dim * in; i++) wr[i] = bf16r(w[i]);  // the GPU multiplies by bf16(W)
  float *y = (float *)xmalloc((size_t)N * out_dim * sizeof(float)), *dx = copy_of(dx0, (size_t)N * in);
  float *dw = copy_of(dw0, (size_t)out_dim * in);
  matmul_forward(y, x, wr, N, in, out_dim);
  matmul_backward(dx, dw, dy, x, wr, N, in, out_dim, 1);

  float *d_w = bind_params(w, (size_t)out_dim * in), *d_dw = dev_f32(dw0, (size_t)out_dim * in);
  void *d_x = dev_bf16(x, (size_t)N * in), *d_dy = dev_bf16(dy, (size_t)N * out_dim);
  void *d_y = G->alloc((size_t)N * out_dim * sizeof(bf16)), *d_dx = dev_bf16(dx0, (size_t)N * in);
  LinearId id = {0, LIN_UP};
  G->matmul_fwd(G->ctx, id, d_y, d_x, d_w, N, in, out_dim);
  G->matmul_bwd(G->ctx, id, d_dx, d_dw, d_dy, d_x, d_w, N, in, out_dim, 1);
  float *yg = host_bf16(d_y, (size_t)N * out_dim), *dxg = host_bf16(d_dx, (size_t)N * in);
  float *dwg = host_f32(d_dw, (size_t)out_dim * in);
  snprintf(what, sizeof what, "matmul fwd N=%d in=%d out=%d", N, in, out_dim);
  check_rel(what, yg, y, (size_t)N * out_dim, TOL_BF16);
  snprintf(what, sizeof what, "matmul bwd: dx += dy W (onto random dx)");
  check_rel(what, dxg, dx, (size_t)N * in, TOL_BF16);
  float *inc_g = minus(dwg, dw0, (size_t)out_dim * in), *inc_c = minus(dw, dw0, (size_t)out_dim * in);
  snprintf(what, sizeof what, "matmul bwd: dW increment (fp32)");
  check_rel(what, inc_g, inc_c, (size_t)out_dim * in, 1e-4);
  G->matmul_bwd(G->ctx, id, d_dx, NULL, d_dy, d_x, d_w, N, in, out_dim, 0);  // overwrite, no dW
  float *dxo = host_bf16(d_dx, (size_t)N * in), *dxo_ref = (float *)xmalloc((size_t)N * in * sizeof(float));
  matmul_backward(dxo_ref, NULL, dy, x, wr, N, in, out_dim, 0);
  check_rel("matmul bwd: dx = dy W (overwrite, dW NULL)", dxo, dxo_ref, (size_t)N * in, TOL_BF16);
  G->release(d_w), G->release(d_dw), G->release(d_x), G->release(d_dy), G->release(d_y), G->release(d_dx);
  free(x), free(w), free(dy), free(dx0), free(dw0), free(wr), free(y), free(dx), free(dw), free(yg), free(dxg);
  free(dwg), free(inc_g), free(inc_c), free(dxo), free(dxo_ref);
}

// ---- dgrad through the transposed weight copies --------------------------------------------------

// Elements where the W^T copy of w [rows, cols] differs from the transpose of its BF16 shadow.
static size_t transposed_mismatches(const float *w, int rows, int cols) {
  const size_t n = (size_t)rows * cols;
  bf16 *s = (bf16 *)xmalloc(n * sizeof(bf16)), *t = (bf16 *)xmalloc(n * sizeof(bf16));
  G->download(s, cuda_param_bf16(w), n * sizeof(bf16));
  G->download(t, cuda_param_bf16_transposed(w, cols, rows), n * sizeof(bf16));
  size_t bad = 0;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) bad += memcmp(&t[(size_t)c * rows + r], &s[(size_t)r * cols + c], sizeof(bf16)) != 0;
  free(s), free(t);
  return bad;
}

// matmul_bwd's dx = dy W on bound weight w [out_dim, in], read back to the host.
static float *dgrad(const float *w, const void *d_dy, void *d_dx, int N, int in, int out_dim) {
  LinearId id = {0, LIN_Q};
  G->matmul_bwd(G->ctx, id, d_dx, NULL, d_dy, NULL, w, N, in, out_dim, 0);
  return host_bf16(d_dx, (size_t)N * in);
}

// The CPU's dx of both weights of test_dgrad_transposed, with bf16(W) of `params` (wr: scratch).
static void dgrad_refs(float *ref1, float *ref2, float *wr, const float *params, size_t total, size_t off2,
                       const float *dy1, const float *dy2, int N, int in, int out_dim) {
  for (size_t i = 0; i < total; i++) wr[i] = bf16r(params[i]);
  matmul_backward(ref1, NULL, dy1, NULL, wr, N, in, out_dim, 0);
  matmul_backward(ref2, NULL, dy2, NULL, wr + off2, N, out_dim, in, 0);
}

// Two weights in one bound buffer (the copies are keyed by their offset): w1 [out_dim, in] and w2
// [in, out_dim], shapes that are not multiples of the transpose's 64 x 256 CTA tile. The TN dgrad
// (on W^T) and the direct NN GEMM (on W) multiply the same BF16 products, summed in fp32 in
// different orders and rounded once to BF16, so they agree to TOL_BF16 like any single-rounding op.
// Then the staleness rules: an adamw step or params_changed must re-transpose (a stale copy gives
// the old weights' gradient, ~0.4 relative away here: far outside the tolerance), and nothing else
// may (the copy is made once per weights version, not per call).
static void test_dgrad_transposed(int N, int in, int out_dim) {
  char what[120];
  const size_t nw = (size_t)out_dim * in, off2 = nw + 8, total = off2 + nw + 8;
  float *p0 = randn(total, 0.05f, 0), *dy1 = randn((size_t)N * out_dim, 1.0f, 1), *dy2 = randn((size_t)N * in, 1.0f, 1);
  float *d_p = bind_params(p0, total), *w1 = d_p, *w2 = d_p + off2;
  void *d_dy1 = dev_bf16(dy1, (size_t)N * out_dim), *d_dy2 = dev_bf16(dy2, (size_t)N * in);
  void *d_dx1 = G->alloc((size_t)N * in * sizeof(bf16)), *d_dx2 = G->alloc((size_t)N * out_dim * sizeof(bf16));
  void *d_ref = G->alloc((size_t)N * (in > out_dim ? in : out_dim) * sizeof(bf16));

  // CPU references with bf16(W) of the given parameters
  float *wr = (float *)xmalloc(total * sizeof(float));
  float *ref1 = (float *)xmalloc((size_t)N * in * sizeof(float));
  float *ref2 = (float *)xmalloc((size_t)N * out_dim * sizeof(float));
  dgrad_refs(ref1, ref2, wr, p0, total, off2, dy1, dy2, N, in, out_dim);

  float *dx1 = dgrad(w1, d_dy1, d_dx1, N, in, out_dim), *dx2 = dgrad(w2, d_dy2, d_dx2, N, out_dim, in);
  size_t bad1 = transposed_mismatches(w1, out_dim, in), bad2 = transposed_mismatches(w2, in, out_dim);
  printf("  W^T copies: %zu + %zu elements differ from the shadow's transpose\n", bad1, bad2);
  CHECK(bad1 == 0 && bad2 == 0, "W^T copy [%d, %d]: %zu differ; [%d, %d]: %zu differ", in, out_dim, bad1, out_dim, in,
        bad2);
  gemm_bf16(d_ref, 0, d_dy1, 0, cuda_param_bf16(w1), 0, N, in, out_dim, 1.0f, 0.0f);  // the direct NN path
  float *nn1 = host_bf16(d_ref, (size_t)N * in);
  snprintf(what, sizeof what, "dgrad N=%d in=%d out=%d: TN on W^T vs NN on W", N, in, out_dim);
  check_rel(what, dx1, nn1, (size_t)N * in, TOL_BF16);
  snprintf(what, sizeof what, "dgrad N=%d in=%d out=%d: TN on W^T vs cpu", N, in, out_dim);
  check_rel(what, dx1, ref1, (size_t)N * in, TOL_BF16);
  snprintf(what, sizeof what, "dgrad N=%d in=%d out=%d: 2nd weight, TN vs cpu", N, out_dim, in);
  check_rel(what, dx2, ref2, (size_t)N * out_dim, TOL_BF16);

  // Laziness: zero w1's shadow behind the backend's back; without a version bump the dgrad must
  // still use the copy made above, bit for bit. params_changed then restores the shadow.
  CUDA_CHECK(cudaMemsetAsync((void *)cuda_param_bf16(w1), 0, nw * sizeof(bf16), cuda_stream()));
  float *again = dgrad(w1, d_dy1, d_dx1, N, in, out_dim);
  CHECK(!memcmp(again, dx1, (size_t)N * in * sizeof(float)),
        "dgrad re-transposed W without a weights change (the copy should be made once per version)");
  G->params_changed();
  free(again);

  // adamw (large lr, every weight moves by ~lr = 40% of its scale): the next dgrad must see it.
  float *d_m = (float *)G->alloc(total * sizeof(float)), *d_v = (float *)G->alloc(total * sizeof(float));
  G->zero(d_m, total * sizeof(float));
  G->zero(d_v, total * sizeof(float));
  float *g = randn(total, 1.0f, 0), *d_g = dev_f32(g, total);
  G->adamw(d_p, d_g, d_m, d_v, total, 2e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1);
  float *p1 = host_f32(d_p, total), *old1 = copy_of(ref1, (size_t)N * in);
  dgrad_refs(ref1, ref2, wr, p1, total, off2, dy1, dy2, N, in, out_dim);
  double moved = rel_err(old1, ref1, (size_t)N * in);
  printf("  adamw moved the cpu dgrad by %.2e relative (what a stale W^T copy would miss)\n", moved);
  CHECK(moved > 10 * TOL_BF16, "adamw step too small to detect a stale copy: %.2e", moved);
  float *ax1 = dgrad(w1, d_dy1, d_dx1, N, in, out_dim), *ax2 = dgrad(w2, d_dy2, d_dx2, N, out_dim, in);
  check_rel("dgrad after adamw: new weights (w1)", ax1, ref1, (size_t)N * in, TOL_BF16);
  check_rel("dgrad after adamw: new weights (w2)", ax2, ref2, (size_t)N * out_dim, TOL_BF16);
  bad1 = transposed_mismatches(w1, out_dim, in), bad2 = transposed_mismatches(w2, in, out_dim);
  CHECK(bad1 == 0 && bad2 == 0, "after adamw: W^T copies differ from the shadow's transpose at %zu + %zu", bad1, bad2);

  // params_changed after new values were uploaded (a checkpoint load): back to p0.
  G->upload(d_p, p0, total * sizeof(float));
  G->params_changed();
  dgrad_refs(ref1, ref2, wr, p0, total, off2, dy1, dy2, N, in, out_dim);
  float *cx1 = dgrad(w1, d_dy1, d_dx1, N, in, out_dim);
  check_rel("dgrad after upload + params_changed", cx1, ref1, (size_t)N * in, TOL_BF16);

  // Turned off: the copies are freed and the dgrad is the direct NN GEMM (the same plan as above,
  // so the same bits).
  size_t held = cuda_mem_used();
  cuda_set_dgrad_transposed(0);
  size_t freed = held - cuda_mem_used();
  CHECK(freed == 2 * nw * sizeof(bf16), "cuda_set_dgrad_transposed(0) freed %zu bytes, want %zu (two W^T copies)",
        freed, 2 * nw * sizeof(bf16));
  float *off1 = dgrad(w1, d_dy1, d_dx1, N, in, out_dim);
  CHECK(!memcmp(off1, nn1, (size_t)N * in * sizeof(float)), "dgrad with the copies off differs from the NN GEMM");
  CHECK(cuda_mem_used() == held - freed, "dgrad with the copies off allocated memory");
  cuda_set_dgrad_transposed(1);

  G->release(d_p);  // frees the shadow and the copies
  void *bufs[] = {d_dy1, d_dy2, d_dx1, d_dx2, d_ref, d_m, d_v, d_g};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) G->release(bufs[i]);
  free(p0), free(dy1), free(dy2), free(wr), free(ref1), free(ref2), free(dx1), free(dx2), free(nn1), free(g), free(p1);
  free(old1), free(ax1), free(ax2), free(cx1), free(off1);
}

// ---- optimizer ----------------------------------------------------------------------------------

// AdamW over `n` elements starting `at` floats into a bound buffer of n + at + 5 floats, three
// steps against adamw_update; the BF16 shadow must be bf16(p) inside the range, untouched outside.
static void test_adamw(size_t n, size_t at) {
  char what[96];
  const size_t total = n + at + 5;
  float *p0 = randn(total, 1.0f, 0), *m = randn(n, 0.01f, 0), *v = randn(n, 0.01f, 0);
  for (size_t i = 0; i < n; i++) v[i] *= v[i];  // second moments are >= 0
  float *d_p = bind_params(p0, total), *d_m = dev_f32(m, n), *d_v = dev_f32(v, n);
  float *p = copy_of(p0 + at, n), *d_g = (float *)G->alloc(n * sizeof(float));
  for (int t = 1; t <= 3; t++) {
    float *g = randn(n, 0.1f, 0);
    G->upload(d_g, g, n * sizeof(float));
    adamw_update(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
    G->adamw(d_p + at, d_g, d_m, d_v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
    free(g);
  }
  float *pg = host_f32(d_p, total), *mg = host_f32(d_m, n), *vg = host_f32(d_v, n);
  snprintf(what, sizeof what, "adamw n=%zu at +%zu, 3 steps: p", n, at);
  check_rel(what, pg + at, p, n, 1e-6);
  snprintf(what, sizeof what, "adamw n=%zu at +%zu, 3 steps: m", n, at);
  check_rel(what, mg, m, n, 1e-6);
  snprintf(what, sizeof what, "adamw n=%zu at +%zu, 3 steps: v", n, at);
  check_rel(what, vg, v, n, 1e-6);
  size_t same = 0;
  for (size_t i = 0; i < n; i++) same += !memcmp(&pg[at + i], &p[i], sizeof(float));
  printf("  adamw: %zu of %zu parameters bit-identical to the CPU\n", same, n);
  CHECK(!memcmp(pg, p0, at * sizeof(float)) && !memcmp(pg + at + n, p0 + at + n, 5 * sizeof(float)),
        "adamw n=%zu: parameters outside the range changed", n);

  bf16 *sh = (bf16 *)xmalloc(total * sizeof(bf16));
  G->download(sh, cuda_param_bf16(d_p), total * sizeof(bf16));
  size_t bad = 0;
  for (size_t i = 0; i < total; i++) {
    float want = bf16r(i >= at && i < at + n ? pg[i] : p0[i]);
    bad += __bfloat162float(sh[i]) != want;
  }
  printf("  adamw: BF16 shadow = bf16(p) at %zu of %zu elements\n", total - bad, total);
  CHECK(bad == 0, "adamw n=%zu: %zu shadow elements differ from bf16(p)", n, bad);
  G->release(d_p), G->release(d_m), G->release(d_v), G->release(d_g);
  free(p0), free(m), free(v), free(p), free(pg), free(mg), free(vg), free(sh);
}

static void test_grad_sumsq(size_t n, size_t at) {
  float *g = randn(n + at, 1e-3f, 0);
  float *d_g = dev_f32(g, n + at);
  double ref = grad_sumsq(g + at, n), s1 = G->grad_sumsq(d_g + at, n), s2 = G->grad_sumsq(d_g + at, n);
  double e = fabs(s1 - ref) / ref;
  printf("  grad_sumsq n=%-9zu at +%zu: %.10g (cpu %.10g), rel err %.2e\n", n, at, s1, ref, e);
  CHECK(e <= 1e-5, "grad_sumsq n=%zu: %.10g vs cpu %.10g", n, s1, ref);
  CHECK(s1 == s2, "grad_sumsq n=%zu: two calls differ (%.17g, %.17g)", n, s1, s2);
  G->release(d_g);
  free(g);
}

static void test_params_changed(size_t n) {
  float *p = randn(n, 1.0f, 0);
  float *d_p = bind_params(p, n);
  bf16 *sh = (bf16 *)xmalloc(n * sizeof(bf16));
  G->download(sh, cuda_param_bf16(d_p), n * sizeof(bf16));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += __bfloat162float(sh[i]) != bf16r(p[i]);
  printf("  params_changed n=%zu: %zu shadow elements differ from bf16(p)\n", n, bad);
  CHECK(bad == 0, "params_changed: %zu of %zu shadow elements differ", bad, n);
  G->release(d_p);
  free(p), free(sh);
}

// ---- the whole model ----------------------------------------------------------------------------

// A 2-layer model with GQA and Llama-3.1 RoPE scaling, run by both backends from the same
// parameters on the same batch. The GPU keeps activations in BF16 (about 2e-3 relative per
// rounding, a few dozen roundings deep), so the loss must agree to 1e-2 and each gradient tensor
// to 3e-2 relative L2 error.
static void test_model(void) {
  LlamaConfig c;
  memset(&c, 0, sizeof c);
  c.vocab_size = 512, c.dim = 256, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.ffn_dim = 512;
  c.max_seq_len = 64, c.norm_eps = 1e-5f, c.rope_theta = 500000.0f;
  c.rope_scaling = 1, c.rope_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4;
  c.rope_original_max_pos = 32;
  const int B = 2, T = 64, N = B * T, ignore = -100;
  Llama *mc = llama_create(&c, B, T, &ops_cpu), *mg = llama_create(&c, B, T, G);
  llama_init(mc, 1234);
  llama_init(mg, 1234);
  int *in = (int *)xmalloc(N * sizeof(int)), *tg = (int *)xmalloc(N * sizeof(int));
  for (int n = 0; n < N; n++) in[n] = (int)(rng_u64(&rng) % c.vocab_size);
  for (int n = 0; n < N; n++) tg[n] = n % T == T - 1 ? ignore : in[n + 1];

  float lc = llama_forward(mc, in, tg, ignore), lg = llama_forward(mg, in, tg, ignore);
  printf("  model loss: cuda %.6f, cpu %.6f (ln V = %.4f)\n", lg, lc, log((double)c.vocab_size));
  CHECK(fabs(lg - lc) <= 1e-2 * fabs(lc), "model loss cuda %.6f vs cpu %.6f", lg, lc);
  llama_backward(mc, 1.0f);
  llama_backward(mg, 1.0f);
  float *gc = llama_grads(mc);
  for (int i = 0; i < llama_num_tensors(mg); i++) {
    const ParamTensor *t = llama_tensor(mg, i);
    float *gg = host_f32(llama_grads(mg) + t->offset, t->numel);
    char what[96];
    snprintf(what, sizeof what, "model gradient %s", t->name);
    check_rel(what, gg, gc + t->offset, t->numel, 3e-2);
    free(gg);
  }
  float *lgt_c = (float *)xmalloc((size_t)N * c.vocab_size * sizeof(float));
  float *lgt_g = (float *)xmalloc((size_t)N * c.vocab_size * sizeof(float));
  llama_logits(mc, in, lgt_c);
  llama_logits(mg, in, lgt_g);
  check_rel("model logits (llama_logits)", lgt_g, lgt_c, (size_t)N * c.vocab_size, 2e-2);
  llama_free(mc);
  llama_free(mg);
  free(in), free(tg), free(lgt_c), free(lgt_g);
}

// ---- speed --------------------------------------------------------------------------------------

__global__ void fill_kernel(float *f, bf16 *h, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 0x9e3779b9u ^ (uint32_t)(i >> 32) * 0x85ebca6bu ^ seed;
    x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
    float u = scale * ((float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f);  // uniform [-scale, scale)
    if (f) f[i] = u;
    if (h) h[i] = __float2bfloat16(u);
  }
}

static void *filled(size_t n, int bf16_elems, uint32_t seed, float scale) {
  void *p = G->alloc(n * (bf16_elems ? 2 : 4));
  fill_kernel<<<1024, 256, 0, cuda_stream()>>>(bf16_elems ? NULL : (float *)p, bf16_elems ? (bf16 *)p : NULL, n, seed,
                                               scale);
  CUDA_CHECK_LAUNCH();
  return p;
}

// Every memory-bound op at Llama-3 8B shapes (N = 8192 tokens, D = 4096, F = 14336, 32/8 heads of
// 128, V = 128256 for the head), once to warm up, then `reps` profiled calls; the profiler's table
// shows TB/s against 4.28 (and the GEMMs of the head and of the "down" dgrad, on W^T and on W,
// against their measured ceilings).
static void speed(void) {
  const int N = 8192, D = 4096, F = 14336, H = 32, hd = 128, V = 128256, reps = 10;
  const size_t nd = (size_t)N * D, nf = (size_t)N * F, np = (size_t)V * D;
  // parameters: the head [V, D] (also the embedding table here), then one norm weight
  float *params = (float *)filled(np + D, 0, 1, 0.02f), *grads = (float *)filled(np + D, 0, 2, 1e-3f);
  G->bind_params(params, np + D);
  float *m = (float *)filled(np, 0, 3, 1e-3f), *v = (float *)filled(np, 0, 4, 1e-6f);
  void *x = filled(nd, 1, 5, 1), *y = filled(nd, 1, 6, 1), *z = filled(nd, 1, 7, 1);
  void *g = filled(nf, 1, 8, 2), *u = filled(nf, 1, 9, 1), *o = filled(nf, 1, 10, 1), *o2 = filled(nf, 1, 11, 1);
  void *q = filled((size_t)N * H * hd, 1, 12, 1);
  float *cs = (float *)filled((size_t)N * hd / 2, 0, 13, 1), *sn = (float *)filled((size_t)N * hd / 2, 0, 14, 1);
  float *rstd = (float *)filled(N, 0, 15, 1);
  int *tok = (int *)xmalloc(N * sizeof(int));
  for (int n = 0; n < N; n++) tok[n] = (int)(rng_u64(&rng) % V);
  int *d_tok = dev_int(tok, N);
  float *wn = params + np;
  const LinearId down = {0, LIN_DOWN};

  for (int pass = 0; pass < 2; pass++) {  // pass 0 warms up (GEMM plans, scratch), pass 1 is profiled
    if (pass == 1) {
      G->sync();
      cuda_profile_reset();
      cuda_profile_enable(1);
    }
    for (int r = 0; r < (pass ? reps : 1); r++) {
      G->residual_fwd(z, x, y, nd);
      G->swiglu_fwd(o, g, u, nf);
      G->swiglu_bwd(o, o2, g, u, g, nf);
      G->rmsnorm_fwd(z, rstd, x, wn, N, D, 1e-5f);
      G->rmsnorm_bwd(z, grads + np, y, x, wn, rstd, N, D);
      G->rope_fwd(q, cs, sn, 1, N, H, hd);
      G->rope_bwd(q, cs, sn, 1, N, H, hd);
      G->embed_fwd(z, d_tok, params, N, D, V);
      G->embed_bwd(grads, x, d_tok, N, D);
      G->adamw(params, grads, m, v, np, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1 + pass);
      G->grad_sumsq(grads, np);
      G->params_changed();
      G->head_ce(z, grads, NULL, x, params, d_tok, N, D, V, 32, -100, 1.0f);
      // a "down" weight [D, F] (the first D*F parameters): adamw made its W^T copy stale, so
      // this transposes it, then runs the dgrad GEMM on the copy
      G->matmul_bwd(G->ctx, down, o, NULL, x, NULL, params, N, F, D, 0);
    }
  }
  // the same dgrad on W directly, for comparison ("gemm dgrad down NN")
  cuda_set_dgrad_transposed(0);
  cuda_profile_enable(0);
  G->matmul_bwd(G->ctx, down, o, NULL, x, NULL, params, N, F, D, 0);  // warm-up: its GEMM plan
  cuda_profile_enable(1);
  for (int r = 0; r < reps; r++) G->matmul_bwd(G->ctx, down, o, NULL, x, NULL, params, N, F, D, 0);
  cuda_set_dgrad_transposed(1);
  G->sync();
  cuda_profile_enable(0);
  printf("  per call, %d calls each (N=%d, D=%d, F=%d, q heads %dx%d, V=%d; adamw etc. over %zu floats):\n", reps, N,
         D, F, H, hd, V, np);
  cuda_profile_report(stdout, reps);
  printf("  device memory held by the backend: %.2f GB now, %.2f GB peak\n", cuda_mem_used() / 1e9,
         cuda_mem_peak() / 1e9);
  void *bufs[] = {params, grads, m, v, x, y, z, g, u, o, o2, q, cs, sn, rstd, d_tok};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) G->release(bufs[i]);
  free(tok);
}

int main(void) {
  char err[256];
  G = cuda_backend_init(0, err, sizeof err);
  CHECK(G != NULL, "cuda_backend_init: %s", err);
  if (!G) TEST_END();
  rng_seed(&rng, 42);

  TEST_SECTION("embedding: forward exact, backward bit-identical to the CPU and deterministic");
  test_embedding(13, 20, 50, 5);
  test_embedding(256, 4096, 1000, 20);
  TEST_SECTION("rmsnorm forward and backward (dx, dw accumulate)");
  test_rmsnorm(5, 64);
  test_rmsnorm(37, 1032);
  test_rmsnorm(256, 4096);
  TEST_SECTION("rope forward, backward and their round trip");
  test_rope(2, 16, 3, 12);
  test_rope(2, 64, 32, 128);
  test_rope(1, 64, 8, 128);
  TEST_SECTION("swiglu and residual");
  test_swiglu(1001, 0);
  test_swiglu(999, 1);
  test_swiglu((size_t)256 * 14336, 0);
  test_residual(1003);
  test_residual((size_t)256 * 4096);
  TEST_SECTION("head + cross-entropy (ignored targets, chunking, loss only, all ignored)");
  test_head_ce(40, 64, 1000, 5, 0);
  test_head_ce(64, 64, 1000, 0, 24);
  test_head_ce(256, 4096, 1000, 10, 0);
  TEST_SECTION("linear entry: matmul forward, backward (dx accumulate and overwrite, dW accumulate)");
  test_matmul(64, 256, 136);
  TEST_SECTION("dgrad through the W^T copies: vs NN and cpu, refreshed by adamw / params_changed only");
  test_dgrad_transposed(64, 520, 136);
  test_dgrad_transposed(256, 4096, 1024);
  TEST_SECTION("optimizer: adamw (with the BF16 shadow), grad_sumsq, params_changed");
  test_adamw((size_t)1 << 20 | 3, 4);
  test_adamw(1001, 1);
  test_grad_sumsq((size_t)10000005, 0);
  test_grad_sumsq(1000, 1);
  test_params_changed(1003);
  TEST_SECTION("whole model: 2 layers, cuda vs cpu backend");
  test_model();
  TEST_SECTION("speed at N=8192 (profiler table)");
  speed();
  printf("  backend memory after releasing everything: %zu bytes of kernel scratch\n", cuda_mem_used());
  TEST_END();
}
