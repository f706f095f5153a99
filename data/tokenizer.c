// data/tokenizer.c: see tokenizer.h. Sections: the rank table, loading, UTF-8 repair, BPE, encode,
// decode.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/tokenizer.h"

#include <errno.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

const char TOKENIZER_LLAMA3_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Llama-3.1's named special tokens (ids 128000..128010); the rest are reserved_special_token_N.
static const char *const NAMED_SPECIALS[] = {"<|begin_of_text|>",
                                             "<|end_of_text|>",
                                             "<|reserved_special_token_0|>",
                                             "<|reserved_special_token_1|>",
                                             "<|finetune_right_pad_id|>",
                                             "<|reserved_special_token_2|>",
                                             "<|start_header_id|>",
                                             "<|end_header_id|>",
                                             "<|eom_id|>",
                                             "<|eot_id|>",
                                             "<|python_tag|>"};
#define N_NAMED_SPECIALS ((int)(sizeof(NAMED_SPECIALS) / sizeof(NAMED_SPECIALS[0])))
#define NO_RANK UINT32_MAX

// A hash slot holds a token's length and first 8 bytes, so a probe usually settles in one cache
// line; only tokens longer than 8 bytes compare their tail in t->bytes.
typedef struct {
  uint64_t head;  // first 8 bytes, zero-padded
  uint32_t id1;   // token id + 1; 0 marks an empty slot
  uint32_t len;
} Slot;

struct Tokenizer {
  int vocab_size;         // TOKENIZER_N_RANKS + TOKENIZER_N_SPECIAL
  char *bytes;            // every token's bytes, concatenated in id order
  uint32_t *offset;       // token id's bytes are bytes[offset[id] .. offset[id+1])
  Slot *table;            // open addressing over the mergeable tokens
  uint32_t table_mask;    // table size - 1 (a power of two, at least twice the token count)
  uint32_t byte_id[256];  // the token of each single byte
  pcre2_code *re;
  int jit;         // the pattern was JIT-compiled (pcre2_jit_match may be used)
  int splittable;  // the pattern is the built-in Llama-3 one, for which tokenizer_split_point holds
};

// ---------------------------------------------------------------------------------------------
// The rank table: byte string -> id, for the mergeable tokens. BPE does a lookup per candidate
// pair, so this is the hot path: a multiply-xor hash over 8-byte words and linear probing.

static inline uint64_t bytes_hash(const uint8_t *p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  uint64_t w = 0;
  memcpy(&w, p, n);
  h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 29);
}

static inline uint64_t head_of(const uint8_t *p, size_t n) {
  uint64_t w = 0;
  memcpy(&w, p, n < 8 ? n : 8);
  return w;
}

// Finds the slot of these bytes: the one holding them, or the empty slot where they would go.
static inline const Slot *find_slot(const Tokenizer *t, const uint8_t *p, size_t n) {
  uint64_t head = head_of(p, n);
  for (uint32_t i = (uint32_t)bytes_hash(p, n) & t->table_mask;; i = (i + 1) & t->table_mask) {
    const Slot *e = &t->table[i];
    if (!e->id1) return e;
    if (e->len == n && e->head == head && (n <= 8 || memcmp(t->bytes + t->offset[e->id1 - 1] + 8, p + 8, n - 8) == 0))
      return e;
  }
}

// Returns the id of the mergeable token with these bytes, or NO_RANK.
static inline uint32_t lookup(const Tokenizer *t, const uint8_t *p, size_t n) {
  return find_slot(t, p, n)->id1 - 1;  // an empty slot gives 0 - 1 == NO_RANK
}

// Inserts id (whose bytes are already in t->bytes); returns the id already holding the same bytes,
// or NO_RANK if it was new.
static uint32_t table_insert(Tokenizer *t, uint32_t id) {
  const uint8_t *p = (const uint8_t *)t->bytes + t->offset[id];
  size_t n = t->offset[id + 1] - t->offset[id];
  Slot *e = (Slot *)find_slot(t, p, n);
  if (e->id1) return e->id1 - 1;
  *e = (Slot){.head = head_of(p, n), .id1 = id + 1, .len = (uint32_t)n};
  return NO_RANK;
}

// ---------------------------------------------------------------------------------------------
// Loading.

