// fp4/gemm_fp8_select.cu: the FP8-embedded GEMM on the faster of its two kernels, chosen once per
// shape (fp4/gemm_fp4.h's fp4_gemm_fp8_on).
//
// At a shape's first call under FP8_KERNEL_TUNED both kernels run on that call's own operands, into
// scratch copies of out (so an accumulating Wgrad is not added to twice): cuBLASLt's block-scaled
// GEMM (its own algorithm already chosen by lt_tune) and each configuration of our wgmma kernel. A
// configuration is eligible only if its result has exactly cuBLASLt's bits; the fastest eligible one
// is kept if it beats cuBLASLt. So the choice, which depends on timings that vary from run to run,
// never changes a result: training stays bit-identical run to run and across resumes whichever wins.
// Everything else (no sm_90 device, a shape our kernel refuses, GEMM_AUTOTUNE=0, no memory for the
// copies) keeps cuBLASLt and records why.
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "common/lt_tune.h"
#include "fp4/gemm_fp4.h"

namespace {

constexpr int MAX_CHOICES = 512;  // distinct GEMM shapes of a run: a dozen per model

struct Cache {
  Fp8Choice c[MAX_CHOICES];
  int n;
};
Cache g_cache;  // the process's choices, like lt_tune's plan cache

__global__ void count_diff_kernel(const uint32_t *a, const uint32_t *b, size_t n, unsigned long long *diff) {
  unsigned long long d = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    d += a[i] != b[i];
  if (d) atomicAdd(diff, d);  // a count: the order of the additions does not matter
}

// Words of two device buffers that differ (bytes a multiple of 4; syncs).
unsigned long long count_diff(const void *a, const void *b, size_t bytes, unsigned long long *d_diff) {
  CUDA_CHECK(cudaMemsetAsync(d_diff, 0, sizeof *d_diff, cuda_stream()));
  count_diff_kernel<<<cuda_grid(bytes / 4, 256), 256, 0, cuda_stream()>>>((const uint32_t *)a, (const uint32_t *)b,
                                                                          bytes / 4, d_diff);
  CUDA_CHECK_LAUNCH();
  unsigned long long h = 0;
  CUDA_CHECK(cudaMemcpyAsync(&h, d_diff, sizeof h, cudaMemcpyDeviceToHost, cuda_stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  return h;
}

// The candidates timed at a shape's first call: 0 cuBLASLt into ref, i > 0 our configuration cfg[i]
// into got (scratch copies: an accumulating one keeps adding, the time is the same).
struct Timed {
  void *ref, *got;
  int out_fp32, M, N, K;
  Fp8Operand A, B;
  float alpha, beta;
  Fp4WgmmaCfg cfg[16];
};
int run_timed(void *ctx, int i) {
  const Timed *t = (const Timed *)ctx;
  if (i == 0) fp4_gemm_fp8(t->ref, t->out_fp32, t->A, t->B, t->M, t->N, t->K, t->alpha, t->beta);
  else fp4_gemm_wgmma_cfg(t->got, t->out_fp32, t->A, t->B, t->M, t->N, t->K, t->alpha, t->beta, t->cfg[i]);
  return 0;
}

// Fills c (key fields set) by timing both kernels on this call's operands; out is only read.
void choose(Fp8Choice *c, const void *out, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K, float alpha,
            float beta) {
  c->own = 0, c->ms_lt = c->ms_own = 0, c->why = NULL;
  if (!fp4_gemm_wgmma_available()) return void(c->why = "no sm_90 device for our kernel");
  const char *no = fp4_gemm_wgmma_unsupported(A, B, M, N, K);
  if (no) return void(c->why = no);
  if (!lt_context()->autotune) return void(c->why = "GEMM_AUTOTUNE=0: no timing, cuBLASLt");
  // Not fp4_gemm_fp8_supported: it caches untimed plans (heuristic #0) that the real call would then
  // find, so cuBLASLt would lose its own tuning. Its one documented refusal is a partial last K block.
  if (K % 128) return void(c->why = "K is not a multiple of 128: cuBLASLt, as without tuning");
  const size_t bytes = (size_t)M * N * (out_fp32 ? 4 : 2);
  // the copies sit at out's offset from a 256-byte boundary: cuBLASLt keys its plan (and algorithm) on
  // the pointers' alignment, so the bits compared are those the real call gets
  const size_t shift = (uintptr_t)out & 255;
  uint8_t *ref_base = NULL, *got_base = NULL;
  unsigned long long *d_diff = NULL;
  if (cudaMalloc(&ref_base, bytes + 256) != cudaSuccess || cudaMalloc(&got_base, bytes + 256) != cudaSuccess ||
      cudaMalloc(&d_diff, sizeof *d_diff) != cudaSuccess) {
    (void)cudaGetLastError();
    cudaFree(ref_base), cudaFree(got_base), cudaFree(d_diff);
    return void(c->why = "no device memory for the timing copies: cuBLASLt");
  }
  void *ref = ref_base + shift, *got = got_base + shift;
  // cuBLASLt's result from out as it is, the bits every candidate must have (its first call on this
  // shape and alignment also chooses its algorithm, timed on these operands)
  if (beta != 0.0f) CUDA_CHECK(cudaMemcpyAsync(ref, out, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
  fp4_gemm_fp8(ref, out_fp32, A, B, M, N, K, alpha, beta);
  int all, ncfg;  // only the configurations that have run on hardware: a run must not be the first
  const Fp4WgmmaCfg *cfgs = fp4_gemm_wgmma_configs(&all, &ncfg);
  Timed t = {ref, got, out_fp32, M, N, K, A, B, alpha, beta, {}};
  int n = 1;  // candidate 0 is cuBLASLt; then ours with its bits
  for (int i = 0; i < ncfg && n < 16; i++) {
    if (beta != 0.0f) CUDA_CHECK(cudaMemcpyAsync(got, out, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
    fp4_gemm_wgmma_cfg(got, out_fp32, A, B, M, N, K, alpha, beta, cfgs[i]);
    if (count_diff(ref, got, bytes, d_diff) == 0) t.cfg[n++] = cfgs[i];
  }
  if (n == 1) c->why = "no configuration of our kernel had cuBLASLt's bits: cuBLASLt";
  else {
    double ms[16];
    const int best = tune_pick_fastest(run_timed, &t, n, LT_TUNE_ROUNDS, LT_TUNE_TARGET_MS, ms);
    int own = 1;  // our fastest
    for (int i = 2; i < n; i++) own = ms[i] < ms[own] ? i : own;
    c->ms_lt = ms[0], c->ms_own = ms[own], c->cfg = t.cfg[own], c->own = best > 0;  // best > 0: best == own
  }
  CUDA_FREE_ALL(ref_base, got_base, d_diff);
}

}  // namespace

extern "C" int fp4_gemm_fp8_on(Fp8Kernel kernel, void *out, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N,
                               int K, float alpha, float beta) {
  if (kernel == FP8_KERNEL_CUBLASLT) return fp4_gemm_fp8(out, out_fp32, A, B, M, N, K, alpha, beta), 0;
  if (kernel == FP8_KERNEL_OWN) return fp4_gemm_wgmma(out, out_fp32, A, B, M, N, K, alpha, beta), 1;
  if (kernel != FP8_KERNEL_TUNED) die("fp4_gemm_fp8_on: kernel %d is not an Fp8Kernel", (int)kernel);
  const int key[7] = {out_fp32, A.blk128, B.blk128, M, N, K, beta != 0.0f};
  Fp8Choice *c = NULL;
  for (int i = 0; i < g_cache.n && !c; i++)
    if (!memcmp(g_cache.c[i].key, key, sizeof key)) c = &g_cache.c[i];
  if (!c) {
    if (g_cache.n == MAX_CHOICES) die("fp4_gemm_fp8_on: more than %d GEMM shapes in one process", MAX_CHOICES);
    c = &g_cache.c[g_cache.n++];
    memset(c, 0, sizeof *c);
    memcpy(c->key, key, sizeof key);
    choose(c, out, out_fp32, A, B, M, N, K, alpha, beta);
  }
  c->calls++;
  if (c->own) fp4_gemm_wgmma_cfg(out, out_fp32, A, B, M, N, K, alpha, beta, c->cfg);
  else fp4_gemm_fp8(out, out_fp32, A, B, M, N, K, alpha, beta);
  return c->own;
}

extern "C" int fp4_gemm_fp8_choice_count(void) { return g_cache.n; }
extern "C" const Fp8Choice *fp4_gemm_fp8_choice_at(int i) { return i >= 0 && i < g_cache.n ? &g_cache.c[i] : NULL; }
extern "C" void fp4_gemm_fp8_choices_reset(void) { g_cache.n = 0; }

extern "C" void fp4_gemm_fp8_choices_report(FILE *f) {
  if (!g_cache.n) return;
  fprintf(f, "\nFP8 GEMM kernel per shape (tuned at first use; our kernel only where its bits equal cuBLASLt's):\n");
  fprintf(f, "%6s %6s %6s %-9s %4s | %9s %9s %7s | %s\n", "M", "N", "K", "scales", "out", "cuBLASLt", "own", "ratio",
          "chosen");
  for (int i = 0; i < g_cache.n; i++) {
    const Fp8Choice *c = &g_cache.c[i];
    const int *k = c->key;
    char own[24] = "-", ratio[16] = "-", chosen[160];
    if (c->ms_own > 0)
      snprintf(own, sizeof own, "%.3f", c->ms_own), snprintf(ratio, sizeof ratio, "%.2fx", c->ms_lt / c->ms_own);
    char cn[16];
    if (c->own) snprintf(chosen, sizeof chosen, "own %s", fp4_gemm_wgmma_cfg_name(c->cfg, cn, sizeof cn));
    else snprintf(chosen, sizeof chosen, "cuBLASLt%s%s", c->why ? ": " : "", c->why ? c->why : "");
    fprintf(f, "%6d %6d %6d %-9s %4s | %9.3f %9s %7s | %s (%ld calls)\n", k[3], k[4], k[5],
            k[1]   ? "BLKxVEC"
            : k[2] ? "VECxBLK"
                   : "VECxVEC",
            k[0] ? (k[6] ? "+f32" : "f32") : "bf16", c->ms_lt, own, ratio, chosen, c->calls);
  }
}
