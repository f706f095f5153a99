// model/cuda/attention_cudnn.cpp: causal GQA flash attention through the cuDNN frontend's graph API.
// The project's only C++ file: the frontend is a header-only C++ library, so this file wraps it in
// the plain C API of model/cuda/attention_cudnn.h. One graph is built per (shape, direction,
// determinism, document bucket) the first time it is asked for, then cached; a call after that only
// patches the device pointers into the cached variant pack and enqueues the kernels. With documents
// (block-causal attention) the graph is THD: ragged offsets and a padding mask (attention_cudnn.h),
// built as TransformerEngine builds its packed-sequence graphs (64-bit offsets, ragged lse,
// max_total_seq_len on the backward). The deterministic document backward runs as several graph calls
// over groups of documents (doc_mask_groups), each with its own graph batch and length.
#include "model/cuda/attention_cudnn.h"

#include <cudnn.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

// The frontend headers define a helper they never use; keep -Wall builds of this file clean.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include <cudnn_frontend.h>
#pragma GCC diagnostic pop
#include <exception>
#include <memory>
#include <unordered_map>

#include "common/common.h"
#include "common/cuda_common.h"
#include "model/doc_mask.h"

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// Tensor ids of the variant pack (the frontend's name for the uid -> device pointer map). The
// document graphs add the ragged offsets (q and out share theirs, as k and v do) and lengths.
enum {
  UID_Q = 1,
  UID_K,
  UID_V,
  UID_O,
  UID_STATS,
  UID_DO,
  UID_DQ,
  UID_DK,
  UID_DV,
  UID_OFF_Q,
  UID_OFF_K,
  UID_OFF_V,
  UID_OFF_O,
  UID_OFF_STATS,
  UID_SEQ_Q,
  UID_SEQ_KV
};

struct AttnKey {
  int B, T, H, KV, hd;
  int backward;       // 0: forward graph, 1: backward graph
  int deterministic;  // backward only
  int docs;           // 0: plain causal; else the graph batch b of a document graph (doc_mask_bucket, or
                      // a DocGroup's b for the deterministic backward)
  int S;              // a document graph's sequence length: T, or a DocGroup's S (b * S = B * T)
};

struct CachedGraph {
  AttnKey key;
  std::shared_ptr<fe::graph::Graph> graph;
  std::unordered_map<int64_t, void *> pack;  // keys fixed at build time, so no rehash on the hot path
};

// A training run uses a couple of shapes (train, maybe eval), and with documents a few buckets of
// their count and, for the deterministic backward, its length classes (8 at T = 8192), so a small
// fixed cache suffices; entries are never evicted because a plan may still be running on the
// stream. Heap-allocated, so no C++ destructor runs at exit after the CUDA runtime has been torn down.
enum { MAX_GRAPHS = 64 };

// One instance per backend (attention_cudnn.h): its handle, graphs and workspace.
struct AttnCudnn {
  CachedGraph *graphs[MAX_GRAPHS];
  int n_graphs;
  cudnnHandle_t handle;
  void *workspace;  // shared by all graphs: they run one at a time on one stream
  size_t workspace_size;
  int deterministic_bwd;
  void *docs;  // the ragged offsets and lengths of the current documents (grow-only, like the workspace)
  size_t docs_size;
  // Host memory of the deterministic document backward (grow-only): cu when DocMask.cu_h is NULL, the
  // grouping (doc_mask_groups) and the groups' ragged arrays as they are uploaded into docs.
  int *cu_h, *order;
  DocGroup *groups;
  int docs_cap;  // documents the three above (and `grouped`) have room for
  char *stage;
  size_t stage_size;
  // The grouping of the last document set, kept while the micro-batch's backward runs layer after
  // layer on the same documents: its cu (n_grouped + 1 entries, -1: none), B, T, group count, and
  // the groups' ragged arrays on the device (their own memory: a recomputed forward rewrites docs).
  int *grouped, n_grouped, grouped_B, grouped_T, grouped_H, grouped_KV, grouped_hd, n_groups;
  void *groups_dev;
  size_t groups_dev_size;
};

