// model/cuda/profile.cu: the CUDA backend's per-op profiler (ops_cuda.h): CUDA event pairs around each
// op's GPU work, booked by name with the bytes and FLOPs the op moves, and the report against the
// copy bandwidth and each GEMM shape's measured ceiling.
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/gemm.h"
#include "fp4/gemm_fp4.h"
#include "model/cuda/ops_cuda.h"

enum { PROF_MAX_ENTRIES = 256, PROF_MAX_SHAPES = 8, PROF_MAX_PENDING = 4096 };

typedef struct {
  char name[40];
  ProfKind kind;
  double ms, bytes, flops;
  long calls;
  int nshapes, shapes_lost;  // GEMM shapes seen (beyond PROF_MAX_SHAPES: lost, no ceiling)
  GemmShape shape[PROF_MAX_SHAPES];
  double shape_flops[PROF_MAX_SHAPES];
} ProfEntry;

typedef struct {
  cudaEvent_t start, stop;
  int entry;  // -1 until cuda_prof_end
} ProfPending;

// The GEMM ceiling of each shape, measured once per profiler.
typedef struct {
  GemmShape s;
  double tflops;
} Ceiling;

struct CudaProfiler {
  int on;
  ProfEntry entry[PROF_MAX_ENTRIES];
  int nentries;
  ProfPending pending[PROF_MAX_PENDING];
  int npending;
  cudaEvent_t *events;  // created events not in use
  int nevents, capevents;
  Ceiling ceil[128];
  int nceil;
  double copy_tbps;  // the memory-bound ceiling, measured at the first report (cuda_copy_tbps; < 0: failed)
};

CudaProfiler *cuda_profiler_create(void) { return (CudaProfiler *)xcalloc(1, sizeof(CudaProfiler)); }

void cuda_profiler_destroy(CudaProfiler *p) {
  if (!p) return;
  for (int i = 0; i < p->nevents; i++) cudaEventDestroy(p->events[i]);
  free(p->events);
  free(p);
}

