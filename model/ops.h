// model/ops.h: the backend operations table. model/llama.c runs the layer graph only through these
// function pointers, so a CUDA backend (BF16 activations, fp32 master weights and gradients) can
// fill the same table and reuse the graph unchanged.
//
// A backend is an instance: backend_open returns a table of its own whose ctx holds everything the
// backend keeps between calls (memory, caches, recipe, profiler), so nothing lives in file-level
// variables and two instances do not share state.
//
// Conventions shared by every op:
// - N = B*T tokens, row-major [N, width] activations; token n is position n % T of sequence n / T.
// - Activations are void* in the backend's activation type (Ops.act_bytes per element).
//   Parameters and their gradients are fp32 (float*), as are per-row statistics (rstd, lse).
// - Linear weights are stored PyTorch-style [out, in]: y = x W^T.
// - Backward ops ACCUMULATE (+=) into parameter gradients (or write them, see set_grad_overwrite). Activation gradients
// are overwritten,
//   except where a comment says "+=" (rmsnorm_bwd's dx, and matmul_bwd's dx when asked), which is
//   how the graph sums the branches of the residual stream and of q/k/v, gate/up.
//
// Below the table are the plain-C CPU reference implementations (one file per op), with typed
// signatures; tests call them directly, ops_cpu.c wraps them into the CPU table (cpu_backend_open).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/gemm_plans.h"
#include "fp4/recipe.h"
#include "model/llama_config.h"

