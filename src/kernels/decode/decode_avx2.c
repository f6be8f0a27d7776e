/* decode_avx2.c — the decode kernel on AVX2 + FMA: 8 floats a vector. */
#include <immintrin.h>

#define VW 8
#define DECODE_KERNELS attn_decode_avx2
#define DECODE_ISA_NAME "avx2"

typedef __m256 vec;

static inline vec v_zero(void) { return _mm256_setzero_ps(); }
static inline vec v_set1(float x) { return _mm256_set1_ps(x); }
static inline vec v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void v_store(float *p, vec v) { _mm256_storeu_ps(p, v); }
static inline vec v_fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec v_mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
static inline vec v_sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
static inline vec v_add(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline vec v_max(vec a, vec b) { return _mm256_max_ps(a, b); }

static inline float v_hmax(vec v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static inline float v_hsum(vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* out[j] = the sum of part[j]'s 8 lanes, j < 16: two groups of 8 vectors,
 * each folded within 128-bit lanes (unpack, shuffle), then the halves. */
static inline void v_hsum_block(const vec *part, float *out) {
    for (int h = 0; h < 2; h++) {
        const vec *x = part + 8 * h;
        __m256 a[4], b[2];
        for (int i = 0; i < 4; i++)
            a[i] = _mm256_add_ps(_mm256_unpacklo_ps(x[2 * i], x[2 * i + 1]),
                                 _mm256_unpackhi_ps(x[2 * i], x[2 * i + 1]));
        for (int i = 0; i < 2; i++)
            b[i] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                                 _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
        _mm256_storeu_ps(out + 8 * h, _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20),
                                                    _mm256_permute2f128_ps(b[0], b[1], 0x31)));
    }
}

/* 2^x as in decode_avx512.c, 2^n built in the exponent bits; x below -125
 * (-inf included) gives exactly 0. */
static inline vec v_exp2(vec x) {
    vec live = _mm256_cmp_ps(x, _mm256_set1_ps(-125.0f), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-125.0f));
    vec n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vec f = _mm256_sub_ps(x, n);
    vec p = _mm256_set1_ps(1.5252733804e-5f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393e-4f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108665e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650696e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718056e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), live);
}

#include "kernels/decode/decode_kernel.h"
