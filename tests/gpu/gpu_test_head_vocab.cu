// tests/gpu/gpu_test_head_vocab.cu: vocabularies that are not a multiple of 8 on the GPU, through the padded
// head of model/cuda/crossentropy.cu (docs/architecture.md "The output head"):
// - the head ops at V = 2,053 and 50,257 (padded to 2,176 and 50,304) against the CPU backend: head_ce's
//   loss, dx and dW (added, overwritten, in one chunk and in several), head_nll (what the downstream
//   tasks are scored by) and the head's matmul_fwd (llama_logits);
// - the padding counts in nothing: its fp32 logits are 0, the loss is the log-sum-exp over the V real
//   logits computed again in double, and padding rows poisoned so that their logits win every row's
//   argmax change no bit of the loss, dx, dW, the scores or the logits;
// - a 2-layer model with V = 2,053 trains: the CPU and CUDA backends from the same init, 10 AdamW steps
//   side by side (the first step's gradients and logits, every step's loss), the loss falls, the
//   padding rows of the GPU's head stay zero, and the parameters hold V rows of the head.
// Tolerances as tests/gpu/gpu_test_ops.cu's (relative L2 errors; the references get the same BF16
// values as the GPU).
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/llama.h"
#include "model/ops.h"
#include "model/cuda/ops_cuda.h"
#include "tests/test.h"
#include "tests/gpu/gpu_ops_util.h"

static const double TOL_BF16 = 4e-3, TOL_BF16_TWICE = 1e-2;
static const int IGNORE = -100;

static void check_rel(const char *what, const float *got, const float *ref, size_t n, double tol) {
  const double e = rel_err(got, ref, n);
  CHECK(e <= tol, "%s: relative error %.3g > %.3g", what, e, tol);
}

// ---- one run of the head ops on a backend ----------------------------------------------------------

typedef struct {
  int N, D, V, mode, chunk, n_ign;  // mode: 0 loss + dx + dW +=, 1 loss only, 2 dW = (overwrite)
} HeadCase;

typedef struct {
  float loss, *dx, *dw, *nll, *logits;
  int n_nll;
} HeadOut;

// The inputs of a case, BF16 values (x with a positive mean: see test_padding), from one seed.
typedef struct {
  float *x, *w, *dw0;
  int *tg, *rows, *rtg;
} HeadIn;

static HeadIn head_inputs(const HeadCase *c, uint64_t seed) {
  Rng r;
  rng_seed(&r, seed);
  HeadIn in;
  const size_t nx = (size_t)c->N * c->D, nw = (size_t)c->V * c->D;
  in.x = (float *)xmalloc(nx * sizeof(float)), in.w = (float *)xmalloc(nw * sizeof(float));
  in.dw0 = (float *)xmalloc(nw * sizeof(float));
  for (size_t i = 0; i < nx; i++) in.x[i] = bf16r(rng_normal(&r) + 1.0f);
  for (size_t i = 0; i < nw; i++) in.w[i] = bf16r(rng_normal(&r) / sqrtf((float)c->D));
  for (size_t i = 0; i < nw; i++) in.dw0[i] = 0.01f * rng_normal(&r);
  in.tg = (int *)xmalloc(c->N * sizeof(int)), in.rows = (int *)xmalloc(c->N * sizeof(int));
  in.rtg = (int *)xmalloc(c->N * sizeof(int));
  for (int n = 0; n < c->N; n++) in.tg[n] = (int)(rng_u64(&r) % c->V);
  in.tg[0] = c->V - 1;  // the last real id: next to the padding
  for (int k = 0; k < c->n_ign; k++) in.tg[(k * 7 + 3) % c->N] = IGNORE;
  for (int i = 0; i < c->N; i++) in.rows[i] = (i * 7 + 3) % c->N, in.rtg[i] = (int)(rng_u64(&r) % c->V);
  in.rtg[1] = c->V - 1;
  return in;
}
static void free_inputs(HeadIn *in) {
  free(in->x), free(in->w), free(in->dw0), free(in->tg), free(in->rows), free(in->rtg);
}

static void *act_in(const Ops *o, const float *h, size_t n) {
  void *d = o->alloc(o->ctx, n * o->act_bytes);
  if (o->act_bytes == 4) {
    o->upload(o->ctx, d, h, n * sizeof(float));
  } else {
    __nv_bfloat16 *t = (__nv_bfloat16 *)xmalloc(n * sizeof(__nv_bfloat16));
    for (size_t i = 0; i < n; i++) t[i] = __float2bfloat16(h[i]);
    o->upload(o->ctx, d, t, n * sizeof(__nv_bfloat16));
    free(t);
  }
  return d;
}
static void *f32_in(const Ops *o, const void *h, size_t bytes) {
  void *d = o->alloc(o->ctx, bytes);
  o->upload(o->ctx, d, h, bytes);
  return d;
}

