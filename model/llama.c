// model/llama.c: parameter layout, activation arena, and the layer graph (llama_forward and
// llama_backward). All math goes through m->ops, so this file is the same for every backend.
#include "model/llama.h"

#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/doc_mask.h"

// The parameter tensors, in layout order.
enum {
  T_EMBED,
  T_ATTN_NORM,
  T_WQ,
  T_WK,
  T_WV,
  T_WO,
  T_FFN_NORM,
  T_GATE,
  T_UP,
  T_DOWN,
  T_FINAL_NORM,
  T_HEAD,
  N_TENSORS
};

// Upper bound on head logits held at once (floats): the head runs max(1, this / V) tokens per chunk.
#define HEAD_CHUNK_FLOATS (1 << 22)

// The activation arena: what the forward saves for the backward, then scratch. Stacked [S, ...]
// buffers hold S slices: one per layer (S = L) when the forward saves them, or a single slice
// (S = 1) that every block overwrites when the backward recomputes them (attn_slices, ffn_slices).
// void* buffers hold ops->act_bytes-sized elements.
typedef struct {
  void *res;  // [L+1, N, D] stream entering block l; slice L enters the final norm
  // the attention half, S = attn_slices
  void *attn_in;     // [S, N, D] rmsnorm(res) * attn_norm
  void *q, *k, *v;   // [S, N, H*hd], [S, N, KV*hd] x2; q and k after RoPE
  void *att;         // [S, N, H*hd] attention output, the input of wo
  void *res_mid;     // [S, N, D] stream after the attention half
  float *attn_rstd;  // [S, N]
  float *lse;        // [S, B, H, T] attention log-sum-exp
  // the feed-forward half, S = ffn_slices
  void *ffn_in;           // [S, N, D] rmsnorm(res_mid) * ffn_norm
  void *gate, *up, *swi;  // [S, N, F] x3; swi = silu(gate) * up, the input of w_down
  float *ffn_rstd;        // [S, N]
  void *final;            // [N, D] final rmsnorm output, the input of the head
  float *final_rstd;      // [N]
  int *inputs, *targets;  // [N] the micro-batch, in backend memory
  void *tmp;              // [N, D] a block's output before the residual add
  float *logits;          // [head_chunk, V] head scratch (act-typed in llama_logits)
  // backward only, reused by every layer
  void *dres;                 // [N, D] gradient of the residual stream
  void *dnorm;                // [N, D] gradient of a norm's output
  void *dq, *dk, *dv, *datt;  // [N, H*hd], [N, KV*hd] x2, [N, H*hd]
  void *dgate, *dup, *dswi;   // [N, F] x3
} Acts;

struct Llama {
  LlamaConfig c;
  int B, T, N;          // B sequences of T tokens, N = B*T
  int hd, qdim, kvdim;  // head dim, H*hd, KV*hd
  const Ops *ops;
  ParamTensor tensors[N_TENSORS];
  size_t n_params;
  float *params, *grads;       // one allocation each, same layout
  float *rope_cos, *rope_sin;  // [T, hd/2]
  Acts a;
  void *arena;     // the one allocation behind every Acts pointer
  int head_chunk;  // tokens per chunk of the fused head + cross-entropy
  int recompute;   // LlamaRecompute or LLAMA_RECOMPUTE_SELECTIVE(n): which activations the backward recomputes
  // Slice of the attention half's (q, k, v, att, res_mid, rstd, lse) and the FFN half's (gate, up,
  // rstd) buffers block l uses: its own when it keeps them, the one scratch slice when the backward
  // recomputes them. n_*: slices carved.
  int *attn_slot, *ffn_slot;
  int n_attn_slices, n_ffn_slices;
  // Slice of attn_in / ffn_in / swi that block l uses: its own, or a shared scratch slice when the
  // backend keeps a quantized copy of that linear input for the backward (Ops.linear_saves_input),
  // so the BF16 one is not kept. n_*: slices carved.
  int *attn_in_slot, *ffn_in_slot, *swi_slot;
  int n_attn_in, n_ffn_in, n_swi;
  unsigned char *input_saved;             // per block: bit b set when input b (attn_in, ffn_in, swi) is the backend's
  size_t arena_bytes, arena_bytes_plain;  // plain: the same with every BF16 input kept
  int have_targets, ignore_index;         // what llama_backward needs from the last llama_forward
  int grads_stale;                        // llama_zero_grad was called: the next backward writes, not adds
  LlamaGradHook grad_hook;                // told as gradient ranges become final in a backward (or NULL)
  void *grad_hook_ctx;
  LlamaLinearTap tap;  // shown each block linear's Dgrad operands (or NULL)
  void *tap_ctx;
  LlamaParamWait param_wait;  // asked before a forward reads a parameter group (or NULL)
  void *param_wait_ctx;
  // Document masking (llama_set_docs): the options, the micro-batch's documents on the host and in
  // backend memory (allocated only when an option is on, so the default arena is unchanged), and
  // what the ops receive: docmask NULL for plain causal attention, rope_pos NULL for positions 0..T-1.
  LlamaDocs doc_opts;
  int *doc_start_h, *doc_pos_h, *doc_cu_h;  // [N], [N], [N + 1]
  int *doc_start, *doc_pos, *doc_cu;        // the same in backend memory
  DocMask docs;
  const DocMask *docmask;
  const int *rope_pos;
};

// ---- parameters ---------------------------------------------------------------------------------

static void add_tensor(Llama *m, int id, const char *name, int decay, int ndim, const int64_t *shape) {
  ParamTensor *t = &m->tensors[id];
  t->name = name;
  t->ndim = ndim;
  t->numel = 1;
  for (int i = 0; i < ndim; i++) t->numel *= (size_t)(t->shape[i] = shape[i]);
  t->offset = m->n_params;
  t->decay = decay;
  m->n_params += t->numel;
}

