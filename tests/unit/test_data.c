// tests/unit/test_data.c: token shards (round trip, corruption detection) and the data loader (shifted
// targets, determinism, rank sharding, epoch wrap, exact resume, validation order, synthetic corpus).
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "data/loader.h"
#include "data/shard.h"
#include "tests/test.h"

static char tmpdir[64];
static const char *big_vocab_shard;  // a vocab-128256 shard from the round trip
static char made[64][256];           // files to delete at the end
static int n_made;

static const char *tmp_path(const char *name) {
  char *p = made[n_made++];
  snprintf(p, sizeof(made[0]), "%s/%s", tmpdir, name);
  return p;
}

static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = xfopen(path, "wb");
  if (n) xfwrite(p, 1, n, f, path);
  fclose(f);
}

// Documents of pseudo-random length, each BOS, content..., EOS; content ids in [2, vocab) and
// avoiding bos/eos. Returns the token count.
static size_t make_docs(uint32_t *out, size_t cap, uint32_t vocab, uint32_t bos, uint32_t eos, uint64_t seed) {
  Rng r;
  rng_seed(&r, seed);
  size_t n = 0;
  while (n + 2 < cap) {
    size_t len = 1 + rng_u64(&r) % 300;
    if (n + len + 2 > cap) len = cap - n - 2;
    out[n++] = bos;
    for (size_t i = 0; i < len; i++) {
      uint32_t t;
      do t = 2 + (uint32_t)(rng_u64(&r) % (vocab - 2));
      while (t == bos || t == eos);
      out[n++] = t;
    }
    out[n++] = eos;
  }
  return n;
}

// The documented token checksum, computed independently of the writer: the tokens as little-endian
// bytes, hash64 chained over SHARD_CHUNK_BYTES chunks starting from seed 0.
static uint64_t hash64_chunked_ref(const uint32_t *tok, size_t n, uint32_t tb) {
  unsigned char *bytes = xmalloc(n * tb + 1);
  for (size_t i = 0; i < n; i++)
    for (uint32_t k = 0; k < tb; k++) bytes[i * tb + k] = (unsigned char)(tok[i] >> (8 * k));
  uint64_t h = 0;
  for (size_t off = 0; off < n * tb; off += SHARD_CHUNK_BYTES) {
    size_t len = n * tb - off < SHARD_CHUNK_BYTES ? n * tb - off : SHARD_CHUNK_BYTES;
    h = hash64(bytes + off, len, h);
  }
  free(bytes);
  return h;
}

static void write_shard(const char *path, uint32_t vocab, int level, const uint32_t *tok, size_t n) {
  ShardWriter *w = shard_writer_open(path, vocab, level);
  // Uneven appends, so chunk boundaries fall inside appends.
  size_t done = 0, step = 1;
  while (done < n) {
    size_t k = n - done < step ? n - done : step;
    shard_writer_append(w, tok + done, k);
    done += k;
    step = step * 3 + 7;
  }
  uint64_t written = shard_writer_close(w);
  if (written != n) die("write_shard %s: wrote %llu of %zu", path, (unsigned long long)written, n);
}

