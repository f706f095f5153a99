// tests/gpu/gpu_test_attention.cu: cuDNN flash attention (model/cuda/attention_cudnn.cpp) against the fp32 CPU
// reference (model/cpu/attention.c), then one Llama-3 8B layer's attention (B=1, T=8192, H=32, KV=8,
// hd=128): checked at sampled rows against a double-precision reference, and timed.
// Usage: gpu_test_attention [--quick]   (--quick skips the 8B shape)
#include <cuda_runtime.h>
#include <cudnn.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/cuda/attention_cudnn.h"
#include "common/cuda_common.h"
#include "model/ops.h"
#include "tests/test.h"
#include "tests/gpu/gpu_util.h"

// Tolerances, as relative errors in the 2-norm (||gpu - ref|| / ||ref||) over a whole tensor.
// The inputs are the same BF16 values on both sides, so the differences come from the GPU's BF16
// roundings: out is stored in BF16 (2^-9 relative each) after P was rounded to BF16 for the PV
// product; the backward also rounds P and dS to BF16 before its four matmuls and stores dq/dk/dv
// in BF16, which roughly doubles the error. Typical measured values are a few 1e-3; a wrong mask,
// scale or head mapping gives errors of order 1.
#define TOL_OUT 1e-2
#define TOL_GRAD 2e-2
// lse is fp32 and computed from fp32 scores (exact BF16 products, fp32 sums): only summation order
// and exp/log approximations differ.
#define TOL_LSE 1e-3

typedef struct {
  int B, T, H, KV, hd;
} Shape;

// ---- host helpers ---------------------------------------------------------------------------------

// The attention instance every test runs on (created in main, as the backend creates its own).
static AttnCudnn *A;

static uint16_t f2bf(float f) {  // round to nearest even
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float bf2f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

// Fills x with N(0,1) values rounded to BF16 and returns a device copy of them in BF16.
static void *random_bf16(float *x, size_t n, Rng *r) {
  uint16_t *h = (uint16_t *)xmalloc(n * 2);
  for (size_t i = 0; i < n; i++) {
    h[i] = f2bf(rng_normal(r));
    x[i] = bf2f(h[i]);
  }
  void *d = dev_alloc(n * 2);
  CUDA_CHECK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
  free(h);
  return d;
}

static void download_bf16(float *x, const void *d, size_t n) {
  uint16_t *h = (uint16_t *)xmalloc(n * 2);
  CUDA_CHECK(cudaMemcpy(h, d, n * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) x[i] = bf2f(h[i]);
  free(h);
}

static double max_abs_diff(const float *x, const float *ref, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)x[i] - ref[i]);
    if (!(d <= m)) m = d;  // NaN sticks
  }
  return m;
}

static void check_close(const char *what, const float *x, const float *ref, size_t n, double tol) {
  double e = rel_err(x, ref, n);
  printf("  %-4s rel err %.3e (max abs diff %.3e, tol %.0e)\n", what, e, max_abs_diff(x, ref, n), tol);
  CHECK(e <= tol, "%s: relative error %.3e > %.0e", what, e, tol);
}

// ---- one problem: BF16-rounded inputs on the host (as floats) and their device copies ----------

typedef struct {
  Shape s;
  size_t nq, nkv, nl;              // elements of q/out/dout/dq, of k/v/dk/dv, of lse
  float *q, *k, *v, *dout;         // host
  void *d_q, *d_k, *d_v, *d_dout;  // device BF16 inputs
  void *d_out, *d_dq, *d_dk, *d_dv;
  float *d_lse;
} Problem;

