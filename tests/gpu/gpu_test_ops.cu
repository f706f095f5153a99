// tests/gpu/gpu_test_ops.cu: the CUDA backend's operations table (model/cuda/ops_cuda.cu and the kernel
// files) against the CPU backend's, op by op from one table of cases (OP_CASES: small odd shapes and
// 8B-like ones), then the backend's own state (the W^T copies, the BF16 shadow), a whole 2-layer
// model run by both backends, then the speed of every memory-bound kernel at N = 8192 tokens (the
// profiler's table, against the copy rate it measures).
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
#include "model/doc_mask.h"
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

// A fresh bound parameter buffer of n floats holding h (the BF16 shadow refreshed).
static float *bind_params(const float *h, size_t n) {
  float *p = dev_f32(h, n);
  G->bind_params(G->ctx, p, n);
  G->params_changed(G->ctx);
  return p;
}

// ---- the op harness: every op of the table on the CPU and the CUDA backend ------------------------
//
// One case is an op, its sizes and a tolerance per output. The case's run function is written once
// against the Ops table: it draws its inputs (BF16-representable values, so both backends get the
// same numbers whatever their activation type), calls the op and emits the outputs as host floats.
// The harness runs it on a CPU instance and twice on the CUDA one, compares each output with the
// CPU's (norm-relative error within the tolerance, or EXACT: bit for bit, an activation against
// bf16 of the CPU's value), and requires the two CUDA runs to agree bit for bit. A new op adds a run
// function and its rows in OP_CASES.

enum { MAX_OUT = 4, MAX_HELD = 24 };
static const double EXACT = -1;

typedef struct {
  char name[24];
  float *v;
  size_t n;
  int act;  // an activation (BF16 on the GPU): EXACT compares it with bf16(cpu)
} OpOut;

typedef struct {
  const Ops *o;
  Rng r;
  OpOut out[MAX_OUT];
  int nout;
  void *dev[MAX_HELD];  // backend buffers, released at the end
  int ndev;
  float *host[MAX_HELD];  // host inputs, freed at the end
  int nhost;
} OpRun;

typedef struct {
  const char *op, *about;
  void (*run)(OpRun *R, const int *d);
  int d[6];             // sizes (meaning per run function)
  double tol[MAX_OUT];  // per emitted output, in emit order
} OpCase;

static void *held(OpRun *R, void *p) {
  if (R->ndev == MAX_HELD) die("op harness: more than %d buffers in one case", MAX_HELD);
  return R->dev[R->ndev++] = p;
}

// n normal values of standard deviation `scale`, rounded to BF16 (host memory, freed with the run).
static float *h_randn(OpRun *R, size_t n, float scale) {
  float *x = (float *)xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) x[i] = bf16r(scale * rng_normal(&R->r));
  if (R->nhost == MAX_HELD) die("op harness: more than %d host arrays in one case", MAX_HELD);
  return R->host[R->nhost++] = x;
}

// Backend buffers of activations (the backend's type), fp32 values, ints; pad elements in front.
static void *act_at(OpRun *R, void *p, size_t i) { return (char *)p + i * R->o->act_bytes; }
static void *in_act(OpRun *R, const float *h, size_t n, size_t pad) {
  const Ops *o = R->o;
  void *d = held(R, o->alloc(o->ctx, (n + pad) * o->act_bytes));
  if (o->act_bytes == 4) {
    o->upload(o->ctx, act_at(R, d, pad), h, n * sizeof(float));
  } else {
    bf16 *t = (bf16 *)xmalloc(n * sizeof(bf16));
    for (size_t i = 0; i < n; i++) t[i] = __float2bfloat16(h[i]);
    o->upload(o->ctx, act_at(R, d, pad), t, n * sizeof(bf16));
    free(t);
  }
  return act_at(R, d, pad);
}
static void *new_act(OpRun *R, size_t n, size_t pad) {
  void *d = held(R, R->o->alloc(R->o->ctx, (n + pad) * R->o->act_bytes));
  R->o->zero(R->o->ctx, d, (n + pad) * R->o->act_bytes);
  return act_at(R, d, pad);
}
static float *in_f32(OpRun *R, const float *h, size_t n) {
  float *d = (float *)held(R, R->o->alloc(R->o->ctx, n * sizeof(float)));
  R->o->upload(R->o->ctx, d, h, n * sizeof(float));
  return d;
}
static int *in_int(OpRun *R, const int *h, size_t n) {
  int *d = (int *)held(R, R->o->alloc(R->o->ctx, n * sizeof(int)));
  R->o->upload(R->o->ctx, d, h, n * sizeof(int));
  return d;
}
// The bound parameter buffer holding h (the CUDA backend's GEMMs read its BF16 shadow).
static float *in_params(OpRun *R, const float *h, size_t n) {
  float *d = in_f32(R, h, n);
  R->o->bind_params(R->o->ctx, d, n);
  R->o->params_changed(R->o->ctx);
  return d;
}

static OpOut *emit_slot(OpRun *R, const char *name, size_t n, int act) {
  if (R->nout == MAX_OUT) die("op harness: more than %d outputs", MAX_OUT);
  OpOut *e = &R->out[R->nout++];
  snprintf(e->name, sizeof e->name, "%s", name);
  e->v = (float *)xmalloc((n ? n : 1) * sizeof(float)), e->n = n, e->act = act;
  return e;
}
static void emit_act(OpRun *R, const char *name, const void *d, size_t n) {
  R->o->acts_to_f32(R->o->ctx, emit_slot(R, name, n, 1)->v, d, n);
}
// fp32 output; minus (host, or NULL): what the op added to it (for accumulated outputs).
static void emit_f32(OpRun *R, const char *name, const float *d, size_t n, const float *minus) {
  OpOut *e = emit_slot(R, name, n, 0);
  R->o->download(R->o->ctx, e->v, d, n * sizeof(float));
  if (minus)
    for (size_t i = 0; i < n; i++) e->v[i] -= minus[i];
}
static void emit_host(OpRun *R, const char *name, const float *h, size_t n) {
  memcpy(emit_slot(R, name, n, 0)->v, h, n * sizeof(float));
}

