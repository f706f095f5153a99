// run/dgrad_diag.c: the paper's Dgrad diagnostic (arXiv 2610.00053, its reproducibility appendix): on
// tensors captured from the model's backward, Dgrad recomputed with MXFP4 and with CTA-local NVFP4
// against the unquantized product, as error energies per block and component, and the geometric mean
// of E_MX / E_CTA over every comparison.
//
// Per micro-batch (the run's data, its BF16 forward and backward: the model's own recipe is not used),
// for each block and component the operands of the Dgrad are captured through the model's linear tap
// (model/llama.h): QKV (q, k and v, whose Dgrads add into the attention norm's input), O (the attention
// output projection) and FFN (gate and up, adding into the FFN norm's input; the paper does not say
// which FFN projection it counts, and down's Dgrad feeds SwiGLU instead of a norm). For each format the
// Dgrad is computed as the CPU reference computes it (model/cpu/linear_fp4.c: dY rows with SR, W^T
// from the 2D weight tiles), `draws` times with fresh SR bits (Philox keyed on the diagnostic's own
// seed, not the run's), the draws averaged, and E = sum (dX^ - dX)^2 against dX = dY W in fp32.
//
// Only the first `rows` rows of dY are taken (whole sequences: --dgrad-tokens), and the work is done
// after the backward, not inside the tap: the tap copies the operands, then every (component, format)
// product runs as one single-threaded task on the CPU backend's OpenMP threads (tasks are independent:
// the fp4 quantizers are serial, so parallel GEMMs alone would leave them on one core). Each task calls
// the CPU reference (linear_fp4_cpu_backward) once per draw, so the numbers do not depend on the thread
// count or on how the tasks are scheduled.
#include "run/dgrad_diag.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "data/loader.h"

enum { COMP_QKV, COMP_O, COMP_FFN, COMP_N };
enum { SLOT_LINEARS = 3 };  // the most linears a component adds up (q, k, v)
enum { REF = 2 };           // the task kinds: format 0 (MXFP4), 1 (CTA-local), REF the fp32 product
enum { REPORT_S = 10 };     // seconds between progress lines on stderr
static const char *COMP_NAMES[COMP_N] = {"QKV", "O", "FFN"};

// One tapped linear: host copies of the first rows of its dY [rows, out] and of its W [out, in].
typedef struct {
  LinearId id;
  int in, out;
  float *dy, *w;
} Tapped;

typedef struct {
  const Run *run;
  LinearFp4Cpu fmt[2];  // MXFP4, CTA-local NVFP4: the paper's two Dgrad contracts
  int draws, batch, batches, rows, D, L;
  Tapped *tapped;  // [slot][SLOT_LINEARS], in the order the backward shows them
  int *ntapped;    // [slot]
  // per block and component: the reference dX and the two formats' averaged dX^ (host, [rows, D])
  float **ref, **est[2];
  double *energy[2];  // [batch][block][component]
  // progress: seconds spent in the forward+backward passes (fb_n of them) and in the Dgrads of the
  // batches before this one, when this batch's Dgrads began, and their cost (all batches cost the same)
  double t0, last_report, fb_s, dgrad_s, dgrad_t0, batch_cost, batch_done;
  int fb_n, in_dgrad;
} Diag;

static int component(LinearKind k) {
  return k == LIN_Q || k == LIN_K || k == LIN_V ? COMP_QKV
         : k == LIN_O                           ? COMP_O
         : k == LIN_GATE || k == LIN_UP         ? COMP_FFN
                                                : -1;
}

