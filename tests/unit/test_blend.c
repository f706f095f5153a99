// tests/unit/test_blend.c: weighted blends of data sources (data/blend.h, the blended data/loader.c,
// the data.train forms of run/config.c): the spec forms and their errors; the schedule keeps every
// source within one sample of its share over every prefix; the blended loader is deterministic by
// seed, gives ranks disjoint rows whose union is world=1's, resumes exactly on another world size or
// micro-batch, counts each source's tokens, and refuses a checkpoint of another blend.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "data/blend.h"
#include "data/loader.h"
#include "data/shard.h"
#include "run/config.h"
#include "tests/test.h"

static char tmpdir[64];
static char made[16][256];  // files to delete at the end
static int n_made;

static const char *tmp_path(const char *name) {
  char *p = made[n_made++];
  snprintf(p, sizeof(made[0]), "%s/%s", tmpdir, name);
  return p;
}

// ---------------------------------------------------------------------------------------------
// The spec forms.

static void expect_parse_error(const char *spec, const char *piece1, const char *piece2) {
  BlendSpec b;
  char err[512] = "";
  CHECK(blend_parse(spec, &b, err, sizeof err) == -1, "'%s' should be refused", spec);
  CHECK(strstr(err, piece1) != NULL, "'%s': message '%s' lacks '%s'", spec, err, piece1);
  if (piece2) CHECK(strstr(err, piece2) != NULL, "'%s': message '%s' lacks '%s'", spec, err, piece2);
  blend_spec_free(&b);
}

static void test_parse(void) {
  TEST_SECTION("spec forms");
  BlendSpec b;
  char err[512] = "";
  CHECK(blend_parse("data/novels/nv_train_*.bin, extra.bin", &b, err, sizeof err) == 0, "%s", err);
  CHECK(b.n == 1 && !b.weighted && b.src[0].weight == 1.0, "a plain spec is one source of weight 1");
  CHECK(!strcmp(b.src[0].paths, "data/novels/nv_train_*.bin,extra.bin") && !strcmp(b.src[0].name, "nv"),
        "plain: paths '%s', name '%s'", b.src[0].paths, b.src[0].name);
  blend_spec_free(&b);
  CHECK(blend_parse("synthetic", &b, err, sizeof err) == 0 && b.n == 1 && !strcmp(b.src[0].name, "synthetic"),
        "synthetic: %s", err);
  blend_spec_free(&b);

  CHECK(blend_parse("0.75:data/web/web_train_*.bin,0.25:data/code/code_train_*.bin", &b, err, sizeof err) == 0, "%s",
        err);
  CHECK(b.n == 2 && b.weighted && b.src[0].weight == 0.75 && b.src[1].weight == 0.25, "weights %g %g", b.src[0].weight,
        b.src[1].weight);
  CHECK(!strcmp(b.src[0].name, "web") && !strcmp(b.src[1].name, "code"), "derived names '%s' '%s'", b.src[0].name,
        b.src[1].name);
  CHECK(!strcmp(b.src[1].paths, "data/code/code_train_*.bin"), "paths '%s'", b.src[1].paths);
  blend_spec_free(&b);

  // Names, unnormalized weights, and entries without a weight joining the source before them.
  CHECK(blend_parse("books=3:a.bin, b.bin,wiki=1:c/*.bin", &b, err, sizeof err) == 0, "%s", err);
  CHECK(b.n == 2 && !strcmp(b.src[0].name, "books") && !strcmp(b.src[1].name, "wiki"), "named sources");
  CHECK(!strcmp(b.src[0].paths, "a.bin,b.bin") && b.src[0].weight == 0.75 && b.src[1].weight == 0.25,
        "source 1: '%s' %g", b.src[0].paths, b.src[0].weight);
  blend_spec_free(&b);

  // Megatron-LM's form; Megatron prefixes and packed-binary manifests name their sources.
  CHECK(blend_parse("2 meg/corpus_text_document 6 d/olmo/manifest.json", &b, err, sizeof err) == 0, "%s", err);
  CHECK(b.n == 2 && !strcmp(b.src[0].name, "corpus") && !strcmp(b.src[1].name, "olmo"), "names '%s' '%s'",
        b.src[0].name, b.src[1].name);
  CHECK(b.src[0].weight == 0.25 && b.src[1].weight == 0.75 && !strcmp(b.src[1].paths, "d/olmo/manifest.json"),
        "Megatron form: %g %g '%s'", b.src[0].weight, b.src[1].weight, b.src[1].paths);
  blend_spec_free(&b);

  // Derived names that collide are numbered; a weight alone keeps a single source's plain order.
  CHECK(blend_parse("1:a/train_*.bin,1:b/train_*.bin", &b, err, sizeof err) == 0, "%s", err);
  CHECK(!strcmp(b.src[0].name, "train") && !strcmp(b.src[1].name, "train_2"), "'%s' '%s'", b.src[0].name,
        b.src[1].name);
  blend_spec_free(&b);
  CHECK(blend_parse("5:x.bin", &b, err, sizeof err) == 0 && b.n == 1 && b.weighted && b.src[0].weight == 1.0,
        "one weighted source: weight %g", b.src[0].weight);
  blend_spec_free(&b);

  expect_parse_error("0.5:a.bin,0:b.bin", "source 2 ('b')", "weight 0 is not a positive finite number");
  expect_parse_error("-1:a.bin,1:b.bin", "source 1 ('a')", "weight -1 is not a positive");
  expect_parse_error("1e999:a.bin,1:b.bin", "source 1 ('a')", "weight 1e999 is not a positive finite number");
  expect_parse_error("1e308:a.bin,1e308:b.bin", "sum overflows", NULL);
  expect_parse_error("a.bin,0.5:b.bin", "entry 'a.bin' has no weight", "WEIGHT:PATH");
  expect_parse_error("0.5:,0.5:b.bin", "entry '0.5:'", "no path after the weight");
  expect_parse_error("x=1:a.bin,x=1:b.bin", "sources 1 and 2 are both named 'x'", NULL);
  expect_parse_error("abcdefghijklmnopqrstuvwxyz0123456=1:a.bin", "longer than 31 characters", NULL);
  char many[2048] = "";
  for (int i = 0; i <= BLEND_MAX_SOURCES; i++)
    snprintf(many + strlen(many), sizeof many - strlen(many), "%s1:s%d.bin", i ? "," : "", i);
  expect_parse_error(many, "more than 64 sources", NULL);
}