// ---- the run functions: one per op ----

// d: N, D, V, distinct ids, table in the bound parameter buffer
static void run_embed_fwd(OpRun *R, const int *d) {
  const int N = d[0], D = d[1], V = d[2], distinct = d[3];
  float *table = h_randn(R, (size_t)V * D, 1.0f);
  int *tok = (int *)xmalloc(N * sizeof(int));
  for (int n = 0; n < N; n++) tok[n] = (int)(rng_u64(&R->r) % distinct) * (V / distinct);
  tok[N - 1] = V - 1;
  float *t = d[4] ? in_params(R, table, (size_t)V * D) : in_f32(R, table, (size_t)V * D);
  int *dt = in_int(R, tok, N);
  void *out = new_act(R, (size_t)N * D, 0);
  R->o->embed_fwd(R->o->ctx, out, dt, t, N, D, V);
  emit_act(R, "out", out, (size_t)N * D);
  free(tok);
}

// d: N, D, V, distinct ids
static void run_embed_bwd(OpRun *R, const int *d) {
  const int N = d[0], D = d[1], V = d[2], distinct = d[3];
  float *dout = h_randn(R, (size_t)N * D, 1.0f), *dt0 = h_randn(R, (size_t)V * D, 1.0f);
  int *tok = (int *)xmalloc(N * sizeof(int));
  for (int n = 0; n < N; n++) tok[n] = (int)(rng_u64(&R->r) % distinct) * (V / distinct);
  float *dt = in_f32(R, dt0, (size_t)V * D);
  R->o->embed_bwd(R->o->ctx, dt, in_act(R, dout, (size_t)N * D, 0), in_int(R, tok, N), N, D);
  emit_f32(R, "dtable", dt, (size_t)V * D, NULL);
  free(tok);
}

static float *norm_weight(OpRun *R, int D) {
  float *w = h_randn(R, D, 0.1f);
  for (int i = 0; i < D; i++) w[i] = bf16r(w[i] + 1.0f);
  return w;
}

// d: N, D
static void run_rmsnorm_fwd(OpRun *R, const int *d) {
  const int N = d[0], D = d[1];
  const size_t nd = (size_t)N * D;
  float *x = h_randn(R, nd, 1.0f), *w = norm_weight(R, D);
  void *out = new_act(R, nd, 0);
  float *rstd = in_f32(R, x, N);  // overwritten
  R->o->rmsnorm_fwd(R->o->ctx, out, rstd, in_act(R, x, nd, 0), in_f32(R, w, D), N, D, 1e-5f);
  emit_act(R, "out", out, nd);
  emit_f32(R, "rstd", rstd, N, NULL);
}

// d: N, D, gradient overwrite. dx accumulates onto random values; dw onto random values (or is
// written, in overwrite mode).
static void run_rmsnorm_bwd(OpRun *R, const int *d) {
  const int N = d[0], D = d[1];
  const size_t nd = (size_t)N * D;
  float *x = h_randn(R, nd, 1.0f), *w = norm_weight(R, D), *dout = h_randn(R, nd, 1.0f), *dx0 = h_randn(R, nd, 1.0f);
  float *dw0 = h_randn(R, D, 1.0f), *out = h_randn(R, nd, 1.0f), *rstd = h_randn(R, N, 1.0f);
  rmsnorm_forward(out, rstd, x, w, N, D, 1e-5f);  // the same rstd for both backends
  void *dx = in_act(R, dx0, nd, 0);
  float *dw = in_f32(R, dw0, D);
  R->o->set_grad_overwrite(R->o->ctx, d[2]);
  R->o->rmsnorm_bwd(R->o->ctx, dx, dw, in_act(R, dout, nd, 0), in_act(R, x, nd, 0), in_f32(R, w, D), in_f32(R, rstd, N),
                    N, D);
  R->o->set_grad_overwrite(R->o->ctx, 0);
  emit_act(R, "dx (+=)", dx, nd);
  emit_f32(R, d[2] ? "dw (overwrite)" : "dw increment", dw, D, d[2] ? NULL : dw0);
}

// Host tokens [B*T] of a micro-batch of documents: BOS (id 1) with probability 1/6, else 0. Fills
// start and cu (and pos) as model/llama.c would, returns the documents' count and pairs in *m
// (its start and cu still host pointers).
static void some_documents(OpRun *R, int B, int T, int *start, int *pos, int *cu, DocMask *m) {
  int *tokens = (int *)xmalloc((size_t)B * T * sizeof(int));
  for (int n = 0; n < B * T; n++) tokens[n] = rng_u64(&R->r) % 6 == 0;
  m->n_docs = doc_mask_build(tokens, B, T, 1, start, pos, cu, &m->pairs);
  m->start = start, m->cu = cu;
  free(tokens);
}

