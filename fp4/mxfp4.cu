// fp4/mxfp4.cu: the MXFP4 producers' host entries (mxfp4.h), the row-copy kernel and the weight-tile
// kernel; the shared device side and the dual producer are in mx_dual.cuh.
#include "fp4/mx_dual.cuh"

// ---- row copy: one thread per 32-block. blockIdx.x * 128 + threadIdx.x = the block along K (the
// row padded to whole 128-groups, so four aligned lanes hold one group), blockIdx.y strides the rows:
// no index division.
#define ROWS_THREADS 128
template <int OUT, bool SR>
__global__ void __launch_bounds__(ROWS_THREADS)
    mx_rows_kernel(const bf16 *x, int rows, int K, MxScale mode, PhiloxStream s, MxOut out) {
  const int b = blockIdx.x * ROWS_THREADS + threadIdx.x;
  const bool in_k = b < K / 32;
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {  // uniform per CTA: the shuffles stay converged
    const size_t row = (size_t)r;
    uint32_t w[16];
    if (in_k) load_words32(w, x + row * K + (size_t)b * 32);
    row_block<OUT, SR>(w, in_k, row, b, rows, K, mode, s, out);
  }
}

// ---- weights: 128x128 tiles of 32x32 subtiles; W rows from registers, W^T through a byte tile in smem
// (FP8: W's E4M3 bytes themselves, transposed; packed: the codes, re-packed along columns)
#define CODE_PITCH 144  // bytes per code-tile row: 128 codes + 16 bytes against bank conflicts

// The tile's FP8 scales (BLK128x128: one per tile of W and of W^T, exponent Et), with the padding of the
// last tile column to whole groups of 4 zeroed.
template <int WOUT, int WTOUT>
static __device__ void w_tile_scales(int tr, int tc, int N, int K, int Et, const MxOut &wq, const MxOut &wtq) {
  const int L = (K + 127) / 128, L4 = mx_blk128_l4(K), LT = (N + 127) / 128, LT4 = mx_blk128_l4(N);
  if (WOUT == OUT_FP8) {
    wq.scale[(size_t)tr * L4 + tc] = mx_embed_scale(Et, wq.scale_mul);
    if (tc == L - 1)
      for (int l = L; l < L4; l++) wq.scale[(size_t)tr * L4 + l] = 0.0f;
  }
  if (WTOUT == OUT_FP8) {
    wtq.scale[(size_t)tc * LT4 + tr] = mx_embed_scale(Et, wtq.scale_mul);
    if (tr == LT - 1)
      for (int l = LT; l < LT4; l++) wtq.scale[(size_t)tc * LT4 + l] = 0.0f;
  }
}

// W^T's FP8 bytes from the byte tile (W's E4M3 bytes, CODE_PITCH rows): warp w, lane l takes columns
// lc, lc + 1 (lc = 2 (32 (w & 1) + l)) of the 32 rows of row block w >> 1; 4 rows' byte pairs -> 2 words.
static __device__ __forceinline__ void w_store_transposed(const uint8_t *codes, int tr, int tc, int N, int K,
                                                          const MxOut &wtq) {
  const int warp = threadIdx.x >> 5, rb = warp >> 1, lc = ((warp & 1) * 32 + (threadIdx.x & 31)) * 2;
  const size_t r0 = (size_t)tr * TILE + rb * 32, col = (size_t)tc * TILE + lc;
  if (r0 >= (size_t)N || col >= (size_t)K) return;
  uint32_t f8[2][8];
#pragma unroll
  for (int i = 0; i < 32; i += 4) {
    uint32_t a[4];
#pragma unroll
    for (int k = 0; k < 4; k++) a[k] = *(const uint16_t *)(codes + (rb * 32 + i + k) * CODE_PITCH + lc);
    f8[0][i / 4] = __byte_perm(__byte_perm(a[0], a[1], 0x0040u), __byte_perm(a[2], a[3], 0x0040u), 0x5410u);
    f8[1][i / 4] = __byte_perm(__byte_perm(a[0], a[1], 0x0051u), __byte_perm(a[2], a[3], 0x0051u), 0x5410u);
  }
#pragma unroll
  for (int h = 0; h < 2; h++) {
    uint8_t *q = wtq.q + (col + h) * N + r0;
    *(uint4 *)q = make_uint4(f8[h][0], f8[h][1], f8[h][2], f8[h][3]);
    *(uint4 *)(q + 16) = make_uint4(f8[h][4], f8[h][5], f8[h][6], f8[h][7]);
  }
}

