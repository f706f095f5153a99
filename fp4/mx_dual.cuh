// fp4/mx_dual.cuh: the device side of the MXFP4 producers (included by fp4/mxfp4.cu, by the fused
// producers of model/cuda/quant_fused.cu, and by fp4/cta_mx_dual.cu for its column phase): the per-block
// row rule, the FP8 embedding straight from the code accumulators, and the dual producer over 128x128
// tiles, templated on the source of its BF16 values.
// Every scalar decision is an FP4_HD rule from e2m1.h / philox.h / hadamard.h / mxfp4.h / fp8_embed.h
// (per block through quant_dev.cuh, which only packs differently), so the bytes equal the CPU
// reference's whatever the source.
//
// Work units: a thread quantizes one 32-block (32 values in registers). Row copies take their block as
// 16 words of BF16 pairs; four consecutive lanes hold the four 32-blocks of one 128-group, so the FP8
// embedding's group exponent is two shuffles. Column copies (blocks along rows, stored transposed) go
// through a 128x128 BF16 tile in shared memory (16-byte-chunk swizzle, conflict-free both ways); there
// four consecutive lanes hold the four 32-row blocks of one column pair, so the transposed stores are
// contiguous per column and the FP8 group exponent is again two shuffles. The producers are bound by
// instruction issue (scripts/gpu/ncu_producers.sh), so every per-element step is kept to the rule itself:
// RNE and SR on the FMA pipe (quant_dev.cuh), the FP8 bytes by one table permute per 4 codes, templates
// for the output kinds and SR, no index divisions.
#pragma once
#include <cuda_bf16.h>

#include "common/common.h"
#include "fp4/fp8_embed.h"
#include "fp4/hadamard.h"
#include "fp4/mxfp4.h"
#include "fp4/quant_dev.cuh"
#include "common/cuda_common.h"

typedef __nv_bfloat16 bf16;

// OUT_FP8_BLK: the FP8 embedding with one exponent per 128x128 tile (BLK128x128 scales), for the
// column copy that is a Wgrad GEMM's 2D operand (Recipe.wgrad_2d).
enum { OUT_NONE = 0, OUT_PACKED = 1, OUT_FP8 = 2, OUT_FP8_BLK = 3 };

static __device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
static __device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// 32 BF16 values (16-byte aligned) as 16 words of pairs (element 2i in the low half of word i), those
// words -> floats, and both at once.
static __device__ __forceinline__ void load_words32(uint32_t *w, const bf16 *p) {
  const uint4 *q = (const uint4 *)p;
#pragma unroll
  for (int c = 0; c < 4; c++) {
    uint4 u = q[c];
    w[4 * c] = u.x, w[4 * c + 1] = u.y, w[4 * c + 2] = u.z, w[4 * c + 3] = u.w;
  }
}
static __device__ __forceinline__ void unpack32(float *v, const uint32_t *w) {
#pragma unroll
  for (int i = 0; i < 16; i++) v[2 * i] = bf16_lo(w[i]), v[2 * i + 1] = bf16_hi(w[i]);
}
static __device__ __forceinline__ void load32(float *v, const bf16 *p) {
  uint32_t w[16];
  load_words32(w, p);
  unpack32(v, w);
}
static __device__ __forceinline__ void load32(float *v, const float *p) {
  const float4 *q = (const float4 *)p;
#pragma unroll
  for (int c = 0; c < 8; c++) {
    float4 f = q[c];
    v[4 * c] = f.x, v[4 * c + 1] = f.y, v[4 * c + 2] = f.z, v[4 * c + 3] = f.w;
  }
}

static __device__ __forceinline__ void store_packed(uint8_t *q, const uint32_t *pk) {
  *(uint4 *)q = make_uint4(pk[0], pk[1], pk[2], pk[3]);
}

// The 32 E4M3 bytes of a block (packed codes pk) with scale byte b in a group of exponent Et: the
// block's 8-entry table (fp8_embed.h) and two byte permutes per 4 codes.
static __device__ __forceinline__ void fp8_words(uint32_t *w, const uint32_t *pk, uint8_t b, int Et) {
  const MxEmbedLut L = mx_embed_lut(b, Et);
#pragma unroll
  for (int i = 0; i < 8; i++) w[i] = mx_embed_lookup4(L, pk[i >> 1] >> (16 * (i & 1)));
}
static __device__ __forceinline__ void store_fp8(uint8_t *q, const uint32_t *pk, uint8_t b, int Et) {
  uint32_t w[8];
  fp8_words(w, pk, b, Et);
  *(uint4 *)q = make_uint4(w[0], w[1], w[2], w[3]);
  *(uint4 *)(q + 16) = make_uint4(w[4], w[5], w[6], w[7]);
}

