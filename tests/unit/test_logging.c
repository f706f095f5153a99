// tests/unit/test_logging.c: the run-tracking pieces: CRC32C against RFC 3720's vectors, the TFRecord
// framing and Event encoding of run/tensorboard.c against bytes computed by hand (and parsed back by
// TensorBoard's own protobuf, see below), the cutting of an earlier event file at a resumed step, the
// metrics log's JSONL lines and the two MFU conventions (run/mfu.h).
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../test.h"
#include "common/common.h"
#include "model/llama_config.h"
#include "run/metrics.h"
#include "run/mfu.h"
#include "run/tensorboard.h"

static void test_crc32c(void) {
  TEST_SECTION("CRC32C: RFC 3720 B.4 and the check value");
  uint8_t buf[48];
  memset(buf, 0, 32);
  CHECK(crc32c(0, buf, 32) == 0x8A9136AAu, "32 zeros: %08x", crc32c(0, buf, 32));
  memset(buf, 0xff, 32);
  CHECK(crc32c(0, buf, 32) == 0x62A8AB43u, "32 0xff: %08x", crc32c(0, buf, 32));
  for (int i = 0; i < 32; i++) buf[i] = (uint8_t)i;
  CHECK(crc32c(0, buf, 32) == 0x46DD794Eu, "0..31: %08x", crc32c(0, buf, 32));
  for (int i = 0; i < 32; i++) buf[i] = (uint8_t)(31 - i);
  CHECK(crc32c(0, buf, 32) == 0x113FDB5Cu, "31..0: %08x", crc32c(0, buf, 32));
  // RFC 3720 B.4's iSCSI Read (10) command PDU
  static const uint8_t pdu[48] = {0x01, 0xc0, 0, 0, 0, 0, 0,    0, 0, 0, 0, 0,    0, 0, 0, 0,     // bytes 0-15
                                  0x14, 0,    0, 0, 0, 0, 0x04, 0, 0, 0, 0, 0x14, 0, 0, 0, 0x18,  // 16-31
                                  0x28, 0,    0, 0, 0, 0, 0,    0, 2, 0, 0, 0,    0, 0, 0, 0};    // 32-47
  CHECK(crc32c(0, pdu, 48) == 0xD9963A56u, "iSCSI read PDU: %08x", crc32c(0, pdu, 48));
  CHECK(crc32c(0, "123456789", 9) == 0xE3069283u, "check value: %08x", crc32c(0, "123456789", 9));
  CHECK(crc32c(crc32c(0, "1234", 4), "56789", 5) == 0xE3069283u, "continued: %08x",
        crc32c(crc32c(0, "1234", 4), "56789", 5));
  CHECK(tb_mask_crc(0xE3069283u) == (((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u), "mask");
}

static uint8_t *slurp(const char *path, size_t *n) { return (uint8_t *)read_file(path, n); }
static int file_size(const char *path, size_t *n) {  // the file's size; 0 when it exists
  if (access(path, F_OK)) return -1;
  free(slurp(path, n));
  return 0;
}

// The one event file tb_open made in dir.
static int event_file(const char *dir, char *path, size_t len) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "ls %s/events.out.tfevents.* 2>/dev/null", dir);
  FILE *p = popen(cmd, "r");
  int ok = p && fgets(path, (int)len, p);
  if (p) pclose(p);
  if (ok) path[strcspn(path, "\n")] = 0;
  return ok;
}

