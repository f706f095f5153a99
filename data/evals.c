// data/evals.c: see evals.h. Task files are small (under 8 MB), so each is read whole and kept as
// decoded, harness-formatted strings.
#include "data/evals.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "data/json.h"

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(xmalloc(n), s, n);
}

// a + b + c in a fresh malloc'd string
static char *concat3(const char *a, const char *b, const char *c) {
  size_t na = strlen(a), nb = strlen(b), nc = strlen(c);
  char *s = xmalloc(na + nb + nc + 1);
  memcpy(s, a, na);
  memcpy(s + na, b, nb);
  memcpy(s + na + nb, c, nc + 1);
  return s;
}

// The paper scores MMLU 5-shot (acc), HellaSwag 10-shot (acc_norm), WinoGrande 5-shot (acc) and
// ARC-Challenge 25-shot (acc_norm).
static const EvalTaskInfo EVAL_TASKS[] = {
    {"mmlu", "mmlu.jsonl", EVAL_MMLU, 5, 0},
    {"hellaswag", "hellaswag_val.txt", EVAL_HELLASWAG, 10, 1},
    {"winogrande", "winogrande.jsonl", EVAL_WINOGRANDE, 5, 0},
    {"arc_challenge", "arc_challenge.jsonl", EVAL_ARC_CHALLENGE, 25, 1},
};
static const int EVAL_N_TASKS = (int)(sizeof EVAL_TASKS / sizeof EVAL_TASKS[0]);
_Static_assert(sizeof EVAL_TASKS / sizeof EVAL_TASKS[0] <= EVAL_MAX_TASKS, "\"paper\" fits eval.tasks");

const EvalTaskInfo *eval_task_info(const char *name) {
  for (int i = 0; i < EVAL_N_TASKS; i++)
    if (!strcmp(name, EVAL_TASKS[i].name)) return &EVAL_TASKS[i];
  return NULL;
}

int eval_tasks_parse(const char *spec, const EvalTaskInfo **task, int *shots, char *err, size_t errlen) {
  if (!strcmp(spec, "paper")) {
    for (int i = 0; i < EVAL_N_TASKS; i++) task[i] = &EVAL_TASKS[i], shots[i] = EVAL_TASKS[i].paper_shots;
    return EVAL_N_TASKS;
  }
  char buf[1024], *save = NULL;
  if (snprintf(buf, sizeof buf, "%s", spec) >= (int)sizeof buf)
    return set_err(err, errlen, "longer than %zu characters", sizeof buf - 1);
  int n = 0;
  for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    char *colon = strchr(item, ':'), *end = NULL;
    if (colon) *colon = 0;
    const EvalTaskInfo *t = eval_task_info(item);
    if (!t)
      return set_err(err, errlen, "unknown task '%s' (known: mmlu, hellaswag, arc_challenge, winogrande, or \"paper\")",
                     item);
    long k = colon ? strtol(colon + 1, &end, 10) : 0;
    if (colon && (k < 0 || k > 1000 || *end || end == colon + 1))
      return set_err(err, errlen, "'%s': the shot count after ':' must be an integer in 0..1000", colon + 1);
    if (n == EVAL_MAX_TASKS) return set_err(err, errlen, "more than %d tasks", EVAL_MAX_TASKS);
    task[n] = t, shots[n++] = (int)k;
  }
  return n;
}

