// fp4/recipe.h: a precision recipe as data. Which operand of which GEMM is quantized how; the layer
// graph never branches on it, only the linear layer's implementation reads it.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// The formats a linear's operands take: MXFP4 (1x32, E8M0), NVFP4 with one fp32 tensor scale per
// operand (TE's "global" scale contract, nvfp4.h) and CTA-local NVFP4 (fp32 outer factors per 256-row
// stripe, nvfp4_cta.h). FMT_AUTO (a contraction's format only): the block's own.
typedef enum { FMT_BF16, FMT_MXFP4, FMT_NVFP4, FMT_NVFP4_CTA, FMT_N, FMT_AUTO = FMT_N } FP4Format;
// The three GEMMs of a linear: Fprop (x W^T), Dgrad (dY W), Wgrad (dY^T x).
typedef enum { CONTR_FPROP, CONTR_DGRAD, CONTR_WGRAD, CONTR_N } Contraction;
#define RECIPE_MAX_SPANS 16
// precision.blocks: blocks first..last (0-based, inclusive) run in format.
typedef struct {
  FP4Format format;
  int first, last;
} BlockSpan;
typedef enum { GEMM_REFERENCE, GEMM_FP8_EMBED, GEMM_FP4_NATIVE } FP4GemmBackend;
// GEMM_FP8_EMBED's kernel: per shape the faster of cuBLASLt and CUTLASS's where the bits agree (tuned;
// cuBLASLt alone in a build without CUTLASS), or one forced (fp4/gemm_fp4.h's fp4_gemm_fp8_on). 2 was
// our own wgmma kernel, removed on 2026-12-05 (docs/gemm_wgmma.md).
typedef enum { FP8_KERNEL_TUNED = 0, FP8_KERNEL_CUBLASLT = 1, FP8_KERNEL_CUTLASS = 3 } Fp8Kernel;
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
  int hadamard;               // 0, 16 or 32: Hadamard along tokens on both Wgrad operands
  int hadamard_plain;         // H16 without the sign flips (hadamard 16 only)
  int weight_2d;              // 2D weight tiles (32x32 MX, 16x16 NV): W and W^T share codes
  int scale_round_up;         // MXFP4: 2^ceil(log2 amax) (the paper) rather than OCP's floor - 2
  FP4GemmBackend gemm;        // how the quantized GEMMs run
  Fp8Kernel fp8_kernel;       // GEMM_FP8_EMBED: cuBLASLt, CUTLASS's, or tuned per shape
  int wgrad_2d;               // FP8 path: the Wgrad operand embedded per 128x128 tile (faster GEMM): WGRAD_2D_*
  int bf16_first, bf16_last;  // blocks kept in BF16 at either end (over every span)
  // precision.fprop/dgrad/wgrad: 0 = auto (the block's format), else 1 + the FP4Format, so that a
  // zero-initialized Recipe is uniform; read it through recipe_override.
  int contraction[CONTR_N];
  // precision.fusion: which of the fusions around the FP4 GEMMs run (the same bits either way).
  // FUSION_AUTO: those that have run on a GPU and measured faster (RMSNorm and SwiGLU inside the
  // quantizers, the operand hybrid's one dY producer); FUSION_ON: also the newer ones (the residual add in
  // the GEMM epilogue, SwiGLU and down's producers in up's GEMM epilogue: model/cuda/linear_fp4.cu's
  // *_IN_AUTO say when auto takes them); FUSION_OFF: none, every op a kernel of its own (for measuring them).
  int fusion;
  int nspans;  // precision.blocks, in the order given (no two overlap)
  BlockSpan spans[RECIPE_MAX_SPANS];
} Recipe;

// The allowed values of each precision.* key, in one place: the config's reference and checks
// (run/config.c) and recipe_resolve read these lists. "auto" is the recipe's default.
#define RECIPE_FORMATS "bf16|mxfp4|nvfp4|nvfp4_cta"  // in FP4Format order
#define RECIPE_CONTRACTION "auto|bf16|mxfp4|nvfp4|nvfp4_cta"
#define RECIPE_SR "auto|none|dgrad|dgrad_wgrad"
#define RECIPE_HADAMARD "auto|none|h16|h32|h16_plain"
#define RECIPE_WEIGHT_2D "auto|on|off"
#define RECIPE_SCALE_ROUNDING "auto|up|down"
#define RECIPE_WGRAD_2D "auto|off|dy|x"
#define RECIPE_FP4_GEMM "auto|reference|fp8|fp4|fp8_cublaslt|fp8_cutlass"
#define RECIPE_FUSION "auto|on|off"
enum { FUSION_AUTO = 0, FUSION_ON = 1, FUSION_OFF = 2 };  // RECIPE_FUSION's order
// A value precision.fp4_gemm took until 2026-12-05, refused (recipe_resolve, run/config.c) with this
// note rather than as unknown: a config that names it must not run another kernel silently.
#define RECIPE_FP4_GEMM_REMOVED "fp8_own"
#define RECIPE_FP4_GEMM_REMOVED_WHY                                                        \
  "fp8_own was our own Hopper FP8 kernel, removed on 2026-12-05 (it never beat cuBLASLt: " \
  "docs/gemm_wgmma.md); fp8_cublaslt gives the same bits"

