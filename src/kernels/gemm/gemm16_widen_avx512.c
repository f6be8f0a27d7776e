/*
 * gemm16_widen_avx512.c — gemm16_widen.c's packing with AVX-512F: 16-bit
 * elements widened 16 at a time (bf16: zero-extend and shift into the top
 * half; f16: vcvtph2ps, exact) into the float panels of the SGEMM's
 * 14 x 32 AVX-512 kernel. Where vectors run along the source's rows (A as
 * is, B transposed), 16 rows of 16 elements are widened and transposed in
 * registers. Compiled with -mavx512f (this file only).
 */
#include "kernels/gemm/gemm16.h"
#include "kernels/gemm/transpose16_avx512.h"

#include <immintrin.h>

#define MR 14
#define NR 32

static size_t min_len(size_t a, size_t b) { return a < b ? a : b; }

/* n <= 16 elements from src, zeros after them (never reading past n). */
static inline __m256i load16(const uint16_t *src, size_t n) {
    if (n == 16) return _mm256_loadu_si256((const __m256i *)(const void *)src);
    uint16_t buf[16] = {0};
    memcpy(buf, src, n * sizeof *src);
    return _mm256_loadu_si256((const __m256i *)(const void *)buf);
}

static inline __m512 widen16(attn_dtype dtype, __m256i h) {
    if (dtype == ATTN_DTYPE_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* Vectors along the source's rows: rows (<= 16) vectors of a panel of
 * width floats, 16 steps of k at a time; step p is stored at
 * dst[p*width + offset], lanes [0, lanes). */
static void widen_transposed(attn_dtype dtype, size_t kc, size_t rows, const uint16_t *src,
                             size_t ld, size_t width, size_t offset, __mmask16 lanes,
                             float *dst) {
    for (size_t p0 = 0; p0 < kc; p0 += 16) {
        size_t steps = min_len(16, kc - p0);
        __m512 r[16];
        for (size_t i = 0; i < 16; i++)
            r[i] = i < rows ? widen16(dtype, load16(src + i * ld + p0, steps)) : _mm512_setzero_ps();
        attn_transpose16(r);
        for (size_t p = 0; p < steps; p++)
            _mm512_mask_storeu_ps(dst + (p0 + p) * width + offset, lanes, r[attn_transpose16_order[p]]);
    }
}

/* Vectors along the source's columns: element (v, p) at src[p*ld + v];
 * each step's width values, zero-padded past len, 16 at a time. */
static void widen_contiguous(attn_dtype dtype, size_t kc, size_t len, const uint16_t *src,
                             size_t ld, size_t width, float *dst) {
    for (size_t q = 0; q * width < len; q++) {
        size_t cols = min_len(width, len - q * width);
        float *panel = dst + q * kc * width;
        for (size_t p = 0; p < kc; p++) {
            const uint16_t *s = src + p * ld + q * width;
            float *d = panel + p * width;
            for (size_t v0 = 0; v0 < width; v0 += 16) {
                size_t n = cols > v0 ? min_len(16, cols - v0) : 0, lanes = min_len(16, width - v0);
                __m512 x = widen16(dtype, load16(s + v0, n));
                _mm512_mask_storeu_ps(d + v0, (__mmask16)((1u << lanes) - 1u), x);
            }
        }
    }
}

void attn_gemm16_widen_avx512_14_pack_a(attn_dtype dtype, size_t kc, size_t rows,
                                        const uint16_t *src, size_t ld, bool trans, void *dst) {
    float *d = dst;
    if (trans) {
        widen_contiguous(dtype, kc, rows, src, ld, MR, d);
        return;
    }
    for (size_t q = 0; q * MR < rows; q++)
        widen_transposed(dtype, kc, min_len(MR, rows - q * MR), src + q * MR * ld, ld, MR, 0,
                         (__mmask16)((1u << MR) - 1u), d + q * kc * MR);
}

void attn_gemm16_widen_avx512_32_pack_b(attn_dtype dtype, size_t kc, size_t cols,
                                        const uint16_t *src, size_t ld, bool trans, void *dst) {
    float *d = dst;
    if (!trans) {
        widen_contiguous(dtype, kc, cols, src, ld, NR, d);
        return;
    }
    for (size_t q = 0; q * NR < cols; q++) {
        size_t panel = min_len(NR, cols - q * NR);
        for (size_t half = 0; half < 2; half++) {
            size_t v0 = half * 16, n = panel > v0 ? min_len(16, panel - v0) : 0;
            widen_transposed(dtype, kc, n, src + (q * NR + v0) * ld, ld, NR, v0, 0xFFFF,
                             d + q * kc * NR);
        }
    }
}