#ifdef __cplusplus
extern "C" {
#endif

// Which linear layer a matmul call is: FP4 recipes (per-kind, per-block overrides) key on this.
typedef enum { LIN_Q, LIN_K, LIN_V, LIN_O, LIN_GATE, LIN_UP, LIN_DOWN, LIN_HEAD, LIN_NKINDS } LinearKind;
typedef struct {
  int layer;  // block index; -1 for the output head
  LinearKind kind;
} LinearId;

static inline const char *linear_kind_name(LinearKind k) {
  static const char *names[LIN_NKINDS] = {"q", "k", "v", "o", "gate", "up", "down", "head"};
  return (unsigned)k < LIN_NKINDS ? names[k] : "?";
}

// The documents of a micro-batch, for block-causal attention (model.doc_mask: block_causal; the rule
// is docs/data.md's "Document masking"). A document is a run of consecutive tokens of one row: one
// starts at every BOS token and at every row's first token (the rest of a document that began
// before the window). Query t of a row sees the keys of its own document up to t: keys
// start[n]..t for token n = b*T + t. model/doc_mask.c builds it from the input ids, once per
// micro-batch; every backend reads what it needs (the CPU start, cuDNN cu, cu_h and n_docs).
typedef struct {
  const int *start;  // [B*T] backend memory: the row position (0..t) where token n's document starts
  const int *cu;     // [n_docs + 1] backend memory: flat index b*T + t of each document's first token, then B*T
  const int *cu_h;   // cu in host memory, or NULL (cuDNN's deterministic backward groups on the host: downloads cu)
  int n_docs;        // documents in the micro-batch (>= B)
  double pairs;      // (query, key) pairs attended to: the sum over documents of len * (len + 1) / 2
} DocMask;

typedef struct Ops {
  const char *name;  // "cpu", "cuda", ...
  int act_bytes;     // bytes per activation element: 4 (fp32) on the CPU, 2 for BF16
  void *ctx;         // the backend's state (model/cpu/ops_cpu.c's CpuBackend, model/cuda/ops_cuda.h's
                     // CudaBackend): every entry below takes it first, as op->f(op->ctx, ...)

  // What a run asks of the backend beyond the ops (train.c, run/). 0 or NULL where it has none of it:
  // the CPU keeps host memory, computes every recipe in fp32 and has nothing to profile or report.
  int host_memory;              // 1: its buffers are host memory
  int (*device_cc)(void *ctx);  // compute capability, major*10 + minor
  void (*set_recipe)(void *ctx, const Recipe *r, int n_layers,
                     uint64_t seed);  // for the FP4 linears; before llama_create
  size_t (*mem_peak)(void *ctx);      // bytes: the peak of the backend's tracked allocations
  void (*mem_reset_peak)(void *ctx);
  size_t (*device_used)(void *ctx);      // bytes in use on the device now (every process's)
  size_t (*fp4_saved_bytes)(void *ctx);  // the FP4 operand copies the forwards keep
  void (*profile)(void *ctx, int on);    // on: reset the per-op timers and time each op; off: stop
  void (*profile_report)(void *ctx, FILE *f, int steps);
  void (*library_report)(void *ctx, FILE *f);  // the run-time libraries it loaded (a line for the bench)
  void (*end_report)(void *ctx, int rank);     // lines for the end of a run (the FP8 Wgrad tiles' exactness counts)
  // Page-locked host memory (a checkpoint's staging, run/resume.c): device-to-host copies into it run
  // at the link's full speed, with no bounce through a driver buffer. NULL on the CPU, whose copies
  // are memcpy (plain malloc serves). host_alloc returns NULL when the memory cannot be pinned.
  void *(*host_alloc)(void *ctx, size_t bytes);
  void (*host_free)(void *ctx, void *p);
  // Named ranges for a profiler's timeline (NVTX on the CUDA backend with logging.nvtx; NULL when off,
  // and on the CPU): the graph brackets each block's forward and backward with them.
  void (*range_push)(void *ctx, const char *name);
  void (*range_pop)(void *ctx);

  // Memory: buffers the ops read and write live where the backend wants them (host or device).
  void *(*alloc)(void *ctx, size_t bytes);
  void (*release)(void *ctx, void *p);
  void (*zero)(void *ctx, void *p, size_t bytes);
  void (*upload)(void *ctx, void *dst, const void *host_src, size_t bytes);
  void (*download)(void *ctx, void *host_dst, const void *src, size_t bytes);
  void (*acts_to_f32)(void *ctx, float *host_dst, const void *src, size_t n);  // n activations -> host floats
  void (*sync)(void *ctx);  // wait for queued work (a no-op on the CPU)

  // Parameters. The model binds its fp32 parameter buffer once after allocating it. A backend may
  // keep derived copies (the CUDA backend keeps BF16 weights for the GEMMs, indexed by the offset of
  // the fp32 pointer an op receives); params_changed() refreshes them after the fp32 values were
  // written from outside (init, checkpoint load). adamw() refreshes them itself.
  void (*bind_params)(void *ctx, float *params, size_t n);
  void (*params_changed)(void *ctx);

  // ZeRO-1 master-weight sharding (parallel/zero.c); all NULL where the backend computes with the fp32
  // values themselves (the CPU). alloc_params allocates the parameter buffer in a form whose memory
  // can later be given back piecewise. After shard_params(off, len, n) only the fp32 parameters in
  // the ranges [off[i], off[i] + len[i]) (floats of the bound buffer: the rank's shard and what the
  // kernels read in fp32, the RMSNorm weights) exist; the rest of the buffer keeps its addresses but
  // no memory (returns the bytes given back). From then on uploads into the buffer write the derived
  // BF16 copy everywhere and the fp32 values where kept, params_changed refreshes the copy from the
  // kept ranges only, and nothing may read the other fp32 values. params_bf16 is the BF16 copy
  // (same indexing as the buffer) for the all-gather of the updated parameters, and
  // params_bf16_changed says it was written from outside (its own derived copies are then stale).
  void *(*alloc_params)(void *ctx, size_t bytes);
  size_t (*shard_params)(void *ctx, const size_t *off, const size_t *len, int n);
  void *(*params_bf16)(void *ctx);
  void (*params_bf16_changed)(void *ctx);

  // Where the run is: the FP4 recipes key their stochastic-rounding random bits on (step, micro-batch)
  // so that a resumed run draws exactly the bits the uninterrupted one would. Call before each
  // micro-batch's forward. A no-op where nothing is random.
  void (*set_step)(void *ctx, int64_t step, int micro);

  // While on, the backward ops below WRITE the parameter gradients they produce instead of adding
  // to them. Each gradient element gets exactly one op call per backward (the head's dw one head_ce
  // call, whatever its chunking), so the graph turns this on for the first backward after
  // llama_zero_grad and needs no memset of the gradient buffer, and the weight-gradient GEMMs need
  // not read it (beta = 0). embed_bwd is a scatter and always adds: the graph zeroes its table first.
  void (*set_grad_overwrite)(void *ctx, int on);

  // Saved tensors kept quantized (NULL where not supported). set_input_saving(on): the model says
  // whether it keeps activations for the backward (recompute none); when on, linear_saves_input(id)
  // is 1 for a linear whose forward keeps its own quantized copy of x for its Wgrad, so matmul_bwd
  // ignores x and the model need not keep the BF16 x (model/llama.c reuses one scratch for it).
  // The answer depends on the backend's precision recipe at the time it is asked.
  void (*set_input_saving)(void *ctx, int on);
  int (*linear_saves_input)(void *ctx, LinearId id);

  // Optimizer on backend memory, with model/adamw.h's exact semantics.
  double (*grad_sumsq)(void *ctx, const float *g, size_t n);
  void (*adamw)(void *ctx, float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                float eps, float weight_decay, float grad_scale, int64_t t);

  // out[n] = table[tokens[n]]. Dies on a token outside [0, V).
  void (*embed_fwd)(void *ctx, void *out, const int *tokens, const float *table, int N, int D, int V);
  // dtable[tokens[n]] += dout[n]
  void (*embed_bwd)(void *ctx, float *dtable, const void *dout, const int *tokens, int N, int D);

  // out = x * rsqrt(mean(x^2) + eps) * w; rstd[n] saved for backward.
  void (*rmsnorm_fwd)(void *ctx, void *out, float *rstd, const void *x, const float *w, int N, int D, float eps);
  // dx += ..., dw += ...
  void (*rmsnorm_bwd)(void *ctx, void *dx, float *dw, const void *dout, const void *x, const float *w,
                      const float *rstd, int N, int D);

  // The single linear entry. out[N, out_dim] = x[N, in] W^T with W [out_dim, in].
  void (*matmul_fwd)(void *ctx, LinearId id, void *out, const void *x, const float *w, int N, int in, int out_dim);
  // dW += dout^T x; dx = dout W (or dx += dout W when dx_accumulate). dx or dw may be NULL.
  void (*matmul_bwd)(void *ctx, LinearId id, void *dx, float *dw, const void *dout, const void *x, const float *w,
                     int N, int in, int out_dim, int dx_accumulate);

  // In-place rotary embedding of x [B*T, n_heads*hd] with cos/sin tables [T, hd/2]; the backward
  // rotates by the opposite angle (the transpose). pos [B*T] (backend memory) is each token's
  // position, a row of the tables (model.doc_positions: restart); NULL: token n's is n % T.
  void (*rope_fwd)(void *ctx, void *x, const float *cos, const float *sin, const int *pos, int B, int T, int n_heads,
                   int hd);
  void (*rope_bwd)(void *ctx, void *dx, const float *cos, const float *sin, const int *pos, int B, int T, int n_heads,
                   int hd);

  // Causal GQA attention: q [N, H*hd], k, v [N, KV*hd] -> out [N, H*hd]; lse (N*H floats) is the
  // log-sum-exp of each row's scaled scores, saved so the backward can rebuild the probabilities.
  // docs NULL: plain causal, lse laid out [B, H, T]. docs set: block-causal (DocMask below), lse in
  // the backend's own layout (the CPU's [B, H, T]; cuDNN's ragged one, [B*T, H]): only its own
  // attention_bwd reads it.
  void (*attention_fwd)(void *ctx, void *out, float *lse, const void *q, const void *k, const void *v,
                        const DocMask *docs, int B, int T, int H, int KV, int hd);
  void (*attention_bwd)(void *ctx, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                        const void *v, const void *out, const float *lse, const DocMask *docs, int B, int T, int H,
                        int KV, int hd);

  // out = silu(gate) * up, elementwise over n values.
  void (*swiglu_fwd)(void *ctx, void *out, const void *gate, const void *up, size_t n);

  // Format-aware fusion (NULL where not supported): rmsnorm_fwd / swiglu_fwd (N x F values) whose output
  // feeds linear `leader` and the linears sharing its input. Where leader keeps its input quantized
  // (linear_saves_input) and the recipe has a fused form, the backend computes the output inside the
  // producer of leader's FP4 copies and leaves `out` unwritten; otherwise these are rmsnorm_fwd /
  // swiglu_fwd. Either way rstd is written.
  void (*rmsnorm_fwd_into)(void *ctx, LinearId leader, void *out, float *rstd, const void *x, const float *w, int N,
                           int D, float eps);
  void (*swiglu_fwd_into)(void *ctx, LinearId leader, void *out, const void *gate, const void *up, int N, int F);
  // matmul_fwd(up_id, up, x, w, N, in, F) then swiglu_fwd_into(down, out, gate, up, N, F), with SwiGLU and
  // down's producers in up's GEMM epilogue (format-aware fusion): the same bits, one kernel; for the linears
  // and shape where fuses_swiglu says the backend has that fusion (NULL or 0: the caller runs the two ops).
  int (*fuses_swiglu)(void *ctx, LinearId up_id, LinearId down, int N, int F);
  void (*matmul_swiglu_fwd)(void *ctx, LinearId up_id, LinearId down, void *up, void *out, const void *x,
                            const float *w, const void *gate, int N, int in, int F);
  void (*swiglu_bwd)(void *ctx, void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n);
  // out = a + b (out may alias a).
  void (*residual_fwd)(void *ctx, void *out, const void *a, const void *b, size_t n);
  // out[N, out_dim] = res + x W^T with the residual add in the linear's GEMM epilogue, for a linear id
  // where fuses_residual(id) says the backend has that fusion (NULL or 0: the caller runs matmul_fwd and
  // residual_fwd instead). The bits equal matmul_fwd into a temporary followed by residual_fwd(out, res,
  // tmp). out and res do not overlap.
  int (*fuses_residual)(void *ctx, LinearId id);
  void (*matmul_residual_fwd)(void *ctx, LinearId id, void *out, const void *res, const void *x, const float *w, int N,
                              int in, int out_dim);

  // Output head fused with cross-entropy, `chunk` tokens at a time so the fp32 logits of the
  // whole batch never exist: logits = x W^T per chunk, loss = mean over targets != ignore_index
  // of logsumexp - logit[target] (0 when no target counts). Returns that mean loss. When dx is
  // not NULL it also writes dx (overwrite) and accumulates dw, for d(objective)/d(loss) = dloss.
  // scratch holds chunk*V floats.
  float (*head_ce)(void *ctx, void *dx, float *dw, float *scratch, const void *x, const float *w, const int *targets,
                   int N, int D, int V, int chunk, int ignore_index, float dloss);
  // The same head without a backward, for chosen rows: nll[i] = logsumexp(x_r W^T) - (x_r W^T)[targets[i]]
  // with r = rows[i], for i < n. rows, targets and nll are HOST arrays; a row may be asked for more
  // than once (one context, several one-token continuations). Only the n asked rows go through the
  // head: an evaluation reads a few positions of each row, and no [N, V] logits leave the device.
  void (*head_nll)(void *ctx, float *nll, float *scratch, const void *x, const float *w, const int *rows,
                   const int *targets, int n, int D, int V, int chunk);
} Ops;

// A new CPU backend instance (model/cpu/ops_cpu.c). Never fails.
const Ops *cpu_backend_open(void);

// parallel.backend: "cpu", "cuda", or "auto" (the GPU when this build has the CUDA backend and one is
// present, else the CPU, saying why). model/backend.c, the one place that knows which backends this
// build has. The device (LOCAL_RANK's) is selected here, before anything (NCCL included) allocates
// on it. deterministic: cuDNN's deterministic attention backward (parallel.deterministic); with
// gemm_choice (common/gemm_plans.h's gemm_plans_choice: recorded or heuristic GEMM algorithms, not
// timed afresh) a resumed run then repeats the original bit for bit (docs/determinism.md). The CPU
// backend is deterministic whatever they say. dgrad_transposed: keep W^T copies for the dgrad GEMMs
// (parallel.dgrad_transposed).
typedef struct {
  int deterministic, dgrad_transposed, local_rank;
  int nvtx;                // logging.nvtx: NVTX ranges around each op of the table and each block (CUDA)
  GemmChoice gemm_choice;  // GEMM_TIMED (0), GEMM_RECORDED or GEMM_HEURISTIC
  const char *gemm_plans;  // GEMM_RECORDED: the record's path
} BackendOptions;
const Ops *backend_open(const char *want, const BackendOptions *o);

// ---- CPU reference implementations (fp32, OpenMP, deterministic) -------------------------------
// Every output element is computed by one thread in a fixed order, so results are bit-identical
// for any thread count. Argument meanings are those of the table above.

// model/cpu/embedding.c
void embedding_forward(float *out, const int *tokens, const float *table, int N, int D, int V);
void embedding_backward(float *dtable, const float *dout, const int *tokens, int N, int D);

// model/cpu/rmsnorm.c
void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int D, float eps);
void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, int N,
                      int D);

