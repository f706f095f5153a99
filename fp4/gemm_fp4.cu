// fp4/gemm_fp4.cu: the FP4 GEMM back ends (see gemm_fp4.h): Hopper FP8 block-scaled cuBLASLt, the
// exact BF16 reference, and Blackwell native FP4 (untested on hardware).
//
// cuBLASLt is column-major; as in common/gemm.cu we ask it for out^T = B . A^T, which it writes
// column-major, i.e. exactly our row-major out[M,N]. So cuBLAS "A" is our B (stored [N,K] row-major =
// column-major K x N, transa = T), cuBLAS "B" is our A (column-major K x M, transb = N), and the
// problem is m = N, n = M, k = K: the TN form FP8 and FP4 need. The probe
// (shared/probes/mx_embed_probe.cu) ran exactly this with cuBLAS-A = weights in BLK128x128 and
// cuBLAS-B = activations in VEC128; BLK128x128 on both sides is not supported, VEC128 on both is, and
// so is cuBLAS-B in BLK128x128 with cuBLAS-A in VEC128 (the Wgrad with dY^T tiles, checked by
// gpu_test_fp4_gemm against the exact reference).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fp4/fp8_embed.h"
#include "fp4/gemm_fp4.h"
#include "fp4/mxfp4.h"
#include "fp4/nvfp4.h"
#include "fp4/nvfp4_cta.h"
#include "common/cuda_common.h"
#include "common/gemm.h"
#include "common/lt_tune.h"

enum { CANDIDATES = 4 };  // heuristic algorithms timed per shape
static const int BENCH_ROUNDS = 5;
static const double BENCH_TARGET_MS = 10.0;

// ---------------------------------------------------------------------------------------------
// Plans, in the one cache of common/lt_tune.h: one per (kind, out type, scale modes, shape,
// beta != 0, alignment), all ints. LT_BF16_DEV_ALPHA: the reference path's BF16 GEMM with a
// device-side alpha (NVFP4 tensor scales), so it needs no host sync; gemm_bf16 takes host scalars.
typedef struct {
  int kind, out_fp32;  // kind: LT_FP8, LT_FP4_NATIVE or LT_BF16_DEV_ALPHA
  int a_blk, b_blk;    // FP8: our A / our B in BLK128x128 (else VEC128); other kinds: 0
  int M, N, K;
  int accumulate, align;
} PlanKey;

// The pointers of one call. alpha/beta are host floats (FP8) or device floats (native); beta
// multiplies out itself (cuBLASLt's C is D: fp4_gemm_fp8_src says why).
typedef struct {
  void *out;
  const void *a, *b, *sa, *sb;
  const float *alpha, *beta;
} Call;

// Grow-only device scratch (reference operands, swizzled scales, device alpha/beta).
typedef struct {
  void *p;
  size_t cap;
} Scratch;
static Scratch g_ref_a, g_ref_b, g_sw_a, g_sw_b, g_dev_scalars;

static void *scratch(Scratch *s, size_t bytes) {
  if (bytes > s->cap) {
    if (s->p) CUDA_CHECK(cudaFree(s->p));  // cudaFree waits for queued work that may still read it
    CUDA_CHECK(cudaMalloc(&s->p, bytes));
    s->cap = bytes;
  }
  return s->p;
}

static void describe(char *buf, size_t n, const PlanKey *k) {
  const char *kind = k->kind == LT_FP8 ? "fp8" : k->kind == LT_FP4_NATIVE ? "fp4-native" : "bf16 (device alpha)";
  int fp8 = k->kind == LT_FP8;
  snprintf(buf, n, "%s A[%d,%d]%s . B[%d,%d]%s^T out=%s beta%s0 align=%d", kind, k->M, k->K,
           !fp8       ? ""
           : k->a_blk ? "(BLK128x128)"
                      : "(VEC128)",
           k->N, k->K,
           !fp8       ? ""
           : k->b_blk ? "(BLK128x128)"
                      : "(VEC128)",
           k->out_fp32 ? "fp32" : "bf16", k->accumulate ? "!=" : "=", k->align);
}

