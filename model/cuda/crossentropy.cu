// model/cuda/crossentropy.cu: the BF16 output head fused with the cross-entropy loss on the GPU (twin of
// crossentropy.c). See ops_cuda.h.
//
// Tokens go through in chunks of C: logits [C, V] = x W^T as fp32 (cuBLASLt, BF16 operands), then
// one CTA per row takes the max and the sum of exponentials in one online pass, writes the row's
// loss, and (for the backward) writes dlogits = dloss/n_valid * (softmax - onehot) as BF16 for
// the two gradient GEMMs: dx[C, D] = dlogits W (overwrite), dW += dlogits^T x (fp32).
//
// Memory (grow-only scratch, kept between calls): C*V*4 bytes of fp32 logits, plus C*V*2 of BF16
// dlogits once a backward has run, plus 4 bytes per token. C is 4096 tokens unless 6*C*V would
// pass 4 GiB: at V = 128256, C = 4096 and the scratch is 2.1 GB + 1.05 GB. Big chunks matter: each
// chunk's wgrad reads and writes all of the fp32 dW (2.1 GB at 8B shapes), and the GEMMs need
// thousands of rows to run near their ceiling.
//
// The host reads the N targets once (one sync), to count the valid ones (the gradient scale
// needs the count before the first chunk) and to die on an out-of-range target as the CPU does;
// the per-token losses are summed on the device in a fixed order and read back once at the end.
//
// The padded vocabulary (docs/architecture.md "The output head"): cuBLASLt's BF16 GEMMs want every
// stored row 16-byte aligned, so a row of V logits needs V % 8 == 0. Any other V (GPT-2's 50,257)
// runs on a head of V_pad = the next multiple of HEAD_VOCAB_MULTIPLE rows, as Megatron pads its
// vocabulary (make_vocab_size_divisible_by): a device copy of W with zero rows after the V real
// ones, logits and dlogits rows of V_pad columns, and a padded fp32 dW whose extra rows are dropped.
// The softmax reads only the V real columns (the padding's logits count in no max, sum, loss or
// nll) and writes 0 as their dlogits. The parameters, gradients, optimizer state and checkpoints
// keep exactly V rows: the padding exists only here. V % 8 == 0 (Llama-3's 128,256, every preset)
// is not padded and runs as before.
#include <math.h>
#include <stdlib.h>

#include "common/common.h"
#include "model/cuda/ops_cuda.h"

enum { CE_THREADS = 512, SUM_THREADS = 1024 };
static const double CE_SCRATCH_BYTES = 4.0 * 1073741824.0;  // bound on 6 * C * V
static const int CE_MAX_CHUNK = 4096;
enum { HEAD_VOCAB_MULTIPLE = 128 };  // Megatron's default make_vocab_size_divisible_by (no tensor parallelism)

int cuda_head_vocab_padded(int V) {
  return V % 8 == 0 ? V : (V + HEAD_VOCAB_MULTIPLE - 1) / HEAD_VOCAB_MULTIPLE * HEAD_VOCAB_MULTIPLE;
}

// Merges a (max, sum of exp(x - max)) pair into (m, s); a pair with max -inf is empty. Symmetric
// in its arguments, so butterfly shuffles leave the same bits in every lane.
__device__ __forceinline__ void merge_max_sum(float &m, float &s, float m2, float s2) {
  float M = fmaxf(m, m2);
  if (M == -INFINITY) return;
  s = (m == -INFINITY ? 0.0f : s * expf(m - M)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - M));
  m = M;
}

__device__ __forceinline__ void warp_max_sum(float &m, float &s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge_max_sum(m, s, m2, s2);
  }
}

