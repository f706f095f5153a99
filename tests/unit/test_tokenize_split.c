// tests/unit/test_tokenize_split.c: the cut points that let `./train tokenize` encode one long
// document on several threads (tokenizer_split_point), the reusable-scratch encoder, the pipeline's
// output for a long .txt document against the whole text's ids, and several inputs read at once
// (the same shards as one thread, errors in input order). The texts are the
// tiktoken reference vectors (tests/data/tokenizer_vectors.txt), joined by newlines, plus cases
// made to stress the Llama-3 pattern around a newline; the ids of the whole text are the oracle.
// Run from the repo root; TOKENIZER_MODEL overrides ../shared/data/tokenizer/tokenizer.model.
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "tests/test.h"

// Cases whose tokens sit on both sides of a newline: contractions, punctuation runs that take
// newlines, whitespace runs, digits, non-ASCII letters, invalid UTF-8, CRLF.
static const char *const TRICKY[] = {
    "a \n\nB c",
    "x!\nY",
    "it's\nThe end",
    "12\n3a 456\n7b",
    "  \n  \nZ z",
    "\r\nQ\r\n\r\nq",
    "\n\n\nW",
    "\xF0\x9F\x98\x80\nA",
    "\xFF\nB\xC3",
    "'\ns'\nS",
    "\t\n\tx\ny",
    "...\n\n...\nEnd",
    "\xC3\xA9t\xC3\xA9\n\xC3\xA9t\xC3\xA9\nete",
    "word\n word\n\nword",
    "\n",
    "A\n",
    "\nA",
};

static int ids_equal(const uint32_t *a, size_t na, const uint32_t *b, size_t nb) {
  return na == nb && (na == 0 || memcmp(a, b, na * sizeof(uint32_t)) == 0);
}

// The texts of tests/data/tokenizer_vectors.txt ("KIND \t ESCAPED_TEXT \t IDS" lines) and TRICKY,
// each followed by a newline, in one buffer.
static char *joined_text(size_t *len) {
  size_t n;
  char *vec = read_file("tests/data/tokenizer_vectors.txt", &n);
  char *out = xmalloc(2 * n + 4096);
  size_t o = 0;
  for (char *line = vec, *eol; *line; line = eol + 1) {
    if (!(eol = strchr(line, '\n'))) break;
    char *t1 = memchr(line, '\t', (size_t)(eol - line)), *t2 = t1 ? memchr(t1 + 1, '\t', (size_t)(eol - t1 - 1)) : NULL;
    if (!t2) continue;
    for (char *s = t1 + 1; s < t2; s++) {  // unescape \n \t \r \\ \xHH
      if (*s != '\\') {
        out[o++] = *s;
        continue;
      }
      char e = *++s;
      if (e == 'x') {
        char hex[3] = {s[1], s[2], 0};
        out[o++] = (char)strtol(hex, NULL, 16);
        s += 2;
      } else out[o++] = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
    }
    out[o++] = '\n';
  }
  free(vec);
  for (size_t i = 0; i < sizeof TRICKY / sizeof TRICKY[0]; i++) {
    size_t k = strlen(TRICKY[i]);
    memcpy(out + o, TRICKY[i], k);
    o += k;
    out[o++] = '\n';
  }
  *len = o;
  return out;
}

// The ids of text cut at every split point at or after `every` bytes from the last cut, encoded
// piece by piece with one scratch; *cuts counts the cuts.
static uint32_t *encode_cut(const Tokenizer *t, const char *text, size_t len, size_t every, size_t *n, int *cuts) {
  TokenizerScratch *sc = tokenizer_scratch_new(t);
  uint32_t *ids = NULL;
  size_t cap = 0;
  *n = 0, *cuts = 0;
  for (size_t a = 0; a < len;) {
    size_t b = tokenizer_split_point(t, text, len, a + every);
    tokenizer_encode_append(t, sc, text + a, b - a, &ids, n, &cap);
    *cuts += b < len;
    a = b;
  }
  tokenizer_scratch_free(sc);
  return ids;
}

