// model/cuda/attention_cudnn.cpp: causal GQA flash attention through the cuDNN frontend's graph API.
// The project's only C++ file: the frontend is a header-only C++ library, so this file wraps it in
// the plain C API of model/cuda/attention_cudnn.h. One graph is built per (shape, direction,
// determinism) the first time it is asked for, then cached; a call after that only patches the
// device pointers into the cached variant pack and enqueues the kernels.
#include "model/cuda/attention_cudnn.h"

#include <cudnn.h>
#include <math.h>
#include <stdint.h>

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

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// Tensor ids of the variant pack (the frontend's name for the uid -> device pointer map).
enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

struct AttnKey {
  int B, T, H, KV, hd;
  int backward;       // 0: forward graph, 1: backward graph
  int deterministic;  // backward only
};

struct CachedGraph {
  AttnKey key;
  std::shared_ptr<fe::graph::Graph> graph;
  std::unordered_map<int64_t, void *> pack;  // keys fixed at build time, so no rehash on the hot path
};

// A training run uses a couple of shapes (train, maybe eval), so a small fixed cache suffices;
// entries are never evicted because a plan may still be running on the stream. Heap-allocated, so
// no C++ destructor runs at exit after the CUDA runtime has been torn down.
enum { MAX_GRAPHS = 32 };

// One instance per backend (attention_cudnn.h): its handle, graphs and workspace.
struct AttnCudnn {
  CachedGraph *graphs[MAX_GRAPHS];
  int n_graphs;
  cudnnHandle_t handle;
  void *workspace;  // shared by all graphs: they run one at a time on one stream
  size_t workspace_size;
  int deterministic_bwd;
};

static const char *key_str(const AttnKey &k) {
  static char buf[160];
  snprintf(buf, sizeof buf, "attention %s B=%d T=%d H=%d KV=%d hd=%d%s", k.backward ? "backward" : "forward", k.B, k.T,
           k.H, k.KV, k.hd, k.backward && k.deterministic ? " deterministic" : "");
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

// [B, heads, T, hd] view of a row-major [B, T, heads, hd] BF16 buffer.
static void set_bshd(fe::graph::Tensor_attributes &t, int64_t uid, const AttnKey &k, int heads) {
  int64_t B = k.B, T = k.T, n = heads, d = k.hd;
  t.set_uid(uid).set_dim({B, n, T, d}).set_stride({T * n * d, d, n * d, 1}).set_data_type(fe::DataType_t::BFLOAT16);
}

static TensorPtr input_bshd(fe::graph::Graph &g, const char *name, int64_t uid, const AttnKey &k, int heads) {
  fe::graph::Tensor_attributes t;
  t.set_name(name);
  set_bshd(t, uid, k, heads);
  return g.tensor(t);
}

// lse / "Stats": fp32 [B, H, T, 1], i.e. our [B, H, T].
static void set_stats(fe::graph::Tensor_attributes &t, const AttnKey &k) {
  int64_t B = k.B, H = k.H, T = k.T;
  t.set_uid(UID_STATS).set_dim({B, H, T, 1}).set_stride({H * T, T, 1, 1}).set_data_type(fe::DataType_t::FLOAT);
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
  if (!k.backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("attention_fwd")
                    .set_generate_stats(true)  // training: the backward needs the lse
                    .set_attn_scale(scale)
                    .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)  // causal: key j <= query t
                    .set_diagonal_band_right_bound(0);
    auto [o, stats] = g->sdpa(q, kk, v, opts);
    o->set_output(true).set_name("out");
    set_bshd(*o, UID_O, k, k.H);
    stats->set_output(true).set_name("lse");
    set_stats(*stats, k);
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
    auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dout, stats, opts);
    dq->set_output(true).set_name("dq");
    set_bshd(*dq, UID_DQ, k, k.H);
    dk->set_output(true).set_name("dk");
    set_bshd(*dk, UID_DK, k, k.KV);
    dv->set_output(true).set_name("dv");
    set_bshd(*dv, UID_DV, k, k.KV);
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
      die("%s: cannot allocate its %.1f MiB cuDNN workspace: %s", key_str(k), ws / 1048576.0, cudaGetErrorString(e));
    a->workspace_size = (size_t)ws;
  }

  const int64_t uids_fwd[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS};
  const int64_t uids_bwd[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV};
  const int64_t *uids = k.backward ? uids_bwd : uids_fwd;
  int n = k.backward ? 9 : 5;
  for (int i = 0; i < n; i++) c->pack[uids[i]] = nullptr;
  c->graph = g;
}

static CachedGraph *get_graph(AttnCudnn *a, const AttnKey &k) {
  for (int i = 0; i < a->n_graphs; i++) {
    const AttnKey &c = a->graphs[i]->key;
    if (c.B == k.B && c.T == k.T && c.H == k.H && c.KV == k.KV && c.hd == k.hd && c.backward == k.backward &&
        c.deterministic == k.deterministic)
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

// Checks the shape and every pointer, then runs the graph of `key` on these tensors.
static void run_call(AttnCudnn *a, const AttnKey &key, const Arg *args, int n) {
  check_shape(key);
  for (int i = 0; i < n; i++) check_ptr(key, args[i].p, args[i].name, args[i].align);
  CachedGraph *c = get_graph(a, key);
  for (int i = 0; i < n; i++) c->pack[args[i].uid] = (void *)args[i].p;
  run(a, c);
}

extern "C" void attention_cudnn_fwd(AttnCudnn *a, void *out, float *lse, const void *q, const void *k, const void *v,
                                    int B, int T, int H, int KV, int hd) {
  const Arg args[] = {{UID_Q, q, "q", 16},
                      {UID_K, k, "k", 16},
                      {UID_V, v, "v", 16},
                      {UID_O, out, "out", 16},
                      {UID_STATS, lse, "lse", 4}};
  run_call(a, AttnKey{B, T, H, KV, hd, 0, 0}, args, 5);
}

extern "C" void attention_cudnn_bwd(AttnCudnn *a, void *dq, void *dk, void *dv, const void *dout, const void *q,
                                    const void *k, const void *v, const void *out, const float *lse, int B, int T,
                                    int H, int KV, int hd) {
  const Arg args[] = {{UID_Q, q, "q", 16},     {UID_K, k, "k", 16},        {UID_V, v, "v", 16},
                      {UID_O, out, "out", 16}, {UID_DO, dout, "dout", 16}, {UID_DQ, dq, "dq", 16},
                      {UID_DK, dk, "dk", 16},  {UID_DV, dv, "dv", 16},     {UID_STATS, lse, "lse", 4}};
  run_call(a, AttnKey{B, T, H, KV, hd, 1, a->deterministic_bwd}, args, 9);
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
  if (a->handle) CUDNN_CHECK(cudnnDestroy(a->handle));
  delete a;
}
