// data/loader.c: see loader.h. Two kinds of source behind one window function: shards held in memory,
// and a synthetic Markov-chain corpus generated per window from (seed, window index); a blend draws
// from several sources by the schedule of data/blend.c.
#include "data/loader.h"

#include <glob.h>
#include <sys/stat.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "data/megatron.h"
#include "data/packed.h"
#include "data/shard.h"

// One shard's tokens: our shard format read into memory, or a Megatron-LM indexed dataset read in place
// (data/megatron.h). The loader reads them only through shard_window() below.
typedef struct {
  char *path;
  uint32_t *tokens;  // our shards
  TokenMap *mg;      // read in place: a Megatron dataset or a packed-binary shard (tokens NULL)
  uint64_t n_tokens;
  uint64_t first_window;  // global index of this shard's window 0
  uint64_t n_windows;
} LoadedShard;

// One source: its windows (shards) or the synthetic corpus, read as one stream of windows.
typedef struct {
  uint64_t seed;  // its window order, and for "synthetic" its language
  LoadedShard *shards;
  int n_shards;
  uint64_t n_windows;  // over all shards; 0 marks the synthetic source
  uint64_t *perm;      // shuffle=1: window order of epoch perm_epoch (NULL until first built)
  uint64_t perm_epoch;
  uint32_t *succ_base;  // synthetic: per context token, first of its successors (see synth_window)
} Source;

struct DataLoader {
  int B, T, rank, world, shuffle;
  uint64_t seed;
  uint32_t vocab_size;
  uint32_t *window;  // T+1 scratch tokens
  BlendSpec spec;    // the sources' names, weights and paths (one source of weight 1 if not a blend)
  Source *src;       // spec.n of them
  // sched.pos: window position of the next micro-batch's first row (rank 0), all ranks agree;
  // sched.count: windows drawn so far from each source (all ranks)
  BlendSchedule sched;
};

// Seeds an Rng from a tuple of 64-bit words, so distinct (seed, purpose, index) never share a stream.
static void rng_seed_tuple(Rng *r, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t words[3] = {a, b, c};
  rng_seed(r, hash64(words, sizeof(words), 0x6c6f61646572ull));
}

// ---------------------------------------------------------------------------------------------
// Synthetic corpus: an order-1 Markov chain. Token 0 stands for BOS, 1 for EOS, 2..V-1 are content.
// Each context c (BOS or a content token) has SYNTH_K successors 2 + (succ_base[c] + j) mod (V-2),
// j = 0..3, drawn with probabilities 1/2, 1/4, 1/8, 1/8. After a content token the document ends
// (EOS) with probability 1/32 instead; EOS is always followed by BOS. Document lengths are thus
// geometric with mean 32 content tokens. Window i starts at a BOS and is sampled from an Rng seeded
// by (seed, stream, i), so it needs no history: the state is just the window position.

enum { SYNTH_BOS = 0, SYNTH_EOS = 1, SYNTH_K = 4, SYNTH_MIN_VOCAB = 2 + SYNTH_K };
static const uint64_t SYNTH_TRAIN_STREAM = 1, SYNTH_HELDOUT_STREAM = 2, PERM_STREAM = 3;

static void synth_build(const DataLoader *dl, Source *src) {
  src->succ_base = xmalloc(sizeof(uint32_t) * dl->vocab_size);
  Rng r;
  rng_seed_tuple(&r, src->seed, 0, 0);  // the language depends on the seed only
  for (uint32_t c = 0; c < dl->vocab_size; c++) src->succ_base[c] = (uint32_t)(rng_u64(&r) % (dl->vocab_size - 2));
}

static void synth_window(const DataLoader *dl, const Source *src, uint64_t i, uint32_t *out, int n) {
  Rng r;
  rng_seed_tuple(&r, src->seed, dl->shuffle ? SYNTH_TRAIN_STREAM : SYNTH_HELDOUT_STREAM, i);
  uint32_t prev = SYNTH_BOS, content = dl->vocab_size - 2;
  out[0] = prev;
  for (int t = 1; t < n; t++) {
    uint64_t u = rng_u64(&r);
    uint32_t next;
    if (prev == SYNTH_EOS) next = SYNTH_BOS;
    else if (prev != SYNTH_BOS && (u >> 59) == 0) next = SYNTH_EOS;  // top 5 bits zero: p = 1/32
    else {
      // Low 3 bits pick j with p = 4/8, 2/8, 1/8, 1/8: exact dyadic probabilities, no floats.
      static const int pick[8] = {0, 0, 0, 0, 1, 1, 2, 3};
      next = 2 + (src->succ_base[prev] + (uint32_t)pick[u & 7]) % content;
    }
    out[t] = prev = next;
  }
}

