// model/cuda/ops_cuda.h: the CUDA backend. Its operations table (model/ops.h) keeps activations in BF16,
// parameters, gradients and optimizer state in fp32, and a BF16 shadow of the parameters for the
// GEMMs. Every kernel and library call runs on cuda_stream(); the only host syncs are in the ops
// that must hand a value or a check to the host (download, head_ce's loss, grad_sumsq, and the
// token checks of embed_fwd / embed_bwd, which read the N token ids back).
//
// The backend is an instance, CudaBackend: everything it keeps between calls (tracked memory, the
// parameter shadow and W^T copies, the FP4 linear layers' recipe and caches, the cuDNN attention
// graphs, the profiler, the kernels' scratch) lives in it, and its table's ctx points to it.
// Process-wide and shared by every instance on the device: the stream, the SM count and the
// cuBLASLt handle with its plan cache (common/), and the reference GEMM's scratch in fp4/.
//
// The first part is plain C: init and the calls tests make on an instance. The second part,
// compiled only by nvcc, is the backend's internal interface between ops_cuda.cu and the kernel
// files (model/cuda/embedding.cu, rmsnorm.cu, rope.cu, swiglu.cu, residual.cu, crossentropy.cu,
// adamw.cu, each the GPU twin of the .c file of the same name, transpose.cu, and profile.cu).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fp4/recipe.h"
#include "model/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CudaBackend CudaBackend;

// Picks the device, creates the stream (once per process) and a new backend instance. Returns its
// table, or NULL with the CUDA error text in err when there is no usable GPU. Prints nothing.
const Ops *cuda_backend_init(int device, char *err, size_t errlen);
// backend_open's CUDA case (model/ops.h): the device of LOCAL_RANK (modulo the visible devices, when
// the launcher already gave each task its own: Slurm's --gpus-per-task shows every task its GPU as
// device 0), cuda_backend_init, then the options. NULL with the reason in err.
const Ops *cuda_backend_open(const BackendOptions *o, char *err, size_t errlen);
// The instance behind a table from cuda_backend_init; dies when ops is not a CUDA table.
CudaBackend *cuda_backend_of(const Ops *ops);

// Profiling. While enabled, every op of the table records a CUDA event pair around its GPU work
// and adds the elapsed time, a call, the bytes it moves (reads + writes, from its arguments) and
// its FLOPs (GEMMs, attention) to an entry named after the op; GEMMs are named per use and layer
// kind ("gemm fwd q", "gemm dgrad down", "gemm wgrad head"). Timing costs a few microseconds of
// host time per op; results are collected at sync() and in the report.
void cuda_profile_enable(CudaBackend *b, int on);
void cuda_profile_reset(CudaBackend *b);
// One row per entry, by time: calls and milliseconds per step (totals / steps), share of the
// total, achieved TB/s (memory-bound ops) or TFLOP/s (GEMMs, attention), the ceiling and the
// fraction of it. Ceilings: the copy rate measured here (cuda_copy_tbps); for GEMMs gemm_ceiling_tflops at each shape
// the entry ran (measured here, once per shape, so call it outside timed regions); none for
// attention.
void cuda_profile_report(CudaBackend *b, FILE *f, int steps);

// Bytes currently held by the table's allocations (alloc, the BF16 shadow and W^T copies, kernel
// scratch), and the most held at once since the start or the last reset. cuBLASLt's and cuDNN's
// own workspaces are not included.
size_t cuda_mem_used(const CudaBackend *b);
size_t cuda_mem_peak(const CudaBackend *b);
void cuda_mem_reset_peak(CudaBackend *b);

// The BF16 copy of parameter w (a device pointer into the bound parameter buffer); dies if w is
// not inside it. For tests and debugging.
const void *cuda_param_bf16(CudaBackend *b, const float *w);

// Transposed weights for the dgrad GEMM. cuBLASLt runs "TN" GEMMs (both operands contiguous along
// K) 15-20% faster on an H200 than the other layouts, and the forward Y = X W^T is one; the dgrad
// dX = dY W (K = out) is not, W [out, in] being contiguous along in. So matmul_bwd keeps, per
// weight, a BF16 copy of W^T [in, out] and runs dX = dY (W^T)^T, the forward's layout. The copies
// are made lazily: params_changed() and adamw() bump a weights version, and a copy older than it is
// re-transposed from the BF16 shadow ("transpose w" in the profile) at its weight's next dgrad, i.e.
// once per optimizer step per weight, however many micro-batches accumulate.
// Memory: one more BF16 copy of every matrix that goes through matmul_bwd (2 bytes per weight:
// about 14 GB for Llama-3 8B's 7B matrix parameters, not the embedding or the head), allocated at
// each weight's first dgrad and freed when the parameter buffer is released or rebound.
// cuda_set_dgrad_transposed(0) frees them and runs the dgrad on W directly (the "NN" layout,
// profiled as "gemm dgrad <kind> NN"); 1, the default, turns the copies back on.
void cuda_set_dgrad_transposed(CudaBackend *b, int on);
// The up-to-date W^T copy [in, out_dim] of the weight w [out_dim, in] (transposing it now if it is
// stale); dies if w is not inside the bound buffer or was seen before with another shape. For tests.
const void *cuda_param_bf16_transposed(CudaBackend *b, const float *w, int in, int out_dim);