static const char *key_str(const AttnKey &k) {
  static char buf[192];
  char docs[80] = "";
  if (k.docs && k.S == k.T) snprintf(docs, sizeof docs, " documents (graph batch %d)", k.docs);
  else if (k.docs) snprintf(docs, sizeof docs, " documents of at most %d tokens (graph batch %d)", k.S, k.docs);
  snprintf(buf, sizeof buf, "attention %s B=%d T=%d H=%d KV=%d hd=%d%s%s", k.backward ? "backward" : "forward", k.B,
           k.T, k.H, k.KV, k.hd, k.backward && k.deterministic ? " deterministic" : "", docs);
  return buf;
}

// Every frontend call returns an error_t whose message says what is unsupported; print it with
// the shape, since "not supported" alone does not tell which of the calls above hit it.
#define FE_CHECK(call, key) fe_check((call), #call, (key), __FILE__, __LINE__)
static void fe_check(fe::error_t e, const char *what, const AttnKey &key, const char *file, int line) {
  if (e.is_good()) return;
  die_at(file, line, "cuDNN frontend: %s failed for %s: %s (code %d)", what, key_str(key), e.get_message().c_str(),
         (int)e.get_code());
}

// The graph's batch and sequence length: the sequences, or with documents the graph batch b and
// length S (the bucket of their count and T, or a deterministic backward group's).
static int64_t graph_batch(const AttnKey &k) { return k.docs ? k.docs : k.B; }
static int64_t graph_len(const AttnKey &k) { return k.docs ? k.S : k.T; }

// [B, heads, T, hd] view of a row-major [B, T, heads, hd] BF16 buffer. With documents the same
// strides describe THD ([b, heads, S, hd]): each document's rows start at its ragged offset.
static void set_bshd(fe::graph::Tensor_attributes &t, int64_t uid, const AttnKey &k, int heads) {
  int64_t B = graph_batch(k), T = graph_len(k), n = heads, d = k.hd;
  t.set_uid(uid).set_dim({B, n, T, d}).set_stride({T * n * d, d, n * d, 1}).set_data_type(fe::DataType_t::BFLOAT16);
}

static TensorPtr input_bshd(fe::graph::Graph &g, const char *name, int64_t uid, const AttnKey &k, int heads) {
  fe::graph::Tensor_attributes t;
  t.set_name(name);
  set_bshd(t, uid, k, heads);
  return g.tensor(t);
}

// lse / "Stats": fp32 [B, H, T, 1], i.e. our [B, H, T]. With documents [docs, H, T, 1] over the
// token-major [B*T, H] buffer, ragged like q.
static void set_stats(fe::graph::Tensor_attributes &t, const AttnKey &k) {
  int64_t B = graph_batch(k), H = k.H, T = graph_len(k);
  t.set_uid(UID_STATS).set_dim({B, H, T, 1}).set_data_type(fe::DataType_t::FLOAT);
  if (k.docs) t.set_stride({H * T, 1, H, 1});
  else t.set_stride({H * T, T, 1, 1});
}

// A 4D [n, 1, 1, 1] index tensor: the ragged offsets (int64, n = graph batch + 1) and lengths (int32).
static TensorPtr index_tensor(fe::graph::Graph &g, const char *name, int64_t uid, int64_t n, fe::DataType_t type) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({n, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(type));
}

// The document graph's extra inputs: ragged offsets of q/out, k, v and lse, and the lengths.
struct Ragged {
  TensorPtr q, k, v, o, stats, seq_q, seq_kv;
};

static Ragged ragged_inputs(fe::graph::Graph &g, const AttnKey &k) {
  const int64_t nb = k.docs;
  const fe::DataType_t i64 = fe::DataType_t::INT64, i32 = fe::DataType_t::INT32;
  return Ragged{
      index_tensor(g, "off_q", UID_OFF_Q, nb + 1, i64),       index_tensor(g, "off_k", UID_OFF_K, nb + 1, i64),
      index_tensor(g, "off_v", UID_OFF_V, nb + 1, i64),       index_tensor(g, "off_o", UID_OFF_O, nb + 1, i64),
      index_tensor(g, "off_lse", UID_OFF_STATS, nb + 1, i64), index_tensor(g, "seq_q", UID_SEQ_Q, nb, i32),
      index_tensor(g, "seq_kv", UID_SEQ_KV, nb, i32)};
}