template <typename T, int WOUT, int WTOUT>
__global__ void __launch_bounds__(256)
    mx_weight_kernel(const T *w, int N, int K, MxScale mode, int rule087, MxOut wq, MxOut wtq) {
  __shared__ __align__(16) uint8_t codes[TILE * CODE_PITCH];
  __shared__ uint32_t s_amax[4][4];
  __shared__ uint8_t s_b[4][4];
  __shared__ int s_Et;
  const int tr = blockIdx.y, tc = blockIdx.x, nbk = K / 32;
  if (threadIdx.x < 16) s_amax[threadIdx.x >> 2][threadIdx.x & 3] = 0;
  __syncthreads();
  float v[2][32];
  bool valid[2];
#pragma unroll
  for (int it = 0; it < 2; it++) {
    int id = threadIdx.x + it * 256, lr = id >> 2, j = id & 3, b = tc * 4 + j;
    size_t row = (size_t)tr * TILE + lr;
    valid[it] = row < (size_t)N && b < nbk;
    if (valid[it]) {
      uint32_t am = 0;
      load32(v[it], w + row * K + (size_t)b * 32);
#pragma unroll
      for (int i = 0; i < 32; i++) am = max(am, mx_abs_bits(v[it][i]));
      atomicMax(&s_amax[lr >> 5][j], am);  // max is order-independent: deterministic
    }
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    int rb = threadIdx.x >> 2, j = threadIdx.x & 3;
    uint32_t am = s_amax[rb][j];
    s_b[rb][j] = am > MX_NAN_BITS ? 0xFF : e8m0_encode(mx_weight_exp(__uint_as_float(am), mode, rule087));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int Et = -127;
    for (int i = 0; i < 16; i++) {
      int rb = i >> 2, j = i & 3;
      if ((size_t)tr * TILE + rb * 32 < (size_t)N && tc * 4 + j < nbk) Et = max(Et, mx_embed_exp_of(s_b[rb][j]));
    }
    s_Et = Et;
    w_tile_scales<WOUT, WTOUT>(tr, tc, N, K, Et, wq, wtq);
  }
  __syncthreads();
  const int Et = s_Et;
#pragma unroll
  for (int it = 0; it < 2; it++) {
    if (!valid[it]) continue;
    int id = threadIdx.x + it * 256, lr = id >> 2, j = id & 3, b = tc * 4 + j;
    size_t row = (size_t)tr * TILE + lr;
    uint8_t sb = s_b[lr >> 5][j];
    int e = sb == 0xFF ? 0 : (int)sb - 127;
    uint32_t pk[4] = {0, 0, 0, 0};
    if (sb != 0xFF) {
      // mx_quantize_weight's element rule with the tile's exponent: the codes of the exact |w| * c, as
      // mx_prescale's (see mx_block_mul and mx_acc4; the 0.87 rule only makes y larger, which the
      // saturating RNE covers).
      const float c = mx_block_mul(e, mode);
      if (c != 0.0f) {
        mx_rne_words(v[it], c, pk);
      } else {  // MX_SCALE_UP with e < -125: the reference step
        for (int i = 0; i < 32; i++)
          pk[i >> 3] += (e2m1_sign(v[it][i]) | e2m1_rne_mag(fp4_f2u(mx_prescale(fabsf(v[it][i]), e, mode))))
                        << (4 * (i & 7));
      }
    }
    if (WOUT == OUT_PACKED) {
      store_packed(wq.q + row * (K / 2) + (size_t)b * 16, pk);
      wq.e8m0[row * nbk + b] = sb;
    } else if (WOUT == OUT_FP8 && WTOUT != OUT_FP8) {
      store_fp8(wq.q + row * K + (size_t)b * 32, pk, sb, Et);
    }
    if (WTOUT == OUT_FP8) {
      // W^T's E4M3 bytes are W's, transposed: the same code, 32x32 scale byte and tile exponent. So the
      // tile keeps W's bytes and the column phase below only moves them.
      uint32_t f8[8];
      fp8_words(f8, pk, sb, Et);
      if (WOUT == OUT_FP8) {
        *(uint4 *)(wq.q + row * K + (size_t)b * 32) = make_uint4(f8[0], f8[1], f8[2], f8[3]);
        *(uint4 *)(wq.q + row * K + (size_t)b * 32 + 16) = make_uint4(f8[4], f8[5], f8[6], f8[7]);
      }
      uint4 *dst = (uint4 *)(codes + lr * CODE_PITCH + j * 32);
      dst[0] = make_uint4(f8[0], f8[1], f8[2], f8[3]);
      dst[1] = make_uint4(f8[4], f8[5], f8[6], f8[7]);
    } else if (WTOUT == OUT_PACKED) {  // one code per byte, for the column reads below
      uint32_t c8[8];
#pragma unroll
      for (int i = 0; i < 8; i++) {  // nibbles 4i..4i+3 -> bytes, by two spreading steps
        uint32_t t = (pk[i >> 1] >> (16 * (i & 1))) & 0xFFFFu;
        t = (t | (t << 8)) & 0x00FF00FFu;
        c8[i] = (t | (t << 4)) & 0x0F0F0F0Fu;
      }
      uint4 *dst = (uint4 *)(codes + lr * CODE_PITCH + j * 32);
      dst[0] = make_uint4(c8[0], c8[1], c8[2], c8[3]);
      dst[1] = make_uint4(c8[4], c8[5], c8[6], c8[7]);
    }
  }
  if (WTOUT == OUT_NONE) return;
  __syncthreads();
  if (WTOUT == OUT_FP8) {
    w_store_transposed(codes, tr, tc, N, K, wtq);
    return;
  }
  const int warp = threadIdx.x >> 5, rb = warp >> 1, lc = ((warp & 1) * 32 + (threadIdx.x & 31)) * 2;
  const size_t r0 = (size_t)tr * TILE + rb * 32, col = (size_t)tc * TILE + lc;
  if (r0 >= (size_t)N || col >= (size_t)K) return;
  uint32_t pk[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
  for (int i = 0; i < 32; i++) {
    uint32_t two = *(const uint16_t *)(codes + (rb * 32 + i) * CODE_PITCH + lc);
    pk[0][i >> 3] |= (two & 15u) << (4 * (i & 7));
    pk[1][i >> 3] |= ((two >> 8) & 15u) << (4 * (i & 7));
  }
  const uint8_t sb = s_b[rb][lc >> 5];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    store_packed(wtq.q + (col + h) * (N / 2) + r0 / 2, pk[h]);
    wtq.e8m0[(col + h) * (N / 32) + r0 / 32] = sb;
  }
}

