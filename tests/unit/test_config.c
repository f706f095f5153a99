// tests/unit/test_config.c: the YAML config: defaults, the shipped configs, round trip, every class of
// load error (with its line and key), --set overrides, the preset ordering rule, validation.
// Run from the repository root (it reads configs/*.yaml).
#include <stdlib.h>

#include "run/config.h"
#include "tests/test.h"

static char err[1024];

// Loads yaml over the defaults into *c; returns config_load_string's result.
static int load(TrainConfig *c, const char *yaml) {
  config_defaults(c);
  err[0] = 0;
  return config_load_string(c, yaml, strlen(yaml), "t.yaml", err, sizeof err);
}

// Expects loading yaml to fail with a message containing each of the given pieces.
static void expect_error(const char *yaml, const char *piece1, const char *piece2) {
  TrainConfig c;
  int rc = load(&c, yaml);
  CHECK(rc == -1, "loading <<%s>> should fail", yaml);
  CHECK(strstr(err, piece1) != NULL, "message '%s' lacks '%s'", err, piece1);
  if (piece2) CHECK(strstr(err, piece2) != NULL, "message '%s' lacks '%s'", err, piece2);
}

static void expect_set_error(const char *assignment, const char *piece1, const char *piece2) {
  TrainConfig c;
  config_defaults(&c);
  TrainConfig before = c;
  err[0] = 0;
  CHECK(config_set(&c, assignment, err, sizeof err) == -1, "--set %s should fail", assignment);
  CHECK(strstr(err, piece1) != NULL, "message '%s' lacks '%s'", err, piece1);
  if (piece2) CHECK(strstr(err, piece2) != NULL, "message '%s' lacks '%s'", err, piece2);
  CHECK(memcmp(&c, &before, sizeof c) == 0, "a failed --set %s changed the config", assignment);
}

// Writes c as YAML into a malloc'd string.
static char *to_yaml(const TrainConfig *c) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  config_write_yaml(c, f);
  fclose(f);
  return buf;
}

static int set(TrainConfig *c, const char *assignment) {
  err[0] = 0;
  int rc = config_set(c, assignment, err, sizeof err);
  if (rc) printf("  (--set %s: %s)\n", assignment, err);
  return rc;
}