static void test_event_bytes(const char *tmp) {
  TEST_SECTION("TFRecord framing and the Event encoding, byte for byte");
  char dir[1024], err[512], path[1200];
  snprintf(dir, sizeof dir, "%s/tb", tmp);
  TbWriter *w = tb_open(dir, 0, err, sizeof err);
  CHECK(w != NULL, "tb_open: %s", err);
  if (!w) return;
  tb_scalar(w, "loss", 1.5f);
  tb_event(w, 300, 2.0);
  tb_event(w, 301, 3.0);  // nothing pending: no record
  tb_close(w);
  CHECK(event_file(dir, path, sizeof path), "no event file in %s", dir);
  const char *name = strrchr(path, '/') + 1;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  char want[600];
  snprintf(want, sizeof want, ".%s.%d.0", host, (int)getpid());
  CHECK(!strncmp(name, "events.out.tfevents.", 20) && strlen(name) > 30 + strlen(want) - 1 &&
            !strcmp(name + strlen(name) - strlen(want), want),
        "name %s: events.out.tfevents.<time>%s", name, want);
  size_t n;
  uint8_t *f = slurp(path, &n);
  // The first record: Event{wall_time = 1 (double), file_version = 3 "brain.Event:2"}: 24 bytes.
  static const uint8_t version_tail[] = {0x1a, 0x0d, 'b', 'r', 'a', 'i', 'n', '.', 'E', 'v', 'e', 'n', 't', ':', '2'};
  CHECK(n > 40 && f[0] == 24 && !memcmp(f + 1, "\0\0\0\0\0\0\0", 7) && f[12] == 0x09 &&
            !memcmp(f + 21, version_tail, sizeof version_tail),
        "the file_version record");
  // Its CRCs: of the 8 length bytes and of the 24 data bytes, masked.
  uint32_t c1 = f[8] | f[9] << 8 | f[10] << 16 | (uint32_t)f[11] << 24;
  uint32_t c2 = f[36] | f[37] << 8 | f[38] << 16 | (uint32_t)f[39] << 24;
  CHECK(c1 == tb_mask_crc(crc32c(0, f, 8)) && c2 == tb_mask_crc(crc32c(0, f + 12, 24)), "version record CRCs");
  // The second, by hand: Event{wall_time 2.0, step 300 (varint ac 02), summary{value{tag "loss",
  // simple_value 1.5f}}}; the masked CRCs 0x139e0d1a and 0x66d5bd87 as TensorBoard's own
  // masked_crc32c computes them (tensorboard.compat.tensorflow_stub), whose protobuf parses these
  // 27 bytes back as wall_time: 2, step: 300, tag "loss", simple_value 1.5.
  static const uint8_t rec[] = {0x1b, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1a, 0x0d, 0x9e,
                                0x13, 0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x10,
                                0xac, 0x02, 0x2a, 0x0d, 0x0a, 0x0b, 0x0a, 0x04, 0x6c, 0x6f, 0x73,
                                0x73, 0x15, 0x00, 0x00, 0xc0, 0x3f, 0x87, 0xbd, 0xd5, 0x66};
  CHECK(n == 40 + sizeof rec && !memcmp(f + 40, rec, sizeof rec), "the scalar record (%zu bytes in the file)", n);
  free(f);
}

static void test_cut(const char *tmp) {
  TEST_SECTION("an earlier event file cut at a resumed step");
  char dir[1024], err[512], path[1200];
  snprintf(dir, sizeof dir, "%s/cut", tmp);
  TbWriter *w = tb_open(dir, 0, err, sizeof err);
  CHECK(w != NULL, "tb_open: %s", err);
  if (!w) return;
  for (int s = 1; s <= 3; s++) {
    tb_scalar(w, "loss", (float)s), tb_scalar(w, "lr", 0.5f);
    tb_event(w, s, s);
  }
  tb_close(w);
  event_file(dir, path, sizeof path);
  size_t n0;
  free(slurp(path, &n0));
  FILE *f = fopen(path, "ab");  // a killed writer's torn last record
  fwrite("\x30\0\0\0\0\0\0\0garbage", 1, 15, f);
  fclose(f);
  int kept = tb_cut_file(path, 2, err, sizeof err);
  size_t n;
  free(slurp(path, &n));
  size_t per = 16 + 9 + 2 + 2 + (2 + 2 + 4 + 1 + 4) + (2 + 2 + 2 + 1 + 4);  // a record of one step: 53 bytes
  CHECK(kept == 2 && n == n0 - per, "cut at step 2: %d scalar events kept, %zu of %zu bytes (one step %zu)", kept, n,
        n0, per);
  // A new writer resuming at step 1 cuts the earlier file itself; at step 0 the file goes.
  w = tb_open(dir, 1, err, sizeof err);
  tb_close(w);
  free(slurp(path, &n));
  CHECK(n == n0 - 2 * per, "tb_open at step 1 keeps step 1 of the earlier file: %zu bytes", n);
  w = tb_open(dir, 0, err, sizeof err);  // a fresh run: the earlier files go (none keeps a scalar)
  char new_path[1200], cmd[1200];
  snprintf(new_path, sizeof new_path, "%s", tb_path(w));
  tb_close(w);
  snprintf(cmd, sizeof cmd, "test $(ls %s | wc -l) -eq 1", dir);
  CHECK(system(cmd) == 0 && !file_size(new_path, &n) && n == 40, "a fresh run leaves its own file only (%zu bytes)", n);
  CHECK(tb_cut_file(new_path, 0, err, sizeof err) == 0 && access(new_path, F_OK) != 0,
        "a file with only its version record is removed");
  CHECK(tb_open("/proc/no_such_dir/x", 0, err, sizeof err) == NULL && strstr(err, "logging.tensorboard"),
        "an unusable folder is refused naming the key: %s", err);
}

