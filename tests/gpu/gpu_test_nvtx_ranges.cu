// tests/gpu/gpu_test_nvtx_ranges.cu: logging.nvtx's ranges (model/cuda/nvtx.cu's op ranges,
// model/llama.c's block ranges) as a profiler receives them, without a profiler: this program is its
// own NVTX tool. NVTX3 calls a statically linked tool's init when the program defines
// InitializeInjectionNvtx2_fnptr (the toolkit's nvtx3/nvtxDetail/nvtxInit.h, load sequence 2; a
// library named by NVTX_INJECTION64_PATH, which Nsight Systems sets, comes first). The init gets the
// engine's NVTX instance's export tables and points the CORE module's RangePushA (what nvtx.cu
// calls), RangePushEx and RangePop at the recorder below.
//
// On one forward+backward of the 2-layer model (BF16, and MXFP4, whose quantizers may be fused):
// - pushes and pops balance, blocks open only at the top, no range opens inside an op's range;
// - the block ranges come as block 1 fwd, block 2 fwd, block 2 bwd, block 1 bwd, and each holds
//   the ops model/llama.c calls, in its order, under the per-kernel table's names; the ops outside
//   the blocks likewise;
// - against the per-kernel table itself (the CUDA profiler's report, parsed): the recorder turns
//   the profiler on only while a given op's range is open, one step per op name, which books each
//   row's calls to the ranges they ran in. Every call of every row ran inside an op's range (none
//   outside), a row named as a range ("rmsnorm fwd", "attention bwd (docs)" ...) ran in that range,
//   a GEMM row ("gemm fwd q", "ref gemm dgrad up" ...) in its linear's matmul range, each matmul
//   range holds its linear's GEMMs, and every range but the untimed copies holds a row.
// With the ranges off nothing is pushed.
#define NVTX_NO_IMPL  // NVTX's types only: this file is the tool; the implementation is nvtx.cu's
#include <math.h>
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/cuda_common.h"
#include "common/gemm_plans.h"
#include "fp4/gemm_cutlass.h"
#include "fp4/recipe.h"
#include "model/cuda/linear_fp4.h"
#include "model/cuda/ops_cuda.h"
#include "model/llama.h"
#include "model/ops.h"
#include "tests/gpu/nvtx_model.h"
#include "tests/test.h"

enum { NAME_LEN = 48, MAX_DEPTH = 16, MAX_ROWS = 256, MAX_LIST = 64 };

// ---- the recorder (the NVTX tool) ---------------------------------------------------------------

typedef struct {
  int push;             // 1: a push, 0: a pop
  int depth;            // ranges open after the event
  char name[NAME_LEN];  // the range pushed, or the one the pop closed ("" when none was open)
} Event;

// Which of the step's kernels the CUDA profiler times: none, all, those outside every op's range,
// or those inside the ranges of one op name.
typedef enum { PROF_NONE, PROF_ALL, PROF_OUTSIDE, PROF_INSIDE } ProfWindow;

// What NVTX reported. File-level because NVTX's callbacks take no context argument.
static struct {
  int inits;  // calls of the tool's init
  Event *ev;
  int nev, cap;
  char open[MAX_DEPTH][NAME_LEN];  // the open ranges' names, outermost first
  int depth, underflows, other_threads;
  pthread_t thread;
  CudaBackend *prof;  // the backend whose profiler follows `window` (NULL: none)
  ProfWindow window;
  const char *inside;  // PROF_INSIDE: the op range whose kernels are timed
} rec;

static int is_block(const char *name) { return !strncmp(name, "block ", 6); }

// The profiler on or off as the window says for the innermost open range (ops never nest: it is
// the op running, if any).
static void follow_window(void) {
  if (!rec.prof || (rec.window != PROF_OUTSIDE && rec.window != PROF_INSIDE)) return;
  const char *top = rec.depth > 0 ? rec.open[(rec.depth < MAX_DEPTH ? rec.depth : MAX_DEPTH) - 1] : NULL;
  const int in_op = top && !is_block(top);
  cuda_profile_enable(rec.prof, rec.window == PROF_OUTSIDE ? !in_op : in_op && !strcmp(top, rec.inside));
}