int main(void) {
  TrainConfig c;

  TEST_SECTION("defaults");
  config_defaults(&c);
  CHECK(config_validate(&c, "defaults", err, sizeof err) == 0, "defaults invalid: %s", err);
  CHECK(!strcmp(c.model_preset, "tiny"), "preset %s", c.model_preset);
  CHECK(c.model.dim == 64 && c.model.n_layers == 2 && c.model.vocab_size == 512, "tiny preset not applied");
  CHECK(c.ignore_index == -1, "ignore_index %d", c.ignore_index);
  CHECK(c.lr == 3e-4f && c.beta1 == 0.9f && c.beta2 == 0.95f && c.eps == 1e-8f, "optim defaults");
  CHECK(c.weight_decay == 0.1f && c.grad_clip == 1.0f, "wd %g clip %g", c.weight_decay, c.grad_clip);
  CHECK(!strcmp(c.schedule, "constant"), "schedule %s", c.schedule);
  CHECK(c.seed == 42, "seed %llu", (unsigned long long)c.seed);
  CHECK(!strcmp(c.train_data, "synthetic") && c.val_data[0] == 0, "data defaults");
  CHECK(!strcmp(c.recipe, "bf16") && !strcmp(c.backend, "auto"), "recipe %s backend %s", c.recipe, c.backend);
  CHECK(c.ckpt_dir[0] == 0 && c.ckpt_interval == 0 && c.ckpt_keep == 3 && c.resume == 0, "checkpoint defaults");
  CHECK(c.log_interval == 1 && c.eval_interval == 0 && c.eval_batches == 8, "logging/eval defaults");
  CHECK(c.threads == 0 && c.data_parallel == 1, "parallel defaults");
  CHECK(!strcmp(c.grad_reduce, "fp32") && c.overlap_reduce == 1 && c.bucket_mb == 64.0f && c.dgrad_transposed == 1,
        "data-parallel defaults: grad_reduce %s overlap %d bucket %g dgrad_transposed %d", c.grad_reduce,
        c.overlap_reduce, c.bucket_mb, c.dgrad_transposed);
  CHECK(c.seq_len <= c.model.max_seq_len, "default seq_len %d", c.seq_len);

  TEST_SECTION("shipped configs");
  const char *shipped[] = {"configs/tiny.yaml", "configs/small.yaml", "configs/llama3_8b.yaml"};
  for (int i = 0; i < 3; i++) {
    config_defaults(&c);
    int rc = config_load(&c, shipped[i], err, sizeof err);
    CHECK(rc == 0, "%s: %s", shipped[i], err);
  }
  config_defaults(&c);
  CHECK(config_load(&c, "configs/tiny.yaml", err, sizeof err) == 0, "%s", err);
  CHECK(c.micro_batch == 8 && c.global_batch == 16 && c.seq_len == 64 && c.total_steps == 300, "tiny batch");
  CHECK(!strcmp(c.schedule, "cosine") && c.lr == 3e-3f && c.warmup_steps == 20, "tiny schedule");
  config_defaults(&c);
  CHECK(config_load(&c, "configs/small.yaml", err, sizeof err) == 0, "%s", err);
  CHECK(!strcmp(c.model_preset, "small") && c.model.dim == 1024, "small preset");
  config_defaults(&c);
  CHECK(config_load(&c, "configs/llama3_8b.yaml", err, sizeof err) == 0, "%s", err);
  CHECK(llama_num_params(&c.model) == 8030261248LL, "8B params %lld", (long long)llama_num_params(&c.model));
  CHECK((int64_t)c.global_batch * c.seq_len == 4194304, "tokens per step");
  CHECK(c.total_steps == 38147 && c.warmup_steps == 2000 && c.decay_start == 47685, "8B schedule");
  CHECK(!strcmp(c.schedule, "wsd") && c.lr == 3e-4f && c.beta2 == 0.95f && c.eps == 1e-8f, "8B optim");
  CHECK(c.model.rope_scaling == 1 && c.model.rope_theta == 500000.0f && c.model.norm_eps == 1e-5f, "8B rope/norm");
  CHECK(!strcmp(c.backend, "cuda") && !strcmp(c.recipe, "bf16") && c.seed == 42, "8B backend/recipe/seed");
  CHECK(config_load(&c, "configs/no_such.yaml", err, sizeof err) == -1, "missing file loads");
  CHECK(strstr(err, "configs/no_such.yaml") && strstr(err, "cannot open"), "%s", err);

  TEST_SECTION("round trip");
  {
    // Start from the 8B config and touch every type, including strings YAML must quote.
    config_defaults(&c);
    CHECK(config_load(&c, "configs/llama3_8b.yaml", err, sizeof err) == 0, "%s", err);
    CHECK(set(&c, "model.dim=4160") == 0, "set dim");
    CHECK(set(&c, "optim.lr=1.2345678e-4") == 0 && set(&c, "model.norm_eps=3.3e-7") == 0, "set floats");
    CHECK(set(&c, "optim.grad_clip=-1") == 0 && set(&c, "model.rope_theta=123456.7") == 0, "set floats");
    CHECK(set(&c, "seed=18446744073709551615") == 0, "set seed");
    CHECK(set(&c, "data.train=a b/\"q\"\\x: #c,*g*.bin,\ttab\nnl,\xc3\xa9") == 0, "set awkward string");
    CHECK(set(&c, "data.val= leading space") == 0 && set(&c, "logging.file=") == 0, "set strings");
    CHECK(set(&c, "checkpoint.resume=no") == 0 && set(&c, "precision.recipe=nvfp4") == 0, "set bool/enum");
    char *yaml = to_yaml(&c);
    TrainConfig back;
    config_defaults(&back);
    int rc = config_load_string(&back, yaml, strlen(yaml), "roundtrip.yaml", err, sizeof err);
    CHECK(rc == 0, "reload failed: %s\n%s", err, yaml);
    CHECK(memcmp(&c, &back, sizeof c) == 0, "round trip differs:\n%s", yaml);
    CHECK(back.seed == UINT64_MAX && back.lr == 1.2345678e-4f && back.grad_clip == -1.0f, "round-trip values");
    char *yaml2 = to_yaml(&back);
    CHECK(!strcmp(yaml, yaml2), "second write differs");
    CHECK(strstr(yaml, "seed: 18446744073709551615\n") && strstr(yaml, "\n  lr: 0.00012345678\n"), "%s", yaml);
    free(yaml);
    free(yaml2);
    // The defaults round-trip too, and their YAML is readable (shortest floats).
    config_defaults(&c);
    yaml = to_yaml(&c);
    CHECK(strstr(yaml, "\n  lr: 0.0003\n") && strstr(yaml, "\n  eps: 1e-08\n") && strstr(yaml, "\n  type: constant\n"),
          "%s", yaml);
    CHECK(strstr(yaml, "\n  rope_theta: 10000.0\n") && strstr(yaml, "\n  train: \"synthetic\"\n"), "%s", yaml);
    config_defaults(&back);
    CHECK(config_set(&back, "optim.lr=1", err, sizeof err) == 0, "%s", err);
    CHECK(config_load_string(&back, yaml, strlen(yaml), "d.yaml", err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(&c, &back, sizeof c) == 0, "defaults round trip differs");
    free(yaml);
  }

  TEST_SECTION("load errors: line and key");
  expect_error("seed: 1\noptimizer:\n  lr: 1\n", "t.yaml:2: optimizer: unknown section", "did you mean 'optim'");
  expect_error("optim:\n  lrr: 1\n", "t.yaml:2: optim.lrr: unknown key", "did you mean 'optim.lr'");
  expect_error("schedule:\n  lr: 1\n", "t.yaml:2: schedule.lr: unknown key", "did you mean 'optim.lr'");
  expect_error("optim:\n  zzzzzz: 1\n", "t.yaml:2: optim.zzzzzz: unknown key", NULL);
  CHECK(strstr(err, "did you mean") == NULL, "far-off key got a suggestion: %s", err);
  expect_error("optim.lr: 1\n", "t.yaml:1: optim.lr: write section keys nested", NULL);
  expect_error("optim:\n  beta1: 0.9\n  lr:\n    a: 1\n", "t.yaml:3: optim.lr: expected a single value, got a mapping",
               NULL);
  expect_error("batch:\n  seq_len: [1, 2]\n", "t.yaml:2: batch.seq_len: expected a single value, got a sequence", NULL);
  expect_error("\n\noptim: 3\n", "t.yaml:3: optim: expected a mapping of keys, got a scalar", NULL);
  expect_error("seed:\n  a: 1\n", "t.yaml:1: seed: expected a single value, got a mapping", NULL);
  expect_error("- model\n- optim\n", "t.yaml:1: expected a mapping of sections", NULL);
  expect_error("batch:\n  seq_len: 3.5\n", "t.yaml:2: batch.seq_len: expected an integer, got '3.5'", NULL);
  expect_error("batch:\n  seq_len: 1_000\n", "batch.seq_len: expected an integer, got '1_000'", NULL);
  expect_error("batch:\n  seq_len: 0x10\n", "batch.seq_len: expected an integer", NULL);
  expect_error("batch:\n  seq_len: ~\n", "batch.seq_len: expected an integer, got ''", NULL);
  expect_error("optim:\n  lr: fast\n", "t.yaml:2: optim.lr: expected a number, got 'fast'", NULL);
  expect_error("optim:\n  lr: inf\n", "optim.lr: expected a number, got 'inf'", NULL);
  expect_error("optim:\n  lr: 1e-4x\n", "optim.lr: expected a number", NULL);
  expect_error("batch:\n  seq_len: 99999999999\n", "t.yaml:2: batch.seq_len: '99999999999' does not fit", NULL);
  expect_error("batch:\n  seq_len: 99999999999999999999999\n", "does not fit in a 32-bit integer", NULL);
  expect_error("optim:\n  lr: 1e39\n", "t.yaml:2: optim.lr: '1e39' is out of range for a 32-bit float", NULL);
  expect_error("seed: -1\n", "t.yaml:1: seed: expected a non-negative integer, got '-1'", NULL);
  expect_error("seed: 18446744073709551616\n", "seed: '18446744073709551616' does not fit in 64 bits", NULL);
  expect_error("optim:\n  beta1: 1.0\n", "t.yaml:2: optim.beta1: must be in [0, 1), got 1.0", NULL);
  expect_error("optim:\n  eps: 0\n", "optim.eps: must be > 0, got 0", NULL);
  expect_error("batch:\n  micro_batch: 0\n", "t.yaml:2: batch.micro_batch: must be >= 1, got 0", NULL);
  expect_error("checkpoint:\n  keep: 0\n", "checkpoint.keep: must be >= 1, got 0", NULL);
  expect_error("model:\n  vocab_size: 1\n", "model.vocab_size: must be >= 2, got 1", NULL);
  expect_error("schedule:\n  type: linear\n", "t.yaml:2: schedule.type: invalid value 'linear'",
               "allowed: constant/cosine/wsd");
  expect_error("precision:\n  recipe: fp8\n", "precision.recipe: invalid value 'fp8'", "bf16/mxfp4/nvfp4");
  expect_error("parallel:\n  backend: tpu\n", "parallel.backend: invalid value 'tpu'", "auto/cpu/cuda");
  expect_error("parallel:\n  grad_reduce: fp16\n", "t.yaml:2: parallel.grad_reduce: invalid value 'fp16'", "fp32/bf16");
  expect_error("parallel:\n  bucket_mb: -1\n", "t.yaml:2: parallel.bucket_mb: must be >= 0", NULL);
  expect_error("parallel:\n  overlap_reduce: sometimes\n", "t.yaml:2: parallel.overlap_reduce: expected true or false",
               NULL);
  expect_error("parallel:\n  dgrad_transposed: 2\n", "t.yaml:2: parallel.dgrad_transposed: expected true or false",
               NULL);
  {
    config_defaults(&c);
    int ok = set(&c, "parallel.grad_reduce=bf16") == 0 && set(&c, "parallel.overlap_reduce=false") == 0 &&
             set(&c, "parallel.bucket_mb=0") == 0 && set(&c, "parallel.dgrad_transposed=off") == 0;
    CHECK(ok && !strcmp(c.grad_reduce, "bf16") && !c.overlap_reduce && c.bucket_mb == 0 && !c.dgrad_transposed,
          "--set of the data-parallel keys");
  }
  expect_error("model:\n  dim: 64\n  preset: huge\n", "t.yaml:3: model.preset: unknown preset 'huge'",
               "tiny, small, llama3_8b");
  expect_error("checkpoint:\n  resume: maybe\n", "t.yaml:2: checkpoint.resume: expected true or false", NULL);
  expect_error("optim:\n  lr: 1\n  beta1: 0.5\n  lr: 2\n", "t.yaml:4: optim.lr: duplicate key (first on line 2)", NULL);
  expect_error("optim:\n  lr: 1\nseed: 3\noptim:\n  eps: 1\n", "t.yaml:4: optim: duplicate key (first on line 1)",
               NULL);
  expect_error("model:\n  preset: tiny\n  preset: small\n", "t.yaml:3: model.preset: duplicate key", NULL);
  expect_error("optim:\n  lr: [1, 2\nseed: 1\n", "YAML syntax error", "t.yaml:");
  expect_error("optim:\n  lr: 1\n bad: 2\n", "t.yaml:3: YAML syntax error", NULL);
  expect_error("optim:\n  lr: \"unterminated\n", "YAML syntax error", NULL);
  expect_error("seed: 1\n---\nseed: 2\n", "a second YAML document", NULL);
  expect_error("optim:\n  ? [a, b]\n  : 1\n", "t.yaml:2: optim: expected a key name, got a sequence", NULL);
  {
    char yaml[2200] = "data:\n  train: ";
    memset(yaml + strlen(yaml), 'x', 1100);
    strcat(yaml, "\n");
    expect_error(yaml, "t.yaml:2: data.train: value is 1100 characters long, the limit is 1023", NULL);
  }
  // A failed load leaves the config untouched, even after keys before the error were applied.
  config_defaults(&c);
  CHECK(config_load_string(&c, "optim:\n  lr: 0.5\n  beta1: 2\n", 28, "t.yaml", err, sizeof err) == -1, "bad beta1");
  CHECK(c.lr == 3e-4f, "failed load changed lr to %g", c.lr);
  // Accepted forms: empty file, empty section, nulls for strings, yes/on/off, quoted numbers.
  CHECK(load(&c, "") == 0 && c.lr == 3e-4f, "empty file: %s", err);
  CHECK(load(&c, "# only a comment\noptim:\n") == 0, "empty section: %s", err);
  CHECK(load(&c, "data:\n  val: ~\neval:\n  interval: 0\n") == 0 && c.val_data[0] == 0, "null string: %s", err);
  CHECK(load(&c, "checkpoint:\n  dir: ck\n  resume: YES\n") == 0 && c.resume == 1, "yes: %s", err);
  CHECK(load(&c, "model:\n  rope_scaling: on\n") == 0 && c.model.rope_scaling == 1, "on: %s", err);
  CHECK(load(&c, "optim:\n  lr: '1e-3'\n  grad_clip: -0.5\n") == 0 && c.lr == 1e-3f && c.grad_clip == -0.5f, "%s", err);
  CHECK(load(&c, "seed: 0\n") == 0 && c.seed == 0, "%s", err);
  CHECK(load(&c, "optim: {lr: 1e-2, beta2: 0.99}\n") == 0 && c.lr == 1e-2f && c.beta2 == 0.99f, "flow: %s", err);

  TEST_SECTION("--set");
  config_defaults(&c);
  CHECK(set(&c, "batch.seq_len=32") == 0 && c.seq_len == 32, "int");
  CHECK(set(&c, "optim.lr=1e-3") == 0 && c.lr == 1e-3f, "float");
  CHECK(set(&c, "checkpoint.resume=true") == 0 && c.resume == 1, "bool");
  CHECK(set(&c, "schedule.type=wsd") == 0 && !strcmp(c.schedule, "wsd"), "enum");
  CHECK(set(&c, "data.train=a.bin,b.bin") == 0 && !strcmp(c.train_data, "a.bin,b.bin"), "string");
  CHECK(set(&c, "data.train=x=y") == 0 && !strcmp(c.train_data, "x=y"), "value with '='");
  CHECK(set(&c, "seed=7") == 0 && c.seed == 7, "top-level");
  CHECK(set(&c, "model.dim=128") == 0 && c.model.dim == 128, "model key");
  CHECK(set(&c, "model.preset=small") == 0 && c.model.dim == 1024 && c.model.n_layers == 12, "preset re-applied");
  CHECK(set(&c, "model.n_layers=4") == 0 && c.model.n_layers == 4 && c.model.dim == 1024, "later key overrides");
  CHECK(!strcmp(c.model_preset, "small"), "preset name %s", c.model_preset);
  expect_set_error("optim.lr", "--set optim.lr: expected section.key=value", NULL);
  expect_set_error("optim.lrr=1", "--set optim.lrr: unknown key", "did you mean 'optim.lr'");
  expect_set_error("optimizer.lr=1", "--set optimizer.lr: unknown key", "did you mean 'optim.lr'");
  expect_set_error("optim=1", "--set optim: unknown key", NULL);
  expect_set_error("optim.lr=fast", "--set optim.lr: expected a number, got 'fast'", NULL);
  expect_set_error("optim.lr=", "--set optim.lr: expected a number, got ''", NULL);
  expect_set_error("batch.seq_len=64.0", "--set batch.seq_len: expected an integer, got '64.0'", NULL);
  expect_set_error("batch.seq_len= 64", "--set batch.seq_len: expected an integer", NULL);
  expect_set_error("optim.beta2=1", "--set optim.beta2: must be in [0, 1), got 1", NULL);
  expect_set_error("checkpoint.resume=2", "--set checkpoint.resume: expected true or false", NULL);
  expect_set_error("schedule.type=Cosine", "--set schedule.type: invalid value 'Cosine'", "constant/cosine/wsd");
  expect_set_error("model.preset=llama3_70b", "--set model.preset: unknown preset 'llama3_70b'", "llama3_8b");

  TEST_SECTION("preset ordering");
  // The preset is applied first wherever it sits in the mapping; explicit keys win.
  CHECK(load(&c, "model:\n  dim: 96\n  n_heads: 4\n  preset: small\n  n_layers: 3\n") == 0, "%s", err);
  CHECK(c.model.dim == 96 && c.model.n_heads == 4 && c.model.n_layers == 3, "explicit keys lost to the preset");
  CHECK(c.model.ffn_dim == 2816 && c.model.vocab_size == 128256 && !strcmp(c.model_preset, "small"),
        "preset not applied");
  // Without a preset key, model keys override what is there (the tiny default).
  CHECK(load(&c, "model:\n  n_layers: 5\n") == 0 && c.model.n_layers == 5 && c.model.dim == 64, "%s", err);

  TEST_SECTION("validation");
  expect_error("batch:\n  micro_batch: 4\n  global_batch: 6\n",
               "t.yaml:3: batch.global_batch: 6 is not divisible by batch.micro_batch (4) x parallel.data_parallel (1)",
               NULL);
  expect_error("parallel:\n  data_parallel: 3\n",
               "batch.global_batch: 16 is not divisible by batch.micro_batch (8) x "
               "parallel.data_parallel (3)",
               NULL);
  expect_error("model:\n  n_heads: 3\n", "t.yaml:2: model.n_heads: model.dim 64 is not divisible by model.n_heads 3",
               NULL);
  expect_error("model:\n  n_kv_heads: 3\n",
               "t.yaml:2: model.n_kv_heads: model.n_heads 4 is not divisible by model.n_kv_heads 3", NULL);
  expect_error("model:\n  dim: 36\n  n_heads: 4\n  n_kv_heads: 1\n", "t.yaml:3: model.n_heads: head dimension",
               "= 9 is odd");
  expect_error("batch:\n  seq_len: 65\n", "t.yaml:2: batch.seq_len: 65 exceeds model.max_seq_len (64)", NULL);
  expect_error("schedule:\n  warmup_steps: 301\n",
               "t.yaml:2: schedule.warmup_steps: 301 exceeds schedule.total_steps (300)", NULL);
  expect_error("schedule:\n  type: wsd\n  decay_start: 250\n",
               "schedule.decay_steps: the decay (schedule.decay_start 250 "
               "+ 60 steps) ends after schedule.total_steps (300)",
               NULL);
  expect_error("schedule:\n  type: wsd\n  decay_start: 10\n", "t.yaml:3: schedule.decay_start: 10 is inside the warmup",
               NULL);
  expect_error("schedule:\n  type: wsd\n  decay_steps: 0\n", "t.yaml:3: schedule.decay_steps: must be >= 1", NULL);
  CHECK(load(&c, "schedule:\n  type: wsd\n  decay_start: 300\n  decay_steps: 0\n") == 0, "never-reached decay: %s",
        err);
  CHECK(load(&c, "schedule:\n  type: wsd\n  decay_start: 240\n  decay_steps: 60\n") == 0, "decay to the end: %s", err);
  expect_error("model:\n  ignore_index: 5\n",
               "t.yaml:2: model.ignore_index: 5 is a valid token id (model.vocab_size is 512)", NULL);
  CHECK(load(&c, "model:\n  ignore_index: 512\n") == 0, "ignore_index = vocab: %s", err);
  expect_error("model:\n  rope_scaling: true\n  rope_high_freq_factor: 1\n",
               "t.yaml:3: model.rope_high_freq_factor: 1 must exceed model.rope_low_freq_factor (1)", NULL);
  expect_error("checkpoint:\n  resume: true\n", "t.yaml:2: checkpoint.resume: is on, but checkpoint.dir is empty",
               NULL);
  expect_error("eval:\n  interval: 10\n", "t.yaml:2: eval.interval: 10, but data.val and eval.tasks are empty", NULL);
  expect_error("data:\n  train: \"\"\n", "t.yaml:2: data.train: is empty", NULL);
  // After --set the key has no line: the message names the source without one.
  config_defaults(&c);
  CHECK(set(&c, "batch.global_batch=12") == 0, "set");
  CHECK(config_validate(&c, "cmdline", err, sizeof err) == -1, "12 %% 8 accepted");
  CHECK(strstr(err, "cmdline: batch.global_batch: 12 is not divisible by batch.micro_batch (8)") == err, "%s", err);
  // Lines come from the last load; a key set by --set afterwards loses its line.
  CHECK(load(&c, "seed: 1\nbatch:\n  global_batch: 32\n") == 0, "%s", err);
  c.global_batch = 20;
  CHECK(config_validate(&c, "t.yaml", err, sizeof err) == -1 && strstr(err, "t.yaml:3: batch.global_batch: 20"), "%s",
        err);
  CHECK(set(&c, "batch.global_batch=20") == 0, "set");
  CHECK(config_validate(&c, "t.yaml", err, sizeof err) == -1 && strstr(err, "t.yaml: batch.global_batch: 20"), "%s",
        err);
  // Values edited in code get the single-value checks too.
  config_defaults(&c);
  c.beta1 = 1.5f;
  CHECK(config_validate(&c, "code", err, sizeof err) == -1 && strstr(err, "code: optim.beta1: must be in [0, 1)"), "%s",
        err);
  config_defaults(&c);
  strcpy(c.recipe, "fp3");
  CHECK(config_validate(&c, "code", err, sizeof err) == -1 && strstr(err, "precision.recipe: invalid value 'fp3'"),
        "%s", err);
  config_defaults(&c);
  c.model.n_heads = 0;
  CHECK(config_validate(&c, "code", err, sizeof err) == -1 && strstr(err, "model.n_heads: must be >= 1"), "%s", err);

  TEST_SECTION("reference");
  {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_print_reference(f);
    fclose(f);
    const char *expect[] = {"seed ",
                            "model.preset ",
                            "tiny|small|llama3_8b",
                            "model.rope_original_max_pos ",
                            "optim.beta1 ",
                            "[0, 1)",
                            "schedule.type ",
                            "constant|cosine|wsd",
                            "data.train ",
                            "\"synthetic\"",
                            "precision.recipe ",
                            "parallel.data_parallel ",
                            "(preset)",
                            "parallel.grad_reduce ",
                            "fp32|bf16",
                            "parallel.overlap_reduce ",
                            "parallel.bucket_mb ",
                            "parallel.dgrad_transposed "};
    for (int i = 0; i < (int)(sizeof expect / sizeof expect[0]); i++)
      CHECK(strstr(buf, expect[i]) != NULL, "reference lacks '%s'", expect[i]);
    free(buf);
  }

  TEST_END();
}