// The tap: copies this linear's first rows of dY and its W to the host for after the backward.
static void tap(void *ctx, LinearId id, const void *dout, const float *w, int N, int in, int out_dim) {
  Diag *d = (Diag *)ctx;
  int c = component(id.kind);
  if (c < 0) return;
  const Ops *op = d->run->ops;
  size_t slot = (size_t)id.layer * COMP_N + c;
  if (d->ntapped[slot] == SLOT_LINEARS) die("dgrad diagnostic: more than %d linears in one component", SLOT_LINEARS);
  Tapped *t = &d->tapped[slot * SLOT_LINEARS + d->ntapped[slot]++];
  if (!t->dy) {  // the first batch: the buffers, kept for the others (same shapes), and W, which no
    t->dy = xmalloc((size_t)d->rows * out_dim * sizeof *t->dy);  // optimizer step changes here
    t->w = xmalloc((size_t)out_dim * in * sizeof *t->w);
    op->download(op->ctx, t->w, w, (size_t)out_dim * in * sizeof *t->w);
  } else if (t->in != in || t->out != out_dim || t->id.kind != id.kind) {
    die("dgrad diagnostic: block %d's linears changed between micro-batches", id.layer + 1);
  }
  t->id = id, t->in = in, t->out = out_dim;
  (void)N;  // the first d->rows of its N rows (the micro-batch's first sequences)
  op->acts_to_f32(op->ctx, t->dy, dout, (size_t)d->rows * out_dim);
}

static LinearFp4Cpu route(const char *recipe, int n_layers, uint64_t seed) {
  RecipeSpec s = {.recipe = recipe, .sr = "dgrad", .hadamard = "none", .fp4_gemm = "reference"};
  return linear_fp4_cpu_route(&s, n_layers, seed);
}

void dgrad_diag_estimate(const LinearFp4Cpu *L, uint32_t step, LinearId id, float *est, const float *dy, const float *w,
                         int rows, int in, int out_dim, int draws) {
  const size_t nx = (size_t)rows * in;
  float *t = xmalloc(nx * sizeof *t);
  for (int k = 0; k < draws; k++) {  // draw k: the SR bits of micro-batch k at `step`
    LinearFp4Cpu Lk = *L;
    Lk.step = step, Lk.micro = (uint32_t)k;
    linear_fp4_cpu_backward(&Lk, id, t, NULL, dy, NULL, w, rows, in, out_dim, 0);
    for (size_t i = 0; i < nx; i++) est[i] += t[i] / (float)draws;
  }
  free(t);
}

// One task: slot's product of kind (a format or REF) over its tapped linears, in the backward's order.
static void run_task(const Diag *d, size_t slot, int kind) {
  float *out = kind == REF ? d->ref[slot] : d->est[kind][slot];
  memset(out, 0, (size_t)d->rows * d->D * sizeof *out);
  for (int j = 0; j < d->ntapped[slot]; j++) {
    const Tapped *t = &d->tapped[slot * SLOT_LINEARS + j];
    if (kind == REF) matmul_backward(out, NULL, t->dy, NULL, t->w, d->rows, t->in, t->out, 1);
    else
      dgrad_diag_estimate(&d->fmt[kind], (uint32_t)d->batch, t->id, out, t->dy, t->w, d->rows, t->in, t->out, d->draws);
  }
}

static double task_cost(const Diag *d, size_t slot, int kind) {
  double c = 0;
  for (int j = 0; j < d->ntapped[slot]; j++) {
    const Tapped *t = &d->tapped[slot * SLOT_LINEARS + j];
    c += (double)t->in * t->out;
  }
  return kind == REF ? c : c * d->draws;
}

typedef struct {
  size_t slot;
  int kind;
  double cost;
} Task;

static int by_cost_desc(const void *a, const void *b) {
  double x = ((const Task *)a)->cost, y = ((const Task *)b)->cost;
  return x < y ? 1 : x > y ? -1 : 0;
}

// "dgrad diagnostic: batch 2/3, 40% of its Dgrads, 1m05s elapsed, eta 2m10s" on stderr: the Dgrads
// left at the rate of those done, and the forward+backward passes left at theirs ("eta -" before any
// Dgrad is done).
static void report(Diag *d, const char *what) {
  double now = now_seconds(), done = d->batch * d->batch_cost + d->batch_done;
  double dgrad_s = d->dgrad_s + (d->in_dgrad ? now - d->dgrad_t0 : 0);
  double left = (done > 0 ? (d->batches * d->batch_cost - done) * dgrad_s / done : 0) +
                (d->fb_n ? (d->batches - d->fb_n) * d->fb_s / d->fb_n : 0);
  long e = (long)(now - d->t0), l = (long)(left + 0.5);
  char eta[32] = "-";
  if (done > 0) snprintf(eta, sizeof eta, "%ldm%02lds", l / 60, l % 60);
  fprintf(stderr, "dgrad diagnostic: batch %d/%d, %s, %ldm%02lds elapsed, eta %s\n", d->batch + 1, d->batches, what,
          e / 60, e % 60, eta);
  fflush(stderr);
  d->last_report = now;
}

