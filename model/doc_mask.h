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

// ---- the deterministic backward's groups of documents ----------------------------------------
// cuDNN's deterministic attention backward (Hopper) writes dP to a workspace of graph batch x H x
// ceil64(length)^2 x 2 bytes, so one graph of doc_mask_bucket(n_docs) entries of T tokens needs
// 32 x the plain causal workspace or more (128 GiB at 8B shapes). model/cuda/attention_cudnn.cpp
// instead runs it as one graph call per group below, each within plain causal's workspace.

// The shortest length class: cuDNN's attention tiles hold 64 query rows, a shorter class saves nothing.
enum { DOC_GROUP_MIN_LEN = 64 };

// One graph call: the documents order[first .. first + n) of doc_mask_groups, each at most S tokens
// long, as a graph batch of b >= n entries (entries n..b-1 empty), with b * S = B * T.
typedef struct {
  int S, b, first, n;
} DocGroup;

// Groups the documents cu[0..n_docs] of a [B, T] micro-batch (doc_mask_build's cu, host memory).
// Length classes S = T, T/2, T/4, ..., halving while S stays whole and at least DOC_GROUP_MIN_LEN
// (T itself when T < 2 * DOC_GROUP_MIN_LEN or odd); a document of L tokens belongs to the smallest
// class S >= L (so L > S/2 except in the smallest class), and each class, in document order, is cut
// into groups of at most b = B * T / S documents, smallest class first. Writes order[0..n_docs) (the
// document indices, group after group: each exactly once) and groups[] (room for n_docs), returns
// the number of groups. b * S = B * T makes a group's workspace b x ceil64(S)^2 at most B x
// ceil64(T)^2 (plain causal's), and its rows exactly the micro-batch's. Dies naming the document
// when cu is not doc_mask_build's (not increasing from 0 to B*T, or a document across two rows).
int doc_mask_groups(const int *cu, int n_docs, int B, int T, int *order, DocGroup *groups);

// The ragged description of group g, as doc_mask_ragged's for its documents: for its i-th document
// d = order[g->first + i] (order NULL: d = g->first + i), i < g->n, off_q[i] = cu[d] * q_row, off_kv[i] = cu[d] *
// kv_row, off_lse[i] = cu[d] * lse_row and len[i] = cu[d + 1] - cu[d]; entries g->n..g->b-1 empty (length 0) and every
// offset from g->n to g->b at cu[n_docs]. g->b + 1 offsets and g->b lengths; offsets increase.
void doc_mask_group_ragged(const int *cu, int n_docs, const int *order, const DocGroup *g, int64_t q_row,
                           int64_t kv_row, int64_t lse_row, int64_t *off_q, int64_t *off_kv, int64_t *off_lse,
                           int32_t *len);

#ifdef __cplusplus
}
#endif
