// tests/unit/test_gradcheck.c: the whole model (model/llama.c over the CPU backend) against an independent
// double-precision Llama written here from the HF formulas: same loss and logits, and analytic
// gradients of EVERY entry of EVERY parameter tensor against central differences of the double
// loss. Also: tensor table, init, gradient accumulation over micro-batches, determinism, and
// activation recomputation (bit-identical to none, smaller arena). The same checks run once more with
// document masking (block-causal attention, RoPE positions restarting at each BOS), against a
// reference that finds the documents its own way (a key is seen when no BOS lies after it up to the
// query).
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/llama.h"
#include "tests/test.h"

#define IGN (-100)

// ---- the reference model, in double ------------------------------------------------------------

typedef struct {
  const Llama *m;
  LlamaConfig c;
  int B, T;
  const int *inputs, *targets;
  double *p;       // parameters, in the model's layout
  double *logits;  // if not NULL, receives [B*T, V]
  LlamaDocs docs;  // document masking; all 0: none
} Ref;

// Whether a BOS lies in row positions (j, t] of token n's row: then key j is in an earlier document
// than query t.
static int bos_between(const Ref *r, int n, int j, int t) {
  const int *row = r->inputs + (n / r->T) * r->T;
  for (int i = j + 1; i <= t; i++)
    if (row[i] == r->docs.bos_id) return 1;
  return 0;
}

// The RoPE position of token n: its row position, or with restarting positions its distance from
// the last BOS at or before it (from the row start when there is none).
static int ref_position(const Ref *r, int n) {
  int t = n % r->T;
  if (!r->docs.restart_positions) return t;
  int s = t;
  while (s > 0 && r->inputs[n - t + s] != r->docs.bos_id) s--;
  return t - s;
}

static const double *tensor(const Ref *r, const char *name, int layer) {
  const ParamTensor *t = llama_find_tensor(r->m, name);
  if (!t) die("model has no tensor '%s'", name);
  int stacked = strcmp(name, "tok_embedding") && strcmp(name, "head") && strcmp(name, "final_norm");
  size_t per_layer = stacked ? t->numel / r->c.n_layers : 0;
  return r->p + t->offset + (size_t)layer * per_layer;
}

static void ref_linear(double *y, const double *x, const double *w, int N, int in, int out) {  // y = x W^T, W [out, in]
  for (int n = 0; n < N; n++)
    for (int o = 0; o < out; o++) {
      double s = 0;
      for (int i = 0; i < in; i++) s += x[n * in + i] * w[o * in + i];
      y[n * out + o] = s;
    }
}

static void ref_rmsnorm(double *y, const double *x, const double *w, int N, int D, double eps) {
  for (int n = 0; n < N; n++) {
    double ms = 0;
    for (int i = 0; i < D; i++) ms += x[n * D + i] * x[n * D + i];
    double r = 1 / sqrt(ms / D + eps);
    for (int i = 0; i < D; i++) y[n * D + i] = w[i] * x[n * D + i] * r;
  }
}

// HF: inv_freq = 1/theta^(2i/hd), llama3 rescaling, q*cos + rotate_half(q)*sin at ref_position.
static void ref_rope(double *x, const Ref *r, const LlamaConfig *c, int N, int nh, int hd) {
  for (int i = 0; i < hd / 2; i++) {
    double f = 1 / pow(c->rope_theta, 2.0 * i / hd);
    if (c->rope_scaling) {
      double orig = c->rope_original_max_pos, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
      double wl = 2 * M_PI / f, fl = wl > orig / lo ? f / c->rope_factor : f, sm = (orig / wl - lo) / (hi - lo);
      f = !(wl < orig / hi) && !(wl > orig / lo) ? (1 - sm) * fl / c->rope_factor + sm * fl : fl;
    }
    for (int n = 0; n < N; n++)
      for (int h = 0; h < nh; h++) {
        double *v = x + (n * nh + h) * hd, a = ref_position(r, n) * f, x1 = v[i], x2 = v[i + hd / 2];
        v[i] = x1 * cos(a) - x2 * sin(a);
        v[i + hd / 2] = x2 * cos(a) + x1 * sin(a);
      }
  }
}

// Causal attention; with block_causal, a key in an earlier document than the query scores -inf.
static void ref_attention(double *out, const Ref *r, const double *q, const double *k, const double *v, int B, int T,
                          int H, int KV, int hd) {
  double *s = xmalloc((size_t)T * sizeof(double));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        int g = h / (H / KV);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= t; j++) {
          double d = 0;
          for (int i = 0; i < hd; i++) d += q[((b * T + t) * H + h) * hd + i] * k[((b * T + j) * KV + g) * hd + i];
          s[j] = r->docs.block_causal && bos_between(r, b * T + t, j, t) ? -INFINITY : d / sqrt(hd);
          mx = fmax(mx, s[j]);
        }
        for (int j = 0; j <= t; j++) sum += exp(s[j] - mx);
        for (int i = 0; i < hd; i++) {
          double o = 0;
          for (int j = 0; j <= t; j++) o += exp(s[j] - mx) / sum * v[((b * T + j) * KV + g) * hd + i];
          out[((b * T + t) * H + h) * hd + i] = o;
        }
      }
  free(s);
}

