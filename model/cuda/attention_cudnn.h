// model/cuda/attention_cudnn.h: causal grouped-query flash attention on the GPU, through cuDNN's graph API
// (model/cuda/attention_cudnn.cpp). The CUDA backend's attention_fwd / attention_bwd entries call these;
// the semantics are exactly those of the CPU reference in model/cpu/attention.c.
//
// Layouts (all device pointers, row-major, token n = b*T + t):
//   q, out, dq, dout  [B*T, H*hd]   BF16, i.e. [B, T, H, hd] ("BSHD")
//   k, v, dk, dv      [B*T, KV*hd]  BF16
//   lse               [B, H, T]     fp32: natural-log log-sum-exp of each query row's SCALED scores,
//                                   lse = log sum_j exp(q.k_j / sqrt(hd)), j <= t.
// Causal (query t sees keys 0..t), softmax scale 1/sqrt(hd). GQA: query head h reads kv head
// h / (H/KV). Requirements (checked, with a message naming the argument): H % KV == 0, hd a
// multiple of 8 and at most 256, BF16 pointers 16-byte aligned.
//
// Documents (docs not NULL: model/ops.h's DocMask, block-causal attention): the micro-batch runs as
// a ragged batch of its documents, cuDNN's THD layout: every tensor keeps its [B*T, heads*hd] rows,
// a ragged offset per document points at its first row, a padding mask with each document's length
// bounds it, and the causal mask applies within it. The graph's batch is the document count rounded
// up to a power of two (at least 32; the extra entries have length 0) and its sequence length T, so
// one graph per (shape, direction, bucket) serves every micro-batch whose count falls in the bucket.
// lse is then cuDNN's ragged layout, [B*T, H] (token-major), not [B, H, T]. The offsets and lengths
// come from DocMask.cu, on the device, by a small kernel per call (attention_docs.cu) into scratch
// the instance keeps. Needs cuDNN 9.6 or newer (ragged lse), checked at the first masked call.
// The deterministic backward is the exception: its workspace grows with graph batch x length^2, so
// it runs one graph call per group of documents (model/doc_mask.h's doc_mask_groups: documents of
// similar length, graph batch b and length S with b * S = B*T, each group within plain causal's
// workspace), the groups found on the host from DocMask.cu_h (downloaded from DocMask.cu, a sync,
// when NULL) and their offsets uploaded by a stream-ordered copy into the same scratch.
//
// Everything is queued on cuda_stream() (common/cuda_common.h); no call synchronizes the host, except
// the first call for a new shape, which builds and caches the cuDNN graph (tens to hundreds of ms)
// and may grow the shared workspace (cudaMalloc). An AttnCudnn instance holds the cuDNN handle
// (created lazily on the device current at its first call), the cached graphs and the workspace;
// the CUDA backend keeps one in its context. An instance is not thread-safe. For the frontend's own
// diagnostics run with CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=stderr.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "model/ops.h"  // DocMask

#ifdef __cplusplus
extern "C" {
#endif

typedef struct AttnCudnn AttnCudnn;
AttnCudnn *attention_cudnn_create(void);
// Frees the cached graphs, the workspace and the cuDNN handle (after a sync), then the instance.
void attention_cudnn_destroy(AttnCudnn *a);

// out and lse are overwritten. docs: NULL for plain causal attention.
void attention_cudnn_fwd(AttnCudnn *a, void *out, float *lse, const void *q, const void *k, const void *v,
                         const DocMask *docs, int B, int T, int H, int KV, int hd);

// dq, dk, dv are overwritten (not accumulated). out and lse are the forward's outputs, docs the
// forward's documents.
void attention_cudnn_bwd(AttnCudnn *a, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                         const void *v, const void *out, const float *lse, const DocMask *docs, int B, int T, int H,
                         int KV, int hd);

// model/cuda/attention_docs.cu: the ragged description of the documents cu[0..n_docs] (device) for a
// graph batch of nb >= n_docs entries: off_q[i] = cu[i] * q_row, off_kv[i] = cu[i] * kv_row and
// off_lse[i] = cu[i] * lse_row element offsets (i <= nb; entries past n_docs point at the end,
// cu[n_docs]) and len[i] = cu[i + 1] - cu[i] (i < nb; 0 past n_docs). Queued on cuda_stream().
void attention_docs_ragged_cuda(const int *cu, int n_docs, int nb, int64_t q_row, int64_t kv_row, int64_t lse_row,
                                int64_t *off_q, int64_t *off_kv, int64_t *off_lse, int32_t *len);

// Deterministic backward (bit-identical dq/dk/dv from run to run). Off by default: the fast
// backward sums dq partials with atomics in an unspecified order. On Hopper, cuDNN's deterministic
// kernel instead materializes dP in a workspace of about B*H*ceil64(T)^2*2 bytes (4 GiB for one
// Llama-3 8B layer at T=8192) and is slower; with documents each group's (b*H*ceil64(S)^2*2) is at
// most that. Takes effect at the next attention_cudnn_bwd call (each setting has its own cached
// graphs). The forward is always deterministic.
void attention_cudnn_set_deterministic(AttnCudnn *a, int on);

// The cuDNN library loaded at run time (e.g. 91400 for 9.14), for benchmark reports.
size_t attention_cudnn_version(void);

// Bytes of the shared device workspace currently held (the largest any cached graph needed so far).
size_t attention_cudnn_workspace_bytes(const AttnCudnn *a);

#ifdef __cplusplus
}
#endif