static void problem_init(Problem *p, Shape s, uint64_t seed) {
  memset(p, 0, sizeof *p);
  p->s = s;
  p->nq = (size_t)s.B * s.T * s.H * s.hd;
  p->nkv = (size_t)s.B * s.T * s.KV * s.hd;
  p->nl = (size_t)s.B * s.H * s.T;
  Rng r;
  rng_seed(&r, seed);
  p->q = (float *)xmalloc(p->nq * 4);
  p->k = (float *)xmalloc(p->nkv * 4);
  p->v = (float *)xmalloc(p->nkv * 4);
  p->dout = (float *)xmalloc(p->nq * 4);
  p->d_q = random_bf16(p->q, p->nq, &r);
  p->d_k = random_bf16(p->k, p->nkv, &r);
  p->d_v = random_bf16(p->v, p->nkv, &r);
  p->d_dout = random_bf16(p->dout, p->nq, &r);
  p->d_out = dev_alloc(p->nq * 2);
  p->d_dq = dev_alloc(p->nq * 2);
  p->d_dk = dev_alloc(p->nkv * 2);
  p->d_dv = dev_alloc(p->nkv * 2);
  p->d_lse = (float *)dev_alloc(p->nl * 4);
}

static void problem_free(Problem *p) {
  free(p->q), free(p->k), free(p->v), free(p->dout);
  void *d[] = {p->d_q, p->d_k, p->d_v, p->d_dout, p->d_out, p->d_dq, p->d_dk, p->d_dv, p->d_lse};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) CUDA_CHECK(cudaFree(d[i]));
}

// The outputs are first filled with 0xff bytes (NaN in BF16 and fp32), so an element the kernels
// skip, or add into instead of overwriting, shows up as NaN.
static void gpu_fwd(Problem *p) {
  const Shape s = p->s;
  CUDA_CHECK(cudaMemsetAsync(p->d_out, 0xff, p->nq * 2, cuda_stream()));
  CUDA_CHECK(cudaMemsetAsync(p->d_lse, 0xff, p->nl * 4, cuda_stream()));
  attention_cudnn_fwd(A, p->d_out, p->d_lse, p->d_q, p->d_k, p->d_v, s.B, s.T, s.H, s.KV, s.hd);
}

static void gpu_bwd(Problem *p) {
  const Shape s = p->s;
  CUDA_CHECK(cudaMemsetAsync(p->d_dq, 0xff, p->nq * 2, cuda_stream()));
  CUDA_CHECK(cudaMemsetAsync(p->d_dk, 0xff, p->nkv * 2, cuda_stream()));
  CUDA_CHECK(cudaMemsetAsync(p->d_dv, 0xff, p->nkv * 2, cuda_stream()));
  attention_cudnn_bwd(A, p->d_dq, p->d_dk, p->d_dv, p->d_dout, p->d_q, p->d_k, p->d_v, p->d_out, p->d_lse, s.B, s.T,
                      s.H, s.KV, s.hd);
}

// Host copies of everything the GPU produced.
typedef struct {
  float *out, *lse, *dq, *dk, *dv;
} Results;

static Results download_results(const Problem *p) {
  Results r;
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  r.out = (float *)xmalloc(p->nq * 4);
  r.lse = (float *)xmalloc(p->nl * 4);
  r.dq = (float *)xmalloc(p->nq * 4);
  r.dk = (float *)xmalloc(p->nkv * 4);
  r.dv = (float *)xmalloc(p->nkv * 4);
  download_bf16(r.out, p->d_out, p->nq);
  CUDA_CHECK(cudaMemcpy(r.lse, p->d_lse, p->nl * 4, cudaMemcpyDeviceToHost));
  download_bf16(r.dq, p->d_dq, p->nq);
  download_bf16(r.dk, p->d_dk, p->nkv);
  download_bf16(r.dv, p->d_dv, p->nkv);
  return r;
}

static void results_free(Results *r) { free(r->out), free(r->lse), free(r->dq), free(r->dk), free(r->dv); }

// ---- small shapes: the whole output against the CPU reference ----------------------------------

