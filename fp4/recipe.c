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

#define AUTO(v) ((v) ? (v) : "auto")  // a key left NULL in a RecipeSpec means "auto"

#define PICK(var, key, value, list) \
  int var = pick(value, list);      \
  if (var < 0) return snprintf(err, errlen, "%s: unknown value '%s' (expected %s)", key, value, list), -1

// precision.blocks: "FORMAT:A-B" entries separated by ',' or ';', blocks counted from 1.
static int parse_spans(Recipe *r, const char *spec, char *err, int errlen) {
  r->nspans = 0;
  if (!spec) return 0;
  const char *p = spec;
  while (*p) {
    while (*p == ' ' || *p == ',' || *p == ';') p++;
    if (!*p) break;
    const char *end = p + strcspn(p, ",;");
    char item[64];
    size_t n = (size_t)(end - p) < sizeof item - 1 ? (size_t)(end - p) : sizeof item - 1;
    memcpy(item, p, n), item[n] = 0;
    char *colon = strchr(item, ':');
    int first = 0, last = 0, used = 0;
    if (colon) {
      *colon = 0;
      if (sscanf(colon + 1, "%d-%d%n", &first, &last, &used) != 2 || colon[1 + used]) {
        used = 0;
        if (sscanf(colon + 1, "%d%n", &first, &used) != 1 || colon[1 + used]) first = -1;
        last = first;
      }
    }
    int f = colon ? pick(item, RECIPE_FORMATS) : -1;
    if (!colon || f < 0 || first < 1 || last < first)
      return snprintf(err, errlen,
                      "precision.blocks: '%.*s': expected FORMAT:FIRST-LAST (FORMAT one of %s, blocks counted from 1, "
                      "e.g. nvfp4_cta:1-27,mxfp4:28-32)",
                      (int)(end - p), p, RECIPE_FORMATS),
             -1;
    if (r->nspans == RECIPE_MAX_SPANS)
      return snprintf(err, errlen, "precision.blocks: more than %d spans", RECIPE_MAX_SPANS), -1;
    r->spans[r->nspans++] = (BlockSpan){(FP4Format)f, first - 1, last - 1};
    p = end;
  }
  return 0;
}

static int may_use_any(const Recipe *r, FP4Format f);

