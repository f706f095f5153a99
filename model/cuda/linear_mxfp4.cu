// model/cuda/linear_mxfp4.cu: MXFP4 as the FP4 linear layer runs it (LinearFormat, linear_fp4.h): 1x32
// blocks with E8M0 scales (docs/formats.md), the 0.87 rule for 32x32 weight tiles, the dual producer
// (row and column copies from one read, RNE columns with H32 or no Hadamard) with RMSNorm and SwiGLU
// fused into it, the FP8 embedding on Hopper, and alpha = mx_unit^2 (no tensor scale).
#include "common/common.h"
#include "fp4/fp8_embed.h"
#include "fp4/mxfp4.h"
#include "model/cuda/linear_fp4.h"
#include "model/cuda/quant_fused.h"

static MxOut out_or_none(const QOp *o) { return o ? linear_mx_out(*o) : MxOut{}; }

// W and/or W^T (a hybrid may take W^T in another format).
static void weight(LinearFp4 *L, const bf16 *w16, int O, int I, const QOp *wq, const QOp *wtq, float *amax) {
  PhiloxStream none = {};
  if (L->recipe.weight_2d) {  // 32x32 tiles, the 0.87 rule; W and W^T with the same codes
    mx_quantize_weight_bf16_cuda(w16, O, I, linear_mx_mode(L), 1, out_or_none(wq), out_or_none(wtq));
  } else if (wtq) {  // 1x32 along in (row copy, skipped without wq) and, for W^T, along out (column copy)
    mx_quantize_dual_cuda(w16, O, I, linear_mx_mode(L), MX_RNE, none, out_or_none(wq), 0, linear_mx_out(*wtq));
  } else if (wq) {
    mx_quantize_rows_cuda(w16, O, I, linear_mx_mode(L), MX_RNE, none, linear_mx_out(*wq));
  }
}

static void rows(LinearFp4 *L, const bf16 *x, int n, int K, int sr, PhiloxStream s, const QOp &dst, float *amax) {
  mx_quantize_rows_cuda(x, n, K, linear_mx_mode(L), sr ? MX_SR : MX_RNE, s, linear_mx_out(dst));
}

// The dual producer's column copy is RNE, with H32 or no Hadamard.
static int has_dual(const LinearFp4 *L, int sr_col) {
  const int had = L->recipe.hadamard;
  return (had == 0 || had == 32) && !sr_col;
}

static int dual(LinearFp4 *L, const bf16 *x, int n, int K, int sr_row, PhiloxStream s_row, const QOp *row, int sr_col,
                const QOp &col) {
  if (!has_dual(L, sr_col)) return 0;
  mx_quantize_dual_cuda(x, n, K, linear_mx_mode(L), sr_row ? MX_SR : MX_RNE, s_row, linear_mx_out(row ? *row : QOp{}),
                        L->recipe.hadamard == 32, linear_col_out(L, col, n, K));
  return 1;
}

// Column copy by the dual producer where it applies, else mx_quantize_cols_cuda (any Hadamard, SR)
// into packed codes, then the FP8 embedding when dst is FP8.
static void cols(LinearFp4 *L, const bf16 *x, int n, int K, int sr, PhiloxStream s, const QOp &dst, float *amax) {
  if (dual(L, x, n, K, 0, s, NULL, sr, dst)) return;
  QOp packed = dst.fp8 ? linear_scratch_op(L, &linear_mxfp4, S_PACKED_TMP, 0, 0, K, n) : dst;
  mx_quantize_cols_cuda(x, n, K, linear_mx_mode(L), linear_mx_hadamard(L), sr ? MX_SR : MX_RNE, s, packed.q, packed.sb);
  if (dst.fp8 && dst.blk128) mx_embed_blk128_cuda(packed.q, packed.sb, K, n, 1.0f, dst.q, dst.sf);
  else if (dst.fp8) mx_embed_vec128_cuda(packed.q, packed.sb, K, n, 1.0f, dst.q, dst.sf);
}

static void dual_rmsnorm(LinearFp4 *L, const bf16 *x, const float *rstd, const float *w, int n, int K, const QOp &row,
                         const QOp &col) {
  mx_quantize_dual_rmsnorm_cuda(x, rstd, w, n, K, linear_mx_mode(L), linear_mx_out(row), L->recipe.hadamard == 32,
                                linear_col_out(L, col, n, K));
}

static void dual_swiglu(LinearFp4 *L, const bf16 *gate, const bf16 *up, int n, int K, const QOp &row, const QOp &col) {
  mx_quantize_dual_swiglu_cuda(gate, up, n, K, linear_mx_mode(L), linear_mx_out(row), L->recipe.hadamard == 32,
                               linear_col_out(L, col, n, K));
}

static float alpha(LinearFp4 *L, const float *amax_a, const float *amax_b, const float **alpha_dev) {
  const float u = mx_unit(linear_mx_mode(L));
  *alpha_dev = NULL;
  return u * u;
}

const LinearFormat linear_mxfp4 = {
    FMT_MXFP4, "mxfp4", "mx",     32,   /*reads=*/1,  /*fp8_embed=*/1, /*outer=*/0, weight,
    rows,      cols,    has_dual, dual, dual_rmsnorm, dual_swiglu,     alpha,
};