// Entropy rate of the process above, in nats per token. Per document: BOS after EOS costs 0, the
// first token after BOS costs H(p), and each of the E[n] = 32 content tokens is followed by EOS or
// a successor, costing H_b(q) + (1-q) H(p). A document spans E[n] + 2 tokens.
static double synth_entropy(void) {
  const double p[SYNTH_K] = {0.5, 0.25, 0.125, 0.125}, q = 1.0 / 32;
  double hp = 0;
  for (int j = 0; j < SYNTH_K; j++) hp -= p[j] * log(p[j]);
  double h_content = -(q * log(q) + (1 - q) * log(1 - q)) + (1 - q) * hp, mean_len = 1 / q;
  return (hp + mean_len * h_content) / (mean_len + 2);
}

// ---------------------------------------------------------------------------------------------
// Shard source.

static void shard_window(const LoadedShard *s, uint64_t w, uint32_t *out, int n) {
  if (s->mg) token_map_read(s->mg, w * (uint64_t)(n - 1), out, n);
  else memcpy(out, s->tokens + w * (uint64_t)(n - 1), sizeof(uint32_t) * (size_t)n);
}

// Which shard holds the source's window w: binary search over first_window.
static const LoadedShard *shard_of(const Source *src, uint64_t w) {
  int lo = 0, hi = src->n_shards - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (src->shards[mid].first_window <= w) lo = mid;
    else hi = mid - 1;
  }
  return &src->shards[lo];
}

// Fisher-Yates shuffle seeded by (seed, epoch). The modulo bias of rng_u64() % (i+1) is below
// n/2^64, negligible next to anything a training run could notice.
static void build_perm(Source *src, uint64_t epoch) {
  if (!src->perm) src->perm = xmalloc(sizeof(uint64_t) * src->n_windows);
  for (uint64_t i = 0; i < src->n_windows; i++) src->perm[i] = i;
  Rng r;
  rng_seed_tuple(&r, src->seed, PERM_STREAM, epoch);
  for (uint64_t i = src->n_windows - 1; i > 0; i--) {
    uint64_t j = rng_u64(&r) % (i + 1), t = src->perm[i];
    src->perm[i] = src->perm[j];
    src->perm[j] = t;
  }
  src->perm_epoch = epoch;
}

// The source's window id at position p of its endless epoch sequence.
static uint64_t window_at(const DataLoader *dl, Source *src, uint64_t p) {
  uint64_t epoch = p / src->n_windows, k = p % src->n_windows;
  if (!dl->shuffle) return k;
  if (!src->perm || src->perm_epoch != epoch) build_perm(src, epoch);
  return src->perm[k];
}

// Window i of a source's stream into out (n = T+1 tokens).
static void source_window(const DataLoader *dl, Source *src, uint64_t i, uint32_t *out, int n) {
  if (src->succ_base) {
    synth_window(dl, src, i, out, n);
    return;
  }
  uint64_t w = window_at(dl, src, i);
  const LoadedShard *s = shard_of(src, w);
  shard_window(s, w - s->first_window, out, n);
}

// What to say when entry finds no file: that its directory does not exist, or that nothing in it
// matches; and for a shard pattern PREFIX_train_*.bin / PREFIX_val_*.bin, the command that makes them.
static void no_match(const char *item, char *err, size_t errlen) {
  char dir[1024], hint[1200] = "";
  const char *slash = strrchr(item, '/');
  if (slash == item) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - item) : 1, slash ? item : ".");
  const char *split = strstr(item, "_train_") ? strstr(item, "_train_") : strstr(item, "_val_");
  if (split && strstr(split, ".bin"))
    snprintf(hint, sizeof hint,
             "; make the shards with: ./train tokenize --tokenizer PATH/tokenizer.model --input CORPUS.jsonl[.zst] "
             "--output %.*s --val-docs 3 (README.md, Data preparation)",
             (int)(split - item), item);
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    set_err(err, errlen, "data spec entry '%s': the directory '%s' does not exist%s", item, dir, hint);
  else set_err(err, errlen, "data spec entry '%s' matches no file in '%s'%s", item, dir, hint);
}

