// dist/zero.c: the ZeRO-1 optimizer step (see dist/zero.h).
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "model/adamw.h"
#include "run/checkpoint.h"
#include "dist/zero.h"

// The forward's parameter-ready wait (llama_set_param_wait): the work queued next waits for the
// stage of the BF16 all-gather that carries this group (zero_step).
static void on_param_wait(void *ctx, int group) {
  Zero *z = ctx;
  comm_stage_wait(z->comm, group);
}

Zero *zero_create(Llama *model, const Ops *ops, Comm *comm, const ZeroOptions *opt) {
  Zero *z = xcalloc(1, sizeof *z);
  z->ops = ops, z->comm = comm, z->model = model;
  if (opt) z->opt = *opt;
  z->n = llama_param_count(model);
  comm_shard_range(z->n, comm_world(comm), comm_rank(comm), &z->lo, &z->hi);
  size_t bytes = (z->hi - z->lo) * sizeof(float);
  z->m = ops->alloc(bytes ? bytes : sizeof(float));  // a tiny model over many ranks may own nothing
  z->v = ops->alloc(bytes ? bytes : sizeof(float));
  ops->zero(z->m, bytes);
  ops->zero(z->v, bytes);
  const ParamTensor *emb = llama_find_tensor(model, "tok_embedding");
  if (emb && z->opt.overlap && comm_world(comm) > 1) {  // only the overlapped reduction goes by rows
    z->embed_off = emb->offset, z->embed_len = emb->numel, z->embed_dim = (size_t)emb->shape[1];
    z->nrows_words = ((size_t)emb->shape[0] + 63) / 64;
    z->rows = xcalloc(z->nrows_words, sizeof(uint64_t));
    z->row_list = xmalloc((size_t)emb->shape[0] * sizeof(uint32_t));
  }
  if (z->opt.shard_master && comm_world(comm) > 1 && comm_on_device(comm) && ops->shard_params) {
    // Kept in fp32: the shard (AdamW updates it) and the tensors without weight decay, the RMSNorm
    // weights, which the kernels read in fp32 (model/llama.h: decay 0 is exactly those).
    int nt = llama_num_tensors(model), nk = 1;
    size_t *off = xmalloc((size_t)(nt + 1) * sizeof(size_t)), *len = xmalloc((size_t)(nt + 1) * sizeof(size_t));
    z->fp32_ranges = xcalloc((size_t)nt + 1, sizeof(CommRange));
    off[0] = z->lo, len[0] = z->hi - z->lo;
    for (int i = 0; i < nt; i++) {
      const ParamTensor *t = llama_tensor(model, i);
      if (t->decay) continue;
      off[nk] = t->offset, len[nk] = t->numel, nk++;
      z->fp32_ranges[z->nfp32++] = (CommRange){t->offset, t->numel};
    }
    z->released = ops->shard_params(off, len, nk);
    z->sharded = 1;
    free(off), free(len);
    llama_set_param_wait(model, on_param_wait, z);
  }
  return z;
}

void zero_free(Zero *z) {
  if (!z) return;
  llama_set_grad_hook(z->model, NULL, NULL);
  llama_set_param_wait(z->model, NULL, NULL);
  z->ops->release(z->m);
  z->ops->release(z->v);
  free(z->bucket);
  free(z->fp32_ranges);
  free(z->rows);
  free(z->row_list);
  free(z);
}

// ---- the gradient reduction -------------------------------------------------------------------

// Hands the open bucket to the transport (asynchronous on NCCL).
static void flush_bucket(Zero *z) {
  if (!z->nbucket) return;
  comm_reduce_ranges(z->comm, llama_grads(z->model), z->n, z->bucket, z->nbucket, z->opt.dtype);
  z->nbucket = 0, z->bucket_len = 0;
}

static void add_range(Zero *z, size_t off, size_t len);

