/*
 * gemv_avx2.c — the matrix-vector kernels with AVX2 + FMA (gemv.h's
 * contract). Four outputs (four streams of W) times two rows: 8 ymm
 * accumulators, 4 loads of W and 2 of x per 8 FMAs. Each accumulator's 8
 * lanes are summed in a fixed order, then the tail of in past a multiple of
 * 8 in order. One body serves float, bf16 and f16 W: 16-bit elements are
 * widened in registers (bf16 by a shift, f16 by F16C's vcvtph2ps), exactly,
 * so the sums are the float kernel's on the widened W. Compiled with
 * -mavx2 -mfma -mf16c (this file only); run only where the CPU has AVX2,
 * FMA and F16C (core/cpu.c).
 */
#include "kernels/gemv/gemv.h"

#include "half.h"

#include <immintrin.h>

enum { W_F32, W_BF16, W_F16 };

/* 8 elements of W from element idx, as floats. */
static inline __m256 load8(int kind, const void *w, size_t idx) {
    if (kind == W_F32) return _mm256_loadu_ps((const float *)w + idx);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + idx));
    if (kind == W_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float load1(int kind, const void *w, size_t idx) {
    if (kind == W_BF16) return attn_bf16_to_float(((const uint16_t *)w)[idx]);
    if (kind == W_F16) return _cvtsh_ss(((const uint16_t *)w)[idx]);
    return ((const float *)w)[idx];
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The scalar end of one dot product: the tail past body, then the bias;
 * wo is the element where output o's row of W starts. */
static inline float finish(int kind, float s, size_t body, size_t in, const float *xr,
                           const void *w, size_t wo, const float *bias, size_t o) {
    for (size_t i = body; i < in; i++) s += xr[i] * load1(kind, w, wo + i);
    return bias ? s + bias[o] : s;
}

/* Outputs o .. o + 3 for rows 0 and 1 of x. */
static inline void tile_4x2(int kind, size_t in, const float *x, const void *w,
                            const float *bias, float *y, size_t ldy, size_t o) {
    size_t w0 = o * in, w1 = w0 + in, w2 = w1 + in, w3 = w2 + in;
    const float *x0 = x, *x1 = x + in;
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    size_t body = in - in % 8;
    for (size_t i = 0; i < body; i += 8) {
        __m256 v0 = _mm256_loadu_ps(x0 + i), v1 = _mm256_loadu_ps(x1 + i);
        __m256 b0 = load8(kind, w, w0 + i), b1 = load8(kind, w, w1 + i);
        __m256 b2 = load8(kind, w, w2 + i), b3 = load8(kind, w, w3 + i);
        a00 = _mm256_fmadd_ps(v0, b0, a00);
        a01 = _mm256_fmadd_ps(v0, b1, a01);
        a02 = _mm256_fmadd_ps(v0, b2, a02);
        a03 = _mm256_fmadd_ps(v0, b3, a03);
        a10 = _mm256_fmadd_ps(v1, b0, a10);
        a11 = _mm256_fmadd_ps(v1, b1, a11);
        a12 = _mm256_fmadd_ps(v1, b2, a12);
        a13 = _mm256_fmadd_ps(v1, b3, a13);
    }
    y[o] = finish(kind, hsum(a00), body, in, x0, w, w0, bias, o);
    y[o + 1] = finish(kind, hsum(a01), body, in, x0, w, w1, bias, o + 1);
    y[o + 2] = finish(kind, hsum(a02), body, in, x0, w, w2, bias, o + 2);
    y[o + 3] = finish(kind, hsum(a03), body, in, x0, w, w3, bias, o + 3);
    y[ldy + o] = finish(kind, hsum(a10), body, in, x1, w, w0, bias, o);
    y[ldy + o + 1] = finish(kind, hsum(a11), body, in, x1, w, w1, bias, o + 1);
    y[ldy + o + 2] = finish(kind, hsum(a12), body, in, x1, w, w2, bias, o + 2);
    y[ldy + o + 3] = finish(kind, hsum(a13), body, in, x1, w, w3, bias, o + 3);
}

/* How far ahead (elements of W) tile_4x1 asks for its rows. */
#define TILE_AHEAD 1024

/* Outputs o .. o + 3 for row 0 of x. Each of the four rows of W is asked
 * for TILE_AHEAD elements ahead of its reads, 128 at a time (a token's
 * step: the prefetchers stop at each row's pages and the four streams
 * alone leave the memory idle between them); past a row's end that is the
 * next row's start, and the next tile's where more (it exists), up to one
 * row past. */
static inline void tile_4x1(int kind, size_t in, const float *x, const void *w,
                            const float *bias, float *y, size_t o, int more) {
    size_t w0 = o * in, w1 = w0 + in, w2 = w1 + in, w3 = w2 + in;
    size_t eb = kind == W_F32 ? 4 : 2;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t body = in - in % 8;
    for (size_t i = 0; i < body; i += 8) {
        if (i % 128 == 0 && i + TILE_AHEAD + 128 <= (more ? 2 * in : in))
            for (size_t r = 0; r < 4; r++)
                for (size_t l = 0; l < 128 * eb; l += 64)
                    _mm_prefetch((const char *)w + ((w0 + r * in) + i + TILE_AHEAD) * eb + l,
                                 _MM_HINT_T0);
        __m256 v = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(v, load8(kind, w, w0 + i), a0);
        a1 = _mm256_fmadd_ps(v, load8(kind, w, w1 + i), a1);
        a2 = _mm256_fmadd_ps(v, load8(kind, w, w2 + i), a2);
        a3 = _mm256_fmadd_ps(v, load8(kind, w, w3 + i), a3);
    }
    y[o] = finish(kind, hsum(a0), body, in, x, w, w0, bias, o);
    y[o + 1] = finish(kind, hsum(a1), body, in, x, w, w1, bias, o + 1);
    y[o + 2] = finish(kind, hsum(a2), body, in, x, w, w2, bias, o + 2);
    y[o + 3] = finish(kind, hsum(a3), body, in, x, w, w3, bias, o + 3);
}

/* One output for one row (the last outputs when out is not a multiple of 4). */
static inline float dot1(int kind, size_t in, const float *x, const void *w, size_t wo,
                         const float *bias, size_t o) {
    __m256 a = _mm256_setzero_ps();
    size_t body = in - in % 8;
    for (size_t i = 0; i < body; i += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load8(kind, w, wo + i), a);
    return finish(kind, hsum(a), body, in, x, w, wo, bias, o);
}

static inline void gemv(int kind, size_t rows, size_t in, const float *x, const void *w,
                        const float *bias, float *y, size_t ldy, size_t o_begin, size_t o_end) {
    size_t o = o_begin;
    for (; o + 4 <= o_end; o += 4) {
        size_t r = 0;
        for (; r + 2 <= rows; r += 2) tile_4x2(kind, in, x + r * in, w, bias, y + r * ldy, ldy, o);
        if (r < rows) tile_4x1(kind, in, x + r * in, w, bias, y + r * ldy, o, o + 8 <= o_end);
    }
    for (; o < o_end; o++)
        for (size_t r = 0; r < rows; r++)
            y[r * ldy + o] = dot1(kind, in, x + r * in, w, o * in, bias, o);
}

void attn_gemv_avx2(size_t rows, size_t in, const float *x, const float *w, const float *bias,
                    float *y, size_t ldy, size_t o_begin, size_t o_end) {
    gemv(W_F32, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}

void attn_gemv_avx2_bf16(size_t rows, size_t in, const float *x, const uint16_t *w,
                         const float *bias, float *y, size_t ldy, size_t o_begin, size_t o_end) {
    gemv(W_BF16, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}

void attn_gemv_avx2_f16(size_t rows, size_t in, const float *x, const uint16_t *w,
                        const float *bias, float *y, size_t ldy, size_t o_begin, size_t o_end) {
    gemv(W_F16, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}

void attn_widen_avx2_bf16(const uint16_t *src, size_t n, float *dst) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(W_BF16, src, i));
    for (; i < n; i++) dst[i] = attn_bf16_to_float(src[i]);
}

void attn_widen_avx2_f16(const uint16_t *src, size_t n, float *dst) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(W_F16, src, i));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}
