// fp4/fp8_embed.cu: packed MXFP4 -> FP8 embedding on the GPU (see fp8_embed.h), for operands kept packed
// and embedded later. (The fused producers in mxfp4.cu write the embedding directly.)
// Each block's bytes come from its 8-entry table (mx_embed_lut) by byte permutes, 4 codes at a time.
// VEC128: one thread per 32-block, four consecutive lanes per 128-group (group exponent by shuffles).
// BLK128x128: one 256-thread CTA per tile; the tile exponent is a shared-memory atomicMax, which is
// order-independent and so deterministic.
#include "common/common.h"
#include "fp4/fp8_embed.h"
#include "common/cuda_common.h"

static __device__ __forceinline__ void embed_block(uint8_t *dst, const uint8_t *src16, uint8_t b, int Et) {
  uint4 u = *(const uint4 *)src16;
  uint32_t in[4] = {u.x, u.y, u.z, u.w}, out[8];
  const MxEmbedLut L = mx_embed_lut(b, Et);
#pragma unroll
  for (int i = 0; i < 8; i++) out[i] = mx_embed_lookup4(L, in[i >> 1] >> (16 * (i & 1)));  // elements 4i..4i+3
  *(uint4 *)dst = make_uint4(out[0], out[1], out[2], out[3]);
  *(uint4 *)(dst + 16) = make_uint4(out[4], out[5], out[6], out[7]);
}

__global__ void embed_vec128_kernel(const uint8_t *codes, const uint8_t *scales, int rows, int K, float scale_mul,
                                    uint8_t *fp8, float *scale) {
  const int nbk = K / 32, per_row = (nbk + 3) / 4 * 4;
  size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, row = t / per_row;
  int b = (int)(t % per_row);
  bool valid = row < (size_t)rows && b < nbk;
  uint8_t sb = valid ? scales[row * nbk + b] : 0xFF;
  int Et = valid ? mx_embed_exp_of(sb) : -127;
  Et = max(Et, __shfl_xor_sync(0xffffffffu, Et, 1));
  Et = max(Et, __shfl_xor_sync(0xffffffffu, Et, 2));
  if (!valid) return;
  embed_block(fp8 + row * K + (size_t)b * 32, codes + row * (K / 2) + (size_t)b * 16, sb, Et);
  if ((b & 3) == 0) scale[(size_t)(b / 4) * rows + row] = mx_embed_scale(Et, scale_mul);
}

__global__ void embed_blk128_kernel(const uint8_t *codes, const uint8_t *scales, int rows, int K, float scale_mul,
                                    uint8_t *fp8, float *scale) {
  __shared__ int s_e;  // Et + 127 >= 0
  const int tr = blockIdx.y, tc = blockIdx.x, nbk = K / 32;
  if (threadIdx.x == 0) s_e = 0;
  __syncthreads();
  uint8_t sb[2];
  bool valid[2];
#pragma unroll
  for (int it = 0; it < 2; it++) {
    int id = threadIdx.x + it * 256, b = tc * 4 + (id & 3);
    size_t row = (size_t)tr * 128 + (id >> 2);
    valid[it] = row < (size_t)rows && b < nbk;
    sb[it] = valid[it] ? scales[row * nbk + b] : 0xFF;
    if (valid[it]) atomicMax(&s_e, mx_embed_exp_of(sb[it]) + 127);
  }
  __syncthreads();
  const int Et = s_e - 127;
#pragma unroll
  for (int it = 0; it < 2; it++) {
    if (!valid[it]) continue;
    int id = threadIdx.x + it * 256, b = tc * 4 + (id & 3);
    size_t row = (size_t)tr * 128 + (id >> 2);
    embed_block(fp8 + row * K + (size_t)b * 32, codes + row * (K / 2) + (size_t)b * 16, sb[it], Et);
  }
  if (threadIdx.x == 0) {
    const int L = (K + 127) / 128, L4 = mx_blk128_l4(K);
    scale[(size_t)tr * L4 + tc] = mx_embed_scale(Et, scale_mul);
    if (tc == L - 1)
      for (int l = L; l < L4; l++) scale[(size_t)tr * L4 + l] = 0.0f;
  }
}

static void check(const char *who, const uint8_t *codes, int rows, int K, const uint8_t *fp8, const float *scale) {
  if (rows <= 0 || K <= 0 || K % 32) die("%s: rows = %d, K = %d: K must be a positive multiple of 32", who, rows, K);
  if ((uintptr_t)codes % 16 || (uintptr_t)fp8 % 16 || (uintptr_t)scale % 4)
    die("%s: codes %p and fp8 %p must be 16-byte aligned, scale %p 4-byte aligned", who, codes, fp8, scale);
}

void mx_embed_vec128_cuda(const uint8_t *codes, const uint8_t *scales, int rows, int K, float scale_mul, uint8_t *fp8,
                          float *scale) {
  check("mx_embed_vec128_cuda", codes, rows, K, fp8, scale);
  size_t threads = (size_t)rows * ((K / 32 + 3) / 4 * 4);
  embed_vec128_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, cuda_stream()>>>(codes, scales, rows, K, scale_mul,
                                                                                    fp8, scale);
  CUDA_CHECK_LAUNCH();
}

void mx_embed_blk128_cuda(const uint8_t *codes, const uint8_t *scales, int rows, int K, float scale_mul, uint8_t *fp8,
                          float *scale) {
  check("mx_embed_blk128_cuda", codes, rows, K, fp8, scale);
  dim3 grid((K + 127) / 128, (rows + 127) / 128);
  embed_blk128_kernel<<<grid, 256, 0, cuda_stream()>>>(codes, scales, rows, K, scale_mul, fp8, scale);
  CUDA_CHECK_LAUNCH();
}
