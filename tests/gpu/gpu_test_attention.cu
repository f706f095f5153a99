// tests/gpu/gpu_test_attention.cu: cuDNN flash attention (model/cuda/attention_cudnn.cpp) against the fp32 CPU
// reference (model/cpu/attention.c), then one Llama-3 8B layer's attention (B=1, T=8192, H=32, KV=8,
// hd=128): checked at sampled rows against a double-precision reference, and timed. The same for
// document masking (block-causal attention, cuDNN's ragged THD graphs): the ragged offsets kernel
// against its C reference byte for byte, small shapes against the CPU reference on several document
// layouts, and the 8B layer on web-like document lengths, sampled and timed beside plain causal. The
// deterministic document backward (graph calls over groups of documents, doc_mask_groups) against the
// fast one and the CPU reference, repeatable bit for bit, and at the 8B shape within plain causal's
// workspace.
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
#include "model/doc_mask.h"
#include "model/ops.h"
#include "run/bench_attention.h"
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
  // documents (problem_set_docs): docs points at dm (device start and cu, host cu_h = cu), start and
  // cu are the host copies
  const DocMask *docs;
  DocMask dm;
  int *start, *cu;
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

// Block-causal attention over the documents of tokens [B*T] (a document starts at each `bos` and at
// each row's first token), as model/llama.c passes them.
static void problem_set_docs(Problem *p, const int *tokens, int bos) {
  const size_t N = (size_t)p->s.B * p->s.T;
  p->start = (int *)xmalloc(N * sizeof(int));
  int *cu = p->cu = (int *)xmalloc((N + 1) * sizeof(int));
  p->dm.n_docs = doc_mask_build(tokens, p->s.B, p->s.T, bos, p->start, NULL, cu, &p->dm.pairs);
  int *d_start = (int *)dev_alloc(N * sizeof(int)), *d_cu = (int *)dev_alloc((N + 1) * sizeof(int));
  CUDA_CHECK(cudaMemcpy(d_start, p->start, N * sizeof(int), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_cu, cu, (p->dm.n_docs + 1) * sizeof(int), cudaMemcpyHostToDevice));
  p->dm.start = d_start, p->dm.cu = d_cu, p->dm.cu_h = cu;
  p->docs = &p->dm;
}

static void problem_free(Problem *p) {
  free(p->q), free(p->k), free(p->v), free(p->dout), free(p->start), free(p->cu);
  void *d[] = {p->d_q, p->d_k, p->d_v, p->d_dout, p->d_out, p->d_dq, p->d_dk, p->d_dv, p->d_lse};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) CUDA_CHECK(cudaFree(d[i]));
  if (p->docs) {
    CUDA_CHECK(cudaFree((void *)p->dm.start));
    CUDA_CHECK(cudaFree((void *)p->dm.cu));
  }
}

// The outputs are first filled with 0xff bytes (NaN in BF16 and fp32), so an element the kernels
// skip, or add into instead of overwriting, shows up as NaN.
static void gpu_fwd(Problem *p) {
  const Shape s = p->s;
  CUDA_CHECK(cudaMemsetAsync(p->d_out, 0xff, p->nq * 2, cuda_stream()));
  CUDA_CHECK(cudaMemsetAsync(p->d_lse, 0xff, p->nl * 4, cuda_stream()));
  attention_cudnn_fwd(A, p->d_out, p->d_lse, p->d_q, p->d_k, p->d_v, p->docs, s.B, s.T, s.H, s.KV, s.hd);
}

static void gpu_bwd(Problem *p) {
  const Shape s = p->s;
  CUDA_CHECK(cudaMemsetAsync(p->d_dq, 0xff, p->nq * 2, cuda_stream()));
  CUDA_CHECK(cudaMemsetAsync(p->d_dk, 0xff, p->nkv * 2, cuda_stream()));
  CUDA_CHECK(cudaMemsetAsync(p->d_dv, 0xff, p->nkv * 2, cuda_stream()));
  attention_cudnn_bwd(A, p->d_dq, p->d_dk, p->d_dv, p->d_dout, p->d_q, p->d_k, p->d_v, p->d_out, p->d_lse, p->docs, s.B,
                      s.T, s.H, s.KV, s.hd);
}

