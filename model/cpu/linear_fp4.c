// model/cpu/linear_fp4.c: the FP4 linear layer of the CPU backend, the fp32 reference of every route
// (fp4/recipe.h): each GEMM's operands are quantized with the C reference of the contraction's
// format, dequantized to fp32 and multiplied by matmul.c's fp32 products; CTA-local NVFP4 multiplies
// its unscaled operands (q * bs', exact) and applies the outer factors after the accumulation, as the
// GPU does. The operands, per format (the CUDA layer's, model/cuda/linear_fp4.h):
//   Fprop  x rows (RNE), W (2D tiles, or rows)          Y = x W^T
//   Dgrad  dY rows (SR with sr_dgrad), W^T (W's 2D tiles, or rows of W^T)   dX = dY W
//   Wgrad  dY and x rotated along tokens (the recipe's Hadamard), transposed, rows along tokens (dY SR
//          with sr_wgrad)                                 dW = dY^T x
// SR bits: philox_stream(seed, step, micro, layer, 4 * kind + use), use 0 = dY for Dgrad, 1 = dY for
// Wgrad, as the CUDA layer draws them. Weights are quantized at every call (the CPU has no cache).
#include "model/cpu/linear_fp4.h"

#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fp4/hadamard.h"
#include "fp4/mxfp4.h"
#include "fp4/nvfp4.h"
#include "fp4/nvfp4_cta.h"

// A dequantized operand [rows, K]: the values, and for CTA-local NVFP4 the unscaled values with their
// outer factors per 256 rows (outer NULL otherwise).
typedef struct {
  float *v, *outer;
} Deq;

static void deq_free(Deq *d) { free(d->v), free(d->outer); }

static int block_of(FP4Format f) { return f == FMT_MXFP4 ? 32 : 16; }

// n must be a multiple of mult (the format's block, or the Hadamard's length) for linear id in format f.
static void require(LinearId id, FP4Format f, const char *what, int n, int mult) {
  if (n % mult)
    die("FP4 linear %s of block %d (%s): %s = %d is not a multiple of %d, which its blocks need; keep the block in "
        "BF16 (precision.blocks or bf16_*_blocks) or change the model's sizes",
        linear_kind_name(id.kind), id.layer, recipe_format_name(f), what, n, mult);
}

// Rows of x [rows, K] in format f.
static Deq deq_rows(const LinearFp4Cpu *L, FP4Format f, const float *x, int rows, int K, int sr, PhiloxStream s) {
  size_t n = (size_t)rows * K;
  Deq d = {xmalloc(n * sizeof(float)), NULL};
  uint8_t *codes = xmalloc(n / 2 + 1), *scales = xmalloc(n / 16 + 1);
  if (f == FMT_MXFP4) {
    MxScale m = L->r.scale_round_up ? MX_SCALE_UP : MX_SCALE_DOWN;
    mx_quantize_rows(x, rows, K, m, sr ? MX_SR : MX_RNE, s, codes, scales);
    mx_dequantize(codes, scales, rows, K, m, d.v);
  } else if (f == FMT_NVFP4) {
    float amax = nvfp4_amax(x, n);
    nvfp4_quantize_rows(x, rows, K, amax, sr ? NV_SR : NV_RNE, s, codes, scales);
    nvfp4_dequantize(codes, scales, rows, K, amax, d.v);
  } else {
    d.outer = xmalloc((size_t)cta_stripes(rows) * sizeof(float));
    nvfp4_cta_quantize_rows(x, rows, K, sr ? NV_SR : NV_RNE, s, codes, scales, d.outer);
    nvfp4_cta_dequantize_unscaled(codes, scales, rows, K, d.v);
  }
  free(codes), free(scales);
  return d;
}

static float *transpose(const float *x, int rows, int cols) {
  float *t = xmalloc((size_t)rows * cols * sizeof *t);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) t[(size_t)c * rows + r] = x[(size_t)r * cols + c];
  return t;
}

