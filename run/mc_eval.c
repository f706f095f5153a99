// run/mc_eval.c: see mc_eval.h.
#include "run/mc_eval.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

int mc_score(Llama *m, int B, int T, const EvalRequest *reqs, int n, double *logp, int *rows_out, char *err,
             size_t errlen) {
  const int V = llama_config(m)->vocab_size;
  for (int i = 0; i < n; i++) {
    const EvalRequest *r = &reqs[i];
    for (int t = 0; t < r->n_ctx + r->n_cont; t++)
      if (r->tokens[t] < 0 || r->tokens[t] >= V) {
        set_err(err, errlen, "request %d: token %d is %d, outside the model's vocabulary of %d", i, t, r->tokens[t], V);
        return -1;
      }
  }
  const size_t NT = (size_t)B * T;
  int *inputs = xmalloc(NT * sizeof(int)), *cand = xmalloc((size_t)T * sizeof(int));
  int *pos = xmalloc(NT * sizeof(int)), *tgt = xmalloc(NT * sizeof(int)), *owner = xmalloc(NT * sizeof(int));
  float *nll = xmalloc(NT * sizeof(float));
  int rc = 0, rows = 0;
  for (int r0 = 0; r0 < n && rc == 0;) {
    memset(inputs, 0, NT * sizeof(int));  // unused rows: any valid tokens do
    int nb = 0, np = 0, r = r0;
    // Fill up to B rows. A request whose inputs up to its last scored position equal the current
    // row's shares that row: the causal model gives those positions the same outputs, so MMLU's four
    // one-token answers after one context cost one row (the harness's HF model caches them alike).
    while (r < n) {
      const EvalRequest *q = &reqs[r];
      const int first = eval_pack_row(q, T, 0, cand);
      if (first < 0) {
        set_err(err, errlen, "request %d: cannot score %d context + %d continuation tokens in rows of %d", r, q->n_ctx,
                q->n_cont, T);
        rc = -1;
        break;
      }
      const int need = first + q->n_cont;  // inputs [0, need) decide the scored positions
      const int share = nb > 0 && !memcmp(inputs + (size_t)(nb - 1) * T, cand, (size_t)need * sizeof(int));
      if ((!share && nb == B) || np + q->n_cont > (int)NT) break;  // picks: at most the batch's positions
      if (!share) memcpy(inputs + (size_t)nb++ * T, cand, (size_t)T * sizeof(int));
      const int b = nb - 1;
      // position first + i predicts continuation token i
      for (int i = 0; i < q->n_cont; i++, np++)
        pos[np] = b * T + first + i, tgt[np] = q->tokens[q->n_ctx + i], owner[np] = r;
      r++;
    }
    if (rc) break;
    llama_token_nll(m, inputs, np, pos, tgt, nll);
    rows += nb;
    for (int k = r0; k < r; k++) logp[k] = 0;
    for (int i = 0; i < np; i++) logp[owner[i]] -= nll[i];  // each request's tokens in order
    r0 = r;
  }
  if (rows_out) *rows_out = rows;
  free(inputs), free(cand), free(pos), free(tgt), free(owner), free(nll);
  return rc;
}

// The argmax of the scores (plain, or divided by the choices' lengths), first maximum winning.
static int pick(const EvalSet *s, int d, const double *lp, int nc, int norm) {
  int best = 0;
  for (int j = 1; j < nc; j++) {
    double a = norm ? lp[j] / eval_choice_length(s, d, j) : lp[j];
    double b = norm ? lp[best] / eval_choice_length(s, d, best) : lp[best];
    if (a > b) best = j;
  }
  return best;
}

// The harness reports acc_norm for HellaSwag and ARC; WinoGrande and MMLU have acc only.
static int has_norm(const EvalSet *s) { return s->kind != EVAL_WINOGRANDE && s->kind != EVAL_MMLU; }

