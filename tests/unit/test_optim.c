// tests/unit/test_optim.c: AdamW against a direct double-precision transcription of torch.optim.AdamW,
// the global gradient norm and clip factor, and the learning-rate schedules.
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "common/common.h"
#include "model/adamw.h"
#include "run/schedule.h"
#include "tests/test.h"

// One AdamW step in double, written straight from the formulas in adamw.h.
static void adamw_ref(double *p, const double *g, double *m, double *v, size_t n, double lr, double b1, double b2,
                      double eps, double wd, double scale, int t) {
  for (size_t i = 0; i < n; i++) {
    double gi = g[i] * scale;
    p[i] *= 1.0 - lr * wd;
    m[i] = b1 * m[i] + (1.0 - b1) * gi;
    v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
    double mhat = m[i] / (1.0 - pow(b1, t)), vhat = v[i] / (1.0 - pow(b2, t));
    p[i] -= lr * mhat / (sqrt(vhat) + eps);
  }
}

// Largest |a - b| / max(1, |b|) over n elements.
static double max_rel(const float *a, const double *b, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs(a[i] - b[i]) / fmax(1.0, fabs(b[i]));
    if (d > worst) worst = d;
  }
  return worst;
}

static void test_adamw_vs_reference(void) {
  TEST_SECTION("adamw matches a double reference over 6 steps (wd, grad_scale, bias correction)");
  // 100003 elements: above the OpenMP threshold and not a multiple of anything convenient.
  enum { N = 100003, STEPS = 6 };
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.37f;
  float *p = xmalloc(N * sizeof(float)), *g = xmalloc(N * sizeof(float));
  float *m = xcalloc(N, sizeof(float)), *v = xcalloc(N, sizeof(float));
  double *pd = xmalloc(N * sizeof(double)), *gd = xmalloc(N * sizeof(double));
  double *md = xcalloc(N, sizeof(double)), *vd = xcalloc(N, sizeof(double));
  Rng r;
  rng_seed(&r, 1);
  for (size_t i = 0; i < N; i++) pd[i] = p[i] = rng_normal(&r) * 0.02f;
  double first_step_move = 0, first_step_want = 0;
  for (int t = 1; t <= STEPS; t++) {
    for (size_t i = 0; i < N; i++) gd[i] = g[i] = rng_normal(&r) * (i % 7 == 0 ? 10.0f : 0.1f);
    double before = p[5], g5 = (double)g[5] * scale;
    adamw_update(p, g, m, v, N, lr, b1, b2, eps, wd, scale, t);
    adamw_ref(pd, gd, md, vd, N, lr, b1, b2, eps, wd, scale, t);
    // At t = 1 bias correction gives mhat = g', vhat = g'^2: the step is lr * g' / (|g'| + eps).
    if (t == 1) first_step_move = p[5] - before, first_step_want = -before * lr * wd - lr * g5 / (fabs(g5) + eps);
  }
  // Float vs double: a few float roundings per step (measured ~2e-8 on p, ~3e-7 on m and v).
  // A missing bias correction or a misplaced decay would be off by ~lr = 1e-3.
  CHECK(max_rel(p, pd, N) < 1e-7, "params rel err %.3g", max_rel(p, pd, N));
  CHECK(max_rel(m, md, N) < 1e-6, "m rel err %.3g", max_rel(m, md, N));
  CHECK(max_rel(v, vd, N) < 1e-6, "v rel err %.3g", max_rel(v, vd, N));
  CHECK_NEAR(first_step_move, first_step_want, lr * 1e-4);
  CHECK(fabs(first_step_move) > 0.99 * lr, "first step moved %.3g, expected about lr", first_step_move);
  free(p), free(g), free(m), free(v), free(pd), free(gd), free(md), free(vd);
}

