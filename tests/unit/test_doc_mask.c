// tests/unit/test_doc_mask.c: document masking (model.doc_mask, model.doc_positions) on the CPU:
// the documents found in the input ids (model/doc_mask.c) on hand-worked rows; the block-causal
// attention reference against a double formula with an explicit mask built from the BOS tokens
// here, its backward against central differences of that formula; and the oracle that needs no
// formula of ours: a packed row A|B gives for B's tokens exactly what B alone gives, op by op
// (attention, RoPE with restarting positions) and through the whole model (logits bit for bit,
// gradients as the sum of A's and B's). The HF transformers comparison with an explicit 4D mask
// is scripts/hf/hf_doc_mask.py.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/doc_mask.h"
#include "model/llama.h"
#include "model/ops.h"
#include "tests/test.h"

static Rng rng;

static float *randn(size_t n) {
  float *x = xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) x[i] = rng_normal(&rng);
  return x;
}

static int same_ints(const int *a, const int *b, int n) { return !memcmp(a, b, (size_t)n * sizeof(int)); }

// ---- the documents of a micro-batch ------------------------------------------------------------

static void test_build(void) {
  TEST_SECTION("documents from the input ids (BOS = 9)");
  enum { B = 2, T = 8, N = B * T };
  // row 0: a document begun before the window, then BOS at 1, 4 and 5 (a one-token document);
  // row 1: BOS at the row's first token and at its last.
  const int tokens[N] = {5, 9, 3, 4, 9, 9, 2, 1, 9, 2, 2, 2, 2, 2, 2, 9};
  const int want_start[N] = {0, 1, 1, 1, 4, 5, 5, 5, 0, 0, 0, 0, 0, 0, 0, 7};
  const int want_pos[N] = {0, 0, 1, 2, 0, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 0};
  const int want_cu[7] = {0, 1, 4, 5, 8, 15, 16};
  int start[N], pos[N], cu[N + 1];
  double pairs;
  int n = doc_mask_build(tokens, B, T, 9, start, pos, cu, &pairs);
  CHECK(n == 6, "%d documents, want 6", n);
  CHECK(same_ints(start, want_start, N), "document starts");
  CHECK(same_ints(pos, want_pos, N), "restarting positions");
  CHECK(same_ints(cu, want_cu, 7), "document boundaries");
  CHECK(pairs == 1 + 6 + 1 + 6 + 28 + 1, "pairs %.0f, want 43 (lengths 1, 3, 1, 3 | 7, 1)", pairs);

  const int plain[N] = {1, 2, 3, 4, 5, 6, 7, 8, 8, 7, 6, 5, 4, 3, 2, 1};  // no BOS: one document per row
  n = doc_mask_build(plain, B, T, 9, start, NULL, cu, &pairs);
  int zeros = 1;
  for (int i = 0; i < N; i++) zeros &= start[i] == 0;
  CHECK(n == B && zeros && cu[0] == 0 && cu[1] == T && cu[2] == N, "no BOS: the rows are the documents");
  CHECK(pairs == B * T * (T + 1) / 2.0, "no BOS: the causal pairs, %.0f", pairs);
}

static void test_ragged(void) {
  TEST_SECTION("the ragged batch cuDNN reads (C reference of attention_docs.cu)");
  CHECK(doc_mask_bucket(1) == 32 && doc_mask_bucket(32) == 32 && doc_mask_bucket(33) == 64 &&
            doc_mask_bucket(100) == 128 && doc_mask_bucket(8192) == 8192,
        "buckets: 32 at least, then powers of two");
  const int cu[7] = {0, 1, 4, 5, 8, 15, 16};
  const int nb = doc_mask_bucket(6);
  int64_t oq[33], okv[33], ol[33];
  int32_t len[32];
  doc_mask_ragged(cu, 6, nb, 32 * 128, 8 * 128, 32, oq, okv, ol, len);
  int ok = 1;
  const int want_len[6] = {1, 3, 1, 3, 7, 1};
  for (int i = 0; i <= nb; i++) {
    int64_t first = i < 6 ? cu[i] : 16;
    ok &= oq[i] == first * 4096 && okv[i] == first * 1024 && ol[i] == first * 32;
    if (i < nb) ok &= len[i] == (i < 6 ? want_len[i] : 0);
  }
  CHECK(ok, "offsets of q/out, k/v and lse rows, lengths, empty padding entries at the end");
}

