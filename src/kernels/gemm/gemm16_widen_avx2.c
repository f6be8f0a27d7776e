/*
 * gemm16_widen_avx2.c — gemm16_widen.c's packing with AVX2 and F16C:
 * 16-bit elements widened 8 at a time (bf16: zero-extend and shift into the
 * top half; f16: vcvtph2ps, exact) into the float panels of the SGEMM's
 * 6 x 16 AVX2 kernel. Where vectors run along the source's rows (A as is,
 * B transposed, as a linear layer's weights are), 8 rows of 8 elements are
 * widened and transposed in registers. Also the packing of B in its 16
 * bits into the same panel order (pack_b16), for the 6 x 16 tile that
 * widens B in registers (sgemm_avx2_6x16.c). Compiled with -mavx2 -mf16c
 * (this file only); the AVX2 kernel set runs only where the CPU has F16C.
 */
#include "kernels/gemm/gemm16.h"
#include "kernels/gemm/transpose8_avx2.h"

#include <immintrin.h>

#define MR 6
#define NR 16

static size_t min_len(size_t a, size_t b) { return a < b ? a : b; }

/* n <= 8 elements from src, zeros after them (never reading past n). */
static inline __m128i load8(const uint16_t *src, size_t n) {
    if (n == 8) return _mm_loadu_si128((const __m128i *)(const void *)src);
    uint16_t buf[8] = {0};
    memcpy(buf, src, n * sizeof *src);
    return _mm_loadu_si128((const __m128i *)(const void *)buf);
}

static inline __m256 widen8(attn_dtype dtype, __m128i h) {
    if (dtype == ATTN_DTYPE_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* The first lanes (6 or 8) of x at d. */
static inline void store_lanes(float *d, __m256 x, size_t lanes) {
    if (lanes == 8) {
        _mm256_storeu_ps(d, x);
        return;
    }
    _mm_storeu_ps(d, _mm256_castps256_ps128(x));
    _mm_storel_pi((__m64 *)(void *)(d + 4), _mm256_extractf128_ps(x, 1));
}

/* Vectors along the source's rows: rows (<= 8) vectors of a panel of width
 * floats, 8 steps of k at a time; step p is stored at dst[p*width +
 * offset], lanes (6 or 8) of them, the rows past rows zero. */
static void widen_transposed(attn_dtype dtype, size_t kc, size_t rows, const uint16_t *src,
                             size_t ld, size_t width, size_t offset, size_t lanes, float *dst) {
    for (size_t p0 = 0; p0 < kc; p0 += 8) {
        size_t steps = min_len(8, kc - p0);
        __m256 r[8];
        for (size_t i = 0; i < 8; i++)
            r[i] = i < rows ? widen8(dtype, load8(src + i * ld + p0, steps)) : _mm256_setzero_ps();
        attn_transpose8(r);
        for (size_t p = 0; p < steps; p++) store_lanes(dst + (p0 + p) * width + offset, r[p], lanes);
    }
}

/* Vectors along the source's columns: element (v, p) at src[p*ld + v];
 * each step's width values, zero-padded past len, 8 at a time. */
static void widen_contiguous(attn_dtype dtype, size_t kc, size_t len, const uint16_t *src,
                             size_t ld, size_t width, float *dst) {
    for (size_t q = 0; q * width < len; q++) {
        size_t cols = min_len(width, len - q * width);
        float *panel = dst + q * kc * width;
        for (size_t p = 0; p < kc; p++) {
            const uint16_t *s = src + p * ld + q * width;
            float *d = panel + p * width;
            for (size_t v0 = 0; v0 < width; v0 += 8) {
                size_t n = cols > v0 ? min_len(8, cols - v0) : 0;
                store_lanes(d + v0, widen8(dtype, load8(s + v0, n)), min_len(8, width - v0));
            }
        }
    }
}

void attn_gemm16_widen_avx2_6_pack_a(attn_dtype dtype, size_t kc, size_t rows,
                                     const uint16_t *src, size_t ld, bool trans, void *dst) {
    float *d = dst;
    if (trans) {
        widen_contiguous(dtype, kc, rows, src, ld, MR, d);
        return;
    }
    for (size_t q = 0; q * MR < rows; q++)
        widen_transposed(dtype, kc, min_len(MR, rows - q * MR), src + q * MR * ld, ld, MR, 0, MR,
                         d + q * kc * MR);
}

void attn_gemm16_widen_avx2_16_pack_b(attn_dtype dtype, size_t kc, size_t cols,
                                      const uint16_t *src, size_t ld, bool trans, void *dst) {
    float *d = dst;
    if (!trans) {
        widen_contiguous(dtype, kc, cols, src, ld, NR, d);
        return;
    }
    for (size_t q = 0; q * NR < cols; q++) {
        size_t panel = min_len(NR, cols - q * NR);
        for (size_t half = 0; half < 2; half++) {
            size_t v0 = half * 8, n = panel > v0 ? min_len(8, panel - v0) : 0;
            widen_transposed(dtype, kc, n, src + (q * NR + v0) * ld, ld, NR, v0, 8,
                             d + q * kc * NR);
        }
    }
}

/* ---- B in 16 bits ----------------------------------------------------- */

/* r[i] holds element j of row i in lane j; afterwards r[j] holds row i's
 * element j in lane i: an 8 x 8 transpose of 16-bit elements. */
static inline void transpose8_u16(__m128i r[8]) {
    __m128i a[8], b[8];
    for (int i = 0; i < 4; i++) {
        a[i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);     /* rows 2i, 2i+1: elements 0-3 */
        a[i + 4] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]); /* and 4-7 */
    }
    for (int i = 0; i < 2; i++) /* rows 4i .. 4i+3 */
        for (int h = 0; h < 2; h++) {
            b[4 * h + 2 * i] = _mm_unpacklo_epi32(a[4 * h + 2 * i], a[4 * h + 2 * i + 1]);
            b[4 * h + 2 * i + 1] = _mm_unpackhi_epi32(a[4 * h + 2 * i], a[4 * h + 2 * i + 1]);
        }
    /* b[4h + 2i + e]: rows 4i .. 4i+3, elements 4h + 2e and 4h + 2e + 1 */
    for (int h = 0; h < 2; h++)
        for (int e = 0; e < 2; e++) {
            r[4 * h + 2 * e] = _mm_unpacklo_epi64(b[4 * h + e], b[4 * h + 2 + e]);
            r[4 * h + 2 * e + 1] = _mm_unpackhi_epi64(b[4 * h + e], b[4 * h + 2 + e]);
        }
}