static void layout_params(Llama *m) {
  const LlamaConfig *c = &m->c;
  int64_t V = c->vocab_size, D = c->dim, L = c->n_layers, F = c->ffn_dim, Q = m->qdim, K = m->kvdim;
  m->n_params = 0;
  add_tensor(m, T_EMBED, "tok_embedding", 1, 2, (int64_t[]){V, D});
  add_tensor(m, T_ATTN_NORM, "attn_norm", 0, 2, (int64_t[]){L, D});
  add_tensor(m, T_WQ, "wq", 1, 3, (int64_t[]){L, Q, D});
  add_tensor(m, T_WK, "wk", 1, 3, (int64_t[]){L, K, D});
  add_tensor(m, T_WV, "wv", 1, 3, (int64_t[]){L, K, D});
  add_tensor(m, T_WO, "wo", 1, 3, (int64_t[]){L, D, Q});
  add_tensor(m, T_FFN_NORM, "ffn_norm", 0, 2, (int64_t[]){L, D});
  add_tensor(m, T_GATE, "w_gate", 1, 3, (int64_t[]){L, F, D});
  add_tensor(m, T_UP, "w_up", 1, 3, (int64_t[]){L, F, D});
  add_tensor(m, T_DOWN, "w_down", 1, 3, (int64_t[]){L, D, F});
  add_tensor(m, T_FINAL_NORM, "final_norm", 0, 1, (int64_t[]){D});
  add_tensor(m, T_HEAD, "head", 1, 2, (int64_t[]){V, D});
  if ((int64_t)m->n_params != llama_num_params(c))
    die("parameter layout has %zu floats but llama_num_params says %lld", m->n_params, (long long)llama_num_params(c));
}

// One block's weights (or gradients, with base = m->grads).
typedef struct {
  float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w_gate, *w_up, *w_down;
} LayerWeights;

static float *layer_slice(const Llama *m, float *base, int id, int l) {
  const ParamTensor *t = &m->tensors[id];
  return base + t->offset + (size_t)l * (t->numel / (size_t)m->c.n_layers);
}

static LayerWeights layer_weights(const Llama *m, float *base, int l) {
  return (LayerWeights){
      .attn_norm = layer_slice(m, base, T_ATTN_NORM, l),
      .wq = layer_slice(m, base, T_WQ, l),
      .wk = layer_slice(m, base, T_WK, l),
      .wv = layer_slice(m, base, T_WV, l),
      .wo = layer_slice(m, base, T_WO, l),
      .ffn_norm = layer_slice(m, base, T_FFN_NORM, l),
      .w_gate = layer_slice(m, base, T_GATE, l),
      .w_up = layer_slice(m, base, T_UP, l),
      .w_down = layer_slice(m, base, T_DOWN, l),
  };
}

static float *whole(const Llama *m, float *base, int id) { return base + m->tensors[id].offset; }

// ---- activations --------------------------------------------------------------------------------

// Slices of the attention half's and the FFN half's activation buffers: one per layer when the
// forward keeps them for the backward, a single scratch slice when the backward recomputes them.
// Whether the backward reruns block l's attention half (full, or its turn under selective_N) and its
// FFN half (those, and ffn).
static int attn_recomputed(const Llama *m, int l) {
  if (m->recompute > LLAMA_RECOMPUTE_SELECTIVE_BASE)
    return (l + 1) % (m->recompute - LLAMA_RECOMPUTE_SELECTIVE_BASE) == 0;
  return m->recompute == LLAMA_RECOMPUTE_FULL;
}
static int ffn_recomputed(const Llama *m, int l) {
  return m->recompute == LLAMA_RECOMPUTE_FFN || attn_recomputed(m, l);
}

// Own slices for the blocks that keep a half, one shared scratch slice after them for those that do not.
static void assign_half_slots(Llama *m) {
  int own_a = 0, own_f = 0, scratch_a = 0, scratch_f = 0;
  for (int l = 0; l < m->c.n_layers; l++) {
    if (attn_recomputed(m, l)) m->attn_slot[l] = -1, scratch_a = 1;
    else m->attn_slot[l] = own_a++;
    if (ffn_recomputed(m, l)) m->ffn_slot[l] = -1, scratch_f = 1;
    else m->ffn_slot[l] = own_f++;
  }
  for (int l = 0; l < m->c.n_layers; l++) {
    if (m->attn_slot[l] < 0) m->attn_slot[l] = own_a;
    if (m->ffn_slot[l] < 0) m->ffn_slot[l] = own_f;
  }
  m->n_attn_slices = own_a + scratch_a, m->n_ffn_slices = own_f + scratch_f;
}
static size_t attn_slices(const Llama *m) { return (size_t)m->n_attn_slices; }
static size_t ffn_slices(const Llama *m) { return (size_t)m->n_ffn_slices; }

// Sizes and carves the arena: with base == NULL only returns the byte count. The only place that
// knows how big each activation buffer is.
static size_t layout_acts(Llama *m, char *base) {
  Acts *a = &m->a;
  const size_t N = m->N, D = m->c.dim, L = m->c.n_layers, F = m->c.ffn_dim, Q = m->qdim, K = m->kvdim;
  const size_t SA = attn_slices(m), SF = ffn_slices(m);
  const size_t ab = m->ops->act_bytes, fb = sizeof(float), lb = ab > fb ? ab : fb;
  size_t off = 0;
#define CARVE(field, count, elem_bytes)                           \
  do { /* 256-byte aligned, as GPU kernels and cuBLAS like */     \
    a->field = base ? (void *)(base + off) : NULL;                \
    off += ((size_t)(count) * (elem_bytes) + 255) & ~(size_t)255; \
  } while (0)
  CARVE(res, (L + 1) * N * D, ab);
  CARVE(attn_in, (size_t)m->n_attn_in * N * D, ab);
  CARVE(q, SA * N * Q, ab);
  CARVE(k, SA * N * K, ab);
  CARVE(v, SA * N * K, ab);
  CARVE(att, SA * N * Q, ab);
  CARVE(res_mid, SA * N * D, ab);
  CARVE(attn_rstd, SA * N, fb);
  CARVE(lse, SA * N * m->c.n_heads, fb);
  CARVE(ffn_in, (size_t)m->n_ffn_in * N * D, ab);
  CARVE(gate, SF * N * F, ab);
  CARVE(up, SF * N * F, ab);
  CARVE(swi, (size_t)m->n_swi * N * F, ab);
  CARVE(ffn_rstd, SF * N, fb);
  CARVE(final, N * D, ab);
  CARVE(final_rstd, N, fb);
  CARVE(inputs, N, sizeof(int));
  CARVE(targets, N, sizeof(int));
  CARVE(tmp, N * D, ab);
  CARVE(logits, (size_t)m->head_chunk * m->c.vocab_size, lb);
  CARVE(dres, N * D, ab);
  CARVE(dnorm, N * D, ab);
  CARVE(dq, N * Q, ab);
  CARVE(dk, N * K, ab);
  CARVE(dv, N * K, ab);
  CARVE(datt, N * Q, ab);
  CARVE(dgate, N * F, ab);
  CARVE(dup, N * F, ab);
  CARVE(dswi, N * F, ab);
#undef CARVE
  return off;
}