// The embedding's gradient is ready: reduce only the rows some rank's tokens touched this step (the
// OR of the ranks' row sets, over TCP while the GPU still runs the backward), packed (comm.h).
static void embedding_ready(Zero *z) {
  comm_allreduce_or_u64(z->comm, z->rows, z->nrows_words);
  const size_t V = z->embed_len / z->embed_dim;
  int k = 0;
  for (size_t r = 0; r < V; r++)
    if (z->rows[r / 64] >> (r % 64) & 1) z->row_list[k++] = (uint32_t)r;
  flush_bucket(z);  // what the backward handed over before goes out first, as it would have
  comm_reduce_rows(z->comm, llama_grads(z->model), z->n, z->embed_off, z->embed_dim, z->row_list, k, z->opt.dtype);
}

// The grad hook: [off, off + len) of the gradients is final for this backward.
static void on_grad_ready(void *ctx, size_t off, size_t len) {
  Zero *z = ctx;
  if (off > z->n || len > z->n - off || z->handed + len > z->n)
    die("zero: the backward reported gradient range [%zu, %zu) of %zu floats after %zu were ready (model/llama.h "
        "grad hook): ranges must tile the buffer once", off, off + len, z->n, z->handed);
  z->handed += len;
  // Sparse only when every micro-batch of the step noted its tokens (the same on every rank: the
  // training loop notes them all), else the whole table.
  if (z->rows && z->notes == z->micros && off == z->embed_off && len == z->embed_len) {
    embedding_ready(z);
    return;
  }
  add_range(z, off, len);
}

// Joins [off, off + len) to the open bucket (merged with a neighbouring range: a tensor's layers
// arrive top down, side by side), which goes out once it holds opt.bucket floats.
static void add_range(Zero *z, size_t off, size_t len) {
  int merged = 0;
  for (int i = 0; i < z->nbucket && !merged; i++) {
    CommRange *b = &z->bucket[i];
    if (b->off == off + len) b->off = off, b->len += len, merged = 1;
    else if (b->off + b->len == off) b->len += len, merged = 1;
  }
  if (!merged) {
    z->bucket = grow_array(z->bucket, z->nbucket, &z->capbucket, sizeof *z->bucket);
    z->bucket[z->nbucket++] = (CommRange){off, len};
  }
  z->bucket_len += len;
  if (z->bucket_len >= z->opt.bucket) flush_bucket(z);
}

void zero_note_tokens(Zero *z, const int *tokens, int N) {
  if (!z->rows) return;
  const size_t V = z->embed_len / z->embed_dim;
  for (int i = 0; i < N; i++)
    if (tokens[i] >= 0 && (size_t)tokens[i] < V) z->rows[tokens[i] / 64] |= 1ull << (tokens[i] % 64);
  z->notes++;
}

void zero_begin_micro(Zero *z, int micro, int accum) {
  if (micro == 0) {
    z->state = ZERO_IDLE;  // a skipped step may have left REDUCED behind
    if (z->rows) memset(z->rows, 0, z->nrows_words * sizeof(uint64_t));
    z->notes = 0;
  }
  z->micros = micro + 1;
  if (!z->opt.overlap || comm_world(z->comm) == 1 || micro != accum - 1) return;
  z->state = ZERO_HOOKED;
  z->handed = 0, z->nbucket = 0, z->bucket_len = 0;
  llama_set_grad_hook(z->model, on_grad_ready, z);
}

void zero_reduce_grads(Zero *z) {
  if (comm_world(z->comm) == 1 || z->state == ZERO_REDUCED) return;
  if (z->state == ZERO_HOOKED) {
    llama_set_grad_hook(z->model, NULL, NULL);
    flush_bucket(z);
    if (z->handed != z->n)
      die("zero: the backward reported %zu of %zu gradient floats ready (model/llama.h grad hook): the rest "
          "would never be reduced", z->handed, z->n);
    comm_reduce_wait(z->comm);
  } else {
    comm_reduce_scatter_sum(z->comm, llama_grads(z->model), z->n, z->opt.dtype);
  }
  z->state = ZERO_REDUCED;
}