static void test_jsonl(const char *tmp) {
  TEST_SECTION("the metrics log's JSONL records");
  char path[1024];
  snprintf(path, sizeof path, "%s/m.jsonl", tmp);
  MetricsLog *m = metrics_open(path, NULL, 0);
  metrics_begin(m, -1, "header");
  metrics_text(m, "config", "a: \"b\"\nc: 1");
  metrics_end(m);
  metrics_begin(m, 7, NULL);
  metrics_num(m, "loss", "%.9g", 2.25);
  metrics_num(m, "tokens", "%.0f", 1024);
  metrics_end(m);
  metrics_close(m);
  m = metrics_open(path, NULL, 7);  // a resume appends after a marker
  metrics_begin(m, 8, "spike");
  metrics_num(m, "loss", "%.9g", 9.5);
  metrics_end(m);
  metrics_close(m);
  size_t n;
  char *s = read_file(path, &n);
  const char *want =
      "{\"event\": \"header\", \"config\": \"a: \\\"b\\\"\\nc: 1\"}\n"
      "{\"step\": 7, \"loss\": 2.25, \"tokens\": 1024}\n"
      "{\"step\": 7, \"event\": \"resumed\"}\n"
      "{\"step\": 8, \"event\": \"spike\", \"loss\": 9.5}\n";
  CHECK(!strcmp(s, want), "got:\n%s", s);
  free(s);
  CHECK(metrics_open(NULL, "", 0) == NULL, "nothing named: no log");
}

static void test_mfu(void) {
  TEST_SECTION("MFU: the paper's convention and the own-peak one");
  LlamaConfig c;
  llama_preset("llama3_8b", &c);
  const double F = llama_flops_per_token(&c, 8192), block = 218103808.0;  // linear weights of one 8B block
  Recipe r;
  char err[256];
  Mfu bf16 = mfu_model(&c, 8192, NULL);
  CHECK(bf16.flops_per_token == F && bf16.bf16_flops == F && bf16.fp8_flops == 0, "bf16: all on BF16");
  CHECK_NEAR(F, 57.91e9, 0.005e9);  // the paper's 57.91 GFLOP/token
  CHECK(mfu_paper(&bf16, 10000) == 10000 * F / 989e12, "bf16: %.9g", mfu_paper(&bf16, 10000));
  CHECK(mfu_own_peak(&bf16, 10000) == mfu_paper(&bf16, 10000), "bf16: both conventions agree");
  recipe_resolve(&r, &(RecipeSpec){.recipe = "mxfp4"}, 90, err, sizeof err);
  Mfu mx = mfu_model(&c, 8192, &r);
  CHECK(mx.fp8_flops == 6 * 32 * block && mx.bf16_flops == F - 6 * 32 * block,
        "mxfp4 on Hopper: the block linears' 41.88 GFLOP/token on FP8 (%.6g)", mx.fp8_flops);
  CHECK_NEAR(mfu_own_peak(&mx, 13289), 13289 * ((F - 6 * 32 * block) / 989e12 + 6 * 32 * block / 1979e12), 1e-12);
  CHECK(mfu_paper(&mx, 13289) > 0.77 && mfu_paper(&mx, 13289) < 0.79, "README's 77.8%% at 13,289 tok/s: %.4f",
        mfu_paper(&mx, 13289));
  recipe_resolve(&r, &(RecipeSpec){.recipe = "mxfp4", .bf16_last = 4}, 90, err, sizeof err);
  Mfu last4 = mfu_model(&c, 8192, &r);
  CHECK(last4.fp8_flops == 6 * 28 * block, "mxfp4 with 4 BF16 blocks: 28 blocks on FP8");
  recipe_resolve(&r, &(RecipeSpec){.recipe = "nvfp4"}, 90, err, sizeof err);
  Mfu nv = mfu_model(&c, 8192, &r);
  CHECK(nv.fp8_flops == 0 && nv.bf16_flops == F, "nvfp4 on Hopper: BF16 GEMMs of the dequantized operands");
  recipe_resolve(&r, &(RecipeSpec){.recipe = "mxfp4"}, 100, err, sizeof err);
  Mfu native = mfu_model(&c, 8192, &r);
  CHECK(native.fp4_flops == 6 * 32 * block && mfu_own_peak(&native, 1e4) == 0,
        "native FP4: no own-peak figure (no FP4 peak known)");
  char d[1024];
  mfu_describe(&mx, d, sizeof d);
  CHECK(strstr(d, "57.91 GFLOP/token") && strstr(d, "/ 989 TFLOP/s") && strstr(d, "41.88 GFLOP/token on FP8 at 1979"),
        "%s", d);
}

int main(void) {
  char tmp[] = "/tmp/test_logging_XXXXXX";
  if (!mkdtemp(tmp)) die("mkdtemp failed");
  test_crc32c();
  test_event_bytes(tmp);
  test_cut(tmp);
  test_jsonl(tmp);
  test_mfu();
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
  if (system(cmd)) printf("could not remove %s\n", tmp);
  TEST_END();
}