static void test_split_points(const Tokenizer *t) {
  TEST_SECTION("split points keep the ids of the whole text");
  size_t len;
  char *text = joined_text(&len);
  uint32_t *whole;
  size_t n_whole = tokenizer_encode(t, text, len, &whole);
  CHECK(len > 10000 && n_whole > 2000, "joined text of %zu bytes, %zu ids", len, n_whole);
  size_t everies[] = {1, 7, 100, 4096};
  for (size_t k = 0; k < sizeof everies / sizeof everies[0]; k++) {
    size_t n;
    int cuts;
    uint32_t *ids = encode_cut(t, text, len, everies[k], &n, &cuts);
    CHECK(ids_equal(ids, n, whole, n_whole), "cut every >= %zu bytes (%d cuts): %zu ids, whole text %zu", everies[k],
          cuts, n, n_whole);
    if (everies[k] == 1) CHECK(cuts > 150, "only %d split points", cuts);
    free(ids);
  }
  // Every point returned is after a newline and before an ASCII letter, and none is missed.
  int bad = 0, missed = 0;
  for (size_t a = 1, p; (p = tokenizer_split_point(t, text, len, a)) < len; a = p + 1) {
    bad += text[p - 1] != '\n' || !((text[p] | 0x20) >= 'a' && (text[p] | 0x20) <= 'z');
    for (size_t q = a; q < p; q++) missed += text[q - 1] == '\n' && (text[q] | 0x20) >= 'a' && (text[q] | 0x20) <= 'z';
  }
  CHECK(bad == 0 && missed == 0, "%d split points not after '\\n' + letter, %d missed", bad, missed);
  CHECK(tokenizer_split_point(t, "ab\ncd", 5, 4) == 5 && tokenizer_split_point(t, "ab\ncd", 5, 0) == 3 &&
            tokenizer_split_point(t, "ab\n", 3, 0) == 3 && tokenizer_split_point(t, "", 0, 0) == 0,
        "edges: from past the last point, from 0, a newline at the end, empty text");
  free(text), free(whole);

  // The rule is not vacuous: cutting between two newlines, or before a space, changes the ids.
  const char *s = "x\n\nY";
  uint32_t *a, *b, *c;
  size_t na = tokenizer_encode(t, s, 5, &a), nb = tokenizer_encode(t, s, 2, &b), nc = tokenizer_encode(t, s + 2, 3, &c);
  int same = na == nb + nc && !memcmp(a, b, nb * sizeof(uint32_t)) && !memcmp(a + nb, c, nc * sizeof(uint32_t));
  CHECK(!same, "a cut between two newlines changes the ids (so such cuts must be refused)");
  CHECK(tokenizer_split_point(t, s, 5, 0) == 3, "'x\\n\\nY' is cut only before the Y");
  free(a), free(b), free(c);
}

static void test_patterns(const char *model, const char *dir) {
  TEST_SECTION("split points only for the Llama-3 pattern");
  char err[512], pat[600], other[600];
  snprintf(pat, sizeof pat, "%s/pat_str.txt", dir);
  snprintf(other, sizeof other, "%s/other_pattern.txt", dir);
  FILE *f = xfopen(other, "wb");
  fputs("\\s+|\\S+\n", f);
  fclose(f);
  Tokenizer *same = tokenizer_load(model, pat, err, sizeof err);
  Tokenizer *diff = tokenizer_load(model, other, err, sizeof err);
  CHECK(same && diff, "patterns load: %s", err);
  if (!same || !diff) return;
  CHECK(tokenizer_split_point(same, "ab\ncd", 5, 0) == 3, "a pattern file holding the built-in pattern splits");
  CHECK(tokenizer_split_point(diff, "ab\ncd", 5, 0) == 5, "another pattern never splits");
  tokenizer_free(same), tokenizer_free(diff);
}

