// data/blend.c: see blend.h. Parsing the spec's forms into sources, and the deadline schedule.
#include "data/blend.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

static int name_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == '.' || c == '-'; }

// Length of the plain decimal number at s ([+-]digits[.digits][e[+-]digits], at least one digit), or 0.
static size_t number_len(const char *s) {
  size_t i = 0, digits = 0;
  if (s[i] == '+' || s[i] == '-') i++;
  for (; isdigit((unsigned char)s[i]); i++) digits++;
  if (s[i] == '.')
    for (i++; isdigit((unsigned char)s[i]); i++) digits++;
  if (!digits) return 0;
  if (s[i] == 'e' || s[i] == 'E') {
    size_t j = i + 1;
    if (s[j] == '+' || s[j] == '-') j++;
    if (isdigit((unsigned char)s[j])) {
      while (isdigit((unsigned char)s[j])) j++;
      i = j;
    }
  }
  return i;
}

// An entry that starts a weighted source: "WEIGHT:" or "NAME=WEIGHT:". Returns the prefix's length
// (0: the entry is a path), with the name's length and the weight's offset and length.
static size_t weight_prefix(const char *e, size_t *name_len, size_t *num_at, size_t *num_len) {
  size_t n = 0;
  while (name_char(e[n])) n++;
  size_t at = n > 0 && e[n] == '=' ? n + 1 : 0;
  size_t len = number_len(e + at);
  if (!len || e[at + len] != ':') return 0;
  *name_len = at ? n : 0, *num_at = at, *num_len = len;
  return at + len + 1;
}

