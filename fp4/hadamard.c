// fp4/hadamard.c: CPU application of the fixed-sign H16/H32 rotations (see hadamard.h).
#include "fp4/hadamard.h"

#include "common/common.h"

static void check_shape(const char *who, int rows, int cols, int n, int along) {
  if (n != 16 && n != 32) die("%s: block size n = %d must be 16 or 32", who, n);
  if (rows < 0 || cols < 0) die("%s: negative shape rows = %d, cols = %d", who, rows, cols);
  if (along % n) die("%s: the transformed dimension (%d) must be a multiple of n = %d", who, along, n);
}

static void transform(float *v, int n) {
  if (n == 32) fp4_h32(v);
  else fp4_h16(v);
}

void fp4_hadamard_rows(float *x, int rows, int cols, int n) {
  check_shape("fp4_hadamard_rows", rows, cols, n, cols);
  for (size_t i = 0; i < (size_t)rows * cols; i += n) transform(x + i, n);
}

void fp4_hadamard_cols(float *x, int rows, int cols, int n) {
  check_shape("fp4_hadamard_cols", rows, cols, n, rows);
  float v[32];
  for (int r0 = 0; r0 < rows; r0 += n)
    for (int c = 0; c < cols; c++) {
      for (int i = 0; i < n; i++) v[i] = x[(size_t)(r0 + i) * cols + c];
      transform(v, n);
      for (int i = 0; i < n; i++) x[(size_t)(r0 + i) * cols + c] = v[i];
    }
}