// Row r of the chunk: loss and, when dlogits is not NULL, d(loss)/d(logits) scaled by g. Rows hold Vp
// columns (the padded vocabulary), of which the first V are real: the rest are read as -inf (a vector
// that starts below V has a real first element, so the running max stays finite) and get dlogits 0.
__global__ void __launch_bounds__(CE_THREADS)
    crossentropy_kernel(const float *logits, bf16 *dlogits, float *row_loss, const int *targets, int V, int Vp,
                        int ignore_index, float g) {
  __shared__ float sm[32], ss[32];
  const size_t row = blockIdx.x;
  const float *lg = logits + row * Vp;
  const int tgt = targets[row];
  float m = -INFINITY, s = 0.0f;
  for (int i = threadIdx.x * 8; i < V; i += blockDim.x * 8) {
    float f[8];
    load_vec<8>(f, lg + i);
#pragma unroll
    for (int k = 0; k < 8; k++) f[k] = i + k < V ? f[k] : -INFINITY;
    float vm = f[0];
#pragma unroll
    for (int k = 1; k < 8; k++) vm = fmaxf(vm, f[k]);
    if (vm > m) {  // rescale the running sum to the new max
      s *= expf(m - vm);
      m = vm;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) s += expf(f[k] - m);
  }
  warp_max_sum(m, s);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sm[warp] = m, ss[warp] = s;
  __syncthreads();
  m = lane < (int)(blockDim.x >> 5) ? sm[lane] : -INFINITY;
  s = lane < (int)(blockDim.x >> 5) ? ss[lane] : 0.0f;
  warp_max_sum(m, s);
  const float lse = m + logf(s);
  if (threadIdx.x == 0) row_loss[row] = tgt == ignore_index ? 0.0f : lse - lg[tgt];
  if (!dlogits) return;
  const float gr = tgt == ignore_index ? 0.0f : g;  // ignored rows get zero gradient
  bf16 *d = dlogits + row * Vp;
  for (int i = threadIdx.x * 8; i < Vp; i += blockDim.x * 8) {
    float f[8];
    load_vec<8>(f, lg + i);
#pragma unroll
    for (int k = 0; k < 8; k++) f[k] = i + k < V ? expf(f[k] - lse) * gr - (i + k == tgt ? gr : 0.0f) : 0.0f;
    store_vec<8>(d + i, f);
  }
}

