// fp4/nvfp4.cu: the NVFP4 producers on the GPU (see nvfp4.h). Every scalar step is an FP4_HD rule
// of nvfp4.h / e2m1.h / philox.h / hadamard.h, the same ones the CPU reference calls, and every
// reduction is a max over |x| bits (order-independent), so the bytes match the CPU's exactly.
// Built with -fmad=false (Makefile), and the rules use FP4_MUL/FP4_DIV, so nothing is contracted.
//
// Kernels (16-byte loads, fp32 math in registers; the quantizers are bound by instruction issue, so the
// per-element work is the block rule itself, via quant_dev.cuh: RNE and SR rounding on the FMA pipe):
//   amax        grid of 256-thread blocks, 4 independent 16-byte loads per thread per step, a warp
//               __reduce_max_sync, one integer atomicMax per block.
//   rows        one thread per 16-block: two 16-byte loads, 8 code bytes and 1 scale byte out, and
//               one Philox call (SR) for the block's 16 elements.
//   cols        a 128-row x 64-column tile is staged through shared memory (16-byte coalesced
//               loads, swizzled); then each thread owns two columns x one 16-row block (4-byte shared
//               loads): R16, quantized and written transposed, the 8 blocks of a column by 8
//               consecutive lanes (64 contiguous code bytes). The amax pass is the same kernel
//               without the writes.
//   weight      one warp per 16x16 tile (lane = row, half-row); the tile amax is one warp reduction;
//               W codes go out directly, W^T codes after a transpose of the tile's codes in shared memory.
//   dequant     one thread per 8 elements: 4 code bytes + 1 scale byte in, 16 bytes of BF16 out.
#include "fp4/nvfp4.h"

#include "common/common.h"
#include "fp4/hadamard.h"
#include "fp4/quant_dev.cuh"
#include "common/cuda_common.h"

typedef __nv_bfloat16 bf16;

#define FULL_MASK 0xffffffffu

// ---- loads: 16 bytes -> floats (exact widening) ------------------------------------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }

__device__ __forceinline__ void load16(const bf16 *p, float *v) {  // 8 values
  uint4 u = __ldg(reinterpret_cast<const uint4 *>(p));
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ void load16(const float *p, float *v) {  // 4 values
  float4 u = __ldg(reinterpret_cast<const float4 *>(p));
  v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
}

// Running max of finite |x| bits (the tensor amax skips Inf/NaN, see nvfp4.h).
__device__ __forceinline__ uint32_t max_finite(uint32_t am, float x) {
  uint32_t a = nv_abs_bits(x);
  return (a < NV_NONFINITE_BITS && a > am) ? a : am;
}

// Block-wide max, then one atomicMax on the float's bits (valid: non-negative floats order as
// their bits). All threads of the block must call it.
__device__ __forceinline__ void block_amax_commit(float *amax, uint32_t am) {
  __shared__ uint32_t warp_max[32];
  am = __reduce_max_sync(FULL_MASK, am);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = am;
  __syncthreads();
  if (warp == 0) {
    am = lane < (int)(blockDim.x >> 5) ? warp_max[lane] : 0u;
    am = __reduce_max_sync(FULL_MASK, am);
    if (lane == 0 && am) atomicMax(reinterpret_cast<unsigned int *>(amax), am);
  }
}

static int aligned(const void *p, size_t a) { return ((uintptr_t)p % a) == 0; }

static void need_aligned(const char *who, const char *what, const void *p, size_t a) {
  if (!aligned(p, a)) die("%s: %s = %p must be %zu-byte aligned", who, what, p, a);
}

// ---- tensor amax ------------------------------------------------------------------------------------
// Vectors [0, nvec) in steps of 4 per thread (independent loads in flight), then the tail n % E.
template <typename T>
__global__ void amax_kernel(float *amax, const T *x, size_t nvec, size_t n) {
  constexpr int E = 16 / sizeof(T);
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  uint32_t am = 0;
  for (size_t v = tid; v < nvec; v += 4 * stride) {
    float f[4][E];
#pragma unroll
    for (int u = 0; u < 4; u++)
      if (v + u * stride < nvec) load16(x + (v + u * stride) * E, f[u]);
#pragma unroll
    for (int u = 0; u < 4; u++)
      if (v + u * stride < nvec)
#pragma unroll
        for (int k = 0; k < E; k++) am = max_finite(am, f[u][k]);
  }
  for (size_t i = nvec * E + tid; i < n; i += stride) am = max_finite(am, to_float(x[i]));
  block_amax_commit(amax, am);
}

template <typename T>
static void amax_launch(float *amax, const T *x, size_t n) {
  CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), cuda_stream()));
  if (!n) return;
  constexpr int E = 16 / sizeof(T);
  const size_t nvec = aligned(x, 16) ? n / E : 0;
  const int threads = 256;
  // One resident wave: each thread streams its share with 4 loads in flight.
  static int per_sm = 0;
  if (!per_sm) CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, amax_kernel<T>, threads, 0));
  size_t want = ((nvec ? nvec : n) + 4 * threads - 1) / (4 * threads);
  size_t cap = (size_t)cuda_sm_count() * (per_sm > 0 ? per_sm : 1);
  int blocks = (int)(want < 1 ? 1 : want > cap ? cap : want);
  amax_kernel<T><<<blocks, threads, 0, cuda_stream()>>>(amax, x, nvec, n);
  CUDA_CHECK_LAUNCH();
}

