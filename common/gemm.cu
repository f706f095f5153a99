// common/gemm.cu: BF16 GEMMs through cuBLASLt with a per-shape plan cache and autotuning. See gemm.h.
//
// cuBLASLt is column-major. A row-major [R,C] matrix is the column-major [C,R] matrix with the same
// bytes, so instead of out = op(A) op(B) we ask cuBLASLt for out^T = op(B)^T op(A)^T, which it
// writes column-major, i.e. exactly our row-major out. Hence cuBLAS "A" is our B, cuBLAS "B" is our
// A, and the cuBLAS problem is m = N, n = M, k = K.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "common/gemm.h"
#include "common/lt_tune.h"

enum { CANDIDATES = 8 };  // heuristic algorithms timed per shape

// Timing effort. Each candidate gets one warm-up call, then `rounds` passes of enough back-to-back
// calls to last about `target_ms`; a candidate keeps its best pass. Passes interleave the
// candidates, so clock ramps and noise hit them alike.
static const int TUNE_ROUNDS = 2, CEIL_ROUNDS = 5;
static const double TUNE_TARGET_MS = 2.0, CEIL_TARGET_MS = 10.0;

// Everything that selects descriptors and algorithm. All ints, so memcmp compares keys.
typedef struct {
  int out_fp32, a_t, b_t, M, N, K;
  int accumulate;  // beta != 0: out is read (and, when tuning, must be protected)
  int align;       // min alignment of the three pointers, 16..256 bytes (the heuristic filters on it)
} GemmKey;

typedef struct {
  GemmKey key;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lout;  // cuBLAS A (our B), cuBLAS B (our A), C = D (out)
  cublasLtMatmulAlgo_t algo;
  int n_candidates, chosen;  // heuristic results available, and the index kept
  double ms, ms_h0;          // measured time per call of the kept algo and of heuristic #0 (0: untimed)
  const char *untuned;       // why the timing was skipped, or NULL
  long calls;
} GemmPlan;

static GemmPlan *g_plans;
static int g_nplans, g_capplans;


static const char *layout_name(int a_t, int b_t) {
  static const char *names[4] = {"A*B", "A*B^T", "A^T*B", "A^T*B^T"};
  return names[a_t * 2 + b_t];
}

static void check_args(const char *who, int out_fp32, int a_t, int b_t, int M, int N, int K) {
  if ((out_fp32 | a_t | b_t) & ~1)
    die("%s: out_fp32=%d a_t=%d b_t=%d must each be 0 or 1", who, out_fp32, a_t, b_t);
  if (M <= 0 || N <= 0 || K <= 0 || M % 8 || N % 8 || K % 8)
    die("%s: M=%d N=%d K=%d must be positive multiples of 8 (every row of A, B and out must start "
        "16-byte aligned for cuBLASLt's BF16 tensor-core kernels)", who, M, N, K);
}

// Largest power of two in [16, 256] dividing every address; dies below 16.
static int pointer_alignment(const void *out, const void *A, const void *B) {
  uintptr_t bits = (uintptr_t)out | (uintptr_t)A | (uintptr_t)B;
  if (!out || !A || !B || (bits & 15))
    die("gemm_bf16: out=%p A=%p B=%p must be non-NULL and 16-byte aligned", out, A, B);
  int align = 256;
  while (bits & (uintptr_t)(align - 1)) align >>= 1;
  return align;
}

static void plan_build(GemmPlan *p) {
  const GemmKey *k = &p->key;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // op(B)^T: B stored [K,N] row-major is column-major [N,K] already (N); stored [N,K] it needs T.
  cublasOperation_t ta = k->b_t ? CUBLAS_OP_T : CUBLAS_OP_N;
  // op(A)^T: A stored [M,K] row-major is column-major [K,M] already (N); stored [K,M] it needs T.
  cublasOperation_t tb = k->a_t ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  // Column-major (rows, cols, ld) of the stored bytes.
  int M = k->M, N = k->N, K = k->K;
  if (k->b_t) CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, K, N, K));
  else CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, N, K, N));
  if (k->a_t) CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, M, K, M));
  else CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, K, M, K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lout, k->out_fp32 ? CUDA_R_32F : CUDA_R_16BF, N, M, N));
}

static void plan_destroy(GemmPlan *p) {
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lout));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lb));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->la));
  CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
}

static void describe(char *buf, size_t n, const GemmKey *k) {
  snprintf(buf, n, "%s M=%d N=%d K=%d out=%s beta%s0 align=%d", layout_name(k->a_t, k->b_t), k->M, k->N, k->K,
           k->out_fp32 ? "fp32" : "bf16", k->accumulate ? "!=" : "=", k->align);
}

// Up to `max` heuristic algorithms that fit the workspace and the key's pointer alignment.
static int plan_candidates(const GemmPlan *p, cublasLtMatmulHeuristicResult_t *res, int max) {
  cublasStatus_t st;
  int valid = lt_candidates(lt_context()->handle, p->desc, p->la, p->lb, p->lout, p->key.align, lt_context()->ws_bytes, res,
                            max, &st);
  if (valid == 0) {
    char d[160];
    describe(d, sizeof d, &p->key);
    die("gemm: cuBLASLt offers no algorithm for %s (heuristic status %d)", d, (int)st);
  }
  return valid;
}