// Splits spec at commas, expands each entry with glob(3) (sorted), and appends the paths.
static int expand_spec(const char *spec, char ***paths, int *n_paths, char *err, size_t errlen) {
  size_t len = strlen(spec);
  char *copy = xmalloc(len + 1);
  memcpy(copy, spec, len + 1);
  int rc = 0, cap = 0;
  *paths = NULL;
  *n_paths = 0;
  // strtok_r would skip empty entries silently; walk the commas by hand so ",," is an error.
  for (char *item = copy, *next; item; item = next) {
    next = strchr(item, ',');
    if (next) *next++ = 0;
    while (*item == ' ' || *item == '\t') item++;
    char *end = item + strlen(item);
    while (end > item && (end[-1] == ' ' || end[-1] == '\t')) *--end = 0;
    if (!*item) {
      set_err(err, errlen, "data spec '%s': empty entry", spec);
      rc = -1;
      break;
    }
    glob_t g;
    // no GLOB_ERR: a directory of the pattern that does not exist is a "no match", said in those words
    int gr = glob(item, 0, NULL, &g);
    if (gr == GLOB_NOMATCH && megatron_detect(item)) {  // a Megatron dataset named by its prefix
      *paths = grow_array(*paths, *n_paths, &cap, sizeof **paths);
      (*paths)[*n_paths] = xmalloc(strlen(item) + 1);
      memcpy((*paths)[(*n_paths)++], item, strlen(item) + 1);
      continue;
    }
    if (gr != 0) {
      if (gr == GLOB_NOMATCH) no_match(item, err, errlen);
      else set_err(err, errlen, "data spec entry '%s': glob failed (out of memory)", item);
      rc = -1;
      break;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
      *paths = grow_array(*paths, *n_paths, &cap, sizeof **paths);
      size_t plen = strlen(g.gl_pathv[i]);
      (*paths)[*n_paths] = xmalloc(plen + 1);
      memcpy((*paths)[(*n_paths)++], g.gl_pathv[i], plen + 1);
    }
    globfree(&g);
  }
  free(copy);
  return rc;
}

// Appends one shard to src->shards (its windows after the others').
static LoadedShard *add_shard(Source *src, int *cap) {
  src->shards = grow_array(src->shards, src->n_shards, cap, sizeof *src->shards);
  LoadedShard *s = &src->shards[src->n_shards++];
  memset(s, 0, sizeof *s);
  return s;
}

static void count_windows(const DataLoader *dl, Source *src, LoadedShard *s) {
  s->n_windows = s->n_tokens > (uint64_t)dl->T ? (s->n_tokens - 1) / (uint64_t)dl->T : 0;
  s->first_window = src->n_windows;
  src->n_windows += s->n_windows;
}