// The FP8 embedding of one block straight from its values (the activation and gradient producers'
// path), given sb and c (mx_block32_scale) and the group exponent Et: per 4 elements the code
// accumulator (mx_acc4; mx_acc4_bf16, SR's prescale folded in, for BF16 values), the sign bytes and one
// permute + one logic op into E4M3 bytes, stored 16
// bytes at a time. BF16: the values are the 16 pair words w (unpacked 4 at a time, signs straight from
// the words), else the floats v. The reference rule for the rare tiny blocks (c == 0, sb != 0xFF).
// rnd: the block's 8 Philox words (SR).
template <bool SR, bool BF16>
static __device__ __forceinline__ void store_fp8_block(uint8_t *q, const float *v, const uint32_t *w, float c,
                                                       uint8_t sb, int Et, MxScale mode, const uint32_t *rnd) {
  const MxEmbedLut L = mx_embed_lut(sb, Et);
  const float ch = c * 0.5f;      // exact (mx_acc4_bf16)
  if (c == 0.0f && sb != 0xFF) {  // never in practice: one uniform branch, out of the main path
    float t[32];
    uint32_t pk[4], out[8];
#pragma unroll
    for (int i = 0; i < 32; i++) t[i] = BF16 ? (i & 1 ? bf16_hi(w[i / 2]) : bf16_lo(w[i / 2])) : v[i];
    mx_quantize_block32(t, mode, SR, rnd, pk);
#pragma unroll
    for (int k = 0; k < 8; k++)
      out[k] = mx_embed_word4(L, (pk[k >> 1] >> (16 * (k & 1))) & 0x7777u,
                              BF16 ? fp4_sign_bytes4_bf16(w[2 * k], w[2 * k + 1]) : fp4_sign_bytes4(v + 4 * k));
    *(uint4 *)q = make_uint4(out[0], out[1], out[2], out[3]);
    *(uint4 *)(q + 16) = make_uint4(out[4], out[5], out[6], out[7]);
    return;
  }
#pragma unroll
  for (int half = 0; half < 2; half++) {
    uint32_t out[4];
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      const int k = 4 * half + kk;
      float x[4];
      if (BF16)
        x[0] = bf16_lo(w[2 * k]), x[1] = bf16_hi(w[2 * k]), x[2] = bf16_lo(w[2 * k + 1]), x[3] = bf16_hi(w[2 * k + 1]);
      else x[0] = v[4 * k], x[1] = v[4 * k + 1], x[2] = v[4 * k + 2], x[3] = v[4 * k + 3];
      const uint32_t codes =
          mx_acc_codes4<SR>(BF16 ? mx_acc4_bf16<SR>(x, c, ch, SR ? rnd[k] : 0u) : mx_acc4<SR>(x, c, SR ? rnd[k] : 0u));
      const uint32_t sgn = BF16 ? fp4_sign_bytes4_bf16(w[2 * k], w[2 * k + 1]) : fp4_sign_bytes4(x);
      out[kk] = mx_embed_word4(L, codes, sgn);
    }
    *(uint4 *)(q + 16 * half) = make_uint4(out[0], out[1], out[2], out[3]);
  }
}

static __device__ __forceinline__ int group4_max(int e) {
  e = max(e, __shfl_xor_sync(0xffffffffu, e, 1));
  return max(e, __shfl_xor_sync(0xffffffffu, e, 2));
}