static void record(int push, const char *name) {
  if (!rec.nev) rec.thread = pthread_self();
  else if (!pthread_equal(rec.thread, pthread_self())) rec.other_threads++;
  rec.ev = (Event *)grow_array(rec.ev, rec.nev, &rec.cap, sizeof *rec.ev);
  Event *e = &rec.ev[rec.nev++];
  e->push = push;
  if (push) {
    snprintf(e->name, NAME_LEN, "%s", name);
    if (rec.depth < MAX_DEPTH) snprintf(rec.open[rec.depth], NAME_LEN, "%s", name);
    rec.depth++;
  } else if (rec.depth > 0) {
    rec.depth--;
    snprintf(e->name, NAME_LEN, "%s", rec.depth < MAX_DEPTH ? rec.open[rec.depth] : "");
  } else {
    rec.underflows++, e->name[0] = 0;
  }
  e->depth = rec.depth;
  follow_window();
}

// NVTX's return values: the zero-based level of the range pushed, or popped.
static int NVTX_API on_push_a(const char *message) {
  record(1, message ? message : "(null)");
  return rec.depth - 1;
}
static int NVTX_API on_push_ex(const nvtxEventAttributes_t *a) {
  record(1, a && a->messageType == NVTX_MESSAGE_TYPE_ASCII && a->message.ascii ? a->message.ascii : "(not ASCII)");
  return rec.depth - 1;
}
static int NVTX_API on_pop(void) {
  record(0, NULL);
  return rec.depth;
}

// The tool's init, called by NVTX at the process's first NVTX call: the CORE module's table holds
// the addresses of the instance's function pointers, which the tool points at its own functions.
// Returning 0 leaves every NVTX call a no-op.
static int NVTX_API recorder_init(NvtxGetExportTableFunc_t get_table) {
  const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get_table(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable core = NULL;
  unsigned int n = 0;
  if (!cb || cb->struct_size < sizeof *cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &n) || !core ||
      n <= NVTX_CBID_CORE_RangePop)
    return 0;
  *core[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)on_push_a;
  *core[NVTX_CBID_CORE_RangePushEx] = (NvtxFunctionPointer)on_push_ex;
  *core[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)on_pop;
  rec.inits++;
  return 1;
}
// The static injection: overrides nvtx.cu's weak definition (NULL), which NVTX's loader tests.
extern "C" {
NvtxInitializeInjectionNvtxFunc_t InitializeInjectionNvtx2_fnptr = recorder_init;
}

// ---- the per-kernel table -----------------------------------------------------------------------

typedef struct {
  char name[NAME_LEN];
  double calls;
} Row;
typedef struct {
  Row row[MAX_ROWS];
  int n, unparsed;
} Table;

// One row of cuda_profile_report: "NAME calls ms %time achieved UNIT ceiling [UNIT] %ceil", NAME of
// one or more words, the ceiling "-" (and %ceil "-") where there is none.
static int parse_row(const char *line, Row *r) {
  char copy[512], *tok[32], *save = NULL;
  snprintf(copy, sizeof copy, "%s", line);
  int n = 0;
  for (char *s = strtok_r(copy, " ", &save); s && n < 32; s = strtok_r(NULL, " ", &save)) tok[n++] = s;
  if (n < 1) return 0;
  const int tail = 3 + 2 + (strcmp(tok[n - 1], "-") ? 2 : 1) + 1;  // calls ms %time, achieved, ceiling, %ceil
  if (n <= tail) return 0;
  r->name[0] = 0;
  for (int i = 0; i < n - tail; i++) {
    size_t len = strlen(r->name);
    snprintf(r->name + len, NAME_LEN - len, "%s%s", i ? " " : "", tok[i]);
  }
  char *end;
  r->calls = strtod(tok[n - tail], &end);
  return *end == 0;
}

// The profiler's table for one step (steps = 1, so calls/step are the calls).
static void read_table(CudaBackend *b, Table *t) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) die("gpu_test_nvtx_ranges: open_memstream failed");
  cuda_profile_report(b, f, 1);
  fclose(f);
  t->n = t->unparsed = 0;
  char *save = NULL;
  int first = 1;
  for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save), first = 0) {
    if (first) continue;                     // the header
    if (!strncmp(line, "total ", 6)) break;  // the FP8 kernel choices follow it
    if (t->n < MAX_ROWS && parse_row(line, &t->row[t->n])) t->n++;
    else t->unparsed++, printf("unparsed profile row: '%s'\n", line);
  }
  free(buf);
}