// Element i of an activation buffer.
static void *act(const Llama *m, void *buf, size_t i) { return (char *)buf + i * (size_t)m->ops->act_bytes; }

// One block's slices of the stacked activations.
typedef struct {
  void *res_in, *attn_in, *q, *k, *v, *att, *res_mid, *ffn_in, *gate, *up, *swi, *res_out;
  float *attn_rstd, *ffn_rstd, *lse;
} LayerActs;

static LayerActs layer_acts(const Llama *m, int l) {
  const Acts *a = &m->a;
  const size_t N = m->N, D = m->c.dim, F = m->c.ffn_dim, Q = m->qdim, K = m->kvdim;
  const size_t la = (size_t)m->attn_slot[l], lf = (size_t)m->ffn_slot[l];
  return (LayerActs){
      .res_in = act(m, a->res, l * N * D),
      .attn_in = act(m, a->attn_in, (size_t)m->attn_in_slot[l] * N * D),
      .q = act(m, a->q, la * N * Q),
      .k = act(m, a->k, la * N * K),
      .v = act(m, a->v, la * N * K),
      .att = act(m, a->att, la * N * Q),
      .res_mid = act(m, a->res_mid, la * N * D),
      .ffn_in = act(m, a->ffn_in, (size_t)m->ffn_in_slot[l] * N * D),
      .gate = act(m, a->gate, lf * N * F),
      .up = act(m, a->up, lf * N * F),
      .swi = act(m, a->swi, (size_t)m->swi_slot[l] * N * F),
      .res_out = act(m, a->res, (l + 1) * N * D),
      .attn_rstd = a->attn_rstd + la * N,
      .ffn_rstd = a->ffn_rstd + lf * N,
      .lse = a->lse + la * N * m->c.n_heads,
  };
}

// The linears that read each BF16 input a block may not keep: attn_in (q, k, v), ffn_in (gate, up),
// swi (down), padded to 3.
static const LinearKind INPUT_USERS[3][3] = {
    {LIN_Q, LIN_K, LIN_V}, {LIN_GATE, LIN_UP, LIN_UP}, {LIN_DOWN, LIN_DOWN, LIN_DOWN}};

// Which slice of attn_in, ffn_in and swi each block uses. By default block l's own (recompute none)
// or the one scratch slice (recomputed halves). With plain == 0 and recompute none, a block whose
// linears keep a quantized copy of that input for their backward (Ops.linear_saves_input: q, k and
// v for attn_in, gate and up for ffn_in, down for swi) writes its BF16 input into one shared
// scratch slice instead: only its forward reads it.
static void assign_slots(Llama *m, int plain) {
  const int L = m->c.n_layers;
  const Ops *op = m->ops;
  const int saving = !plain && m->recompute == LLAMA_RECOMPUTE_NONE && op->linear_saves_input;
  int *slots[3] = {m->attn_in_slot, m->ffn_in_slot, m->swi_slot}, *count[3] = {&m->n_attn_in, &m->n_ffn_in, &m->n_swi};
  for (int b = 0; b < 3; b++) {
    int own = 0, shared = 0;
    for (int l = 0; l < L; l++) {
      int saved = saving, kept = b == 0 ? !attn_recomputed(m, l) : !ffn_recomputed(m, l);
      for (int u = 0; u < 3 && saved; u++) saved = op->linear_saves_input(op->ctx, (LinearId){l, INPUT_USERS[b][u]});
      if (kept && !saved) slots[b][l] = own++;
      else slots[b][l] = -1, shared = 1;
      if (kept && saved) m->input_saved[l] |= (unsigned char)(1u << b);
      else m->input_saved[l] &= (unsigned char)~(1u << b);
    }
    for (int l = 0; l < L; l++)
      if (slots[b][l] < 0) slots[b][l] = own;  // the one scratch slice, after the kept ones
    *count[b] = own + shared;
  }
}

// ---- lifetime -----------------------------------------------------------------------------------

Llama *llama_create(const LlamaConfig *c, int B, int T, const Ops *ops) {
  return llama_create_ex(c, B, T, ops, LLAMA_RECOMPUTE_NONE);
}