// Quantizes one row 32-block (RNE or SR) and writes it. All lanes must call it (the FP8 path
// shuffles within aligned groups of 4 lanes = the 4 blocks of one 128-group); valid says whether
// this lane's block exists. b: the block's index along K. w: the block's 16 BF16-pair words.
template <int OUT, bool SR>
static __device__ __forceinline__ void row_block(const uint32_t *w, bool valid, size_t row, int b, int rows, int K,
                                                 MxScale mode, PhiloxStream s, const MxOut &out) {
  uint32_t rnd[8];
  uint8_t sb = 0;
  float c = 0.0f;
  size_t i0 = row * K + (size_t)b * 32;
  if (valid) {
    if (SR) {
      philox_group16(s, i0 / 16, rnd);
      philox_group16(s, i0 / 16 + 1, rnd + 4);
    }
    if (OUT == OUT_PACKED) {
      float v[32];
      uint32_t pk[4];
      unpack32(v, w);
      sb = mx_block32_dev<SR>(v, mode, rnd, pk);
      store_packed(out.q + i0 / 2, pk);
      out.e8m0[row * (K / 32) + b] = sb;
    } else {
      sb = mx_block32_scale_of(mx_bf16_amax(w), mode, &c);
    }
  }
  if (OUT == OUT_FP8) {
    int Et = group4_max(valid ? mx_embed_exp_of(sb) : -127);
    if (valid) {
      store_fp8_block<SR, true>(out.q + i0, NULL, w, c, sb, Et, mode, rnd);
      if ((b & 3) == 0) out.scale[(size_t)(b / 4) * rows + row] = mx_embed_scale(Et, out.scale_mul);
    }
  }
}

// ---- dual producer over 128x128 tiles: row copy (RNE/SR) and column copy (RNE, optional H32)
#define TILE 128
// Physical 16-byte chunk (0..15) of logical chunk c (8 BF16 columns) of tile row r; rows are 256 bytes.
// Phase 1 stores (a quarter-warp writes chunks 4j + cc, j = 0..3, of two adjacent rows) and phase 2
// loads (a warp reads words 8w..8w+7 of one row in each of the four 32-row blocks) both hit 8 distinct
// 4-bank groups: c >> 3 flips bit 0, the row parity and the row block flip bits 1-2.
static __device__ __forceinline__ int swz(int r, int c) { return c ^ (c >> 3) ^ (((r & 1) ^ ((r >> 5) & 3)) << 1); }

// Phase 1's store of a row 32-block (4 x 16 bytes u) at tile row lr, 32-block j of the tile.
static __device__ __forceinline__ void mx_tile_put(uint4 *tile, int lr, int j, const uint4 *u) {
#pragma unroll
  for (int c = 0; c < 4; c++) tile[lr * 16 + swz(lr, j * 4 + c)] = u[c];
}

