// data/tokenizer.h: the Llama-3 tokenizer (tiktoken-style byte-level BPE), encode and decode.
//
// Encoding = pretokenize with the Llama-3 regex (PCRE2), then byte-pair-merge each piece by rank,
// exactly as tiktoken's encode_ordinary does. Ids 0..127999 are the mergeable tokens of
// tokenizer.model (id == rank); 128000..128255 are the 256 Llama-3.1 special tokens, which
// encoding never produces (their strings in text are ordinary text) and decoding spells out.
//
// Invalid UTF-8 in the input: each maximal ill-formed subsequence is replaced by U+FFFD before
// pretokenizing (the Unicode "substitution of maximal subparts" rule, which is what Python's
// bytes.decode("utf-8", "replace") does). So for valid UTF-8 decode(encode(x)) == x; for invalid
// UTF-8 the ids equal tiktoken's on the replaced text.
//
// Limit: \p{L} and \p{N} come from PCRE2's Unicode tables (Unicode 14 in PCRE2 10.42), while
// tiktoken's Rust regex uses a newer Unicode. Code points first assigned after Unicode 14 (CJK
// Extension H, newer hieroglyph blocks, ...) can therefore split differently; all others match.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;

#define TOKENIZER_N_RANKS 128000  // mergeable tokens in Llama-3's tokenizer.model
#define TOKENIZER_N_SPECIAL 256   // special tokens after them
#define TOKENIZER_BOS 128000      // <|begin_of_text|>
#define TOKENIZER_EOS 128001      // <|end_of_text|>

// Loads tokenizer.model (lines "base64(token bytes) rank", ranks 0, 1, 2, ... in order) and the
// pretokenizer regex from pattern_path (a trailing newline is stripped), or the built-in Llama-3
// pattern when pattern_path is NULL. On failure returns NULL with a message naming the file (and
// line) in err.
Tokenizer *tokenizer_load(const char *model_path, const char *pattern_path, char *err, size_t errlen);
void tokenizer_free(Tokenizer *t);

// Encodes len bytes of ordinary text (no special tokens) into a malloc'd array *ids (caller frees;
// never NULL) and returns the count. Thread-safe: any number of threads may encode concurrently.
size_t tokenizer_encode(const Tokenizer *t, const char *text, size_t len, uint32_t **ids);

// Working memory for encoding (PCRE2 match data, BPE arrays, the UTF-8 repair buffer), kept by a
// thread across calls so that encoding many documents allocates almost nothing. One thread at a time.
typedef struct TokenizerScratch TokenizerScratch;
TokenizerScratch *tokenizer_scratch_new(const Tokenizer *t);
void tokenizer_scratch_free(TokenizerScratch *s);

// tokenizer_encode's ids appended to the growable array (*ids, *n_ids, *cap), realloc'd as needed
// (start from NULL, 0, 0). Returns the number appended.
size_t tokenizer_encode_append(const Tokenizer *t, TokenizerScratch *s, const char *text, size_t len, uint32_t **ids,
                               size_t *n_ids, size_t *cap);

// The first position p in [max(from, 1), len) where the text may be cut without changing its ids:
// encode(text) == encode(text[0..p)) then encode(text[p..len)). With the built-in Llama-3 pattern
// (or a pattern file holding it) that is after a '\n' followed by an ASCII letter; len when there is
// none, and always len with another pattern. Lets one long document be encoded by several threads.
size_t tokenizer_split_point(const Tokenizer *t, const char *text, size_t len, size_t from);

// The bytes of one token (not NUL-terminated), or NULL if id >= vocab size.
const char *tokenizer_token(const Tokenizer *t, uint32_t id, size_t *len);

// Decodes n ids into a malloc'd NUL-terminated byte string *out of length *len (caller frees).
// Returns 0, or -1 (with *out = NULL) if some id is out of range.
int tokenizer_decode(const Tokenizer *t, const uint32_t *ids, size_t n, char **out, size_t *len);

int tokenizer_vocab_size(const Tokenizer *t);  // 128256
uint32_t tokenizer_bos(const Tokenizer *t);    // 128000
uint32_t tokenizer_eos(const Tokenizer *t);    // 128001

// The built-in Llama-3 pretokenizer pattern (same as shared/data/tokenizer/pat_str.txt).
extern const char TOKENIZER_LLAMA3_PATTERN[];
