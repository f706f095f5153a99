// common/lt_tune.cu: see lt_tune.h.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "common/lt_tune.h"

static LtContext g_ctx;

static_assert(sizeof(cublasLtMatmulAlgo_t) == GEMM_PLAN_VALUE_WORDS * sizeof(uint64_t),
              "a recorded value holds one cublasLtMatmulAlgo_t");
static_assert((int)LT_KEY_INTS == (int)GEMM_PLAN_KEY_INTS, "a record's key is a plan's key");

// GEMM_AUTOTUNE=0 in the environment: heuristic #0 whatever the choice.
static int autotune_env(void) {
  const char *e = getenv("GEMM_AUTOTUNE");
  if (e && strcmp(e, "0") != 0 && strcmp(e, "1") != 0)
    die("environment variable GEMM_AUTOTUNE='%s': expected 0 (heuristic #0) or 1 (time the top candidates)", e);
  return !(e && strcmp(e, "0") == 0);
}

const LtContext *lt_context(void) {
  if (g_ctx.handle) return &g_ctx;
  g_ctx.autotune = autotune_env();
  g_ctx.untimed = g_ctx.autotune ? NULL : "GEMM_AUTOTUNE=0";
  g_ctx.choice = GEMM_TIMED;
  g_ctx.ws_bytes = 64u << 20;
  CUBLAS_CHECK(cublasLtCreate(&g_ctx.handle));
  CUDA_CHECK(cudaMalloc(&g_ctx.ws, g_ctx.ws_bytes));
  return &g_ctx;
}

void lt_context_release(void) {
  if (!g_ctx.handle) return;
  CUDA_CHECK(cudaFree(g_ctx.ws));
  CUBLAS_CHECK(cublasLtDestroy(g_ctx.handle));
  gemm_plans_free(&g_ctx.plans);
  memset(&g_ctx, 0, sizeof g_ctx);
}

int lt_set_choice(GemmChoice choice, const char *path, char *err, size_t errlen) {
  lt_context();
  GemmPlans plans = {};
  if (choice == GEMM_RECORDED && !path[0]) return set_err(err, errlen, "lt_set_choice: a record needs a path");
  if (choice == GEMM_RECORDED && gemm_plans_load(&plans, path, err, errlen)) return -1;
  gemm_plans_free(&g_ctx.plans);
  g_ctx.plans = plans;
  g_ctx.choice = choice;
  g_ctx.autotune = autotune_env() && choice != GEMM_HEURISTIC;
  g_ctx.untimed = g_ctx.autotune             ? NULL
                  : choice == GEMM_HEURISTIC ? "parallel.deterministic without a record: heuristic #0"
                                             : "GEMM_AUTOTUNE=0";
  // The record's device: the GPU's name (tabs and newlines would break the file's lines) and
  // compute capability, and cuBLASLt's version (an algorithm is valid for the library that made it).
  int dev;
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  GemmPlanDevice *d = &g_ctx.device;
  snprintf(d->gpu, sizeof d->gpu, "%s", prop.name[0] ? prop.name : "unnamed GPU");
  for (char *c = d->gpu; *c; c++)
    if (*c == '\t' || *c == '\n' || *c == '\r') *c = ' ';
  d->cc = prop.major * 10 + prop.minor;
  d->lib = (uint64_t)cublasLtGetVersion();
  return 0;
}

// Takes the record's lock (nested within the process), merging what other processes saved since.
static void record_lock(void) {
  char err[2560];
  if (gemm_plans_lock(&g_ctx.plans, err, sizeof err)) die("parallel.gemm_plans: %s", err);
}

const uint64_t *lt_recorded(const int *key) {
  if (g_ctx.choice != GEMM_RECORDED) return NULL;
  const uint64_t *v = gemm_plans_find(&g_ctx.plans, &g_ctx.device, key);
  if (v) return v;
  // Another process sharing the record may have chosen it since we read it: look again under the
  // lock, and on a miss keep the lock until lt_record, so that no other process chooses it meanwhile.
  record_lock();
  v = gemm_plans_find(&g_ctx.plans, &g_ctx.device, key);
  if (v) gemm_plans_unlock(&g_ctx.plans);
  return v;
}