void nvfp4_amax_cuda(float *amax, const bf16 *x, size_t n) { amax_launch(amax, x, n); }
void nvfp4_amax_f32_cuda(float *amax, const float *x, size_t n) { amax_launch(amax, x, n); }

// ---- row copy: 1x16 blocks along K ------------------------------------------------------------------
// Thread b owns 16-block b of the flat tensor (K % 16 == 0), which is also its Philox group: two
// 16-byte loads, then the block rule the CPU runs (nv_block16_dev = nv_quantize_block16 + pack16),
// 8 code bytes and one scale byte out. One Philox call per thread serves all 16 elements.
template <bool SR>
__global__ void rows_kernel(const bf16 *x, size_t nblocks, const float *amax, PhiloxStream s, uint8_t *codes,
                            uint8_t *scales) {
  const size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (b >= nblocks) return;
  const float s_enc = nv_encode_scale(__ldg(amax));
  float v[16];
  load16(x + 16 * b, v);
  load16(x + 16 * b + 8, v + 8);
  uint32_t w[4] = {0, 0, 0, 0};
  if (SR) philox_group16(s, b, w);
  uint32_t pk[2];
  const uint8_t bs = nv_block16_dev<SR>(v, s_enc, w, pk);
  reinterpret_cast<uint2 *>(codes)[b] = make_uint2(pk[0], pk[1]);
  scales[b] = bs;
}

void nvfp4_quantize_rows_cuda(const bf16 *x, int rows, int K, const float *amax, NvRound rnd, PhiloxStream s,
                              uint8_t *codes, uint8_t *scales) {
  const char *who = "nvfp4_quantize_rows_cuda";
  if (rows < 0 || K <= 0 || K % 16) die("%s: rows = %d, K = %d: K must be a positive multiple of 16", who, rows, K);
  const size_t n = (size_t)rows * K;
  if (rnd == NV_SR) philox_check_range(who, n);
  if (!n) return;
  need_aligned(who, "x", x, 16);
  need_aligned(who, "codes", codes, 8);
  const size_t nblocks = n / 16;
  const int threads = 256;
  const size_t grid = (nblocks + threads - 1) / threads;
  if (rnd == NV_SR) rows_kernel<true><<<grid, threads, 0, cuda_stream()>>>(x, nblocks, amax, s, codes, scales);
  else rows_kernel<false><<<grid, threads, 0, cuda_stream()>>>(x, nblocks, amax, s, codes, scales);
  CUDA_CHECK_LAUNCH();
}

// ---- column copy (Wgrad): optional R16 down columns, 16-blocks down columns, written transposed ------
// A CTA stages a 128-row x 64-column BF16 tile in shared memory (16-byte loads, rows of 128 bytes,
// chunk c of row r stored at chunk c ^ ((r >> 4) & 7)). Then warp w, lane = 8 p + rb owns columns
// c0 + 2 (4 w + p) and +1 over rows 16 rb .. +15: one 4-byte shared load per two elements (the swizzle
// makes the warp's 32 words hit 32 banks), R16 and the block rule in registers, and the eight lanes of
// a column write its 8 blocks as 64 contiguous code bytes and 8 contiguous scale bytes.
#define COL_TR 128  // tile rows (8 blocks of 16)
#define COL_TC 64   // tile columns
#define COL_THREADS 256

