// fp4/recipe.h: a precision recipe as data. Which operand of which GEMM is quantized how; the layer
// graph never branches on it, only the linear layer's implementation reads it.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FMT_BF16, FMT_MXFP4, FMT_NVFP4 } FP4Format;
typedef enum { GEMM_REFERENCE, GEMM_FP8_EMBED, GEMM_FP4_NATIVE } FP4GemmBackend;
// GEMM_FP8_EMBED's kernel: per shape the faster of cuBLASLt and ours where the bits agree (tuned), or
// one forced (fp4/gemm_fp4.h's fp4_gemm_fp8_on).
typedef enum { FP8_KERNEL_TUNED = 0, FP8_KERNEL_CUBLASLT = 1, FP8_KERNEL_OWN = 2 } Fp8Kernel;
// On the FP8 path cuBLASLt runs a Wgrad with both operands in VEC128 (one exponent per 128 tokens of a
// row) at ~880 TFLOP/s, with one in BLK128x128 (one per 128x128 tile) at ~1100 (docs/results_fp4.md).
// The tile embedding is exact while a tile's 32-blocks lie within 14 binades of its largest
// (fp8_embed.h), as for the weights: dY^T by default, as trained models grow outlier channels in the
// activations that gradients do not have (linear_fp4_tile_stats counts the blocks outside the range).
typedef enum { WGRAD_2D_OFF = 0, WGRAD_2D_DY = 1, WGRAD_2D_X = 2 } Wgrad2D;

typedef struct {
  FP4Format format;           // of every linear layer not overridden to BF16
  int sr_dgrad;               // dY stochastically rounded for Dgrad (row copy)
  int sr_wgrad;               // dY stochastically rounded for Wgrad too (column copy)
  int hadamard;               // 0, 16 or 32: fixed-sign Hadamard along tokens on both Wgrad operands
  int weight_2d;              // 2D weight tiles (32x32 MX, 16x16 NV): W and W^T share codes
  int scale_round_up;         // MXFP4: 2^ceil(log2 amax) (the paper) rather than OCP's floor - 2
  FP4GemmBackend gemm;        // how the quantized GEMMs run
  Fp8Kernel fp8_kernel;       // GEMM_FP8_EMBED: cuBLASLt, our wgmma kernel (fp4/gemm_wgmma.cu), or tuned per shape
  int wgrad_2d;               // FP8 path: the Wgrad operand embedded per 128x128 tile (faster GEMM): WGRAD_2D_*
  int bf16_first, bf16_last;  // blocks kept in BF16 at either end
} Recipe;

// The allowed values of each precision.* key, in one place: the config's reference and checks
// (run/config.c) and recipe_resolve read these lists. "auto" is the recipe's default.
#define RECIPE_FORMATS "bf16|mxfp4|nvfp4"
#define RECIPE_SR "auto|none|dgrad|dgrad_wgrad"
#define RECIPE_HADAMARD "auto|none|h16|h32"
#define RECIPE_WEIGHT_2D "auto|on|off"
#define RECIPE_SCALE_ROUNDING "auto|up|down"
#define RECIPE_WGRAD_2D "auto|off|dy|x"
#define RECIPE_FP4_GEMM "auto|reference|fp8|fp4|fp8_own|fp8_cublaslt"

// A recipe as the config spells it: the precision.* keys.
typedef struct {
  const char *recipe, *sr, *hadamard, *weight_2d, *scale_rounding, *fp4_gemm, *wgrad_2d;
  int bf16_first, bf16_last;
} RecipeSpec;

// Fills *r from the spec ("auto" = the recipe's default):
//   mxfp4: SR for Dgrad only, H32, 2D weights, round-up scales (the paper's recipe)
//   nvfp4: SR for Dgrad and Wgrad, H16, 2D 16x16 weights (TE's recipe)
// fp4_gemm "auto" picks by compute capability: native FP4 on sm_100+, the FP8 embedding on sm_90,
// the reference elsewhere, the FP8 embedding on cuBLASLt. "fp8" is the FP8 embedding with its kernel
// tuned per shape (FP8_KERNEL_TUNED: ours only where it is faster and has cuBLASLt's bits; opt-in until
// it has run on hardware); "fp8_cublaslt" and "fp8_own" force one (ours: sm_90 only) (cc = major*10 + minor; 0 when
// there is no GPU). wgrad_2d: auto (dy on the FP8 path) | off | dy | x; other back ends ignore it. Then recipe_check.
// Returns 0, or -1 with err naming the key.
int recipe_resolve(Recipe *r, const RecipeSpec *spec, int cc, char *err, int errlen);

// The combinations no back end runs, however r was made (recipe_resolve, or a test by hand): 0, or
// -1 with err naming the precision key. The one validation of a recipe; the linear layers call it too.
int recipe_check(const Recipe *r, char *err, int errlen);

// The format block `layer` of `n_layers` runs in (BF16 when overridden).
FP4Format recipe_block_format(const Recipe *r, int layer, int n_layers);

// One line describing the resolved recipe, for the run's banner and checkpoint metadata.
void recipe_describe(const Recipe *r, char *buf, int len);

#ifdef __cplusplus
}
#endif