// The mean cross-entropy of LlamaForCausalLM on (inputs, targets), in double.
static double ref_loss(Ref *r) {
  const LlamaConfig *c = &r->c;
  const int N = r->B * r->T, D = c->dim, F = c->ffn_dim, H = c->n_heads, KV = c->n_kv_heads, V = c->vocab_size;
  const int hd = D / H, Q = H * hd, K = KV * hd;
#define DBL(n) xmalloc(sizeof(double) * (size_t)(n))
  double *h = DBL(N * D), *a = DBL(N * D), *o = DBL(N * D), *q = DBL(N * Q), *k = DBL(N * K), *v = DBL(N * K);
  double *att = DBL(N * Q), *gt = DBL(N * F), *up = DBL(N * F), *lg = DBL(N * V);
#undef DBL
  const double eps = c->norm_eps;
  for (int n = 0; n < N; n++) memcpy(h + n * D, tensor(r, "tok_embedding", 0) + r->inputs[n] * D, sizeof(double) * D);
  for (int l = 0; l < c->n_layers; l++) {
    ref_rmsnorm(a, h, tensor(r, "attn_norm", l), N, D, eps);
    ref_linear(q, a, tensor(r, "wq", l), N, D, Q);
    ref_linear(k, a, tensor(r, "wk", l), N, D, K);
    ref_linear(v, a, tensor(r, "wv", l), N, D, K);
    ref_rope(q, r, c, N, H, hd);
    ref_rope(k, r, c, N, KV, hd);
    ref_attention(att, r, q, k, v, r->B, r->T, H, KV, hd);
    ref_linear(o, att, tensor(r, "wo", l), N, Q, D);
    for (int i = 0; i < N * D; i++) h[i] += o[i];
    ref_rmsnorm(a, h, tensor(r, "ffn_norm", l), N, D, eps);
    ref_linear(gt, a, tensor(r, "w_gate", l), N, D, F);
    ref_linear(up, a, tensor(r, "w_up", l), N, D, F);
    for (int i = 0; i < N * F; i++) gt[i] = gt[i] / (1 + exp(-gt[i])) * up[i];
    ref_linear(o, gt, tensor(r, "w_down", l), N, F, D);
    for (int i = 0; i < N * D; i++) h[i] += o[i];
  }
  ref_rmsnorm(a, h, tensor(r, "final_norm", 0), N, D, eps);
  ref_linear(lg, a, tensor(r, "head", 0), N, D, V);
  if (r->logits) memcpy(r->logits, lg, sizeof(double) * N * V);
  double loss = 0;
  int count = 0;
  for (int n = 0; n < N; n++) {
    if (r->targets[n] == IGN) continue;
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, lg[n * V + i]);
    for (int i = 0; i < V; i++) sum += exp(lg[n * V + i] - mx);
    loss += mx + log(sum) - lg[n * V + r->targets[n]];
    count++;
  }
  free(h), free(a), free(o), free(q), free(k), free(v), free(att), free(gt), free(up), free(lg);
  return count ? loss / count : 0;
}

// ---- the tiny test model ----------------------------------------------------------------------------

static LlamaConfig tiny_config(void) {
  LlamaConfig c = {0};
  c.vocab_size = 37, c.dim = 16, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.ffn_dim = 24;
  c.max_seq_len = 16, c.norm_eps = 1e-5f, c.rope_theta = 10000;
  // Llama-3.1 scaling on; with hd = 4 the frequencies are 1 (kept) and 0.01 (wavelength 628,
  // between orig/high = 256 and orig/low = 1024: interpolated).
  c.rope_scaling = 1, c.rope_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4;
  c.rope_original_max_pos = 1024;
  return c;
}

// Parameters larger than HF's 0.02 init, so attention is far from uniform, SwiGLU far from linear
// and the norm weights not all 1: every path of the gradient carries weight.
static void randomize(Llama *m, uint64_t seed) {
  Rng r;
  rng_seed(&r, seed);
  float *p = llama_params(m);
  for (int i = 0; i < llama_num_tensors(m); i++) {
    const ParamTensor *t = llama_tensor(m, i);
    for (size_t j = 0; j < t->numel; j++)
      p[t->offset + j] = t->decay ? 0.3f * rng_normal(&r) : 1.0f + 0.2f * rng_normal(&r);
  }
}

static void make_batch(int *in, int *tg, int N, int V, uint64_t seed) {
  Rng r;
  rng_seed(&r, seed);
  for (int n = 0; n < N; n++) in[n] = (int)(rng_u64(&r) % V), tg[n] = (int)(rng_u64(&r) % V);
  in[5] = in[1];                    // a repeated token (embedding gradient rows add up)
  tg[2] = tg[7] = tg[N - 1] = IGN;  // some ignored targets
}

// ---- tests ----------------------------------------------------------------------------------------

