// model/cuda/rope.cu: rotary position embedding on the GPU, in place (twin of rope.c's rotate). See
// ops_cuda.h. Element i of a head rotates with element i + hd/2 (HF's rotate_half) by the angle
// of its position (its row position, or pos[token] when positions restart at each document); the
// backward passes sign -1 (the transpose of a rotation is its inverse).
#include "common/common.h"
#include "model/cuda/ops_cuda.h"

// One thread per (token, head, VEC consecutive i < hd/2): reads x[i..], x[i+half..] and the
// position's cos/sin, writes both halves back.
template <int VEC>
__global__ void rope_kernel(bf16 *x, const float *cos_t, const float *sin_t, const int *pos, int T, int n_heads,
                            int half, unsigned items, float sign) {
  const unsigned per_head = half / VEC;
  for (unsigned it = blockIdx.x * blockDim.x + threadIdx.x; it < items; it += gridDim.x * blockDim.x) {
    unsigned head = it / per_head, i = (it - head * per_head) * VEC;  // head = token * n_heads + h
    unsigned token = head / n_heads, t = pos ? (unsigned)pos[token] : token % T;
    bf16 *v = x + (size_t)head * (2 * half) + i;
    float x1[VEC], x2[VEC], c[VEC], s[VEC];
    load_vec<VEC>(x1, v);
    load_vec<VEC>(x2, v + half);
    load_vec<VEC>(c, cos_t + (size_t)t * half + i);
    load_vec<VEC>(s, sin_t + (size_t)t * half + i);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      float sn = sign * s[k], a = x1[k], b = x2[k];
      x1[k] = a * c[k] - b * sn;  // x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1)
      x2[k] = b * c[k] + a * sn;
    }
    store_vec<VEC>(v, x1);
    store_vec<VEC>(v + half, x2);
  }
}

void rope_rotate_cuda(bf16 *x, const float *cos_t, const float *sin_t, const int *pos, int B, int T, int n_heads,
                      int hd, int sign) {
  if (B <= 0 || T <= 0 || n_heads <= 0 || hd <= 0 || hd % 2)
    die("rope (cuda): B=%d, T=%d, n_heads=%d must be positive and head_dim %d positive and even", B, T, n_heads, hd);
  const int half = hd / 2;
  const int vec = half % 8 == 0 && aligned16(x) && aligned16(cos_t) && aligned16(sin_t) ? 8 : 1;
  const size_t items = (size_t)B * T * n_heads * (half / vec);
  if (items > 0x7fffffffu)
    die("rope (cuda): %d x %d tokens x %d heads x %d is too large for 32-bit indexing", B, T, n_heads, hd);
  const int threads = 256, grid = cuda_grid(items, threads);
  if (vec == 8)
    rope_kernel<8>
        <<<grid, threads, 0, cuda_stream()>>>(x, cos_t, sin_t, pos, T, n_heads, half, (unsigned)items, (float)sign);
  else
    rope_kernel<1>
        <<<grid, threads, 0, cuda_stream()>>>(x, cos_t, sin_t, pos, T, n_heads, half, (unsigned)items, (float)sign);
  CUDA_CHECK_LAUNCH();
}