static double calls_of(const Table *t, const char *name) {
  for (int i = 0; i < t->n; i++)
    if (!strcmp(t->row[i].name, name)) return t->row[i].calls;
  return 0;
}

// ---- one step -----------------------------------------------------------------------------------

typedef struct {
  int first, last;  // its events: rec.ev[first, last)
  Table table;      // the profiler's rows (empty with PROF_NONE)
  float loss;
} Step;

// One forward+backward of a fresh 2-layer model (so every step runs the same ops, W^T copies and
// quantized weights made afresh), its profiler following the window.
static void run_step(const Ops *ops, const char *recipe, const int *in, const int *tg, ProfWindow w, const char *inside,
                     Step *st) {
  Llama *m = nvtx_model(ops, recipe);
  CudaBackend *b = cuda_backend_of(ops);
  if (w != PROF_NONE) {
    cuda_profile_reset(b);
    rec.prof = b, rec.window = w, rec.inside = inside;
    cuda_profile_enable(b, w == PROF_ALL || w == PROF_OUTSIDE);  // no range is open yet
  }
  st->first = rec.nev;
  st->loss = llama_forward_backward(m, in, tg, -1, 1.0f);
  st->last = rec.nev;
  st->table.n = st->table.unparsed = 0;
  if (w != PROF_NONE) {
    cuda_profile_enable(b, 0);
    rec.prof = NULL;
    read_table(b, &st->table);
  }
  llama_free(m);
}

// ---- the checks ---------------------------------------------------------------------------------

// Range or row names, copied (the recorder's events move as they grow).
typedef struct {
  char name[MAX_LIST][NAME_LEN];
  int n;
} List;

static void add(List *l, const char *name) {
  if (l->n < MAX_LIST) snprintf(l->name[l->n++], NAME_LEN, "%s", name);
}
static int find(const List *l, const char *name) {
  for (int i = 0; i < l->n; i++)
    if (!strcmp(l->name[i], name)) return i;
  return -1;
}
static int equals(const List *l, const char *const *want, int n) {
  if (l->n != n) return 0;
  for (int i = 0; i < n; i++)
    if (strcmp(l->name[i], want[i])) return 0;
  return 1;
}
static const char *joined(const List *l) {
  static char buf[4096];
  buf[0] = 0;
  for (int i = 0; i < l->n; i++) {
    size_t len = strlen(buf);
    snprintf(buf + len, sizeof buf - len, "%s%s", i ? ", " : "", l->name[i]);
  }
  return buf;
}

// The ops model/llama.c calls (llama_forward_backward, recompute none): inside each block's forward
// (attention_half_fwd, ffn_hidden_fwd, then forward_blocks' down and residual) and backward
// (backward_blocks), and outside the blocks (the uploads left out: their number depends on the
// document masking).
#define N_OF(a) (int)(sizeof a / sizeof *a)
static const char *const BLOCKS[] = {"block 1 fwd", "block 2 fwd", "block 2 bwd", "block 1 bwd"};
static const char *const BLOCK_FWD[] = {"rmsnorm fwd", "matmul fwd q",    "matmul fwd k",    "matmul fwd v",
                                        "rope fwd",    "rope fwd",        "attention fwd",   "matmul fwd o",
                                        "residual",    "rmsnorm fwd",     "matmul fwd gate", "matmul fwd up",
                                        "swiglu fwd",  "matmul fwd down", "residual"};
// With the residual adds in the o and down projections' GEMM epilogues (Ops.matmul_residual_fwd: FP4
// linears on the FP8 path).
static const char *const BLOCK_FWD_FUSED[] = {"rmsnorm fwd",
                                              "matmul fwd q",
                                              "matmul fwd k",
                                              "matmul fwd v",
                                              "rope fwd",
                                              "rope fwd",
                                              "attention fwd",
                                              "matmul+residual fwd o",
                                              "rmsnorm fwd",
                                              "matmul fwd gate",
                                              "matmul fwd up",
                                              "swiglu fwd",
                                              "matmul+residual fwd down"};