static void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v, size_t n) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, a, v, n));
}

static void plan_build(LtPlan *p, const PlanKey *k) {
  p->align = k->align;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  int32_t mode_a, mode_b;  // cuBLAS A = our B, cuBLAS B = our A
  cudaDataType_t t;
  if (k->kind == LT_FP8) {
    // FAST_ACCUM stays at its default 0: block scales need the promoted fp32 accumulation.
    mode_a = k->b_blk ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    mode_b = k->a_blk ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    t = CUDA_R_8F_E4M3;
  } else {
    mode_a = mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
    t = k->kind == LT_FP4_NATIVE ? CUDA_R_4F_E2M1 : CUDA_R_16BF;
    int32_t pm = CUBLASLT_POINTER_MODE_DEVICE;  // alpha carries device-side tensor scales
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm);
  }
  if (k->kind != LT_BF16_DEV_ALPHA) {
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a);
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b);
    // Placeholder scale pointers (aligned, non-NULL) so the heuristic sees a complete descriptor, as
    // in the probe; every launch sets the call's own.
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &lt_context()->ws, sizeof(void *));
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &lt_context()->ws, sizeof(void *));
  }
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, t, k->K, k->N, k->K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, t, k->K, k->M, k->K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lout, k->out_fp32 ? CUDA_R_32F : CUDA_R_16BF, k->N, k->M, k->N));
}

static cublasStatus_t launch(const LtPlan *p, const cublasLtMatmulAlgo_t *algo, const Call *c) {
  // Scale pointers are per call; setting them is a host-side write into the descriptor. (A BF16
  // plan has none: a scale pointer there would be read as a scalar scale.)
  if (p->key[0] != LT_BF16_DEV_ALPHA) {
    cublasStatus_t st =
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c->sb, sizeof c->sb);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    st = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c->sa, sizeof c->sa);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
  }
  const LtContext *lt = lt_context();
  return cublasLtMatmul(lt->handle, p->desc, c->alpha, c->b, p->la, c->a, p->lb, c->beta, c->out, p->lout, c->out,
                        p->lout, algo, lt->ws, lt->ws_bytes, cuda_stream());
}

typedef struct {
  const LtPlan *p;
  Call c;
} TuneCall;

static cublasStatus_t launch_tune(void *ctx, const cublasLtMatmulAlgo_t *algo) {
  const TuneCall *t = (const TuneCall *)ctx;
  return launch(t->p, algo, &t->c);
}

// The plan of a key, built at its first use and its algorithm chosen on call c (NULL: heuristic #0,
// nothing to time, as for fp4_gemm_fp8_supported). n_candidates 0: cuBLASLt offers nothing.
static LtPlan *plan_get(const PlanKey *key, const Call *c) {
  int created;
  LtPlan *p = lt_plan_get((const int *)key, (int)(sizeof *key / sizeof(int)), &created);
  if (!created) return p;
  plan_build(p, key);
  TuneCall t = {p, c ? *c : Call{}};
  lt_plan_choose(p, CANDIDATES, c ? launch_tune : NULL, &t, &t.c.out, (size_t)key->M * key->N * (key->out_fp32 ? 4 : 2),
                 key->accumulate);
  return p;
}

// One call on a key's plan: built and tuned at the key's first use, dies naming the GEMM when
// cuBLASLt offers no algorithm for it (hint: what to check first, or "").
static void plan_run(const char *who, const char *hint, const PlanKey *key, const Call *c) {
  LtPlan *p = plan_get(key, c);
  if (p->n_candidates == 0) {
    char d[200];
    describe(d, sizeof d, key);
    die("%s: cuBLASLt offers no algorithm for %s%s", who, d, hint);
  }
  p->calls++;
  CUBLAS_CHECK(launch(p, &p->algo, c));
}

