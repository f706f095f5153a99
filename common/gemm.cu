// common/gemm.cu: BF16 GEMMs through cuBLASLt, their plans in the one cache of common/lt_tune.h. See gemm.h.
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

// Timing effort of the ceiling (the plans' own choice is lt_plan_choose's): one warm-up call per
// candidate, then CEIL_ROUNDS interleaved passes of about CEIL_TARGET_MS; each keeps its best pass.
static const int CEIL_ROUNDS = 5;
static const double CEIL_TARGET_MS = 10.0;

// The plan key (common/lt_tune.h): everything that selects descriptors and algorithm, all ints.
typedef struct {
  int kind;  // LT_BF16
  int out_fp32, a_t, b_t, M, N, K;
  int accumulate;  // beta != 0: out is read (and, when tuning, must be protected)
  int align;       // min alignment of the three pointers, 16..256 bytes (the heuristic filters on it)
} GemmKey;

static GemmKey key_of(const LtPlan *p) {
  GemmKey k;
  memcpy(&k, p->key, sizeof k);
  return k;
}

static const char *layout_name(int a_t, int b_t) {
  static const char *names[4] = {"A*B", "A*B^T", "A^T*B", "A^T*B^T"};
  return names[a_t * 2 + b_t];
}

static void check_args(const char *who, int out_fp32, int a_t, int b_t, int M, int N, int K) {
  if ((out_fp32 | a_t | b_t) & ~1) die("%s: out_fp32=%d a_t=%d b_t=%d must each be 0 or 1", who, out_fp32, a_t, b_t);
  if (M <= 0 || N <= 0 || K <= 0 || M % 8 || N % 8 || K % 8)
    die("%s: M=%d N=%d K=%d must be positive multiples of 8 (every row of A, B and out must start "
        "16-byte aligned for cuBLASLt's BF16 tensor-core kernels)",
        who, M, N, K);
}