// And with SwiGLU and down's input producer in up's GEMM epilogue too (Ops.matmul_swiglu_fwd: CUTLASS on Hopper).
static const char *const BLOCK_FWD_FUSED_SWIGLU[] = {
    "rmsnorm fwd", "matmul fwd q",    "matmul fwd k",         "matmul fwd v",
    "rope fwd",    "rope fwd",        "attention fwd",        "matmul+residual fwd o",
    "rmsnorm fwd", "matmul fwd gate", "matmul+swiglu fwd up", "matmul+residual fwd down"};
static const char *const BLOCK_BWD[] = {"matmul bwd down", "swiglu bwd",   "matmul bwd gate", "matmul bwd up",
                                        "rmsnorm bwd",     "matmul bwd o", "attention bwd",   "rope bwd",
                                        "rope bwd",        "matmul bwd q", "matmul bwd k",    "matmul bwd v",
                                        "rmsnorm bwd"};
// embed, the blocks, the final norm, the fused head (loss and gradient), the embedding gradient's
// and d(residual)'s zeroing, the final norm's backward, the blocks, the embedding's backward
static const char *const TOP[] = {"embed fwd", "block 1 fwd", "block 2 fwd", "rmsnorm fwd", "head ce",  "zero",
                                  "zero",      "rmsnorm bwd", "block 2 bwd", "block 1 bwd", "embed bwd"};
// The table's entries that time nothing (copies through cudaMemcpy, a host counter: ops_cuda.cu).
static const char *const UNTIMED[] = {"upload", "download", "sync", "acts to f32", "params bf16 changed"};
static const char *const KINDS[] = {"q", "k", "v", "o", "gate", "up", "down", "head"};

static int in_list(const char *const *l, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(l[i], name)) return 1;
  return 0;
}

// The step's ranges: balanced, nested as a timeline should be, in the graph's order.
static void check_structure(const Step *s, int residual_fused, int swiglu_fused) {
  int depth = 0, min_depth = 0, in_op = 0, deep_blocks = 0, nblock = -1;
  const char *open[MAX_DEPTH] = {0};
  List top, blocks, inner[8];
  top.n = blocks.n = 0;
  for (int k = 0; k < 8; k++) inner[k].n = 0;
  for (int i = s->first; i < s->last; i++) {
    const Event *e = &rec.ev[i];
    if (!e->push) {
      depth--;
      if (depth < min_depth) min_depth = depth;
      continue;
    }
    const char *parent = depth > 0 && depth <= MAX_DEPTH ? open[depth - 1] : NULL;
    if (parent && !is_block(parent)) in_op++;  // a range inside an op's range
    if (is_block(e->name) && depth > 0) deep_blocks++;
    if (depth == 0) {
      if (is_block(e->name)) add(&blocks, e->name), nblock = blocks.n - 1;
      if (strcmp(e->name, "upload")) add(&top, e->name);
    } else if (depth == 1 && parent && is_block(parent) && nblock >= 0 && nblock < 8) {
      add(&inner[nblock], e->name);
    }
    if (depth < MAX_DEPTH) open[depth] = e->name;
    depth++;
  }
  CHECK(s->last > s->first, "the step pushed ranges (%d events)", s->last - s->first);
  CHECK(min_depth == 0 && depth == 0, "pushes and pops balance (depth never below 0: lowest %d; at the end %d)",
        min_depth, depth);
  CHECK(in_op == 0, "no range opens inside an op's range (%d did)", in_op);
  CHECK(deep_blocks == 0, "block ranges open only at the top (%d did not)", deep_blocks);
  CHECK(equals(&blocks, BLOCKS, N_OF(BLOCKS)), "the block ranges in order: %s", joined(&blocks));
  CHECK(equals(&top, TOP, N_OF(TOP)), "the top-level ranges (uploads aside): %s", joined(&top));
  for (int k = 0; k < blocks.n && k < 8; k++) {
    const int fwd = strstr(blocks.name[k], " fwd") != NULL;
    const int ok = !fwd             ? equals(&inner[k], BLOCK_BWD, N_OF(BLOCK_BWD))
                   : swiglu_fused   ? equals(&inner[k], BLOCK_FWD_FUSED_SWIGLU, N_OF(BLOCK_FWD_FUSED_SWIGLU))
                   : residual_fused ? equals(&inner[k], BLOCK_FWD_FUSED, N_OF(BLOCK_FWD_FUSED))
                                    : equals(&inner[k], BLOCK_FWD, N_OF(BLOCK_FWD));
    CHECK(ok, "%s holds the ops of llama.c's block %s, in order: %s", blocks.name[k], fwd ? "forward" : "backward",
          joined(&inner[k]));
  }
}