// Reads a split's shards (PREFIX_train_*.bin) into one stream.
static uint32_t *read_stream(const char *prefix, size_t *n) {
  uint32_t *all = NULL;
  *n = 0;
  for (int k = 0;; k++) {
    char path[700];
    snprintf(path, sizeof path, "%s_train_%06d.bin", prefix, k);
    if (access(path, F_OK) != 0) break;
    uint32_t *tok;
    ShardInfo info;
    char err[512];
    if (shard_read(path, &tok, &info, err, sizeof err)) die("%s", err);
    uint32_t *grown = xmalloc((*n + info.n_tokens + 1) * sizeof(uint32_t));
    if (*n) memcpy(grown, all, *n * sizeof(uint32_t));
    memcpy(grown + *n, tok, info.n_tokens * sizeof(uint32_t));
    free(all), free(tok);
    all = grown, *n += info.n_tokens;
  }
  return all;
}

static void test_long_document(const Tokenizer *t, const char *model, const char *dir) {
  TEST_SECTION("a long .txt document, cut into pieces by the pipeline");
  size_t len;
  char *text = joined_text(&len);
  size_t total = 0;  // the joined text four times over: 300 KB or more, several 64 KB pieces
  char *big = xmalloc(4 * len);
  for (int k = 0; k < 4; k++) memcpy(big + total, text, len), total += len;
  char path[600];
  snprintf(path, sizeof path, "%s/long.txt", dir);
  FILE *f = xfopen(path, "wb");
  xfwrite(big, 1, total, f, path);
  fclose(f);
  uint32_t *whole;
  size_t n_whole = tokenizer_encode(t, big, total, &whole);
  const char *inputs[] = {path};
  for (int threads = 1; threads <= 3; threads += 2) {
    char prefix[600], err[1024];
    snprintf(prefix, sizeof prefix, "%s/long_t%d", dir, threads);
    PrepareOptions o = {.tokenizer_path = model,
                        .inputs = inputs,
                        .n_inputs = 1,
                        .output_prefix = prefix,
                        .shard_tokens = 40000,
                        .zstd_level = threads == 1 ? 0 : 3,
                        .threads = threads,
                        .quiet = 1};
    PrepareStats st;
    CHECK(prepare_run(&o, &st, err, sizeof err) == 0, "prepare_run: %s", err);
    size_t n;
    uint32_t *got = read_stream(prefix, &n);
    CHECK(n == n_whole + 2 && got[0] == TOKENIZER_BOS && got[n - 1] == TOKENIZER_EOS &&
              ids_equal(got + 1, n - 2, whole, n_whole),
          "%d threads: %zu tokens in %d shards = BOS, the whole text's %zu ids, EOS", threads, n, st.shards[0],
          n_whole);
    CHECK(st.shards[0] == (int)((n_whole + 2 + 39999) / 40000), "%d shards", st.shards[0]);
    free(got);
  }
  free(text), free(big), free(whole);
}

static int same_file(const char *a, const char *b) {
  size_t na, nb;
  char *x = read_file(a, &na), *y = read_file(b, &nb);
  int eq = na == nb && !memcmp(x, y, na);
  free(x), free(y);
  return eq;
}