// W [N, K] for Fprop (transposed = 0) or W^T [K, N] for Dgrad (1): with 2D scales one set of codes for
// both, else rows of W or of W^T.
static Deq deq_weight(const LinearFp4Cpu *L, FP4Format f, const float *w, int N, int K, int transposed) {
  const PhiloxStream none = {{0, 0}, 0, 0, 0};
  if (!L->r.weight_2d) {
    if (!transposed) return deq_rows(L, f, w, N, K, 0, none);
    float *wt = transpose(w, N, K);
    Deq d = deq_rows(L, f, wt, K, N, 0, none);
    free(wt);
    return d;
  }
  size_t n = (size_t)N * K;
  Deq d = {xmalloc(n * sizeof(float)), NULL};
  uint8_t *codes = xmalloc(n / 2 + 1), *scales = xmalloc(n / 16 + 1);
  int rows = transposed ? K : N, cols = transposed ? N : K;
  uint8_t *c = transposed ? NULL : codes, *s = transposed ? NULL : scales;
  uint8_t *ct = transposed ? codes : NULL, *st = transposed ? scales : NULL;
  if (f == FMT_MXFP4) {
    MxScale m = L->r.scale_round_up ? MX_SCALE_UP : MX_SCALE_DOWN;
    mx_quantize_weight(w, N, K, m, 1, c, s, ct, st);
    mx_dequantize(codes, scales, rows, cols, m, d.v);
  } else if (f == FMT_NVFP4) {
    float amax = nvfp4_amax(w, n);
    nvfp4_quantize_weight(w, N, K, amax, c, s, ct, st);
    nvfp4_dequantize(codes, scales, rows, cols, amax, d.v);
  } else {
    d.outer = xmalloc((size_t)cta_stripes(rows) * sizeof(float));
    nvfp4_cta_quantize_weight(w, N, K, c, s, transposed ? NULL : d.outer, ct, st, transposed ? d.outer : NULL);
    nvfp4_cta_dequantize_unscaled(codes, scales, rows, cols, d.v);
  }
  free(codes), free(scales);
  return d;
}

// A Wgrad operand: x [rows = tokens, K] rotated along the tokens by the recipe's Hadamard, then x^T
// [K, tokens] quantized in rows (blocks along the tokens).
static Deq deq_cols(const LinearFp4Cpu *L, FP4Format f, const float *x, int rows, int K, int sr, PhiloxStream s) {
  float *t = xmalloc((size_t)rows * K * sizeof *t);
  memcpy(t, x, (size_t)rows * K * sizeof *t);
  if (L->r.hadamard == 32 || (L->r.hadamard == 16 && !L->r.hadamard_plain)) {
    fp4_hadamard_cols(t, rows, K, L->r.hadamard);
  } else if (L->r.hadamard == 16) {
    float v[16];
    for (int r0 = 0; r0 < rows; r0 += 16)
      for (int k = 0; k < K; k++) {
        for (int i = 0; i < 16; i++) v[i] = t[(size_t)(r0 + i) * K + k];
        fp4_h16_plain(v);
        for (int i = 0; i < 16; i++) t[(size_t)(r0 + i) * K + k] = v[i];
      }
  }
  float *tt = transpose(t, rows, K);
  free(t);
  Deq d = deq_rows(L, f, tt, K, rows, sr, s);
  free(tt);
  return d;
}

// out [M, N] = a [M, K] b [N, K]^T, then the outer factors where the operands have them.
static void gemm(float *out, const Deq *a, const Deq *b, int M, int N, int K) {
  matmul_forward(out, a->v, b->v, M, K, N);
  if (a->outer) nvfp4_cta_apply_outer(out, M, N, a->outer, b->outer);
}

static PhiloxStream stream(const LinearFp4Cpu *L, LinearId id, int use) {
  return philox_stream(L->seed, L->step, L->micro, (uint32_t)id.layer, 4u * (uint32_t)id.kind + (uint32_t)use);
}

