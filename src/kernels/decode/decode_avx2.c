/* decode_avx2.c — the decode kernel on AVX2 + FMA (+ F16C for binary16 and
 * fp8 codes): 8 floats a vector. */
#include "kernels/vec/vec_avx2.h"

#include <stdint.h>

#define DECODE_KERNELS attn_decode_avx2
#define DECODE_ISA_NAME "avx2"

/* out[j] = the sum (max: the largest) of part[j]'s 8 lanes, j < 16: two
 * groups of 8 vectors, each folded within 128-bit lanes (unpack, shuffle),
 * then the halves. */
static inline __m256 v_fold(__m256 a, __m256 b, int max) {
    return max ? _mm256_max_ps(a, b) : _mm256_add_ps(a, b);
}

static inline void v_reduce_block(const vec *part, float *out, int max) {
    for (int h = 0; h < 2; h++) {
        const vec *x = part + 8 * h;
        __m256 a[4], b[2];
        for (int i = 0; i < 4; i++)
            a[i] = v_fold(_mm256_unpacklo_ps(x[2 * i], x[2 * i + 1]),
                          _mm256_unpackhi_ps(x[2 * i], x[2 * i + 1]), max);
        for (int i = 0; i < 2; i++)
            b[i] = v_fold(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                          _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE), max);
        _mm256_storeu_ps(out + 8 * h, v_fold(_mm256_permute2f128_ps(b[0], b[1], 0x20),
                                             _mm256_permute2f128_ps(b[0], b[1], 0x31), max));
    }
}

static inline __m128i load8(const void *p) { return _mm_loadl_epi64((const __m128i *)p); }

static inline vec v_from_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* 16 bf16 elements as two vectors: the even elements (0, 2, .., 14) and
 * the odd ones. A bf16 is the top half of a float: a shift turns the low
 * half of each 32-bit lane into a float and a mask the high half, one
 * instruction a vector where v_from_bf16 takes a widening and a shift. */
#define DECODE_BF16_PAIRS 1
static inline void v_from_bf16_pair(const uint16_t *p, vec *even, vec *odd) {
    __m256i w = _mm256_loadu_si256((const __m256i *)p);
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xFFFF0000u)));
}

static inline vec v_from_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* e4m3 S.EEEE.MMM as binary16 S.0EEEE.MMM0000000: the same value / 2^8,
 * subnormals included (vcvtph2ps widens those exactly). The byte goes to
 * the top of its 16-bit lane, an arithmetic shift right by one copies S
 * into bit 14, and the mask (every bit but 14) clears it. */
static inline vec v_from_e4m3(const uint8_t *p) {
    __m128i top = _mm_unpacklo_epi8(_mm_setzero_si128(), load8(p));
    return _mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16(top, 1), _mm_set1_epi16((short)0xBFFF)));
}

static inline vec v_from_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(p)));
}

static inline vec v_from_i4(const uint8_t *p, int high) {
    __m256i b = _mm256_cvtepu8_epi32(load8(p));
    __m256i n = high ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(15));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(n, _mm256_set1_epi32(8)));
}

#include "kernels/decode/decode_kernel.h"