static char *dup_span(const char *s, size_t n) {
  char *d = xmalloc(n + 1);
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

static void append_entry(char **paths, const char *e) {
  size_t a = strlen(*paths), n = strlen(e);
  char *d = xmalloc(a + n + 2);
  memcpy(d, *paths, a);
  d[a] = ',';
  memcpy(d + a + 1, e, n + 1);
  free(*paths);
  *paths = d;
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  char *end = s + strlen(s);
  while (end > s && (end[-1] == ' ' || end[-1] == '\t')) *--end = 0;
  return s;
}

// The raw parse: each source's paths, and its name and weight as written (NULL: not written).
typedef struct {
  char *name[BLEND_MAX_SOURCES], *weight[BLEND_MAX_SOURCES];
} Written;

static int add_source(BlendSpec *b, Written *w, char *name, char *weight, char *paths, char *err, size_t errlen) {
  if (b->n == BLEND_MAX_SOURCES) {
    free(name), free(weight), free(paths);
    return set_err(err, errlen, "more than %d sources", BLEND_MAX_SOURCES);
  }
  w->name[b->n] = name, w->weight[b->n] = weight, b->src[b->n].paths = paths;
  b->n++;
  return 0;
}

// Megatron-LM's "W1 PATH1 W2 PATH2 ...": no comma, an even number (>= 2) of words, every other one a
// number. Returns 1 when spec is in that form (sources added), 0 when not, -1 on error.
static int parse_megatron(const char *spec, BlendSpec *b, Written *w, char *err, size_t errlen) {
  if (strchr(spec, ',')) return 0;
  char *copy = dup_span(spec, strlen(spec)), *words[2 * BLEND_MAX_SOURCES + 2];
  int n = 0, rc = 0;
  for (char *s = copy; *s && n < (int)(sizeof words / sizeof *words);) {
    while (*s && isspace((unsigned char)*s)) s++;
    if (!*s) break;
    words[n++] = s;
    while (*s && !isspace((unsigned char)*s)) s++;
    if (*s) *s++ = 0;
  }
  int ok = n >= 2 && n % 2 == 0 && n < (int)(sizeof words / sizeof *words);
  for (int i = 0; ok && i < n; i += 2) ok = number_len(words[i]) == strlen(words[i]);
  for (int i = 0; ok && rc == 0 && i < n; i += 2)
    rc = add_source(b, w, NULL, dup_span(words[i], strlen(words[i])), dup_span(words[i + 1], strlen(words[i + 1])), err,
                    errlen);
  free(copy);
  return rc < 0 ? -1 : ok;
}

// The comma form: entries, each a path or a WEIGHT:/NAME=WEIGHT: prefix and a path starting a source.
static int parse_entries(char *spec, BlendSpec *b, Written *w, char *err, size_t errlen) {
  for (char *e = spec, *next; e; e = next) {
    next = strchr(e, ',');
    if (next) *next++ = 0;
    e = trim(e);
    size_t name_len, num_at, num_len, skip = weight_prefix(e, &name_len, &num_at, &num_len);
    if (!skip) {  // a path: the previous source's, or the first source's when no weight came yet
      if (b->n == 0) {
        if (add_source(b, w, NULL, NULL, dup_span(e, strlen(e)), err, errlen)) return -1;
      } else append_entry(&b->src[b->n - 1].paths, e);
      continue;
    }
    char *path = trim(e + skip);
    if (!*path) return set_err(err, errlen, "entry '%s': no path after the weight", e);
    if (b->n == 1 && !w->weight[0])
      return set_err(err, errlen,
                     "entry '%s' has no weight, but a later one has: write WEIGHT:PATH (or NAME=WEIGHT:PATH) for "
                     "every source",
                     b->src[0].paths);
    if (add_source(b, w, name_len ? dup_span(e, name_len) : NULL, dup_span(e + num_at, num_len),
                   dup_span(path, strlen(path)), err, errlen))
      return -1;
  }
  return 0;
}

// A source's name from its first path: the file's stem without the shard pattern ("data/web/web_train_*.bin"
// -> "web", "x/corpus_text_document" -> "corpus"), or the folder of a packed-binary manifest.
static void derive_name(const char *paths, int index, char *out) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%.*s", (int)strcspn(paths, ","), paths);
  char *s = trim(buf), *end = s + strlen(s);
  while (end > s && end[-1] == '/') *--end = 0;
  char *base = strrchr(s, '/') ? strrchr(s, '/') + 1 : s;
  size_t blen = strlen(base);
  if (blen > 5 && !strcmp(base + blen - 5, ".json") && base > s) {  // a manifest: name it by its folder
    base[-1] = 0;
    base = strrchr(s, '/') ? strrchr(s, '/') + 1 : s;
  }
  static const char *const cuts[] = {"_train", "_val", "_text_document", "*", "?", "[", ".bin", ".idx", ".json"};
  for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
    char *at = strstr(base, cuts[i]);
    if (at && at > base) *at = 0;
  }
  size_t n = 0;
  for (const char *c = base; *c && n < BLEND_NAME - 1; c++) out[n++] = name_char(*c) ? *c : '_';
  while (n > 0 && strchr("_.-", out[n - 1])) n--;
  out[n] = 0;
  if (!n) snprintf(out, BLEND_NAME, "source%d", index + 1);
}