// Stages x[r0 .. r0+127, c0 .. c0+63]: all four of a thread's 16-byte loads are issued before the
// first shared store. Rows past `rows` are not loaded (they are whole 16-blocks, skipped later);
// chunks partly past K, or rows whose pitch is not 16-byte aligned (vec = false), go element by
// element with zeros past K.
__device__ __forceinline__ void col_load_tile(uint4 *tile, const bf16 *x, int rows, int K, int r0, int c0, bool vec) {
  constexpr int PER = COL_TR * (COL_TC / 8) / COL_THREADS;  // 4 chunks per thread
  uint4 buf[PER];
#pragma unroll
  for (int j = 0; j < PER; j++) {
    const int q = threadIdx.x + j * COL_THREADS, r = q >> 3, c = (q & 7) * 8;
    if (vec && r0 + r < rows && c0 + c + 8 <= K)
      buf[j] = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)(r0 + r) * K + c0 + c));
  }
#pragma unroll
  for (int j = 0; j < PER; j++) {
    const int q = threadIdx.x + j * COL_THREADS, r = q >> 3, ch = q & 7, c = ch * 8;
    if (r0 + r >= rows) continue;
    uint4 *dst = &tile[r * 8 + (ch ^ ((r >> 4) & 7))];
    if (vec && c0 + c + 8 <= K) {
      *dst = buf[j];
    } else {
      const bf16 *src = x + (size_t)(r0 + r) * K + c0 + c;
      uint32_t w[4];
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const uint32_t lo = c0 + c + 2 * i < K ? (uint32_t)__bfloat16_as_ushort(src[2 * i]) : 0u;
        const uint32_t hi = c0 + c + 2 * i + 1 < K ? (uint32_t)__bfloat16_as_ushort(src[2 * i + 1]) : 0u;
        w[i] = lo | (hi << 16);
      }
      *dst = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// QUANT = false: the amax pass (max |R16 x| over finite values into *amax). QUANT = true: quantize.
template <bool QUANT, bool SR>
__global__ void __launch_bounds__(COL_THREADS)
    cols_kernel(const bf16 *x, int rows, int K, int rot, bool vec, float *amax_out, const float *amax_in,
                PhiloxStream s, uint8_t *codes, uint8_t *scales) {
  __shared__ uint4 tile[COL_TR * (COL_TC / 8)];
  const int c0 = blockIdx.x * COL_TC, r0 = blockIdx.y * COL_TR;
  col_load_tile(tile, x, rows, K, r0, c0, vec);
  __syncthreads();
  const int lane = threadIdx.x & 31, rb = lane & 7, cp = (threadIdx.x >> 5) * 4 + (lane >> 3);
  const int col = c0 + 2 * cp, rblk = r0 + 16 * rb;
  const float s_enc = QUANT ? nv_encode_scale(__ldg(amax_in)) : 1.0f;
  uint32_t am = 0;
  if (rblk < rows && col < K) {
    const uint32_t *t32 = reinterpret_cast<const uint32_t *>(tile);
    uint32_t w32[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
      const int r = 16 * rb + i;
      w32[i] = t32[r * 32 + ((cp >> 2) ^ rb) * 4 + (cp & 3)];  // (r >> 4) & 7 == rb
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
      if (col + h >= K) break;
      float v[16];
#pragma unroll
      for (int i = 0; i < 16; i++) v[i] = __uint_as_float(h ? w32[i] & 0xffff0000u : w32[i] << 16);
      fp4_rotate16(v, rot);
      if (!QUANT) {
#pragma unroll
        for (int i = 0; i < 16; i++) am = max_finite(am, v[i]);
        continue;
      }
      const size_t e = (size_t)(col + h) * rows + rblk;  // element 0 of the block in [K, rows]
      uint32_t w[4] = {0, 0, 0, 0};
      if (SR) philox_group16(s, e / 16, w);
      uint32_t pk[2];
      const uint8_t bs = nv_block16_dev<SR>(v, s_enc, w, pk);
      *reinterpret_cast<uint2 *>(codes + e / 2) = make_uint2(pk[0], pk[1]);
      scales[e / 16] = bs;
    }
  }
  if (!QUANT) block_amax_commit(amax_out, am);
}

static void cols_check(const char *who, const bf16 *x, int rows, int K, int rot) {
  if (rows < 0 || K <= 0 || rows % 16)
    die("%s: rows = %d, K = %d: rows must be a multiple of 16 (blocks run down columns), K positive", who, rows, K);
  if (rot != FP4_ROT_NONE && rot != FP4_ROT_H16 && rot != FP4_ROT_H16_PLAIN)
    die("%s: rotation %d is none (0), H16 (1) or plain H16 (2)", who, rot);
  if ((rows + COL_TR - 1) / COL_TR > 65535) die("%s: rows = %d exceeds the grid limit (%d)", who, rows, 65535 * COL_TR);
  (void)x;
}

void nvfp4_amax_hadamard_cuda(float *amax, const bf16 *x, int rows, int K, int rot) {
  cols_check("nvfp4_amax_hadamard_cuda", x, rows, K, rot);
  CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), cuda_stream()));
  if (!rows) return;
  const bool vec = aligned(x, 16) && K % 8 == 0;
  dim3 grid((K + COL_TC - 1) / COL_TC, (rows + COL_TR - 1) / COL_TR);
  cols_kernel<false, false>
      <<<grid, COL_THREADS, 0, cuda_stream()>>>(x, rows, K, rot, vec, amax, NULL, PhiloxStream{}, NULL, NULL);
  CUDA_CHECK_LAUNCH();
}

