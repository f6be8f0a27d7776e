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
/* Keeps *x in a register: the compiler may otherwise fold its load into
 * every instruction that uses it, a load per use where one would do. */
static inline void v_in_register(vec *x) { __asm__("" : "+v"(*x)); }
static inline void v_store(float *p, vec v) { _mm512_storeu_ps(p, v); }
static inline vec v_fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
/* c - a b, rounded once */
static inline vec v_nfma(vec a, vec b, vec c) { return _mm512_fnmadd_ps(a, b, c); }
static inline vec v_mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
static inline vec v_sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
static inline vec v_add(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline vec v_abs(vec a) { return _mm512_abs_ps(a); }
static inline vec v_max(vec a, vec b) { return _mm512_max_ps(a, b); }
static inline vec v_div(vec a, vec b) { return _mm512_div_ps(a, b); }
static inline float v_hmax(vec v) { return _mm512_reduce_max_ps(v); }
/* whether some lane of a exceeds b's */
static inline int v_any_greater(vec a, vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) != 0; }
/* whether some lane of a is NaN */
static inline int v_any_nan(vec a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) != 0; }
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

/* tanh(x), as Cephes' tanhf: x + x^3 P(x^2) below |x| = 0.625, else
 * 1 - 2 e r with e = 2^(-2 |x| log2 e) and r = 1 / (1 + e), its sign put
 * back (within 1.7 ulp: softcap's gradient 1 - t^2 magnifies t's error
 * where the cap saturates). r is rcp14 and a Newton step in the fma form
 * r + r (1 - (1 + e) r), and 1 - 2 e r rounds once: (1 - e) r with r
 * rounded above 1, or (1 - e) / (1 + e) rounded thrice, is off by up to 3
 * ulp. +-inf gives +-1, and NaN +-1 too: v_exp2 gives 0 for it, so a
 * caller that must keep NaN puts it back. A vdivps costs as much as the
 * rest. */
static inline vec v_tanh(vec x) {
    vec a = _mm512_abs_ps(x), z = _mm512_mul_ps(a, a);
    vec p = _mm512_set1_ps(-5.70498872745e-3f);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
    vec small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), a, a);
    __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u));
    __mmask16 near0 = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
    /* every lane small (softcap's scores mostly are, well inside the cap):
     * the exp2 and the reciprocal would be blended away */
    if (near0 == 0xFFFF) return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(small), sign));
    vec e = v_exp2(_mm512_mul_ps(a, _mm512_set1_ps(-2.8853900817779268f)));
    vec one = _mm512_set1_ps(1.0f), den = _mm512_add_ps(one, e), r = _mm512_rcp14_ps(den);
    r = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(den, r, one), r);
    vec large = _mm512_fnmadd_ps(_mm512_add_ps(e, e), r, one);
    vec t = _mm512_mask_blend_ps(near0, large, small);
    /* |t| with x's sign bit */
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));
}

#endif /* ATTN_KERNELS_VEC_AVX512_H */