// A recipe as the config spells it: the precision.* keys (NULL: "auto", except recipe).
typedef struct {
  const char *recipe, *sr, *hadamard, *weight_2d, *scale_rounding, *fp4_gemm, *wgrad_2d;
  int bf16_first, bf16_last;
  const char *fprop, *dgrad, *wgrad;  // RECIPE_CONTRACTION (NULL: auto)
  const char *blocks;                 // "FORMAT:A-B[,FORMAT:A-B...]", 1-based as the paper counts (NULL, "": none)
  const char *fusion;                 // RECIPE_FUSION (NULL: auto)
} RecipeSpec;

// Fills *r from the spec ("auto" = the default of the recipe's format):
//   mxfp4: SR for Dgrad only, H32, 2D weights, round-up scales (the paper's recipe)
//   nvfp4: SR for Dgrad and Wgrad, H16, 2D 16x16 weights (TE's recipe)
//   nvfp4_cta: SR for Dgrad only, no Hadamard, 2D16 weights (the paper's CTA-local route)
// Mixed routes name formats per block (precision.blocks) and per contraction (precision.fprop, dgrad,
// wgrad: one format for that GEMM in every FP4 block); the element keys apply to whichever format
// runs, and combinations no format can honour are refused (recipe_check).
// fp4_gemm "auto" picks by compute capability: native FP4 on sm_100+, the FP8 embedding on sm_90,
// the reference elsewhere, the FP8 embedding on cuBLASLt. "fp8" is the FP8 embedding with its kernel
// tuned per shape (FP8_KERNEL_TUNED: CUTLASS's only where faster with cuBLASLt's bits, so cuBLASLt
// alone in a build without CUTLASS; opt-in until it has run on hardware); "fp8_cublaslt" and
// "fp8_cutlass" force one (the last: sm_90 only); "fp8_own" is refused (RECIPE_FP4_GEMM_REMOVED)
// (cc = major*10 + minor; 0 when
// there is no GPU). wgrad_2d: auto (dy on the FP8 path) | off | dy | x; other back ends ignore it. Then recipe_check.
// Returns 0, or -1 with err naming the key.
int recipe_resolve(Recipe *r, const RecipeSpec *spec, int cc, char *err, int errlen);

// The combinations no back end runs, however r was made (recipe_resolve, or a test by hand): 0, or
// -1 with err naming the precision key. The one validation of a recipe; the linear layers call it too.
int recipe_check(const Recipe *r, char *err, int errlen);

// The spans against the model's depth (a span past the last block): 0, or -1 with err naming the key.
int recipe_check_layers(const Recipe *r, int n_layers, char *err, int errlen);

// The format block `layer` (0-based) of `n_layers` runs in: BF16 at the overridden ends, else its
// span's, else the recipe's.
FP4Format recipe_block_format(const Recipe *r, int layer, int n_layers);
// Contraction c's override: FMT_AUTO or a format.
static inline FP4Format recipe_override(const Recipe *r, Contraction c) {
  return r->contraction[c] ? (FP4Format)(r->contraction[c] - 1) : FMT_AUTO;
}
// The format of contraction c in block `layer`: BF16 in a BF16 block, else the contraction's override,
// else the block's.
FP4Format recipe_format(const Recipe *r, int layer, int n_layers, Contraction c);
// 1 when some block and contraction of an n_layers model runs in format f.
int recipe_uses(const Recipe *r, int n_layers, FP4Format f);
// 1 when every FP4 block runs one format in all three contractions (no span, no override that differs).
int recipe_uniform(const Recipe *r, int n_layers);
const char *recipe_format_name(FP4Format f);

// One line describing the resolved recipe, for the run's banner and checkpoint metadata.
void recipe_describe(const Recipe *r, char *buf, int len);
// The route's contract per contraction for an n_layers model, in one line (--dry-run): each run of
// blocks with one contract, then for Fprop, Dgrad and Wgrad the format and what each operand gets.
void recipe_contract(const Recipe *r, int n_layers, char *buf, int len);
// The spans and overrides in canonical form, for the checkpoint's "route" section: two runs with the
// same string compute the same route.
void recipe_route_key(const Recipe *r, char *buf, int len);

#ifdef __cplusplus
}
#endif