Llama *llama_create_ex(const LlamaConfig *c, int B, int T, const Ops *ops, int recompute) {
  if ((recompute < LLAMA_RECOMPUTE_NONE || recompute > LLAMA_RECOMPUTE_FULL) &&
      !(recompute > LLAMA_RECOMPUTE_SELECTIVE_BASE && recompute < LLAMA_RECOMPUTE_SELECTIVE(1 << 20)))
    die("model: recompute mode %d is not one of none (0), ffn (1), full (2), LLAMA_RECOMPUTE_SELECTIVE(n)", recompute);
  if (c->vocab_size < 1 || c->dim < 1 || c->n_layers < 1 || c->n_heads < 1 || c->n_kv_heads < 1 || c->ffn_dim < 1)
    die("model: vocab_size %d, dim %d, n_layers %d, n_heads %d, n_kv_heads %d, ffn_dim %d must all be >= 1",
        c->vocab_size, c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim);
  if (c->dim % c->n_heads) die("model.dim %d is not divisible by model.n_heads %d", c->dim, c->n_heads);
  if (c->n_heads % c->n_kv_heads)
    die("model.n_heads %d is not divisible by model.n_kv_heads %d", c->n_heads, c->n_kv_heads);
  if (llama_head_dim(c) % 2) die("head dim (model.dim / model.n_heads = %d) must be even for RoPE", llama_head_dim(c));
  if (B < 1 || T < 1) die("micro-batch B=%d, T=%d: both must be >= 1", B, T);
  if (T > c->max_seq_len) die("seq_len %d exceeds model.max_seq_len %d", T, c->max_seq_len);
  if ((int64_t)B * T > INT32_MAX / 2) die("micro-batch of %d x %d tokens is too large", B, T);

  Llama *m = xcalloc(1, sizeof *m);
  m->c = *c;
  m->B = B, m->T = T, m->N = B * T;
  m->hd = llama_head_dim(c);
  m->qdim = c->n_heads * m->hd, m->kvdim = c->n_kv_heads * m->hd;
  m->ops = ops;
  m->recompute = recompute;
  layout_params(m);
  // alloc_params: memory that ZeRO-1 can later give back outside the rank's shard (parallel/zero.h).
  m->params = ops->alloc_params ? ops->alloc_params(ops->ctx, m->n_params * sizeof(float))
                                : ops->alloc(ops->ctx, m->n_params * sizeof(float));
  m->grads = ops->alloc(ops->ctx, m->n_params * sizeof(float));
  ops->bind_params(ops->ctx, m->params, m->n_params);
  ops->zero(ops->ctx, m->grads, m->n_params * sizeof(float));

  // RoPE tables for positions 0..T-1, computed once on the host.
  size_t half = (size_t)m->hd / 2, tb = (size_t)T * half * sizeof(float);
  float *cos_h = xmalloc(tb), *sin_h = xmalloc(tb);
  rope_tables(cos_h, sin_h, T, m->hd, c);
  m->rope_cos = ops->alloc(ops->ctx, tb), m->rope_sin = ops->alloc(ops->ctx, tb);
  ops->upload(ops->ctx, m->rope_cos, cos_h, tb);
  ops->upload(ops->ctx, m->rope_sin, sin_h, tb);
  free(cos_h);
  free(sin_h);

  int chunk = HEAD_CHUNK_FLOATS / c->vocab_size;
  m->head_chunk = chunk < 1 ? 1 : chunk > m->N ? m->N : chunk;
  // Saved tensors kept quantized (FP4 recipes on the CUDA backend): only worth it when the forward
  // keeps every block's activations; the recomputing modes keep the inputs' BF16 scratch instead.
  if (ops->set_input_saving) ops->set_input_saving(ops->ctx, recompute == LLAMA_RECOMPUTE_NONE);
  m->attn_in_slot = xcalloc((size_t)c->n_layers, sizeof(int));
  m->ffn_in_slot = xcalloc((size_t)c->n_layers, sizeof(int));
  m->swi_slot = xcalloc((size_t)c->n_layers, sizeof(int));
  m->input_saved = xcalloc((size_t)c->n_layers, 1);
  m->attn_slot = xcalloc((size_t)c->n_layers, sizeof(int));
  m->ffn_slot = xcalloc((size_t)c->n_layers, sizeof(int));
  assign_half_slots(m);
  assign_slots(m, 1);
  m->arena_bytes_plain = layout_acts(m, NULL);
  assign_slots(m, 0);
  m->arena_bytes = layout_acts(m, NULL);
  m->arena = ops->alloc(ops->ctx, m->arena_bytes);
  layout_acts(m, m->arena);
  return m;
}

// ---- documents ----------------------------------------------------------------------------------

static void free_docs(Llama *m) {
  const Ops *op = m->ops;
  int *dev[3] = {m->doc_start, m->doc_pos, m->doc_cu};
  for (int i = 0; i < 3; i++)
    if (dev[i]) op->release(op->ctx, dev[i]);
  free(m->doc_start_h), free(m->doc_pos_h), free(m->doc_cu_h);
  m->doc_start = m->doc_pos = m->doc_cu = m->doc_start_h = m->doc_pos_h = m->doc_cu_h = NULL;
  m->docmask = NULL, m->rope_pos = NULL;
}

void llama_set_docs(Llama *m, const LlamaDocs *d) {
  free_docs(m);
  m->doc_opts = *d;
  if (!d->block_causal && !d->restart_positions) return;
  if (d->bos_id < 0 || d->bos_id >= m->c.vocab_size)
    die("model.bos_id %d is outside the vocabulary [0, %d): document masking (model.doc_mask, model.doc_positions) "
        "needs the id of the token that starts each document (128000 for Llama-3)",
        d->bos_id, m->c.vocab_size);
  const Ops *op = m->ops;
  const size_t N = (size_t)m->N;
  m->doc_start_h = xmalloc(N * sizeof(int)), m->doc_cu_h = xmalloc((N + 1) * sizeof(int));
  if (d->restart_positions) m->doc_pos_h = xmalloc(N * sizeof(int));
  if (d->block_causal) {
    m->doc_start = op->alloc(op->ctx, N * sizeof(int));
    m->doc_cu = op->alloc(op->ctx, (N + 1) * sizeof(int));
    m->docmask = &m->docs;
  }
  if (d->restart_positions) m->rope_pos = m->doc_pos = op->alloc(op->ctx, N * sizeof(int));
}

// The micro-batch's documents from its input ids (host), uploaded for the ops; nothing when off.
static void find_docs(Llama *m, const int *inputs) {
  if (!m->doc_start_h) return;
  const Ops *op = m->ops;
  const size_t N = (size_t)m->N;
  double pairs;
  int n_docs =
      doc_mask_build(inputs, m->B, m->T, m->doc_opts.bos_id, m->doc_start_h, m->doc_pos_h, m->doc_cu_h, &pairs);
  if (m->doc_start) {
    op->upload(op->ctx, m->doc_start, m->doc_start_h, N * sizeof(int));
    op->upload(op->ctx, m->doc_cu, m->doc_cu_h, (size_t)(n_docs + 1) * sizeof(int));
    m->docs = (DocMask){.start = m->doc_start, .cu = m->doc_cu, .cu_h = m->doc_cu_h, .n_docs = n_docs, .pairs = pairs};
  }
  if (m->doc_pos) op->upload(op->ctx, m->doc_pos, m->doc_pos_h, N * sizeof(int));
}

