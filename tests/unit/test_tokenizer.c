// tests/unit/test_tokenizer.c: the Llama-3 tokenizer against tiktoken's ids (tests/data/
// tokenizer_vectors.txt, from scripts/dev/gen_tokenizer_vectors.py), its loading errors, the JSON
// field reader, and the data-preparation round trip through real shards.
// Run from the repo root; TOKENIZER_MODEL overrides ../shared/data/tokenizer/tokenizer.model.
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "common/common.h"
#include "data/json.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "tests/test.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
  static char buf[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
  return buf[k];
}

static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = xfopen(path, "wb");
  xfwrite(p, 1, n, f, path);
  fclose(f);
}

static int ids_equal(const uint32_t *a, size_t na, const uint32_t *b, size_t nb) {
  return na == nb && (na == 0 || memcmp(a, b, na * sizeof(uint32_t)) == 0);
}

// ---------------------------------------------------------------------------------------------
// Reference vectors: "KIND \t ESCAPED_TEXT \t IDS" per line.

typedef struct {
  int valid_utf8;  // KIND == "text"
  char *text;
  size_t len;
  uint32_t *ids;
  size_t n_ids;
} Case;

static char *unescape(const char *s, size_t n, size_t *len) {
  char *out = xmalloc(n + 1);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '\\') {
      out[o++] = s[i];
      continue;
    }
    char e = s[++i];
    if (e == 'n') out[o++] = '\n';
    else if (e == 't') out[o++] = '\t';
    else if (e == 'r') out[o++] = '\r';
    else if (e == '\\') out[o++] = '\\';
    else if (e == 'x') {
      char hex[3] = {s[i + 1], s[i + 2], 0};
      out[o++] = (char)strtol(hex, NULL, 16);
      i += 2;
    } else die("tokenizer_vectors.txt: bad escape \\%c", e);
  }
  out[o] = 0;
  *len = o;
  return out;
}

static Case *load_cases(const char *path, int *n_cases) {
  size_t len;
  char *text = read_file(path, &len);
  int cap = 512, n = 0;
  Case *cases = xcalloc((size_t)cap, sizeof(Case));
  for (char *line = text, *eol; *line; line = eol + 1) {
    eol = strchr(line, '\n');
    if (!eol) die("%s: last line has no newline", path);
    char *tab1 = memchr(line, '\t', (size_t)(eol - line));
    char *tab2 = tab1 ? memchr(tab1 + 1, '\t', (size_t)(eol - tab1 - 1)) : NULL;
    if (!tab2 || n == cap) die("%s: case %d is malformed (or too many cases)", path, n + 1);
    Case *c = &cases[n++];
    c->valid_utf8 = strncmp(line, "text\t", 5) == 0;
    c->text = unescape(tab1 + 1, (size_t)(tab2 - tab1 - 1), &c->len);
    c->ids = xmalloc((size_t)(eol - tab2) * sizeof(uint32_t));
    for (char *p = tab2 + 1; p < eol;) c->ids[c->n_ids++] = (uint32_t)strtoul(p, &p, 10);
  }
  free(text);
  *n_cases = n;
  return cases;
}