// ---------------------------------------------------------------------------------------------
// Argument checks.
static void check_shape(const char *who, int out_fp32, int M, int N, int K, int k_mult) {
  if (out_fp32 & ~1) die("%s: out_fp32 = %d must be 0 or 1", who, out_fp32);
  if (M <= 0 || N <= 0 || K <= 0 || M % 4 || N % 8 || K % k_mult)
    die("%s: M=%d N=%d K=%d: need M %% 4 == 0, N %% 8 == 0 (16-byte aligned out rows) and K %% %d == 0", who, M, N, K,
        k_mult);
}

// ---------------------------------------------------------------------------------------------
// Hopper FP8 path.
static PlanKey plan_key(int kind, int out_fp32, int a_blk, int b_blk, int M, int N, int K, int accumulate, int align) {
  PlanKey k;
  memset(&k, 0, sizeof k);  // the key is compared with memcmp: no stray padding bytes
  k.kind = kind;
  k.out_fp32 = out_fp32;
  k.a_blk = a_blk != 0;
  k.b_blk = b_blk != 0;
  k.M = M;
  k.N = N;
  k.K = K;
  k.accumulate = accumulate;
  k.align = align;
  return k;
}

static PlanKey fp8_key(int out_fp32, int a_blk, int b_blk, int M, int N, int K, int accumulate, int align) {
  return plan_key(LT_FP8, out_fp32, a_blk, b_blk, M, N, K, accumulate, align);
}

static void check_modes(const char *who, int a_blk, int b_blk) {
  if (a_blk && b_blk)
    die("%s: A and B both BLK128x128: cuBLASLt has no 2D x 2D block-scaled FP8 mode (one operand must be "
        "VEC128)",
        who);
}

void fp4_gemm_fp8_src(void *out, const void *src, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K,
                      float alpha, float beta) {
  check_shape("fp4_gemm_fp8", out_fp32, M, N, K, 16);
  check_modes("fp4_gemm_fp8", A.blk128, B.blk128);
  if (src == out) src = NULL;
  // cuBLASLt 13.1 with C apart from D rounds its epilogue otherwise than in place (rel 2.1-2.4e-3 of the
  // result in 24 of 24 cases on an H100, gpu_test_fp4_gemm, 2026-12-05): the in-place form is the
  // oracle (alpha * acc rounded to BF16, then + beta * C), so beta's matrix is copied into out first.
  if (src) {
    CUDA_CHECK(cudaMemcpyAsync(out, src, (size_t)M * N * (out_fp32 ? 4 : 2), cudaMemcpyDeviceToDevice, cuda_stream()));
    src = NULL;
  }
  const void *ptrs[6] = {out, A.e4m3, B.e4m3, out, A.scale, B.scale};
  const char *names[6] = {"out", "A.e4m3", "B.e4m3", "src", "A.scale", "B.scale"};
  int align = lt_alignment("fp4_gemm_fp8", ptrs, names, 4);
  lt_alignment("fp4_gemm_fp8", ptrs + 4, names + 4, 2);  // cuBLASLt needs 16-byte aligned scale tensors
  PlanKey key = fp8_key(out_fp32, A.blk128, B.blk128, M, N, K, beta != 0.0f, align);
  Call c = {out, A.e4m3, B.e4m3, A.scale, B.scale, &alpha, &beta};
  plan_run("fp4_gemm_fp8",
           " (ask fp4_gemm_fp8_supported first; a K that is not a multiple of 128 or a BLK128x128 A may be "
           "unsupported)",
           &key, &c);
}

void fp4_gemm_fp8(void *out, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K, float alpha, float beta) {
  fp4_gemm_fp8_src(out, NULL, out_fp32, A, B, M, N, K, alpha, beta);
}

int fp4_gemm_fp8_supported(int out_fp32, int a_blk128, int b_blk128, int M, int N, int K) {
  check_shape("fp4_gemm_fp8_supported", out_fp32, M, N, K, 16);
  if (a_blk128 && b_blk128) return 0;
  for (int acc = 0; acc < 2; acc++) {  // both beta forms must work
    PlanKey key = fp8_key(out_fp32, a_blk128, b_blk128, M, N, K, acc, 256);
    if (plan_get(&key, NULL)->n_candidates == 0) return 0;
  }
  return 1;
}