// The precision recipe of the linear layers (fp4/recipe.h; model/cuda/linear_fp4.h has the design): r is
// copied; NULL or a bf16 recipe puts every linear on the BF16 path (the default). n_layers is the
// model's block count (recipe_block_format's BF16 overrides count from both ends), seed the SR seed.
// The head always stays BF16. Dies on a recipe this backend cannot run; drops quantized weights.
// The table's set_step(step, micro) then keys the stochastic rounding on the run's position.
void cuda_set_recipe(CudaBackend *b, const Recipe *r, int n_layers, uint64_t seed);

// Tokens per chunk of head_ce (logits GEMM, softmax, and the two gradient GEMMs). 0 (the default)
// picks it from V: at most 4096 tokens and 4 GiB of scratch. A multiple of 8. For tests.
void cuda_head_ce_set_chunk(CudaBackend *b, int tokens);
// The head's padded vocabulary (model/cuda/crossentropy.cu): V when V % 8 == 0, else the next multiple
// of 128; the head GEMMs run on that many rows of W, the padding's zero rows existing only on the
// device. cuda_head_weight_padded: the BF16 [V_pad, D] weight they read for the head w [V, D] of the
// bound parameters, brought up to date now (w's shadow itself when V is not padded). For tests.
int cuda_head_vocab_padded(int V);
const void *cuda_head_weight_padded(CudaBackend *b, const float *w, int V, int D);
// cuDNN's deterministic attention backward on (1) or off (0, the default; see attention_cudnn.h).
void cuda_set_deterministic_attention(CudaBackend *b, int on);
// The instance's FP4 linear layers (model/cuda/linear_fp4.h), for the tests' switches and counters.
typedef struct LinearFp4 LinearFp4;
LinearFp4 *cuda_linear_fp4(CudaBackend *b);

#ifdef __cplusplus
}
#endif

// ---- internal: shared by the backend's .cu files ------------------------------------------------
#ifdef __CUDACC__
#include <cuda_bf16.h>

#include "common/cuda_common.h"

typedef __nv_bfloat16 bf16;

// A grow-only device buffer for a kernel's scratch: reallocated only when a call needs more.
typedef struct {
  void *p;
  size_t bytes;
} CudaScratch;

typedef struct CudaProfiler CudaProfiler;  // model/cuda/profile.cu
typedef struct ParamMemory ParamMemory;    // model/cuda/param_memory.cu
typedef struct AttnCudnn AttnCudnn;        // model/cuda/attention_cudnn.h

typedef struct {
  void *p;
  size_t bytes;
} CudaAllocation;

// A W^T copy for the dgrad GEMM (see cuda_set_dgrad_transposed).
typedef struct {
  size_t offset;     // of W in the bound parameter buffer: the key, as for the BF16 shadow
  int in, out_dim;   // W is [out_dim, in]
  bf16 *t;           // W^T [in, out_dim]
  uint64_t version;  // CudaBackend.wversion when t was transposed (0: never)
} WeightT;

// The backend instance: its table (ops.ctx == this) and all it keeps between calls.
struct CudaBackend {
  Ops ops;

  // Tracked device memory (cuda_malloc_tracked): every allocation, the bytes held and the peak.
  struct {
    CudaAllocation *v;
    int n, cap;
    size_t used, peak;
  } mem;

  CudaProfiler *prof;
  ParamMemory *pm;  // the parameter buffers of alloc_params
  LinearFp4 *lin;   // the FP4 linear layers
  AttnCudnn *attn;  // cuDNN attention graphs

  // The bound fp32 parameter buffer and its BF16 shadow (bf16(params[i]) at the same index).
  float *params;
  size_t nparams;
  bf16 *shadow;
  uint64_t wversion;  // bumped whenever the shadow may have changed (W^T, FP4 copies)
  // ZeRO-1 sharding (Ops.shard_params): the float ranges whose fp32 values still exist, sorted and
  // disjoint; nkeep < 0 while the buffer is whole. up_stage: device staging for uploads into it.
  size_t *keep_off, *keep_len;
  int nkeep;
  CudaScratch up_stage;
  WeightT *wt;  // W^T copies for the dgrad
  int nwt, capwt;
  int dgrad_transposed;

