// model/cuda/ops_cuda.cu: the CUDA backend's operations table (see ops_cuda.h): the instance
// (CudaBackend), device memory with usage tracking, the BF16 parameter shadow and the W^T copies for
// the dgrad, thin wrappers from the table's void* signatures to the typed kernels of the other .cu
// files, and the routing of FP4 linear layers to model/cuda/linear_fp4.cu. The profiler is
// model/cuda/profile.cu.
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fp4/gemm_fp4.h"
#include "model/cuda/attention_cudnn.h"
#include "common/gemm.h"
#include "common/lt_tune.h"
#include "model/cuda/linear_fp4.h"
#include "model/cuda/ops_cuda.h"

// ---- memory -------------------------------------------------------------------------------------

void *cuda_malloc_tracked(CudaBackend *b, size_t bytes, const char *what) {
  void *p = NULL;
  size_t asked = bytes ? bytes : 256;  // never hand out NULL for an empty buffer
  cudaError_t e = cudaMalloc(&p, asked);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    die("cudaMalloc of %zu bytes (%.3f GiB) for %s failed: %s; the device has %.3f GiB free of %.3f GiB, "
        "this backend holds %.3f GiB",
        asked, asked / 1073741824.0, what, cudaGetErrorString(e), free_b / 1073741824.0, total_b / 1073741824.0,
        b->mem.used / 1073741824.0);
  }
  b->mem.v = (CudaAllocation *)grow_array(b->mem.v, b->mem.n, &b->mem.cap, sizeof *b->mem.v);
  b->mem.v[b->mem.n++] = CudaAllocation{p, asked};
  b->mem.used += asked;
  if (b->mem.used > b->mem.peak) b->mem.peak = b->mem.used;
  return p;
}

void cuda_free_tracked(CudaBackend *b, void *p) {
  if (!p) return;
  for (int i = 0; i < b->mem.n; i++)
    if (b->mem.v[i].p == p) {
      b->mem.used -= b->mem.v[i].bytes;
      b->mem.v[i] = b->mem.v[--b->mem.n];
      CUDA_CHECK(cudaFree(p));
      return;
    }
  die("cuda backend: release(%p): not a pointer this backend allocated (or released twice)", p);
}

void *cuda_scratch(CudaBackend *b, CudaScratch *s, size_t bytes, const char *what) {
  if (bytes > s->bytes) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // queued kernels may still use the old buffer
    cuda_free_tracked(b, s->p);
    s->p = cuda_malloc_tracked(b, bytes, what);
    s->bytes = bytes;
  }
  return s->p;
}

size_t cuda_mem_used(const CudaBackend *b) { return b->mem.used; }
size_t cuda_mem_peak(const CudaBackend *b) { return b->mem.peak; }
void cuda_mem_reset_peak(CudaBackend *b) { b->mem.peak = b->mem.used; }

// Copies that touch the bound parameter buffer go through the parameter section below (it keeps
// the BF16 shadow in step and, once sharded, the fp32 values only where they exist).
static int params_upload(CudaBackend *b, void *dst, const void *src, size_t bytes);
static void params_check_download(CudaBackend *b, const void *src, size_t bytes);

