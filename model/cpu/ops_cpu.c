// model/cpu/ops_cpu.c: the CPU backend's operations table: host memory, fp32 activations, and thin
// void* -> float* wrappers over the reference ops (calling through a mismatched function pointer
// type would be undefined behaviour, hence the wrappers rather than casts).
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/adamw.h"
#include "model/cpu/linear_fp4.h"
#include "model/ops.h"

static void *cpu_alloc(void *ctx, size_t bytes) { return xcalloc(1, bytes); }
static void cpu_release(void *ctx, void *p) { free(p); }
static void cpu_zero(void *ctx, void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void cpu_acts_to_f32(void *ctx, float *dst, const void *src, size_t n) { memcpy(dst, src, n * sizeof(float)); }

static void cpu_sync(void *ctx) {}
static void cpu_bind_params(void *ctx, float *params, size_t n) {}
static void cpu_params_changed(void *ctx) {}
// The CPU backend's state (Ops.ctx): the table itself and the settings its ops read.
typedef struct {
  Ops ops;
  int grad_overwrite;  // Ops.set_grad_overwrite
  LinearFp4Cpu lin;    // the precision recipe of the linear layers (set_recipe, set_step)
} CpuBackend;

static void cpu_set_step(void *ctx, int64_t step, int micro) {
  if (step < 0 || step > (int64_t)UINT32_MAX || micro < 0)
    die("set_step(step=%lld, micro=%d): step must be in [0, 2^32) and micro >= 0 (the Philox counter words)",
        (long long)step, micro);
  LinearFp4Cpu *L = &((CpuBackend *)ctx)->lin;
  L->step = (uint32_t)step, L->micro = (uint32_t)micro;
}

static void cpu_set_recipe(void *ctx, const Recipe *r, int n_layers, uint64_t seed) {
  LinearFp4Cpu *L = &((CpuBackend *)ctx)->lin;
  char err[512];
  if (r && recipe_check(r, err, sizeof err)) die("cpu set_recipe: %s", err);
  if (r && recipe_check_layers(r, n_layers, err, sizeof err)) die("cpu set_recipe: %s", err);
  memset(&L->r, 0, sizeof L->r);
  if (r) L->r = *r;
  else L->r.format = FMT_BF16;
  L->nlayers = n_layers, L->seed = seed;
}

// Ops.set_grad_overwrite: the references add into dw, so in overwrite mode the wrappers clear it
// first (cheap next to the op on the CPU; the CUDA backend gets a real saving from it).
static void cpu_set_grad_overwrite(void *ctx, int on) { ((CpuBackend *)ctx)->grad_overwrite = on; }
static void clear_if_overwriting(void *ctx, float *dw, size_t n) {
  if (((CpuBackend *)ctx)->grad_overwrite && dw) memset(dw, 0, n * sizeof(float));
}

static void cpu_embed_fwd(void *ctx, void *out, const int *tokens, const float *table, int N, int D, int V) {
  embedding_forward(out, tokens, table, N, D, V);
}
static void cpu_embed_bwd(void *ctx, float *dtable, const void *dout, const int *tokens, int N, int D) {
  embedding_backward(dtable, dout, tokens, N, D);
}
static void cpu_rmsnorm_fwd(void *ctx, void *out, float *rstd, const void *x, const float *w, int N, int D, float eps) {
  rmsnorm_forward(out, rstd, x, w, N, D, eps);
}
static void cpu_rmsnorm_bwd(void *ctx, void *dx, float *dw, const void *dout, const void *x, const float *w,
                            const float *rstd, int N, int D) {
  clear_if_overwriting(ctx, dw, (size_t)D);
  rmsnorm_backward(dx, dw, dout, x, w, rstd, N, D);
}
static void cpu_matmul_fwd(void *ctx, LinearId id, void *out, const void *x, const float *w, int N, int in,
                           int out_dim) {
  linear_fp4_cpu_forward(&((CpuBackend *)ctx)->lin, id, out, x, w, N, in, out_dim);
}
static void cpu_matmul_bwd(void *ctx, LinearId id, void *dx, float *dw, const void *dout, const void *x, const float *w,
                           int N, int in, int out_dim, int dx_accumulate) {
  clear_if_overwriting(ctx, dw, (size_t)in * out_dim);
  linear_fp4_cpu_backward(&((CpuBackend *)ctx)->lin, id, dx, dw, dout, x, w, N, in, out_dim, dx_accumulate);
}
static void cpu_rope_fwd(void *ctx, void *x, const float *cos, const float *sin, const int *pos, int B, int T,
                         int n_heads, int hd) {
  rope_forward(x, cos, sin, pos, B, T, n_heads, hd);
}
static void cpu_rope_bwd(void *ctx, void *dx, const float *cos, const float *sin, const int *pos, int B, int T,
                         int n_heads, int hd) {
  rope_backward(dx, cos, sin, pos, B, T, n_heads, hd);
}
static void cpu_attention_fwd(void *ctx, void *out, float *lse, const void *q, const void *k, const void *v,
                              const DocMask *docs, int B, int T, int H, int KV, int hd) {
  attention_forward(out, lse, q, k, v, docs ? docs->start : NULL, B, T, H, KV, hd);
}
static void cpu_attention_bwd(void *ctx, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                              const void *v, const void *out, const float *lse, const DocMask *docs, int B, int T,
                              int H, int KV, int hd) {
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, docs ? docs->start : NULL, B, T, H, KV, hd);
}
static void cpu_swiglu_fwd(void *ctx, void *out, const void *gate, const void *up, size_t n) {
  swiglu_forward(out, gate, up, n);
}
static void cpu_swiglu_bwd(void *ctx, void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                           size_t n) {
  swiglu_backward(dgate, dup, dout, gate, up, n);
}
static void cpu_residual_fwd(void *ctx, void *out, const void *a, const void *b, size_t n) {
  residual_forward(out, a, b, n);
}
static float cpu_head_ce(void *ctx, void *dx, float *dw, float *scratch, const void *x, const float *w,
                         const int *targets, int N, int D, int V, int chunk, int ignore_index, float dloss) {
  if (dx) clear_if_overwriting(ctx, dw, (size_t)V * D);  // without dx nothing is written to dw
  return head_crossentropy(dx, dw, scratch, x, w, targets, N, D, V, chunk, ignore_index, dloss);
}