  int grad_overwrite;  // Ops.set_grad_overwrite
  int head_chunk;      // cuda_head_ce_set_chunk; 0 = automatic
  Ops nvtx_inner;      // the table before cuda_nvtx_wrap, which its NVTX ranges call (model/cuda/nvtx.cu)

  // The kernels' scratch, each named after its file.
  struct {
    CudaScratch logits, dlogits, row_loss, total;
    CudaScratch picked_x, picked_idx;  // head_rows_nll_cuda's gathered rows and their indices
    int *targets_host;
    size_t targets_cap;
    // A padded vocabulary: the padded BF16 weight, copied from pad_src [pad_V, pad_D] at weights
    // version pad_version into pad_buf, and the padded fp32 dW.
    CudaScratch w_pad, dw_pad;
    const bf16 *pad_src;
    const void *pad_buf;
    int pad_V, pad_D;
    uint64_t pad_version;
  } head;  // crossentropy.cu
  struct {
    int *host;
    size_t host_cap;
    CudaScratch buckets;
  } embed;                  // embedding.cu
  CudaScratch rms_partial;  // rmsnorm.cu
  CudaScratch sumsq;        // adamw.cu's grad_sumsq
  bf16 *acts_host;          // acts_to_f32's host staging
  size_t acts_cap;
};

// Tracked device memory: dies naming `what`, the bytes asked for and the free memory on failure.
void *cuda_malloc_tracked(CudaBackend *b, size_t bytes, const char *what);
void cuda_free_tracked(CudaBackend *b, void *p);  // NULL is fine
void *cuda_scratch(CudaBackend *b, CudaScratch *s, size_t bytes, const char *what);

// model/cuda/param_memory.cu: the fp32 parameter buffer (Ops.alloc_params) as a reserved virtual range of
// fixed-size physical chunks, all mapped by alloc (*mapped = bytes of them). keep unmaps every
// chunk that holds no byte of the ranges [off[i], off[i] + len[i]) (bytes from the buffer's start)
// and returns the bytes released; free returns the bytes still mapped before it.
// The buffers are listed in a ParamMemory (one per backend instance).
ParamMemory *param_memory_create(void);
void *param_memory_alloc(ParamMemory *pm, size_t bytes, size_t *mapped);
int param_memory_owns(const ParamMemory *pm, const void *p);
size_t param_memory_keep(ParamMemory *pm, void *p, const size_t *off, const size_t *len, int n);
size_t param_memory_free(ParamMemory *pm, void *p);

// Host <-> device copies on the stream, returning when done (the host buffer is free at once).
// An upload into the bound parameter buffer also writes the BF16 shadow; once the buffer is
// sharded (Ops.shard_params) it writes the fp32 values only where they are kept, and a download
// from it dies unless all of the range is kept.
void cuda_upload(CudaBackend *b, void *dst, const void *src, size_t bytes);
void cuda_download(CudaBackend *b, void *dst, const void *src, size_t bytes);

// Profiling hooks (no-ops while disabled): begin records the start event and returns a mark for
// end, which records the stop event and books the interval to `name`.
typedef enum { PROF_MEM, PROF_GEMM, PROF_ATTN } ProfKind;
// Which ceiling a GEMM entry is measured against: gemm_ceiling_tflops (BF16, the default 0), or
// fp4_gemm_fp8_tflops with a BLK128x128 B (FP4 Fprop/Dgrad, Wgrad with 2D X tiles), both VEC128, or a
// BLK128x128 A (Wgrad with 2D dY tiles), or none.
typedef enum {
  GEMM_ENGINE_BF16 = 0,
  GEMM_ENGINE_FP8_BLK,
  GEMM_ENGINE_FP8_VEC,
  GEMM_ENGINE_NONE,
  GEMM_ENGINE_FP8_ABLK
} GemmEngine;
typedef struct {
  int out_fp32, a_t, b_t, M, N, K;
  int engine;  // GemmEngine
} GemmShape;
CudaProfiler *cuda_profiler_create(void);
void cuda_profiler_destroy(CudaProfiler *p);

// model/cuda/nvtx.cu: logging.nvtx: each op of the instance's table inside an NVTX range named as in
// the per-kernel table, and the table's range_push/range_pop (the graph's block ranges) set.
void cuda_nvtx_wrap(CudaBackend *b);
int cuda_prof_begin(CudaBackend *b);
void cuda_prof_end(CudaBackend *b, int mark, const char *name, ProfKind kind, double bytes, double flops,
                   const GemmShape *shape);
