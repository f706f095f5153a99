// tests/unit/test_recipe.c: precision recipes resolve from the config's keys as documented, per-block
// overrides pick BF16 blocks, and impossible combinations are refused with the key named.
#include <string.h>

#include "fp4/recipe.h"
#include "run/config.h"
#include "tests/test.h"

static int resolve(Recipe *r, const char *recipe, const char *sr, const char *had, const char *w2d, const char *sc,
                   const char *gemm, int first, int last, int cc, char *err) {
  RecipeSpec spec = {recipe, sr, had, w2d, sc, gemm, "auto", first, last};
  return recipe_resolve(r, &spec, cc, err, 256);
}

int main(void) {
  Recipe r;
  char err[256];
  TEST_SECTION("defaults");
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "auto", 0, 0, 90, err), "%s", err);
  CHECK(r.format == FMT_MXFP4 && r.sr_dgrad && !r.sr_wgrad && r.hadamard == 32 && r.weight_2d && r.scale_round_up,
        "mxfp4 is the paper's recipe: row-gradient SR, H32, 2D weights, round-up scales");
  CHECK(r.gemm == GEMM_FP8_EMBED, "mxfp4 on sm_90 runs through the FP8 embedding (got %d)", r.gemm);
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "auto", 0, 0, 100, err) && r.gemm == GEMM_FP4_NATIVE,
        "sm_100 runs FP4 natively");
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "auto", 0, 0, 80, err) && r.gemm == GEMM_REFERENCE,
        "older GPUs run the exact reference");
  CHECK(!resolve(&r, "nvfp4", "auto", "auto", "auto", "auto", "auto", 0, 0, 90, err), "%s", err);
  CHECK(r.format == FMT_NVFP4 && r.sr_dgrad && r.sr_wgrad && r.hadamard == 16 && r.weight_2d,
        "nvfp4 is TE's recipe: SR on both gradients, H16, 16x16 weights");
  CHECK(r.gemm == GEMM_REFERENCE, "nvfp4 on Hopper is exact only through BF16 (got %d)", r.gemm);

  TEST_SECTION("each element on its own");
  CHECK(!resolve(&r, "mxfp4", "none", "none", "off", "down", "reference", 0, 0, 90, err), "%s", err);
  CHECK(!r.sr_dgrad && !r.sr_wgrad && !r.hadamard && !r.weight_2d && !r.scale_round_up && r.gemm == GEMM_REFERENCE,
        "every switch turns off");
  CHECK(!resolve(&r, "mxfp4", "dgrad_wgrad", "h16", "on", "up", "fp8", 0, 0, 90, err), "%s", err);
  CHECK(r.sr_dgrad && r.sr_wgrad && r.hadamard == 16 && r.gemm == GEMM_FP8_EMBED, "and on");

  TEST_SECTION("the FP8 embedding's kernel: cuBLASLt by default, tuned per shape (fp8), or ours forced");
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "auto", 0, 0, 90, err), "%s", err);
  CHECK(r.gemm == GEMM_FP8_EMBED && r.fp8_kernel == FP8_KERNEL_CUBLASLT, "auto on Hopper: gemm %d kernel %d", r.gemm,
        r.fp8_kernel);
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "fp8", 0, 0, 90, err) && r.fp8_kernel == FP8_KERNEL_TUNED,
        "fp8: tuned (%d)", r.fp8_kernel);
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "fp8_own", 0, 0, 90, err), "%s", err);
  CHECK(r.gemm == GEMM_FP8_EMBED && r.fp8_kernel == FP8_KERNEL_OWN && r.wgrad_2d == WGRAD_2D_DY,
        "gemm %d kernel %d wgrad_2d %d", r.gemm, r.fp8_kernel, r.wgrad_2d);
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "fp8_cublaslt", 0, 0, 90, err), "%s", err);
  CHECK(r.gemm == GEMM_FP8_EMBED && r.fp8_kernel == FP8_KERNEL_CUBLASLT && r.wgrad_2d == WGRAD_2D_DY,
        "gemm %d kernel %d wgrad_2d %d", r.gemm, r.fp8_kernel, r.wgrad_2d);
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "fp8_cublaslt", 0, 0, 100, err),
        "cuBLASLt's FP8 path exists on Blackwell too: %s", err);
  CHECK(resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "fp8_own", 0, 0, 100, err) && strstr(err, "fp8_own") &&
            strstr(err, "sm_100"),
        "ours refused off Hopper: %s", err);
  CHECK(resolve(&r, "nvfp4", "auto", "auto", "auto", "auto", "fp8_own", 0, 0, 90, err) && strstr(err, "NVFP4"),
        "refused for NVFP4: %s", err);
  CHECK(resolve(&r, "nvfp4", "auto", "auto", "auto", "auto", "fp8_cublaslt", 0, 0, 90, err) && strstr(err, "NVFP4"),
        "refused for NVFP4: %s", err);
  {
    Recipe bad = r;
    CHECK(!resolve(&bad, "mxfp4", "auto", "auto", "auto", "auto", "reference", 0, 0, 90, err), "%s", err);
    bad.fp8_kernel = FP8_KERNEL_OWN;  // by hand: a kernel choice without the embedding
    CHECK(recipe_check(&bad, err, sizeof err) && strstr(err, "fp8_own"), "own without GEMM_FP8_EMBED: %s", err);
    bad.fp8_kernel = (Fp8Kernel)7;
    CHECK(recipe_check(&bad, err, sizeof err) && strstr(err, "Fp8Kernel"), "an unknown kernel: %s", err);
  }

  TEST_SECTION("the Wgrad operand in 128x128 tiles (FP8 path only)");
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "auto", 0, 0, 90, err) && r.wgrad_2d == WGRAD_2D_DY,
        "auto on the FP8 path tiles dY^T (got %d)", r.wgrad_2d);
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "reference", 0, 0, 90, err) && r.wgrad_2d == WGRAD_2D_OFF,
        "the reference back end has no embedding (got %d)", r.wgrad_2d);
  CHECK(!recipe_resolve(&r, &(RecipeSpec){"mxfp4", "auto", "auto", "auto", "auto", "fp8", "x", 0, 0}, 90, err, 256) &&
            r.wgrad_2d == WGRAD_2D_X,
        "x tiles x^T: %s", err);
  CHECK(!recipe_resolve(&r, &(RecipeSpec){"mxfp4", "auto", "auto", "auto", "auto", "fp8", "off", 0, 0}, 90, err, 256) &&
            r.wgrad_2d == WGRAD_2D_OFF,
        "off: both VEC128: %s", err);
  CHECK(recipe_resolve(&r, &(RecipeSpec){"mxfp4", "auto", "auto", "auto", "auto", "fp8", "both", 0, 0}, 90, err, 256) &&
            strstr(err, "precision.wgrad_2d"),
        "an unknown value names the key: %s", err);

  TEST_SECTION("per-block overrides");
  CHECK(!resolve(&r, "nvfp4", "auto", "auto", "auto", "auto", "auto", 1, 4, 90, err), "%s", err);
  int bf16 = 0;
  for (int l = 0; l < 32; l++) bf16 += recipe_block_format(&r, l, 32) == FMT_BF16;
  CHECK(bf16 == 5, "first 1 + last 4 of 32 blocks in BF16, got %d", bf16);
  CHECK(recipe_block_format(&r, 0, 32) == FMT_BF16 && recipe_block_format(&r, 1, 32) == FMT_NVFP4 &&
            recipe_block_format(&r, 27, 32) == FMT_NVFP4 && recipe_block_format(&r, 28, 32) == FMT_BF16,
        "the boundaries are blocks 0 | 1 and 27 | 28");

  TEST_SECTION("refused combinations name the key");
  CHECK(resolve(&r, "nvfp4", "auto", "auto", "auto", "auto", "fp8", 0, 0, 90, err) && strstr(err, "precision.fp4_gemm"),
        "nvfp4 cannot ride on FP8: %s", err);
  CHECK(resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "fp4", 0, 0, 90, err) && strstr(err, "sm_100"),
        "native FP4 needs sm_100: %s", err);
  CHECK(resolve(&r, "nvfp4", "auto", "auto", "auto", "down", "auto", 0, 0, 90, err) &&
            strstr(err, "precision.scale_rounding"),
        "round-down is MXFP4's: %s", err);

  CHECK(resolve(&r, "nvfp4", "auto", "h32", "auto", "auto", "reference", 0, 0, 90, err) &&
            strstr(err, "precision.hadamard"),
        "nvfp4 with h32 (its producers rotate 16-blocks): %s", err);
  CHECK(resolve(&r, "mxfp4", "auto", "h8", "auto", "auto", "auto", 0, 0, 90, err) &&
            strstr(err, "precision.hadamard: unknown value 'h8'") && strstr(err, RECIPE_HADAMARD),
        "an unknown value is refused with the allowed list: %s", err);

  TEST_SECTION("recipe_check: the one validation, also of recipes built by hand");
  {
    Recipe h = {0};
    h.format = FMT_NVFP4, h.gemm = GEMM_FP8_EMBED, h.hadamard = 16, h.scale_round_up = 1;
    CHECK(recipe_check(&h, err, 256) && strstr(err, "precision.fp4_gemm"), "nvfp4 on the fp8 path: %s", err);
    h.gemm = GEMM_REFERENCE, h.hadamard = 24;
    CHECK(recipe_check(&h, err, 256) && strstr(err, "precision.hadamard"), "a 24-point Hadamard: %s", err);
    h.hadamard = 16;
    CHECK(!recipe_check(&h, err, 256), "nvfp4, H16, reference GEMM passes: %s", err);
    Recipe bf = {0};
    bf.hadamard = 24;  // a BF16 recipe quantizes nothing: nothing to check
    CHECK(!recipe_check(&bf, err, 256), "bf16 passes whatever its unused fields: %s", err);
  }

  TEST_SECTION("through the config");
  TrainConfig c;
  config_defaults(&c);
  const char *y = "precision:\n  recipe: nvfp4\n  fp4_gemm: fp8\n";
  CHECK(config_load_string(&c, y, strlen(y), "x.yaml", err, sizeof err) && strstr(err, "x.yaml") &&
            strstr(err, "precision.fp4_gemm"),
        "the config rejects nvfp4 on fp8: %s", err);
  config_defaults(&c);
  y = "precision:\n  recipe: mxfp4\n  bf16_last_blocks: 1\n";
  CHECK(!config_load_string(&c, y, strlen(y), "x.yaml", err, sizeof err), "%s", err);
  CHECK(!strcmp(c.recipe, "mxfp4") && c.bf16_last_blocks == 1, "loaded");
  TEST_END();
}
