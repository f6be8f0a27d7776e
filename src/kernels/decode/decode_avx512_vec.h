/*
 * decode_avx512_vec.h — the decode kernel's vocabulary on AVX-512F (decode_kernel.h
 * lists it): 16 floats a vector, a key block's scores of one query head in
 * one register. For the kernel sets that include it (decode_avx512.c,
 * decode_amx.c), compiled with -mavx512f.
 */
#ifndef ATTN_DECODE_AVX512_VEC_H
#define ATTN_DECODE_AVX512_VEC_H

#include "kernels/vec/vec_avx512.h"

#include <stdint.h>

/* out[j] = the sum (max: the largest) of part[j]'s 16 lanes, j < 16, in
 * one register: pairs of vectors folded within 128-bit lanes (unpack, then
 * shuffle), then the four 128-bit lanes across vectors: 30 shuffles and 15
 * adds (or maxes) for 16 results. */
static inline __m512 v_fold(__m512 a, __m512 b, int max) {
    return max ? _mm512_max_ps(a, b) : _mm512_add_ps(a, b);
}

static inline void v_reduce_block(const vec *part, float *out, int max) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = v_fold(_mm512_unpacklo_ps(part[2 * i], part[2 * i + 1]),
                      _mm512_unpackhi_ps(part[2 * i], part[2 * i + 1]), max);
    for (int i = 0; i < 4; i++)
        b[i] = v_fold(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                      _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE), max);
    /* b[i], 128-bit lane k: the lane-k results of vectors 4i .. 4i + 3 */
    for (int i = 0; i < 2; i++)
        c[i] = v_fold(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                      _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD), max);
    _mm512_storeu_ps(out, v_fold(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                                 _mm512_shuffle_f32x4(c[0], c[1], 0xDD), max));
}

static inline vec v_from_bf16(const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* 32 bf16 elements in one load: the even ones shifted into the top half of
 * their 32-bit lane, the odd ones already there, their neighbour masked
 * off (one instruction a vector, where widening in order takes two). */
#define DECODE_BF16_PAIRS 1
static inline void v_from_bf16_pair(const uint16_t *p, vec *even, vec *odd) {
    __m512i w = _mm512_loadu_si512(p);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u)));
}

static inline vec v_from_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* e4m3 S.EEEE.MMM as binary16 S.0EEEE.MMM0000000: the same value / 2^8,
 * subnormals included (vcvtph2ps widens those exactly). The byte goes to
 * the top of its 16-bit lane, an arithmetic shift right by one copies S
 * into bit 14, and the mask (every bit but 14) clears it. */
static inline vec v_from_e4m3(const uint8_t *p) {
    __m256i top = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
    return _mm512_cvtph_ps(
        _mm256_and_si256(_mm256_srai_epi16(top, 1), _mm256_set1_epi16((short)0xBFFF)));
}

static inline vec v_from_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

static inline vec v_from_i4(const uint8_t *p, int high) {
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    __m512i n = high ? _mm512_srli_epi32(b, 4) : _mm512_and_si512(b, _mm512_set1_epi32(15));
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(n, _mm512_set1_epi32(8)));
}

#endif /* ATTN_DECODE_AVX512_VEC_H */
