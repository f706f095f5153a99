// fp4/nvfp4_cta.cu: the CTA-local NVFP4 producers on the GPU (see nvfp4_cta.h), and the epilogue that
// applies the outer factors after a GEMM on unscaled operands. Every scalar step is an FP4_HD rule of
// nvfp4_cta.h / nvfp4.h / e2m1.h / philox.h / hadamard.h, the ones the CPU reference calls, and every
// reduction is a max over |x| bits, so the bytes and factors are the CPU's (tests/gpu/gpu_test_fp4_cta.cu).
// Built with -fmad=false (Makefile), so nothing is contracted.
//
// The passes, as the reference's: (1) chunk amaxes (an integer atomicMax per 16-block into its
// 128 x 128 chunk), (2) each stripe's outer factor from its chunks, (3) one thread per 16-block: its
// chunk's scale, the block quantized, its scale folded with the chunk's correction. Column copies run
// the same passes in the transposed space (a thread gathers its 16 tokens down a column and rotates
// them). Straightforward first versions: correctness against the reference first, speed measured next.
#include "fp4/nvfp4_cta.h"

#include "common/common.h"
#include "common/cuda_common.h"
#include "fp4/hadamard.h"

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ float ld(const bf16 *p) { return __bfloat162float(*p); }

// The 16 values of carrier block (r, k0): rows copy (cols = 0) reads x[r, k0..k0+15]; a column copy
// (cols = 1) is the carrier x^T, so it reads x[k0..k0+15, r] (x [K_carrier, rows_carrier] as stored is
// [tokens, features]) and rotates them.
template <typename T>
__device__ __forceinline__ void gather(const T *x, int xcols, int r, int k0, int cols, int rot, float *v) {
  if (!cols) {
#pragma unroll
    for (int i = 0; i < 16; i++) v[i] = ld(x + (size_t)r * xcols + k0 + i);
  } else {
#pragma unroll
    for (int i = 0; i < 16; i++) v[i] = ld(x + (size_t)(k0 + i) * xcols + r);
    fp4_rotate16(v, rot);
  }
}

// Passes (1) and (3), one thread per carrier 16-block: quantize = 0 adds the block's finite amax into its
// 128 x 128 chunk (the reference skips non-finite values there); 1 quantizes it with its chunk's scale
// and folds its scale with the chunk's correction.
template <typename T>
__global__ void block_kernel(int quantize, const T *x, int xcols, int crows, int ccols, int cols, int rot, int sr,
                             PhiloxStream s, uint32_t *am, const float *outer, uint8_t *codes, uint8_t *scales) {
  const size_t per_row = (size_t)ccols / 16, total = (size_t)crows * per_row, stride = (size_t)gridDim.x * blockDim.x;
  const int ck = (ccols + CTA_CHUNK - 1) / CTA_CHUNK;
  for (size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x; b < total; b += stride) {
    const int r = (int)(b / per_row), k0 = (int)(b % per_row) * 16;
    uint32_t *chunk = am + (size_t)(r / CTA_CHUNK) * ck + k0 / CTA_CHUNK;
    float v[16];
    gather(x, xcols, r, k0, cols, rot, v);
    if (!quantize) {
      uint32_t m = 0;
#pragma unroll
      for (int i = 0; i < 16; i++) {
        uint32_t a = nv_abs_bits(v[i]);
        if (a < NV_NONFINITE_BITS && a > m) m = a;
      }
      if (m) atomicMax(chunk, m);
      continue;
    }
    const float a_c = fp4_u2f(*chunk);
    uint32_t w[4] = {0, 0, 0, 0};
    if (sr) philox_group16(s, b, w);  // block b starts at carrier element 16 b
    uint8_t c[16];
    uint8_t bs = nv_quantize_block16(v, cta_encode_scale(a_c), sr, w, c);
    scales[b] = cta_fold(bs, cta_ratio(cta_chunk_factor(a_c), outer[r / CTA_STRIPE]));
    uint8_t *o = codes + b * 8;
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = (uint8_t)((c[2 * i] & 15) | (c[2 * i + 1] << 4));
  }
}

// (2) outer[t] = the largest chunk factor of stripe t (two chunk rows, every chunk column).
__global__ void outer_kernel(const uint32_t *am, int cr, int ck, int nstripes, float *outer) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= nstripes) return;
  float m = 0.0f;
  for (int c = 2 * t; c < 2 * t + 2 && c < cr; c++)
    for (int j = 0; j < ck; j++) {
      float f = cta_chunk_factor(fp4_u2f(am[(size_t)c * ck + j]));
      m = f > m ? f : m;
    }
  outer[t] = m;
}

