// model/cuda/residual.cu: the residual add on the GPU, out = a + b in fp32, rounded once (twin of
// residual.c). See ops_cuda.h. out may alias a: each element is read and written by one thread.
#include "common/common.h"
#include "model/cuda/ops_cuda.h"

struct Add {
  __device__ __forceinline__ float operator()(float x, float y) const { return x + y; }
};

void residual_forward_cuda(bf16 *out, const bf16 *a, const bf16 *b, size_t n) {
  elementwise<8>(Binary<Add>{out, a, b, Add{}}, n, aligned16(out) && aligned16(a) && aligned16(b));
}
