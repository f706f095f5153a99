// tests/gpu/gpu_test_fused.cu: the fused producers of model/cuda/quant_fused.h (format-aware fusion). Their bytes
// must equal the unfused pair's: rmsnorm_forward_cuda (or swiglu_forward_cuda) writing BF16, then
// mx_quantize_dual_cuda on it (whose bytes gpu_test_fp4_mx holds to the CPU reference). Row and column
// copies, FP8-embedded and packed, H32 and none, shapes with partial 128-tiles, inputs with outliers
// and exact zeros; rstd-only RMSNorm equal to the full one. Then a bandwidth table: each fused producer
// against the copy rate measured on the GPU at hand, and the unfused pair's time for the same work.
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fp4/fp8_embed.h"
#include "fp4/mxfp4.h"
#include "common/cuda_common.h"
#include "model/cuda/ops_cuda.h"
#include "model/cuda/quant_fused.h"
#include "tests/test.h"
#include "tests/gpu/gpu_util.h"

typedef __nv_bfloat16 bf16;
static Rng rng;

static void *dalloc(size_t n) { return dev_alloc(n, 0); }

// rows x K BF16 values: normal, every 37th an outlier (x 100) when outliers, every 101st an exact zero.
static bf16 *make_bf16(size_t rows, size_t K, float scale, int outliers = 1) {
  size_t n = rows * K;
  bf16 *h = (bf16 *)xmalloc(n * sizeof(bf16)), *d = (bf16 *)dalloc(n * sizeof(bf16));
  for (size_t i = 0; i < n; i++) {
    float v = (float)rng_normal(&rng) * scale;
    if (outliers && i % 37 == 5) v *= 100.0f;
    if (i % 101 == 7) v = 0.0f;
    h[i] = __float2bfloat16(v);
  }
  CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(bf16), cudaMemcpyHostToDevice));
  free(h);
  return d;
}

typedef struct {
  MxOut row, col;
  size_t row_bytes, col_bytes, row_sbytes, col_sbytes;
} Outs;

// fp8: 0 packed, 1 FP8 (VEC128 columns), 2 FP8 with the column copy in BLK128x128 (a Wgrad 2D operand).
static Outs make_outs(int rows, int K, int kind) {
  Outs o;
  const int fp8 = kind != 0, blk = kind == 2;
  memset(&o, 0, sizeof o);
  o.row_bytes = fp8 ? (size_t)rows * K : (size_t)rows * K / 2;
  o.col_bytes = o.row_bytes;
  o.row_sbytes = fp8 ? mx_vec128_scale_count(rows, K) * 4 : (size_t)rows * K / 32;
  o.col_sbytes = blk   ? mx_blk128_scale_count(K, rows) * 4
                 : fp8 ? mx_vec128_scale_count(K, rows) * 4
                       : (size_t)rows * K / 32;
  o.col.blk128 = blk;
  o.row.q = (uint8_t *)dalloc(o.row_bytes), o.col.q = (uint8_t *)dalloc(o.col_bytes);
  o.row.fp8 = o.col.fp8 = fp8, o.row.scale_mul = o.col.scale_mul = 1.0f;
  if (fp8) o.row.scale = (float *)dalloc(o.row_sbytes), o.col.scale = (float *)dalloc(o.col_sbytes);
  else o.row.e8m0 = (uint8_t *)dalloc(o.row_sbytes), o.col.e8m0 = (uint8_t *)dalloc(o.col_sbytes);
  return o;
}
static void free_outs(Outs *o) {
  cudaFree(o->row.q), cudaFree(o->col.q);
  cudaFree(o->row.fp8 ? (void *)o->row.scale : (void *)o->row.e8m0);
  cudaFree(o->col.fp8 ? (void *)o->col.scale : (void *)o->col.e8m0);
}

static int same_bytes(const void *a, const void *b, size_t n) { return same_bytes_at(NULL, a, 1, b, 1, n, 0); }

