/*
 * fingerprint.h — a fingerprint of a float array's bits, by which the
 * modules and the model tell that a parameter changed between a forward
 * and its backward.
 */
#ifndef ATTN_FINGERPRINT_H
#define ATTN_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* A 64-bit fingerprint of n floats' bits: FNV-1a over 32-bit words in four
 * interleaved lanes, then the lanes folded. Within a lane each step is a
 * bijection of the state for a given word, so two arrays that differ in
 * one element always differ here; -0 and 0, and NaN payloads, count as
 * different. */
static inline uint64_t attn_fingerprint_floats(const float *x, size_t n) {
    const uint64_t prime = 0x100000001b3ULL;
    uint64_t lane[4] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL, 0x9e3779b97f4a7c15ULL,
                        0xc2b2ae3d27d4eb4fULL};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (size_t l = 0; l < 4; l++) {
            uint32_t bits;
            memcpy(&bits, x + i + l, sizeof bits);
            lane[l] = (lane[l] ^ bits) * prime;
        }
    for (; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, x + i, sizeof bits);
        lane[0] = (lane[0] ^ bits) * prime;
    }
    uint64_t h = (uint64_t)n * prime;
    for (size_t l = 0; l < 4; l++) h = (h ^ lane[l]) * prime;
    return h;
}

#endif /* ATTN_FINGERPRINT_H */