static void ensure_handle(AttnCudnn *a) {
  if (!a->handle) CUDNN_CHECK(cudnnCreate(&a->handle));
}

static void build_graph(AttnCudnn *a, CachedGraph *c) {
  const AttnKey &k = c->key;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const float scale = 1.0f / sqrtf((float)k.hd);
  TensorPtr q = input_bshd(*g, "q", UID_Q, k, k.H), kk = input_bshd(*g, "k", UID_K, k, k.KV),
            v = input_bshd(*g, "v", UID_V, k, k.KV);
  Ragged r{};
  if (k.docs) {  // each document a sequence of the batch: ragged rows, its length as the padding mask
    r = ragged_inputs(*g, k);
    q->set_ragged_offset(r.q);
    kk->set_ragged_offset(r.k);
    v->set_ragged_offset(r.v);
  }
  if (!k.backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("attention_fwd")
                    .set_generate_stats(true)  // training: the backward needs the lse
                    .set_attn_scale(scale)
                    .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)  // causal: key j <= query t
                    .set_diagonal_band_right_bound(0);
    if (k.docs) opts.set_padding_mask(true).set_seq_len_q(r.seq_q).set_seq_len_kv(r.seq_kv);
    auto [o, stats] = g->sdpa(q, kk, v, opts);
    o->set_output(true).set_name("out");
    set_bshd(*o, UID_O, k, k.H);
    stats->set_output(true).set_name("lse");
    set_stats(*stats, k);
    if (k.docs) o->set_ragged_offset(r.o), stats->set_ragged_offset(r.stats);
  } else {
    TensorPtr o = input_bshd(*g, "out", UID_O, k, k.H), dout = input_bshd(*g, "dout", UID_DO, k, k.H);
    fe::graph::Tensor_attributes st;
    st.set_name("lse");
    set_stats(st, k);
    TensorPtr stats = g->tensor(st);
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("attention_bwd")
                    .set_attn_scale(scale)
                    .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                    .set_diagonal_band_right_bound(0)
                    .set_deterministic_algorithm(k.deterministic != 0);
    if (k.docs) {
      o->set_ragged_offset(r.o), dout->set_ragged_offset(r.o), stats->set_ragged_offset(r.stats);
      // The tokens in all: sizes the frontend's ragged fp32 buffers (dQ accumulator, softmax sums),
      // which it addresses with the same offsets, by them instead of graph batch x S. A group's
      // offsets reach any row of the micro-batch, so this is B*T for groups too.
      const int64_t tokens = (int64_t)k.B * k.T;
      opts.set_padding_mask(true).set_seq_len_q(r.seq_q).set_seq_len_kv(r.seq_kv);
      opts.set_max_total_seq_len_q(tokens).set_max_total_seq_len_kv(tokens);
    }
    auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dout, stats, opts);
    dq->set_output(true).set_name("dq");
    set_bshd(*dq, UID_DQ, k, k.H);
    dk->set_output(true).set_name("dk");
    set_bshd(*dk, UID_DK, k, k.KV);
    dv->set_output(true).set_name("dv");
    set_bshd(*dv, UID_DV, k, k.KV);
    if (k.docs) dq->set_ragged_offset(r.q), dk->set_ragged_offset(r.k), dv->set_ragged_offset(r.v);
  }

  // Heuristics mode A ranks the engines; FALLBACK adds engines that always exist, in case none of
  // A's candidates supports the graph. build_plans then keeps the first candidate that builds.
  FE_CHECK(g->validate(), k);
  FE_CHECK(g->build_operation_graph(a->handle), k);
  FE_CHECK(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), k);
  FE_CHECK(g->check_support(), k);
  FE_CHECK(g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), k);

  int64_t ws = 0;
  FE_CHECK(g->get_workspace_size(ws), k);
  if ((size_t)ws > a->workspace_size) {  // grow-only; only ever happens while building a graph
    if (a->workspace) {
      CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));  // earlier plans may still read the old one
      CUDA_CHECK(cudaFree(a->workspace));
    }
    cudaError_t e = cudaMalloc(&a->workspace, (size_t)ws);
    if (e != cudaSuccess)
      die("%s: cannot allocate its %.1f MiB cuDNN workspace: %s. %s", key_str(k), ws / 1048576.0, cudaGetErrorString(e),
          k.backward && k.deterministic
              ? "The deterministic backward writes dP to it (graph batch x H x length^2 x 2 bytes): set "
                "parallel.deterministic: false (the fast backward needs little), or shorten batch.seq_len or "
                "batch.micro_batch"
              : "Shorten batch.seq_len or batch.micro_batch, or free device memory");
    a->workspace_size = (size_t)ws;
  }

  const int64_t uids_fwd[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS};
  const int64_t uids_bwd[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV};
  const int64_t uids_docs[] = {UID_OFF_Q, UID_OFF_K, UID_OFF_V, UID_OFF_O, UID_OFF_STATS, UID_SEQ_Q, UID_SEQ_KV};
  const int64_t *uids = k.backward ? uids_bwd : uids_fwd;
  int n = k.backward ? 9 : 5;
  for (int i = 0; i < n; i++) c->pack[uids[i]] = nullptr;
  if (k.docs)
    for (int i = 0; i < 7; i++) c->pack[uids_docs[i]] = nullptr;
  c->graph = g;
}

