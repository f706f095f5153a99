// fp4/recipe.c: see recipe.h.
#include "fp4/recipe.h"

#include <stdio.h>
#include <string.h>

// The index of value in a '|'-separated list, or -1.
static int pick(const char *value, const char *list) {
  size_t n = strlen(value);
  for (int i = 0; *list; i++) {
    const char *bar = strchr(list, '|');
    size_t len = bar ? (size_t)(bar - list) : strlen(list);
    if (len == n && !strncmp(value, list, n)) return i;
    if (!bar) break;
    list = bar + 1;
  }
  return -1;
}

#define PICK(var, key, value, list) \
  int var = pick(value, list);      \
  if (var < 0) return snprintf(err, errlen, "%s: unknown value '%s' (expected %s)", key, value, list), -1

int recipe_resolve(Recipe *r, const RecipeSpec *s, int cc, char *err, int errlen) {
  memset(r, 0, sizeof *r);
  PICK(format, "precision.recipe", s->recipe, RECIPE_FORMATS);
  r->format = format == 0 ? FMT_BF16 : format == 1 ? FMT_MXFP4 : FMT_NVFP4;
  const int nv = r->format == FMT_NVFP4;

  PICK(sr, "precision.sr", s->sr, RECIPE_SR);  // auto none dgrad dgrad_wgrad
  r->sr_dgrad = sr != 1;
  r->sr_wgrad = sr == 0 ? nv : sr == 3;

  PICK(had, "precision.hadamard", s->hadamard, RECIPE_HADAMARD);  // auto none h16 h32
  r->hadamard = had == 0 ? (nv ? 16 : 32) : had == 1 ? 0 : had == 2 ? 16 : 32;

  PICK(w2d, "precision.weight_2d", s->weight_2d, RECIPE_WEIGHT_2D);  // auto on off
  r->weight_2d = w2d != 2;

  PICK(round, "precision.scale_rounding", s->scale_rounding, RECIPE_SCALE_ROUNDING);  // auto up down
  r->scale_round_up = round != 2;

  PICK(gemm, "precision.fp4_gemm", s->fp4_gemm, RECIPE_FP4_GEMM);  // auto reference fp8 fp4 fp8_own fp8_cublaslt
  if (gemm == 0) r->gemm = cc >= 100 ? GEMM_FP4_NATIVE : cc >= 90 && !nv ? GEMM_FP8_EMBED : GEMM_REFERENCE;
  else r->gemm = gemm == 1 ? GEMM_REFERENCE : gemm == 3 ? GEMM_FP4_NATIVE : GEMM_FP8_EMBED;
  // auto keeps cuBLASLt until the tuned path (fp8) has run on hardware: a default is not where code first runs
  r->fp8_kernel = gemm == 4 ? FP8_KERNEL_OWN : gemm == 2 ? FP8_KERNEL_TUNED : FP8_KERNEL_CUBLASLT;
  if (r->fp8_kernel == FP8_KERNEL_OWN && cc && cc != 90)
    return snprintf(err, errlen, "precision.fp4_gemm: fp8_own is a Hopper (sm_90) kernel; this GPU is sm_%d", cc), -1;
  if (r->gemm == GEMM_FP4_NATIVE && cc && cc < 100)
    return snprintf(err, errlen, "precision.fp4_gemm: fp4 needs an sm_100 GPU (this one is sm_%d)", cc), -1;

  PICK(wg, "precision.wgrad_2d", s->wgrad_2d, RECIPE_WGRAD_2D);  // auto off dy x
  r->wgrad_2d = wg == 1 ? WGRAD_2D_OFF : wg == 3 ? WGRAD_2D_X : WGRAD_2D_DY;
  if (r->gemm != GEMM_FP8_EMBED || r->format != FMT_MXFP4) r->wgrad_2d = WGRAD_2D_OFF;  // an FP8-embedding choice

  r->bf16_first = s->bf16_first, r->bf16_last = s->bf16_last;
  return recipe_check(r, err, errlen);
}

int recipe_check(const Recipe *r, char *err, int errlen) {
  if (r->format == FMT_BF16) return 0;
  const int nv = r->format == FMT_NVFP4;
  if (r->hadamard != 0 && r->hadamard != 16 && r->hadamard != 32)
    return snprintf(err, errlen, "precision.hadamard: %d points: expected 0, 16 or 32", r->hadamard), -1;
  if (nv && r->hadamard == 32)
    return snprintf(err, errlen,
                    "precision.hadamard: h32 with nvfp4: the NVFP4 Wgrad producers rotate 16-blocks (h16 or none)"),
           -1;
  if (nv && !r->scale_round_up)
    return snprintf(err, errlen, "precision.scale_rounding: 'down' is an MXFP4 option; NVFP4 scales are E4M3"), -1;
  // NVFP4's E2M1 x E4M3 products need 6 significant bits: exact in BF16, not in E4M3 (docs/formats.md §3).
  if (nv && r->gemm == GEMM_FP8_EMBED)
    return snprintf(err, errlen, "precision.fp4_gemm: fp8 cannot hold NVFP4 exactly; use reference (Hopper) or fp4"),
           -1;
  if (r->fp8_kernel != FP8_KERNEL_TUNED && r->fp8_kernel != FP8_KERNEL_CUBLASLT && r->fp8_kernel != FP8_KERNEL_OWN)
    return snprintf(err, errlen, "precision.fp4_gemm: FP8 kernel %d is not an Fp8Kernel", (int)r->fp8_kernel), -1;
  if (r->fp8_kernel == FP8_KERNEL_OWN && r->gemm != GEMM_FP8_EMBED)  // the others mean nothing elsewhere
    return snprintf(err, errlen, "precision.fp4_gemm: fp8_own runs the FP8 embedding (Recipe.gemm GEMM_FP8_EMBED)"), -1;
  if (r->bf16_first < 0 || r->bf16_last < 0)
    return snprintf(err, errlen, "precision.bf16_first_blocks/bf16_last_blocks must be >= 0"), -1;
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
           fmt[r->format],
           r->sr_wgrad   ? "Dgrad+Wgrad"
           : r->sr_dgrad ? "Dgrad"
                         : "off",
           r->hadamard == 32   ? "H32"
           : r->hadamard == 16 ? "H16"
                               : "no",
           r->weight_2d ? "2D" : "1D",
           r->format == FMT_MXFP4 ? (r->scale_round_up ? ", round-up exponents" : ", OCP round-down exponents") : "",
           gemm[r->gemm],
           r->wgrad_2d == WGRAD_2D_DY  ? " (Wgrad dY in 128x128 tiles)"
           : r->wgrad_2d == WGRAD_2D_X ? " (Wgrad x in 128x128 tiles)"
                                       : "",
           r->bf16_first, r->bf16_last);
}