void cuda_prof_collect(CudaBackend *b);  // books the finished intervals (sync() calls it)

// gemm_bf16 (common/gemm.h), booked to the profile entry `name`.
void cuda_gemm(CudaBackend *b, const char *name, void *out, int out_fp32, const void *A, int a_t, const void *B,
               int b_t, int M, int N, int K, float alpha, float beta);

// ---- the kernels' host entry points (typed twins of the CPU references in ops.h) ----
// model/cuda/embedding.cu. Both read the N token ids back to the host: forward to check them (dies on
// an id outside [0, V)), backward to group the positions by token, so each table row is summed by
// one CTA in position order (deterministic, no atomics). Backward returns the distinct-token count.
void embedding_forward_cuda(CudaBackend *b, bf16 *out, const int *tokens, const float *table, int N, int D, int V);
// The same from a BF16 table (the parameters' shadow: bf16(table) is what the fp32 form writes).
void embedding_forward_bf16_cuda(CudaBackend *b, bf16 *out, const int *tokens, const bf16 *table, int N, int D, int V);
int embedding_backward_cuda(CudaBackend *b, float *dtable, const bf16 *dout, const int *tokens, int N, int D);

// model/cuda/rmsnorm.cu. D must be a multiple of 8 (16-byte rows) and at most 32768. out NULL: rstd only
// (the fused FP4 producers of quant_fused.cu make the output inside the quantizer).
void rmsnorm_forward_cuda(bf16 *out, float *rstd, const bf16 *x, const float *w, int N, int D, float eps);
// Returns the number of per-CTA partial rows of dw (for the profiler's byte count).
// dw_overwrite: dw = ... instead of dw += ... (Ops.set_grad_overwrite).
int rmsnorm_backward_cuda(CudaBackend *b, bf16 *dx, float *dw, const bf16 *dout, const bf16 *x, const float *w,
                          const float *rstd, int N, int D, int dw_overwrite);

// model/cuda/rope.cu: rotates by +angle (sign 1) or -angle (sign -1), in place. pos [B*T] (device):
// each token's position (Ops.rope_fwd), NULL: n % T.
void rope_rotate_cuda(bf16 *x, const float *cos_t, const float *sin_t, const int *pos, int B, int T, int n_heads,
                      int hd, int sign);

// model/cuda/swiglu.cu, model/cuda/residual.cu
void swiglu_forward_cuda(bf16 *out, const bf16 *gate, const bf16 *up, size_t n);
void swiglu_backward_cuda(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up, size_t n);
void residual_forward_cuda(bf16 *out, const bf16 *a, const bf16 *b, size_t n);

// model/cuda/crossentropy.cu: ops.h's head_ce with the BF16 weight w16 [V, D] (the shadow: a padded
// vocabulary's copy is refreshed by the weights version). See the file for the chunking, its memory
// and the padding.
float head_crossentropy_cuda(CudaBackend *b, bf16 *dx, float *dw, const bf16 *x, const bf16 *w16, const int *targets,
                             int N, int D, int V, int ignore_index, float dloss, int chunk_tokens, int dw_overwrite);
// ops.h's head_nll: the loss of rows[i] of x for targets[i], i < n (host arrays), through the head
// for those rows only (gathered on the device).
void head_rows_nll_cuda(CudaBackend *b, float *nll_host, const bf16 *x, const bf16 *w16, const int *rows,
                        const int *targets, int n, int D, int V, int chunk_tokens);
// The head's logits out [N, V] = x W^T (BF16) when V is padded (the GEMM cannot write rows of V).
void head_logits_cuda(CudaBackend *b, bf16 *out, const bf16 *x, const bf16 *w16, int N, int D, int V);

// model/cuda/transpose.cu: dst [cols, rows] = src [rows, cols]^T; rows, cols multiples of 8, pointers
// 16-byte aligned, no aliasing.
void transpose_bf16_cuda(bf16 *dst, const bf16 *src, int rows, int cols);

// model/cuda/adamw.cu. adamw_update_cuda also writes bf16(p) into p16 when p16 is not NULL.
void adamw_update_cuda(float *p, bf16 *p16, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                       float beta2, float eps, float weight_decay, float grad_scale, int64_t t);
double grad_sumsq_cuda(CudaBackend *b, const float *g, size_t n);  // synchronizes to return
void f32_to_bf16_cuda(bf16 *dst, const float *src, size_t n);