static int b64_value(int c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict standard base64 (length a multiple of 4, '=' only as final padding). Writes at most
// 3*n/4 bytes to out; returns the decoded length or -1.
static long b64_decode(const char *s, size_t n, uint8_t *out) {
  if (n == 0 || n % 4) return -1;
  long len = 0;
  for (size_t i = 0; i < n; i += 4) {
    int pad = (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=');
    if (pad && i + 4 != n) return -1;
    int v[4];
    for (int k = 0; k < 4 - pad; k++)
      if ((v[k] = b64_value((unsigned char)s[i + k])) < 0) return -1;
    uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (pad < 2 ? (uint32_t)v[2] << 6 : 0) |
                 (pad < 1 ? (uint32_t)v[3] : 0);
    out[len++] = (uint8_t)(w >> 16);
    if (pad < 2) out[len++] = (uint8_t)(w >> 8);
    if (pad < 1) out[len++] = (uint8_t)w;
  }
  return len;
}

// Reads a whole file, or returns NULL with err set (the library must not exit on bad input).
static char *slurp(const char *path, size_t *len, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    set_err(err, errlen, "cannot open '%s': %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 20, n = 0;
  char *buf = xmalloc(cap + 1);
  for (size_t got; (got = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += got;
    if (n == cap) {
      char *bigger = xmalloc(2 * cap + 1);
      memcpy(bigger, buf, n);
      free(buf);
      buf = bigger;
      cap *= 2;
    }
  }
  int failed = ferror(f);
  fclose(f);
  if (failed) {
    set_err(err, errlen, "cannot read '%s'", path);
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

// Parses the model text into t->bytes/offset/table. Returns 0 or -1 with err naming path:line.
static int parse_model(Tokenizer *t, const char *path, const char *text, size_t len, char *err, size_t errlen) {
  // Decoded bytes are shorter than their base64, so the file size bounds the mergeable bytes.
  t->bytes = xmalloc(len + TOKENIZER_N_SPECIAL * 40);  // specials are < 40 bytes each
  t->offset = xcalloc((size_t)t->vocab_size + 1, sizeof(uint32_t));
  uint32_t size = 1;
  while (size < 2u * TOKENIZER_N_RANKS) size *= 2;
  t->table = xcalloc(size, sizeof(Slot));
  t->table_mask = size - 1;

  uint32_t n = 0;  // tokens parsed so far
  size_t used = 0;
  const char *p = text, *end = text + len;
  for (long line = 1; p < end; line++) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    const char *stop = (eol > p && eol[-1] == '\r') ? eol - 1 : eol;
    if (stop == p) {  // tolerate blank lines (e.g. a trailing one)
      p = eol + 1;
      continue;
    }
    const char *space = memchr(p, ' ', (size_t)(stop - p));
    if (!space) {
      set_err(err, errlen, "%s:%ld: expected 'BASE64 RANK', found no space", path, line);
      return -1;
    }
    char *rank_end;
    errno = 0;
    unsigned long long rank = strtoull(space + 1, &rank_end, 10);
    if (rank_end != stop || space[1] < '0' || space[1] > '9' || errno) {
      set_err(err, errlen, "%s:%ld: bad rank '%.*s'", path, line, (int)(stop - space - 1), space + 1);
      return -1;
    }
    if (n == TOKENIZER_N_RANKS) {
      set_err(err, errlen, "%s:%ld: more than %d tokens", path, line, TOKENIZER_N_RANKS);
      return -1;
    }
    if (rank != n) {
      set_err(err, errlen, "%s:%ld: rank %llu out of order (expected %u: ranks must be 0, 1, 2, ... in file order)",
              path, line, rank, n);
      return -1;
    }
    long got = b64_decode(p, (size_t)(space - p), (uint8_t *)t->bytes + used);
    if (got <= 0) {
      set_err(err, errlen, "%s:%ld: bad base64 '%.*s'", path, line, (int)(space - p), p);
      return -1;
    }
    t->offset[n] = (uint32_t)used;
    used += (size_t)got;
    t->offset[n + 1] = (uint32_t)used;
    uint32_t dup = table_insert(t, n);
    if (dup != NO_RANK) {
      set_err(err, errlen, "%s:%ld: token bytes duplicate those of rank %u", path, line, dup);
      return -1;
    }
    n++;
    p = eol + 1;
  }
  if (n != TOKENIZER_N_RANKS) {
    set_err(err, errlen, "%s: has %u tokens, expected %d (Llama-3 tokenizer.model)", path, n, TOKENIZER_N_RANKS);
    return -1;
  }
  // BPE starts from single bytes, so every byte must be a token.
  for (int b = 0; b < 256; b++) {
    uint8_t byte = (uint8_t)b;
    if ((t->byte_id[b] = lookup(t, &byte, 1)) == NO_RANK) {
      set_err(err, errlen, "%s: byte 0x%02x has no token (every single byte must be one)", path, b);
      return -1;
    }
  }
  for (int i = 0; i < TOKENIZER_N_SPECIAL; i++) {
    char *dst = t->bytes + used;
    int w = i < N_NAMED_SPECIALS ? snprintf(dst, 40, "%s", NAMED_SPECIALS[i])
                                 : snprintf(dst, 40, "<|reserved_special_token_%d|>", i - N_NAMED_SPECIALS + 3);
    used += (size_t)w;
    t->offset[TOKENIZER_N_RANKS + i + 1] = (uint32_t)used;
  }
  return 0;
}

// tiktoken's regex engine (Rust) defines \s as Unicode White_Space; PCRE2's UCP \s also matches
// U+180E (Perl's historical list). So \s and \S are rewritten to \p{White_Space} and its
// negation, which are the same inside and outside character classes. Escaped backslashes are
// skipped; \Q..\E quoting is not understood (the Llama-3 pattern has none). PCRE2 before 10.40
// lacks \p{White_Space}: there the pattern stays as is and U+180E counts as a space.
#define HAVE_WHITE_SPACE_PROPERTY (PCRE2_MAJOR > 10 || PCRE2_MINOR >= 40)
static char *rewrite_whitespace(const char *pat, size_t len, size_t *out_len) {
  char *out = xmalloc(len * 8 + 1);  // "\s" (2 bytes) grows to "\p{White_Space}" (15 bytes)
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    if (HAVE_WHITE_SPACE_PROPERTY && pat[i] == '\\' && i + 1 < len && (pat[i + 1] == 's' || pat[i + 1] == 'S')) {
      o += (size_t)sprintf(out + o, "\\%c{White_Space}", pat[i + 1] == 's' ? 'p' : 'P');
      i++;
    } else if (pat[i] == '\\' && i + 1 < len) {
      out[o++] = pat[i++];
      out[o++] = pat[i];
    } else {
      out[o++] = pat[i];
    }
  }
  out[o] = 0;
  *out_len = o;
  return out;
}

static int compile_pattern(Tokenizer *t, const char *pattern, size_t len, const char *what, char *err, size_t errlen) {
  int code;
  PCRE2_SIZE at;
  size_t n;
  char *rewritten = rewrite_whitespace(pattern, len, &n);
  t->re = pcre2_compile((PCRE2_SPTR)rewritten, n, PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
  free(rewritten);
  if (!t->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    set_err(err, errlen, "%s: bad regex: %s (at offset %zu after rewriting \\s)", what, (const char *)msg, (size_t)at);
    return -1;
  }
  // JIT is several times faster; without it (unsupported CPU, or a build without JIT) the
  // interpreter gives the same matches.
  t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
  return 0;
}

Tokenizer *tokenizer_load(const char *model_path, const char *pattern_path, char *err, size_t errlen) {
  Tokenizer *t = xcalloc(1, sizeof(Tokenizer));
  t->vocab_size = TOKENIZER_N_RANKS + TOKENIZER_N_SPECIAL;
  size_t len;
  char *text = slurp(model_path, &len, err, errlen);
  int ok = text && parse_model(t, model_path, text, len, err, errlen) == 0;
  free(text);
  if (ok && pattern_path) {
    char *pat = slurp(pattern_path, &len, err, errlen);
    while (pat && len && (pat[len - 1] == '\n' || pat[len - 1] == '\r')) len--;
    ok = pat && compile_pattern(t, pat, len, pattern_path, err, errlen) == 0;
    t->splittable = ok && len == strlen(TOKENIZER_LLAMA3_PATTERN) && !memcmp(pat, TOKENIZER_LLAMA3_PATTERN, len);
    free(pat);
  } else if (ok) {
    ok = compile_pattern(t, TOKENIZER_LLAMA3_PATTERN, strlen(TOKENIZER_LLAMA3_PATTERN), "built-in pattern", err,
                         errlen) == 0;
    t->splittable = 1;
  }
  if (!ok) {
    tokenizer_free(t);
    return NULL;
  }
  return t;
}

void tokenizer_free(Tokenizer *t) {
  if (!t) return;
  if (t->re) pcre2_code_free(t->re);
  free(t->bytes);
  free(t->offset);
  free(t->table);
  free(t);
}

int tokenizer_vocab_size(const Tokenizer *t) { return t->vocab_size; }
uint32_t tokenizer_bos(const Tokenizer *t) { return TOKENIZER_BOS; }
uint32_t tokenizer_eos(const Tokenizer *t) { return TOKENIZER_EOS; }

// ---------------------------------------------------------------------------------------------
// UTF-8 repair. PCRE2 in UTF mode rejects invalid UTF-8, so ill-formed input is rewritten first.

// Length of the well-formed sequence at p (1..4), or 0 if ill-formed, with *bad = the length of
// its maximal subpart (the bytes that could still have begun a valid sequence, at least 1).
// Ranges follow the Unicode standard's table of well-formed byte sequences.
static int utf8_sequence(const uint8_t *p, size_t n, int *bad) {
  uint8_t b = p[0], lo = 0x80, hi = 0xBF;  // lo..hi: allowed range of the second byte
  int need;                                // continuation bytes
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;  // no overlong forms
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;  // no overlong forms
    if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    *bad = 1;  // a stray continuation byte, C0/C1 (always overlong) or F5..FF
    return 0;
  }
  for (int k = 1; k <= need; k++) {
    if ((size_t)k >= n || p[k] < lo || p[k] > hi) {
      *bad = k;
      return 0;
    }
    lo = 0x80, hi = 0xBF;
  }
  return need + 1;
}

// Returns the offset of the first ill-formed byte, or n if the text is valid UTF-8.
static size_t utf8_first_invalid(const uint8_t *p, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {  // skip ASCII eight bytes at a time
      uint64_t w;
      memcpy(&w, p + i, 8);
      if (!(w & 0x8080808080808080ull)) {
        i += 8;
        continue;
      }
    }
    int bad, k = utf8_sequence(p + i, n - i, &bad);
    if (!k) return i;
    i += (size_t)k;
  }
  return n;
}

// Writes p with each maximal ill-formed subpart replaced by U+FFFD into out (room for 3 * n bytes:
// at worst every byte becomes a 3-byte U+FFFD).
static void utf8_repair(const uint8_t *p, size_t n, char *out, size_t *out_len) {
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    int bad, k = utf8_sequence(p + i, n - i, &bad);
    if (k) {
      memcpy(out + o, p + i, (size_t)k);
      o += (size_t)k, i += (size_t)k;
    } else {
      memcpy(out + o, "\xEF\xBF\xBD", 3);
      o += 3, i += (size_t)bad;
    }
  }
  *out_len = o;
}

// ---------------------------------------------------------------------------------------------
// BPE on one piece, tiktoken's rule: repeatedly merge the adjacent pair of parts whose concatenation
// has the lowest rank (leftmost on ties) until no concatenation is a token. Parts form a linked
// list over byte offsets; candidate pairs sit in a min-heap keyed by (rank, offset), which selects
// the same pair as tiktoken's linear scan but costs O(n log n), so long runs (10k spaces) are cheap.
// Stale heap entries are skipped by comparing against the pair's current rank.

typedef struct {
  uint32_t *next;  // next[i]: start of the part after the one starting at i (n = end)
  uint32_t *prev;  // prev[i]: start of the part before
  uint32_t *id;    // id[i]: token of the part starting at i
  uint32_t *rank;  // rank[i]: rank of merging part i with its successor; NO_RANK if none/dead
  uint64_t *heap;
  size_t cap;
} BpeWork;

static void bpe_reserve(BpeWork *w, size_t n) {
  if (n <= w->cap) return;
  free(w->next), free(w->prev), free(w->id), free(w->rank), free(w->heap);
  w->cap = n < 256 ? 256 : 2 * n;
  w->next = xmalloc(w->cap * sizeof(uint32_t));
  w->prev = xmalloc(w->cap * sizeof(uint32_t));
  w->id = xmalloc(w->cap * sizeof(uint32_t));
  w->rank = xmalloc(w->cap * sizeof(uint32_t));
  w->heap = xmalloc(w->cap * 2 * sizeof(uint64_t));  // each merge pushes at most two entries
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
  size_t i = (*n)++;
  while (i > 0 && h[(i - 1) / 2] > v) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
  h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
  uint64_t top = h[0], v = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && h[c + 1] < h[c]) c++;
    if (h[c] >= v) break;
    h[i] = h[c], i = c;
  }
  h[i] = v;
  return top;
}

