// model/cuda/ops_cuda.cu: the CUDA backend's operations table (see ops_cuda.h): device memory with
// usage tracking, the BF16 parameter shadow and the W^T copies for the dgrad, thin wrappers from
// the table's void* signatures to the typed kernels of the other .cu files, the per-op profiler, and
// the routing of FP4 linear layers to model/cuda/linear_fp4.cu.
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fp4/gemm_fp4.h"
#include "model/cuda/attention_cudnn.h"
#include "common/gemm.h"
#include "model/cuda/linear_fp4.h"
#include "model/cuda/ops_cuda.h"

// ---- memory -------------------------------------------------------------------------------------

typedef struct {
  void *p;
  size_t bytes;
} Allocation;
static Allocation *g_allocs;
static int g_nallocs, g_capallocs;
static size_t g_mem_used, g_mem_peak;

void *cuda_malloc_tracked(size_t bytes, const char *what) {
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
        g_mem_used / 1073741824.0);
  }
  g_allocs = (Allocation *)grow_array(g_allocs, g_nallocs, &g_capallocs, sizeof *g_allocs);
  g_allocs[g_nallocs++] = Allocation{p, asked};
  g_mem_used += asked;
  if (g_mem_used > g_mem_peak) g_mem_peak = g_mem_used;
  return p;
}

void cuda_free_tracked(void *p) {
  if (!p) return;
  for (int i = 0; i < g_nallocs; i++)
    if (g_allocs[i].p == p) {
      g_mem_used -= g_allocs[i].bytes;
      g_allocs[i] = g_allocs[--g_nallocs];
      CUDA_CHECK(cudaFree(p));
      return;
    }
  die("cuda backend: release(%p): not a pointer this backend allocated (or released twice)", p);
}

void *cuda_scratch(CudaScratch *s, size_t bytes, const char *what) {
  if (bytes > s->bytes) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // queued kernels may still use the old buffer
    cuda_free_tracked(s->p);
    s->p = cuda_malloc_tracked(bytes, what);
    s->bytes = bytes;
  }
  return s->p;
}

size_t cuda_mem_used(void) { return g_mem_used; }
size_t cuda_mem_peak(void) { return g_mem_peak; }
void cuda_mem_reset_peak(void) { g_mem_peak = g_mem_used; }

// Copies that touch the bound parameter buffer go through the parameter section below (it keeps
// the BF16 shadow in step and, once sharded, the fp32 values only where they exist).
static int params_upload(void *dst, const void *src, size_t bytes);
static void params_check_download(const void *src, size_t bytes);

