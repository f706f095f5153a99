// fp4/gemm_fp8_select.cu: the FP8-embedded GEMM on the fastest of its kernels, chosen once per shape
// (fp4/gemm_fp4.h's fp4_gemm_fp8_on).
//
// At a shape's first call under FP8_KERNEL_TUNED the kernels run on that call's own operands, into
// scratch copies of out (so an accumulating Wgrad is not added to twice): cuBLASLt's block-scaled
// GEMM (its own algorithm already chosen by lt_tune), each configuration of our wgmma kernel and each
// of CUTLASS's (fp4/gemm_cutlass.h), where they take the shape. A configuration is eligible only if
// its result has exactly cuBLASLt's bits; the fastest eligible one is kept if it beats cuBLASLt. So the choice, which
// depends on timings that vary from run to run, never changes a result: training stays bit-identical run to run and
// across resumes whichever wins. Everything else (no sm_90 device, a shape our kernel refuses, no timing, no memory for
// the copies) keeps cuBLASLt and records why. With a record (common/lt_tune.h's lt_set_choice) the choice is recorded
// too, and a later process takes the recorded configuration after checking, on its first call, that it still has
// cuBLASLt's bits there (no timing): the same speed without the timing.
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

// A kernel beside cuBLASLt: ours (kernel 1) with configuration cfg, or CUTLASS's (2) configuration
// cutlass (Fp8Choice.own's numbering).
struct Cand {
  int kernel;
  Fp4WgmmaCfg cfg;
  int cutlass;
};

void run_cand(const Cand &c, void *out, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K, float alpha,
              float beta) {
  if (c.kernel == 2) fp4_gemm_cutlass_cfg(out, out_fp32, A, B, M, N, K, alpha, beta, c.cutlass);
  else fp4_gemm_wgmma_cfg(out, out_fp32, A, B, M, N, K, alpha, beta, c.cfg);
}

// The candidates timed at a shape's first call: 0 cuBLASLt into ref, i > 0 cand[i] into got (scratch
// copies: an accumulating one keeps adding, the time is the same).
struct Timed {
  void *ref, *got;
  int out_fp32, M, N, K;
  Fp8Operand A, B;
  float alpha, beta;
  Cand cand[16];
};
int run_timed(void *ctx, int i) {
  const Timed *t = (const Timed *)ctx;
  if (i == 0) fp4_gemm_fp8(t->ref, t->out_fp32, t->A, t->B, t->M, t->N, t->K, t->alpha, t->beta);
  else run_cand(t->cand[i], t->got, t->out_fp32, t->A, t->B, t->M, t->N, t->K, t->alpha, t->beta);
  return 0;
}

bool same_cfg(Fp4WgmmaCfg a, Fp4WgmmaCfg b) {
  return a.bn == b.bn && a.cluster == b.cluster && a.pipelined == b.pipelined && a.epi_smem == b.epi_smem &&
         a.ordered == b.ordered;
}
bool same_cand(const Cand &a, const Cand &b) {
  return a.kernel == b.kernel && (a.kernel == 2 ? a.cutlass == b.cutlass : same_cfg(a.cfg, b.cfg));
}