static void test_against_cpu(Shape s, uint64_t seed) {
  char name[128];
  snprintf(name, sizeof name, "B=%d T=%d H=%d KV=%d hd=%d vs CPU reference", s.B, s.T, s.H, s.KV, s.hd);
  TEST_SECTION(name);
  Problem p;
  problem_init(&p, s, seed);
  gpu_fwd(&p);
  gpu_bwd(&p);
  Results g = download_results(&p);

  Results ref;
  ref.out = (float *)xmalloc(p.nq * 4);
  ref.lse = (float *)xmalloc(p.nl * 4);
  ref.dq = (float *)xmalloc(p.nq * 4);
  ref.dk = (float *)xmalloc(p.nkv * 4);
  ref.dv = (float *)xmalloc(p.nkv * 4);
  attention_forward(ref.out, ref.lse, p.q, p.k, p.v, s.B, s.T, s.H, s.KV, s.hd);
  attention_backward(ref.dq, ref.dk, ref.dv, p.dout, p.q, p.k, p.v, ref.out, ref.lse, s.B, s.T, s.H, s.KV, s.hd);

  check_close("out", g.out, ref.out, p.nq, TOL_OUT);
  check_close("lse", g.lse, ref.lse, p.nl, TOL_LSE);
  check_close("dq", g.dq, ref.dq, p.nq, TOL_GRAD);
  check_close("dk", g.dk, ref.dk, p.nkv, TOL_GRAD);
  check_close("dv", g.dv, ref.dv, p.nkv, TOL_GRAD);
  results_free(&g);
  results_free(&ref);
  problem_free(&p);
}

// Forward twice, and the deterministic backward twice: bit-identical results.
static void test_determinism(Shape s, uint64_t seed) {
  TEST_SECTION("repeatability: forward, deterministic backward");
  Problem p;
  problem_init(&p, s, seed);
  attention_cudnn_set_deterministic(A, 1);
  gpu_fwd(&p);
  gpu_bwd(&p);
  Results a = download_results(&p);
  gpu_fwd(&p);
  gpu_bwd(&p);
  Results b = download_results(&p);
  attention_cudnn_set_deterministic(A, 0);
  CHECK(memcmp(a.out, b.out, p.nq * 4) == 0, "forward out differs between two runs");
  CHECK(memcmp(a.lse, b.lse, p.nl * 4) == 0, "forward lse differs between two runs");
  CHECK(memcmp(a.dq, b.dq, p.nq * 4) == 0, "deterministic dq differs between two runs");
  CHECK(memcmp(a.dk, b.dk, p.nkv * 4) == 0, "deterministic dk differs between two runs");
  CHECK(memcmp(a.dv, b.dv, p.nkv * 4) == 0, "deterministic dv differs between two runs");

  // The deterministic kernel must also be right, not merely repeatable.
  float *dq = (float *)xmalloc(p.nq * 4), *dk = (float *)xmalloc(p.nkv * 4), *dv = (float *)xmalloc(p.nkv * 4);
  float *out = (float *)xmalloc(p.nq * 4), *lse = (float *)xmalloc(p.nl * 4);
  attention_forward(out, lse, p.q, p.k, p.v, s.B, s.T, s.H, s.KV, s.hd);
  attention_backward(dq, dk, dv, p.dout, p.q, p.k, p.v, out, lse, s.B, s.T, s.H, s.KV, s.hd);
  check_close("dq", a.dq, dq, p.nq, TOL_GRAD);
  check_close("dk", a.dk, dk, p.nkv, TOL_GRAD);
  check_close("dv", a.dv, dv, p.nkv, TOL_GRAD);
  printf("  workspace held: %.1f MiB\n", attention_cudnn_workspace_bytes(A) / 1048576.0);
  free(dq), free(dk), free(dv), free(out), free(lse);
  results_free(&a);
  results_free(&b);
  problem_free(&p);
}

// ---- large shapes: a double-precision reference at sampled places -------------------------------
// Rows (b, h, t) give out, lse and dq. dk and dv are checked for the last J keys of each sequence:
// only queries t >= T-J see those keys, so computing all of those rows gives them exactly.

typedef struct {
  int b, h, t;
} Row;

typedef struct {
  int nrows, ntail, J;  // rows[0..ntail) are the tail rows t >= T-J, then random rows
  Row *rows;
  double *out, *lse, *dq;  // [nrows][hd], [nrows], [nrows][hd]
  double *dk, *dv;         // [B][J][KV][hd]
} Sampled;