// The three passes for a carrier [crows, ccols] read from x (cols: x is the carrier's transpose).
template <typename T>
static void quantize(const char *who, const T *x, int crows, int ccols, int cols, int rot, int sr, PhiloxStream s,
                     uint8_t *codes, uint8_t *scales, float *outer, uint32_t *chunk_am) {
  if (crows <= 0 || ccols <= 0 || ccols % 16)
    die("%s: carrier %d x %d: its row length must be a positive multiple of 16", who, crows, ccols);
  if (sr) philox_check_range(who, (uint64_t)crows * ccols);
  const int cr = (crows + CTA_CHUNK - 1) / CTA_CHUNK, ck = (ccols + CTA_CHUNK - 1) / CTA_CHUNK;
  const size_t blocks = (size_t)crows * ccols / 16;
  const int xcols = cols ? crows : ccols, threads = 256;
  CUDA_CHECK(cudaMemsetAsync(chunk_am, 0, (size_t)cr * ck * sizeof(uint32_t), cuda_stream()));
  block_kernel<T><<<cuda_grid(blocks, threads), threads, 0, cuda_stream()>>>(0, x, xcols, crows, ccols, cols, rot, 0, s,
                                                                             chunk_am, NULL, NULL, NULL);
  CUDA_CHECK_LAUNCH();
  outer_kernel<<<(cta_stripes(crows) + 127) / 128, 128, 0, cuda_stream()>>>(chunk_am, cr, ck, cta_stripes(crows),
                                                                            outer);
  CUDA_CHECK_LAUNCH();
  block_kernel<T><<<cuda_grid(blocks, threads), threads, 0, cuda_stream()>>>(1, x, xcols, crows, ccols, cols, rot, sr,
                                                                             s, chunk_am, outer, codes, scales);
  CUDA_CHECK_LAUNCH();
}

// The fold of pass (3) alone, one thread per block scale: for a row copy whose codes, unfolded scales and
// chunk amaxes another producer wrote (fp4/cta_mx_dual.cu); the expression is block_kernel's.
__global__ void fold_kernel(const uint32_t *am, int crows, int ccols, const float *outer, uint8_t *scales) {
  const size_t per_row = (size_t)ccols / 16, total = (size_t)crows * per_row, stride = (size_t)gridDim.x * blockDim.x;
  const int ck = (ccols + CTA_CHUNK - 1) / CTA_CHUNK;
  for (size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x; b < total; b += stride) {
    const int r = (int)(b / per_row), k0 = (int)(b % per_row) * 16;
    const float a_c = fp4_u2f(am[(size_t)(r / CTA_CHUNK) * ck + k0 / CTA_CHUNK]);
    scales[b] = cta_fold(scales[b], cta_ratio(cta_chunk_factor(a_c), outer[r / CTA_STRIPE]));
  }
}

void nvfp4_cta_rows_finish_cuda(const uint32_t *scratch, int rows, int K, uint8_t *scales, float *outer) {
  if (rows <= 0 || K <= 0 || K % 16) die("nvfp4_cta_rows_finish_cuda: %d x %d: K a positive multiple of 16", rows, K);
  const int cr = (rows + CTA_CHUNK - 1) / CTA_CHUNK, ck = (K + CTA_CHUNK - 1) / CTA_CHUNK;
  outer_kernel<<<(cta_stripes(rows) + 127) / 128, 128, 0, cuda_stream()>>>(scratch, cr, ck, cta_stripes(rows), outer);
  CUDA_CHECK_LAUNCH();
  const size_t n = (size_t)rows * K / 16;
  fold_kernel<<<cuda_grid(n, 256), 256, 0, cuda_stream()>>>(scratch, rows, K, outer, scales);
  CUDA_CHECK_LAUNCH();
}

size_t nvfp4_cta_scratch_words(int rows, int K) {
  return (size_t)((rows + CTA_CHUNK - 1) / CTA_CHUNK) * ((K + CTA_CHUNK - 1) / CTA_CHUNK);
}

void nvfp4_cta_quantize_rows_cuda(const bf16 *x, int rows, int K, NvRound rnd, PhiloxStream s, uint8_t *codes,
                                  uint8_t *scales, float *outer, uint32_t *scratch) {
  quantize("nvfp4_cta_quantize_rows_cuda", x, rows, K, 0, FP4_ROT_NONE, rnd == NV_SR, s, codes, scales, outer, scratch);
}

