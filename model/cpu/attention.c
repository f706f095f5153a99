// model/cpu/attention.c: causal grouped-query attention, softmax(q k^T / sqrt(hd)) v (CPU reference).
// See ops.h. Like flash attention, only the per-row log-sum-exp is saved; the backward rebuilds
// the probabilities from it, so no [T, T] matrix is ever stored. With documents (doc_start, the
// block-causal mask of ops.h's DocMask) query t's keys are j0..t, j0 = doc_start[b*T + t], instead
// of 0..t: the loops start at j0, so the masked keys cost nothing and the sums over the others run
// in the same order as without a mask (a document that starts a row gives the same bits either way).
#include "common/common.h"
#include "model/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float dot(const float *a, const float *b, int n) {
  float s = 0;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, const int *doc_start,
                       int B, int T, int H, int KV, int hd) {
  const int group = H / KV, qs = H * hd, kvs = KV * hd;  // query head h reads kv head h / group
  const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
  {
    float *p = xmalloc((size_t)T * sizeof(float));
#pragma omp for schedule(static)
    for (int row = 0; row < B * H * T; row++) {  // row = (b, h, t); rows are independent
      int t = row % T, h = (row / T) % H, b = row / (T * H), g = h / group;
      const float *qr = q + ((size_t)b * T + t) * qs + h * hd;
      const float *kb = k + (size_t)b * T * kvs + g * hd, *vb = v + (size_t)b * T * kvs + g * hd;
      const int j0 = doc_start ? doc_start[(size_t)b * T + t] : 0;
      float mx = -INFINITY;
      for (int j = j0; j <= t; j++) {  // causal: keys j0..t of the query's document only
        p[j] = dot(qr, kb + (size_t)j * kvs, hd) * scale;
        if (p[j] > mx) mx = p[j];
      }
      double sum = 0;
      for (int j = j0; j <= t; j++) {
        p[j] = expf(p[j] - mx);
        sum += p[j];
      }
      float inv = (float)(1.0 / sum);
      float *o = out + ((size_t)b * T + t) * qs + h * hd;
      memset(o, 0, (size_t)hd * sizeof(float));
      for (int j = j0; j <= t; j++) {
        float pj = p[j] * inv;  // HF normalizes the probabilities, then multiplies by v
        const float *vr = vb + (size_t)j * kvs;
        for (int i = 0; i < hd; i++) o[i] += pj * vr[i];
      }
      lse[((size_t)b * H + h) * T + t] = mx + (float)log(sum);
    }
    free(p);
  }
}

// With P = softmax(S), dP = dout v^T, dS = P (dP - rowsum(dout * out)), S = scale q k^T.
void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                        const float *v, const float *out, const float *lse, const int *doc_start, int B, int T, int H,
                        int KV, int hd) {
  const int group = H / KV, qs = H * hd, kvs = KV * hd;
  const float scale = 1.0f / sqrtf((float)hd);
  // One task per (sequence, kv head): it owns dk/dv of that head and dq of the query heads that
  // share it, so no two threads add into the same element and the order is fixed.
#pragma omp parallel for schedule(static)
  for (int task = 0; task < B * KV; task++) {
    int b = task / KV, g = task % KV;
    const float *kb = k + (size_t)b * T * kvs + g * hd, *vb = v + (size_t)b * T * kvs + g * hd;
    float *dkb = dk + (size_t)b * T * kvs + g * hd, *dvb = dv + (size_t)b * T * kvs + g * hd;
    for (int j = 0; j < T; j++) {
      memset(dkb + (size_t)j * kvs, 0, (size_t)hd * sizeof(float));
      memset(dvb + (size_t)j * kvs, 0, (size_t)hd * sizeof(float));
    }
    for (int h = g * group; h < (g + 1) * group; h++)
      for (int t = 0; t < T; t++) {
        size_t r = ((size_t)b * T + t) * qs + h * hd;
        const float *qr = q + r, *dor = dout + r, *orow = out + r;
        float *dqr = dq + r;
        float l = lse[((size_t)b * H + h) * T + t];
        float delta = dot(dor, orow, hd);  // rowsum(dout * out) = sum_j P_j dP_j
        memset(dqr, 0, (size_t)hd * sizeof(float));
        const int j0 = doc_start ? doc_start[(size_t)b * T + t] : 0;
        for (int j = j0; j <= t; j++) {
          const float *kr = kb + (size_t)j * kvs, *vr = vb + (size_t)j * kvs;
          float pj = expf(dot(qr, kr, hd) * scale - l);
          float ds = pj * (dot(dor, vr, hd) - delta) * scale;
          float *dkr = dkb + (size_t)j * kvs, *dvr = dvb + (size_t)j * kvs;
          for (int i = 0; i < hd; i++) {
            dvr[i] += pj * dor[i];
            dqr[i] += ds * kr[i];
            dkr[i] += ds * qr[i];
          }
        }
      }
  }
}