// The same ranges, in the same order, as step `ref` (the windowed steps' rows add up only then).
static int same_events(const Step *a, const Step *ref) {
  if (a->last - a->first != ref->last - ref->first) return 0;
  for (int i = 0; i < a->last - a->first; i++) {
    const Event *x = &rec.ev[a->first + i], *y = &rec.ev[ref->first + i];
    if (x->push != y->push || strcmp(x->name, y->name)) return 0;
  }
  return 1;
}

// A GEMM row ("gemm fwd q", "gemm dgrad q NN", "ref gemm wgrad up", ...): its use (fwd, dgrad,
// wgrad) and linear kind.
static int gemm_row(const char *row, char use[16], char kind[16]) {
  const char *g = strstr(row, "gemm ");
  if (!g || (g != row && g[-1] != ' ')) return 0;
  return sscanf(g, "gemm %15s %15s", use, kind) == 2 && in_list(KINDS, N_OF(KINDS), kind);
}

// The range a GEMM row belongs to: its linear's matmul range ("matmul fwd q", "matmul bwd up"),
// the head's "head ce" (the head op this step calls).
static int gemm_range(const char *row, char *range, size_t len) {
  char use[16], kind[16];
  if (!gemm_row(row, use, kind)) return 0;
  if (!strcmp(kind, "head")) snprintf(range, len, "head ce");
  else if (!strcmp(use, "fwd+res")) snprintf(range, len, "matmul+residual fwd %s", kind);   // the residual epilogue
  else if (!strcmp(use, "fwd+swiglu")) snprintf(range, len, "matmul+swiglu fwd %s", kind);  // the SwiGLU epilogue
  else snprintf(range, len, "matmul %s %s", strcmp(use, "fwd") ? "bwd" : "fwd", kind);
  return 1;
}