int zero_step(Zero *z, const ZeroHyper *h, float lr, int64_t t, float *norm_out) {
  const Ops *op = z->ops;
  float *g = llama_grads(z->model), *p = llama_params(z->model);
  const int world = comm_world(z->comm);
  zero_reduce_grads(z);
  z->state = ZERO_IDLE;
  double sumsq = op->grad_sumsq(g + z->lo, z->hi - z->lo);
  comm_allreduce_sum_f64(z->comm, &sumsq, 1);
  // The sum over ranks of mean gradients, divided by world: the mean (see zero.h).
  float norm = (float)(sqrt(sumsq) / world);
  *norm_out = norm;
  if (!isfinite(norm)) return -1;  // every rank sees the same norm, so every rank skips
  float scale = clip_scale(norm, h->grad_clip) / (float)world;
  for (int i = 0; i < llama_num_tensors(z->model); i++) {
    const ParamTensor *tn = llama_tensor(z->model, i);
    size_t a = tn->offset > z->lo ? tn->offset : z->lo, b = tn->offset + tn->numel;
    if (b > z->hi) b = z->hi;
    if (a >= b) continue;  // this tensor lies outside the shard
    op->adamw(p + a, g + a, z->m + (a - z->lo), z->v + (a - z->lo), b - a, lr, h->beta1, h->beta2, h->eps,
              tn->decay ? h->weight_decay : 0.0f, scale, t);
  }
  if (world > 1 && z->sharded) {
    // The RMSNorm weights in fp32 now (small); then the BF16 copy (adamw wrote the shard's) in
    // stages in the next forward's order: the embedding, block by block, the head. The stages run
    // on the transport's stream while the host goes on to the next step, and each group's first
    // reader waits on the GPU for its stage only (on_param_wait), so the gather of the blocks and
    // the head overlaps the next forward instead of preceding it.
    comm_all_gather_ranges(z->comm, p, z->n, z->fp32_ranges, z->nfp32);
    const int groups = llama_config(z->model)->n_layers + 2;
    size_t off[LLAMA_GROUP_RANGES], len[LLAMA_GROUP_RANGES];
    CommRange r[LLAMA_GROUP_RANGES];
    for (int gi = 0; gi < groups; gi++) {
      int nr = llama_param_group(z->model, gi, off, len);
      for (int i = 0; i < nr; i++) r[i] = (CommRange){off[i], len[i]};
      comm_all_gather_bf16_stage(z->comm, op->params_bf16(), z->n, r, nr, gi);
    }
    op->params_bf16_changed();
  } else if (world > 1) {
    comm_all_gather(z->comm, p, z->n);
    op->params_changed();  // the other ranks' shards arrived as plain fp32 values
  }
  return 0;
}

const float *zero_full_params(Zero *z) {
  if (!z->sharded) return llama_params(z->model);
  float *g = llama_grads(z->model);
  comm_all_gather_to(z->comm, llama_params(z->model), g, z->n);
  return g;
}

// ---- sharded checkpoints ----------------------------------------------------------------------

int zero_file_checksum(const char *path, uint64_t *checksum, uint64_t *bytes, char *err, size_t errlen) {
  enum { CHUNK_BYTES = 64 << 20 };
  FILE *f = fopen(path, "rb");
  if (!f) return set_err(err, errlen, "cannot open '%s': %s", path, strerror(errno));
  unsigned char *buf = xmalloc(CHUNK_BYTES);
  uint64_t hashes[512], total = 0;  // 512 chunks: 32 GiB before folding
  size_t nh = 0, k;
  while ((k = fread(buf, 1, CHUNK_BYTES, f)) > 0) {
    if (nh == 512) hashes[0] = hash64(hashes, sizeof hashes, 1), nh = 1;  // fold to stay bounded
    hashes[nh++] = hash64(buf, k, total);
    total += k;
  }
  int bad = ferror(f);
  fclose(f);
  free(buf);
  if (bad) return set_err(err, errlen, "cannot read '%s': %s", path, strerror(errno));
  *checksum = hash64(hashes, nh * sizeof(uint64_t), total);
  *bytes = total;
  return 0;
}