// ---- the deterministic backward's groups of documents ---------------------------------------------

static int ceil64(int x) { return (x + 63) / 64 * 64; }

// The length classes, counted here: T, then halves while whole and at least DOC_GROUP_MIN_LEN.
static int smallest_class(int T) {
  int S = T;
  while (S % 2 == 0 && S / 2 >= DOC_GROUP_MIN_LEN) S /= 2;
  return S;
}

// The micro-batch [B, T] of documents with these lengths, row after row (each row's lengths sum
// to T): cu as doc_mask_build writes it. Returns n_docs.
static int cu_of_lengths(const int *lens, int n, int *cu) {
  cu[0] = 0;
  for (int i = 0; i < n; i++) cu[i + 1] = cu[i] + lens[i];
  return n;
}

// Groups cu's documents and checks every property the attention relies on; returns the group count
// (and the groups and order in *groups, *order when not NULL; the caller frees them). quiet: no line
// of figures (the checks still count and print on failure).
static int check_groups(const char *what, const int *cu, int n_docs, int B, int T, int quiet, DocGroup **groups_out,
                        int **order_out) {
  int *order = xmalloc((size_t)n_docs * sizeof(int)), *seen = xcalloc((size_t)n_docs, sizeof(int));
  DocGroup *g = xmalloc((size_t)n_docs * sizeof(DocGroup));
  const int ng = doc_mask_groups(cu, n_docs, B, T, order, g), N = B * T, smin = smallest_class(T);
  const int64_t q_row = 32 * 128, kv_row = 8 * 128, lse_row = 32;
  int once = 1, shape = 1, lengths = 1, increasing = 1, full = 1, offsets = 1, workspace = 1, placed = 0;
  int *covered = xcalloc((size_t)N, sizeof(int));  // how many group entries hold each token's row
  for (int j = 0; j < ng; j++) {
    const DocGroup *x = &g[j];
    int k = 0;
    while (k < 20 && (T >> k) != x->S) k++;
    shape &= x->first == placed && x->n >= 1 && x->n <= x->b && (long)x->b * x->S == N && k < 20 && T % x->S == 0 &&
             x->b == B << k && x->S >= smin;
    workspace &= (double)x->b * ceil64(x->S) * ceil64(x->S) <= (double)B * ceil64(T) * ceil64(T);
    // a class's groups are full but its last: the next group has another S
    if (x->n < x->b && j + 1 < ng && g[j + 1].S == x->S) full = 0;
    for (int i = 0; i < x->n; i++) {
      const int d = order[x->first + i], L = cu[d + 1] - cu[d];
      seen[d]++;
      lengths &= L <= x->S && (x->S == smin || 2 * L > x->S);
      if (i > 0) increasing &= d > order[x->first + i - 1];
    }
    placed += x->n;
    int64_t *oq = xmalloc((size_t)(x->b + 1) * 8), *ok = xmalloc((size_t)(x->b + 1) * 8);
    int64_t *ol = xmalloc((size_t)(x->b + 1) * 8);
    int32_t *len = xmalloc((size_t)x->b * 4);
    doc_mask_group_ragged(cu, n_docs, order, x, q_row, kv_row, lse_row, oq, ok, ol, len);
    for (int i = 0; i <= x->b; i++) {
      const int d = i < x->n ? order[x->first + i] : -1;
      const int64_t row = d >= 0 ? cu[d] : N;
      offsets &= oq[i] == row * q_row && ok[i] == row * kv_row && ol[i] == row * lse_row;
      if (i > 0) offsets &= oq[i] >= oq[i - 1];
      if (i < x->b) {
        offsets &= len[i] == (d >= 0 ? cu[d + 1] - cu[d] : 0);
        for (int t = 0; t < len[i]; t++) covered[oq[i] / q_row + t]++;
      }
    }
    free(oq), free(ok), free(ol), free(len);
  }
  for (int d = 0; d < n_docs; d++) once &= seen[d] == 1;
  for (int t = 0; t < N; t++) once &= covered[t] == 1;
  if (!quiet) printf("  %-44s %5d documents, %3d groups\n", what, n_docs, ng);
  CHECK(once && placed == n_docs, "%s: a document (or a token's row) is in %s one group", what,
        placed == n_docs ? "not exactly" : "more or less than");
  CHECK(shape, "%s: a group's S is not T/2^k >= the smallest class, or b * S != B*T, or n outside 1..b", what);
  CHECK(lengths && increasing && full, "%s: lengths in (S/2, S] %d, documents increasing %d, groups full %d", what,
        lengths, increasing, full);
  CHECK(offsets, "%s: offsets or lengths of the ragged arrays wrong (or not increasing)", what);
  CHECK(workspace, "%s: a group's dP workspace b * ceil64(S)^2 exceeds plain causal's B * ceil64(T)^2", what);
  free(seen), free(covered);
  if (groups_out) *groups_out = g, *order_out = order;
  else free(g), free(order);
  return ng;
}