int recipe_resolve(Recipe *r, const RecipeSpec *s, int cc, char *err, int errlen) {
  memset(r, 0, sizeof *r);
  PICK(format, "precision.recipe", s->recipe, RECIPE_FORMATS);
  r->format = (FP4Format)format;  // RECIPE_FORMATS lists FP4Format's order
  const int nv = r->format == FMT_NVFP4, cta = r->format == FMT_NVFP4_CTA;

  const char *names[CONTR_N] = {s->fprop, s->dgrad, s->wgrad};
  static const char *keys[CONTR_N] = {"precision.fprop", "precision.dgrad", "precision.wgrad"};
  for (int c = 0; c < CONTR_N; c++) {
    PICK(f, keys[c], AUTO(names[c]), RECIPE_CONTRACTION);  // auto bf16 mxfp4 nvfp4 nvfp4_cta
    r->contraction[c] = f;                                 // 0 auto, else 1 + FP4Format (RECIPE_CONTRACTION's order)
  }
  if (parse_spans(r, s->blocks, err, errlen)) return -1;

  PICK(sr, "precision.sr", AUTO(s->sr), RECIPE_SR);  // auto none dgrad dgrad_wgrad
  r->sr_dgrad = sr != 1;
  r->sr_wgrad = sr == 0 ? nv : sr == 3;

  PICK(had, "precision.hadamard", AUTO(s->hadamard), RECIPE_HADAMARD);  // auto none h16 h32 h16_plain
  r->hadamard = had == 0 ? (nv ? 16 : cta ? 0 : 32) : had == 1 ? 0 : had == 3 ? 32 : 16;
  r->hadamard_plain = had == 4;

  PICK(w2d, "precision.weight_2d", AUTO(s->weight_2d), RECIPE_WEIGHT_2D);  // auto on off
  r->weight_2d = w2d != 2;

  PICK(round, "precision.scale_rounding", AUTO(s->scale_rounding), RECIPE_SCALE_ROUNDING);  // auto up down
  r->scale_round_up = round != 2;

  // The GEMM back end of the MXFP4 contractions; NVFP4 forms run through BF16 on Hopper (exact).
  // CTA-local NVFP4's native path (FP4 GEMM, then the outer factors) has never run on Blackwell, so
  // auto keeps such routes on the exact reference there (fp4 asks for it and is refused at run time).
  const int mx = may_use_any(r, FMT_MXFP4), any_cta = may_use_any(r, FMT_NVFP4_CTA);
  // gemm: auto reference fp8 fp4 fp8_cublaslt fp8_cutlass
  if (s->fp4_gemm && !strcmp(s->fp4_gemm, RECIPE_FP4_GEMM_REMOVED))
    return snprintf(err, errlen, "precision.fp4_gemm: %s; use one of %s", RECIPE_FP4_GEMM_REMOVED_WHY, RECIPE_FP4_GEMM),
           -1;
  PICK(gemm, "precision.fp4_gemm", AUTO(s->fp4_gemm), RECIPE_FP4_GEMM);
  if (gemm == 0 && cc >= 100) r->gemm = any_cta ? GEMM_REFERENCE : GEMM_FP4_NATIVE;
  else if (gemm == 0) r->gemm = cc >= 90 && mx ? GEMM_FP8_EMBED : GEMM_REFERENCE;
  else r->gemm = gemm == 1 ? GEMM_REFERENCE : gemm == 3 ? GEMM_FP4_NATIVE : GEMM_FP8_EMBED;
  // auto keeps cuBLASLt until the tuned path (fp8) has run on hardware: a default is not where code first runs
  r->fp8_kernel = gemm == 5 ? FP8_KERNEL_CUTLASS : gemm == 2 ? FP8_KERNEL_TUNED : FP8_KERNEL_CUBLASLT;
  if (r->fp8_kernel == FP8_KERNEL_CUTLASS && cc && cc != 90)
    return snprintf(err, errlen, "precision.fp4_gemm: fp8_cutlass is a Hopper (sm_90) kernel; this GPU is sm_%d", cc),
           -1;
  if (r->gemm == GEMM_FP4_NATIVE && cc && cc < 100)
    return snprintf(err, errlen, "precision.fp4_gemm: fp4 needs an sm_100 GPU (this one is sm_%d)", cc), -1;

  PICK(wg, "precision.wgrad_2d", AUTO(s->wgrad_2d), RECIPE_WGRAD_2D);  // auto off dy x
  r->wgrad_2d = wg == 1 ? WGRAD_2D_OFF : wg == 3 ? WGRAD_2D_X : WGRAD_2D_DY;
  if (r->gemm != GEMM_FP8_EMBED || !mx) r->wgrad_2d = WGRAD_2D_OFF;  // an FP8-embedding choice

  PICK(fu, "precision.fusion", AUTO(s->fusion), RECIPE_FUSION);  // auto on off
  r->fusion = fu;                                                // RECIPE_FUSION's order is FUSION_*'s

  r->bf16_first = s->bf16_first, r->bf16_last = s->bf16_last;
  return recipe_check(r, err, errlen);
}

// Whether contraction c may run in format f in some block (without the depth: the spans' formats
// count wherever they lie).
static int may_use(const Recipe *r, Contraction c, FP4Format f) {
  if (r->contraction[c]) return recipe_override(r, c) == f && (r->format != FMT_BF16 || r->nspans);
  if (r->format == f) return 1;
  for (int i = 0; i < r->nspans; i++)
    if (r->spans[i].format == f) return 1;
  return 0;
}

static int may_use_any(const Recipe *r, FP4Format f) {
  return may_use(r, CONTR_FPROP, f) || may_use(r, CONTR_DGRAD, f) || may_use(r, CONTR_WGRAD, f);
}