// Through the stream, then a sync: the copy is done (and the host buffer reusable) on return,
// whatever kind of host memory it is.
void cuda_upload(CudaBackend *b, void *dst, const void *src, size_t bytes) {
  if (!bytes || params_upload(b, dst, src, bytes)) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

void cuda_download(CudaBackend *b, void *dst, const void *src, size_t bytes) {
  if (!bytes) return;
  params_check_download(b, src, bytes);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

void cuda_gemm(CudaBackend *b, const char *name, void *out, int out_fp32, const void *A, int a_t, const void *B,
               int b_t, int M, int N, int K, float alpha, float beta) {
  int mk = cuda_prof_begin(b);
  gemm_bf16(out, out_fp32, A, a_t, B, b_t, M, N, K, alpha, beta);
  if (mk < 0) return;
  GemmShape s = {out_fp32, a_t, b_t, M, N, K, GEMM_ENGINE_BF16};
  double ob = out_fp32 ? 4 : 2, bytes = 2.0 * ((double)M * K + (double)K * N) + ob * M * N * (beta != 0 ? 2 : 1);
  cuda_prof_end(b, mk, name, PROF_GEMM, bytes, 2.0 * M * N * K, &s);
}

// ---- parameters and their BF16 shadow -----------------------------------------------------------

// Where the BF16 copy of w[0..count) lives; dies unless all of it is inside the bound buffer.
static bf16 *shadow_of(CudaBackend *b, const float *w, size_t count, const char *what) {
  if (!b->shadow) die("cuda backend: %s: no parameter buffer is bound (bind_params was not called)", what);
  uintptr_t lo = (uintptr_t)b->params, hi = lo + b->nparams * sizeof(float), p = (uintptr_t)w;
  if (p < lo || p + count * sizeof(float) > hi || (p - lo) % sizeof(float))
    die("cuda backend: %s: weight %p (%zu floats) is not inside the bound parameter buffer %p (%zu floats)", what,
        (const void *)w, count, (void *)b->params, b->nparams);
  return b->shadow + (w - b->params);
}

const void *cuda_param_bf16(CudaBackend *b, const float *w) { return shadow_of(b, w, 1, "cuda_param_bf16"); }

// ZeRO-1 master-weight sharding (Ops.shard_params): CudaBackend.keep_off / keep_len / nkeep.
static int in_params(CudaBackend *b, const void *p, size_t bytes) {
  uintptr_t lo = (uintptr_t)b->params, hi = lo + b->nparams * sizeof(float), a = (uintptr_t)p;
  return b->params && a >= lo && a < hi && a + bytes <= hi;
}

// Uploads into the bound buffer: the fp32 values go where they exist (all of them until it is
// sharded), and the BF16 shadow gets bf16() of every uploaded value, through a device staging
// buffer in pieces. The shadow is what the GEMMs, the embedding and the FP4 quantizers read, so a
// sharded rank that uploads the whole model (init, resume, init_from) computes with all of it.
static int params_upload(CudaBackend *b, void *dst, const void *src, size_t bytes) {
  if (b->nkeep < 0 || !in_params(b, dst, bytes)) return 0;
  if (((uintptr_t)dst - (uintptr_t)b->params) % sizeof(float) || bytes % sizeof(float))
    die("cuda backend: upload of %zu bytes at %p: not whole floats of the sharded parameter buffer", bytes, dst);
  const size_t PIECE = (size_t)16 << 20;  // floats: 64 MiB of staging
  size_t off = (size_t)((float *)dst - b->params), n = bytes / sizeof(float);
  float *stage =
      (float *)cuda_scratch(b, &b->up_stage, (n < PIECE ? n : PIECE) * sizeof(float), "parameter upload staging");
  for (size_t a = 0; a < n; a += PIECE) {
    size_t k = n - a < PIECE ? n - a : PIECE, lo = off + a, hi = lo + k;
    CUDA_CHECK(
        cudaMemcpyAsync(stage, (const float *)src + a, k * sizeof(float), cudaMemcpyHostToDevice, cuda_stream()));
    f32_to_bf16_cuda(b->shadow + lo, stage, k);
    for (int i = 0; i < b->nkeep; i++) {
      size_t x = b->keep_off[i] > lo ? b->keep_off[i] : lo, y = b->keep_off[i] + b->keep_len[i];
      if (y > hi) y = hi;
      if (x < y)
        CUDA_CHECK(cudaMemcpyAsync(b->params + x, stage + (x - lo), (y - x) * sizeof(float), cudaMemcpyDeviceToDevice,
                                   cuda_stream()));
    }
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // the staging buffer is reused by the next piece
  }
  b->wversion++;
  return 1;
}

static int kept(CudaBackend *b, size_t off, size_t n) {  // [off, off + n) lies inside one kept range
  for (int i = 0; i < b->nkeep; i++)
    if (off >= b->keep_off[i] && off + n <= b->keep_off[i] + b->keep_len[i]) return 1;
  return 0;
}

static void params_check_download(CudaBackend *b, const void *src, size_t bytes) {
  if (b->nkeep < 0 || !in_params(b, src, bytes)) return;
  size_t off = (size_t)((const float *)src - b->params), n = (bytes + sizeof(float) - 1) / sizeof(float);
  if (!kept(b, off, n))
    die("cuda backend: download of parameters [%zu, %zu): this rank holds only its shard of the fp32 parameters "
        "(parallel.shard_master); gather them first (parallel/zero.h zero_full_params)",
        off, off + n);
}

void cuda_head_ce_set_chunk(CudaBackend *b, int tokens) {
  if (tokens < 0 || tokens % 8)
    die("cuda_head_ce_set_chunk: %d tokens: must be 0 (automatic) or a positive multiple of 8", tokens);
  b->head_chunk = tokens;
}

// ---- W^T copies for the dgrad GEMM (see ops_cuda.h) ----------------------------------------------

static void wt_free_all(CudaBackend *b) {
  for (int i = 0; i < b->nwt; i++) cuda_free_tracked(b, b->wt[i].t);
  b->nwt = 0;
}

// W^T of w [out_dim, in], re-transposed from the shadow when older than the current weights. A
// linear search: a few hundred weights, once per dgrad GEMM of milliseconds.
static const bf16 *transposed_of(CudaBackend *b, const float *w, int in, int out_dim, const char *what) {
  const bf16 *w16 = shadow_of(b, w, (size_t)in * out_dim, what);
  size_t off = (size_t)(w - b->params);
  WeightT *e = NULL;
  for (int i = 0; i < b->nwt && !e; i++)
    if (b->wt[i].offset == off) e = &b->wt[i];
  if (e && (e->in != in || e->out_dim != out_dim))
    die("cuda backend: %s: the weight at parameter offset %zu is used as [out=%d, in=%d], but was [out=%d, in=%d] "
        "before (its W^T copy is per weight)",
        what, off, out_dim, in, e->out_dim, e->in);
  if (!e) {  // first dgrad of this weight (the first backward): allocate its copy
    b->wt = (WeightT *)grow_array(b->wt, b->nwt, &b->capwt, sizeof *b->wt);
    bf16 *t = (bf16 *)cuda_malloc_tracked(b, (size_t)in * out_dim * sizeof(bf16), "a transposed BF16 weight (W^T)");
    e = &b->wt[b->nwt++];
    *e = WeightT{off, in, out_dim, t, 0};
  }
  if (e->version != b->wversion) {
    int mk = cuda_prof_begin(b);
    transpose_bf16_cuda(e->t, w16, out_dim, in);
    cuda_prof_end(b, mk, "transpose w", PROF_MEM, 4.0 * in * out_dim, 0, NULL);
    e->version = b->wversion;
  }
  return e->t;
}

void cuda_set_dgrad_transposed(CudaBackend *b, int on) {
  if (on != 0 && on != 1) die("cuda_set_dgrad_transposed(%d): expected 0 or 1", on);
  if (!on) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // queued GEMMs may still read the copies
    wt_free_all(b);
  }
  b->dgrad_transposed = on;
}

const void *cuda_param_bf16_transposed(CudaBackend *b, const float *w, int in, int out_dim) {
  return transposed_of(b, w, in, out_dim, "cuda_param_bf16_transposed");
}

// ---- the table's entries ------------------------------------------------------------------------

static const bf16 *cb(const void *p) { return (const bf16 *)p; }
static bf16 *mb(void *p) { return (bf16 *)p; }

static void *cu_alloc(void *ctx, size_t bytes) { return cuda_malloc_tracked((CudaBackend *)ctx, bytes, "Ops.alloc"); }

static void *cu_alloc_params(void *ctx, size_t bytes) {
  CudaBackend *b = (CudaBackend *)ctx;
  size_t mapped = 0;
  void *p = param_memory_alloc(b->pm, bytes, &mapped);
  b->mem.used += mapped;
  if (b->mem.used > b->mem.peak) b->mem.peak = b->mem.used;
  return p;
}

static void cu_release(void *ctx, void *p) {
  CudaBackend *b = (CudaBackend *)ctx;
  if (p && p == (void *)b->params) {  // the model's parameters go: so do their shadow, W^T and FP4 copies
    wt_free_all(b);
    linear_fp4_release_weights(b->lin);
    cuda_free_tracked(b, b->shadow);
    b->shadow = NULL, b->params = NULL, b->nparams = 0;
    free(b->keep_off), free(b->keep_len);
    b->keep_off = b->keep_len = NULL, b->nkeep = -1;
    cuda_free_tracked(b, b->up_stage.p);
    b->up_stage.p = NULL, b->up_stage.bytes = 0;
  }
  if (p && param_memory_owns(b->pm, p)) b->mem.used -= param_memory_free(b->pm, p);
  else cuda_free_tracked(b, p);
}

static int cmp_size(const void *a, const void *b) {
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  return x < y ? -1 : x > y;
}

static size_t cu_shard_params(void *ctx, const size_t *off, const size_t *len, int n) {
  CudaBackend *b = (CudaBackend *)ctx;
  if (!b->params) die("cuda backend: shard_params: no parameter buffer is bound");
  if (!param_memory_owns(b->pm, b->params))
    die("cuda backend: shard_params: the bound parameter buffer was not allocated by alloc_params");
  if (b->nkeep >= 0) die("cuda backend: shard_params: the parameter buffer is already sharded");
  // Sort by offset and merge, so that kept() can test a span against one range.
  size_t *pairs = (size_t *)xmalloc(2 * (size_t)(n ? n : 1) * sizeof(size_t));
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (!len[i]) continue;
    if (off[i] > b->nparams || len[i] > b->nparams - off[i])
      die("cuda backend: shard_params: range [%zu, %zu) is outside the %zu parameters", off[i], off[i] + len[i],
          b->nparams);
    pairs[2 * m] = off[i], pairs[2 * m + 1] = len[i], m++;
  }
  qsort(pairs, m, 2 * sizeof(size_t), cmp_size);
  b->keep_off = (size_t *)xmalloc((m ? m : 1) * sizeof(size_t));
  b->keep_len = (size_t *)xmalloc((m ? m : 1) * sizeof(size_t));
  b->nkeep = 0;
  size_t *boff = (size_t *)xmalloc((m ? m : 1) * sizeof(size_t)),
         *blen = (size_t *)xmalloc((m ? m : 1) * sizeof(size_t));
  for (int i = 0; i < m; i++) {
    size_t lo = pairs[2 * i], hi = lo + pairs[2 * i + 1];
    if (b->nkeep && lo <= b->keep_off[b->nkeep - 1] + b->keep_len[b->nkeep - 1]) {
      size_t *e = &b->keep_len[b->nkeep - 1], end = b->keep_off[b->nkeep - 1] + *e;
      if (hi > end) *e = hi - b->keep_off[b->nkeep - 1];
    } else {
      b->keep_off[b->nkeep] = lo, b->keep_len[b->nkeep] = hi - lo, b->nkeep++;
    }
  }
  for (int i = 0; i < b->nkeep; i++) boff[i] = b->keep_off[i] * sizeof(float), blen[i] = b->keep_len[i] * sizeof(float);
  size_t released = param_memory_keep(b->pm, b->params, boff, blen, b->nkeep);
  b->mem.used -= released;
  free(pairs), free(boff), free(blen);
  return released;
}