// Through the stream, then a sync: the copy is done (and the host buffer reusable) on return,
// whatever kind of host memory it is.
void cuda_upload(void *dst, const void *src, size_t bytes) {
  if (!bytes || params_upload(dst, src, bytes)) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

void cuda_download(void *dst, const void *src, size_t bytes) {
  if (!bytes) return;
  params_check_download(src, bytes);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

// ---- profiling ----------------------------------------------------------------------------------

enum { PROF_MAX_ENTRIES = 256, PROF_MAX_SHAPES = 8, PROF_MAX_PENDING = 4096 };
static const double COPY_TBPS = 4.28;  // measured H200 device-to-device copy bandwidth (read + write)

typedef struct {
  char name[40];
  ProfKind kind;
  double ms, bytes, flops;
  long calls;
  int nshapes, shapes_lost;           // GEMM shapes seen (beyond PROF_MAX_SHAPES: lost, no ceiling)
  GemmShape shape[PROF_MAX_SHAPES];
  double shape_flops[PROF_MAX_SHAPES];
} ProfEntry;

typedef struct {
  cudaEvent_t start, stop;
  int entry;  // -1 until cuda_prof_end
} ProfPending;

static int g_prof_on;
static ProfEntry g_prof[PROF_MAX_ENTRIES];
static int g_nprof;
static ProfPending g_pending[PROF_MAX_PENDING];
static int g_npending;
static cudaEvent_t *g_events;  // created events not in use
static int g_nevents, g_capevents;

static cudaEvent_t event_get(void) {
  if (g_nevents) return g_events[--g_nevents];
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

static void event_put(cudaEvent_t e) {
  g_events = (cudaEvent_t *)grow_array(g_events, g_nevents, &g_capevents, sizeof *g_events);
  g_events[g_nevents++] = e;
}

// Waits for the recorded intervals and books their times.
static void prof_collect(void) {
  for (int i = 0; i < g_npending; i++) {
    ProfPending *pp = &g_pending[i];
    if (pp->entry >= 0) {
      float ms = 0;
      CUDA_CHECK(cudaEventSynchronize(pp->stop));
      CUDA_CHECK(cudaEventElapsedTime(&ms, pp->start, pp->stop));
      g_prof[pp->entry].ms += ms;
      event_put(pp->stop);
    }
    event_put(pp->start);
  }
  g_npending = 0;
}

static int prof_entry(const char *name, ProfKind kind) {
  for (int i = 0; i < g_nprof; i++)
    if (!strcmp(g_prof[i].name, name)) return i;
  if (g_nprof == PROF_MAX_ENTRIES) die("cuda profiler: more than %d op names (at '%s')", PROF_MAX_ENTRIES, name);
  ProfEntry *e = &g_prof[g_nprof];
  memset(e, 0, sizeof *e);
  snprintf(e->name, sizeof e->name, "%s", name);
  e->kind = kind;
  return g_nprof++;
}

int cuda_prof_begin(void) {
  if (!g_prof_on) return -1;
  if (g_npending == PROF_MAX_PENDING) prof_collect();
  ProfPending *pp = &g_pending[g_npending];
  pp->start = event_get();
  pp->entry = -1;
  CUDA_CHECK(cudaEventRecord(pp->start, cuda_stream()));
  return g_npending++;
}

void cuda_prof_end(int mark, const char *name, ProfKind kind, double bytes, double flops, const GemmShape *shape) {
  if (mark < 0) return;
  ProfPending *pp = &g_pending[mark];
  pp->stop = event_get();
  CUDA_CHECK(cudaEventRecord(pp->stop, cuda_stream()));
  pp->entry = prof_entry(name, kind);
  ProfEntry *e = &g_prof[pp->entry];
  e->calls++;
  e->bytes += bytes;
  e->flops += flops;
  if (shape) {
    int s = 0;
    while (s < e->nshapes && memcmp(&e->shape[s], shape, sizeof *shape)) s++;
    if (s == e->nshapes && s < PROF_MAX_SHAPES) e->shape[e->nshapes++] = *shape;
    if (s < e->nshapes) e->shape_flops[s] += flops;
    else e->shapes_lost = 1;
  }
}

void cuda_profile_enable(int on) { g_prof_on = on; }

void cuda_profile_reset(void) {
  prof_collect();
  g_nprof = 0;
}

// The GEMM ceiling of each shape, measured once per process.
typedef struct {
  GemmShape s;
  double tflops;
} Ceiling;
static Ceiling g_ceil[128];
static int g_nceil;

static double gemm_ceiling(const GemmShape *s) {
  for (int i = 0; i < g_nceil; i++)
    if (!memcmp(&g_ceil[i].s, s, sizeof *s)) return g_ceil[i].tflops;
  double t = s->engine == GEMM_ENGINE_BF16 ? gemm_ceiling_tflops(s->out_fp32, s->a_t, s->b_t, s->M, s->N, s->K)
             : s->engine == GEMM_ENGINE_NONE  ? 0
                                              : fp4_gemm_fp8_tflops(s->M, s->N, s->K, s->engine == GEMM_ENGINE_FP8_ABLK,
                                                                    s->engine == GEMM_ENGINE_FP8_BLK, s->out_fp32);
  if (g_nceil < 128) g_ceil[g_nceil++] = Ceiling{*s, t};
  return t;
}

// The rate an entry would have had if each of its shapes ran at its ceiling (TFLOP/s), or 0.
static double entry_ceiling_tflops(const ProfEntry *e) {
  if (e->kind != PROF_GEMM || e->shapes_lost || !e->nshapes) return 0;
  double seconds = 0;
  for (int s = 0; s < e->nshapes; s++) {
    double c = gemm_ceiling(&e->shape[s]);
    if (c <= 0) return 0;  // a shape without a measured ceiling
    seconds += e->shape_flops[s] / (c * 1e12);
  }
  return seconds > 0 ? e->flops / seconds / 1e12 : 0;
}

void cuda_profile_report(FILE *f, int steps) {
  prof_collect();
  if (steps < 1) steps = 1;
  int order[PROF_MAX_ENTRIES];
  double total = 0;
  for (int i = 0; i < g_nprof; i++) order[i] = i, total += g_prof[i].ms;
  for (int i = 1; i < g_nprof; i++)  // insertion sort by time, largest first
    for (int j = i; j > 0 && g_prof[order[j]].ms > g_prof[order[j - 1]].ms; j--) {
      int t = order[j];
      order[j] = order[j - 1], order[j - 1] = t;
    }
  fprintf(f, "%-22s %10s %10s %7s %16s %16s %7s\n", "op", "calls/step", "ms/step", "%time", "achieved", "ceiling",
          "%ceil");
  for (int r = 0; r < g_nprof; r++) {
    const ProfEntry *e = &g_prof[order[r]];
    double sec = e->ms * 1e-3, achieved, ceiling;
    const char *unit;
    if (e->kind == PROF_MEM) {
      achieved = sec > 0 ? e->bytes / sec / 1e12 : 0, ceiling = COPY_TBPS, unit = "TB/s";
    } else {
      achieved = sec > 0 ? e->flops / sec / 1e12 : 0, ceiling = entry_ceiling_tflops(e), unit = "TFLOP/s";
    }
    char ach[32], cei[32], pct[16];
    snprintf(ach, sizeof ach, "%.2f %s", achieved, unit);
    if (ceiling > 0) {
      snprintf(cei, sizeof cei, "%.2f %s", ceiling, unit);
      snprintf(pct, sizeof pct, "%.1f%%", 100 * achieved / ceiling);
    } else {
      snprintf(cei, sizeof cei, "-");
      snprintf(pct, sizeof pct, "-");
    }
    fprintf(f, "%-22s %10.2f %10.3f %6.1f%% %16s %16s %7s\n", e->name, (double)e->calls / steps, e->ms / steps,
            total > 0 ? 100 * e->ms / total : 0.0, ach, cei, pct);
  }
  fprintf(f, "%-22s %10s %10.3f %6.1f%%\n", "total", "", total / steps, 100.0);
}

void cuda_gemm(const char *name, void *out, int out_fp32, const void *A, int a_t, const void *B, int b_t, int M,
               int N, int K, float alpha, float beta) {
  int mk = cuda_prof_begin();
  gemm_bf16(out, out_fp32, A, a_t, B, b_t, M, N, K, alpha, beta);
  if (mk < 0) return;
  GemmShape s = {out_fp32, a_t, b_t, M, N, K, GEMM_ENGINE_BF16};
  double ob = out_fp32 ? 4 : 2, bytes = 2.0 * ((double)M * K + (double)K * N) + ob * M * N * (beta != 0 ? 2 : 1);
  cuda_prof_end(mk, name, PROF_GEMM, bytes, 2.0 * M * N * K, &s);
}

// ---- parameters and their BF16 shadow -----------------------------------------------------------

static float *g_params;  // the bound fp32 parameter buffer
static size_t g_nparams;
static bf16 *g_shadow;   // bf16(g_params[i]) at the same index
static int g_head_chunk; // cuda_head_ce_set_chunk; 0 = automatic
static uint64_t g_wversion = 1;  // bumped whenever the BF16 shadow may have changed (W^T, FP4 copies)

// Where the BF16 copy of w[0..count) lives; dies unless all of it is inside the bound buffer.
static bf16 *shadow_of(const float *w, size_t count, const char *what) {
  if (!g_shadow) die("cuda backend: %s: no parameter buffer is bound (bind_params was not called)", what);
  uintptr_t lo = (uintptr_t)g_params, hi = lo + g_nparams * sizeof(float), p = (uintptr_t)w;
  if (p < lo || p + count * sizeof(float) > hi || (p - lo) % sizeof(float))
    die("cuda backend: %s: weight %p (%zu floats) is not inside the bound parameter buffer %p (%zu floats)", what,
        (const void *)w, count, (void *)g_params, g_nparams);
  return g_shadow + (w - g_params);
}

const void *cuda_param_bf16(const float *w) { return shadow_of(w, 1, "cuda_param_bf16"); }

// ZeRO-1 master-weight sharding (Ops.shard_params): the float ranges of the bound buffer whose
// fp32 values still exist, sorted and disjoint; g_nkeep < 0 while the buffer is whole.
static size_t *g_keep_off, *g_keep_len;
static int g_nkeep = -1;
static CudaScratch g_up_stage;  // device staging for uploads into the sharded buffer

static int in_params(const void *p, size_t bytes) {
  uintptr_t lo = (uintptr_t)g_params, hi = lo + g_nparams * sizeof(float), a = (uintptr_t)p;
  return g_params && a >= lo && a < hi && a + bytes <= hi;
}

// Uploads into the bound buffer: the fp32 values go where they exist (all of them until it is
// sharded), and the BF16 shadow gets bf16() of every uploaded value, through a device staging
// buffer in pieces. The shadow is what the GEMMs, the embedding and the FP4 quantizers read, so a
// sharded rank that uploads the whole model (init, resume, init_from) computes with all of it.
static int params_upload(void *dst, const void *src, size_t bytes) {
  if (g_nkeep < 0 || !in_params(dst, bytes)) return 0;
  if (((uintptr_t)dst - (uintptr_t)g_params) % sizeof(float) || bytes % sizeof(float))
    die("cuda backend: upload of %zu bytes at %p: not whole floats of the sharded parameter buffer", bytes, dst);
  const size_t PIECE = (size_t)16 << 20;  // floats: 64 MiB of staging
  size_t off = (size_t)((float *)dst - g_params), n = bytes / sizeof(float);
  float *stage = (float *)cuda_scratch(&g_up_stage, (n < PIECE ? n : PIECE) * sizeof(float), "parameter upload staging");
  for (size_t a = 0; a < n; a += PIECE) {
    size_t k = n - a < PIECE ? n - a : PIECE, lo = off + a, hi = lo + k;
    CUDA_CHECK(cudaMemcpyAsync(stage, (const float *)src + a, k * sizeof(float), cudaMemcpyHostToDevice, cuda_stream()));
    f32_to_bf16_cuda(g_shadow + lo, stage, k);
    for (int i = 0; i < g_nkeep; i++) {
      size_t x = g_keep_off[i] > lo ? g_keep_off[i] : lo, y = g_keep_off[i] + g_keep_len[i];
      if (y > hi) y = hi;
      if (x < y)
        CUDA_CHECK(cudaMemcpyAsync(g_params + x, stage + (x - lo), (y - x) * sizeof(float), cudaMemcpyDeviceToDevice,
                                   cuda_stream()));
    }
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // the staging buffer is reused by the next piece
  }
  g_wversion++;
  return 1;
}

static int kept(size_t off, size_t n) {  // [off, off + n) lies inside one kept range
  for (int i = 0; i < g_nkeep; i++)
    if (off >= g_keep_off[i] && off + n <= g_keep_off[i] + g_keep_len[i]) return 1;
  return 0;
}

static void params_check_download(const void *src, size_t bytes) {
  if (g_nkeep < 0 || !in_params(src, bytes)) return;
  size_t off = (size_t)((const float *)src - g_params), n = (bytes + sizeof(float) - 1) / sizeof(float);
  if (!kept(off, n))
    die("cuda backend: download of parameters [%zu, %zu): this rank holds only its shard of the fp32 parameters "
        "(parallel.shard_master); gather them first (dist/zero.h zero_full_params)", off, off + n);
}

void cuda_head_ce_set_chunk(int tokens) {
  if (tokens < 0 || tokens % 8) die("cuda_head_ce_set_chunk: %d tokens: must be 0 (automatic) or a positive multiple of 8", tokens);
  g_head_chunk = tokens;
}

// ---- W^T copies for the dgrad GEMM (see ops_cuda.h) ----------------------------------------------

typedef struct {
  size_t offset;     // of W in the bound parameter buffer: the key, as for the BF16 shadow
  int in, out_dim;   // W is [out_dim, in]
  bf16 *t;           // W^T [in, out_dim]
  uint64_t version;  // g_wversion when t was transposed (0: never)
} WeightT;

static WeightT *g_wt;
static int g_nwt, g_capwt;
static int g_dgrad_transposed = 1;

static void wt_free_all(void) {
  for (int i = 0; i < g_nwt; i++) cuda_free_tracked(g_wt[i].t);
  g_nwt = 0;
}

// W^T of w [out_dim, in], re-transposed from the shadow when older than the current weights. A
// linear search: a few hundred weights, once per dgrad GEMM of milliseconds.
static const bf16 *transposed_of(const float *w, int in, int out_dim, const char *what) {
  const bf16 *w16 = shadow_of(w, (size_t)in * out_dim, what);
  size_t off = (size_t)(w - g_params);
  WeightT *e = NULL;
  for (int i = 0; i < g_nwt && !e; i++)
    if (g_wt[i].offset == off) e = &g_wt[i];
  if (e && (e->in != in || e->out_dim != out_dim))
    die("cuda backend: %s: the weight at parameter offset %zu is used as [out=%d, in=%d], but was [out=%d, in=%d] "
        "before (its W^T copy is per weight)", what, off, out_dim, in, e->out_dim, e->in);
  if (!e) {  // first dgrad of this weight (the first backward): allocate its copy
    g_wt = (WeightT *)grow_array(g_wt, g_nwt, &g_capwt, sizeof *g_wt);
    bf16 *t = (bf16 *)cuda_malloc_tracked((size_t)in * out_dim * sizeof(bf16), "a transposed BF16 weight (W^T)");
    e = &g_wt[g_nwt++];
    *e = WeightT{off, in, out_dim, t, 0};
  }
  if (e->version != g_wversion) {
    int mk = cuda_prof_begin();
    transpose_bf16_cuda(e->t, w16, out_dim, in);
    cuda_prof_end(mk, "transpose w", PROF_MEM, 4.0 * in * out_dim, 0, NULL);
    e->version = g_wversion;
  }
  return e->t;
}

void cuda_set_dgrad_transposed(int on) {
  if (on != 0 && on != 1) die("cuda_set_dgrad_transposed(%d): expected 0 or 1", on);
  if (!on) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // queued GEMMs may still read the copies
    wt_free_all();
  }
  g_dgrad_transposed = on;
}

const void *cuda_param_bf16_transposed(const float *w, int in, int out_dim) {
  return transposed_of(w, in, out_dim, "cuda_param_bf16_transposed");
}

// ---- the table's entries ------------------------------------------------------------------------

static const bf16 *cb(const void *p) { return (const bf16 *)p; }
static bf16 *mb(void *p) { return (bf16 *)p; }

static void *cu_alloc(size_t bytes) { return cuda_malloc_tracked(bytes, "Ops.alloc"); }

static void *cu_alloc_params(size_t bytes) {
  size_t mapped = 0;
  void *p = param_memory_alloc(bytes, &mapped);
  g_mem_used += mapped;
  if (g_mem_used > g_mem_peak) g_mem_peak = g_mem_used;
  return p;
}

static void cu_release(void *p) {
  if (p && p == (void *)g_params) {  // the model's parameters go: so do their shadow, W^T and FP4 copies
    wt_free_all();
    linear_fp4_release_weights();
    cuda_free_tracked(g_shadow);
    g_shadow = NULL, g_params = NULL, g_nparams = 0;
    free(g_keep_off), free(g_keep_len);
    g_keep_off = g_keep_len = NULL, g_nkeep = -1;
    cuda_free_tracked(g_up_stage.p);
    g_up_stage.p = NULL, g_up_stage.bytes = 0;
  }
  if (p && param_memory_owns(p)) g_mem_used -= param_memory_free(p);
  else cuda_free_tracked(p);
}

static int cmp_size(const void *a, const void *b) {
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  return x < y ? -1 : x > y;
}

static size_t cu_shard_params(const size_t *off, const size_t *len, int n) {
  if (!g_params) die("cuda backend: shard_params: no parameter buffer is bound");
  if (!param_memory_owns(g_params))
    die("cuda backend: shard_params: the bound parameter buffer was not allocated by alloc_params");
  if (g_nkeep >= 0) die("cuda backend: shard_params: the parameter buffer is already sharded");
  // Sort by offset and merge, so that kept() can test a span against one range.
  size_t *pairs = (size_t *)xmalloc(2 * (size_t)(n ? n : 1) * sizeof(size_t));
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (!len[i]) continue;
    if (off[i] > g_nparams || len[i] > g_nparams - off[i])
      die("cuda backend: shard_params: range [%zu, %zu) is outside the %zu parameters", off[i], off[i] + len[i],
          g_nparams);
    pairs[2 * m] = off[i], pairs[2 * m + 1] = len[i], m++;
  }
  qsort(pairs, m, 2 * sizeof(size_t), cmp_size);
  g_keep_off = (size_t *)xmalloc((m ? m : 1) * sizeof(size_t));
  g_keep_len = (size_t *)xmalloc((m ? m : 1) * sizeof(size_t));
  g_nkeep = 0;
  size_t *boff = (size_t *)xmalloc((m ? m : 1) * sizeof(size_t)), *blen = (size_t *)xmalloc((m ? m : 1) * sizeof(size_t));
  for (int i = 0; i < m; i++) {
    size_t a = pairs[2 * i], b = a + pairs[2 * i + 1];
    if (g_nkeep && a <= g_keep_off[g_nkeep - 1] + g_keep_len[g_nkeep - 1]) {
      size_t *e = &g_keep_len[g_nkeep - 1], end = g_keep_off[g_nkeep - 1] + *e;
      if (b > end) *e = b - g_keep_off[g_nkeep - 1];
    } else {
      g_keep_off[g_nkeep] = a, g_keep_len[g_nkeep] = b - a, g_nkeep++;
    }
  }
  for (int i = 0; i < g_nkeep; i++) boff[i] = g_keep_off[i] * sizeof(float), blen[i] = g_keep_len[i] * sizeof(float);
  size_t released = param_memory_keep(g_params, boff, blen, g_nkeep);
  g_mem_used -= released;
  free(pairs), free(boff), free(blen);
  return released;
}

static void *cu_params_bf16(void) {
  if (!g_shadow) die("cuda backend: params_bf16: no parameter buffer is bound");
  return g_shadow;
}

static void cu_params_bf16_changed(void) { g_wversion++; }

static void cu_zero(void *p, size_t bytes) {
  if (!bytes) return;
  int mk = cuda_prof_begin();
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_stream()));
  cuda_prof_end(mk, "zero", PROF_MEM, (double)bytes, 0, NULL);
}

