// tests/gpu/gpu_test_swiglu_epilogue.cu: the up projection's GEMM with SwiGLU and down's MXFP4 producers in
// its epilogue (model/cuda/swiglu_epilogue.h). Its bytes must equal the unfused path's: the GEMM alone
// (CUTLASS's, whose bits gpu_test_fp4_gemm holds to cuBLASLt's; here also compared to cuBLASLt's) writing
// up, then the fused SwiGLU producer (mx_quantize_dual_swiglu_cuda, held to swiglu + the dual producer by
// gpu_test_fused) reading gate and up. up, the row copy and the column copy (VEC128 and BLK128x128, H32 and
// none), codes and scales, at shapes of one tile to an 8B block's. Then the time of the fused kernel
// beside the unfused pair's, both GEMM kernels.
#include <cuda_bf16.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "fp4/gemm_cutlass.h"
#include "fp4/fp8_embed.h"
#include "fp4/gemm_fp4.h"
#include "fp4/mxfp4.h"
#include "model/cuda/quant_fused.h"
#include "model/cuda/swiglu_epilogue.h"
#include "tests/test.h"
#include "tests/gpu/gpu_util.h"

typedef __nv_bfloat16 bf16;
static Rng rng;

static void *dalloc(size_t n) { return dev_alloc(n, 0xAB); }

// rows x K normal BF16 values times scale; every 97th an exact zero.
static bf16 *make_bf16(size_t rows, size_t K, float scale) {
  const size_t n = rows * K;
  bf16 *h = (bf16 *)xmalloc(n * sizeof(bf16)), *d = (bf16 *)dalloc(n * sizeof(bf16));
  for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16(i % 97 == 3 ? 0.0f : (float)rng_normal(&rng) * scale);
  CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(bf16), cudaMemcpyHostToDevice));
  free(h);
  return d;
}

// The GEMM's operands as the linear makes them: x's row copy (VEC128) and W's (BLK128x128, the 0.87 rule).
typedef struct {
  uint8_t *xq, *wq;
  float *xs, *ws;
  Fp8Operand A, B;
} Operands;
static Operands make_operands(int M, int N, int K) {
  Operands o;
  bf16 *x = make_bf16(M, K, 1.0f), *w = make_bf16(N, K, 0.02f);
  o.xq = (uint8_t *)dalloc((size_t)M * K), o.wq = (uint8_t *)dalloc((size_t)N * K);
  o.xs = (float *)dalloc(mx_vec128_scale_count(M, K) * 4), o.ws = (float *)dalloc(mx_blk128_scale_count(N, K) * 4);
  MxOut xo = {o.xq, NULL, o.xs, 1, 1.0f, 0, NULL}, wo = {o.wq, NULL, o.ws, 1, 1.0f, 1, NULL}, none_out = {};
  PhiloxStream none = {};
  mx_quantize_rows_cuda(x, M, K, MX_SCALE_UP, MX_RNE, none, xo);
  mx_quantize_weight_bf16_cuda(w, N, K, MX_SCALE_UP, 1, wo, none_out);
  o.A = Fp8Operand{o.xq, o.xs, 0}, o.B = Fp8Operand{o.wq, o.ws, 1};
  cudaFree(x), cudaFree(w);
  return o;
}
static void free_operands(Operands *o) { cudaFree(o->xq), cudaFree(o->wq), cudaFree(o->xs), cudaFree(o->ws); }

