// data/packed.c: see packed.h.
#include "data/packed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "data/json.h"

#define PACKED_FORMAT "lbt_packed_tokens_manifest_v1"

// The manifest path for a file or a folder (malloc'd), or NULL.
static char *manifest_path(const char *path) {
  struct stat st;
  if (stat(path, &st)) return NULL;
  if (!S_ISDIR(st.st_mode)) {
    size_t n = strlen(path);
    if (n < 5 || strcmp(path + n - 5, ".json")) return NULL;
    char *p = xmalloc(n + 1);
    memcpy(p, path, n + 1);
    return p;
  }
  static const char *names[] = {"manifest.json", "packed_tokens_manifest.json"};
  for (int i = 0; i < 2; i++) {
    char *p = xmalloc(strlen(path) + strlen(names[i]) + 2);
    sprintf(p, "%s/%s", path, names[i]);
    if (!stat(p, &st) && S_ISREG(st.st_mode)) return p;
    free(p);
  }
  return NULL;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = xmalloc((size_t)(n > 0 ? n : 0) + 1);
  *len = fread(buf, 1, (size_t)(n > 0 ? n : 0), f);
  buf[*len] = 0;
  fclose(f);
  return buf;
}

// The string member key of the object text, or NULL (not there, or an error: *bad set).
static char *member(const char *text, size_t len, const char *key, int *bad) {
  char *out = NULL, err[64];
  size_t n;
  int r = json_get_string(text, len, key, &out, &n, err, sizeof err);
  if (r < 0) *bad = 1;
  return r == 1 ? out : NULL;
}

int packed_detect(const char *path) {
  char *m = manifest_path(path);
  if (!m) return 0;
  size_t len;
  char *text = slurp(m, &len);
  int bad = 0;
  char *fmt = text ? member(text, len, "format", &bad) : NULL;
  int yes = fmt && !strcmp(fmt, PACKED_FORMAT);
  free(fmt), free(text), free(m);
  return yes;
}

int packed_open(const char *path, uint32_t vocab_size, TokenMap **maps, int *n, char *err, size_t errlen) {
  *maps = NULL, *n = 0;
  char *m = manifest_path(path), *text = NULL, *dtype = NULL;
  size_t len = 0;
  int rc = -1, bad = 0, cap = 0;
  if (!m || !(text = slurp(m, &len))) {
    set_err(err, errlen, "packed-binary dataset %s: no manifest (manifest.json or packed_tokens_manifest.json)", path);
    goto out;
  }
  dtype = member(text, len, "dtype", &bad);
  static const struct {
    const char *name;
    int width, is_signed;
  } types[] = {{"uint8", 1, 0}, {"uint16", 2, 0}, {"int32", 4, 1}, {"uint32", 4, 0}, {"int64", 8, 1}};
  int t = 3;  // uint32 by default
  if (dtype) {
    for (t = 0; t < 5 && strcmp(types[t].name, dtype); t++) {
    }
    if (t == 5) {
      set_err(err, errlen, "packed-binary manifest %s: dtype '%s' is not uint8, uint16, int32, uint32 or int64", m,
              dtype);
      goto out;
    }
  }
  size_t s0, s1;
  char jerr[256];
  int has = json_member_span(text, len, "shards", &s0, &s1, jerr, sizeof jerr);
  if (has <= 0 || text[s0] != '[') {
    set_err(err, errlen, "packed-binary manifest %s: no \"shards\" array (%s)", m, has < 0 ? jerr : "missing");
    goto out;
  }
  char *dir = xmalloc(strlen(m) + 1);
  strcpy(dir, m);
  char *slash = strrchr(dir, '/');
  if (slash) slash[1] = 0;
  else dir[0] = 0;
  size_t pos = 0, e0, e1;
  int r;
  while ((r = json_array_next(text + s0, s1 - s0, &pos, &e0, &e1, jerr, sizeof jerr)) == 1) {
    const char *el = text + s0 + e0;
    size_t el_len = e1 - e0;
    char *sp = member(el, el_len, "path", &bad);
    if (!sp) {
      free(dir);
      set_err(err, errlen, "packed-binary manifest %s: shard %d has no \"path\"", m, *n + 1);
      goto out;
    }
    char *full = xmalloc(strlen(dir) + strlen(sp) + 1);
    sprintf(full, "%s%s", sp[0] == '/' ? "" : dir, sp);
    free(sp);
    uint64_t expect = UINT64_MAX;
    size_t c0, c1;
    if (json_member_span(el, el_len, "token_count", &c0, &c1, jerr, sizeof jerr) == 1) {
      char num[32];
      snprintf(num, sizeof num, "%.*s", (int)(c1 - c0), el + c0);
      char *end;
      unsigned long long v = strtoull(num, &end, 10);
      if (*end || num[0] == '-') {
        free(full), free(dir);
        set_err(err, errlen, "packed-binary manifest %s: token_count '%s' is not a count", m, num);
        goto out;
      }
      expect = v;
    }
    *maps = grow_array(*maps, *n, &cap, sizeof **maps);
    memset(&(*maps)[*n], 0, sizeof **maps);
    if (token_map_open(&(*maps)[*n], full, types[t].width, types[t].is_signed, expect, vocab_size,
                       "packed-binary shard", err, errlen)) {
      free(full), free(dir);
      goto out;
    }
    (*n)++;
    free(full);
  }
  free(dir);
  if (r < 0) {
    set_err(err, errlen, "packed-binary manifest %s: %s", m, jerr);
    goto out;
  }
  if (!*n) {
    set_err(err, errlen, "packed-binary manifest %s: no shards", m);
    goto out;
  }
  rc = 0;
out:
  if (rc) {
    for (int i = 0; i < *n; i++) token_map_close(&(*maps)[i]);
    free(*maps), *maps = NULL, *n = 0;
  }
  free(m), free(text), free(dtype);
  return rc;
}