// ---- device helpers: 16-byte vectors of 8 BF16 or 4 fp32, fp32 math -----------------------------
// The elementwise outputs of RMSNorm and SwiGLU, shared by their kernels and by the fused FP4 producers
// (model/cuda/quant_fused.cu), which compute the same BF16 values inside the quantizer: one definition, the
// same bits either way.
__device__ __forceinline__ float rmsnorm_value(float x, float r, float w) { return w * (x * r); }      // HF's order
__device__ __forceinline__ float swiglu_value(float g, float u) { return g / (1.0f + expf(-g)) * u; }  // torch's silu
// SwiGLU's backward for one element (swiglu.cu's kernel): d silu/dg = sig + g sig (1 - sig).
__device__ __forceinline__ void swiglu_bwd_value(float d, float g, float u, float *dg, float *du) {
  const float sig = 1.0f / (1.0f + expf(-g));
  *dg = d * u * sig * (1.0f + g * (1.0f - sig));
  *du = d * (g * sig);
}

static inline int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// The skeleton of the elementwise kernels: f.at<W>(i) handles elements [i, i + W). Elements
// [0, W * nvec) go as vectors of W (16-byte accesses), the rest (or everything, when `vectors` is 0
// because a pointer is misaligned) one by one; grid-stride loops, each element read and written by
// one thread (so an output may alias an input).
template <int W, typename F>
__global__ void elementwise_kernel(F f, size_t nvec, size_t n) {
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t v = tid; v < nvec; v += stride) f.template at<W>(W * v);
  for (size_t i = W * nvec + tid; i < n; i += stride) f.template at<1>(i);
}

template <int W, typename F>
static void elementwise(const F &f, size_t n, int vectors) {
  if (!n) return;
  const size_t nvec = vectors ? n / W : 0;
  const int threads = 256;
  elementwise_kernel<W><<<cuda_grid(nvec ? nvec : n, threads), threads, 0, cuda_stream()>>>(f, nvec, n);
  CUDA_CHECK_LAUNCH();
}

// VEC consecutive elements <-> floats. VEC is 8 (one 16-byte access for BF16, two for fp32) or 1.
template <int VEC>
__device__ __forceinline__ void load_vec(float *f, const bf16 *p) {
  if constexpr (VEC == 8) {
    uint4 u = *reinterpret_cast<const uint4 *>(p);
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) {
      float2 t = __bfloat1622float2(h[k]);
      f[2 * k] = t.x, f[2 * k + 1] = t.y;
    }
  } else {
#pragma unroll
    for (int k = 0; k < VEC; k++) f[k] = __bfloat162float(p[k]);
  }
}

template <int VEC>
__device__ __forceinline__ void store_vec(bf16 *p, const float *f) {
  if constexpr (VEC == 8) {
    uint4 u;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    *reinterpret_cast<uint4 *>(p) = u;
  } else {
#pragma unroll
    for (int k = 0; k < VEC; k++) p[k] = __float2bfloat16_rn(f[k]);
  }
}

template <int VEC>
__device__ __forceinline__ void load_vec(float *f, const float *p) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int k = 0; k < VEC; k += 4) {
      float4 t = *reinterpret_cast<const float4 *>(p + k);
      f[k] = t.x, f[k + 1] = t.y, f[k + 2] = t.z, f[k + 3] = t.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < VEC; k++) f[k] = p[k];
  }
}

template <int VEC>
__device__ __forceinline__ void store_vec(float *p, const float *f) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int k = 0; k < VEC; k += 4)
      *reinterpret_cast<float4 *>(p + k) = make_float4(f[k], f[k + 1], f[k + 2], f[k + 3]);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; k++) p[k] = f[k];
  }
}

// For elementwise: out = fn(a, b) in fp32, rounded once to BF16 (fn: a functor of two floats).
template <typename Fn>
struct Binary {
  bf16 *out;
  const bf16 *a, *b;
  Fn fn;
  template <int VEC>
  __device__ __forceinline__ void at(size_t i) const {
    float x[VEC], y[VEC];
    load_vec<VEC>(x, a + i);
    load_vec<VEC>(y, b + i);
#pragma unroll
    for (int k = 0; k < VEC; k++) x[k] = fn(x[k], y[k]);
    store_vec<VEC>(out + i, x);
  }
};

// Sums over a warp / a block, the same bits in every thread (butterflies add the same pairs in
// every lane), in a fixed order: deterministic. block_sum needs blockDim.x a multiple of 32 and
// every thread of the block to call it.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call's readers are done with part[]
  if (lane == 0) part[warp] = v;
  __syncthreads();
  return warp_sum(lane < nwarps ? part[lane] : 0.0f);
}
#endif  // __CUDACC__
