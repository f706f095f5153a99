// model/cuda/linear_nvfp4_cta.cu: CTA-local NVFP4 as the FP4 linear layer runs it (LinearFormat,
// linear_fp4.h): 1x16 blocks with E4M3 scales under fp32 outer factors per 256-row stripe of each
// operand (fp4/nvfp4_cta.h, docs/formats.md §5). The producers write the factors into the operand's
// QOp.outer; the GEMM runs on the unscaled operands and applies alpha_i beta_j after the whole
// accumulation (fp4_gemm_cta), so alpha here is 1. 2D16 weights with one common factor; R16 (fixed-sign
// or plain) on the Wgrad pair. No same-format dual or fused producers (each copy reads its source twice:
// the chunk amaxes, then the codes); the operand hybrid's dY (CTA-local rows for Dgrad, MXFP4 columns for
// Wgrad) comes from one read (linear_hybrid_dual, fp4/cta_mx_dual.h).
#include "fp4/cta_mx_dual.h"
#include "fp4/hadamard.h"
#include "fp4/nvfp4_cta.h"
#include "model/cuda/linear_fp4.h"

static int rotation(const LinearFp4 *L) {
  if (L->recipe.hadamard != 16) return FP4_ROT_NONE;  // recipe_check refuses H32 with a 16-block Wgrad
  return L->recipe.hadamard_plain ? FP4_ROT_H16_PLAIN : FP4_ROT_H16;
}

// W and/or W^T (a hybrid may take the other in another format). The tile rule needs W's factors even
// when only W^T is made: they go to the chunk scratch's tail then.
static void weight(LinearFp4 *L, const bf16 *w16, int O, int I, const QOp *wq, const QOp *wtq, float *amax) {
  if (L->recipe.weight_2d) {
    uint32_t *scratch = linear_cta_scratch(L, O, I);
    float *outer = wq ? wq->outer : (float *)(scratch + nvfp4_cta_scratch_words(O, I));
    nvfp4_cta_quantize_weight_bf16_cuda(w16, O, I, wq ? wq->q : NULL, wq ? wq->sb : NULL, outer, wtq ? wtq->q : NULL,
                                        wtq ? wtq->sb : NULL, wtq ? wtq->outer : NULL, scratch);
    return;
  }
  PhiloxStream none = {};
  if (wq) nvfp4_cta_quantize_rows_cuda(w16, O, I, NV_RNE, none, wq->q, wq->sb, wq->outer, linear_cta_scratch(L, O, I));
  if (wtq)
    nvfp4_cta_quantize_cols_cuda(w16, O, I, FP4_ROT_NONE, NV_RNE, none, wtq->q, wtq->sb, wtq->outer,
                                 linear_cta_scratch(L, I, O));
}

static void rows(LinearFp4 *L, const bf16 *x, int n, int K, int sr, PhiloxStream s, const QOp &dst, float *amax) {
  nvfp4_cta_quantize_rows_cuda(x, n, K, sr ? NV_SR : NV_RNE, s, dst.q, dst.sb, dst.outer, linear_cta_scratch(L, n, K));
}

// A column copy's carrier is x^T [K, n]: its chunks and stripes are taken there.
static void cols(LinearFp4 *L, const bf16 *x, int n, int K, int sr, PhiloxStream s, const QOp &dst, float *amax) {
  nvfp4_cta_quantize_cols_cuda(x, n, K, rotation(L), sr ? NV_SR : NV_RNE, s, dst.q, dst.sb, dst.outer,
                               linear_cta_scratch(L, K, n));
}

static int has_dual(const LinearFp4 *L, int sr_col) { return 0; }

static int dual(LinearFp4 *L, const bf16 *x, int n, int K, int sr_row, PhiloxStream s_row, const QOp *row, int sr_col,
                const QOp &col) {
  return 0;
}

// The MXFP4 column copy as linear_mxfp4.cu's cols() makes it (its scale rounding and Hadamard), written
// by the hybrid producer; the SR column copy (precision.sr dgrad_wgrad) stays with the two producers.
int linear_hybrid_dual(LinearFp4 *L, const LinearFormat *fd, const LinearFormat *fw, const bf16 *x, int n, int K,
                       int sr_row, PhiloxStream s_row, const QOp &row, int sr_col, const QOp &col) {
  if (fd != &linear_nvfp4_cta || fw != &linear_mxfp4 || sr_col) return 0;
  cta_mx_dual_cuda(x, n, K, sr_row ? NV_SR : NV_RNE, s_row, row.q, row.sb, row.outer, linear_cta_scratch(L, n, K),
                   linear_mx_mode(L), linear_mx_hadamard(L), linear_col_out(L, col, n, K));
  return 1;
}

// The scale lives in the operands' outer factors, applied by the GEMM's epilogue.
static float alpha(LinearFp4 *L, const float *amax_a, const float *amax_b, const float **alpha_dev) {
  *alpha_dev = NULL;
  return 1.0f;
}

const LinearFormat linear_nvfp4_cta = {
    FMT_NVFP4_CTA, "nvfp4_cta", "cta", 16,   /*reads=*/2, /*fp8_embed=*/0, /*outer=*/1, weight, rows,
    cols,          has_dual,    dual,  NULL, NULL,        alpha,
};
