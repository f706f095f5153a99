// model/doc_mask.c: see doc_mask.h.
#include "model/doc_mask.h"

#include "common/common.h"

int doc_mask_build(const int *tokens, int B, int T, int bos_id, int *start, int *pos, int *cu, double *pairs) {
  int n_docs = 0;
  double sum = 0;
  for (int b = 0; b < B; b++) {
    int t0 = 0;
    for (int t = 0; t < T; t++) {
      const int n = b * T + t;
      if (t == 0 || tokens[n] == bos_id) {  // a row's first token, or a BOS: a new document
        if (t > 0) sum += (double)(t - t0) * (t - t0 + 1) / 2;
        t0 = t;
        cu[n_docs++] = n;
      }
      start[n] = t0;
      if (pos) pos[n] = t - t0;
    }
    sum += (double)(T - t0) * (T - t0 + 1) / 2;
  }
  cu[n_docs] = B * T;
  *pairs = sum;
  return n_docs;
}

void doc_mask_ragged(const int *cu, int n_docs, int nb, int64_t q_row, int64_t kv_row, int64_t lse_row, int64_t *off_q,
                     int64_t *off_kv, int64_t *off_lse, int32_t *len) {
  const DocGroup all = {.b = nb, .first = 0, .n = n_docs};  // every document in order, in one group
  doc_mask_group_ragged(cu, n_docs, NULL, &all, q_row, kv_row, lse_row, off_q, off_kv, off_lse, len);
}

int doc_mask_bucket(int n_docs) {
  int nb = 32;
  while (nb < n_docs && nb < (1 << 30)) nb *= 2;
  return nb;
}

// The class of a document of len tokens: the largest k <= K with T >> k >= len (classes T >> 0..K).
static int group_class(int len, int T, int K) {
  int k = 0;
  while (k < K && (T >> (k + 1)) >= len) k++;
  return k;
}

int doc_mask_groups(const int *cu, int n_docs, int B, int T, int *order, DocGroup *groups) {
  if (n_docs < 1 || cu[0] != 0 || cu[n_docs] != B * T)
    die("document groups: %d documents with boundaries from %d to %d, want at least one from 0 to B*T = %d", n_docs,
        n_docs > 0 ? cu[0] : 0, n_docs > 0 ? cu[n_docs] : 0, B * T);
  for (int i = 0; i < n_docs; i++)
    if (cu[i + 1] <= cu[i] || cu[i] / T != (cu[i + 1] - 1) / T)
      die("document groups: document %d spans tokens [%d, %d): not a run of 1 to T = %d tokens of one row (cu must "
          "come from doc_mask_build)",
          i, cu[i], cu[i + 1], T);
  int K = 0;  // classes T >> 0 .. T >> K
  while (T % (2 << K) == 0 && (T >> (K + 1)) >= DOC_GROUP_MIN_LEN) K++;
  // Two passes over the documents: a count per class, then each into its class's run (the smallest class,
  // S = T >> K, first; document order within a class); then the groups cut from each class's run.
  int count[32] = {0}, next[32];
  for (int i = 0; i < n_docs; i++) count[group_class(cu[i + 1] - cu[i], T, K)]++;
  for (int k = K, at = 0; k >= 0; k--) next[k] = at, at += count[k];
  for (int i = 0; i < n_docs; i++) order[next[group_class(cu[i + 1] - cu[i], T, K)]++] = i;
  int n_groups = 0, placed = 0;
  for (int k = K; k >= 0; k--) {
    const int S = T >> k, b = B << k;
    for (int j = 0; j < count[k]; j += b)
      groups[n_groups++] = (DocGroup){.S = S, .b = b, .first = placed + j, .n = count[k] - j < b ? count[k] - j : b};
    placed += count[k];
  }
  return n_groups;
}

void doc_mask_group_ragged(const int *cu, int n_docs, const int *order, const DocGroup *g, int64_t q_row,
                           int64_t kv_row, int64_t lse_row, int64_t *off_q, int64_t *off_kv, int64_t *off_lse,
                           int32_t *len) {
  for (int i = 0; i <= g->b; i++) {
    const int d = i >= g->n ? n_docs : order ? order[g->first + i] : g->first + i;  // past its documents: empty
    const int64_t first = cu[d];
    off_q[i] = first * q_row, off_kv[i] = first * kv_row, off_lse[i] = first * lse_row;
    if (i < g->b) len[i] = i < g->n ? cu[d + 1] - cu[d] : 0;
  }
}