// Rank of merging the part at i with its successor (NO_RANK if it is the last part).
static inline uint32_t pair_rank(const Tokenizer *t, const uint8_t *p, uint32_t n, const BpeWork *w, uint32_t i) {
  uint32_t j = w->next[i];
  if (j == n) return NO_RANK;
  return lookup(t, p + i, w->next[j] - i);
}

// Appends the tokens of piece p[0..n) (n >= 2, not itself a token) to out.
static void bpe(const Tokenizer *t, const uint8_t *p, uint32_t n, BpeWork *w, uint32_t *out, size_t *n_out) {
  bpe_reserve(w, n);
  size_t hn = 0;
  for (uint32_t i = 0; i < n; i++) w->next[i] = i + 1, w->prev[i] = i - 1, w->id[i] = t->byte_id[p[i]];
  for (uint32_t i = 0; i < n; i++) {
    w->rank[i] = pair_rank(t, p, n, w, i);
    if (w->rank[i] != NO_RANK) heap_push(w->heap, &hn, (uint64_t)w->rank[i] << 32 | i);
  }
  while (hn) {
    uint64_t top = heap_pop(w->heap, &hn);
    uint32_t r = (uint32_t)(top >> 32), i = (uint32_t)top;
    if (w->rank[i] != r) continue;  // stale: the pair at i changed or the part died
    uint32_t j = w->next[i];
    w->id[i] = r;  // rank == id for mergeable tokens
    w->next[i] = w->next[j];
    w->rank[j] = NO_RANK;
    if (w->next[i] < n) w->prev[w->next[i]] = i;
    w->rank[i] = pair_rank(t, p, n, w, i);
    if (w->rank[i] != NO_RANK) heap_push(w->heap, &hn, (uint64_t)w->rank[i] << 32 | i);
    if (i > 0) {
      uint32_t h = w->prev[i];
      w->rank[h] = pair_rank(t, p, n, w, h);
      if (w->rank[h] != NO_RANK) heap_push(w->heap, &hn, (uint64_t)w->rank[h] << 32 | h);
    }
  }
  for (uint32_t i = 0; i < n; i = w->next[i]) out[(*n_out)++] = w->id[i];
}