// The device buffers of a case on backend o: w bound as the parameters (the CUDA GEMMs read its shadow).
typedef struct {
  void *x, *dx, *logits;
  float *w, *dw;
  int *tg;
} HeadDev;

static HeadDev head_upload(const Ops *o, const HeadCase *c, const HeadIn *in) {
  HeadDev d;
  const size_t nw = (size_t)c->V * c->D;
  d.w = (float *)f32_in(o, in->w, nw * sizeof(float));
  o->bind_params(o->ctx, d.w, nw);
  o->params_changed(o->ctx);
  d.x = act_in(o, in->x, (size_t)c->N * c->D);
  d.dx = o->alloc(o->ctx, (size_t)c->N * c->D * o->act_bytes);
  d.logits = o->alloc(o->ctx, (size_t)c->N * c->V * o->act_bytes);
  d.dw = (float *)f32_in(o, in->dw0, nw * sizeof(float));
  d.tg = (int *)f32_in(o, in->tg, c->N * sizeof(int));
  return d;
}
static void head_release(const Ops *o, HeadDev *d) {
  void *p[] = {d->x, d->dx, d->logits, d->w, d->dw, d->tg};
  for (size_t i = 0; i < sizeof p / sizeof *p; i++) o->release(o->ctx, p[i]);
}

// head_ce (as the case's mode asks), head_nll of every row in a scattered order, and the logits.
static HeadOut head_run(const Ops *o, const HeadCase *c, const HeadIn *in, HeadDev *d) {
  HeadOut out;
  const size_t nx = (size_t)c->N * c->D, nw = (size_t)c->V * c->D;
  float *scratch = (float *)xmalloc((size_t)c->N * c->V * sizeof(float));  // the CPU's chunk: all N tokens
  if (!o->host_memory) cuda_head_ce_set_chunk(cuda_backend_of(o), c->chunk);
  o->set_grad_overwrite(o->ctx, c->mode == 2);
  out.loss = o->head_ce(o->ctx, c->mode == 1 ? NULL : d->dx, c->mode == 1 ? NULL : d->dw, scratch, d->x, d->w, d->tg,
                        c->N, c->D, c->V, c->N, IGNORE, 0.5f);
  o->set_grad_overwrite(o->ctx, 0);
  if (!o->host_memory) cuda_head_ce_set_chunk(cuda_backend_of(o), 0);
  out.dx = (float *)xmalloc(nx * sizeof(float)), out.dw = (float *)xmalloc(nw * sizeof(float));
  o->acts_to_f32(o->ctx, out.dx, d->dx, nx);
  o->download(o->ctx, out.dw, d->dw, nw * sizeof(float));
  out.n_nll = c->N;
  out.nll = (float *)xmalloc(c->N * sizeof(float));
  o->head_nll(o->ctx, out.nll, scratch, d->x, d->w, in->rows, in->rtg, c->N, c->D, c->V, c->N);
  o->matmul_fwd(o->ctx, (LinearId){-1, LIN_HEAD}, d->logits, d->x, d->w, c->N, c->D, c->V);
  out.logits = (float *)xmalloc((size_t)c->N * c->V * sizeof(float));
  o->acts_to_f32(o->ctx, out.logits, d->logits, (size_t)c->N * c->V);
  o->sync(o->ctx);
  free(scratch);
  return out;
}
static void free_out(HeadOut *h) { free(h->dx), free(h->dw), free(h->nll), free(h->logits); }

// ---- the head ops against the CPU --------------------------------------------------------------------

