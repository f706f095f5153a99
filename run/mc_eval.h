// run/mc_eval.h: multiple-choice evaluation with the model: the log-likelihood of each request's
// continuation, then accuracy as lm-evaluation-harness computes it (acc: argmax of sum log p;
// acc_norm: argmax of sum log p / len(choice) in characters; ties go to the first choice, as
// np.argmax). The tasks and requests come from data/evals.h.
//
// Cost: each request takes one of the model's B rows of T tokens, except that requests repeating the
// previous one's inputs share its row (MMLU: one row per question, not four); a batch is one forward
// pass, then the fused head for the scored positions only (llama_token_nll), so no [B*T, V] logits
// reach the host and a row costs about as much as a training row's forward through the blocks.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data/evals.h"
#include "data/tokenizer.h"
#include "model/llama.h"

#ifdef __cplusplus
extern "C" {
#endif

// Accuracy over one group of documents (an MMLU subject or category).
typedef struct {
  char name[48];
  int n;
  double acc;
} EvalGroup;

typedef struct {
  char name[32];  // task name
  int n;          // documents scored
  double acc;
  double acc_norm;
  int has_norm;    // 0 for WinoGrande and MMLU, whose harness tasks report acc only
  int paper_norm;  // the paper's metric for this task is acc_norm (else acc)
  // MMLU: acc per subject (in file order) and per category, each the mean over its documents; acc is
  // the mean over all documents (the harness's group aggregation, weighted by size).
  int n_subjects;
  EvalGroup subject[EVAL_MAX_SUBJECTS];
  EvalGroup category[EVAL_MMLU_CATEGORIES];
} EvalResult;

// The paper's metric of a result (acc_norm or acc).
static inline double eval_paper_metric(const EvalResult *r) { return r->paper_norm ? r->acc_norm : r->acc; }

// The tokenizer-free core: sum log p(continuation | context) of each of n requests, computed through
// llama_token_nll B rows at a time; *rows_out (if not NULL) = the rows it took. B and T must be the
// ones m was created with. Deterministic and independent of the thread count. The sum runs over
// the request's tokens in order; on the CPU a request's score has the same bits however it is
// batched or shared. Returns 0, or -1 with a message in err (a token id outside the vocabulary, a
// request that does not fit, see eval_pack_row).
int mc_score(Llama *m, int B, int T, const EvalRequest *reqs, int n, double *logp, int *rows_out, char *err,
             size_t errlen);

// Accuracy over the documents of rq from the scores logp[rq->n_req].
void mc_accuracy(const EvalSet *s, const EvalRequests *rq, const double *logp, EvalResult *out);

// A task prepared once (file parsed, prompts built and tokenized), to run at every eval interval.
typedef struct {
  EvalSet *set;
  EvalRequests rq;
  int k_shot;
  double *logp;  // [rq.n_req]: the scores of the last run
  int rows;      // the rows of T tokens the last run took (fewer than rq.n_req where requests share)
} McTask;

// Prepares `task` from path with k_shot examples per document over the first `limit` documents
// (all if limit <= 0; MMLU: the first `limit` of each subject, as the harness limits its subtasks). bos >= 0 is
// prepended to every context (pass TOKENIZER_BOS when the model was trained on BOS-framed documents). Returns NULL with
// a message in err.
McTask *mc_task_open(const Tokenizer *tok, const char *task, const char *path, int k_shot, int limit, uint64_t seed,
                     int bos, char *err, size_t errlen);
int mc_task_run(McTask *t, Llama *m, int B, int T, EvalResult *out, char *err, size_t errlen);
// The last run's documents as JSONL, one line each: {"doc": d, "subject": ..., "gold": g, "pred": p,
// "pred_norm": p', "logp": [...]} (subject for MMLU only, pred_norm where the task has acc_norm), the
// form scripts/eval/compare_harness.py reads beside the harness's samples. Returns 0, or -1 with err.
int mc_task_write_samples(const McTask *t, const char *path, char *err, size_t errlen);
void mc_task_free(McTask *t);

// One-shot convenience: open, run, free. BOS is prepended when the model's vocabulary has it.
int eval_task(Llama *m, int B, int T, const Tokenizer *tok, const char *task, const char *path, int k_shot, int limit,
              uint64_t seed, EvalResult *out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