static CachedGraph *get_graph(AttnCudnn *a, const AttnKey &k) {
  for (int i = 0; i < a->n_graphs; i++) {
    const AttnKey &c = a->graphs[i]->key;
    if (c.B == k.B && c.T == k.T && c.H == k.H && c.KV == k.KV && c.hd == k.hd && c.backward == k.backward &&
        c.deterministic == k.deterministic && c.docs == k.docs && c.S == k.S)
      return a->graphs[i];
  }
  if (a->n_graphs == MAX_GRAPHS)
    die("%s: more than %d distinct attention a->graphs requested; raise MAX_GRAPHS in model/cuda/attention_cudnn.cpp",
        key_str(k), MAX_GRAPHS);
  ensure_handle(a);
  CachedGraph *c = new CachedGraph();
  c->key = k;
  try {  // the frontend reports errors through error_t, but a few paths (allocation) throw
    build_graph(a, c);
  } catch (const std::exception &e) {
    die("%s: building the cuDNN graph threw: %s", key_str(k), e.what());
  }
  a->graphs[a->n_graphs++] = c;
  return c;
}

static void check_shape(const AttnKey &k) {
  if (k.B <= 0 || k.T <= 0 || k.H <= 0 || k.KV <= 0 || k.hd <= 0) die("%s: every size must be positive", key_str(k));
  if (k.H % k.KV != 0) die("%s: H=%d query heads is not a multiple of KV=%d kv heads", key_str(k), k.H, k.KV);
  if (k.hd % 8 != 0 || k.hd > 256)
    die("%s: head dim hd=%d must be a multiple of 8 and at most 256 (cuDNN flash attention)", key_str(k), k.hd);
}

// cuDNN's kernels move q/k/v/out/dq/dk/dv with 16-byte vector and TMA loads.
static void check_ptr(const AttnKey &k, const void *p, const char *name, unsigned align) {
  if (!p) die("%s: %s is NULL", key_str(k), name);
  if ((uintptr_t)p % align != 0) die("%s: %s = %p is not %u-byte aligned", key_str(k), name, p, align);
}

static void run(AttnCudnn *a, CachedGraph *c) {
  CUDNN_CHECK(cudnnSetStream(a->handle, cuda_stream()));  // cheap; the backend may have switched streams
  FE_CHECK(c->graph->execute(a->handle, c->pack, a->workspace), c->key);
}

// One tensor of a call: its variant-pack id, pointer, name (for errors) and required alignment.
struct Arg {
  int64_t uid;
  const void *p;
  const char *name;
  unsigned align;
};