void llama_free(Llama *m) {
  if (!m) return;
  const Ops *op = m->ops;
  op->release(op->ctx, m->params);
  op->release(op->ctx, m->grads);
  op->release(op->ctx, m->rope_cos);
  op->release(op->ctx, m->rope_sin);
  op->release(op->ctx, m->arena);
  free_docs(m);
  free(m->attn_in_slot), free(m->ffn_in_slot), free(m->swi_slot), free(m->input_saved), free(m->attn_slot),
      free(m->ffn_slot);
  free(m);
}

const LlamaConfig *llama_config(const Llama *m) { return &m->c; }
size_t llama_activation_bytes(const Llama *m) { return m->arena_bytes; }
size_t llama_activation_bytes_plain(const Llama *m) { return m->arena_bytes_plain; }
float *llama_params(Llama *m) { return m->params; }
size_t llama_param_count(const Llama *m) { return m->n_params; }
int llama_num_tensors(const Llama *m) { return N_TENSORS; }

const ParamTensor *llama_tensor(const Llama *m, int i) {
  if (i < 0 || i >= N_TENSORS) die("llama_tensor: index %d outside [0, %d)", i, N_TENSORS);
  return &m->tensors[i];
}

const ParamTensor *llama_find_tensor(const Llama *m, const char *name) {
  for (int i = 0; i < N_TENSORS; i++)
    if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
  return NULL;
}

// No memset: the next backward writes the gradients instead of adding to them (Ops.set_grad_overwrite).
void llama_zero_grad(Llama *m) { m->grads_stale = 1; }

// The grads are read (after a backward, or by a caller right after llama_zero_grad): make them real.
float *llama_grads(Llama *m) {
  if (m->grads_stale) {
    m->ops->zero(m->ops->ctx, m->grads, m->n_params * sizeof(float));
    m->grads_stale = 0;
  }
  return m->grads;
}

// Runs the backward from the fused head's output in a->dnorm; see llama_zero_grad.
static void backward_blocks(Llama *m);
static void backward_all(Llama *m, float dloss, int head_done) {
  const Ops *op = m->ops;
  Acts *a = &m->a;
  int overwrite = m->grads_stale;
  if (overwrite) op->set_grad_overwrite(op->ctx, 1);
  m->grads_stale = 0;
  // embed_bwd adds (a scatter): its table is the one gradient that still needs zeroing
  if (overwrite) op->zero(op->ctx, whole(m, m->grads, T_EMBED), m->tensors[T_EMBED].numel * sizeof(float));
  if (!head_done)  // head + loss again (llama_forward kept no logits) -> d(final norm output) in dnorm
    op->head_ce(op->ctx, a->dnorm, whole(m, m->grads, T_HEAD), a->logits, a->final, whole(m, m->params, T_HEAD),
                a->targets, m->N, m->c.dim, m->c.vocab_size, m->head_chunk, m->ignore_index, dloss);
  backward_blocks(m);
  if (overwrite) op->set_grad_overwrite(op->ctx, 0);
}

void llama_init(Llama *m, uint64_t seed) {
  // Generated on the host in blocks and uploaded. Each 64K-element chunk of a tensor has its own
  // RNG stream keyed by (seed, tensor, chunk), so the values do not depend on the thread count.
  enum { CHUNK = 1 << 16, BLOCK = 256 * CHUNK };
  size_t largest = 0;
  for (int id = 0; id < N_TENSORS; id++) largest = m->tensors[id].numel > largest ? m->tensors[id].numel : largest;
  float *host = xmalloc((largest < BLOCK ? largest : BLOCK) * sizeof(float));
  for (int id = 0; id < N_TENSORS; id++) {
    const ParamTensor *t = &m->tensors[id];
    for (size_t b0 = 0; b0 < t->numel; b0 += BLOCK) {
      size_t nb = t->numel - b0 < BLOCK ? t->numel - b0 : BLOCK;
      if (!t->decay) {  // RMSNorm weights start at 1
        for (size_t i = 0; i < nb; i++) host[i] = 1.0f;
      } else {
#pragma omp parallel for schedule(static)
        for (size_t c0 = 0; c0 < nb; c0 += CHUNK) {
          uint64_t key[3] = {seed, (uint64_t)id, (b0 + c0) / CHUNK};
          Rng r;
          rng_seed(&r, hash64(key, sizeof key, 0));
          size_t end = c0 + CHUNK < nb ? c0 + CHUNK : nb;
          for (size_t i = c0; i < end; i++) host[i] = 0.02f * rng_normal(&r);
        }
      }
      m->ops->upload(m->ops->ctx, m->params + t->offset + b0, host, nb * sizeof(float));
    }
  }
  free(host);
  m->ops->params_changed(m->ops->ctx);
}

// ---- the graph ----------------------------------------------------------------------------------

static LinearId lin(int layer, LinearKind kind) { return (LinearId){layer, kind}; }

// The two halves of a block's forward. forward_blocks runs them for every block; with
// recomputation the backward runs them again, block by block, to refill what the forward did not
// keep. Rerunning an op on the same inputs gives the same bits (every op is deterministic). That
// holds for the FP4 recipes too: a linear layer's quantization of x is a pure function of x and
// the step, and its stochastic-rounding bits are keyed by (step, micro-batch, layer, tensor)
// (model/cuda/linear_fp4.h), not by how many times the layer was called.

// out = res + x W^T: a linear and the residual add after it, the add in the linear's GEMM epilogue
// where the backend has that fusion for id (Ops.fuses_residual, matmul_residual_fwd: the same bits),
// else the two ops through the block's scratch a->tmp.
static void linear_residual_fwd(Llama *m, LinearId id, void *out, const void *res, const void *x, const float *w,
                                int in, int out_dim) {
  const Ops *op = m->ops;
  const int N = m->N;
  if (op->fuses_residual && op->fuses_residual(op->ctx, id)) {
    op->matmul_residual_fwd(op->ctx, id, out, res, x, w, N, in, out_dim);
    return;
  }
  op->matmul_fwd(op->ctx, id, m->a.tmp, x, w, N, in, out_dim);
  op->residual_fwd(op->ctx, out, res, m->a.tmp, (size_t)N * out_dim);
}

