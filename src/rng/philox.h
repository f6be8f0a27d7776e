/*
 * philox.h — Philox4x32-10 (Salmon, Moraes, Dror & Shaw, "Parallel random
 * numbers: as easy as 1, 2, 3", SC 2011): a counter-based generator, the
 * one PyTorch uses on CUDA. Any element's draw is a pure function of
 * (key, counter), so a kernel can draw the dropout mask of any tile in any
 * order, on any thread, and its backward can draw it again.
 *
 * attn's dropout counter: e is the flat index of the element in the (B, H,
 * T, S) weights of one dropout call. Elements go by groups of 64: group
 * g = e / 64 draws the 16 blocks 16 g .. 16 g + 15, and element e takes word
 * (e / 16) % 4 of block 16 g + e % 16 — so 16 consecutive elements take the
 * same word of 16 consecutive blocks, one vector lane each. Counter words:
 * (block low, block high, offset low, offset high); key: the rng's seed
 * (low, high). An element is kept when its word < keep_threshold =
 * floor((1 - p) * 2^32).
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

/* The four words of dropout block `block`. */
static inline void attn_philox_dropout_block(uint64_t seed, uint64_t offset, uint64_t block,
                                             uint32_t out[4]) {
    uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)offset,
                           (uint32_t)(offset >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    attn_philox4x32_10(counter, key, out);
}

/* The 64 draws of group g, element by element: words[e % 64] for e in the
 * group. */
static inline void attn_philox_dropout_group(uint64_t seed, uint64_t offset, uint64_t group,
                                             uint32_t words[64]) {
    for (uint32_t lane = 0; lane < 16; lane++) {
        uint32_t w[4];
        attn_philox_dropout_block(seed, offset, group * 16 + lane, w);
        for (int k = 0; k < 4; k++) words[16 * k + lane] = w[k];
    }
}

/* The draw of element e alone. */
static inline uint32_t attn_philox_dropout_word(uint64_t seed, uint64_t offset, uint64_t e) {
    uint32_t w[4];
    attn_philox_dropout_block(seed, offset, (e >> 6) * 16 + (e & 15), w);
    return w[(e >> 4) & 3];
}

/* floor((1 - p) * 2^32), for 0 < p < 1: keep when draw < threshold. */
static inline uint64_t attn_philox_keep_threshold(double p) {
    double t = (1.0 - p) * 4294967296.0;
    return t >= 4294967296.0 ? 4294967296ull : (uint64_t)t;
}

#endif /* ATTN_PHILOX_H */