// Random E4M3 bytes (uniform values in [-6, 6), never NaN) and unit float scales, for benchmarks:
// tensor-core power (hence clocks) depends on the data.
static __global__ void fill_e4m3_kernel(uint8_t *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    p[i] = e4m3_encode_rne((float)cuda_hash24(i, seed) * (12.0f / 16777216.0f) - 6.0f);
  }
}

static __global__ void fill_f32_kernel(float *p, size_t n, float v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

static size_t fp8_scale_count(int blk, int rows, int K) {
  return blk ? mx_blk128_scale_count(rows, K) : mx_vec128_scale_count(rows, K);
}

Fp8Operand fp4_bench_operand(int rows, int K, int blk128, uint32_t seed) {
  uint8_t *q;
  float *sf;
  const size_t ns = fp8_scale_count(blk128, rows, K);
  CUDA_CHECK(cudaMalloc(&q, (size_t)rows * K));
  CUDA_CHECK(cudaMalloc(&sf, ns * 4));
  fill_e4m3_kernel<<<1024, 256, 0, cuda_stream()>>>(q, (size_t)rows * K, seed);
  CUDA_CHECK_LAUNCH();
  fill_f32_kernel<<<64, 256, 0, cuda_stream()>>>(sf, ns, 1.0f);
  CUDA_CHECK_LAUNCH();
  return (Fp8Operand){q, sf, blk128};
}

void fp4_bench_operand_free(Fp8Operand o) { CUDA_FREE_ALL(o.e4m3, o.scale); }

double fp4_gemm_fp8_tflops(int M, int N, int K, int a_blk128, int b_blk128, int out_fp32) {
  check_shape("fp4_gemm_fp8_tflops", out_fp32, M, N, K, 16);
  check_modes("fp4_gemm_fp8_tflops", a_blk128, b_blk128);
  PlanKey key = fp8_key(out_fp32, a_blk128, b_blk128, M, N, K, out_fp32, 256);
  LtPlan p;  // outside the cache: the rate is independent of the plans kept
  memset(&p, 0, sizeof p);
  plan_build(&p, &key);
  Fp8Operand A = fp4_bench_operand(M, K, a_blk128, 1), B = fp4_bench_operand(N, K, b_blk128, 2);
  void *out;
  CUDA_CHECK(cudaMalloc(&out, (size_t)M * N * (out_fp32 ? 4 : 2)));
  CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)M * N * (out_fp32 ? 4 : 2), cuda_stream()));
  float alpha = 1.0f, beta = out_fp32 ? 1.0f : 0.0f;
  Call c = {out, A.e4m3, B.e4m3, A.scale, B.scale, &alpha, &beta};
  TuneCall t = {&p, c};
  int n;
  double ms = lt_plan_best_ms(&p, CANDIDATES, launch_tune, &t, BENCH_ROUNDS, BENCH_TARGET_MS, &n, NULL);
  CUDA_CHECK(cudaFree(out));
  fp4_bench_operand_free(A), fp4_bench_operand_free(B);
  lt_plan_destroy(&p);
  if (ms < 0) {
    char d[200];
    describe(d, sizeof d, &key);
    die("fp4_gemm_fp8_tflops: no cuBLASLt algorithm ran for %s (%d candidates)", d, n);
  }
  return 2.0 * M * N * K / (ms * 1e-3) / 1e12;
}

// ---------------------------------------------------------------------------------------------
// Dequantizers for the reference path. One thread per 16 consecutive elements of a row: one 16-byte
// (FP8) or 8-byte (FP4) load, two 16-byte BF16 stores. K % 16 == 0 keeps every group in one scale
// block and every access aligned.