void nvfp4_cta_quantize_cols_cuda(const bf16 *x, int rows, int K, int rot, NvRound rnd, PhiloxStream s, uint8_t *codes,
                                  uint8_t *scales, float *outer, uint32_t *scratch) {
  if (rows % 16)
    die("nvfp4_cta_quantize_cols_cuda: rows = %d must be a multiple of 16 (blocks run down columns)", rows);
  if (rot != FP4_ROT_NONE && rot != FP4_ROT_H16 && rot != FP4_ROT_H16_PLAIN)
    die("nvfp4_cta_quantize_cols_cuda: rotation %d is none, H16 or plain H16", rot);
  quantize("nvfp4_cta_quantize_cols_cuda", x, K, rows, 1, rot, rnd == NV_SR, s, codes, scales, outer, scratch);
}

// ---- weights: 2D16 tiles, one common factor --------------------------------------------------------

// g = the largest chunk factor of the whole weight; every outer entry of W and W^T gets it.
__global__ void common_factor_kernel(const uint32_t *am, size_t nchunks, float *outer, int n_outer, float *outer_t,
                                     int n_outer_t) {
  __shared__ float best[256];
  float m = 0.0f;
  for (size_t i = threadIdx.x; i < nchunks; i += blockDim.x) {
    float f = cta_chunk_factor(fp4_u2f(am[i]));
    m = f > m ? f : m;
  }
  best[threadIdx.x] = m;
  __syncthreads();
  for (int h = blockDim.x / 2; h > 0; h >>= 1) {
    if ((int)threadIdx.x < h && best[threadIdx.x + h] > best[threadIdx.x]) best[threadIdx.x] = best[threadIdx.x + h];
    __syncthreads();
  }
  const float g = best[0];
  for (int i = threadIdx.x; i < n_outer; i += blockDim.x) outer[i] = g;
  if (outer_t)
    for (int i = threadIdx.x; i < n_outer_t; i += blockDim.x) outer_t[i] = g;
}

template <typename T>
__device__ void weight_tile(const T *w, int N, int K, int n0, int k0, const uint32_t *am, const float *outer,
                            uint8_t *codes, uint8_t *scales, uint8_t *codes_t, uint8_t *scales_t) {
  const int ck = (K + CTA_CHUNK - 1) / CTA_CHUNK;
  const float a_c = fp4_u2f(am[(size_t)(n0 / CTA_CHUNK) * ck + k0 / CTA_CHUNK]), s_c = cta_encode_scale(a_c);
  uint32_t m = 0;
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      uint32_t a = nv_abs_bits(ld(w + (size_t)(n0 + i) * K + k0 + j));
      m = a > m ? a : m;
    }
  const uint8_t mult = cta_weight_mult(m, s_c);
  const float coeff = cta_weight_coeff(mult, s_c);
  const uint8_t bs = cta_fold_weight(cta_weight_scale(mult), cta_ratio(cta_chunk_factor(a_c), outer[0]));
  uint8_t c[256];  // the tile's codes, each element encoded once for both orientations
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) c[i * 16 + j] = nv_encode(ld(w + (size_t)(n0 + i) * K + k0 + j), coeff, 0, 0);
  for (int i = 0; i < 16; i++) {
    if (codes) {
      for (int j = 0; j < 8; j++)
        codes[(size_t)(n0 + i) * (K / 2) + k0 / 2 + j] =
            (uint8_t)((c[i * 16 + 2 * j] & 15) | (c[i * 16 + 2 * j + 1] << 4));
      scales[(size_t)(n0 + i) * (K / 16) + k0 / 16] = bs;
    }
    if (codes_t) {  // row i of the tile's transpose: column i of the tile
      for (int j = 0; j < 8; j++)
        codes_t[(size_t)(k0 + i) * (N / 2) + n0 / 2 + j] =
            (uint8_t)((c[2 * j * 16 + i] & 15) | (c[(2 * j + 1) * 16 + i] << 4));
      scales_t[(size_t)(k0 + i) * (N / 16) + n0 / 16] = bs;
    }
  }
}