static void test_case(const Ops *cpu, const HeadCase *c, uint64_t seed) {
  HeadIn in = head_inputs(c, seed);
  HeadDev dc = head_upload(cpu, c, &in), dg = head_upload(G, c, &in);
  HeadOut rc = head_run(cpu, c, &in, &dc), rg = head_run(G, c, &in, &dg);
  char what[160];
  const size_t nx = (size_t)c->N * c->D, nw = (size_t)c->V * c->D;
  static const char *modes[3] = {"dW +=", "loss only", "dW ="};
  snprintf(what, sizeof what, "V=%d (padded %d) N=%d D=%d %s chunk %d, %d ignored", c->V, cuda_head_vocab_padded(c->V),
           c->N, c->D, modes[c->mode], c->chunk, c->n_ign);
  CHECK(fabs(rg.loss - rc.loss) <= 1e-4 * fabs(rc.loss), "%s: loss cuda %.7f vs cpu %.7f", what, rg.loss, rc.loss);
  if (c->mode != 1) {
    char w2[200];
    snprintf(w2, sizeof w2, "%s: dx", what);
    check_rel(w2, rg.dx, rc.dx, nx, TOL_BF16_TWICE);
    if (c->mode == 0)  // the increment, as the ops test compares it
      for (size_t i = 0; i < nw; i++) rg.dw[i] -= in.dw0[i], rc.dw[i] -= in.dw0[i];
    snprintf(w2, sizeof w2, "%s: dW", what);
    check_rel(w2, rg.dw, rc.dw, nw, TOL_BF16_TWICE);
  }
  char w3[200];
  snprintf(w3, sizeof w3, "%s: head_nll", what);
  check_rel(w3, rg.nll, rc.nll, c->N, 2e-4);
  snprintf(w3, sizeof w3, "%s: logits (matmul_fwd of the head)", what);
  check_rel(w3, rg.logits, rc.logits, (size_t)c->N * c->V, TOL_BF16);
  printf("  %s: loss cuda %.6f cpu %.6f\n", what, rg.loss, rc.loss);
  free_out(&rc), free_out(&rg);
  head_release(cpu, &dc), head_release(G, &dg);
  free_inputs(&in);
}

// ---- the padding counts in nothing ---------------------------------------------------------------------