// ---------------------------------------------------------------------------------------------
// The schedule.

// Runs n positions of a schedule over weights w (normalized here) and returns the largest
// |count_s(p) - w_s p| over every source and every prefix p = 1..n.
static double worst_lag(const double *w, int k, int n, int *picks) {
  BlendSpec b = {.n = k, .weighted = 1};
  double total = 0;
  for (int i = 0; i < k; i++) total += w[i];
  for (int i = 0; i < k; i++) b.src[i].weight = w[i] / total;
  BlendSchedule s;
  blend_schedule_init(&s, &b);
  double worst = 0;
  uint64_t seen[BLEND_MAX_SOURCES] = {0};
  int in_order = 1;
  for (int p = 0; p < n; p++) {
    uint64_t index;
    int src = blend_next(&s, &index);
    in_order &= index == seen[src]++;  // each source is read as its own stream, in order
    if (picks) picks[p] = src;
    for (int i = 0; i < k; i++) {
      double lag = fabs((double)s.count[i] - b.src[i].weight * (double)(p + 1));
      if (lag > worst) worst = lag;
    }
  }
  CHECK(in_order && s.pos == (uint64_t)n, "source-local indices count up from 0");
  return worst;
}

static void test_schedule(void) {
  TEST_SECTION("schedule");
  // 3:1 is exact every 4 samples: three of source 0, then one of source 1.
  static int picks[20000];
  const double w31[2] = {0.75, 0.25};
  double lag = worst_lag(w31, 2, 400, picks);
  int pattern = 1;
  for (int p = 0; p < 400; p++) pattern &= picks[p] == (p % 4 == 3);
  CHECK(pattern, "0.75/0.25 draws 0,0,0,1 repeated");
  CHECK(lag < 1, "0.75/0.25: worst lag %g", lag);

  // Within one sample of the exact share over every prefix, for 2 to 64 sources of very uneven weights.
  Rng r;
  rng_seed(&r, 11);
  const int ks[6] = {2, 3, 7, 12, 16, BLEND_MAX_SOURCES};
  for (int t = 0; t < 6; t++) {
    for (int trial = 0; trial < 4; trial++) {
      double w[BLEND_MAX_SOURCES];
      for (int i = 0; i < ks[t]; i++) {
        double u = rng_uniform(&r);
        w[i] = 1e-3 + u * u * u;  // some sources a thousand times rarer than others
      }
      lag = worst_lag(w, ks[t], 20000, NULL);
      CHECK(lag < 1, "%d sources (trial %d): a prefix is %.6f samples off its share", ks[t], trial, lag);
    }
  }

  // blend_check accepts the schedule's own counts and refuses others.
  BlendSpec b = {.n = 3, .weighted = 1};
  const char *names[3] = {"a", "b", "c"};
  const double w3[3] = {0.5, 0.3, 0.2};
  for (int i = 0; i < 3; i++) b.src[i].weight = w3[i], snprintf(b.src[i].name, BLEND_NAME, "%s", names[i]);
  BlendSchedule s;
  blend_schedule_init(&s, &b);
  for (int p = 0; p < 1001; p++) {
    uint64_t index;
    blend_next(&s, &index);
  }
  char err[512] = "";
  CHECK(blend_check(&s, &b, err, sizeof err) == 0, "own counts: %s", err);
  CHECK(s.count[0] + s.count[1] + s.count[2] == 1001 && s.count[0] >= 500 && s.count[0] <= 501, "counts %llu %llu %llu",
        (unsigned long long)s.count[0], (unsigned long long)s.count[1], (unsigned long long)s.count[2]);
  BlendSchedule bad = s;
  bad.count[1] += 2, bad.count[2] -= 2;
  CHECK(blend_check(&bad, &b, err, sizeof err) == -1 && strstr(err, "source 'b'") && strstr(err, "not within one"),
        "shifted counts: %s", err);
  bad = s;
  bad.count[0]++;
  CHECK(blend_check(&bad, &b, err, sizeof err) == -1 && strstr(err, "sum to 1002"), "counts off the position: %s", err);
}