static __device__ __forceinline__ void store16_bf16(__nv_bfloat16 *dst, const float *v) {
  __align__(16) __nv_bfloat16 h[16];
#pragma unroll
  for (int i = 0; i < 16; i++) h[i] = __float2bfloat16_rn(v[i]);
  ((uint4 *)dst)[0] = ((const uint4 *)h)[0];
  ((uint4 *)dst)[1] = ((const uint4 *)h)[1];
}

static __global__ void dequant_fp8_kernel(const uint8_t *q, const float *scale, int blk128, int rows, int K,
                                          __nv_bfloat16 *out) {
  size_t groups_per_row = (size_t)K / 16, n = (size_t)rows * groups_per_row;
  int l4 = mx_blk128_l4(K);
  for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < n; g += (size_t)gridDim.x * blockDim.x) {
    size_t r = g / groups_per_row;
    int k0 = (int)(g % groups_per_row) * 16;
    float s = blk128 ? scale[(r / 128) * l4 + k0 / 128] : scale[(size_t)(k0 / 128) * rows + r];
    __align__(16) uint8_t b[16];
    *(uint4 *)b = *(const uint4 *)(q + r * K + k0);
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; i++) v[i] = __fmul_rn(e4m3_decode(b[i]), s);  // exact for power-of-two s
    store16_bf16(out + r * K + k0, v);
  }
}

static __global__ void dequant_mx_kernel(const uint8_t *codes, const uint8_t *e8m0, int rows, int K,
                                         __nv_bfloat16 *out) {
  size_t groups_per_row = (size_t)K / 16, n = (size_t)rows * groups_per_row;
  for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < n; g += (size_t)gridDim.x * blockDim.x) {
    size_t r = g / groups_per_row;
    int k0 = (int)(g % groups_per_row) * 16;
    uint8_t sb = e8m0[r * (K / 32) + k0 / 32];
    __align__(8) uint8_t b[8];
    *(uint2 *)b = *(const uint2 *)(codes + r * (K / 2) + k0 / 2);
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
      uint8_t c = (i & 1) ? b[i >> 1] >> 4 : b[i >> 1] & 15;
      v[i] = mx_decode(c, sb, MX_SCALE_DOWN);  // q * 2^e, exact (MX_SCALE_DOWN has unit 1)
    }
    store16_bf16(out + r * K + k0, v);
  }
}

void fp4_dequant_fp8_bf16(const uint8_t *e4m3, const float *scale, int blk128, int rows, int K, void *out) {
  if (rows <= 0 || K <= 0 || K % 16) die("fp4_dequant_fp8_bf16: rows=%d K=%d: need rows > 0 and K %% 16 == 0", rows, K);
  if (((uintptr_t)e4m3 | (uintptr_t)out) & 15)
    die("fp4_dequant_fp8_bf16: e4m3=%p out=%p must be 16-byte aligned", e4m3, out);
  size_t n = (size_t)rows * (K / 16);
  dequant_fp8_kernel<<<cuda_grid(n, 256), 256, 0, cuda_stream()>>>(e4m3, scale, blk128, rows, K, (__nv_bfloat16 *)out);
  CUDA_CHECK_LAUNCH();
}

void fp4_dequant_mx_bf16(const uint8_t *codes, const uint8_t *e8m0, int rows, int K, void *out) {
  if (rows <= 0 || K <= 0 || K % 32) die("fp4_dequant_mx_bf16: rows=%d K=%d: need rows > 0 and K %% 32 == 0", rows, K);
  if (((uintptr_t)codes & 7) || ((uintptr_t)out & 15))
    die("fp4_dequant_mx_bf16: codes=%p must be 8-byte and out=%p 16-byte aligned", codes, out);
  size_t n = (size_t)rows * (K / 16);
  dequant_mx_kernel<<<cuda_grid(n, 256), 256, 0, cuda_stream()>>>(codes, e8m0, rows, K, (__nv_bfloat16 *)out);
  CUDA_CHECK_LAUNCH();
}

