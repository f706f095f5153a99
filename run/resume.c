// run/resume.c: checkpoints of a training run: what a checkpoint must agree on with the run that loads
// it, saving (one file, or one per rank plus a manifest; in the background with checkpoint.async,
// run/ckpt_async.h), resuming (resharding across world sizes) and checkpoint.init_from.
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "run/checkpoint.h"
#include "run/ckpt_async.h"
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
// is backend memory; host[] is the same memory on the CPU, else room in the staging buffer, laid
// out as run/ckpt_async.h lays sections out (each at a 64-byte boundary). Only rank 0's file holds
// the parameters, so only its staging buffer has room for them: host[0] is NULL elsewhere, and
// everywhere when there is no staging buffer (no checkpoint.dir).
typedef struct {
  float *state[3], *host[3];
  size_t bytes[3];
} CkptState;

int on_host(const Run *r) { return r->ops->host_memory; }

static CkptState ckpt_state(Run *r) {
  const Zero *z = r->zero;
  size_t n = z->n, s = z->hi - z->lo, off = 0;
  CkptState c = {{llama_params(r->model), z->m, z->v}, {0}, {n * sizeof(float), s * sizeof(float), s * sizeof(float)}};
  for (int i = 0; i < 3; i++) {
    if (on_host(r)) c.host[i] = c.state[i];
    else if (r->host_stage && (i || r->rank == 0)) {
      c.host[i] = (float *)((char *)r->host_stage + off);
      off += ckpt_stage_bytes(&c.bytes[i], 1);
    }
  }
  return c;
}

// The staging buffer holds what this rank saves: its params (rank 0), m and v for a device backend's
// downloads, and with checkpoint.async also the small sections, all copied at the save's step. It
// is pinned (Ops.host_alloc) where the backend can pin, so the downloads run at the link's speed.
// The CPU backend's synchronous save writes from its live state and needs none.
void checkpoint_open(Run *r) {
  r->pending_step = -1;
  const int async = r->cfg.ckpt_async;
  if (!r->cfg.ckpt_dir[0] || (on_host(r) && !async)) return;
  CkptState st = ckpt_state(r);
  size_t sizes[8] = {st.bytes[1], st.bytes[2]};
  int k = 2;
  if (r->rank == 0) sizes[k++] = st.bytes[0];
  if (async) {
    sizes[k++] = sizeof(RunMeta), sizes[k++] = sizeof(LoaderState), sizes[k++] = sizeof(LoaderBlendState);
    sizes[k++] = sizeof(RecipeMeta), sizes[k++] = sizeof r->route;
  }
  r->stage_bytes = ckpt_stage_bytes(sizes, k);
  r->host_stage = ckpt_stage_alloc(r->ops->host_alloc, r->ops->ctx, r->stage_bytes, &r->stage_pinned);
  if (r->ops->host_alloc && !r->stage_pinned)
    fprintf(stderr,
            "warning: cannot pin %.2f GB of host memory for checkpoint staging: pageable memory instead "
            "(slower saves)\n",
            r->stage_bytes / 1e9);
  printf("checkpoint staging: %.3f GB of %s host memory (%s%s)%s\n", r->stage_bytes / 1e9,
         r->stage_pinned ? "pinned" : "pageable", r->rank == 0 ? "the parameters and " : "",
         r->world > 1 ? "this rank's AdamW m, v" : "AdamW m, v",
         async ? "; saves copy the state there and write it in the background" : "");
}

void checkpoint_close(Run *r) {
  ckpt_writer_close(r->writer);  // train() waited for the last write: nothing is pending
  r->writer = NULL;
  ckpt_stage_free(r->ops->host_free, r->ops->ctx, r->host_stage, r->stage_pinned);
  r->host_stage = NULL;
}

// Where this rank's file goes: checkpoint.dir, or its rank_<r>/ sub-directory when sharded.
static void rank_dir(const Run *r, char *dir, size_t len) {
  if (r->world > 1) snprintf(dir, len, "%s/rank_%d", r->cfg.ckpt_dir, r->rank);
  else snprintf(dir, len, "%s", r->cfg.ckpt_dir);
}