void lt_record(const int *key, const uint64_t *value) {
  if (g_ctx.choice != GEMM_RECORDED) return;
  if (g_ctx.plans.lock_depth == 0) die("lt_record: no miss of lt_recorded holds the record's lock");
  char err[2560];
  if (value && (gemm_plans_put(&g_ctx.plans, &g_ctx.device, key, value, err, sizeof err) ||
                gemm_plans_save(&g_ctx.plans, err, sizeof err)))
    die("%s: the GEMM choices could not be recorded, so a later process could not repeat this run; free the "
        "space or fix the permissions (or set parallel.gemm_plans elsewhere)",
        err);
  gemm_plans_unlock(&g_ctx.plans);
}

// Up to `max` heuristic results with state SUCCESS, in the heuristic's order, for buffers aligned to
// `align` bytes and a workspace of ws_bytes. Split-K only with fp32 partial sums reduced in a fixed
// order: the "in place" and "output type" schemes would sum partials in a BF16 output (and "in
// place" orders them at run time), so results would be neither fp32-accurate nor deterministic.
// *status gets the heuristic call's status (for messages). Returns the count (0 if none).
static int lt_candidates(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                         cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lout, int align, size_t ws_bytes,
                         cublasLtMatmulHeuristicResult_t *res, int max, cublasStatus_t *status) {
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
  // The default assumes 256-byte aligned buffers; slices of larger buffers may be less aligned.
  uint32_t a = (uint32_t)align;
  const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; i++) CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], &a, sizeof a));
  uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                                    sizeof reductions));
  int n = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lout, lout, pref, max, res, &n);
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (status) *status = st;
  int valid = 0;  // keep the results whose state is SUCCESS, in the heuristic's order
  for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < n; i++)
    if (res[i].state == CUBLAS_STATUS_SUCCESS) res[valid++] = res[i];
  return valid;
}

// Mean milliseconds per call of candidate i over `reps` back-to-back calls, or -1 if it refuses to run.
static double time_calls(TuneRun run, void *ctx, int i, int reps) {
  static cudaEvent_t ev[2];
  if (!ev[0]) {
    CUDA_CHECK(cudaEventCreate(&ev[0]));
    CUDA_CHECK(cudaEventCreate(&ev[1]));
  }
  CUDA_CHECK(cudaEventRecord(ev[0], cuda_stream()));
  for (int r = 0; r < reps; r++)
    if (run(ctx, i)) return -1;
  CUDA_CHECK(cudaEventRecord(ev[1], cuda_stream()));
  CUDA_CHECK(cudaEventSynchronize(ev[1]));
  CUDA_CHECK_LAUNCH();
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
  return ms / reps;
}

int tune_pick_fastest(TuneRun run, void *ctx, int n, int rounds, double target_ms, double *ms) {
  int reps[16];
  if (n > 16) n = 16;
  for (int i = 0; i < n; i++) {  // warm-up call; its time (first-call costs included) sizes the passes
    ms[i] = time_calls(run, ctx, i, 1);
    double r = ms[i] > 0 ? target_ms / ms[i] : 1;
    reps[i] = r < 1 ? 1 : r > 200 ? 200 : (int)r;
  }
  for (int round = 0; round < rounds; round++)
    for (int i = 0; i < n; i++) {
      if (ms[i] < 0) continue;
      double t = time_calls(run, ctx, i, reps[i]);
      if (t > 0 && (round == 0 || t < ms[i])) ms[i] = t;  // round 0 replaces the warm-up's time
    }
  int best = -1;
  for (int i = 0; i < n; i++)
    if (ms[i] > 0 && (best < 0 || ms[i] < ms[best])) best = i;
  return best;
}

