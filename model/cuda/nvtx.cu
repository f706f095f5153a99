// model/cuda/nvtx.cu: NVTX ranges around each op of the CUDA backend's table (logging.nvtx), so that
// an Nsight Systems timeline shows each kernel under the op that launched it, named as in the
// per-kernel table ("rmsnorm fwd", "attention bwd", "matmul fwd q", ...), inside the graph's block
// ranges ("block 3 fwd", model/llama.c, through the table's range_push and range_pop).
//
// cuda_nvtx_wrap keeps the instance's table as it is (nvtx_inner) and points each entry that queues
// GPU work at a wrapper: push the range, call the kept entry, pop. The wrappers are generated from
// the entries' own types, so an op whose signature changes needs nothing here; a new op gets its
// range by a line in RANGED_OPS. With logging.nvtx off (the default) nothing is wrapped: the table
// is the plain one and range_push is NULL. NVTX3 is header-only; without a profiler attached a push
// is a test of a function pointer.
#include <nvtx3/nvToolsExt.h>

#include "model/cuda/ops_cuda.h"

namespace {

struct Range {
  explicit Range(const char *name) { nvtxRangePushA(name); }
  ~Range() { nvtxRangePop(); }
};

const Ops &inner(void *ctx) { return ((CudaBackend *)ctx)->nvtx_inner; }

template <typename F>
struct Ranged;
// An entry R (*)(void *ctx, A...): call<M, Name> is the same entry inside a range named Name.
template <typename R, typename... A>
struct Ranged<R (*)(void *, A...)> {
  template <R (*Ops::*M)(void *, A...), const char *Name>
  static R call(void *ctx, A... a) {
    Range r(Name);
    return (inner(ctx).*M)(ctx, a...);
  }
  // The linear entries (first argument a LinearId): the range is named by the layer kind.
  template <R (*Ops::*M)(void *, A...), const char *const *Names>
  static R call_linear(void *ctx, A... a) {
    Range r(Names[linear_kind(a...)]);
    return (inner(ctx).*M)(ctx, a...);
  }
  template <typename... Rest>
  static int linear_kind(LinearId id, Rest...) {
    return (unsigned)id.kind < LIN_NKINDS ? id.kind : LIN_NKINDS;
  }
};

// The entries that queue GPU work, with their ranges' names (the profiler's, where it has the op).
// clang-format off
#define RANGED_OPS(X)                                                                                   \
  X(zero, "zero") X(upload, "upload") X(download, "download") X(acts_to_f32, "acts to f32")             \
  X(sync, "sync") X(params_changed, "params to bf16") X(params_bf16_changed, "params bf16 changed")      \
  X(grad_sumsq, "grad sumsq") X(adamw, "adamw") X(embed_fwd, "embed fwd") X(embed_bwd, "embed bwd")     \
  X(rmsnorm_fwd, "rmsnorm fwd") X(rmsnorm_bwd, "rmsnorm bwd") X(rmsnorm_fwd_into, "rmsnorm fwd")        \
  X(rope_fwd, "rope fwd") X(rope_bwd, "rope bwd") X(attention_fwd, "attention fwd")                     \
  X(attention_bwd, "attention bwd") X(swiglu_fwd, "swiglu fwd") X(swiglu_fwd_into, "swiglu fwd")        \
  X(swiglu_bwd, "swiglu bwd") X(residual_fwd, "residual")                                               \
  X(head_ce, "head ce") X(head_nll, "head nll")
// clang-format on

#define NAME(field, name) constexpr char name_##field[] = name;
RANGED_OPS(NAME)
#undef NAME

constexpr const char *MATMUL_FWD[LIN_NKINDS + 1] = {"matmul fwd q",    "matmul fwd k",    "matmul fwd v",
                                                    "matmul fwd o",    "matmul fwd gate", "matmul fwd up",
                                                    "matmul fwd down", "matmul fwd head", "matmul fwd"};
constexpr const char *MATMUL_RES_FWD[LIN_NKINDS + 1] = {
    "matmul+residual fwd q",    "matmul+residual fwd k",    "matmul+residual fwd v",
    "matmul+residual fwd o",    "matmul+residual fwd gate", "matmul+residual fwd up",
    "matmul+residual fwd down", "matmul+residual fwd head", "matmul+residual fwd"};
constexpr const char *MATMUL_SWIGLU_FWD[LIN_NKINDS + 1] = {
    "matmul+swiglu fwd q",    "matmul+swiglu fwd k",    "matmul+swiglu fwd v",
    "matmul+swiglu fwd o",    "matmul+swiglu fwd gate", "matmul+swiglu fwd up",
    "matmul+swiglu fwd down", "matmul+swiglu fwd head", "matmul+swiglu fwd"};
constexpr const char *MATMUL_BWD[LIN_NKINDS + 1] = {"matmul bwd q",    "matmul bwd k",    "matmul bwd v",
                                                    "matmul bwd o",    "matmul bwd gate", "matmul bwd up",
                                                    "matmul bwd down", "matmul bwd head", "matmul bwd"};

void range_push(void *ctx, const char *name) { nvtxRangePushA(name); }
void range_pop(void *ctx) { nvtxRangePop(); }

}  // namespace

void cuda_nvtx_wrap(CudaBackend *b) {
  Ops *t = &b->ops;
  if (t->range_push) return;  // already wrapped
  b->nvtx_inner = *t;
#define WRAP(field, name) \
  if (t->field) t->field = Ranged<decltype(t->field)>::call<&Ops::field, name_##field>;
  RANGED_OPS(WRAP)
#undef WRAP
  if (t->matmul_fwd) t->matmul_fwd = Ranged<decltype(t->matmul_fwd)>::call_linear<&Ops::matmul_fwd, MATMUL_FWD>;
  if (t->matmul_residual_fwd)
    t->matmul_residual_fwd =
        Ranged<decltype(t->matmul_residual_fwd)>::call_linear<&Ops::matmul_residual_fwd, MATMUL_RES_FWD>;
  if (t->matmul_swiglu_fwd)
    t->matmul_swiglu_fwd =
        Ranged<decltype(t->matmul_swiglu_fwd)>::call_linear<&Ops::matmul_swiglu_fwd, MATMUL_SWIGLU_FWD>;
  if (t->matmul_bwd) t->matmul_bwd = Ranged<decltype(t->matmul_bwd)>::call_linear<&Ops::matmul_bwd, MATMUL_BWD>;
  t->range_push = range_push;
  t->range_pop = range_pop;
}