static int cmp_desc(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

// Steps of dir/manifest_*.txt, newest first; returns the count (*steps malloc'd).
static int list_manifests(const char *dir, int64_t **steps) {
  int n = 0, cap = 16;
  *steps = xmalloc(cap * sizeof(int64_t));
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    long long s;
    char tail[8];
    if (sscanf(e->d_name, "manifest_%lld.%7s", &s, tail) != 2 || strcmp(tail, "txt")) continue;
    if (n == cap) *steps = realloc(*steps, (cap *= 2) * sizeof(int64_t));
    if (!*steps) die("out of memory listing '%s'", dir);
    (*steps)[n++] = s;
  }
  closedir(d);
  qsort(*steps, n, sizeof(int64_t), cmp_desc);
  return n;
}

static void manifest_path(char *out, size_t len, const char *dir, int64_t step) {
  snprintf(out, len, "%s/manifest_%08lld.txt", dir, (long long)step);
}

int zero_manifest_write(const char *dir, const ZeroManifest *m, int keep, char *err, size_t errlen) {
  char path[4096], tmp[4200];
  manifest_path(path, sizeof path, dir, m->step);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return set_err(err, errlen, "cannot create '%s': %s", tmp, strerror(errno));
  size_t dl = strlen(dir);
  fprintf(f, "# sharded checkpoint: shard RANK FILE LO HI BYTES CHECKSUM (dist/zero.h)\n");
  fprintf(f, "step %lld\nworld %d\nn_params %zu\n", (long long)m->step, m->world, m->n);
  for (int r = 0; r < m->world; r++) {
    const ZeroShardFile *s = &m->files[r];
    const char *rel = strncmp(s->path, dir, dl) || s->path[dl] != '/' ? s->path : s->path + dl + 1;
    fprintf(f, "shard %d %s %zu %zu %llu %016llx\n", r, rel, s->lo, s->hi, (unsigned long long)s->bytes,
            (unsigned long long)s->checksum);
  }
  int bad = fflush(f) || fsync(fileno(f));
  if (fclose(f) || bad || rename(tmp, path)) {
    unlink(tmp);
    return set_err(err, errlen, "cannot write '%s': %s", path, strerror(errno));
  }
  if (keep <= 0) return 0;
  int64_t *steps;
  int n = list_manifests(dir, &steps);
  for (int i = keep; i < n; i++) {
    manifest_path(path, sizeof path, dir, steps[i]);
    unlink(path);
  }
  free(steps);
  return 0;
}

int zero_manifest_read(const char *dir, int64_t step, ZeroManifest *m, char *err, size_t errlen) {
  char path[4096], line[4096];
  manifest_path(path, sizeof path, dir, step);
  FILE *f = fopen(path, "r");
  if (!f) return set_err(err, errlen, "cannot open '%s': %s", path, strerror(errno));
  *m = (ZeroManifest){.step = -1};
  int lineno = 0, seen = 0, rc = 0;
  long long v;
  while (!rc && fgets(line, sizeof line, f)) {
    lineno++;
    char file[1024];
    int r;
    size_t lo, hi;
    unsigned long long bytes, sum;
    if (line[0] == '#') continue;
    if (sscanf(line, "step %lld", &v) == 1) m->step = v;
    else if (sscanf(line, "world %lld", &v) == 1 && v >= 1 && v < 1 << 20 && !m->files) {
      m->world = (int)v;
      m->files = xcalloc((size_t)v, sizeof(ZeroShardFile));
    } else if (sscanf(line, "n_params %zu", &m->n) == 1) {
    } else if (sscanf(line, "shard %d %1023s %zu %zu %llu %llx", &r, file, &lo, &hi, &bytes, &sum) == 6 && m->files &&
               r >= 0 && r < m->world) {
      ZeroShardFile *s = &m->files[r];
      snprintf(s->path, sizeof s->path, "%s/%s", dir, file);
      s->lo = lo, s->hi = hi, s->bytes = bytes, s->checksum = sum;
      seen++;
    } else {
      rc = set_err(err, errlen, "%s:%d: cannot parse '%.80s'", path, lineno, line);
    }
  }
  fclose(f);
  if (!rc && (m->step != step || !m->files || seen != m->world))
    rc = set_err(err, errlen, "%s: incomplete (step %lld, world %d, %d shard lines)", path, (long long)m->step,
                 m->world, seen);
  for (int r = 0; !rc && r < m->world; r++)  // the shards must tile [0, n) in rank order
    if (m->files[r].lo != (r ? m->files[r - 1].hi : 0) || m->files[r].hi < m->files[r].lo ||
        (r == m->world - 1 && m->files[r].hi != m->n))
      rc = set_err(err, errlen, "%s: shard %d range [%zu, %zu) does not continue the previous ones", path, r,
                   m->files[r].lo, m->files[r].hi);
  if (rc) zero_manifest_free(m);
  return rc;
}