static void plan_build(LtPlan *p, const GemmKey *k) {
  p->align = k->align;
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

static void describe(char *buf, size_t n, const GemmKey *k) {
  snprintf(buf, n, "%s M=%d N=%d K=%d out=%s beta%s0 align=%d", layout_name(k->a_t, k->b_t), k->M, k->N, k->K,
           k->out_fp32 ? "fp32" : "bf16", k->accumulate ? "!=" : "=", k->align);
}

static cublasStatus_t launch(const LtPlan *p, const cublasLtMatmulAlgo_t *algo, void *out, const void *A, const void *B,
                             float alpha, float beta) {
  const LtContext *lt = lt_context();
  return cublasLtMatmul(lt->handle, p->desc, &alpha, B, p->la, A, p->lb, &beta, out, p->lout, out, p->lout, algo,
                        lt->ws, lt->ws_bytes, cuda_stream());
}

// One GEMM call with fixed operands, for lt_plan_choose and lt_plan_best_ms.
typedef struct {
  const LtPlan *p;
  void *out;
  const void *A, *B;
  float alpha, beta;
} TuneCall;

static cublasStatus_t launch_tune(void *ctx, const cublasLtMatmulAlgo_t *algo) {
  const TuneCall *c = (const TuneCall *)ctx;
  return launch(c->p, algo, c->out, c->A, c->B, c->alpha, c->beta);
}

// The plan of a key, built and chosen (on this call's operands) at its first use.
static LtPlan *plan_get(const GemmKey *key, void *out, const void *A, const void *B, float alpha, float beta) {
  int created;
  LtPlan *p = lt_plan_get((const int *)key, (int)(sizeof *key / sizeof(int)), &created);
  if (!created) return p;
  plan_build(p, key);
  TuneCall c = {p, out, A, B, alpha, beta};
  lt_plan_choose(p, CANDIDATES, launch_tune, &c, &c.out, (size_t)key->M * key->N * (key->out_fp32 ? 4 : 2),
                 key->accumulate);
  if (p->n_candidates == 0) {
    char d[160];
    describe(d, sizeof d, key);
    die("gemm: cuBLASLt offers no algorithm for %s", d);
  }
  return p;
}

void gemm_bf16(void *out, int out_fp32, const void *A, int a_t, const void *B, int b_t, int M, int N, int K,
               float alpha, float beta) {
  check_args("gemm_bf16", out_fp32, a_t, b_t, M, N, K);
  const void *ptrs[3] = {out, A, B};
  const char *names[3] = {"out", "A", "B"};
  GemmKey key = {LT_BF16, out_fp32, a_t, b_t, M, N, K, beta != 0.0f, lt_alignment("gemm_bf16", ptrs, names, 3)};
  LtPlan *p = plan_get(&key, out, A, B, alpha, beta);
  p->calls++;
  CUBLAS_CHECK(launch(p, &p->algo, out, A, B, alpha, beta));
}

double gemm_ceiling_tflops(int out_fp32, int a_t, int b_t, int M, int N, int K) {
  check_args("gemm_ceiling_tflops", out_fp32, a_t, b_t, M, N, K);
  GemmKey key = {LT_BF16, out_fp32, a_t, b_t, M, N, K, out_fp32, 256};  // cudaMalloc'd buffers
  LtPlan p;  // outside the cache: the ceiling is independent of the plans kept
  memset(&p, 0, sizeof p);
  plan_build(&p, &key);
  // Random operands: tensor-core power (hence clocks) depends on the data, zeros would flatter.
  void *A, *B, *out;
  CUDA_CHECK(cudaMalloc(&A, (size_t)M * K * 2));
  CUDA_CHECK(cudaMalloc(&B, (size_t)K * N * 2));
  CUDA_CHECK(cudaMalloc(&out, (size_t)M * N * (out_fp32 ? 4 : 2)));
  cuda_fill_uniform_bf16(A, (size_t)M * K, 1);
  cuda_fill_uniform_bf16(B, (size_t)K * N, 2);
  CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)M * N * (out_fp32 ? 4 : 2), cuda_stream()));
  TuneCall c = {&p, out, A, B, 1.0f, out_fp32 ? 1.0f : 0.0f};
  int n;
  cublasStatus_t st;
  double ms = lt_plan_best_ms(&p, CANDIDATES, launch_tune, &c, CEIL_ROUNDS, CEIL_TARGET_MS, &n, &st);
  CUDA_FREE_ALL(out, B, A);
  lt_plan_destroy(&p);
  if (ms < 0) {
    char d[160];
    describe(d, sizeof d, &key);
    die("gemm_ceiling_tflops: no cuBLASLt algorithm ran for %s (%d candidates, heuristic status %d)", d, n, (int)st);
  }
  return 2.0 * M * N * K / (ms * 1e-3) / 1e12;
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
  int shapes = 0;
  for (int i = 0; i < lt_plan_count(); i++) shapes += lt_plan_at(i)->key[0] == LT_BF16;
  if (!shapes) {
    fprintf(f, "gemm plans: none (gemm_bf16 not called yet)\n");
    return;
  }
  fprintf(f, "gemm plans: %d shapes, autotune %s, workspace %zu MiB\n", shapes, lt_context()->autotune ? "on" : "off",
          lt_context()->ws_bytes >> 20);
  fprintf(f, "  %-8s %7s %7s %7s %4s %4s %5s %8s %6s %8s %8s  %s\n", "layout", "M", "N", "K", "out", "acc", "align",
          "calls", "pick", "TFLOP/s", "heur#0", "algo id/tile/stages/splitK/swizzle/cluster");
  for (int i = 0; i < lt_plan_count(); i++) {
    const LtPlan *p = lt_plan_at(i);
    if (p->key[0] != LT_BF16) continue;
    const GemmKey key = key_of(p), *k = &key;
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
  lt_plans_release();
  lt_context_release();
}
