// tests/unit/test_recipe.c: precision recipes resolve from the config's keys as documented, per-block
// overrides pick BF16 blocks, and impossible combinations are refused with the key named.
#include <string.h>

#include "fp4/recipe.h"
#include "run/config.h"
#include "tests/test.h"

static int resolve(Recipe *r, const char *recipe, const char *sr, const char *had, const char *w2d, const char *sc,
                   const char *gemm, int first, int last, int cc, char *err) {
  RecipeSpec spec = {.recipe = recipe,
                     .sr = sr,
                     .hadamard = had,
                     .weight_2d = w2d,
                     .scale_rounding = sc,
                     .fp4_gemm = gemm,
                     .wgrad_2d = "auto",
                     .bf16_first = first,
                     .bf16_last = last};
  return recipe_resolve(r, &spec, cc, err, 512);
}

// A mixed route: recipe, the three contraction formats, the spans and the Hadamard (other keys auto).
static int route(Recipe *r, const char *recipe, const char *fprop, const char *dgrad, const char *wgrad,
                 const char *blocks, const char *had, const char *gemm, char *err) {
  RecipeSpec spec = {.recipe = recipe,
                     .sr = "auto",
                     .hadamard = had,
                     .weight_2d = "auto",
                     .scale_rounding = "auto",
                     .fp4_gemm = gemm,
                     .wgrad_2d = "auto",
                     .fprop = fprop,
                     .dgrad = dgrad,
                     .wgrad = wgrad,
                     .blocks = blocks};
  return recipe_resolve(r, &spec, 90, err, 512);
}

