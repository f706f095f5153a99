// data/evals.h: multiple-choice downstream tasks (MMLU, HellaSwag, ARC-Challenge, WinoGrande): loading
// the task files, formatting prompts exactly as EleutherAI's lm-evaluation-harness does, and turning
// them into token-level requests (context tokens, continuation tokens) laid into the model's rows.
// No model code here: run/mc_eval.h scores the requests.
//
// A document has n_choices requests; request j is (context_j, continuation_j) and its score is
// sum log p(continuation_j | context_j). The harness's formats (target delimiter " "):
// - HellaSwag: context = query, continuation = " " + ending_j, where query is
//   preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()) and endings are preprocessed.
// - ARC-Challenge: context = "Question: {q}\nAnswer:", continuation = " " + choice_j.
// - WinoGrande (partial evaluation): the sentence is split at "_"; context_j = prefix + option_j,
//   continuation = " " + the text after the blank (the same for both options).
// - MMLU (the harness's `mmlu` task): context = description + "{question.strip()}\nA. {c0}\nB. {c1}\n
//   C. {c2}\nD. {c3}\nAnswer:", continuation = " A" .. " D", where description is "The following are
//   multiple choice questions (with answers) about {subject with '_' as ' '}.\n\n".
// k-shot: the context is prefixed by k solved examples, each formatted as context + " " + gold answer,
// joined and terminated by "\n\n". MMLU takes the first k dev questions of the document's subject, in
// file order (the harness's first_n sampler on the dev split), after the description; the other
// tasks take k examples of the same file (never the document itself), picked per document from the
// seed (the harness draws them from a training split these files do not have).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { EVAL_HELLASWAG, EVAL_ARC_CHALLENGE, EVAL_WINOGRANDE, EVAL_MMLU } EvalKind;

#define EVAL_MAX_CHOICES 8
#define EVAL_MAX_SUBJECTS 64  // MMLU has 57
#define EVAL_MMLU_CATEGORIES 4

// The tasks the engine knows: name, file in eval.dir, and the paper's setting (shots; its metric is
// acc_norm when paper_norm, else acc).
typedef struct {
  const char *name, *file;
  EvalKind kind;
  int paper_shots, paper_norm;
} EvalTaskInfo;
const EvalTaskInfo *eval_task_info(const char *name);  // NULL for an unknown name
#define EVAL_MAX_TASKS 8
// Parses eval.tasks ("paper": every task above with its paper_shots; or "name:shots,...", shots 0
// when omitted) into at most EVAL_MAX_TASKS
// (task, shots) pairs. Returns the count, or -1 with the reason in err (an unknown name, a bad shot
// count, too many tasks).
int eval_tasks_parse(const char *spec, const EvalTaskInfo **task, int *shots, char *err, size_t errlen);
// MMLU's subject categories as the harness groups them (mmlu_stem, ...), and a subject's (-1: unknown).
extern const char *const EVAL_MMLU_CATEGORY[EVAL_MMLU_CATEGORIES];
int eval_mmlu_category(const char *subject);

// One document, already in the harness's doc_to_text / doc_to_choice / doc_to_target form.
// HellaSwag, ARC: query is the context text, choices the answers (without the leading " ").
// WinoGrande: query is unused (NULL), choices are the partial contexts (prefix + option) and target
// is the text after the blank (stripped, without the leading " ").
typedef struct {
  char *query;
  char *target;
  int n_choices;
  char *choices[EVAL_MAX_CHOICES];
  int gold;     // index of the right choice
  int subject;  // MMLU: index into EvalSet.subject; -1 elsewhere
} EvalDoc;

typedef struct {
  EvalKind kind;
  char name[32];  // "hellaswag", "arc_challenge", "winogrande", "mmlu"
  int n;
  EvalDoc *docs;  // MMLU: the test split, in file order
  // MMLU only: the subjects in order of first appearance, and the dev split (the few-shot pool)
  int n_subjects;
  char subject[EVAL_MAX_SUBJECTS][48];
  int n_dev;
  EvalDoc *dev;
} EvalSet;