// Host copies of everything the GPU produced (lse as [B, H, T], also when cuDNN's is [B*T, H]).
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
  if (p->docs) {  // the ragged lse is token-major
    float *t = (float *)xmalloc(p->nl * 4);
    const int T = p->s.T, H = p->s.H;
    for (size_t n = 0; n < (size_t)p->s.B * T; n++)
      for (int h = 0; h < H; h++) t[((n / T) * H + h) * T + n % T] = r.lse[n * H + h];
    memcpy(r.lse, t, p->nl * 4);
    free(t);
  }
  download_bf16(r.dq, p->d_dq, p->nq);
  download_bf16(r.dk, p->d_dk, p->nkv);
  download_bf16(r.dv, p->d_dv, p->nkv);
  return r;
}

static void results_free(Results *r) { free(r->out), free(r->lse), free(r->dq), free(r->dk), free(r->dv); }

// ---- small shapes: the whole output against the CPU reference ----------------------------------

// Document layouts of the masked tests: tokens [B*T] with BOS = 1.
enum { DOCS_NONE, DOCS_RANDOM, DOCS_ONE_PER_ROW, DOCS_SHORT, DOCS_WEB };
static const char *const DOC_LAYOUTS[] = {"", "random documents", "no BOS (one document per row)",
                                          "short documents, BOS pairs, BOS last", "web-like lengths (mean 100)"};

static int *doc_tokens(int layout, Shape s, uint64_t seed) {
  const int N = s.B * s.T;
  int *t = (int *)xmalloc(N * sizeof(int));
  Rng r;
  rng_seed(&r, seed);
  for (int n = 0; n < N; n++) {
    if (layout == DOCS_RANDOM) t[n] = rng_u64(&r) % 40 == 0;  // documents of ~40 tokens
    else if (layout == DOCS_SHORT) t[n] = rng_u64(&r) % 3 == 0 || n % s.T == s.T - 1;
    else t[n] = 0;
  }
  if (layout == DOCS_SHORT) t[1] = t[2] = 1;  // documents of one token
  if (layout == DOCS_WEB) bench_web_documents(t, N, 1000, 1, 100, WEB_DOC_SIGMA, seed);
  return t;
}

// A problem of shape s from seed, with the documents of `layout` (DOCS_NONE: plain causal).
static void problem_with_docs(Problem *p, Shape s, uint64_t seed, int layout) {
  problem_init(p, s, seed);
  if (!layout) return;
  int *tokens = doc_tokens(layout, s, seed);
  problem_set_docs(p, tokens, 1);
  free(tokens);
}

