// tests/unit/test_evals.c: the downstream multiple-choice evals: task file parsing (MMLU too), the harness's
// HellaSwag preprocessing, k-shot prompts (checked against lm-evaluation-harness's own strings), request tokenization
// and row packing, scoring through a tiny random model against a direct log-softmax of llama_logits, and accuracy on
// oracle scores. Run from the repo root (reads ../shared/data/evals and ../shared/data/tokenizer).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "data/evals.h"
#include "data/json.h"
#include "data/tokenizer.h"
#include "model/llama.h"
#include "run/mc_eval.h"
#include "tests/test.h"

#define EVALS "../shared/data/evals/"

static EvalSet *load(const char *task, const char *file) {
  char err[512];
  EvalSet *s = evalset_load(task, file, err, sizeof err);
  if (!s) die("%s", err);
  return s;
}

static void test_parsing(EvalSet *hs, EvalSet *arc, EvalSet *wg) {
  TEST_SECTION("parsing the task files");
  CHECK(hs->n == 10042 && hs->kind == EVAL_HELLASWAG, "hellaswag n = %d", hs->n);
  CHECK(!strcmp(hs->docs[0].query, "Roof shingle removal: A man is sitting on a roof. He"), "%s", hs->docs[0].query);
  CHECK(hs->docs[0].gold == 3 && hs->docs[0].n_choices == 4, "gold %d", hs->docs[0].gold);
  CHECK(!strcmp(hs->docs[0].choices[0], "is using wrap to wrap a pair of skis."), "%s", hs->docs[0].choices[0]);
  CHECK(!strcmp(hs->docs[0].choices[3], "starts pulling up roofing on a roof."), "%s", hs->docs[0].choices[3]);
  CHECK(hs->docs[10041].gold == 2, "last gold %d", hs->docs[10041].gold);
  // a WikiHow item: ctx_b empty (ends in '.'), and a "[www...]" bracket the harness deletes
  const char *q = hs->docs[3505].query;
  CHECK(strstr(q, "Visit a site like to find loads") && !strchr(q, '['), "%s", q);
  CHECK(!strncmp(q, "Family Life: How to entertain a toddler. Ask the toddler", 56), "%s", q);

  CHECK(arc->n == 1172 && arc->kind == EVAL_ARC_CHALLENGE, "arc n = %d", arc->n);
  CHECK(!strcmp(arc->docs[0].query,
                "Question: An astronomer observes that a planet rotates faster after a meteorite impact. Which is the "
                "most likely effect of this increase in rotation?\nAnswer:"),
        "%s", arc->docs[0].query);
  CHECK(arc->docs[0].n_choices == 4 && arc->docs[0].gold == 2, "n %d gold %d", arc->docs[0].n_choices,
        arc->docs[0].gold);
  CHECK(!strcmp(arc->docs[0].choices[2], "Planetary days will become shorter."), "%s", arc->docs[0].choices[2]);
  CHECK(arc->docs[1].gold == 1 && !strcmp(arc->docs[1].choices[3], "building materials will be cheaper"), "%s",
        arc->docs[1].choices[3]);

  CHECK(wg->n == 1267 && wg->kind == EVAL_WINOGRANDE, "winogrande n = %d", wg->n);
  CHECK(wg->docs[0].n_choices == 2 && wg->docs[0].gold == 1 && wg->docs[1].gold == 0, "gold %d %d", wg->docs[0].gold,
        wg->docs[1].gold);
  CHECK(!strcmp(wg->docs[0].choices[0], "Sarah was a much better surgeon than Maria so Sarah"), "%s",
        wg->docs[0].choices[0]);
  CHECK(!strcmp(wg->docs[0].choices[1], "Sarah was a much better surgeon than Maria so Maria"), "%s",
        wg->docs[0].choices[1]);
  CHECK(!strcmp(wg->docs[0].target, "always got the easier cases."), "%s", wg->docs[0].target);

  char err[512];
  CHECK(!evalset_load("mmlu_pro", EVALS "arc_challenge.jsonl", err, sizeof err) && strstr(err, "mmlu_pro"), "%s", err);
  CHECK(!evalset_load("mmlu", EVALS "arc_challenge.jsonl", err, sizeof err) && strstr(err, "arc_challenge.jsonl:1") &&
            strstr(err, "subject"),
        "%s", err);
  CHECK(!evalset_load("hellaswag", EVALS "arc_challenge.jsonl", err, sizeof err) && strstr(err, "arc_challenge.jsonl"),
        "%s", err);
  CHECK(!evalset_load("winogrande", "/nonexistent/wg.jsonl", err, sizeof err) && strstr(err, "/nonexistent/wg.jsonl"),
        "%s", err);
  // a bad line is reported with its line number and key
  const char *bad = "/tmp/test_evals_bad.jsonl";
  FILE *f = xfopen(bad, "w");
  fprintf(f, "{\"query\": \"Question: a\", \"choices\": [\"x\", \"y\"], \"gold\": 1}\n");
  fprintf(f, "{\"query\": \"Question: b\", \"choices\": [\"x\", \"y\"], \"gold\": 2}\n");
  fclose(f);
  CHECK(!evalset_load("arc_challenge", bad, err, sizeof err) && strstr(err, "bad.jsonl:2") && strstr(err, "gold"), "%s",
        err);
  f = xfopen(bad, "w");
  fprintf(f, "{\"query\": \"Question: a\", \"choices\": [\"x\", 3], \"gold\": 0}\n");
  fclose(f);
  CHECK(!evalset_load("arc_challenge", bad, err, sizeof err) && strstr(err, ":1") && strstr(err, "choices"), "%s", err);
  f = xfopen(bad, "w");
  fprintf(f, "{\"query\": \"Question: \\u00e9 \\\"q\\\"\", \"choices\": [\"a\\\"]\", \"b\"] ,\"gold\":1}\n");
  fclose(f);
  EvalSet *esc = evalset_load("arc_challenge", bad, err, sizeof err);
  CHECK(esc && !strcmp(esc->docs[0].query, "Question: \xc3\xa9 \"q\"\nAnswer:") &&
            !strcmp(esc->docs[0].choices[0], "a\"]"),
        "escapes: %s", esc ? esc->docs[0].query : err);
  CHECK(esc && esc->docs[0].gold == 1 && esc->docs[0].n_choices == 2, "gold");
  evalset_free(esc);
}

