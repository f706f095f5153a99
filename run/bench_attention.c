// run/bench_attention.c: see bench_attention.h. Each variant runs the backend's attention_fwd and
// attention_bwd on the same random q, k, v, dout; every quantity is the median of individually synced
// repetitions (as run/bench.c). The document-masked variant cycles through DRAWS micro-batches of
// documents, so its time covers the spread of document counts (and of cuDNN's graph buckets), not one
// lucky draw; the first call of each draw (graph builds) is not timed.
#include "run/bench_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/doc_mask.h"

enum { DRAWS = 4 };

void bench_web_documents(int *tokens, int N, int vocab, int bos_id, double mean_len, double sigma, uint64_t seed) {
  Rng r;
  rng_seed(&r, seed);
  const double mu = log(mean_len) - sigma * sigma / 2;  // the log-normal's mean is exp(mu + sigma^2 / 2)
  int left = 0;                                         // tokens left in the current document
  for (int n = 0; n < N; n++) {
    if (left == 0) {  // a new document: its length, then its BOS
      double len = exp(mu + sigma * rng_normal(&r));
      left = len < 2 ? 2 : len > 1e9 ? 1000000000 : (int)(len + 0.5);
      if (n == 0) left = 1 + (int)(rng_u64(&r) % (uint64_t)left);  // the window starts inside the first one
      else {
        tokens[n] = bos_id, left--;
        continue;
      }
    }
    int t = (int)(rng_u64(&r) % (uint64_t)vocab);
    tokens[n] = t == bos_id ? (t + 1) % vocab : t;
    left--;
  }
}

