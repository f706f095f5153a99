// run/config.c: the training configuration. One table (KEYS) describes every key; loading YAML
// (libyaml's document API), --set overrides, validation of single values, YAML output and the
// reference are all driven by it. Only the cross-field checks in validate() are written per key.
#include "run/config.h"

#include "fp4/recipe.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "common/common.h"
#include "data/blend.h"
#include "data/evals.h"

// ---------------------------------------------------------------------------------------------
// The key table

typedef enum { K_INT, K_U64, K_FLOAT, K_BOOL, K_STRING, K_ENUM, K_PRESET } KeyType;
static const char *const TYPE_NAMES[] = {"int", "uint64", "float", "bool", "string", "enum", "preset"};

enum { OPEN_LO = 1, OPEN_HI = 2 };  // range flags: the bound itself is excluded

typedef struct {
  const char *name;  // "section.key", or "key" at the top level
  KeyType type;
  size_t offset, size;  // the field in TrainConfig
  const char *def;      // default, parsed like any other value; NULL: filled by model.preset
  double lo, hi;        // range of int and float keys (see flags); +-INFINITY or INT_MIN/MAX: unbounded
  int flags;
  const char *choices;  // enum: allowed values, separated by '|'
  const char *help;
} Key;

#define FIELD(f) offsetof(TrainConfig, f), sizeof(((TrainConfig *)0)->f)
#define BIG INT_MAX
#define INF INFINITY
#define KINT(name, f, def, lo, hi, help) \
  { name, K_INT, FIELD(f), def, lo, hi, 0, NULL, help }
#define KFLOAT(name, f, def, lo, hi, flags, help) \
  { name, K_FLOAT, FIELD(f), def, lo, hi, flags, NULL, help }
#define KBOOL(name, f, def, help) \
  { name, K_BOOL, FIELD(f), def, 0, 1, 0, NULL, help }
#define KSTR(name, f, def, help) \
  { name, K_STRING, FIELD(f), def, 0, 0, 0, NULL, help }
#define KENUM(name, f, def, choices, help) \
  { name, K_ENUM, FIELD(f), def, 0, 0, 0, choices, help }