int recipe_check(const Recipe *r, char *err, int errlen) {
  static const char *keys[CONTR_N] = {"precision.fprop", "precision.dgrad", "precision.wgrad"};
  if ((unsigned)r->format >= FMT_N) return snprintf(err, errlen, "precision.recipe: format %d", (int)r->format), -1;
  for (int c = 0; c < CONTR_N; c++) {
    if ((unsigned)r->contraction[c] > FMT_N)
      return snprintf(err, errlen, "%s: format %d", keys[c], r->contraction[c] - 1), -1;
    if (r->contraction[c] && r->format == FMT_BF16 && !r->nspans)
      return snprintf(err, errlen,
                      "%s: %s with precision.recipe bf16 and no precision.blocks: every block runs in BF16, so no "
                      "contraction can run in another format",
                      keys[c], recipe_format_name(recipe_override(r, (Contraction)c))),
             -1;
  }
  for (int i = 0; i < r->nspans; i++) {
    const BlockSpan *a = &r->spans[i];
    if ((unsigned)a->format >= FMT_N || a->first < 0 || a->last < a->first)
      return snprintf(err, errlen, "precision.blocks: span %d is not FORMAT:FIRST-LAST with 1 <= FIRST <= LAST", i + 1),
             -1;
    for (int j = 0; j < i; j++)
      if (a->first <= r->spans[j].last && r->spans[j].first <= a->last)
        return snprintf(err, errlen, "precision.blocks: blocks %d-%d and %d-%d overlap", r->spans[j].first + 1,
                        r->spans[j].last + 1, a->first + 1, a->last + 1),
               -1;
  }
  if (r->bf16_first < 0 || r->bf16_last < 0)
    return snprintf(err, errlen, "precision.bf16_first_blocks/bf16_last_blocks must be >= 0"), -1;
  const int mx = may_use_any(r, FMT_MXFP4);
  const int nv16 = may_use_any(r, FMT_NVFP4) || may_use_any(r, FMT_NVFP4_CTA);
  if (!mx && !nv16) return 0;  // every linear in BF16: the element keys mean nothing
  if (r->hadamard != 0 && r->hadamard != 16 && r->hadamard != 32)
    return snprintf(err, errlen, "precision.hadamard: %d points: expected 0, 16 or 32", r->hadamard), -1;
  if (r->hadamard_plain && r->hadamard != 16)
    return snprintf(err, errlen, "precision.hadamard: the plain (unsigned) form exists for H16 only"), -1;
  if (r->hadamard == 32 && (may_use(r, CONTR_WGRAD, FMT_NVFP4) || may_use(r, CONTR_WGRAD, FMT_NVFP4_CTA)))
    return snprintf(err, errlen,
                    "precision.hadamard: h32 with an NVFP4 Wgrad: 16-element blocks take a 16-point rotation (h16, "
                    "h16_plain or none; precision.wgrad: mxfp4 keeps h32)"),
           -1;
  if (!r->scale_round_up && !mx)
    return snprintf(err, errlen, "precision.scale_rounding: 'down' is an MXFP4 option; NVFP4 scales are E4M3"), -1;
  // NVFP4's E2M1 x E4M3 products need 6 significant bits: exact in BF16, not in E4M3 (docs/formats.md §3).
  if (!mx && r->gemm == GEMM_FP8_EMBED)
    return snprintf(err, errlen,
                    "precision.fp4_gemm: fp8 cannot hold NVFP4 exactly and no contraction is MXFP4; use reference "
                    "(Hopper) or fp4"),
           -1;
  if (r->fp8_kernel != FP8_KERNEL_TUNED && r->fp8_kernel != FP8_KERNEL_CUBLASLT && r->fp8_kernel != FP8_KERNEL_CUTLASS)
    return snprintf(err, errlen, "precision.fp4_gemm: FP8 kernel %d is not an Fp8Kernel%s", (int)r->fp8_kernel,
                    r->fp8_kernel == 2 ? " (2 was fp8_own, removed on 2026-12-05)" : ""),
           -1;
  if (r->fp8_kernel == FP8_KERNEL_CUTLASS && r->gemm != GEMM_FP8_EMBED)  // the others mean nothing elsewhere
    return snprintf(err, errlen, "precision.fp4_gemm: fp8_cutlass runs the FP8 embedding (Recipe.gemm GEMM_FP8_EMBED)"),
           -1;
  return 0;
}