// ---- weights, the engine's case (BF16 shadow -> W and/or W^T as FP8 with BLK128x128 scales): the tiles of
// mx_weight_kernel, but persistent CTAs (tiles blockIdx.x, + gridDim.x, ...) that stage the next tile's BF16
// in shared memory by cp.async while this one is quantized. One tile per CTA left DRAM idle between a
// CTA's load and its stores (ncu: 58% of DRAM peak, 34% of issue slots, latency-bound).
#define WSTAGE_BYTES (TILE * 256)  // a tile of BF16: 128 rows of 16 chunks of 16 bytes

static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Where chunk ch (0..15) of staged row r lives: conflict-free for the cp.async stores (a quarter warp
// writes 8 consecutive chunks of a row) and for the block reads (a quarter warp reads chunk 4 j + c,
// j = 0..3, of two adjacent rows).
static __device__ __forceinline__ int w_swz(int r, int ch) { return ch ^ (((ch >> 2) ^ r) & 3); }

// Tile (tr, tc)'s BF16 into the stage, 16 bytes per copy, consecutive threads on consecutive chunks.
static __device__ __forceinline__ void w_stage_tile(uint8_t *stage, const bf16 *w, int N, int K, int tr, int tc) {
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const int id = i * 256 + threadIdx.x, r = id >> 4, ch = id & 15;
    const size_t row = (size_t)tr * TILE + r;
    if (row < (size_t)N && tc * 4 + (ch >> 2) < K / 32)
      cp_async16(stage + r * 256 + w_swz(r, ch) * 16, w + row * K + (size_t)tc * TILE + ch * 8);
  }
  cp_async_commit();
}