static void test_groups(void) {
  TEST_SECTION("groups of documents for the deterministic backward (doc_mask_groups)");
  {  // hand-worked: T = 256 has classes 256, 128, 64
    const int lens[] = {10, 64, 65, 117, 256}, B = 2, T = 256;
    int cu[6];
    DocGroup *g;
    int *order;
    int ng = check_groups("B=2 T=256, lengths 10 64 65 117 | 256", cu, cu_of_lengths(lens, 5, cu), B, T, 0, &g, &order);
    const DocGroup want[3] = {{64, 8, 0, 2}, {128, 4, 2, 2}, {256, 2, 4, 1}};
    const int want_order[5] = {0, 1, 2, 3, 4};
    CHECK(ng == 3 && !memcmp(g, want, sizeof want) && same_ints(order, want_order, 5),
          "groups {S, b, first, n}: {64, 8, 0, 2} {128, 4, 2, 2} {256, 2, 4, 1}");
    int64_t oq[9], okv[9], ol[9];
    int32_t len[8];
    doc_mask_group_ragged(cu, 5, order, &g[0], 4096, 1024, 32, oq, okv, ol, len);
    int ok =
        oq[0] == 0 && oq[1] == 10 * 4096 && okv[1] == 10 * 1024 && ol[1] == 10 * 32 && len[0] == 10 && len[1] == 64;
    for (int i = 2; i <= 8; i++) ok &= oq[i] == 512 * 4096 && okv[i] == 512 * 1024 && ol[i] == 512 * 32;
    for (int i = 2; i < 8; i++) ok &= len[i] == 0;
    CHECK(ok, "group 0's ragged arrays: documents at rows 0 and 10 (10 and 64 tokens), 6 empty entries at row 512");
    doc_mask_group_ragged(cu, 5, order, &g[1], 4096, 1024, 32, oq, okv, ol, len);
    CHECK(oq[0] == 74 * 4096 && oq[1] == 139 * 4096 && len[0] == 65 && len[1] == 117 && len[2] == 0 &&
              oq[4] == 512 * 4096,
          "group 1: rows 74 and 139 (65 and 117 tokens): not contiguous with group 0's");
    free(g), free(order);
  }
  enum { T8 = 8192 };
  int *cu = xmalloc((4 * T8 + 1) * sizeof(int)), *lens = xmalloc(4 * T8 * sizeof(int));
  DocGroup *g;
  int *order;
  lens[0] = T8;
  int ng = check_groups("one document of T = 8192", cu, cu_of_lengths(lens, 1, cu), 1, T8, 0, &g, &order);
  CHECK(ng == 1 && g[0].S == T8 && g[0].b == 1 && g[0].n == 1, "one group, S = T, b = 1 (plain causal's shape)");
  free(g), free(order);
  for (int i = 0; i < T8; i++) lens[i] = 1;
  ng = check_groups("T = 8192 documents of one token", cu, cu_of_lengths(lens, T8, cu), 1, T8, 0, &g, &order);
  int all = 1;
  for (int j = 0; j < ng; j++) all &= g[j].S == 64 && g[j].b == 128 && g[j].n == 128;
  CHECK(ng == 64 && all, "64 full groups of S = 64, b = 128: %d groups", ng);
  free(g), free(order);
  {  // documents at the class boundaries of T = 1024 (classes 1024, 512, 256, 128, 64), B = 3 rows
    const int bl[] = {64, 65, 128, 129, 256, 257, 125, 512, 512, 513, 511};
    const int want_S[] = {64, 128, 128, 256, 256, 512, 128, 512, 512, 1024, 512};
    ng = check_groups("B=3 T=1024, lengths at class boundaries", cu, cu_of_lengths(bl, 11, cu), 3, 1024, 0, &g, &order);
    int ok = 1;
    for (int j = 0; j < ng; j++)
      for (int i = 0; i < g[j].n; i++) ok &= g[j].S == want_S[order[g[j].first + i]];
    CHECK(ok && ng == 5, "64 -> 64, 65 -> 128, 128 -> 128, 129 -> 256, 257 -> 512, 513 -> 1024 (%d groups)", ng);
    free(g), free(order);
  }
  // T without many factors of two: T = 200 has classes 200 and 100; T = 9 and T = 96 only T.
  const int l200[] = {100, 100, 1, 99, 100};
  ng = check_groups("B=2 T=200, lengths 100 100 | 1 99 100", cu, cu_of_lengths(l200, 5, cu), 2, 200, 0, &g, &order);
  CHECK(ng == 2 && g[0].S == 100 && g[0].b == 4 && g[0].n == 4 && g[1].n == 1 && order[4] == 4,
        "T=200: five documents of at most 100 tokens, class 100 with b = 4: groups of 4 and 1");
  free(g), free(order);
  const int l9[] = {9, 3, 6};
  ng = check_groups("B=2 T=9, lengths 9 | 3 6", cu, cu_of_lengths(l9, 3, cu), 2, 9, 0, &g, &order);
  CHECK(ng == 2 && g[0].S == 9 && g[0].b == 2 && g[0].n == 2 && g[1].n == 1, "T=9: one class, groups of B = 2");
  free(g), free(order);

  // Random micro-batches: the properties above on documents found from random BOS tokens.
  Rng r;
  rng_seed(&r, 77);
  const int Ts[] = {64, 96, 100, 128, 200, 256, 384, 1000, 1024, 3072};
  int *tokens = xmalloc(4 * 3072 * sizeof(int)), *start = xmalloc(4 * 3072 * sizeof(int));
  for (int c = 0; c < 60; c++) {
    const int T = Ts[c % 10], B = 1 + (int)(rng_u64(&r) % 4);
    const int every = 1 + (int)(rng_u64(&r) % (c % 3 ? 300 : 5));  // a third with many short documents
    for (int n = 0; n < B * T; n++) tokens[n] = rng_u64(&r) % every == 0;
    double pairs;
    const int nd = doc_mask_build(tokens, B, T, 1, start, NULL, cu, &pairs);
    char what[64];
    snprintf(what, sizeof what, "random: B=%d T=%d, BOS 1 in %d", B, T, every);
    check_groups(what, cu, nd, B, T, c >= 10, NULL, NULL);  // the first 10 print their figures
  }
  free(cu), free(lens), free(tokens), free(start);
}

