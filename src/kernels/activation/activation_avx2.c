/*
 * activation_avx2.c — activation.h's kernels with AVX2 + FMA: four doubles
 * a vector. GELU needs 1 + tanh(u) and 1 - tanh(u)^2, which lose every bit
 * to cancellation where tanh nears -1 or 1; both are written in e =
 * exp(-2 |u|) instead (tanh_terms), where |u| >= 1/16, and from tanh's
 * Taylor series to u^13 below (the first term left out is under 3e-20 of
 * tanh). exp reduces to 2^n e^r, |r| <= ln(2) / 2, e^r by its Taylor
 * series to r^13 (the first term left out is under 6e-18 of it), 2^n built
 * in the exponent's
 * bits. Compiled with -mavx2 -mfma (this file only); run only where the
 * CPU has both (core/cpu.c).
 */
#include "kernels/activation/activation.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define GELU_K 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_C 0.044715

/* exp(y) for y in [-708, 0] (the caller clamps). */
static inline __m256d exp_neg(__m256d y) {
    const __m256d log2e = _mm256_set1_pd(1.4426950408889634);
    const __m256d ln2_hi = _mm256_set1_pd(6.93147180369123816490e-01);
    const __m256d ln2_lo = _mm256_set1_pd(1.90821492927058770002e-10);
    __m256d n = _mm256_round_pd(_mm256_mul_pd(y, log2e),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_fnmadd_pd(n, ln2_hi, y);
    r = _mm256_fnmadd_pd(n, ln2_lo, r);
    /* 1 + r + r^2/2! + ... + r^13/13!, Horner's rule */
    static const double inv_fact[14] = {1.0,
                                        1.0,
                                        0.5,
                                        1.0 / 6,
                                        1.0 / 24,
                                        1.0 / 120,
                                        1.0 / 720,
                                        1.0 / 5040,
                                        1.0 / 40320,
                                        1.0 / 362880,
                                        1.0 / 3628800,
                                        1.0 / 39916800,
                                        1.0 / 479001600,
                                        1.0 / 6227020800.0};
    __m256d p = _mm256_set1_pd(inv_fact[13]);
    for (int k = 12; k >= 0; k--) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(inv_fact[k]));
    /* 2^n: n + 1023 in the exponent field (n >= -1022 for y >= -708) */
    __m128i ni = _mm256_cvtpd_epi32(n);
    __m256i bits = _mm256_slli_epi64(
        _mm256_add_epi64(_mm256_cvtepi32_epi64(ni), _mm256_set1_epi64x(1023)), 52);
    return _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
}

/* 1 + tanh(u) and 1 - tanh(u)^2, neither by a subtraction near 0: with
 * e = exp(-2 |u|) and d = 1 + e, 1 + tanh(u) = 2 / d for u >= 0 and 2 e / d
 * for u < 0, 1 - tanh(u)^2 = 4 e / d^2 (where |u| >= 1/16; below, tanh's
 * Taylor series, |tanh| < 1/16). Past |u| = 354 e is 0: 1 + tanh(-inf) is
 * 0, as the scalar layer's. */
