// parallel/zero.c: the ZeRO-1 optimizer step (see parallel/zero.h).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/adamw.h"
#include "parallel/zero.h"

// The forward's parameter-ready wait (llama_set_param_wait): the work queued next waits for the
// stage of the BF16 all-gather that carries this group (zero_step).
static void on_param_wait(void *ctx, int group) {
  Zero *z = ctx;
  comm_stage_wait(z->comm, group);
}

Zero *zero_create(Llama *model, const Ops *ops, Comm *comm, const ZeroOptions *opt) {
  Zero *z = xcalloc(1, sizeof *z);
  z->ops = ops, z->comm = comm, z->model = model;
  if (opt) z->opt = *opt;
  z->n = llama_param_count(model);
  comm_shard_range(z->n, comm_world(comm), comm_rank(comm), &z->lo, &z->hi);
  size_t bytes = (z->hi - z->lo) * sizeof(float);
  z->m = ops->alloc(ops->ctx, bytes ? bytes : sizeof(float));  // a tiny model over many ranks may own nothing
  z->v = ops->alloc(ops->ctx, bytes ? bytes : sizeof(float));
  ops->zero(ops->ctx, z->m, bytes);
  ops->zero(ops->ctx, z->v, bytes);
  const ParamTensor *emb = llama_find_tensor(model, "tok_embedding");
  if (emb && z->opt.overlap && comm_world(comm) > 1) {  // only the overlapped reduction goes by rows
    z->embed_off = emb->offset, z->embed_len = emb->numel, z->embed_dim = (size_t)emb->shape[1];
    z->nrows_words = ((size_t)emb->shape[0] + 63) / 64;
    z->rows = xcalloc(z->nrows_words, sizeof(uint64_t));
    z->row_list = xmalloc((size_t)emb->shape[0] * sizeof(uint32_t));
  }
  if (z->opt.shard_master && comm_world(comm) > 1 && comm_on_device(comm) && ops->shard_params) {
    // Kept in fp32: the shard (AdamW updates it) and the tensors without weight decay, the RMSNorm
    // weights, which the kernels read in fp32 (model/llama.h: decay 0 is exactly those).
    int nt = llama_num_tensors(model), nk = 1;
    size_t *off = xmalloc((size_t)(nt + 1) * sizeof(size_t)), *len = xmalloc((size_t)(nt + 1) * sizeof(size_t));
    z->fp32_ranges = xcalloc((size_t)nt + 1, sizeof(CommRange));
    off[0] = z->lo, len[0] = z->hi - z->lo;
    for (int i = 0; i < nt; i++) {
      const ParamTensor *t = llama_tensor(model, i);
      if (t->decay) continue;
      off[nk] = t->offset, len[nk] = t->numel, nk++;
      z->fp32_ranges[z->nfp32++] = (CommRange){t->offset, t->numel};
    }
    z->released = ops->shard_params(ops->ctx, off, len, nk);
    z->sharded = 1;
    free(off), free(len);
    llama_set_param_wait(model, on_param_wait, z);
  }
  return z;
}

void zero_free(Zero *z) {
  if (!z) return;
  llama_set_grad_hook(z->model, NULL, NULL);
  llama_set_param_wait(z->model, NULL, NULL);
  z->ops->release(z->ops->ctx, z->m);
  z->ops->release(z->ops->ctx, z->v);
  free(z->bucket);
  free(z->fp32_ranges);
  free(z->rows);
  free(z->row_list);
  free(z);
}

// ---- the gradient reduction -------------------------------------------------------------------

// Hands the open bucket to the transport (asynchronous on NCCL).
static void flush_bucket(Zero *z) {
  if (!z->nbucket) return;
  comm_reduce_ranges(z->comm, llama_grads(z->model), z->n, z->bucket, z->nbucket, z->opt.dtype);
  z->nbucket = 0, z->bucket_len = 0;
}

static void add_range(Zero *z, size_t off, size_t len);

// The embedding's gradient is ready: reduce only the rows some rank's tokens touched this step (the
// OR of the ranks' row sets, over TCP while the GPU still runs the backward), packed (comm.h).
static void embedding_ready(Zero *z) {
  comm_allreduce_or_u64(z->comm, z->rows, z->nrows_words);
  const size_t V = z->embed_len / z->embed_dim;
  int k = 0;
  for (size_t r = 0; r < V; r++)
    if (z->rows[r / 64] >> (r % 64) & 1) z->row_list[k++] = (uint32_t)r;
  flush_bucket(z);  // what the backward handed over before goes out first, as it would have
  comm_reduce_rows(z->comm, llama_grads(z->model), z->n, z->embed_off, z->embed_dim, z->row_list, k, z->opt.dtype);
}

// The grad hook: [off, off + len) of the gradients is final for this backward.
static void on_grad_ready(void *ctx, size_t off, size_t len) {
  Zero *z = ctx;
  if (off > z->n || len > z->n - off || z->handed + len > z->n)
    die("zero: the backward reported gradient range [%zu, %zu) of %zu floats after %zu were ready (model/llama.h "
        "grad hook): ranges must tile the buffer once",
        off, off + len, z->n, z->handed);
  z->handed += len;
  // Sparse only when every micro-batch of the step noted its tokens (the same on every rank: the
  // training loop notes them all), else the whole table.
  if (z->rows && z->notes == z->micros && off == z->embed_off && len == z->embed_len) {
    embedding_ready(z);
    return;
  }
  add_range(z, off, len);
}