static void check_pre(const char *in, const char *want) {
  char *got = hellaswag_preprocess(in);
  CHECK(!strcmp(got, want), "preprocess('%s') = '%s', want '%s'", in, got, want);
  free(got);
}

static void test_preprocess(void) {
  TEST_SECTION("HellaSwag preprocessing");
  check_pre("  How to X [title] Do Y. [step] Then  go. ", "How to X. Do Y. Then go.");
  check_pre("a   b", "a  b");  // one non-overlapping pass, as str.replace
  check_pre("visit [www.x.org] now [", "visit now [");
  check_pre("[header] How to [a] b [c]", " How to b ");
  check_pre("plain text.", "plain text.");
  char c1[] = "Roof: A man is on a roof. he", c2[] = "Life: How to x. Do y.", c3[] = "Ride: . \" a camel\"";
  hellaswag_capitalize_ctx_b(c1);
  hellaswag_capitalize_ctx_b(c2);
  hellaswag_capitalize_ctx_b(c3);
  CHECK(!strcmp(c1, "Roof: A man is on a roof. He"), "%s", c1);
  CHECK(!strcmp(c2, "Life: How to x. Do y."), "%s", c2);
  CHECK(!strcmp(c3, "Ride: . \" a camel\""), "%s", c3);
}

static void test_prompts(EvalSet *hs, EvalSet *arc, EvalSet *wg) {
  TEST_SECTION("k-shot prompts and request text");
  int a[25], b[25], c[25];
  eval_fewshot_pick(arc->n, 7, 25, 1234, a);
  eval_fewshot_pick(arc->n, 7, 25, 1234, b);
  eval_fewshot_pick(arc->n, 7, 25, 1235, c);
  int same = 1, differ = 0, valid = 1;
  for (int i = 0; i < 25; i++) {
    same &= a[i] == b[i];
    differ |= a[i] != c[i];
    valid &= a[i] != 7 && a[i] >= 0 && a[i] < arc->n;
    for (int j = 0; j < i; j++) valid &= a[i] != a[j];
  }
  CHECK(same && differ && valid, "deterministic %d, seed-dependent %d, distinct and not the doc %d", same, differ,
        valid);
  int small[2];
  eval_fewshot_pick(3, 1, 2, 9, small);  // the only choice: {0, 2}
  CHECK(small[0] + small[1] == 2 && small[0] != 1 && small[1] != 1, "%d %d", small[0], small[1]);

  // ARC 2-shot: "Question: ..\nAnswer: gold\n\n" twice, then the question
  char *prefix = eval_fewshot_prefix(arc, 0, 2, 42), *ctx, *cont, want[8192];
  int p[2];
  eval_fewshot_pick(arc->n, 0, 2, 42, p);
  snprintf(want, sizeof want, "%s %s\n\n%s %s\n\n", arc->docs[p[0]].query,
           arc->docs[p[0]].choices[arc->docs[p[0]].gold], arc->docs[p[1]].query,
           arc->docs[p[1]].choices[arc->docs[p[1]].gold]);
  CHECK(!strcmp(prefix, want), "prefix:\n%s\nwant:\n%s", prefix, want);
  CHECK(!strncmp(prefix, "Question: ", 10) && strstr(prefix, "\nAnswer: "), "%.60s", prefix);
  eval_request_text(arc, 0, 1, prefix, &ctx, &cont);
  snprintf(want, sizeof want, "%s%s", prefix, arc->docs[0].query);
  CHECK(!strcmp(ctx, want) && !strcmp(cont, " Planetary years will become longer."), "ctx/cont: %s", cont);
  free(ctx), free(cont), free(prefix);

  char *zero = eval_fewshot_prefix(hs, 0, 0, 42);
  CHECK(zero[0] == 0, "0-shot prefix '%s'", zero);
  eval_request_text(hs, 0, 3, zero, &ctx, &cont);
  CHECK(!strcmp(ctx, "Roof shingle removal: A man is sitting on a roof. He") &&
            !strcmp(cont, " starts pulling up roofing on a roof."),
        "%s|%s", ctx, cont);
  free(ctx), free(cont), free(zero);

  // WinoGrande: example = gold context + " " + suffix; the request's context is prefix + option
  prefix = eval_fewshot_prefix(wg, 1, 1, 5);
  eval_fewshot_pick(wg->n, 1, 1, 5, p);
  snprintf(want, sizeof want, "%s %s\n\n", wg->docs[p[0]].choices[wg->docs[p[0]].gold], wg->docs[p[0]].target);
  CHECK(!strcmp(prefix, want), "%s", prefix);
  eval_request_text(wg, 1, 0, prefix, &ctx, &cont);
  snprintf(want, sizeof want, "%sSarah was a much better surgeon than Maria so Sarah", prefix);
  CHECK(!strcmp(ctx, want) && !strcmp(cont, " always got the harder cases."), "%s|%s", ctx, cont);
  free(ctx), free(cont), free(prefix);
}

