// tests/unit/test_linear_fp4.c: the CPU backend's FP4 linear layer (model/cpu/linear_fp4.c), the fp32
// reference of every route: under BF16 it is matmul.c bit for bit; each format's Fprop, Dgrad and Wgrad
// are the products of the operands its C quantizers make (recomposed here from fp4/); a mixed route
// computes each contraction exactly as the pure route of that contraction's format; SR draws per
// (step, micro); the errors against fp32 are those of FP4 operands.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fp4/hadamard.h"
#include "fp4/mxfp4.h"
#include "fp4/nvfp4.h"
#include "fp4/nvfp4_cta.h"
#include "model/cpu/linear_fp4.h"
#include "tests/test.h"

enum { N = 64, IN = 96, OUT = 160 };

static float *randn(size_t n, uint64_t seed, float scale) {
  Rng r;
  rng_seed(&r, seed);
  float *x = xmalloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(&r);
  return x;
}

static LinearFp4Cpu route(const char *recipe, const char *dgrad, const char *had) {
  RecipeSpec s = {.recipe = recipe, .hadamard = had, .fp4_gemm = "reference", .dgrad = dgrad};
  LinearFp4Cpu L = linear_fp4_cpu_route(&s, 4, 42);
  L.step = 3, L.micro = 1;
  return L;
}

typedef struct {
  float *y, *dx, *dw;
} Out;

static const LinearId ID = {2, LIN_GATE};

static Out run(const LinearFp4Cpu *L, const float *x, const float *w, const float *dy) {
  Out o = {xmalloc((size_t)N * OUT * sizeof(float)), xmalloc((size_t)N * IN * sizeof(float)),
           xcalloc((size_t)OUT * IN, sizeof(float))};
  linear_fp4_cpu_forward(L, ID, o.y, x, w, N, IN, OUT);
  linear_fp4_cpu_backward(L, ID, o.dx, o.dw, dy, x, w, N, IN, OUT, 0);
  return o;
}

static void out_free(Out *o) { free(o->y), free(o->dx), free(o->dw); }

static double rel(const float *a, const float *b, size_t n) {
  double e = 0, s = 0;
  for (size_t i = 0; i < n; i++) e += pow((double)a[i] - b[i], 2), s += (double)b[i] * b[i];
  return sqrt(e / s);
}

// y = x W^T from the MXFP4 reference operands, composed here.
static void mx_fprop(float *y, const float *x, const float *w) {
  uint8_t *c = xmalloc(N * IN), *s = xmalloc(N * IN), *cw = xmalloc(OUT * IN), *sw = xmalloc(OUT * IN);
  float *xd = xmalloc(N * IN * 4), *wd = xmalloc(OUT * IN * 4);
  PhiloxStream none = {{0, 0}, 0, 0, 0};
  mx_quantize_rows(x, N, IN, MX_SCALE_UP, MX_RNE, none, c, s);
  mx_dequantize(c, s, N, IN, MX_SCALE_UP, xd);
  mx_quantize_weight(w, OUT, IN, MX_SCALE_UP, 1, cw, sw, NULL, NULL);
  mx_dequantize(cw, sw, OUT, IN, MX_SCALE_UP, wd);
  matmul_forward(y, xd, wd, N, IN, OUT);
  free(c), free(s), free(cw), free(sw), free(xd), free(wd);
}

// dX = dY W with CTA-local dY rows (SR, the Dgrad stream) and W^T from the 2D16 tiles, outer factors after.
static void cta_dgrad(float *dx, const float *dy, const float *w, const LinearFp4Cpu *L) {
  uint8_t *c = xmalloc(N * OUT), *s = xmalloc(N * OUT), *ct = xmalloc(OUT * IN), *st = xmalloc(OUT * IN);
  float *a = xmalloc(N * OUT * 4), *b = xmalloc(OUT * IN * 4), oa[4], ob[4];
  PhiloxStream str = philox_stream(L->seed, L->step, L->micro, ID.layer, 4 * ID.kind + 0);
  nvfp4_cta_quantize_rows(dy, N, OUT, NV_SR, str, c, s, oa);
  nvfp4_cta_dequantize_unscaled(c, s, N, OUT, a);
  nvfp4_cta_quantize_weight(w, OUT, IN, NULL, NULL, NULL, ct, st, ob);
  nvfp4_cta_dequantize_unscaled(ct, st, IN, OUT, b);
  matmul_forward(dx, a, b, N, OUT, IN);
  nvfp4_cta_apply_outer(dx, N, IN, oa, ob);
  free(c), free(s), free(ct), free(st), free(a), free(b);
}