// ---------------------------------------------------------------------------------------------
// The blended loader over shards. Source "web" holds two shards of values 10000 + j, source "code"
// one of 50000 + j, so a row's first token names its source and window.

enum { T = 16, WEB0 = 600, WEB1 = 333, CODE = 500, NW_WEB = (WEB0 - 1) / T + (WEB1 - 1) / T, NW_CODE = (CODE - 1) / T };
static char blend_spec[1024], web_spec[512];

static void write_shard(const char *path, uint32_t base, int n) {
  uint32_t tok[1000];
  for (int j = 0; j < n; j++) tok[j] = base + (uint32_t)j;
  ShardWriter *w = shard_writer_open(path, 65536, 0);
  shard_writer_append(w, tok, (size_t)n);
  if (shard_writer_close(w) != (uint64_t)n) die("write_shard %s", path);
}

static void make_sources(void) {
  const char *w0 = tmp_path("web_train_000000.bin"), *w1 = tmp_path("web_train_000001.bin");
  const char *c0 = tmp_path("code_train_000000.bin");
  write_shard(w0, 10000, WEB0);
  write_shard(w1, 20000, WEB1);
  write_shard(c0, 50000, CODE);
  snprintf(web_spec, sizeof web_spec, "%s/web_train_*.bin", tmpdir);
  snprintf(blend_spec, sizeof blend_spec, "0.75:%s,0.25:%s", web_spec, c0);
}