static void *cu_params_bf16(void *ctx) {
  CudaBackend *b = (CudaBackend *)ctx;
  if (!b->shadow) die("cuda backend: params_bf16: no parameter buffer is bound");
  return b->shadow;
}

static void cu_params_bf16_changed(void *ctx) { ((CudaBackend *)ctx)->wversion++; }

static void cu_zero(void *ctx, void *p, size_t bytes) {
  CudaBackend *b = (CudaBackend *)ctx;
  if (!bytes) return;
  int mk = cuda_prof_begin(b);
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_stream()));
  cuda_prof_end(b, mk, "zero", PROF_MEM, (double)bytes, 0, NULL);
}

static void cu_acts_to_f32(void *ctx, float *dst, const void *src, size_t n) {
  CudaBackend *b = (CudaBackend *)ctx;
  if (n > b->acts_cap) {  // grow-only host staging
    free(b->acts_host);
    b->acts_host = (bf16 *)xmalloc(n * sizeof(bf16));
    b->acts_cap = n;
  }
  cuda_download(b, b->acts_host, src, n * sizeof(bf16));
  for (size_t i = 0; i < n; i++) dst[i] = __bfloat162float(b->acts_host[i]);
}

static void cu_sync(void *ctx) {
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  CUDA_CHECK(cudaGetLastError());  // a kernel fault surfaces here at the latest
  cuda_prof_collect((CudaBackend *)ctx);
}