// ---- block-causal attention against an explicit mask ---------------------------------------------

typedef struct {
  int B, T, H, KV, hd;
  const int *seg;  // [B*T] document number of each token, counted here from the BOS tokens
  double *q, *k, *v, *dout;
} Masked;

// softmax(q k^T / sqrt(hd) + mask) v with the full [T, T] scores; the mask allows key j for query t
// when j <= t and both are in the same document.
static void naive_masked(double *out, double *lse, const Masked *c) {
  const int T = c->T, H = c->H, hd = c->hd, qs = H * hd, ks = c->KV * hd;
  double *s = xmalloc((size_t)T * sizeof(double));
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        const int g = h / (H / c->KV), n = b * T + t;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < T; j++) {
          double d = 0;
          for (int i = 0; i < hd; i++)
            d += c->q[(size_t)n * qs + h * hd + i] * c->k[(size_t)(b * T + j) * ks + g * hd + i];
          s[j] = j <= t && c->seg[b * T + j] == c->seg[n] ? d / sqrt(hd) : -INFINITY;
          mx = fmax(mx, s[j]);
        }
        for (int j = 0; j < T; j++) sum += exp(s[j] - mx);
        if (lse) lse[((size_t)b * H + h) * T + t] = mx + log(sum);
        for (int i = 0; i < hd; i++) {
          double o = 0;
          for (int j = 0; j < T; j++) o += exp(s[j] - mx) / sum * c->v[(size_t)(b * T + j) * ks + g * hd + i];
          out[(size_t)n * qs + h * hd + i] = o;
        }
      }
  free(s);
}