// A row's window: web windows 0..NW_WEB-1, code windows NW_WEB.. (-1: not a window start).
static int window_id(int first) {
  if (first >= 10000 && first < 10000 + (WEB0 - 1) / T * T && (first - 10000) % T == 0) return (first - 10000) / T;
  if (first >= 20000 && first < 20000 + (WEB1 - 1) / T * T && (first - 20000) % T == 0)
    return (WEB0 - 1) / T + (first - 20000) / T;
  if (first >= 50000 && first < 50000 + NW_CODE * T && (first - 50000) % T == 0) return NW_WEB + (first - 50000) / T;
  return -1;
}

static DataLoader *open_ok(const char *spec, int B, int rank, int world, uint64_t seed) {
  char err[512] = "";
  DataLoader *dl = loader_open(spec, B, T, rank, world, seed, 1, 65536, err, sizeof err);
  if (!dl) die("loader_open(%s): %s", spec, err);
  return dl;
}

// Window ids of the next n_steps batches (B rows each); checks that targets are the shifted inputs.
static void take(DataLoader *dl, int B, int n_steps, int *ids) {
  int in[8 * T], tg[8 * T], shifted = 1;
  for (int k = 0; k < n_steps; k++) {
    loader_next(dl, in, tg);
    for (int b = 0; b < B; b++) {
      ids[k * B + b] = window_id(in[b * T]);
      for (int t = 0; t < T; t++) shifted &= tg[b * T + t] == in[b * T + t] + 1;
    }
  }
  CHECK(shifted, "targets are the inputs shifted by one");
}

static int is_code(int id) { return id >= NW_WEB; }