// One query row in double: fills p[j] (probabilities) and ds[j] (dS, scale included) for j <= t,
// o and dq; returns the lse.
static double row_ref(Shape s, const float *q, const float *k, const float *v, const float *dout, Row r, double *p,
                      double *ds, double *o, double *dq) {
  const int g = r.h / (s.H / s.KV), hd = s.hd;
  const size_t qs = (size_t)s.H * hd, kvs = (size_t)s.KV * hd, row = ((size_t)r.b * s.T + r.t) * qs + r.h * hd;
  const float *qr = q + row, *dr = dout + row;
  const float *kb = k + (size_t)r.b * s.T * kvs + g * hd, *vb = v + (size_t)r.b * s.T * kvs + g * hd;
  const double scale = 1.0 / sqrt((double)hd);
  double mx = -INFINITY, sum = 0, delta = 0;
  for (int j = 0; j <= r.t; j++) {
    double d = 0;
    for (int i = 0; i < hd; i++) d += (double)qr[i] * kb[j * kvs + i];
    p[j] = d * scale;
    if (p[j] > mx) mx = p[j];
  }
  for (int j = 0; j <= r.t; j++) sum += (p[j] = exp(p[j] - mx));
  for (int i = 0; i < hd; i++) o[i] = dq[i] = 0;
  for (int j = 0; j <= r.t; j++) {
    p[j] /= sum;
    for (int i = 0; i < hd; i++) o[i] += p[j] * vb[j * kvs + i];
  }
  for (int i = 0; i < hd; i++) delta += dr[i] * o[i];
  for (int j = 0; j <= r.t; j++) {
    double dp = 0;
    for (int i = 0; i < hd; i++) dp += (double)dr[i] * vb[j * kvs + i];
    ds[j] = p[j] * (dp - delta) * scale;
    for (int i = 0; i < hd; i++) dq[i] += ds[j] * kb[j * kvs + i];
  }
  return mx + log(sum);
}

static Sampled sampled_ref(Shape s, const float *q, const float *k, const float *v, const float *dout, int J,
                           int nrandom, uint64_t seed) {
  Sampled S;
  const int hd = s.hd;
  S.J = J;
  S.ntail = s.B * s.H * J;
  S.nrows = S.ntail + nrandom;
  S.rows = (Row *)xmalloc(S.nrows * sizeof(Row));
  int n = 0;
  for (int b = 0; b < s.B; b++)
    for (int h = 0; h < s.H; h++)
      for (int t = s.T - J; t < s.T; t++) {
        Row rw = {b, h, t};
        S.rows[n++] = rw;
      }
  Rng r;
  rng_seed(&r, seed);
  for (int i = 0; i < nrandom; i++) {  // includes t = 0 and t = 1, the rows with the fewest keys
    Row rw;
    rw.t = i < 2 ? i : (int)(rng_u64(&r) % (uint64_t)(s.T - J));
    rw.b = (int)(rng_u64(&r) % (uint64_t)s.B);
    rw.h = (int)(rng_u64(&r) % (uint64_t)s.H);
    S.rows[n++] = rw;
  }
  S.out = (double *)xcalloc((size_t)S.nrows * hd, sizeof(double));
  S.dq = (double *)xcalloc((size_t)S.nrows * hd, sizeof(double));
  S.lse = (double *)xcalloc(S.nrows, sizeof(double));
  size_t nkv = (size_t)s.B * J * s.KV * hd;
  S.dk = (double *)xcalloc(nkv, sizeof(double));
  S.dv = (double *)xcalloc(nkv, sizeof(double));
  double *p = (double *)xmalloc(s.T * sizeof(double)), *ds = (double *)xmalloc(s.T * sizeof(double));
  for (int i = 0; i < S.nrows; i++) {
    Row rw = S.rows[i];
    S.lse[i] = row_ref(s, q, k, v, dout, rw, p, ds, S.out + (size_t)i * hd, S.dq + (size_t)i * hd);
    if (i >= S.ntail) continue;
    const int g = rw.h / (s.H / s.KV);
    const float *qr = q + ((size_t)rw.b * s.T + rw.t) * s.H * hd + rw.h * hd;
    const float *dr = dout + ((size_t)rw.b * s.T + rw.t) * s.H * hd + rw.h * hd;
    for (int j = s.T - J; j <= rw.t; j++) {
      double *dk = S.dk + (((size_t)rw.b * J + (j - (s.T - J))) * s.KV + g) * hd;
      double *dv = S.dv + (((size_t)rw.b * J + (j - (s.T - J))) * s.KV + g) * hd;
      for (int c = 0; c < hd; c++) {
        dk[c] += ds[j] * qr[c];
        dv[c] += p[j] * dr[c];
      }
    }
  }
  free(p), free(ds);
  return S;
}