// The per-kernel table against the ranges, for the recipe whose full step (profiled throughout) is
// `all`: one step with the profiler on outside every op's range, then one per op name with it on
// inside that op's ranges only.
static void check_table(const Ops *ops, const char *recipe, const int *in, const int *tg, const Step *all) {
  const Table *t = &all->table;
  CHECK(t->n > 0 && t->unparsed == 0, "the per-kernel table: %d rows read, %d not", t->n, t->unparsed);
  List ops_seen;
  ops_seen.n = 0;  // the step's op ranges, by first push
  for (int i = all->first; i < all->last; i++)
    if (rec.ev[i].push && !is_block(rec.ev[i].name) && find(&ops_seen, rec.ev[i].name) < 0)
      add(&ops_seen, rec.ev[i].name);
  Step *outside = (Step *)xmalloc(sizeof(Step)), *inside = (Step *)xmalloc((size_t)ops_seen.n * sizeof(Step));
  run_step(ops, recipe, in, tg, PROF_OUTSIDE, NULL, outside);
  int differ = !same_events(outside, all), unparsed = outside->table.unparsed;
  for (int u = 0; u < ops_seen.n; u++) {
    run_step(ops, recipe, in, tg, PROF_INSIDE, ops_seen.name[u], &inside[u]);
    differ += !same_events(&inside[u], all), unparsed += inside[u].table.unparsed;
  }
  CHECK(differ == 0 && unparsed == 0,
        "the %d windowed steps pushed the first one's ranges (%d did not) and their tables read (%d rows not)",
        ops_seen.n + 1, differ, unparsed);

  List out_rows;
  out_rows.n = 0;
  for (int i = 0; i < outside->table.n; i++) add(&out_rows, outside->table.row[i].name);
  CHECK(out_rows.n == 0, "no row of the table runs outside an op's range: %s", joined(&out_rows));

  int unbooked = 0, misnamed = 0, named = 0, gemms = 0, gemm_wrong = 0;
  for (int i = 0; i < t->n; i++) {
    const Row *r = &t->row[i];
    char where[1024] = "", base[NAME_LEN], range[NAME_LEN];
    double sum = 0;
    for (int u = 0; u < ops_seen.n; u++) {
      double c = calls_of(&inside[u].table, r->name);
      if (c == 0) continue;
      sum += c;
      size_t len = strlen(where);
      snprintf(where + len, sizeof where - len, "%s%s (%g)", len ? ", " : "", ops_seen.name[u], c);
    }
    printf("  row %-40s %4g calls, in %s\n", r->name, r->calls, where[0] ? where : "no op range");
    if (sum != r->calls)
      unbooked++, printf("  ! row '%s': %g calls, %g of them inside op ranges\n", r->name, r->calls, sum);
    // a row named as a range, a qualifier aside ("attention fwd (docs)", "rmsnorm fwd (rstd only)")
    snprintf(base, sizeof base, "%s", r->name);
    char *q = strstr(base, " (");
    if (q && base[strlen(base) - 1] == ')') *q = 0;
    int u = find(&ops_seen, base);
    if (u >= 0) {
      named++;
      if (calls_of(&inside[u].table, r->name) != r->calls)
        misnamed++, printf("  ! row '%s': not all its calls ran in the range '%s'\n", r->name, base);
    }
    if (gemm_range(r->name, range, sizeof range)) {
      gemms++;
      u = find(&ops_seen, range);
      if (u < 0 || calls_of(&inside[u].table, r->name) != r->calls)
        gemm_wrong++, printf("  ! GEMM row '%s': not all its calls ran in '%s'\n", r->name, range);
    }
  }
  CHECK(unbooked == 0, "every call of every row ran inside an op's range (%d rows not)", unbooked);
  CHECK(named > 0 && misnamed == 0, "the %d rows named as a range ran in it (%d did not)", named, misnamed);
  CHECK(gemms > 0 && gemm_wrong == 0, "the %d GEMM rows ran in their linear's matmul range (%d did not)", gemms,
        gemm_wrong);

  // each matmul range holds its linear's GEMMs; every range but the untimed ones holds a row
  int matmuls = 0, lacking = 0, empty = 0, timed_untimed = 0;
  for (int u = 0; u < ops_seen.n; u++) {
    const char *name = ops_seen.name[u];
    const Table *ut = &inside[u].table;
    if (in_list(UNTIMED, N_OF(UNTIMED), name)) timed_untimed += ut->n > 0;
    else if (ut->n == 0) empty++, printf("  ! range '%s' holds no row of the table\n", name);
    char use[8] = "fwd", kind[8];
    const int res = sscanf(name, "matmul+residual fwd %7s", kind) == 1;        // its GEMM row: "gemm fwd+res KIND"
    const int swi = !res && sscanf(name, "matmul+swiglu fwd %7s", kind) == 1;  // "gemm fwd+swiglu KIND"
    if (!res && !swi && sscanf(name, "matmul %7s %7s", use, kind) != 2) continue;
    matmuls++;
    const int fwd = !strcmp(use, "fwd");
    const char *uses[2] = {res ? "fwd+res" : swi ? "fwd+swiglu" : fwd ? "fwd" : "dgrad", fwd ? NULL : "wgrad"};
    for (int k = 0; k < 2; k++) {
      if (!uses[k]) continue;
      int found = 0;
      for (int i = 0; i < ut->n; i++) {
        char gu[16], gk[16];
        if (gemm_row(ut->row[i].name, gu, gk) && !strcmp(gu, uses[k]) && !strcmp(gk, kind)) found = 1;
      }
      if (!found) lacking++, printf("  ! range '%s' holds no 'gemm %s %s' row\n", name, uses[k], kind);
    }
  }
  CHECK(matmuls == 14 && lacking == 0, "the %d matmul ranges (7 linears, fwd and bwd) hold their GEMMs (%d missing)",
        matmuls, lacking);
  CHECK(empty == 0, "every range but the untimed copies holds a row (%d did not)", empty);
  CHECK(timed_untimed == 0, "the untimed entries (upload ...) hold no row (%d did)", timed_untimed);
  free(outside), free(inside);
}