static void test_vectors(const Tokenizer *t) {
  TEST_SECTION("tiktoken reference vectors");
  int n;
  Case *cases = load_cases("tests/data/tokenizer_vectors.txt", &n);
  CHECK(n >= 200, "only %d cases", n);
  int mismatches = 0, roundtrip_fail = 0, n_invalid = 0;
  for (int i = 0; i < n; i++) {
    Case *c = &cases[i];
    uint32_t *ids;
    size_t k = tokenizer_encode(t, c->text, c->len, &ids);
    if (!ids_equal(ids, k, c->ids, c->n_ids)) {
      if (mismatches++ < 5) {
        printf("  case %d (%zu bytes, '%.40s'): got %zu ids, want %zu; first difference at", i + 1, c->len, c->text, k,
               c->n_ids);
        size_t j = 0;
        while (j < k && j < c->n_ids && ids[j] == c->ids[j]) j++;
        printf(" %zu\n", j);
      }
    }
    char *dec;
    size_t dec_len;
    if (tokenizer_decode(t, ids, k, &dec, &dec_len) != 0) roundtrip_fail++;
    else if (c->valid_utf8 && (dec_len != c->len || memcmp(dec, c->text, c->len) != 0)) roundtrip_fail++;
    n_invalid += !c->valid_utf8;
    free(dec), free(ids);
  }
  CHECK(mismatches == 0, "%d of %d cases differ from tiktoken", mismatches, n);
  CHECK(roundtrip_fail == 0, "decode(encode(x)) != x in %d cases", roundtrip_fail);
  CHECK(n_invalid >= 10, "only %d invalid-UTF-8 cases", n_invalid);
  CHECK(cases[0].n_ids == 6 && cases[0].ids[0] == 2028 && cases[0].ids[5] == 13, "first case is the known sentence");

  // Thread safety: every case encoded concurrently gives the same ids.
  int *same = xcalloc((size_t)n, sizeof(int));
#pragma omp parallel for schedule(dynamic, 1) num_threads(2)
  for (int i = 0; i < n; i++) {
    uint32_t *ids;
    size_t k = tokenizer_encode(t, cases[i].text, cases[i].len, &ids);
    same[i] = ids_equal(ids, k, cases[i].ids, cases[i].n_ids);
    free(ids);
  }
  int par_fail = 0;
  for (int i = 0; i < n; i++) par_fail += !same[i];
  free(same);
  CHECK(par_fail == 0, "%d cases differ when encoded from 2 threads", par_fail);
  for (int i = 0; i < n; i++) free(cases[i].text), free(cases[i].ids);
  free(cases);
}

// ---------------------------------------------------------------------------------------------

static size_t encode_str(const Tokenizer *t, const char *s, uint32_t **ids) {
  return tokenizer_encode(t, s, strlen(s), ids);
}