// A document graph's checks: boundaries present, a plausible count, a cuDNN with ragged lse.
static void check_docs(const AttnKey &key, const DocMask *d) {
  if (!d->cu || !d->start) die("%s: the DocMask has no document boundaries (cu, start)", key_str(key));
  if (d->n_docs < key.B || d->n_docs > key.B * key.T)
    die("%s: %d documents in %d rows of %d tokens: a row holds 1 to T documents", key_str(key), d->n_docs, key.B,
        key.T);
  if (cudnnGetVersion() < 90600)
    die("%s: document masking on CUDA needs cuDNN 9.6 or newer (ragged lse); this process loaded cuDNN %zu",
        key_str(key), (size_t)cudnnGetVersion());
}

// The ragged description of a graph batch of nb entries, as laid out in the instance's scratch (and,
// for the deterministic backward's groups, in its host stage): off_q (q and out), off_kv (k and v) and
// off_lse, nb + 1 each, then the lengths (seq_q and seq_kv), each array 256-byte aligned.
struct RaggedArrays {
  int64_t *off_q, *off_kv, *off_lse;
  int32_t *len;
};

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }
static size_t ragged_bytes(int nb) { return 3 * align256((size_t)(nb + 1) * 8) + align256((size_t)nb * 4); }

static RaggedArrays ragged_at(char *base, int nb) {
  const size_t offs = align256((size_t)(nb + 1) * 8);
  return RaggedArrays{(int64_t *)base, (int64_t *)(base + offs), (int64_t *)(base + 2 * offs),
                      (int32_t *)(base + 3 * offs)};
}

// The variant-pack entries of a ragged description.
static void ragged_pack(const RaggedArrays &r, Arg *args) {
  const Arg e[] = {{UID_OFF_Q, r.off_q, "off_q", 8},         {UID_OFF_O, r.off_q, "off_o", 8},
                   {UID_OFF_K, r.off_kv, "off_k", 8},        {UID_OFF_V, r.off_kv, "off_v", 8},
                   {UID_OFF_STATS, r.off_lse, "off_lse", 8}, {UID_SEQ_Q, r.len, "seq_q", 4},
                   {UID_SEQ_KV, r.len, "seq_kv", 4}};
  for (int i = 0; i < 7; i++) args[i] = e[i];
}

// Grow-only device memory *p of *size bytes, at least `need`: the old block may still be read by queued
// plans, so it is freed after a sync.
static char *grow_dev(void **p, size_t *size, size_t need) {
  if (need > *size) {
    if (*p) {
      CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
      CUDA_CHECK(cudaFree(*p));
    }
    CUDA_CHECK(cudaMalloc(p, need));
    *size = need;
  }
  return (char *)*p;
}

// The instance's device scratch for ragged descriptions, at least `need` bytes.
static char *docs_scratch(AttnCudnn *a, size_t need) { return grow_dev(&a->docs, &a->docs_size, need); }

// The document graph's offsets and lengths for this call, in the instance's scratch, derived on the
// device from docs->cu. Sets the graph batch (the bucket of the count) and length T in key.
static void ragged_args(AttnCudnn *a, AttnKey *key, const DocMask *d, Arg *args) {
  check_docs(*key, d);
  const int nb = key->docs = doc_mask_bucket(d->n_docs);
  key->S = key->T;
  RaggedArrays r = ragged_at(docs_scratch(a, ragged_bytes(nb)), nb);
  attention_docs_ragged_cuda(d->cu, d->n_docs, nb, (int64_t)key->H * key->hd, (int64_t)key->KV * key->hd, key->H,
                             r.off_q, r.off_kv, r.off_lse, r.len);
  ragged_pack(r, args);
}

// Runs the graph of `key` on these tensors (and extra: a ragged description).
static void run_graph(AttnCudnn *a, const AttnKey &key, const Arg *args, int n, const Arg *extra, int n_extra) {
  CachedGraph *c = get_graph(a, key);
  for (int i = 0; i < n; i++) c->pack[args[i].uid] = (void *)args[i].p;
  for (int i = 0; i < n_extra; i++) c->pack[extra[i].uid] = (void *)extra[i].p;
  run(a, c);
}

