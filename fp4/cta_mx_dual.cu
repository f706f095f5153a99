// fp4/cta_mx_dual.cu: the operand hybrid's dY producer (see cta_mx_dual.h): the CTA-local NVFP4 row copy
// and the MXFP4 column copy from one read of the BF16 source. Every scalar step is the rule the two
// separate producers call (nv_quantize_block16 and the cta_* rules as fp4/nvfp4_cta.cu's block_kernel,
// the MXFP4 column phase of fp4/mx_dual.cuh itself), so the bytes are theirs. Built with -fmad=false.
#include "fp4/cta_mx_dual.h"
#include "fp4/mx_dual.cuh"

// The MXFP4 column copy's rotation, any of mx_quantize_cols_cuda's (mx_rotate32).
struct MxRotAny {
  int hadamard;
  __device__ __forceinline__ void operator()(float *v) const { mx_rotate32(v, hadamard); }
};

// The finite |x| bits' max of 16 BF16-pair words (the chunk amax skips non-finite values, as
// nvfp4_cta.cu's pass 1).
static __device__ __forceinline__ uint32_t finite_amax_bits(const uint4 *u) {
  uint32_t m = 0;
#pragma unroll
  for (int c = 0; c < 4; c++) {
    const uint32_t w[4] = {u[c].x, u[c].y, u[c].z, u[c].w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const uint32_t lo = nv_abs_bits(bf16_lo(w[i])), hi = nv_abs_bits(bf16_hi(w[i]));
      if (lo < NV_NONFINITE_BITS && lo > m) m = lo;
      if (hi < NV_NONFINITE_BITS && hi > m) m = hi;
    }
  }
  return m;
}

// One CTA per 128 x 128 tile (tr, tc) of x [rows, K]: (1) the tile's 512 row 32-blocks, two per thread,
// into registers and shared memory; the chunk amax by a warp max and a max over the 8 warps' (written to
// chunk_am[tr, tc] for the finishing pass); (2) each thread's four row 16-blocks quantized with the
// chunk's S_c (codes, unfolded E4M3 scales); (3) the MXFP4 column copy from shared memory.
template <int COL, bool SR>
__global__ void __launch_bounds__(256)
    cta_mx_dual_kernel(const bf16 *x, int rows, int K, PhiloxStream s, uint8_t *codes, uint8_t *scales,
                       uint32_t *chunk_am, MxScale mode, int hadamard, MxOut col_out) {
  __shared__ uint4 tile[TILE * 16];
  __shared__ uint32_t warp_am[8];
  __shared__ int tile_e;  // OUT_FP8_BLK: the tile's largest block exponent + 127
  const int tr = blockIdx.y, tc = blockIdx.x, nbk = K / 32, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) tile_e = 0;  // ordered before phase (3)'s atomics by the barrier below
  const MxSrcBf16 src = {x, K};
  uint4 raw[2][4];
  bool valid[2];
#pragma unroll
  for (int it = 0; it < 2; it++) {
    const int id = threadIdx.x + it * 256, b = tc * 4 + (id & 3);
    const size_t row = (size_t)tr * TILE + (id >> 2);
    valid[it] = row < (size_t)rows && b < nbk;
    if (valid[it]) src.load(row, b, raw[it]);
  }
  uint32_t m = 0;
#pragma unroll
  for (int it = 0; it < 2; it++) {
    const int id = threadIdx.x + it * 256;
    if (valid[it]) {
      mx_tile_put(tile, id >> 2, id & 3, raw[it]);
      const uint32_t a = finite_amax_bits(raw[it]);
      m = a > m ? a : m;
    }
  }
  m = __reduce_max_sync(0xffffffffu, m);
  if (lane == 0) warp_am[warp] = m;
  __syncthreads();  // the chunk amax's parts, and the tile for phase (3)
  uint32_t am = 0;
#pragma unroll
  for (int w = 0; w < 8; w++) am = warp_am[w] > am ? warp_am[w] : am;
  if (threadIdx.x == 0) chunk_am[(size_t)tr * gridDim.x + tc] = am;  // gridDim.x = the chunks along K
  const float s_c = cta_encode_scale(fp4_u2f(am));
  // Rolled over the two blocks as mx_dual_kernel's phase 1: the second block's registers move into the
  // first's between the iterations (no dynamic register indexing).
  uint4 cur[4] = {raw[0][0], raw[0][1], raw[0][2], raw[0][3]};
  bool cur_valid = valid[0];