template <int WOUT, int WTOUT>
__global__ void __launch_bounds__(256, 4)
    mx_weight_fp8_kernel(const bf16 *w, int N, int K, MxScale mode, int rule087, MxOut wq, MxOut wtq) {
  extern __shared__ __align__(16) uint8_t w_smem[];
  uint8_t *stage = w_smem, *codes = w_smem + WSTAGE_BYTES;  // codes: W's bytes for W^T (CODE_PITCH rows)
  __shared__ uint32_t s_amax[4][4];
  __shared__ uint8_t s_b[4][4];
  __shared__ int s_Et;
  const int nbk = K / 32, lane = threadIdx.x & 31, tiles_c = (K + TILE - 1) / TILE;
  const int ntiles = tiles_c * ((N + TILE - 1) / TILE);
  if ((int)blockIdx.x < ntiles) w_stage_tile(stage, w, N, K, blockIdx.x / tiles_c, blockIdx.x % tiles_c);
  for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
    const int tr = t / tiles_c, tc = t % tiles_c;
    if (threadIdx.x < 16) s_amax[threadIdx.x >> 2][threadIdx.x & 3] = 0;
    cp_async_wait_all();
    __syncthreads();  // tile t staged by every thread; the previous tile's scales and byte tile read
    uint32_t raw[2][16];
    bool valid[2];
#pragma unroll
    for (int it = 0; it < 2; it++) {
      const int id = threadIdx.x + it * 256, lr = id >> 2, j = id & 3;
      valid[it] = (size_t)tr * TILE + lr < (size_t)N && tc * 4 + j < nbk;
      const uint4 *src = (const uint4 *)(stage + lr * 256);
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const uint4 u = src[w_swz(lr, 4 * j + c)];
        raw[it][4 * c] = u.x, raw[it][4 * c + 1] = u.y, raw[it][4 * c + 2] = u.z, raw[it][4 * c + 3] = u.w;
      }
    }
    __syncthreads();  // the stage read by all (and s_amax zeroed): the next tile may come in
    if (t + (int)gridDim.x < ntiles) w_stage_tile(stage, w, N, K, (t + gridDim.x) / tiles_c, (t + gridDim.x) % tiles_c);
      // Each 32x32 block's amax: a warp holds 8 rows of one row block, its lanes l and l ^ 4, ^ 8, ^ 16 the
      // same block column, so three shuffles and one shared atomic per block column and warp.
#pragma unroll
    for (int it = 0; it < 2; it++) {
      uint32_t am = valid[it] ? fp4_f2u(mx_bf16_amax(raw[it])) : 0u;  // NaN: above MX_NAN_BITS
      am = max(am, __shfl_xor_sync(0xffffffffu, am, 4));
      am = max(am, __shfl_xor_sync(0xffffffffu, am, 8));
      am = max(am, __shfl_xor_sync(0xffffffffu, am, 16));
      if (lane < 4) atomicMax(&s_amax[(threadIdx.x + it * 256) >> 7][lane], am);  // order-independent
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // warp 0: the 16 scale bytes, then the tile exponent over the blocks inside W
      const int rb = (lane >> 2) & 3, j = lane & 3;
      int e = -127;
      if (lane < 16) {
        const uint32_t am = s_amax[rb][j];
        const uint8_t b = am > MX_NAN_BITS ? 0xFF : e8m0_encode(mx_weight_exp(__uint_as_float(am), mode, rule087));
        s_b[rb][j] = b;
        if ((size_t)tr * TILE + rb * 32 < (size_t)N && tc * 4 + j < nbk) e = mx_embed_exp_of(b);
      }
      e = __reduce_max_sync(0xffffffffu, e);
      if (lane == 0) {
        s_Et = e;
        w_tile_scales<WOUT, WTOUT>(tr, tc, N, K, e, wq, wtq);
      }
    }
    __syncthreads();
    const int Et = s_Et;