static double masked_objective(Masked *c, double *x, size_t i, double xi) {
  double keep = x[i];
  x[i] = xi;
  size_t n = (size_t)c->B * c->T * c->H * c->hd;
  double *o = xmalloc(n * sizeof(double)), r = 0;
  naive_masked(o, NULL, c);
  for (size_t j = 0; j < n; j++) r += o[j] * c->dout[j];
  free(o);
  x[i] = keep;
  return r;
}

static void check_fd(const char *what, const float *got, Masked *c, double *x, size_t n) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    const double h = 1e-5, fd = (masked_objective(c, x, i, x[i] + h) - masked_objective(c, x, i, x[i] - h)) / (2 * h);
    double e = fabs(got[i] - fd) / (1e-5 + 1e-4 * fabs(fd));
    if (!(e <= worst)) worst = e, at = i;
  }
  printf("  %-32s %.2f of tolerance\n", what, worst);
  CHECK(worst <= 1, "%s: element %zu off by %.2f x the tolerance", what, at, worst);
}

static void test_attention_mask(void) {
  TEST_SECTION("block-causal attention vs softmax with an explicit mask (GQA 4 on 2), backward vs finite diff.");
  enum { B = 2, T = 9, H = 4, KV = 2, hd = 8, N = B * T, BOS = 1 };
  // row 0: documents [0, 3), [3, 4), [4, 9); row 1: [0, 6), [6, 9)
  const int tokens[N] = {5, 6, 7, 1, 1, 8, 9, 4, 3, 7, 7, 7, 7, 7, 7, 1, 2, 2};
  int start[N], cu[N + 1], seg[N];
  double pairs;
  doc_mask_build(tokens, B, T, BOS, start, NULL, cu, &pairs);
  for (int n = 0, d = -1; n < N; n++) {  // the mask's own count of documents
    if (n % T == 0 || tokens[n] == BOS) d++;
    seg[n] = d;
  }
  const size_t nq = (size_t)N * H * hd, nk = (size_t)N * KV * hd, nl = (size_t)B * H * T;
  float *q = randn(nq), *k = randn(nk), *v = randn(nk), *dout = randn(nq);
  Masked c = {B, T, H, KV, hd, seg, xmalloc(nq * 8), xmalloc(nk * 8), xmalloc(nk * 8), xmalloc(nq * 8)};
  for (size_t i = 0; i < nq; i++) c.q[i] = q[i], c.dout[i] = dout[i];
  for (size_t i = 0; i < nk; i++) c.k[i] = k[i], c.v[i] = v[i];
  float *out = xmalloc(nq * 4), *lse = xmalloc(nl * 4);
  double *want = xmalloc(nq * 8), *want_lse = xmalloc(nl * 8);
  attention_forward(out, lse, q, k, v, start, B, T, H, KV, hd);
  naive_masked(want, want_lse, &c);
  double e_out = 0, e_lse = 0;
  for (size_t i = 0; i < nq; i++) e_out = fmax(e_out, fabs(out[i] - want[i]));
  for (size_t i = 0; i < nl; i++) e_lse = fmax(e_lse, fabs(lse[i] - want_lse[i]));
  printf("  forward max |err|: out %.2e, lse %.2e\n", e_out, e_lse);
  CHECK(e_out < 2e-6 && e_lse < 2e-6, "out %.3g, lse %.3g", e_out, e_lse);

  // A document's outputs ignore the other documents: changing keys and values of row 0's first two
  // documents leaves its third document's rows bit for bit, and changes the first's.
  float *k2 = xmalloc(nk * 4), *v2 = xmalloc(nk * 4), *out2 = xmalloc(nq * 4), *lse2 = xmalloc(nl * 4);
  memcpy(k2, k, nk * 4), memcpy(v2, v, nk * 4);
  for (size_t i = 0; i < (size_t)4 * KV * hd; i++) k2[i] += 1, v2[i] -= 1;
  attention_forward(out2, lse2, q, k2, v2, start, B, T, H, KV, hd);
  int third_same = !memcmp(out + (size_t)4 * H * hd, out2 + (size_t)4 * H * hd, (size_t)5 * H * hd * 4);
  int first_changed = memcmp(out, out2, (size_t)3 * H * hd * 4) != 0;
  CHECK(third_same && first_changed, "isolation: later document unchanged %d, changed document changed %d", third_same,
        first_changed);

  float *dq = xmalloc(nq * 4), *dk = xmalloc(nk * 4), *dv = xmalloc(nk * 4);
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, start, B, T, H, KV, hd);
  check_fd("dq", dq, &c, c.q, nq);
  check_fd("dk", dk, &c, c.k, nk);
  check_fd("dv", dv, &c, c.v, nk);
  free(q), free(k), free(v), free(dout), free(c.q), free(c.k), free(c.v), free(c.dout), free(out), free(lse);
  free(want), free(want_lse), free(k2), free(v2), free(out2), free(lse2), free(dq), free(dk), free(dv);
}

