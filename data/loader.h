// data/loader.h: turns token shards (or a built-in synthetic corpus) into [B, T] micro-batches of
// inputs and next-token targets, sharded over ranks, shuffled per epoch, exactly resumable.
//
// Sample unit: a window of T+1 consecutive tokens of one shard's stream, taken at stride T, so every
// token (but each shard's first, and a tail shorter than T) is a target exactly once per epoch.
// Windows may cross document boundaries. All windows of all shards form one epoch, visited in a
// permutation seeded by (seed, epoch) when shuffle=1, or in file order when shuffle=0.
//
// The epochs are laid end to end as one infinite sequence of window positions. Micro-batch k of rank
// r takes positions [k*B*world + r*B, +B), so ranks are disjoint and together see exactly what one
// rank with B*world sees; a batch may run over into the next epoch. The state is the position of
// the next micro-batch, identical on every rank, so it also stays valid when B or world change.
//
// Blends (data/blend.h): a spec with weights names several sources. Each source is a stream as above
// (its own windows, epochs and permutation, seeded by (seed, source index)); global position p draws
// from the source the blend schedule picks, at that source's next index. Ranks take positions as
// above, every rank following the whole schedule, so the state is still one global position plus the
// samples drawn from each source (which make the schedule O(sources) a sample to continue).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data/blend.h"

#ifdef __cplusplus
extern "C" {
#endif

// POD, saved in checkpoints. Position of the next micro-batch = epoch * n_windows + cursor.
// For "synthetic", n_windows is 0 (unbounded), epoch stays 0 and cursor counts windows. For a blend,
// n_windows is the sum over its sources (synthetic ones count 0) and epoch * n_windows + cursor is
// the global position; the sources' own epochs follow from LoaderBlendState's counts.
typedef struct {
  uint64_t seed;
  uint64_t epoch;
  uint64_t cursor;
  uint64_t n_windows;
} LoaderState;

// A blend's sources and how far each has been read: POD, saved in checkpoints as the "blend" section
// (docs/checkpoint_format.md), 4104 bytes. A resume must find the same sources (names, weights and
// windows, in order).
typedef struct {
  char name[BLEND_NAME];
  double weight;       // normalized
  uint64_t n_windows;  // per epoch (0: synthetic)
  uint64_t samples;    // windows drawn from it so far, all ranks together
  uint64_t tokens;     // target tokens drawn from it so far: samples * T
} LoaderSourceState;
#define LOADER_BLEND_VERSION 1
typedef struct {
  uint32_t version;  // LOADER_BLEND_VERSION
  uint32_t n_sources;
  LoaderSourceState src[BLEND_MAX_SOURCES];  // [n_sources, BLEND_MAX_SOURCES) zero
} LoaderBlendState;

// One source as a run reports it (the banner, the log).
typedef struct {
  const char *name, *paths;   // owned by the loader
  double weight;              // normalized (1 for a single source)
  uint64_t tokens_per_epoch;  // n_windows * T; 0 for "synthetic"
  uint64_t tokens;            // target tokens drawn from it so far, all ranks together
} LoaderSourceInfo;

typedef struct DataLoader DataLoader;

// spec: "synthetic", or a comma-separated list of shard paths and glob(3) patterns (each pattern's
// matches sorted; entries kept in spec order), or a blend of such sources with weights (blend.h).
// Errors (a bad blend, a pattern matching nothing, a corrupt shard, a shard whose vocab_size exceeds
// the model's, no shard holding T+1 tokens, bad B/T/rank/world) return NULL with a message in err
// (for a blend, naming the source).
// For "synthetic", seed also picks the language (the transition table), and shuffle=0 reads a
// held-out stream of the same language, so a validation loader with the train seed never repeats
// training windows.
DataLoader *loader_open(const char *spec, int B, int T, int rank, int world, uint64_t seed, int shuffle,
                        uint32_t vocab_size, char *err, size_t errlen);
// Fills B*T ints each; row b is one window: inputs = w[0..T), targets = w[1..T].
void loader_next(DataLoader *dl, int *inputs, int *targets);
void loader_get_state(const DataLoader *dl, LoaderState *s);
// Fills *b (all of it, unused entries zero) and returns the number of sources (1: not a blend).
int loader_get_blend(const DataLoader *dl, LoaderBlendState *b);
// blend: the saved LoaderBlendState, or NULL when there was none (a single-source checkpoint).
// Refuses (returns -1 with err) a state from another data set or seed, an out-of-range cursor, a
// blend for a single source or the reverse, and a blend whose sources differ from this loader's
// (naming the first difference: count, name, weight or windows), or whose counts do not add up.
int loader_set_state(DataLoader *dl, const LoaderState *s, const LoaderBlendState *blend, char *err, size_t errlen);
int loader_n_sources(const DataLoader *dl);
LoaderSourceInfo loader_source_info(const DataLoader *dl, int source);
void loader_reset(DataLoader *dl);  // back to position 0, e.g. before each validation pass
// Target tokens per epoch (n_windows * T, summed over a blend's sources); 0 for "synthetic", which
// has no epochs.
uint64_t loader_tokens_per_epoch(const DataLoader *dl);
// "synthetic" only: the corpus's entropy rate in nats per token, i.e. the lowest reachable
// expected loss (about 1.27). Returns -1 for shard data.
double loader_synthetic_entropy(const DataLoader *dl);
void loader_close(DataLoader *dl);

#ifdef __cplusplus
}
#endif