#pragma unroll
    for (int it = 0; it < 2; it++) {
      if (!valid[it]) continue;
      const int id = threadIdx.x + it * 256, lr = id >> 2, j = id & 3, b = tc * 4 + j;
      const size_t row = (size_t)tr * TILE + lr;
      const uint8_t sb = s_b[lr >> 5][j];
      const int e = sb == 0xFF ? 0 : (int)sb - 127;
      const float c = mx_block_mul(e, mode);
      uint32_t f8[8];
      if (sb != 0xFF && c == 0.0f) {  // MX_SCALE_UP with e < -125: the reference step, then the table
        float x[32];
        uint32_t pk[4] = {0, 0, 0, 0};
        unpack32(x, raw[it]);
        for (int i = 0; i < 32; i++)
          pk[i >> 3] += (e2m1_sign(x[i]) | e2m1_rne_mag(fp4_f2u(mx_prescale(fabsf(x[i]), e, mode)))) << (4 * (i & 7));
        fp8_words(f8, pk, sb, Et);
      } else {  // the codes straight into E4M3 (a NaN tile: the table gives 0x7F whatever the codes)
        const MxEmbedLut L = mx_embed_lut(sb, Et);
#pragma unroll
        for (int k = 0; k < 8; k++) {
          const uint32_t w0 = raw[it][2 * k], w1 = raw[it][2 * k + 1];
          const float x[4] = {bf16_lo(w0), bf16_hi(w0), bf16_lo(w1), bf16_hi(w1)};
          f8[k] = mx_embed_word4(L, mx_acc_codes4<false>(mx_acc4_bf16<false>(x, c, 0.0f, 0u)),
                                 fp4_sign_bytes4_bf16(w0, w1));
        }
      }
      if (WOUT == OUT_FP8) {
        *(uint4 *)(wq.q + row * K + (size_t)b * 32) = make_uint4(f8[0], f8[1], f8[2], f8[3]);
        *(uint4 *)(wq.q + row * K + (size_t)b * 32 + 16) = make_uint4(f8[4], f8[5], f8[6], f8[7]);
      }
      if (WTOUT == OUT_FP8) {  // W^T's bytes are W's, transposed (mx_weight_kernel)
        uint4 *dst = (uint4 *)(codes + lr * CODE_PITCH + j * 32);
        dst[0] = make_uint4(f8[0], f8[1], f8[2], f8[3]);
        dst[1] = make_uint4(f8[4], f8[5], f8[6], f8[7]);
      }
    }
    if (WTOUT == OUT_FP8) {
      __syncthreads();
      w_store_transposed(codes, tr, tc, N, K, wtq);
    }
  }
}

// ---- host side: checks and dispatch

static void check_ptr(const char *who, const char *what, const void *p, int align) {
  if ((uintptr_t)p % align) die("%s: %s = %p is not %d-byte aligned", who, what, p, align);
}
static void check_out(const char *who, const char *what, const MxOut &o) {
  if (!o.q) return;
  check_ptr(who, what, o.q, 16);
  if (o.fp8 && !o.scale) die("%s: %s: fp8 output without a scale buffer", who, what);
  if (!o.fp8 && !o.e8m0) die("%s: %s: packed output without an e8m0 buffer", who, what);
  if (o.fp8) check_ptr(who, what, o.scale, 4);
}
static void check_shape(const char *who, int rows, int K, int rows_mult) {
  if (rows <= 0 || K <= 0 || K % 32 || rows % rows_mult)
    die("%s: rows = %d, K = %d: need K a positive multiple of 32 and rows a positive multiple of %d", who, rows, K,
        rows_mult);
}