void nvfp4_quantize_cols_cuda(const bf16 *x, int rows, int K, int rot, const float *amax, NvRound rnd, PhiloxStream s,
                              uint8_t *codes, uint8_t *scales) {
  const char *who = "nvfp4_quantize_cols_cuda";
  cols_check(who, x, rows, K, rot);
  if (rnd == NV_SR) philox_check_range(who, (uint64_t)rows * K);
  if (!rows) return;
  need_aligned(who, "codes", codes, 8);
  const bool vec = aligned(x, 16) && K % 8 == 0;
  dim3 grid((K + COL_TC - 1) / COL_TC, (rows + COL_TR - 1) / COL_TR);
  if (rnd == NV_SR)
    cols_kernel<true, true>
        <<<grid, COL_THREADS, 0, cuda_stream()>>>(x, rows, K, rot, vec, NULL, amax, s, codes, scales);
  else
    cols_kernel<true, false>
        <<<grid, COL_THREADS, 0, cuda_stream()>>>(x, rows, K, rot, vec, NULL, amax, s, codes, scales);
  CUDA_CHECK_LAUNCH();
}

// ---- weights: 16x16 tiles -> W and W^T ------------------------------------------------------------
#define W_WARPS 8  // tiles per block, side by side along K

template <typename T>
__device__ __forceinline__ void load8(const T *p, float *v) {
  if constexpr (sizeof(T) == 2) {
    load16(p, v);
  } else {
    load16(p, v);
    load16(p + 4, v + 4);
  }
}

// Lane l handles row n0 + l/2, columns k0 + 8(l%2) .. +7 of its warp's tile.
template <typename T>
__global__ void weight_kernel(const T *w, int N, int K, const float *amax, uint8_t *codes, uint8_t *scales,
                              uint8_t *codes_t, uint8_t *scales_t) {
  __shared__ uint8_t tcodes[W_WARPS][16][17];  // the tile's codes, one per byte (padded row)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n0 = blockIdx.y * 16, k0 = (blockIdx.x * W_WARPS + warp) * 16;
  if (k0 >= K) return;  // whole warp; no block-wide sync below
  const int r = lane >> 1, h = lane & 1;
  const float s_enc = nv_encode_scale(__ldg(amax));
  float v[8];
  load8(w + (size_t)(n0 + r) * K + k0 + 8 * h, v);
  uint32_t am = 0;
#pragma unroll
  for (int k = 0; k < 8; k++) am = am > nv_abs_bits(v[k]) ? am : nv_abs_bits(v[k]);
  am = __reduce_max_sync(FULL_MASK, am);
  const uint8_t bs = nv_block_scale(am, s_enc);
  const float inv = nv_elem_inv(bs, s_enc);
  uint32_t packed = 0;
#pragma unroll
  for (int k = 0; k < 8; k++) {
    const uint8_t c = nv_encode(v[k], inv, 0, 0u);
    packed |= (uint32_t)c << (4 * k);
    tcodes[warp][r][8 * h + k] = c;
  }
  if (codes) {
    *reinterpret_cast<uint32_t *>(codes + (size_t)(n0 + r) * (K / 2) + k0 / 2 + 4 * h) = packed;
    if (!h) scales[(size_t)(n0 + r) * (K / 16) + k0 / 16] = bs;
  }
  if (codes_t) {
    __syncwarp();
    // Now lane l writes row k0 + l/2 of W^T, tile rows n0 + 8(l%2) .. +7.
    uint32_t pt = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) pt |= (uint32_t)tcodes[warp][8 * h + k][r] << (4 * k);
    *reinterpret_cast<uint32_t *>(codes_t + (size_t)(k0 + r) * (N / 2) + n0 / 2 + 4 * h) = pt;
    if (!h) scales_t[(size_t)(k0 + r) * (N / 16) + n0 / 16] = bs;
  }
}

