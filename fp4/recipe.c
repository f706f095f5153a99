// fp4/recipe.c: see recipe.h.
#include "fp4/recipe.h"

#include <stdio.h>
#include <string.h>

static int is(const char *a, const char *b) { return !strcmp(a, b); }

int recipe_resolve(Recipe *r, const char *recipe, const char *sr, const char *hadamard, const char *weight_2d,
                   const char *scale_rounding, const char *gemm, const char *wgrad_2d, int bf16_first, int bf16_last,
                   int cc, char *err, int errlen) {
  memset(r, 0, sizeof *r);
  if (is(recipe, "bf16")) r->format = FMT_BF16;
  else if (is(recipe, "mxfp4")) r->format = FMT_MXFP4;
  else if (is(recipe, "nvfp4")) r->format = FMT_NVFP4;
  else return snprintf(err, errlen, "precision.recipe: unknown recipe '%s'", recipe), -1;
  int nv = r->format == FMT_NVFP4;

  if (is(sr, "auto")) r->sr_dgrad = 1, r->sr_wgrad = nv;
  else if (is(sr, "none")) r->sr_dgrad = r->sr_wgrad = 0;
  else if (is(sr, "dgrad")) r->sr_dgrad = 1, r->sr_wgrad = 0;
  else if (is(sr, "dgrad_wgrad")) r->sr_dgrad = r->sr_wgrad = 1;
  else return snprintf(err, errlen, "precision.sr: unknown value '%s'", sr), -1;

  if (is(hadamard, "auto")) r->hadamard = nv ? 16 : 32;
  else if (is(hadamard, "none")) r->hadamard = 0;
  else if (is(hadamard, "h16")) r->hadamard = 16;
  else if (is(hadamard, "h32")) r->hadamard = 32;
  else return snprintf(err, errlen, "precision.hadamard: unknown value '%s'", hadamard), -1;

  if (is(weight_2d, "auto") || is(weight_2d, "on")) r->weight_2d = 1;
  else if (is(weight_2d, "off")) r->weight_2d = 0;
  else return snprintf(err, errlen, "precision.weight_2d: unknown value '%s'", weight_2d), -1;

  if (is(scale_rounding, "auto") || is(scale_rounding, "up")) r->scale_round_up = 1;
  else if (is(scale_rounding, "down")) r->scale_round_up = 0;
  else return snprintf(err, errlen, "precision.scale_rounding: unknown value '%s'", scale_rounding), -1;
  if (!r->scale_round_up && nv)
    return snprintf(err, errlen, "precision.scale_rounding: 'down' is an MXFP4 option; NVFP4 scales are E4M3"), -1;

  if (is(gemm, "auto")) r->gemm = cc >= 100 ? GEMM_FP4_NATIVE : cc >= 90 && !nv ? GEMM_FP8_EMBED : GEMM_REFERENCE;
  else if (is(gemm, "reference")) r->gemm = GEMM_REFERENCE;
  else if (is(gemm, "fp8")) r->gemm = GEMM_FP8_EMBED;
  else if (is(gemm, "fp4")) r->gemm = GEMM_FP4_NATIVE;
  else return snprintf(err, errlen, "precision.fp4_gemm: unknown value '%s'", gemm), -1;
  // NVFP4's E2M1 x E4M3 products need 6 significant bits: exact in BF16, not in E4M3 (docs/formats.md §3).
  if (nv && r->gemm == GEMM_FP8_EMBED)
    return snprintf(err, errlen, "precision.fp4_gemm: fp8 cannot hold NVFP4 exactly; use reference (Hopper) or fp4"), -1;
  if (r->gemm == GEMM_FP4_NATIVE && cc && cc < 100)
    return snprintf(err, errlen, "precision.fp4_gemm: fp4 needs an sm_100 GPU (this one is sm_%d)", cc), -1;

  if (is(wgrad_2d, "auto") || is(wgrad_2d, "dy")) r->wgrad_2d = WGRAD_2D_DY;
  else if (is(wgrad_2d, "off")) r->wgrad_2d = WGRAD_2D_OFF;
  else if (is(wgrad_2d, "x")) r->wgrad_2d = WGRAD_2D_X;
  else return snprintf(err, errlen, "precision.wgrad_2d: unknown value '%s'", wgrad_2d), -1;
  if (r->gemm != GEMM_FP8_EMBED || r->format != FMT_MXFP4) r->wgrad_2d = WGRAD_2D_OFF;  // an FP8-embedding choice

  if (bf16_first < 0 || bf16_last < 0)
    return snprintf(err, errlen, "precision.bf16_first_blocks/bf16_last_blocks must be >= 0"), -1;
  r->bf16_first = bf16_first, r->bf16_last = bf16_last;
  return 0;
}

FP4Format recipe_block_format(const Recipe *r, int layer, int n_layers) {
  if (layer < r->bf16_first || layer >= n_layers - r->bf16_last) return FMT_BF16;
  return r->format;
}

void recipe_describe(const Recipe *r, char *buf, int len) {
  static const char *fmt[] = {"bf16", "mxfp4", "nvfp4"}, *gemm[] = {"reference", "fp8-embedded", "fp4-native"};
  if (r->format == FMT_BF16) {
    snprintf(buf, len, "bf16");
    return;
  }
  snprintf(buf, len, "%s: SR %s, %s Wgrad Hadamard, %s weight scales%s, %s GEMMs%s, BF16 blocks %d first / %d last",
           fmt[r->format], r->sr_wgrad ? "Dgrad+Wgrad" : r->sr_dgrad ? "Dgrad" : "off",
           r->hadamard == 32 ? "H32" : r->hadamard == 16 ? "H16" : "no", r->weight_2d ? "2D" : "1D",
           r->format == FMT_MXFP4 ? (r->scale_round_up ? ", round-up exponents" : ", OCP round-down exponents") : "",
           gemm[r->gemm], r->wgrad_2d == WGRAD_2D_DY ? " (Wgrad dY in 128x128 tiles)"
                          : r->wgrad_2d == WGRAD_2D_X ? " (Wgrad x in 128x128 tiles)" : "",
           r->bf16_first, r->bf16_last);
}