static void sampled_free(Sampled *S) {
  free(S->rows), free(S->out), free(S->lse), free(S->dq), free(S->dk), free(S->dv);
}

// Gathers the full-size results x at the sampled places and compares them with the reference.
static void check_sampled(Shape s, const Sampled *S, const Results *x, double tol_out, double tol_lse,
                          double tol_grad) {
  const int hd = s.hd, J = S->J;
  size_t nr = (size_t)S->nrows * hd, nkv = (size_t)s.B * J * s.KV * hd;
  float *a = (float *)xmalloc(nr * 4), *b = (float *)xmalloc(nr * 4);
  float *la = (float *)xmalloc(S->nrows * 4), *lb = (float *)xmalloc(S->nrows * 4);
  for (int i = 0; i < S->nrows; i++) {
    Row r = S->rows[i];
    la[i] = x->lse[((size_t)r.b * s.H + r.h) * s.T + r.t];
    lb[i] = (float)S->lse[i];
  }
  check_close("lse", la, lb, S->nrows, tol_lse);
  for (int pass = 0; pass < 2; pass++) {  // out, then dq: same row layout
    const float *full = pass == 0 ? x->out : x->dq;
    const double *ref = pass == 0 ? S->out : S->dq;
    for (int i = 0; i < S->nrows; i++) {
      Row r = S->rows[i];
      const float *src = full + ((size_t)r.b * s.T + r.t) * s.H * hd + r.h * hd;
      for (int c = 0; c < hd; c++) {
        a[(size_t)i * hd + c] = src[c];
        b[(size_t)i * hd + c] = (float)ref[(size_t)i * hd + c];
      }
    }
    check_close(pass == 0 ? "out" : "dq", a, b, nr, pass == 0 ? tol_out : tol_grad);
  }
  float *ka = (float *)xmalloc(nkv * 4), *kb = (float *)xmalloc(nkv * 4);
  for (int pass = 0; pass < 2; pass++) {  // dk, then dv, for keys T-J..T-1
    const float *full = pass == 0 ? x->dk : x->dv;
    const double *ref = pass == 0 ? S->dk : S->dv;
    for (int b0 = 0; b0 < s.B; b0++)
      for (int j = 0; j < J; j++) {
        const float *src = full + ((size_t)b0 * s.T + s.T - J + j) * s.KV * hd;
        size_t off = ((size_t)b0 * J + j) * s.KV * hd;
        for (size_t c = 0; c < (size_t)s.KV * hd; c++) {
          ka[off + c] = src[c];
          kb[off + c] = (float)ref[off + c];
        }
      }
    check_close(pass == 0 ? "dk" : "dv", ka, kb, nkv, tol_grad);
  }
  free(a), free(b), free(la), free(lb), free(ka), free(kb);
}