template <typename T>
static void weight_launch(const char *who, const T *w, int N, int K, const float *amax, uint8_t *codes, uint8_t *scales,
                          uint8_t *codes_t, uint8_t *scales_t) {
  if (N < 0 || K <= 0 || N % 16 || K % 16)
    die("%s: N = %d, K = %d must be positive multiples of 16 (16x16 tiles)", who, N, K);
  if (N / 16 > 65535) die("%s: N = %d exceeds the grid limit (%d)", who, N, 65535 * 16);
  if ((codes && !scales) || (codes_t && !scales_t)) die("%s: codes given without their scales", who);
  if (!N || (!codes && !codes_t)) return;
  need_aligned(who, "w", w, 16);
  if (codes) need_aligned(who, "codes", codes, 4);
  if (codes_t) need_aligned(who, "codes_t", codes_t, 4);
  dim3 grid((K / 16 + W_WARPS - 1) / W_WARPS, N / 16);
  weight_kernel<T><<<grid, 32 * W_WARPS, 0, cuda_stream()>>>(w, N, K, amax, codes, scales, codes_t, scales_t);
  CUDA_CHECK_LAUNCH();
}

void nvfp4_quantize_weight_cuda(const float *w, int N, int K, const float *amax, uint8_t *codes, uint8_t *scales,
                                uint8_t *codes_t, uint8_t *scales_t) {
  weight_launch("nvfp4_quantize_weight_cuda", w, N, K, amax, codes, scales, codes_t, scales_t);
}

void nvfp4_quantize_weight_bf16_cuda(const bf16 *w, int N, int K, const float *amax, uint8_t *codes, uint8_t *scales,
                                     uint8_t *codes_t, uint8_t *scales_t) {
  weight_launch("nvfp4_quantize_weight_bf16_cuda", w, N, K, amax, codes, scales, codes_t, scales_t);
}

// ---- dequantize to BF16 (unscaled) and the GEMM alpha ----------------------------------------------
__global__ void dequant_kernel(const uint8_t *codes, const uint8_t *scales, size_t nthreads, bf16 *out) {
  const size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (t >= nthreads) return;
  const uint32_t c = __ldg(reinterpret_cast<const uint32_t *>(codes) + t);
  const uint8_t bs = __ldg(scales + t / 2);
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; i++)
    o[i] = (uint32_t)nv_decode_unscaled_bf16((uint8_t)((c >> (8 * i)) & 15u), bs) |
           ((uint32_t)nv_decode_unscaled_bf16((uint8_t)((c >> (8 * i + 4)) & 15u), bs) << 16);
  reinterpret_cast<uint4 *>(out)[t] = make_uint4(o[0], o[1], o[2], o[3]);
}

void nvfp4_dequant_bf16_unscaled(const uint8_t *codes, const uint8_t *scales, int rows, int K, bf16 *out) {
  const char *who = "nvfp4_dequant_bf16_unscaled";
  if (rows < 0 || K <= 0 || K % 16) die("%s: rows = %d, K = %d: K must be a positive multiple of 16", who, rows, K);
  const size_t nthreads = (size_t)rows * K / 8;
  if (!nthreads) return;
  need_aligned(who, "codes", codes, 4);
  need_aligned(who, "out", out, 16);
  const int threads = 256;
  dequant_kernel<<<(nthreads + threads - 1) / threads, threads, 0, cuda_stream()>>>(codes, scales, nthreads, out);
  CUDA_CHECK_LAUNCH();
}

__global__ void gemm_alpha_kernel(float *alpha, const float *amax_a, const float *amax_b) {
  *alpha = nv_gemm_alpha(*amax_a, *amax_b);
}

void nvfp4_gemm_alpha_cuda(float *alpha, const float *amax_a, const float *amax_b) {
  gemm_alpha_kernel<<<1, 1, 0, cuda_stream()>>>(alpha, amax_a, amax_b);
  CUDA_CHECK_LAUNCH();
}