static void cu_acts_to_f32(float *dst, const void *src, size_t n) {
  static bf16 *host;  // grow-only staging buffer
  static size_t cap;
  if (n > cap) {
    free(host);
    host = (bf16 *)xmalloc(n * sizeof(bf16));
    cap = n;
  }
  cuda_download(host, src, n * sizeof(bf16));
  for (size_t i = 0; i < n; i++) dst[i] = __bfloat162float(host[i]);
}

static void cu_sync(void) {
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  CUDA_CHECK(cudaGetLastError());  // a kernel fault surfaces here at the latest
  if (g_npending) prof_collect();
}

static void cu_bind_params(float *params, size_t n) {
  wt_free_all();  // keyed by offsets (and pointers) into the previous buffer
  linear_fp4_release_weights();
  cuda_free_tracked(g_shadow);
  g_shadow = (bf16 *)cuda_malloc_tracked(n * sizeof(bf16), "the BF16 parameter shadow");
  g_params = params, g_nparams = n;
}

static void cu_params_changed(void) {
  if (!g_shadow) die("cuda backend: params_changed: no parameter buffer is bound (bind_params was not called)");
  g_wversion++;  // every W^T copy is stale now
  int mk = cuda_prof_begin();
  size_t moved = 0;
  if (g_nkeep < 0) {
    f32_to_bf16_cuda(g_shadow, g_params, g_nparams), moved = g_nparams;
  } else {  // sharded: only the kept fp32 values exist; the rest of the shadow came by upload or all-gather
    for (int i = 0; i < g_nkeep; i++)
      f32_to_bf16_cuda(g_shadow + g_keep_off[i], g_params + g_keep_off[i], g_keep_len[i]), moved += g_keep_len[i];
  }
  cuda_prof_end(mk, "params to bf16", PROF_MEM, 6.0 * moved, 0, NULL);
}