int main(void) {
  char err[256];
  // deterministic, W^T copies, device 0, nvtx, cuBLASLt's heuristic GEMMs
  const BackendOptions no_ranges = {1, 1, 0, 0, GEMM_HEURISTIC, NULL}, with_ranges = {1, 1, 0, 1, GEMM_HEURISTIC, NULL};
  const Ops *ranged = cuda_backend_open(&with_ranges, err, sizeof err);
  CHECK(ranged != NULL, "a CUDA backend with NVTX ranges: %s", err);
  if (!ranged) TEST_END();

  TEST_SECTION("the injection");
  CHECK(ranged->range_push && ranged->range_pop, "with ranges: range_push and range_pop are set");
  if (!ranged->range_push) TEST_END();
  ranged->range_push(ranged->ctx, "probe");
  ranged->range_pop(ranged->ctx);
  CHECK(rec.inits == 1, "NVTX called this program's tool once (%d times)", rec.inits);
  if (rec.inits != 1) {
    const char *env = getenv("NVTX_INJECTION64_PATH");
    if (env)
      printf("NVTX_INJECTION64_PATH=%s is set (a profiler attached?): NVTX loads that tool first; unset it\n", env);
    else printf("this toolkit's NVTX3 has no static injection (it came with NVTX's load sequence 2)\n");
    TEST_END();
  }
  CHECK(rec.nev == 2 && rec.ev[0].push && !strcmp(rec.ev[0].name, "probe") && rec.ev[0].depth == 1 && !rec.ev[1].push &&
            !strcmp(rec.ev[1].name, "probe") && rec.ev[1].depth == 0,
        "range_push(\"probe\"), range_pop: recorded as such (%d events)", rec.nev);

  int in[NVTX_N], tg[NVTX_N];
  nvtx_batch(in, tg);
  // mxfp4 as it ships (precision.fusion auto), then with the newer fusions auto leaves out too
  const char *recipes[] = {"bf16", "mxfp4", "mxfp4:on"};
  for (int k = 0; k < 3; k++) {
    char what[96];
    snprintf(what, sizeof what, "%s: one step's ranges", recipes[k]);
    TEST_SECTION(what);
    Step *warm = (Step *)xmalloc(sizeof(Step)), *all = (Step *)xmalloc(sizeof(Step));
    run_step(ranged, recipes[k], in, tg, PROF_NONE, NULL, warm);  // first calls: plans, tunings, caches
    run_step(ranged, recipes[k], in, tg, PROF_ALL, NULL, all);
    CHECK(isfinite(all->loss), "loss %g", all->loss);
    // the recipe is still set: whether its o and down add the residual in their epilogue
    const int fused = linear_fp4_fuses_residual(((CudaBackend *)ranged->ctx)->lin, (LinearId){0, LIN_O});
    CHECK(fused == (k == 2 && cuda_device_cc() == 90), "%s: the residual add in the o GEMM's epilogue: %s", recipes[k],
          fused ? "yes" : "no");
    const int swiglu = linear_fp4_fuses_swiglu(((CudaBackend *)ranged->ctx)->lin, (LinearId){0, LIN_UP},
                                               (LinearId){0, LIN_DOWN}, NVTX_N, 384);
    CHECK(k == 2 || !swiglu, "%s: SwiGLU in the up GEMM's epilogue only with fusion on: %s", recipes[k],
          swiglu ? "yes" : "no");
    check_structure(all, fused, swiglu);
    snprintf(what, sizeof what, "%s: the per-kernel table against the ranges", recipes[k]);
    TEST_SECTION(what);
    check_table(ranged, recipes[k], in, tg, all);
    free(warm), free(all);
  }
  CHECK(rec.underflows == 0 && rec.other_threads == 0 && rec.depth == 0,
        "over the whole run: no pop without a push (%d), one thread (%d others), nothing left open (%d)",
        rec.underflows, rec.other_threads, rec.depth);

  TEST_SECTION("ranges off: nothing is pushed");
  const Ops *plain = cuda_backend_open(&no_ranges, err, sizeof err);
  CHECK(plain != NULL, "a CUDA backend without ranges: %s", err);
  if (!plain) TEST_END();
  CHECK(!plain->range_push && !plain->range_pop, "range_push and range_pop are NULL");
  Step *off = (Step *)xmalloc(sizeof(Step));
  run_step(plain, "bf16", in, tg, PROF_NONE, NULL, off);
  CHECK(isfinite(off->loss) && off->last == off->first, "one step, loss %g, %d events", off->loss,
        off->last - off->first);
  free(off);
  TEST_END();
}