static void test_tensor_table(void) {
  TEST_SECTION("tensor table and init");
  LlamaConfig c = tiny_config();
  Llama *m = llama_create(&c, 2, 7, cpu_backend_open());
  const char *names[] = {"tok_embedding", "attn_norm", "wq",   "wk",     "wv",         "wo",
                         "ffn_norm",      "w_gate",    "w_up", "w_down", "final_norm", "head"};
  const int64_t L = 2, D = 16, Q = 16, K = 8, F = 24, V = 37;
  const int64_t shapes[12][3] = {{V, D}, {L, D},    {L, Q, D}, {L, K, D}, {L, K, D}, {L, D, Q},
                                 {L, D}, {L, F, D}, {L, F, D}, {L, D, F}, {D},       {V, D}};
  const int ndims[12] = {2, 2, 3, 3, 3, 3, 2, 3, 3, 3, 1, 2};
  CHECK(llama_num_tensors(m) == 12, "%d tensors", llama_num_tensors(m));
  size_t off = 0;
  int layout_ok = 1;
  for (int i = 0; i < 12 && i < llama_num_tensors(m); i++) {
    const ParamTensor *t = llama_tensor(m, i);
    int ok = !strcmp(t->name, names[i]) && t->ndim == ndims[i] && t->offset == off;
    size_t numel = 1;
    for (int d = 0; d < ndims[i]; d++) ok &= t->shape[d] == shapes[i][d], numel *= (size_t)shapes[i][d];
    ok &= t->numel == numel && t->decay == !strstr(t->name, "norm") && llama_find_tensor(m, names[i]) == t;
    if (!ok) printf("  tensor %d (%s) does not match the expected layout\n", i, t->name);
    layout_ok &= ok;
    off += t->numel;
  }
  CHECK(layout_ok, "names, shapes, contiguous offsets, decay flags");
  CHECK(off == llama_param_count(m) && (int64_t)off == llama_num_params(&c), "%zu floats, llama_num_params %lld", off,
        (long long)llama_num_params(&c));
  CHECK(llama_find_tensor(m, "nope") == NULL, "unknown tensor name");

  llama_init(m, 42);
  const float *p = llama_params(m);
  size_t n = llama_param_count(m);
  float *first = xmalloc(n * sizeof(float));
  memcpy(first, p, n * sizeof(float));
  int norms_one = 1;
  double ss = 0;
  size_t nw = 0;
  for (int i = 0; i < llama_num_tensors(m); i++) {
    const ParamTensor *t = llama_tensor(m, i);
    for (size_t j = 0; j < t->numel; j++) {
      if (!t->decay) norms_one &= p[t->offset + j] == 1.0f;
      else ss += (double)p[t->offset + j] * p[t->offset + j], nw++;
    }
  }
  double sd = sqrt(ss / nw);
  CHECK(norms_one, "RMSNorm weights initialised to 1");
  CHECK(fabs(sd - 0.02) < 0.001, "std of matrices and embeddings %.5f, want 0.02 (n = %zu)", sd, nw);
  llama_init(m, 42);
  CHECK(!memcmp(first, p, n * sizeof(float)), "same seed, same parameters");
  omp_set_num_threads(1);
  llama_init(m, 42);
  omp_set_num_threads(2);
  CHECK(!memcmp(first, p, n * sizeof(float)), "init independent of the thread count");
  llama_init(m, 43);
  CHECK(memcmp(first, p, n * sizeof(float)) != 0, "another seed, other parameters");
  free(first);
  llama_free(m);
}

// The BOS of the document test: row 0 holds documents [0, 3) (begun before the window) and [3, 7);
// row 1 [7, 11), [11, 12) (a BOS right after a BOS) and [12, 14).
#define DOC_BOS 36
static void place_bos(int *in, int N) {
  for (int n = 0; n < N; n++)
    if (in[n] == DOC_BOS) in[n] = 0;
  in[3] = in[7] = in[11] = in[12] = DOC_BOS;
}

// docs NULL: plain causal attention, positions 0..T-1; else the model and the reference mask
// documents as docs says, on a batch with BOS tokens (place_bos).
static void test_against_reference(const LlamaDocs *docs) {
  LlamaConfig c = tiny_config();
  const int B = 2, T = 7, N = B * T, V = c.vocab_size;
  Llama *m = llama_create(&c, B, T, cpu_backend_open());
  randomize(m, 7);
  int in[14], tg[14];
  make_batch(in, tg, N, V, 11);
  if (docs) place_bos(in, N), llama_set_docs(m, docs);
  size_t n = llama_param_count(m);
  Ref r = {m, c, B, T, in, tg, xmalloc(n * sizeof(double)), xmalloc(sizeof(double) * N * V), {0, 0, 0}};
  if (docs) r.docs = *docs;
  for (size_t i = 0; i < n; i++) r.p[i] = llama_params(m)[i];

  char title[160];
  if (docs)
    snprintf(title, sizeof title, "documents (doc_mask %s, doc_positions %s): forward vs the double reference",
             docs->block_causal ? "block_causal" : "none", docs->restart_positions ? "restart" : "continue");
  TEST_SECTION(docs ? title : "forward vs the double reference");
  double ref = ref_loss(&r);
  llama_zero_grad(m);
  float loss = llama_forward(m, in, tg, IGN);
  printf("  loss %.7f, reference %.7f\n", loss, ref);
  CHECK_NEAR(loss, ref, 2e-5);
  llama_backward(m, 1.0f);
  float *grads = xmalloc(n * sizeof(float));
  memcpy(grads, llama_grads(m), n * sizeof(float));

  float *logits = xmalloc(sizeof(float) * N * V);
  llama_logits(m, in, logits);
  double worst = 0;
  for (int i = 0; i < N * V; i++) worst = fmax(worst, fabs(logits[i] - r.logits[i]));
  printf("  logits max |err| %.2e\n", worst);
  CHECK(worst < 1e-5, "logits differ from the reference by %.3g", worst);
  if (!docs) {  // positions restart at 0 for every sequence: two identical sequences give identical logits
    int in2[14];
    for (int i = 0; i < N; i++) in2[i] = in[i % T];
    llama_logits(m, in2, logits);
    CHECK(!memcmp(logits, logits + T * V, sizeof(float) * T * V), "sequence 1 repeats sequence 0, logits differ");
  } else {  // the reference without the mask is far from the model with it: the check above can fail
    Ref plain = r;
    plain.docs = (LlamaDocs){0, 0, 0};
    plain.logits = xmalloc(sizeof(double) * N * V);
    ref_loss(&plain);
    double off = 0;
    for (int i = 0; i < N * V; i++) off = fmax(off, fabs(logits[i] - plain.logits[i]));
    printf("  the same reference without documents differs by up to %.2e\n", off);
    CHECK(off > 1e-2, "masking documents changed the logits by only %.3g", off);
    free(plain.logits);
  }
  free(r.logits);
  r.logits = NULL;

  // Central differences of the double loss with step 1e-5: truncation error ~1e-10 relative,
  // rounding ~1e-16/1e-5, so the estimate is exact far below fp32 precision. The analytic
  // gradient is fp32: each entry is a sum of a few hundred fp32 products through several chained
  // ops, good to some 1e-6 of its tensor's gradient scale (measured: max rel err ~3e-5). An
  // entry's error is taken relative to max(|fd|, 1e-2 * the tensor's largest |fd|), so entries
  // whose gradient nearly cancels are judged against the tensor's scale, and we accept 1e-3:
  // 30x the measured fp32 error, while a real mistake (a sign, an index, a scale, a missing term,
  // a 0.1% error in a RoPE frequency) gives 0.1 to 100.
  TEST_SECTION(docs ? "documents: gradient check of every entry vs central differences (double)"
                    : "gradient check: every entry of every tensor vs central differences (double)");
  const double h = 1e-5, tol = 1e-3;
  for (int ti = 0; ti < llama_num_tensors(m); ti++) {
    const ParamTensor *t = llama_tensor(m, ti);
    double *fd = xmalloc(t->numel * sizeof(double)), scale = 0;
    for (size_t j = 0; j < t->numel; j++) {
      double *x = &r.p[t->offset + j], x0 = *x;
      *x = x0 + h;
      double lp = ref_loss(&r);
      *x = x0 - h;
      double lm = ref_loss(&r);
      *x = x0;
      fd[j] = (lp - lm) / (2 * h);
      scale = fmax(scale, fabs(fd[j]));
    }
    double max_rel = 0, max_abs = 0;
    size_t at = 0;
    for (size_t j = 0; j < t->numel; j++) {
      double a = grads[t->offset + j], e = fabs(a - fd[j]), rel = e / fmax(fabs(fd[j]), 1e-2 * scale);
      if (rel > max_rel) max_rel = rel, at = j;
      max_abs = fmax(max_abs, e);
    }
    printf("  %-14s %5zu entries  max|grad| %.3e  max abs err %.2e  max rel err %.2e\n", t->name, t->numel, scale,
           max_abs, max_rel);
    CHECK(scale > 0 && max_rel < tol, "%s: entry %zu: analytic %.9g, finite difference %.9g (rel err %.3g)", t->name,
          at, grads[t->offset + at], fd[at], max_rel);
    free(fd);
  }
  free(grads), free(logits), free(r.p);
  llama_free(m);
}