// One chunk (N tokens) of V = 2053: the fp32 logits head_ce leaves in its scratch, [N, V_pad].
static float *ce_logits(int N, int Vp) {
  float *h = (float *)xmalloc((size_t)N * Vp * sizeof(float));
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  CUDA_CHECK(cudaMemcpy(h, CB->head.logits.p, (size_t)N * Vp * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

static int same_bits(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

static void test_padding(void) {
  const HeadCase c = {64, 64, 2053, 0, 0, 5};
  const int Vp = cuda_head_vocab_padded(c.V), N = c.N, D = c.D, V = c.V;
  CHECK(Vp == 2176 && cuda_head_vocab_padded(50257) == 50304 && cuda_head_vocab_padded(128256) == 128256 &&
            cuda_head_vocab_padded(512) == 512,
        "padded vocabularies: 2053 -> %d, 50257 -> %d, 128256 and 512 unpadded", Vp, cuda_head_vocab_padded(50257));
  HeadIn in = head_inputs(&c, 77);
  HeadDev d = head_upload(G, &c, &in);
  const float loss = G->head_ce(G->ctx, NULL, NULL, NULL, d.x, d.w, d.tg, N, D, V, N, IGNORE, 0.5f);
  float *lg = ce_logits(N, Vp);  // one chunk: the scratch holds every row's logits
  size_t nonzero = 0;
  double sum = 0;
  int counted = 0;
  for (int n = 0; n < N; n++) {
    for (int j = V; j < Vp; j++) nonzero += lg[(size_t)n * Vp + j] != 0.0f;
    if (in.tg[n] == IGNORE) continue;
    double m = -INFINITY, s = 0;
    for (int j = 0; j < V; j++) m = fmax(m, lg[(size_t)n * Vp + j]);
    for (int j = 0; j < V; j++) s += exp(lg[(size_t)n * Vp + j] - m);
    sum += m + log(s) - lg[(size_t)n * Vp + in.tg[n]], counted++;
  }
  const double want = sum / counted;
  CHECK(nonzero == 0, "the padding's logits are 0 (zero rows of W): %zu are not", nonzero);
  CHECK(fabs(loss - want) <= 1e-5 * want, "loss %.7f == log-sum-exp over the %d real fp32 logits in double %.7f", loss,
        V, want);
  free(lg);
  HeadOut a = head_run(G, &c, &in, &d);

  // Poison: padding rows of 1.0 make the padding's logits sum(x) ~ 64 (x has mean 1), far above every
  // real logit (~N(0, 1.4)): counted anywhere, they would win every row's max and argmax.
  __nv_bfloat16 *wp = (__nv_bfloat16 *)cuda_head_weight_padded(CB, d.w, V, D);
  const size_t npad = (size_t)(Vp - V) * D;
  __nv_bfloat16 *one = (__nv_bfloat16 *)xmalloc(npad * sizeof(__nv_bfloat16));
  for (size_t i = 0; i < npad; i++) one[i] = __float2bfloat16(1.0f);
  CUDA_CHECK(cudaMemcpy(wp + (size_t)V * D, one, npad * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  free(one);
  G->upload(G->ctx, d.dw, in.dw0, (size_t)V * D * sizeof(float));  // the same dW to add to
  const float loss_b = G->head_ce(G->ctx, NULL, NULL, NULL, d.x, d.w, d.tg, N, D, V, N, IGNORE, 0.5f);
  lg = ce_logits(N, Vp);
  int padding_wins = 0;
  for (int n = 0; n < N; n++) {
    int arg = 0;
    for (int j = 1; j < Vp; j++) arg = lg[(size_t)n * Vp + j] > lg[(size_t)n * Vp + arg] ? j : arg;
    padding_wins += arg >= V;
  }
  free(lg);
  HeadOut b = head_run(G, &c, &in, &d);
  CHECK(cuda_head_weight_padded(CB, d.w, V, D) == wp, "the poisoned copy is the one the ops read (same version)");
  CHECK(padding_wins == N, "poisoned: the padding holds the largest logit of %d of %d rows", padding_wins, N);
  CHECK(same_bits(&loss, &loss_b, 1), "poisoned padding: loss-only head_ce %.7f, was %.7f (bit for bit)", loss_b, loss);
  CHECK(same_bits(&a.loss, &b.loss, 1), "poisoned padding: loss %.7f, was %.7f (bit for bit)", b.loss, a.loss);
  CHECK(same_bits(a.dx, b.dx, (size_t)N * D), "poisoned padding: dx unchanged bit for bit");
  CHECK(same_bits(a.dw, b.dw, (size_t)V * D), "poisoned padding: dW unchanged bit for bit");
  CHECK(same_bits(a.nll, b.nll, N), "poisoned padding: head_nll (evaluation scores) unchanged bit for bit");
  CHECK(same_bits(a.logits, b.logits, (size_t)N * V), "poisoned padding: the %d logits of llama_logits unchanged", V);
  // A new weights version (an optimizer step) rebuilds the copy: zero padding again.
  G->params_changed(G->ctx);
  wp = (__nv_bfloat16 *)cuda_head_weight_padded(CB, d.w, V, D);
  float *pad = (float *)xmalloc(npad * sizeof(float));
  download_floats(pad, wp + (size_t)V * D, npad, 0);
  size_t nz = 0;
  for (size_t i = 0; i < npad; i++) nz += pad[i] != 0.0f;
  CHECK(nz == 0, "after params_changed the padding rows are zero again (%zu nonzero)", nz);
  free(pad);
  free_out(&a), free_out(&b);
  head_release(G, &d);
  free_inputs(&in);
}

// ---- a model with V = 2053 trains ------------------------------------------------------------------------

static void test_training(void) {
  LlamaConfig c;
  memset(&c, 0, sizeof c);
  c.vocab_size = 2053, c.dim = 128, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.ffn_dim = 256;
  c.max_seq_len = 64, c.norm_eps = 1e-5f, c.rope_theta = 500000.0f;
  const int B = 2, T = 64, N = B * T, V = c.vocab_size, D = c.dim, steps = 10;
  const Ops *cpu = cpu_backend_open();
  Llama *mc = llama_create(&c, B, T, cpu), *mg = llama_create(&c, B, T, G);
  llama_init(mc, 1234);
  llama_init(mg, 1234);
  const size_t np = llama_param_count(mg);
  const ParamTensor *head = llama_find_tensor(mg, "head");
  CHECK(np == llama_param_count(mc) && head && head->shape[0] == V && head->numel == (size_t)V * D,
        "the parameters hold the head's %d rows, as on the CPU (%zu floats)", V, np);
  // A fixed batch of a deterministic sequence per row: learnable, so the loss must fall.
  int *in = (int *)xmalloc(N * sizeof(int)), *tg = (int *)xmalloc(N * sizeof(int));
  for (int n = 0; n < N; n++) in[n] = n % T == 0 ? (int)(rng_u64(&rng) % V) : (in[n - 1] * 37 + 11) % V;
  for (int n = 0; n < N; n++) tg[n] = n % T == T - 1 ? IGNORE : in[n + 1];
  in[5] = V - 1, tg[4] = V - 1;  // the last real id as input and as target

  // Step 0 in detail: loss, every gradient tensor and the logits, as gpu_test_ops' whole-model test.
  float lc = llama_forward(mc, in, tg, IGNORE), lg = llama_forward(mg, in, tg, IGNORE);
  CHECK(fabs(lg - lc) <= 1e-2 * fabs(lc), "V=2053 model loss cuda %.6f vs cpu %.6f", lg, lc);
  llama_zero_grad(mc), llama_zero_grad(mg);
  llama_backward(mc, 1.0f), llama_backward(mg, 1.0f);
  for (int i = 0; i < llama_num_tensors(mg); i++) {
    const ParamTensor *t = llama_tensor(mg, i);
    float *gg = host_f32(llama_grads(mg) + t->offset, t->numel);
    char what[96];
    snprintf(what, sizeof what, "V=2053 model gradient %s", t->name);
    check_rel(what, gg, llama_grads(mc) + t->offset, t->numel, 3e-2);
    free(gg);
  }
  float *lgt_c = (float *)xmalloc((size_t)N * V * sizeof(float)),
        *lgt_g = (float *)xmalloc((size_t)N * V * sizeof(float));
  llama_logits(mc, in, lgt_c);
  llama_logits(mg, in, lgt_g);
  check_rel("V=2053 model logits (llama_logits)", lgt_g, lgt_c, (size_t)N * V, 2e-2);
  free(lgt_c), free(lgt_g);

  // Training side by side: AdamW on each backend's own memory.
  float *m_c = (float *)xcalloc(np, sizeof(float)), *v_c = (float *)xcalloc(np, sizeof(float));
  float *m_g = (float *)G->alloc(G->ctx, np * sizeof(float)), *v_g = (float *)G->alloc(G->ctx, np * sizeof(float));
  G->zero(G->ctx, m_g, np * sizeof(float)), G->zero(G->ctx, v_g, np * sizeof(float));
  float first = 0, last = 0, worst = 0;
  for (int s = 1; s <= steps; s++) {
    llama_zero_grad(mc), llama_zero_grad(mg);
    lc = llama_forward_backward(mc, in, tg, IGNORE, 1.0f);
    lg = llama_forward_backward(mg, in, tg, IGNORE, 1.0f);
    cpu->adamw(cpu->ctx, llama_params(mc), llama_grads(mc), m_c, v_c, np, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, s);
    G->adamw(G->ctx, llama_params(mg), llama_grads(mg), m_g, v_g, np, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, s);
    worst = fmaxf(worst, fabsf(lg - lc) / lc);
    if (s == 1) first = lg;
    last = lg;
    printf("  step %2d: loss cuda %.5f cpu %.5f\n", s, lg, lc);
  }
  CHECK(worst <= 5e-2, "every step's loss within 5%% of the CPU's (worst %.3g)", worst);
  CHECK(last < 0.75f * first, "the V=2053 model trains on the GPU: loss %.4f -> %.4f", first, last);
  // The padding rows of the head the GPU computes with are still zero after the optimizer steps.
  const size_t npad = (size_t)(cuda_head_vocab_padded(V) - V) * D;
  const __nv_bfloat16 *wp = (const __nv_bfloat16 *)cuda_head_weight_padded(CB, llama_params(mg) + head->offset, V, D);
  float *pad = (float *)xmalloc(npad * sizeof(float));
  download_floats(pad, wp + (size_t)V * D, npad, 0);
  size_t nz = 0;
  for (size_t i = 0; i < npad; i++) nz += pad[i] != 0.0f;
  CHECK(nz == 0, "after %d steps the head's padding rows are zero (%zu nonzero)", steps, nz);
  free(pad);
  G->release(G->ctx, m_g), G->release(G->ctx, v_g);
  free(m_c), free(v_c), free(in), free(tg);
  llama_free(mc);
  llama_free(mg);
}

int main(void) {
  GPU_OPS_TEST_BEGIN(53);
  const Ops *cpu = cpu_backend_open();
  TEST_SECTION("head ops at V = 2053 and 50257 (padded): cuda vs cpu");
  const HeadCase cases[] = {
      {64, 64, 2053, 0, 0, 5},   {64, 64, 2053, 0, 24, 0},  {64, 64, 2053, 2, 0, 3}, {40, 64, 2053, 1, 0, 5},
      {32, 128, 50257, 0, 0, 2}, {48, 64, 50257, 2, 16, 0}, {64, 64, 2056, 0, 0, 3},  // a multiple of 8: not padded,
                                                                                      // the same checks
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) test_case(cpu, &cases[i], 100 + i);
  TEST_SECTION("the padding counts in nothing (V = 2053)");
  test_padding();
  TEST_SECTION("a 2-layer model with V = 2053 trains: cuda vs cpu");
  test_training();
  TEST_END();
}