int main(void) {
  float *x = randn((size_t)N * IN, 1, 1.0f), *w = randn((size_t)OUT * IN, 2, 0.05f),
        *dy = randn((size_t)N * OUT, 3, 0.01f);
  Out ref = {xmalloc(N * OUT * 4), xmalloc(N * IN * 4), xcalloc(OUT * IN, 4)};
  matmul_forward(ref.y, x, w, N, IN, OUT);
  matmul_backward(ref.dx, ref.dw, dy, x, w, N, IN, OUT, 0);

  TEST_SECTION("BF16 (fp32 on the CPU): matmul.c bit for bit");
  LinearFp4Cpu bf = route("bf16", NULL, "auto");
  Out o = run(&bf, x, w, dy);
  CHECK(!memcmp(o.y, ref.y, N * OUT * 4) && !memcmp(o.dx, ref.dx, N * IN * 4) && !memcmp(o.dw, ref.dw, OUT * IN * 4),
        "the BF16 route changed an fp32 product");
  out_free(&o);

  TEST_SECTION("each format: FP4-sized errors against fp32, SR by (step, micro)");
  const char *fmts[] = {"mxfp4", "nvfp4", "nvfp4_cta"};
  for (int f = 0; f < 3; f++) {
    LinearFp4Cpu L = route(fmts[f], NULL, "auto");
    o = run(&L, x, w, dy);
    double e[3] = {rel(o.y, ref.y, N * OUT), rel(o.dx, ref.dx, N * IN), rel(o.dw, ref.dw, OUT * IN)};
    printf("  %-9s rel L2 against fp32: Fprop %.4f, Dgrad %.4f, Wgrad %.4f\n", fmts[f], e[0], e[1], e[2]);
    for (int i = 0; i < 3; i++) CHECK(e[i] > 0.02 && e[i] < 0.3, "%s: contraction %d error %.4f", fmts[f], i, e[i]);
    Out p = run(&L, x, w, dy);
    CHECK(!memcmp(o.dx, p.dx, N * IN * 4) && !memcmp(o.dw, p.dw, OUT * IN * 4), "%s: the same step, other bits",
          fmts[f]);
    out_free(&p);
    L.micro = 2;
    p = run(&L, x, w, dy);
    CHECK(memcmp(o.dx, p.dx, N * IN * 4) && !memcmp(o.y, p.y, N * OUT * 4),
          "%s: another micro-batch must change the SR Dgrad and nothing in Fprop", fmts[f]);
    out_free(&p), out_free(&o);
  }

  TEST_SECTION("the references, composed by hand: MXFP4 Fprop, CTA-local Dgrad");
  LinearFp4Cpu mx = route("mxfp4", NULL, "auto"), cta = route("nvfp4_cta", NULL, "auto");
  float *y = xmalloc(N * OUT * 4), *dx = xmalloc(N * IN * 4);
  mx_fprop(y, x, w);
  o = run(&mx, x, w, dy);
  CHECK(!memcmp(o.y, y, N * OUT * 4), "MXFP4 Fprop is not the product of the reference operands");
  out_free(&o);
  cta_dgrad(dx, dy, w, &cta);
  o = run(&cta, x, w, dy);
  CHECK(!memcmp(o.dx, dx, N * IN * 4), "CTA-local Dgrad is not the product of the reference operands with the factors");
  out_free(&o);

  TEST_SECTION("the operand hybrid computes each contraction as that format's pure route");
  LinearFp4Cpu hy = route("mxfp4", "nvfp4_cta", "h16_plain"), mxp = route("mxfp4", NULL, "h16_plain");
  Out h = run(&hy, x, w, dy), a = run(&mxp, x, w, dy), c = run(&cta, x, w, dy);
  CHECK(!memcmp(h.y, a.y, N * OUT * 4), "hybrid Fprop != MXFP4 Fprop");
  CHECK(!memcmp(h.dx, c.dx, N * IN * 4), "hybrid Dgrad != CTA-local Dgrad");
  CHECK(!memcmp(h.dw, a.dw, OUT * IN * 4), "hybrid Wgrad != MXFP4 Wgrad with plain H16");
  LinearFp4Cpu mxs = route("mxfp4", NULL, "h16");
  Out s = run(&mxs, x, w, dy);
  CHECK(memcmp(s.dw, a.dw, OUT * IN * 4), "plain and fixed-sign H16 gave the same Wgrad");
  CHECK(rel(a.dw, ref.dw, OUT * IN) < 0.3 && rel(s.dw, ref.dw, OUT * IN) < 0.3, "a rotated Wgrad is still dY^T x");
  out_free(&h), out_free(&a), out_free(&c), out_free(&s);

  TEST_SECTION("per-block formats: the depth hybrid's blocks");
  LinearFp4Cpu d = route("nvfp4_cta", NULL, "none");
  RecipeSpec sp = {.recipe = "nvfp4_cta", .hadamard = "none", .fp4_gemm = "reference", .blocks = "mxfp4:3-4"};
  char err[512];
  CHECK(!recipe_resolve(&d.r, &sp, 0, err, sizeof err), "%s", err);
  CHECK(linear_fp4_cpu_format(&d, (LinearId){1, LIN_Q}, CONTR_FPROP) == FMT_NVFP4_CTA &&
            linear_fp4_cpu_format(&d, ID, CONTR_WGRAD) == FMT_MXFP4 &&
            linear_fp4_cpu_format(&d, (LinearId){-1, LIN_HEAD}, CONTR_FPROP) == FMT_BF16,
        "block 2 (index 1) CTA-local, block 3 (index 2) MXFP4, the head BF16");
  LinearFp4Cpu mxn = route("mxfp4", NULL, "none");
  Out p = run(&d, x, w, dy), q = run(&mxn, x, w, dy);
  CHECK(!memcmp(p.y, q.y, N * OUT * 4) && !memcmp(p.dx, q.dx, N * IN * 4) && !memcmp(p.dw, q.dw, OUT * IN * 4),
        "an MXFP4 block of the depth hybrid differs from the MXFP4 route");
  out_free(&p), out_free(&q);

  free(x), free(w), free(dy), free(y), free(dx);
  out_free(&ref);
  TEST_END();
}