static void test_loader(void) {
  TEST_SECTION("blended loader");
  make_sources();
  enum { B = 4, STEPS = 150, N = B * STEPS };  // 600 rows: web's 57 windows ~8 epochs, code's 31 ~5
  static int ids[N], ids2[N];
  DataLoader *dl = open_ok(blend_spec, B, 0, 1, 42);
  CHECK(loader_n_sources(dl) == 2, "two sources");
  LoaderSourceInfo web = loader_source_info(dl, 0), code = loader_source_info(dl, 1);
  CHECK(!strcmp(web.name, "web") && !strcmp(code.name, "code") && web.weight == 0.75 && code.weight == 0.25,
        "sources %s %g, %s %g", web.name, web.weight, code.name, code.weight);
  CHECK(web.tokens_per_epoch == (uint64_t)NW_WEB * T && code.tokens_per_epoch == (uint64_t)NW_CODE * T,
        "tokens/epoch %llu %llu", (unsigned long long)web.tokens_per_epoch, (unsigned long long)code.tokens_per_epoch);
  CHECK(loader_tokens_per_epoch(dl) == (uint64_t)(NW_WEB + NW_CODE) * T, "the blend's tokens/epoch");
  take(dl, B, STEPS, ids);
  int valid = 1, within = 1, n_code = 0;
  for (int p = 0; p < N; p++) {
    valid &= ids[p] >= 0;
    n_code += is_code(ids[p]);
    within &= fabs(n_code - 0.25 * (p + 1)) < 1;
  }
  CHECK(valid, "every row is a whole window of one source");
  CHECK(within && n_code == N / 4, "the code share is within one row of 1/4 over every prefix (%d of %d)", n_code, N);
  web = loader_source_info(dl, 0), code = loader_source_info(dl, 1);
  CHECK(web.tokens == (uint64_t)(N - n_code) * T && code.tokens == (uint64_t)n_code * T,
        "tokens per source: web %llu, code %llu", (unsigned long long)web.tokens, (unsigned long long)code.tokens);
  // Each source is its own stream: its epochs are permutations of its own windows, reshuffled.
  int web_seq[N], code_seq[N], nw = 0, nc = 0;
  for (int p = 0; p < N; p++) {
    if (is_code(ids[p])) code_seq[nc++] = ids[p];
    else web_seq[nw++] = ids[p];
  }
  char seen[NW_WEB + NW_CODE];
  int perm_ok = 1;
  for (int e = 0; e < 2; e++) {
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < NW_WEB; i++) perm_ok &= !seen[web_seq[e * NW_WEB + i]]++;
    for (int i = 0; i < NW_CODE; i++) perm_ok &= !seen[code_seq[e * NW_CODE + i]]++;
  }
  CHECK(perm_ok, "each source's first two epochs visit each of its windows once");
  CHECK(memcmp(web_seq, web_seq + NW_WEB, sizeof(int) * NW_WEB) != 0, "web's epoch 1 is reshuffled");

  // Deterministic by seed; another seed gives another order.
  DataLoader *same = open_ok(blend_spec, B, 0, 1, 42), *other = open_ok(blend_spec, B, 0, 1, 43);
  take(same, B, STEPS, ids2);
  CHECK(memcmp(ids, ids2, sizeof ids) == 0, "same seed, same rows");
  take(other, B, STEPS, ids2);
  CHECK(memcmp(ids, ids2, sizeof ids) != 0, "another seed, other rows");
  int same_sources = 1;
  for (int p = 0; p < N; p++) same_sources &= is_code(ids[p]) == is_code(ids2[p]);
  CHECK(same_sources, "the schedule depends on the weights only; the seed orders each source's windows");

  // Ranks: world=2 (B/2 each) and world=4 (B/4 each) together are world=1's rows, disjoint.
  for (int world = 2; world <= 4; world *= 2) {
    int ok = 1, disjoint = 1;
    static int part[4][N];
    for (int r = 0; r < world; r++) {
      DataLoader *x = open_ok(blend_spec, B / world, r, world, 42);
      take(x, B / world, STEPS, part[r]);
      loader_close(x);
    }
    for (int k = 0; k < STEPS; k++)
      for (int r = 0; r < world; r++)
        for (int b = 0; b < B / world; b++) ok &= part[r][k * (B / world) + b] == ids[k * B + r * (B / world) + b];
    // In the first 8 steps (32 rows: 24 of web's 57 windows, 8 of code's 31, no epoch wraps) no window
    // is read by two ranks.
    for (int r = 1; r < world; r++)
      for (int i = 0; i < 8 * B / world; i++)
        for (int j = 0; j < 8 * B / world; j++) disjoint &= part[r][i] != part[0][j];
    CHECK(ok, "%d ranks: rank r's rows are rows r*B/%d.. of world=1's batch at every step", world, world);
    CHECK(disjoint, "%d ranks read disjoint windows within an epoch", world);
  }

  // Resume: a state saved at step 37 continues exactly, on the same shape, on 2 ranks of B/2, on one
  // rank of B/2 (twice the accumulation) and on 4 ranks of B/4.
  DataLoader *x = open_ok(blend_spec, B, 0, 1, 42);
  take(x, B, 37, ids2);
  LoaderState ls;
  LoaderBlendState bs;
  loader_get_state(x, &ls);
  CHECK(loader_get_blend(x, &bs) == 2 && bs.version == LOADER_BLEND_VERSION && bs.n_sources == 2, "blend state");
  CHECK(bs.src[0].samples + bs.src[1].samples == 37 * B && bs.src[1].tokens == bs.src[1].samples * T &&
            bs.src[0].n_windows == NW_WEB && !strcmp(bs.src[1].name, "code"),
        "saved counts: web %llu, code %llu", (unsigned long long)bs.src[0].samples,
        (unsigned long long)bs.src[1].samples);
  CHECK(ls.n_windows == NW_WEB + NW_CODE && ls.epoch * ls.n_windows + ls.cursor == 37 * B, "saved position");
  const int shapes[4][2] = {{B, 1}, {B / 2, 2}, {B / 2, 1}, {B / 4, 4}};  // {micro-batch, world}
  for (int sh = 0; sh < 4; sh++) {
    int b = shapes[sh][0], world = shapes[sh][1], rows = 40 * B / world;
    int ok = 1;
    for (int r = 0; r < world; r++) {
      DataLoader *y = open_ok(blend_spec, b, r, world, 42);
      char err[512] = "";
      CHECK(loader_set_state(y, &ls, &bs, err, sizeof err) == 0, "%s", err);
      static int got[N];
      take(y, b, rows / b, got);
      // Step k of this shape covers global rows 37*B + k*b*world + [r*b, (r+1)*b).
      for (int k = 0; k < rows / b; k++)
        for (int i = 0; i < b; i++) ok &= got[k * b + i] == ids[37 * B + k * b * world + r * b + i];
      loader_close(y);
    }
    CHECK(ok, "resumed with micro-batch %d on %d rank(s): exactly the rows world=1 reads next", b, world);
  }

  // A checkpoint of another blend, or of no blend, is refused, naming what changed.
  char err[512] = "", spec[1200];
  DataLoader *plain = open_ok(web_spec, B, 0, 1, 42);
  CHECK(loader_set_state(plain, &ls, &bs, err, sizeof err) == -1 && strstr(err, "the checkpoint blends 2 sources") &&
            strstr(err, "web 0.75, code 0.25"),
        "blend into a single source: %s", err);
  LoaderState pls;
  loader_get_state(plain, &pls);
  CHECK(loader_set_state(x, &pls, NULL, err, sizeof err) == -1 && strstr(err, "the checkpoint read one source"),
        "single source into a blend: %s", err);
  snprintf(spec, sizeof spec, "0.7:%s,0.3:%s/code_train_*.bin", web_spec, tmpdir);
  DataLoader *reweighed = open_ok(spec, B, 0, 1, 42);
  CHECK(loader_set_state(reweighed, &ls, &bs, err, sizeof err) == -1 &&
            strstr(err, "source 'web' has weight 0.75 in the checkpoint, 0.7 in this run"),
        "other weights: %s", err);
  snprintf(spec, sizeof spec, "0.75:%s,prog=0.25:%s/code_train_*.bin", web_spec, tmpdir);
  DataLoader *renamed = open_ok(spec, B, 0, 1, 42);
  CHECK(loader_set_state(renamed, &ls, &bs, err, sizeof err) == -1 &&
            strstr(err, "source 2 is 'code' in the checkpoint, 'prog' in this run"),
        "renamed source: %s", err);
  snprintf(spec, sizeof spec, "2:%s,1:%s/code_train_*.bin,1:synthetic", web_spec, tmpdir);
  DataLoader *three = open_ok(spec, B, 0, 1, 42);
  CHECK(loader_set_state(three, &ls, &bs, err, sizeof err) == -1 &&
            strstr(err,
                   "the checkpoint blends 2 sources (web 0.75, code 0.25), this run 3 sources (web 0.5, code "
                   "0.25, synthetic 0.25)"),
        "a third source: %s", err);
  snprintf(spec, sizeof spec, "0.75:%s/web_train_000000.bin,0.25:%s/code_train_*.bin", tmpdir, tmpdir);
  DataLoader *fewer = open_ok(spec, B, 0, 1, 42);
  CHECK(loader_set_state(fewer, &ls, &bs, err, sizeof err) == -1 &&
            strstr(err, "source 'web' has 57 windows in the checkpoint, 37 in this run"),
        "a source with fewer shards: %s", err);
  LoaderBlendState tampered = bs;
  tampered.src[0].samples += 3, tampered.src[1].samples -= 3;
  DataLoader *y = open_ok(blend_spec, B, 0, 1, 42);
  CHECK(loader_set_state(y, &ls, &tampered, err, sizeof err) == -1 && strstr(err, "not within one of its share"),
        "counts off the schedule: %s", err);
  tampered = bs;
  tampered.version = 2;
  CHECK(loader_set_state(y, &ls, &tampered, err, sizeof err) == -1 && strstr(err, "version 2"), "version: %s", err);

  // One weighted source reads what the plain spec reads; a source that finds no file is named.
  snprintf(spec, sizeof spec, "1:%s", web_spec);
  DataLoader *one = open_ok(spec, B, 0, 1, 42), *ref = open_ok(web_spec, B, 0, 1, 42);
  take(one, B, 20, ids);
  take(ref, B, 20, ids2);
  CHECK(memcmp(ids, ids2, sizeof(int) * 20 * B) == 0 && loader_n_sources(one) == 1, "'1:PATHS' reads as 'PATHS'");
  snprintf(spec, sizeof spec, "0.5:%s,0.5:%s/math_train_*.bin", web_spec, tmpdir);
  CHECK(loader_open(spec, B, T, 0, 1, 42, 1, 65536, err, sizeof err) == NULL && strstr(err, "source 2 ('math')") &&
            strstr(err, "matches no file"),
        "a missing source is named: %s", err);
  CHECK(loader_open("0.5:a.bin,-0.5:b.bin", B, T, 0, 1, 42, 1, 65536, err, sizeof err) == NULL &&
            strstr(err, "weight -0.5 is not a positive finite number"),
        "bad weight at open: %s", err);

  DataLoader *all[] = {dl, same, other, x, plain, reweighed, renamed, three, fewer, y, one, ref};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) loader_close(all[i]);
}

