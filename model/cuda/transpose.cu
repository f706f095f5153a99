// model/cuda/transpose.cu: the BF16 matrix transpose behind the backend's W^T copies (see ops_cuda.h),
// which let the dgrad GEMM run in cuBLASLt's fastest layout.
//
// No shared memory: each thread moves one 8 x 8 block, eight 16-byte row loads in, an in-register
// transpose, eight 16-byte row stores out. A warp's lanes are 4 block-rows x 8 block-columns, so
// every load instruction reads 4 source rows x 128 contiguous bytes and every store writes 8
// destination rows x 64 contiguous bytes: whole 32-byte sectors both ways. A CTA's 8 warps are 2 x 4
// of those 32 x 64 tiles (a 64 x 256 CTA tile), so the other half of each 128-byte destination line
// is written by a sibling warp at about the same time.
#include "common/common.h"
#include "model/cuda/ops_cuda.h"

enum { TILE_ROWS = 64, TILE_COLS = 256, TRANSPOSE_THREADS = 256 };

// The 4 32-bit words of a 16-byte row of 8 BF16 (element 2w in the low half of word w).
__device__ __forceinline__ void load_words(uint32_t w[4], const bf16 *p) {
  uint4 u = *reinterpret_cast<const uint4 *>(p);
  w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
}

// dst [cols, rows] = src [rows, cols]^T. rows and cols are multiples of 8, both pointers 16-byte aligned.
__global__ void __launch_bounds__(TRANSPOSE_THREADS)
    transpose_bf16_kernel(bf16 *__restrict__ dst, const bf16 *__restrict__ src, int rows, int cols) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r0 = blockIdx.y * TILE_ROWS + (warp >> 2) * 32 + (lane >> 3) * 8;
  const int c0 = blockIdx.x * TILE_COLS + (warp & 3) * 64 + (lane & 7) * 8;
  if (r0 >= rows || c0 >= cols) return;  // dimensions are multiples of 8: a block is all in or all out
  uint32_t w[8][4];                      // w[i][k]: source row r0 + i, columns c0 + 2k, c0 + 2k + 1
#pragma unroll
  for (int i = 0; i < 8; i++) load_words(w[i], src + (size_t)(r0 + i) * cols + c0);
    // Destination row c0 + j is source column j: word m packs rows 2m (low half) and 2m + 1, taken
    // from the low (j even) or high (j odd) halves of their word j / 2.
#pragma unroll
  for (int j = 0; j < 8; j++) {
    const unsigned sel = (j & 1) ? 0x7632u : 0x5410u;
    uint4 u;
    u.x = __byte_perm(w[0][j / 2], w[1][j / 2], sel);
    u.y = __byte_perm(w[2][j / 2], w[3][j / 2], sel);
    u.z = __byte_perm(w[4][j / 2], w[5][j / 2], sel);
    u.w = __byte_perm(w[6][j / 2], w[7][j / 2], sel);
    *reinterpret_cast<uint4 *>(dst + (size_t)(c0 + j) * rows + r0) = u;
  }
}

void transpose_bf16_cuda(bf16 *dst, const bf16 *src, int rows, int cols) {
  if (rows <= 0 || cols <= 0 || rows % 8 || cols % 8)
    die("transpose_bf16_cuda: %d x %d: both dimensions must be positive multiples of 8 (16-byte rows)", rows, cols);
  if (!aligned16(dst) || !aligned16(src))
    die("transpose_bf16_cuda: dst %p and src %p must be 16-byte aligned", (void *)dst, (const void *)src);
  if (dst == src) die("transpose_bf16_cuda: dst and src are the same buffer %p (it is not in place)", (void *)dst);
  dim3 grid((cols + TILE_COLS - 1) / TILE_COLS, (rows + TILE_ROWS - 1) / TILE_ROWS);
  if (grid.y > 65535) die("transpose_bf16_cuda: %d rows is more than the grid allows (%d)", rows, 65535 * TILE_ROWS);
  transpose_bf16_kernel<<<grid, TRANSPOSE_THREADS, 0, cuda_stream()>>>(dst, src, rows, cols);
  CUDA_CHECK_LAUNCH();
}