// n values in the backend's activation type (fp32, or BF16 rounded to nearest even), from N(0, 1).
static void *random_acts(const Ops *op, size_t n, Rng *r) {
  const size_t bytes = n * (size_t)op->act_bytes;
  void *host = xmalloc(bytes), *dev = op->alloc(op->ctx, bytes);
  for (size_t i = 0; i < n; i++) {
    float f = rng_normal(r);
    if (op->act_bytes == 4) memcpy((char *)host + 4 * i, &f, 4);
    else {
      uint32_t u;
      memcpy(&u, &f, 4);
      uint16_t h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      memcpy((char *)host + 2 * i, &h, 2);
    }
  }
  op->upload(op->ctx, dev, host, bytes);
  free(host);
  return dev;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct {
  void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
  float *lse;
  int B, T, H, KV, hd;
} Buffers;

// Median ms of the forward and of the backward over `steps` synced calls each, cycling through the
// n_sets document sets (docs NULL: plain causal), after one untimed call of each. Each backward
// follows an untimed forward on its own documents (their lse). flush (NULL: none): a buffer of
// flush_bytes zeroed before each timed call, so that q, k, v (16-64 MB at 8B shapes, within a GPU's L2)
// come from memory as in a training step, not from the L2 the previous repetition left them in.
static void time_variant(const Ops *op, const Buffers *b, const DocMask *docs, int n_sets, int steps, void *flush,
                         size_t flush_bytes, double *fwd_ms, double *bwd_ms) {
  double *t = xmalloc((size_t)steps * sizeof(double));
  for (int pass = 0; pass < 2; pass++) {
    for (int s = -n_sets; s < steps; s++) {  // negative s: the warm-up calls
      const DocMask *d = docs ? &docs[(s + n_sets) % n_sets] : NULL;
      if (pass == 1) op->attention_fwd(op->ctx, b->out, b->lse, b->q, b->k, b->v, d, b->B, b->T, b->H, b->KV, b->hd);
      if (flush) op->zero(op->ctx, flush, flush_bytes);
      op->sync(op->ctx);
      double t0 = now_seconds();
      if (pass == 0) op->attention_fwd(op->ctx, b->out, b->lse, b->q, b->k, b->v, d, b->B, b->T, b->H, b->KV, b->hd);
      else
        op->attention_bwd(op->ctx, b->dq, b->dk, b->dv, b->dout, b->q, b->k, b->v, b->out, b->lse, d, b->B, b->T, b->H,
                          b->KV, b->hd);
      op->sync(op->ctx);
      if (s >= 0) t[s] = (now_seconds() - t0) * 1e3;
    }
    qsort(t, steps, sizeof *t, cmp_double);
    double med = steps % 2 ? t[steps / 2] : 0.5 * (t[steps / 2 - 1] + t[steps / 2]);
    if (pass == 0) *fwd_ms = med;
    else *bwd_ms = med;
  }
  free(t);
}

// Mean ms of a plain causal forward + backward pair over `steps` pairs queued back to back (one sync at
// each end, after one untimed pair): the GPU busy throughout as inside a training step, where the synced
// medians above let it idle between calls (and its clocks recover under the power cap).
static double time_back_to_back(const Ops *op, const Buffers *b, int steps) {
  double t0 = 0;
  for (int s = -1; s < steps; s++) {
    if (s == 0) op->sync(op->ctx), t0 = now_seconds();
    op->attention_fwd(op->ctx, b->out, b->lse, b->q, b->k, b->v, NULL, b->B, b->T, b->H, b->KV, b->hd);
    op->attention_bwd(op->ctx, b->dq, b->dk, b->dv, b->dout, b->q, b->k, b->v, b->out, b->lse, NULL, b->B, b->T, b->H,
                      b->KV, b->hd);
  }
  op->sync(op->ctx);
  return (now_seconds() - t0) * 1e3 / steps;
}

int bench_attention_main(const TrainConfig *cfg, const Ops *op, int steps) {
  const LlamaConfig *mc = &cfg->model;
  Buffers b = {
      .B = cfg->micro_batch, .T = cfg->seq_len, .H = mc->n_heads, .KV = mc->n_kv_heads, .hd = llama_head_dim(mc)};
  const int N = b.B * b.T;
  const size_t nq = (size_t)N * b.H * b.hd, nkv = (size_t)N * b.KV * b.hd;
  const int bos = cfg->bos_id < mc->vocab_size ? cfg->bos_id : 0;  // only the structure matters here
  printf("bench-attention: %s backend, B=%d T=%d H=%d KV=%d hd=%d, %d steps each (median of synced calls)\n", op->name,
         b.B, b.T, b.H, b.KV, b.hd, steps);
  if (op->library_report) op->library_report(op->ctx, stdout);
  Rng r;
  rng_seed(&r, cfg->seed);
  b.q = random_acts(op, nq, &r), b.k = random_acts(op, nkv, &r), b.v = random_acts(op, nkv, &r);
  b.dout = random_acts(op, nq, &r);
  b.out = op->alloc(op->ctx, nq * op->act_bytes), b.dq = op->alloc(op->ctx, nq * op->act_bytes);
  b.dk = op->alloc(op->ctx, nkv * op->act_bytes), b.dv = op->alloc(op->ctx, nkv * op->act_bytes);
  b.lse = op->alloc(op->ctx, (size_t)N * b.H * sizeof(float));

  // DRAWS micro-batches of web-like documents, each as the model would pass it (model/llama.c).
  DocMask docs[DRAWS];
  int *tokens = xmalloc((size_t)N * sizeof(int)), *start = xmalloc((size_t)N * sizeof(int));
  int *cu_all = xmalloc((size_t)DRAWS * ((size_t)N + 1) * sizeof(int)), longest = 0, total_docs = 0;
  double pairs = 0;
  for (int d = 0; d < DRAWS; d++) {
    int *cu = cu_all + (size_t)d * ((size_t)N + 1);  // kept on the host per draw, as the model keeps its own
    bench_web_documents(tokens, N, mc->vocab_size, bos, WEB_DOC_MEAN, WEB_DOC_SIGMA, cfg->seed + 1000 * (d + 1));
    docs[d].n_docs = doc_mask_build(tokens, b.B, b.T, bos, start, NULL, cu, &docs[d].pairs);
    for (int i = 0; i < docs[d].n_docs; i++) longest = cu[i + 1] - cu[i] > longest ? cu[i + 1] - cu[i] : longest;
    total_docs += docs[d].n_docs, pairs += docs[d].pairs;
    int *ds = op->alloc(op->ctx, (size_t)N * sizeof(int)), *dc = op->alloc(op->ctx, ((size_t)N + 1) * sizeof(int));
    op->upload(op->ctx, ds, start, (size_t)N * sizeof(int));
    op->upload(op->ctx, dc, cu, ((size_t)docs[d].n_docs + 1) * sizeof(int));
    docs[d].start = ds, docs[d].cu = dc, docs[d].cu_h = cu;
  }
  const double causal_pairs = (double)b.B * b.T * (b.T + 1) / 2;
  printf(
      "documents: log-normal lengths (mean %.0f, sigma %.1f), %d draws of %d rows: %.1f documents per draw, "
      "longest %d tokens; %.1f%% of the causal (query, key) pairs\n",
      WEB_DOC_MEAN, WEB_DOC_SIGMA, DRAWS, b.B, (double)total_docs / DRAWS, longest,
      100.0 * pairs / DRAWS / causal_pairs);

  double pf, pb, mf, mb, cf = 0, cb = 0;
  time_variant(op, &b, NULL, 1, steps, NULL, 0, &pf, &pb);
  time_variant(op, &b, docs, DRAWS, steps, NULL, 0, &mf, &mb);
  const double bb = time_back_to_back(op, &b, steps);
  // plain causal again with the L2 flushed before each call (GPU backends: 256 MB, several times any L2)
  const int gpu = strcmp(op->name, "cpu") != 0;
  const size_t flush_bytes = (size_t)256 << 20;
  void *flush = gpu ? op->alloc(op->ctx, flush_bytes) : NULL;
  if (flush) time_variant(op, &b, NULL, 1, steps, flush, flush_bytes, &cf, &cb);
  // FLOPs as FlashAttention counts them: 2 matmuls of 2 * hd per (query, key) pair and head forward,
  // 5 backward; the pairs are those computed, the causal triangle or the documents' triangles.
  const double f_plain = 4.0 * causal_pairs * b.H * b.hd, f_docs = 4.0 * pairs / DRAWS * b.H * b.hd;
  printf(
      "\n| attention | fwd ms | bwd ms | fwd+bwd ms | TFLOP/s over the pairs computed: fwd, bwd, both |\n"
      "|---|---|---|---|---|\n");
  printf("| plain causal | %.3f | %.3f | %.3f | %.3g, %.3g, %.3g |\n", pf, pb, pf + pb, f_plain / pf * 1e-9,
         2.5 * f_plain / pb * 1e-9, 3.5 * f_plain / (pf + pb) * 1e-9);
  printf("| document-masked | %.3f | %.3f | %.3f | %.3g, %.3g, %.3g |\n", mf, mb, mf + mb, f_docs / mf * 1e-9,
         2.5 * f_docs / mb * 1e-9, 3.5 * f_docs / (mf + mb) * 1e-9);
  printf("| plain causal, %d pairs back to back | - | - | %.3f | -, -, %.3g |\n", steps, bb, 3.5 * f_plain / bb * 1e-9);
  if (flush)
    printf("| plain causal, L2 flushed before each call | %.3f | %.3f | %.3f | %.3g, %.3g, %.3g |\n", cf, cb, cf + cb,
           f_plain / cf * 1e-9, 2.5 * f_plain / cb * 1e-9, 3.5 * f_plain / (cf + cb) * 1e-9);
  printf("BENCH attention %s plain causal     fwd+bwd %8.3f ms\n", op->name, pf + pb);
  printf("BENCH attention %s document-masked  fwd+bwd %8.3f ms  (%.2fx plain; the pairs alone would give %.2fx)\n",
         op->name, mf + mb, (mf + mb) / (pf + pb), pairs / DRAWS / causal_pairs);

  if (flush) op->release(op->ctx, flush);
  void *bufs[] = {b.q, b.k, b.v, b.out, b.dout, b.dq, b.dk, b.dv, b.lse};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) op->release(op->ctx, bufs[i]);
  for (int d = 0; d < DRAWS; d++) op->release(op->ctx, (void *)docs[d].start), op->release(op->ctx, (void *)docs[d].cu);
  free(tokens), free(start), free(cu_all);
  return 0;
}