// cuBLASLt's candidates as tune_pick_fastest's: candidate i is heuristic result i.
typedef struct {
  LtLaunch launch;
  void *ctx;
  const cublasLtMatmulHeuristicResult_t *res;
} AlgoRun;
static int algo_run(void *ctx, int i) {
  const AlgoRun *a = (const AlgoRun *)ctx;
  return a->launch(a->ctx, &a->res[i].algo) != CUBLAS_STATUS_SUCCESS;
}
static int lt_pick_fastest(LtLaunch launch, void *ctx, const cublasLtMatmulHeuristicResult_t *res, int n, int rounds,
                           double target_ms, double *ms) {
  AlgoRun a = {launch, ctx, res};
  return tune_pick_fastest(algo_run, &a, n, rounds, target_ms, ms);
}

// ---- the plan cache -----------------------------------------------------------------------------

static LtPlan **g_plans;  // one allocation per plan: a plan's address outlives the array's growth
static int g_nplans, g_capplans;

LtPlan *lt_plan_get(const int *key, int n, int *created) {
  if (n < 1 || n > LT_KEY_INTS) die("lt_plan_get: a key of %d ints (1..%d)", n, (int)LT_KEY_INTS);
  int k[LT_KEY_INTS] = {0};
  memcpy(k, key, (size_t)n * sizeof(int));
  for (int i = 0; i < g_nplans; i++)
    if (memcmp(g_plans[i]->key, k, sizeof k) == 0) {
      *created = 0;
      return g_plans[i];
    }
  g_plans = (LtPlan **)grow_array(g_plans, g_nplans, &g_capplans, sizeof *g_plans);
  LtPlan *p = (LtPlan *)xmalloc(sizeof *p);
  memset(p, 0, sizeof *p);
  memcpy(p->key, k, sizeof k);
  g_plans[g_nplans++] = p;
  *created = 1;
  return p;
}

int lt_plan_count(void) { return g_nplans; }
const LtPlan *lt_plan_at(int i) { return i >= 0 && i < g_nplans ? g_plans[i] : NULL; }

void lt_plan_destroy(LtPlan *p) {
  if (p->lout) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lout));
  if (p->lb) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lb));
  if (p->la) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->la));
  if (p->desc) CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
  p->lout = p->lb = p->la = NULL;
  p->desc = NULL;
}

void lt_plans_release(void) {
  for (int i = 0; i < g_nplans; i++) {
    lt_plan_destroy(g_plans[i]);
    free(g_plans[i]);
  }
  free(g_plans);
  g_plans = NULL;
  g_nplans = g_capplans = 0;
}

// GEMM_RECORDED: takes the recorded algorithm of p's key when cuBLASLt accepts it for p's
// descriptors and our workspace: returns 1. Else 0 with the record's lock held for lt_record: on a
// miss (lt_recorded), or when cuBLASLt refuses it (reported; the new choice replaces it).
static int use_recorded(LtPlan *p, const LtContext *lt) {
  const uint64_t *v = lt_recorded(p->key);
  if (!v) return 0;
  cublasLtMatmulAlgo_t algo;
  memcpy(&algo, v, sizeof algo);
  cublasLtMatmulHeuristicResult_t r;
  memset(&r, 0, sizeof r);
  cublasStatus_t st = cublasLtMatmulAlgoCheck(lt->handle, p->desc, p->la, p->lb, p->lout, p->lout, &algo, &r);
  if (st == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= lt->ws_bytes) {
    p->algo = algo, p->n_candidates = 1, p->chosen = 0, p->untuned = "recorded";
    return 1;
  }
  char key[160];
  int o = 0;
  for (int i = 0; i < LT_KEY_INTS; i++) o += snprintf(key + o, sizeof key - o, "%s%d", i ? " " : "", p->key[i]);
  fprintf(stderr,
          "warning: gemm_plans '%s': cuBLASLt refuses the recorded algorithm of plan [%s] (%s, workspace %zu of "
          "%zu bytes): choosing and recording another; this process no longer repeats the ones that used it\n",
          lt->plans.path, key, cublasLtGetStatusName(st), r.workspaceSize, lt->ws_bytes);
  record_lock();
  return 0;
}

