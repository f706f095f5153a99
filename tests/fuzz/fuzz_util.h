// tests/fuzz/fuzz_util.h: what the file-reading fuzz targets share: a private scratch directory
// (removed at exit) and a helper that stores the fuzz input as a file in it.
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir[256];

static void fuzz_cleanup(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir);
  if (fuzz_dir[0] && system(cmd)) fprintf(stderr, "cannot remove %s\n", fuzz_dir);
}

// Creates the scratch directory once (under $TMPDIR or /tmp).
static const char *fuzz_scratch(void) {
  if (fuzz_dir[0]) return fuzz_dir;
  const char *base = getenv("TMPDIR");
  snprintf(fuzz_dir, sizeof fuzz_dir, "%s/fuzzXXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(fuzz_dir)) {
    perror("mkdtemp");
    abort();
  }
  atexit(fuzz_cleanup);
  return fuzz_dir;
}

// Writes data to scratch/name and returns the path (a static buffer).
static const char *fuzz_write_file(const char *name, const unsigned char *data, size_t size) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", fuzz_scratch(), name);
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) {
    perror(path);
    abort();
  }
  return path;
}