static int same_outs(const Outs *a, const Outs *b) {
  const void *sa_r = a->row.fp8 ? (void *)a->row.scale : (void *)a->row.e8m0;
  const void *sb_r = b->row.fp8 ? (void *)b->row.scale : (void *)b->row.e8m0;
  const void *sa_c = a->col.fp8 ? (void *)a->col.scale : (void *)a->col.e8m0;
  const void *sb_c = b->col.fp8 ? (void *)b->col.scale : (void *)b->col.e8m0;
  return same_bytes(a->row.q, b->row.q, a->row_bytes) && same_bytes(a->col.q, b->col.q, a->col_bytes) &&
         same_bytes(sa_r, sb_r, a->row_sbytes) && same_bytes(sa_c, sb_c, a->col_sbytes);
}

// The output forms the fused tests cover: packed codes, FP8 rows and columns, FP8 with 128x128 columns.
static const char *out_form(int fp8) { return fp8 == 2 ? "fp8, BLK128x128 columns" : fp8 ? "fp8" : "packed"; }

static void test_rmsnorm(int rows, int D) {
  bf16 *x = make_bf16(rows, D, 1.0f), *y = (bf16 *)dalloc((size_t)rows * D * 2);
  float *w = (float *)dalloc(D * 4), *rstd = (float *)dalloc(rows * 4), *rstd2 = (float *)dalloc(rows * 4);
  float *hw = (float *)xmalloc(D * 4);
  for (int i = 0; i < D; i++) hw[i] = 1.0f + 0.3f * (float)rng_normal(&rng);
  CUDA_CHECK(cudaMemcpy(w, hw, D * 4, cudaMemcpyHostToDevice));
  rmsnorm_forward_cuda(y, rstd, x, w, rows, D, 1e-5f);
  rmsnorm_forward_cuda(NULL, rstd2, x, w, rows, D, 1e-5f);
  CHECK(same_bytes(rstd, rstd2, rows * 4), "rmsnorm %d x %d: rstd-only pass differs from the full one", rows, D);
  for (int fp8 = 0; fp8 < 3; fp8++)
    for (int had = 0; had < 2; had++) {
      Outs ref = make_outs(rows, D, fp8), got = make_outs(rows, D, fp8);
      PhiloxStream none = {};
      mx_quantize_dual_cuda(y, rows, D, MX_SCALE_UP, MX_RNE, none, ref.row, had, ref.col);
      mx_quantize_dual_rmsnorm_cuda(x, rstd2, w, rows, D, MX_SCALE_UP, got.row, had, got.col);
      CHECK(same_outs(&ref, &got), "rmsnorm %d x %d (%s, %s): fused bytes differ from rmsnorm + dual producer", rows, D,
            out_form(fp8), had ? "H32" : "no Hadamard");
      free_outs(&ref), free_outs(&got);
    }
  cudaFree(x), cudaFree(y), cudaFree(w), cudaFree(rstd), cudaFree(rstd2), free(hw);
}

static void test_swiglu(int rows, int F) {
  bf16 *g = make_bf16(rows, F, 2.0f), *u = make_bf16(rows, F, 1.0f), *y = (bf16 *)dalloc((size_t)rows * F * 2);
  swiglu_forward_cuda(y, g, u, (size_t)rows * F);
  for (int fp8 = 0; fp8 < 3; fp8++)
    for (int had = 0; had < 2; had++) {
      Outs ref = make_outs(rows, F, fp8), got = make_outs(rows, F, fp8);
      PhiloxStream none = {};
      mx_quantize_dual_cuda(y, rows, F, MX_SCALE_UP, MX_RNE, none, ref.row, had, ref.col);
      mx_quantize_dual_swiglu_cuda(g, u, rows, F, MX_SCALE_UP, got.row, had, got.col);
      CHECK(same_outs(&ref, &got), "swiglu %d x %d (%s, %s): fused bytes differ from swiglu + dual producer", rows, F,
            out_form(fp8), had ? "H32" : "no Hadamard");
      free_outs(&ref), free_outs(&got);
    }
  cudaFree(g), cudaFree(u), cudaFree(y);
}

// ---- benchmark ------------------------------------------------------------------------------------
typedef struct {
  int rows, K, swiglu;
  bf16 *a, *b, *y;
  float *w, *rstd;
  Outs o;
} Bench;