int recipe_check_layers(const Recipe *r, int n_layers, char *err, int errlen) {
  for (int i = 0; i < r->nspans; i++)
    if (r->spans[i].last >= n_layers)
      return snprintf(err, errlen, "precision.blocks: blocks %d-%d: the model has %d blocks (counted from 1)",
                      r->spans[i].first + 1, r->spans[i].last + 1, n_layers),
             -1;
  return 0;
}

FP4Format recipe_block_format(const Recipe *r, int layer, int n_layers) {
  if (layer < r->bf16_first || layer >= n_layers - r->bf16_last) return FMT_BF16;
  for (int i = 0; i < r->nspans; i++)
    if (layer >= r->spans[i].first && layer <= r->spans[i].last) return r->spans[i].format;
  return r->format;
}

FP4Format recipe_format(const Recipe *r, int layer, int n_layers, Contraction c) {
  FP4Format b = recipe_block_format(r, layer, n_layers);
  return b == FMT_BF16 || !r->contraction[c] ? b : recipe_override(r, c);
}

int recipe_uses(const Recipe *r, int n_layers, FP4Format f) {
  for (int l = 0; l < n_layers; l++)
    for (int c = 0; c < CONTR_N; c++)
      if (recipe_format(r, l, n_layers, (Contraction)c) == f) return 1;
  return 0;
}

int recipe_uniform(const Recipe *r, int n_layers) {
  for (int l = 0; l < n_layers; l++)
    for (int c = 0; c < CONTR_N; c++) {
      FP4Format f = recipe_format(r, l, n_layers, (Contraction)c);
      if (f != FMT_BF16 && f != r->format) return 0;
    }
  return 1;
}

const char *recipe_format_name(FP4Format f) {
  static const char *n[] = {"bf16", "mxfp4", "nvfp4", "nvfp4_cta", "auto"};
  return (unsigned)f <= FMT_AUTO ? n[f] : "?";
}

static const char *hadamard_desc(const Recipe *r) {
  return r->hadamard == 32 ? "H32" : r->hadamard == 16 ? (r->hadamard_plain ? "plain H16" : "H16") : "no";
}

void recipe_describe(const Recipe *r, char *buf, int len) {
  static const char *gemm[] = {"reference", "fp8-embedded", "fp4-native"};
  if (r->format == FMT_BF16 && !r->nspans) {
    snprintf(buf, len, "bf16");
    return;
  }
  int n = snprintf(
      buf, len, "%s: SR %s, %s Wgrad Hadamard, %s weight scales%s, %s GEMMs%s, BF16 blocks %d first / %d last",
      recipe_format_name(r->format),
      r->sr_wgrad   ? "Dgrad+Wgrad"
      : r->sr_dgrad ? "Dgrad"
                    : "off",
      hadamard_desc(r), r->weight_2d ? "2D" : "1D",
      r->format == FMT_MXFP4 ? (r->scale_round_up ? ", round-up exponents" : ", OCP round-down exponents") : "",
      gemm[r->gemm],
      r->wgrad_2d == WGRAD_2D_DY  ? " (Wgrad dY in 128x128 tiles)"
      : r->wgrad_2d == WGRAD_2D_X ? " (Wgrad x in 128x128 tiles)"
                                  : "",
      r->bf16_first, r->bf16_last);
  char key[256];
  recipe_route_key(r, key, sizeof key);
  if (strcmp(key, "uniform") && n > 0 && n < len) n += snprintf(buf + n, len - n, ", route %s", key);
  if (r->fusion != FUSION_AUTO && n > 0 && n < len)
    snprintf(buf + n, len - n, r->fusion == FUSION_OFF ? ", unfused" : ", every fusion (also those auto leaves out)");
}