static cublasStatus_t launch(const GemmPlan *p, const cublasLtMatmulAlgo_t *algo, void *out, const void *A,
                             const void *B, float alpha, float beta) {
  const LtContext *lt = lt_context();
  return cublasLtMatmul(lt->handle, p->desc, &alpha, B, p->la, A, p->lb, &beta, out, p->lout, out, p->lout, algo, lt->ws,
                        lt->ws_bytes, cuda_stream());
}

// One GEMM call with fixed operands, for lt_pick_fastest.
typedef struct {
  const GemmPlan *p;
  void *out;
  const void *A, *B;
  float alpha, beta;
} TuneCall;

static cublasStatus_t launch_tune(void *ctx, const cublasLtMatmulAlgo_t *algo) {
  const TuneCall *c = (const TuneCall *)ctx;
  return launch(c->p, algo, c->out, c->A, c->B, c->alpha, c->beta);
}

// Times the n candidates on these buffers and returns the fastest's index; ms[i] gets candidate
// i's time per call (-1: it failed to run, which happens only for odd algorithms).
static int pick_fastest(const GemmPlan *p, const cublasLtMatmulHeuristicResult_t *res, int n, void *out,
                        const void *A, const void *B, float alpha, float beta, int rounds, double target_ms,
                        double *ms) {
  TuneCall c = {p, out, A, B, alpha, beta};
  int best = lt_pick_fastest(launch_tune, &c, res, n, rounds, target_ms, ms);
  if (best < 0) {
    char d[160];
    describe(d, sizeof d, &p->key);
    die("gemm: none of the %d cuBLASLt algorithms for %s ran", n, d);
  }
  return best;
}

// First call of a shape: choose the algorithm. With beta != 0 the timed calls would keep adding
// into `out`, so they run on a scratch copy instead (allocated here, freed before returning).
static void plan_tune(GemmPlan *p, void *out, const void *A, const void *B, float alpha, float beta) {
  cublasLtMatmulHeuristicResult_t res[CANDIDATES];
  int n = plan_candidates(p, res, lt_context()->autotune ? CANDIDATES : 1);
  p->n_candidates = n;
  p->chosen = 0;
  p->algo = res[0].algo;
  if (!lt_context()->autotune) { p->untuned = "GEMM_AUTOTUNE=0"; return; }
  if (n < 2) { p->untuned = "one candidate"; return; }
  cudaStreamCaptureStatus cap;
  CUDA_CHECK(cudaStreamIsCapturing(cuda_stream(), &cap));
  if (cap != cudaStreamCaptureStatusNone) {  // timing would sync inside a capture: not allowed
    p->untuned = "first call inside a CUDA graph capture";
    return;
  }
  void *target = out;
  if (beta != 0) {
    size_t bytes = (size_t)p->key.M * p->key.N * (p->key.out_fp32 ? 4 : 2);
    if (cudaMalloc(&target, bytes) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the out-of-memory error; tuning is an optimization
      p->untuned = "no memory for a scratch output";
      return;
    }
    CUDA_CHECK(cudaMemcpyAsync(target, out, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
  }
  double ms[CANDIDATES];
  int best = pick_fastest(p, res, n, target, A, B, alpha, beta, TUNE_ROUNDS, TUNE_TARGET_MS, ms);
  if (target != out) CUDA_CHECK(cudaFree(target));
  p->chosen = best;
  p->algo = res[best].algo;
  p->ms = ms[best];
  p->ms_h0 = ms[0];
}

static GemmPlan *plan_get(const GemmKey *key, void *out, const void *A, const void *B, float alpha, float beta) {
  for (int i = 0; i < g_nplans; i++)
    if (memcmp(&g_plans[i].key, key, sizeof *key) == 0) return &g_plans[i];
  g_plans = (GemmPlan *)grow_array(g_plans, g_nplans, &g_capplans, sizeof *g_plans);
  GemmPlan *p = &g_plans[g_nplans++];
  memset(p, 0, sizeof *p);
  p->key = *key;
  plan_build(p);
  plan_tune(p, out, A, B, alpha, beta);
  return p;
}

void gemm_bf16(void *out, int out_fp32, const void *A, int a_t, const void *B, int b_t, int M, int N, int K,
               float alpha, float beta) {
  check_args("gemm_bf16", out_fp32, a_t, b_t, M, N, K);
  GemmKey key;
  key.out_fp32 = out_fp32;
  key.a_t = a_t;
  key.b_t = b_t;
  key.M = M;
  key.N = N;
  key.K = K;
  key.accumulate = beta != 0.0f;
  key.align = pointer_alignment(out, A, B);
  GemmPlan *p = plan_get(&key, out, A, B, alpha, beta);
  p->calls++;
  CUBLAS_CHECK(launch(p, &p->algo, out, A, B, alpha, beta));
}

static __global__ void fill_uniform_bf16(__nv_bfloat16 *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 0x9e3779b9u ^ (uint32_t)(i >> 32) * 0x85ebca6bu ^ seed;
    h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
    p[i] = __float2bfloat16((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);  // uniform [-1, 1)
  }
}

double gemm_ceiling_tflops(int out_fp32, int a_t, int b_t, int M, int N, int K) {
  check_args("gemm_ceiling_tflops", out_fp32, a_t, b_t, M, N, K);
  GemmPlan p;
  memset(&p, 0, sizeof p);
  p.key.out_fp32 = out_fp32;
  p.key.a_t = a_t;
  p.key.b_t = b_t;
  p.key.M = M;
  p.key.N = N;
  p.key.K = K;
  p.key.accumulate = out_fp32;
  p.key.align = 256;  // cudaMalloc'd buffers
  plan_build(&p);
  // Random operands: tensor-core power (hence clocks) depends on the data, zeros would flatter.
  void *A, *B, *out;
  CUDA_CHECK(cudaMalloc(&A, (size_t)M * K * 2));
  CUDA_CHECK(cudaMalloc(&B, (size_t)K * N * 2));
  CUDA_CHECK(cudaMalloc(&out, (size_t)M * N * (out_fp32 ? 4 : 2)));
  fill_uniform_bf16<<<1024, 256, 0, cuda_stream()>>>((__nv_bfloat16 *)A, (size_t)M * K, 1);
  CUDA_CHECK_LAUNCH();
  fill_uniform_bf16<<<1024, 256, 0, cuda_stream()>>>((__nv_bfloat16 *)B, (size_t)K * N, 2);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)M * N * (out_fp32 ? 4 : 2), cuda_stream()));
  cublasLtMatmulHeuristicResult_t res[CANDIDATES];
  int n = plan_candidates(&p, res, CANDIDATES);
  double ms[CANDIDATES];
  int best = pick_fastest(&p, res, n, out, A, B, 1.0f, out_fp32 ? 1.0f : 0.0f, CEIL_ROUNDS, CEIL_TARGET_MS, ms);
  CUDA_CHECK(cudaFree(out));
  CUDA_CHECK(cudaFree(B));
  CUDA_CHECK(cudaFree(A));
  plan_destroy(&p);
  return 2.0 * M * N * K / (ms[best] * 1e-3) / 1e12;
}