static void test_accumulation(void) {
  TEST_SECTION("gradients accumulate over micro-batches");
  LlamaConfig c = tiny_config();
  const int B = 2, T = 7, N = B * T;
  Llama *m = llama_create(&c, B, T, cpu_backend_open());
  randomize(m, 3);
  size_t n = llama_param_count(m);
  int in1[14], tg1[14], in2[14], tg2[14];
  make_batch(in1, tg1, N, c.vocab_size, 21);
  make_batch(in2, tg2, N, c.vocab_size, 22);
  float *g1 = xmalloc(n * sizeof(float)), *g2 = xmalloc(n * sizeof(float));
  llama_zero_grad(m);
  float l1 = llama_forward(m, in1, tg1, IGN);
  llama_backward(m, 1.0f);
  memcpy(g1, llama_grads(m), n * sizeof(float));
  llama_zero_grad(m);
  float l2 = llama_forward(m, in2, tg2, IGN);
  llama_backward(m, 1.0f);
  memcpy(g2, llama_grads(m), n * sizeof(float));

  llama_zero_grad(m);
  float a1 = llama_forward(m, in1, tg1, IGN);
  llama_backward(m, 0.5f);
  float a2 = llama_forward(m, in2, tg2, IGN);
  llama_backward(m, 0.25f);
  const float *g = llama_grads(m);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; i++) {
    worst = fmax(worst, fabs(g[i] - (0.5 * g1[i] + 0.25 * g2[i])));
    scale = fmax(scale, fabs(g1[i]) + fabs(g2[i]));
  }
  printf("  max |g - (0.5 g1 + 0.25 g2)| = %.2e (gradient scale %.2e)\n", worst, scale);
  CHECK(l1 == a1 && l2 == a2, "losses change with accumulation: %g/%g vs %g/%g", l1, l2, a1, a2);
  CHECK(worst <= 1e-6 * scale, "accumulated gradients off by %.3g", worst);
  // The first backward after llama_zero_grad writes the gradients (Ops.set_grad_overwrite); one
  // after an explicit clear adds into zeros. Both must give g1 exactly.
  llama_zero_grad(m);
  g = llama_grads(m);  // reading them makes the zeros real, so the next backward adds
  int zero = 1;
  for (size_t i = 0; i < n; i++) zero &= g[i] == 0.0f;
  CHECK(zero, "llama_zero_grad clears every gradient");
  llama_forward(m, in1, tg1, IGN);
  llama_backward(m, 1.0f);
  CHECK(!memcmp(llama_grads(m), g1, n * sizeof(float)), "adding into cleared gradients differs from overwriting");
  llama_zero_grad(m);
  llama_forward_backward(m, in1, tg1, IGN, 1.0f);
  CHECK(!memcmp(llama_grads(m), g1, n * sizeof(float)), "llama_forward_backward's overwrite differs from the backward");
  free(g1), free(g2);
  llama_free(m);
}

// Loss and gradients of one step of a fresh tiny-preset model, with the given thread count.
static float run_step(int threads, float *grads_out, int fused) {
  LlamaConfig c;
  if (llama_preset("tiny", &c)) die("no tiny preset");
  const int B = 4, T = 32, N = B * T;
  omp_set_num_threads(threads);
  Llama *m = llama_create(&c, B, T, cpu_backend_open());
  llama_init(m, 5);
  int *in = xmalloc(N * sizeof(int)), *tg = xmalloc(N * sizeof(int));
  make_batch(in, tg, N, c.vocab_size, 9);
  llama_zero_grad(m);
  float loss;
  if (fused) {
    loss = llama_forward_backward(m, in, tg, IGN, 1.0f);
  } else {
    loss = llama_forward(m, in, tg, IGN);
    llama_backward(m, 1.0f);
  }
  memcpy(grads_out, llama_grads(m), llama_param_count(m) * sizeof(float));
  free(in), free(tg);
  llama_free(m);
  omp_set_num_threads(2);
  return loss;
}