// What each operand of contraction c in format f gets, e.g. "x 1x32 RNE, W 2D32".
static void operands(const Recipe *r, Contraction c, FP4Format f, char *buf, int len) {
  const int blk = f == FMT_MXFP4 ? 32 : 16;
  char w[16], wt[32];
  snprintf(w, sizeof w, r->weight_2d ? "2D%d" : "1x%d", blk);
  snprintf(wt, sizeof wt, r->weight_2d ? "W's %d-tiles" : "1x%d", blk);
  if (c == CONTR_FPROP) snprintf(buf, len, "x 1x%d RNE, W %s", blk, w);
  else if (c == CONTR_DGRAD) snprintf(buf, len, "dY 1x%d %s, W^T %s", blk, r->sr_dgrad ? "SR" : "RNE", wt);
  else
    snprintf(buf, len, "dY^T %s and x^T RNE, 1x%d along tokens, %s%s", r->sr_wgrad ? "SR" : "RNE", blk,
             r->hadamard ? "after " : "", r->hadamard ? hadamard_desc(r) : "no Hadamard");
}

static const char *scales_desc(FP4Format f) {
  return f == FMT_MXFP4       ? "E8M0 per 32"
         : f == FMT_NVFP4     ? "E4M3 per 16, fp32 tensor scale"
         : f == FMT_NVFP4_CTA ? "E4M3 per 16, fp32 outer factors per 256 rows"
                              : "";
}

void recipe_contract(const Recipe *r, int n_layers, char *buf, int len) {
  static const char *cname[CONTR_N] = {"Fprop", "Dgrad", "Wgrad"};
  int n = 0;
  buf[0] = 0;
  for (int l0 = 0; l0 < n_layers;) {
    FP4Format f0[CONTR_N];
    for (int c = 0; c < CONTR_N; c++) f0[c] = recipe_format(r, l0, n_layers, (Contraction)c);
    int l1 = l0;
    while (l1 + 1 < n_layers) {
      int same = 1;
      for (int c = 0; c < CONTR_N; c++) same &= recipe_format(r, l1 + 1, n_layers, (Contraction)c) == f0[c];
      if (!same) break;
      l1++;
    }
    n += snprintf(buf + n, n < len ? len - n : 0, "%sblocks %d-%d:", l0 ? "; " : "", l0 + 1, l1 + 1);
    if (f0[0] == FMT_BF16 && f0[1] == FMT_BF16 && f0[2] == FMT_BF16)
      n += snprintf(buf + n, n < len ? len - n : 0, " BF16");
    else
      for (int c = 0; c < CONTR_N; c++) {
        char ops[128] = "";
        if (f0[c] != FMT_BF16) operands(r, (Contraction)c, f0[c], ops, sizeof ops);
        n += snprintf(buf + n, n < len ? len - n : 0, "%s %s %s%s%s%s%s", c ? " |" : "", cname[c],
                      recipe_format_name(f0[c]), f0[c] != FMT_BF16 ? " (" : "", scales_desc(f0[c]),
                      f0[c] != FMT_BF16 ? "; " : "", ops);
        if (f0[c] != FMT_BF16) n += snprintf(buf + n, n < len ? len - n : 0, ")");
      }
    l0 = l1 + 1;
  }
}

void recipe_route_key(const Recipe *r, char *buf, int len) {
  int n = 0, any = r->hadamard_plain || r->nspans;
  for (int c = 0; c < CONTR_N; c++) any |= r->contraction[c] != 0;
  if (!any) {
    snprintf(buf, len, "uniform");
    return;
  }
  n += snprintf(buf, len, "fprop=%s dgrad=%s wgrad=%s blocks=", recipe_format_name(recipe_override(r, CONTR_FPROP)),
                recipe_format_name(recipe_override(r, CONTR_DGRAD)),
                recipe_format_name(recipe_override(r, CONTR_WGRAD)));
  for (int i = 0; i < r->nspans; i++)
    n += snprintf(buf + n, n < len ? len - n : 0, "%s%s:%d-%d", i ? "," : "", recipe_format_name(r->spans[i].format),
                  r->spans[i].first + 1, r->spans[i].last + 1);
  snprintf(buf + n, n < len ? len - n : 0, "%s%s", r->nspans ? "" : "-",
           r->hadamard_plain ? " hadamard=h16_plain" : "");
}
