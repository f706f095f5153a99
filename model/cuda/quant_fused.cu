// model/cuda/quant_fused.cu: the fused producers of model/cuda/quant_fused.h: two sources for the dual producer's
// tile (fp4/mx_dual.cuh) that compute RMSNorm's or SwiGLU's BF16 output on the fly.
#include "fp4/mx_dual.cuh"
#include "model/cuda/ops_cuda.h"
#include "model/cuda/quant_fused.h"

static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // the rounding store_vec does
  return *(const uint32_t *)&h;
}

// rmsnorm(x)[row, k] = w[k] * (x[row, k] * rstd[row]), rounded to BF16.
struct MxSrcRmsnorm {
  const bf16 *x;
  const float *rstd, *w;
  int K;
  __device__ __forceinline__ void load(size_t row, int b, uint4 *u) const {
    const uint4 *p = (const uint4 *)(x + row * K + (size_t)b * 32);
    const float4 *wp = (const float4 *)(w + (size_t)b * 32);
    const float r = rstd[row];
#pragma unroll
    for (int c = 0; c < 4; c++) {
      const uint4 in = p[c];
      const float4 w0 = wp[2 * c], w1 = wp[2 * c + 1];
      const uint32_t wd[4] = {in.x, in.y, in.z, in.w};
      const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
      uint32_t o[4];
#pragma unroll
      for (int i = 0; i < 4; i++)
        o[i] =
            pack_bf16x2(rmsnorm_value(bf16_lo(wd[i]), r, wv[2 * i]), rmsnorm_value(bf16_hi(wd[i]), r, wv[2 * i + 1]));
      u[c] = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
};

// swiglu[row, k] = silu(gate[row, k]) * up[row, k], rounded to BF16.
struct MxSrcSwiglu {
  const bf16 *gate, *up;
  int K;
  __device__ __forceinline__ void load(size_t row, int b, uint4 *u) const {
    const uint4 *pg = (const uint4 *)(gate + row * K + (size_t)b * 32),
                *pu = (const uint4 *)(up + row * K + (size_t)b * 32);
#pragma unroll
    for (int c = 0; c < 4; c++) {
      const uint4 g4 = pg[c], u4 = pu[c];
      const uint32_t g[4] = {g4.x, g4.y, g4.z, g4.w}, uu[4] = {u4.x, u4.y, u4.z, u4.w};
      uint32_t o[4];
#pragma unroll
      for (int i = 0; i < 4; i++)
        o[i] = pack_bf16x2(swiglu_value(bf16_lo(g[i]), bf16_lo(uu[i])), swiglu_value(bf16_hi(g[i]), bf16_hi(uu[i])));
      u[c] = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
};

static void check_args(const char *who, int rows, int K, const void *const *ptrs, const char *const *names, int n,
                       const MxOut &row, const MxOut &col) {
  if (rows <= 0 || K <= 0 || rows % 32 || K % 32)
    die("%s: rows = %d, K = %d: need positive multiples of 32", who, rows, K);
  for (int i = 0; i < n; i++)
    if (!ptrs[i] || !aligned16(ptrs[i]))
      die("%s: %s = %p must be a 16-byte aligned device pointer", who, names[i], ptrs[i]);
  const MxOut *outs[2] = {&row, &col};
  for (int i = 0; i < 2; i++)
    if (outs[i]->q && (!aligned16(outs[i]->q) || (outs[i]->fp8 ? !outs[i]->scale : !outs[i]->e8m0)))
      die("%s: %s output: unaligned codes or missing scales", who, i ? "column" : "row");
}

void mx_quantize_dual_rmsnorm_cuda(const bf16 *x, const float *rstd, const float *w, int rows, int K, MxScale mode,
                                   MxOut row, int hadamard, MxOut col) {
  const void *p[3] = {x, rstd, w};
  const char *n[3] = {"x", "rstd", "w"};
  check_args("mx_quantize_dual_rmsnorm_cuda", rows, K, p, n, 3, row, col);
  PhiloxStream none = {};
  mx_dual_launch<MxSrcRmsnorm, false>(MxSrcRmsnorm{x, rstd, w, K}, rows, K, mode, MX_RNE, none, row, hadamard, col);
}

void mx_quantize_dual_swiglu_cuda(const bf16 *gate, const bf16 *up, int rows, int K, MxScale mode, MxOut row,
                                  int hadamard, MxOut col) {
  const void *p[2] = {gate, up};
  const char *n[2] = {"gate", "up"};
  check_args("mx_quantize_dual_swiglu_cuda", rows, K, p, n, 2, row, col);
  PhiloxStream none = {};
  mx_dual_launch<MxSrcSwiglu, false>(MxSrcSwiglu{gate, up, K}, rows, K, mode, MX_RNE, none, row, hadamard, col);
}