// Order matters twice: YAML output follows it, and model.preset precedes the keys it fills.
static const Key KEYS[] = {
    {"seed", K_U64, FIELD(seed), "42", 0, 0, 0, NULL, "seed of initialization, data order and stochastic rounding"},

    {"model.preset", K_PRESET, FIELD(model_preset), "tiny", 0, 0, 0, NULL,
     "architecture preset; applied first, then the other model keys override it"},
    KINT("model.vocab_size", model.vocab_size, NULL, 2, BIG, "vocabulary size (embedding and output head rows)"),
    KINT("model.dim", model.dim, NULL, 1, BIG, "model width d_model"),
    KINT("model.n_layers", model.n_layers, NULL, 1, BIG, "number of transformer blocks"),
    KINT("model.n_heads", model.n_heads, NULL, 1, BIG, "query heads; must divide model.dim, head dim even"),
    KINT("model.n_kv_heads", model.n_kv_heads, NULL, 1, BIG, "key/value heads (GQA); must divide model.n_heads"),
    KINT("model.ffn_dim", model.ffn_dim, NULL, 1, BIG, "SwiGLU hidden size"),
    KINT("model.max_seq_len", model.max_seq_len, NULL, 1, BIG, "longest sequence the RoPE tables cover"),
    KFLOAT("model.norm_eps", model.norm_eps, NULL, 0, 1, OPEN_LO, "RMSNorm epsilon"),
    KFLOAT("model.rope_theta", model.rope_theta, NULL, 0, INF, OPEN_LO, "RoPE base"),
    KBOOL("model.rope_scaling", model.rope_scaling, NULL, "Llama-3.1 RoPE frequency scaling (the four keys below)"),
    KFLOAT("model.rope_factor", model.rope_factor, NULL, 1, INF, 0, "scaling: factor dividing the low frequencies"),
    KFLOAT("model.rope_low_freq_factor", model.rope_low_freq_factor, NULL, 0, INF, OPEN_LO, "scaling: low_freq_factor"),
    KFLOAT("model.rope_high_freq_factor", model.rope_high_freq_factor, NULL, 0, INF, OPEN_LO,
           "scaling: high_freq_factor; must exceed low_freq_factor"),
    KINT("model.rope_original_max_pos", model.rope_original_max_pos, NULL, 1, BIG, "scaling: original context length"),
    KINT("model.ignore_index", ignore_index, "-1", INT_MIN, BIG, "target id that adds no loss; not a valid token id"),
    KENUM("model.doc_mask", doc_mask, "none", "none|block_causal",
          "block_causal: attention does not cross a document boundary (a document starts at each model.bos_id and "
          "at each sequence's first token; docs/data.md); none: plain causal over the whole sequence"),
    KENUM("model.doc_positions", doc_positions, "continue", "continue|restart",
          "RoPE positions: continue through the sequence, or restart at 0 at each model.bos_id (with block_causal the "
          "two agree up to rounding: attention sees only distances within a document)"),
    KINT("model.bos_id", bos_id, "128000", 0, BIG,
         "the token that starts a document (Llama-3's <|begin_of_text|>); read by doc_mask and doc_positions"),

    KFLOAT("optim.lr", lr, "3e-4", 0, INF, 0, "peak learning rate (AdamW)"),
    KFLOAT("optim.beta1", beta1, "0.9", 0, 1, OPEN_HI, "AdamW beta1"),
    KFLOAT("optim.beta2", beta2, "0.95", 0, 1, OPEN_HI, "AdamW beta2"),
    KFLOAT("optim.eps", eps, "1e-8", 0, INF, OPEN_LO, "AdamW epsilon"),
    KFLOAT("optim.weight_decay", weight_decay, "0.1", 0, INF, 0, "decoupled weight decay"),
    KFLOAT("optim.grad_clip", grad_clip, "1.0", -INF, INF, 0, "global gradient-norm clip; <= 0 disables"),
    KBOOL("optim.decay_norms", decay_norms, "false",
          "decay the RMSNorm weights too (TorchTitan's convention, so the paper's runs); false: matrices only, as "
          "Megatron-LM"),

    KENUM("schedule.type", schedule, "constant", "constant|cosine|wsd",
          "lr after linear warmup: constant, cosine to the floor, or wsd (stable, then decay)"),
    KINT("schedule.warmup_steps", warmup_steps, "20", 0, BIG, "steps of linear warmup up to optim.lr"),
    KINT("schedule.total_steps", total_steps, "300", 1, BIG, "training length in optimizer steps"),
    KFLOAT("schedule.min_lr_ratio", min_lr_ratio, "0.1", 0, 1, 0, "cosine/wsd floor as a fraction of optim.lr"),
    KINT("schedule.decay_start", decay_start, "240", 0, BIG, "wsd: first decay step; >= total_steps: never reached"),
    KINT("schedule.decay_steps", decay_steps, "60", 0, BIG, "wsd: length of the linear decay to the floor"),

    KINT("batch.micro_batch", micro_batch, "8", 1, BIG, "sequences per forward/backward per rank"),
    KINT("batch.global_batch", global_batch, "16", 1, BIG,
         "sequences per optimizer step, all ranks; a multiple of micro_batch x data_parallel"),
    KINT("batch.seq_len", seq_len, "64", 1, BIG, "tokens per sequence; <= model.max_seq_len"),

    KSTR("data.train", train_data, "synthetic",
         "\"synthetic\", or shard paths/globs separated by commas, or a blend: [NAME=]WEIGHT:PATHS,... or a YAML "
         "list of {path, weight, name} (docs/data.md)"),
    KSTR("data.val", val_data, "", "validation shards, same form; empty: no validation"),
    KSTR("data.tokenizer", tokenizer_path, "", "tiktoken-format tokenizer.model (needed by eval.tasks)"),

    KENUM("precision.recipe", recipe, "bf16", RECIPE_FORMATS,
          "format of the linear layers: bf16, mxfp4 (the paper's), nvfp4 (one fp32 tensor scale per operand: TE's "
          "and the paper's global NVFP4), nvfp4_cta (the paper's CTA-local NVFP4: fp32 outer factors per 256 rows)"),
    KENUM("precision.sr", sr, "auto", RECIPE_SR,
          "stochastic rounding of dY: for Dgrad only (mxfp4 default), or Dgrad and Wgrad (nvfp4 default)"),
    KENUM("precision.hadamard", hadamard, "auto", RECIPE_HADAMARD,
          "Hadamard on both Wgrad operands along tokens (mxfp4: h32, nvfp4: h16, nvfp4_cta: none); h16_plain: "
          "without the fixed sign flips"),
    KENUM("precision.weight_2d", weight_2d, "auto", RECIPE_WEIGHT_2D,
          "2D weight scales (32x32 MXFP4, 16x16 NVFP4) so W and W^T share codes (default on)"),
    KENUM("precision.scale_rounding", scale_rounding, "auto", RECIPE_SCALE_ROUNDING,
          "MXFP4 block exponent: up = the paper's encode-centric 2^ceil(log2 amax), down = OCP's floor - 2"),
    KENUM("precision.wgrad_2d", wgrad_2d, "auto", RECIPE_WGRAD_2D,
          "fp8 back end: embed one Wgrad operand per 128x128 tile for cuBLASLt's faster mode (auto = dy)"),
    KENUM("precision.fp4_gemm", fp4_gemm, "auto", RECIPE_FP4_GEMM,
          "FP4 GEMM back end: reference (dequantize, BF16 GEMM), fp8 (Hopper embedding: per shape the faster of "
          "cuBLASLt and CUTLASS's where their bits agree; cuBLASLt alone in a build without CUTLASS), fp8_cublaslt "
          "or fp8_cutlass (one of them; fp8_own, our own kernel, was removed on 2026-12-05), fp4 (Blackwell native); "
          "auto: fp4 on Blackwell (reference with CTA-local NVFP4), "
          "fp8_cublaslt on Hopper with an MXFP4 contraction, else reference"),
    KENUM("precision.fusion", fusion, "auto", RECIPE_FUSION,
          "format-aware fusion around the FP4 GEMMs, the same bits either way: auto = those that have run on a GPU "
          "and measured faster (RMSNorm and SwiGLU inside the quantizers); on = also the newer ones (the residual "
          "add in the o/down GEMM epilogue, SwiGLU and down's producer in up's GEMM epilogue); off = none (for "
          "measuring)"),
    KINT("precision.bf16_first_blocks", bf16_first_blocks, "0", 0, BIG, "the first N blocks stay in BF16"),
    KINT("precision.bf16_last_blocks", bf16_last_blocks, "0", 0, BIG,
         "the last N blocks stay in BF16 (the paper's NVFP4 variant keeps 4)"),
    KSTR("precision.blocks", blocks, "",
         "formats per block, counted from 1: \"nvfp4_cta:1-27,mxfp4:28-32\" (the paper's depth hybrid); blocks "
         "not named take precision.recipe"),
    KENUM("precision.fprop", fprop, "auto", RECIPE_CONTRACTION,
          "the Fprop GEMM's format in every FP4 block; auto: the block's"),
    KENUM("precision.dgrad", dgrad, "auto", RECIPE_CONTRACTION,
          "the Dgrad GEMM's format in every FP4 block (the paper's operand hybrid: nvfp4_cta with mxfp4 blocks)"),
    KENUM("precision.wgrad", wgrad, "auto", RECIPE_CONTRACTION, "the Wgrad GEMM's format in every FP4 block"),

    KSTR("checkpoint.dir", ckpt_dir, "", "checkpoint directory; empty: no checkpoints"),
    KINT("checkpoint.interval", ckpt_interval, "0", 0, BIG, "steps between checkpoints; 0: only at the end"),
    KINT("checkpoint.keep", ckpt_keep, "3", 1, BIG, "checkpoints kept (older ones are deleted)"),
    KBOOL("checkpoint.resume", resume, "false", "resume from the latest checkpoint in checkpoint.dir, if any"),
    KBOOL("checkpoint.async", ckpt_async, "true",
          "copy the state to host memory at the save's step and write the file in a background thread while "
          "training goes on (costs a host copy of the saved state); false: training waits for the whole write"),
    KSTR("checkpoint.init_from", init_from, "",
         "start from the \"params\" of this file instead of the random init: a model imported by "
         "scripts/hf/import_hf.py, or another run's checkpoint; the model keys must match it; a resume takes "
         "precedence"),

    KINT("logging.interval", log_interval, "1", 1, BIG, "steps between log lines"),
    KSTR("logging.file", log_file, "", "JSONL metrics file; empty: none"),
    KSTR("logging.tensorboard", tensorboard, "",
         "folder for TensorBoard event files of the same metrics (rank 0 writes; a resume starts a new file); "
         "empty: none"),
    KBOOL("logging.nvtx", nvtx, "false",
          "CUDA: NVTX ranges around each block and each op of the backend, named as the per-kernel table, for an "
          "Nsight Systems timeline"),

    KINT("eval.interval", eval_interval, "0", 0, BIG, "steps between validation passes; 0: none"),
    KINT("eval.batches", eval_batches, "8", 1, BIG, "micro-batches per validation pass"),
    KSTR("eval.tasks", eval_tasks, "",
         "downstream tasks with shot counts, e.g. \"mmlu:5,hellaswag:10\", or \"paper\" (mmlu:5, hellaswag:10, "
         "winogrande:5, arc_challenge:25, the paper's); empty: none"),
    KSTR("eval.dir", eval_dir, "",
         "folder holding mmlu.jsonl, hellaswag_val.txt, arc_challenge.jsonl, winogrande.jsonl"),
    KSTR("eval.samples", eval_samples, "",
         "folder for each task's per-document results (<task>.jsonl, rewritten at every eval); empty: none"),
    KINT("eval.limit", eval_limit, "0", 0, BIG,
         "documents per task (the first N; MMLU: the first N of each subject, as the harness's --limit); 0: all"),

    KINT("reliability.max_bad_steps", max_bad_steps, "10", 1, BIG,
         "consecutive non-finite steps (each skipped) after which the run stops; the last checkpoint is kept"),
    KFLOAT("reliability.spike_factor", spike_factor, "3.0", 0, INF, 0,
           "log a loss spike when a step's loss exceeds this x the running mean; 0: off, else > 1"),
    KINT("reliability.spike_window", spike_window, "20", 1, 100000, "steps in the running mean of the spike check"),

    KENUM("parallel.backend", backend, "auto", "auto|cpu|cuda", "compute backend; auto: cuda when a GPU is present"),
    KINT("parallel.threads", threads, "0", 0, BIG, "CPU backend OpenMP threads; 0: all cores"),
    KINT("parallel.data_parallel", data_parallel, "1", 1, BIG, "expected number of data-parallel ranks"),
    KBOOL("parallel.deterministic", deterministic, "true",
          "bit-reproducible GPU runs across processes (resume): cuDNN's deterministic attention backward, and GEMM "
          "algorithms timed once and recorded in parallel.gemm_plans (without a record: cuBLASLt's first "
          "heuristic); false: timed in each process, atomics in the attention backward (docs/determinism.md)"),
    KSTR("parallel.gemm_plans", gemm_plans, "",
         "file recording the GEMM algorithm choices of a deterministic run, reused by every later process (a "
         "resume, or another run sharing it; with several ranks each appends .rank_<r>); empty: "
         "checkpoint.dir/gemm_plans when checkpoint.dir is set"),
    KSTR("parallel.recompute", recompute, "none",
         "activation recomputation: ffn: the backward recomputes each block's feed-forward activations, "
         "full: the whole block from its input, selective_N: every Nth block (counted from 1) as full, the paper's "
         "selective-N (32 for its FP4 routes, 8 for BF16); less activation memory, same results, more compute"),
    KSTR("parallel.rendezvous", rendezvous, "env",
         "how ranks find rank 0: env (MASTER_ADDR, MASTER_PORT) or file:/shared/path (rank 0 writes host and port)"),
    KFLOAT("parallel.timeout_s", timeout_s, "600", 0, INF, OPEN_LO,
           "seconds a rendezvous or collective may wait for a peer before the run stops naming it; also bounds "
           "one overlapped gradient reduction (the last micro-batch's backward)"),
    KENUM("parallel.grad_reduce", grad_reduce, "fp32", "fp32|bf16",
          "gradient reduction across ranks: fp32, or bf16 on the wire (rounded to nearest even, summed in bf16: "
          "half the bytes, ~3 significant digits per summand)"),
    KBOOL("parallel.shard_master", shard_master, "true",
          "CUDA with several ranks: keep only this rank's shard of the fp32 master weights (and the RMSNorm "
          "weights), all-gathering the updated parameters in BF16; saves 4 bytes per parameter x (1 - 1/ranks)"),
    KBOOL("parallel.overlap_reduce", overlap_reduce, "true",
          "start each gradient bucket's reduction during the last micro-batch's backward instead of after it "
          "(same results)"),
    KFLOAT("parallel.bucket_mb", bucket_mb, "64", 0, INF, 0,
           "MB of fp32 gradients coalesced per overlapped reduction; 0: each tensor slice on its own"),
    KBOOL("parallel.dgrad_transposed", dgrad_transposed, "true",
          "CUDA: keep a BF16 W^T copy of every BF16 linear weight for a faster dgrad GEMM (2 bytes per weight: "
          "~14 GB for Llama-3 8B); false frees that memory"),
};
#define NKEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

