// model/doc_mask.c: see doc_mask.h.
#include "model/doc_mask.h"

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
  for (int i = 0; i <= nb; i++) {
    const int64_t first = cu[i < n_docs ? i : n_docs];
    off_q[i] = first * q_row, off_kv[i] = first * kv_row, off_lse[i] = first * lse_row;
    if (i < nb) len[i] = i < n_docs ? cu[i + 1] - cu[i] : 0;
  }
}

int doc_mask_bucket(int n_docs) {
  int nb = 32;
  while (nb < n_docs && nb < (1 << 30)) nb *= 2;
  return nb;
}