// The sampled double reference itself, checked against model/cpu/attention.c (no GPU involved).
static void test_sampled_reference(void) {
  TEST_SECTION("sampled double-precision reference vs model/cpu/attention.c");
  Shape s = {2, 48, 4, 2, 16};
  size_t nq = (size_t)s.B * s.T * s.H * s.hd, nkv = (size_t)s.B * s.T * s.KV * s.hd, nl = (size_t)s.B * s.H * s.T;
  Rng r;
  rng_seed(&r, 7);
  float *q = (float *)xmalloc(nq * 4), *k = (float *)xmalloc(nkv * 4), *v = (float *)xmalloc(nkv * 4),
        *dout = (float *)xmalloc(nq * 4);
  for (size_t i = 0; i < nq; i++) q[i] = rng_normal(&r), dout[i] = rng_normal(&r);
  for (size_t i = 0; i < nkv; i++) k[i] = rng_normal(&r), v[i] = rng_normal(&r);
  Results c;
  c.out = (float *)xmalloc(nq * 4), c.lse = (float *)xmalloc(nl * 4), c.dq = (float *)xmalloc(nq * 4);
  c.dk = (float *)xmalloc(nkv * 4), c.dv = (float *)xmalloc(nkv * 4);
  attention_forward(c.out, c.lse, q, k, v, s.B, s.T, s.H, s.KV, s.hd);
  attention_backward(c.dq, c.dk, c.dv, dout, q, k, v, c.out, c.lse, s.B, s.T, s.H, s.KV, s.hd);
  Sampled S = sampled_ref(s, q, k, v, dout, 8, 10, 11);
  check_sampled(s, &S, &c, 1e-5, 1e-6, 1e-5);  // fp32 vs double over short sums
  sampled_free(&S);
  results_free(&c);
  free(q), free(k), free(v), free(dout);
}

// ---- one Llama-3 8B layer: sampled check and timing ----------------------------------------------

static float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CUDA_CHECK(cudaEventSynchronize(b));
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

// Mean ms of `reps` calls of fwd (backward = 0) or bwd (1), after `warmup` untimed calls.
static float time_op(Problem *p, int backward, int warmup, int reps) {
  const Shape s = p->s;
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < warmup + reps; i++) {
    if (i == warmup) CUDA_CHECK(cudaEventRecord(e0, cuda_stream()));
    if (backward)
      attention_cudnn_bwd(A, p->d_dq, p->d_dk, p->d_dv, p->d_dout, p->d_q, p->d_k, p->d_v, p->d_out, p->d_lse, s.B, s.T,
                          s.H, s.KV, s.hd);
    else attention_cudnn_fwd(A, p->d_out, p->d_lse, p->d_q, p->d_k, p->d_v, s.B, s.T, s.H, s.KV, s.hd);
  }
  CUDA_CHECK(cudaEventRecord(e1, cuda_stream()));
  float ms = elapsed_ms(e0, e1) / reps;
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  return ms;
}

static const Shape LLAMA8B = {1, 8192, 32, 8, 128};
// Forward FLOPs: QK^T and PV, 2*T*T*hd each per head, halved by the causal mask. Backward: 2.5x.
static double fwd_flop(Shape s) { return 2.0 * 2.0 * s.B * s.H * (double)s.T * s.T * s.hd / 2; }

// Builds the problem p and keeps the fast backward's results in g for llama8b_deterministic.
static void llama8b_fast(Problem *p, Results *g) {
  const Shape s = LLAMA8B;
  TEST_SECTION("Llama-3 8B layer: B=1 T=8192 H=32 KV=8 hd=128");
  double t0 = now_seconds();
  problem_init(p, s, 2024);
  gpu_fwd(p);  // first calls build the graphs
  gpu_bwd(p);
  *g = download_results(p);
  printf("  data + graph builds + first run: %.1f s\n", now_seconds() - t0);
  t0 = now_seconds();
  Sampled S = sampled_ref(s, p->q, p->k, p->v, p->dout, 8, 64, 5);
  printf("  sampled reference: %d rows, dk/dv of the last %d keys (%.1f s)\n", S.nrows, S.J, now_seconds() - t0);
  check_sampled(s, &S, g, TOL_OUT, TOL_LSE, TOL_GRAD);
  sampled_free(&S);

  const double fwd = fwd_flop(s), bwd = 2.5 * fwd;
  const double paper_flop = 12.0 * s.H * s.hd * s.T * ((double)s.B * s.T);  // 12*H*hd*S per token, fwd+bwd
  float fwd_ms = time_op(p, 0, 3, 20), bwd_ms = time_op(p, 1, 3, 20), fb = fwd_ms + bwd_ms;
  printf("  forward   %7.3f ms  %6.1f TFLOP/s  (causal count %.1f GFLOP)\n", fwd_ms, fwd / fwd_ms * 1e-9, fwd * 1e-9);
  printf("  backward  %7.3f ms  %6.1f TFLOP/s  (2.5x forward)\n", bwd_ms, bwd / bwd_ms * 1e-9);
  printf("  fwd+bwd   %7.3f ms  %6.1f TFLOP/s causal; paper formula %.1f GFLOP -> %.1f TFLOP/s\n", fb,
         (fwd + bwd) / fb * 1e-9, paper_flop * 1e-9, paper_flop / fb * 1e-9);
  printf("  (docs/formats.md §3: cuDNN through PyTorch, same shape: 3.6 ms fwd+bwd, ~534 TFLOP/s causal)\n");
  // Generous bound (3x the PyTorch figure): catches a slow fallback engine, not small regressions.
  CHECK(fb < 10.8f, "fwd+bwd %.3f ms, more than 3x the 3.6 ms cuDNN reaches through PyTorch", fb);
}