// Checks the shape and every pointer, then runs the graph of `key` on these tensors (and, with
// documents, on their ragged description).
static void run_call(AttnCudnn *a, AttnKey key, const DocMask *docs, const Arg *args, int n) {
  check_shape(key);
  for (int i = 0; i < n; i++) check_ptr(key, args[i].p, args[i].name, args[i].align);
  Arg extra[7];
  int n_extra = 0;
  if (docs) ragged_args(a, &key, docs, extra), n_extra = 7;
  run_graph(a, key, args, n, extra, n_extra);
}

// The deterministic backward over documents. One graph of doc_mask_bucket(n_docs) entries of T tokens
// would need a dP workspace of 32 x plain causal's or more (attention_cudnn.h), so it runs one graph
// call per group of doc_mask_groups (model/doc_mask.c): graph batch b, length S, b * S = B * T, hence
// each within plain causal's workspace. A group's offsets point at its documents' own rows of the
// same q/k/v/out/dout/lse and dq/dk/dv (increasing, not contiguous: the other documents lie between),
// so nothing is gathered or scattered, and as every document is in exactly one group each row of
// dq/dk/dv is written once. The grouping is plain C on the host (from DocMask.cu_h); all groups' ragged
// arrays are built in the host stage and go to their own device memory in one stream-ordered copy,
// once per document set (the layers of a micro-batch reuse them). That copy may overwrite arrays that
// the last micro-batch's plans read: safe, since every plan and the copy are queued on cuda_stream(),
// which runs the copy after them. And cudaMemcpyAsync from pageable memory (the stage is plain
// malloc'd) returns only once the source has been staged, so the stage may be rewritten later.
static void bwd_doc_groups(AttnCudnn *a, AttnKey key, const DocMask *d, const Arg *args, int n) {
  check_shape(key);
  for (int i = 0; i < n; i++) check_ptr(key, args[i].p, args[i].name, args[i].align);
  key.S = key.T;  // for the messages until a group sets its own
  check_docs(key, d);
  const int nd = d->n_docs;
  if (nd > a->docs_cap) {  // grow-only host memory, none of it read by the device
    free(a->cu_h), free(a->order), free(a->groups), free(a->grouped);
    a->cu_h = (int *)xmalloc(((size_t)nd + 1) * sizeof(int));
    a->order = (int *)xmalloc((size_t)nd * sizeof(int));
    a->groups = (DocGroup *)xmalloc((size_t)nd * sizeof(DocGroup));
    a->grouped = (int *)xmalloc(((size_t)nd + 1) * sizeof(int));
    a->docs_cap = nd, a->n_grouped = -1;
  }
  const int *cu = d->cu_h;
  if (!cu) {  // the caller keeps no host copy: download it (a sync)
    CUDA_CHECK(cudaMemcpyAsync(a->cu_h, d->cu, ((size_t)nd + 1) * sizeof(int), cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    cu = a->cu_h;
  }
  // Every layer of a micro-batch has the same documents: group them and upload the groups' arrays
  // once (a copy from pageable memory waits for the stream: once per micro-batch, not per layer).
  const size_t cu_bytes = ((size_t)nd + 1) * sizeof(int);
  // (keyed by the heads too: the offsets are in elements of q, k, v and lse rows)
  if (a->n_grouped != nd || a->grouped_B != key.B || a->grouped_T != key.T || a->grouped_H != key.H ||
      a->grouped_KV != key.KV || a->grouped_hd != key.hd || memcmp(a->grouped, cu, cu_bytes)) {
    a->n_groups = doc_mask_groups(cu, nd, key.B, key.T, a->order, a->groups);
    size_t need = 0;
    for (int g = 0; g < a->n_groups; g++) need += ragged_bytes(a->groups[g].b);
    if (need > a->stage_size) {
      free(a->stage);
      a->stage = (char *)xmalloc(need);
      a->stage_size = need;
    }
    const int64_t q_row = (int64_t)key.H * key.hd, kv_row = (int64_t)key.KV * key.hd;
    size_t at = 0;
    for (int g = 0; g < a->n_groups; g++) {
      RaggedArrays h = ragged_at(a->stage + at, a->groups[g].b);
      doc_mask_group_ragged(cu, nd, a->order, &a->groups[g], q_row, kv_row, key.H, h.off_q, h.off_kv, h.off_lse, h.len);
      at += ragged_bytes(a->groups[g].b);
    }
    grow_dev(&a->groups_dev, &a->groups_dev_size, need);
    CUDA_CHECK(cudaMemcpyAsync(a->groups_dev, a->stage, need, cudaMemcpyHostToDevice, cuda_stream()));
    memcpy(a->grouped, cu, cu_bytes);
    a->n_grouped = nd, a->grouped_B = key.B, a->grouped_T = key.T;
    a->grouped_H = key.H, a->grouped_KV = key.KV, a->grouped_hd = key.hd;
  }
  size_t at = 0;
  for (int g = 0; g < a->n_groups; g++) {
    key.docs = a->groups[g].b, key.S = a->groups[g].S;
    Arg extra[7];
    ragged_pack(ragged_at((char *)a->groups_dev + at, key.docs), extra);
    run_graph(a, key, args, n, extra, 7);
    at += ragged_bytes(key.docs);
  }
}

extern "C" void attention_cudnn_fwd(AttnCudnn *a, void *out, float *lse, const void *q, const void *k, const void *v,
                                    const DocMask *docs, int B, int T, int H, int KV, int hd) {
  const Arg args[] = {{UID_Q, q, "q", 16},
                      {UID_K, k, "k", 16},
                      {UID_V, v, "v", 16},
                      {UID_O, out, "out", 16},
                      {UID_STATS, lse, "lse", 4}};
  run_call(a, AttnKey{B, T, H, KV, hd, 0, 0, 0, T}, docs, args, 5);
}

extern "C" void attention_cudnn_bwd(AttnCudnn *a, void *dq, void *dk, void *dv, const void *dout, const void *q,
                                    const void *k, const void *v, const void *out, const float *lse,
                                    const DocMask *docs, int B, int T, int H, int KV, int hd) {
  const Arg args[] = {{UID_Q, q, "q", 16},     {UID_K, k, "k", 16},        {UID_V, v, "v", 16},
                      {UID_O, out, "out", 16}, {UID_DO, dout, "dout", 16}, {UID_DQ, dq, "dq", 16},
                      {UID_DK, dk, "dk", 16},  {UID_DV, dv, "dv", 16},     {UID_STATS, lse, "lse", 4}};
  const AttnKey key{B, T, H, KV, hd, 1, a->deterministic_bwd, 0, T};
  if (docs && a->deterministic_bwd) bwd_doc_groups(a, key, docs, args, 9);
  else run_call(a, key, docs, args, 9);
}

extern "C" size_t attention_cudnn_version(void) { return cudnnGetVersion(); }

extern "C" void attention_cudnn_set_deterministic(AttnCudnn *a, int on) { a->deterministic_bwd = on != 0; }

extern "C" size_t attention_cudnn_workspace_bytes(const AttnCudnn *a) { return a->workspace_size; }

extern "C" AttnCudnn *attention_cudnn_create(void) { return new AttnCudnn(); }

extern "C" void attention_cudnn_destroy(AttnCudnn *a) {
  if (!a) return;
  if (a->n_graphs > 0 || a->workspace) CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  for (int i = 0; i < a->n_graphs; i++) delete a->graphs[i];
  if (a->workspace) CUDA_CHECK(cudaFree(a->workspace));
  if (a->docs) CUDA_CHECK(cudaFree(a->docs));
  if (a->groups_dev) CUDA_CHECK(cudaFree(a->groups_dev));
  free(a->cu_h), free(a->order), free(a->groups), free(a->stage), free(a->grouped);
  if (a->handle) CUDNN_CHECK(cudnnDestroy(a->handle));
  delete a;
}
