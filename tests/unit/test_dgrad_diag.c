// tests/unit/test_dgrad_diag.c: the Dgrad diagnostic's per-linear product (run/dgrad_diag.c, the CPU
// reference once per SR draw): fresh SR bits per draw, and the row-prefix property --dgrad-tokens relies on. The whole
// diagnostic runs in tests/system/test_dgrad_diag.sh.
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

// Each draw takes fresh SR bits: the average of `draws` is finite and differs from the average the
// first draw's bits would give if every draw reused them (built the way dgrad_diag_estimate sums).
static void fresh_draws(const char *recipe, int rows, int in, int out_dim, int draws, LinearId id) {
  LinearFp4Cpu L = route(recipe);
  const size_t nx = (size_t)rows * in;
  float *dy = xmalloc((size_t)rows * out_dim * sizeof *dy), *w = xmalloc((size_t)out_dim * in * sizeof *w);
  float *one = xcalloc(nx, sizeof *one), *avg = xcalloc(nx, sizeof *avg);
  fill(dy, rows, out_dim, 11u + (uint32_t)rows), fill(w, out_dim, in, 29u + (uint32_t)in);
  dgrad_diag_estimate(&L, 5, id, one, dy, w, rows, in, out_dim, 1);
  dgrad_diag_estimate(&L, 5, id, avg, dy, w, rows, in, out_dim, draws);
  float *same = xcalloc(nx, sizeof *same);  // every draw with the first draw's bits
  for (int k = 0; k < draws; k++)
    for (size_t i = 0; i < nx; i++) same[i] += one[i] / (float)draws;
  int finite = 1;
  for (size_t i = 0; i < nx; i++) finite &= isfinite(avg[i]) != 0;
  CHECK(finite && memcmp(same, avg, nx * sizeof *same) != 0,
        "%s %s rows %d: the average of %d draws equals repeated first draws (no fresh SR bits) or is not finite",
        recipe, linear_kind_name(id.kind), rows, draws);
  free(dy), free(w), free(one), free(avg), free(same);
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
  TEST_SECTION("each draw takes fresh SR bits");
  const char *recipes[2] = {"mxfp4", "nvfp4_cta"};
  for (int f = 0; f < 2; f++) {
    fresh_draws(recipes[f], 320, 96, 64, 3, (LinearId){1, LIN_K});    // a partial CTA stripe (320 = 256 + 64)
    fresh_draws(recipes[f], 512, 64, 160, 4, (LinearId){3, LIN_UP});  // two whole stripes, out != in
  }
  TEST_SECTION("a prefix of dY's rows gives the prefix of the Dgrad");
  for (int f = 0; f < 2; f++) prefix_rows(recipes[f], 768, 256, 64, 96);
  TEST_END();
}