// Deterministic backward at the 8B shape: repeatable, close to the fast one (g), and its cost.
// Run last: it needs a multi-GiB workspace on Hopper.
static void llama8b_deterministic(Problem *p, const Results *g) {
  TEST_SECTION("Llama-3 8B layer: deterministic backward");
  attention_cudnn_set_deterministic(A, 1);
  gpu_bwd(p);
  Results a = download_results(p);
  gpu_bwd(p);
  Results b = download_results(p);
  CHECK(
      memcmp(a.dq, b.dq, p->nq * 4) == 0 && memcmp(a.dk, b.dk, p->nkv * 4) == 0 && memcmp(a.dv, b.dv, p->nkv * 4) == 0,
      "deterministic backward differs between two runs at the 8B shape");
  check_close("dq", a.dq, g->dq, p->nq, TOL_GRAD);
  check_close("dk", a.dk, g->dk, p->nkv, TOL_GRAD);
  check_close("dv", a.dv, g->dv, p->nkv, TOL_GRAD);
  float det_ms = time_op(p, 1, 1, 5);
  printf("  deterministic backward %.3f ms (%.1f TFLOP/s), workspace %.1f MiB\n", det_ms,
         2.5 * fwd_flop(p->s) / det_ms * 1e-9, attention_cudnn_workspace_bytes(A) / 1048576.0);
  attention_cudnn_set_deterministic(A, 0);
  results_free(&a);
  results_free(&b);
}

int main(int argc, char **argv) {
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  test_sampled_reference();  // host only, before any CUDA call

  int dev = 0;
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  printf("device %s (sm_%d%d), cuDNN %zu\n", prop.name, prop.major, prop.minor, cudnnGetVersion());
  cudaStream_t stream;  // a stream of our own, as the backend has: the ops must honour cuda_stream()
  CUDA_CHECK(cudaStreamCreate(&stream));
  cuda_set_stream(stream);
  A = attention_cudnn_create();

  const Shape shapes[] = {
      {2, 128, 8, 2, 64},
      {2, 128, 8, 2, 128},
      {1, 200, 4, 1, 128},  // T not a multiple of 64, a single kv head
      {2, 200, 8, 8, 64},   // plain multi-head (KV = H)
  };
  for (int i = 0; i < 4; i++) test_against_cpu(shapes[i], 1 + i);
  // The deterministic runs come after the fast 8B timing, so that an unsupported deterministic
  // mode (which dies with cuDNN's message) cannot hide the other results.
  Problem big;
  Results big_fast;
  if (!quick) llama8b_fast(&big, &big_fast);
  test_determinism(shapes[1], 5);
  if (!quick) {
    llama8b_deterministic(&big, &big_fast);
    results_free(&big_fast);
    problem_free(&big);
  }

  attention_cudnn_destroy(A);
  CUDA_CHECK(cudaStreamDestroy(stream));
  TEST_END();
}