// Attention half: res_mid = res_in + wo(attention(rope(q), rope(k), v)), q/k/v from rmsnorm(res_in).
// Also regenerates the attention's lse.
static void attention_half_fwd(Llama *m, int l, const LayerWeights *w, const LayerActs *s) {
  const Ops *op = m->ops;
  const int B = m->B, T = m->T, N = m->N, D = m->c.dim, H = m->c.n_heads, KV = m->c.n_kv_heads;
  const int hd = m->hd, Q = m->qdim, K = m->kvdim;
  if (op->rmsnorm_fwd_into)  // the backend may compute attn_in inside the producer of q/k/v's FP4 input
    op->rmsnorm_fwd_into(op->ctx, lin(l, LIN_Q), s->attn_in, s->attn_rstd, s->res_in, w->attn_norm, N, D,
                         m->c.norm_eps);
  else op->rmsnorm_fwd(op->ctx, s->attn_in, s->attn_rstd, s->res_in, w->attn_norm, N, D, m->c.norm_eps);
  op->matmul_fwd(op->ctx, lin(l, LIN_Q), s->q, s->attn_in, w->wq, N, D, Q);
  op->matmul_fwd(op->ctx, lin(l, LIN_K), s->k, s->attn_in, w->wk, N, D, K);
  op->matmul_fwd(op->ctx, lin(l, LIN_V), s->v, s->attn_in, w->wv, N, D, K);
  op->rope_fwd(op->ctx, s->q, m->rope_cos, m->rope_sin, m->rope_pos, B, T, H, hd);
  op->rope_fwd(op->ctx, s->k, m->rope_cos, m->rope_sin, m->rope_pos, B, T, KV, hd);
  op->attention_fwd(op->ctx, s->att, s->lse, s->q, s->k, s->v, m->docmask, B, T, H, KV, hd);
  linear_residual_fwd(m, lin(l, LIN_O), s->res_mid, s->res_in, s->att, w->wo, Q, D);
}

// Feed-forward half up to w_down's input: swi = silu(w_gate x) * (w_up x), x = rmsnorm(res_mid).
// (w_down and the residual add, whose outputs the backward does not read, stay in forward_blocks.)
static void ffn_hidden_fwd(Llama *m, int l, const LayerWeights *w, const LayerActs *s) {
  const Ops *op = m->ops;
  const int N = m->N, D = m->c.dim, F = m->c.ffn_dim;
  if (op->rmsnorm_fwd_into)  // likewise ffn_in for gate/up, and swi for down (format-aware fusion)
    op->rmsnorm_fwd_into(op->ctx, lin(l, LIN_GATE), s->ffn_in, s->ffn_rstd, s->res_mid, w->ffn_norm, N, D,
                         m->c.norm_eps);
  else op->rmsnorm_fwd(op->ctx, s->ffn_in, s->ffn_rstd, s->res_mid, w->ffn_norm, N, D, m->c.norm_eps);
  op->matmul_fwd(op->ctx, lin(l, LIN_GATE), s->gate, s->ffn_in, w->w_gate, N, D, F);
  if (op->fuses_swiglu && op->fuses_swiglu(op->ctx, lin(l, LIN_UP), lin(l, LIN_DOWN), N, F)) {
    op->matmul_swiglu_fwd(op->ctx, lin(l, LIN_UP), lin(l, LIN_DOWN), s->up, s->swi, s->ffn_in, w->w_up, s->gate, N, D,
                          F);
    return;  // SwiGLU (and down's input producer) ran in up's GEMM epilogue
  }
  op->matmul_fwd(op->ctx, lin(l, LIN_UP), s->up, s->ffn_in, w->w_up, N, D, F);
  if (op->swiglu_fwd_into) op->swiglu_fwd_into(op->ctx, lin(l, LIN_DOWN), s->swi, s->gate, s->up, N, F);
  else op->swiglu_fwd(op->ctx, s->swi, s->gate, s->up, (size_t)N * F);
}

// Embedding, the blocks and the final norm: fills every saved activation up to a->final.
static void param_wait(const Llama *m, int group);

// A range named "block <l+1> <what>" on a profiler's timeline around a block's ops (Ops.range_push:
// NVTX with logging.nvtx on the CUDA backend; NULL otherwise, and then this is one test).
static void range_push(const Llama *m, int l, const char *what) {
  if (!m->ops->range_push) return;
  char name[48];
  snprintf(name, sizeof name, "block %d %s", l + 1, what);  // counted from 1, as the config counts blocks
  m->ops->range_push(m->ops->ctx, name);
}
static void range_pop(const Llama *m) {
  if (m->ops->range_pop) m->ops->range_pop(m->ops->ctx);
}
static void find_docs(Llama *m, const int *inputs);

static void forward_blocks(Llama *m, const int *inputs) {
  const Ops *op = m->ops;
  const LlamaConfig *c = &m->c;
  Acts *a = &m->a;
  const int N = m->N, D = c->dim, F = c->ffn_dim;

  op->upload(op->ctx, a->inputs, inputs, (size_t)N * sizeof(int));
  find_docs(m, inputs);
  param_wait(m, 0);
  op->embed_fwd(op->ctx, a->res, a->inputs, whole(m, m->params, T_EMBED), N, D, c->vocab_size);
  for (int l = 0; l < c->n_layers; l++) {
    param_wait(m, 1 + l);
    range_push(m, l, "fwd");
    LayerWeights w = layer_weights(m, m->params, l);
    LayerActs s = layer_acts(m, l);
    attention_half_fwd(m, l, &w, &s);
    // feed-forward: res_out = res_mid + w_down(swi)
    ffn_hidden_fwd(m, l, &w, &s);
    linear_residual_fwd(m, lin(l, LIN_DOWN), s.res_out, s.res_mid, s.swi, w.w_down, F, D);
    range_pop(m);
  }
  void *res_last = act(m, a->res, (size_t)c->n_layers * N * D);
  param_wait(m, c->n_layers + 1);  // the final norm and the head (every caller's next op)
  op->rmsnorm_fwd(op->ctx, a->final, a->final_rstd, res_last, whole(m, m->params, T_FINAL_NORM), N, D, c->norm_eps);
}