static inline void tanh_terms(__m256d u, __m256d *one_plus, __m256d *sech2) {
    const __m256d sign_bit = _mm256_set1_pd(-0.0), one = _mm256_set1_pd(1.0);
    const __m256d two = _mm256_set1_pd(2.0);
    __m256d a = _mm256_andnot_pd(sign_bit, u);
    __m256d e = exp_neg(_mm256_max_pd(_mm256_mul_pd(a, _mm256_set1_pd(-2.0)),
                                      _mm256_set1_pd(-708.0)));
    e = _mm256_andnot_pd(_mm256_cmp_pd(a, _mm256_set1_pd(354.0), _CMP_GT_OQ), e);
    __m256d d = _mm256_add_pd(one, e);
    __m256d negative = _mm256_cmp_pd(u, _mm256_setzero_pd(), _CMP_LT_OQ);
    __m256d large_plus = _mm256_div_pd(_mm256_blendv_pd(two, _mm256_mul_pd(two, e), negative), d);
    __m256d large_sech2 = _mm256_div_pd(_mm256_mul_pd(_mm256_set1_pd(4.0), e), _mm256_mul_pd(d, d));
    /* small: t = a - a^3/3 + 2a^5/15 - 17a^7/315 + 62a^9/2835 - 1382a^11/155925
     * + 21844a^13/6081075, with u's sign */
    __m256d a2 = _mm256_mul_pd(a, a);
    __m256d s = _mm256_set1_pd(21844.0 / 6081075.0);
    s = _mm256_fmadd_pd(s, a2, _mm256_set1_pd(-1382.0 / 155925.0));
    s = _mm256_fmadd_pd(s, a2, _mm256_set1_pd(62.0 / 2835.0));
    s = _mm256_fmadd_pd(s, a2, _mm256_set1_pd(-17.0 / 315.0));
    s = _mm256_fmadd_pd(s, a2, _mm256_set1_pd(2.0 / 15.0));
    s = _mm256_fmadd_pd(s, a2, _mm256_set1_pd(-1.0 / 3.0));
    __m256d t = _mm256_fmadd_pd(_mm256_mul_pd(s, a2), a, a);
    t = _mm256_or_pd(t, _mm256_and_pd(u, sign_bit));
    /* a < 1/16 is false for NaN: NaN goes the large way (and x, NaN, makes
     * the result NaN) */
    __m256d small = _mm256_cmp_pd(a, _mm256_set1_pd(0.0625), _CMP_LT_OQ);
    *one_plus = _mm256_blendv_pd(large_plus, _mm256_add_pd(one, t), small);
    *sech2 = _mm256_blendv_pd(large_sech2, _mm256_fnmadd_pd(t, t, one), small);
}

static inline __m256d gelu_u(__m256d x) {
    __m256d x3 = _mm256_mul_pd(_mm256_mul_pd(x, x), x);
    return _mm256_mul_pd(_mm256_set1_pd(GELU_K), _mm256_fmadd_pd(_mm256_set1_pd(GELU_C), x3, x));
}

/* Four elements: y = gelu(x). */
static inline __m128 gelu4(__m128 xf) {
    __m256d x = _mm256_cvtps_pd(xf), one_plus, sech2;
    tanh_terms(gelu_u(x), &one_plus, &sech2);
    return _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(0.5), x), one_plus));
}

/* Four elements: dx + dy gelu'(x). */
static inline __m128 gelu_backward4(__m128 xf, __m128 dyf, __m128 dxf) {
    __m256d x = _mm256_cvtps_pd(xf), half = _mm256_set1_pd(0.5), one_plus, sech2;
    tanh_terms(gelu_u(x), &one_plus, &sech2);
    __m256d du = _mm256_mul_pd(_mm256_set1_pd(GELU_K),
                               _mm256_fmadd_pd(_mm256_set1_pd(3.0 * GELU_C), _mm256_mul_pd(x, x),
                                               _mm256_set1_pd(1.0)));
    __m256d g = _mm256_fmadd_pd(_mm256_mul_pd(_mm256_mul_pd(half, x), sech2), du,
                                _mm256_mul_pd(half, one_plus));
    __m256d dx = _mm256_fmadd_pd(_mm256_cvtps_pd(dyf), g, _mm256_cvtps_pd(dxf));
    return _mm256_cvtpd_ps(dx);
}

static void gelu_tanh_avx2(const float *x, float *y, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(y + i, gelu4(_mm_loadu_ps(x + i)));
    if (i < n) {
        float xs[4] = {0}, ys[4];
        memcpy(xs, x + i, (n - i) * sizeof(float));
        _mm_storeu_ps(ys, gelu4(_mm_loadu_ps(xs)));
        memcpy(y + i, ys, (n - i) * sizeof(float));
    }
}

static void gelu_tanh_backward_avx2(const float *x, const float *dy, float *dx, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(dx + i, gelu_backward4(_mm_loadu_ps(x + i), _mm_loadu_ps(dy + i),
                                             _mm_loadu_ps(dx + i)));
    if (i < n) {
        float xs[4] = {0}, dys[4] = {0}, dxs[4] = {0};
        memcpy(xs, x + i, (n - i) * sizeof(float));
        memcpy(dys, dy + i, (n - i) * sizeof(float));
        memcpy(dxs, dx + i, (n - i) * sizeof(float));
        _mm_storeu_ps(dxs, gelu_backward4(_mm_loadu_ps(xs), _mm_loadu_ps(dys), _mm_loadu_ps(dxs)));
        memcpy(dx + i, dxs, (n - i) * sizeof(float));
    }
}

