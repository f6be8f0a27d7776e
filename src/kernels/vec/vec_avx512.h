/* vec_avx512.h — the vector vocabulary of the AVX-512F kernels (flash/,
 * decode/): 16 floats a vector. Included by one .c file per kernel set,
 * compiled with -mavx512f. */
#ifndef ATTN_KERNELS_VEC_AVX512_H
#define ATTN_KERNELS_VEC_AVX512_H

#include <immintrin.h>

#define VW 16

typedef __m512 vec;

static inline vec v_zero(void) { return _mm512_setzero_ps(); }
static inline vec v_set1(float x) { return _mm512_set1_ps(x); }
static inline vec v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_store(float *p, vec v) { _mm512_storeu_ps(p, v); }
static inline vec v_fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec v_mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
static inline vec v_sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
static inline vec v_add(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline vec v_abs(vec a) { return _mm512_abs_ps(a); }
static inline vec v_max(vec a, vec b) { return _mm512_max_ps(a, b); }
static inline vec v_div(vec a, vec b) { return _mm512_div_ps(a, b); }
static inline float v_hmax(vec v) { return _mm512_reduce_max_ps(v); }
/* whether some lane of a exceeds b's */
static inline int v_any_greater(vec a, vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) != 0; }
static inline float v_hsum(vec v) { return _mm512_reduce_add_ps(v); }

/* 2^x = 2^n * 2^f, n = round(x), |f| <= 1/2, 2^f by a degree-6 polynomial
 * fitted at Chebyshev nodes (relative error 2.6e-9, a 23rd of float's
 * epsilon, one fma a vector fewer than a degree-7 Taylor series); -inf (and
 * anything below -125, NaN too) gives exactly 0 by a mask, never by
 * underflow: a scalef into the subnormals takes a microcode assist, which
 * the masked keys of every edge tile of a sliding window would take. The
 * masked lanes need no clamp: their NaN (-inf - -inf) or subnormal never
 * reaches the register, and takes no assist. */
static inline vec v_exp2(vec x) {
    __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_GE_OQ);
    vec n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vec f = _mm512_sub_ps(x, n);
    vec p = _mm512_set1_ps(1.5469732016e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3400432166e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6180256029e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503272142e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651214e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314720671e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(live, p, n);
}

#endif /* ATTN_KERNELS_VEC_AVX512_H */