// The harness's groups (lm_eval/tasks/mmlu/default: each subject's tag mmlu_<category>_tasks).
const char *const EVAL_MMLU_CATEGORY[EVAL_MMLU_CATEGORIES] = {"stem", "other", "social_sciences", "humanities"};
static const struct {
  const char *subject;
  int category;
} MMLU_SUBJECTS[] = {
    {"abstract_algebra", 0},
    {"anatomy", 0},
    {"astronomy", 0},
    {"business_ethics", 1},
    {"clinical_knowledge", 1},
    {"college_biology", 0},
    {"college_chemistry", 0},
    {"college_computer_science", 0},
    {"college_mathematics", 0},
    {"college_medicine", 1},
    {"college_physics", 0},
    {"computer_security", 0},
    {"conceptual_physics", 0},
    {"econometrics", 2},
    {"electrical_engineering", 0},
    {"elementary_mathematics", 0},
    {"formal_logic", 3},
    {"global_facts", 1},
    {"high_school_biology", 0},
    {"high_school_chemistry", 0},
    {"high_school_computer_science", 0},
    {"high_school_european_history", 3},
    {"high_school_geography", 2},
    {"high_school_government_and_politics", 2},
    {"high_school_macroeconomics", 2},
    {"high_school_mathematics", 0},
    {"high_school_microeconomics", 2},
    {"high_school_physics", 0},
    {"high_school_psychology", 2},
    {"high_school_statistics", 0},
    {"high_school_us_history", 3},
    {"high_school_world_history", 3},
    {"human_aging", 1},
    {"human_sexuality", 2},
    {"international_law", 3},
    {"jurisprudence", 3},
    {"logical_fallacies", 3},
    {"machine_learning", 0},
    {"management", 1},
    {"marketing", 1},
    {"medical_genetics", 1},
    {"miscellaneous", 1},
    {"moral_disputes", 3},
    {"moral_scenarios", 3},
    {"nutrition", 1},
    {"philosophy", 3},
    {"prehistory", 3},
    {"professional_accounting", 1},
    {"professional_law", 3},
    {"professional_medicine", 1},
    {"professional_psychology", 2},
    {"public_relations", 2},
    {"security_studies", 2},
    {"sociology", 2},
    {"us_foreign_policy", 2},
    {"virology", 1},
    {"world_religions", 3},
};

int eval_mmlu_category(const char *subject) {
  for (size_t i = 0; i < sizeof MMLU_SUBJECTS / sizeof MMLU_SUBJECTS[0]; i++)
    if (!strcmp(subject, MMLU_SUBJECTS[i].subject)) return MMLU_SUBJECTS[i].category;
  return -1;
}

// ---- HellaSwag preprocessing ---------------------------------------------------------------------

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

char *hellaswag_preprocess(const char *text) {
  // strip (ASCII whitespace; the file is plain text lines)
  while (is_space(*text)) text++;
  size_t n = strlen(text);
  while (n > 0 && is_space(text[n - 1])) n--;
  // " [title]" -> ". " never grows the text, and neither do the later steps
  char *a = xmalloc(n + 1), *b = xmalloc(n + 1);
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    if (n - i >= 8 && !memcmp(text + i, " [title]", 8)) a[o++] = '.', a[o++] = ' ', i += 8;
    else a[o++] = text[i++];
  }
  a[o] = 0;
  // re.sub(r"\[.*?\]", "", text): each '[' up to the nearest following ']' goes; a '[' with no ']'
  // after it stays.
  size_t m = 0;
  for (size_t i = 0; a[i];) {
    char *close = a[i] == '[' ? strchr(a + i + 1, ']') : NULL;
    if (close) i = (size_t)(close - a) + 1;
    else b[m++] = a[i++];
  }
  b[m] = 0;
  // str.replace("  ", " "): non-overlapping, left to right, one pass ("   " becomes "  ")
  o = 0;
  for (size_t i = 0; i < m;) {
    a[o++] = b[i];
    i += (b[i] == ' ' && b[i + 1] == ' ') ? 2 : 1;
  }
  a[o] = 0;
  free(b);
  return a;
}

void hellaswag_capitalize_ctx_b(char *context) {
  size_t n = strlen(context);
  if (n == 0 || context[n - 1] == '.') return;  // ctx_b empty (WikiHow items)
  char *last = NULL;
  for (char *p = strstr(context, ". "); p; p = strstr(p + 1, ". ")) last = p;
  if (last && last[2] >= 'a' && last[2] <= 'z') last[2] = (char)(last[2] - 'a' + 'A');
}

// ---- loaders ---------------------------------------------------------------------------------------

// The lines of a file, split in place ('\n', with a trailing '\r' dropped). A final newline does not
// start an extra line.
typedef struct {
  char *buf;
  char **line;
  int n;
} Lines;

