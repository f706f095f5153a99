// common/lt_tune.h: what every cuBLASLt GEMM layer (the BF16 GEMM in common/gemm.cu, the FP4 back
// ends in fp4/gemm_fp4.cu) shares: the handle and workspace, the one plan cache (a plan per GEMM
// kind and key), the choice of algorithm (heuristic query, timing) and the pointer alignment.
#pragma once
#include <cublasLt.h>
#include <stddef.h>

#include "common/gemm_plans.h"

// The process's one cuBLASLt handle and GEMM workspace, created at first use (both GEMM layers use
// them), and how plans choose their algorithm: timed (the default), heuristic #0, or recorded
// (lt_set_choice). GEMM_AUTOTUNE=0 in the environment keeps heuristic #0 whatever the choice (a
// recording run then records it); dies on a GEMM_AUTOTUNE other than 0 or 1.
typedef struct {
  cublasLtHandle_t handle;
  void *ws;
  size_t ws_bytes;        // 64 MiB: split-K and Hopper kernels like 32 MiB+
  int autotune;           // 1: the layers may time candidates; 0: heuristic #0 (why: untimed)
  const char *untimed;    // why nothing is timed ("GEMM_AUTOTUNE=0", ...), NULL when autotune is 1
  GemmChoice choice;      // GEMM_TIMED, GEMM_RECORDED or GEMM_HEURISTIC (common/gemm_plans.h)
  GemmPlans plans;        // GEMM_RECORDED: the record, read by lt_set_choice, saved at every new entry
  GemmPlanDevice device;  // this GPU and cuBLASLt version: the record's entries are theirs
} LtContext;
const LtContext *lt_context(void);
// Destroys the handle and frees the workspace and the record (for leak checks at exit); the next
// lt_context() creates them again, timing by default. The callers' cached descriptors stay valid.
void lt_context_release(void);

// How plans made from now on choose their algorithm (parallel.deterministic, docs/determinism.md):
// GEMM_TIMED times the heuristic's top candidates in this process; GEMM_HEURISTIC keeps heuristic #0;
// GEMM_RECORDED reads the record at path (a missing file is an empty record) and takes a plan's
// recorded algorithm for this GPU and cuBLASLt version when cuBLASLt accepts it
// (cublasLtMatmulAlgoCheck), else chooses as GEMM_TIMED and records the choice, saving the record at
// once (atomically: a process killed later leaves it whole). -1 with err naming the file and what to
// do when the record cannot be read. Creates the context.
int lt_set_choice(GemmChoice choice, const char *path, char *err, size_t errlen);
// GEMM_RECORDED: the value recorded under key (LT_KEY_INTS ints) for this GPU, looked up again in
// the file (common/gemm_plans.h's gemm_plans_lock) when this process has none. NULL otherwise: when
// recording, that miss holds the record's lock, and the caller must then call lt_record for key.
const uint64_t *lt_recorded(const int *key);
// GEMM_RECORDED, after a miss: records value under key (NULL: nothing was chosen), saves the record
// and releases the miss's lock. Dies with the file's name when the record cannot be written (the run
// could not be repeated). Otherwise does nothing.
void lt_record(const int *key, const uint64_t *value);

// Runs one call of the GEMM being tuned with `algo` on cuda_stream().
typedef cublasStatus_t (*LtLaunch)(void *ctx, const cublasLtMatmulAlgo_t *algo);

// ---- timing candidates --------------------------------------------------------------------------
// The timing effort when a choice is made at a first call: one warm-up call per candidate, then
// LT_TUNE_ROUNDS interleaved passes of about LT_TUNE_TARGET_MS each; a candidate keeps its best pass.
#define LT_TUNE_ROUNDS 2
#define LT_TUNE_TARGET_MS 2.0
// Runs candidate i once on cuda_stream(): 0, or nonzero if it refuses to run.
typedef int (*TuneRun)(void *ctx, int i);
// Times candidates 0..n-1 (n <= 16): a warm-up call each sizes the passes to ~target_ms, then `rounds`
// interleaved passes keep each candidate's best per-call time in ms[i] (-1: it refused to run).
// Returns the fastest's index, or -1 if none ran. Syncs: call outside the hot path. cuBLASLt's
// algorithms are timed with it, and fp4_gemm_fp8_on's kernels (fp4/gemm_fp8_select.cu).
int tune_pick_fastest(TuneRun run, void *ctx, int n, int rounds, double target_ms, double *ms);