void mx_quantize_rows_cuda(const bf16 *x, int rows, int K, MxScale mode, MxRound rnd, PhiloxStream s, MxOut out) {
  const char *who = "mx_quantize_rows_cuda";
  check_shape(who, rows, K, 1);
  check_ptr(who, "x", x, 16);
  check_out(who, "out", out);
  if (rnd == MX_SR) philox_check_range(who, (uint64_t)rows * K);
  if (!out.q) return;
  const int per_row = (K / 32 + 3) / 4 * 4;  // blocks per row, padded to whole 128-groups
  dim3 grid((per_row + ROWS_THREADS - 1) / ROWS_THREADS, rows < 65535 ? rows : 65535);
  bool sr = rnd == MX_SR;
#define ROWS(O, S) mx_rows_kernel<O, S><<<grid, ROWS_THREADS, 0, cuda_stream()>>>(x, rows, K, mode, s, out)
  if (out.fp8) {
    if (sr) ROWS(OUT_FP8, true);
    else ROWS(OUT_FP8, false);
  } else {
    if (sr) ROWS(OUT_PACKED, true);
    else ROWS(OUT_PACKED, false);
  }
#undef ROWS
  CUDA_CHECK_LAUNCH();
}

void mx_quantize_dual_cuda(const bf16 *x, int rows, int K, MxScale mode, MxRound row_rnd, PhiloxStream s, MxOut row,
                           int hadamard, MxOut col) {
  const char *who = "mx_quantize_dual_cuda";
  check_shape(who, rows, K, 32);
  check_ptr(who, "x", x, 16);
  check_out(who, "row", row);
  check_out(who, "col", col);
  if (row_rnd == MX_SR) philox_check_range(who, (uint64_t)rows * K);
  mx_dual_launch(MxSrcBf16{x, K}, rows, K, mode, row_rnd, s, row, hadamard, col);
}

