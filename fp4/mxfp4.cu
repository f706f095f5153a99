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
  // FAST: the engine's case (BF16 shadow, FP8 outputs): the blocks stay BF16 words until quantized (half
  // the registers), the amax comes from the pairs, the codes from mx_acc4_bf16 straight into E4M3.
  constexpr bool FAST = sizeof(T) == 2 && WOUT != OUT_PACKED && WTOUT != OUT_PACKED;
  float v[2][32];
  uint32_t raw[2][16];
  bool valid[2];
#pragma unroll
  for (int it = 0; it < 2; it++) {
    int id = threadIdx.x + it * 256, lr = id >> 2, j = id & 3, b = tc * 4 + j;
    size_t row = (size_t)tr * TILE + lr;
    valid[it] = row < (size_t)N && b < nbk;
    if (valid[it]) {
      uint32_t am = 0;
      if constexpr (FAST) {
        load_words32(raw[it], (const bf16 *)w + row * K + (size_t)b * 32);
        am = fp4_f2u(mx_bf16_amax(raw[it]));  // NaN: above MX_NAN_BITS, as the bits' max
      } else {
        load32(v[it], w + row * K + (size_t)b * 32);
#pragma unroll
        for (int i = 0; i < 32; i++) am = max(am, mx_abs_bits(v[it][i]));
      }
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
  __syncthreads();
  const int Et = s_Et;
#pragma unroll
  for (int it = 0; it < 2; it++) {
    if (!valid[it]) continue;
    int id = threadIdx.x + it * 256, lr = id >> 2, j = id & 3, b = tc * 4 + j;
    size_t row = (size_t)tr * TILE + lr;
    uint8_t sb = s_b[lr >> 5][j];
    int e = sb == 0xFF ? 0 : (int)sb - 127;
    if constexpr (FAST) {
      const float c = mx_block_mul(e, mode);
      uint32_t f8[8];
      if (sb != 0xFF && c == 0.0f) {  // MX_SCALE_UP with e < -125: the reference step, then the table
        float t[32];
        uint32_t pk[4] = {0, 0, 0, 0};
        unpack32(t, raw[it]);
        for (int i = 0; i < 32; i++)
          pk[i >> 3] += (e2m1_sign(t[i]) | e2m1_rne_mag(fp4_f2u(mx_prescale(fabsf(t[i]), e, mode)))) << (4 * (i & 7));
        fp8_words(f8, pk, sb, Et);
      } else {  // (a NaN tile: the table gives 0x7F whatever the codes)
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
      if (WTOUT == OUT_FP8) {  // W^T's bytes: see below
        uint4 *dst = (uint4 *)(codes + lr * CODE_PITCH + j * 32);
        dst[0] = make_uint4(f8[0], f8[1], f8[2], f8[3]);
        dst[1] = make_uint4(f8[4], f8[5], f8[6], f8[7]);
      }
      continue;
    }
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
  const int warp = threadIdx.x >> 5, rb = warp >> 1, lc = ((warp & 1) * 32 + (threadIdx.x & 31)) * 2;
  const size_t r0 = (size_t)tr * TILE + rb * 32, col = (size_t)tc * TILE + lc;
  if (r0 >= (size_t)N || col >= (size_t)K) return;
  if (WTOUT == OUT_FP8) {  // columns lc, lc + 1 of the byte tile, 32 rows: 4 rows' byte pairs -> 2 words
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
    return;
  }
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

template <typename T>
static void weight_dispatch(const char *who, const T *w, int N, int K, MxScale mode, int rule087, MxOut wq, MxOut wtq) {
  check_shape(who, N, K, 32);
  check_ptr(who, "w", w, 16);
  check_out(who, "wq", wq);
  check_out(who, "wtq", wtq);
  dim3 grid((K + TILE - 1) / TILE, (N + TILE - 1) / TILE);
#define WK(A, B) mx_weight_kernel<T, A, B><<<grid, 256, 0, cuda_stream()>>>(w, N, K, mode, rule087, wq, wtq)
  switch (mx_out_kind(wq) * 3 + mx_out_kind(wtq)) {
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
