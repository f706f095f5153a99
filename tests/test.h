// tests/test.h: a tiny assertion harness. Each test program is one main() that runs checks and ends
// with TEST_END(), which prints "N passed, N failed" and returns non-zero on any failure.
#pragma once
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int test_passed_, test_failed_;

// CHECK(cond, fmt, ...): one assertion. On failure prints where and why.
#define CHECK(cond, ...)                                     \
  do {                                                       \
    if (cond) test_passed_++;                                \
    else {                                                   \
      test_failed_++;                                        \
      printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      printf(__VA_ARGS__);                                   \
      printf("\n");                                          \
    }                                                        \
  } while (0)

// CHECK_NEAR(a, b, tol): |a-b| <= tol (absolute).
#define CHECK_NEAR(a, b, tol)                                                                       \
  do {                                                                                              \
    double a_ = (a), b_ = (b);                                                                      \
    CHECK(fabs(a_ - b_) <= (tol), "%s = %.9g, %s = %.9g, tol %.3g", #a, a_, #b, b_, (double)(tol)); \
  } while (0)

#define TEST_SECTION(name) printf("-- %s\n", name)

#define TEST_END()                                                \
  do {                                                            \
    printf("%d passed, %d failed\n", test_passed_, test_failed_); \
    return test_failed_ ? 1 : 0;                                  \
  } while (0)

// dir/name, in one of 8 rotating buffers: fine inside one expression; copy paths kept longer.
static inline const char *test_path(const char *dir, const char *name) {
  static char buf[8][512];
  static int k;
  char *p = buf[k++ % 8];
  snprintf(p, 512, "%s/%s", dir, name);
  return p;
}

static inline int test_exists(const char *path) { return access(path, F_OK) == 0; }