// YAML line of each key from the last successful config_load; 0 when defaulted, filled by the
// preset or set with --set. Validation messages quote it.
static int key_lines[NKEYS];

static const Key *find_key(const char *name) {
  for (int i = 0; i < NKEYS; i++)
    if (!strcmp(KEYS[i].name, name)) return &KEYS[i];
  return NULL;
}

static int key_index(const char *name) {
  const Key *k = find_key(name);
  return k ? (int)(k - KEYS) : -1;
}

// Length of the section part of a key name ("optim" in "optim.lr"); 0 for top-level keys.
static size_t section_len(const char *name) {
  const char *dot = strchr(name, '.');
  return dot ? (size_t)(dot - name) : 0;
}

static int is_section(const char *s) {
  size_t n = strlen(s);
  for (int i = 0; i < NKEYS; i++)
    if (section_len(KEYS[i].name) == n && !strncmp(KEYS[i].name, s, n)) return 1;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Suggestions for misspelled names

static int edit_distance(const char *a, size_t na, const char *b, size_t nb) {
  if (na > 63 || nb > 63) return INT_MAX / 2;
  int row[64];
  for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= na; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= nb; j++) {
      int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      diag = up;
      row[j] = best;
    }
  }
  return row[nb];
}

// Edit distance, except that a name starting with the other ("optimizer", "optim") counts as 1.
static int name_distance(const char *a, size_t na, const char *b, size_t nb) {
  size_t shorter = na < nb ? na : nb;
  if (shorter >= 3 && na != nb && !strncmp(a, b, shorter)) return 1;
  return edit_distance(a, na, b, nb);
}

// Writes " (did you mean 'x'?)" into buf when some name is close, else "". A full key is compared
// whole and by its last part (so "schedule.lr" finds "optim.lr"); a top-level name is compared
// with sections and top-level keys.
static void suggest(const char *name, char *buf, size_t n) {
  const char *dot = strrchr(name, '.'), *leaf = dot ? dot + 1 : name;
  int best = INT_MAX;
  char cand[CFG_NAME] = "";
  for (int i = 0; i < NKEYS; i++) {
    const char *kn = KEYS[i].name;
    size_t sl = section_len(kn);
    int d;
    if (dot) {
      if (!sl) continue;
      d = name_distance(name, strlen(name), kn, strlen(kn));
      int dl = name_distance(leaf, strlen(leaf), kn + sl + 1, strlen(kn + sl + 1)) + 1;
      if (dl < d) d = dl;
      if (d < best) best = d, snprintf(cand, sizeof cand, "%s", kn);
    } else {
      size_t len = sl ? sl : strlen(kn);
      d = name_distance(name, strlen(name), kn, len);
      if (d < best) best = d, snprintf(cand, sizeof cand, "%.*s", (int)len, kn);
    }
  }
  size_t leaf_len = strlen(leaf);
  if (best <= 2 && (size_t)best < leaf_len) snprintf(buf, n, " (did you mean '%s'?)", cand);
  else if (n) buf[0] = 0;
}