static void cu_set_step(int64_t step, int micro) { linear_fp4_set_step(step, micro); }

// Ops.set_grad_overwrite: the weight-gradient GEMMs run with beta = 0 (no read of dW, no memset).
static int g_grad_overwrite;
static void cu_set_grad_overwrite(int on) { g_grad_overwrite = on; }

void cuda_set_recipe(const Recipe *r, int n_layers, uint64_t seed) { linear_fp4_set_recipe(r, n_layers, seed); }

static double cu_grad_sumsq(const float *g, size_t n) {
  int mk = cuda_prof_begin();
  double s = grad_sumsq_cuda(g, n);
  cuda_prof_end(mk, "grad sumsq", PROF_MEM, 4.0 * n, 0, NULL);
  return s;
}

static void cu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                     float eps, float weight_decay, float grad_scale, int64_t t) {
  // Parameters of the bound buffer get their BF16 copy refreshed in the same pass; a buffer
  // outside it (an optimizer test, say) has no copy to refresh.
  uintptr_t lo = (uintptr_t)g_params, hi = lo + g_nparams * sizeof(float), a = (uintptr_t)p;
  bf16 *p16 = g_shadow && a >= lo && a < hi ? shadow_of(p, n, "adamw") : NULL;
  if (p16) g_wversion++;  // W^T copies are re-transposed at their next dgrad (one counter for all)
  int mk = cuda_prof_begin();
  adamw_update_cuda(p, p16, g, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
  cuda_prof_end(mk, "adamw", PROF_MEM, (28.0 + (p16 ? 2 : 0)) * n, 0, NULL);
}

static void cu_embed_fwd(void *out, const int *tokens, const float *table, int N, int D, int V) {
  int mk = cuda_prof_begin();
  // The table's BF16 shadow when it is the model's: the same bits (the output is BF16), and the
  // only copy of the whole table on a rank whose fp32 parameters are sharded.
  const int shadow = in_params(table, (size_t)V * D * sizeof(float)) && g_shadow;
  if (shadow) embedding_forward_bf16_cuda(mb(out), tokens, g_shadow + (table - g_params), N, D, V);
  else embedding_forward_cuda(mb(out), tokens, table, N, D, V);
  cuda_prof_end(mk, "embed fwd", PROF_MEM, 4.0 * N + (shadow ? 4.0 : 6.0) * N * D, 0, NULL);
}

static void cu_embed_bwd(float *dtable, const void *dout, const int *tokens, int N, int D) {
  int mk = cuda_prof_begin();
  int distinct = embedding_backward_cuda(dtable, cb(dout), tokens, N, D);
  cuda_prof_end(mk, "embed bwd", PROF_MEM, 4.0 * N + 2.0 * N * D + 8.0 * distinct * D, 0, NULL);
}

static void cu_rmsnorm_fwd(void *out, float *rstd, const void *x, const float *w, int N, int D, float eps) {
  int mk = cuda_prof_begin();
  rmsnorm_forward_cuda(mb(out), rstd, cb(x), w, N, D, eps);
  cuda_prof_end(mk, "rmsnorm fwd", PROF_MEM, 4.0 * N * D + 4.0 * D + 4.0 * N, 0, NULL);
}

static void cu_rmsnorm_bwd(void *dx, float *dw, const void *dout, const void *x, const float *w, const float *rstd,
                           int N, int D) {
  int mk = cuda_prof_begin();
  int parts = rmsnorm_backward_cuda(mb(dx), dw, cb(dout), cb(x), w, rstd, N, D, g_grad_overwrite);
  // x and dout read, dx read and written; w, rstd; the partial sums written and read; dw updated
  cuda_prof_end(mk, "rmsnorm bwd", PROF_MEM, 8.0 * N * D + 4.0 * D + 4.0 * N + 8.0 * parts * D + 8.0 * D, 0, NULL);
}

// A linear the recipe puts in FP4 goes to linear_fp4.cu (with its weight's BF16 shadow and the
// weights version its quantized copies are checked against); the rest runs in BF16 here.
static void cu_matmul_fwd(void *ctx, LinearId id, void *out, const void *x, const float *w, int N, int in,
                          int out_dim) {
  if (linear_fp4_active(id)) {
    const bf16 *w16 = shadow_of(w, (size_t)in * out_dim, "FP4 matmul_fwd");
    linear_fp4_forward(id, mb(out), cb(x), w, w16, g_wversion, N, in, out_dim);
    return;
  }
  char name[40];
  snprintf(name, sizeof name, "gemm fwd %s", linear_kind_name(id.kind));
  const bf16 *w16 = shadow_of(w, (size_t)in * out_dim, name);
  cuda_gemm(name, out, 0, x, 0, w16, 1, N, out_dim, in, 1.0f, 0.0f);
}

static void cu_matmul_bwd(void *ctx, LinearId id, void *dx, float *dw, const void *dout, const void *x,
                          const float *w, int N, int in, int out_dim, int dx_accumulate) {
  if (linear_fp4_active(id)) {
    const bf16 *w16 = shadow_of(w, (size_t)in * out_dim, "FP4 matmul_bwd");
    linear_fp4_backward(id, mb(dx), dw, cb(dout), cb(x), w, w16, g_wversion, N, in, out_dim, dx_accumulate,
                        g_grad_overwrite);
    return;
  }
  char name[40];
  if (dx && g_dgrad_transposed) {  // dX [N, in] (+)= dY [N, out] (W^T [in, out])^T: the forward's TN layout
    snprintf(name, sizeof name, "gemm dgrad %s", linear_kind_name(id.kind));
    const bf16 *wt = transposed_of(w, in, out_dim, name);
    cuda_gemm(name, dx, 0, dout, 0, wt, 1, N, in, out_dim, 1.0f, dx_accumulate ? 1.0f : 0.0f);
  } else if (dx) {  // dX (+)= dY W on W [out, in] itself
    snprintf(name, sizeof name, "gemm dgrad %s NN", linear_kind_name(id.kind));
    const bf16 *w16 = shadow_of(w, (size_t)in * out_dim, name);
    cuda_gemm(name, dx, 0, dout, 0, w16, 0, N, in, out_dim, 1.0f, dx_accumulate ? 1.0f : 0.0f);
  }
  if (dw) {  // dW [out, in] (+)= dout^T x, into the fp32 gradient
    snprintf(name, sizeof name, "gemm wgrad %s", linear_kind_name(id.kind));
    cuda_gemm(name, dw, 1, dout, 1, x, 0, out_dim, in, N, 1.0f, g_grad_overwrite ? 0.0f : 1.0f);
  }
}

static double rope_bytes(int B, int T, int n_heads, int hd) {
  return 4.0 * B * T * n_heads * hd + 4.0 * T * hd;  // x read + written (BF16); cos + sin [T, hd/2] fp32
}

static void cu_rope_fwd(void *x, const float *cos_t, const float *sin_t, int B, int T, int n_heads, int hd) {
  int mk = cuda_prof_begin();
  rope_rotate_cuda(mb(x), cos_t, sin_t, B, T, n_heads, hd, 1);
  cuda_prof_end(mk, "rope fwd", PROF_MEM, rope_bytes(B, T, n_heads, hd), 0, NULL);
}

static void cu_rope_bwd(void *dx, const float *cos_t, const float *sin_t, int B, int T, int n_heads, int hd) {
  int mk = cuda_prof_begin();
  rope_rotate_cuda(mb(dx), cos_t, sin_t, B, T, n_heads, hd, -1);
  cuda_prof_end(mk, "rope bwd", PROF_MEM, rope_bytes(B, T, n_heads, hd), 0, NULL);
}

// Causal attention FLOPs, as FlashAttention's papers (and docs/formats.md §3's 534 TFLOP/s) count them:
// each of the two forward matmuls (QK^T, PV) is 2*T*T*hd/2 per (sequence, head); the backward has
// five (QK^T recomputed, dV, dP, dQ, dK).
static double attn_flops(int B, int T, int H, int hd, int matmuls) { return matmuls * (double)B * H * T * T * hd; }

static void cu_attention_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T, int H,
                             int KV, int hd) {
  int mk = cuda_prof_begin();
  attention_cudnn_fwd(out, lse, q, k, v, B, T, H, KV, hd);
  double bytes = 2.0 * B * T * (2.0 * H + 2.0 * KV) * hd + 4.0 * B * H * T;
  cuda_prof_end(mk, "attention fwd", PROF_ATTN, bytes, attn_flops(B, T, H, hd, 2), NULL);
}