static void test_adamw_pure_decay(void) {
  TEST_SECTION("adamw with zero gradients shrinks weights by exactly (1 - lr*wd)");
  enum { N = 1000 };
  const float lr = 3e-4f, wd = 0.1f;
  float p[N], p0[N], g[N] = {0}, m[N] = {0}, v[N] = {0};
  Rng r;
  rng_seed(&r, 2);
  for (int i = 0; i < N; i++) p0[i] = p[i] = rng_normal(&r);
  adamw_update(p, g, m, v, N, lr, 0.9f, 0.95f, 1e-8f, wd, 1.0f, 1);
  int exact = 0, state_zero = 0;
  for (int i = 0; i < N; i++) {
    exact += p[i] == p0[i] * (1.0f - lr * wd);
    state_zero += m[i] == 0 && v[i] == 0;
  }
  CHECK(exact == N, "%d of %d weights decayed exactly", exact, N);
  CHECK(state_zero == N, "%d of %d moments stayed 0", state_zero, N);
  // wd = 0 and zero gradients: nothing moves.
  memcpy(p0, p, sizeof p);
  adamw_update(p, g, m, v, N, lr, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 2);
  CHECK(!memcmp(p, p0, sizeof p), "weights moved without gradient or decay");
  g[0] = 1.0f;
  adamw_update(p, g, m, v, 0, lr, 0.9f, 0.95f, 1e-8f, wd, 1.0f, 3);  // n = 0 touches nothing
  CHECK(!memcmp(p, p0, sizeof p) && m[0] == 0 && v[0] == 0, "n = 0 changed the buffers");
}

static void test_adamw_grad_scale(void) {
  TEST_SECTION("grad_scale is the same as scaling the gradient");
  enum { N = 513 };
  float p1[N], p2[N], g[N], g2[N], m1[N] = {0}, v1[N] = {0}, m2[N] = {0}, v2[N] = {0};
  Rng r;
  rng_seed(&r, 3);
  for (int i = 0; i < N; i++) p1[i] = p2[i] = rng_normal(&r), g[i] = rng_normal(&r), g2[i] = g[i] * 0.25f;
  for (int t = 1; t <= 3; t++) {
    adamw_update(p1, g, m1, v1, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.25f, t);
    adamw_update(p2, g2, m2, v2, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, t);
  }
  CHECK(!memcmp(p1, p2, sizeof p1) && !memcmp(m1, m2, sizeof m1) && !memcmp(v1, v2, sizeof v1),
        "g*0.25 (power of two: exact) and grad_scale 0.25 differ");
}

static void test_norm_and_clip(void) {
  TEST_SECTION("global norm vs naive double sum; same bits at 1 and 2 threads; clip_scale");
  size_t n = 1000003;  // several 64K chunks plus a ragged tail
  float *g = xmalloc(n * sizeof(float));
  Rng r;
  rng_seed(&r, 4);
  double naive = 0;
  for (size_t i = 0; i < n; i++) g[i] = rng_normal(&r) * 1e-3f, naive += (double)g[i] * g[i];
  omp_set_num_threads(1);
  float n1 = grad_global_norm(g, n);
  double s1 = grad_sumsq(g, n);
  omp_set_num_threads(2);
  float n2 = grad_global_norm(g, n);
  double s2 = grad_sumsq(g, n);
  CHECK_NEAR(n1, sqrt(naive), sqrt(naive) * 1e-6);
  CHECK(n1 == n2 && s1 == s2, "1 thread %.9g, 2 threads %.9g", n1, n2);
  CHECK(memcmp(&s1, &s2, sizeof s1) == 0, "sum of squares bits differ between thread counts");
  CHECK(grad_global_norm(g, 0) == 0.0f, "empty norm is %g", grad_global_norm(g, 0));
  float three_four[2] = {3, 4};
  CHECK(grad_global_norm(three_four, 2) == 5.0f, "norm of (3,4) = %g", grad_global_norm(three_four, 2));
  free(g);

  CHECK(clip_scale(5.0f, 0.0f) == 1.0f, "clip 0 disables");
  CHECK(clip_scale(5.0f, -1.0f) == 1.0f, "negative clip disables");
  CHECK(clip_scale(0.5f, 1.0f) == 1.0f, "norm below clip");
  CHECK(clip_scale(1.0f, 1.0f) == 1.0f, "norm equal to clip");
  CHECK(clip_scale(2.0f, 1.0f) == 1.0f / (2.0f + 1e-6f), "norm 2, clip 1: %.9g", clip_scale(2.0f, 1.0f));
  CHECK_NEAR(clip_scale(2.0f, 1.0f) * 2.0f, 1.0, 1e-6);
}

