// data/loader.c: see loader.h. Two sources behind one window function: shards held in memory, and
// a synthetic Markov-chain corpus generated per window from (seed, window index).
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

struct DataLoader {
  int B, T, rank, world, shuffle;
  uint64_t seed;
  uint32_t vocab_size;
  uint64_t pos;      // window position of the next micro-batch's first row (rank 0), all ranks agree
  uint32_t *window;  // T+1 scratch tokens

  // shard source
  LoadedShard *shards;
  int n_shards;
  uint64_t n_windows;  // over all shards; 0 marks the synthetic source
  uint64_t *perm;      // shuffle=1: window order of epoch perm_epoch (NULL until first built)
  uint64_t perm_epoch;

  // synthetic source
  uint32_t *succ_base;  // per context token: first of its successors (see synth_window)
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

static void synth_build(DataLoader *dl) {
  dl->succ_base = xmalloc(sizeof(uint32_t) * dl->vocab_size);
  Rng r;
  rng_seed_tuple(&r, dl->seed, 0, 0);  // the language depends on the seed only
  for (uint32_t c = 0; c < dl->vocab_size; c++) dl->succ_base[c] = (uint32_t)(rng_u64(&r) % (dl->vocab_size - 2));
}

static void synth_window(const DataLoader *dl, uint64_t i, uint32_t *out, int n) {
  Rng r;
  rng_seed_tuple(&r, dl->seed, dl->shuffle ? SYNTH_TRAIN_STREAM : SYNTH_HELDOUT_STREAM, i);
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
      next = 2 + (dl->succ_base[prev] + (uint32_t)pick[u & 7]) % content;
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

// Which shard holds global window w: binary search over first_window.
static const LoadedShard *shard_of(const DataLoader *dl, uint64_t w) {
  int lo = 0, hi = dl->n_shards - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (dl->shards[mid].first_window <= w) lo = mid;
    else hi = mid - 1;
  }
  return &dl->shards[lo];
}

// Fisher-Yates shuffle seeded by (seed, epoch). The modulo bias of rng_u64() % (i+1) is below
// n/2^64, negligible next to anything a training run could notice.
static void build_perm(DataLoader *dl, uint64_t epoch) {
  if (!dl->perm) dl->perm = xmalloc(sizeof(uint64_t) * dl->n_windows);
  for (uint64_t i = 0; i < dl->n_windows; i++) dl->perm[i] = i;
  Rng r;
  rng_seed_tuple(&r, dl->seed, PERM_STREAM, epoch);
  for (uint64_t i = dl->n_windows - 1; i > 0; i--) {
    uint64_t j = rng_u64(&r) % (i + 1), t = dl->perm[i];
    dl->perm[i] = dl->perm[j];
    dl->perm[j] = t;
  }
  dl->perm_epoch = epoch;
}

// Global window id at position p of the endless epoch sequence.
static uint64_t window_at(DataLoader *dl, uint64_t p) {
  uint64_t epoch = p / dl->n_windows, k = p % dl->n_windows;
  if (!dl->shuffle) return k;
  if (!dl->perm || dl->perm_epoch != epoch) build_perm(dl, epoch);
  return dl->perm[k];
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

// Appends one source to dl->shards (its windows after the others').
static LoadedShard *add_shard(DataLoader *dl, int *cap) {
  dl->shards = grow_array(dl->shards, dl->n_shards, cap, sizeof *dl->shards);
  LoadedShard *s = &dl->shards[dl->n_shards++];
  memset(s, 0, sizeof *s);
  return s;
}

static void count_windows(DataLoader *dl, LoadedShard *s) {
  s->n_windows = s->n_tokens > (uint64_t)dl->T ? (s->n_tokens - 1) / (uint64_t)dl->T : 0;
  s->first_window = dl->n_windows;
  dl->n_windows += s->n_windows;
}

static int load_shards(DataLoader *dl, const char *spec, char *err, size_t errlen) {
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
        LoadedShard *s = add_shard(dl, &cap);
        s->mg = xmalloc(sizeof *s->mg);
        *s->mg = maps[j];
        size_t len = strlen(maps[j].bin_path);
        s->path = xmalloc(len + 1);
        memcpy(s->path, maps[j].bin_path, len + 1);
        s->n_tokens = maps[j].n_tokens;
        count_windows(dl, s);
      }
      if (rc == 0) free(maps);
      continue;
    }
    LoadedShard *s = add_shard(dl, &cap);
    ShardInfo info = {0};
    if (kind[i] == MEGATRON) {
      s->mg = xcalloc(1, sizeof *s->mg);
      rc = megatron_open(paths[i], dl->vocab_size, s->mg, err, errlen);
      info.n_tokens = s->mg->n_tokens;
    } else rc = shard_read(paths[i], &s->tokens, &info, err, errlen);
    s->path = paths[i];
    paths[i] = NULL;  // owned by the shard now
    s->n_tokens = rc == 0 ? info.n_tokens : 0;
    count_windows(dl, s);
  }
  if (rc == 0 && dl->n_windows == 0) {
    set_err(err, errlen, "data spec '%s': no shard holds T+1 = %d tokens", spec, dl->T + 1);
    rc = -1;
  }
  for (int i = 0; i < n; i++) free(paths[i]);
  free(paths), free(kind);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Public API.

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
  while (*spec == ' ') spec++;
  if (strcmp(spec, "synthetic") == 0) {
    if (vocab_size < SYNTH_MIN_VOCAB) {
      set_err(err, errlen, "loader: synthetic data needs vocab_size >= %d, got %u", SYNTH_MIN_VOCAB, vocab_size);
      loader_close(dl);
      return NULL;
    }
    synth_build(dl);
  } else if (load_shards(dl, spec, err, errlen) != 0) {
    loader_close(dl);
    return NULL;
  }
  return dl;
}