// An algorithm configuration attribute as an integer (the attributes are 16- or 32-bit).
static long algo_attr(const cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t v32 = 0;
  uint16_t v16 = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(algo, attr, &v32, sizeof v32, &written) == CUBLAS_STATUS_SUCCESS)
    return (long)(int32_t)v32;
  if (cublasLtMatmulAlgoConfigGetAttribute(algo, attr, &v16, sizeof v16, &written) == CUBLAS_STATUS_SUCCESS)
    return (long)v16;
  return -1;
}

void gemm_shape_report(FILE *f) {
  if (!g_nplans) {
    fprintf(f, "gemm plans: none (gemm_bf16 not called yet)\n");
    return;
  }
  fprintf(f, "gemm plans: %d shapes, autotune %s, workspace %zu MiB\n", g_nplans, lt_context()->autotune ? "on" : "off",
          lt_context()->ws_bytes >> 20);
  fprintf(f, "  %-8s %7s %7s %7s %4s %4s %5s %8s %6s %8s %8s  %s\n", "layout", "M", "N", "K", "out", "acc", "align",
          "calls", "pick", "TFLOP/s", "heur#0", "algo id/tile/stages/splitK/swizzle/cluster");
  for (int i = 0; i < g_nplans; i++) {
    const GemmPlan *p = &g_plans[i];
    const GemmKey *k = &p->key;
    double flop = 2.0 * k->M * k->N * k->K;
    char pick[16], rate[16], rate0[16];
    snprintf(pick, sizeof pick, "%d/%d", p->chosen, p->n_candidates);
    snprintf(rate, sizeof rate, "%.1f", p->ms > 0 ? flop / (p->ms * 1e-3) / 1e12 : 0.0);
    snprintf(rate0, sizeof rate0, "%.1f", p->ms_h0 > 0 ? flop / (p->ms_h0 * 1e-3) / 1e12 : 0.0);
    fprintf(f, "  %-8s %7d %7d %7d %4s %4d %5d %8ld %6s %8s %8s  %ld/%ld/%ld/%ld/%ld/%ld%s%s\n",
            layout_name(k->a_t, k->b_t), k->M, k->N, k->K, k->out_fp32 ? "fp32" : "bf16", k->accumulate, k->align,
            p->calls, pick, p->ms > 0 ? rate : "-", p->ms_h0 > 0 ? rate0 : "-",
            algo_attr(&p->algo, CUBLASLT_ALGO_CONFIG_ID), algo_attr(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
            algo_attr(&p->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), algo_attr(&p->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
            algo_attr(&p->algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
            algo_attr(&p->algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), p->untuned ? "  untuned: " : "",
            p->untuned ? p->untuned : "");
  }
}

void gemm_shutdown(void) {
  for (int i = 0; i < g_nplans; i++) plan_destroy(&g_plans[i]);
  free(g_plans);
  g_plans = NULL;
  g_nplans = g_capplans = 0;
  lt_context_release();
}
