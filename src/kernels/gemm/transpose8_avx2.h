/*
 * transpose8_avx2.h — the 8 x 8 transpose of 32-bit elements in 8 ymm
 * registers, for the SGEMM's and the 16-bit GEMM's packing, in the files
 * compiled for AVX2 that include it.
 */
#ifndef ATTN_TRANSPOSE8_AVX2_H
#define ATTN_TRANSPOSE8_AVX2_H

#include <immintrin.h>

/* r[0..7] = the transpose of r[0..7]. */
static inline void attn_transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* t[0] = r0,r1 columns 0,1 (and 4,5); t[1] columns 2,3 (6,7); likewise
     * t[2], t[3] for rows 2,3. */
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    /* u[j] (j < 4) holds column j of rows 0-3 (low lane) and column j + 4
     * (high lane); u[4 + j] the same for rows 4-7. */
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
        r[j + 4] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
}

#endif /* ATTN_TRANSPOSE8_AVX2_H */
