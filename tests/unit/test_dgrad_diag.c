// tests/unit/test_dgrad_diag.c: the Dgrad diagnostic's per-linear product (run/dgrad_diag.c) against
// the CPU reference it reproduces (model/cpu/linear_fp4.c, one call per SR draw), bit for bit, and the
// row-prefix property --dgrad-tokens relies on. The whole diagnostic runs in tests/system/test_dgrad_diag.sh.
#include <stdlib.h>

#include "common/common.h"
#include "run/dgrad_diag.h"
#include "tests/test.h"

// Values over several binades, rows of different magnitudes (so blocks and stripes get different scales).
static void fill(float *x, int rows, int cols, uint32_t seed) {
  uint32_t s = seed;
  for (int r = 0; r < rows; r++) {
    float row_scale = ldexpf(1.0f, (int)(r % 7) - 3);
    for (int c = 0; c < cols; c++) {
      s = s * 1664525u + 1013904223u;
      float u = (float)(s >> 8) / 16777216.0f - 0.5f;
      s = s * 1664525u + 1013904223u;
      x[(size_t)r * cols + c] = u * row_scale * ldexpf(1.0f, (int)(s >> 29) - 4);
    }
  }
}

static LinearFp4Cpu route(const char *recipe) {
  RecipeSpec s = {.recipe = recipe, .sr = "dgrad", .hadamard = "none", .fp4_gemm = "reference"};
  return linear_fp4_cpu_route(&s, 4, 0x5eedu);
}

// est starts at 0.25 everywhere (the function adds to it); the reference does the same per draw.
static void one(const char *recipe, int rows, int in, int out_dim, int draws, LinearId id) {
  LinearFp4Cpu L = route(recipe);
  const size_t nx = (size_t)rows * in;
  float *dy = xmalloc((size_t)rows * out_dim * sizeof *dy), *w = xmalloc((size_t)out_dim * in * sizeof *w);
  float *est = xmalloc(nx * sizeof *est), *want = xmalloc(nx * sizeof *want), *t = xmalloc(nx * sizeof *t);
  fill(dy, rows, out_dim, 11u + (uint32_t)rows), fill(w, out_dim, in, 29u + (uint32_t)in);
  for (size_t i = 0; i < nx; i++) est[i] = want[i] = 0.25f;
  const uint32_t step = 5;
  dgrad_diag_estimate(&L, step, id, est, dy, w, rows, in, out_dim, draws);
  float *first = xmalloc(nx * sizeof *first);
  int differ = 0;  // a later draw's Dgrad differs from the first's: fresh SR bits
  for (int k = 0; k < draws; k++) {
    LinearFp4Cpu Lk = L;
    Lk.step = step, Lk.micro = (uint32_t)k;
    linear_fp4_cpu_backward(&Lk, id, t, NULL, dy, NULL, w, rows, in, out_dim, 0);
    if (k == 0) memcpy(first, t, nx * sizeof *t);
    else differ |= memcmp(first, t, nx * sizeof *t) != 0;
    for (size_t i = 0; i < nx; i++) want[i] += t[i] / (float)draws;
  }
  size_t bad = 0;
  for (size_t i = 0; i < nx; i++) bad += memcmp(&est[i], &want[i], sizeof(float)) != 0;
  CHECK(bad == 0, "%s %s rows %d in %d out %d draws %d: %zu of %zu elements differ from linear_fp4_cpu_backward",
        recipe, linear_kind_name(id.kind), rows, in, out_dim, draws, bad, nx);
  if (draws > 1) CHECK(differ, "%s: the %d draws all gave the same Dgrad (no fresh SR bits)", recipe, draws);
  free(dy), free(w), free(est), free(want), free(t), free(first);
}

// The first `prefix` rows of dY give the first rows of the full estimate (the SR bits are indexed by
// the element's place in [rows, out], and CTA-local stripes of 256 rows are whole).
static void prefix_rows(const char *recipe, int rows, int prefix, int in, int out_dim) {
  LinearFp4Cpu L = route(recipe);
  LinearId id = {2, LIN_GATE};
  float *dy = xmalloc((size_t)rows * out_dim * sizeof *dy), *w = xmalloc((size_t)out_dim * in * sizeof *w);
  float *full = xcalloc((size_t)rows * in, sizeof *full), *part = xcalloc((size_t)prefix * in, sizeof *part);
  fill(dy, rows, out_dim, 7u), fill(w, out_dim, in, 8u);
  dgrad_diag_estimate(&L, 1, id, full, dy, w, rows, in, out_dim, 2);
  dgrad_diag_estimate(&L, 1, id, part, dy, w, prefix, in, out_dim, 2);
  CHECK(!memcmp(full, part, (size_t)prefix * in * sizeof *part), "%s: the first %d of %d rows differ", recipe, prefix,
        rows);
  free(dy), free(w), free(full), free(part);
}

int main(void) {
  TEST_SECTION("dgrad_diag_estimate = linear_fp4_cpu_backward per draw, averaged in draw order");
  const char *recipes[2] = {"mxfp4", "nvfp4_cta"};
  for (int f = 0; f < 2; f++) {
    one(recipes[f], 320, 96, 64, 3, (LinearId){1, LIN_K});    // a partial CTA stripe (320 = 256 + 64)
    one(recipes[f], 512, 64, 160, 4, (LinearId){3, LIN_UP});  // two whole stripes, out != in
    one(recipes[f], 64, 128, 32, 1, (LinearId){0, LIN_O});    // one draw: the reference's product itself
  }
  TEST_SECTION("a prefix of dY's rows gives the prefix of the Dgrad");
  for (int f = 0; f < 2; f++) prefix_rows(recipes[f], 768, 256, 64, 96);
  TEST_END();
}