// The data loader's position (and a blend's per-source counts) at the save's step.
typedef struct {
  LoaderState ls;
  LoaderBlendState blend;
} LoaderSnap;

// The sections of this rank's file in their order: meta, params (rank 0's file only), adam_m,
// adam_v, loader, blend (a blend of sources only; a single source writes none), recipe, route.
// big[]: where params, m and v are now, read with copy (NULL: host memory). Returns the count.
static int sections(Run *r, const CkptState *st, const void *const big[3], CkptCopyFn copy, LoaderSnap *ld,
                    CkptSource *out) {
  static const char *names[3] = {"params", "adam_m", "adam_v"};
  CkptSource *s = out;
  *s++ = (CkptSource){"meta", &r->meta, sizeof r->meta, NULL, NULL};
  for (int i = 0; i < 3; i++)
    if (i || r->rank == 0) *s++ = (CkptSource){names[i], big[i], st->bytes[i], copy, r->ops->ctx};
  loader_get_state(r->train, &ld->ls);
  *s++ = (CkptSource){"loader", &ld->ls, sizeof ld->ls, NULL, NULL};
  if (loader_get_blend(r->train, &ld->blend) > 1)
    *s++ = (CkptSource){"blend", &ld->blend, sizeof ld->blend, NULL, NULL};
  *s++ = (CkptSource){"recipe", &r->recipe, sizeof r->recipe, NULL, NULL};
  *s++ = (CkptSource){"route", r->route, sizeof r->route, NULL, NULL};
  return (int)(s - out);
}

// A failed save (disk full, permissions) stops the run: training on without being able to save
// would only widen the gap since the last checkpoint, which ckpt_save leaves intact. The other
// ranks then stop at their next collective, naming this one.
static void stop_on_failed_save(const Run *r, int64_t step, const char *err) {
  die("checkpoint at step %lld failed: %s; stopping (%s%s)", (long long)step, err,
      r->last_ckpt[0] ? "the last good checkpoint is intact: " : "no earlier checkpoint of this run", r->last_ckpt);
}

// ckpt_prune_unlisted's question: does a manifest still name this step's rank files?
static int listed_by_manifest(int64_t step, void *ckpt_dir) { return manifest_exists((const char *)ckpt_dir, step); }

// World > 1, once this rank's file of `step` is durable (sum and bytes: its file_checksum): an
// all-reduce of every rank's size and checksum (when it returns every file is durable), then rank
// 0 writes the manifest naming them, then a barrier (nobody reports the checkpoint before its
// manifest exists). Collective. path gets the manifest's path.
static void write_manifest(Run *r, int64_t step, uint64_t sum, uint64_t bytes, char *path, size_t len) {
  char err[1024];
  Manifest man = {step, r->world, r->zero->n, xcalloc((size_t)r->world, sizeof(ShardFile))};
  double *info = xcalloc(4 * (size_t)r->world, sizeof(double)), *mine = info + 4 * r->rank;
  mine[0] = (double)(sum >> 32), mine[1] = (double)(sum & 0xffffffffu), mine[2] = (double)bytes;  // exact in doubles
  comm_allreduce_sum_f64(r->comm, info, 4 * r->world);
  for (int k = 0; k < r->world; k++) {
    ShardFile *f = &man.files[k];
    snprintf(f->path, sizeof f->path, "%s/rank_%d/ckpt_%08lld.bin", r->cfg.ckpt_dir, k, (long long)step);
    comm_shard_range(man.n, r->world, k, &f->lo, &f->hi);
    f->checksum = (uint64_t)info[4 * k] << 32 | (uint64_t)info[4 * k + 1];
    f->bytes = (uint64_t)info[4 * k + 2];
  }
  if (r->rank == 0 && manifest_write(r->cfg.ckpt_dir, &man, r->cfg.ckpt_keep, err, sizeof err))
    die("checkpoint at step %lld: %s", (long long)step, err);
  comm_barrier(r->comm);
  char dir[2048];  // the rank files of older steps go only now that the new manifest names this step's
  rank_dir(r, dir, sizeof dir);
  if (r->cfg.ckpt_keep > 0) ckpt_prune_unlisted(dir, step, listed_by_manifest, r->cfg.ckpt_dir);
  free(info);
  manifest_free(&man);
  snprintf(path, len, "%s/manifest_%08lld.txt", r->cfg.ckpt_dir, (long long)step);
}