static int load_shards(const DataLoader *dl, Source *src, const char *spec, char *err, size_t errlen) {
  char **paths;
  int n = 0, rc = expand_spec(spec, &paths, &n, err, errlen);
  // Each path is a packed-binary manifest (or its folder), a Megatron dataset (a glob over its folder
  // lists its .bin and its .idx: keep one of the pair) or one of our shards.
  enum { OURS, MEGATRON, PACKED };
  int *kind = xcalloc((size_t)n + 1, sizeof(int)), kept = 0;
  for (int i = 0; rc == 0 && i < n; i++) {
    kind[kept] = packed_detect(paths[i]) ? PACKED : megatron_detect(paths[i]) ? MEGATRON : OURS;
    int dup = 0;
    for (int j = 0; kind[kept] == MEGATRON && j < kept && !dup; j++)
      dup = kind[j] == MEGATRON && megatron_same_dataset(paths[j], paths[i]);
    if (dup) free(paths[i]);
    else paths[kept++] = paths[i];
  }
  if (rc == 0) n = kept;
  // Our shards' headers first: a vocab mismatch or a corrupt header fails before any large read (the
  // other formats are validated when opened: an index or a manifest is all their header).
  for (int i = 0; rc == 0 && i < n; i++) {
    if (kind[i] != OURS) continue;
    ShardInfo info;
    rc = shard_read_info(paths[i], &info, err, errlen);
    if (rc == 0 && info.vocab_size > dl->vocab_size) {
      set_err(err, errlen, "shard %s: vocab_size %u exceeds the model's vocab_size %u", paths[i], info.vocab_size,
              dl->vocab_size);
      rc = -1;
    }
  }
  int cap = 0;
  for (int i = 0; rc == 0 && i < n; i++) {
    if (kind[i] == PACKED) {
      TokenMap *maps;
      int nm;
      rc = packed_open(paths[i], dl->vocab_size, &maps, &nm, err, errlen);
      for (int j = 0; rc == 0 && j < nm; j++) {
        LoadedShard *s = add_shard(src, &cap);
        s->mg = xmalloc(sizeof *s->mg);
        *s->mg = maps[j];
        size_t len = strlen(maps[j].bin_path);
        s->path = xmalloc(len + 1);
        memcpy(s->path, maps[j].bin_path, len + 1);
        s->n_tokens = maps[j].n_tokens;
        count_windows(dl, src, s);
      }
      if (rc == 0) free(maps);
      continue;
    }
    LoadedShard *s = add_shard(src, &cap);
    ShardInfo info = {0};
    if (kind[i] == MEGATRON) {
      s->mg = xcalloc(1, sizeof *s->mg);
      rc = megatron_open(paths[i], dl->vocab_size, s->mg, err, errlen);
      info.n_tokens = s->mg->n_tokens;
    } else rc = shard_read(paths[i], &s->tokens, &info, err, errlen);
    s->path = paths[i];
    paths[i] = NULL;  // owned by the shard now
    s->n_tokens = rc == 0 ? info.n_tokens : 0;
    count_windows(dl, src, s);
  }
  if (rc == 0 && src->n_windows == 0) {
    set_err(err, errlen, "data spec '%s': no shard holds T+1 = %d tokens", spec, dl->T + 1);
    rc = -1;
  }
  for (int i = 0; i < n; i++) free(paths[i]);
  free(paths), free(kind);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Public API.

// A blend's source i reads its own order (and synthetic language): seeded by (seed, i). A single
// source keeps the run's seed, so a plain spec reads exactly what it read before blends existed.
static uint64_t source_seed(uint64_t seed, int i, int blend) {
  if (!blend) return seed;
  uint64_t words[2] = {seed, (uint64_t)i};
  return hash64(words, sizeof(words), 0x626c656e64ull);  // "blend"
}

static int open_source(DataLoader *dl, Source *src, const char *spec, char *err, size_t errlen) {
  while (*spec == ' ') spec++;
  if (strcmp(spec, "synthetic") == 0) {
    if (dl->vocab_size < SYNTH_MIN_VOCAB)
      return set_err(err, errlen, "loader: synthetic data needs vocab_size >= %d, got %u", SYNTH_MIN_VOCAB,
                     dl->vocab_size);
    synth_build(dl, src);
    return 0;
  }
  return load_shards(dl, src, spec, err, errlen);
}

// Windows over all sources (0 for synthetic ones): the state's n_windows.
static uint64_t total_windows(const DataLoader *dl) {
  uint64_t n = 0;
  for (int i = 0; i < dl->spec.n; i++) n += dl->src[i].n_windows;
  return n;
}

DataLoader *loader_open(const char *spec, int B, int T, int rank, int world, uint64_t seed, int shuffle,
                        uint32_t vocab_size, char *err, size_t errlen) {
  if (B <= 0 || T <= 0 || world <= 0 || rank < 0 || rank >= world) {
    set_err(err, errlen, "loader: bad shape B=%d T=%d rank=%d world=%d", B, T, rank, world);
    return NULL;
  }
  if (vocab_size == 0 || vocab_size > (uint32_t)INT32_MAX) {
    set_err(err, errlen, "loader: vocab_size %u out of range", vocab_size);
    return NULL;
  }
  DataLoader *dl = xcalloc(1, sizeof(*dl));
  *dl = (DataLoader){
      .B = B, .T = T, .rank = rank, .world = world, .shuffle = shuffle ? 1 : 0, .seed = seed, .vocab_size = vocab_size};
  dl->window = xmalloc(sizeof(uint32_t) * ((size_t)T + 1));
  char msg[1024];
  if (blend_parse(spec, &dl->spec, msg, sizeof msg)) {
    set_err(err, errlen, "data spec '%s': %s", spec, msg);
    loader_close(dl);
    return NULL;
  }
  const int n = dl->spec.n, blend = n > 1;
  dl->src = xcalloc((size_t)n, sizeof *dl->src);
  for (int i = 0; i < n; i++) {
    dl->src[i].seed = source_seed(seed, i, blend);
    // A plain spec is opened as written, so its messages quote it unchanged.
    if (open_source(dl, &dl->src[i], dl->spec.weighted ? dl->spec.src[i].paths : spec, msg, sizeof msg)) {
      if (blend) set_err(err, errlen, "source %d ('%s'): %s", i + 1, dl->spec.src[i].name, msg);
      else set_err(err, errlen, "%s", msg);
      loader_close(dl);
      return NULL;
    }
  }
  blend_schedule_init(&dl->sched, &dl->spec);
  return dl;
}

void loader_next(DataLoader *dl, int *inputs, int *targets) {
  const int T = dl->T;
  // Every rank follows the schedule over the whole micro-batch of all ranks and reads its own rows.
  const uint64_t first = (uint64_t)dl->rank * (uint64_t)dl->B, all = (uint64_t)dl->B * (uint64_t)dl->world;
  for (uint64_t q = 0; q < all; q++) {
    uint64_t index;
    int s = blend_next(&dl->sched, &index);
    if (q < first || q >= first + (uint64_t)dl->B) continue;
    source_window(dl, &dl->src[s], index, dl->window, T + 1);
    size_t b = (size_t)(q - first);
    for (int t = 0; t < T; t++) {
      inputs[b * T + t] = (int)dl->window[t];
      targets[b * T + t] = (int)dl->window[t + 1];
    }
  }
}

void loader_get_state(const DataLoader *dl, LoaderState *s) {
  uint64_t n = total_windows(dl), pos = dl->sched.pos;
  s->seed = dl->seed;
  s->n_windows = n;
  s->epoch = n ? pos / n : 0;
  s->cursor = n ? pos % n : pos;
}

// The "blend" checkpoint section's layout, as docs/checkpoint_format.md gives it.
_Static_assert(sizeof(LoaderSourceState) == 64 && sizeof(LoaderBlendState) == 8 + 64 * BLEND_MAX_SOURCES,
               "LoaderBlendState is the documented 4104 bytes");

int loader_get_blend(const DataLoader *dl, LoaderBlendState *b) {
  memset(b, 0, sizeof *b);
  b->version = LOADER_BLEND_VERSION;
  b->n_sources = (uint32_t)dl->spec.n;
  for (int i = 0; i < dl->spec.n; i++) {
    LoaderSourceState *s = &b->src[i];
    memcpy(s->name, dl->spec.src[i].name, sizeof s->name);
    s->weight = dl->spec.src[i].weight;
    s->n_windows = dl->src[i].n_windows;
    s->samples = dl->sched.count[i];
    s->tokens = s->samples * (uint64_t)dl->T;
  }
  return dl->spec.n;
}

// A weight as the shortest decimal that reads back as the same double.
static const char *weight_text(double w, char *buf, size_t n) {
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, w);
    if (strtod(buf, NULL) == w) break;
  }
  return buf;
}