// ---- the oracle: a packed row A|B against A alone and B alone -------------------------------------

// Rows [t0, t0 + n) of a [*, T, width] activation, as a dense [n, width].
static int rows_equal(const float *packed, int t0, const float *alone, int n, int width) {
  return !memcmp(packed + (size_t)t0 * width, alone, (size_t)n * width * sizeof(float));
}

// lse [H, T] of one sequence: query rows [t0, t0 + n) against [H, n].
static int lse_equal(const float *packed, int T, int t0, const float *alone, int n, int H) {
  int ok = 1;
  for (int h = 0; h < H; h++) ok &= !memcmp(packed + (size_t)h * T + t0, alone + (size_t)h * n, n * sizeof(float));
  return ok;
}

static void test_packed_ops(void) {
  TEST_SECTION("packed row A|B: attention and RoPE give B's tokens exactly what B alone gives");
  enum { A = 5, Bn = 8, T = A + Bn, H = 4, KV = 2, hd = 16, BOS = 3 };
  int tokens[T];
  for (int t = 0; t < T; t++) tokens[t] = t == A ? BOS : 7;  // A began before the window; B is BOS + 7 tokens
  int start[T], pos[T], cu[T + 1];
  double pairs;
  CHECK(doc_mask_build(tokens, 1, T, BOS, start, pos, cu, &pairs) == 2, "two documents");
  const int qw = H * hd, kw = KV * hd;
  float *q = randn((size_t)T * qw), *k = randn((size_t)T * kw), *v = randn((size_t)T * kw),
        *dout = randn((size_t)T * qw);
  float *out = xmalloc((size_t)T * qw * 4), *lse = xmalloc((size_t)H * T * 4);
  float *dq = xmalloc((size_t)T * qw * 4), *dk = xmalloc((size_t)T * kw * 4), *dv = xmalloc((size_t)T * kw * 4);
  attention_forward(out, lse, q, k, v, start, 1, T, H, KV, hd);
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, start, 1, T, H, KV, hd);
  const int t0s[2] = {0, A}, lens[2] = {A, Bn};
  for (int d = 0; d < 2; d++) {  // each document alone: its own rows of q, k, v, dout, plain causal
    const int t0 = t0s[d], n = lens[d];
    float *o1 = xmalloc((size_t)n * qw * 4), *l1 = xmalloc((size_t)H * n * 4), *dq1 = xmalloc((size_t)n * qw * 4);
    float *dk1 = xmalloc((size_t)n * kw * 4), *dv1 = xmalloc((size_t)n * kw * 4);
    const float *qa = q + (size_t)t0 * qw, *ka = k + (size_t)t0 * kw, *va = v + (size_t)t0 * kw;
    attention_forward(o1, l1, qa, ka, va, NULL, 1, n, H, KV, hd);
    attention_backward(dq1, dk1, dv1, dout + (size_t)t0 * qw, qa, ka, va, o1, l1, NULL, 1, n, H, KV, hd);
    CHECK(rows_equal(out, t0, o1, n, qw) && lse_equal(lse, T, t0, l1, n, H), "document %c: out and lse bit for bit",
          "AB"[d]);
    CHECK(rows_equal(dq, t0, dq1, n, qw) && rows_equal(dk, t0, dk1, n, kw) && rows_equal(dv, t0, dv1, n, kw),
          "document %c: dq, dk, dv bit for bit", "AB"[d]);
    free(o1), free(l1), free(dq1), free(dk1), free(dv1);
  }
  // Without the mask B's rows see A's keys: the check above can fail.
  float *plain = xmalloc((size_t)T * qw * 4), *lp = xmalloc((size_t)H * T * 4);
  attention_forward(plain, lp, q, k, v, NULL, 1, T, H, KV, hd);
  CHECK(!rows_equal(plain, A, out + (size_t)A * qw, Bn, qw) && rows_equal(plain, 0, out, A, qw),
        "without the mask B's rows differ, A's (at the row start) do not");

  // RoPE with restarting positions: B's tokens rotate as B alone at positions 0..
  LlamaConfig c = {.rope_theta = 500000};
  float *cos_t = xmalloc((size_t)T * hd / 2 * 4), *sin_t = xmalloc((size_t)T * hd / 2 * 4);
  rope_tables(cos_t, sin_t, T, hd, &c);
  float *x = randn((size_t)T * qw), *xa = xmalloc((size_t)Bn * qw * 4);
  memcpy(xa, x + (size_t)A * qw, (size_t)Bn * qw * 4);
  rope_forward(x, cos_t, sin_t, pos, 1, T, H, hd);
  rope_forward(xa, cos_t, sin_t, NULL, 1, Bn, H, hd);
  CHECK(rows_equal(x, A, xa, Bn, qw), "rope forward: B's tokens at restarted positions, bit for bit");
  rope_backward(x, cos_t, sin_t, pos, 1, T, H, hd);
  rope_backward(xa, cos_t, sin_t, NULL, 1, Bn, H, hd);
  CHECK(rows_equal(x, A, xa, Bn, qw), "rope backward, bit for bit");
  int identity[T];  // explicit positions 0..T-1 are the NULL default, bit for bit
  for (int t = 0; t < T; t++) identity[t] = t;
  float *y1 = randn((size_t)T * qw), *y2 = xmalloc((size_t)T * qw * 4);
  memcpy(y2, y1, (size_t)T * qw * 4);
  rope_forward(y1, cos_t, sin_t, NULL, 1, T, H, hd);
  rope_forward(y2, cos_t, sin_t, identity, 1, T, H, hd);
  CHECK(!memcmp(y1, y2, (size_t)T * qw * 4), "positions 0..T-1 given explicitly = the default");
  free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv), free(plain), free(lp);
  free(cos_t), free(sin_t), free(x), free(xa), free(y1), free(y2);
}