static void cu_bind_params(void *ctx, float *params, size_t n) {
  CudaBackend *b = (CudaBackend *)ctx;
  wt_free_all(b);  // keyed by offsets (and pointers) into the previous buffer
  linear_fp4_release_weights(b->lin);
  cuda_free_tracked(b, b->shadow);
  b->shadow = (bf16 *)cuda_malloc_tracked(b, n * sizeof(bf16), "the BF16 parameter shadow");
  b->params = params, b->nparams = n;
}

static void cu_params_changed(void *ctx) {
  CudaBackend *b = (CudaBackend *)ctx;
  if (!b->shadow) die("cuda backend: params_changed: no parameter buffer is bound (bind_params was not called)");
  b->wversion++;  // every W^T copy is stale now
  int mk = cuda_prof_begin(b);
  size_t moved = 0;
  if (b->nkeep < 0) {
    f32_to_bf16_cuda(b->shadow, b->params, b->nparams), moved = b->nparams;
  } else {  // sharded: only the kept fp32 values exist; the rest of the shadow came by upload or all-gather
    for (int i = 0; i < b->nkeep; i++)
      f32_to_bf16_cuda(b->shadow + b->keep_off[i], b->params + b->keep_off[i], b->keep_len[i]), moved += b->keep_len[i];
  }
  cuda_prof_end(b, mk, "params to bf16", PROF_MEM, 6.0 * moved, 0, NULL);
}

static void cu_set_step(void *ctx, int64_t step, int micro) {
  linear_fp4_set_step(((CudaBackend *)ctx)->lin, step, micro);
}

// Ops.set_grad_overwrite: the weight-gradient GEMMs run with beta = 0 (no read of dW, no memset).
static void cu_set_grad_overwrite(void *ctx, int on) { ((CudaBackend *)ctx)->grad_overwrite = on; }

void cuda_set_recipe(CudaBackend *b, const Recipe *r, int n_layers, uint64_t seed) {
  linear_fp4_set_recipe(b->lin, r, n_layers, seed);
}
static void cu_set_recipe(void *ctx, const Recipe *r, int n_layers, uint64_t seed) {
  cuda_set_recipe((CudaBackend *)ctx, r, n_layers, seed);
}

static double cu_grad_sumsq(void *ctx, const float *g, size_t n) {
  CudaBackend *b = (CudaBackend *)ctx;
  int mk = cuda_prof_begin(b);
  double s = grad_sumsq_cuda(b, g, n);
  cuda_prof_end(b, mk, "grad sumsq", PROF_MEM, 4.0 * n, 0, NULL);
  return s;
}