void mc_accuracy(const EvalSet *s, const EvalRequests *rq, const double *logp, EvalResult *out) {
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", s->name);
  out->n = rq->n_docs;
  out->has_norm = has_norm(s);
  const EvalTaskInfo *info = eval_task_info(s->name);
  out->paper_norm = info && info->paper_norm;
  int right = 0, right_norm = 0;
  int sub_n[EVAL_MAX_SUBJECTS] = {0}, sub_right[EVAL_MAX_SUBJECTS] = {0};
  for (int d = 0; d < rq->n_docs; d++) {
    const double *lp = logp + rq->first[d];
    const int nc = rq->first[d + 1] - rq->first[d], best = pick(s, d, lp, nc, 0), best_norm = pick(s, d, lp, nc, 1);
    right += best == s->docs[d].gold;
    right_norm += best_norm == s->docs[d].gold;
    if (s->docs[d].subject >= 0) sub_n[s->docs[d].subject]++, sub_right[s->docs[d].subject] += best == s->docs[d].gold;
  }
  out->acc = rq->n_docs ? (double)right / rq->n_docs : 0;
  out->acc_norm = out->has_norm && rq->n_docs ? (double)right_norm / rq->n_docs : 0;
  if (s->kind != EVAL_MMLU) return;
  // Per subject, then per category: means over their documents (the harness weights groups by size).
  int cat_n[EVAL_MMLU_CATEGORIES] = {0}, cat_right[EVAL_MMLU_CATEGORIES] = {0};
  for (int k = 0; k < s->n_subjects; k++) {
    if (!sub_n[k]) continue;  // not among the first eval.limit documents
    EvalGroup *g = &out->subject[out->n_subjects++];
    snprintf(g->name, sizeof g->name, "%s", s->subject[k]);
    g->n = sub_n[k], g->acc = (double)sub_right[k] / sub_n[k];
    int c = eval_mmlu_category(s->subject[k]);
    cat_n[c] += sub_n[k], cat_right[c] += sub_right[k];
  }
  for (int c = 0; c < EVAL_MMLU_CATEGORIES; c++) {
    snprintf(out->category[c].name, sizeof out->category[c].name, "%s", EVAL_MMLU_CATEGORY[c]);
    out->category[c].n = cat_n[c];
    out->category[c].acc = cat_n[c] ? (double)cat_right[c] / cat_n[c] : 0;
  }
}

McTask *mc_task_open(const Tokenizer *tok, const char *task, const char *path, int k_shot, int limit, uint64_t seed,
                     int bos, char *err, size_t errlen) {
  EvalSet *s = evalset_load(task, path, err, errlen);
  if (!s) return NULL;
  McTask *t = xcalloc(1, sizeof(McTask));
  t->set = s;
  t->k_shot = k_shot;
  if (s->kind == EVAL_MMLU && limit > 0) evalset_keep_per_subject(s, limit), limit = 0;  // per subject
  if (eval_build_requests(s, tok, k_shot, limit, seed, bos, &t->rq, err, errlen)) {
    mc_task_free(t);
    return NULL;
  }
  return t;
}

int mc_task_run(McTask *t, Llama *m, int B, int T, EvalResult *out, char *err, size_t errlen) {
  if (!t->logp) t->logp = xmalloc(((size_t)t->rq.n_req + 1) * sizeof(double));
  char e[512];
  int rc = mc_score(m, B, T, t->rq.req, t->rq.n_req, t->logp, &t->rows, e, sizeof e);
  if (rc) set_err(err, errlen, "%s %d-shot: %s", t->set->name, t->k_shot, e);
  else mc_accuracy(t->set, &t->rq, t->logp, out);
  return rc;
}

int mc_task_write_samples(const McTask *t, const char *path, char *err, size_t errlen) {
  if (!t->logp) return set_err(err, errlen, "%s: no run to write samples of", t->set->name), -1;
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return set_err(err, errlen, "%s: cannot write", tmp), -1;
  const EvalSet *s = t->set;
  const int norm = has_norm(s);
  for (int d = 0; d < t->rq.n_docs; d++) {
    const double *lp = t->logp + t->rq.first[d];
    int nc = t->rq.first[d + 1] - t->rq.first[d];
    fprintf(f, "{\"doc\": %d, ", d);
    if (s->docs[d].subject >= 0) fprintf(f, "\"subject\": \"%s\", ", s->subject[s->docs[d].subject]);
    fprintf(f, "\"gold\": %d, \"pred\": %d, ", s->docs[d].gold, pick(s, d, lp, nc, 0));
    if (norm) fprintf(f, "\"pred_norm\": %d, ", pick(s, d, lp, nc, 1));
    fprintf(f, "\"logp\": [");
    for (int j = 0; j < nc; j++) fprintf(f, "%s%.17g", j ? ", " : "", lp[j]);
    fprintf(f, "]}\n");
  }
  int bad = ferror(f);
  if (fclose(f) || bad || rename(tmp, path)) return set_err(err, errlen, "%s: write failed", path), -1;
  return 0;
}

void mc_task_free(McTask *t) {
  if (!t) return;
  eval_requests_free(&t->rq);
  evalset_free(t->set);
  free(t->logp);
  free(t);
}

int eval_task(Llama *m, int B, int T, const Tokenizer *tok, const char *task, const char *path, int k_shot, int limit,
              uint64_t seed, EvalResult *out, char *err, size_t errlen) {
  int bos = llama_config(m)->vocab_size > (int)tokenizer_bos(tok) ? (int)tokenizer_bos(tok) : -1;
  McTask *t = mc_task_open(tok, task, path, k_shot, limit, seed, bos, err, errlen);
  if (!t) return -1;
  int rc = mc_task_run(t, m, B, T, out, err, errlen);
  mc_task_free(t);
  return rc;
}