static int ids_equal(const int *a, const uint32_t *b, int n) {
  for (int i = 0; i < n; i++)
    if (a[i] != (int)b[i]) return 0;
  return 1;
}

static void test_requests(const Tokenizer *tok) {
  TEST_SECTION("request tokenization and row packing");
  EvalRequest r;
  eval_request_tokenize(tok, "Question: Why?\nAnswer:", " Because it is.", TOKENIZER_BOS, &r);
  uint32_t *ids;
  size_t nctx = tokenizer_encode(tok, "Question: Why?\nAnswer:", 22, &ids);
  CHECK(r.tokens[0] == TOKENIZER_BOS && r.n_ctx == (int)nctx + 1 && ids_equal(r.tokens + 1, ids, (int)nctx),
        "context: n_ctx %d", r.n_ctx);
  free(ids);
  size_t ncont = tokenizer_encode(tok, " Because it is.", 15, &ids);
  CHECK(r.n_cont == (int)ncont && ids_equal(r.tokens + r.n_ctx, ids, (int)ncont), "continuation: n_cont %d", r.n_cont);
  free(ids);
  // trailing whitespace of the context moves to the continuation (harness _encode_pair)
  EvalRequest s;
  eval_request_tokenize(tok, "Answer: ", "yes", -1, &s);
  size_t n1 = tokenizer_encode(tok, "Answer:", 7, &ids);
  CHECK(s.n_ctx == (int)n1 && ids_equal(s.tokens, ids, (int)n1), "n_ctx %d", s.n_ctx);
  free(ids);
  n1 = tokenizer_encode(tok, " yes", 4, &ids);
  CHECK(s.n_cont == (int)n1 && ids_equal(s.tokens + s.n_ctx, ids, (int)n1), "n_cont %d", s.n_cont);
  free(ids);
  eval_request_free(&r), eval_request_free(&s);

  int toks[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, row[16];
  EvalRequest q = {toks, 7, 3};
  int first = eval_pack_row(&q, 16, 0, row);
  CHECK(first == 6 && row[0] == 1 && row[8] == 9 && row[9] == 0 && row[15] == 0, "fits: first %d row %d %d %d", first,
        row[0], row[8], row[9]);
  first = eval_pack_row(&q, 5, 0, row);  // last 6 tokens 5..10, the row gets 5..9
  CHECK(first == 2 && row[0] == 5 && row[4] == 9 && row[first] == 7, "truncated: first %d row0 %d", first, row[0]);
  first = eval_pack_row(&q, 3, 0, row);  // continuation fills the whole row: only the last context token stays
  CHECK(first == 0 && row[0] == 7 && row[2] == 9, "tight: first %d row0 %d", first, row[0]);
  EvalRequest too_long = {toks, 1, 9}, no_ctx = {toks, 0, 3};
  CHECK(eval_pack_row(&too_long, 8, 0, row) == -1 && eval_pack_row(&no_ctx, 8, 0, row) == -1, "unscorable requests");
}

static LlamaConfig tiny_config(int V, int T) {
  LlamaConfig c = {0};
  c.vocab_size = V, c.dim = 16, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.ffn_dim = 24;
  c.max_seq_len = T, c.norm_eps = 1e-5f, c.rope_theta = 10000;
  return c;
}

// Large random weights, so the log-probabilities are far from uniform and depend on the context.
static void randomize(Llama *m, uint64_t seed) {
  Rng r;
  rng_seed(&r, seed);
  float *p = llama_params(m);
  for (size_t i = 0; i < llama_param_count(m); i++) p[i] = 0.3f * rng_normal(&r);
}

// sum log p(continuation) from one row laid out by hand, through a B = 1 model
static double direct_logp(Llama *m1, int T, int V, const int *tokens, int n_ctx, int n_cont, int pad) {
  int total = n_ctx + n_cont, start = total > T + 1 ? total - (T + 1) : 0, row[64];
  for (int i = 0; i < T; i++) row[i] = start + i < total - 1 ? tokens[start + i] : pad;
  float *lg = xmalloc((size_t)T * V * sizeof(float));
  llama_logits(m1, row, lg);
  double sum = 0;
  for (int t = total - n_cont; t < total; t++) {
    const float *x = lg + (size_t)(t - 1 - start) * V;
    double z = 0;
    for (int v = 0; v < V; v++) z += exp((double)x[v]);
    sum += (double)x[tokens[t]] - log(z);
  }
  free(lg);
  return sum;
}

// The same model at batch 2 and at batch 1 on the CPU (the scorer's batching must not matter), its
// parameters set by init(m2, seed) and copied.
static void twin_models(const LlamaConfig *c, int T, void (*init)(Llama *, uint64_t), uint64_t seed, Llama **m2,
                        Llama **m1) {
  *m2 = llama_create(c, 2, T, cpu_backend_open());
  *m1 = llama_create(c, 1, T, cpu_backend_open());
  init(*m2, seed);
  memcpy(llama_params(*m1), llama_params(*m2), llama_param_count(*m2) * sizeof(float));
}

static void test_scoring(void) {
  TEST_SECTION("scoring with a tiny model vs llama_logits");
  const int V = 37, T = 16;
  LlamaConfig c = tiny_config(V, T);
  Llama *m2, *m1;
  twin_models(&c, T, randomize, 11, &m2, &m1);
  int t0[6] = {3, 14, 15, 9, 2, 6}, t1[24], t2[4] = {0, 36, 1, 1};
  for (int i = 0; i < 24; i++) t1[i] = (i * 7 + 3) % V;
  EvalRequest reqs[3] = {{t0, 4, 2}, {t1, 20, 4}, {t2, 1, 3}};  // the second is left-truncated
  double lp[3], lp2[3];
  char err[256];
  CHECK(mc_score(m2, 2, T, reqs, 3, lp, NULL, err, sizeof err) == 0, "%s", err);
  CHECK_NEAR(lp[0], direct_logp(m1, T, V, t0, 4, 2, 5), 1e-5);  // pad 5: padding must not matter
  CHECK_NEAR(lp[1], direct_logp(m1, T, V, t1, 20, 4, 0), 1e-5);
  CHECK_NEAR(lp[2], direct_logp(m1, T, V, t2, 1, 3, 17), 1e-5);
  CHECK(lp[0] < 0 && lp[1] < 0 && lp[2] < 0 && lp[0] != lp[2], "%g %g %g", lp[0], lp[1], lp[2]);
  CHECK(mc_score(m1, 1, T, reqs, 3, lp2, NULL, err, sizeof err) == 0, "%s", err);
  CHECK(fabs(lp2[0] - lp[0]) < 1e-5 && fabs(lp2[1] - lp[1]) < 1e-5 && fabs(lp2[2] - lp[2]) < 1e-5, "B=1 vs B=2: %g %g",
        lp2[1], lp[1]);
  CHECK(mc_score(m2, 2, T, reqs, 3, lp2, NULL, err, sizeof err) == 0 && !memcmp(lp, lp2, sizeof lp),
        "bit-identical rerun");
  // Row sharing: four one-token answers after one context take one row (MMLU), a two-token answer
  // whose first token differs takes its own; every score has the bits it has when scored alone.
  int q[4][7], q2[2][6];
  for (int j = 0; j < 4; j++) {
    for (int i = 0; i < 6; i++) q[j][i] = (i * 5 + 1) % V;
    q[j][6] = 20 + j;
  }
  for (int j = 0; j < 2; j++) q2[j][0] = 4, q2[j][1] = 9, q2[j][2] = 9, q2[j][3] = 2, q2[j][4] = 30 + j, q2[j][5] = 8;
  EvalRequest sh[7] = {{q[0], 6, 1},  {q[1], 6, 1},  {q[2], 6, 1}, {q[3], 6, 1},
                       {q2[0], 4, 2}, {q2[1], 4, 2}, {t0, 4, 2}};
  double ls[7], alone;
  int rows = -1, same = 1;
  CHECK(mc_score(m2, 2, T, sh, 7, ls, &rows, err, sizeof err) == 0, "%s", err);
  CHECK(rows == 4, "7 requests took %d rows (want 4: one for the shared context, three more)", rows);
  for (int j = 0; j < 7; j++) {
    CHECK(mc_score(m2, 2, T, &sh[j], 1, &alone, NULL, err, sizeof err) == 0, "%s", err);
    same &= !memcmp(&alone, &ls[j], sizeof alone);
  }
  CHECK(same, "shared-row scores bit-identical to scoring each alone");
  CHECK_NEAR(ls[2], direct_logp(m1, T, V, q[2], 6, 1, 0), 1e-5);
  CHECK(ls[0] != ls[1] && ls[4] != ls[5], "%g %g %g %g", ls[0], ls[1], ls[4], ls[5]);
  int bad[3] = {1, 2, 37};
  EvalRequest br = {bad, 2, 1};
  CHECK(mc_score(m2, 2, T, &br, 1, lp2, NULL, err, sizeof err) == -1 && strstr(err, "vocabulary"), "%s", err);
  llama_free(m1), llama_free(m2);
}

static void test_end_to_end(const Tokenizer *tok) {
  TEST_SECTION("eval_task end to end (tiny model, Llama-3 vocabulary)");
  const int V = 128256, T = 64;
  LlamaConfig c = tiny_config(V, T);
  Llama *m2, *m1;
  twin_models(&c, T, llama_init, 3, &m2, &m1);
  EvalResult r2, r1;
  char err[512];
  // 2-shot ARC contexts are longer than T = 64: every request is left-truncated
  CHECK(eval_task(m2, 2, T, tok, "arc_challenge", EVALS "arc_challenge.jsonl", 2, 3, 42, &r2, err, sizeof err) == 0,
        "%s", err);
  CHECK(eval_task(m1, 1, T, tok, "arc_challenge", EVALS "arc_challenge.jsonl", 2, 3, 42, &r1, err, sizeof err) == 0,
        "%s", err);
  CHECK(r2.n == 3 && !strcmp(r2.name, "arc_challenge") && r2.has_norm, "n %d", r2.n);
  CHECK(r2.acc == r1.acc && r2.acc_norm == r1.acc_norm && r2.acc >= 0 && r2.acc <= 1, "acc %g %g", r2.acc, r1.acc);
  CHECK(eval_task(m2, 2, T, tok, "winogrande", EVALS "winogrande.jsonl", 0, 2, 42, &r2, err, sizeof err) == 0 &&
            r2.n == 2 && !r2.has_norm,
        "%s", err);
  CHECK(eval_task(m2, 2, T, tok, "winogrande", EVALS "winogrande.jsonl", 1267, 2, 42, &r2, err, sizeof err) == -1 &&
            strstr(err, "1267-shot"),
        "%s", err);
  llama_free(m1), llama_free(m2);
}

static void test_oracle(EvalSet *arc, EvalSet *wg) {
  TEST_SECTION("accuracy on oracle and constant scores");
  // requests without tokens: mc_accuracy only needs the document/request layout
  const int nd = 50;
  EvalRequests rq = {.n_docs = nd};
  rq.first = xmalloc((nd + 1) * sizeof(int));
  rq.first[0] = 0;
  for (int d = 0; d < nd; d++) rq.first[d + 1] = rq.first[d] + arc->docs[d].n_choices;
  rq.n_req = rq.first[nd];
  double *lp = xmalloc(rq.n_req * sizeof(double));
  for (int d = 0; d < nd; d++)
    for (int j = 0; j < arc->docs[d].n_choices; j++) lp[rq.first[d] + j] = j == arc->docs[d].gold ? -0.5 : -3.0;
  EvalResult r;
  mc_accuracy(arc, &rq, lp, &r);
  CHECK(r.n == nd && r.acc == 1.0 && r.acc_norm == 1.0, "oracle: acc %g acc_norm %g", r.acc, r.acc_norm);

  // constant scores: acc picks choice 0; acc_norm = argmax of -1/len picks the longest (first if tied)
  int want0 = 0, want_long = 0;
  for (int d = 0; d < nd; d++) {
    want0 += arc->docs[d].gold == 0;
    int best = 0;
    for (int j = 1; j < arc->docs[d].n_choices; j++)
      if (strlen(arc->docs[d].choices[j]) > strlen(arc->docs[d].choices[best])) best = j;  // ASCII here
    want_long += arc->docs[d].gold == best;
  }
  for (int i = 0; i < rq.n_req; i++) lp[i] = -1.0;
  mc_accuracy(arc, &rq, lp, &r);
  CHECK_NEAR(r.acc, want0 / 50.0, 1e-12);
  CHECK_NEAR(r.acc_norm, want_long / 50.0, 1e-12);
  CHECK(want0 > 0 && want0 < nd, "the constant scorer is right on some, not all: %d", want0);

  // characters, not bytes: "é" is one character
  EvalDoc doc = {.query = "q", .n_choices = 2, .choices = {"\xc3\xa9t\xc3\xa9", "abcd"}};
  EvalSet one = {.kind = EVAL_ARC_CHALLENGE, .name = "t", .n = 1, .docs = &doc};
  CHECK(eval_choice_length(&one, 0, 0) == 3 && eval_choice_length(&one, 0, 1) == 4, "code points");
  free(lp), free(rq.first);

  // WinoGrande: acc only
  EvalRequests wq = {.n_docs = 3, .n_req = 6, .first = (int[]){0, 2, 4, 6}};
  double wl[6] = {-1, -2, -2, -1, -1, -1};  // picks 0, 1, 0 (tie)
  mc_accuracy(wg, &wq, wl, &r);
  int want = (wg->docs[0].gold == 0) + (wg->docs[1].gold == 1) + (wg->docs[2].gold == 0);
  CHECK_NEAR(r.acc, want / 3.0, 1e-12);
  CHECK(!r.has_norm && r.acc_norm == 0, "winogrande has no acc_norm");
}

// ---- MMLU --------------------------------------------------------------------------------------

static void test_tasks_parse(void) {
  TEST_SECTION("eval.tasks: \"paper\" and task:shots lists");
  const EvalTaskInfo *t[EVAL_MAX_TASKS];
  int k[EVAL_MAX_TASKS];
  char err[256];
  int n = eval_tasks_parse("paper", t, k, err, sizeof err);
  CHECK(n == 4 && !strcmp(t[0]->name, "mmlu") && k[0] == 5 && !strcmp(t[1]->name, "hellaswag") && k[1] == 10 &&
            !strcmp(t[2]->name, "winogrande") && k[2] == 5 && !strcmp(t[3]->name, "arc_challenge") && k[3] == 25,
        "paper: %d tasks", n);
  CHECK(t[1]->paper_norm && !t[0]->paper_norm && !t[2]->paper_norm && t[3]->paper_norm, "the paper's metrics");
  n = eval_tasks_parse("winogrande,mmlu:3", t, k, err, sizeof err);
  CHECK(n == 2 && k[0] == 0 && k[1] == 3 && !strcmp(t[1]->file, "mmlu.jsonl"), "list: %d", n);
  CHECK(eval_tasks_parse("mmlu:x", t, k, err, sizeof err) < 0 && strstr(err, "'x'"), "%s", err);
  CHECK(eval_tasks_parse("mmlu:-1", t, k, err, sizeof err) < 0 && strstr(err, "shot"), "%s", err);
  CHECK(eval_tasks_parse("gsm8k:5", t, k, err, sizeof err) < 0 && strstr(err, "gsm8k"), "%s", err);
  CHECK(eval_tasks_parse("mmlu,mmlu,mmlu,mmlu,mmlu,mmlu,mmlu,mmlu,mmlu", t, k, err, sizeof err) < 0 &&
            strstr(err, "more than 8"),
        "%s", err);
}

static void test_mmlu_parsing(const EvalSet *m) {
  TEST_SECTION("MMLU: the file, subjects and categories");
  CHECK(m->kind == EVAL_MMLU && m->n == 14042 && m->n_dev == 285 && m->n_subjects == 57, "n %d dev %d subjects %d",
        m->n, m->n_dev, m->n_subjects);
  CHECK(!strcmp(m->subject[0], "abstract_algebra") && !strcmp(m->subject[56], "world_religions"), "%s %s",
        m->subject[0], m->subject[56]);
  const EvalDoc *d = &m->docs[0];
  CHECK(!strcmp(d->query,
                "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\nA. 0\nB. 4\nC. "
                "2\nD. 6\nAnswer:") &&
            d->gold == 1 && d->n_choices == 4 && !strcmp(d->choices[3], "D") && d->subject == 0,
        "%s", d->query);
  int per_cat[EVAL_MMLU_CATEGORIES] = {0}, dev5 = 1;
  for (int k = 0; k < m->n_subjects; k++) {
    int c = eval_mmlu_category(m->subject[k]), nd = 0;
    if (c >= 0) per_cat[c]++;
    for (int i = 0; i < m->n_dev; i++) nd += m->dev[i].subject == k;
    dev5 &= nd == 5;
  }
  CHECK(per_cat[0] == 19 && per_cat[1] == 13 && per_cat[2] == 12 && per_cat[3] == 13,
        "subjects per category (stem, other, social_sciences, humanities): %d %d %d %d", per_cat[0], per_cat[1],
        per_cat[2], per_cat[3]);
  CHECK(dev5, "5 dev questions per subject");
  CHECK(eval_mmlu_category("us_foreign_policy") == 2 && eval_mmlu_category("nonsense") < 0, "categories");
  // Python's strip(): one question ends in U+0085 (NEL), which str.strip() removes
  int nel = 0;
  for (int i = 0; i < m->n; i++)
    if (!strncmp(m->docs[i].query, "Role-learning theory suggests that\nA. ", 38)) nel++;
  CHECK(nel == 1, "the question ending in U+0085 is stripped (%d found)", nel);
}

// One bad line in an otherwise good MMLU file: rejected before anything is scored, naming the line.
static void check_mmlu_bad(const char *line, int truncate, const char *want) {
  const char *path = "/tmp/test_evals_mmlu_bad.jsonl";
  FILE *f = xfopen(path, "w");
  fprintf(f,
          "{\"subject\": \"anatomy\", \"split\": \"test\", \"question\": \"q\", \"choices\": [\"a\", \"b\", \"c\", "
          "\"d\"], \"answer\": 0}\n");
  if (truncate) fprintf(f, "%.*s", (int)(strlen(line) / 2), line);
  else fprintf(f, "%s\n", line);
  fclose(f);
  char err[512];
  EvalSet *s = evalset_load("mmlu", path, err, sizeof err);
  CHECK(!s && strstr(err, "mmlu_bad.jsonl:2") && strstr(err, want), "%s -> %s", line, s ? "accepted" : err);
  evalset_free(s);
}

static void test_mmlu_bad_data(void) {
  TEST_SECTION("MMLU: bad data stops with the file and line");
  const char *ok =
      "{\"subject\": \"anatomy\", \"split\": \"dev\", \"question\": \"q\", \"choices\": [\"a\", \"b\", "
      "\"c\", \"d\"], \"answer\": 3}";
  check_mmlu_bad("{\"split\": \"test\", \"question\": \"q\", \"choices\": [\"a\", \"b\", \"c\", \"d\"], \"answer\": 0}",
                 0, "subject");
  check_mmlu_bad(
      "{\"subject\": \"anatomy\", \"split\": \"test\", \"choices\": [\"a\", \"b\", \"c\", \"d\"], "
      "\"answer\": 0}",
      0, "question");
  check_mmlu_bad(
      "{\"subject\": \"anatomy\", \"split\": \"test\", \"question\": \"q\", \"choices\": [\"a\", \"b\", "
      "\"c\", \"d\"], \"answer\": 4}",
      0, "answer");
  check_mmlu_bad(
      "{\"subject\": \"anatomy\", \"split\": \"test\", \"question\": \"q\", \"choices\": [\"a\", \"b\", "
      "\"c\", \"d\"]}",
      0, "answer");
  check_mmlu_bad(
      "{\"subject\": \"anatomy\", \"split\": \"test\", \"question\": \"q\", \"choices\": [\"a\", \"\", "
      "\"c\", \"d\"], \"answer\": 1}",
      0, "empty");
  check_mmlu_bad(
      "{\"subject\": \"anatomy\", \"split\": \"test\", \"question\": \"q\", \"choices\": [\"a\", \"b\", "
      "\"c\"], \"answer\": 1}",
      0, "4 answers");
  check_mmlu_bad(
      "{\"subject\": \"anatomy\", \"split\": \"train\", \"question\": \"q\", \"choices\": [\"a\", \"b\", "
      "\"c\", \"d\"], \"answer\": 1}",
      0, "split");
  check_mmlu_bad(
      "{\"subject\": \"astrology\", \"split\": \"test\", \"question\": \"q\", \"choices\": [\"a\", \"b\", "
      "\"c\", \"d\"], \"answer\": 1}",
      0, "astrology");
  check_mmlu_bad(ok, 1, "");  // a truncated last line
  // fewer dev questions than shots: refused when the requests are built, naming the subject
  const char *path = "/tmp/test_evals_mmlu_bad.jsonl";
  FILE *f = xfopen(path, "w");
  fprintf(f, "%s\n", ok);
  fprintf(f,
          "{\"subject\": \"anatomy\", \"split\": \"test\", \"question\": \"q\", \"choices\": [\"a\", \"b\", \"c\", "
          "\"d\"], \"answer\": 0}\n");
  fclose(f);
  char err[512];
  EvalSet *s = evalset_load("mmlu", path, err, sizeof err);
  EvalRequests rq;
  CHECK(s && eval_build_requests(s, NULL, 2, 0, 1, -1, &rq, err, sizeof err) && strstr(err, "anatomy") &&
            strstr(err, "2 dev"),
        "%s", err);
  evalset_free(s);
}

// A string member of a harness_prompts.jsonl line (NULL if absent); an int member by its digits.
static char *member(const char *line, const char *key) {
  char *out, e[64];
  size_t n;
  return json_get_string(line, strlen(line), key, &out, &n, e, sizeof e) == 1 ? out : NULL;
}
static int int_member(const char *line, const char *key) {
  char pat[32];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *p = strstr(line, pat);
  return p ? atoi(p + strlen(pat)) : -1;
}

// The engine's request texts against the harness's own (lm-evaluation-harness 0.4.13, through
// scripts/eval/harness_tasks.py over the same files): MMLU 0- and 5-shot, the others zero-shot.
static void test_harness_prompts(const EvalSet *mmlu, const EvalSet *hs, const EvalSet *arc, const EvalSet *wg) {
  TEST_SECTION("prompts: the same strings as lm-evaluation-harness builds (tests/data/harness_prompts.jsonl)");
  size_t len;
  char *text = read_file("tests/data/harness_prompts.jsonl", &len);
  int lines = 0, reqs = 0, bad = 0, per_task[4] = {0};
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    char *task = member(line, "task");
    int shots = int_member(line, "shots"), doc = int_member(line, "doc"), n = int_member(line, "n");
    const EvalSet *s = !strncmp(task, "mmlu_", 5)       ? mmlu
                       : !strcmp(task, "hellaswag")     ? hs
                       : !strcmp(task, "arc_challenge") ? arc
                                                        : wg;
    int d = doc;
    if (s == mmlu) {  // the doc-th question of the subject, in file order
      int k = 0;
      while (k < mmlu->n_subjects && strcmp(mmlu->subject[k], task + 5)) k++;
      d = -1;
      for (int i = 0, seen = 0; i < mmlu->n && d < 0; i++)
        if (mmlu->docs[i].subject == k && seen++ == doc) d = i;
    }
    per_task[s == mmlu ? 0 : s == hs ? 1 : s == arc ? 2 : 3]++;
    lines++;
    char *prefix = eval_fewshot_prefix(s, d, shots, 1234);
    for (int j = 0; j < n && d >= 0; j++) {
      char key[16], *ctx, *cont, *want_ctx, *want_cont;
      snprintf(key, sizeof key, "ctx%d", j);
      want_ctx = member(line, key);
      if (!want_ctx) want_ctx = member(line, "ctx0");
      snprintf(key, sizeof key, "cont%d", j);
      want_cont = member(line, key);
      eval_request_text(s, d, j, prefix, &ctx, &cont);
      if (strcmp(ctx, want_ctx) || strcmp(cont, want_cont)) {
        if (bad++ < 3)
          printf("  %s %d-shot doc %d choice %d:\n    ours    %.200s|%s\n    harness %.200s|%s\n", task, shots, doc, j,
                 ctx, cont, want_ctx, want_cont);
      }
      reqs++;
      free(ctx), free(cont), free(want_ctx), free(want_cont);
    }
    if (d < 0) bad++;
    free(prefix), free(task);
  }
  free(text);
  printf("  %d documents (mmlu %d, hellaswag %d, arc %d, winogrande %d), %d requests\n", lines, per_task[0],
         per_task[1], per_task[2], per_task[3], reqs);
  CHECK(lines == 234 && reqs > 800, "%d documents, %d requests read", lines, reqs);
  CHECK(bad == 0, "%d requests differ from the harness's", bad);
}