static void cpu_head_nll(void *ctx, float *nll, float *scratch, const void *x, const float *w, const int *rows,
                         const int *targets, int n, int D, int V, int chunk) {
  head_rows_nll(nll, scratch, x, w, rows, targets, n, D, V, chunk);
}

static double cpu_grad_sumsq(void *ctx, const float *g, size_t n) { return grad_sumsq(g, n); }
static void cpu_adamw(void *ctx, float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                      float beta2, float eps, float weight_decay, float grad_scale, int64_t t) {
  adamw_update(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
}

static const Ops CPU_TABLE = {
    .name = "cpu",
    .act_bytes = sizeof(float),
    .host_memory = 1,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .upload = cpu_copy,
    .download = cpu_copy,
    .acts_to_f32 = cpu_acts_to_f32,
    .sync = cpu_sync,
    .bind_params = cpu_bind_params,
    .params_changed = cpu_params_changed,
    .set_step = cpu_set_step,
    .set_recipe = cpu_set_recipe,
    .set_grad_overwrite = cpu_set_grad_overwrite,
    .grad_sumsq = cpu_grad_sumsq,
    .adamw = cpu_adamw,
    .embed_fwd = cpu_embed_fwd,
    .embed_bwd = cpu_embed_bwd,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .matmul_fwd = cpu_matmul_fwd,
    .matmul_bwd = cpu_matmul_bwd,
    .rope_fwd = cpu_rope_fwd,
    .rope_bwd = cpu_rope_bwd,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .residual_fwd = cpu_residual_fwd,
    .head_ce = cpu_head_ce,
    .head_nll = cpu_head_nll,
};

const Ops *cpu_backend_open(void) {
  CpuBackend *b = (CpuBackend *)xcalloc(1, sizeof *b);
  b->ops = CPU_TABLE;
  b->ops.ctx = b;
  b->lin.r.format = FMT_BF16;
  return &b->ops;
}