static int read_lines(const char *path, Lines *L, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    set_err(err, errlen, "%s: cannot open", path);
    return -1;
  }
  fclose(f);
  size_t len;
  L->buf = read_file(path, &len);
  int cap = 1024;
  L->line = xmalloc(cap * sizeof(char *));
  L->n = 0;
  for (size_t i = 0; i < len;) {
    char *s = L->buf + i, *nl = memchr(s, '\n', len - i);
    size_t k = nl ? (size_t)(nl - s) : len - i;
    s[k] = 0;  // the '\n', or read_file's terminating NUL
    if (k > 0 && s[k - 1] == '\r') s[k - 1] = 0;
    if (L->n == cap) L->line = realloc(L->line, (cap *= 2) * sizeof(char *));
    if (!L->line) die("out of memory reading %s", path);
    L->line[L->n++] = s;
    i += k + 1;
  }
  return 0;
}

static void free_lines(Lines *L) {
  free(L->buf);
  free(L->line);
}

// Parses a whole decimal integer; -1 if s is not one or is out of [0, max].
static int parse_index(const char *s, size_t n, int max) {
  if (n == 0 || n > 9) return -1;
  int v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v <= max ? v : -1;
}

static int load_hellaswag(EvalSet *s, const char *path, char *err, size_t errlen) {
  Lines L;
  if (read_lines(path, &L, err, errlen)) return -1;
  if (L.n == 0 || L.n % 6) {
    set_err(err, errlen, "%s: %d lines; expected 6 per document (context, gold, 4 endings)", path, L.n);
    free_lines(&L);
    return -1;
  }
  s->n = L.n / 6;
  s->docs = xcalloc((size_t)s->n, sizeof(EvalDoc));
  for (int d = 0; d < s->n; d++) {
    char **l = L.line + 6 * d;
    EvalDoc *doc = &s->docs[d];
    doc->gold = parse_index(l[1], strlen(l[1]), 3);
    if (doc->gold < 0) {
      set_err(err, errlen, "%s:%d: gold: expected 0..3, got '%s'", path, 6 * d + 2, l[1]);
      s->n = d;  // evalset_free frees the documents before this one
      free_lines(&L);
      return -1;
    }
    hellaswag_capitalize_ctx_b(l[0]);
    doc->query = hellaswag_preprocess(l[0]);
    doc->n_choices = 4;
    for (int j = 0; j < 4; j++) doc->choices[j] = hellaswag_preprocess(l[2 + j]);
    for (int j = 0; j < 4; j++)
      if (!doc->choices[j][0] || !doc->query[0]) {
        set_err(err, errlen, "%s:%d: %s is empty", path, 6 * d + (doc->query[0] ? 3 + j : 1),
                doc->query[0] ? "an ending" : "the context");
        s->n = d + 1;
        free_lines(&L);
        return -1;
      }
  }
  free_lines(&L);
  return 0;
}

// Just enough of the already validated object (json_get_string checks the whole syntax) to find a
// member's raw value: strings are skipped escape-aware, containers by depth.
static size_t skip_string(const char *s, size_t n, size_t i) {
  for (i++; i < n && s[i] != '"'; i++)
    if (s[i] == '\\') i++;
  return i + 1;
}

static size_t skip_ws_at(const char *s, size_t n, size_t i) {
  while (i < n && is_space(s[i])) i++;
  return i;
}

static size_t skip_value(const char *s, size_t n, size_t i) {
  if (s[i] == '"') return skip_string(s, n, i);
  if (s[i] == '{' || s[i] == '[') {
    int depth = 0;
    for (; i < n; i++) {
      if (s[i] == '"') i = skip_string(s, n, i) - 1;
      else if (s[i] == '{' || s[i] == '[') depth++;
      else if ((s[i] == '}' || s[i] == ']') && --depth == 0) return i + 1;
    }
    return n;
  }
  while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']' && !is_space(s[i])) i++;  // number, literal
  return i;
}

// The raw value [*b, *e) of top-level member key (last one wins, as in json.h); 0 if absent. Keys
// are compared raw, which is enough for the plain ASCII keys of the task files.
static int member_span(const char *s, size_t n, const char *key, size_t *b, size_t *e) {
  size_t kl = strlen(key), i = skip_ws_at(s, n, 0) + 1;  // past '{'
  int found = 0;
  for (;;) {
    i = skip_ws_at(s, n, i);
    if (i >= n || s[i] != '"') return found;  // '}' (empty object) or end
    size_t k0 = i + 1, k1 = skip_string(s, n, i) - 1;
    i = skip_ws_at(s, n, k1 + 2);  // past the closing quote and ':'
    size_t v1 = skip_value(s, n, i);
    if (k1 - k0 == kl && !memcmp(s + k0, key, kl)) *b = i, *e = v1, found = 1;
    i = skip_ws_at(s, n, v1);
    if (i >= n || s[i] != ',') return found;
    i++;
  }
}

