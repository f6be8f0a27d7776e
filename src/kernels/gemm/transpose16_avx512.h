/*
 * transpose16_avx512.h — the 16 x 16 transpose of 32-bit elements in 16
 * zmm registers, for the SGEMM's and the 16-bit GEMM's packing, in the
 * files compiled for AVX-512 that include it.
 */
#ifndef ATTN_TRANSPOSE16_AVX512_H
#define ATTN_TRANSPOSE16_AVX512_H

#include <immintrin.h>

/* r[0..15] = the transpose of r[0..15]: four rounds of shuffles, leaving
 * row p of the transpose in r[attn_transpose16_order[p]]. */
static inline void attn_transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 2; j++) {
            __m512 lo = t[4 * i + j], hi = t[4 * i + j + 2];
            r[4 * i + j] = _mm512_shuffle_ps(lo, hi, 0x44);
            r[4 * i + j + 2] = _mm512_shuffle_ps(lo, hi, 0xEE);
        }
    }
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 4; j++) {
            __m512 lo = r[8 * i + j], hi = r[8 * i + j + 4];
            t[8 * i + j] = _mm512_shuffle_f32x4(lo, hi, 0x88);
            t[8 * i + j + 4] = _mm512_shuffle_f32x4(lo, hi, 0xDD);
        }
    }
    for (int j = 0; j < 8; j++) {
        __m512 lo = t[j], hi = t[j + 8];
        r[j] = _mm512_shuffle_f32x4(lo, hi, 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(lo, hi, 0xDD);
    }
}

static const int attn_transpose16_order[16] = {0, 2, 1, 3, 4, 6, 5, 7,
                                               8, 10, 9, 11, 12, 14, 13, 15};

#endif /* ATTN_TRANSPOSE16_AVX512_H */