void loader_next(DataLoader *dl, int *inputs, int *targets) {
  const int T = dl->T;
  for (int b = 0; b < dl->B; b++) {
    uint64_t p = dl->pos + (uint64_t)dl->rank * (uint64_t)dl->B + (uint64_t)b;
    if (dl->succ_base) {
      synth_window(dl, p, dl->window, T + 1);
    } else {
      uint64_t w = window_at(dl, p);
      const LoadedShard *s = shard_of(dl, w);
      shard_window(s, w - s->first_window, dl->window, T + 1);
    }
    for (int t = 0; t < T; t++) {
      inputs[(size_t)b * T + t] = (int)dl->window[t];
      targets[(size_t)b * T + t] = (int)dl->window[t + 1];
    }
  }
  dl->pos += (uint64_t)dl->B * (uint64_t)dl->world;
}

void loader_get_state(const DataLoader *dl, LoaderState *s) {
  s->seed = dl->seed;
  s->n_windows = dl->n_windows;
  s->epoch = dl->n_windows ? dl->pos / dl->n_windows : 0;
  s->cursor = dl->n_windows ? dl->pos % dl->n_windows : dl->pos;
}

int loader_set_state(DataLoader *dl, const LoaderState *s, char *err, size_t errlen) {
  if (s->seed != dl->seed || s->n_windows != dl->n_windows) {
    set_err(err, errlen,
            "loader state is from another data set or seed (state: seed %llu, %llu windows; "
            "this loader: seed %llu, %llu windows)",
            (unsigned long long)s->seed, (unsigned long long)s->n_windows, (unsigned long long)dl->seed,
            (unsigned long long)dl->n_windows);
    return -1;
  }
  if (dl->n_windows == 0) {
    if (s->epoch != 0) {
      set_err(err, errlen, "loader state: epoch %llu for synthetic data, which has no epochs",
              (unsigned long long)s->epoch);
      return -1;
    }
    dl->pos = s->cursor;
    return 0;
  }
  if (s->cursor >= dl->n_windows || s->epoch > (UINT64_MAX - s->cursor) / dl->n_windows) {
    set_err(err, errlen, "loader state: cursor %llu / epoch %llu out of range for %llu windows",
            (unsigned long long)s->cursor, (unsigned long long)s->epoch, (unsigned long long)dl->n_windows);
    return -1;
  }
  dl->pos = s->epoch * dl->n_windows + s->cursor;
  return 0;
}

void loader_reset(DataLoader *dl) { dl->pos = 0; }

uint64_t loader_tokens_per_epoch(const DataLoader *dl) { return dl->n_windows * (uint64_t)dl->T; }

double loader_synthetic_entropy(const DataLoader *dl) { return dl->succ_base ? synth_entropy() : -1.0; }

void loader_close(DataLoader *dl) {
  if (!dl) return;
  for (int i = 0; i < dl->n_shards; i++) {
    free(dl->shards[i].path);
    free(dl->shards[i].tokens);
    if (dl->shards[i].mg) token_map_close(dl->shards[i].mg), free(dl->shards[i].mg);
  }
  free(dl->shards);
  free(dl->perm);
  free(dl->succ_base);
  free(dl->window);
  free(dl);
}