static void test_determinism(void) {
  TEST_SECTION("determinism (tiny preset, B=4, T=32)");
  LlamaConfig c;
  llama_preset("tiny", &c);
  size_t n = (size_t)llama_num_params(&c);
  float *ga = xmalloc(n * sizeof(float)), *gb = xmalloc(n * sizeof(float)), *gc = xmalloc(n * sizeof(float));
  float *gd = xmalloc(n * sizeof(float));
  float la = run_step(2, ga, 0), lb = run_step(2, gb, 0), lc = run_step(1, gc, 0), ld = run_step(2, gd, 1);
  printf("  loss %.7f (2 threads), %.7f (again), %.7f (1 thread), %.7f (llama_forward_backward)\n", la, lb, lc, ld);
  CHECK(la == lb && !memcmp(ga, gb, n * sizeof(float)), "two runs with 2 threads differ");
  CHECK(la == lc && !memcmp(ga, gc, n * sizeof(float)), "1 thread and 2 threads differ");
  CHECK(la == ld && !memcmp(ga, gd, n * sizeof(float)), "llama_forward_backward differs from forward + backward");
  free(ga), free(gb), free(gc), free(gd);
}

// One optimizer step's worth of work with a recompute mode: two accumulated micro-batches (the
// first through llama_forward + llama_backward, the second through llama_forward_backward), then
// an eval forward and llama_logits. Fills grads [n] and logits [N, V]; returns the losses.
typedef struct {
  float train1, train2, eval;
  size_t act_bytes;
} RecomputeRun;

static RecomputeRun recompute_run_ops(const LlamaConfig *c, int B, int T, int mode, float *grads, float *logits,
                                      const Ops *ops) {
  const int N = B * T;
  Llama *m = llama_create_ex(c, B, T, ops, mode);
  randomize(m, 13);
  int *in1 = xmalloc(N * sizeof(int)), *tg1 = xmalloc(N * sizeof(int));
  int *in2 = xmalloc(N * sizeof(int)), *tg2 = xmalloc(N * sizeof(int));
  make_batch(in1, tg1, N, c->vocab_size, 31);
  make_batch(in2, tg2, N, c->vocab_size, 32);
  RecomputeRun r = {.act_bytes = llama_activation_bytes(m)};
  llama_zero_grad(m);
  r.train1 = llama_forward(m, in1, tg1, IGN);
  llama_backward(m, 0.5f);
  r.train2 = llama_forward_backward(m, in2, tg2, IGN, 0.5f);
  memcpy(grads, llama_grads(m), llama_param_count(m) * sizeof(float));
  r.eval = llama_forward(m, in2, tg1, IGN);
  llama_logits(m, in1, logits);
  free(in1), free(tg1), free(in2), free(tg2);
  llama_free(m);
  return r;
}

static RecomputeRun recompute_run(const LlamaConfig *c, int B, int T, int mode, float *grads, float *logits) {
  return recompute_run_ops(c, B, T, mode, grads, logits, cpu_backend_open());
}