float llama_forward(Llama *m, const int *inputs, const int *targets, int ignore_index) {
  if (!inputs || !targets) die("llama_forward: inputs and targets are required (use llama_logits for logits only)");
  const Ops *op = m->ops;
  forward_blocks(m, inputs);
  op->upload(op->ctx, m->a.targets, targets, (size_t)m->N * sizeof(int));
  m->have_targets = 1;
  m->ignore_index = ignore_index;
  // loss only: the backward recomputes the logits, so no [N, V] buffer is kept between the passes
  return op->head_ce(op->ctx, NULL, NULL, m->a.logits, m->a.final, whole(m, m->params, T_HEAD), m->a.targets, m->N,
                     m->c.dim, m->c.vocab_size, m->head_chunk, ignore_index, 0.0f);
}

void llama_set_linear_tap(Llama *m, LlamaLinearTap fn, void *ctx) {
  m->tap = fn;
  m->tap_ctx = ctx;
}

// One block linear's backward, shown to the tap first.
static void linear_bwd(Llama *m, LinearId id, void *dx, float *dw, const void *dout, const void *x, const float *w,
                       int N, int in, int out_dim, int dx_accumulate) {
  if (m->tap) m->tap(m->tap_ctx, id, dout, w, N, in, out_dim);
  m->ops->matmul_bwd(m->ops->ctx, id, dx, dw, dout, x, w, N, in, out_dim, dx_accumulate);
}

void llama_set_grad_hook(Llama *m, LlamaGradHook fn, void *ctx) {
  m->grad_hook = fn;
  m->grad_hook_ctx = ctx;
}

void llama_set_param_wait(Llama *m, LlamaParamWait fn, void *ctx) {
  m->param_wait = fn;
  m->param_wait_ctx = ctx;
}

int llama_param_group(const Llama *m, int group, size_t *off, size_t *len) {
  const int L = m->c.n_layers;
  if (group < 0 || group > L + 1) die("llama_param_group: group %d outside [0, %d]", group, L + 1);
  if (group == 0) {
    off[0] = m->tensors[T_EMBED].offset, len[0] = m->tensors[T_EMBED].numel;
    return 1;
  }
  if (group == L + 1) {
    off[0] = m->tensors[T_FINAL_NORM].offset, len[0] = m->tensors[T_FINAL_NORM].numel;
    off[1] = m->tensors[T_HEAD].offset, len[1] = m->tensors[T_HEAD].numel;
    return 2;
  }
  static const int ids[9] = {T_ATTN_NORM, T_WQ, T_WK, T_WV, T_WO, T_FFN_NORM, T_GATE, T_UP, T_DOWN};
  for (int i = 0; i < 9; i++) {
    const ParamTensor *t = &m->tensors[ids[i]];
    len[i] = t->numel / (size_t)L;
    off[i] = t->offset + (size_t)(group - 1) * len[i];
  }
  return 9;
}

static void param_wait(const Llama *m, int group) {
  if (m->param_wait) m->param_wait(m->param_wait_ctx, group);
}

// Tells the hook that tensor id's slice for layer l (l < 0: the whole tensor) got its last
// contribution of this backward (its ops are queued, not necessarily finished).
static void grad_ready(Llama *m, int id, int l) {
  if (!m->grad_hook) return;
  const ParamTensor *t = &m->tensors[id];
  size_t len = l < 0 ? t->numel : t->numel / (size_t)m->c.n_layers;
  m->grad_hook(m->grad_hook_ctx, t->offset + (l < 0 ? 0 : (size_t)l * len), len);
}

// The backward from d(final norm output) (in a->dnorm, written by the fused head) down to the
// embedding.
// A block whose BF16 linear inputs were not kept needs the backend's quantized copies: dies, naming
// the block, if the backend no longer keeps them (its recipe or saving mode changed since the model
// was created), instead of differentiating against another block's input.
static void check_saved_inputs(const Llama *m) {
  if (m->recompute != LLAMA_RECOMPUTE_NONE || !m->ops->linear_saves_input) return;
  static const char *what[3] = {"attention input (q, k, v)", "feed-forward input (gate, up)", "down input"};
  for (int b = 0; b < 3; b++)
    for (int l = 0; l < m->c.n_layers; l++) {
      if (!(m->input_saved[l] >> b & 1)) continue;  // block l keeps its own BF16 input
      for (int u = 0; u < 3; u++)
        if (!m->ops->linear_saves_input(m->ops->ctx, (LinearId){l, INPUT_USERS[b][u]}))
          die("model: block %d's BF16 %s was not kept because the backend kept a quantized copy when the model "
              "was created; its recipe or input saving has changed since: create the model after setting the "
              "recipe (and recompute mode) it trains with",
              l, what[b]);
    }
}

