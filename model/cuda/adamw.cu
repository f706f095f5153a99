// model/cuda/adamw.cu: the optimizer's GPU kernels (twin of adamw.c): the AdamW update, which also
// refreshes the BF16 copy of the parameters it updates, the gradient sum of squares, and the
// plain fp32 -> BF16 copy of the parameters. See ops_cuda.h.
#include <math.h>

#include "common/common.h"
#include "model/cuda/ops_cuda.h"

// The update's scalars, formed on the host exactly as adamw.c forms them.
typedef struct {
  float beta2, eps, decay, step_size, bc2_sqrt, one_minus_b1, one_minus_b2, grad_scale;
} AdamScalars;

// One element, with adamw.c's operations in adamw.c's order. The _rn intrinsics keep nvcc from
// fusing multiply-adds (the CPU rounds each product), so the result matches the CPU's bits.
__device__ __forceinline__ float adamw_one(float p, float g, float &m, float &v, const AdamScalars &a) {
  float gi = __fmul_rn(g, a.grad_scale);
  float mi = __fadd_rn(m, __fmul_rn(a.one_minus_b1, __fsub_rn(gi, m)));  // torch's lerp_(g, 1 - beta1)
  float vi = __fadd_rn(__fmul_rn(a.beta2, v), __fmul_rn(__fmul_rn(a.one_minus_b2, gi), gi));
  float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), a.bc2_sqrt), a.eps);
  m = mi, v = vi;
  return __fsub_rn(__fmul_rn(p, a.decay), __fmul_rn(a.step_size, __fdiv_rn(mi, denom)));
}

// Four BF16 in one 8-byte store.
__device__ __forceinline__ void store_bf16x4(bf16 *dst, float4 x) {
  uint2 u;
  __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
  h[0] = __floats2bfloat162_rn(x.x, x.y);
  h[1] = __floats2bfloat162_rn(x.z, x.w);
  *reinterpret_cast<uint2 *>(dst) = u;
}

// Elements [0, 4 * nvec) as float4 (and 4 BF16 of the copy), then the rest one by one.
__global__ void adamw_kernel(float *p, bf16 *p16, const float *g, float *m, float *v, size_t nvec, size_t n,
                             AdamScalars a) {
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = tid; i < nvec; i += stride) {
    float4 pp = reinterpret_cast<float4 *>(p)[i], gg = reinterpret_cast<const float4 *>(g)[i];
    float4 mm = reinterpret_cast<float4 *>(m)[i], vv = reinterpret_cast<float4 *>(v)[i];
    pp.x = adamw_one(pp.x, gg.x, mm.x, vv.x, a);
    pp.y = adamw_one(pp.y, gg.y, mm.y, vv.y, a);
    pp.z = adamw_one(pp.z, gg.z, mm.z, vv.z, a);
    pp.w = adamw_one(pp.w, gg.w, mm.w, vv.w, a);
    reinterpret_cast<float4 *>(p)[i] = pp;
    reinterpret_cast<float4 *>(m)[i] = mm;
    reinterpret_cast<float4 *>(v)[i] = vv;
    if (p16) store_bf16x4(p16 + 4 * i, pp);
  }
  for (size_t i = 4 * nvec + tid; i < n; i += stride) {
    float mi = m[i], vi = v[i];
    p[i] = adamw_one(p[i], g[i], mi, vi, a);
    m[i] = mi, v[i] = vi;
    if (p16) p16[i] = __float2bfloat16_rn(p[i]);
  }
}

static int aligned8(const void *p) { return ((uintptr_t)p & 7) == 0; }