// The persistent weight kernel: as many CTAs as fit on the GPU at once, at most one per tile.
template <int WOUT, int WTOUT>
static void weight_fp8_kernel_launch(const bf16 *w, int N, int K, MxScale mode, int rule087, MxOut wq, MxOut wtq) {
  const size_t smem = WSTAGE_BYTES + (WTOUT == OUT_FP8 ? TILE * CODE_PITCH : 0);
  CUDA_CHECK(
      cudaFuncSetAttribute(mx_weight_fp8_kernel<WOUT, WTOUT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int dev = 0, sms = 0, per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mx_weight_fp8_kernel<WOUT, WTOUT>, 256, smem));
  const long tiles = (long)((K + TILE - 1) / TILE) * ((N + TILE - 1) / TILE),
             fit = (long)sms * (per_sm > 0 ? per_sm : 1);
  mx_weight_fp8_kernel<WOUT, WTOUT>
      <<<(unsigned)(tiles < fit ? tiles : fit), 256, smem, cuda_stream()>>>(w, N, K, mode, rule087, wq, wtq);
}
static void weight_fp8_launch(const bf16 *w, int N, int K, MxScale mode, int rule087, MxOut wq, MxOut wtq) {
  if (!wq.q) weight_fp8_kernel_launch<OUT_NONE, OUT_FP8>(w, N, K, mode, rule087, wq, wtq);
  else if (!wtq.q) weight_fp8_kernel_launch<OUT_FP8, OUT_NONE>(w, N, K, mode, rule087, wq, wtq);
  else weight_fp8_kernel_launch<OUT_FP8, OUT_FP8>(w, N, K, mode, rule087, wq, wtq);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
static void weight_dispatch(const char *who, const T *w, int N, int K, MxScale mode, int rule087, MxOut wq, MxOut wtq) {
  check_shape(who, N, K, 32);
  check_ptr(who, "w", w, 16);
  check_out(who, "wq", wq);
  check_out(who, "wtq", wtq);
  const int kw = mx_out_kind(wq), kwt = mx_out_kind(wtq);
  if (sizeof(T) == 2 && kw != OUT_PACKED && kwt != OUT_PACKED && kw + kwt > 0) {  // the engine's case
    weight_fp8_launch((const bf16 *)w, N, K, mode, rule087, wq, wtq);
    return;
  }
  dim3 grid((K + TILE - 1) / TILE, (N + TILE - 1) / TILE);
#define WK(A, B) mx_weight_kernel<T, A, B><<<grid, 256, 0, cuda_stream()>>>(w, N, K, mode, rule087, wq, wtq)
  switch (kw * 3 + kwt) {
    case 0:
      return;
    case 1:
      WK(OUT_NONE, OUT_PACKED);
      break;
    case 2:
      WK(OUT_NONE, OUT_FP8);
      break;
    case 3:
      WK(OUT_PACKED, OUT_NONE);
      break;
    case 4:
      WK(OUT_PACKED, OUT_PACKED);
      break;
    case 5:
      WK(OUT_PACKED, OUT_FP8);
      break;
    case 6:
      WK(OUT_FP8, OUT_NONE);
      break;
    case 7:
      WK(OUT_FP8, OUT_PACKED);
      break;
    case 8:
      WK(OUT_FP8, OUT_FP8);
      break;
  }
#undef WK
  CUDA_CHECK_LAUNCH();
}

void mx_quantize_weight_cuda(const float *w, int N, int K, MxScale mode, int rule087, MxOut wq, MxOut wtq) {
  weight_dispatch("mx_quantize_weight_cuda", w, N, K, mode, rule087, wq, wtq);
}
void mx_quantize_weight_bf16_cuda(const bf16 *w, int N, int K, MxScale mode, int rule087, MxOut wq, MxOut wtq) {
  weight_dispatch("mx_quantize_weight_bf16_cuda", w, N, K, mode, rule087, wq, wtq);
}

// One MXFP4 column 32-block per thread: the cases the fused dual producer does not cover (H16, SR on
// the column copy). Blocks run down each column of x [rows, K] and are stored transposed (codes
// [K, rows/2], E8M0 [K, rows/32]), SR bits indexed by the element's place in that [K, rows] tensor.
// Threads of a warp take consecutive columns, so each of the 32 row reads is coalesced.
static __global__ void mx_cols_kernel(const __nv_bfloat16 *x, int rows, int K, MxScale mode, int hadamard, int sr,
                                      PhiloxStream s, uint8_t *codes, uint8_t *e8m0) {
  size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nblk = (size_t)(rows / 32) * K;
  if (t >= nblk) return;
  const int c = (int)(t % K);
  const size_t rb = t / K;
  float v[32];
#pragma unroll
  for (int i = 0; i < 32; i++) v[i] = __bfloat162float(x[(rb * 32 + i) * K + c]);
  mx_rotate32(v, hadamard);
  const size_t i0 = (size_t)c * rows + rb * 32;
  uint32_t rnd[8], pk[4];
  if (sr) {
    philox_group16(s, i0 / 16, rnd);
    philox_group16(s, i0 / 16 + 1, rnd + 4);
  }
  uint8_t b = mx_quantize_block32(v, mode, sr, rnd, pk);
  *(uint4 *)(codes + i0 / 2) = make_uint4(pk[0], pk[1], pk[2], pk[3]);
  e8m0[(size_t)c * (rows / 32) + rb] = b;
}

void mx_quantize_cols_cuda(const __nv_bfloat16 *x, int rows, int K, MxScale mode, int hadamard, MxRound rnd,
                           PhiloxStream s, uint8_t *codes, uint8_t *e8m0) {
  if (rows <= 0 || K <= 0 || rows % 32)
    die("mx_quantize_cols_cuda: rows = %d, K = %d (rows a positive multiple of 32)", rows, K);
  if (hadamard != 0 && hadamard != 16 && hadamard != 32 && hadamard != MX_HADAMARD_H16_PLAIN)
    die("mx_quantize_cols_cuda: hadamard = %d (0, 16, 32 or MX_HADAMARD_H16_PLAIN)", hadamard);
  const size_t n = (size_t)(rows / 32) * K;
  mx_cols_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(x, rows, K, mode, hadamard, rnd == MX_SR, s,
                                                                         codes, e8m0);
  CUDA_CHECK_LAUNCH();
}