static void cu_attention_bwd(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                             const void *v, const void *out, const float *lse, int B, int T, int H, int KV, int hd) {
  int mk = cuda_prof_begin();
  attention_cudnn_bwd(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, KV, hd);
  double bytes = 2.0 * B * T * (4.0 * H + 4.0 * KV) * hd + 4.0 * B * H * T;
  cuda_prof_end(mk, "attention bwd", PROF_ATTN, bytes, attn_flops(B, T, H, hd, 5), NULL);
}

static void cu_swiglu_fwd(void *out, const void *gate, const void *up, size_t n) {
  int mk = cuda_prof_begin();
  swiglu_forward_cuda(mb(out), cb(gate), cb(up), n);
  cuda_prof_end(mk, "swiglu fwd", PROF_MEM, 6.0 * n, 0, NULL);
}

static void cu_rmsnorm_fwd_into(LinearId leader, void *out, float *rstd, const void *x, const float *w, int N, int D,
                                float eps) {
  if (linear_fp4_fusable(leader)) {
    int mk = cuda_prof_begin();
    rmsnorm_forward_cuda(NULL, rstd, cb(x), w, N, D, eps);  // rstd only: the producer makes the output
    cuda_prof_end(mk, "rmsnorm fwd (rstd only)", PROF_MEM, 2.0 * N * D + 4.0 * N, 0, NULL);
    if (linear_fp4_fused_rmsnorm(leader, out, cb(x), rstd, w, N, D)) return;
  }
  cu_rmsnorm_fwd(out, rstd, x, w, N, D, eps);
}