// The choice without a record: heuristic #0, or the fastest timed (see lt_plan_choose).
static void choose_fresh(LtPlan *p, int max, LtLaunch launch, void *ctx, void **out, size_t out_bytes, int accumulate) {
  cublasLtMatmulHeuristicResult_t res[16];
  const LtContext *lt = lt_context();
  if (max > 16) max = 16;
  int n = lt_candidates(lt->handle, p->desc, p->la, p->lb, p->lout, p->align, lt->ws_bytes, res, lt->autotune ? max : 1,
                        NULL);
  p->n_candidates = n, p->chosen = 0, p->ms = p->ms_h0 = 0, p->untuned = NULL;
  if (n == 0) return;
  p->algo = res[0].algo;
  if (!lt->autotune) {
    p->untuned = lt->untimed;
    return;
  }
  if (!launch) {
    p->untuned = "no call to time";
    return;
  }
  if (n < 2) {
    p->untuned = "one candidate";
    return;
  }
  cudaStreamCaptureStatus cap;
  CUDA_CHECK(cudaStreamIsCapturing(cuda_stream(), &cap));
  if (cap != cudaStreamCaptureStatusNone) {
    p->untuned = "first call inside a CUDA graph capture";
    return;
  }
  void *real = *out;
  if (accumulate) {
    void *copy;
    if (cudaMalloc(&copy, out_bytes) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the out-of-memory error: tuning is an optimization
      p->untuned = "no memory for a scratch output";
      return;
    }
    CUDA_CHECK(cudaMemcpyAsync(copy, real, out_bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
    *out = copy;
  }
  double ms[16];
  int best = lt_pick_fastest(launch, ctx, res, n, LT_TUNE_ROUNDS, LT_TUNE_TARGET_MS, ms);
  if (accumulate) {
    CUDA_CHECK(cudaFree(*out));
    *out = real;
  }
  if (best < 0) {
    p->untuned = "no candidate ran";
    return;
  }
  p->chosen = best, p->algo = res[best].algo, p->ms = ms[best], p->ms_h0 = ms[0];
}

void lt_plan_choose(LtPlan *p, int max, LtLaunch launch, void *ctx, void **out, size_t out_bytes, int accumulate) {
  const LtContext *lt = lt_context();
  p->ms = p->ms_h0 = 0;
  const int recording = lt->choice == GEMM_RECORDED;
  if (recording && use_recorded(p, lt)) return;
  choose_fresh(p, max, launch, ctx, out, out_bytes, accumulate);
  // Whatever was chosen, timed or not (a first call inside a graph capture, one candidate, no call to
  // time), is what this run computed with: later processes must take the same.
  if (recording) lt_record(p->key, p->n_candidates > 0 ? p->algo.data : NULL);
}

double lt_plan_best_ms(const LtPlan *p, int max, LtLaunch launch, void *ctx, int rounds, double target_ms, int *n,
                       cublasStatus_t *status) {
  cublasLtMatmulHeuristicResult_t res[16];
  double ms[16];
  const LtContext *lt = lt_context();
  int got = lt_candidates(lt->handle, p->desc, p->la, p->lb, p->lout, p->align, lt->ws_bytes, res, max > 16 ? 16 : max,
                          status);
  if (n) *n = got;
  int best = got ? lt_pick_fastest(launch, ctx, res, got, rounds, target_ms, ms) : -1;
  return best < 0 ? -1 : ms[best];
}

int lt_alignment(const char *who, const void *const *ptrs, const char *const *names, int n) {
  uintptr_t bits = 0;
  for (int i = 0; i < n; i++) {
    if (!ptrs[i] || ((uintptr_t)ptrs[i] & 15))
      die("%s: %s = %p must be non-NULL and 16-byte aligned", who, names[i], ptrs[i]);
    bits |= (uintptr_t)ptrs[i];
  }
  int align = 256;
  while (bits & (uintptr_t)(align - 1)) align >>= 1;
  return align;
}
