// model/doc_mask.h: the documents of a micro-batch, from its input ids (model.doc_mask and
// model.doc_positions; the rule is docs/data.md's "Document masking"). Plain C on the host:
// model/llama.c calls it once per micro-batch and uploads what the ops read (model/ops.h's DocMask).
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// tokens [B*T] (host). A document starts at every bos_id token and at every row's first token (the
// tokens before a row's first BOS belong to a document that began before the window). Writes, for
// token n = b*T + t:
//   start[n]  the row position t0 <= t where its document starts (DocMask.start),
//   pos[n]    t - t0, its position within the document (model.doc_positions: restart); pos may be NULL,
//   cu[i]     the flat index of document i's first token, i < n_docs, and cu[n_docs] = B*T (DocMask.cu;
//             room for B*T + 1 ints),
// and *pairs = sum over documents of len * (len + 1) / 2. Returns n_docs.
int doc_mask_build(const int *tokens, int B, int T, int bos_id, int *start, int *pos, int *cu, double *pairs);

// The documents as the ragged batch of cuDNN's THD attention (model/cuda/attention_cudnn.h), for a
// graph batch of nb >= n_docs entries: element offsets off_q[i] = cu[i] * q_row, off_kv[i] = cu[i] *
// kv_row, off_lse[i] = cu[i] * lse_row for i <= nb (entries past n_docs: empty, at cu[n_docs]), and
// lengths len[i] = cu[i + 1] - cu[i] for i < nb (0 past n_docs). The C reference of
// attention_docs_ragged_cuda (model/cuda/attention_docs.cu).
void doc_mask_ragged(const int *cu, int n_docs, int nb, int64_t q_row, int64_t kv_row, int64_t lse_row, int64_t *off_q,
                     int64_t *off_kv, int64_t *off_lse, int32_t *len);

// The graph batch a document count runs in: the next power of two, at least 32 (TransformerEngine's
// bucketing), so that a few cuDNN graphs serve every micro-batch.
int doc_mask_bucket(int n_docs);

#ifdef __cplusplus
}
#endif
