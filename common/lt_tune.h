// common/lt_tune.h: what the BF16 GEMM layer (common/gemm.cu) and the FP4 GEMM back ends
// (fp4/gemm_fp4.cu) share about choosing a cuBLASLt algorithm: the heuristic query and the timing.
#pragma once
#include <cublasLt.h>
#include <stddef.h>

// The process's one cuBLASLt handle and GEMM workspace, created at first use (both GEMM layers use
// them), and the GEMM_AUTOTUNE setting: 1 (default) lets the layers time the heuristic's top
// candidates, 0 keeps heuristic #0. Dies on a GEMM_AUTOTUNE other than 0 or 1.
typedef struct {
  cublasLtHandle_t handle;
  void *ws;
  size_t ws_bytes;  // 64 MiB: split-K and Hopper kernels like 32 MiB+
  int autotune;
} LtContext;
const LtContext *lt_context(void);
// Destroys the handle and frees the workspace (for leak checks at exit); the next lt_context()
// creates them again. The callers' cached descriptors stay valid.
void lt_context_release(void);

// Up to `max` heuristic results with state SUCCESS, in the heuristic's order, for buffers aligned to
// `align` bytes and a workspace of ws_bytes. Split-K only with fp32 partial sums reduced in a fixed
// order: the "in place" and "output type" schemes would sum partials in a BF16 output (and "in
// place" orders them at run time), so results would be neither fp32-accurate nor deterministic.
// *status gets the heuristic call's status (for messages). Returns the count (0 if none).
int lt_candidates(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                  cublasLtMatrixLayout_t lout, int align, size_t ws_bytes, cublasLtMatmulHeuristicResult_t *res,
                  int max, cublasStatus_t *status);

// Runs one call of the GEMM being tuned with `algo` on cuda_stream().
typedef cublasStatus_t (*LtLaunch)(void *ctx, const cublasLtMatmulAlgo_t *algo);

// Times candidates 0..n-1 (n <= 16): a warm-up call each sizes the passes to ~target_ms, then
// `rounds` interleaved passes keep each candidate's best per-call time in ms[i] (-1: it refused to
// run). Returns the fastest's index, or -1 if none ran. Syncs: call outside the hot path.
int lt_pick_fastest(LtLaunch launch, void *ctx, const cublasLtMatmulHeuristicResult_t *res, int n, int rounds,
                    double target_ms, double *ms);
