// common/gemm_plans.h: the record of a run's GEMM algorithm choices (parallel.gemm_plans; the file
// format and the rules are in docs/determinism.md). A cuBLASLt algorithm chosen by timing depends on
// the timings, so two processes can choose differently and their results then differ in the last
// bits. A run that records its choices and reuses them in every later process (a resume, a second
// run sharing the record) repeats its results bit for bit while still running the timed choice.
//
// An entry is (device, key) -> value: the device is the GPU's name, its compute capability and the
// cuBLASLt version (an algorithm is only valid for the library that made it); the key is a plan's
// ints (common/lt_tune.h: the GEMM kind, shape, layouts, alignment); the value is the opaque
// cublasLtMatmulAlgo_t (8 words) or, for the FP8 kernel choice, our kernel's configuration. Entries
// of other devices stay in the file untouched. Plain C, no CUDA: lt_tune.cu fills and reads it.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { GEMM_PLAN_KEY_INTS = 12, GEMM_PLAN_VALUE_WORDS = 8, GEMM_PLAN_GPU_MAX = 256 };

typedef struct {
  char gpu[GEMM_PLAN_GPU_MAX];  // the device's name (cudaDeviceProp.name), without tabs or newlines
  int cc;                       // compute capability, major * 10 + minor
  uint64_t lib;                 // cublasLtGetVersion()
} GemmPlanDevice;

typedef struct {
  GemmPlanDevice dev;
  int key[GEMM_PLAN_KEY_INTS];  // zero-padded
  uint64_t value[GEMM_PLAN_VALUE_WORDS];
} GemmPlanEntry;

typedef struct {
  char path[2048];  // where gemm_plans_save writes; "" keeps the record in memory
  GemmPlanEntry *e;
  int n, cap;
  int lock_fd, lock_depth;  // gemm_plans_lock: the lock file, held while lock_depth > 0
} GemmPlans;

// Reads the record at path into *r (which it initializes; free with gemm_plans_free). A missing file
// is an empty record. A file that is unreadable, truncated, damaged (its checksum) or of another
// format is refused: -1 with err naming the file, the line and what to do. It is never guessed at: a
// run that silently timed afresh would no longer repeat the processes that recorded it.
int gemm_plans_load(GemmPlans *r, const char *path, char *err, size_t errlen);
// The value recorded for key (GEMM_PLAN_KEY_INTS ints) on device dev, or NULL.
const uint64_t *gemm_plans_find(const GemmPlans *r, const GemmPlanDevice *dev, const int *key);
// Entries recorded for dev (the banner's count).
int gemm_plans_count(const GemmPlans *r, const GemmPlanDevice *dev);
// Sets the value of (dev, key), adding the entry or replacing its value. -1 with err when dev's name
// is empty or holds a tab or newline (the file separates fields with them).
int gemm_plans_put(GemmPlans *r, const GemmPlanDevice *dev, const int *key, const uint64_t *value, char *err,
                   size_t errlen);
// Several processes may share a record (a run and an --eval-only beside it on one checkpoint.dir,
// two runs naming one parallel.gemm_plans). gemm_plans_lock takes the record's lock (flock on
// PATH.lock; nested calls in one process count up) and merges into r the file's entries r lacks
// (other processes' new choices), keeping r's own values. A process that looks a key up again under
// the lock, chooses only if it is still missing and saves before unlocking never loses another's
// entry, and two processes never record different choices for one key. -1 with err (naming the
// file) when the lock file cannot be made or the record has been damaged. No-ops when r->path is "".
int gemm_plans_lock(GemmPlans *r, char *err, size_t errlen);
void gemm_plans_unlock(GemmPlans *r);
// Writes the record to r->path atomically (common.h's write_file_atomic), creating its folder.
// Nothing to do when r->path is "". -1 with err naming the file.
int gemm_plans_save(const GemmPlans *r, char *err, size_t errlen);
void gemm_plans_free(GemmPlans *r);

// How GEMMs choose their algorithm, from parallel.deterministic and where a record can live:
//   GEMM_TIMED      the fastest of the heuristic's top candidates, timed in each process (the fast
//                   path of parallel.deterministic: false; a run then differs from process to process)
//   GEMM_RECORDED   timed once, kept in the record at path and reused by every later process
//   GEMM_HEURISTIC  cuBLASLt's heuristic #0, which every process picks alike (untimed, a little slower)
typedef enum { GEMM_TIMED = 0, GEMM_RECORDED = 1, GEMM_HEURISTIC = 2 } GemmChoice;
// The choice and record path of one process: deterministic false -> GEMM_TIMED. Otherwise the record
// is parallel.gemm_plans when set, else checkpoint.dir/gemm_plans (not for --bench, which leaves a
// run's checkpoint.dir alone), with ".rank_<r>" appended when world > 1 (each rank records what it
// chose); with a record -> GEMM_RECORDED. Without one, a deterministic run takes GEMM_HEURISTIC (the
// one choice two processes make alike with nothing shared), and --bench GEMM_TIMED (a benchmark
// repeats nothing: it times what a run with a record runs). path gets the record's path or "".
// Returns the choice, or -1 when the path does not fit in n bytes.
int gemm_plans_choice(int deterministic, const char *gemm_plans, const char *ckpt_dir, int world, int rank, int bench,
                      char *path, size_t n);
// "timed", "recorded" or "heuristic".
const char *gemm_choice_name(GemmChoice c);

#ifdef __cplusplus
}
#endif
