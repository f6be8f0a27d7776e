/*
 * philox.h — Philox4x32-10 (Salmon, Moraes, Dror & Shaw, "Parallel random
 * numbers: as easy as 1, 2, 3", SC 2011): a counter-based generator, the
 * one PyTorch uses on CUDA. Any element's draw is a pure function of
 * (key, counter), so a kernel can draw the dropout mask of any tile in any
 * order, on any thread, and its backward can draw it again.
 *
 * attn's dropout counter: the flat index e of the element in the (B, H, T,
 * S) weights of one dropout call; block e / 4 gives four words, lane e % 4
 * is the element's. Counter words: (e/4 low, e/4 high, offset low, offset
 * high); key: the rng's seed (low, high). An element is kept when its
 * word < keep_threshold = floor((1 - p) * 2^32).
 */
#ifndef ATTN_PHILOX_H
#define ATTN_PHILOX_H

#include <stdint.h>

#define ATTN_PHILOX_M0 0xD2511F53u
#define ATTN_PHILOX_M1 0xCD9E8D57u
#define ATTN_PHILOX_W0 0x9E3779B9u
#define ATTN_PHILOX_W1 0xBB67AE85u

/* out = Philox4x32-10(counter, key). */
static inline void attn_philox4x32_10(const uint32_t counter[4], const uint32_t key[2],
                                      uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += ATTN_PHILOX_W0;
            k1 += ATTN_PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)ATTN_PHILOX_M0 * c0, p1 = (uint64_t)ATTN_PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The four draws of dropout block `block` (elements 4*block .. 4*block+3). */
static inline void attn_philox_dropout_block(uint64_t seed, uint64_t offset, uint64_t block,
                                             uint32_t out[4]) {
    uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)offset,
                           (uint32_t)(offset >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    attn_philox4x32_10(counter, key, out);
}

/* floor((1 - p) * 2^32), for 0 < p < 1: keep when draw < threshold. */
static inline uint64_t attn_philox_keep_threshold(double p) {
    double t = (1.0 - p) * 4294967296.0;
    return t >= 4294967296.0 ? 4294967296ull : (uint64_t)t;
}

#endif /* ATTN_PHILOX_H */