// Phase 2 of a producer over the 128x128 tile (tr, tc) of a rows x K source (rows % 32 == 0,
// K % 32 == 0), held in `tile` as mx_tile_put stored it: the column copy (32-blocks down the columns,
// each rotated by rot(v) first, stored transposed [K, rows]). Every thread of the CTA calls it, after
// a barrier that orders the tile's stores (FP8 shuffles within lanes, FP8_BLK has a barrier of its
// own); FP8_BLK: *tile_e is 0 before (the tile's largest block exponent + 127 is reduced there).
// tid: the thread's index among the tile's 256 (threadIdx.x in a producer kernel, the consumer index in a
// GEMM's epilogue); bar: a barrier over those 256 threads (__syncthreads in a producer kernel; a GEMM's
// epilogue has producer warps that never reach one, so it passes its named barrier).
struct CtaBarrier {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};
template <int COL, class Rot, class Bar = CtaBarrier>
static __device__ __forceinline__ void mx_tile_cols(const uint4 *tile, int *tile_e, int tr, int tc, int rows, int K,
                                                    MxScale mode, Rot rot, const MxOut &col_out, int tid = threadIdx.x,
                                                    Bar bar = Bar{}) {
  // Warp w, lane = 4 p + rb: columns lc, lc + 1 with lc = 2 (8 w + p), rows rb*32 .. +31.
  // The four lanes of one column pair hold its four 32-blocks, so their stores are contiguous (64
  // bytes packed, 128 bytes FP8, per column) and the FP8 group exponent is two shuffles.
  const int lane = tid & 31, rb = lane & 3, cw = (tid >> 5) * 8 + (lane >> 2), lc = 2 * cw;
  const size_t r0 = (size_t)tr * TILE + rb * 32, col = (size_t)tc * TILE + lc;
  const bool ok = r0 < (size_t)rows && col < (size_t)K;  // K % 32 == 0: col + 1 < K too
  // Row r = 32 rb + i of the tile holds this word at swz(r, cw >> 2) = base ^ ((i & 1) << 1) (the row
  // block is rb): two base addresses, then constant offsets.
  const int c4 = cw >> 2, base = c4 ^ (c4 >> 3) ^ (rb << 1);
  const uint32_t *t32 = (const uint32_t *)tile + rb * 2048 + (cw & 3);
  const uint32_t *pe = t32 + 4 * base, *po = t32 + 4 * (base ^ 2) + 64;
  uint32_t w32[32];  // (stale tile words where !ok: read, never stored)
#pragma unroll
  for (int i = 0; i < 32; i += 2) w32[i] = pe[i * 64], w32[i + 1] = po[i * 64];
  if constexpr (COL == OUT_FP8_BLK) {
    // One exponent for the whole 128x128 tile (fp8_embed.h, as the weights): both columns' codes
    // first, the tile's largest block exponent through a warp max and a shared atomic, then the bytes.
    uint32_t pk[2][4];
    uint8_t sbh[2];
    int e = -127;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float v[32];
#pragma unroll
      for (int i = 0; i < 32; i++) v[i] = __uint_as_float(__byte_perm(w32[i], 0u, h ? 0x3244u : 0x1044u));
      rot(v);
      sbh[h] = mx_block32_dev<false>(v, mode, NULL, pk[h]);
      if (ok) e = max(e, mx_embed_exp_of(sbh[h]));
    }
    e = __reduce_max_sync(0xffffffffu, e);
    if (lane == 0) atomicMax(tile_e, e + 127);
    bar();
    const int Et = *tile_e - 127;
    if (ok)
#pragma unroll
      for (int h = 0; h < 2; h++) store_fp8(col_out.q + (col + h) * rows + r0, pk[h], sbh[h], Et);
    if (col_out.rounded) {  // nonzero blocks outside the exact range: one warp sum, one atomic
      int n = 0;
#pragma unroll
      for (int h = 0; h < 2; h++)
        n += ok && sbh[h] != 0xFF && mx_embed_exp_of(sbh[h]) < Et - 14 &&
             ((pk[h][0] | pk[h][1] | pk[h][2] | pk[h][3]) & 0x77777777u) != 0;
      n = __reduce_add_sync(0xffffffffu, n);
      if (lane == 0 && n) atomicAdd(col_out.rounded, (unsigned long long)n);
    }
    if (tid == 0) {  // the copy is [K, rows]: tile row tc, tile column tr
      const int L = (rows + TILE - 1) / TILE, L4 = mx_blk128_l4(rows);
      col_out.scale[(size_t)tc * L4 + tr] = mx_embed_scale(Et, col_out.scale_mul);
      if (tr == L - 1)
        for (int l = L; l < L4; l++) col_out.scale[(size_t)tc * L4 + l] = 0.0f;
    }
  } else {
#pragma unroll 1  // rolled, as phase 1: column h's BF16 halves by one permute with a selector per h
    for (int h = 0; h < 2; h++) {
      const uint32_t half = h ? 0x3244u : 0x1044u;  // bytes 2-3 (or 0-1) of the word to the top, zeros below
      float v[32];
#pragma unroll
      for (int i = 0; i < 32; i++) v[i] = __uint_as_float(__byte_perm(w32[i], 0u, half));
      rot(v);
      if (COL == OUT_PACKED) {
        if (ok) {
          uint32_t pk[4];
          const uint8_t sb = mx_block32_dev<false>(v, mode, NULL, pk);
          store_packed(col_out.q + (col + h) * (rows / 2) + r0 / 2, pk);
          col_out.e8m0[(col + h) * (rows / 32) + r0 / 32] = sb;
        }
      } else {  // FP8: the group exponent (all lanes shuffle) before the codes
        float c = 0.0f;
        const uint8_t sb = ok ? mx_block32_scale(v, mode, &c) : 0;
        const int Et = group4_max(ok ? mx_embed_exp_of(sb) : -127);
        if (ok) {
          store_fp8_block<false, false>(col_out.q + (col + h) * rows + r0, v, NULL, c, sb, Et, mode, NULL);
          if (rb == 0) col_out.scale[(size_t)tr * K + col + h] = mx_embed_scale(Et, col_out.scale_mul);
        }
      }
    }
  }
}

// A column 32-block's rotation along the tokens: hadamard 32, 16 (fixed-sign, on each half), plain H16
// (MX_HADAMARD_H16_PLAIN) or none (0), as mx_quantize_cols_cuda takes it.
static __device__ __forceinline__ void mx_rotate32(float *v, int hadamard) {
  if (hadamard == 32) fp4_h32(v);
  else if (hadamard == 16) fp4_h16(v), fp4_h16(v + 16);
  else if (hadamard == MX_HADAMARD_H16_PLAIN) fp4_h16_plain(v), fp4_h16_plain(v + 16);
}