// down's input copies: FP8 rows (VEC128), FP8 columns in VEC128 or BLK128x128, every byte `fill` first (the
// reference's and the kernel's differ, so a byte either leaves unwritten shows as a mismatch).
typedef struct {
  MxOut row, col;
  size_t bytes, row_s, col_s;
} Outs;
static Outs make_outs(int rows, int K, int blk, int fill) {
  Outs o;
  memset(&o, 0, sizeof o);
  o.bytes = (size_t)rows * K;
  o.row_s = mx_vec128_scale_count(rows, K) * 4;
  o.col_s = (blk ? mx_blk128_scale_count(K, rows) : mx_vec128_scale_count(K, rows)) * 4;
  o.row = MxOut{(uint8_t *)dev_alloc(o.bytes, fill), NULL, (float *)dev_alloc(o.row_s, fill), 1, 1.0f, 0, NULL};
  o.col = MxOut{(uint8_t *)dev_alloc(o.bytes, fill), NULL, (float *)dev_alloc(o.col_s, fill), 1, 1.0f, blk, NULL};
  return o;
}
static void free_outs(Outs *o) {
  cudaFree(o->row.q), cudaFree(o->row.scale), cudaFree(o->col.q), cudaFree(o->col.scale);
}

static const float ALPHA = 1.0f / 36.0f;  // mx_unit(MX_SCALE_UP)^2

static void test_shape(int M, int N, int K) {
  Operands op = make_operands(M, N, K);
  bf16 *gate = make_bf16(M, N, 2.0f);
  bf16 *up_ref = (bf16 *)dalloc((size_t)M * N * 2), *up_lt = (bf16 *)dalloc((size_t)M * N * 2),
       *up = (bf16 *)dalloc((size_t)M * N * 2);
  fp4_gemm_cutlass_cfg(up_ref, NULL, 0, op.A, op.B, M, N, K, ALPHA, 0.0f, 0);
  fp4_gemm_fp8(up_lt, 0, op.A, op.B, M, N, K, ALPHA, 0.0f);
  CHECK(same_bytes_at("CUTLASS vs cuBLASLt up", up_ref, 1, up_lt, 1, (size_t)M * N * 2, N * 2),
        "%d x %d x %d: CUTLASS's GEMM differs from cuBLASLt's (the unfused reference itself)", M, N, K);
  for (int blk = 0; blk < 2; blk++)
    for (int had = 0; had < 2; had++) {
      Outs ref = make_outs(M, N, blk, 0xAB), got = make_outs(M, N, blk, 0x5C);
      mx_quantize_dual_swiglu_cuda(gate, up_ref, M, N, MX_SCALE_UP, ref.row, had, ref.col);
      CUDA_CHECK(cudaMemset(up, 0xff, (size_t)M * N * 2));
      up_gemm_swiglu_mx_cuda(up, gate, op.A, op.B, M, N, K, ALPHA, MX_SCALE_UP, got.row, had, got.col);
      const char *form = blk ? "BLK128x128 columns" : "VEC128 columns", *h = had ? "H32" : "no H";
      CHECK(same_bytes_at("up", up_ref, 1, up, 1, (size_t)M * N * 2, N * 2),
            "%d x %d x %d (%s, %s): up differs from the GEMM's", M, N, K, form, h);
      CHECK(same_bytes_at("row copy", ref.row.q, 1, got.row.q, 1, ref.bytes, N) &&
                same_bytes_at("row scales", ref.row.scale, 1, got.row.scale, 1, ref.row_s, 0),
            "%d x %d x %d (%s, %s): the row copy differs from GEMM + fused producer", M, N, K, form, h);
      CHECK(same_bytes_at("column copy", ref.col.q, 1, got.col.q, 1, ref.bytes, M) &&
                same_bytes_at("column scales", ref.col.scale, 1, got.col.scale, 1, ref.col_s, 0),
            "%d x %d x %d (%s, %s): the column copy differs from GEMM + fused producer", M, N, K, form, h);
      free_outs(&ref), free_outs(&got);
    }
  cudaFree(gate), cudaFree(up_ref), cudaFree(up_lt), cudaFree(up);
  free_operands(&op);
}

