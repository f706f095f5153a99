// fp4/gemm_fp8_select.cu: the FP8-embedded GEMM on the fastest of its kernels, chosen once per shape
// (fp4/gemm_fp4.h's fp4_gemm_fp8_on).
//
// At a shape's first call under FP8_KERNEL_TUNED the kernels run on that call's own operands, into
// scratch copies of out (so an accumulating Wgrad is not added to twice): cuBLASLt's block-scaled
// GEMM (its own algorithm already chosen by lt_tune) and each configuration of CUTLASS's
// (fp4/gemm_cutlass.h) where it takes the shape. A configuration is eligible only if its result has
// exactly cuBLASLt's bits; the fastest eligible one is kept if it beats cuBLASLt. So the choice, which
// depends on timings that vary from run to run, never changes a result: training stays bit-identical run to run and
// across resumes whichever wins. Everything else (no CUTLASS in the build, no sm_90 device, a shape CUTLASS refuses, no
// timing, no memory for the copies) keeps cuBLASLt and records why. (Our own wgmma kernel was a candidate until
// 2026-12-05 and never won a shape: docs/gemm_wgmma.md.) With a record (common/lt_tune.h's lt_set_choice) the choice is
// recorded too, and a later process takes the recorded configuration after checking, on its first call, that it still
// has cuBLASLt's bits there (no timing): the same speed without the timing.
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "common/lt_tune.h"
#include "fp4/gemm_cutlass.h"
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

// The candidates timed at a shape's first call: 0 cuBLASLt into ref, i > 0 cand[i] into got (scratch
// copies: an accumulating one keeps adding, the time is the same).
struct Timed {
  void *ref, *got;
  const void *src;  // beta's matrix (NULL: each candidate's own out, a scratch copy of out)
  int out_fp32, M, N, K;
  Fp8Operand A, B;
  float alpha, beta;
  int cfg[16];  // the CUTLASS configuration of candidate i > 0
};
int run_timed(void *ctx, int i) {
  const Timed *t = (const Timed *)ctx;
  if (i == 0) fp4_gemm_fp8_src(t->ref, t->src, t->out_fp32, t->A, t->B, t->M, t->N, t->K, t->alpha, t->beta);
  else fp4_gemm_cutlass_cfg(t->got, t->src, t->out_fp32, t->A, t->B, t->M, t->N, t->K, t->alpha, t->beta, t->cfg[i]);
  return 0;
}