// Loads a task file:
// - hellaswag: llama.cpp's hellaswag_val.txt, 6 lines per document: context
//   ("activity_label: ctx"), gold index, 4 endings;
// - arc_challenge: JSONL {"query": "Question: ...", "choices": [...], "gold": i};
// - winogrande: JSONL {"context_options": [prefix+option1, prefix+option2], "continuation": "...",
//   "gold": i};
// - mmlu: JSONL {"subject": "abstract_algebra", "split": "test" | "dev", "question": "...",
//   "choices": [4 strings], "answer": 0..3}; every subject of the harness's 57, none unknown.
// Returns NULL with "path:line: reason" in err on any malformed input (a missing or mistyped field,
// an answer out of range, an empty choice, a truncated last line), before anything is scored.
EvalSet *evalset_load(const char *task, const char *path, char *err, size_t errlen);
void evalset_free(EvalSet *s);
// MMLU: keeps the first n test questions of each subject (the harness's --limit on its group, which
// limits each subtask), in file order.
void evalset_keep_per_subject(EvalSet *s, int n);

// The harness's HellaSwag preprocess(): strip, " [title]" -> ". ", delete "[...]" (shortest match),
// then each non-overlapping "  " -> " ". Returns a malloc'd string.
char *hellaswag_preprocess(const char *text);

// The text file holds activity_label + ": " + ctx_a + " " + ctx_b with ctx_b NOT capitalized. The
// harness capitalizes ctx_b; in the file ctx_b is non-empty exactly when the context does not end in
// '.' (ActivityNet items, 3243 of 10042), and it is the text after the last ". ". This uppercases
// its first letter in place. (Python's capitalize() also lowercases the rest of ctx_b; ctx_b is
// already lowercase there, so only proper nouns could differ.)
void hellaswag_capitalize_ctx_b(char *context);

// Picks k distinct documents among n, never doc itself, deterministically from (seed, doc): the
// same document gets the same examples whatever limit or order it is evaluated in. Needs k < n.
void eval_fewshot_pick(int n, int doc, int k, uint64_t seed, int *out);

// The k-shot prefix of document doc: "" for k = 0, else the examples joined and terminated by
// "\n\n". Returns a malloc'd string.
char *eval_fewshot_prefix(const EvalSet *s, int doc, int k, uint64_t seed);

// The text of request j of document doc, given its few-shot prefix: malloc'd *context and
// *continuation (the continuation includes the " " target delimiter).
void eval_request_text(const EvalSet *s, int doc, int j, const char *prefix, char **context, char **continuation);

// What acc_norm divides by: the harness's len(choice) in characters (Unicode code points, which is
// Python's len), of the choice without its delimiter.
double eval_choice_length(const EvalSet *s, int doc, int j);

// A token-level request: tokens = context ids followed by continuation ids.
typedef struct {
  int *tokens;
  int n_ctx, n_cont;
} EvalRequest;

// Tokenizes as the harness's _encode_pair: trailing whitespace of the context moves to the front of
// the continuation, context + continuation is encoded whole and split after the context's own
// token count. bos >= 0 is prepended to the context (-1: none).
void eval_request_tokenize(const Tokenizer *tok, const char *context, const char *continuation, int bos,
                           EvalRequest *r);
void eval_request_free(EvalRequest *r);

// All requests of the first `limit` documents (all when limit <= 0), doc d owning requests
// first[d] .. first[d+1]-1, one per choice.
typedef struct {
  int n_docs, n_req;
  int *first;  // [n_docs + 1]
  EvalRequest *req;
} EvalRequests;

// Builds the requests of a task with k_shot examples per document (bos as above). Returns 0, or -1
// with a message in err (k_shot too large for the file).
int eval_build_requests(const EvalSet *s, const Tokenizer *tok, int k_shot, int limit, uint64_t seed, int bos,
                        EvalRequests *out, char *err, size_t errlen);
void eval_requests_free(EvalRequests *rq);

// Lays a request into one model row of T input tokens as the harness does: keep the last T+1 tokens
// of context + continuation (left truncation), feed all but the last, pad the rest of the row with
// pad_id (causal attention: padding after a token never changes its logits). The logit at position
// returned + i predicts continuation token i, i < n_cont. Returns -1 if the request cannot be
// scored (empty context or continuation, or a continuation longer than T).
int eval_pack_row(const EvalRequest *r, int T, int pad_id, int *row);

#ifdef __cplusplus
}
#endif