// Decodes the JSON string token raw[0..n) through json_get_string, wrapping it as {"v": ...}.
static char *decode_string(const char *raw, size_t n) {
  char *obj = xmalloc(n + 8), *out;
  size_t out_len;
  memcpy(obj, "{\"v\":", 5);
  memcpy(obj + 5, raw, n);
  memcpy(obj + 5 + n, "}", 2);
  int rc = json_get_string(obj, n + 6, "v", &out, &out_len, NULL, 0);
  free(obj);
  return rc == 1 ? out : NULL;
}

static char *get_string(const char *line, const char *key, const char *where, char *err, size_t errlen) {
  char *out, e[128];
  size_t out_len;
  int rc = json_get_string(line, strlen(line), key, &out, &out_len, e, sizeof e);
  if (rc == 1) return out;
  if (rc == 0) set_err(err, errlen, "%s: missing string member \"%s\"", where, key);
  else set_err(err, errlen, "%s: \"%s\": %s", where, key, e[0] ? e : "expected a string");
  return NULL;
}

// An array of 1..EVAL_MAX_CHOICES strings into out[]; returns the count or -1.
static int get_string_array(const char *line, const char *key, char **out, const char *where, char *err,
                            size_t errlen) {
  size_t n = strlen(line), b, e;
  if (!member_span(line, n, key, &b, &e) || line[b] != '[') {
    set_err(err, errlen, "%s: \"%s\": expected an array of strings", where, key);
    return -1;
  }
  int count = 0;
  for (size_t i = skip_ws_at(line, e, b + 1); i < e && line[i] != ']';) {
    size_t v1 = skip_value(line, e, i);
    char *str = line[i] == '"' && count < EVAL_MAX_CHOICES ? decode_string(line + i, v1 - i) : NULL;
    if (!str) {
      set_err(err, errlen, "%s: \"%s\"[%d]: expected a string (at most %d entries)", where, key, count,
              EVAL_MAX_CHOICES);
      while (count > 0) free(out[--count]);
      return -1;
    }
    out[count++] = str;
    i = skip_ws_at(line, e, v1);
    if (i < e && line[i] == ',') i = skip_ws_at(line, e, i + 1);
  }
  if (count == 0) set_err(err, errlen, "%s: \"%s\": empty array", where, key);
  return count ? count : -1;
}

// Integer member key in 0..n_choices-1 (the gold answer), or -1 with a message.
static int get_index(const char *line, const char *key, int n_choices, const char *where, char *err, size_t errlen) {
  size_t n = strlen(line), b, e;
  int v = member_span(line, n, key, &b, &e) ? parse_index(line + b, e - b, n_choices - 1) : -1;
  if (v < 0) set_err(err, errlen, "%s: \"%s\": expected an integer in 0..%d", where, key, n_choices - 1);
  return v;
}