static void gemm_bf16_dev_alpha(void *out, int out_fp32, const void *a, const void *b, int M, int N, int K, float alpha,
                                float beta, const float *alpha_dev);

// ---------------------------------------------------------------------------------------------
// Reference path: dequantize both operands into scratch BF16 buffers, then gemm_bf16 (A . B^T).
void fp4_gemm_reference_fp8(void *out, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K, float alpha,
                            float beta) {
  check_shape("fp4_gemm_reference_fp8", out_fp32, M, N, K, 16);
  void *a = scratch(&g_ref_a, (size_t)M * K * 2), *b = scratch(&g_ref_b, (size_t)N * K * 2);
  fp4_dequant_fp8_bf16(A.e4m3, A.scale, A.blk128, M, K, a);
  fp4_dequant_fp8_bf16(B.e4m3, B.scale, B.blk128, N, K, b);
  gemm_bf16(out, out_fp32, a, 0, b, 1, M, N, K, alpha, beta);
}

void fp4_gemm_reference_packed(void *out, int out_fp32, FP4Format fmt, Fp4Operand A, Fp4Operand B, int M, int N, int K,
                               float alpha, float beta, const float *alpha_dev) {
  check_shape("fp4_gemm_reference_packed", out_fp32, M, N, K, 32);
  if (fmt != FMT_MXFP4 && fmt != FMT_NVFP4) die("fp4_gemm_reference_packed: format %d is not MXFP4 or NVFP4", (int)fmt);
  void *a = scratch(&g_ref_a, (size_t)M * K * 2), *b = scratch(&g_ref_b, (size_t)N * K * 2);
  if (fmt == FMT_MXFP4) {
    fp4_dequant_mx_bf16(A.codes, A.scales, M, K, a);
    fp4_dequant_mx_bf16(B.codes, B.scales, N, K, b);
  } else {
    nvfp4_dequant_bf16_unscaled(A.codes, A.scales, M, K, (__nv_bfloat16 *)a);
    nvfp4_dequant_bf16_unscaled(B.codes, B.scales, N, K, (__nv_bfloat16 *)b);
  }
  if (alpha_dev) gemm_bf16_dev_alpha(out, out_fp32, a, b, M, N, K, alpha, beta, alpha_dev);
  else gemm_bf16(out, out_fp32, a, 0, b, 1, M, N, K, alpha, beta);
}

void fp4_gemm_cta(void *out, int out_fp32, int native, Fp4Operand A, const float *outer_a, Fp4Operand B,
                  const float *outer_b, int M, int N, int K, int accumulate, float *acc) {
  if (!outer_a || !outer_b || !acc) die("fp4_gemm_cta: the outer factors of A and B and the workspace are required");
  if (native) fp4_gemm_native(acc, 1, FMT_NVFP4, A, B, M, N, K, 1.0f, 0.0f, NULL);
  else fp4_gemm_reference_packed(acc, 1, FMT_NVFP4, A, B, M, N, K, 1.0f, 0.0f, NULL);
  nvfp4_cta_apply_outer_cuda(acc, M, N, outer_a, outer_b, out_fp32 ? NULL : (__nv_bfloat16 *)out,
                             out_fp32 ? (float *)out : NULL, accumulate);
}

// ---------------------------------------------------------------------------------------------
// Blackwell native path. UNTESTED ON HARDWARE: written from the cuBLASLt documentation (FP4 operands
// CUDA_R_4F_E2M1, VEC16_UE4M3 scales in the 128x4 tiled layout, TN only) and compiled for sm_100a;
// the swizzle and re-basing kernels are tested on Hopper by tests/gpu/gpu_test_fp4_gemm.cu.
size_t fp4_swizzled_scale_bytes(int rows, int n_cols) {
  return (size_t)(rows + 127) / 128 * 128 * ((size_t)(n_cols + 3) / 4 * 4);
}

static __global__ void max_e8m0_kernel(const uint8_t *s, size_t n, int *max_b) {
  int m = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    if (s[i] != 0xFF && s[i] > m) m = s[i];
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0 && m > 0) atomicMax(max_b, m);  // max is order-independent: deterministic
}