static void cu_adamw(void *ctx, float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                     float beta2, float eps, float weight_decay, float grad_scale, int64_t t) {
  CudaBackend *b = (CudaBackend *)ctx;
  // Parameters of the bound buffer get their BF16 copy refreshed in the same pass; a buffer
  // outside it (an optimizer test, say) has no copy to refresh.
  uintptr_t lo = (uintptr_t)b->params, hi = lo + b->nparams * sizeof(float), a = (uintptr_t)p;
  bf16 *p16 = b->shadow && a >= lo && a < hi ? shadow_of(b, p, n, "adamw") : NULL;
  if (p16) b->wversion++;  // W^T copies are re-transposed at their next dgrad (one counter for all)
  int mk = cuda_prof_begin(b);
  adamw_update_cuda(p, p16, g, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
  cuda_prof_end(b, mk, "adamw", PROF_MEM, (28.0 + (p16 ? 2 : 0)) * n, 0, NULL);
}

static void cu_embed_fwd(void *ctx, void *out, const int *tokens, const float *table, int N, int D, int V) {
  CudaBackend *b = (CudaBackend *)ctx;
  int mk = cuda_prof_begin(b);
  // The table's BF16 shadow when it is the model's: the same bits (the output is BF16), and the
  // only copy of the whole table on a rank whose fp32 parameters are sharded.
  const int shadow = in_params(b, table, (size_t)V * D * sizeof(float)) && b->shadow;
  if (shadow) embedding_forward_bf16_cuda(b, mb(out), tokens, b->shadow + (table - b->params), N, D, V);
  else embedding_forward_cuda(b, mb(out), tokens, table, N, D, V);
  cuda_prof_end(b, mk, "embed fwd", PROF_MEM, 4.0 * N + (shadow ? 4.0 : 6.0) * N * D, 0, NULL);
}

static void cu_embed_bwd(void *ctx, float *dtable, const void *dout, const int *tokens, int N, int D) {
  CudaBackend *b = (CudaBackend *)ctx;
  int mk = cuda_prof_begin(b);
  int distinct = embedding_backward_cuda(b, dtable, cb(dout), tokens, N, D);
  cuda_prof_end(b, mk, "embed bwd", PROF_MEM, 4.0 * N + 2.0 * N * D + 8.0 * distinct * D, 0, NULL);
}

static void cu_rmsnorm_fwd(void *ctx, void *out, float *rstd, const void *x, const float *w, int N, int D, float eps) {
  CudaBackend *b = (CudaBackend *)ctx;
  int mk = cuda_prof_begin(b);
  rmsnorm_forward_cuda(mb(out), rstd, cb(x), w, N, D, eps);
  cuda_prof_end(b, mk, "rmsnorm fwd", PROF_MEM, 4.0 * N * D + 4.0 * D + 4.0 * N, 0, NULL);
}

static void cu_rmsnorm_bwd(void *ctx, void *dx, float *dw, const void *dout, const void *x, const float *w,
                           const float *rstd, int N, int D) {
  CudaBackend *b = (CudaBackend *)ctx;
  int mk = cuda_prof_begin(b);
  int parts = rmsnorm_backward_cuda(b, mb(dx), dw, cb(dout), cb(x), w, rstd, N, D, b->grad_overwrite);
  // x and dout read, dx read and written; w, rstd; the partial sums written and read; dw updated
  cuda_prof_end(b, mk, "rmsnorm bwd", PROF_MEM, 8.0 * N * D + 4.0 * D + 4.0 * N + 8.0 * parts * D + 8.0 * D, 0, NULL);
}

// A contraction the recipe puts in FP4 goes to linear_fp4.cu (with its weight's BF16 shadow and the
// weights version its quantized copies are checked against); the rest runs in BF16 here.
static void cu_matmul_fwd(void *ctx, LinearId id, void *out, const void *x, const float *w, int N, int in,
                          int out_dim) {
  CudaBackend *b = (CudaBackend *)ctx;
  if (linear_fp4_runs(b->lin, id, CONTR_FPROP)) {
    const bf16 *w16 = shadow_of(b, w, (size_t)in * out_dim, "FP4 matmul_fwd");
    linear_fp4_forward(b->lin, id, mb(out), cb(x), w, w16, b->wversion, N, in, out_dim, NULL);
    return;
  }
  char name[40];
  snprintf(name, sizeof name, "gemm fwd %s", linear_kind_name(id.kind));
  const bf16 *w16 = shadow_of(b, w, (size_t)in * out_dim, name);
  if (id.kind == LIN_HEAD && cuda_head_vocab_padded(out_dim) != out_dim) {  // llama_logits, padded vocabulary
    head_logits_cuda(b, mb(out), cb(x), w16, N, in, out_dim);
    return;
  }
  cuda_gemm(b, name, out, 0, x, 0, w16, 1, N, out_dim, in, 1.0f, 0.0f);
}

static int cu_fuses_residual(void *ctx, LinearId id) {
  return linear_fp4_fuses_residual(((CudaBackend *)ctx)->lin, id);
}

static void cu_matmul_residual_fwd(void *ctx, LinearId id, void *out, const void *res, const void *x, const float *w,
                                   int N, int in, int out_dim) {
  CudaBackend *b = (CudaBackend *)ctx;
  const bf16 *w16 = shadow_of(b, w, (size_t)in * out_dim, "FP4 matmul_residual_fwd");
  linear_fp4_forward(b->lin, id, mb(out), cb(x), w, w16, b->wversion, N, in, out_dim, cb(res));  // checks id fuses
}

static void cu_matmul_bwd(void *ctx, LinearId id, void *dx, float *dw, const void *dout, const void *x, const float *w,
                          int N, int in, int out_dim, int dx_accumulate) {
  CudaBackend *b = (CudaBackend *)ctx;
  void *fdx = dx && linear_fp4_runs(b->lin, id, CONTR_DGRAD) ? dx : NULL;
  float *fdw = dw && linear_fp4_runs(b->lin, id, CONTR_WGRAD) ? dw : NULL;
  if (fdx || fdw) {
    const bf16 *w16 = shadow_of(b, w, (size_t)in * out_dim, "FP4 matmul_bwd");
    linear_fp4_backward(b->lin, id, mb(fdx), fdw, cb(dout), cb(x), w, w16, b->wversion, N, in, out_dim, dx_accumulate,
                        b->grad_overwrite);
    if (fdx) dx = NULL;  // done; what is left runs in BF16 below
    if (fdw) dw = NULL;
  }
  char name[40];
  if (dx && b->dgrad_transposed) {  // dX [N, in] (+)= dY [N, out] (W^T [in, out])^T: the forward's TN layout
    snprintf(name, sizeof name, "gemm dgrad %s", linear_kind_name(id.kind));
    const bf16 *wt = transposed_of(b, w, in, out_dim, name);
    cuda_gemm(b, name, dx, 0, dout, 0, wt, 1, N, in, out_dim, 1.0f, dx_accumulate ? 1.0f : 0.0f);
  } else if (dx) {  // dX (+)= dY W on W [out, in] itself
    snprintf(name, sizeof name, "gemm dgrad %s NN", linear_kind_name(id.kind));
    const bf16 *w16 = shadow_of(b, w, (size_t)in * out_dim, name);
    cuda_gemm(b, name, dx, 0, dout, 0, w16, 0, N, in, out_dim, 1.0f, dx_accumulate ? 1.0f : 0.0f);
  }
  if (dw) {  // dW [out, in] (+)= dout^T x, into the fp32 gradient
    snprintf(name, sizeof name, "gemm wgrad %s", linear_kind_name(id.kind));
    cuda_gemm(b, name, dw, 1, dout, 1, x, 0, out_dim, in, N, 1.0f, b->grad_overwrite ? 0.0f : 1.0f);
  }
}

static double rope_bytes(int B, int T, int n_heads, int hd) {
  return 4.0 * B * T * n_heads * hd + 4.0 * T * hd;  // x read + written (BF16); cos + sin [T, hd/2] fp32
}

static void cu_rope_fwd(void *ctx, void *x, const float *cos_t, const float *sin_t, const int *pos, int B, int T,
                        int n_heads, int hd) {
  CudaBackend *b = (CudaBackend *)ctx;
  int mk = cuda_prof_begin(b);
  rope_rotate_cuda(mb(x), cos_t, sin_t, pos, B, T, n_heads, hd, 1);
  cuda_prof_end(b, mk, "rope fwd", PROF_MEM, rope_bytes(B, T, n_heads, hd), 0, NULL);
}

static void cu_rope_bwd(void *ctx, void *dx, const float *cos_t, const float *sin_t, const int *pos, int B, int T,
                        int n_heads, int hd) {
  CudaBackend *b = (CudaBackend *)ctx;
  int mk = cuda_prof_begin(b);
  rope_rotate_cuda(mb(dx), cos_t, sin_t, pos, B, T, n_heads, hd, -1);
  cuda_prof_end(b, mk, "rope bwd", PROF_MEM, rope_bytes(B, T, n_heads, hd), 0, NULL);
}

// Causal attention FLOPs, as FlashAttention's papers (and docs/formats.md §3's 534 TFLOP/s) count them:
// each of the two forward matmuls (QK^T, PV) is 2*T*T*hd/2 per (sequence, head); the backward has
// five (QK^T recomputed, dV, dP, dQ, dK). With documents, the pairs attended to replace B*T*T/2.
static double attn_flops(const DocMask *docs, int B, int T, int H, int hd, int matmuls) {
  double pairs = docs ? docs->pairs : (double)B * T * T / 2;
  return matmuls * 2.0 * pairs * H * hd;
}

static void cu_attention_fwd(void *ctx, void *out, float *lse, const void *q, const void *k, const void *v,
                             const DocMask *docs, int B, int T, int H, int KV, int hd) {
  CudaBackend *b = (CudaBackend *)ctx;
  int mk = cuda_prof_begin(b);
  attention_cudnn_fwd(b->attn, out, lse, q, k, v, docs, B, T, H, KV, hd);
  double bytes = 2.0 * B * T * (2.0 * H + 2.0 * KV) * hd + 4.0 * B * H * T;
  cuda_prof_end(b, mk, docs ? "attention fwd (docs)" : "attention fwd", PROF_ATTN, bytes,
                attn_flops(docs, B, T, H, hd, 2), NULL);
}

static void cu_attention_bwd(void *ctx, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                             const void *v, const void *out, const float *lse, const DocMask *docs, int B, int T, int H,
                             int KV, int hd) {
  CudaBackend *b = (CudaBackend *)ctx;
  int mk = cuda_prof_begin(b);
  attention_cudnn_bwd(b->attn, dq, dk, dv, dout, q, k, v, out, lse, docs, B, T, H, KV, hd);
  double bytes = 2.0 * B * T * (4.0 * H + 4.0 * KV) * hd + 4.0 * B * H * T;
  cuda_prof_end(b, mk, docs ? "attention bwd (docs)" : "attention bwd", PROF_ATTN, bytes,
                attn_flops(docs, B, T, H, hd, 5), NULL);
}

static void cu_swiglu_fwd(void *ctx, void *out, const void *gate, const void *up, size_t n) {
  CudaBackend *b = (CudaBackend *)ctx;
  int mk = cuda_prof_begin(b);
  swiglu_forward_cuda(mb(out), cb(gate), cb(up), n);
  cuda_prof_end(b, mk, "swiglu fwd", PROF_MEM, 6.0 * n, 0, NULL);
}

static void cu_rmsnorm_fwd_into(void *ctx, LinearId leader, void *out, float *rstd, const void *x, const float *w,
                                int N, int D, float eps) {
  CudaBackend *b = (CudaBackend *)ctx;
  if (linear_fp4_fusable(b->lin, leader)) {
    int mk = cuda_prof_begin(b);
    rmsnorm_forward_cuda(NULL, rstd, cb(x), w, N, D, eps);  // rstd only: the producer makes the output
    cuda_prof_end(b, mk, "rmsnorm fwd (rstd only)", PROF_MEM, 2.0 * N * D + 4.0 * N, 0, NULL);
    if (linear_fp4_fused_rmsnorm(b->lin, leader, out, cb(x), rstd, w, N, D)) return;
  }
  cu_rmsnorm_fwd(ctx, out, rstd, x, w, N, D, eps);
}

static void cu_swiglu_fwd_into(void *ctx, LinearId leader, void *out, const void *gate, const void *up, int N, int F) {
  if (linear_fp4_fused_swiglu(((CudaBackend *)ctx)->lin, leader, out, cb(gate), cb(up), N, F)) return;
  cu_swiglu_fwd(ctx, out, gate, up, (size_t)N * F);
}

static int cu_fuses_swiglu(void *ctx, LinearId up_id, LinearId down, int N, int F) {
  return linear_fp4_fuses_swiglu(((CudaBackend *)ctx)->lin, up_id, down, N, F);
}

static void cu_matmul_swiglu_fwd(void *ctx, LinearId up_id, LinearId down, void *up, void *out, const void *x,
                                 const float *w, const void *gate, int N, int in, int F) {
  CudaBackend *b = (CudaBackend *)ctx;
  const bf16 *w16 = shadow_of(b, w, (size_t)in * F, "FP4 matmul_swiglu_fwd");
  linear_fp4_forward_swiglu(b->lin, up_id, down, mb(up), out, cb(x), w, w16, b->wversion, cb(gate), N, in,
                            F);  // checks it fuses
}

static void cu_swiglu_bwd(void *ctx, void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                          size_t n) {
  CudaBackend *b = (CudaBackend *)ctx;
  int mk = cuda_prof_begin(b);
  swiglu_backward_cuda(mb(dgate), mb(dup), cb(dout), cb(gate), cb(up), n);
  cuda_prof_end(b, mk, "swiglu bwd", PROF_MEM, 10.0 * n, 0, NULL);
}

static void cu_residual_fwd(void *ctx, void *out, const void *x, const void *y, size_t n) {
  CudaBackend *b = (CudaBackend *)ctx;
  int mk = cuda_prof_begin(b);
  residual_forward_cuda(mb(out), cb(x), cb(y), n);
  cuda_prof_end(b, mk, "residual", PROF_MEM, 6.0 * n, 0, NULL);
}

// The graph's `chunk` and `scratch` suit the CPU (a few MB of fp32 logits); the GPU wants
// thousands of tokens per GEMM, so crossentropy.cu chunks with its own scratch instead.
static float cu_head_ce(void *ctx, void *dx, float *dw, float *scratch, const void *x, const float *w,
                        const int *targets, int N, int D, int V, int chunk, int ignore_index, float dloss) {
  CudaBackend *b = (CudaBackend *)ctx;
  const bf16 *w16 = shadow_of(b, w, (size_t)V * D, "head_ce");
  return head_crossentropy_cuda(b, mb(dx), dw, cb(x), w16, targets, N, D, V, ignore_index, dloss, b->head_chunk,
                                b->grad_overwrite);
}

static void cu_head_nll(void *ctx, float *nll, float *scratch, const void *x, const float *w, const int *rows,
                        const int *targets, int n, int D, int V, int chunk) {
  CudaBackend *b = (CudaBackend *)ctx;
  const bf16 *w16 = shadow_of(b, w, (size_t)V * D, "head_nll");
  head_rows_nll_cuda(b, nll, cb(x), w16, rows, targets, n, D, V, b->head_chunk);
}

// ---- init ---------------------------------------------------------------------------------------

static size_t cu_device_used(void *ctx) {
  size_t free_b = 0, total = 0;
  if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return total - free_b;
}

static void cu_profile(void *ctx, int on) {
  CudaBackend *b = (CudaBackend *)ctx;
  if (on) cuda_profile_reset(b);
  cuda_profile_enable(b, on);
}

static void cu_profile_report(void *ctx, FILE *f, int steps) { cuda_profile_report((CudaBackend *)ctx, f, steps); }
static size_t cu_mem_peak(void *ctx) { return cuda_mem_peak((CudaBackend *)ctx); }
static void cu_mem_reset_peak(void *ctx) { cuda_mem_reset_peak((CudaBackend *)ctx); }
static int cu_device_cc(void *ctx) { return cuda_device_cc(); }
static void cu_upload(void *ctx, void *dst, const void *src, size_t bytes) {
  cuda_upload((CudaBackend *)ctx, dst, src, bytes);
}
static void cu_download(void *ctx, void *dst, const void *src, size_t bytes) {
  cuda_download((CudaBackend *)ctx, dst, src, bytes);
}
// cudaHostAlloc pins the pages (the driver, not RLIMIT_MEMLOCK, bounds it); a failure is answered
// with NULL, and the caller falls back to pageable memory.
static void *cu_host_alloc(void *ctx, size_t bytes) {
  void *p = NULL;
  if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return p;
}
static void cu_host_free(void *ctx, void *p) {
  if (p) CUDA_CHECK(cudaFreeHost(p));
}
static void cu_set_input_saving(void *ctx, int on) { linear_fp4_set_save_inputs(((CudaBackend *)ctx)->lin, on); }
static int cu_linear_saves_input(void *ctx, LinearId id) {
  return linear_fp4_saves_input(((CudaBackend *)ctx)->lin, id);
}
static size_t cu_fp4_saved_bytes(void *ctx) { return linear_fp4_saved_bytes(((CudaBackend *)ctx)->lin); }

static void cu_library_report(void *ctx, FILE *f) {
  fprintf(f, "bench: cuDNN %zu loaded at run time\n", attention_cudnn_version());
}

// The exactness of the tiled Wgrad operands (precision.wgrad_2d) on this rank.
static void cu_end_report(void *ctx, int rank) {
  unsigned long long rounded, blocks;
  linear_fp4_tile_stats(((CudaBackend *)ctx)->lin, &rounded, &blocks);
  if (blocks)
    printf("FP8 Wgrad tiles (rank %d): %llu of %llu 32-blocks nonzero and outside the exact embedding range (%.3g%%)\n",
           rank, rounded, blocks, 100.0 * (double)rounded / (double)blocks);
}

static void fill_table(Ops *o, CudaBackend *b) {
  o->name = "cuda";
  o->act_bytes = sizeof(bf16);
  o->ctx = b;
  o->alloc = cu_alloc;
  o->release = cu_release;
  o->zero = cu_zero;
  o->upload = cu_upload;
  o->download = cu_download;
  o->host_alloc = cu_host_alloc;
  o->host_free = cu_host_free;
  o->acts_to_f32 = cu_acts_to_f32;
  o->sync = cu_sync;
  o->bind_params = cu_bind_params;
  o->params_changed = cu_params_changed;
  o->set_input_saving = cu_set_input_saving;
  o->linear_saves_input = cu_linear_saves_input;
  o->alloc_params = cu_alloc_params;
  o->shard_params = cu_shard_params;
  o->params_bf16 = cu_params_bf16;
  o->params_bf16_changed = cu_params_bf16_changed;
  o->set_step = cu_set_step;
  o->set_grad_overwrite = cu_set_grad_overwrite;
  o->grad_sumsq = cu_grad_sumsq;
  o->adamw = cu_adamw;
  o->embed_fwd = cu_embed_fwd;
  o->embed_bwd = cu_embed_bwd;
  o->rmsnorm_fwd = cu_rmsnorm_fwd;
  o->rmsnorm_bwd = cu_rmsnorm_bwd;
  o->matmul_fwd = cu_matmul_fwd;
  o->fuses_residual = cu_fuses_residual;
  o->matmul_residual_fwd = cu_matmul_residual_fwd;
  o->matmul_bwd = cu_matmul_bwd;
  o->rope_fwd = cu_rope_fwd;
  o->rope_bwd = cu_rope_bwd;
  o->attention_fwd = cu_attention_fwd;
  o->attention_bwd = cu_attention_bwd;
  o->swiglu_fwd = cu_swiglu_fwd;
  o->rmsnorm_fwd_into = cu_rmsnorm_fwd_into;
  o->swiglu_fwd_into = cu_swiglu_fwd_into;
  o->fuses_swiglu = cu_fuses_swiglu;
  o->matmul_swiglu_fwd = cu_matmul_swiglu_fwd;
  o->swiglu_bwd = cu_swiglu_bwd;
  o->residual_fwd = cu_residual_fwd;
  o->head_ce = cu_head_ce;
  o->head_nll = cu_head_nll;
  o->host_memory = 0;
  o->device_cc = cu_device_cc;
  o->set_recipe = cu_set_recipe;
  o->mem_peak = cu_mem_peak;
  o->mem_reset_peak = cu_mem_reset_peak;
  o->device_used = cu_device_used;
  o->fp4_saved_bytes = cu_fp4_saved_bytes;
  o->profile = cu_profile;
  o->profile_report = cu_profile_report;
  o->library_report = cu_library_report;
  o->end_report = cu_end_report;
}

const Ops *cuda_backend_init(int device, char *err, size_t errlen) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    snprintf(err, errlen, "%s", e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device found");
    (void)cudaGetLastError();
    return NULL;
  }
  if (device < 0 || device >= count) {
    snprintf(err, errlen, "CUDA device %d requested, but %d device(s) are present", device, count);
    return NULL;
  }
  int sms = 0;  // read here so that a broken device fails now, with its error
  if ((e = cudaSetDevice(device)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) {
    snprintf(err, errlen, "CUDA device %d: %s", device, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return NULL;
  }
  if (!cuda_stream()) {
    // A blocking stream: it still orders with anything a library queues on the legacy stream.
    cudaStream_t s;
    if ((e = cudaStreamCreate(&s)) != cudaSuccess) {
      snprintf(err, errlen, "CUDA device %d: cudaStreamCreate: %s", device, cudaGetErrorString(e));
      (void)cudaGetLastError();
      return NULL;
    }
    cuda_set_stream(s);
  }
  CudaBackend *b = (CudaBackend *)xcalloc(1, sizeof *b);
  b->prof = cuda_profiler_create();
  b->pm = param_memory_create();
  b->lin = linear_fp4_create(b);
  b->attn = attention_cudnn_create();
  b->wversion = 1;
  b->nkeep = -1;
  b->dgrad_transposed = 1;
  fill_table(&b->ops, b);
  return &b->ops;
}

CudaBackend *cuda_backend_of(const Ops *ops) {
  if (!ops || strcmp(ops->name, "cuda") || !ops->ctx || &((CudaBackend *)ops->ctx)->ops != ops)
    die("cuda_backend_of: table '%s' is not a CUDA backend instance", ops ? ops->name : "(null)");
  return (CudaBackend *)ops->ctx;
}

LinearFp4 *cuda_linear_fp4(CudaBackend *b) { return b->lin; }

void cuda_set_deterministic_attention(CudaBackend *b, int on) { attention_cudnn_set_deterministic(b->attn, on); }

const Ops *cuda_backend_open(const BackendOptions *o, char *err, size_t errlen) {
  int count = 0, device = o->local_rank;
  if (cudaGetDeviceCount(&count) != cudaSuccess) (void)cudaGetLastError(), count = 0;
  if (count > 0 && device >= count) {
    printf("LOCAL_RANK %d sees %d GPU%s: using device %d\n", device, count, count == 1 ? "" : "s", device % count);
    device %= count;
  }
  const Ops *ops = cuda_backend_init(device, err, errlen);
  if (!ops) return NULL;
  CudaBackend *b = (CudaBackend *)ops->ctx;
  // A GEMM algorithm timed afresh can differ in another process, and cuDNN's fast attention backward
  // adds with atomics: either makes a resumed run drift from the original (docs/determinism.md).
  const GemmChoice choice = o->gemm_choice;
  char perr[4096];
  if (lt_set_choice(choice, o->gemm_plans ? o->gemm_plans : "", perr, sizeof perr))
    die("parallel.gemm_plans: %s", perr);
  if (o->deterministic) attention_cudnn_set_deterministic(b->attn, 1);
  const LtContext *lt = lt_context();
  char gemms[2600];
  if (choice == GEMM_RECORDED)
    snprintf(gemms, sizeof gemms,
             "recorded in %s (%d for this GPU and cuBLASLt %llu; a new shape is timed once and added)", lt->plans.path,
             gemm_plans_count(&lt->plans, &lt->device), (unsigned long long)lt->device.lib);
  else if (choice == GEMM_HEURISTIC)
    snprintf(gemms, sizeof gemms,
             "cuBLASLt's heuristic #0, alike in every process (no record: set checkpoint.dir or parallel.gemm_plans to "
             "time them once and reuse them)");
  else
    snprintf(gemms, sizeof gemms, "timed in this process%s",
             o->deterministic ? " (as a run with a record runs them)" : "");
  printf("determinism: GEMM algorithms %s%s; attention backward %s\n", gemms,
         lt->autotune || choice == GEMM_HEURISTIC ? "" : " (GEMM_AUTOTUNE=0: heuristic #0)",
         o->deterministic ? "deterministic"
                          : "non-deterministic (parallel.deterministic: false: runs do not repeat bit for bit)");
  cuda_set_dgrad_transposed(b, o->dgrad_transposed);
  if (o->nvtx) cuda_nvtx_wrap(b);
  return ops;
}