// "2 sources (web 0.75, code 0.25)" for messages.
static void describe_sources(const LoaderBlendState *b, char *buf, size_t n) {
  size_t o = (size_t)snprintf(buf, n, "%u source%s (", b->n_sources, b->n_sources == 1 ? "" : "s");
  for (uint32_t i = 0; i < b->n_sources && o < n; i++) {
    char w[32];
    o += (size_t)snprintf(buf + o, n - o, "%s%.*s %s", i ? ", " : "", BLEND_NAME, b->src[i].name,
                          weight_text(b->src[i].weight, w, sizeof w));
  }
  if (o < n) snprintf(buf + o, n - o, ")");
}

// The first difference between a checkpoint's blend (a) and this loader's (b), or 0.
static int blend_mismatch(const LoaderBlendState *a, const LoaderBlendState *b, char *err, size_t errlen) {
  char da[512], db[512], wa[32], wb[32];
  if (a->version != LOADER_BLEND_VERSION)
    return set_err(err, errlen, "the checkpoint's blend section has version %u, this build reads %u", a->version,
                   LOADER_BLEND_VERSION);
  describe_sources(a, da, sizeof da);
  describe_sources(b, db, sizeof db);
  if (a->n_sources != b->n_sources || a->n_sources > BLEND_MAX_SOURCES)
    return set_err(err, errlen, "the checkpoint blends %s, this run %s", da, db);
  for (uint32_t i = 0; i < a->n_sources; i++) {
    const LoaderSourceState *x = &a->src[i], *y = &b->src[i];
    if (strncmp(x->name, y->name, BLEND_NAME))
      return set_err(err, errlen, "source %u is '%.*s' in the checkpoint, '%.*s' in this run (checkpoint: %s; run: %s)",
                     i + 1, BLEND_NAME, x->name, BLEND_NAME, y->name, da, db);
    if (x->weight != y->weight)
      return set_err(err, errlen, "source '%.*s' has weight %s in the checkpoint, %s in this run (normalized weights)",
                     BLEND_NAME, y->name, weight_text(x->weight, wa, sizeof wa), weight_text(y->weight, wb, sizeof wb));
    if (x->n_windows != y->n_windows)
      return set_err(err, errlen,
                     "source '%.*s' has %llu windows in the checkpoint, %llu in this run (other shards or seq_len)",
                     BLEND_NAME, y->name, (unsigned long long)x->n_windows, (unsigned long long)y->n_windows);
  }
  return 0;
}