// ---------------------------------------------------------------------------------------------
// Values: parsing (strict), range checks, formatting

static void *field(TrainConfig *c, const Key *k) { return (char *)c + k->offset; }
static const void *cfield(const TrainConfig *c, const Key *k) { return (const char *)c + k->offset; }

static int in_range(const Key *k, double v) {
  int lo_ok = (k->flags & OPEN_LO) ? v > k->lo : v >= k->lo;
  int hi_ok = (k->flags & OPEN_HI) ? v < k->hi : v <= k->hi;
  return lo_ok && hi_ok;
}

// "[0, 1)", ">= 1", "> 0", "constant|cosine|wsd", or "" when anything goes.
static void range_text(const Key *k, char *buf, size_t n) {
  buf[0] = 0;
  if (k->type == K_ENUM) {
    snprintf(buf, n, "%s", k->choices);
  } else if (k->type == K_PRESET) {  // "tiny, small, llama3_8b" -> "tiny|small|llama3_8b"
    size_t o = 0;
    for (const char *s = llama_preset_names(); *s && o + 1 < n; s++) {
      if (*s == ' ') continue;
      buf[o++] = *s == ',' ? '|' : *s;
    }
    buf[o] = 0;
  } else if (k->type == K_INT || k->type == K_FLOAT) {
    int no_lo = k->type == K_INT ? k->lo <= INT_MIN : isinf(k->lo);
    int no_hi = k->type == K_INT ? k->hi >= INT_MAX : isinf(k->hi);
    const char *gt = (k->flags & OPEN_LO) ? ">" : ">=", *lt = (k->flags & OPEN_HI) ? "<" : "<=";
    if (no_lo && no_hi) return;
    if (no_hi) snprintf(buf, n, "%s %g", gt, k->lo);
    else if (no_lo) snprintf(buf, n, "%s %g", lt, k->hi);
    else
      snprintf(buf, n, "%c%g, %g%c", (k->flags & OPEN_LO) ? '(' : '[', k->lo, k->hi, (k->flags & OPEN_HI) ? ')' : ']');
  }
}

static int out_of_range(const Key *k, const char *text, char *msg, size_t n) {
  char r[64];
  range_text(k, r, sizeof r);
  snprintf(msg, n, "must be %s%s, got %s", (r[0] == '[' || r[0] == '(') ? "in " : "", r, text);
  return -1;
}

// A plain decimal integer: optional sign, then digits only (no spaces, "1_000", hex or octal).
static int is_integer_text(const char *s, int allow_minus) {
  if (*s == '-' && allow_minus) s++;
  else if (*s == '+') s++;
  if (!*s) return 0;
  for (; *s; s++)
    if (*s < '0' || *s > '9') return 0;
  return 1;
}

// A plain decimal float: digits, '.', exponent. Rules out inf, nan and hex floats, which strtof takes.
static int is_float_text(const char *s) {
  int digits = 0;
  for (; *s; s++) {
    if (*s >= '0' && *s <= '9') digits = 1;
    else if (!strchr(".eE+-", *s)) return 0;
  }
  return digits;
}

static int match_choice(const char *choices, const char *s) {
  size_t n = strlen(s);
  for (const char *p = choices; p;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && !strncmp(p, s, n)) return 1;
    p = bar ? bar + 1 : NULL;
  }
  return 0;
}

static void set_string(char *dst, size_t size, const char *s) {
  memset(dst, 0, size);  // zero the tail too, so equal configs are equal bytes
  memcpy(dst, s, strlen(s));
}

// Parses text as key k's value and stores it in *c. Returns 0, or -1 with the reason in msg.
// Nothing is stored on failure.
static int set_value(TrainConfig *c, const Key *k, const char *text, char *msg, size_t n) {
  char shown[80];  // the value as quoted in messages, cut short if long
  snprintf(shown, sizeof shown, strlen(text) > 60 ? "'%.60s...'" : "'%s'", text);
  void *p = field(c, k);
  switch (k->type) {
    case K_INT: {
      if (!is_integer_text(text, 1)) return snprintf(msg, n, "expected an integer, got %s", shown), -1;
      errno = 0;
      long long v = strtoll(text, NULL, 10);
      if (errno == ERANGE || v < INT_MIN || v > INT_MAX)
        return snprintf(msg, n, "%s does not fit in a 32-bit integer", shown), -1;
      if (!in_range(k, (double)v)) return out_of_range(k, text, msg, n);
      *(int *)p = (int)v;
      return 0;
    }
    case K_U64: {
      if (!is_integer_text(text, 0)) return snprintf(msg, n, "expected a non-negative integer, got %s", shown), -1;
      errno = 0;
      unsigned long long v = strtoull(text, NULL, 10);
      if (errno == ERANGE) return snprintf(msg, n, "%s does not fit in 64 bits", shown), -1;
      *(uint64_t *)p = (uint64_t)v;
      return 0;
    }
    case K_FLOAT: {
      if (!is_float_text(text)) return snprintf(msg, n, "expected a number, got %s", shown), -1;
      char *end;
      errno = 0;
      float v = strtof(text, &end);
      if (*end) return snprintf(msg, n, "expected a number, got %s", shown), -1;
      if (errno == ERANGE || !isfinite(v)) return snprintf(msg, n, "%s is out of range for a 32-bit float", shown), -1;
      if (!in_range(k, v)) return out_of_range(k, text, msg, n);
      *(float *)p = v;
      return 0;
    }
    case K_BOOL: {
      static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
      for (int i = 0; i < 3; i++) {
        if (!strcasecmp(text, yes[i])) return *(int *)p = 1, 0;
        if (!strcasecmp(text, no[i])) return *(int *)p = 0, 0;
      }
      return snprintf(msg, n, "expected true or false (or yes/no, on/off), got %s", shown), -1;
    }
    case K_STRING:
    case K_ENUM:
    case K_PRESET: {
      if (strlen(text) >= k->size)
        return snprintf(msg, n, "value is %zu characters long, the limit is %zu", strlen(text), k->size - 1), -1;
      if (k->type == K_ENUM && !match_choice(k->choices, text)) {
        char r[128];
        range_text(k, r, sizeof r);
        for (char *s = r; *s; s++)
          if (*s == '|') *s = '/';
        // a value the key no longer takes says why (a config naming it must not run something else)
        if (!strcmp(k->name, "precision.fp4_gemm") && !strcmp(text, RECIPE_FP4_GEMM_REMOVED))
          return snprintf(msg, n, "%s; allowed: %s", RECIPE_FP4_GEMM_REMOVED_WHY, k->choices), -1;
        return snprintf(msg, n, "invalid value %s (allowed: %s)", shown, r), -1;
      }
      if (k->type == K_PRESET) {
        LlamaConfig m;
        if (llama_preset(text, &m))
          return snprintf(msg, n, "unknown preset %s (allowed: %s)", shown, llama_preset_names()), -1;
        c->model = m;
      }
      set_string(p, k->size, text);
      return 0;
    }
  }
  return -1;
}