// ---------------------------------------------------------------------------------------------
// Encode: pretokenize with the regex, then each piece is one token or goes through BPE. As in
// tiktoken, text the pattern does not match is skipped (the Llama-3 pattern matches everything).

struct TokenizerScratch {
  pcre2_match_data *md;
  BpeWork bpe;
  char *repair;  // the UTF-8-repaired text, when the input is ill-formed
  size_t repair_cap;
};

TokenizerScratch *tokenizer_scratch_new(const Tokenizer *t) {
  TokenizerScratch *s = xcalloc(1, sizeof *s);
  if (!(s->md = pcre2_match_data_create_from_pattern(t->re, NULL)))
    die("tokenizer: out of memory for PCRE2 match data");
  return s;
}

void tokenizer_scratch_free(TokenizerScratch *s) {
  if (!s) return;
  pcre2_match_data_free(s->md);
  free(s->bpe.next), free(s->bpe.prev), free(s->bpe.id), free(s->bpe.rank), free(s->bpe.heap);
  free(s->repair);
  free(s);
}

static inline void reserve_ids(uint32_t **ids, size_t *cap, size_t need) {
  if (*cap >= need) return;
  size_t grown = 2 * *cap > need ? 2 * *cap : need;
  uint32_t *bigger = realloc(*ids, grown * sizeof(uint32_t));
  if (!bigger) die("tokenizer_encode: out of memory for %zu ids", grown);
  *ids = bigger, *cap = grown;
}