static void test_against_cpu(Shape s, uint64_t seed, int layout) {
  char name[192];
  snprintf(name, sizeof name, "B=%d T=%d H=%d KV=%d hd=%d%s%s vs CPU reference", s.B, s.T, s.H, s.KV, s.hd,
           layout ? ", documents: " : "", DOC_LAYOUTS[layout]);
  TEST_SECTION(name);
  Problem p;
  problem_with_docs(&p, s, seed, layout);
  if (layout) printf("  %d documents in %d rows\n", p.dm.n_docs, s.B);
  gpu_fwd(&p);
  gpu_bwd(&p);
  Results g = download_results(&p);

  Results ref;
  ref.out = (float *)xmalloc(p.nq * 4);
  ref.lse = (float *)xmalloc(p.nl * 4);
  ref.dq = (float *)xmalloc(p.nq * 4);
  ref.dk = (float *)xmalloc(p.nkv * 4);
  ref.dv = (float *)xmalloc(p.nkv * 4);
  attention_forward(ref.out, ref.lse, p.q, p.k, p.v, p.start, s.B, s.T, s.H, s.KV, s.hd);
  attention_backward(ref.dq, ref.dk, ref.dv, p.dout, p.q, p.k, p.v, ref.out, ref.lse, p.start, s.B, s.T, s.H, s.KV,
                     s.hd);

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
static void test_determinism(Shape s, uint64_t seed, int layout) {
  TEST_SECTION(layout ? "repeatability with documents: forward, deterministic backward"
                      : "repeatability: forward, deterministic backward");
  Problem p;
  problem_with_docs(&p, s, seed, layout);
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
  attention_forward(out, lse, p.q, p.k, p.v, p.start, s.B, s.T, s.H, s.KV, s.hd);
  attention_backward(dq, dk, dv, p.dout, p.q, p.k, p.v, out, lse, p.start, s.B, s.T, s.H, s.KV, s.hd);
  check_close("dq", a.dq, dq, p.nq, TOL_GRAD);
  check_close("dk", a.dk, dk, p.nkv, TOL_GRAD);
  check_close("dv", a.dv, dv, p.nkv, TOL_GRAD);
  printf("  workspace held: %.1f MiB\n", attention_cudnn_workspace_bytes(A) / 1048576.0);
  free(dq), free(dk), free(dv), free(out), free(lse);
  results_free(&a);
  results_free(&b);
  problem_free(&p);
}

// The deterministic document backward, run as graph calls over groups of documents (doc_mask_groups),
// against the fast (one graph) backward and the CPU reference; twice bit for bit; and once more with
// DocMask.cu_h NULL (cu downloaded instead), the same bits.
static void test_docs_deterministic(Shape s, uint64_t seed, int layout) {
  char name[192];
  snprintf(name, sizeof name, "B=%d T=%d H=%d KV=%d hd=%d, documents: %s: deterministic (grouped) backward", s.B, s.T,
           s.H, s.KV, s.hd, DOC_LAYOUTS[layout]);
  TEST_SECTION(name);
  Problem p;
  problem_with_docs(&p, s, seed, layout);
  int *order = (int *)xmalloc(p.dm.n_docs * sizeof(int));
  DocGroup *groups = (DocGroup *)xmalloc(p.dm.n_docs * sizeof(DocGroup));
  const int ng = doc_mask_groups(p.cu, p.dm.n_docs, s.B, s.T, order, groups);
  printf("  %d documents in %d groups:", p.dm.n_docs, ng);
  for (int g = 0; g < ng && g < 8; g++) printf(" {S %d, b %d, n %d}", groups[g].S, groups[g].b, groups[g].n);
  printf("%s\n", ng > 8 ? " ..." : "");
  free(order), free(groups);

  gpu_fwd(&p);
  gpu_bwd(&p);  // the fast backward: one graph
  Results f = download_results(&p);
  attention_cudnn_set_deterministic(A, 1);
  gpu_bwd(&p);
  Results a = download_results(&p);
  gpu_bwd(&p);
  Results b = download_results(&p);
  p.dm.cu_h = NULL;
  gpu_bwd(&p);
  Results c = download_results(&p);
  p.dm.cu_h = p.cu;
  attention_cudnn_set_deterministic(A, 0);

  float *out = (float *)xmalloc(p.nq * 4), *lse = (float *)xmalloc(p.nl * 4);
  float *dq = (float *)xmalloc(p.nq * 4), *dk = (float *)xmalloc(p.nkv * 4), *dv = (float *)xmalloc(p.nkv * 4);
  attention_forward(out, lse, p.q, p.k, p.v, p.start, s.B, s.T, s.H, s.KV, s.hd);
  attention_backward(dq, dk, dv, p.dout, p.q, p.k, p.v, out, lse, p.start, s.B, s.T, s.H, s.KV, s.hd);
  printf("  fast backward vs CPU reference:\n");
  check_close("dq", f.dq, dq, p.nq, TOL_GRAD);
  check_close("dk", f.dk, dk, p.nkv, TOL_GRAD);
  check_close("dv", f.dv, dv, p.nkv, TOL_GRAD);
  printf("  deterministic backward vs CPU reference:\n");  // NaN where a group left a row unwritten
  check_close("dq", a.dq, dq, p.nq, TOL_GRAD);
  check_close("dk", a.dk, dk, p.nkv, TOL_GRAD);
  check_close("dv", a.dv, dv, p.nkv, TOL_GRAD);
  printf("  deterministic vs fast backward:\n");
  check_close("dq", a.dq, f.dq, p.nq, TOL_GRAD);
  check_close("dk", a.dk, f.dk, p.nkv, TOL_GRAD);
  check_close("dv", a.dv, f.dv, p.nkv, TOL_GRAD);
  CHECK(!memcmp(a.dq, b.dq, p.nq * 4) && !memcmp(a.dk, b.dk, p.nkv * 4) && !memcmp(a.dv, b.dv, p.nkv * 4),
        "deterministic document backward differs between two runs");
  CHECK(!memcmp(a.dq, c.dq, p.nq * 4) && !memcmp(a.dk, c.dk, p.nkv * 4) && !memcmp(a.dv, c.dv, p.nkv * 4),
        "deterministic document backward with cu downloaded (DocMask.cu_h NULL) differs");
  printf("  workspace held: %.1f MiB\n", attention_cudnn_workspace_bytes(A) / 1048576.0);
  free(out), free(lse), free(dq), free(dk), free(dv);
  results_free(&f), results_free(&a), results_free(&b), results_free(&c);
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

// One query row in double: fills p[j] (probabilities) and ds[j] (dS, scale included) for j0 <= j <= t,
// o and dq; returns the lse. j0: where the row's document starts (start, DocMask.start on the host),
// 0 without documents.
static double row_ref(Shape s, const float *q, const float *k, const float *v, const float *dout, const int *start,
                      Row r, double *p, double *ds, double *o, double *dq) {
  const int g = r.h / (s.H / s.KV), hd = s.hd;
  const size_t qs = (size_t)s.H * hd, kvs = (size_t)s.KV * hd, row = ((size_t)r.b * s.T + r.t) * qs + r.h * hd;
  const float *qr = q + row, *dr = dout + row;
  const float *kb = k + (size_t)r.b * s.T * kvs + g * hd, *vb = v + (size_t)r.b * s.T * kvs + g * hd;
  const double scale = 1.0 / sqrt((double)hd);
  const int j0 = start ? start[(size_t)r.b * s.T + r.t] : 0;
  double mx = -INFINITY, sum = 0, delta = 0;
  for (int j = j0; j <= r.t; j++) {
    double d = 0;
    for (int i = 0; i < hd; i++) d += (double)qr[i] * kb[j * kvs + i];
    p[j] = d * scale;
    if (p[j] > mx) mx = p[j];
  }
  for (int j = j0; j <= r.t; j++) sum += (p[j] = exp(p[j] - mx));
  for (int i = 0; i < hd; i++) o[i] = dq[i] = 0;
  for (int j = j0; j <= r.t; j++) {
    p[j] /= sum;
    for (int i = 0; i < hd; i++) o[i] += p[j] * vb[j * kvs + i];
  }
  for (int i = 0; i < hd; i++) delta += dr[i] * o[i];
  for (int j = j0; j <= r.t; j++) {
    double dp = 0;
    for (int i = 0; i < hd; i++) dp += (double)dr[i] * vb[j * kvs + i];
    ds[j] = p[j] * (dp - delta) * scale;
    for (int i = 0; i < hd; i++) dq[i] += ds[j] * kb[j * kvs + i];
  }
  return mx + log(sum);
}

static Sampled sampled_ref(Shape s, const float *q, const float *k, const float *v, const float *dout, const int *start,
                           int J, int nrandom, uint64_t seed) {
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
    S.lse[i] = row_ref(s, q, k, v, dout, start, rw, p, ds, S.out + (size_t)i * hd, S.dq + (size_t)i * hd);
    if (i >= S.ntail) continue;
    const int g = rw.h / (s.H / s.KV);
    const float *qr = q + ((size_t)rw.b * s.T + rw.t) * s.H * hd + rw.h * hd;
    const float *dr = dout + ((size_t)rw.b * s.T + rw.t) * s.H * hd + rw.h * hd;
    const int j0 = start ? start[(size_t)rw.b * s.T + rw.t] : 0;  // keys of earlier documents get nothing
    for (int j = s.T - J > j0 ? s.T - J : j0; j <= rw.t; j++) {
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

// The sampled double reference itself, checked against model/cpu/attention.c (no GPU involved),
// without and with documents.
static void test_sampled_reference(int layout) {
  TEST_SECTION(layout ? "sampled double-precision reference vs model/cpu/attention.c, documents"
                      : "sampled double-precision reference vs model/cpu/attention.c");
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
  int *start = NULL, *cu = NULL;
  if (layout) {
    int *tokens = doc_tokens(layout, s, 3);
    start = (int *)xmalloc((size_t)s.B * s.T * sizeof(int)), cu = (int *)xmalloc(((size_t)s.B * s.T + 1) * sizeof(int));
    double pairs;
    doc_mask_build(tokens, s.B, s.T, 1, start, NULL, cu, &pairs);
    free(tokens);
  }
  attention_forward(c.out, c.lse, q, k, v, start, s.B, s.T, s.H, s.KV, s.hd);
  attention_backward(c.dq, c.dk, c.dv, dout, q, k, v, c.out, c.lse, start, s.B, s.T, s.H, s.KV, s.hd);
  Sampled S = sampled_ref(s, q, k, v, dout, start, 8, 10, 11);
  check_sampled(s, &S, &c, 1e-5, 1e-6, 1e-5);  // fp32 vs double over short sums
  sampled_free(&S);
  results_free(&c);
  free(q), free(k), free(v), free(dout), free(start), free(cu);
}

// attention_docs_ragged_cuda against doc_mask_ragged (model/doc_mask.c), byte for byte.
static void test_ragged_offsets(void) {
  TEST_SECTION("ragged offsets and lengths (attention_docs.cu) vs doc_mask_ragged");
  const int counts[] = {1, 6, 32, 33, 700};
  for (int c = 0; c < 5; c++) {
    const int n_docs = counts[c], nb = doc_mask_bucket(n_docs);
    int *cu = (int *)xmalloc((n_docs + 1) * sizeof(int));
    Rng r;
    rng_seed(&r, 40 + c);
    cu[0] = 0;
    for (int i = 1; i <= n_docs; i++) cu[i] = cu[i - 1] + 1 + (int)(rng_u64(&r) % 3000);
    int64_t *want = (int64_t *)xmalloc(3 * (nb + 1) * sizeof(int64_t)), *got = (int64_t *)xmalloc(3 * (nb + 1) * 8);
    int32_t *want_len = (int32_t *)xmalloc(nb * 4), *got_len = (int32_t *)xmalloc(nb * 4);
    doc_mask_ragged(cu, n_docs, nb, 32 * 128, 8 * 128, 32, want, want + nb + 1, want + 2 * (nb + 1), want_len);
    int *d_cu = (int *)dev_alloc((n_docs + 1) * sizeof(int));
    int64_t *d_off = (int64_t *)dev_alloc(3 * (nb + 1) * 8);
    int32_t *d_len = (int32_t *)dev_alloc(nb * 4);
    CUDA_CHECK(cudaMemcpy(d_cu, cu, (n_docs + 1) * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d_off, 0xff, 3 * (nb + 1) * 8));
    CUDA_CHECK(cudaMemset(d_len, 0xff, nb * 4));
    attention_docs_ragged_cuda(d_cu, n_docs, nb, 32 * 128, 8 * 128, 32, d_off, d_off + nb + 1, d_off + 2 * (nb + 1),
                               d_len);
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    CUDA_CHECK(cudaMemcpy(got, d_off, 3 * (nb + 1) * 8, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(got_len, d_len, nb * 4, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(got, want, 3 * (nb + 1) * 8) && !memcmp(got_len, want_len, nb * 4),
          "%d documents in a graph batch of %d: offsets or lengths differ", n_docs, nb);
    CUDA_CHECK(cudaFree(d_cu));
    CUDA_CHECK(cudaFree(d_off));
    CUDA_CHECK(cudaFree(d_len));
    free(cu), free(want), free(got), free(want_len), free(got_len);
  }
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
      attention_cudnn_bwd(A, p->d_dq, p->d_dk, p->d_dv, p->d_dout, p->d_q, p->d_k, p->d_v, p->d_out, p->d_lse, p->docs,
                          s.B, s.T, s.H, s.KV, s.hd);
    else attention_cudnn_fwd(A, p->d_out, p->d_lse, p->d_q, p->d_k, p->d_v, p->docs, s.B, s.T, s.H, s.KV, s.hd);
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
static float llama8b_fast(Problem *p, Results *g) {
  const Shape s = LLAMA8B;
  TEST_SECTION("Llama-3 8B layer: B=1 T=8192 H=32 KV=8 hd=128");
  double t0 = now_seconds();
  problem_init(p, s, 2024);
  gpu_fwd(p);  // first calls build the graphs
  gpu_bwd(p);
  *g = download_results(p);
  printf("  data + graph builds + first run: %.1f s\n", now_seconds() - t0);
  t0 = now_seconds();
  Sampled S = sampled_ref(s, p->q, p->k, p->v, p->dout, NULL, 8, 64, 5);
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
  return fb;
}

// The 8B layer's data (p, after the plain runs) as packed web-like documents (mean 1,000 tokens, as
// ./train --bench-attention draws them): sampled check with the documents' starts, and the cost
// beside plain causal (plain_ms: fwd+bwd of the same data). Keeps the results in g.
static void llama8b_docs(Problem *p, float plain_ms, Results *g_out) {
  const Shape s = p->s;
  TEST_SECTION("Llama-3 8B layer, documents of web-like lengths (mean 1000): sampled check, cost beside causal");
  int *tokens = (int *)xmalloc((size_t)s.B * s.T * sizeof(int));
  bench_web_documents(tokens, s.B * s.T, 128256, 128000, WEB_DOC_MEAN, WEB_DOC_SIGMA, 42);
  problem_set_docs(p, tokens, 128000);
  free(tokens);
  const double causal_pairs = (double)s.B * s.T * (s.T + 1) / 2;
  printf("  %d documents, %.1f%% of the causal pairs\n", p->dm.n_docs, 100 * p->dm.pairs / causal_pairs);
  gpu_fwd(p);
  gpu_bwd(p);
  Results g = *g_out = download_results(p);
  Sampled S = sampled_ref(s, p->q, p->k, p->v, p->dout, p->start, 8, 64, 6);
  check_sampled(s, &S, &g, TOL_OUT, TOL_LSE, TOL_GRAD);
  sampled_free(&S);
  const double fwd = 4.0 * p->dm.pairs * s.H * s.hd, bwd = 2.5 * fwd;
  float fwd_ms = time_op(p, 0, 3, 20), bwd_ms = time_op(p, 1, 3, 20), fb = fwd_ms + bwd_ms;
  printf("  forward   %7.3f ms  %6.1f TFLOP/s over the documents' pairs\n", fwd_ms, fwd / fwd_ms * 1e-9);
  printf("  backward  %7.3f ms  %6.1f TFLOP/s\n", bwd_ms, bwd / bwd_ms * 1e-9);
  printf("  fwd+bwd   %7.3f ms against %.3f ms plain causal: %.2fx (the pairs alone: %.2fx)\n", fb, plain_ms,
         fb / plain_ms, p->dm.pairs / causal_pairs);
  // The documents hold a fraction of the causal pairs: masking them must not cost more than causal.
  CHECK(fb < plain_ms, "document-masked fwd+bwd %.3f ms is not below plain causal's %.3f ms", fb, plain_ms);
}

// The deterministic backward on p twice: the two runs bit for bit alike, and close to the fast one (g).
static void deterministic_twice(Problem *p, const Results *g, const char *what) {
  attention_cudnn_set_deterministic(A, 1);
  gpu_bwd(p);
  Results a = download_results(p);
  gpu_bwd(p);
  Results b = download_results(p);
  CHECK(
      memcmp(a.dq, b.dq, p->nq * 4) == 0 && memcmp(a.dk, b.dk, p->nkv * 4) == 0 && memcmp(a.dv, b.dv, p->nkv * 4) == 0,
      "%s: the deterministic backward differs between two runs", what);
  check_close("dq", a.dq, g->dq, p->nq, TOL_GRAD);
  check_close("dk", a.dk, g->dk, p->nkv, TOL_GRAD);
  check_close("dv", a.dv, g->dv, p->nkv, TOL_GRAD);
  results_free(&a);
  results_free(&b);
}

// Deterministic backward at the 8B shape: repeatable, close to the fast one (g), and its cost.
// Run last: it needs a multi-GiB workspace on Hopper.
static void llama8b_deterministic(Problem *p, const Results *g) {
  TEST_SECTION("Llama-3 8B layer: deterministic backward");
  deterministic_twice(p, g, "8B layer");
  float det_ms = time_op(p, 1, 1, 5);
  printf("  deterministic backward %.3f ms (%.1f TFLOP/s), workspace %.1f MiB\n", det_ms,
         2.5 * fwd_flop(p->s) / det_ms * 1e-9, attention_cudnn_workspace_bytes(A) / 1048576.0);
  attention_cudnn_set_deterministic(A, 0);
}

// The deterministic backward on the 8B layer's web-like documents (p and the fast results g from
// llama8b_docs): one graph of 32+ entries of 8192 tokens would need a 128 GiB dP workspace; the groups
// must fit in what plain causal's deterministic backward already holds (plain_ws, up to a few MiB of
// the frontend's own), repeat bit for bit and agree with the fast backward. Run last: a group that
// still could not allocate dies with the message.
static void llama8b_docs_deterministic(Problem *p, const Results *g, size_t plain_ws) {
  TEST_SECTION("Llama-3 8B layer, web-like documents: deterministic backward (groups of documents)");
  int *order = (int *)xmalloc(p->dm.n_docs * sizeof(int));
  DocGroup *groups = (DocGroup *)xmalloc(p->dm.n_docs * sizeof(DocGroup));
  const int ng = doc_mask_groups(p->cu, p->dm.n_docs, p->s.B, p->s.T, order, groups);
  printf("  %d documents in %d groups:", p->dm.n_docs, ng);
  for (int i = 0; i < ng; i++) printf(" {S %d, b %d, n %d}", groups[i].S, groups[i].b, groups[i].n);
  printf("\n");
  free(order), free(groups);
  deterministic_twice(p, g, "8B layer, documents");
  const size_t ws = attention_cudnn_workspace_bytes(A);
  printf("  workspace held %.1f MiB (plain causal's deterministic backward: %.1f MiB)\n", ws / 1048576.0,
         plain_ws / 1048576.0);
  CHECK(ws <= plain_ws + ((size_t)64 << 20),
        "the groups grew the workspace to %.1f MiB, beyond plain causal's %.1f MiB", ws / 1048576.0,
        plain_ws / 1048576.0);
  float det_ms = time_op(p, 1, 1, 5);
  printf("  deterministic document backward %.3f ms\n", det_ms);
  attention_cudnn_set_deterministic(A, 0);
}

int main(int argc, char **argv) {
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  test_sampled_reference(DOCS_NONE);  // host only, before any CUDA call
  test_sampled_reference(DOCS_SHORT);

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
  for (int i = 0; i < 4; i++) test_against_cpu(shapes[i], 1 + i, DOCS_NONE);
  // Documents: the ragged description, then every layout on shapes with GQA, plain multi-head, T not
  // a multiple of 64, and more documents than the smallest graph batch (32).
  test_ragged_offsets();
  test_against_cpu(shapes[0], 11, DOCS_RANDOM);
  test_against_cpu(shapes[2], 12, DOCS_ONE_PER_ROW);
  test_against_cpu(shapes[3], 13, DOCS_SHORT);
  test_against_cpu((Shape){2, 1024, 8, 2, 128}, 14, DOCS_WEB);
  // The deterministic runs come after the fast 8B timing, so that an unsupported deterministic
  // mode (which dies with cuDNN's message) cannot hide the other results.
  Problem big;
  Results big_fast;
  float plain_ms = 0;
  if (!quick) plain_ms = llama8b_fast(&big, &big_fast);
  test_determinism(shapes[1], 5, DOCS_NONE);
  test_determinism(shapes[1], 6, DOCS_RANDOM);
  // The grouped deterministic document backward: many short documents (class 64, groups of b = 4),
  // T = 200 (classes 200 and 100), one document per row (S = T, b = B), web-like lengths over the
  // classes 1024 .. 64.
  test_docs_deterministic(shapes[0], 21, DOCS_SHORT);
  test_docs_deterministic(shapes[3], 22, DOCS_RANDOM);
  test_docs_deterministic(shapes[2], 23, DOCS_ONE_PER_ROW);
  test_docs_deterministic((Shape){2, 1024, 8, 2, 128}, 24, DOCS_WEB);
  if (!quick) {
    llama8b_deterministic(&big, &big_fast);
    const size_t plain_ws = attention_cudnn_workspace_bytes(A);
    results_free(&big_fast);
    Results docs_fast;
    llama8b_docs(&big, plain_ms, &docs_fast);
    llama8b_docs_deterministic(&big, &docs_fast, plain_ws);
    results_free(&docs_fast);
    problem_free(&big);
  }

  attention_cudnn_destroy(A);
  CUDA_CHECK(cudaStreamDestroy(stream));
  TEST_END();
}