// *out = sum of x[0..n) in double: thread t adds a contiguous slice in order, then a fixed tree.
__global__ void __launch_bounds__(SUM_THREADS) sum_kernel(double *out, const float *x, int n) {
  __shared__ double part[SUM_THREADS];
  const int per = (n + SUM_THREADS - 1) / SUM_THREADS, lo = threadIdx.x * per, hi = min(n, lo + per);
  double s = 0;
  for (int i = lo; i < hi; i++) s += x[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = SUM_THREADS / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = part[0];
}

// Tokens per chunk: `forced` if set, else the largest multiple of 8 within CE_MAX_CHUNK and the
// scratch bound; never more than N.
static int chunk_tokens(int N, int V, int forced) {
  int c = forced;
  if (!c) {
    double fit = CE_SCRATCH_BYTES / (6.0 * V);
    c = fit > CE_MAX_CHUNK ? CE_MAX_CHUNK : (int)fit / 8 * 8;
    if (c < 8) c = 8;
  }
  return c < N ? c : N;
}

// The host staging for N targets or indices (grow-only).
static int *host_ints(CudaBackend *b, size_t n) {
  if (b->head.targets_cap < n) {
    free(b->head.targets_host);
    b->head.targets_host = (int *)xmalloc(n * sizeof(int));
    b->head.targets_cap = n;
  }
  return b->head.targets_host;
}

// The head weight the GEMMs read: w16 [V, D] itself, or for a padded vocabulary its device copy
// [V_pad, D] with zero rows after the V real ones, copied again whenever the weights version moved
// (adamw, params_changed: once per optimizer step) or another weight is asked for.
static const bf16 *head_weight(CudaBackend *b, const bf16 *w16, int V, int D) {
  const int Vp = cuda_head_vocab_padded(V);
  if (Vp == V) return w16;
  bf16 *p = (bf16 *)cuda_scratch(b, &b->head.w_pad, (size_t)Vp * D * sizeof(bf16), "head padded BF16 weight");
  if (b->head.pad_src != w16 || b->head.pad_buf != p || b->head.pad_V != V || b->head.pad_D != D ||
      b->head.pad_version != b->wversion) {
    int mk = cuda_prof_begin(b);
    CUDA_CHECK(cudaMemcpyAsync(p, w16, (size_t)V * D * sizeof(bf16), cudaMemcpyDeviceToDevice, cuda_stream()));
    CUDA_CHECK(cudaMemsetAsync(p + (size_t)V * D, 0, (size_t)(Vp - V) * D * sizeof(bf16), cuda_stream()));
    cuda_prof_end(b, mk, "head pad w", PROF_MEM, 4.0 * V * D + 2.0 * (Vp - V) * D, 0, NULL);
    b->head.pad_src = w16, b->head.pad_buf = p, b->head.pad_V = V, b->head.pad_D = D;
    b->head.pad_version = b->wversion;
  }
  return p;
}

const void *cuda_head_weight_padded(CudaBackend *b, const float *w, int V, int D) {
  return head_weight(b, (const bf16 *)cuda_param_bf16(b, w), V, D);
}

// The chunked head over N rows of x: logits per chunk, each row's loss into the returned device
// buffer [N], and with dx the two gradient GEMMs (g: each counted target's d(loss)). Padded V: the
// GEMMs run on V_pad columns (head_weight), and dW goes through an fp32 [V_pad, D] copy that starts as
// dw (unless overwritten) and whose first V rows return to dw at the end: the same additions, in the
// same order, as unpadded.
static float *head_chunks(CudaBackend *b, bf16 *dx, float *dw, const bf16 *x, const bf16 *w16, const int *targets,
                          int N, int D, int V, int ignore_index, float g, int forced_chunk, int dw_overwrite) {
  if (N <= 0 || D <= 0 || V <= 0 || N % 8 || D % 8)
    die("head_ce (cuda): N=%d tokens and D=%d must be positive multiples of 8, V=%d positive (cuBLASLt BF16 GEMM "
        "shapes; V is padded)",
        N, D, V);
  const int Vp = cuda_head_vocab_padded(V), C = chunk_tokens(N, Vp, forced_chunk);
  const bf16 *wp = head_weight(b, w16, V, D);
  float *logits = (float *)cuda_scratch(b, &b->head.logits, (size_t)C * Vp * sizeof(float), "head_ce fp32 logits");
  bf16 *dlogits =
      dx ? (bf16 *)cuda_scratch(b, &b->head.dlogits, (size_t)C * Vp * sizeof(bf16), "head_ce BF16 dlogits") : NULL;
  float *row_loss = (float *)cuda_scratch(b, &b->head.row_loss, (size_t)N * sizeof(float), "head_ce per-token losses");
  cudaStream_t s = cuda_stream();
  float *dwp = dw;
  if (dw && Vp != V) {
    dwp = (float *)cuda_scratch(b, &b->head.dw_pad, (size_t)Vp * D * sizeof(float), "head_ce padded fp32 dW");
    if (!dw_overwrite) CUDA_CHECK(cudaMemcpyAsync(dwp, dw, (size_t)V * D * sizeof(float), cudaMemcpyDeviceToDevice, s));
    CUDA_CHECK(cudaMemsetAsync(dwp + (size_t)V * D, 0, (size_t)(Vp - V) * D * sizeof(float), s));
  }
  for (int n0 = 0; n0 < N; n0 += C) {
    const int nc = N - n0 < C ? N - n0 : C;
    const bf16 *xc = x + (size_t)n0 * D;
    cuda_gemm(b, "gemm fwd head", logits, 1, xc, 0, wp, 1, nc, Vp, D, 1.0f, 0.0f);
    int mk = cuda_prof_begin(b);
    crossentropy_kernel<<<nc, CE_THREADS, 0, s>>>(logits, dlogits, row_loss + n0, targets + n0, V, Vp, ignore_index, g);
    CUDA_CHECK_LAUNCH();
    cuda_prof_end(b, mk, "head softmax", PROF_MEM, (double)nc * Vp * (dlogits ? 10 : 4) + 8.0 * nc, 0, NULL);
    if (!dx) continue;
    cuda_gemm(b, "gemm dgrad head", dx + (size_t)n0 * D, 0, dlogits, 0, wp, 0, nc, D, Vp, 1.0f, 0.0f);
    const float beta = dw_overwrite && n0 == 0 ? 0.0f : 1.0f;  // the first chunk writes, the rest add
    if (dw) cuda_gemm(b, "gemm wgrad head", dwp, 1, dlogits, 1, xc, 0, Vp, D, nc, 1.0f, beta);
  }
  if (dwp != dw) CUDA_CHECK(cudaMemcpyAsync(dw, dwp, (size_t)V * D * sizeof(float), cudaMemcpyDeviceToDevice, s));
  return row_loss;
}

float head_crossentropy_cuda(CudaBackend *b, bf16 *dx, float *dw, const bf16 *x, const bf16 *w16, const int *targets,
                             int N, int D, int V, int ignore_index, float dloss, int forced_chunk, int dw_overwrite) {
  if (N <= 0) die("head_ce (cuda): N=%d tokens must be positive", N);
  int *tg = host_ints(b, N), count = 0;
  cuda_download(b, tg, targets, (size_t)N * sizeof(int));
  for (int n = 0; n < N; n++) {
    if (tg[n] == ignore_index) continue;
    if (tg[n] < 0 || tg[n] >= V)
      die("cross-entropy: target id %d at position %d is outside [0, %d) and is not ignore_index %d", tg[n], n, V,
          ignore_index);
    count++;
  }
  // The loss is a mean over counted targets, so each one's d(loss) is dloss / count.
  const float g = count ? dloss / count : 0.0f;
  float *row_loss = head_chunks(b, dx, dw, x, w16, targets, N, D, V, ignore_index, g, forced_chunk, dw_overwrite);
  double *total = (double *)cuda_scratch(b, &b->head.total, sizeof(double), "head_ce loss sum");
  sum_kernel<<<1, SUM_THREADS, 0, cuda_stream()>>>(total, row_loss, N);
  CUDA_CHECK_LAUNCH();
  double sum = 0;
  cuda_download(b, &sum, total, sizeof sum);
  return count ? (float)(sum / count) : 0.0f;
}

// out [n, V] = the first V of each row's Vp columns (BF16; out's rows need not be aligned).
__global__ void unpad_rows_kernel(bf16 *out, const bf16 *in, int n, int V, int Vp) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)n * V; i += (size_t)gridDim.x * blockDim.x)
    out[i] = in[(i / V) * Vp + i % V];
}