static void cu_swiglu_fwd_into(LinearId leader, void *out, const void *gate, const void *up, int N, int F) {
  if (linear_fp4_fused_swiglu(leader, out, cb(gate), cb(up), N, F)) return;
  cu_swiglu_fwd(out, gate, up, (size_t)N * F);
}

static void cu_swiglu_bwd(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n) {
  int mk = cuda_prof_begin();
  swiglu_backward_cuda(mb(dgate), mb(dup), cb(dout), cb(gate), cb(up), n);
  cuda_prof_end(mk, "swiglu bwd", PROF_MEM, 10.0 * n, 0, NULL);
}

static void cu_residual_fwd(void *out, const void *a, const void *b, size_t n) {
  int mk = cuda_prof_begin();
  residual_forward_cuda(mb(out), cb(a), cb(b), n);
  cuda_prof_end(mk, "residual", PROF_MEM, 6.0 * n, 0, NULL);
}

// The graph's `chunk` and `scratch` suit the CPU (a few MB of fp32 logits); the GPU wants
// thousands of tokens per GEMM, so crossentropy.cu chunks with its own scratch instead.
static float cu_head_ce(void *dx, float *dw, float *scratch, const void *x, const float *w, const int *targets,
                        int N, int D, int V, int chunk, int ignore_index, float dloss) {
  const bf16 *w16 = shadow_of(w, (size_t)V * D, "head_ce");
  return head_crossentropy_cuda(mb(dx), dw, cb(x), w16, targets, N, D, V, ignore_index, dloss, g_head_chunk,
                                g_grad_overwrite, NULL);
}