static int load_jsonl(EvalSet *s, const char *path, char *err, size_t errlen) {
  Lines L;
  if (read_lines(path, &L, err, errlen)) return -1;
  s->docs = xcalloc((size_t)L.n + 1, sizeof(EvalDoc));
  s->n = 0;
  int rc = 0;
  for (int i = 0; i < L.n && rc == 0; i++) {
    const char *line = L.line[i];
    if (!line[skip_ws_at(line, strlen(line), 0)]) continue;  // blank line
    char where[600], e[128];
    snprintf(where, sizeof where, "%s:%d", path, i + 1);
    char *unused;
    size_t unused_len;
    if (json_get_string(line, strlen(line), "", &unused, &unused_len, e, sizeof e) < 0) {  // syntax check
      set_err(err, errlen, "%s: %s", where, e);
      rc = -1;
      break;
    }
    if (unused) free(unused);
    EvalDoc *d = &s->docs[s->n];
    if (s->kind == EVAL_ARC_CHALLENGE) {
      char *q = get_string(line, "query", where, err, errlen);
      if (!q) {
        rc = -1;
        break;
      }
      d->query = concat3(q, "\nAnswer:", "");  // the file's query is "Question: {q}"
      free(q);
      d->n_choices = get_string_array(line, "choices", d->choices, where, err, errlen);
    } else {
      d->target = get_string(line, "continuation", where, err, errlen);
      if (!d->target) {
        rc = -1;
        break;
      }
      d->n_choices = get_string_array(line, "context_options", d->choices, where, err, errlen);
      if (d->n_choices > 0 && d->n_choices != 2) {
        set_err(err, errlen, "%s: \"context_options\": expected 2 options, got %d", where, d->n_choices);
        rc = -1;
      }
    }
    s->n++;  // from here on evalset_free owns what the document holds
    if (d->n_choices < 0) {
      d->n_choices = 0;
      rc = -1;
    }
    for (int j = 0; rc == 0 && j < d->n_choices; j++)
      if (!d->choices[j][0])
        set_err(err, errlen, "%s: \"%s\"[%d] is empty", where,
                s->kind == EVAL_ARC_CHALLENGE ? "choices" : "context_options", j),
            rc = -1;
    if (rc == 0 && (d->gold = get_index(line, "gold", d->n_choices, where, err, errlen)) < 0) rc = -1;
  }
  if (rc == 0 && s->n == 0) {
    set_err(err, errlen, "%s: no documents", path);
    rc = -1;
  }
  free_lines(&L);
  return rc;
}

// Python's str.isspace() code points, for str.strip() on UTF-8 text.
static int py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// The code point of the UTF-8 sequence at s (length *n), or -1 for a malformed one.
static int32_t utf8_at(const unsigned char *s, size_t avail, int *n) {
  if (s[0] < 0x80) return *n = 1, s[0];
  int k = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc0 ? 2 : 0;
  if (!k || (size_t)k > avail) return -1;
  int32_t c = s[0] & (0x7f >> k);
  for (int i = 1; i < k; i++) {
    if ((s[i] & 0xc0) != 0x80) return -1;
    c = (c << 6) | (s[i] & 0x3f);
  }
  return *n = k, c;
}

// Python's str.strip(): a malloc'd copy without leading and trailing whitespace (Unicode's, as
// Python counts it: the MMLU file has a question ending in U+0085).
static char *py_strip(const char *text) {
  const unsigned char *s = (const unsigned char *)text;
  size_t n = strlen(text), a = 0, b = n;
  int k;
  for (int32_t c; a < n && (c = utf8_at(s + a, n - a, &k)) >= 0 && py_space((uint32_t)c);) a += k;
  while (b > a) {  // back to the start of the last code point
    size_t p = b - 1;
    while (p > a && (s[p] & 0xc0) == 0x80) p--;
    int32_t c = utf8_at(s + p, b - p, &k);
    if (c < 0 || p + k != b || !py_space((uint32_t)c)) break;
    b = p;
  }
  char *out = xmalloc(b - a + 1);
  memcpy(out, text + a, b - a);
  out[b - a] = 0;
  return out;
}

// MMLU's doc_to_text: "{question.strip()}\nA. {c0}\nB. {c1}\nC. {c2}\nD. {c3}\nAnswer:".
static char *mmlu_text(const char *question, char *const choices[4]) {
  char *q = py_strip(question);
  size_t n = strlen(q) + 16;
  for (int j = 0; j < 4; j++) n += strlen(choices[j]) + 4;
  char *out = xmalloc(n);
  int o = snprintf(out, n, "%s", q);
  for (int j = 0; j < 4; j++) o += snprintf(out + o, n - o, "\n%c. %s", 'A' + j, choices[j]);
  snprintf(out + o, n - o, "\nAnswer:");
  free(q);
  return out;
}