// The dual producer's column rotation: H32 or none.
struct MxRotH32 {
  int on;
  __device__ __forceinline__ void operator()(float *v) const {
    if (on) fp4_h32(v);
  }
};

// The source of the tile's BF16 values: MxSrcBf16 reads x; the fused producers (model/cuda/quant_fused.cu)
// compute them from what the previous op would have read (RMSNorm's input, SwiGLU's gate and up).
// load(row, b, u): the 32 values of block b of row as 4 x 16 bytes of BF16 pairs.
struct MxSrcBf16 {
  const bf16 *x;
  int K;
  __device__ __forceinline__ void load(size_t row, int b, uint4 *u) const {
    const uint4 *p = (const uint4 *)(x + row * K + (size_t)b * 32);
#pragma unroll
    for (int c = 0; c < 4; c++) u[c] = p[c];
  }
};

// Phases 1 and 2 of the dual producer on tile (tr, tc), whose two row blocks per thread (512 in all: 128
// rows x 4) are already in registers (raw, valid: mx_dual_load's): the row copy, then the column copy
// through `tile`. tile_e (OUT_FP8_BLK): 0 on entry, ordered by a barrier before the first atomic.
// in_tile: the tile already holds the values (a GEMM epilogue put them there), so phase 1 does not store
// them. tid, bar: as mx_tile_cols takes them.
template <int ROW, int COL, bool SR, class Bar = CtaBarrier>
static __device__ __forceinline__ void mx_dual_tile(const uint4 (&raw)[2][4], const bool (&valid)[2], uint4 *tile,
                                                    int *tile_e, int tr, int tc, int rows, int K, MxScale mode,
                                                    PhiloxStream s, const MxOut &row_out, int hadamard,
                                                    const MxOut &col_out, int tid = threadIdx.x, Bar bar = Bar{},
                                                    bool in_tile = false) {
  if (COL != OUT_NONE && !in_tile) {  // the tile for phase 2
#pragma unroll
    for (int it = 0; it < 2; it++) {
      const int id = tid + it * 256;
      if (valid[it]) mx_tile_put(tile, id >> 2, id & 3, raw[it]);
    }
  }
  if (ROW != OUT_NONE) {
    // Rolled over the two blocks (half the code: the instruction cache was a stall reason); the second
    // block's registers move into the first's between the iterations (no dynamic register indexing).
    uint4 cur[4] = {raw[0][0], raw[0][1], raw[0][2], raw[0][3]};
    bool cur_valid = valid[0];
#pragma unroll 1
    for (int it = 0; it < 2; it++) {
      const int id = tid + it * 256, lr = id >> 2, j = id & 3, b = tc * 4 + j;
      const size_t row = (size_t)tr * TILE + lr;
      uint32_t w[16];
#pragma unroll
      for (int c = 0; c < 4; c++)
        w[4 * c] = cur[c].x, w[4 * c + 1] = cur[c].y, w[4 * c + 2] = cur[c].z, w[4 * c + 3] = cur[c].w;
      row_block<ROW, SR>(w, cur_valid, row, b, rows, K, mode, s, row_out);
#pragma unroll
      for (int c = 0; c < 4; c++) cur[c] = raw[1][c];
      cur_valid = valid[1];
    }
  }
  if (COL == OUT_NONE) return;
  if (!in_tile) bar();  // phase 2: the column copy (an epilogue's tile was ordered before the call)
  mx_tile_cols<COL>(tile, tile_e, tr, tc, rows, K, mode, MxRotH32{hadamard}, col_out, tid, bar);
}

// The inverse of mx_tile_put: a row 32-block of the tile (tile row lr, 32-block j) as 4 x 16 bytes.
static __device__ __forceinline__ void mx_tile_get(const uint4 *tile, int lr, int j, uint4 *u) {
#pragma unroll
  for (int c = 0; c < 4; c++) u[c] = tile[lr * 16 + swz(lr, j * 4 + c)];
}

// Phase 1's loads: the thread's two row blocks of tile (tr, tc), four lanes covering 256 contiguous
// bytes; both issued before either is quantized. load(row, b, u...) fills one uint4[4] per output.
template <class Load>
static __device__ __forceinline__ void mx_dual_load(int tr, int tc, int rows, int K, bool (&valid)[2], Load load) {
#pragma unroll
  for (int it = 0; it < 2; it++) {
    const int id = threadIdx.x + it * 256, lr = id >> 2, b = tc * 4 + (id & 3);
    const size_t row = (size_t)tr * TILE + lr;
    valid[it] = row < (size_t)rows && b < K / 32;
    if (valid[it]) load(it, row, b);
  }
}