// checkpoint.async: false. The whole save happens here: downloads into the staging buffer (device
// backends), ckpt_save, and with world > 1 the manifest with the file's checksum (hashed from memory).
static void save_sync(Run *r) {
  CkptState st = ckpt_state(r);
  // With sharded fp32 masters the shards meet in the (dead between steps) gradient buffer first:
  // a collective, so every rank calls it.
  const float *params = zero_full_params(r->zero);
  for (int i = 0; i < 3; i++)
    if (!on_host(r) && (i || r->rank == 0))
      r->ops->download(r->ops->ctx, st.host[i], i ? st.state[i] : params, st.bytes[i]);
  CkptSource src[8];
  CkptSection secs[8];
  LoaderSnap ld;
  const void *big[3] = {st.host[0], st.host[1], st.host[2]};
  int n = sections(r, &st, big, NULL, &ld, src);
  for (int i = 0; i < n; i++) secs[i] = (CkptSection){src[i].name, (void *)src[i].src, src[i].bytes};
  char dir[2048], err[1024], path[4200];
  rank_dir(r, dir, sizeof dir);
  double t0 = now_seconds();
  uint64_t sum = 0, bytes = 0;
  if (ckpt_save_sum(dir, r->step, secs, n, r->world > 1 ? 0 : r->cfg.ckpt_keep, r->world > 1 ? &sum : NULL, &bytes, err,
                    sizeof err))  // sharded: write_manifest prunes
    stop_on_failed_save(r, r->step, err);
  snprintf(path, sizeof path, "%s/ckpt_%08lld.bin", dir, (long long)r->step);
  if (r->world > 1) write_manifest(r, r->step, sum, bytes, path, sizeof path);
  snprintf(r->last_ckpt, sizeof r->last_ckpt, "%s", path);
  r->saved_step = r->step;
  printf("saved checkpoint %s (%.2fs)\n", r->last_ckpt, now_seconds() - t0);
  fflush(stdout);
}

// Takes this rank's finished background write (waiting for it), stopping the run if it failed.
static void collect(Run *r) {
  if (!ckpt_writer_wait(r->writer, &r->pending))
    die("checkpoint at step %lld: the writer has no save to report", (long long)r->pending_step);
  if (r->pending.failed) stop_on_failed_save(r, r->pending.step, r->pending.err);
  r->pending_collected = 1;
}

// Every rank's file of the pending save is written: with world > 1 the manifest (collective), then
// the checkpoint counts as saved.
static void finish(Run *r) {
  char path[4200];
  snprintf(path, sizeof path, "%s", r->pending.path);
  if (r->world > 1) write_manifest(r, r->pending.step, r->pending.checksum, r->pending.bytes, path, sizeof path);
  snprintf(r->last_ckpt, sizeof r->last_ckpt, "%s", path);
  printf("saved checkpoint %s (stall %.3fs, background write %.3fs)\n", r->last_ckpt, r->pending_stall,
         r->pending.write_s);
  fflush(stdout);
  r->pending_step = -1;
  r->pending_collected = 0;
}

void checkpoint_wait(Run *r) {
  if (r->pending_step < 0) return;
  if (!r->pending_collected) {
    if (ckpt_writer_busy(r->writer)) {
      printf("checkpoint: waiting for the background write of step %lld\n", (long long)r->pending_step);
      fflush(stdout);
    }
    collect(r);
  }
  finish(r);
}

int checkpoint_poll_begin(Run *r) {
  if (r->pending_step < 0) return 0;
  if (!r->pending_collected && !ckpt_writer_busy(r->writer)) collect(r);
  return r->pending_collected;
}

// Every rank has the same save pending and polls at the same step boundaries, so all of them see
// the same sum and finish together.
void checkpoint_poll_end(Run *r, double collected_ranks) {
  if (r->pending_step >= 0 && collected_ranks == r->world) finish(r);
}