// Synthetic sources blend too: two languages (seeded per source), in their shares.
static void test_synthetic_blend(void) {
  TEST_SECTION("synthetic sources");
  char err[512] = "";
  DataLoader *a = loader_open("a=3:synthetic,b=1:synthetic", 8, 32, 0, 1, 5, 1, 512, err, sizeof err);
  CHECK(a != NULL, "%s", err);
  if (!a) return;
  static int in[8 * 32], tg[8 * 32];
  for (int k = 0; k < 10; k++) loader_next(a, in, tg);
  LoaderSourceInfo sa = loader_source_info(a, 0), sb = loader_source_info(a, 1);
  CHECK(sa.tokens == 60 * 32 && sb.tokens == 20 * 32 && sa.tokens_per_epoch == 0, "synthetic shares: %llu %llu tokens",
        (unsigned long long)sa.tokens, (unsigned long long)sb.tokens);
  CHECK(loader_synthetic_entropy(a) < 0, "a blend has no single entropy floor");
  loader_close(a);
}

// ---------------------------------------------------------------------------------------------
// data.train in the config: the YAML list form, the string form, their errors.

static int load(TrainConfig *c, const char *yaml, char *err, size_t n) {
  config_defaults(c);
  err[0] = 0;
  return config_load_string(c, yaml, strlen(yaml), "t.yaml", err, n);
}