// d: B, T, heads, hd, direction (1 forward, -1 backward), positions (0: the row's, 1: restarting at
// each document)
static void run_rope(OpRun *R, const int *d) {
  const int B = d[0], T = d[1], heads = d[2], hd = d[3];
  LlamaConfig c;
  memset(&c, 0, sizeof c);
  c.rope_theta = 500000.0f, c.rope_scaling = 1, c.rope_factor = 8, c.rope_low_freq_factor = 1;
  c.rope_high_freq_factor = 4, c.rope_original_max_pos = 32;
  const size_t half = hd / 2, n = (size_t)B * T * heads * hd;
  float *cs = h_randn(R, T * half, 1.0f), *sn = h_randn(R, T * half, 1.0f), *x = h_randn(R, n, 1.0f);
  rope_tables(cs, sn, T, hd, &c);
  void *dx = in_act(R, x, n, 0);
  const int *pos = NULL;
  if (d[5]) {
    int *start = (int *)xmalloc((size_t)B * T * sizeof(int)), *p = (int *)xmalloc((size_t)B * T * sizeof(int));
    int *cu = (int *)xmalloc(((size_t)B * T + 1) * sizeof(int));
    DocMask m;
    some_documents(R, B, T, start, p, cu, &m);
    pos = in_int(R, p, (size_t)B * T);
    free(start), free(p), free(cu);
  }
  if (d[4] > 0) R->o->rope_fwd(R->o->ctx, dx, in_f32(R, cs, T * half), in_f32(R, sn, T * half), pos, B, T, heads, hd);
  else R->o->rope_bwd(R->o->ctx, dx, in_f32(R, cs, T * half), in_f32(R, sn, T * half), pos, B, T, heads, hd);
  emit_act(R, "x", dx, n);
}

// d: n, misalignment (elements past an aligned allocation: 1 takes the element-wise path)
static void run_swiglu_fwd(OpRun *R, const int *d) {
  const size_t n = d[0], pad = d[1];
  float *g = h_randn(R, n, 2.0f), *u = h_randn(R, n, 1.0f);
  void *out = new_act(R, n, pad);
  R->o->swiglu_fwd(R->o->ctx, out, in_act(R, g, n, pad), in_act(R, u, n, pad), n);
  emit_act(R, "out", out, n);
}

static void run_swiglu_bwd(OpRun *R, const int *d) {
  const size_t n = d[0], pad = d[1];
  float *g = h_randn(R, n, 2.0f), *u = h_randn(R, n, 1.0f), *dout = h_randn(R, n, 1.0f);
  void *dg = new_act(R, n, pad), *du = new_act(R, n, pad);
  R->o->swiglu_bwd(R->o->ctx, dg, du, in_act(R, dout, n, pad), in_act(R, g, n, pad), in_act(R, u, n, pad), n);
  emit_act(R, "dgate", dg, n);
  emit_act(R, "dup", du, n);
}

// d: n. out aliases a, as the graph may do.
static void run_residual(OpRun *R, const int *d) {
  const size_t n = d[0];
  float *a = h_randn(R, n, 1.0f), *b = h_randn(R, n, 1.0f);
  void *da = in_act(R, a, n, 0);
  R->o->residual_fwd(R->o->ctx, da, da, in_act(R, b, n, 0), n);
  emit_act(R, "out = a + b", da, n);
}

// d: N, in, out (weight in the bound parameter buffer, as the model's)
static void run_matmul_fwd(OpRun *R, const int *d) {
  const int N = d[0], in = d[1], out = d[2];
  float *x = h_randn(R, (size_t)N * in, 1.0f), *w = h_randn(R, (size_t)out * in, 0.05f);
  float *dw = in_params(R, w, (size_t)out * in);
  void *y = new_act(R, (size_t)N * out, 0);
  R->o->matmul_fwd(R->o->ctx, (LinearId){0, LIN_UP}, y, in_act(R, x, (size_t)N * in, 0), dw, N, in, out);
  emit_act(R, "y", y, (size_t)N * out);
}

// d: N, in, out, mode: 0 dx += and dW +=, 1 dx = with dW NULL, 2 dW = (gradient overwrite)
static void run_matmul_bwd(OpRun *R, const int *d) {
  const int N = d[0], in = d[1], out = d[2], mode = d[3];
  float *x = h_randn(R, (size_t)N * in, 1.0f), *w = h_randn(R, (size_t)out * in, 0.05f);
  float *dy = h_randn(R, (size_t)N * out, 1.0f), *dx0 = h_randn(R, (size_t)N * in, 1.0f);
  float *dw0 = h_randn(R, (size_t)out * in, 1.0f);
  float *pw = in_params(R, w, (size_t)out * in), *dw = in_f32(R, dw0, (size_t)out * in);
  void *dx = in_act(R, dx0, (size_t)N * in, 0);
  R->o->set_grad_overwrite(R->o->ctx, mode == 2);
  R->o->matmul_bwd(R->o->ctx, (LinearId){0, LIN_UP}, dx, mode == 1 ? NULL : dw, in_act(R, dy, (size_t)N * out, 0),
                   in_act(R, x, (size_t)N * in, 0), pw, N, in, out, mode == 0);
  R->o->set_grad_overwrite(R->o->ctx, 0);
  emit_act(R, mode == 0 ? "dx (+=)" : "dx", dx, (size_t)N * in);
  if (mode != 1) emit_f32(R, mode == 2 ? "dW (overwrite)" : "dW increment", dw, (size_t)out * in, mode ? NULL : dw0);
}

// The CUDA head's own chunk (it ignores the graph's): 0 automatic.
static void head_chunk(OpRun *R, int tokens) {
  if (!R->o->host_memory) cuda_head_ce_set_chunk(cuda_backend_of(R->o), tokens);
}