int zero_manifest_latest(const char *dir, ZeroManifest *m, char *err, size_t errlen) {
  int64_t *steps;
  int n = list_manifests(dir, &steps), found = 1;
  for (int i = 0; i < n && found == 1; i++) {
    char why[1024];
    int bad = zero_manifest_read(dir, steps[i], m, why, sizeof why);
    for (int r = 0; !bad && r < m->world; r++) {
      uint64_t sum, bytes;
      const ZeroShardFile *s = &m->files[r];
      if (zero_file_checksum(s->path, &sum, &bytes, why, sizeof why)) bad = 1;
      else if (bytes != s->bytes || sum != s->checksum)
        bad = set_err(why, sizeof why, "'%s' has %llu bytes and checksum %016llx, the manifest says %llu and %016llx",
                      s->path, (unsigned long long)bytes, (unsigned long long)sum, (unsigned long long)s->bytes,
                      (unsigned long long)s->checksum);
    }
    if (!bad) found = 0;
    else {
      fprintf(stderr, "warning: skipping sharded checkpoint of step %lld: %s\n", (long long)steps[i], why);
      zero_manifest_free(m);
    }
  }
  free(steps);
  (void)err, (void)errlen;
  return found;
}

void zero_manifest_free(ZeroManifest *m) {
  free(m->files);
  m->files = NULL;
}

int zero_load_moments(const ZeroShardFile *src, int nsrc, size_t lo, size_t hi, float *m_out, float *v_out, char *err,
                      size_t errlen) {
  static const char *names[2] = {"adam_m", "adam_v"};
  float *out[2] = {m_out, v_out};
  for (int i = 0; i < nsrc; i++) {
    size_t a = src[i].lo > lo ? src[i].lo : lo, b = src[i].hi < hi ? src[i].hi : hi;
    if (a >= b) continue;  // this file holds none of our range
    if (src[i].lo == lo && src[i].hi == hi) {  // same world size: straight into place
      CkptSection secs[2] = {{"adam_m", m_out, (hi - lo) * sizeof(float)}, {"adam_v", v_out, (hi - lo) * sizeof(float)}};
      if (ckpt_load(src[i].path, secs, 2, NULL, err, errlen)) return -1;
      continue;
    }
    for (int k = 0; k < 2; k++) {
      void *buf;
      size_t bytes;
      if (ckpt_read_section(src[i].path, names[k], &buf, &bytes, err, errlen)) return -1;
      if (bytes != (src[i].hi - src[i].lo) * sizeof(float)) {
        free(buf);
        return set_err(err, errlen, "'%s': section %s has %zu bytes, its shard [%zu, %zu) needs %zu", src[i].path,
                       names[k], bytes, src[i].lo, src[i].hi, (src[i].hi - src[i].lo) * sizeof(float));
      }
      memcpy(out[k] + (a - lo), (float *)buf + (a - src[i].lo), (b - a) * sizeof(float));
      free(buf);
    }
  }
  return 0;
}