static TrainConfig sched(const char *type) {
  TrainConfig c;
  memset(&c, 0, sizeof c);
  strcpy(c.schedule, type);
  c.lr = 3e-4f;
  c.warmup_steps = 10;
  c.total_steps = 110;
  c.min_lr_ratio = 0.1f;
  c.decay_start = 50;
  c.decay_steps = 20;
  return c;
}

// Every step's lr is non-decreasing during warmup and non-increasing after it.
static int shape_ok(const TrainConfig *c, int64_t upto) {
  for (int64_t s = 1; s < upto; s++) {
    float a = lr_at(c, s - 1), b = lr_at(c, s);
    if (s < c->warmup_steps ? b < a : b > a) return 0;
  }
  return 1;
}

static void test_schedules(void) {
  TEST_SECTION("schedules: constant, cosine, wsd at their key steps; monotone");
  const double lr = 3e-4f, lo = lr * 0.1f;
  TrainConfig c = sched("constant");
  CHECK(lr_at(&c, 0) == (float)(lr * 1 / 10), "warmup step 0: %g", lr_at(&c, 0));
  CHECK(lr_at(&c, 4) == (float)(lr * 5 / 10), "warmup step 4: %g", lr_at(&c, 4));
  CHECK(lr_at(&c, 9) == (float)lr, "warmup end: %g", lr_at(&c, 9));
  CHECK(lr_at(&c, 60) == (float)lr && lr_at(&c, 100000) == (float)lr, "constant after warmup");
  CHECK(shape_ok(&c, 200), "constant schedule not monotone");
  c.warmup_steps = 0;
  CHECK(lr_at(&c, 0) == (float)lr, "no warmup: step 0 runs at lr (%g)", lr_at(&c, 0));

  c = sched("cosine");
  CHECK(lr_at(&c, 0) == (float)(lr / 10), "cosine step 0: %g", lr_at(&c, 0));
  CHECK(lr_at(&c, 9) == (float)lr, "cosine warmup end: %g", lr_at(&c, 9));
  CHECK(lr_at(&c, 10) == (float)lr, "cosine decay start: %g", lr_at(&c, 10));
  CHECK_NEAR(lr_at(&c, 60), lo + (lr - lo) * 0.5, 1e-10);                                  // p = 1/2
  CHECK_NEAR(lr_at(&c, 35), lo + (lr - lo) * 0.5 * (1 + cos(M_PI * 0.25)), 1e-10);         // p = 1/4
  CHECK_NEAR(lr_at(&c, 109), lo + (lr - lo) * 0.5 * (1 + cos(M_PI * 99.0 / 100)), 1e-10);  // last step
  CHECK_NEAR(lr_at(&c, 110), lo, 1e-12);
  CHECK_NEAR(lr_at(&c, 500), lo, 1e-12);
  CHECK(shape_ok(&c, 200), "cosine schedule not monotone");

  c = sched("wsd");
  CHECK(lr_at(&c, 0) == (float)(lr / 10), "wsd step 0: %g", lr_at(&c, 0));
  CHECK(lr_at(&c, 9) == (float)lr && lr_at(&c, 30) == (float)lr && lr_at(&c, 50) == (float)lr, "wsd stable phase");
  CHECK_NEAR(lr_at(&c, 55), lr - (lr - lo) * 0.25, 1e-10);
  CHECK_NEAR(lr_at(&c, 60), lr - (lr - lo) * 0.5, 1e-10);
  CHECK_NEAR(lr_at(&c, 69), lr - (lr - lo) * 0.95, 1e-10);
  CHECK_NEAR(lr_at(&c, 70), lo, 1e-12);
  CHECK_NEAR(lr_at(&c, 1000), lo, 1e-12);
  CHECK(shape_ok(&c, 200), "wsd schedule not monotone");
  c.decay_steps = 0;
  CHECK_NEAR(lr_at(&c, 50), lo, 1e-12);  // an empty decay phase drops straight to the floor
  CHECK(lr_at(&c, 49) == (float)lr, "before an empty decay phase");
}

int main(void) {
  test_adamw_vs_reference();
  test_adamw_pure_decay();
  test_adamw_grad_scale();
  test_norm_and_clip();
  test_schedules();
  TEST_END();
}