// d: N, D, V, ignored targets (all of them when -1), CUDA chunk, mode: 0 loss + dx + dW +=, 1 loss
// only, 2 dW = (gradient overwrite)
static void run_head_ce(OpRun *R, const int *d) {
  const int N = d[0], D = d[1], V = d[2], n_ign = d[3], mode = d[5], ignore = -100;
  float *x = h_randn(R, (size_t)N * D, 1.0f), *w = h_randn(R, (size_t)V * D, 1.0f / sqrtf((float)D));
  float *dw0 = h_randn(R, (size_t)V * D, 0.01f);
  int *tg = (int *)xmalloc(N * sizeof(int));
  for (int n = 0; n < N; n++) tg[n] = n_ign < 0 ? ignore : (int)(rng_u64(&R->r) % V);
  for (int k = 0; k < n_ign; k++) tg[(k * 7 + 3) % N] = ignore;
  float *pw = in_params(R, w, (size_t)V * D), *dw = in_f32(R, dw0, (size_t)V * D);
  void *dx = new_act(R, (size_t)N * D, 0);
  float *scratch = (float *)xmalloc((size_t)N * V * sizeof(float));
  head_chunk(R, d[4]);
  R->o->set_grad_overwrite(R->o->ctx, mode == 2);
  float loss = R->o->head_ce(R->o->ctx, mode == 1 ? NULL : dx, mode == 1 ? NULL : dw, scratch,
                             in_act(R, x, (size_t)N * D, 0), pw, in_int(R, tg, N), N, D, V, N, ignore, 0.5f);
  R->o->set_grad_overwrite(R->o->ctx, 0);
  head_chunk(R, 0);
  emit_host(R, "loss", &loss, 1);
  if (mode != 1) {
    emit_act(R, "dx", dx, (size_t)N * D);
    emit_f32(R, mode == 2 ? "dW (overwrite)" : "dW increment", dw, (size_t)V * D, mode ? NULL : dw0);
  }
  free(tg), free(scratch);
}

// d: N, D, V, asked rows. The losses of rows asked in a scattered order, some twice (host memory).
static void run_head_nll(OpRun *R, const int *d) {
  const int N = d[0], D = d[1], V = d[2], n = d[3];
  float *x = h_randn(R, (size_t)N * D, 1.0f), *w = h_randn(R, (size_t)V * D, 1.0f / sqrtf((float)D));
  int *rows = (int *)xmalloc(n * sizeof(int)), *tg = (int *)xmalloc(n * sizeof(int));
  for (int i = 0; i < n; i++) rows[i] = (i * 7 + 3) % N, tg[i] = (int)(rng_u64(&R->r) % V);
  float *nll = (float *)xmalloc(n * sizeof(float)), *scratch = (float *)xmalloc((size_t)N * V * sizeof(float));
  R->o->head_nll(R->o->ctx, nll, scratch, in_act(R, x, (size_t)N * D, 0), in_params(R, w, (size_t)V * D), rows, tg, n,
                 D, V, N);
  emit_host(R, "nll", nll, n);
  free(rows), free(tg), free(nll), free(scratch);
}

// d: B, T, H, KV, hd
static void run_attention_fwd(OpRun *R, const int *d) {
  const int B = d[0], T = d[1], H = d[2], KV = d[3], hd = d[4];
  const size_t nq = (size_t)B * T * H * hd, nkv = (size_t)B * T * KV * hd;
  float *q = h_randn(R, nq, 1.0f), *k = h_randn(R, nkv, 1.0f), *v = h_randn(R, nkv, 1.0f);
  void *out = new_act(R, nq, 0);
  float *lse = (float *)held(R, R->o->alloc(R->o->ctx, (size_t)B * H * T * sizeof(float)));
  R->o->attention_fwd(R->o->ctx, out, lse, in_act(R, q, nq, 0), in_act(R, k, nkv, 0), in_act(R, v, nkv, 0), NULL, B, T,
                      H, KV, hd);
  emit_act(R, "out", out, nq);
  emit_f32(R, "lse", lse, (size_t)B * H * T, NULL);
}

// d: B, T, H, KV, hd. The forward's out and lse from the CPU reference, so both backends get them.
static void run_attention_bwd(OpRun *R, const int *d) {
  const int B = d[0], T = d[1], H = d[2], KV = d[3], hd = d[4];
  const size_t nq = (size_t)B * T * H * hd, nkv = (size_t)B * T * KV * hd, nl = (size_t)B * H * T;
  float *q = h_randn(R, nq, 1.0f), *k = h_randn(R, nkv, 1.0f), *v = h_randn(R, nkv, 1.0f);
  float *dout = h_randn(R, nq, 1.0f), *o = h_randn(R, nq, 1.0f), *lse = h_randn(R, nl, 1.0f);
  attention_forward(o, lse, q, k, v, NULL, B, T, H, KV, hd);
  for (size_t i = 0; i < nq; i++) o[i] = bf16r(o[i]);  // what a BF16 forward hands the backward
  void *dq = new_act(R, nq, 0), *dk = new_act(R, nkv, 0), *dv = new_act(R, nkv, 0);
  R->o->attention_bwd(R->o->ctx, dq, dk, dv, in_act(R, dout, nq, 0), in_act(R, q, nq, 0), in_act(R, k, nkv, 0),
                      in_act(R, v, nkv, 0), in_act(R, o, nq, 0), in_f32(R, lse, nl), NULL, B, T, H, KV, hd);
  emit_act(R, "dq", dq, nq);
  emit_act(R, "dk", dk, nkv);
  emit_act(R, "dv", dv, nkv);
}