// Joins [off, off + len) to the open bucket (merged with a neighbouring range: a tensor's layers
// arrive top down, side by side), which goes out once it holds opt.bucket floats.
static void add_range(Zero *z, size_t off, size_t len) {
  int merged = 0;
  for (int i = 0; i < z->nbucket && !merged; i++) {
    CommRange *b = &z->bucket[i];
    if (b->off == off + len) b->off = off, b->len += len, merged = 1;
    else if (b->off + b->len == off) b->len += len, merged = 1;
  }
  if (!merged) {
    z->bucket = grow_array(z->bucket, z->nbucket, &z->capbucket, sizeof *z->bucket);
    z->bucket[z->nbucket++] = (CommRange){off, len};
  }
  z->bucket_len += len;
  if (z->bucket_len >= z->opt.bucket) flush_bucket(z);
}

void zero_note_tokens(Zero *z, const int *tokens, int N) {
  if (!z->rows) return;
  const size_t V = z->embed_len / z->embed_dim;
  for (int i = 0; i < N; i++)
    if (tokens[i] >= 0 && (size_t)tokens[i] < V) z->rows[tokens[i] / 64] |= 1ull << (tokens[i] % 64);
  z->notes++;
}

void zero_begin_micro(Zero *z, int micro, int accum) {
  if (micro == 0) {
    z->state = ZERO_IDLE;  // a skipped step may have left REDUCED behind
    if (z->rows) memset(z->rows, 0, z->nrows_words * sizeof(uint64_t));
    z->notes = 0;
  }
  z->micros = micro + 1;
  if (!z->opt.overlap || comm_world(z->comm) == 1 || micro != accum - 1) return;
  z->state = ZERO_HOOKED;
  z->handed = 0, z->nbucket = 0, z->bucket_len = 0;
  llama_set_grad_hook(z->model, on_grad_ready, z);
}

void zero_reduce_grads(Zero *z) {
  if (comm_world(z->comm) == 1 || z->state == ZERO_REDUCED) return;
  if (z->state == ZERO_HOOKED) {
    llama_set_grad_hook(z->model, NULL, NULL);
    flush_bucket(z);
    if (z->handed != z->n)
      die("zero: the backward reported %zu of %zu gradient floats ready (model/llama.h grad hook): the rest "
          "would never be reduced",
          z->handed, z->n);
    comm_reduce_wait(z->comm);
  } else {
    comm_reduce_scatter_sum(z->comm, llama_grads(z->model), z->n, z->opt.dtype);
  }
  z->state = ZERO_REDUCED;
}

int zero_step(Zero *z, const ZeroHyper *h, float lr, int64_t t, float *norm_out) {
  const Ops *op = z->ops;
  float *g = llama_grads(z->model), *p = llama_params(z->model);
  const int world = comm_world(z->comm);
  zero_reduce_grads(z);
  z->state = ZERO_IDLE;
  double sumsq = op->grad_sumsq(op->ctx, g + z->lo, z->hi - z->lo);
  comm_allreduce_sum_f64(z->comm, &sumsq, 1);
  // The sum over ranks of mean gradients, divided by world: the mean (see zero.h).
  float norm = (float)(sqrt(sumsq) / world);
  *norm_out = norm;
  if (!isfinite(norm)) return -1;  // every rank sees the same norm, so every rank skips
  float scale = clip_scale(norm, h->grad_clip) / (float)world;
  for (int i = 0; i < llama_num_tensors(z->model); i++) {
    const ParamTensor *tn = llama_tensor(z->model, i);
    size_t a = tn->offset > z->lo ? tn->offset : z->lo, b = tn->offset + tn->numel;
    if (b > z->hi) b = z->hi;
    if (a >= b) continue;  // this tensor lies outside the shard
    op->adamw(op->ctx, p + a, g + a, z->m + (a - z->lo), z->v + (a - z->lo), b - a, lr, h->beta1, h->beta2, h->eps,
              tn->decay || h->decay_norms ? h->weight_decay : 0.0f, scale, t);
  }
  if (world > 1 && z->sharded) {
    // The RMSNorm weights in fp32 now (small); then the BF16 copy (adamw wrote the shard's) in
    // stages in the next forward's order: the embedding, block by block, the head. The stages run
    // on the transport's stream while the host goes on to the next step, and each group's first
    // reader waits on the GPU for its stage only (on_param_wait), so the gather of the blocks and
    // the head overlaps the next forward instead of preceding it.
    comm_all_gather_ranges(z->comm, p, z->n, z->fp32_ranges, z->nfp32);
    const int groups = llama_config(z->model)->n_layers + 2;
    size_t off[LLAMA_GROUP_RANGES], len[LLAMA_GROUP_RANGES];
    CommRange r[LLAMA_GROUP_RANGES];
    for (int gi = 0; gi < groups; gi++) {
      int nr = llama_param_group(z->model, gi, off, len);
      for (int i = 0; i < nr; i++) r[i] = (CommRange){off[i], len[i]};
      comm_all_gather_bf16_stage(z->comm, op->params_bf16(op->ctx), z->n, r, nr, gi);
    }
    op->params_bf16_changed(op->ctx);
  } else if (world > 1) {
    comm_all_gather(z->comm, p, z->n);
    op->params_changed(op->ctx);  // the other ranks' shards arrived as plain fp32 values
  }
  return 0;
}

const float *zero_full_params(Zero *z) {
  if (!z->sharded) return llama_params(z->model);
  float *g = llama_grads(z->model);
  comm_all_gather_to(z->comm, llama_params(z->model), g, z->n);
  return g;
}