// ---- the plan cache -----------------------------------------------------------------------------
// A plan: one GEMM kind's descriptors at one key and the algorithm kept. The key is ints (compared
// whole): key[0] the kind, then the kind's own fields (shape, layouts, types, beta != 0, alignment).
// LT_FP8_KERNEL is no cuBLASLt plan: the key of fp4_gemm_fp8_on's kernel choice in the record.
enum { LT_KEY_INTS = 12 };
typedef enum {
  LT_BF16 = 1,
  LT_FP8 = 2,
  LT_FP4_NATIVE = 3,
  LT_BF16_DEV_ALPHA = 4,  // 5 was a per-tensor FP8 speed reference (removed with our own GEMM)
  LT_FP8_KERNEL = 6
} LtKind;
typedef struct {
  int key[LT_KEY_INTS];  // zero-padded
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lout;  // cuBLAS A (our B), cuBLAS B (our A), C = D (out)
  int align;                            // the pointers' alignment (lt_alignment), set with the descriptors
  cublasLtMatmulAlgo_t algo;
  int n_candidates, chosen;  // heuristic results (0: cuBLASLt offers none), the index kept
  double ms, ms_h0;          // per call: the kept algorithm and heuristic #0 (0: untimed)
  const char *untuned;       // why the timing was skipped, or NULL
  long calls;
} LtPlan;

// The process's plan of key (n <= LT_KEY_INTS ints). A new plan holds only the key and *created is
// 1: the caller builds its descriptors, then calls lt_plan_choose. Plans keep their address until
// lt_plans_release.
LtPlan *lt_plan_get(const int *key, int n, int *created);
int lt_plan_count(void);
const LtPlan *lt_plan_at(int i);
// Destroys a plan's descriptors (a plan of the cache, or one built outside it for a benchmark).
void lt_plan_destroy(LtPlan *p);
// Destroys every cached plan (a later lt_plan_get starts afresh).
void lt_plans_release(void);

// Chooses p->algo among the first `max` (<= 16) heuristic candidates: heuristic #0, or with
// autotuning the fastest on the call's own operands; with a record (lt_set_choice), the recorded one
// if there is one (untuned then says "recorded"), and any other choice is recorded. launch(ctx) runs that call; *out is
// its output pointer inside ctx: with accumulate (beta != 0) the timed calls would keep adding into it, so they run on
// a scratch copy (out_bytes) swapped in there and back. launch NULL: no call to time. Sets n_candidates (0: none, algo
// unset), chosen, ms, ms_h0, untuned. Syncs when it times.
void lt_plan_choose(LtPlan *p, int max, LtLaunch launch, void *ctx, void **out, size_t out_bytes, int accumulate);

// Benchmarks (allocates nothing, syncs): the best time per call in ms among the first `max` (<= 16)
// heuristic candidates of p (a plan built outside the cache, for buffers aligned to p->align), each
// timed `rounds` passes of about target_ms by launch(ctx); -1 when none ran. *n gets the candidates
// the heuristic offered, *status its status (either may be NULL), for messages.
double lt_plan_best_ms(const LtPlan *p, int max, LtLaunch launch, void *ctx, int rounds, double target_ms, int *n,
                       cublasStatus_t *status);

// The largest power of two in [16, 256] dividing every pointer (the heuristic filters algorithms on
// it). Dies naming `who` and the first pointer that is NULL or not 16-byte aligned.
int lt_alignment(const char *who, const void *const *ptrs, const char *const *names, int n);