void fp4_scale_max_e8m0(const uint8_t *e8m0, size_t n, int *max_b) {
  CUDA_CHECK(cudaMemsetAsync(max_b, 0, sizeof(int), cuda_stream()));
  if (n == 0) return;
  max_e8m0_kernel<<<cuda_grid(n, 256), 256, 0, cuda_stream()>>>(e8m0, n, max_b);
  CUDA_CHECK_LAUNCH();
}

// UE4M3 byte of 2^(b - max_b + 8): exact for exponents -9..8, 0 below (e4m3_encode_rne rounds 2^-10,
// a tie, to 0), NaN for the E8M0 NaN byte.
static __device__ __forceinline__ uint8_t rebase_e8m0(uint8_t b, int max_b) {
  if (b == 0xFF) return 0x7F;
  int d = (int)b - max_b + 8;
  return e4m3_encode_rne(fp4_exp2i(d < -30 ? -30 : d));
}

static __global__ void swizzle_kernel(const uint8_t *in, int rows, int n_cols, int from_e8m0, const int *max_b,
                                      uint8_t *out) {
  int rows_pad = (rows + 127) / 128 * 128, cols_pad = (n_cols + 3) / 4 * 4;
  int mb = from_e8m0 ? *max_b : 0;
  size_t n = (size_t)rows_pad * cols_pad;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    int r = (int)(i / cols_pad), c = (int)(i % cols_pad);
    uint8_t v = 0;
    if (r < rows && c < n_cols)
      v = from_e8m0 ? rebase_e8m0(in[(size_t)r * (n_cols / 2) + c / 2], mb) : in[(size_t)r * n_cols + c];
    out[fp4_swizzled_offset(r, c, n_cols)] = v;
  }
}

void fp4_swizzle_scales(const uint8_t *in, int rows, int n_cols, int from_e8m0, const int *max_b, uint8_t *out) {
  if (rows <= 0 || n_cols <= 0 || (from_e8m0 && (n_cols % 2 || !max_b)))
    die("fp4_swizzle_scales: rows=%d n_cols=%d from_e8m0=%d max_b=%p: need positive sizes, and for E8M0 an even "
        "n_cols (two 16-blocks per 32-block) and a max_b",
        rows, n_cols, from_e8m0, (const void *)max_b);
  size_t n = fp4_swizzled_scale_bytes(rows, n_cols);
  swizzle_kernel<<<cuda_grid(n, 256), 256, 0, cuda_stream()>>>(in, rows, n_cols, from_e8m0, max_b, out);
  CUDA_CHECK_LAUNCH();
}

// dev[0] = the effective alpha, dev[1] = beta (device pointer mode takes both from the device).
// max_a/max_b (MXFP4 on the native path): undo the re-basing of the block scales.
static __global__ void scalars_kernel(float *dev, float alpha, float beta, const float *alpha_dev, const int *max_a,
                                      const int *max_b) {
  float a = alpha;
  if (alpha_dev) a = __fmul_rn(a, *alpha_dev);
  if (max_a) a = fp4_ldexp(fp4_ldexp(a, *max_a - 127 - 8), *max_b - 127 - 8);  // undo the re-basing
  dev[0] = a;
  dev[1] = beta;
}