int loader_set_state(DataLoader *dl, const LoaderState *s, const LoaderBlendState *blend, char *err, size_t errlen) {
  // The blend first: a changed blend is named as such, not as "another data set".
  LoaderBlendState mine;
  loader_get_blend(dl, &mine);
  char desc[512];
  if (!blend && dl->spec.n > 1) {
    describe_sources(&mine, desc, sizeof desc);
    return set_err(err, errlen, "the checkpoint read one source, this run blends %s", desc);
  }
  if (blend && dl->spec.n == 1) {
    describe_sources(blend, desc, sizeof desc);
    return set_err(err, errlen, "the checkpoint blends %s, this run reads one source", desc);
  }
  if (blend && blend_mismatch(blend, &mine, err, errlen)) return -1;
  const uint64_t n_windows = total_windows(dl);
  if (s->seed != dl->seed || s->n_windows != n_windows) {
    set_err(err, errlen,
            "loader state is from another data set or seed (state: seed %llu, %llu windows; "
            "this loader: seed %llu, %llu windows)",
            (unsigned long long)s->seed, (unsigned long long)s->n_windows, (unsigned long long)dl->seed,
            (unsigned long long)n_windows);
    return -1;
  }
  uint64_t pos;
  if (n_windows == 0) {
    if (s->epoch != 0) {
      set_err(err, errlen, "loader state: epoch %llu for synthetic data, which has no epochs",
              (unsigned long long)s->epoch);
      return -1;
    }
    pos = s->cursor;
  } else {
    if (s->cursor >= n_windows || s->epoch > (UINT64_MAX - s->cursor) / n_windows) {
      set_err(err, errlen, "loader state: cursor %llu / epoch %llu out of range for %llu windows",
              (unsigned long long)s->cursor, (unsigned long long)s->epoch, (unsigned long long)n_windows);
      return -1;
    }
    pos = s->epoch * n_windows + s->cursor;
  }
  BlendSchedule sched = dl->sched;
  sched.pos = pos;
  for (int i = 0; i < dl->spec.n; i++) sched.count[i] = blend ? blend->src[i].samples : pos;
  if (blend && blend_check(&sched, &dl->spec, err, errlen)) return -1;
  dl->sched = sched;
  return 0;
}

int loader_n_sources(const DataLoader *dl) { return dl->spec.n; }

LoaderSourceInfo loader_source_info(const DataLoader *dl, int i) {
  return (LoaderSourceInfo){dl->spec.src[i].name, dl->spec.src[i].paths, dl->spec.src[i].weight,
                            dl->src[i].n_windows * (uint64_t)dl->T, dl->sched.count[i] * (uint64_t)dl->T};
}

void loader_reset(DataLoader *dl) { blend_schedule_init(&dl->sched, &dl->spec); }

uint64_t loader_tokens_per_epoch(const DataLoader *dl) { return total_windows(dl) * (uint64_t)dl->T; }

double loader_synthetic_entropy(const DataLoader *dl) {
  return dl->spec.n == 1 && dl->src[0].succ_base ? synth_entropy() : -1.0;
}

void loader_close(DataLoader *dl) {
  if (!dl) return;
  for (int k = 0; dl->src && k < dl->spec.n; k++) {
    Source *src = &dl->src[k];
    for (int i = 0; i < src->n_shards; i++) {
      free(src->shards[i].path);
      free(src->shards[i].tokens);
      if (src->shards[i].mg) token_map_close(src->shards[i].mg), free(src->shards[i].mg);
    }
    free(src->shards);
    free(src->perm);
    free(src->succ_base);
  }
  free(dl->src);
  blend_spec_free(&dl->spec);
  free(dl->window);
  free(dl);
}