/* pack_b's panels (gemm.h) with each element's 16 bits: column q*NR + j of
 * op(B) at dst[q*kc*NR + p*NR + j], zero-padded to the tile. The bits are
 * the same for bf16 and f16: the tile widens them. */
void attn_gemm16_avx2_16_pack_b16(attn_dtype dtype, size_t kc, size_t cols, const uint16_t *src,
                                  size_t ld, bool trans, void *dst) {
    (void)dtype;
    uint16_t *d = dst;
    for (size_t q = 0; q * NR < cols; q++) {
        size_t panel = min_len(NR, cols - q * NR);
        uint16_t *dq = d + q * kc * NR;
        if (!trans) { /* op(B)'s rows: NR contiguous elements a step */
            for (size_t p = 0; p < kc; p++) {
                memcpy(dq + p * NR, src + p * ld + q * NR, panel * sizeof *src);
                memset(dq + p * NR + panel, 0, (NR - panel) * sizeof *src);
            }
            continue;
        }
        /* op(B)'s columns are src's rows: 8 of them, 8 steps at a time */
        for (size_t half = 0; half < 2; half++) {
            size_t v0 = half * 8, rows = panel > v0 ? min_len(8, panel - v0) : 0;
            const uint16_t *sq = src + (q * NR + v0) * ld;
            for (size_t p0 = 0; p0 < kc; p0 += 8) {
                size_t steps = min_len(8, kc - p0);
                __m128i r[8];
                for (size_t i = 0; i < 8; i++)
                    r[i] = i < rows ? load8(sq + i * ld + p0, steps) : _mm_setzero_si128();
                transpose8_u16(r);
                for (size_t p = 0; p < steps; p++)
                    _mm_storeu_si128((__m128i *)(void *)(dq + (p0 + p) * NR + v0), r[p]);
            }
        }
    }
}
