// model/cuda/swiglu.cu: the SwiGLU gate silu(gate) * up on the GPU, elementwise in fp32 (twin of
// swiglu.c). See ops_cuda.h. Vectors of 8 BF16 (16-byte accesses) when every pointer allows,
// then the n % 8 tail (or everything, for misaligned pointers) one element at a time.
#include "common/common.h"
#include "model/cuda/ops_cuda.h"

struct Swiglu {
  __device__ __forceinline__ float operator()(float g, float u) const { return swiglu_value(g, u); }
};

struct SwigluBwd {
  bf16 *dgate, *dup;
  const bf16 *dout, *gate, *up;
  template <int VEC>
  __device__ __forceinline__ void at(size_t i) const {
    float d[VEC], g[VEC], u[VEC], dg[VEC], du[VEC];
    load_vec<VEC>(d, dout + i);
    load_vec<VEC>(g, gate + i);
    load_vec<VEC>(u, up + i);
#pragma unroll
    for (int k = 0; k < VEC; k++) swiglu_bwd_value(d[k], g[k], u[k], &dg[k], &du[k]);
    store_vec<VEC>(dgate + i, dg);
    store_vec<VEC>(dup + i, du);
  }
};

void swiglu_forward_cuda(bf16 *out, const bf16 *gate, const bf16 *up, size_t n) {
  elementwise<8>(Binary<Swiglu>{out, gate, up, Swiglu{}}, n, aligned16(out) && aligned16(gate) && aligned16(up));
}

void swiglu_backward_cuda(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up, size_t n) {
  elementwise<8>(SwigluBwd{dgate, dup, dout, gate, up}, n,
                 aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) && aligned16(up));
}
