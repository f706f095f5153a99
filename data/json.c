// data/json.c: see json.h. A recursive-descent checker over one line; only the wanted string is
// decoded, every other value is validated and skipped.
#include "data/json.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

#define JSON_MAX_DEPTH 512  // nesting limit, so hostile input cannot overflow the stack

typedef struct {
  const char *s;
  size_t n, i;
  int depth;
  char *err;
  size_t errlen;
  int span;  // json_member_span: record the wanted member's value span, of any type
  size_t span_start, span_end;
} Parser;

// Reports a syntax error at byte offset `at` of the line (as a 1-based column); returns -1.
static int fail_at(Parser *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_at(Parser *p, size_t at, const char *fmt, ...) {
  if (p->err && p->errlen) {
    int k = snprintf(p->err, p->errlen, "column %zu: ", at + 1);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < p->errlen) vsnprintf(p->err + k, p->errlen - (size_t)k, fmt, ap);
    va_end(ap);
  }
  return -1;
}

#define fail(p, ...) fail_at((p), (p)->i, __VA_ARGS__)

static void skip_ws(Parser *p) {
  while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

static int peek(Parser *p) { return p->i < p->n ? (unsigned char)p->s[p->i] : -1; }

static size_t put_utf8(char *d, uint32_t c) {
  if (c < 0x80) {
    d[0] = (char)c;
    return 1;
  }
  if (c < 0x800) {
    d[0] = (char)(0xC0 | c >> 6);
    d[1] = (char)(0x80 | (c & 0x3F));
    return 2;
  }
  if (c < 0x10000) {
    d[0] = (char)(0xE0 | c >> 12);
    d[1] = (char)(0x80 | (c >> 6 & 0x3F));
    d[2] = (char)(0x80 | (c & 0x3F));
    return 3;
  }
  d[0] = (char)(0xF0 | c >> 18);
  d[1] = (char)(0x80 | (c >> 12 & 0x3F));
  d[2] = (char)(0x80 | (c >> 6 & 0x3F));
  d[3] = (char)(0x80 | (c & 0x3F));
  return 4;
}

// Reads the 4 hex digits of a \u escape at p->i; -1 if malformed.
static long hex4(Parser *p) {
  if (p->n - p->i < 4) return -1;
  long v = 0;
  for (int k = 0; k < 4; k++) {
    int c = p->s[p->i + k];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return -1;
    v = v * 16 + d;
  }
  p->i += 4;
  return v;
}

// Parses a string at p->i (which is '"'). If dst is non-NULL the decoded bytes go there (the
// caller guarantees room for as many bytes as the raw string has: decoding never grows it).
static int parse_string(Parser *p, char *dst, size_t *dst_len) {
  size_t o = 0, start = p->i;
  p->i++;  // opening quote
  for (;;) {
    if (p->i >= p->n) return fail_at(p, start, "unterminated string");
    char c = p->s[p->i++];
    if (c == '"') break;
    if (c != '\\') {
      if (dst) dst[o++] = c;
      continue;
    }
    if (p->i >= p->n) return fail_at(p, start, "unterminated string");
    char e = p->s[p->i++];
    static const char escapes[] = "\"\\/bfnrt", decoded[] = "\"\\/\b\f\n\r\t";
    const char *simple = e ? strchr(escapes, e) : NULL;
    if (simple) {
      if (dst) dst[o++] = decoded[simple - escapes];
      continue;
    }
    if (e != 'u') return fail_at(p, p->i - 2, "bad escape '\\%c'", e);
    long u = hex4(p);
    if (u < 0) return fail(p, "bad \\u escape (need 4 hex digits)");
    uint32_t cp = (uint32_t)u;
    if (u >= 0xD800 && u <= 0xDBFF && p->n - p->i >= 6 && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
      size_t save = p->i;
      p->i += 2;
      long lo = hex4(p);
      if (lo >= 0xDC00 && lo <= 0xDFFF) cp = 0x10000 + ((uint32_t)(u - 0xD800) << 10) + (uint32_t)(lo - 0xDC00);
      else p->i = save;  // not a low surrogate: leave it to be read as its own escape
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;  // lone surrogate: not encodable in UTF-8
    if (dst) o += put_utf8(dst + o, cp);
  }
  if (dst_len) *dst_len = o;
  return 0;
}

static int parse_literal(Parser *p, const char *word) {
  size_t k = strlen(word);
  if (p->n - p->i < k || memcmp(p->s + p->i, word, k) != 0) return fail(p, "invalid literal (expected %s)", word);
  p->i += k;
  return 0;
}

static int digits(Parser *p) {
  size_t start = p->i;
  while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
  return p->i > start ? 0 : fail(p, "expected a digit");
}

static int parse_number(Parser *p) {
  if (peek(p) == '-') p->i++;
  if (peek(p) == '0') p->i++;
  else if (digits(p)) return -1;
  if (peek(p) == '.') {
    p->i++;
    if (digits(p)) return -1;
  }
  if (peek(p) == 'e' || peek(p) == 'E') {
    p->i++;
    if (peek(p) == '+' || peek(p) == '-') p->i++;
    if (digits(p)) return -1;
  }
  return 0;
}

static int parse_value(Parser *p);

// Parses an object at p->i ('{'). When key is non-NULL (the top level), the string value of the
// last member named key is decoded into *out.
static int parse_object(Parser *p, const char *key, char **out, size_t *out_len, int *found) {
  if (++p->depth > JSON_MAX_DEPTH) return fail(p, "nesting deeper than %d", JSON_MAX_DEPTH);
  p->i++;
  skip_ws(p);
  if (peek(p) == '}') {
    p->i++, p->depth--;
    return 0;
  }
  size_t keylen = key ? strlen(key) : 0;
  for (;;) {
    skip_ws(p);
    if (peek(p) != '"') return fail(p, "expected a member name in quotes");
    // Names are compared decoded (so "te\u0078t" is "text"); long names cannot match and are skipped.
    char name[64];
    size_t name_len = 0, j = p->i + 1;
    while (j < p->n && p->s[j] != '"') j += p->s[j] == '\\' ? 2 : 1;  // raw end; decoding only shrinks
    int fits = key && j - p->i - 1 <= sizeof name;
    if (parse_string(p, fits ? name : NULL, &name_len)) return -1;
    int want = fits && name_len == keylen && memcmp(name, key, keylen) == 0;
    skip_ws(p);
    if (peek(p) != ':') return fail(p, "expected ':' after member name");
    p->i++;
    skip_ws(p);
    if (want && p->span) {
      size_t start = p->i;
      if (parse_value(p)) return -1;
      p->span_start = start, p->span_end = p->i, *found = 1;
    } else if (want) {
      if (peek(p) != '"') return fail(p, "member \"%s\" is not a string", key);
      size_t start = p->i;
      char *buf = xmalloc(p->n - start + 1);
      size_t n;
      if (parse_string(p, buf, &n)) {
        free(buf);
        return -1;
      }
      buf[n] = 0;
      if (*found) free(*out);  // duplicate key: the last one wins
      *out = buf, *out_len = n, *found = 1;
    } else if (parse_value(p)) {
      return -1;
    }
    skip_ws(p);
    int c = peek(p);
    p->i++;
    if (c == '}') break;
    if (c != ',') return fail_at(p, p->i - 1, "expected ',' or '}' in object");
  }
  p->depth--;
  return 0;
}

static int parse_array(Parser *p) {
  if (++p->depth > JSON_MAX_DEPTH) return fail(p, "nesting deeper than %d", JSON_MAX_DEPTH);
  p->i++;
  skip_ws(p);
  if (peek(p) == ']') {
    p->i++, p->depth--;
    return 0;
  }
  for (;;) {
    skip_ws(p);
    if (parse_value(p)) return -1;
    skip_ws(p);
    int c = peek(p);
    p->i++;
    if (c == ']') break;
    if (c != ',') return fail_at(p, p->i - 1, "expected ',' or ']' in array");
  }
  p->depth--;
  return 0;
}

static int parse_value(Parser *p) {
  int found = 0;
  switch (peek(p)) {
    case '"':
      return parse_string(p, NULL, NULL);
    case '{':
      return parse_object(p, NULL, NULL, NULL, &found);
    case '[':
      return parse_array(p);
    case 't':
      return parse_literal(p, "true");
    case 'f':
      return parse_literal(p, "false");
    case 'n':
      return parse_literal(p, "null");
    case -1:
      return fail(p, "unexpected end of line, expected a value");
    default:
      if (peek(p) == '-' || (peek(p) >= '0' && peek(p) <= '9')) return parse_number(p);
      return fail(p, "unexpected character '%c', expected a value", p->s[p->i]);
  }
}

int json_get_string(const char *text, size_t len, const char *key, char **out, size_t *out_len, char *err,
                    size_t errlen) {
  Parser p = {.s = text, .n = len, .err = err, .errlen = errlen};
  int found = 0;
  *out = NULL, *out_len = 0;
  skip_ws(&p);
  if (peek(&p) != '{') return fail(&p, "expected a JSON object ('{')");
  if (parse_object(&p, key, out, out_len, &found) == 0) {
    skip_ws(&p);
    if (p.i == p.n) return found;
    fail(&p, "unexpected text after the object");
  }
  if (found) free(*out);
  *out = NULL, *out_len = 0;
  return -1;
}

int json_member_span(const char *text, size_t len, const char *key, size_t *start, size_t *end, char *err,
                     size_t errlen) {
  Parser p = {.s = text, .n = len, .err = err, .errlen = errlen, .span = 1};
  int found = 0;
  char *unused = NULL;
  size_t unused_len = 0;
  skip_ws(&p);
  if (peek(&p) != '{') return fail(&p, "expected a JSON object ('{')");
  if (parse_object(&p, key, &unused, &unused_len, &found)) return -1;
  skip_ws(&p);
  if (p.i != p.n) return fail(&p, "unexpected text after the object");
  if (found) *start = p.span_start, *end = p.span_end;
  return found;
}

int json_array_next(const char *text, size_t len, size_t *pos, size_t *start, size_t *end, char *err, size_t errlen) {
  Parser p = {.s = text, .n = len, .i = *pos, .err = err, .errlen = errlen};
  skip_ws(&p);
  if (peek(&p) == '[') {
    p.i++;
    skip_ws(&p);
    if (peek(&p) == ']') return *pos = p.i + 1, 0;
  } else if (peek(&p) == ']' || p.i >= p.n) {
    return 0;
  }
  skip_ws(&p);
  size_t s = p.i;
  if (parse_value(&p)) return -1;
  *start = s, *end = p.i;
  skip_ws(&p);
  int c = peek(&p);
  if (c != ',' && c != ']') return fail(&p, "expected ',' or ']' in array");
  *pos = c == ',' ? p.i + 1 : p.i;
  return 1;
}