// ---- time: the fused kernel against GEMM + fused producer, with either GEMM kernel
typedef struct {
  int M, N, K;
  Operands op;
  bf16 *gate, *up;
  Outs o;
} Bench;
static void run_fused(void *p) {
  Bench *b = (Bench *)p;
  up_gemm_swiglu_mx_cuda(b->up, b->gate, b->op.A, b->op.B, b->M, b->N, b->K, ALPHA, MX_SCALE_UP, b->o.row, 1, b->o.col);
}
static void run_cutlass_then_producer(void *p) {
  Bench *b = (Bench *)p;
  fp4_gemm_cutlass_cfg(b->up, NULL, 0, b->op.A, b->op.B, b->M, b->N, b->K, ALPHA, 0.0f, 0);
  mx_quantize_dual_swiglu_cuda(b->gate, b->up, b->M, b->N, MX_SCALE_UP, b->o.row, 1, b->o.col);
}
static void run_cublaslt_then_producer(void *p) {
  Bench *b = (Bench *)p;
  fp4_gemm_fp8(b->up, 0, b->op.A, b->op.B, b->M, b->N, b->K, ALPHA, 0.0f);
  mx_quantize_dual_swiglu_cuda(b->gate, b->up, b->M, b->N, MX_SCALE_UP, b->o.row, 1, b->o.col);
}
static void run_cublaslt(void *p) {
  Bench *b = (Bench *)p;
  fp4_gemm_fp8(b->up, 0, b->op.A, b->op.B, b->M, b->N, b->K, ALPHA, 0.0f);
}
static void run_producer(void *p) {
  Bench *b = (Bench *)p;
  mx_quantize_dual_swiglu_cuda(b->gate, b->up, b->M, b->N, MX_SCALE_UP, b->o.row, 1, b->o.col);
}

static void bench(void) {
  const int shapes[2][3] = {{8192, 14336, 4096}, {16384, 14336, 4096}};
  printf("\nup GEMM + SwiGLU + down's MX copies (FP8 rows, H32 BLK128x128 columns), median us:\n");
  printf("%6s %6s %5s | %9s | %12s %12s | %9s %9s | %s\n", "M", "N", "K", "fused", "CUTLASS+prod", "cuBLASLt+prod",
         "cuBLASLt", "producer", "fused vs best unfused");
  for (int s = 0; s < 2; s++) {
    Bench b;
    b.M = shapes[s][0], b.N = shapes[s][1], b.K = shapes[s][2];
    b.op = make_operands(b.M, b.N, b.K);
    b.gate = make_bf16(b.M, b.N, 1.0f), b.up = (bf16 *)dalloc((size_t)b.M * b.N * 2);
    b.o = make_outs(b.M, b.N, 1, 0);
    const double f = 1e3 * time_median_ms(run_fused, &b), c = 1e3 * time_median_ms(run_cutlass_then_producer, &b),
                 l = 1e3 * time_median_ms(run_cublaslt_then_producer, &b), g = 1e3 * time_median_ms(run_cublaslt, &b),
                 q = 1e3 * time_median_ms(run_producer, &b);
    const double best = c < l ? c : l;
    printf("%6d %6d %5d | %9.1f | %12.1f %12.1f | %9.1f %9.1f | %.3fx (%+.1f us)\n", b.M, b.N, b.K, f, c, l, g, q,
           best / f, f - best);
    cudaFree(b.gate), cudaFree(b.up);
    free_outs(&b.o), free_operands(&b.op);
  }
}

int main(int argc, char **argv) {
  rng_seed(&rng, 31);
  Fp8Operand z = {NULL, NULL, 0};
  MxOut zo = {};
  const char *why = swiglu_epilogue_unsupported(z, z, 128, 128, 128, zo, zo);
  if (why && (strstr(why, "CUTLASS") || strstr(why, "sm_90"))) {  // a build or GPU without the kernel
    printf("skipped: %s\n", why);
    TEST_END();
  }
  TEST_SECTION("up GEMM with SwiGLU and down's MX producers in its epilogue == GEMM + fused producer");
  const int sh[5][3] = {{128, 128, 128}, {256, 384, 256}, {384, 1024, 512}, {1024, 2048, 4096}, {2048, 14336, 4096}};
  for (int i = 0; i < 5; i++) test_shape(sh[i][0], sh[i][1], sh[i][2]);
  if (!(argc > 1 && !strcmp(argv[1], "--no-bench"))) bench();
  TEST_END();
}
