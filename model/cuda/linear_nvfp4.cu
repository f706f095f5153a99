// model/cuda/linear_nvfp4.cu: NVFP4 as the FP4 linear layer runs it (LinearFormat, linear_fp4.h): 1x16
// blocks with E4M3 scales under an fp32 tensor scale per operand (docs/formats.md). Each copy takes
// the tensor amax first (a pass of its own, kept on the device), and the GEMM's alpha is computed on
// the device from the two operands' amaxes. 16x16 weight tiles; no dual or fused producers; packed
// operands only (the reference GEMM on Hopper, the native one on Blackwell).
#include "fp4/hadamard.h"
#include "fp4/nvfp4.h"
#include "model/cuda/linear_fp4.h"

// W and/or W^T (a hybrid may take the other in another format).
static void weight(LinearFp4 *L, const bf16 *w16, int O, int I, const QOp *wq, const QOp *wtq, float *amax) {
  nvfp4_amax_cuda(amax, w16, (size_t)O * I);
  if (L->recipe.weight_2d) {  // 16x16 tiles
    nvfp4_quantize_weight_bf16_cuda(w16, O, I, amax, wq ? wq->q : NULL, wq ? wq->sb : NULL, wtq ? wtq->q : NULL,
                                    wtq ? wtq->sb : NULL);
  } else {
    PhiloxStream none = {};
    if (wq) nvfp4_quantize_rows_cuda(w16, O, I, amax, NV_RNE, none, wq->q, wq->sb);
    if (wtq) nvfp4_quantize_cols_cuda(w16, O, I, FP4_ROT_NONE, amax, NV_RNE, none, wtq->q, wtq->sb);
  }
}

static void rows(LinearFp4 *L, const bf16 *x, int n, int K, int sr, PhiloxStream s, const QOp &dst, float *amax) {
  nvfp4_amax_cuda(amax, x, (size_t)n * K);
  nvfp4_quantize_rows_cuda(x, n, K, amax, sr ? NV_SR : NV_RNE, s, dst.q, dst.sb);
}

// The tensor amax is of the rotated values when the recipe applies a Hadamard (H16, fixed-sign or plain).
static void cols(LinearFp4 *L, const bf16 *x, int n, int K, int sr, PhiloxStream s, const QOp &dst, float *amax) {
  const int rot = L->recipe.hadamard != 16 ? FP4_ROT_NONE : L->recipe.hadamard_plain ? FP4_ROT_H16_PLAIN : FP4_ROT_H16;
  if (rot != FP4_ROT_NONE) nvfp4_amax_hadamard_cuda(amax, x, n, K, rot);
  else nvfp4_amax_cuda(amax, x, (size_t)n * K);
  nvfp4_quantize_cols_cuda(x, n, K, rot, amax, sr ? NV_SR : NV_RNE, s, dst.q, dst.sb);
}

static int has_dual(const LinearFp4 *L, int sr_col) { return 0; }

static int dual(LinearFp4 *L, const bf16 *x, int n, int K, int sr_row, PhiloxStream s_row, const QOp *row, int sr_col,
                const QOp &col) {
  return 0;
}

static float alpha(LinearFp4 *L, const float *amax_a, const float *amax_b, const float **alpha_dev) {
  float *a = linear_dev_scalar(L, D_ALPHA);
  nvfp4_gemm_alpha_cuda(a, amax_a, amax_b);
  *alpha_dev = a;
  return 1.0f;
}

const LinearFormat linear_nvfp4 = {
    FMT_NVFP4, "nvfp4",  "nv", 16,   /*reads=*/2, /*fp8_embed=*/0, /*outer=*/0, weight, rows,
    cols,      has_dual, dual, NULL, NULL,        alpha,
};