static void test_round_trip(void) {
  TEST_SECTION("shard round trip");
  const size_t cap = 700000;  // > one 1 MiB chunk at both token widths
  uint32_t *tok = xmalloc(cap * sizeof(uint32_t));
  struct {
    uint32_t vocab, bos, eos;
    int level;
    const char *name;
  } cases[] = {
      {512, 0, 1, 0, "rt_512_raw.bin"},
      {512, 0, 1, 3, "rt_512_zstd.bin"},
      {128256, SHARD_BOS_ID, SHARD_EOS_ID, 0, "rt_128k_raw.bin"},
      {128256, SHARD_BOS_ID, SHARD_EOS_ID, 3, "rt_128k_zstd.bin"},
  };
  uint64_t checksum_raw = 0;
  for (int c = 0; c < 4; c++) {
    size_t n = make_docs(tok, cap, cases[c].vocab, cases[c].bos, cases[c].eos, 1000 + cases[c].vocab);
    const char *path = tmp_path(cases[c].name);
    if (cases[c].vocab > 65536) big_vocab_shard = path;
    write_shard(path, cases[c].vocab, cases[c].level, tok, n);
    char tmp[300];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0, "%s left behind", tmp);

    ShardInfo info;
    char err[512] = "";
    CHECK(shard_read_info(path, &info, err, sizeof(err)) == 0, "%s", err);
    uint32_t tb = cases[c].vocab <= 65536 ? 2 : 4;
    CHECK(info.version == SHARD_VERSION, "version %u", info.version);
    CHECK(info.vocab_size == cases[c].vocab, "vocab %u", info.vocab_size);
    CHECK(info.token_bytes == tb, "token_bytes %u", info.token_bytes);
    CHECK(info.compression == (cases[c].level ? SHARD_COMPRESS_ZSTD : SHARD_COMPRESS_NONE), "compression %u",
          info.compression);
    CHECK(info.n_tokens == n, "n_tokens %llu vs %zu", (unsigned long long)info.n_tokens, n);
    if (cases[c].level == 0)
      CHECK(info.payload_bytes == n * tb, "raw payload %llu", (unsigned long long)info.payload_bytes);
    else
      CHECK(info.payload_bytes < n * tb, "zstd payload %llu not smaller than raw",
            (unsigned long long)info.payload_bytes);
    CHECK(info.checksum == hash64_chunked_ref(tok, n, tb), "checksum differs from the documented definition");
    // The checksum covers the uncompressed tokens, so raw and zstd shards of the same tokens agree.
    if (cases[c].level == 0) checksum_raw = info.checksum;
    else
      CHECK(info.checksum == checksum_raw, "zstd checksum %llx vs raw %llx", (unsigned long long)info.checksum,
            (unsigned long long)checksum_raw);

    uint32_t *back = NULL;
    ShardInfo info2;
    CHECK(shard_read(path, &back, &info2, err, sizeof(err)) == 0, "%s", err);
    CHECK(back && memcmp(back, tok, n * sizeof(uint32_t)) == 0, "%s: tokens differ after round trip", path);
    CHECK(back && back[0] == cases[c].bos && back[n - 1] == cases[c].eos, "documents keep their BOS/EOS");
    CHECK(info2.checksum == info.checksum && info2.n_tokens == n, "shard_read info agrees with shard_read_info");
    free(back);
  }
  // Empty shards are valid, raw and zstd.
  for (int level = 0; level <= 1; level++) {
    const char *path = tmp_path(level ? "empty_zstd.bin" : "empty_raw.bin");
    write_shard(path, 512, level, NULL, 0);
    uint32_t *back = NULL;
    ShardInfo info;
    char err[512] = "";
    CHECK(shard_read(path, &back, &info, err, sizeof(err)) == 0, "%s", err);
    CHECK(info.n_tokens == 0, "empty shard has %llu tokens", (unsigned long long)info.n_tokens);
    free(back);
  }
  free(tok);
}

// Returns the file at path as bytes (caller frees).
static unsigned char *slurp(const char *path, size_t *n) { return (unsigned char *)read_file(path, n); }