// The batch's products: every (slot, kind) task on the OpenMP threads, the costliest first.
static void run_tasks(Diag *d, size_t slots) {
  Task *task = xmalloc(slots * 3 * sizeof *task);
  size_t n = 0;
  d->batch_cost = d->batch_done = 0;
  d->dgrad_t0 = now_seconds(), d->in_dgrad = 1;
  for (size_t s = 0; s < slots; s++)
    for (int k = 0; k < 3; k++) {
      task[n] = (Task){s, k, task_cost(d, s, k)};
      d->batch_cost += task[n++].cost;
    }
  qsort(task, n, sizeof *task, by_cost_desc);
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < n; i++) {
    run_task(d, task[i].slot, task[i].kind);
#pragma omp critical(dgrad_diag_progress)
    {
      d->batch_done += task[i].cost;
      if (now_seconds() - d->last_report >= REPORT_S) {
        char what[64];
        snprintf(what, sizeof what, "%.0f%% of its Dgrads", 100 * d->batch_done / d->batch_cost);
        report(d, what);
      }
    }
  }
  d->in_dgrad = 0;
  d->dgrad_s += now_seconds() - d->dgrad_t0;
  free(task);
}

int dgrad_diagnostic(Run *r, int batches, int draws, int tokens, uint64_t seed, FILE *out) {
  if (strcmp(r->cfg.recipe, "bf16") || r->cfg.blocks[0])
    die("--dgrad-diagnostic: the tensors come from a BF16 backward: run it with --set precision.recipe=bf16 (load a "
        "checkpoint of any route with checkpoint.init_from)");
  if (r->world != 1) die("--dgrad-diagnostic: run it as one process (parallel.data_parallel 1), not %d", r->world);
  if (batches < 1 || draws < 1) die("--dgrad-diagnostic: batches %d and draws %d must be >= 1", batches, draws);
  if (tokens < 0) die("--dgrad-tokens: %d must be >= 0 (0: the whole micro-batch)", tokens);
  const LlamaConfig *c = llama_config(r->model);
  const int B = r->cfg.micro_batch, T = r->cfg.seq_len;
  // whole sequences, the first ones of each micro-batch: every position 0..T-1 is represented as in the
  // full batch, and the loader's windows are shuffled, so the first sequences are a random sample
  int seqs = tokens == 0 || (tokens + T - 1) / T > B ? B : (tokens + T - 1) / T;
  Diag d = {.run = r, .draws = draws, .batches = batches, .rows = seqs * T, .D = c->dim, .L = c->n_layers};
  d.fmt[0] = route("mxfp4", d.L, seed), d.fmt[1] = route("nvfp4_cta", d.L, seed);
  const size_t slots = (size_t)d.L * COMP_N, nd = (size_t)d.rows * d.D;
  d.tapped = xcalloc(slots * SLOT_LINEARS, sizeof *d.tapped);
  d.ntapped = xcalloc(slots, sizeof *d.ntapped);
  d.ref = xcalloc(slots, sizeof *d.ref);
  for (int f = 0; f < 2; f++) d.est[f] = xcalloc(slots, sizeof *d.est[f]);
  for (size_t s = 0; s < slots; s++) {
    d.ref[s] = xmalloc(nd * sizeof(float));
    for (int f = 0; f < 2; f++) d.est[f][s] = xmalloc(nd * sizeof(float));
  }
  for (int f = 0; f < 2; f++) d.energy[f] = xcalloc((size_t)batches * slots, sizeof(double));
  llama_set_linear_tap(r->model, tap, &d);
  fprintf(out,
          "dgrad diagnostic: %d micro-batch(es) of %d x %d tokens, Dgrads on the first %d sequence(s) (%d tokens) of "
          "each, %d SR draws averaged, blocks 1-%d, components QKV, O, FFN (gate+up)\n",
          batches, B, T, seqs, d.rows, draws, d.L);
  fflush(out);
  d.t0 = d.last_report = now_seconds();
  for (int b = 0; b < batches; b++) {
    d.batch = b;
    double t = now_seconds();
    memset(d.ntapped, 0, slots * sizeof *d.ntapped);
    loader_next(r->train, r->inputs, r->targets);
    llama_zero_grad(r->model);
    llama_forward_backward(r->model, r->inputs, r->targets, r->cfg.ignore_index, 1.0f);
    double t_fb = now_seconds() - t;
    d.fb_s += t_fb, d.fb_n++;
    d.batch_done = 0;
    if (now_seconds() - d.last_report >= REPORT_S) {  // a slow backend's pass (the CPU's, on a big model)
      char what[64];
      snprintf(what, sizeof what, "forward+backward done in %.1f s", t_fb);
      report(&d, what);
    }
    run_tasks(&d, slots);
    double *energy[2] = {d.energy[0] + (size_t)b * slots, d.energy[1] + (size_t)b * slots};
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < 2 * slots; i++) {  // each energy summed in element order, as one thread would
      size_t s = i / 2;
      const float *est = d.est[i % 2][s], *ref = d.ref[s];
      double e = 0;
      for (size_t j = 0; j < nd; j++) e += ((double)est[j] - ref[j]) * ((double)est[j] - ref[j]);
      energy[i % 2][s] = e;
    }
    double log_sum = 0;
    int lower = 0, n = 0;
    for (size_t s = 0; s < slots; s++) {
      if (energy[0][s] > 0 && energy[1][s] > 0) log_sum += log(energy[0][s] / energy[1][s]), n++;
      lower += energy[1][s] < energy[0][s];
    }
    fprintf(out, "dgrad diagnostic batch %d/%d: CTA-local lower in %d of %zu, geometric mean E_MX/E_CTA %.4f\n", b + 1,
            batches, lower, slots, n ? exp(log_sum / n) : NAN);
    fflush(out);
    char what[128];
    double t_all = now_seconds() - t;
    snprintf(what, sizeof what, "done in %.1f s (forward+backward %.1f s, Dgrads %.1f s)", t_all, t_fb, t_all - t_fb);
    d.batch_done = d.batch_cost;
    report(&d, what);
  }
  llama_set_linear_tap(r->model, NULL, NULL);
  // the table: per block and component, the energies summed over the batches; the ratio statistics
  // over every (batch, block, component) comparison, as the paper counts them
  fprintf(out, "| block | component | E_MX | E_CTA | E_MX / E_CTA |\n|---|---|---|---|---|\n");
  double log_sum = 0;
  int n = 0, lower = 0;
  for (int l = 0; l < d.L; l++)
    for (int k = 0; k < COMP_N; k++) {
      double em = 0, el = 0;
      for (int b = 0; b < batches; b++) {
        double a = d.energy[0][(size_t)b * slots + l * COMP_N + k], z = d.energy[1][(size_t)b * slots + l * COMP_N + k];
        em += a, el += z;
        if (a > 0 && z > 0) log_sum += log(a / z), n++;
        lower += z < a;
      }
      fprintf(out, "| %d | %s | %.4e | %.4e | %.3f |\n", l + 1, COMP_NAMES[k], em, el, el > 0 ? em / el : NAN);
      fflush(out);
    }
  double gm = n ? exp(log_sum / n) : NAN;
  fprintf(out,
          "DGRAD_DIAG comparisons %d, CTA-local lower in %d, geometric mean E_MX/E_CTA %.4f (the paper: lower in "
          "288 of 288, 1.292)\n",
          batches * d.L * COMP_N, lower, gm);
  fflush(out);
  for (size_t s = 0; s < slots; s++) {
    free(d.ref[s]);
    for (int f = 0; f < 2; f++) free(d.est[f][s]);
  }
  for (size_t i = 0; i < slots * SLOT_LINEARS; i++) free(d.tapped[i].dy), free(d.tapped[i].w);
  free(d.tapped), free(d.ntapped);
  free(d.ref), free(d.est[0]), free(d.est[1]), free(d.energy[0]), free(d.energy[1]);
  return 0;
}