static void test_basics(const Tokenizer *t) {
  TEST_SECTION("vocabulary, special tokens, decode");
  CHECK(tokenizer_vocab_size(t) == 128256, "vocab %d", tokenizer_vocab_size(t));
  CHECK(tokenizer_bos(t) == 128000 && tokenizer_eos(t) == 128001, "bos %u eos %u", tokenizer_bos(t), tokenizer_eos(t));
  size_t len;
  const char *s = tokenizer_token(t, 2028, &len);
  CHECK(s && len == 4 && !memcmp(s, "This", 4), "token 2028");
  s = tokenizer_token(t, 128000, &len);
  CHECK(s && len == 17 && !memcmp(s, "<|begin_of_text|>", 17), "token 128000");
  s = tokenizer_token(t, 128009, &len);
  CHECK(s && len == 10 && !memcmp(s, "<|eot_id|>", 10), "token 128009");
  s = tokenizer_token(t, 128255, &len);
  CHECK(s && len == strlen("<|reserved_special_token_247|>") && !memcmp(s, "<|reserved_special_token_247|>", len),
        "token 128255");
  CHECK(tokenizer_token(t, 128256, &len) == NULL, "id past the vocab");

  uint32_t seq[] = {128000, 2028, 374, 128001}, bad[] = {2028, 128256};
  char *out;
  CHECK(tokenizer_decode(t, seq, 4, &out, &len) == 0 && len == 39 &&
            !strcmp(out, "<|begin_of_text|>This is<|end_of_text|>"),
        "decode with specials: '%s'", out);
  free(out);
  CHECK(tokenizer_decode(t, bad, 2, &out, &len) == -1 && out == NULL, "decode rejects id 128256");
  CHECK(tokenizer_decode(t, seq, 0, &out, &len) == 0 && len == 0 && out[0] == 0, "decode of nothing");
  free(out);

  // Special-token strings are ordinary text: never ids >= 128000.
  uint32_t *ids;
  size_t n = encode_str(t, "<|begin_of_text|><|eot_id|>", &ids);
  int any_special = 0;
  for (size_t i = 0; i < n; i++) any_special |= ids[i] >= 128000;
  CHECK(n > 2 && !any_special, "special strings encoded as text (%zu ids)", n);
  free(ids);

  TEST_SECTION("invalid UTF-8 becomes U+FFFD per maximal subpart");
  struct {
    const char *in, *want;
  } repl[] = {
      {"abc\xff"
       "def",
       "abc\xEF\xBF\xBD"
       "def"},
      {"\xe2\x82", "\xEF\xBF\xBD"},                                        // truncated: one U+FFFD
      {"\xed\xa0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},            // surrogate: three
      {"\xc0\x80!", "\xEF\xBF\xBD\xEF\xBF\xBD!"},                          // overlong: two
      {"\xf0\x9f\x98 \xf0\x9f\x98\x80", "\xEF\xBF\xBD \xf0\x9f\x98\x80"},  // cut emoji, then a whole one
  };
  for (size_t i = 0; i < sizeof repl / sizeof repl[0]; i++) {
    n = encode_str(t, repl[i].in, &ids);
    CHECK(tokenizer_decode(t, ids, n, &out, &len) == 0 && !strcmp(out, repl[i].want), "repair case %zu", i);
    free(out), free(ids);
  }

  TEST_SECTION("long pieces are not quadratic");
  size_t big = 200000;
  char *spaces = xmalloc(big + 2);
  memset(spaces, ' ', big);
  spaces[big] = 'x', spaces[big + 1] = 0;
  double t0 = now_seconds();
  n = tokenizer_encode(t, spaces, big + 1, &ids);
  double dt = now_seconds() - t0;
  CHECK(tokenizer_decode(t, ids, n, &out, &len) == 0 && len == big + 1 && !memcmp(out, spaces, big + 1),
        "200k spaces round trip");
  CHECK(n < big / 8, "200k spaces in %zu tokens", n);
  CHECK(dt < 2.0, "200k spaces took %.2f s", dt);
  free(out), free(ids);
  for (size_t i = 0; i < big; i++) spaces[i] = "ab"[(i * 7 + i / 3) % 2];  // one long letter piece
  t0 = now_seconds();
  n = tokenizer_encode(t, spaces, big, &ids);
  dt = now_seconds() - t0;
  CHECK(tokenizer_decode(t, ids, n, &out, &len) == 0 && len == big && !memcmp(out, spaces, big),
        "200k letters round trip");
  CHECK(dt < 2.0, "200k-letter piece took %.2f s", dt);
  free(out), free(ids), free(spaces);
}

// ---------------------------------------------------------------------------------------------

static void check_load_error(const char *what, const char *content, size_t len, const char *want1, const char *want2) {
  const char *path = tmp_path("bad.model");
  write_bytes(path, content, len);
  char err[512] = "";
  Tokenizer *t = tokenizer_load(path, NULL, err, sizeof err);
  CHECK(!t && strstr(err, want1) && strstr(err, want2), "%s: err = '%s', want '%s' and '%s'", what, err, want1, want2);
  tokenizer_free(t);
}

static void test_load_errors(const char *model) {
  TEST_SECTION("loading errors name file and line");
  size_t len;
  char *good = read_file(model, &len);
  char bad_b64[] = "IQ== 0\nIg== 1\nI*== 2\n";
  check_load_error("bad base64", bad_b64, strlen(bad_b64), "bad.model:3:", "bad base64");
  char bad_rank[] = "IQ== 0\nIg== 2\n";
  check_load_error("rank order", bad_rank, strlen(bad_rank), "bad.model:2:", "rank 2 out of order");
  char dup[] = "IQ== 0\nIg== 1\nIQ== 2\n";
  check_load_error("duplicate", dup, strlen(dup), "bad.model:3:", "duplicate those of rank 0");
  char no_space[] = "IQ== 0\nIg==1\n";
  check_load_error("no space", no_space, strlen(no_space), "bad.model:2:", "expected 'BASE64 RANK'");
  char bad_num[] = "IQ== 0\nIg== 1x\n";
  check_load_error("bad rank", bad_num, strlen(bad_num), "bad.model:2:", "bad rank '1x'");
  // The real file cut after 1000 lines: the count is wrong.
  size_t cut = 0;
  for (int lines = 0; lines < 1000; cut++) lines += good[cut] == '\n';
  check_load_error("truncated", good, cut, "bad.model:", "has 1000 tokens, expected 128000");
  free(good);

  char err[512] = "";
  Tokenizer *t = tokenizer_load(tmp_path("missing.model"), NULL, err, sizeof err);
  CHECK(!t && strstr(err, "missing.model") && strstr(err, "cannot open"), "missing file: '%s'", err);
  write_bytes(tmp_path("bad_pattern.txt"), "(unclosed", 9);
  t = tokenizer_load(model, tmp_path("bad_pattern.txt"), err, sizeof err);
  CHECK(!t && strstr(err, "bad_pattern.txt") && strstr(err, "bad regex"), "bad pattern: '%s'", err);
}

static void test_pattern_file(const Tokenizer *builtin, const char *model, const char *pattern_path) {
  TEST_SECTION("pattern file equals the built-in pattern");
  size_t len;
  char *pat = read_file(pattern_path, &len);
  while (len && (pat[len - 1] == '\n' || pat[len - 1] == '\r')) len--;
  CHECK(len == strlen(TOKENIZER_LLAMA3_PATTERN) && !memcmp(pat, TOKENIZER_LLAMA3_PATTERN, len),
        "built-in pattern differs from %s", pattern_path);
  free(pat);
  char err[512];
  Tokenizer *t = tokenizer_load(model, pattern_path, err, sizeof err);
  CHECK(t != NULL, "load with pattern: %s", err);
  if (!t) return;
  const char *s = "Hello world! It's 2024...\n\n  ok";
  uint32_t *a, *b;
  size_t na = encode_str(builtin, s, &a), nb = encode_str(t, s, &b);
  CHECK(ids_equal(a, na, b, nb), "same ids with the pattern file");
  free(a), free(b);
  tokenizer_free(t);
}

// ---------------------------------------------------------------------------------------------

static void test_json(void) {
  TEST_SECTION("JSON string field");
  char *s, err[256];
  size_t n;
  const char *line =
      "{\"id\": 7, \"meta\": {\"text\": 1, \"a\": [1, -2.5e3, true, null, {\"x\": \"}\"}]}, "
      "\"text\": \"a\\\"b\\\\c\\/d\\n\\t\\u00e9\\u4e2d\\ud83d\\ude00\\ud800x\\u0041\"}";
  int rc = json_get_string(line, strlen(line), "text", &s, &n, err, sizeof err);
  const char *want = "a\"b\\c/d\n\t\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\xEF\xBF\xBDxA";
  CHECK(rc == 1 && n == strlen(want) && !memcmp(s, want, n), "escapes decoded (rc %d: '%s')", rc, rc == 1 ? s : err);
  free(s);

  line =
      "{\"te\\u0078t\": \"first\", \"text\": \"last\", \"long_key_that_is_longer_than_sixty_four_bytes_and_so_is_"
      "never_decoded\": 0}";
  rc = json_get_string(line, strlen(line), "text", &s, &n, err, sizeof err);
  CHECK(rc == 1 && !strcmp(s, "last"), "duplicate key: last wins");
  free(s);
  line = "{\"text\": \"\\u0000\"}";
  rc = json_get_string(line, strlen(line), "text", &s, &n, err, sizeof err);
  CHECK(rc == 1 && n == 1 && s[0] == 0, "\\u0000 is a NUL byte of the text");
  free(s);
  line = "  {\"id\": 1}  ";
  CHECK(json_get_string(line, strlen(line), "text", &s, &n, err, sizeof err) == 0 && !s, "missing key gives 0");

  struct {
    const char *line, *msg;
  } bad[] = {
      {"{\"text\": 5}", "column 10: member \"text\" is not a string"},
      {"{\"text\": \"abc}", "unterminated string"},
      {"{\"text\": \"a\\qb\"}", "column 12: bad escape"},
      {"{\"text\": \"\\u12G4\"}", "bad \\u escape"},
      {"{\"a\" 1}", "column 6: expected ':'"},
      {"{\"a\": 1,}", "column 9: expected a member name"},
      {"{\"a\": [1 2]}", "expected ',' or ']'"},
      {"{\"a\": tru}", "expected true"},
      {"{\"a\": 01}", "expected ',' or '}'"},
      {"{\"a\": -}", "expected a digit"},
      {"[1, 2]", "column 1: expected a JSON object"},
      {"{\"text\": \"x\"} trailing", "column 15: unexpected text after the object"},
      {"{\"text\": \"x\"", "expected ',' or '}'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = 0;
    rc = json_get_string(bad[i].line, strlen(bad[i].line), "text", &s, &n, err, sizeof err);
    CHECK(rc == -1 && !s && strstr(err, bad[i].msg), "bad JSON %zu: got %d '%s', want '%s'", i, rc, err, bad[i].msg);
  }
  // Deep nesting is an error, not a stack overflow.
  char deep[4000];
  size_t k = 0;
  k += (size_t)sprintf(deep, "{\"a\": ");
  for (int i = 0; i < 1000; i++) deep[k++] = '[';
  deep[k] = 0;
  rc = json_get_string(deep, k, "text", &s, &n, err, sizeof err);
  CHECK(rc == -1 && strstr(err, "nesting deeper"), "deep nesting: '%s'", err);
}

// ---------------------------------------------------------------------------------------------
// Data preparation round trip.

static const char *DOCS[] = {
    "First document: This is a test sentence.",
    "Second, with unicode: caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 and a tab\there.",
    "",  // empty: skipped
    "Third document.\nIt has two lines and <|end_of_text|> as plain text.",
};
static const char *DOC_LINES[] = {
    "{\"text\": \"First document: This is a test sentence.\", \"id\": 1}",
    "{\"meta\": {\"k\": [1, 2]}, "
    "\"text\": \"Second, with unicode: caf\\u00e9 \xE4\xB8\xAD\\u6587 \\ud83d\\ude00 and a tab\\there.\"}",
    "{\"text\": \"\"}",
    "{\"text\": \"Third document.\\nIt has two lines and <|end_of_text|> as plain text.\"}",
};
#define N_DOCS 4
static const char *TXT_DOC = "A plain text file\n\nis one document, blank lines and all.\n";

// Reads and concatenates PREFIX_split_000000.bin, ...; returns the shard count.
static int read_split(const char *prefix, const char *split, uint32_t **all, size_t *n_all, uint64_t *sizes) {
  *all = NULL, *n_all = 0;
  int k = 0;
  for (;; k++) {
    char path[600], err[512];
    snprintf(path, sizeof path, "%s_%s_%06d.bin", prefix, split, k);
    if (access(path, F_OK) != 0) break;
    uint32_t *tok;
    ShardInfo info;
    if (shard_read(path, &tok, &info, err, sizeof err) != 0) {
      CHECK(0, "shard_read: %s", err);
      break;
    }
    if (sizes && k < 64) sizes[k] = info.n_tokens;
    uint32_t *grown = xmalloc((*n_all + info.n_tokens + 1) * sizeof(uint32_t));
    if (*n_all) memcpy(grown, *all, *n_all * sizeof(uint32_t));
    memcpy(grown + *n_all, tok, info.n_tokens * sizeof(uint32_t));
    free(*all), free(tok);
    *all = grown, *n_all += info.n_tokens;
  }
  return k;
}

// The expected stream for the given documents: BOS ids EOS each.
static uint32_t *expected_stream(const Tokenizer *t, const char *const *docs, int n, size_t *len) {
  size_t cap = 1024;
  uint32_t *out = xmalloc(cap * sizeof(uint32_t));
  *len = 0;
  for (int i = 0; i < n; i++) {
    if (!docs[i][0]) continue;
    uint32_t *ids;
    size_t k = encode_str(t, docs[i], &ids);
    if (*len + k + 2 > cap) {
      cap = 2 * (*len + k + 2);
      uint32_t *bigger = xmalloc(cap * sizeof(uint32_t));
      memcpy(bigger, out, *len * sizeof(uint32_t));
      free(out);
      out = bigger;
    }
    out[(*len)++] = 128000;
    memcpy(out + *len, ids, k * sizeof(uint32_t));
    *len += k;
    out[(*len)++] = 128001;
    free(ids);
  }
  return out;
}

static int files_equal(const char *a, const char *b) {
  size_t na, nb;
  char *x = read_file(a, &na), *y = read_file(b, &nb);
  int eq = na == nb && !memcmp(x, y, na);
  free(x), free(y);
  return eq;
}

static void test_prepare(const Tokenizer *t, const char *model) {
  TEST_SECTION("data preparation round trip");
  // Inputs: a .jsonl (with a blank line and CRLF endings), the same as .jsonl.zst, and a .txt.
  char jsonl[4096] = "";
  for (int i = 0; i < N_DOCS; i++) {
    strcat(jsonl, DOC_LINES[i]);
    strcat(jsonl, i == 1 ? "\r\n\n" : "\n");
  }
  write_bytes(tmp_path("docs.jsonl"), jsonl, strlen(jsonl));
  size_t bound = ZSTD_compressBound(strlen(jsonl));
  char *z = xmalloc(bound);
  size_t zn = ZSTD_compress(z, bound, jsonl, strlen(jsonl), 3);
  CHECK(!ZSTD_isError(zn), "zstd compress");
  write_bytes(tmp_path("docs.jsonl.zst"), z, zn);
  write_bytes(tmp_path("trunc.jsonl.zst"), z, zn - 5);
  free(z);
  write_bytes(tmp_path("doc.txt"), TXT_DOC, strlen(TXT_DOC));

  // Expected: the 3 non-empty .jsonl docs, the same 3 from .zst, then the .txt doc.
  const char *all_docs[2 * N_DOCS + 1];
  for (int i = 0; i < N_DOCS; i++) all_docs[i] = all_docs[N_DOCS + i] = DOCS[i];
  all_docs[2 * N_DOCS] = TXT_DOC;
  size_t n_want;
  uint32_t *want = expected_stream(t, all_docs, 2 * N_DOCS + 1, &n_want);
  size_t n_first;  // the first document alone: it goes to validation with --val-docs 1
  uint32_t *first = expected_stream(t, DOCS, 1, &n_first);

  char prefix[600];
  snprintf(prefix, sizeof prefix, "%s/out", tmpdir);
  char *argv[] = {"tokenize",
                  "--tokenizer",
                  (char *)model,
                  "--input",
                  (char *)tmp_path("docs.jsonl"),
                  "--input",
                  (char *)tmp_path("docs.jsonl.zst"),
                  "--input",
                  (char *)tmp_path("doc.txt"),
                  "--output",
                  prefix,
                  "--shard-tokens",
                  "50",
                  "--val-docs",
                  "1",
                  "--threads",
                  "2",
                  "--quiet",
                  NULL};
  int argc = (int)(sizeof argv / sizeof argv[0]) - 1;
  CHECK(tokenize_main(argc, argv) == 0, "tokenize_main succeeded");

  uint32_t *train, *val;
  size_t n_train, n_val;
  uint64_t sizes[64];
  int shards = read_split(prefix, "train", &train, &n_train, sizes);
  int val_shards = read_split(prefix, "val", &val, &n_val, NULL);
  CHECK(val_shards == 1 && ids_equal(val, n_val, first, n_first), "val = the first document (%zu tokens)", n_val);
  CHECK(n_train == n_want - n_first && ids_equal(train, n_train, want + n_first, n_want - n_first),
        "train = the other documents, framed BOS..EOS (%zu vs %zu tokens)", n_train, n_want - n_first);
  CHECK(shards == (int)((n_train + 49) / 50), "%d shards for %zu tokens", shards, n_train);
  int sizes_ok = 1;
  for (int k = 0; k + 1 < shards; k++) sizes_ok &= sizes[k] == 50;
  CHECK(sizes_ok && shards > 1 && sizes[shards - 1] == n_train - 50 * (size_t)(shards - 1),
        "every shard but the last holds 50 tokens");
  size_t bos = 0, eos = 0;
  for (size_t i = 0; i < n_train; i++) bos += train[i] == 128000, eos += train[i] == 128001;
  CHECK(train[0] == 128000 && train[n_train - 1] == 128001 && bos == 6 && eos == 6, "6 framed documents in train");
  free(train), free(val), free(want), free(first);

  // --val-fraction: content-hash split, identical output for 1 and 2 threads and raw shards.
  char p1[600], p2[600];
  snprintf(p1, sizeof p1, "%s/frac1", tmpdir);
  snprintf(p2, sizeof p2, "%s/frac2", tmpdir);
  const char *inputs[] = {tmp_path("docs.jsonl"), tmp_path("docs.jsonl.zst"), tmp_path("doc.txt")};
  PrepareOptions opt = {.tokenizer_path = model,
                        .inputs = inputs,
                        .n_inputs = 3,
                        .output_prefix = p1,
                        .shard_tokens = 1000,
                        .val_fraction = 0.5,
                        .zstd_level = 0,
                        .threads = 1,
                        .quiet = 1};
  PrepareStats st1, st2;
  char err[1024];
  CHECK(prepare_run(&opt, &st1, err, sizeof err) == 0, "val-fraction run: %s", err);
  opt.output_prefix = p2, opt.threads = 2;
  CHECK(prepare_run(&opt, &st2, err, sizeof err) == 0, "val-fraction run 2: %s", err);
  CHECK(st1.docs[0] + st1.docs[1] == 7 && st1.empty_docs == 2, "7 docs, 2 empty (got %llu+%llu, %llu)",
        (unsigned long long)st1.docs[0], (unsigned long long)st1.docs[1], (unsigned long long)st1.empty_docs);
  // The split is decided by the content hash alone: recompute it here and compare streams.
  const char *split_docs[2][2 * N_DOCS + 1];
  int n_split[2] = {0, 0};
  for (int i = 0; i < 2 * N_DOCS + 1; i++) {
    if (!all_docs[i][0]) continue;
    int v = (hash64(all_docs[i], strlen(all_docs[i]), PREPARE_VAL_HASH_SEED) >> 11) * 0x1p-53 < 0.5;
    split_docs[v][n_split[v]++] = all_docs[i];
  }
  CHECK(n_split[0] > 0 && n_split[1] > 0, "both splits used (%d train, %d val)", n_split[0], n_split[1]);
  for (int v = 0; v < 2; v++) {
    uint32_t *got, *exp;
    size_t n_got, n_exp;
    exp = expected_stream(t, split_docs[v], n_split[v], &n_exp);
    read_split(p1, v ? "val" : "train", &got, &n_got, NULL);
    CHECK(st1.docs[v] == (uint64_t)n_split[v] && ids_equal(got, n_got, exp, n_exp), "%s split by content hash",
          v ? "val" : "train");
    free(got), free(exp);
  }
  char a[700], b[700];
  snprintf(a, sizeof a, "%s_train_000000.bin", p1);
  snprintf(b, sizeof b, "%s_train_000000.bin", p2);
  CHECK(files_equal(a, b), "train shard identical for 1 and 2 threads");
  CHECK(st1.tokens[0] == st2.tokens[0] && st1.tokens[1] == st2.tokens[1], "same token counts");

  TEST_SECTION("data preparation over many batches");
  // More documents than one batch holds (4096), so the read/encode/write pipeline turns over.
  enum { MANY = 9000 };
  FILE *f = xfopen(tmp_path("many.jsonl"), "wb");
  char **many = xmalloc(MANY * sizeof(char *));
  for (int i = 0; i < MANY; i++) {
    many[i] = xmalloc(64);
    snprintf(many[i], 64, "Document %d says: %s", i, i % 3 ? "hello" : "caf\xC3\xA9 \xF0\x9F\x98\x80!");
    fprintf(f, "{\"text\": \"%s\"}\n", many[i]);
  }
  fclose(f);
  const char *many_in = tmp_path("many.jsonl");
  char pm[600];
  snprintf(pm, sizeof pm, "%s/many", tmpdir);
  PrepareOptions mo = {.tokenizer_path = model,
                       .inputs = &many_in,
                       .n_inputs = 1,
                       .output_prefix = pm,
                       .shard_tokens = 100000000,
                       .val_docs = 10,
                       .zstd_level = 1,
                       .threads = 2,
                       .quiet = 1};
  CHECK(prepare_run(&mo, &st1, err, sizeof err) == 0, "many docs: %s", err);
  CHECK(st1.docs[0] == MANY - 10 && st1.docs[1] == 10, "%llu train + %llu val docs", (unsigned long long)st1.docs[0],
        (unsigned long long)st1.docs[1]);
  uint32_t *got;
  size_t n_got, n_exp;
  read_split(pm, "train", &got, &n_got, NULL);
  uint32_t *exp = expected_stream(t, (const char *const *)many + 10, MANY - 10, &n_exp);
  CHECK(ids_equal(got, n_got, exp, n_exp), "9000-document stream in order (%zu vs %zu tokens)", n_got, n_exp);
  free(got), free(exp);
  for (int i = 0; i < MANY; i++) free(many[i]);
  free(many);

  TEST_SECTION("data preparation errors");
  const char *bad_lines = "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n";
  write_bytes(tmp_path("bad.jsonl"), bad_lines, strlen(bad_lines));
  const char *no_text = "{\"text\": \"ok\"}\n\n{\"body\": \"x\"}\n";
  write_bytes(tmp_path("notext.jsonl"), no_text, strlen(no_text));
  write_bytes(tmp_path("data.csv"), "a,b\n", 4);
  struct {
    const char *input, *msg;
  } cases[] = {
      {"bad.jsonl", "bad.jsonl:2: bad JSON: column 10: unterminated string"},
      {"notext.jsonl", "notext.jsonl:3: object has no \"text\" member"},
      {"nope.jsonl", "cannot open"},
      {"data.csv", "data.csv: unsupported input"},
      {"trunc.jsonl.zst", "trunc.jsonl.zst: truncated zstd stream"},
  };
  opt.n_inputs = 1, opt.output_prefix = prefix, opt.val_fraction = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *in = tmp_path(cases[i].input);
    opt.inputs = &in;
    err[0] = 0;
    int rc = prepare_run(&opt, &st1, err, sizeof err);
    CHECK(rc == -1 && strstr(err, cases[i].msg), "input %s: rc %d, err '%s', want '%s'", cases[i].input, rc, err,
          cases[i].msg);
  }
  // --text prints the ids on one line: capture stdout in a file.
  fflush(stdout);
  int saved = dup(1);
  FILE *cap = xfopen(tmp_path("stdout.txt"), "wb");
  dup2(fileno(cap), 1);
  char *text_args[] = {"tokenize", "--tokenizer", (char *)model, "--text", "This is a test sentence.", NULL};
  int text_rc = tokenize_main(5, text_args);
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  fclose(cap);
  char *printed = read_file(tmp_path("stdout.txt"), NULL);
  CHECK(text_rc == 0 && !strcmp(printed, "2028 374 264 1296 11914 13\n"), "--text printed '%s'", printed);
  free(printed);

  char *bad_flag[] = {"tokenize", "--tokenizer", (char *)model, "--frobnicate", "1", NULL};
  CHECK(tokenize_main(5, bad_flag) != 0, "unknown flag fails");
  char *bad_value[] = {"tokenize", "--tokenizer", (char *)model, "--shard-tokens", "12x", NULL};
  CHECK(tokenize_main(5, bad_value) != 0, "bad --shard-tokens fails");
  char *no_output[] = {"tokenize", "--tokenizer", (char *)model, "--input", "x.jsonl", NULL};
  CHECK(tokenize_main(5, no_output) != 0, "--input without --output fails");
}

int main(void) {
  const char *model = getenv("TOKENIZER_MODEL");
  if (!model) model = "../shared/data/tokenizer/tokenizer.model";
  snprintf(tmpdir, sizeof tmpdir, "/tmp/test_tokenizer_%d", (int)getpid());
  mkdir(tmpdir, 0700);

  char err[512];
  double t0 = now_seconds();
  Tokenizer *t = tokenizer_load(model, NULL, err, sizeof err);
  CHECK(t != NULL, "load: %s", err);
  if (!t) TEST_END();
  printf("loaded %s in %.3f s\n", model, now_seconds() - t0);

  test_basics(t);
  test_vectors(t);
  test_load_errors(model);
  char pattern[1024];  // pat_str.txt next to the model
  const char *slash = strrchr(model, '/');
  snprintf(pattern, sizeof pattern, "%.*spat_str.txt", slash ? (int)(slash - model + 1) : 0, model);
  test_pattern_file(t, model, pattern);
  test_json();
  test_prepare(t, model);
  tokenizer_free(t);

  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) printf("note: could not remove %s\n", tmpdir);
  TEST_END();
}