static void test_mmlu_accuracy(const EvalSet *m, const Tokenizer *tok) {
  TEST_SECTION("MMLU: requests, and accuracy per subject and category on oracle scores");
  char err[512];
  EvalRequests rq;
  CHECK(eval_build_requests(m, tok, 5, 300, 1, TOKENIZER_BOS, &rq, err, sizeof err) == 0, "%s", err);
  CHECK(rq.n_docs == 300 && rq.n_req == 1200, "%d docs %d requests", rq.n_docs, rq.n_req);
  int one = 1, shared = 1;
  for (int d = 0; d < rq.n_docs; d++)
    for (int j = 0; j < 4; j++) {
      const EvalRequest *r = &rq.req[rq.first[d] + j];
      one &= r->n_cont == 1;  // " A" .. " D" are single tokens
      shared &= r->n_ctx == rq.req[rq.first[d]].n_ctx &&
                !memcmp(r->tokens, rq.req[rq.first[d]].tokens, r->n_ctx * sizeof(int));
    }
  CHECK(one && shared, "one continuation token each (%d), one context per document (%d)", one, shared);
  double *lp = xmalloc(rq.n_req * sizeof(double));
  for (int d = 0; d < rq.n_docs; d++)  // gold wins in even documents, choice 0 in odd ones
    for (int j = 0; j < 4; j++) lp[rq.first[d] + j] = (d % 2 ? j == 0 : j == m->docs[d].gold) ? -1.0 : -2.0;
  EvalResult r;
  mc_accuracy(m, &rq, lp, &r);
  int want = 0, n_sub = 0;
  for (int d = 0; d < rq.n_docs; d++) want += d % 2 == 0 || m->docs[d].gold == 0;
  for (int k = 0; k < m->n_subjects; k++) {
    int has = 0;
    for (int d = 0; d < rq.n_docs; d++) has |= m->docs[d].subject == k;
    n_sub += has;
  }
  CHECK_NEAR(r.acc, (double)want / 300, 1e-12);
  CHECK(!r.has_norm && !r.paper_norm && r.n_subjects == n_sub, "has_norm %d, %d subjects (want %d)", r.has_norm,
        r.n_subjects, n_sub);
  double wsum = 0;
  int n_all = 0;
  for (int c = 0; c < EVAL_MMLU_CATEGORIES; c++) wsum += r.category[c].acc * r.category[c].n, n_all += r.category[c].n;
  CHECK(n_all == 300 && fabs(wsum / n_all - r.acc) < 1e-12, "categories weighted by size give the group acc");
  double wsub = 0;
  for (int k = 0; k < r.n_subjects; k++) wsub += r.subject[k].acc * r.subject[k].n;
  CHECK(fabs(wsub / 300 - r.acc) < 1e-12, "subjects weighted by size give the group acc");
  free(lp);
  eval_requests_free(&rq);
  // eval.limit on MMLU is per subject, as the harness's --limit on its group
  McTask *t = mc_task_open(tok, "mmlu", EVALS "mmlu.jsonl", 0, 3, 1, TOKENIZER_BOS, err, sizeof err);
  int per[EVAL_MAX_SUBJECTS] = {0}, ok = t != NULL, ordered = 1;
  for (int d = 0; t && d < t->set->n; d++) {
    per[t->set->docs[d].subject]++;
    if (d && t->set->docs[d].subject < t->set->docs[d - 1].subject) ordered = 0;
  }
  for (int k = 0; t && k < t->set->n_subjects; k++) ok &= per[k] == 3;
  CHECK(ok && t->rq.n_docs == 57 * 3 && ordered, "limit 3: %d documents, 3 per subject in file order",
        t ? t->rq.n_docs : -1);
  mc_task_free(t);
}