void adamw_update_cuda(float *p, bf16 *p16, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                       float beta2, float eps, float weight_decay, float grad_scale, int64_t t) {
  if (t < 1) die("adamw (cuda): step t must start at 1, got %lld", (long long)t);
  if (!n) return;
  // As adamw.c (torch.optim.AdamW): bias corrections in double, step_size = lr / bc1,
  // denom = sqrt(v) / sqrt(bc2) + eps.
  double bc1 = 1.0 - pow((double)beta1, (double)t), bc2 = 1.0 - pow((double)beta2, (double)t);
  AdamScalars a;
  a.beta2 = beta2, a.eps = eps, a.grad_scale = grad_scale;
  a.step_size = (float)(lr / bc1), a.bc2_sqrt = (float)sqrt(bc2);
  a.decay = 1.0f - lr * weight_decay;
  a.one_minus_b1 = 1.0f - beta1, a.one_minus_b2 = 1.0f - beta2;
  int vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v) && (!p16 || aligned8(p16));
  size_t nvec = vec ? n / 4 : 0;
  const int threads = 256;
  adamw_kernel<<<cuda_grid(nvec ? nvec : n, threads), threads, 0, cuda_stream()>>>(p, p16, g, m, v, nvec, n, a);
  CUDA_CHECK_LAUNCH();
}

// ---- sum of squares -----------------------------------------------------------------------------

enum { SUMSQ_THREADS = 256, SUMSQ_BLOCKS = 1024 };  // fixed: the partition depends on n alone

// Block b writes partial[b]: each thread sums squares in fp32 over its grid-stride elements, the
// block adds its threads in double by a fixed tree.
__global__ void __launch_bounds__(SUMSQ_THREADS) sumsq_kernel(double *partial, const float *g, size_t nvec, size_t n) {
  __shared__ double part[SUMSQ_THREADS];
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  float s = 0.0f;
  for (size_t i = tid; i < nvec; i += stride) {
    float4 x = reinterpret_cast<const float4 *>(g)[i];
    s += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
  }
  for (size_t i = 4 * nvec + tid; i < n; i += stride) s += g[i] * g[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = SUMSQ_THREADS / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = part[0];
}

// out[0] = the sum of partial[0..parts) (parts <= SUMSQ_BLOCKS), by a fixed tree in double.
__global__ void __launch_bounds__(SUMSQ_BLOCKS) sumsq_final_kernel(double *out, const double *partial, int parts) {
  __shared__ double part[SUMSQ_BLOCKS];
  part[threadIdx.x] = (int)threadIdx.x < parts ? partial[threadIdx.x] : 0.0;
  __syncthreads();
  for (int w = SUMSQ_BLOCKS / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = part[0];
}

double grad_sumsq_cuda(CudaBackend *b, const float *g, size_t n) {
  if (!n) return 0.0;
  size_t nvec = aligned16(g) ? n / 4 : 0, work = nvec ? nvec : n;
  size_t blocks = (work + SUMSQ_THREADS - 1) / SUMSQ_THREADS;
  int parts = blocks < SUMSQ_BLOCKS ? (int)blocks : SUMSQ_BLOCKS;
  double *d = (double *)cuda_scratch(b, &b->sumsq, (SUMSQ_BLOCKS + 1) * sizeof(double), "grad_sumsq partial sums");
  sumsq_kernel<<<parts, SUMSQ_THREADS, 0, cuda_stream()>>>(d + 1, g, nvec, n);
  CUDA_CHECK_LAUNCH();
  sumsq_final_kernel<<<1, SUMSQ_BLOCKS, 0, cuda_stream()>>>(d, d + 1, parts);
  CUDA_CHECK_LAUNCH();
  double s = 0;
  cuda_download(b, &s, d, sizeof s);
  return s;
}

// ---- fp32 -> BF16 -------------------------------------------------------------------------------

struct ToBf16 {
  bf16 *dst;
  const float *src;
  template <int W>
  __device__ __forceinline__ void at(size_t i) const {
    if constexpr (W == 4) store_bf16x4(dst + i, *reinterpret_cast<const float4 *>(src + i));
    else dst[i] = __float2bfloat16_rn(src[i]);
  }
};

void f32_to_bf16_cuda(bf16 *dst, const float *src, size_t n) {
  elementwise<4>(ToBf16{dst, src}, n, aligned16(src) && aligned8(dst));
}