static void cu_head_nll(float *nll, float *scratch, const void *x, const float *w, const int *targets, int N, int D,
                        int V, int chunk, int ignore_index) {
  const bf16 *w16 = shadow_of(w, (size_t)V * D, "head_nll");
  head_crossentropy_cuda(NULL, NULL, cb(x), w16, targets, N, D, V, ignore_index, 0.0f, g_head_chunk, 0, nll);
}

// ---- init ---------------------------------------------------------------------------------------

static Ops g_ops;

static size_t cu_device_used(void) {
  size_t free_b = 0, total = 0;
  if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return total - free_b;
}

static void cu_profile(int on) {
  if (on) cuda_profile_reset();
  cuda_profile_enable(on);
}

static void cu_library_report(FILE *f) { fprintf(f, "bench: cuDNN %zu loaded at run time\n", attention_cudnn_version()); }

// The exactness of the tiled Wgrad operands (precision.wgrad_2d) on this rank.
static void cu_end_report(int rank) {
  unsigned long long rounded, blocks;
  linear_fp4_tile_stats(&rounded, &blocks);
  if (blocks)
    printf("FP8 Wgrad tiles (rank %d): %llu of %llu 32-blocks nonzero and outside the exact embedding range (%.3g%%)\n",
           rank, rounded, blocks, 100.0 * (double)rounded / (double)blocks);
}