static cudaEvent_t event_get(CudaProfiler *p) {
  if (p->nevents) return p->events[--p->nevents];
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

static void event_put(CudaProfiler *p, cudaEvent_t e) {
  p->events = (cudaEvent_t *)grow_array(p->events, p->nevents, &p->capevents, sizeof *p->events);
  p->events[p->nevents++] = e;
}

// Waits for the recorded intervals and books their times.
static void prof_collect(CudaProfiler *p) {
  for (int i = 0; i < p->npending; i++) {
    ProfPending *pp = &p->pending[i];
    if (pp->entry >= 0) {
      float ms = 0;
      CUDA_CHECK(cudaEventSynchronize(pp->stop));
      CUDA_CHECK(cudaEventElapsedTime(&ms, pp->start, pp->stop));
      p->entry[pp->entry].ms += ms;
      event_put(p, pp->stop);
    }
    event_put(p, pp->start);
  }
  p->npending = 0;
}

void cuda_prof_collect(CudaBackend *b) {
  if (b->prof->npending) prof_collect(b->prof);
}

static int prof_entry(CudaProfiler *p, const char *name, ProfKind kind) {
  for (int i = 0; i < p->nentries; i++)
    if (!strcmp(p->entry[i].name, name)) return i;
  if (p->nentries == PROF_MAX_ENTRIES) die("cuda profiler: more than %d op names (at '%s')", PROF_MAX_ENTRIES, name);
  ProfEntry *e = &p->entry[p->nentries];
  memset(e, 0, sizeof *e);
  snprintf(e->name, sizeof e->name, "%s", name);
  e->kind = kind;
  return p->nentries++;
}

int cuda_prof_begin(CudaBackend *b) {
  CudaProfiler *p = b->prof;
  if (!p->on) return -1;
  if (p->npending == PROF_MAX_PENDING) prof_collect(p);
  ProfPending *pp = &p->pending[p->npending];
  pp->start = event_get(p);
  pp->entry = -1;
  CUDA_CHECK(cudaEventRecord(pp->start, cuda_stream()));
  return p->npending++;
}

void cuda_prof_end(CudaBackend *b, int mark, const char *name, ProfKind kind, double bytes, double flops,
                   const GemmShape *shape) {
  if (mark < 0) return;
  CudaProfiler *p = b->prof;
  ProfPending *pp = &p->pending[mark];
  pp->stop = event_get(p);
  CUDA_CHECK(cudaEventRecord(pp->stop, cuda_stream()));
  pp->entry = prof_entry(p, name, kind);
  ProfEntry *e = &p->entry[pp->entry];
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

void cuda_profile_enable(CudaBackend *b, int on) { b->prof->on = on; }

void cuda_profile_reset(CudaBackend *b) {
  prof_collect(b->prof);
  b->prof->nentries = 0;
}

static double gemm_ceiling(CudaProfiler *p, const GemmShape *s) {
  for (int i = 0; i < p->nceil; i++)
    if (!memcmp(&p->ceil[i].s, s, sizeof *s)) return p->ceil[i].tflops;
  double t = s->engine == GEMM_ENGINE_BF16   ? gemm_ceiling_tflops(s->out_fp32, s->a_t, s->b_t, s->M, s->N, s->K)
             : s->engine == GEMM_ENGINE_NONE ? 0
                                             : fp4_gemm_fp8_tflops(s->M, s->N, s->K, s->engine == GEMM_ENGINE_FP8_ABLK,
                                                                   s->engine == GEMM_ENGINE_FP8_BLK, s->out_fp32);
  if (p->nceil < 128) p->ceil[p->nceil++] = Ceiling{*s, t};
  return t;
}

// The rate an entry would have had if each of its shapes ran at its ceiling (TFLOP/s), or 0.
static double entry_ceiling_tflops(CudaProfiler *p, const ProfEntry *e) {
  if (e->kind != PROF_GEMM || e->shapes_lost || !e->nshapes) return 0;
  double seconds = 0;
  for (int s = 0; s < e->nshapes; s++) {
    double c = gemm_ceiling(p, &e->shape[s]);
    if (c <= 0) return 0;  // a shape without a measured ceiling
    seconds += e->shape_flops[s] / (c * 1e12);
  }
  return seconds > 0 ? e->flops / seconds / 1e12 : 0;
}

void cuda_profile_report(CudaBackend *b, FILE *f, int steps) {
  CudaProfiler *p = b->prof;
  prof_collect(p);
  if (steps < 1) steps = 1;
  int order[PROF_MAX_ENTRIES];
  double total = 0;
  for (int i = 0; i < p->nentries; i++) order[i] = i, total += p->entry[i].ms;
  for (int i = 1; i < p->nentries; i++)  // insertion sort by time, largest first
    for (int j = i; j > 0 && p->entry[order[j]].ms > p->entry[order[j - 1]].ms; j--) {
      int t = order[j];
      order[j] = order[j - 1], order[j - 1] = t;
    }
  if (p->copy_tbps == 0) {
    const double t = cuda_copy_tbps();
    p->copy_tbps = t > 0 ? t : -1;
  }
  fprintf(f, "%-22s %10s %10s %7s %16s %16s %7s\n", "op", "calls/step", "ms/step", "%time", "achieved", "ceiling",
          "%ceil");
  for (int r = 0; r < p->nentries; r++) {
    const ProfEntry *e = &p->entry[order[r]];
    double sec = e->ms * 1e-3, achieved, ceiling;
    const char *unit;
    if (e->kind == PROF_MEM) {
      achieved = sec > 0 ? e->bytes / sec / 1e12 : 0, ceiling = p->copy_tbps > 0 ? p->copy_tbps : 0, unit = "TB/s";
    } else {
      achieved = sec > 0 ? e->flops / sec / 1e12 : 0, ceiling = entry_ceiling_tflops(p, e), unit = "TFLOP/s";
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
  fp4_gemm_fp8_choices_report(f);  // which FP8 kernel each shape runs, when the recipe tunes it
}
