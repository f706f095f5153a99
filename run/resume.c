// run/resume.c: checkpoints of a training run: what a checkpoint must agree on with the run that loads
// it, saving (one file, or one per rank plus a manifest), resuming (resharding across world sizes)
// and checkpoint.init_from.
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "run/checkpoint.h"
#include "run/manifest.h"
#include "run/run.h"

// Names the first model key where a file's model config (a) differs from this run's (b); 'what'
// names the file's side in the message ("checkpoint has ..."). max_seq_len only sizes the RoPE
// tables, and the scaling details only matter when scaling is on, so neither is compared.
static int model_mismatch(const LlamaConfig *a, const LlamaConfig *b, const char *what, char *msg, size_t len) {
#define CMP(field, key, fmt)                                                                   \
  do {                                                                                         \
    if (a->field != b->field) {                                                                \
      snprintf(msg, len, key ": %s has " fmt ", this run has " fmt, what, a->field, b->field); \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)
  CMP(vocab_size, "model.vocab_size", "%d");
  CMP(dim, "model.dim", "%d");
  CMP(n_layers, "model.n_layers", "%d");
  CMP(n_heads, "model.n_heads", "%d");
  CMP(n_kv_heads, "model.n_kv_heads", "%d");
  CMP(ffn_dim, "model.ffn_dim", "%d");
  CMP(norm_eps, "model.norm_eps", "%g");
  CMP(rope_theta, "model.rope_theta", "%g");
  CMP(rope_scaling, "model.rope_scaling", "%d");
  if (a->rope_scaling) {
    CMP(rope_factor, "model.rope_factor", "%g");
    CMP(rope_low_freq_factor, "model.rope_low_freq_factor", "%g");
    CMP(rope_high_freq_factor, "model.rope_high_freq_factor", "%g");
    CMP(rope_original_max_pos, "model.rope_original_max_pos", "%d");
  }
#undef CMP
  return 0;
}

// Names the first field where a checkpoint's meta differs from this run's, by its config key.
static int meta_mismatch(const RunMeta *a, const RunMeta *b, char *msg, size_t len) {
#define CMP(field, key, fmt)                                                                     \
  do {                                                                                           \
    if (a->field != b->field) {                                                                  \
      snprintf(msg, len, key ": checkpoint has " fmt ", this run has " fmt, a->field, b->field); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)
  CMP(version, "run metadata version", "%u");
  if (model_mismatch(&a->model, &b->model, "checkpoint", msg, len)) return 1;
  CMP(micro_batch, "batch.micro_batch", "%d");
  CMP(global_batch, "batch.global_batch", "%d");
  CMP(seq_len, "batch.seq_len", "%d");
  CMP(world, "parallel.data_parallel", "%d");
  CMP(seed, "seed", "%" PRIu64);
  CMP(n_params, "parameter count", "%" PRIu64);
#undef CMP
  if (strcmp(a->recipe, b->recipe)) {
    snprintf(msg, len, "precision.recipe: checkpoint has %s, this run has %s", a->recipe, b->recipe);
    return 1;
  }
  return 0;
}

static const char *hadamard_name(int size) { return size == 32 ? "h32" : size == 16 ? "h16" : size ? "?" : "none"; }

// Same for the recipe's details, in config-key terms.
static int recipe_mismatch(const RecipeMeta *a, const RecipeMeta *b, char *msg, size_t len) {
  static const char *sr[] = {"none", "dgrad", "?", "dgrad_wgrad"};
  int sa = a->sr_dgrad + 2 * a->sr_wgrad, sb = b->sr_dgrad + 2 * b->sr_wgrad;
  if (sa != sb) {
    snprintf(msg, len, "precision.sr: checkpoint has %s, this run has %s", sr[sa & 3], sr[sb & 3]);
    return 1;
  }
#define CMP(field, key, fmt, A, B)                                                 \
  do {                                                                             \
    if (a->field != b->field) {                                                    \
      snprintf(msg, len, key ": checkpoint has " fmt ", this run has " fmt, A, B); \
      return 1;                                                                    \
    }                                                                              \
  } while (0)
  CMP(hadamard, "precision.hadamard", "%s", hadamard_name(a->hadamard), hadamard_name(b->hadamard));
  CMP(weight_2d, "precision.weight_2d", "%s", a->weight_2d ? "on" : "off", b->weight_2d ? "on" : "off");
  CMP(scale_round_up, "precision.scale_rounding", "%s", a->scale_round_up ? "up" : "down",
      b->scale_round_up ? "up" : "down");
  CMP(bf16_first, "precision.bf16_first_blocks", "%d", a->bf16_first, b->bf16_first);
  CMP(bf16_last, "precision.bf16_last_blocks", "%d", a->bf16_last, b->bf16_last);
#undef CMP
  return 0;
}

// The checkpointed state: params (all of them), then AdamW m and v (this rank's shard). state[]
// is backend memory; host[] is the same memory on the CPU, else room in the staging buffer.
typedef struct {
  float *state[3], *host[3];
  size_t bytes[3];
} CkptState;

int on_host(const Run *r) { return r->ops->host_memory; }

static CkptState ckpt_state(Run *r) {
  const Zero *z = r->zero;
  size_t n = z->n, s = z->hi - z->lo, offset[3] = {0, n, n + s};
  CkptState c = {{llama_params(r->model), z->m, z->v}, {0}, {n * sizeof(float), s * sizeof(float), s * sizeof(float)}};
  for (int i = 0; i < 3; i++) c.host[i] = on_host(r) ? c.state[i] : r->host_stage + offset[i];
  return c;
}

// With one process: checkpoint.dir/ckpt_<step>.bin. With world > 1: a sharded checkpoint, one file
// per rank under checkpoint.dir/rank_<r>/ plus rank 0's manifest (parallel/zero.h). Only rank 0's
// file holds the parameters (all of them, gathered first when the masters are sharded).
void save_checkpoint(Run *r) {
  if (!r->cfg.ckpt_dir[0]) return;
  const int sharded = r->world > 1;
  CkptState st = ckpt_state(r);
  // With sharded fp32 masters the shards meet in the (dead between steps) gradient buffer first:
  // a collective, so every rank calls it.
  const float *params = zero_full_params(r->zero);
  for (int i = 0; i < 3; i++)
    if (!on_host(r) && (i || r->rank == 0))
      r->ops->download(r->ops->ctx, st.host[i], i ? st.state[i] : params, st.bytes[i]);
  LoaderState ls;
  loader_get_state(r->train, &ls);
  LoaderBlendState blend;  // a blend's sources and per-source counts; a single source writes none
  int blended = loader_get_blend(r->train, &blend) > 1;
  CkptSection secs[8] = {{"meta", &r->meta, sizeof r->meta}}, *s = secs + 1;
  if (r->rank == 0) *s++ = (CkptSection){"params", st.host[0], st.bytes[0]};
  *s++ = (CkptSection){"adam_m", st.host[1], st.bytes[1]};
  *s++ = (CkptSection){"adam_v", st.host[2], st.bytes[2]};
  *s++ = (CkptSection){"loader", &ls, sizeof ls};
  if (blended) *s++ = (CkptSection){"blend", &blend, sizeof blend};
  *s++ = (CkptSection){"recipe", &r->recipe, sizeof r->recipe};
  *s++ = (CkptSection){"route", r->route, sizeof r->route};
  char dir[2048], err[1024];
  if (sharded) snprintf(dir, sizeof dir, "%s/rank_%d", r->cfg.ckpt_dir, r->rank);
  else snprintf(dir, sizeof dir, "%s", r->cfg.ckpt_dir);
  double t0 = now_seconds();
  // A failed save (disk full, permissions) stops the run: training on without being able to save
  // would only widen the gap since the last checkpoint, which ckpt_save leaves intact. The other
  // ranks then stop at their next collective, naming this one.
  if (ckpt_save(dir, r->step, secs, (int)(s - secs), r->cfg.ckpt_keep, err, sizeof err))
    die("checkpoint at step %lld failed: %s; stopping (%s%s)", (long long)r->step, err,
        r->last_ckpt[0] ? "the last good checkpoint is intact: " : "no earlier checkpoint of this run", r->last_ckpt);
  char path[2200];
  snprintf(path, sizeof path, "%s/ckpt_%08lld.bin", dir, (long long)r->step);
  if (sharded) {
    // Every rank's file is durable once this all-reduce of their sizes and checksums returns.
    Manifest man = {r->step, r->world, r->zero->n, xcalloc((size_t)r->world, sizeof(ShardFile))};
    double *info = xcalloc(4 * (size_t)r->world, sizeof(double)), *mine = info + 4 * r->rank;
    uint64_t sum, bytes;
    if (file_checksum(path, &sum, &bytes, err, sizeof err)) die("checkpoint at step %lld: %s", (long long)r->step, err);
    mine[0] = (double)(sum >> 32), mine[1] = (double)(sum & 0xffffffffu), mine[2] = (double)bytes;  // exact in doubles
    comm_allreduce_sum_f64(r->comm, info, 4 * r->world);
    for (int k = 0; k < r->world; k++) {
      ShardFile *f = &man.files[k];
      snprintf(f->path, sizeof f->path, "%s/rank_%d/ckpt_%08lld.bin", r->cfg.ckpt_dir, k, (long long)r->step);
      comm_shard_range(man.n, r->world, k, &f->lo, &f->hi);
      f->checksum = (uint64_t)info[4 * k] << 32 | (uint64_t)info[4 * k + 1];
      f->bytes = (uint64_t)info[4 * k + 2];
    }
    if (r->rank == 0 && manifest_write(r->cfg.ckpt_dir, &man, r->cfg.ckpt_keep, err, sizeof err))
      die("checkpoint at step %lld: %s", (long long)r->step, err);
    comm_barrier(r->comm);  // nobody reports the checkpoint before its manifest exists
    free(info);
    manifest_free(&man);
    snprintf(path, sizeof path, "%s/manifest_%08lld.txt", r->cfg.ckpt_dir, (long long)r->step);
  }
  snprintf(r->last_ckpt, sizeof r->last_ckpt, "%s", path);
  r->saved_step = r->step;
  printf("saved checkpoint %s (%.2fs)\n", r->last_ckpt, now_seconds() - t0);
  fflush(stdout);
}

// Loads the newest valid checkpoint, after checking that it was written by a compatible run.
// Returns 1 when it did, 0 when checkpoint.dir holds none (the run starts from scratch).
// Rank 0 picks the newest complete one, single-file (what a one-process run writes) or sharded
// (a manifest), and tells the others, so that every rank loads the same step. The world size may
// differ from the checkpoint's: parameters are whole in every form, and this rank's range of the
// moments is cut out of the saved shards (manifest_load_moments).
int resume(Run *r) {
  char err[1024], why[512];
  struct {
    int64_t step;
    int32_t kind;  // 0: none, 1: one file, 2: a sharded checkpoint's manifest
    char path[2048];
  } pick = {-1, 0, ""};
  Manifest man = {0};
  if (r->rank == 0) {
    int64_t step;
    int one = ckpt_latest(r->cfg.ckpt_dir, pick.path, sizeof pick.path, &step);
    if (one < 0) die("cannot scan checkpoint dir '%s'", r->cfg.ckpt_dir);
    int sharded = manifest_latest(r->cfg.ckpt_dir, &man, err, sizeof err);
    if (sharded == 0 && (one != 0 || man.step >= step)) pick.kind = 2, pick.step = man.step;
    else if (one == 0) pick.kind = 1, pick.step = step;
    manifest_free(&man);
  }
  comm_broadcast_bytes(r->comm, &pick, sizeof pick);
  if (pick.kind == 0) {
    printf("resume: no checkpoint in '%s', starting from scratch\n", r->cfg.ckpt_dir);
    return 0;
  }
  ShardFile single = {.lo = 0, .hi = r->zero->n}, *src = &single;
  int nsrc = 1;
  if (pick.kind == 1) snprintf(single.path, sizeof single.path, "%s", pick.path);
  else {
    if (manifest_read(r->cfg.ckpt_dir, pick.step, &man, err, sizeof err)) die("resume: %s", err);
    src = man.files, nsrc = man.world;
  }
  const char *path = src[0].path;  // meta, params, loader state: rank 0's file
  RunMeta old;
  int64_t step;
  CkptSection meta = {"meta", &old, sizeof old};
  if (ckpt_load(path, &meta, 1, &step, err, sizeof err)) die("%s", err);
  RunMeta want = r->meta;
  want.tokens_seen = old.tokens_seen;
  want.world = old.world;  // another world size is fine: the moments are re-cut below
  if (meta_mismatch(&old, &want, why, sizeof why)) die("checkpoint %s does not match this run: %s", path, why);
  size_t recipe_bytes;
  int has = ckpt_section_size(path, "recipe", &recipe_bytes, err, sizeof err);
  if (has < 0) die("%s", err);
  if (has == 0 && strcmp(old.recipe, "bf16")) {  // the details only matter for an FP4 recipe
    RecipeMeta old_recipe;
    CkptSection rs = {"recipe", &old_recipe, sizeof old_recipe};
    if (ckpt_load(path, &rs, 1, NULL, err, sizeof err)) die("%s", err);
    if (recipe_mismatch(&old_recipe, &r->recipe, why, sizeof why))
      die("checkpoint %s does not match this run: %s", path, why);
  }
  // The per-block and per-contraction formats ("route"; checkpoints older than it ran uniform routes).
  char old_route[sizeof r->route] = "uniform";
  has = ckpt_section_size(path, "route", &recipe_bytes, err, sizeof err);
  if (has < 0) die("%s", err);
  if (has == 0) {
    CkptSection rs = {"route", old_route, sizeof old_route};
    if (ckpt_load(path, &rs, 1, NULL, err, sizeof err)) die("%s", err);
    old_route[sizeof old_route - 1] = 0;
  }
  if (strcmp(old_route, r->route))
    die("checkpoint %s does not match this run: precision.blocks/fprop/dgrad/wgrad/hadamard: checkpoint has route "
        "'%s', this run has '%s'",
        path, old_route, r->route);
  CkptState st = ckpt_state(r);
  LoaderState ls;
  CkptSection secs[] = {{"params", st.host[0], st.bytes[0]}, {"loader", &ls, sizeof ls}};
  if (ckpt_load(path, secs, 2, &step, err, sizeof err)) die("%s", err);
  if (manifest_load_moments(src, nsrc, r->zero->lo, r->zero->hi, st.host[1], st.host[2], err, sizeof err))
    die("resume: %s", err);
  if (!on_host(r))
    for (int i = 0; i < 3; i++) r->ops->upload(r->ops->ctx, st.state[i], st.host[i], st.bytes[i]);
  r->ops->params_changed(r->ops->ctx);
  // A blend's sources and counts ("blend"; single-source checkpoints, older ones too, have none).
  LoaderBlendState blend;
  has = ckpt_section_size(path, "blend", &recipe_bytes, err, sizeof err);
  if (has < 0) die("%s", err);
  CkptSection bs = {"blend", &blend, sizeof blend};
  if (has == 0 && ckpt_load(path, &bs, 1, NULL, err, sizeof err)) die("%s", err);
  if (loader_set_state(r->train, &ls, has == 0 ? &blend : NULL, err, sizeof err))
    die("checkpoint %s does not match this run: data.train: %s", path, err);
  r->meta.tokens_seen = old.tokens_seen;
  r->step = r->saved_step = step;
  if (pick.kind == 1) snprintf(r->last_ckpt, sizeof r->last_ckpt, "%s", pick.path);
  else snprintf(r->last_ckpt, sizeof r->last_ckpt, "%s/manifest_%08lld.txt", r->cfg.ckpt_dir, (long long)step);
  if (old.world != r->world)
    printf("resume: re-sharding the optimizer state from %d to %d ranks\n", old.world, r->world);
  printf("resumed from %s at step %lld\n", r->last_ckpt, (long long)step);
  manifest_free(&man);
  return 1;
}

// checkpoint.init_from: replaces the random init by the "params" of a file, after checking that its
// model config ("init_meta" of an imported model, or a training checkpoint's "meta") is this run's.
// Only the parameters are taken: the optimizer state, step and data position start fresh.
void init_from(Run *r) {
  const char *path = r->cfg.init_from;
  char err[1024], why[512];
  size_t meta_bytes;
  const char *name = "init_meta";
  int has = ckpt_section_size(path, name, &meta_bytes, err, sizeof err);
  if (has < 0) die("checkpoint.init_from: %s", err);
  if (has == 1) name = "meta";
  void *buf;
  if (ckpt_read_section(path, name, &buf, &meta_bytes, err, sizeof err)) die("checkpoint.init_from: %s", err);
  size_t want_bytes = has == 1 ? sizeof(RunMeta) : sizeof(InitMeta);
  uint32_t want_version = has == 1 ? META_VERSION : INIT_META_VERSION;
  if (meta_bytes != want_bytes)
    die("checkpoint.init_from: '%s': section '%s' has %zu bytes, this build's has %zu", path, name, meta_bytes,
        want_bytes);
  // Both structs start with the version, then the model config.
  LlamaConfig model = has == 1 ? ((RunMeta *)buf)->model : ((InitMeta *)buf)->model;
  uint32_t version = *(uint32_t *)buf;
  free(buf);
  if (version != want_version)
    die("checkpoint.init_from: '%s': section '%s' has version %u, this build reads %u", path, name, version,
        want_version);
  if (model_mismatch(&model, &r->cfg.model, "the file", why, sizeof why))
    die("checkpoint.init_from: '%s' holds a different model: %s", path, why);
  size_t bytes = llama_param_count(r->model) * sizeof(float);
  float *host = on_host(r) ? llama_params(r->model) : r->host_stage;  // the staging buffer starts with the params
  CkptSection params = {"params", host, bytes};
  if (ckpt_load(path, &params, 1, NULL, err, sizeof err)) die("checkpoint.init_from: %s", err);
  if (!on_host(r)) r->ops->upload(r->ops->ctx, llama_params(r->model), host, bytes);
  r->ops->params_changed(r->ops->ctx);
  printf("initialized from %s\n", path);
}