// The paper's routes that mix formats or use CTA-local NVFP4 (docs/formats.md §5-6).
static void test_routes(void) {
  Recipe r;
  char err[512], line[2048];
  TEST_SECTION("CTA-local NVFP4 and plain H16");
  CHECK(!route(&r, "nvfp4_cta", NULL, NULL, NULL, NULL, "auto", "auto", err), "%s", err);
  CHECK(r.format == FMT_NVFP4_CTA && r.sr_dgrad && !r.sr_wgrad && r.hadamard == 0 && r.weight_2d &&
            r.gemm == GEMM_REFERENCE,
        "nvfp4_cta: row SR for Dgrad only, no Hadamard, 2D16 weights, exact through BF16 on Hopper");
  CHECK(!route(&r, "nvfp4_cta", NULL, NULL, NULL, NULL, "h16", "auto", err) && r.hadamard == 16 && !r.hadamard_plain,
        "CTA-local + fixed-sign H16: %s", err);
  CHECK(!route(&r, "mxfp4", NULL, NULL, NULL, NULL, "h16_plain", "auto", err) && r.hadamard == 16 && r.hadamard_plain,
        "plain H16: %s", err);
  CHECK(recipe_uniform(&r, 32) && !recipe_uses(&r, 32, FMT_NVFP4_CTA), "one format: uniform");

  TEST_SECTION("the operand hybrid: MXFP4 Fprop and Wgrad, CTA-local Dgrad");
  CHECK(!route(&r, "mxfp4", NULL, "nvfp4_cta", NULL, NULL, "h16_plain", "auto", err), "%s", err);
  CHECK(recipe_format(&r, 3, 32, CONTR_FPROP) == FMT_MXFP4 && recipe_format(&r, 3, 32, CONTR_DGRAD) == FMT_NVFP4_CTA &&
            recipe_format(&r, 3, 32, CONTR_WGRAD) == FMT_MXFP4,
        "per contraction");
  CHECK(r.gemm == GEMM_FP8_EMBED && !recipe_uniform(&r, 32) && recipe_uses(&r, 32, FMT_NVFP4_CTA),
        "the MXFP4 contractions keep the FP8 path (gemm %d)", r.gemm);
  recipe_contract(&r, 32, line, sizeof line);
  CHECK(strstr(line, "blocks 1-32: Fprop mxfp4") &&
            strstr(line, "| Dgrad nvfp4_cta (E4M3 per 16, fp32 outer factors") && strstr(line, "| Wgrad mxfp4") &&
            strstr(line, "plain H16") && !strchr(line, '\n'),
        "the contract line: %s", line);
  recipe_route_key(&r, line, sizeof line);
  CHECK(!strcmp(line, "fprop=auto dgrad=nvfp4_cta wgrad=auto blocks=- hadamard=h16_plain"), "route key: %s", line);
  CHECK(!route(&r, "mxfp4", NULL, "nvfp4_cta", NULL, NULL, "h32", "auto", err), "the H32 hybrid (MXFP4 Wgrad): %s",
        err);

  TEST_SECTION("the 27/5 depth hybrid: CTA-local in blocks 1-27, MXFP4 in 28-32");
  CHECK(!route(&r, "nvfp4_cta", NULL, NULL, NULL, "mxfp4:28-32", "none", "auto", err), "%s", err);
  CHECK(recipe_block_format(&r, 26, 32) == FMT_NVFP4_CTA && recipe_block_format(&r, 27, 32) == FMT_MXFP4 &&
            recipe_block_format(&r, 31, 32) == FMT_MXFP4,
        "blocks counted from 1: block 28 is index 27");
  CHECK(!route(&r, "bf16", NULL, NULL, NULL, "nvfp4_cta:1-27; mxfp4:28-32", "none", "auto", err) &&
            recipe_block_format(&r, 0, 32) == FMT_NVFP4_CTA && recipe_block_format(&r, 31, 32) == FMT_MXFP4 &&
            r.nspans == 2,
        "two spans, ';' as the paper writes them: %s", err);
  recipe_contract(&r, 32, line, sizeof line);
  CHECK(strstr(line, "blocks 1-27: Fprop nvfp4_cta") && strstr(line, "; blocks 28-32: Fprop mxfp4"), "contract: %s",
        line);
  CHECK(!recipe_check_layers(&r, 32, err, sizeof err), "fits 32 blocks: %s", err);
  CHECK(recipe_check_layers(&r, 16, err, sizeof err) && strstr(err, "precision.blocks") && strstr(err, "16 blocks"),
        "a span past the model: %s", err);

  TEST_SECTION("refused mixes name the key");
  CHECK(route(&r, "nvfp4_cta", NULL, NULL, NULL, NULL, "h32", "auto", err) && strstr(err, "precision.hadamard"),
        "h32 on a 16-block Wgrad: %s", err);
  CHECK(route(&r, "mxfp4", NULL, NULL, "nvfp4_cta", NULL, "h32", "auto", err) && strstr(err, "precision.hadamard"),
        "h32 with an nvfp4_cta Wgrad override: %s", err);
  CHECK(route(&r, "nvfp4_cta", NULL, NULL, NULL, NULL, "none", "fp8", err) && strstr(err, "precision.fp4_gemm"),
        "fp8 without an MXFP4 contraction: %s", err);
  CHECK(route(&r, "bf16", NULL, "nvfp4_cta", NULL, NULL, "auto", "auto", err) && strstr(err, "precision.dgrad"),
        "an override in an all-BF16 model: %s", err);
  CHECK(route(&r, "mxfp4", NULL, NULL, NULL, "nvfp4:3-5,mxfp4:5-8", "auto", "auto", err) &&
            strstr(err, "precision.blocks") && strstr(err, "overlap"),
        "overlapping spans: %s", err);
  const char *bad[] = {"mxfp4", "mxfp4:0-3", "mxfp4:5-3", "fp8:1-2", "mxfp4:1-x", "mxfp4:"};
  for (int i = 0; i < 6; i++)
    CHECK(route(&r, "mxfp4", NULL, NULL, NULL, bad[i], "auto", "auto", err) && strstr(err, "precision.blocks") &&
              strstr(err, "FORMAT:FIRST-LAST"),
          "'%s': %s", bad[i], err);
  CHECK(route(&r, "mxfp4", "fp8", NULL, NULL, NULL, "auto", "auto", err) && strstr(err, "precision.fprop"),
        "an unknown contraction format: %s", err);
  Recipe h = {0};
  h.format = FMT_NVFP4_CTA, h.hadamard = 32, h.hadamard_plain = 1, h.scale_round_up = 1;
  CHECK(recipe_check(&h, err, sizeof err) && strstr(err, "precision.hadamard"), "plain H32 by hand: %s", err);
  CHECK(!strcmp(recipe_format_name(FMT_NVFP4_CTA), "nvfp4_cta"), "the format's config name");
}

