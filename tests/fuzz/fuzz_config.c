// tests/fuzz/fuzz_config.c: the YAML config loader on arbitrary bytes. config_load_string must
// return 0 or -1 with a message, never crash, leak or die; on success the config must validate and
// survive a YAML round trip; on failure the config must be left as it was.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "run/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static TrainConfig def;
  static int ready;
  if (!ready) config_defaults(&def), ready = 1;
  TrainConfig c = def;
  char err[1024];
  if (config_load_string(&c, (const char *)data, size, "fuzz.yaml", err, sizeof err)) {
    if (!err[0] || memcmp(&c, &def, sizeof c)) abort();  // a message, and *c untouched
    return 0;
  }
  if (config_validate(&c, "fuzz.yaml", err, sizeof err)) abort();
  // What loaded must write out as YAML that loads back to the same config.
  char *yaml = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&yaml, &len);
  config_write_yaml(&c, f);
  fclose(f);
  TrainConfig back = def;
  if (config_load_string(&back, yaml, len, "roundtrip.yaml", err, sizeof err) || memcmp(&back, &c, sizeof c)) {
    fprintf(stderr, "round trip failed: %s\n%s", err, yaml);
    abort();
  }
  free(yaml);
  return 0;
}