// One thread per 16x16 tile: the encode-centric tile rule, W's rows and W^T's rows of the tile.
template <typename T>
__global__ void weight_kernel(const T *w, int N, int K, const uint32_t *am, const float *outer, uint8_t *codes,
                              uint8_t *scales, uint8_t *codes_t, uint8_t *scales_t) {
  const size_t tk = (size_t)K / 16, total = (size_t)(N / 16) * tk, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += stride)
    weight_tile(w, N, K, (int)(t / tk) * 16, (int)(t % tk) * 16, am, outer, codes, scales, codes_t, scales_t);
}

template <typename T>
static void weight(const T *w, int N, int K, uint8_t *codes, uint8_t *scales, float *outer, uint8_t *codes_t,
                   uint8_t *scales_t, float *outer_t, uint32_t *scratch) {
  if (N <= 0 || K <= 0 || N % 16 || K % 16)
    die("nvfp4_cta_quantize_weight_cuda: N = %d, K = %d: multiples of 16", N, K);
  if (!outer) die("nvfp4_cta_quantize_weight_cuda: outer (W's factors) is required: the tiles' fold reads it");
  const int cr = (N + CTA_CHUNK - 1) / CTA_CHUNK, ck = (K + CTA_CHUNK - 1) / CTA_CHUNK, threads = 256;
  const size_t blocks16 = (size_t)N * K / 16;
  CUDA_CHECK(cudaMemsetAsync(scratch, 0, (size_t)cr * ck * sizeof(uint32_t), cuda_stream()));
  const PhiloxStream none = {};
  block_kernel<T><<<cuda_grid(blocks16, threads), threads, 0, cuda_stream()>>>(0, w, K, N, K, 0, FP4_ROT_NONE, 0, none,
                                                                               scratch, NULL, NULL, NULL);
  CUDA_CHECK_LAUNCH();
  common_factor_kernel<<<1, 256, 0, cuda_stream()>>>(scratch, (size_t)cr * ck, outer, cta_stripes(N), outer_t,
                                                     cta_stripes(K));
  CUDA_CHECK_LAUNCH();
  const size_t tiles = (size_t)(N / 16) * (K / 16);
  weight_kernel<T>
      <<<cuda_grid(tiles, 128), 128, 0, cuda_stream()>>>(w, N, K, scratch, outer, codes, scales, codes_t, scales_t);
  CUDA_CHECK_LAUNCH();
}

void nvfp4_cta_quantize_weight_cuda(const float *w, int N, int K, uint8_t *codes, uint8_t *scales, float *outer,
                                    uint8_t *codes_t, uint8_t *scales_t, float *outer_t, uint32_t *scratch) {
  weight(w, N, K, codes, scales, outer, codes_t, scales_t, outer_t, scratch);
}

void nvfp4_cta_quantize_weight_bf16_cuda(const bf16 *w, int N, int K, uint8_t *codes, uint8_t *scales, float *outer,
                                         uint8_t *codes_t, uint8_t *scales_t, float *outer_t, uint32_t *scratch) {
  weight(w, N, K, codes, scales, outer, codes_t, scales_t, outer_t, scratch);
}

// ---- the epilogue: C = acc * (alpha_{i/256} * beta_{j/256}) ----------------------------------------

__global__ void apply_outer_kernel(const float *acc, int M, int N, const float *alpha, const float *beta,
                                   bf16 *out_bf16, float *out_f32, int accumulate) {
  const size_t total = (size_t)M * N, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += stride) {
    const int i = (int)(e / N), j = (int)(e % N);
    const float v = FP4_MUL(acc[e], cta_outer_product(alpha[i / CTA_STRIPE], beta[j / CTA_STRIPE]));
    if (out_bf16) out_bf16[e] = __float2bfloat16_rn(accumulate ? FP4_ADD(__bfloat162float(out_bf16[e]), v) : v);
    else out_f32[e] = accumulate ? FP4_ADD(out_f32[e], v) : v;
  }
}

void nvfp4_cta_apply_outer_cuda(const float *acc, int M, int N, const float *alpha, const float *beta, bf16 *out_bf16,
                                float *out_f32, int accumulate) {
  if (M <= 0 || N <= 0 || (!out_bf16) == (!out_f32)) die("nvfp4_cta_apply_outer_cuda: M %d, N %d, one output", M, N);
  const size_t n = (size_t)M * N;
  apply_outer_kernel<<<cuda_grid(n, 256), 256, 0, cuda_stream()>>>(acc, M, N, alpha, beta, out_bf16, out_f32,
                                                                   accumulate);
  CUDA_CHECK_LAUNCH();
}