// Shortest decimal that reads back (strtof) as exactly v; integral values keep a ".0".
static void format_float(float v, char *buf, size_t n) {
  if (v == truncf(v) && fabsf(v) < 1e9f) {
    snprintf(buf, n, "%.1f", v);
    return;
  }
  for (int prec = 1; prec <= 9; prec++) {
    snprintf(buf, n, "%.*g", prec, v);
    if (strtof(buf, NULL) == v) return;
  }
}

// Writes key k's value as text; with 'quote', strings become YAML double-quoted scalars.
static void format_value(const TrainConfig *c, const Key *k, int quote, char *buf, size_t n) {
  const void *p = cfield(c, k);
  switch (k->type) {
    case K_INT:
      snprintf(buf, n, "%d", *(const int *)p);
      break;
    case K_U64:
      snprintf(buf, n, "%" PRIu64, *(const uint64_t *)p);
      break;
    case K_FLOAT:
      format_float(*(const float *)p, buf, n);
      break;
    case K_BOOL:
      snprintf(buf, n, "%s", *(const int *)p ? "true" : "false");
      break;
    case K_ENUM:
    case K_PRESET:
      snprintf(buf, n, "%.*s", (int)k->size, (const char *)p);
      break;
    case K_STRING: {
      const unsigned char *s = p;
      size_t o = 0, len = strnlen(p, k->size);
      if (!quote) {
        snprintf(buf, n, "%.*s", (int)len, (const char *)s);
        break;
      }
      buf[o++] = '"';
      for (size_t i = 0; i < len && o + 6 < n; i++) {  // escapes YAML's double-quoted style reads back
        if (s[i] == '"' || s[i] == '\\') buf[o++] = '\\', buf[o++] = (char)s[i];
        // YAML's Unicode line breaks (U+0085, U+2028, U+2029) would be folded on reading: escape them
        else if (s[i] == 0xc2 && i + 1 < len && s[i + 1] == 0x85) buf[o++] = '\\', buf[o++] = 'N', i++;
        else if (s[i] == 0xe2 && i + 2 < len && s[i + 1] == 0x80 && (s[i + 2] == 0xa8 || s[i + 2] == 0xa9))
          buf[o++] = '\\', buf[o++] = s[i + 2] == 0xa8 ? 'L' : 'P', i += 2;
        else if (s[i] < 0x20 || s[i] == 0x7f) o += (size_t)snprintf(buf + o, n - o, "\\x%02x", s[i]);
        else buf[o++] = (char)s[i];
      }
      buf[o++] = '"';
      buf[o] = 0;
      break;
    }
  }
}
#define VALUE_BUF (4 * CFG_PATH + 8)  // the longest string, every byte escaped as \xHH, quoted

// ---------------------------------------------------------------------------------------------
// Defaults, validation

void config_defaults(TrainConfig *c) {
  memset(c, 0, sizeof *c);
  for (int i = 0; i < NKEYS; i++) {
    const Key *k = &KEYS[i];
    size_t want = k->type == K_U64 ? sizeof(uint64_t) : k->type == K_FLOAT ? sizeof(float) : sizeof(int);
    if (k->type != K_STRING && k->type != K_ENUM && k->type != K_PRESET && k->size != want)
      die("config table: %s is a %s but its field has %zu bytes", k->name, TYPE_NAMES[k->type], k->size);
    char msg[256];
    if (k->def && set_value(c, k, k->def, msg, sizeof msg)) die("config table: default of %s: %s", k->name, msg);
    key_lines[i] = 0;
  }
}

// Formats a failure of key 'key' into err, with the key's line when it came from the file.
static int invalid(char *err, size_t n, const char *where, const int *lines, const char *key, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int i = key_index(key), line = i >= 0 ? lines[i] : 0;
  if (line > 0) snprintf(err, n, "%s:%d: %s: %s", where, line, key, msg);
  else snprintf(err, n, "%s: %s: %s", where, key, msg);
  return -1;
}

// Of two keys in one cross-field rule, the one to blame: the one the file set, if only one was.
static const char *blame(const int *lines, const char *a, const char *b) {
  int ia = key_index(a), ib = key_index(b);
  return (ia >= 0 && lines[ia] > 0) || ib < 0 || lines[ib] <= 0 ? a : b;
}