int main(void) {
  double t0 = now_seconds();
  EvalSet *hs = load("hellaswag", EVALS "hellaswag_val.txt"), *arc = load("arc_challenge", EVALS "arc_challenge.jsonl"),
          *wg = load("winogrande", EVALS "winogrande.jsonl");
  const char *model =
      getenv("TOKENIZER_MODEL") ? getenv("TOKENIZER_MODEL") : "../shared/data/tokenizer/tokenizer.model";
  char err[512];
  Tokenizer *tok = tokenizer_load(model, NULL, err, sizeof err);
  if (!tok) die("%s", err);
  EvalSet *mmlu = load("mmlu", EVALS "mmlu.jsonl");
  test_parsing(hs, arc, wg);
  test_tasks_parse();
  test_mmlu_parsing(mmlu);
  test_mmlu_bad_data();
  test_harness_prompts(mmlu, hs, arc, wg);
  test_mmlu_accuracy(mmlu, tok);
  test_preprocess();
  test_prompts(hs, arc, wg);
  test_requests(tok);
  test_scoring();
  test_end_to_end(tok);
  test_oracle(arc, wg);
  evalset_free(hs), evalset_free(arc), evalset_free(wg), evalset_free(mmlu);
  tokenizer_free(tok);
  printf("(%.2f s)\n", now_seconds() - t0);
  TEST_END();
}