static LlamaConfig model_config(void) {
  LlamaConfig c = {0};
  c.vocab_size = 41, c.dim = 32, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.ffn_dim = 48;
  c.max_seq_len = 32, c.norm_eps = 1e-5f, c.rope_theta = 10000;
  return c;
}

// A model over n tokens with the parameters p (and docs, recompute mode), run on one sequence: its
// logits and its gradients of mean loss * dloss.
static void run_model_ex(const float *p, const int *in, const int *tg, int n, const LlamaDocs *docs, int recompute,
                         float dloss, float *logits, float *grads) {
  LlamaConfig c = model_config();
  Llama *m = llama_create_ex(&c, 1, n, cpu_backend_open(), recompute);
  memcpy(llama_params(m), p, llama_param_count(m) * sizeof(float));
  if (docs) llama_set_docs(m, docs);
  llama_logits(m, in, logits);
  llama_zero_grad(m);
  llama_forward_backward(m, in, tg, -1, dloss);
  memcpy(grads, llama_grads(m), llama_param_count(m) * sizeof(float));
  llama_free(m);
}

static void run_model(const float *p, const int *in, const int *tg, int n, const LlamaDocs *docs, float dloss,
                      float *logits, float *grads) {
  run_model_ex(p, in, tg, n, docs, LLAMA_RECOMPUTE_NONE, dloss, logits, grads);
}

