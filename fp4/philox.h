// fp4/philox.h: Philox4x32-10 counter-based random bits (Salmon et al., SC'11), FP4_HD, and the
// counter layout that makes stochastic rounding deterministic and never reused.
//
// API:
//   void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
//   PhiloxStream philox_stream(uint64_t seed, uint32_t step, uint32_t micro, uint32_t layer, uint32_t tensor)
//   void philox_group16(PhiloxStream s, uint64_t group, uint32_t out[4])   128 bits for 16 elements
//   uint32_t philox_byte(const uint32_t w[4], uint32_t j)                  byte j (0..15) of those
//
// Layout: one Philox call yields 128 bits = 8 random bits for each of 16 consecutive elements of a
// tensor (SR uses 8 bits per element; see e2m1.h for what that resolution means).
//   key     = (lo32(seed), hi32(seed))
//   counter = (element_index / 16, micro, step, (layer << 16) | tensor)
//   element i uses byte i % 16 of the output: word (i % 16) / 4, bits 8*(i % 4) .. +7.
// element_index is the element's row-major index in the tensor being rounded ([rows, K] for the row
// copy), so the bits do not depend on how a kernel tiles the work. (seed, step, micro-batch, layer,
// tensor id) name a disjoint counter range, so no two roundings in a run share bits, and a resumed
// run (same seed and step) draws the same bits as the original. Limits: layer and tensor < 65536,
// element_index < 2^36 (philox_group16 takes the group index, element_index / 16, as 32 bits).
#pragma once
#include "common/common.h"
#include "fp4/fp4_common.h"

typedef struct {
  uint32_t key[2];
  uint32_t micro, step, tag;  // counter words 1..3
} PhiloxStream;

// Host side: dies unless the n elements of one rounding fit element_index < 2^36 (above).
static inline void philox_check_range(const char *who, uint64_t n) {
  if (n >= (1ull << 36))
    die("%s: %llu elements exceed the 2^36 stochastic-rounding counter range (fp4/philox.h)", who,
        (unsigned long long)n);
}

static inline FP4_HD void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
  FP4_UNROLL
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;  // Weyl key schedule (the last bump is unused)
    k1 += 0xBB67AE85u;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

static inline FP4_HD PhiloxStream philox_stream(uint64_t seed, uint32_t step, uint32_t micro, uint32_t layer,
                                                uint32_t tensor) {
  PhiloxStream s;
  s.key[0] = (uint32_t)seed;
  s.key[1] = (uint32_t)(seed >> 32);
  s.micro = micro;
  s.step = step;
  s.tag = (layer << 16) | (tensor & 0xffffu);
  return s;
}

static inline FP4_HD void philox_group16(PhiloxStream s, uint64_t group, uint32_t out[4]) {
  uint32_t ctr[4] = {(uint32_t)group, s.micro, s.step, s.tag};
  philox4x32_10(ctr, s.key, out);
}

static inline FP4_HD uint32_t philox_byte(const uint32_t w[4], uint32_t j) {
  return (w[j >> 2] >> (8 * (j & 3))) & 0xffu;
}