// (256, 3): three CTAs per SM (80 registers); the SR variants would otherwise take ~118 and fit two.
template <int ROW, int COL, bool SR, class Src>
__global__ void __launch_bounds__(256, 3)
    mx_dual_kernel(Src src, int rows, int K, MxScale mode, PhiloxStream s, MxOut row_out, int hadamard, MxOut col_out) {
  __shared__ uint4 tile[TILE * 16];
  __shared__ int tile_e;  // OUT_FP8_BLK: the tile's largest block exponent + 127
  const int tr = blockIdx.y, tc = blockIdx.x;
  if (COL == OUT_FP8_BLK && threadIdx.x == 0) tile_e = 0;  // ordered before the atomics by phase 2's barrier
  uint4 raw[2][4];
  bool valid[2];
  mx_dual_load(tr, tc, rows, K, valid, [&](int it, size_t row, int b) { src.load(row, b, raw[it]); });
  mx_dual_tile<ROW, COL, SR>(raw, valid, tile, &tile_e, tr, tc, rows, K, mode, s, row_out, hadamard, col_out);
}

// ---- host side of the dual producer, for any source (mxfp4.cu, model/cuda/quant_fused.cu)
static inline int mx_out_kind(const MxOut &o) { return o.q == NULL ? OUT_NONE : o.fp8 ? OUT_FP8 : OUT_PACKED; }
// The column copy's kind: the FP8 embedding with BLK128x128 scales when blk128 is set.
static inline int mx_col_kind(const MxOut &o) {
  return mx_out_kind(o) == OUT_FP8 && o.blk128 ? OUT_FP8_BLK : mx_out_kind(o);
}

// Launches the dual producer over a rows x K source (rows % 32 == 0, K % 32 == 0; checked by the caller).
// WITH_SR = false: the row copy is RNE only (the sources of forward activations; no SR kernels built).
template <class Src, bool WITH_SR = true>
static void mx_dual_launch(const Src &src, int rows, int K, MxScale mode, MxRound row_rnd, PhiloxStream s, MxOut row,
                           int hadamard, MxOut col) {
  if (!WITH_SR && row_rnd == MX_SR) die("mx_dual_launch: this source has no stochastic-rounding row copy");
  dim3 grid((K + TILE - 1) / TILE, (rows + TILE - 1) / TILE);
  int rk = mx_out_kind(row), ck = mx_col_kind(col), sr = row_rnd == MX_SR;
  if (row.q && row.fp8 && row.blk128)
    die("mx_dual_launch: the row copy has VEC128 scales (blk128 is for the column copy)");
  if (ck == OUT_FP8_BLK && rk == OUT_PACKED)
    die("mx_dual_launch: a packed row copy with a BLK128x128 column copy is not built");
#define DUAL(R, C, S) \
  mx_dual_kernel<R, C, S, Src><<<grid, 256, 0, cuda_stream()>>>(src, rows, K, mode, s, row, hadamard, col)
#define DUAL_SR(R, C)         \
  if constexpr (WITH_SR) {    \
    if (sr) DUAL(R, C, true); \
    else DUAL(R, C, false);   \
  } else {                    \
    DUAL(R, C, false);        \
  }
  switch (rk * 4 + ck) {
    case 0:
      return;
    case 1:
      DUAL(OUT_NONE, OUT_PACKED, false);
      break;
    case 2:
      DUAL(OUT_NONE, OUT_FP8, false);
      break;
    case 3:
      DUAL(OUT_NONE, OUT_FP8_BLK, false);
      break;
    case 4:
      DUAL_SR(OUT_PACKED, OUT_NONE);
      break;
    case 5:
      DUAL_SR(OUT_PACKED, OUT_PACKED);
      break;
    case 6:
      DUAL_SR(OUT_PACKED, OUT_FP8);
      break;
    case 8:
      DUAL_SR(OUT_FP8, OUT_NONE);
      break;
    case 9:
      DUAL_SR(OUT_FP8, OUT_PACKED);
      break;
    case 10:
      DUAL_SR(OUT_FP8, OUT_FP8);
      break;
    case 11:
      DUAL_SR(OUT_FP8, OUT_FP8_BLK);
      break;
  }
#undef DUAL_SR
#undef DUAL
  CUDA_CHECK_LAUNCH();
}