static void test_packed_model(void) {
  TEST_SECTION("the model on a packed row A|B (block-causal, restarting positions) vs A alone and B alone");
  enum { A = 6, Bn = 9, T = A + Bn, BOS = 40 };
  LlamaConfig c = model_config();
  const int V = c.vocab_size;
  Llama *m = llama_create(&c, 1, T, cpu_backend_open());
  llama_init(m, 3);
  const size_t np = llama_param_count(m);
  float *p = xmalloc(np * 4);
  memcpy(p, llama_params(m), np * 4);
  llama_free(m);
  int in[T], tg[T];
  for (int t = 0; t < T; t++) in[t] = (int)(rng_u64(&rng) % (V - 1)), tg[t] = (int)(rng_u64(&rng) % V);
  in[A] = BOS;  // B = BOS + 8 tokens; A began before the window
  const LlamaDocs docs = {.block_causal = 1, .restart_positions = 1, .bos_id = BOS};
  float *lp = xmalloc((size_t)T * V * 4), *la = xmalloc((size_t)A * V * 4), *lb = xmalloc((size_t)Bn * V * 4);
  float *gp = xmalloc(np * 4), *ga = xmalloc(np * 4), *gb = xmalloc(np * 4);
  // The mean loss over T targets is A/T times A's mean plus Bn/T times B's: so are the gradients.
  run_model(p, in, tg, T, &docs, 1.0f, lp, gp);
  run_model(p, in, tg, A, NULL, (float)A / T, la, ga);
  run_model(p, in + A, tg + A, Bn, NULL, (float)Bn / T, lb, gb);
  CHECK(!memcmp(lp, la, (size_t)A * V * 4), "A's logits bit for bit");
  CHECK(!memcmp(lp + (size_t)A * V, lb, (size_t)Bn * V * 4), "B's logits bit for bit");
  double num = 0, den = 0;
  for (size_t i = 0; i < np; i++) {
    double d = (double)gp[i] - ((double)ga[i] + gb[i]);
    num += d * d, den += (double)gp[i] * gp[i];
  }
  printf("  gradients: packed vs A + B, relative L2 %.2e\n", sqrt(num / den));
  CHECK(den > 0 && sqrt(num / den) < 1e-5, "gradients differ by %.3g (relative L2)", sqrt(num / den));

  // Without the options B's tokens see A and sit at positions A..: the checks above can fail.
  run_model(p, in, tg, T, NULL, 1.0f, lp, gp);
  CHECK(memcmp(lp + (size_t)A * V, lb, (size_t)Bn * V * 4) != 0, "without document masking B's logits differ");
  // With the mask, continuing positions shift every query and key of B by A: RoPE's scores depend only
  // on their distance, so B's logits agree with B alone up to rounding (the tables' other rows).
  const LlamaDocs mask_only = {.block_causal = 1, .restart_positions = 0, .bos_id = BOS};
  run_model(p, in, tg, T, &mask_only, 1.0f, lp, gp);
  double shift = 0, scale = 0;
  for (size_t i = 0; i < (size_t)Bn * V; i++)
    shift = fmax(shift, fabs(lp[(size_t)A * V + i] - lb[i])), scale = fmax(scale, fabs(lb[i]));
  printf("  mask, continuing positions: B's logits within %.2e of B alone (largest %.2f)\n", shift, scale);
  CHECK(shift < 1e-5 * scale && !memcmp(lp, la, (size_t)A * V * 4),
        "mask with continuing positions: B's logits off by %.3g (RoPE is relative), A's bit for bit", shift);
  const LlamaDocs off = {0, 0, BOS};
  float *lo = xmalloc((size_t)T * V * 4), *go = xmalloc(np * 4);
  run_model(p, in, tg, T, NULL, 1.0f, lp, gp);
  run_model(p, in, tg, T, &off, 1.0f, lo, go);
  CHECK(!memcmp(lp, lo, (size_t)T * V * 4) && !memcmp(gp, go, np * 4), "options off: the default, bit for bit");
  // The backward's recomputation reruns the blocks on the same documents: bit-identical.
  run_model(p, in, tg, T, &docs, 1.0f, lp, gp);
  run_model_ex(p, in, tg, T, &docs, LLAMA_RECOMPUTE_FULL, 1.0f, lo, go);
  CHECK(!memcmp(lp, lo, (size_t)T * V * 4) && !memcmp(gp, go, np * 4), "recompute full with documents, bit for bit");
  free(p), free(lp), free(la), free(lb), free(gp), free(ga), free(gb), free(lo), free(go);
}

int main(void) {
  rng_seed(&rng, 29);
  test_build();
  test_ragged();
  test_groups();
  test_attention_mask();
  test_packed_ops();
  test_packed_model();
  TEST_END();
}