static void expect_config_error(const char *yaml, const char *piece1, const char *piece2) {
  TrainConfig c;
  char err[1024];
  CHECK(load(&c, yaml, err, sizeof err) == -1, "<<%s>> should be refused", yaml);
  CHECK(strstr(err, piece1) != NULL, "message '%s' lacks '%s'", err, piece1);
  if (piece2) CHECK(strstr(err, piece2) != NULL, "message '%s' lacks '%s'", err, piece2);
}

static void test_config(void) {
  TEST_SECTION("data.train in the config");
  TrainConfig c;
  char err[1024];
  const char *yaml =
      "data:\n"
      "  train:\n"
      "    - {path: \"data/web/web_train_*.bin\", weight: 0.7}\n"
      "    - {path: [c/a.bin, c/b.bin], weight: 0.3, name: code}\n";
  CHECK(load(&c, yaml, err, sizeof err) == 0, "%s", err);
  CHECK(!strcmp(c.train_data, "0.7:data/web/web_train_*.bin,code=0.3:c/a.bin,c/b.bin"), "list form read as '%s'",
        c.train_data);
  // --print-config writes the string form, which loads back to the same config.
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  config_write_yaml(&c, f);
  fclose(f);
  TrainConfig back;
  CHECK(load(&back, buf, err, sizeof err) == 0 && !strcmp(back.train_data, c.train_data), "round trip: %s", err);
  free(buf);
  CHECK(load(&c, "data:\n  train:\n    - path: x/web_train_*.bin\n      weight: 3\n", err, sizeof err) == 0 &&
            !strcmp(c.train_data, "3:x/web_train_*.bin"),
        "block mapping: '%s' %s", c.train_data, err);

  expect_config_error("data:\n  train:\n    - {path: a.bin, weight: 1}\n    - {path: b.bin, weight: -0.3}\n",
                      "t.yaml:4: data.train[1].weight: expected a positive finite number, got '-0.3'", NULL);
  expect_config_error("data:\n  train:\n    - {path: a.bin, weight: 0}\n", "data.train[0].weight", "got '0'");
  expect_config_error("data:\n  train:\n    - {path: a.bin, weight: .inf}\n", "data.train[0].weight", "got '.inf'");
  expect_config_error("data:\n  train:\n    - {path: a.bin, weight: lots}\n", "data.train[0].weight", "got 'lots'");
  expect_config_error("data:\n  train:\n    - {path: a.bin}\n", "t.yaml:3: data.train[0]: needs a weight", NULL);
  expect_config_error("data:\n  train:\n    - {weight: 1}\n", "data.train[0]: needs a path", NULL);
  expect_config_error("data:\n  train:\n    - {path: a.bin, wieght: 1}\n", "data.train[0].wieght: unknown key", NULL);
  expect_config_error("data:\n  train:\n    - {path: a.bin, weight: 1, name: 'my web'}\n",
                      "data.train[0].name: 'my web': use letters", NULL);
  expect_config_error("data:\n  train:\n    - path: a.bin\n      weight: -2\n",
                      "t.yaml:4: data.train[0].weight: expected a positive finite number, got '-2'", NULL);
  CHECK(load(&c, "data:\n  train:\n    - {path: a.bin, weight: 1, name: web}\n    - {path: b.bin, weight: 1}\n", err,
             sizeof err) == 0 &&
            !strcmp(c.train_data, "web=1:a.bin,1:b.bin"),
        "a source without a name after a named one: '%s' %s", c.train_data, err);
  expect_config_error("data:\n  train:\n    - a.bin\n", "data.train[0]: expected a mapping", NULL);
  expect_config_error("data:\n  train: []\n", "data.train: an empty list", NULL);
  expect_config_error(
      "data:\n  train:\n    - {path: a.bin, weight: 1, name: x}\n    - {path: b.bin, weight: 1, name: x}\n",
      "t.yaml:2: data.train: sources 1 and 2 are both named 'x'", NULL);
  // The string form (--set) is checked by config_validate, naming the key and the source.
  config_defaults(&c);
  CHECK(config_set(&c, "data.train=0.5:a.bin,-1:b.bin", err, sizeof err) == 0, "%s", err);
  CHECK(config_validate(&c, "--set", err, sizeof err) == -1 &&
            strstr(err, "data.train: source 2 ('b'): weight -1 is not a positive finite number"),
        "string form: %s", err);
  CHECK(config_set(&c, "data.train=0.5:a.bin,0.5:b.bin", err, sizeof err) == 0 &&
            config_validate(&c, "--set", err, sizeof err) == 0,
        "a good string form validates: %s", err);
  CHECK(config_set(&c, "data.val=1:a.bin,x:b.bin", err, sizeof err) == 0 &&
            config_validate(&c, "--set", err, sizeof err) == 0,
        "data.val: 'x:b.bin' is a path of the weighted source: %s", err);
  CHECK(config_set(&c, "data.val=a.bin,0.5:b.bin", err, sizeof err) == 0 &&
            config_validate(&c, "--set", err, sizeof err) == -1 && strstr(err, "data.val: entry 'a.bin' has no weight"),
        "data.val is checked too: %s", err);
}

int main(void) {
  snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_blend_XXXXXX");
  if (!mkdtemp(tmpdir)) die("mkdtemp failed");
  test_parse();
  test_schedule();
  test_loader();
  test_synthetic_blend();
  test_config();
  for (int i = 0; i < n_made; i++) unlink(made[i]);
  rmdir(tmpdir);
  TEST_END();
}