/* ---- cross-entropy ---------------------------------------------------- */

/* exp(y) for any y <= 0 or NaN: exp_neg where y >= -708, 0 below (the
 * scalar exp's subnormals there are below a float's reach once divided by
 * a sum of at least 1), NaN kept. */
static inline __m256d exp_nonpositive(__m256d y) {
    const __m256d floor = _mm256_set1_pd(-708.0);
    __m256d e = exp_neg(_mm256_max_pd(y, floor));
    e = _mm256_and_pd(e, _mm256_cmp_pd(y, floor, _CMP_GE_OQ));
    return _mm256_blendv_pd(e, y, _mm256_cmp_pd(y, y, _CMP_UNORD_Q));
}

/* Four logits from z + v, the last row's lanes past V as -inf. */
static inline __m256d load4(const float *z, size_t v, size_t V) {
    if (v + 4 <= V) return _mm256_cvtps_pd(_mm_loadu_ps(z + v));
    float pad[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    memcpy(pad, z + v, (V - v) * sizeof(float));
    return _mm256_cvtps_pd(_mm_loadu_ps(pad));
}

/* The largest of z (NaN ignored: -inf when every z is NaN or -inf). */
static double row_max(const float *z, size_t V) {
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    size_t v = 0;
    /* maxps gives its second operand where the first is NaN */
    for (; v + 8 <= V; v += 8) m8 = _mm256_max_ps(_mm256_loadu_ps(z + v), m8);
    float lanes[8];
    _mm256_storeu_ps(lanes, m8);
    float max = -INFINITY;
    for (int i = 0; i < 8; i++)
        if (lanes[i] > max) max = lanes[i];
    for (; v < V; v++)
        if (z[v] > max) max = z[v];
    return max;
}

/* sum_v exp(z[v] - max), in four lanes summed at the end. */
static double row_sum(const float *z, size_t V, double max) {
    __m256d m = _mm256_set1_pd(max), sum = _mm256_setzero_pd();
    for (size_t v = 0; v < V; v += 4)
        sum = _mm256_add_pd(sum, exp_nonpositive(_mm256_sub_pd(load4(z, v, V), m)));
    double lanes[4];
    _mm256_storeu_pd(lanes, sum);
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

static double crossentropy_row_avx2(const float *z, size_t V, int32_t target) {
    double max = row_max(z, V);
    return max + log(row_sum(z, V, max)) - (double)z[target];
}

static void crossentropy_backward_row_avx2(const float *z, size_t V, int32_t target,
                                           double scale, float *dz) {
    double max = row_max(z, V);
    __m256d m = _mm256_set1_pd(max), sum = _mm256_set1_pd(row_sum(z, V, max));
    __m256d s = _mm256_set1_pd(scale), t = _mm256_set1_pd((double)target);
    __m256d index = _mm256_setr_pd(0.0, 1.0, 2.0, 3.0), four = _mm256_set1_pd(4.0);
    const __m256d one = _mm256_set1_pd(1.0);
    for (size_t v = 0; v < V; v += 4, index = _mm256_add_pd(index, four)) {
        __m256d p = _mm256_div_pd(exp_nonpositive(_mm256_sub_pd(load4(z, v, V), m)), sum);
        __m256d indicator = _mm256_and_pd(one, _mm256_cmp_pd(index, t, _CMP_EQ_OQ));
        if (v + 4 <= V) {
            __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(dz + v));
            d = _mm256_add_pd(d, _mm256_mul_pd(s, _mm256_sub_pd(p, indicator)));
            _mm_storeu_ps(dz + v, _mm256_cvtpd_ps(d));
        } else {
            float lanes[4] = {0};
            memcpy(lanes, dz + v, (V - v) * sizeof(float));
            __m256d d = _mm256_add_pd(_mm256_cvtps_pd(_mm_loadu_ps(lanes)),
                                      _mm256_mul_pd(s, _mm256_sub_pd(p, indicator)));
            _mm_storeu_ps(lanes, _mm256_cvtpd_ps(d));
            memcpy(dz + v, lanes, (V - v) * sizeof(float));
        }
    }
}

const attn_activation_kernels attn_activation_avx2 = {"avx2", gelu_tanh_avx2,
                                                      gelu_tanh_backward_avx2,
                                                      crossentropy_row_avx2,
                                                      crossentropy_backward_row_avx2};