static int validate(const TrainConfig *c, const int *lines, const char *where, char *err, size_t n) {
#define FAIL(key, ...) return invalid(err, n, where, lines, key, __VA_ARGS__)
  // Every value on its own first: range, enum, preset name, string length. A struct built or
  // edited in code gets the same checks as a loaded one.
  for (int i = 0; i < NKEYS; i++) {
    char text[VALUE_BUF], msg[256];
    TrainConfig scratch;
    memcpy(&scratch, c, sizeof scratch);
    format_value(c, &KEYS[i], 0, text, sizeof text);
    if (set_value(&scratch, &KEYS[i], text, msg, sizeof msg)) FAIL(KEYS[i].name, "%s", msg);
  }
  const LlamaConfig *m = &c->model;
  if (m->dim % m->n_heads)
    FAIL(blame(lines, "model.n_heads", "model.dim"), "model.dim %d is not divisible by model.n_heads %d", m->dim,
         m->n_heads);
  {  // the recipe's own consistency rules (fp4/recipe.c), with the GPU unknown here (cc 0)
    Recipe r;
    char msg[512];
    RecipeSpec spec = config_recipe_spec(c);
    if (recipe_resolve(&r, &spec, 0, msg, sizeof msg)) {
      const char *colon = strchr(msg, ':');  // messages start with their key
      char key[64];
      snprintf(key, sizeof key, "%.*s", colon ? (int)(colon - msg) : 0, msg);
      FAIL(colon ? key : "precision.recipe", "%s", colon ? colon + 2 : msg);
    } else if (recipe_check_layers(&r, m->n_layers, msg, sizeof msg)) {
      FAIL("precision.blocks", "%s", strchr(msg, ':') + 2);
    }
  }
  if (c->bf16_first_blocks + c->bf16_last_blocks > m->n_layers)
    FAIL(blame(lines, "precision.bf16_last_blocks", "precision.bf16_first_blocks"),
         "precision.bf16_first_blocks %d + precision.bf16_last_blocks %d exceed model.n_layers %d",
         c->bf16_first_blocks, c->bf16_last_blocks, m->n_layers);
  if (llama_recompute_parse(c->recompute) < 0)
    FAIL("parallel.recompute", "'%s': expected none, ffn, full or selective_N (N >= 1, e.g. selective_32)",
         c->recompute);
  if (m->n_heads % m->n_kv_heads)
    FAIL(blame(lines, "model.n_kv_heads", "model.n_heads"), "model.n_heads %d is not divisible by model.n_kv_heads %d",
         m->n_heads, m->n_kv_heads);
  if (llama_head_dim(m) % 2)  // RoPE rotates pairs of channels
    FAIL("model.n_heads", "head dimension model.dim / model.n_heads = %d / %d = %d is odd", m->dim, m->n_heads,
         llama_head_dim(m));
  if (c->ignore_index >= 0 && c->ignore_index < m->vocab_size)
    FAIL("model.ignore_index", "%d is a valid token id (model.vocab_size is %d)", c->ignore_index, m->vocab_size);
  if ((strcmp(c->doc_mask, "none") || strcmp(c->doc_positions, "continue")) && c->bos_id >= m->vocab_size)
    FAIL("model.bos_id",
         "%d is not a token id (model.vocab_size is %d), but model.doc_mask is %s and model.doc_positions %s: set "
         "the id of the token that starts each document",
         c->bos_id, m->vocab_size, c->doc_mask, c->doc_positions);
  if (m->rope_scaling && m->rope_high_freq_factor <= m->rope_low_freq_factor)
    FAIL("model.rope_high_freq_factor", "%g must exceed model.rope_low_freq_factor (%g)", m->rope_high_freq_factor,
         m->rope_low_freq_factor);
  if (c->seq_len > m->max_seq_len)
    FAIL("batch.seq_len", "%d exceeds model.max_seq_len (%d)", c->seq_len, m->max_seq_len);
  if (c->global_batch % ((int64_t)c->micro_batch * c->data_parallel))
    FAIL("batch.global_batch", "%d is not divisible by batch.micro_batch (%d) x parallel.data_parallel (%d)",
         c->global_batch, c->micro_batch, c->data_parallel);
  if (strcmp(c->rendezvous, "env") && (strncmp(c->rendezvous, "file:", 5) || !c->rendezvous[5]))
    FAIL("parallel.rendezvous", "expected \"env\" or \"file:/shared/path\", got '%s'", c->rendezvous);
  if (c->warmup_steps > c->total_steps)
    FAIL("schedule.warmup_steps", "%d exceeds schedule.total_steps (%d)", c->warmup_steps, c->total_steps);
  // wsd: a decay that starts at or after total_steps is never reached (the paper's 8B runs), so
  // only a decay that starts inside the run must also end inside it.
  if (!strcmp(c->schedule, "wsd")) {
    if (c->decay_start < c->warmup_steps)
      FAIL("schedule.decay_start", "%d is inside the warmup (schedule.warmup_steps %d)", c->decay_start,
           c->warmup_steps);
    if (c->decay_start < c->total_steps && c->decay_steps < 1)
      FAIL("schedule.decay_steps",
           "must be >= 1 when the decay starts inside the run (schedule.decay_start %d < "
           "schedule.total_steps %d)",
           c->decay_start, c->total_steps);
    if (c->decay_start < c->total_steps && (int64_t)c->decay_start + c->decay_steps > c->total_steps)
      FAIL("schedule.decay_steps",
           "the decay (schedule.decay_start %d + %d steps) ends after schedule.total_steps (%d)", c->decay_start,
           c->decay_steps, c->total_steps);
  }
  if (!c->train_data[0]) FAIL("data.train", "is empty (use \"synthetic\" or shard paths)");
  for (int i = 0; i < 2; i++) {  // a blend's form and weights (data/blend.h); the loader checks the files
    const char *key = i ? "data.val" : "data.train", *spec = i ? c->val_data : c->train_data;
    BlendSpec b;
    char msg[512];
    int bad = spec[0] && blend_parse(spec, &b, msg, sizeof msg);
    if (spec[0]) blend_spec_free(&b);
    if (bad) FAIL(key, "%s", msg);
  }
  if (c->eval_interval > 0 && !c->val_data[0] && !c->eval_tasks[0])
    FAIL("eval.interval", "%d, but data.val and eval.tasks are empty (nothing to evaluate)", c->eval_interval);
  if (c->eval_tasks[0]) {  // names and counts checked here, files when the run opens them
    const EvalTaskInfo *task[EVAL_MAX_TASKS];
    int shots[EVAL_MAX_TASKS];
    char msg[256];
    if (eval_tasks_parse(c->eval_tasks, task, shots, msg, sizeof msg) < 0) FAIL("eval.tasks", "%s", msg);
    if (!c->tokenizer_path[0]) FAIL("eval.tasks", "needs data.tokenizer (the tokenizer.model to encode the tasks)");
    if (!c->eval_dir[0]) FAIL("eval.tasks", "needs eval.dir (the folder with the task files)");
  }
  if (c->spike_factor > 0 && c->spike_factor <= 1)
    FAIL("reliability.spike_factor", "%g would flag ordinary steps: use 0 (off) or a factor > 1", c->spike_factor);
  if (c->resume && !c->ckpt_dir[0]) FAIL("checkpoint.resume", "is on, but checkpoint.dir is empty");
  return 0;
#undef FAIL
}

int config_validate(const TrainConfig *c, const char *where, char *err, size_t errlen) {
  return validate(c, key_lines, where, err, errlen);
}

// ---------------------------------------------------------------------------------------------
// Loading YAML

typedef struct {
  yaml_document_t *doc;
  const char *name;  // the path, for messages
  TrainConfig *c;
  int *lines;
  char *err;
  size_t errlen;
} Loader;

static int line_of(const yaml_node_t *node) { return (int)node->start_mark.line + 1; }

static const char *kind_of(const yaml_node_t *node) {
  return node->type == YAML_MAPPING_NODE ? "a mapping" : node->type == YAML_SEQUENCE_NODE ? "a sequence" : "a scalar";
}

static int fail(const Loader *L, const yaml_node_t *at, const char *key, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (key) snprintf(L->err, L->errlen, "%s:%d: %s: %s", L->name, line_of(at), key, msg);
  else snprintf(L->err, L->errlen, "%s:%d: %s", L->name, line_of(at), msg);
  return -1;
}

static const char *scalar(const yaml_node_t *node) { return (const char *)node->data.scalar.value; }

// A plain empty, "~" or "null" scalar: YAML's null. It means "" for strings and an empty section.
static int is_null(const yaml_node_t *node) {
  if (node->type != YAML_SCALAR_NODE || node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
  const char *s = scalar(node);
  return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static void full_name(char *buf, size_t n, const char *section, const char *key) {
  if (section) snprintf(buf, n, "%s.%s", section, key);
  else snprintf(buf, n, "%s", key);
}

// Every key of a mapping must be a plain scalar and appear once.
static int check_keys(const Loader *L, const yaml_node_t *map, const char *section) {
  for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
    yaml_node_t *kn = yaml_document_get_node(L->doc, p->key);
    if (kn->type != YAML_SCALAR_NODE) return fail(L, kn, section, "expected a key name, got %s", kind_of(kn));
    for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
      yaml_node_t *qn = yaml_document_get_node(L->doc, q->key);
      if (qn->type == YAML_SCALAR_NODE && !strcmp(scalar(qn), scalar(kn))) {
        char name[2 * CFG_NAME];
        full_name(name, sizeof name, section, scalar(kn));
        return fail(L, kn, name, "duplicate key (first on line %d)", line_of(qn));
      }
    }
  }
  return 0;
}