static int load_mmlu(EvalSet *s, const char *path, char *err, size_t errlen) {
  Lines L;
  if (read_lines(path, &L, err, errlen)) return -1;
  s->docs = xcalloc((size_t)L.n + 1, sizeof(EvalDoc));
  s->dev = xcalloc((size_t)L.n + 1, sizeof(EvalDoc));
  s->n = s->n_dev = 0;
  int rc = 0;
  for (int i = 0; i < L.n && rc == 0; i++) {
    const char *line = L.line[i];
    if (!line[skip_ws_at(line, strlen(line), 0)]) continue;  // blank line
    char where[600], e[128], *unused;
    size_t unused_len;
    snprintf(where, sizeof where, "%s:%d", path, i + 1);
    if (json_get_string(line, strlen(line), "", &unused, &unused_len, e, sizeof e) < 0) {  // syntax check
      set_err(err, errlen, "%s: %s", where, e);
      rc = -1;
      break;
    }
    if (unused) free(unused);
    char *subject = get_string(line, "subject", where, err, errlen), *split = NULL, *question = NULL;
    if (subject) split = get_string(line, "split", where, err, errlen);
    if (split) question = get_string(line, "question", where, err, errlen);
    if (!question) {
      free(subject), free(split);
      rc = -1;
      break;
    }
    int dev = !strcmp(split, "dev");
    if (!dev && strcmp(split, "test"))
      set_err(err, errlen, "%s: \"split\": expected \"test\" or \"dev\", got \"%s\"", where, split), rc = -1;
    else if (eval_mmlu_category(subject) < 0)
      set_err(err, errlen, "%s: \"subject\": '%s' is not one of MMLU's 57 subjects", where, subject), rc = -1;
    EvalDoc *d = dev ? &s->dev[s->n_dev] : &s->docs[s->n];
    char *choices[EVAL_MAX_CHOICES];
    int nc = rc ? 0 : get_string_array(line, "choices", choices, where, err, errlen);
    if (rc == 0 && nc != 4) {
      if (nc > 0) set_err(err, errlen, "%s: \"choices\": expected 4 answers, got %d", where, nc);
      rc = -1;
    }
    for (int j = 0; rc == 0 && j < 4; j++)
      if (!choices[j][0]) set_err(err, errlen, "%s: \"choices\"[%d] is empty", where, j), rc = -1;
    if (rc == 0 && (d->gold = get_index(line, "answer", 4, where, err, errlen)) < 0) rc = -1;
    if (rc == 0) {
      int k = 0;
      while (k < s->n_subjects && strcmp(s->subject[k], subject)) k++;
      if (k == s->n_subjects) {  // a new subject (57 at most: each is known)
        snprintf(s->subject[k], sizeof s->subject[k], "%s", subject);
        s->n_subjects++;
      }
      d->subject = k;
      d->query = mmlu_text(question, choices);
      d->n_choices = 4;
      for (int j = 0; j < 4; j++) d->choices[j] = xstrdup((const char[]){(char)('A' + j), 0});
      if (dev) s->n_dev++;
      else s->n++;
    }
    for (int j = 0; j < nc && nc > 0; j++) free(choices[j]);
    free(subject), free(split), free(question);
  }
  if (rc == 0 && s->n == 0) set_err(err, errlen, "%s: no test documents", path), rc = -1;
  free_lines(&L);
  return rc;
}

EvalSet *evalset_load(const char *task, const char *path, char *err, size_t errlen) {
  EvalSet *s = xcalloc(1, sizeof(EvalSet));
  const EvalTaskInfo *info = eval_task_info(task);
  if (info) s->kind = info->kind;
  else {
    set_err(err, errlen, "unknown eval task '%s' (expected mmlu, hellaswag, arc_challenge or winogrande)", task);
    free(s);
    return NULL;
  }
  snprintf(s->name, sizeof s->name, "%s", task);
  int rc = s->kind == EVAL_HELLASWAG ? load_hellaswag(s, path, err, errlen)
           : s->kind == EVAL_MMLU    ? load_mmlu(s, path, err, errlen)
                                     : load_jsonl(s, path, err, errlen);
  for (int d = 0; d < s->n; d++)
    if (s->kind != EVAL_MMLU) s->docs[d].subject = -1;
  if (rc) {
    evalset_free(s);
    return NULL;
  }
  return s;
}

static void free_doc(EvalDoc *d) {
  free(d->query);
  free(d->target);
  for (int j = 0; j < d->n_choices; j++) free(d->choices[j]);
}