// The head's logits out [N, V] (BF16) = x W^T for a padded vocabulary (Ops.matmul_fwd of the head,
// llama_logits): the GEMM on the padded weight into a [N8, V_pad] scratch, N8 = N rounded up to 8 rows
// (x's rows copied with zero rows after them), then the V real columns of the first N rows.
void head_logits_cuda(CudaBackend *b, bf16 *out, const bf16 *x, const bf16 *w16, int N, int D, int V) {
  if (N <= 0 || D <= 0 || D % 8 || V <= 0) die("head logits (cuda): N=%d, D=%d (a multiple of 8), V=%d", N, D, V);
  const int Vp = cuda_head_vocab_padded(V), N8 = (N + 7) / 8 * 8;
  const bf16 *wp = head_weight(b, w16, V, D);
  bf16 *xs = (bf16 *)cuda_scratch(b, &b->head.picked_x, (size_t)N8 * D * sizeof(bf16), "head logits rows");
  bf16 *ls = (bf16 *)cuda_scratch(b, &b->head.dlogits, (size_t)N8 * Vp * sizeof(bf16), "head logits padded");
  CUDA_CHECK(cudaMemcpyAsync(xs, x, (size_t)N * D * sizeof(bf16), cudaMemcpyDeviceToDevice, cuda_stream()));
  CUDA_CHECK(cudaMemsetAsync(xs + (size_t)N * D, 0, (size_t)(N8 - N) * D * sizeof(bf16), cuda_stream()));
  cuda_gemm(b, "gemm fwd head", ls, 0, xs, 0, wp, 1, N8, Vp, D, 1.0f, 0.0f);
  const int threads = 256;
  unpad_rows_kernel<<<cuda_grid((size_t)N * V, threads), threads, 0, cuda_stream()>>>(out, ls, N, V, Vp);
  CUDA_CHECK_LAUNCH();
}

// xg[i] = x[rows[i]], one CTA per gathered row, 16-byte copies (D is a multiple of 8).
__global__ void gather_rows_kernel(bf16 *xg, const bf16 *x, const int *rows, int D) {
  const uint4 *src = (const uint4 *)(x + (size_t)rows[blockIdx.x] * D);
  uint4 *dst = (uint4 *)(xg + (size_t)blockIdx.x * D);
  for (int i = threadIdx.x; i < D / 8; i += blockDim.x) dst[i] = src[i];
}

// The rows and targets are the caller's (host, checked by llama_token_nll): one upload of both, the
// gather, the head, one download of the n losses; no count, no sum.
void head_rows_nll_cuda(CudaBackend *b, float *nll_host, const bf16 *x, const bf16 *w16, const int *rows,
                        const int *targets, int n, int D, int V, int chunk_tokens) {
  if (n <= 0) return;
  if (D % 8) die("head_nll (cuda): D=%d must be a multiple of 8", D);
  const int np = (n + 7) / 8 * 8;  // the head GEMM wants multiples of 8 rows: padding rows score nothing
  int *idx = host_ints(b, (size_t)2 * np);
  for (int i = 0; i < np; i++) idx[i] = i < n ? rows[i] : rows[0], idx[np + i] = i < n ? targets[i] : -1;
  int *didx = (int *)cuda_scratch(b, &b->head.picked_idx, (size_t)2 * np * sizeof(int), "head_nll row indices");
  bf16 *xg = (bf16 *)cuda_scratch(b, &b->head.picked_x, (size_t)np * D * sizeof(bf16), "head_nll gathered rows");
  cuda_upload(b, didx, idx, (size_t)2 * np * sizeof(int));
  int mk = cuda_prof_begin(b);
  gather_rows_kernel<<<np, 128, 0, cuda_stream()>>>(xg, x, didx, D);
  CUDA_CHECK_LAUNCH();
  cuda_prof_end(b, mk, "head gather", PROF_MEM, 4.0 * np * D, 0, NULL);
  float *row_loss = head_chunks(b, NULL, NULL, xg, w16, didx + np, np, D, V, -1, 0.0f, chunk_tokens, 0);
  cuda_download(b, nll_host, row_loss, (size_t)n * sizeof(float));
}