// d: B, T, H, KV, hd. Block-causal attention (documents from some_documents), forward then backward
// on the backend's own forward: lse is each backend's own layout, so it is passed on, not compared.
static void run_attention_docs(OpRun *R, const int *d) {
  const int B = d[0], T = d[1], H = d[2], KV = d[3], hd = d[4];
  const size_t nq = (size_t)B * T * H * hd, nkv = (size_t)B * T * KV * hd, nl = (size_t)B * H * T;
  int *start = (int *)xmalloc((size_t)B * T * sizeof(int)), *cu = (int *)xmalloc(((size_t)B * T + 1) * sizeof(int));
  DocMask m = {};  // cu_h NULL: the host cu is freed below
  some_documents(R, B, T, start, NULL, cu, &m);
  m.start = in_int(R, start, (size_t)B * T), m.cu = in_int(R, cu, (size_t)m.n_docs + 1);
  free(start), free(cu);
  float *q = h_randn(R, nq, 1.0f), *k = h_randn(R, nkv, 1.0f), *v = h_randn(R, nkv, 1.0f), *dout = h_randn(R, nq, 1.0f);
  void *q_ = in_act(R, q, nq, 0), *k_ = in_act(R, k, nkv, 0), *v_ = in_act(R, v, nkv, 0);
  void *out = new_act(R, nq, 0);
  float *lse = (float *)held(R, R->o->alloc(R->o->ctx, nl * sizeof(float)));
  R->o->attention_fwd(R->o->ctx, out, lse, q_, k_, v_, &m, B, T, H, KV, hd);
  emit_act(R, "out", out, nq);
  void *dq = new_act(R, nq, 0), *dk = new_act(R, nkv, 0), *dv = new_act(R, nkv, 0);
  R->o->attention_bwd(R->o->ctx, dq, dk, dv, in_act(R, dout, nq, 0), q_, k_, v_, out, lse, &m, B, T, H, KV, hd);
  emit_act(R, "dq", dq, nq);
  emit_act(R, "dk", dk, nkv);
  emit_act(R, "dv", dv, nkv);
}