void evalset_keep_per_subject(EvalSet *s, int n) {
  int seen[EVAL_MAX_SUBJECTS] = {0}, kept = 0;
  for (int d = 0; d < s->n; d++) {
    EvalDoc *doc = &s->docs[d];
    if (doc->subject >= 0 && seen[doc->subject]++ >= n) free_doc(doc);
    else s->docs[kept++] = *doc;
  }
  s->n = kept;
}

static void free_docs(EvalDoc *docs, int n) {
  for (int d = 0; d < n; d++) free_doc(&docs[d]);
  free(docs);
}

void evalset_free(EvalSet *s) {
  if (!s) return;
  free_docs(s->docs, s->n);
  free_docs(s->dev, s->n_dev);
  free(s);
}

// ---- prompts -----------------------------------------------------------------------------------------

void eval_fewshot_pick(int n, int doc, int k, uint64_t seed, int *out) {
  if (k >= n) die("eval_fewshot_pick: %d examples requested from %d documents", k, n);
  Rng r;
  rng_seed(&r, hash64(&doc, sizeof doc, seed));  // per document: independent of limit and order
  for (int i = 0; i < k;) {
    int c = (int)(rng_u64(&r) % (uint64_t)n), dup = c == doc;
    for (int j = 0; j < i && !dup; j++) dup = out[j] == c;
    if (!dup) out[i++] = c;
  }
}

// A solved example: the context text + " " + its gold answer.
static char *solved_example(const EvalSet *s, const EvalDoc *d) {
  if (s->kind == EVAL_WINOGRANDE) return concat3(d->choices[d->gold], " ", d->target);
  return concat3(d->query, " ", d->choices[d->gold]);
}

// MMLU's task description, "The following are multiple choice questions (with answers) about
// {subject, '_' -> ' '}.\n\n", then the first k dev questions of the subject, solved.
static char *mmlu_prefix(const EvalSet *s, int subject, int k) {
  char name[48];
  snprintf(name, sizeof name, "%s", s->subject[subject]);
  for (char *p = name; *p; p++)
    if (*p == '_') *p = ' ';
  char *prefix = concat3("The following are multiple choice questions (with answers) about ", name, ".\n\n");
  for (int i = 0, used = 0; i < s->n_dev && used < k; i++) {
    if (s->dev[i].subject != subject) continue;
    char *ex = solved_example(s, &s->dev[i]), *next = concat3(prefix, ex, "\n\n");
    free(ex);
    free(prefix);
    prefix = next, used++;
  }
  return prefix;
}

static int dev_count(const EvalSet *s, int subject) {
  int n = 0;
  for (int i = 0; i < s->n_dev; i++) n += s->dev[i].subject == subject;
  return n;
}

char *eval_fewshot_prefix(const EvalSet *s, int doc, int k, uint64_t seed) {
  if (s->kind == EVAL_MMLU) return mmlu_prefix(s, s->docs[doc].subject, k);
  char *prefix = xstrdup("");
  if (k <= 0) return prefix;
  int *pick = xmalloc((size_t)k * sizeof(int));
  eval_fewshot_pick(s->n, doc, k, seed, pick);
  for (int i = 0; i < k; i++) {
    char *ex = solved_example(s, &s->docs[pick[i]]), *next = concat3(prefix, ex, "\n\n");
    free(ex);
    free(prefix);
    prefix = next;
  }
  free(pick);
  return prefix;
}

void eval_request_text(const EvalSet *s, int doc, int j, const char *prefix, char **context, char **continuation) {
  const EvalDoc *d = &s->docs[doc];
  if (j < 0 || j >= d->n_choices) die("eval_request_text: %s doc %d has no choice %d", s->name, doc, j);
  if (s->kind == EVAL_WINOGRANDE) {
    *context = concat3(prefix, d->choices[j], "");
    *continuation = concat3(" ", d->target, "");
  } else {
    *context = concat3(prefix, d->query, "");
    *continuation = concat3(" ", d->choices[j], "");
  }
}

double eval_choice_length(const EvalSet *s, int doc, int j) {
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)s->docs[doc].choices[j]; *p; p++) n += (*p & 0xC0) != 0x80;
  return (double)n;
}

// ---- token requests ------------------------------------------------------------------------------

