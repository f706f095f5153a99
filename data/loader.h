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
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// POD, saved in checkpoints. Position of the next micro-batch = epoch * n_windows + cursor.
// For "synthetic", n_windows is 0 (unbounded), epoch stays 0 and cursor counts windows.
typedef struct {
  uint64_t seed;
  uint64_t epoch;
  uint64_t cursor;
  uint64_t n_windows;
} LoaderState;

typedef struct DataLoader DataLoader;

// spec: "synthetic", or a comma-separated list of shard paths and glob(3) patterns (each pattern's
// matches sorted; entries kept in spec order). Errors (a pattern matching nothing, a corrupt shard,
// a shard whose vocab_size exceeds the model's, no shard holding T+1 tokens, bad B/T/rank/world)
// return NULL with a message in err.
// For "synthetic", seed also picks the language (the transition table), and shuffle=0 reads a
// held-out stream of the same language, so a validation loader with the train seed never repeats
// training windows.
DataLoader *loader_open(const char *spec, int B, int T, int rank, int world, uint64_t seed, int shuffle,
                        uint32_t vocab_size, char *err, size_t errlen);
// Fills B*T ints each; row b is one window: inputs = w[0..T), targets = w[1..T].
void loader_next(DataLoader *dl, int *inputs, int *targets);
void loader_get_state(const DataLoader *dl, LoaderState *s);
// Refuses (returns -1 with err) a state from another data set or seed, or an out-of-range cursor.
int loader_set_state(DataLoader *dl, const LoaderState *s, char *err, size_t errlen);
void loader_reset(DataLoader *dl);  // back to position 0, e.g. before each validation pass
// Target tokens per epoch (n_windows * T); 0 for "synthetic", which has no epochs.
uint64_t loader_tokens_per_epoch(const DataLoader *dl);
// "synthetic" only: the corpus's entropy rate in nats per token, i.e. the lowest reachable
// expected loss (about 1.27). Returns -1 for shard data.
double loader_synthetic_entropy(const DataLoader *dl);
void loader_close(DataLoader *dl);

#ifdef __cplusplus
}
#endif