int main(void) {
  Recipe r;
  char err[512];
  test_routes();
  TEST_SECTION("defaults");
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "auto", 0, 0, 90, err), "%s", err);
  CHECK(r.format == FMT_MXFP4 && r.sr_dgrad && !r.sr_wgrad && r.hadamard == 32 && r.weight_2d && r.scale_round_up,
        "mxfp4 is the paper's recipe: row-gradient SR, H32, 2D weights, round-up scales");
  CHECK(r.gemm == GEMM_FP8_EMBED, "mxfp4 on sm_90 runs through the FP8 embedding (got %d)", r.gemm);
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "auto", 0, 0, 100, err) && r.gemm == GEMM_FP4_NATIVE,
        "sm_100 runs FP4 natively");
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "auto", 0, 0, 80, err) && r.gemm == GEMM_REFERENCE,
        "older GPUs run the exact reference");
  CHECK(!resolve(&r, "nvfp4_cta", "auto", "auto", "auto", "auto", "auto", 0, 0, 100, err) && r.gemm == GEMM_REFERENCE,
        "CTA-local NVFP4 on sm_100 keeps the exact reference (its native path never ran; got %d)", r.gemm);
  CHECK(!resolve(&r, "nvfp4_cta", "auto", "auto", "auto", "auto", "auto", 0, 0, 90, err) && r.gemm == GEMM_REFERENCE,
        "CTA-local NVFP4 on Hopper runs through BF16 (got %d)", r.gemm);
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

  TEST_SECTION("the FP8 embedding's kernel: cuBLASLt by default, tuned per shape (fp8), or one forced");
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "auto", 0, 0, 90, err), "%s", err);
  CHECK(r.gemm == GEMM_FP8_EMBED && r.fp8_kernel == FP8_KERNEL_CUBLASLT, "auto on Hopper: gemm %d kernel %d", r.gemm,
        r.fp8_kernel);
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "fp8", 0, 0, 90, err) && r.fp8_kernel == FP8_KERNEL_TUNED,
        "fp8: tuned (%d)", r.fp8_kernel);
  // fp8_own (our own kernel, removed on 2026-12-05) is refused by name, never run as another kernel
  CHECK(resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "fp8_own", 0, 0, 90, err) &&
            strstr(err, "precision.fp4_gemm") && strstr(err, "fp8_own") && strstr(err, "removed") &&
            strstr(err, RECIPE_FP4_GEMM) && !strstr(RECIPE_FP4_GEMM, "fp8_own"),
        "fp8_own refused, naming the key, why and the values it takes: %s", err);
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "fp8_cublaslt", 0, 0, 90, err), "%s", err);
  CHECK(r.gemm == GEMM_FP8_EMBED && r.fp8_kernel == FP8_KERNEL_CUBLASLT && r.wgrad_2d == WGRAD_2D_DY,
        "gemm %d kernel %d wgrad_2d %d", r.gemm, r.fp8_kernel, r.wgrad_2d);
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "fp8_cutlass", 0, 0, 90, err), "%s", err);
  CHECK(r.gemm == GEMM_FP8_EMBED && r.fp8_kernel == FP8_KERNEL_CUTLASS && r.wgrad_2d == WGRAD_2D_DY,
        "gemm %d kernel %d wgrad_2d %d", r.gemm, r.fp8_kernel, r.wgrad_2d);
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "fp8_cutlass", 0, 0, 0, err) &&
            r.fp8_kernel == FP8_KERNEL_CUTLASS,
        "no GPU (cc 0): resolved, checked against the device at run time: %s", err);
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "fp8_cublaslt", 0, 0, 100, err),
        "cuBLASLt's FP8 path exists on Blackwell too: %s", err);
  CHECK(resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "fp8_cutlass", 0, 0, 100, err) &&
            strstr(err, "fp8_cutlass") && strstr(err, "sm_100"),
        "CUTLASS's Hopper kernel refused off Hopper: %s", err);
  CHECK(resolve(&r, "nvfp4", "auto", "auto", "auto", "auto", "fp8_cutlass", 0, 0, 90, err) && strstr(err, "NVFP4"),
        "refused for NVFP4: %s", err);
  CHECK(resolve(&r, "nvfp4", "auto", "auto", "auto", "auto", "fp8_cublaslt", 0, 0, 90, err) && strstr(err, "NVFP4"),
        "refused for NVFP4: %s", err);
  {
    Recipe bad = r;
    CHECK(!resolve(&bad, "mxfp4", "auto", "auto", "auto", "auto", "reference", 0, 0, 90, err), "%s", err);
    bad.fp8_kernel = FP8_KERNEL_CUTLASS;  // by hand: a kernel choice without the embedding
    CHECK(recipe_check(&bad, err, sizeof err) && strstr(err, "fp8_cutlass"), "CUTLASS without GEMM_FP8_EMBED: %s", err);
    bad.fp8_kernel = (Fp8Kernel)7;
    CHECK(recipe_check(&bad, err, sizeof err) && strstr(err, "Fp8Kernel"), "an unknown kernel: %s", err);
    bad.fp8_kernel = (Fp8Kernel)2;  // the removed own kernel's number
    CHECK(recipe_check(&bad, err, sizeof err) && strstr(err, "Fp8Kernel") && strstr(err, "fp8_own"),
          "the removed kernel's number: %s", err);
  }

  TEST_SECTION("the Wgrad operand in 128x128 tiles (FP8 path only)");
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "auto", 0, 0, 90, err) && r.wgrad_2d == WGRAD_2D_DY,
        "auto on the FP8 path tiles dY^T (got %d)", r.wgrad_2d);
  CHECK(!resolve(&r, "mxfp4", "auto", "auto", "auto", "auto", "reference", 0, 0, 90, err) && r.wgrad_2d == WGRAD_2D_OFF,
        "the reference back end has no embedding (got %d)", r.wgrad_2d);
  CHECK(!recipe_resolve(
            &r, &(RecipeSpec){"mxfp4", "auto", "auto", "auto", "auto", "fp8", "x", 0, 0, NULL, NULL, NULL, NULL, NULL},
            90, err, 256) &&
            r.wgrad_2d == WGRAD_2D_X,
        "x tiles x^T: %s", err);
  CHECK(
      !recipe_resolve(
          &r, &(RecipeSpec){"mxfp4", "auto", "auto", "auto", "auto", "fp8", "off", 0, 0, NULL, NULL, NULL, NULL, NULL},
          90, err, 256) &&
          r.wgrad_2d == WGRAD_2D_OFF,
      "off: both VEC128: %s", err);
  CHECK(
      recipe_resolve(
          &r, &(RecipeSpec){"mxfp4", "auto", "auto", "auto", "auto", "fp8", "both", 0, 0, NULL, NULL, NULL, NULL, NULL},
          90, err, 256) &&
          strstr(err, "precision.wgrad_2d"),
      "an unknown value names the key: %s", err);

  TEST_SECTION("precision.fusion: auto by default (the fusions run on a GPU), on (all), off (none): the same bits");
  {
    char d[512];
    CHECK(!recipe_resolve(&r, &(RecipeSpec){.recipe = "mxfp4"}, 90, err, 256) && r.fusion == FUSION_AUTO,
          "auto: the fusions that have run on a GPU: %s", err);
    recipe_describe(&r, d, sizeof d);
    CHECK(!strstr(d, "fused") && !strstr(d, "fusion"), "the description of the default says nothing of it: %s", d);
    CHECK(!recipe_resolve(&r, &(RecipeSpec){.recipe = "mxfp4", .fusion = "on"}, 90, err, 256) && r.fusion == FUSION_ON,
          "on: every fusion: %s", err);
    recipe_describe(&r, d, sizeof d);
    CHECK(strstr(d, ", every fusion (also those auto leaves out)") != NULL, "on is in the description: %s", d);
    CHECK(
        !recipe_resolve(&r, &(RecipeSpec){.recipe = "mxfp4", .fusion = "off"}, 90, err, 256) && r.fusion == FUSION_OFF,
        "off: unfused: %s", err);
    recipe_describe(&r, d, sizeof d);
    CHECK(strstr(d, ", unfused") != NULL, "off is in the description the log prints: %s", d);
    CHECK(recipe_resolve(&r, &(RecipeSpec){.recipe = "mxfp4", .fusion = "no"}, 90, err, 256) &&
              strstr(err, "precision.fusion") && strstr(err, RECIPE_FUSION),
          "an unknown value names the key and the values: %s", err);
    TrainConfig fc;
    config_defaults(&fc);
    CHECK(!config_set(&fc, "precision.fusion=off", err, sizeof err) && !strcmp(fc.fusion, "off"),
          "--set precision.fusion=off: %s", err);
    const RecipeSpec fs = config_recipe_spec(&fc);
    CHECK(fs.fusion && !strcmp(fs.fusion, "off"), "the config passes it to the recipe");
  }

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
  y = "precision:\n  recipe: mxfp4\n  fp4_gemm: fp8_own\n";
  CHECK(config_load_string(&c, y, strlen(y), "x.yaml", err, sizeof err) && strstr(err, "x.yaml") &&
            strstr(err, "precision.fp4_gemm") && strstr(err, "removed") && strstr(err, "fp8_cutlass"),
        "the config refuses the removed fp8_own, naming the key, why and the values it takes: %s", err);
  config_defaults(&c);
  CHECK(config_set(&c, "precision.fp4_gemm=fp8_own", err, sizeof err) && strstr(err, "precision.fp4_gemm") &&
            strstr(err, "removed") && strstr(err, "fp8_cublaslt"),
        "--set refuses it too: %s", err);
  config_defaults(&c);
  y = "precision:\n  recipe: mxfp4\n  bf16_last_blocks: 1\n";
  CHECK(!config_load_string(&c, y, strlen(y), "x.yaml", err, sizeof err), "%s", err);
  CHECK(!strcmp(c.recipe, "mxfp4") && c.bf16_last_blocks == 1, "loaded");
  TEST_END();
}