// Fills c (key fields set) by timing the kernels on this call's operands; out is only read. With
// `only` (a recorded configuration) nothing is timed: c takes it if it is one this build may choose
// and has cuBLASLt's bits on this call, else cuBLASLt.
void choose(Fp8Choice *c, const void *out, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N, int K, float alpha,
            float beta, const Cand *only) {
  c->own = 0, c->ms_lt = c->ms_own = c->ms_cutlass = 0, c->why = NULL;
  const char *no = fp4_gemm_wgmma_unsupported(A, B, M, N, K);
  int ncut = 0;  // CUTLASS's configurations that may be chosen
  c->why_cutlass = fp4_gemm_cutlass_unsupported(out_fp32, A, B, M, N, K);
  if (!c->why_cutlass) fp4_gemm_cutlass_configs(&ncut);
  if (!c->why_cutlass && !ncut) c->why_cutlass = "none of its configurations has run on hardware yet";
  if (no && c->why_cutlass) return void(c->why = no);
  if (!only && lt_context()->untimed) return void(c->why = "no timing: cuBLASLt");
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
  // the candidates: ours and CUTLASS's where they take the shape, only the configurations that have
  // run on hardware (a run must not be the first); 16 at most with cuBLASLt (tune_pick_fastest)
  Cand all[32];
  int nall = 0, nown = 0, tuned = 0;
  const Fp4WgmmaCfg *cfgs = no ? NULL : fp4_gemm_wgmma_configs(&nown, &tuned);
  for (int i = 0; !no && i < tuned; i++) all[nall++] = {1, cfgs[i], 0};
  for (int i = 0; i < ncut && nall < 32; i++) all[nall++] = {2, {}, i};
  Timed t = {ref, got, out_fp32, M, N, K, A, B, alpha, beta, {}};
  int n = 1;  // candidate 0 is cuBLASLt; then the others with its bits
  for (int i = 0; i < nall && n < 16; i++) {
    if (only && !same_cand(*only, all[i])) continue;
    if (beta != 0.0f) CUDA_CHECK(cudaMemcpyAsync(got, out, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
    run_cand(all[i], got, out_fp32, A, B, M, N, K, alpha, beta);
    if (count_diff(ref, got, bytes, d_diff) == 0) t.cand[n++] = all[i];
  }
  if (n == 1 && only) c->why = "the recorded configuration is not this build's or lacks cuBLASLt's bits: cuBLASLt";
  else if (n == 1) c->why = "no configuration of ours or CUTLASS's had cuBLASLt's bits: cuBLASLt";
  else if (only) {
    c->own = t.cand[1].kernel, c->cfg = t.cand[1].cfg, c->cutlass_cfg = t.cand[1].cutlass, c->why = "recorded";
  } else {
    double ms[16];
    const int best = tune_pick_fastest(run_timed, &t, n, LT_TUNE_ROUNDS, LT_TUNE_TARGET_MS, ms);
    c->ms_lt = ms[0];
    for (int i = 1; i < n; i++) {  // each kernel's fastest, for the report; the fastest of all is kept
      const Cand &k = t.cand[i];
      double *m = k.kernel == 2 ? &c->ms_cutlass : &c->ms_own;
      if (ms[i] > 0 && (*m <= 0 || ms[i] < *m)) {
        *m = ms[i];
        if (k.kernel == 2) c->cutlass_cfg = k.cutlass;
        else c->cfg = k.cfg;
      }
    }
    if (best > 0) c->own = t.cand[best].kernel;  // the fastest of all: its kernel's fastest, set above
  }
  CUDA_FREE_ALL(ref_base, got_base, d_diff);
}

}  // namespace

extern "C" int fp4_gemm_fp8_on(Fp8Kernel kernel, void *out, int out_fp32, Fp8Operand A, Fp8Operand B, int M, int N,
                               int K, float alpha, float beta) {
  if (kernel == FP8_KERNEL_CUBLASLT) return fp4_gemm_fp8(out, out_fp32, A, B, M, N, K, alpha, beta), 0;
  if (kernel == FP8_KERNEL_OWN) return fp4_gemm_wgmma(out, out_fp32, A, B, M, N, K, alpha, beta), 1;
  if (kernel == FP8_KERNEL_CUTLASS) return fp4_gemm_cutlass(out, out_fp32, A, B, M, N, K, alpha, beta), 2;
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
    // In the record (lt_tune.h) as {LT_FP8_KERNEL, the key} -> {own, our configuration's fields,
    // CUTLASS's configuration's index in fp4/gemm_cutlass.cu's list (a record predating a change of the
    // list is to be deleted; a recorded choice is rechecked for bits, not speed)}.
    const int rkey[LT_KEY_INTS] = {LT_FP8_KERNEL, key[0], key[1], key[2], key[3], key[4], key[5], key[6]};
    const uint64_t *rec = lt_recorded(rkey);
    if (rec && !rec[0]) c->why = "recorded: cuBLASLt";
    else if (rec) {
      const Cand only = {(int)rec[0], {(int)rec[1], (int)rec[2], (int)rec[3], (int)rec[4], (int)rec[5]}, (int)rec[6]};
      choose(c, out, out_fp32, A, B, M, N, K, alpha, beta, &only);
    } else {
      choose(c, out, out_fp32, A, B, M, N, K, alpha, beta, NULL);
      const uint64_t v[GEMM_PLAN_VALUE_WORDS] = {
          (uint64_t)c->own,          (uint64_t)c->cfg.bn,      (uint64_t)c->cfg.cluster, (uint64_t)c->cfg.pipelined,
          (uint64_t)c->cfg.epi_smem, (uint64_t)c->cfg.ordered, (uint64_t)c->cutlass_cfg};
      lt_record(rkey, v);
    }
  }
  c->calls++;
  if (c->own) run_cand({c->own, c->cfg, c->cutlass_cfg}, out, out_fp32, A, B, M, N, K, alpha, beta);
  else fp4_gemm_fp8(out, out_fp32, A, B, M, N, K, alpha, beta);
  return c->own;
}