static void backward_blocks(Llama *m) {
  check_saved_inputs(m);
  const Ops *op = m->ops;
  const LlamaConfig *c = &m->c;
  Acts *a = &m->a;
  const int B = m->B, T = m->T, N = m->N, D = c->dim, F = c->ffn_dim, H = c->n_heads, KV = c->n_kv_heads;
  const int hd = m->hd, Q = m->qdim, K = m->kvdim;
  float *p = m->params, *g = m->grads;

  op->zero(op->ctx, a->dres, (size_t)N * D * op->act_bytes);
  void *res_last = act(m, a->res, (size_t)c->n_layers * N * D);
  op->rmsnorm_bwd(op->ctx, a->dres, whole(m, g, T_FINAL_NORM), a->dnorm, res_last, whole(m, p, T_FINAL_NORM),
                  a->final_rstd, N, D);
  grad_ready(m, T_HEAD, -1);  // the fused head ran before this function
  grad_ready(m, T_FINAL_NORM, -1);

  // dres holds d(res_out) of block l on entry and d(res_in) on exit: the residual adds pass it
  // through unchanged and each norm's backward adds its branch into it.
  for (int l = c->n_layers - 1; l >= 0; l--) {
    range_push(m, l, "bwd");
    LayerWeights w = layer_weights(m, p, l), dw = layer_weights(m, g, l);
    LayerActs s = layer_acts(m, l);
    // refill the scratch slices of this block from its saved input (res_in, or res_mid for ffn)
    if (attn_recomputed(m, l)) attention_half_fwd(m, l, &w, &s);
    if (ffn_recomputed(m, l)) ffn_hidden_fwd(m, l, &w, &s);
    // feed-forward
    linear_bwd(m, lin(l, LIN_DOWN), a->dswi, dw.w_down, a->dres, s.swi, w.w_down, N, F, D, 0);
    op->swiglu_bwd(op->ctx, a->dgate, a->dup, a->dswi, s.gate, s.up, (size_t)N * F);
    linear_bwd(m, lin(l, LIN_GATE), a->dnorm, dw.w_gate, a->dgate, s.ffn_in, w.w_gate, N, D, F, 0);
    linear_bwd(m, lin(l, LIN_UP), a->dnorm, dw.w_up, a->dup, s.ffn_in, w.w_up, N, D, F, 1);
    op->rmsnorm_bwd(op->ctx, a->dres, dw.ffn_norm, a->dnorm, s.res_mid, w.ffn_norm, s.ffn_rstd, N, D);
    // attention
    linear_bwd(m, lin(l, LIN_O), a->datt, dw.wo, a->dres, s.att, w.wo, N, Q, D, 0);
    op->attention_bwd(op->ctx, a->dq, a->dk, a->dv, a->datt, s.q, s.k, s.v, s.att, s.lse, m->docmask, B, T, H, KV, hd);
    op->rope_bwd(op->ctx, a->dq, m->rope_cos, m->rope_sin, m->rope_pos, B, T, H, hd);
    op->rope_bwd(op->ctx, a->dk, m->rope_cos, m->rope_sin, m->rope_pos, B, T, KV, hd);
    linear_bwd(m, lin(l, LIN_Q), a->dnorm, dw.wq, a->dq, s.attn_in, w.wq, N, D, Q, 0);
    linear_bwd(m, lin(l, LIN_K), a->dnorm, dw.wk, a->dk, s.attn_in, w.wk, N, D, K, 1);
    linear_bwd(m, lin(l, LIN_V), a->dnorm, dw.wv, a->dv, s.attn_in, w.wv, N, D, K, 1);
    op->rmsnorm_bwd(op->ctx, a->dres, dw.attn_norm, a->dnorm, s.res_in, w.attn_norm, s.attn_rstd, N, D);
    static const int block_tensors[] = {T_DOWN, T_GATE, T_UP, T_FFN_NORM, T_WO, T_WQ, T_WK, T_WV, T_ATTN_NORM};
    for (size_t i = 0; i < sizeof block_tensors / sizeof *block_tensors; i++) grad_ready(m, block_tensors[i], l);
    range_pop(m);
  }
  op->embed_bwd(op->ctx, whole(m, g, T_EMBED), a->dres, a->inputs, N, D);
  grad_ready(m, T_EMBED, -1);
}

void llama_backward(Llama *m, float dloss) {
  if (!m->have_targets)
    die("llama_backward: call llama_forward first (llama_logits overwrites the activations it saved)");
  backward_all(m, dloss, 0);
}

float llama_forward_backward(Llama *m, const int *inputs, const int *targets, int ignore_index, float dloss) {
  if (!inputs || !targets) die("llama_forward_backward: inputs and targets are required");
  const Ops *op = m->ops;
  Acts *a = &m->a;
  forward_blocks(m, inputs);
  op->upload(op->ctx, a->targets, targets, (size_t)m->N * sizeof(int));
  m->have_targets = 1;
  m->ignore_index = ignore_index;
  // one pass of the fused head: the loss and its gradient together, no logits recomputed
  int overwrite = m->grads_stale;
  if (overwrite) op->set_grad_overwrite(op->ctx, 1);
  float loss =
      op->head_ce(op->ctx, a->dnorm, whole(m, m->grads, T_HEAD), a->logits, a->final, whole(m, m->params, T_HEAD),
                  a->targets, m->N, m->c.dim, m->c.vocab_size, m->head_chunk, ignore_index, dloss);
  if (overwrite) op->set_grad_overwrite(op->ctx, 0);
  backward_all(m, dloss, 1);
  return loss;
}

void llama_token_nll(Llama *m, const int *inputs, int n, const int *pos, const int *targets, float *nll) {
  for (int i = 0; i < n; i++) {
    if (pos[i] < 0 || pos[i] >= m->N) die("llama_token_nll: position %d is outside [0, %d)", pos[i], m->N);
    if (targets[i] < 0 || targets[i] >= m->c.vocab_size)
      die("llama_token_nll: target id %d at position %d is outside [0, %d)", targets[i], pos[i], m->c.vocab_size);
  }
  const Ops *op = m->ops;
  forward_blocks(m, inputs);
  m->have_targets = 0;  // a backward would need llama_forward's bookkeeping
  op->head_nll(op->ctx, nll, m->a.logits, m->a.final, whole(m, m->params, T_HEAD), pos, targets, n, m->c.dim,
               m->c.vocab_size, m->head_chunk);
}

void llama_logits(Llama *m, const int *inputs, float *out) {
  const Ops *op = m->ops;
  const int N = m->N, D = m->c.dim, V = m->c.vocab_size;
  forward_blocks(m, inputs);
  m->have_targets = 0;  // the saved activations no longer match the last llama_forward's targets
  for (int n0 = 0; n0 < N; n0 += m->head_chunk) {
    int nc = N - n0 < m->head_chunk ? N - n0 : m->head_chunk;
    op->matmul_fwd(op->ctx, lin(-1, LIN_HEAD), m->a.logits, act(m, m->a.final, (size_t)n0 * D),
                   whole(m, m->params, T_HEAD), nc, D, V);
    op->acts_to_f32(op->ctx, out + (size_t)n0 * V, m->a.logits, (size_t)nc * V);
  }
}