int fp4_gemm_native_available(void) {
  int dev, major = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major < 10) return 0;
  cudaFuncAttributes fa;  // sm_100a code runs on cc 10.0 only: ask whether a kernel image loads here
  if (cudaFuncGetAttributes(&fa, swizzle_kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return 1;
}

void fp4_gemm_native(void *out, int out_fp32, FP4Format fmt, Fp4Operand A, Fp4Operand B, int M, int N, int K,
                     float alpha, float beta, const float *alpha_dev) {
  check_shape("fp4_gemm_native", out_fp32, M, N, K, 32);
  if (fmt != FMT_MXFP4 && fmt != FMT_NVFP4) die("fp4_gemm_native: format %d is not MXFP4 or NVFP4", (int)fmt);
  if (!fp4_gemm_native_available())
    die("fp4_gemm_native: needs a compute capability 10.0 GPU (native FP4 tensor cores); use the FP8 or reference "
        "back end here");
  const void *ptrs[3] = {out, A.codes, B.codes};
  const char *names[3] = {"out", "A.codes", "B.codes"};
  int align = lt_alignment("fp4_gemm_native", ptrs, names, 3);
  int cols = K / 16, mx = fmt == FMT_MXFP4;
  size_t sa_bytes = fp4_swizzled_scale_bytes(M, cols), sb_bytes = fp4_swizzled_scale_bytes(N, cols);
  uint8_t *sa = (uint8_t *)scratch(&g_sw_a, sa_bytes), *sb = (uint8_t *)scratch(&g_sw_b, sb_bytes);
  // dev scalars: [0] alpha, [1] beta, then two ints (max E8M0 byte of A and of B), 16-byte slots.
  char *dev = (char *)scratch(&g_dev_scalars, 64);
  float *ab = (float *)dev;
  int *max_a = (int *)(dev + 16), *max_b = (int *)(dev + 32);
  if (mx) {
    fp4_scale_max_e8m0(A.scales, (size_t)M * (K / 32), max_a);
    fp4_scale_max_e8m0(B.scales, (size_t)N * (K / 32), max_b);
  }
  fp4_swizzle_scales(A.scales, M, cols, mx, max_a, sa);
  fp4_swizzle_scales(B.scales, N, cols, mx, max_b, sb);
  scalars_kernel<<<1, 1, 0, cuda_stream()>>>(ab, alpha, beta, alpha_dev, mx ? max_a : NULL, mx ? max_b : NULL);
  CUDA_CHECK_LAUNCH();
  PlanKey key = plan_key(LT_FP4_NATIVE, out_fp32, 0, 0, M, N, K, beta != 0.0f, align);
  Call c = {out, A.codes, B.codes, sa, sb, ab, ab + 1};
  plan_run("fp4_gemm_native", "", &key, &c);
}

// out = alpha * (*alpha_dev) * a . b^T + beta * out with BF16 a [M,K], b [N,K]: gemm_bf16's TN case,
// with the scalars in device memory.
static void gemm_bf16_dev_alpha(void *out, int out_fp32, const void *a, const void *b, int M, int N, int K, float alpha,
                                float beta, const float *alpha_dev) {
  if (M % 8 || K % 8)
    die("fp4_gemm_reference_packed: M=%d K=%d must be multiples of 8 (16-byte aligned BF16 rows)", M, K);
  const void *ptrs[3] = {out, a, b};
  const char *names[3] = {"out", "A (dequantized)", "B (dequantized)"};
  int align = lt_alignment("fp4_gemm_reference_packed", ptrs, names, 3);
  float *ab = (float *)scratch(&g_dev_scalars, 64);  // [0] alpha, [1] beta
  scalars_kernel<<<1, 1, 0, cuda_stream()>>>(ab, alpha, beta, alpha_dev, NULL, NULL);
  CUDA_CHECK_LAUNCH();
  PlanKey key = plan_key(LT_BF16_DEV_ALPHA, out_fp32, 0, 0, M, N, K, beta != 0.0f, align);
  Call c = {out, a, b, NULL, NULL, ab, ab + 1};
  plan_run("fp4_gemm_reference_packed", "", &key, &c);
}

// ---------------------------------------------------------------------------------------------
void fp4_gemm_shutdown(void) {
  Scratch *all[5] = {&g_ref_a, &g_ref_b, &g_sw_a, &g_sw_b, &g_dev_scalars};
  for (int i = 0; i < 5; i++) {
    if (all[i]->p) CUDA_CHECK(cudaFree(all[i]->p));
    all[i]->p = NULL;
    all[i]->cap = 0;
  }
  lt_plans_release();
  lt_context_release();
}