size_t tokenizer_encode_append(const Tokenizer *t, TokenizerScratch *sc, const char *text, size_t len, uint32_t **ids,
                               size_t *n_ids, size_t *cap) {
  if (utf8_first_invalid((const uint8_t *)text, len) != len) {
    if (sc->repair_cap < 3 * len) {
      free(sc->repair);
      sc->repair_cap = 3 * len;
      sc->repair = xmalloc(sc->repair_cap);
    }
    utf8_repair((const uint8_t *)text, len, sc->repair, &len);
    text = sc->repair;
  }
  if (len >= UINT32_MAX) die("tokenizer_encode: text of %zu bytes is too long (limit 4 GB)", len);
  size_t n_out = *n_ids;
  reserve_ids(ids, cap, n_out + len / 3 + 16);  // about 4 bytes a token; grown below when short
  pcre2_match_data *md = sc->md;
  const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
  const uint8_t *s = (const uint8_t *)text;

  for (size_t pos = 0; pos < len;) {
    int rc = t->jit ? pcre2_jit_match(t->re, s, len, pos, 0, md, NULL)
                    : pcre2_match(t->re, s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // pathological backtracking: the interpreter copes
      rc = pcre2_match(t->re, s, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      die("tokenizer_encode: regex match failed at byte %zu: %s", pos, (const char *)msg);
    }
    size_t a = ov[0], b = ov[1];
    if (a == b) {  // an empty match (only possible with a custom pattern): step over one character
      int bad, k = utf8_sequence(s + a, len - a, &bad);
      pos = a + (size_t)(k ? k : 1);
      continue;
    }
    reserve_ids(ids, cap, n_out + (b - a));  // a piece gives at most one token per byte
    uint32_t id = lookup(t, s + a, b - a);
    if (id != NO_RANK) (*ids)[n_out++] = id;
    else bpe(t, s + a, (uint32_t)(b - a), &sc->bpe, *ids, &n_out);
    pos = b;
  }
  size_t added = n_out - *n_ids;
  *n_ids = n_out;
  return added;
}

size_t tokenizer_encode(const Tokenizer *t, const char *text, size_t len, uint32_t **ids) {
  TokenizerScratch *sc = tokenizer_scratch_new(t);
  uint32_t *out = NULL;
  size_t n = 0, cap = 0;
  tokenizer_encode_append(t, sc, text, len, &out, &n, &cap);
  tokenizer_scratch_free(sc);
  uint32_t *shrunk = realloc(out, (n ? n : 1) * sizeof(uint32_t));
  *ids = shrunk ? shrunk : out;
  return n;
}

// The Llama-3 pattern never matches across a newline followed by a letter: every alternative that
// can hold a '\n' ends with a run of \s or [\r\n] (which a letter stops), and the one that starts
// with a non-letter ([^\r\n\p{L}\p{N}]?\p{L}+) excludes '\n'. The matches before such a point do not
// look past it either, but for \s+(?!\S), which is never reached there: \s*[\r\n]+ comes first and
// takes any whitespace run that ends in '\n'. So the matches of the whole text are those of the
// two sides, and so are the tokens. Only ASCII letters are tested, which needs no Unicode table.
size_t tokenizer_split_point(const Tokenizer *t, const char *text, size_t len, size_t from) {
  if (!t->splittable) return len;
  for (size_t i = from ? from : 1; i < len;) {
    const char *nl = memchr(text + i - 1, '\n', len - i);  // a '\n' at i - 1 .. len - 2
    if (!nl) break;
    size_t p = (size_t)(nl - text) + 1;
    unsigned char c = (unsigned char)text[p];
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return p;
    i = p + 1;
  }
  return len;
}

// ---------------------------------------------------------------------------------------------
// Decode.

const char *tokenizer_token(const Tokenizer *t, uint32_t id, size_t *len) {
  if (id >= (uint32_t)t->vocab_size) return NULL;
  *len = t->offset[id + 1] - t->offset[id];
  return t->bytes + t->offset[id];
}

int tokenizer_decode(const Tokenizer *t, const uint32_t *ids, size_t n, char **out, size_t *len) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] >= (uint32_t)t->vocab_size) {
      *out = NULL;
      *len = 0;
      return -1;
    }
    total += t->offset[ids[i] + 1] - t->offset[ids[i]];
  }
  char *buf = xmalloc(total + 1);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    size_t k = t->offset[ids[i] + 1] - t->offset[ids[i]];
    memcpy(buf + o, t->bytes + t->offset[ids[i]], k);
    o += k;
  }
  buf[o] = 0;
  *out = buf;
  *len = o;
  return 0;
}