// One scalar of a data source's mapping, or for "path" also a list of scalars (joined with commas).
static int source_value(const Loader *L, const yaml_node_t *vn, const char *key, char *out, size_t n) {
  out[0] = 0;
  if (vn->type == YAML_SCALAR_NODE) {
    if (strlen(scalar(vn)) != vn->data.scalar.length) return fail(L, vn, key, "value contains a NUL character");
    snprintf(out, n, "%s", is_null(vn) ? "" : scalar(vn));
    return 0;
  }
  if (vn->type != YAML_SEQUENCE_NODE || strcmp(strrchr(key, '.') + 1, "path"))
    return fail(L, vn, key, "expected a single value, got %s", kind_of(vn));
  size_t o = 0;
  for (yaml_node_item_t *it = vn->data.sequence.items.start; it < vn->data.sequence.items.top; it++) {
    yaml_node_t *p = yaml_document_get_node(L->doc, *it);
    if (p->type != YAML_SCALAR_NODE) return fail(L, p, key, "expected a path, got %s", kind_of(p));
    o += (size_t)snprintf(out + o, o < n ? n - o : 0, "%s%s", o ? "," : "", scalar(p));
  }
  return 0;
}

// data.train (or data.val) as a YAML list of sources, each {path: ..., weight: ..., name: ...}
// (name optional, path a string or a list): written into the string form NAME=WEIGHT:PATHS,...
// (data/blend.h), which validate() parses again like a --set value.
static int load_sources(Loader *L, const Key *k, const char *name, const yaml_node_t *kn, const yaml_node_t *vn) {
  char text[4 * CFG_PATH] = "", msg[256];
  size_t o = 0;
  int i = 0;
  for (yaml_node_item_t *it = vn->data.sequence.items.start; it < vn->data.sequence.items.top; it++, i++) {
    yaml_node_t *item = yaml_document_get_node(L->doc, *it);
    char entry[2 * CFG_NAME], key[3 * CFG_NAME], v[3][2 * CFG_PATH];  // path, weight, name
    snprintf(entry, sizeof entry, "%s[%d]", name, i);
    if (item->type != YAML_MAPPING_NODE)
      return fail(L, item, entry, "expected a mapping {path: ..., weight: ...}, got %s", kind_of(item));
    if (check_keys(L, item, entry)) return -1;
    const yaml_node_t *at[3] = {NULL, NULL, NULL};  // each field's value, for its line
    v[0][0] = v[1][0] = v[2][0] = 0;
    for (yaml_node_pair_t *p = item->data.mapping.pairs.start; p < item->data.mapping.pairs.top; p++) {
      yaml_node_t *pk = yaml_document_get_node(L->doc, p->key), *pv = yaml_document_get_node(L->doc, p->value);
      static const char *const fields[3] = {"path", "weight", "name"};
      int f = 0;
      while (f < 3 && strcmp(scalar(pk), fields[f])) f++;
      full_name(key, sizeof key, entry, scalar(pk));
      if (f == 3) return fail(L, pk, key, "unknown key (a source has path, weight and name)");
      if (source_value(L, pv, key, v[f], sizeof v[f])) return -1;
      at[f] = pv;
    }
    if (!v[0][0]) return fail(L, at[0] ? at[0] : item, entry, "needs a path (shard paths or globs)");
    if (!at[1]) return fail(L, item, entry, "needs a weight (a positive number; the weights are normalized)");
    char *end = v[1];
    double w = is_float_text(v[1]) ? strtod(v[1], &end) : NAN;
    snprintf(key, sizeof key, "%s.weight", entry);
    if (!is_float_text(v[1]) || *end || !isfinite(w) || !(w > 0))
      return fail(L, at[1], key, "expected a positive finite number, got '%s'", v[1]);
    snprintf(key, sizeof key, "%s.name", entry);
    for (const char *c = v[2]; *c; c++)
      if (!isalnum((unsigned char)*c) && !strchr("_.-", *c))
        return fail(L, at[2], key, "'%s': use letters, digits, '_', '.' and '-'", v[2]);
    o += (size_t)snprintf(text + o, o < sizeof text ? sizeof text - o : 0, "%s%s%s%s:%s", i ? "," : "", v[2],
                          v[2][0] ? "=" : "", v[1], v[0]);
  }
  if (i == 0) return fail(L, kn, name, "an empty list: give at least one source {path: ..., weight: ...}");
  if (o >= sizeof text) return fail(L, kn, name, "the sources are too long together (limit %zu)", k->size - 1);
  if (set_value(L->c, k, text, msg, sizeof msg)) return fail(L, kn, name, "%s", msg);
  L->lines[k - KEYS] = line_of(kn);
  return 0;
}

static int load_key(Loader *L, const char *name, const yaml_node_t *kn, const yaml_node_t *vn) {
  const Key *k = find_key(name);
  if (!k) {
    char hint[96];
    suggest(name, hint, sizeof hint);
    return fail(L, kn, name, "unknown key%s", hint);
  }
  if (vn->type == YAML_SEQUENCE_NODE && (!strcmp(name, "data.train") || !strcmp(name, "data.val")))
    return load_sources(L, k, name, kn, vn);
  if (vn->type != YAML_SCALAR_NODE) return fail(L, kn, name, "expected a single value, got %s", kind_of(vn));
  if (strlen(scalar(vn)) != vn->data.scalar.length) return fail(L, kn, name, "value contains a NUL character");
  const char *text = is_null(vn) ? "" : scalar(vn);
  char msg[256];
  if (set_value(L->c, k, text, msg, sizeof msg)) return fail(L, kn, name, "%s", msg);
  if (k->type == K_PRESET)  // the preset refilled the model: its keys no longer come from the file
    for (int i = 0; i < NKEYS; i++)
      if (!KEYS[i].def) L->lines[i] = 0;
  L->lines[k - KEYS] = line_of(kn);
  return 0;
}

// Loads one section's mapping. Preset keys go first, wherever they appear, so that the section's
// other keys override what the preset filled.
static int load_section(Loader *L, const char *section, const yaml_node_t *map) {
  if (check_keys(L, map, section)) return -1;
  for (int pass = 0; pass < 2; pass++) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
      yaml_node_t *kn = yaml_document_get_node(L->doc, p->key), *vn = yaml_document_get_node(L->doc, p->value);
      char name[2 * CFG_NAME];
      full_name(name, sizeof name, section, scalar(kn));
      const Key *k = find_key(name);
      if ((k && k->type == K_PRESET) != (pass == 0)) continue;
      if (load_key(L, name, kn, vn)) return -1;
    }
  }
  return 0;
}