// Fills c (key fields set) by timing the kernels on this call's operands; out is only read (src: beta's
// matrix, NULL for out; a separate one is read by CUTLASS as it is, and copied into ref by cuBLASLt, whose
// time includes that copy, as on the real call). With
// `only` >= 0 (a recorded CUTLASS configuration) nothing is timed: c takes it if it is one this build
// may choose and has cuBLASLt's bits on this call, else cuBLASLt.
void choose(Fp8Choice *c, const void *out, const void *src, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N,
            int K, float alpha, float beta, int only) {
  c->kernel = 0, c->ms_lt = c->ms_cutlass = 0, c->why = NULL;
  int ncut = 0;  // CUTLASS's configurations that may be chosen
  c->why_cutlass = fp4_gemm_cutlass_unsupported(out_fp32, A, B, M, N, K);
  if (!c->why_cutlass) fp4_gemm_cutlass_configs(out_fp32, &ncut);
  if (!c->why_cutlass && !ncut) c->why_cutlass = "none of its configurations has run on hardware yet";
  if (c->why_cutlass) return void(c->why = "no other kernel: cuBLASLt");
  if (only < 0 && lt_context()->untimed) return void(c->why = "no timing: cuBLASLt");
  if (only >= ncut) return void(c->why = "the recorded configuration is not this build's: cuBLASLt");
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
  const int copy = beta != 0.0f && !src;  // in place: each candidate adds to its own copy of out
  if (copy) CUDA_CHECK(cudaMemcpyAsync(ref, out, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
  fp4_gemm_fp8_src(ref, src, out_fp32, A, B, M, N, K, alpha, beta);
  // the candidates: CUTLASS's configurations that have run on hardware (a run must not be the first);
  // 16 at most with cuBLASLt (tune_pick_fastest)
  Timed t = {ref, got, src, out_fp32, M, N, K, A, B, alpha, beta, {}};
  int n = 1;  // candidate 0 is cuBLASLt; then the others with its bits
  for (int i = 0; i < ncut && n < 16; i++) {
    if (only >= 0 && only != i) continue;
    if (copy) CUDA_CHECK(cudaMemcpyAsync(got, out, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
    fp4_gemm_cutlass_cfg(got, src, out_fp32, A, B, M, N, K, alpha, beta, i);
    if (count_diff(ref, got, bytes, d_diff) == 0) t.cfg[n++] = i;
  }
  if (n == 1 && only >= 0) c->why = "the recorded configuration lacks cuBLASLt's bits here: cuBLASLt";
  else if (n == 1) c->why = "no configuration of CUTLASS's had cuBLASLt's bits: cuBLASLt";
  else if (only >= 0) c->kernel = 2, c->cutlass_cfg = t.cfg[1], c->why = "recorded";
  else {
    double ms[16];
    const int best = tune_pick_fastest(run_timed, &t, n, LT_TUNE_ROUNDS, LT_TUNE_TARGET_MS, ms);
    c->ms_lt = ms[0];
    for (int i = 1; i < n; i++)  // CUTLASS's fastest, for the report
      if (ms[i] > 0 && (c->ms_cutlass <= 0 || ms[i] < c->ms_cutlass)) c->ms_cutlass = ms[i], c->cutlass_cfg = t.cfg[i];
    if (best > 0) c->kernel = 2;  // the fastest of all: CUTLASS's fastest, set above
  }
  CUDA_FREE_ALL(ref_base, got_base, d_diff);
}

}  // namespace

extern "C" int fp4_gemm_fp8_on(Fp8Kernel kernel, void *out, const void *src, int out_fp32, Fp8Operand A, Fp8Operand B,
                               int M, int N, int K, float alpha, float beta) {
  if (src == out) src = NULL;
  if (kernel == FP8_KERNEL_CUBLASLT) return fp4_gemm_fp8_src(out, src, out_fp32, A, B, M, N, K, alpha, beta), 0;
  if (kernel == FP8_KERNEL_CUTLASS) return fp4_gemm_cutlass_cfg(out, src, out_fp32, A, B, M, N, K, alpha, beta, 0), 2;
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
    // In the record (lt_tune.h) as {LT_FP8_KERNEL, the key} -> {kernel, 0, 0, 0, 0, 0, CUTLASS's
    // configuration's index in fp4/gemm_cutlass.cu's list} (a record predating a change of the list is
    // to be deleted; a recorded choice is rechecked for bits, not speed). Words 1-5 held our own
    // kernel's configuration until it was removed (2026-12-05); a record that chose it (kernel 1) is
    // read as cuBLASLt, whose bits that kernel had to have to be chosen.
    const int rkey[LT_KEY_INTS] = {LT_FP8_KERNEL, key[0], key[1], key[2], key[3], key[4], key[5], key[6]};
    const uint64_t *rec = lt_recorded(rkey);
    if (rec && !rec[0]) c->why = "recorded: cuBLASLt";
    else if (rec && rec[0] == 1)
      c->why =
          "recorded: our own kernel, removed on 2026-12-05: cuBLASLt, the same bits (delete the record to tune "
          "CUTLASS here)";
    else if (rec && rec[0] != 2)
      die("fp4_gemm_fp8_on: the GEMM record names FP8 kernel %llu, not 0 (cuBLASLt) or 2 (CUTLASS): it is not this "
          "engine's; delete the file parallel.gemm_plans names",
          (unsigned long long)rec[0]);
    else if (rec)  // an index past the list (a record of another build) matches no configuration: cuBLASLt
      choose(c, out, src, out_fp32, A, B, M, N, K, alpha, beta, rec[6] < 1024 ? (int)rec[6] : 1024);
    else {
      choose(c, out, src, out_fp32, A, B, M, N, K, alpha, beta, -1);
      const uint64_t v[GEMM_PLAN_VALUE_WORDS] = {(uint64_t)c->kernel, 0, 0, 0, 0, 0, (uint64_t)c->cutlass_cfg};
      lt_record(rkey, v);
    }
  }
  c->calls++;
  if (c->kernel == 2) fp4_gemm_cutlass_cfg(out, src, out_fp32, A, B, M, N, K, alpha, beta, c->cutlass_cfg);
  else fp4_gemm_fp8_src(out, src, out_fp32, A, B, M, N, K, alpha, beta);
  return c->kernel;
}

extern "C" int fp4_gemm_fp8_choice_count(void) { return g_cache.n; }
extern "C" const Fp8Choice *fp4_gemm_fp8_choice_at(int i) { return i >= 0 && i < g_cache.n ? &g_cache.c[i] : NULL; }
extern "C" void fp4_gemm_fp8_choices_reset(void) { g_cache.n = 0; }

extern "C" void fp4_gemm_fp8_choices_report(FILE *f) {
  if (!g_cache.n) return;
  fprintf(f, "\nFP8 GEMM kernel per shape (tuned at first use; CUTLASS's only where the bits equal cuBLASLt's):\n");
  fprintf(f, "%6s %6s %6s %-9s %4s | %9s %9s %7s | %s\n", "M", "N", "K", "scales", "out", "cuBLASLt", "cutlass",
          "ratio", "chosen");
  for (int i = 0; i < g_cache.n; i++) {
    const Fp8Choice *c = &g_cache.c[i];
    const int *k = c->key;
    char cut[24] = "-", ratio[16] = "-", chosen[240];
    if (c->ms_cutlass > 0) snprintf(cut, sizeof cut, "%.3f", c->ms_cutlass);
    if (c->ms_cutlass > 0) snprintf(ratio, sizeof ratio, "%.2fx", c->ms_lt / c->ms_cutlass);  // cuBLASLt over CUTLASS
    if (c->kernel == 2)
      snprintf(chosen, sizeof chosen, "cutlass %s%s", fp4_gemm_cutlass_cfg_name(c->cutlass_cfg),
               c->why ? " (recorded)" : "");
    else
      snprintf(chosen, sizeof chosen, "cuBLASLt%s%s%s%s", c->why ? ": " : "", c->why ? c->why : "",
               c->why_cutlass ? "; no CUTLASS: " : "", c->why_cutlass ? c->why_cutlass : "");
    fprintf(f, "%6d %6d %6d %-9s %4s | %9.3f %9s %7s | %s (%ld calls)\n", k[3], k[4], k[5],
            k[1]   ? "BLKxVEC"
            : k[2] ? "VECxBLK"
                   : "VECxVEC",
            k[0] ? (k[6] ? "+f32" : "f32") : "bf16", c->ms_lt, cut, ratio, chosen, c->calls);
  }
}