// Names (given or derived, then unique), weights (positive, finite, normalized).
static int finish(BlendSpec *b, const Written *w, char *err, size_t errlen) {
  for (int i = 0; i < b->n; i++) {
    BlendSource *s = &b->src[i];
    if (w->name[i] && strlen(w->name[i]) >= BLEND_NAME)
      return set_err(err, errlen, "source %d: name '%s' is longer than %d characters", i + 1, w->name[i],
                     BLEND_NAME - 1);
    if (w->name[i]) snprintf(s->name, sizeof s->name, "%s", w->name[i]);
    else derive_name(s->paths, i, s->name);
    for (int j = 0; j < i; j++) {
      if (strcmp(s->name, b->src[j].name)) continue;
      if (w->name[i])
        return set_err(err, errlen, "sources %d and %d are both named '%s': name them apart (NAME=WEIGHT:PATH)", j + 1,
                       i + 1, s->name);
      char base[BLEND_NAME];
      snprintf(base, sizeof base, "%s", s->name);
      snprintf(s->name, sizeof s->name, "%.*s_%d", BLEND_NAME - 5, base, i + 1);
      j = -1;  // compare the new name with every earlier one again
    }
  }
  if (b->n == 1 && !w->weight[0]) {
    b->src[0].weight = 1;
    return 0;
  }
  double total = 0;
  for (int i = 0; i < b->n; i++) {
    char *end;
    double v = strtod(w->weight[i], &end);
    if (*end || !isfinite(v) || !(v > 0))
      return set_err(err, errlen, "source %d ('%s'): weight %s is not a positive finite number", i + 1, b->src[i].name,
                     w->weight[i]);
    b->src[i].weight = v;
    total += v;
  }
  if (!isfinite(total)) return set_err(err, errlen, "the weights' sum overflows: scale them down");
  for (int i = 0; i < b->n; i++) b->src[i].weight /= total;
  b->weighted = 1;
  return 0;
}

int blend_parse(const char *spec, BlendSpec *b, char *err, size_t errlen) {
  memset(b, 0, sizeof *b);
  Written w = {{0}, {0}};
  char *copy = dup_span(spec, strlen(spec));
  int rc = parse_megatron(spec, b, &w, err, errlen);
  if (rc == 0) rc = parse_entries(copy, b, &w, err, errlen);  // not Megatron's form: read the commas
  if (rc >= 0) rc = finish(b, &w, err, errlen);
  for (int i = 0; i < BLEND_MAX_SOURCES; i++) free(w.name[i]), free(w.weight[i]);
  free(copy);
  return rc < 0 ? -1 : 0;
}

void blend_spec_free(BlendSpec *b) {
  for (int i = 0; i < b->n; i++) free(b->src[i].paths);
  b->n = 0;
}

void blend_schedule_init(BlendSchedule *s, const BlendSpec *b) {
  memset(s, 0, sizeof *s);
  s->n = b->n;
  for (int i = 0; i < b->n; i++) s->weight[i] = b->src[i].weight;
}

int blend_next(BlendSchedule *s, uint64_t *index) {
  const double next = (double)(s->pos + 1);
  int pick = -1;
  double best = 0;
  for (int i = 0; i < s->n; i++) {
    if (!((double)s->count[i] < s->weight[i] * next)) continue;  // not due: one more would put it ahead
    double deadline = (double)(s->count[i] + 1) / s->weight[i];
    if (pick < 0 || deadline < best) pick = i, best = deadline;
  }
  // The lags w (p+1) - c sum to 1, so some source is due; rounding could only hide that after
  // ~1e15 samples. Then the most lagging one goes.
  if (pick < 0)
    for (int i = 0; i < s->n; i++) {
      double lag = s->weight[i] * next - (double)s->count[i];
      if (pick < 0 || lag > best) pick = i, best = lag;
    }
  if (pick < 0) die("blend_next: a schedule of no sources");
  *index = s->count[pick]++;
  s->pos++;
  return pick;
}

int blend_check(const BlendSchedule *s, const BlendSpec *b, char *err, size_t errlen) {
  uint64_t sum = 0;
  for (int i = 0; i < s->n; i++) sum += s->count[i];
  if (sum != s->pos)
    return set_err(err, errlen, "the sources' sample counts sum to %llu, not to the position %llu",
                   (unsigned long long)sum, (unsigned long long)s->pos);
  for (int i = 0; i < s->n; i++) {
    double share = s->weight[i] * (double)s->pos;
    if (!(fabs((double)s->count[i] - share) < 1 + 1e-12 * (double)s->pos))
      return set_err(err, errlen, "source '%s': %llu samples at position %llu, not within one of its share %.1f",
                     b->src[i].name, (unsigned long long)s->count[i], (unsigned long long)s->pos, share);
  }
  return 0;
}