// model/cpu/matmul.c
void matmul_forward(float *out, const float *x, const float *w, int N, int in, int out_dim);
// The same with W already transposed (wt [in, out_dim], from matmul_transpose_weight, malloc'd),
// for callers that apply one weight several times (the chunked head).
float *matmul_transpose_weight(const float *w, int in, int out_dim);
void matmul_forward_wt(float *out, const float *x, const float *wt, int N, int in, int out_dim);
void matmul_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int in,
                     int out_dim, int dx_accumulate);

// model/cpu/rope.c
// inv_freq[i], i < hd/2: 1/theta^(2i/hd), then HF's "llama3" rescaling when c->rope_scaling.
void rope_inv_freq(float *inv_freq, int hd, const LlamaConfig *c);
// cos/sin [T, hd/2] of position * inv_freq (angle in double, stored as float).
void rope_tables(float *cos, float *sin, int T, int hd, const LlamaConfig *c);
// pos: as Ops.rope_fwd (host memory here), NULL for positions 0..T-1 in every row.
void rope_forward(float *x, const float *cos, const float *sin, const int *pos, int B, int T, int n_heads, int hd);
void rope_backward(float *dx, const float *cos, const float *sin, const int *pos, int B, int T, int n_heads, int hd);

// model/cpu/attention.c. doc_start: DocMask.start (host memory), NULL for plain causal. Masked keys
// cost nothing: each query row loops over its own document's keys only.
void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, const int *doc_start,
                       int B, int T, int H, int KV, int hd);
void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                        const float *v, const float *out, const float *lse, const int *doc_start, int B, int T, int H,
                        int KV, int hd);

// model/cpu/swiglu.c
void swiglu_forward(float *out, const float *gate, const float *up, size_t n);
void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);

// model/cpu/residual.c
void residual_forward(float *out, const float *a, const float *b, size_t n);

// model/cpu/crossentropy.c
float head_crossentropy(float *dx, float *dw, float *scratch, const float *x, const float *w, const int *targets, int N,
                        int D, int V, int chunk, int ignore_index, float dloss);
// head_crossentropy's loss of chosen rows (Ops.head_nll): nll[i] for row rows[i] and targets[i].
void head_rows_nll(float *nll, float *scratch, const float *x, const float *w, const int *rows, const int *targets,
                   int n, int D, int V, int chunk);

#ifdef __cplusplus
}
#endif
