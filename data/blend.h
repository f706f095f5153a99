// data/blend.h: weighted blends of training data sources: parsing the data spec into sources and
// weights, and the schedule that says which source each sample position of the run draws from.
//
// Spec forms (docs/data.md, "Blends"):
//   "a.bin,b/*.bin"                      one source, today's form (also "synthetic")
//   "0.7:web/*.bin,0.3:code/*.bin"       WEIGHT:PATHS; an entry without a weight belongs to the
//                                        source before it, so "0.7:a.bin,b.bin,0.3:c.bin" is two sources
//   "web=0.7:web/*.bin,code=0.3:..."     NAME=WEIGHT:PATHS names a source (else the name is derived
//                                        from its first path: "data/web/web_train_*.bin" -> "web")
//   "0.7 web/prefix 0.3 code/prefix"     Megatron-LM's form: weights and paths separated by spaces
// The YAML list form of data.train (run/config.c) is written into the NAME=WEIGHT:PATHS form.
//
// Schedule: weights are normalized to sum to 1. Sample position p (counting every sample of every
// rank, in the loader's global order) goes to the source that is due soonest: among the sources s
// whose count c_s of samples so far is below w_s (p + 1) (taking one more keeps it within its
// share), the one with the earliest deadline (c_s + 1) / w_s, ties to the lower index. This is
// earliest-deadline-first on the proportional-fair ("Pfair") windows of Baruah et al.; it keeps
// |c_s(p) - w_s p| < 1 for every source and every prefix p, for any number of sources. (Megatron-LM's
// BlendedDataset takes the largest w_s max(p, 1) - c_s instead, a greedy rule that can drift further:
// 1.45 samples with three uneven weights.) The source-local index of the sample is c_s before it is
// counted, so each source is read as its own stream, in order.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BLEND_MAX_SOURCES 64
#define BLEND_NAME 32  // a name's bytes with its NUL: [A-Za-z0-9_.-], at most 31 characters

typedef struct {
  char name[BLEND_NAME];  // the log's "tokens/<name>"; unique in a blend
  double weight;          // normalized: a spec's weights sum to 1
  char *paths;            // the source's comma-separated paths/globs (malloc'd)
} BlendSource;

typedef struct {
  int n;         // sources, 1..BLEND_MAX_SOURCES
  int weighted;  // the spec gave weights (a plain spec is one source of weight 1)
  BlendSource src[BLEND_MAX_SOURCES];
} BlendSpec;

// Parses spec (no file is touched). Returns 0, or -1 with err naming the entry: a weight that is not
// a positive finite number, an entry before the first weight, a weight with no path, a bad or
// repeated name, too many sources. Free with blend_spec_free (also after a failure).
int blend_parse(const char *spec, BlendSpec *b, char *err, size_t errlen);
void blend_spec_free(BlendSpec *b);

// The schedule's state at a position: all a resume needs (with the weights).
typedef struct {
  int n;
  double weight[BLEND_MAX_SOURCES];   // normalized
  uint64_t pos;                       // samples drawn so far, all ranks together
  uint64_t count[BLEND_MAX_SOURCES];  // of them, from each source; they sum to pos
} BlendSchedule;

void blend_schedule_init(BlendSchedule *s, const BlendSpec *b);  // at position 0
// The source of sample position s->pos, and in *index its source-local index; then counts it.
int blend_next(BlendSchedule *s, uint64_t *index);
// Checks counts restored from a checkpoint: they sum to pos and each is within one sample of its
// share. Returns 0, or -1 with err naming the source.
int blend_check(const BlendSchedule *s, const BlendSpec *b, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