extern "C" int fp4_gemm_fp8_choice_count(void) { return g_cache.n; }
extern "C" const Fp8Choice *fp4_gemm_fp8_choice_at(int i) { return i >= 0 && i < g_cache.n ? &g_cache.c[i] : NULL; }
extern "C" void fp4_gemm_fp8_choices_reset(void) { g_cache.n = 0; }

extern "C" void fp4_gemm_fp8_choices_report(FILE *f) {
  if (!g_cache.n) return;
  fprintf(
      f, "\nFP8 GEMM kernel per shape (tuned at first use; ours or CUTLASS's only where the bits equal cuBLASLt's):\n");
  fprintf(f, "%6s %6s %6s %-9s %4s | %9s %9s %9s %7s | %s\n", "M", "N", "K", "scales", "out", "cuBLASLt", "own",
          "cutlass", "ratio", "chosen");
  for (int i = 0; i < g_cache.n; i++) {
    const Fp8Choice *c = &g_cache.c[i];
    const int *k = c->key;
    char own[24] = "-", cut[24] = "-", ratio[16] = "-", chosen[240];
    if (c->ms_own > 0) snprintf(own, sizeof own, "%.3f", c->ms_own);
    if (c->ms_cutlass > 0) snprintf(cut, sizeof cut, "%.3f", c->ms_cutlass);
    // ratio: cuBLASLt's time over the faster of the other two
    const double other = c->ms_own > 0 && (c->ms_cutlass <= 0 || c->ms_own < c->ms_cutlass) ? c->ms_own : c->ms_cutlass;
    if (other > 0) snprintf(ratio, sizeof ratio, "%.2fx", c->ms_lt / other);
    char cn[16];
    if (c->own == 1)
      snprintf(chosen, sizeof chosen, "own %s%s", fp4_gemm_wgmma_cfg_name(c->cfg, cn, sizeof cn),
               c->why ? " (recorded)" : "");
    else if (c->own == 2)
      snprintf(chosen, sizeof chosen, "cutlass %s%s", fp4_gemm_cutlass_cfg_name(c->cutlass_cfg),
               c->why ? " (recorded)" : "");
    else
      snprintf(chosen, sizeof chosen, "cuBLASLt%s%s%s%s", c->why ? ": " : "", c->why ? c->why : "",
               c->why_cutlass ? "; no CUTLASS: " : "", c->why_cutlass ? c->why_cutlass : "");
    fprintf(f, "%6d %6d %6d %-9s %4s | %9.3f %9s %9s %7s | %s (%ld calls)\n", k[3], k[4], k[5],
            k[1]   ? "BLKxVEC"
            : k[2] ? "VECxBLK"
                   : "VECxVEC",
            k[0] ? (k[6] ? "+f32" : "f32") : "bf16", c->ms_lt, own, cut, ratio, chosen, c->calls);
  }
}
