/* vec_avx2.h — the vector vocabulary of the AVX2 + FMA kernels (flash/,
 * decode/): 8 floats a vector. Included by one .c file per kernel set,
 * compiled with -mavx2 -mfma. */
#ifndef ATTN_KERNELS_VEC_AVX2_H
#define ATTN_KERNELS_VEC_AVX2_H

#include <immintrin.h>

#define VW 8

typedef __m256 vec;

static inline vec v_zero(void) { return _mm256_setzero_ps(); }
static inline vec v_set1(float x) { return _mm256_set1_ps(x); }
static inline vec v_load(const float *p) { return _mm256_loadu_ps(p); }
/* Keeps *x in a register: the compiler may otherwise fold its load into
 * every instruction that uses it, a load per use where one would do. */
static inline void v_in_register(vec *x) { __asm__("" : "+x"(*x)); }
static inline void v_store(float *p, vec v) { _mm256_storeu_ps(p, v); }
static inline vec v_fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
/* c - a b, rounded once */
static inline vec v_nfma(vec a, vec b, vec c) { return _mm256_fnmadd_ps(a, b, c); }
static inline vec v_mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
static inline vec v_sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
static inline vec v_add(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline vec v_abs(vec a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
static inline vec v_max(vec a, vec b) { return _mm256_max_ps(a, b); }
static inline vec v_div(vec a, vec b) { return _mm256_div_ps(a, b); }

/* whether some lane of a exceeds b's */
static inline int v_any_greater(vec a, vec b) {
    return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)) != 0;
}
/* whether some lane of a is NaN */
static inline int v_any_nan(vec a) {
    return _mm256_movemask_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)) != 0;
}
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

/* 2^x as in vec_avx512.h; 2^n built in the exponent bits, and inputs
 * below -125 (-inf included) give exactly 0, never a subnormal (whose
 * arithmetic takes microcode assists). */
static inline vec v_exp2(vec x) {
    vec live = _mm256_cmp_ps(x, _mm256_set1_ps(-125.0f), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-125.0f));
    vec n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vec f = _mm256_sub_ps(x, n);
    vec p = _mm256_set1_ps(1.5469732016e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3400432166e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6180256029e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5503272142e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022651214e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314720671e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), live);
}

/* tanh(x) as in vec_avx512.h, with a true division: 1 - e (2 / (1 + e)). */
static inline vec v_tanh(vec x) {
    vec a = v_abs(x), z = _mm256_mul_ps(a, a);
    vec p = _mm256_set1_ps(-5.70498872745e-3f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
    vec small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), a, a);
    vec sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
    vec near0 = _mm256_cmp_ps(a, _mm256_set1_ps(0.625f), _CMP_LT_OQ);
    /* every lane small: the exp2 and the division would be blended away */
    if (_mm256_movemask_ps(near0) == 0xFF) return _mm256_or_ps(small, sign);
    vec e = v_exp2(_mm256_mul_ps(a, _mm256_set1_ps(-2.8853900817779268f)));
    vec one = _mm256_set1_ps(1.0f);
    vec r = _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(one, e));
    vec large = _mm256_fnmadd_ps(e, r, one);
    vec t = _mm256_blendv_ps(large, small, near0);
    return _mm256_or_ps(t, sign);
}

#endif /* ATTN_KERNELS_VEC_AVX2_H */