LinearFp4Cpu linear_fp4_cpu_route(const RecipeSpec *s, int n_layers, uint64_t seed) {
  LinearFp4Cpu L;
  memset(&L, 0, sizeof L);
  char err[512];
  if (recipe_resolve(&L.r, s, 0, err, sizeof err)) die("%s", err);
  L.nlayers = n_layers, L.seed = seed;
  return L;
}

FP4Format linear_fp4_cpu_format(const LinearFp4Cpu *L, LinearId id, Contraction c) {
  if (id.layer < 0 || id.kind == LIN_HEAD || (L->r.format == FMT_BF16 && !L->r.nspans)) return FMT_BF16;
  return recipe_format(&L->r, id.layer, L->nlayers, c);
}

void linear_fp4_cpu_forward(const LinearFp4Cpu *L, LinearId id, float *out, const float *x, const float *w, int N,
                            int in, int out_dim) {
  FP4Format f = linear_fp4_cpu_format(L, id, CONTR_FPROP);
  if (f == FMT_BF16) {
    matmul_forward(out, x, w, N, in, out_dim);
    return;
  }
  require(id, f, "in", in, block_of(f));
  if (L->r.weight_2d) require(id, f, "out (2D weight tiles)", out_dim, block_of(f));
  const PhiloxStream none = {{0, 0}, 0, 0, 0};
  Deq xq = deq_rows(L, f, x, N, in, 0, none), wq = deq_weight(L, f, w, out_dim, in, 0);
  gemm(out, &xq, &wq, N, out_dim, in);
  deq_free(&xq), deq_free(&wq);
}

void linear_fp4_cpu_backward(const LinearFp4Cpu *L, LinearId id, float *dx, float *dw, const float *dout,
                             const float *x, const float *w, int N, int in, int out_dim, int dx_accumulate) {
  FP4Format fd = dx ? linear_fp4_cpu_format(L, id, CONTR_DGRAD) : FMT_BF16;
  FP4Format fw = dw ? linear_fp4_cpu_format(L, id, CONTR_WGRAD) : FMT_BF16;
  if (dx && fd == FMT_BF16) matmul_backward(dx, NULL, dout, x, w, N, in, out_dim, dx_accumulate);
  if (dw && fw == FMT_BF16) matmul_backward(NULL, dw, dout, x, w, N, in, out_dim, 0);
  if (dx && fd != FMT_BF16) {
    require(id, fd, "out", out_dim, block_of(fd));
    if (L->r.weight_2d) require(id, fd, "in (2D weight tiles)", in, block_of(fd));
    Deq dy = deq_rows(L, fd, dout, N, out_dim, L->r.sr_dgrad, stream(L, id, 0));
    Deq wt = deq_weight(L, fd, w, out_dim, in, 1);
    float *t = xmalloc((size_t)N * in * sizeof *t);
    gemm(t, &dy, &wt, N, in, out_dim);
    for (size_t i = 0; i < (size_t)N * in; i++) dx[i] = dx_accumulate ? dx[i] + t[i] : t[i];
    free(t), deq_free(&dy), deq_free(&wt);
  }
  if (dw && fw != FMT_BF16) {
    require(id, fw, "tokens (N)", N, block_of(fw) > L->r.hadamard ? block_of(fw) : L->r.hadamard);
    const PhiloxStream none = {{0, 0}, 0, 0, 0};
    Deq dyc = deq_cols(L, fw, dout, N, out_dim, L->r.sr_wgrad, stream(L, id, 1));
    Deq xc = deq_cols(L, fw, x, N, in, 0, none);
    float *t = xmalloc((size_t)in * out_dim * sizeof *t);
    gemm(t, &dyc, &xc, out_dim, in, N);
    for (size_t i = 0; i < (size_t)in * out_dim; i++) dw[i] += t[i];
    free(t), deq_free(&dyc), deq_free(&xc);
  }
}
