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
#include "run/dgrad_diag.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "data/loader.h"
#include "model/cpu/linear_fp4.h"

enum { COMP_QKV, COMP_O, COMP_FFN, COMP_N };
static const char *COMP_NAMES[COMP_N] = {"QKV", "O", "FFN"};

typedef struct {
  const Run *run;
  LinearFp4Cpu fmt[2];  // MXFP4, CTA-local NVFP4: the paper's two Dgrad contracts
  int draws, batch;
  // per block and component: the reference dX and the two formats' averaged dX^ (host, [N, D])
  float **ref, **est[2];
  double *energy[2];  // [batch][block][component]
  int N, D, L;
} Diag;

static int component(LinearKind k) {
  return k == LIN_Q || k == LIN_K || k == LIN_V ? COMP_QKV
         : k == LIN_O                           ? COMP_O
         : k == LIN_GATE || k == LIN_UP         ? COMP_FFN
                                                : -1;
}

// The tap: this linear's Dgrad, unquantized and in both formats, added into its component's sums.
static void tap(void *ctx, LinearId id, const void *dout, const float *w, int N, int in, int out_dim) {
  Diag *d = (Diag *)ctx;
  int c = component(id.kind);
  if (c < 0) return;
  const Ops *op = d->run->ops;
  float *dy = xmalloc((size_t)N * out_dim * sizeof *dy), *wh = xmalloc((size_t)out_dim * in * sizeof *wh);
  float *t = xmalloc((size_t)N * in * sizeof *t);
  op->acts_to_f32(op->ctx, dy, dout, (size_t)N * out_dim);
  op->download(op->ctx, wh, w, (size_t)out_dim * in * sizeof *wh);
  size_t slot = (size_t)id.layer * COMP_N + c;
  matmul_backward(d->ref[slot], NULL, dy, NULL, wh, N, in, out_dim, 1);
  for (int f = 0; f < 2; f++)
    for (int k = 0; k < d->draws; k++) {
      LinearFp4Cpu L = d->fmt[f];
      L.step = (uint32_t)d->batch, L.micro = (uint32_t)k;
      linear_fp4_cpu_backward(&L, id, t, NULL, dy, NULL, wh, N, in, out_dim, 0);
      float *e = d->est[f][slot];
      for (size_t i = 0; i < (size_t)N * in; i++) e[i] += t[i] / (float)d->draws;
    }
  free(dy), free(wh), free(t);
}

static LinearFp4Cpu route(const char *recipe, int n_layers, uint64_t seed) {
  RecipeSpec s = {.recipe = recipe, .sr = "dgrad", .hadamard = "none", .fp4_gemm = "reference"};
  return linear_fp4_cpu_route(&s, n_layers, seed);
}

int dgrad_diagnostic(Run *r, int batches, int draws, uint64_t seed, FILE *out) {
  if (strcmp(r->cfg.recipe, "bf16") || r->cfg.blocks[0])
    die("--dgrad-diagnostic: the tensors come from a BF16 backward: run it with --set precision.recipe=bf16 (load a "
        "checkpoint of any route with checkpoint.init_from)");
  if (r->world != 1) die("--dgrad-diagnostic: run it as one process (parallel.data_parallel 1), not %d", r->world);
  if (batches < 1 || draws < 1) die("--dgrad-diagnostic: batches %d and draws %d must be >= 1", batches, draws);
  const LlamaConfig *c = llama_config(r->model);
  Diag d = {.run = r, .draws = draws, .N = r->cfg.micro_batch * r->cfg.seq_len, .D = c->dim, .L = c->n_layers};
  d.fmt[0] = route("mxfp4", d.L, seed), d.fmt[1] = route("nvfp4_cta", d.L, seed);
  const size_t slots = (size_t)d.L * COMP_N, nd = (size_t)d.N * d.D;
  d.ref = xcalloc(slots, sizeof *d.ref);
  for (int f = 0; f < 2; f++) d.est[f] = xcalloc(slots, sizeof *d.est[f]);
  for (size_t s = 0; s < slots; s++) {
    d.ref[s] = xmalloc(nd * sizeof(float));
    for (int f = 0; f < 2; f++) d.est[f][s] = xmalloc(nd * sizeof(float));
  }
  for (int f = 0; f < 2; f++) d.energy[f] = xcalloc((size_t)batches * slots, sizeof(double));
  llama_set_linear_tap(r->model, tap, &d);
  fprintf(out,
          "dgrad diagnostic: %d micro-batch(es) of %d x %d tokens, %d SR draws averaged, blocks 1-%d, components "
          "QKV, O, FFN (gate+up)\n",
          batches, r->cfg.micro_batch, r->cfg.seq_len, draws, d.L);
  for (int b = 0; b < batches; b++) {
    d.batch = b;
    for (size_t s = 0; s < slots; s++) {
      memset(d.ref[s], 0, nd * sizeof(float));
      for (int f = 0; f < 2; f++) memset(d.est[f][s], 0, nd * sizeof(float));
    }
    loader_next(r->train, r->inputs, r->targets);
    llama_zero_grad(r->model);
    llama_forward_backward(r->model, r->inputs, r->targets, r->cfg.ignore_index, 1.0f);
    for (size_t s = 0; s < slots; s++)
      for (int f = 0; f < 2; f++) {
        double e = 0;
        for (size_t i = 0; i < nd; i++)
          e += ((double)d.est[f][s][i] - d.ref[s][i]) * ((double)d.est[f][s][i] - d.ref[s][i]);
        d.energy[f][(size_t)b * slots + s] = e;
      }
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
    }
  double gm = n ? exp(log_sum / n) : NAN;
  fprintf(out,
          "DGRAD_DIAG comparisons %d, CTA-local lower in %d, geometric mean E_MX/E_CTA %.4f (the paper: lower in "
          "288 of 288, 1.292)\n",
          batches * d.L * COMP_N, lower, gm);
  for (size_t s = 0; s < slots; s++) {
    free(d.ref[s]);
    for (int f = 0; f < 2; f++) free(d.est[f][s]);
  }
  free(d.ref), free(d.est[0]), free(d.est[1]), free(d.energy[0]), free(d.energy[1]);
  return 0;
}