static size_t align256(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

static void test_recompute(void) {
  TEST_SECTION("activation recomputation: bit-identical results, smaller arena");
  CHECK(llama_recompute_parse("none") == LLAMA_RECOMPUTE_NONE && llama_recompute_parse("ffn") == LLAMA_RECOMPUTE_FFN &&
            llama_recompute_parse("full") == LLAMA_RECOMPUTE_FULL && llama_recompute_parse("attn") == -1,
        "llama_recompute_parse");
  CHECK(!strcmp(llama_recompute_name(LLAMA_RECOMPUTE_FFN), "ffn"), "llama_recompute_name(ffn) = %s",
        llama_recompute_name(LLAMA_RECOMPUTE_FFN));
  LlamaConfig c;
  if (llama_preset("tiny", &c)) die("no tiny preset");
  c.n_layers = 3;  // more than two blocks share the scratch slices
  const int B = 2, T = 16, N = B * T, V = c.vocab_size;
  size_t n = (size_t)llama_num_params(&c);
  float *g[3], *lg[3];
  RecomputeRun r[3];
  for (int mode = 0; mode < 3; mode++) {
    g[mode] = xmalloc(n * sizeof(float)), lg[mode] = xmalloc((size_t)N * V * sizeof(float));
    r[mode] = recompute_run(&c, B, T, mode, g[mode], lg[mode]);
    printf("  %-4s losses %.7f %.7f, eval %.7f, activations %zu bytes\n", llama_recompute_name(mode), r[mode].train1,
           r[mode].train2, r[mode].eval, r[mode].act_bytes);
  }
  double gmax = 0;
  for (size_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(g[0][i]));
  CHECK(gmax > 1e-3, "the reference gradients are not trivially zero (max %g)", gmax);
  for (int mode = 1; mode < 3; mode++) {
    const char *name = llama_recompute_name(mode);
    CHECK(r[mode].train1 == r[0].train1 && r[mode].train2 == r[0].train2,
          "%s: training losses %.9g %.9g, without recomputation %.9g %.9g", name, r[mode].train1, r[mode].train2,
          r[0].train1, r[0].train2);
    CHECK(!memcmp(g[mode], g[0], n * sizeof(float)), "%s: accumulated gradients differ from recompute none", name);
    CHECK(r[mode].eval == r[0].eval, "%s: eval loss %.9g vs %.9g", name, r[mode].eval, r[0].eval);
    CHECK(!memcmp(lg[mode], lg[0], (size_t)N * V * sizeof(float)), "%s: llama_logits differ from recompute none", name);
  }
  // The arena loses L-1 slices of every recomputed buffer (each buffer is 256-byte aligned).
  const size_t L = c.n_layers, D = c.dim, F = c.ffn_dim, hd = D / c.n_heads, Q = c.n_heads * hd;
  const size_t K = c.n_kv_heads * hd, H = c.n_heads, fb = sizeof(float);
  const size_t ffn_slice[] = {N * D * fb, N * F * fb, N * F * fb, N * F * fb, N * fb};  // ffn_in gate up swi ffn_rstd
  const size_t attn_slice[] = {N * D * fb, N * Q * fb, N * K * fb, N * K * fb, N * Q * fb,
                               N * D * fb, N * fb,     N * H * fb};  // attn_in q k v att res_mid attn_rstd lse
  size_t save_ffn = 0, save_attn = 0;
  for (int i = 0; i < 5; i++) save_ffn += align256(L * ffn_slice[i]) - align256(ffn_slice[i]);
  for (int i = 0; i < 8; i++) save_attn += align256(L * attn_slice[i]) - align256(attn_slice[i]);
  CHECK(r[0].act_bytes - r[1].act_bytes == save_ffn, "ffn saves %zu bytes, want %zu", r[0].act_bytes - r[1].act_bytes,
        save_ffn);
  CHECK(r[0].act_bytes - r[2].act_bytes == save_ffn + save_attn, "full saves %zu bytes, want %zu",
        r[0].act_bytes - r[2].act_bytes, save_ffn + save_attn);
  for (int mode = 0; mode < 3; mode++) free(g[mode]), free(lg[mode]);
}

// selective_N: every Nth block (counted from 1) recomputed whole, the others keeping everything.
static void test_selective(void) {
  TEST_SECTION("selective_N recomputation (the paper's selective-N): bit-identical, the arena it saves");
  CHECK(llama_recompute_parse("selective_8") == LLAMA_RECOMPUTE_SELECTIVE(8) &&
            llama_recompute_parse("selective_0") == -1 && llama_recompute_parse("selective_") == -1 &&
            llama_recompute_parse("selective_3x") == -1,
        "parse selective_N");
  CHECK(!strcmp(llama_recompute_name(LLAMA_RECOMPUTE_SELECTIVE(32)), "selective_32"), "name: %s",
        llama_recompute_name(LLAMA_RECOMPUTE_SELECTIVE(32)));
  LlamaConfig c;
  if (llama_preset("tiny", &c)) die("no tiny preset");
  c.n_layers = 4;
  const int B = 2, T = 16, N = B * T, V = c.vocab_size;
  const int modes[4] = {LLAMA_RECOMPUTE_NONE, LLAMA_RECOMPUTE_SELECTIVE(2), LLAMA_RECOMPUTE_SELECTIVE(1),
                        LLAMA_RECOMPUTE_SELECTIVE(5)};
  size_t n = (size_t)llama_num_params(&c);
  float *g[4], *lg[4];
  RecomputeRun r[4];
  for (int i = 0; i < 4; i++) {
    g[i] = xmalloc(n * sizeof(float)), lg[i] = xmalloc((size_t)N * V * sizeof(float));
    r[i] = recompute_run(&c, B, T, modes[i], g[i], lg[i]);
    printf("  %-12s losses %.7f %.7f, activations %zu bytes\n", llama_recompute_name(modes[i]), r[i].train1,
           r[i].train2, r[i].act_bytes);
  }
  for (int i = 1; i < 4; i++) {
    const char *name = llama_recompute_name(modes[i]);
    CHECK(r[i].train1 == r[0].train1 && r[i].train2 == r[0].train2 && r[i].eval == r[0].eval, "%s: losses", name);
    CHECK(!memcmp(g[i], g[0], n * sizeof(float)), "%s: gradients differ from recompute none", name);
    CHECK(!memcmp(lg[i], lg[0], (size_t)N * V * sizeof(float)), "%s: logits differ", name);
  }
  // selective_2 recomputes blocks 2 and 4: they share one scratch slice of every per-block buffer, so
  // the arena holds 3 slices instead of 4; selective_1 is full (1 slice); selective_5 recomputes none
  const size_t D = c.dim, F = c.ffn_dim, hd = D / c.n_heads, Q = c.n_heads * hd, K = c.n_kv_heads * hd;
  const size_t H = c.n_heads, fb = sizeof(float);
  const size_t slice[] = {N * D * fb, N * F * fb, N * F * fb, N * F * fb, N * fb, N * D * fb, N * Q * fb,
                          N * K * fb, N * K * fb, N * Q * fb, N * D * fb, N * fb, N * H * fb};
  size_t one = 0, all_but_one = 0;
  for (int i = 0; i < 13; i++)
    one += align256(4 * slice[i]) - align256(3 * slice[i]), all_but_one += align256(4 * slice[i]) - align256(slice[i]);
  CHECK(r[0].act_bytes - r[1].act_bytes == one, "selective_2 saves %zu bytes, want %zu",
        r[0].act_bytes - r[1].act_bytes, one);
  CHECK(r[0].act_bytes - r[2].act_bytes == all_but_one, "selective_1 (= full) saves %zu, want %zu",
        r[0].act_bytes - r[2].act_bytes, all_but_one);
  CHECK(r[3].act_bytes == r[0].act_bytes, "selective_5 on 4 blocks recomputes none: %zu vs %zu", r[3].act_bytes,
        r[0].act_bytes);
  for (int i = 0; i < 4; i++) free(g[i]), free(lg[i]);
}

// ---- saved linear inputs (Ops.linear_saves_input) ------------------------------------------------
// The CPU table plus what the CUDA backend's FP4 linears do with input saving on: the forward of q,
// gate and down keeps its own copy of x (here a plain fp32 copy; there the quantized Wgrad operand),
// and the backward of q/k/v, gate/up and down uses that copy, never the x the model passes. Block
// SKIP keeps its BF16 inputs, as a block the recipe leaves in BF16 would. So the model's layout (one
// shared scratch for the inputs it need not keep) must give bit-identical results, and a wiring
// mistake (a backward handed another block's input) would not.
enum { SAVE_MAX_LAYERS = 8, SAVE_SKIP = 1 };
static int g_saving;
static float *g_kept[SAVE_MAX_LAYERS][LIN_NKINDS];
static size_t g_kept_n[SAVE_MAX_LAYERS][LIN_NKINDS];

static const Ops *g_base;  // the CPU table the saving one wraps

static void saving_set(void *ctx, int on) { g_saving = on; }
static int saving_saves_id(LinearId id) {
  return g_saving && id.layer >= 0 && id.layer != SAVE_SKIP && id.kind != LIN_O && id.kind != LIN_HEAD;
}
static int saving_saves(void *ctx, LinearId id) { return saving_saves_id(id); }
static LinearKind saving_group(LinearKind k) { return k == LIN_K || k == LIN_V ? LIN_Q : k == LIN_UP ? LIN_GATE : k; }

static void saving_fwd(void *ctx, LinearId id, void *out, const void *x, const float *w, int N, int in, int out_dim) {
  if (saving_saves_id(id) && saving_group(id.kind) == id.kind) {
    size_t n = (size_t)N * in;
    float **k = &g_kept[id.layer][id.kind];
    if (g_kept_n[id.layer][id.kind] != n) free(*k), *k = xmalloc(n * sizeof(float)), g_kept_n[id.layer][id.kind] = n;
    memcpy(*k, x, n * sizeof(float));
  }
  g_base->matmul_fwd(ctx, id, out, x, w, N, in, out_dim);
}

static void saving_bwd(void *ctx, LinearId id, void *dx, float *dw, const void *dout, const void *x, const float *w,
                       int N, int in, int out_dim, int dx_accumulate) {
  if (saving_saves_id(id)) x = g_kept[id.layer][saving_group(id.kind)];
  g_base->matmul_bwd(ctx, id, dx, dw, dout, x, w, N, in, out_dim, dx_accumulate);
}

static void test_saved_inputs(void) {
  TEST_SECTION("saved linear inputs: the model keeps no BF16 input a backend keeps; bit-identical results");
  g_base = cpu_backend_open();
  Ops saving = *g_base;  // the same ctx: the wrapped entries get the CPU backend's own state
  saving.name = "cpu+saving";
  saving.set_input_saving = saving_set;
  saving.linear_saves_input = saving_saves;
  saving.matmul_fwd = saving_fwd;
  saving.matmul_bwd = saving_bwd;
  LlamaConfig c;
  if (llama_preset("tiny", &c)) die("no tiny preset");
  c.n_layers = 4;  // blocks 0, 2, 3 share one scratch for each input, block 1 keeps its own
  const int B = 2, T = 16, N = B * T, V = c.vocab_size;
  size_t n = (size_t)llama_num_params(&c);
  float *g0 = xmalloc(n * sizeof(float)), *g1 = xmalloc(n * sizeof(float));
  float *l0 = xmalloc((size_t)N * V * sizeof(float)), *l1 = xmalloc((size_t)N * V * sizeof(float));
  RecomputeRun plain = recompute_run_ops(&c, B, T, LLAMA_RECOMPUTE_NONE, g0, l0, cpu_backend_open());
  RecomputeRun saved = recompute_run_ops(&c, B, T, LLAMA_RECOMPUTE_NONE, g1, l1, &saving);
  CHECK(g_saving == 1, "a model that keeps its activations turns input saving on");
  CHECK(saved.train1 == plain.train1 && saved.train2 == plain.train2 && saved.eval == plain.eval,
        "losses %.9g %.9g eval %.9g vs %.9g %.9g %.9g", saved.train1, saved.train2, saved.eval, plain.train1,
        plain.train2, plain.eval);
  CHECK(!memcmp(g1, g0, n * sizeof(float)), "accumulated gradients differ with saved inputs");
  CHECK(!memcmp(l1, l0, (size_t)N * V * sizeof(float)), "logits differ with saved inputs");
  // Three of four blocks drop attn_in [N, D], ffn_in [N, D] and swi [N, F] for one shared slice each.
  const size_t fb = sizeof(float), D = c.dim, F = c.ffn_dim;
  size_t want = align256(4 * N * D * fb) - align256(2 * N * D * fb);
  want = 2 * want + align256(4 * N * F * fb) - align256(2 * N * F * fb);
  CHECK(plain.act_bytes - saved.act_bytes == want, "arena %zu bytes smaller, want %zu",
        plain.act_bytes - saved.act_bytes, want);
  printf("  arena %zu bytes with saved inputs, %zu without\n", saved.act_bytes, plain.act_bytes);
  RecomputeRun full = recompute_run_ops(&c, B, T, LLAMA_RECOMPUTE_FULL, g1, l1, &saving);
  CHECK(g_saving == 0, "recompute full turns input saving off");
  CHECK(full.train2 == plain.train2 && !memcmp(g1, g0, n * sizeof(float)), "recompute full with the saving table");
  for (int l = 0; l < SAVE_MAX_LAYERS; l++)
    for (int k = 0; k < LIN_NKINDS; k++) free(g_kept[l][k]);
  free(g0), free(g1), free(l0), free(l1);
}

// The graph's fused entries (Ops.matmul_residual_fwd, Ops.matmul_swiglu_fwd) as a backend that fuses would be
// handed them: this table computes them with the CPU backend's own matmul, residual add and SwiGLU, so the bits
// must be the plain table's, and a wiring mistake (another block's buffer, res and x or gate and up swapped, a
// wrong layer or linear) would change them or the record. It declines both fusions in block FUSE_DECLINE
// (fuses_residual and fuses_swiglu 0), so the graph's fallback runs beside them.
enum { FUSE_DECLINE = 1 };
static int g_res_calls[2], g_res_declined, g_swi_calls, g_swi_declined;
static float *g_res_tmp;
static size_t g_res_tmp_n;

static int fusing_fuses(void *ctx, LinearId id) {
  if (id.kind != LIN_O && id.kind != LIN_DOWN) die("fuses_residual for a %s linear", linear_kind_name(id.kind));
  if (id.layer == FUSE_DECLINE) return g_res_declined++, 0;
  return 1;
}

static void fusing_residual(void *ctx, LinearId id, void *out, const void *res, const void *x, const float *w, int N,
                            int in, int out_dim) {
  if (id.layer == FUSE_DECLINE) die("matmul_residual_fwd in block %d, whose fuses_residual said no", id.layer);
  const size_t n = (size_t)N * out_dim;
  if (g_res_tmp_n < n) free(g_res_tmp), g_res_tmp = xmalloc(n * sizeof(float)), g_res_tmp_n = n;
  g_base->matmul_fwd(ctx, id, g_res_tmp, x, w, N, in, out_dim);
  g_base->residual_fwd(ctx, out, res, g_res_tmp, n);
  g_res_calls[id.kind == LIN_DOWN]++;
}

static int fusing_fuses_swiglu(void *ctx, LinearId up_id, LinearId down, int N, int F) {
  if (up_id.kind != LIN_UP || down.kind != LIN_DOWN || up_id.layer != down.layer)
    die("fuses_swiglu for %s and %s", linear_kind_name(up_id.kind), linear_kind_name(down.kind));
  if (up_id.layer == FUSE_DECLINE) return g_swi_declined++, 0;
  return 1;
}

static void fusing_swiglu(void *ctx, LinearId up_id, LinearId down, void *up, void *out, const void *x, const float *w,
                          const void *gate, int N, int in, int F) {
  if (up_id.kind != LIN_UP || down.kind != LIN_DOWN || up_id.layer != down.layer)
    die("matmul_swiglu_fwd for %s and %s", linear_kind_name(up_id.kind), linear_kind_name(down.kind));
  if (up_id.layer == FUSE_DECLINE) die("matmul_swiglu_fwd in block %d, whose fuses_swiglu said no", up_id.layer);
  g_base->matmul_fwd(ctx, up_id, up, x, w, N, in, F);
  g_base->swiglu_fwd(ctx, out, gate, up, (size_t)N * F);
  g_swi_calls++;
}

static void test_fused_entries(void) {
  TEST_SECTION("the graph's fused entries (residual in the o/down GEMM, SwiGLU in up's GEMM)");
  g_base = cpu_backend_open();
  Ops fusing = *g_base;
  fusing.name = "cpu+fusing";
  fusing.fuses_residual = fusing_fuses;
  fusing.matmul_residual_fwd = fusing_residual;
  fusing.fuses_swiglu = fusing_fuses_swiglu;
  fusing.matmul_swiglu_fwd = fusing_swiglu;
  LlamaConfig c;
  if (llama_preset("tiny", &c)) die("no tiny preset");
  c.n_layers = 3;
  const int B = 2, T = 16, N = B * T, V = c.vocab_size;
  size_t n = (size_t)llama_num_params(&c);
  float *g0 = xmalloc(n * sizeof(float)), *g1 = xmalloc(n * sizeof(float));
  float *l0 = xmalloc((size_t)N * V * sizeof(float)), *l1 = xmalloc((size_t)N * V * sizeof(float));
  for (int mode = 0; mode < 2; mode++) {
    const int rc = mode ? LLAMA_RECOMPUTE_FULL : LLAMA_RECOMPUTE_NONE;
    memset(g_res_calls, 0, sizeof g_res_calls), g_res_declined = g_swi_calls = g_swi_declined = 0;
    RecomputeRun plain = recompute_run_ops(&c, B, T, rc, g0, l0, cpu_backend_open());
    RecomputeRun fused = recompute_run_ops(&c, B, T, rc, g1, l1, &fusing);
    const char *what = mode ? "recompute full" : "recompute none";
    CHECK(fused.train1 == plain.train1 && fused.train2 == plain.train2 && fused.eval == plain.eval &&
              !memcmp(g1, g0, n * sizeof(float)) && !memcmp(l1, l0, (size_t)N * V * sizeof(float)),
          "%s: the fused entries give the plain table's losses (%.9g %.9g vs %.9g %.9g), gradients and logits", what,
          fused.train1, fused.train2, plain.train1, plain.train2);
    // 4 forwards (2 training, the eval, llama_logits), plus the backwards' recomputed attention halves
    const int fwd = 4 * (c.n_layers - 1), rec = mode ? 2 * (c.n_layers - 1) : 0;
    CHECK(g_res_calls[0] == fwd + rec && g_res_calls[1] == fwd && g_res_declined == 4 * 2 + (mode ? 2 : 0),
          "%s: residual fused for o %d times, down %d, declined %d (want %d, %d, %d)", what, g_res_calls[0],
          g_res_calls[1], g_res_declined, fwd + rec, fwd, 4 * 2 + (mode ? 2 : 0));
    // SwiGLU's half of the block is recomputed as the attention half is (recompute full)
    CHECK(g_swi_calls == fwd + rec && g_swi_declined == 4 + (mode ? 2 : 0),
          "%s: SwiGLU fused into up's GEMM %d times, declined %d (want %d, %d)", what, g_swi_calls, g_swi_declined,
          fwd + rec, 4 + (mode ? 2 : 0));
  }
  free(g_res_tmp), g_res_tmp = NULL, g_res_tmp_n = 0;
  free(g0), free(g1), free(l0), free(l1);
}

int main(void) {
  omp_set_num_threads(2);
  test_tensor_table();
  test_against_reference(NULL);
  test_against_reference(&(LlamaDocs){.block_causal = 1, .restart_positions = 1, .bos_id = DOC_BOS});
  test_against_reference(&(LlamaDocs){.block_causal = 1, .restart_positions = 0, .bos_id = DOC_BOS});
  test_against_reference(&(LlamaDocs){.block_causal = 0, .restart_positions = 1, .bos_id = DOC_BOS});
  test_accumulation();
  test_determinism();
  test_recompute();
  test_selective();
  test_saved_inputs();
  test_fused_entries();
  TEST_END();
}