static void run_fused(void *p) {
  Bench *B = (Bench *)p;
  if (B->swiglu) {
    mx_quantize_dual_swiglu_cuda(B->a, B->b, B->rows, B->K, MX_SCALE_UP, B->o.row, 1, B->o.col);
  } else {
    rmsnorm_forward_cuda(NULL, B->rstd, B->a, B->w, B->rows, B->K, 1e-5f);
    mx_quantize_dual_rmsnorm_cuda(B->a, B->rstd, B->w, B->rows, B->K, MX_SCALE_UP, B->o.row, 1, B->o.col);
  }
}
static void run_unfused(void *p) {
  Bench *B = (Bench *)p;
  PhiloxStream none = {};
  if (B->swiglu) swiglu_forward_cuda(B->y, B->a, B->b, (size_t)B->rows * B->K);
  else rmsnorm_forward_cuda(B->y, B->rstd, B->a, B->w, B->rows, B->K, 1e-5f);
  mx_quantize_dual_cuda(B->y, B->rows, B->K, MX_SCALE_UP, MX_RNE, none, B->o.row, 1, B->o.col);
}

static void bench(void) {
  copy_gbs_here();  // its line before the table
  printf("\n%-46s %6s %6s %9s %8s %6s %12s\n", "fused producer (FP8 rows + H32 cols)", "rows", "K", "time(us)", "GB/s",
         "%copy", "unfused(us)");
  const int toks[2] = {8192, 16384};
  for (int sw = 0; sw < 2; sw++)
    for (int ti = 0; ti < 2; ti++) {
      Bench B;
      memset(&B, 0, sizeof B);
      B.rows = toks[ti], B.K = sw ? 14336 : 4096, B.swiglu = sw;
      size_t n = (size_t)B.rows * B.K;
      // activation-like data (no x100 outliers: SiLU's exp and division then take their fast paths, as
      // on a model's gate values)
      B.a = make_bf16(B.rows, B.K, 1.0f, 0), B.b = sw ? make_bf16(B.rows, B.K, 1.0f, 0) : NULL;
      B.y = (bf16 *)dalloc(n * 2);
      B.w = (float *)dalloc(B.K * 4), B.rstd = (float *)dalloc(B.rows * 4);
      B.o = make_outs(B.rows, B.K, 1);
      // bytes read + written: the inputs (x twice for RMSNorm: its rstd pass, then the producer), both copies
      double out = 2.0 * (n + n / 32.0), bytes = sw ? 4.0 * n + out : 4.0 * n + 8.0 * B.rows + out;
      double us = 1e3 * time_median_ms(run_fused, &B), un = 1e3 * time_median_ms(run_unfused, &B),
             gbs = bytes / (us * 1e-6) / 1e9;
      printf("%-46s %6d %6d %9.1f %8.0f %5.1f%% %12.1f\n",
             sw ? "SwiGLU -> down's x copies (fused)" : "RMSNorm (rstd pass + fused producer)", B.rows, B.K, us, gbs,
             gbs / copy_gbs_here() * 100, un);
      cudaFree(B.a), cudaFree(B.y), cudaFree(B.w), cudaFree(B.rstd);
      if (B.b) cudaFree(B.b);
      free_outs(&B.o);
    }
}

int main(int argc, char **argv) {
  rng_seed(&rng, 77);
  TEST_SECTION("RMSNorm fused into the dual producer == rmsnorm + dual producer");
  const int rr[5] = {32, 96, 160, 288, 1024}, dd[5] = {32, 160, 416, 4096, 4096};
  for (int i = 0; i < 5; i++) test_rmsnorm(rr[i], dd[i]);
  TEST_SECTION("SwiGLU fused into the dual producer == swiglu + dual producer");
  const int fr[4] = {32, 96, 288, 256}, ff[4] = {96, 544, 1024, 14336};
  for (int i = 0; i < 4; i++) test_swiglu(fr[i], ff[i]);
  if (!(argc > 1 && !strcmp(argv[1], "--no-bench"))) bench();
  TEST_END();
}