// checkpoint.async: true. Waits for the previous write (two saves never overlap), then copies the
// state at this step into the staging buffer and hands the file to the writer's thread.
static void save_async(Run *r) {
  checkpoint_wait(r);
  if (!r->writer) r->writer = ckpt_writer_open(r->host_stage, r->stage_bytes);
  double t0 = now_seconds();
  CkptState st = ckpt_state(r);
  const void *big[3] = {zero_full_params(r->zero), st.state[1], st.state[2]};  // a collective, as above
  CkptSource src[8];
  LoaderSnap ld;
  int n = sections(r, &st, big, on_host(r) ? NULL : r->ops->download, &ld, src);
  char dir[2048], err[1024];
  rank_dir(r, dir, sizeof dir);
  if (ckpt_writer_submit(r->writer, dir, r->step, src, n, r->world > 1 ? 0 : r->cfg.ckpt_keep, r->world > 1, NULL, err,
                         sizeof err))  // sharded: write_manifest prunes
    die("checkpoint at step %lld: %s", (long long)r->step, err);
  r->pending_step = r->saved_step = r->step;
  r->pending_stall = now_seconds() - t0;
  printf("checkpoint at step %lld: state copied in %.3fs, writing it in the background\n", (long long)r->step,
         r->pending_stall);
  fflush(stdout);
}

// With one process: checkpoint.dir/ckpt_<step>.bin. With world > 1: a sharded checkpoint, one file
// per rank under checkpoint.dir/rank_<r>/ plus rank 0's manifest (parallel/zero.h). Only rank 0's
// file holds the parameters (all of them, gathered first when the masters are sharded).
void save_checkpoint(Run *r) {
  if (!r->cfg.ckpt_dir[0]) return;
  if (r->cfg.ckpt_async) save_async(r);
  else save_sync(r);
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
  // So is another micro-batch at the same global batch (say, on GPUs with less memory): the loader's
  // position counts the rows of all ranks, so every step reads the same rows; only the order in which
  // the accumulation adds them changes, so the losses are no longer bit-identical to the original's.
  if (old.micro_batch != want.micro_batch && r->rank == 0)
    printf(
        "resume: batch.micro_batch %d -> %d at global batch %d: the same rows per step, accumulated in another "
        "order (not bit for bit); validation reads eval.batches micro-batches, now of another size\n",
        old.micro_batch, want.micro_batch, want.global_batch);
  want.micro_batch = old.micro_batch;
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
  // Through the staging buffer, else (rank > 0 has no room for the params; a process that never saves
  // has no staging at all) through host memory of its own for the time of the load.
  CkptState st = ckpt_state(r);
  float *tmp[3] = {NULL, NULL, NULL};
  for (int i = 0; i < 3; i++)
    if (!st.host[i]) st.host[i] = tmp[i] = xmalloc(st.bytes[i] ? st.bytes[i] : 1);
  LoaderState ls;
  CkptSection secs[] = {{"params", st.host[0], st.bytes[0]}, {"loader", &ls, sizeof ls}};
  if (ckpt_load(path, secs, 2, &step, err, sizeof err)) die("%s", err);
  if (manifest_load_moments(src, nsrc, r->zero->lo, r->zero->hi, st.host[1], st.host[2], err, sizeof err))
    die("resume: %s", err);
  if (!on_host(r))
    for (int i = 0; i < 3; i++) r->ops->upload(r->ops->ctx, st.state[i], st.host[i], st.bytes[i]);
  for (int i = 0; i < 3; i++) free(tmp[i]);
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
  float *host = ckpt_state(r).host[0], *tmp = host ? NULL : xmalloc(bytes);  // rank 0's staging buffer, or room
  if (tmp) host = tmp;
  CkptSection params = {"params", host, bytes};
  if (ckpt_load(path, &params, 1, NULL, err, sizeof err)) die("checkpoint.init_from: %s", err);
  if (!on_host(r)) r->ops->upload(r->ops->ctx, llama_params(r->model), host, bytes);
  free(tmp);
  r->ops->params_changed(r->ops->ctx);
  printf("initialized from %s\n", path);
}