#pragma unroll 1
  for (int it = 0; it < 2; it++) {
    const int id = threadIdx.x + it * 256, b32 = tc * 4 + (id & 3);
    const size_t row = (size_t)tr * TILE + (id >> 2);
    if (cur_valid) {
      uint32_t w[16];
      float v[32];
#pragma unroll
      for (int c = 0; c < 4; c++)
        w[4 * c] = cur[c].x, w[4 * c + 1] = cur[c].y, w[4 * c + 2] = cur[c].z, w[4 * c + 3] = cur[c].w;
      unpack32(v, w);
      uint32_t pk[4];
      uint8_t bs[2];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const size_t blk = row * (K / 16) + 2 * b32 + h;  // the 16-block's index in the row copy (its SR group)
        uint32_t rnd[4] = {0, 0, 0, 0};
        if (SR) philox_group16(s, blk, rnd);
        bs[h] = nv_block16_dev<SR>(v + 16 * h, s_c, rnd, pk + 2 * h);  // nv_quantize_block16 + pack16
      }
      store_packed(codes + row * (K / 2) + (size_t)b32 * 16, pk);
      *(uint16_t *)(scales + row * (K / 16) + (size_t)b32 * 2) = (uint16_t)(bs[0] | (bs[1] << 8));
    }
#pragma unroll
    for (int c = 0; c < 4; c++) cur[c] = raw[1][c];
    cur_valid = valid[1];
  }
  mx_tile_cols<COL>(tile, &tile_e, tr, tc, rows, K, mode, MxRotAny{hadamard}, col_out);
}

void cta_mx_dual_cuda(const bf16 *x, int rows, int K, NvRound row_rnd, PhiloxStream s, uint8_t *codes, uint8_t *scales,
                      float *outer, uint32_t *scratch, MxScale mode, int hadamard, MxOut col) {
  const char *who = "cta_mx_dual_cuda";
  if (rows <= 0 || K <= 0 || rows % 32 || K % 32)
    die("%s: rows = %d, K = %d: both must be positive multiples of 32 (MXFP4 blocks run down the columns)", who, rows,
        K);
  if (hadamard != 0 && hadamard != 16 && hadamard != 32 && hadamard != MX_HADAMARD_H16_PLAIN)
    die("%s: hadamard = %d (0, 16, 32 or MX_HADAMARD_H16_PLAIN)", who, hadamard);
  if (row_rnd == NV_SR) philox_check_range(who, (uint64_t)rows * K);
  if ((uintptr_t)x % 16 || (uintptr_t)codes % 16 || (uintptr_t)scales % 2 || !outer || !scratch)
    die("%s: x %p and codes %p 16-byte aligned, scales %p 2-byte aligned, outer and scratch given", who,
        (const void *)x, (void *)codes, (void *)scales);
  if (!col.q || (uintptr_t)col.q % 16 || (col.fp8 ? !col.scale : !col.e8m0))
    die("%s: the column copy needs a 16-byte aligned q and its %s buffer", who, col.fp8 ? "scale" : "e8m0");
  dim3 grid((K + TILE - 1) / TILE, (rows + TILE - 1) / TILE);
  const bool sr = row_rnd == NV_SR;
#define CMD(C, S) \
  cta_mx_dual_kernel<C, S><<<grid, 256, 0, cuda_stream()>>>(x, rows, K, s, codes, scales, scratch, mode, hadamard, col)
  switch (mx_col_kind(col)) {
    case OUT_PACKED:
      if (sr) CMD(OUT_PACKED, true);
      else CMD(OUT_PACKED, false);
      break;
    case OUT_FP8:
      if (sr) CMD(OUT_FP8, true);
      else CMD(OUT_FP8, false);
      break;
    default:
      if (sr) CMD(OUT_FP8_BLK, true);
      else CMD(OUT_FP8_BLK, false);
      break;
  }
#undef CMD
  CUDA_CHECK_LAUNCH();
  nvfp4_cta_rows_finish_cuda(scratch, rows, K, scales, outer);
}