static void put_u32le(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64le(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

// Writes a corrupted copy and checks shard_read fails with a message naming the path and each key.
static void expect_bad(const char *name, const unsigned char *bytes, size_t n, const char *key1, const char *key2) {
  const char *path = tmp_path(name);
  write_bytes(path, bytes, n);
  char err[512] = "";
  uint32_t sentinel, *tok = &sentinel;  // shard_read must set it to NULL
  ShardInfo info;
  int rc = shard_read(path, &tok, &info, err, sizeof(err));
  CHECK(rc == -1, "%s: shard_read returned %d", name, rc);
  CHECK(tok == NULL, "%s: tokens not NULL on failure", name);
  CHECK(strstr(err, path) != NULL, "%s: message does not name the path: %s", name, err);
  CHECK(strstr(err, key1) != NULL, "%s: message lacks '%s': %s", name, key1, err);
  if (key2) CHECK(strstr(err, key2) != NULL, "%s: message lacks '%s': %s", name, key2, err);
}

static void test_corruption(void) {
  TEST_SECTION("shard corruption detection");
  uint32_t tok[5000];
  // Ids below 256 except one, so that relabelling the shard as vocab 256 leaves exactly one bad id.
  size_t n = make_docs(tok, 5000, 256, 0, 1, 7);
  tok[100] = 300;
  const char *raw_path = tmp_path("good_raw.bin"), *z_path = tmp_path("good_zstd.bin");
  write_shard(raw_path, 512, 0, tok, n);
  write_shard(z_path, 512, 19, tok, n);
  size_t rn, zn;
  unsigned char *raw = slurp(raw_path, &rn), *z = slurp(z_path, &zn);
  unsigned char *buf = xmalloc(rn > zn ? rn : zn);

  char want[128];
  snprintf(want, sizeof(want), "expected %zu payload bytes, found %zu", 2 * n, 2 * n - 10);
  expect_bad("trunc_raw.bin", raw, rn - 10, "truncated", want);
  expect_bad("trunc_zstd.bin", z, zn - 5, "truncated", "payload bytes");
  expect_bad("trunc_header.bin", raw, 10, "truncated header", NULL);
  expect_bad("empty.bin", raw, 0, "empty", NULL);

  memcpy(buf, raw, rn);
  buf[SHARD_HEADER_BYTES + 777] ^= 0x04;
  expect_bad("flip_payload_raw.bin", buf, rn, "token checksum mismatch", NULL);
  memcpy(buf, z, zn);
  buf[SHARD_HEADER_BYTES + (zn - SHARD_HEADER_BYTES) / 2] ^= 0x10;
  {
    // A flipped compressed byte surfaces either as a zstd error or as a checksum mismatch.
    const char *path = tmp_path("flip_payload_zstd.bin");
    write_bytes(path, buf, zn);
    uint32_t *t = NULL;
    char err[512] = "";
    CHECK(shard_read(path, &t, NULL, err, sizeof(err)) == -1 && t == NULL, "flipped zstd byte accepted");
    CHECK(strstr(err, path) && (strstr(err, "zstd") || strstr(err, "checksum")), "message: %s", err);
  }

  memcpy(buf, raw, rn);
  buf[26] ^= 0x01;  // inside n_tokens
  expect_bad("flip_header.bin", buf, rn, "header checksum mismatch", NULL);
  memcpy(buf, raw, rn);
  buf[0] = 'X';
  expect_bad("magic.bin", buf, rn, "bad magic", NULL);
  memcpy(buf, raw, rn);
  put_u32le(buf + 8, 2);
  expect_bad("version.bin", buf, rn, "unsupported format version 2", NULL);
  // Extra bytes after the payload are as suspicious as missing ones.
  memcpy(buf, raw, rn);
  {
    unsigned char *longer = xmalloc(rn + 3);
    memcpy(longer, raw, rn);
    memset(longer + rn, 0, 3);
    expect_bad("trailing.bin", longer, rn + 3, "3 unexpected bytes", NULL);
    free(longer);
  }
  // A well-formed shard whose header claims a smaller vocab than its tokens use: rewrite vocab_size
  // to 256 (token 300 at index 100 is then out of range) and re-sign the header as documented.
  memcpy(buf, raw, rn);
  put_u32le(buf + 12, 256);
  put_u64le(buf + 56, hash64(buf, 56, 0));
  expect_bad("range.bin", buf, rn, "token id 300 at index 100", "vocab_size 256");

  char err[512] = "";
  ShardInfo info;
  const char *missing = tmp_path("missing.bin");
  CHECK(shard_read_info(missing, &info, err, sizeof(err)) == -1, "missing file accepted");
  CHECK(strstr(err, missing) && strstr(err, "cannot open"), "message: %s", err);
  free(raw);
  free(z);
  free(buf);
}

// ---------------------------------------------------------------------------------------------
// Loader over shards. Shard s holds values base_s + j, so a window is identified by its first token.

enum { T = 16, LEN0 = 1000, LEN1 = 517, LEN2 = 2000, NW = (LEN0 - 1) / T + (LEN1 - 1) / T + (LEN2 - 1) / T };
static const uint32_t BASES[3] = {10000, 20000, 30000};
static char spec3[1024], glob3[300];

static void make_loader_shards(void) {
  const int lens[3] = {LEN0, LEN1, LEN2};
  const char *names[3] = {"shard_c.bin", "shard_a.bin", "shard_b.bin"};  // created out of order
  const int which[3] = {2, 0, 1};  // names[i] holds BASES[which[i]]: sorted a, b, c = bases 0, 1, 2
  uint32_t tok[LEN2];
  const char *paths[3];
  for (int i = 0; i < 3; i++) paths[i] = tmp_path(names[i]);
  for (int i = 0; i < 3; i++) {
    int s = which[i];
    for (int j = 0; j < lens[s]; j++) tok[j] = BASES[s] + (uint32_t)j;
    write_shard(paths[i], 65536, i == 1 ? 5 : 0, tok, (size_t)lens[s]);
  }
  snprintf(spec3, sizeof(spec3), "%s, %s,%s", paths[1], paths[2], paths[0]);
  snprintf(glob3, sizeof(glob3), "%s/shard_*.bin", tmpdir);
}

// Global window id of a row: from its first token, in spec order a, b, c.
static int window_id(int first) {
  const int nw[3] = {(LEN0 - 1) / T, (LEN1 - 1) / T, (LEN2 - 1) / T};
  int id = 0;
  for (int s = 0; s < 3; s++) {
    if (first >= (int)BASES[s] && first < (int)BASES[s] + nw[s] * T) {
      if ((first - (int)BASES[s]) % T != 0) return -1;
      return id + (first - (int)BASES[s]) / T;
    }
    id += nw[s];
  }
  return -1;
}

static DataLoader *open_ok(const char *spec, int B, int rank, int world, uint64_t seed, int shuffle, uint32_t vocab) {
  char err[512] = "";
  DataLoader *dl = loader_open(spec, B, T, rank, world, seed, shuffle, vocab, err, sizeof(err));
  if (!dl) die("loader_open(%s) failed: %s", spec, err);
  return dl;
}

// Window ids of the next n_steps batches of dl (B rows each) into ids.
static void take_ids(DataLoader *dl, int B, int n_steps, int *ids) {
  int in[8 * T], tg[8 * T];
  for (int k = 0; k < n_steps; k++) {
    loader_next(dl, in, tg);
    for (int b = 0; b < B; b++) ids[k * B + b] = window_id(in[b * T]);
  }
}

static int is_permutation(const int *ids, int n) {
  char seen[NW] = {0};
  for (int i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= NW || seen[ids[i]]) return 0;
    seen[ids[i]] = 1;
  }
  return 1;
}

static void test_loader_shards(void) {
  TEST_SECTION("loader over shards");
  make_loader_shards();
  enum { B = 4, STEPS = 2 * NW / B + 3 };  // more than two epochs
  DataLoader *dl = open_ok(spec3, B, 0, 1, 42, 1, 65536);
  CHECK(loader_tokens_per_epoch(dl) == (uint64_t)NW * T, "tokens/epoch %llu",
        (unsigned long long)loader_tokens_per_epoch(dl));
  CHECK(loader_synthetic_entropy(dl) == -1.0, "entropy is synthetic-only");

  // Targets are the inputs shifted by one; rows start at window boundaries.
  int in[B * T], tg[B * T], ok = 1;
  loader_next(dl, in, tg);
  for (int b = 0; b < B; b++) {
    ok &= window_id(in[b * T]) >= 0;
    for (int t = 0; t < T; t++) ok &= tg[b * T + t] == in[b * T + t] + 1;
  }
  CHECK(ok, "targets are inputs shifted by one, rows are whole windows");
  loader_reset(dl);

  // Each epoch is a permutation of all windows; the next epoch uses another one.
  static int ids[STEPS * B], ids2[STEPS * B];
  take_ids(dl, B, STEPS, ids);
  CHECK(is_permutation(ids, NW), "epoch 0 visits every window once");
  CHECK(is_permutation(ids + NW, NW), "epoch 1 visits every window once");
  CHECK(memcmp(ids, ids + NW, sizeof(int) * NW) != 0, "epoch 1 reshuffled");
  int in_order = 1;
  for (int i = 0; i < NW; i++) in_order &= ids[i] == i;
  CHECK(!in_order, "shuffle=1 is not file order");
  LoaderState st;
  loader_get_state(dl, &st);
  CHECK(st.epoch == 2 && st.cursor == (uint64_t)(STEPS * B - 2 * NW) && st.n_windows == NW && st.seed == 42,
        "state after %d steps: epoch %llu cursor %llu", STEPS, (unsigned long long)st.epoch,
        (unsigned long long)st.cursor);

  // Deterministic by seed; another seed gives another order.
  DataLoader *same = open_ok(spec3, B, 0, 1, 42, 1, 65536), *other = open_ok(spec3, B, 0, 1, 43, 1, 65536);
  take_ids(same, B, STEPS, ids2);
  CHECK(memcmp(ids, ids2, sizeof(ids)) == 0, "same seed, same batches");
  take_ids(other, B, STEPS, ids2);
  CHECK(memcmp(ids, ids2, sizeof(ids)) != 0, "other seed, other batches");

  // Ranks: world=2 with B/2 rows each together equal world=1's batch, row for row.
  DataLoader *r0 = open_ok(spec3, B / 2, 0, 2, 42, 1, 65536), *r1 = open_ok(spec3, B / 2, 1, 2, 42, 1, 65536);
  int a[B / 2 * STEPS], c[B / 2 * STEPS], union_ok = 1;
  take_ids(r0, B / 2, STEPS, a);
  take_ids(r1, B / 2, STEPS, c);
  for (int k = 0; k < STEPS; k++)
    for (int b = 0; b < B / 2; b++) union_ok &= a[k * 2 + b] == ids[k * B + b] && c[k * 2 + b] == ids[k * B + 2 + b];
  CHECK(union_ok, "rank 0 + rank 1 rows == world=1 rows at every step, across epoch wraps");
  int disjoint = 1;
  for (int i = 0; i < NW / 2 - 1; i++)
    for (int j = 0; j < NW / 2 - 1; j++) disjoint &= a[i] != c[j];
  CHECK(disjoint, "ranks see disjoint windows within an epoch");

  // Resume mid-epoch (and mid-epoch after a wrap) reproduces the following batches exactly.
  const int stops[2] = {17, NW / B + 9};
  for (int s = 0; s < 2; s++) {
    DataLoader *x = open_ok(spec3, B, 0, 1, 42, 1, 65536);
    take_ids(x, B, stops[s], ids2);
    LoaderState saved;
    loader_get_state(x, &saved);
    int want[20 * B], got[20 * B];
    take_ids(x, B, 20, want);
    DataLoader *y = open_ok(glob3, B, 0, 1, 42, 1, 65536);  // the glob names the same sorted shards
    char err[512] = "";
    CHECK(loader_set_state(y, &saved, NULL, err, sizeof(err)) == 0, "%s", err);
    take_ids(y, B, 20, got);
    CHECK(memcmp(want, got, sizeof(want)) == 0, "resume at step %d (epoch %llu cursor %llu) is exact", stops[s],
          (unsigned long long)saved.epoch, (unsigned long long)saved.cursor);
    // The same state on a two-rank run continues the same global sequence.
    DataLoader *z1 = open_ok(spec3, B / 2, 1, 2, 42, 1, 65536);
    CHECK(loader_set_state(z1, &saved, NULL, err, sizeof(err)) == 0, "%s", err);
    take_ids(z1, B / 2, 1, got);
    CHECK(got[0] == want[2] && got[1] == want[3], "resumed rank 1 of 2 takes rows 2,3 of the next batch");
    loader_close(x);
    loader_close(y);
    loader_close(z1);
  }

  // A state from another seed or data set is refused.
  char err[512] = "";
  LoaderState foreign = st;
  foreign.seed = 7;
  CHECK(loader_set_state(dl, &foreign, NULL, err, sizeof(err)) == -1 && strstr(err, "another"), "other seed: %s", err);
  foreign = st;
  foreign.n_windows = NW + 1;
  CHECK(loader_set_state(dl, &foreign, NULL, err, sizeof(err)) == -1 && strstr(err, "another"), "other data: %s", err);
  foreign = st;
  foreign.cursor = NW;
  CHECK(loader_set_state(dl, &foreign, NULL, err, sizeof(err)) == -1 && strstr(err, "cursor"), "bad cursor: %s", err);

  // Validation order (shuffle=0): windows in spec order, wrapping to the start; reset rewinds.
  DataLoader *val = open_ok(spec3, B, 0, 1, 42, 0, 65536);
  take_ids(val, B, STEPS, ids2);
  int ordered = 1;
  for (int i = 0; i < STEPS * B; i++) ordered &= ids2[i] == i % NW;
  CHECK(ordered, "shuffle=0 visits windows in order and wraps");
  loader_next(val, in, tg);
  loader_reset(val);
  loader_next(val, in, tg);
  CHECK(in[0] == (int)BASES[0] && in[T] == (int)BASES[0] + T && tg[T - 1] == (int)BASES[0] + T,
        "reset: first batch again");

  loader_close(dl);
  loader_close(same);
  loader_close(other);
  loader_close(r0);
  loader_close(r1);
  loader_close(val);
}

static void expect_open_fails(const char *spec, int Tl, uint32_t vocab, const char *key1, const char *key2) {
  char err[512] = "";
  DataLoader *dl = loader_open(spec, 2, Tl, 0, 1, 1, 1, vocab, err, sizeof(err));
  CHECK(dl == NULL, "loader_open(%s) should fail", spec);
  CHECK(strstr(err, key1) != NULL, "message lacks '%s': %s", key1, err);
  if (key2) CHECK(strstr(err, key2) != NULL, "message lacks '%s': %s", key2, err);
  loader_close(dl);
}

static void test_loader_errors(void) {
  TEST_SECTION("loader errors");
  char spec[2048];
  snprintf(spec, sizeof(spec), "%s,%s/nothing_*.bin", spec3, tmpdir);
  expect_open_fails(spec, T, 65536, "nothing_*.bin", "matches no file");
  // a directory that does not exist is named as such (glob's read error before), and a shard pattern
  // gets the command that makes its shards
  snprintf(spec, sizeof(spec), "%s/no_such_dir/nv_train_*.bin", tmpdir);
  expect_open_fails(spec, T, 65536, "no_such_dir' does not exist", "./train tokenize");
  snprintf(spec, sizeof(spec), "%s/nv_val_*.bin", tmpdir);
  expect_open_fails(spec, T, 65536, "matches no file in", "--output");
  expect_open_fails(glob3, T, 512, "vocab_size 65536", "512");
  snprintf(spec, sizeof(spec), "%s,,%s", glob3, glob3);
  expect_open_fails(spec, T, 65536, "empty entry", NULL);
  expect_open_fails(glob3, 5000, 65536, "no shard holds T+1 = 5001 tokens", NULL);
  snprintf(spec, sizeof(spec), "%s,%s", glob3, big_vocab_shard);  // over the model's vocab
  expect_open_fails(spec, T, 65536, "vocab_size 128256", big_vocab_shard);
  expect_open_fails("synthetic", T, 4, "vocab_size >= 6", NULL);
  expect_open_fails(glob3, 0, 65536, "bad shape", NULL);
}

// ---------------------------------------------------------------------------------------------
// Synthetic source.

static void test_synthetic(void) {
  TEST_SECTION("synthetic corpus");
  enum { SB = 8, ST = 256, V = 512 };
  static int in[SB * ST], tg[SB * ST], in2[SB * ST], tg2[SB * ST];
  char err[512] = "";
  DataLoader *a = loader_open("synthetic", SB, ST, 0, 1, 5, 1, V, err, sizeof(err));
  DataLoader *b = loader_open("synthetic", SB, ST, 0, 1, 5, 1, V, err, sizeof(err));
  DataLoader *c = loader_open("synthetic", SB, ST, 0, 1, 6, 1, V, err, sizeof(err));
  DataLoader *h = loader_open("synthetic", SB, ST, 0, 1, 5, 0, V, err, sizeof(err));
  CHECK(a && b && c && h, "open synthetic: %s", err);
  if (!a || !b || !c || !h) return;
  CHECK(loader_tokens_per_epoch(a) == 0, "synthetic has no epochs");

  int same = 1, shifted = 1, in_range = 1, starts_bos = 1;
  for (int k = 0; k < 5; k++) {
    loader_next(a, in, tg);
    loader_next(b, in2, tg2);
    same &= memcmp(in, in2, sizeof(in)) == 0 && memcmp(tg, tg2, sizeof(tg)) == 0;
    for (int r = 0; r < SB; r++) {
      starts_bos &= in[r * ST] == 0;
      for (int t = 0; t < ST; t++) {
        in_range &= in[r * ST + t] >= 0 && in[r * ST + t] < V && tg[r * ST + t] >= 0 && tg[r * ST + t] < V;
        if (t + 1 < ST) shifted &= tg[r * ST + t] == in[r * ST + t + 1];
      }
    }
  }
  CHECK(same, "same seed, same synthetic batches");
  CHECK(shifted && in_range && starts_bos, "synthetic rows: shifted targets %d, ids < V %d, start at BOS %d", shifted,
        in_range, starts_bos);
  loader_next(c, in2, tg2);
  loader_reset(a);
  loader_next(a, in, tg);
  CHECK(memcmp(in, in2, sizeof(in)) != 0, "other seed, other synthetic data");
  loader_next(h, in2, tg2);
  CHECK(memcmp(in, in2, sizeof(in)) != 0, "shuffle=0 reads the held-out stream");

  // Resume: the state is a window count; a fresh loader continues identically.
  for (int k = 0; k < 3; k++) loader_next(a, in, tg);
  LoaderState st;
  loader_get_state(a, &st);
  CHECK(st.n_windows == 0 && st.epoch == 0 && st.cursor == 4 * SB, "synthetic state cursor %llu",
        (unsigned long long)st.cursor);
  loader_next(a, in, tg);
  DataLoader *r = loader_open("synthetic", SB, ST, 0, 1, 5, 1, V, err, sizeof(err));
  CHECK(loader_set_state(r, &st, NULL, err, sizeof(err)) == 0, "%s", err);
  loader_next(r, in2, tg2);
  CHECK(memcmp(in, in2, sizeof(in)) == 0 && memcmp(tg, tg2, sizeof(tg)) == 0, "synthetic resume is exact");
  LoaderState shard_state = {5, 0, 3, NW};
  CHECK(loader_set_state(r, &shard_state, NULL, err, sizeof(err)) == -1 && strstr(err, "another"),
        "shard state refused: %s", err);

  // Ranks: two ranks of SB/2 rows equal one rank of SB rows.
  DataLoader *q0 = loader_open("synthetic", SB / 2, ST, 0, 2, 5, 1, V, err, sizeof(err));
  DataLoader *q1 = loader_open("synthetic", SB / 2, ST, 1, 2, 5, 1, V, err, sizeof(err));
  loader_reset(a);
  loader_next(a, in, tg);
  loader_next(q0, in2, tg2);
  loader_next(q1, in2 + SB / 2 * ST, tg2 + SB / 2 * ST);
  CHECK(memcmp(in, in2, sizeof(in)) == 0, "synthetic ranks together equal world=1");

  // The empirical conditional entropy H(next | current) of the stream matches the documented
  // entropy rate: this is the loss a model can reach, so it must be what the generator produces.
  static int counts[V][V];
  memset(counts, 0, sizeof(counts));
  loader_reset(a);
  long total = 0;
  for (int k = 0; k < 200; k++) {
    loader_next(a, in, tg);
    for (int i = 0; i < SB * ST; i++) counts[in[i]][tg[i]]++;
    total += SB * ST;
  }
  double hsum = 0;
  for (int x = 0; x < V; x++) {
    long row = 0;
    for (int y = 0; y < V; y++) row += counts[x][y];
    for (int y = 0; y < V; y++)
      if (counts[x][y]) hsum -= counts[x][y] * log((double)counts[x][y] / row);
  }
  double h_emp = hsum / total, h_doc = loader_synthetic_entropy(a);
  printf("synthetic entropy rate: %.4f nats/token documented, %.4f measured over %ld tokens (uniform: %.4f)\n", h_doc,
         h_emp, total, log((double)V));
  CHECK_NEAR(h_doc, 1.27253, 1e-5);
  CHECK_NEAR(h_emp, h_doc, 0.02);
  int bos_after_eos = 1;
  for (int x = 0; x < V; x++) bos_after_eos &= x == 0 ? counts[1][x] > 0 : counts[1][x] == 0;
  CHECK(bos_after_eos, "EOS (1) is always followed by BOS (0)");

  loader_close(a);
  loader_close(b);
  loader_close(c);
  loader_close(h);
  loader_close(r);
  loader_close(q0);
  loader_close(q1);
}

int main(void) {
  snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_data_XXXXXX");
  if (!mkdtemp(tmpdir)) die("mkdtemp failed");
  test_round_trip();
  test_corruption();
  test_loader_shards();
  test_loader_errors();
  test_synthetic();
  for (int i = 0; i < n_made; i++) unlink(made[i]);
  rmdir(tmpdir);
  TEST_END();
}