// Nine threads read two inputs at once (1 + threads/8): the shards are those of one thread, and an
// error in the third input is the one reported, with its line, though the fourth is read beside it.
static void test_inputs_at_once(const char *model, const char *dir) {
  TEST_SECTION("several inputs read at once");
  size_t len;
  char *text = joined_text(&len);
  char paths[6][600];
  const char *inputs[6];
  for (int k = 0; k < 6; k++) {  // .jsonl files of 0.3 to 1.7 MB (one or two blocks each), one .txt
    snprintf(paths[k], sizeof paths[k], "%s/in%d.%s", dir, k, k == 4 ? "txt" : "jsonl");
    FILE *f = xfopen(paths[k], "wb");
    if (k == 4) xfwrite(text, 1, len, f, paths[k]);
    for (int rep = 0; k != 4 && rep < 6 * (k + 1); rep++)
      for (size_t a = 0; a < len;) {  // each line of the joined text as a document, JSON-escaped
        const char *nl = memchr(text + a, '\n', len - a);
        size_t b = nl ? (size_t)(nl - text) : len;
        fputs("{\"text\": \"", f);
        for (size_t i = a; i < b; i++) {
          unsigned char ch = (unsigned char)text[i];
          if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
          else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
          else fputc(ch, f);
        }
        fprintf(f, " %d %d\"}\n", k, rep);
        a = b + 1;
      }
    fclose(f);
    inputs[k] = paths[k];
  }
  char prefix[2][600], err[1024];
  PrepareStats st[2];
  for (int r = 0; r < 2; r++) {
    snprintf(prefix[r], sizeof prefix[r], "%s/many_t%d", dir, r ? 9 : 1);
    PrepareOptions o = {.tokenizer_path = model,
                        .inputs = inputs,
                        .n_inputs = 6,
                        .output_prefix = prefix[r],
                        .shard_tokens = 1000000,
                        .val_docs = 100,
                        .zstd_level = 1,
                        .threads = r ? 9 : 1,
                        .quiet = 1};
    CHECK(prepare_run(&o, &st[r], err, sizeof err) == 0, "%d threads: %s", o.threads, err);
  }
  int same = st[0].shards[0] == st[1].shards[0] && st[0].shards[0] >= 2 && st[1].shards[1] == 1;
  for (int k = 0; same && k < st[0].shards[0] + 1; k++) {
    char a[700], b[700];
    const char *split = k < st[0].shards[0] ? "train" : "val";
    int i = k < st[0].shards[0] ? k : 0;
    snprintf(a, sizeof a, "%s_%s_%06d.bin", prefix[0], split, i);
    snprintf(b, sizeof b, "%s_%s_%06d.bin", prefix[1], split, i);
    same = same_file(a, b);
  }
  CHECK(same && st[0].docs[0] == st[1].docs[0], "9 threads write the shards of 1 (%d train shards, %llu docs)",
        st[0].shards[0], (unsigned long long)st[0].docs[0]);

  FILE *f = xfopen(paths[2], "ab");  // the third input ends with a bad line
  fputs("{\"text\": \"fine\"}\n{\"text\": 7}\n", f);
  fclose(f);
  long lines = 0;
  char *third = read_file(paths[2], NULL);
  for (char *c = third; *c; c++) lines += *c == '\n';
  free(third);
  PrepareOptions o = {.tokenizer_path = model,
                      .inputs = inputs,
                      .n_inputs = 6,
                      .output_prefix = prefix[1],
                      .shard_tokens = 1000000,
                      .threads = 9,
                      .quiet = 1};
  char want[700];
  snprintf(want, sizeof want, "%s:%ld: bad JSON", paths[2], lines);
  CHECK(prepare_run(&o, &st[1], err, sizeof err) == -1 && strstr(err, want), "error '%s', want '%s'", err, want);
  free(text);
}

int main(void) {
  const char *model = getenv("TOKENIZER_MODEL");
  if (!model) model = "../shared/data/tokenizer/tokenizer.model";
  char dir[256], err[512];
  snprintf(dir, sizeof dir, "/tmp/test_tokenize_split_%d", (int)getpid());
  mkdir(dir, 0700);
  Tokenizer *t = tokenizer_load(model, NULL, err, sizeof err);
  CHECK(t != NULL, "load: %s", err);
  if (!t) TEST_END();
  test_split_points(t);
  char model_dir[600];  // pat_str.txt sits next to the model
  const char *slash = strrchr(model, '/');
  snprintf(model_dir, sizeof model_dir, "%.*s", slash ? (int)(slash - model) : 1, slash ? model : ".");
  char pat[700];
  snprintf(pat, sizeof pat, "%s/pat_str.txt", model_dir);
  if (access(pat, R_OK) == 0) {
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/'", pat, dir);
    if (system(cmd) != 0) printf("note: could not copy %s\n", pat);
  }
  test_patterns(model, dir);
  test_long_document(t, model, dir);
  test_inputs_at_once(model, dir);
  tokenizer_free(t);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
  TEST_END();
}