// d: n, offset into a bound buffer, steps. Three AdamW steps on parameters of the bound buffer.
static void run_adamw(OpRun *R, const int *d) {
  const size_t n = d[0], at = d[1], total = n + at + 5;
  float *p0 = h_randn(R, total, 1.0f), *m0 = h_randn(R, n, 0.01f), *v0 = h_randn(R, n, 0.01f);
  for (size_t i = 0; i < n; i++) v0[i] *= v0[i];  // second moments are >= 0
  float *p = in_params(R, p0, total), *m = in_f32(R, m0, n), *v = in_f32(R, v0, n);
  for (int t = 1; t <= d[2]; t++) {
    float *g = in_f32(R, h_randn(R, n, 0.1f), n);
    R->o->adamw(R->o->ctx, p + at, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
  }
  emit_f32(R, "p (whole buffer)", p, total, NULL);
  emit_f32(R, "m", m, n, NULL);
  emit_f32(R, "v", v, n, NULL);
}

// d: n, offset. The sum of squares (a host double, compared as a float).
static void run_grad_sumsq(OpRun *R, const int *d) {
  const size_t n = d[0], at = d[1];
  float *g = in_f32(R, h_randn(R, n + at, 1e-3f), n + at);
  float s = (float)R->o->grad_sumsq(R->o->ctx, g + at, n);
  emit_host(R, "sum of squares", &s, 1);
}

static const OpCase OP_CASES[] = {
    {"embed_fwd", "table row, odd sizes", run_embed_fwd, {13, 20, 50, 5, 0}, {EXACT}},
    {"embed_fwd", "from the parameters' shadow", run_embed_fwd, {256, 4096, 1000, 20, 1}, {EXACT}},
    {"embed_bwd", "position-ordered adds", run_embed_bwd, {13, 20, 50, 5}, {EXACT}},
    {"embed_bwd", "many repeats", run_embed_bwd, {256, 4096, 1000, 20}, {EXACT}},
    {"rmsnorm_fwd", "", run_rmsnorm_fwd, {5, 64}, {TOL_BF16, 1e-5}},
    {"rmsnorm_fwd", "", run_rmsnorm_fwd, {37, 1032}, {TOL_BF16, 1e-5}},
    {"rmsnorm_fwd", "", run_rmsnorm_fwd, {256, 4096}, {TOL_BF16, 1e-5}},
    {"rmsnorm_bwd", "", run_rmsnorm_bwd, {5, 64, 0}, {TOL_BF16, 1e-4}},
    {"rmsnorm_bwd", "", run_rmsnorm_bwd, {37, 1032, 0}, {TOL_BF16, 1e-4}},
    {"rmsnorm_bwd", "dw overwrite", run_rmsnorm_bwd, {256, 4096, 1}, {TOL_BF16, 1e-4}},
    {"rope_fwd", "hd 12", run_rope, {2, 16, 3, 12, 1}, {TOL_BF16}},
    {"rope_fwd", "", run_rope, {2, 64, 32, 128, 1}, {TOL_BF16}},
    {"rope_bwd", "hd 12", run_rope, {2, 16, 3, 12, -1}, {TOL_BF16}},
    {"rope_bwd", "", run_rope, {1, 64, 8, 128, -1}, {TOL_BF16}},
    {"rope_fwd", "positions restart at documents", run_rope, {2, 64, 8, 128, 1, 1}, {TOL_BF16}},
    {"rope_bwd", "positions restart at documents", run_rope, {2, 64, 8, 128, -1, 1}, {TOL_BF16}},
    {"swiglu_fwd", "", run_swiglu_fwd, {1001, 0}, {TOL_BF16}},
    {"swiglu_fwd", "misaligned", run_swiglu_fwd, {999, 1}, {TOL_BF16}},
    {"swiglu_fwd", "", run_swiglu_fwd, {256 * 14336, 0}, {TOL_BF16}},
    {"swiglu_bwd", "", run_swiglu_bwd, {1001, 0}, {TOL_BF16, TOL_BF16}},
    {"swiglu_bwd", "misaligned", run_swiglu_bwd, {999, 1}, {TOL_BF16, TOL_BF16}},
    {"swiglu_bwd", "", run_swiglu_bwd, {256 * 14336, 0}, {TOL_BF16, TOL_BF16}},
    {"residual_fwd", "out aliases a", run_residual, {1003}, {EXACT}},
    {"residual_fwd", "out aliases a", run_residual, {256 * 4096}, {EXACT}},
    {"matmul_fwd", "BF16 linear", run_matmul_fwd, {64, 256, 136}, {TOL_BF16}},
    {"matmul_bwd", "dx +=, dW +=", run_matmul_bwd, {64, 256, 136, 0}, {TOL_BF16, 1e-4}},
    {"matmul_bwd", "dx =, no dW", run_matmul_bwd, {64, 256, 136, 1}, {TOL_BF16}},
    {"matmul_bwd", "dW overwrite", run_matmul_bwd, {64, 256, 136, 2}, {TOL_BF16, 1e-4}},
    {"head_ce", "5 ignored", run_head_ce, {40, 64, 1000, 5, 0, 0}, {1e-4, TOL_BF16_TWICE, TOL_BF16_TWICE}},
    {"head_ce", "chunks of 24", run_head_ce, {64, 64, 1000, 0, 24, 0}, {1e-4, TOL_BF16_TWICE, TOL_BF16_TWICE}},
    {"head_ce", "", run_head_ce, {256, 4096, 1000, 10, 0, 0}, {1e-4, TOL_BF16_TWICE, TOL_BF16_TWICE}},
    {"head_ce", "loss only", run_head_ce, {40, 64, 1000, 5, 0, 1}, {1e-4}},
    {"head_ce", "dW overwrite", run_head_ce, {64, 64, 1000, 3, 0, 2}, {1e-4, TOL_BF16_TWICE, TOL_BF16_TWICE}},
    {"head_ce", "all targets ignored", run_head_ce, {40, 64, 1000, -1, 0, 0}, {EXACT, EXACT, EXACT}},
    {"head_nll", "", run_head_nll, {40, 64, 1000, 53}, {2e-4}},
    {"attention_fwd", "GQA", run_attention_fwd, {2, 128, 8, 2, 64}, {1e-2, 1e-3}},
    {"attention_fwd", "T not a multiple of 64", run_attention_fwd, {1, 200, 4, 1, 128}, {1e-2, 1e-3}},
    {"attention_bwd", "GQA", run_attention_bwd, {2, 128, 8, 2, 64}, {2e-2, 2e-2, 2e-2}},
    {"attention_fwd+bwd", "documents", run_attention_docs, {2, 200, 8, 2, 64}, {1e-2, 2e-2, 2e-2, 2e-2}},
    {"adamw", "3 steps, 1M + 3", run_adamw, {(1 << 20) | 3, 4, 3}, {1e-6, 1e-6, 1e-6}},
    {"adamw", "3 steps, odd offset", run_adamw, {1001, 1, 3}, {1e-6, 1e-6, 1e-6}},
    {"grad_sumsq", "", run_grad_sumsq, {10000005, 0}, {1e-5}},
    {"grad_sumsq", "odd offset", run_grad_sumsq, {1000, 1}, {1e-5}},
};

static void run_close(OpRun *R) {
  for (int i = 0; i < R->ndev; i++) R->o->release(R->o->ctx, R->dev[i]);
  for (int i = 0; i < R->nhost; i++) free(R->host[i]);
  for (int i = 0; i < R->nout; i++) free(R->out[i].v);
}

static void run_on(OpRun *R, const Ops *o, const OpCase *c, uint64_t seed) {
  memset(R, 0, sizeof *R);
  R->o = o;
  rng_seed(&R->r, seed);
  c->run(R, c->d);
  o->sync(o->ctx);
}

static void test_op_cases(const Ops *cpu) {
  const int ncases = (int)(sizeof OP_CASES / sizeof *OP_CASES);
  for (int i = 0; i < ncases; i++) {
    const OpCase *c = &OP_CASES[i];
    OpRun a, b, b2;
    run_on(&a, cpu, c, 1000 + i);
    run_on(&b, G, c, 1000 + i);
    run_on(&b2, G, c, 1000 + i);
    CHECK(a.nout == b.nout && b.nout == b2.nout, "%s: the backends emitted %d and %d outputs", c->op, a.nout, b.nout);
    for (int k = 0; k < a.nout && k < b.nout; k++) {
      const OpOut *ref = &a.out[k], *got = &b.out[k];
      char what[96];
      snprintf(what, sizeof what, "%s %s%s%s: %s", c->op, c->about, *c->about ? ", " : "", "cuda vs cpu", ref->name);
      if (c->tol[k] == EXACT) {
        float *want = (float *)xmalloc((ref->n ? ref->n : 1) * sizeof(float));
        for (size_t j = 0; j < ref->n; j++) want[j] = ref->act ? bf16r(ref->v[j]) : ref->v[j];
        check_exact(what, got->v, want, ref->n);
        free(want);
      } else {
        check_rel(what, got->v, ref->v, ref->n, c->tol[k]);
      }
      CHECK(got->n == b2.out[k].n && !memcmp(got->v, b2.out[k].v, got->n * sizeof(float)),
            "%s %s: two CUDA runs differ (not deterministic)", c->op, ref->name);
    }
    run_close(&a), run_close(&b), run_close(&b2);
  }
  printf("  %d cases, each on the CPU and twice on CUDA\n", ncases);
}

// ---- dgrad through the transposed weight copies --------------------------------------------------

// Elements where the W^T copy of w [rows, cols] differs from the transpose of its BF16 shadow.
static size_t transposed_mismatches(const float *w, int rows, int cols) {
  const size_t n = (size_t)rows * cols;
  bf16 *s = (bf16 *)xmalloc(n * sizeof(bf16)), *t = (bf16 *)xmalloc(n * sizeof(bf16));
  G->download(G->ctx, s, cuda_param_bf16(CB, w), n * sizeof(bf16));
  G->download(G->ctx, t, cuda_param_bf16_transposed(CB, w, cols, rows), n * sizeof(bf16));
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
  void *d_dx1 = G->alloc(G->ctx, (size_t)N * in * sizeof(bf16)),
       *d_dx2 = G->alloc(G->ctx, (size_t)N * out_dim * sizeof(bf16));
  void *d_ref = G->alloc(G->ctx, (size_t)N * (in > out_dim ? in : out_dim) * sizeof(bf16));

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
  gemm_bf16(d_ref, 0, d_dy1, 0, cuda_param_bf16(CB, w1), 0, N, in, out_dim, 1.0f, 0.0f);  // the direct NN path
  float *nn1 = host_bf16(d_ref, (size_t)N * in);
  snprintf(what, sizeof what, "dgrad N=%d in=%d out=%d: TN on W^T vs NN on W", N, in, out_dim);
  check_rel(what, dx1, nn1, (size_t)N * in, TOL_BF16);
  snprintf(what, sizeof what, "dgrad N=%d in=%d out=%d: TN on W^T vs cpu", N, in, out_dim);
  check_rel(what, dx1, ref1, (size_t)N * in, TOL_BF16);
  snprintf(what, sizeof what, "dgrad N=%d in=%d out=%d: 2nd weight, TN vs cpu", N, out_dim, in);
  check_rel(what, dx2, ref2, (size_t)N * out_dim, TOL_BF16);

  // Laziness: zero w1's shadow behind the backend's back; without a version bump the dgrad must
  // still use the copy made above, bit for bit. params_changed then restores the shadow.
  CUDA_CHECK(cudaMemsetAsync((void *)cuda_param_bf16(CB, w1), 0, nw * sizeof(bf16), cuda_stream()));
  float *again = dgrad(w1, d_dy1, d_dx1, N, in, out_dim);
  CHECK(!memcmp(again, dx1, (size_t)N * in * sizeof(float)),
        "dgrad re-transposed W without a weights change (the copy should be made once per version)");
  G->params_changed(G->ctx);
  free(again);

  // adamw (large lr, every weight moves by ~lr = 40% of its scale): the next dgrad must see it.
  float *d_m = (float *)G->alloc(G->ctx, total * sizeof(float)),
        *d_v = (float *)G->alloc(G->ctx, total * sizeof(float));
  G->zero(G->ctx, d_m, total * sizeof(float));
  G->zero(G->ctx, d_v, total * sizeof(float));
  float *g = randn(total, 1.0f, 0), *d_g = dev_f32(g, total);
  G->adamw(G->ctx, d_p, d_g, d_m, d_v, total, 2e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1);
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
  G->upload(G->ctx, d_p, p0, total * sizeof(float));
  G->params_changed(G->ctx);
  dgrad_refs(ref1, ref2, wr, p0, total, off2, dy1, dy2, N, in, out_dim);
  float *cx1 = dgrad(w1, d_dy1, d_dx1, N, in, out_dim);
  check_rel("dgrad after upload + params_changed", cx1, ref1, (size_t)N * in, TOL_BF16);

  // Turned off: the copies are freed and the dgrad is the direct NN GEMM (the same plan as above,
  // so the same bits).
  size_t held = cuda_mem_used(CB);
  cuda_set_dgrad_transposed(CB, 0);
  size_t freed = held - cuda_mem_used(CB);
  CHECK(freed == 2 * nw * sizeof(bf16), "cuda_set_dgrad_transposed(CB, 0) freed %zu bytes, want %zu (two W^T copies)",
        freed, 2 * nw * sizeof(bf16));
  float *off1 = dgrad(w1, d_dy1, d_dx1, N, in, out_dim);
  CHECK(!memcmp(off1, nn1, (size_t)N * in * sizeof(float)), "dgrad with the copies off differs from the NN GEMM");
  CHECK(cuda_mem_used(CB) == held - freed, "dgrad with the copies off allocated memory");
  cuda_set_dgrad_transposed(CB, 1);

  G->release(G->ctx, d_p);  // frees the shadow and the copies
  void *bufs[] = {d_dy1, d_dy2, d_dx1, d_dx2, d_ref, d_m, d_v, d_g};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) G->release(G->ctx, bufs[i]);
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
  float *p = copy_of(p0 + at, n), *d_g = (float *)G->alloc(G->ctx, n * sizeof(float));
  for (int t = 1; t <= 3; t++) {
    float *g = randn(n, 0.1f, 0);
    G->upload(G->ctx, d_g, g, n * sizeof(float));
    adamw_update(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
    G->adamw(G->ctx, d_p + at, d_g, d_m, d_v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
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
  G->download(G->ctx, sh, cuda_param_bf16(CB, d_p), total * sizeof(bf16));
  size_t bad = 0;
  for (size_t i = 0; i < total; i++) {
    float want = bf16r(i >= at && i < at + n ? pg[i] : p0[i]);
    bad += __bfloat162float(sh[i]) != want;
  }
  printf("  adamw: BF16 shadow = bf16(p) at %zu of %zu elements\n", total - bad, total);
  CHECK(bad == 0, "adamw n=%zu: %zu shadow elements differ from bf16(p)", n, bad);
  G->release(G->ctx, d_p), G->release(G->ctx, d_m), G->release(G->ctx, d_v), G->release(G->ctx, d_g);
  free(p0), free(m), free(v), free(p), free(pg), free(mg), free(vg), free(sh);
}

static void test_params_changed(size_t n) {
  float *p = randn(n, 1.0f, 0);
  float *d_p = bind_params(p, n);
  bf16 *sh = (bf16 *)xmalloc(n * sizeof(bf16));
  G->download(G->ctx, sh, cuda_param_bf16(CB, d_p), n * sizeof(bf16));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += __bfloat162float(sh[i]) != bf16r(p[i]);
  printf("  params_changed n=%zu: %zu shadow elements differ from bf16(p)\n", n, bad);
  CHECK(bad == 0, "params_changed: %zu of %zu shadow elements differ", bad, n);
  G->release(G->ctx, d_p);
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
  Llama *mc = llama_create(&c, B, T, cpu_backend_open()), *mg = llama_create(&c, B, T, G);
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
    float u = scale * ((float)cuda_hash24(i, seed) * (2.0f / 16777216.0f) - 1.0f);  // uniform [-scale, scale)
    if (f) f[i] = u;
    if (h) h[i] = __float2bfloat16(u);
  }
}

static void *filled(size_t n, int bf16_elems, uint32_t seed, float scale) {
  void *p = G->alloc(G->ctx, n * (bf16_elems ? 2 : 4));
  fill_kernel<<<1024, 256, 0, cuda_stream()>>>(bf16_elems ? NULL : (float *)p, bf16_elems ? (bf16 *)p : NULL, n, seed,
                                               scale);
  CUDA_CHECK_LAUNCH();
  return p;
}

// Every memory-bound op at Llama-3 8B shapes (N = 8192 tokens, D = 4096, F = 14336, 32/8 heads of
// 128, V = 128256 for the head), once to warm up, then `reps` profiled calls; the profiler's table
// shows TB/s against the measured copy rate (and the GEMMs of the head and of the "down" dgrad, on W^T and on W,
// against their measured ceilings).
static void speed(void) {
  const int N = 8192, D = 4096, F = 14336, H = 32, hd = 128, V = 128256, reps = 10;
  const size_t nd = (size_t)N * D, nf = (size_t)N * F, np = (size_t)V * D;
  // parameters: the head [V, D] (also the embedding table here), then one norm weight
  float *params = (float *)filled(np + D, 0, 1, 0.02f), *grads = (float *)filled(np + D, 0, 2, 1e-3f);
  G->bind_params(G->ctx, params, np + D);
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
      G->sync(G->ctx);
      cuda_profile_reset(CB);
      cuda_profile_enable(CB, 1);
    }
    for (int r = 0; r < (pass ? reps : 1); r++) {
      G->residual_fwd(G->ctx, z, x, y, nd);
      G->swiglu_fwd(G->ctx, o, g, u, nf);
      G->swiglu_bwd(G->ctx, o, o2, g, u, g, nf);
      G->rmsnorm_fwd(G->ctx, z, rstd, x, wn, N, D, 1e-5f);
      G->rmsnorm_bwd(G->ctx, z, grads + np, y, x, wn, rstd, N, D);
      G->rope_fwd(G->ctx, q, cs, sn, NULL, 1, N, H, hd);
      G->rope_bwd(G->ctx, q, cs, sn, NULL, 1, N, H, hd);
      G->embed_fwd(G->ctx, z, d_tok, params, N, D, V);
      G->embed_bwd(G->ctx, grads, x, d_tok, N, D);
      G->adamw(G->ctx, params, grads, m, v, np, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1 + pass);
      G->grad_sumsq(G->ctx, grads, np);
      G->params_changed(G->ctx);
      G->head_ce(G->ctx, z, grads, NULL, x, params, d_tok, N, D, V, 32, -100, 1.0f);
      // a "down" weight [D, F] (the first D*F parameters): adamw made its W^T copy stale, so
      // this transposes it, then runs the dgrad GEMM on the copy
      G->matmul_bwd(G->ctx, down, o, NULL, x, NULL, params, N, F, D, 0);
    }
  }
  // the same dgrad on W directly, for comparison ("gemm dgrad down NN")
  cuda_set_dgrad_transposed(CB, 0);
  cuda_profile_enable(CB, 0);
  G->matmul_bwd(G->ctx, down, o, NULL, x, NULL, params, N, F, D, 0);  // warm-up: its GEMM plan
  cuda_profile_enable(CB, 1);
  for (int r = 0; r < reps; r++) G->matmul_bwd(G->ctx, down, o, NULL, x, NULL, params, N, F, D, 0);
  cuda_set_dgrad_transposed(CB, 1);
  G->sync(G->ctx);
  cuda_profile_enable(CB, 0);
  printf("  per call, %d calls each (N=%d, D=%d, F=%d, q heads %dx%d, V=%d; adamw etc. over %zu floats):\n", reps, N, D,
         F, H, hd, V, np);
  cuda_profile_report(CB, stdout, reps);
  printf("  device memory held by the backend: %.2f GB now, %.2f GB peak\n", cuda_mem_used(CB) / 1e9,
         cuda_mem_peak(CB) / 1e9);
  void *bufs[] = {params, grads, m, v, x, y, z, g, u, o, o2, q, cs, sn, rstd, d_tok};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) G->release(G->ctx, bufs[i]);
  free(tok);
}

int main(void) {
  GPU_OPS_TEST_BEGIN(42);

  TEST_SECTION("every op of the table: CPU and CUDA backends compared case by case (OP_CASES)");
  test_op_cases(cpu_backend_open());
  TEST_SECTION("dgrad through the W^T copies: vs NN and cpu, refreshed by adamw / params_changed only");
  test_dgrad_transposed(64, 520, 136);
  test_dgrad_transposed(256, 4096, 1024);
  TEST_SECTION("the BF16 shadow: kept by adamw, refreshed by params_changed");
  test_adamw((size_t)1 << 20 | 3, 4);
  test_adamw(1001, 1);
  test_params_changed(1003);
  TEST_SECTION("whole model: 2 layers, cuda vs cpu backend");
  test_model();
  TEST_SECTION("speed at N=8192 (profiler table)");
  speed();
  printf("  backend memory after releasing everything: %zu bytes of kernel scratch\n", cuda_mem_used(CB));
  TEST_END();
}