void eval_request_tokenize(const Tokenizer *tok, const char *context, const char *continuation, int bos,
                           EvalRequest *r) {
  size_t nc = strlen(context), ws = 0;
  while (ws < nc && is_space(context[nc - 1 - ws])) ws++;
  nc -= ws;  // context[nc..] now belongs to the continuation
  size_t nw = nc + ws + strlen(continuation);
  char *whole = xmalloc(nw + 1);
  memcpy(whole, context, nc + ws);
  memcpy(whole + nc + ws, continuation, nw - nc - ws + 1);
  uint32_t *ctx_ids, *all_ids;
  size_t n_ctx = tokenizer_encode(tok, context, nc, &ctx_ids);
  size_t n_all = tokenizer_encode(tok, whole, nw, &all_ids);
  size_t n_cont = n_all > n_ctx ? n_all - n_ctx : 0;
  int b = bos >= 0;
  r->n_ctx = (int)n_ctx + b;
  r->n_cont = (int)n_cont;
  r->tokens = xmalloc((size_t)(r->n_ctx + r->n_cont + 1) * sizeof(int));
  if (b) r->tokens[0] = bos;
  for (size_t i = 0; i < n_ctx; i++) r->tokens[b + i] = (int)ctx_ids[i];
  for (size_t i = 0; i < n_cont; i++) r->tokens[r->n_ctx + i] = (int)all_ids[n_ctx + i];
  free(ctx_ids);
  free(all_ids);
  free(whole);
}

void eval_request_free(EvalRequest *r) {
  free(r->tokens);
  r->tokens = NULL;
  r->n_ctx = r->n_cont = 0;
}

int eval_build_requests(const EvalSet *s, const Tokenizer *tok, int k_shot, int limit, uint64_t seed, int bos,
                        EvalRequests *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (s->kind == EVAL_MMLU) {  // the examples come from each subject's dev questions
    for (int k = 0; k < s->n_subjects && k_shot >= 0; k++)
      if (dev_count(s, k) < k_shot) {
        set_err(err, errlen, "%s: %d-shot needs %d dev questions of subject %s; the file has %d", s->name, k_shot,
                k_shot, s->subject[k], dev_count(s, k));
        return -1;
      }
  }
  if (k_shot < 0 || (s->kind != EVAL_MMLU && k_shot >= s->n)) {
    set_err(err, errlen, "%s: %d-shot needs more than %d documents in the file", s->name, k_shot, k_shot);
    return -1;
  }
  int nd = limit > 0 && limit < s->n ? limit : s->n;
  out->n_docs = nd;
  out->first = xmalloc(((size_t)nd + 1) * sizeof(int));
  out->first[0] = 0;
  for (int d = 0; d < nd; d++) out->first[d + 1] = out->first[d] + s->docs[d].n_choices;
  out->n_req = out->first[nd];
  out->req = xcalloc((size_t)out->n_req, sizeof(EvalRequest));
// documents are independent and each writes its own requests: any schedule gives the same result
#pragma omp parallel for schedule(static)
  for (int d = 0; d < nd; d++) {
    char *prefix = eval_fewshot_prefix(s, d, k_shot, seed);
    for (int j = 0; j < s->docs[d].n_choices; j++) {
      char *ctx, *cont;
      eval_request_text(s, d, j, prefix, &ctx, &cont);
      eval_request_tokenize(tok, ctx, cont, bos, &out->req[out->first[d] + j]);
      free(ctx);
      free(cont);
    }
    free(prefix);
  }
  return 0;
}

void eval_requests_free(EvalRequests *rq) {
  for (int i = 0; i < rq->n_req; i++) eval_request_free(&rq->req[i]);
  free(rq->req);
  free(rq->first);
  memset(rq, 0, sizeof *rq);
}

int eval_pack_row(const EvalRequest *r, int T, int pad_id, int *row) {
  if (r->n_ctx < 1 || r->n_cont < 1 || r->n_cont > T) return -1;
  int total = r->n_ctx + r->n_cont;
  int keep = total < T + 1 ? total : T + 1;  // the last T+1 tokens; the row gets all but the last
  const int *src = r->tokens + (total - keep);
  for (int i = 0; i < keep - 1; i++) row[i] = src[i];
  for (int i = keep - 1; i < T; i++) row[i] = pad_id;
  return keep - 1 - r->n_cont;
}