static void fill_table(Ops *o) {
  o->name = "cuda";
  o->act_bytes = sizeof(bf16);
  o->ctx = NULL;
  o->alloc = cu_alloc;
  o->release = cu_release;
  o->zero = cu_zero;
  o->upload = cuda_upload;
  o->download = cuda_download;
  o->acts_to_f32 = cu_acts_to_f32;
  o->sync = cu_sync;
  o->bind_params = cu_bind_params;
  o->params_changed = cu_params_changed;
  o->set_input_saving = linear_fp4_set_save_inputs;
  o->linear_saves_input = linear_fp4_saves_input;
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
  o->matmul_bwd = cu_matmul_bwd;
  o->rope_fwd = cu_rope_fwd;
  o->rope_bwd = cu_rope_bwd;
  o->attention_fwd = cu_attention_fwd;
  o->attention_bwd = cu_attention_bwd;
  o->swiglu_fwd = cu_swiglu_fwd;
  o->rmsnorm_fwd_into = cu_rmsnorm_fwd_into;
  o->swiglu_fwd_into = cu_swiglu_fwd_into;
  o->swiglu_bwd = cu_swiglu_bwd;
  o->residual_fwd = cu_residual_fwd;
  o->head_ce = cu_head_ce;
  o->head_nll = cu_head_nll;
  o->host_memory = 0;
  o->device_cc = cuda_device_cc;
  o->set_recipe = cuda_set_recipe;
  o->mem_peak = cuda_mem_peak;
  o->mem_reset_peak = cuda_mem_reset_peak;
  o->device_used = cu_device_used;
  o->fp4_saved_bytes = linear_fp4_saved_bytes;
  o->profile = cu_profile;
  o->profile_report = cuda_profile_report;
  o->library_report = cu_library_report;
  o->end_report = cu_end_report;
}

int cuda_device_cc(void) {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return 0;
  return major * 10 + minor;
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
  fill_table(&g_ops);
  return &g_ops;
}

const Ops *cuda_backend_open(const BackendOptions *o, char *err, size_t errlen) {
  int count = 0, device = o->local_rank;
  if (cudaGetDeviceCount(&count) != cudaSuccess) (void)cudaGetLastError(), count = 0;
  if (count > 0 && device >= count) {
    printf("LOCAL_RANK %d sees %d GPU%s: using device %d\n", device, count, count == 1 ? "" : "s", device % count);
    device %= count;
  }
  const Ops *ops = cuda_backend_init(device, err, errlen);
  if (!ops) return NULL;
  if (o->deterministic) {
    // Timing-based autotuning can pick another GEMM algorithm in another process, and cuDNN's fast
    // attention backward adds with atomics: both would make a resumed run drift from the original.
    setenv("GEMM_AUTOTUNE", "0", 1);
    attention_cudnn_set_deterministic(1);
  }
  cuda_set_dgrad_transposed(o->dgrad_transposed);
  return ops;
}