static int load_document(Loader *L) {
  yaml_node_t *root = yaml_document_get_root_node(L->doc);
  if (!root || is_null(root)) return 0;  // an empty file sets nothing
  if (root->type != YAML_MAPPING_NODE)
    return fail(L, root, NULL, "expected a mapping of sections (model:, optim:, ...) at the top level, got %s",
                kind_of(root));
  if (check_keys(L, root, NULL)) return -1;
  for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
    yaml_node_t *kn = yaml_document_get_node(L->doc, p->key), *vn = yaml_document_get_node(L->doc, p->value);
    const char *name = scalar(kn);
    if (find_key(name) && section_len(name))
      return fail(L, kn, name, "write section keys nested ('%.*s:', then '  %s: ...' below it)", (int)section_len(name),
                  name, name + section_len(name) + 1);
    if (find_key(name)) {  // a top-level key such as seed
      if (load_key(L, name, kn, vn)) return -1;
    } else if (is_section(name)) {
      if (is_null(vn)) continue;  // "optim:" with every key commented out
      if (vn->type != YAML_MAPPING_NODE) return fail(L, kn, name, "expected a mapping of keys, got %s", kind_of(vn));
      if (load_section(L, name, vn)) return -1;
    } else {
      char hint[96];
      suggest(name, hint, sizeof hint);
      return fail(L, kn, name, "unknown section%s", hint);
    }
  }
  return 0;
}

static int syntax_error(const yaml_parser_t *p, const char *name, char *err, size_t n) {
  if (p->error == YAML_READER_ERROR)
    snprintf(err, n, "%s: cannot read YAML: %s at byte %zu", name, p->problem ? p->problem : "error",
             p->problem_offset);
  else
    snprintf(err, n, "%s:%d: YAML syntax error: %s%s%s", name, (int)p->problem_mark.line + 1,
             p->problem ? p->problem : "error", p->context ? " " : "", p->context ? p->context : "");
  return -1;
}

// Loads the parser's single document over a copy of *c and validates it; *c and the key lines
// change only if all of that succeeds.
static int load(TrainConfig *c, yaml_parser_t *parser, const char *name, char *err, size_t errlen) {
  TrainConfig tmp;
  memcpy(&tmp, c, sizeof tmp);
  int lines[NKEYS] = {0};
  yaml_document_t doc;
  if (!yaml_parser_load(parser, &doc)) return syntax_error(parser, name, err, errlen);
  Loader L = {&doc, name, &tmp, lines, err, errlen};
  int rc = load_document(&L);
  yaml_document_delete(&doc);
  if (rc) return rc;
  // A second document would be silently ignored by yaml_parser_load: reject it.
  if (!yaml_parser_load(parser, &doc)) return syntax_error(parser, name, err, errlen);
  yaml_node_t *extra = yaml_document_get_root_node(&doc);
  if (extra) {
    snprintf(err, errlen, "%s:%d: a second YAML document; a config file holds one", name, line_of(extra));
    rc = -1;
  }
  yaml_document_delete(&doc);
  if (rc || validate(&tmp, lines, name, err, errlen)) return -1;
  memcpy(c, &tmp, sizeof tmp);
  memcpy(key_lines, lines, sizeof lines);
  return 0;
}

int config_load_string(TrainConfig *c, const char *yaml, size_t len, const char *name, char *err, size_t errlen) {
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) return snprintf(err, errlen, "%s: cannot initialize libyaml", name), -1;
  yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
  int rc = load(c, &parser, name, err, errlen);
  yaml_parser_delete(&parser);
  return rc;
}

int config_load(TrainConfig *c, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) return snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno)), -1;
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) {
    fclose(f);
    return snprintf(err, errlen, "%s: cannot initialize libyaml", path), -1;
  }
  yaml_parser_set_input_file(&parser, f);
  int rc = load(c, &parser, path, err, errlen);
  yaml_parser_delete(&parser);
  fclose(f);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// --set, output, reference

int config_set(TrainConfig *c, const char *assignment, char *err, size_t errlen) {
  const char *eq = strchr(assignment, '=');
  if (!eq) return snprintf(err, errlen, "--set %s: expected section.key=value", assignment), -1;
  char name[2 * CFG_NAME];
  snprintf(name, sizeof name, "%.*s", (int)(eq - assignment), assignment);
  const Key *k = find_key(name);
  if (!k) {
    char hint[96];
    suggest(name, hint, sizeof hint);
    return snprintf(err, errlen, "--set %s: unknown key%s", name, hint), -1;
  }
  char msg[256];
  if (set_value(c, k, eq + 1, msg, sizeof msg)) return snprintf(err, errlen, "--set %s: %s", name, msg), -1;
  if (k->type == K_PRESET)
    for (int i = 0; i < NKEYS; i++)
      if (!KEYS[i].def) key_lines[i] = 0;
  key_lines[k - KEYS] = 0;
  return 0;
}

void config_write_yaml(const TrainConfig *c, FILE *f) {
  size_t open_len = 0;  // length of the section being written (0: top level)
  const char *open = "";
  for (int i = 0; i < NKEYS; i++) {
    const Key *k = &KEYS[i];
    size_t sl = section_len(k->name);
    char value[VALUE_BUF];
    format_value(c, k, 1, value, sizeof value);
    if (!sl) {
      fprintf(f, "%s: %s\n", k->name, value);
      open_len = 0;
      continue;
    }
    if (sl != open_len || strncmp(open, k->name, sl)) fprintf(f, "%.*s:\n", (int)sl, k->name);
    open = k->name, open_len = sl;
    fprintf(f, "  %s: %s\n", k->name + sl + 1, value);
  }
}

void config_print_reference(FILE *f) {
  fprintf(f,
          "Config keys: YAML 'section: {key: value}', or --set section.key=value (applied in order).\n"
          "model.preset fills every key marked 'preset'; explicit model keys then override it.\n\n");
  fprintf(f, "%-29s %-7s %-11s %-21s %s\n", "key", "type", "default", "range / values", "description");
  for (int i = 0; i < NKEYS; i++) {
    const Key *k = &KEYS[i];
    char def[CFG_NAME + 2], range[64];
    if (!k->def) snprintf(def, sizeof def, "(preset)");
    else if (k->type == K_STRING) snprintf(def, sizeof def, "\"%s\"", k->def);
    else snprintf(def, sizeof def, "%s", k->def);
    range_text(k, range, sizeof range);
    fprintf(f, "%-29s %-7s %-11s %-21s %s\n", k->name, TYPE_NAMES[k->type], def, range, k->help);
  }
}

RecipeSpec config_recipe_spec(const TrainConfig *c) {
  return (RecipeSpec){c->recipe,           c->sr,       c->hadamard, c->weight_2d,
                      c->scale_rounding,   c->fp4_gemm, c->wgrad_2d, c->bf16_first_blocks,
                      c->bf16_last_blocks, c->fprop,    c->dgrad,    c->wgrad,
                      c->blocks,           c->fusion};
}
