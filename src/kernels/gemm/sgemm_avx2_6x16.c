/*
 * sgemm_avx2_6x16.c — the AVX2 + FMA kernel set: a 6 x 16 tile of C in 12
 * ymm accumulators (6 rows, two vectors of 8 floats each).
 *
 * Each step p loads two vectors of the packed B micro-panel and broadcasts
 * the 6 values of the packed A micro-panel into 12 FMAs: 12 + 2 + 1 of the
 * 16 registers, 8 loads for 12 FMAs. The same tile runs on B's micro-panels
 * kept in 16 bits (gemm16.h, attn_sgemm_run_b16): f16 widened by vcvtph2ps,
 * bf16 16 columns a load as the even columns (a shift) and the odd ones (a
 * mask), put back in order before the store; half the bytes of B to stream
 * through the caches, and the same bits as on B widened first. Compiled
 * with -mavx2 -mfma -mf16c (this file only) and run only where the CPU has
 * them (dispatch.c).
 */
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm16.h"
#include "kernels/gemm/gemm_pack.h"
#include "kernels/gemm/transpose8_avx2.h"

#include <immintrin.h>

#define MR 6
#define NR 16
_Static_assert(NR <= ATTN_GEMM_NR_MAX, "an edge tile pads its bias to ATTN_GEMM_NR_MAX");
/* Steps of p the loop prefetches ahead, B's line and A's (as the AVX-512
 * set's, which says why). */
#define PREFETCH_STEPS 16

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* How B's micro-panel is stored: floats, or the bits of f16 or bf16. */
typedef enum b_format { B_FLOAT, B_F16, B_BF16 } b_format;

/* Step p's two vectors of B: columns 0-7 and 8-15, for bf16 the even
 * columns and the odd ones (see ROW_UNPAIR). */
static ALWAYS_INLINE void load_b(b_format fmt, const void *b, size_t p, __m256 *b0, __m256 *b1) {
    if (fmt == B_F16) {
        const __m128i *h = (const __m128i *)((const uint16_t *)b + p * NR);
        *b0 = _mm256_cvtph_ps(_mm_loadu_si128(h));
        *b1 = _mm256_cvtph_ps(_mm_loadu_si128(h + 1));
    } else if (fmt == B_BF16) {
        __m256i w = _mm256_loadu_si256((const __m256i *)((const uint16_t *)b + p * NR));
        *b0 = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
        *b1 = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xFFFF0000u)));
    } else {
        const float *f = (const float *)b + p * NR;
        *b0 = _mm256_loadu_ps(f);
        *b1 = _mm256_loadu_ps(f + 8);
    }
}

/* B's element p * NR + PREFETCH_STEPS * NR, as a byte address. */
static ALWAYS_INLINE const char *b_ahead(b_format fmt, const void *b, size_t p) {
    size_t bytes = fmt == B_FLOAT ? sizeof(float) : sizeof(uint16_t);
    return (const char *)b + (p + PREFETCH_STEPS) * NR * bytes;
}

#define ROW_DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps();
#define ROW_FMA(r)                                                                           \
    do {                                                                                       \
        __m256 a_r = _mm256_broadcast_ss(a + (r));                                             \
        c##r##0 = _mm256_fmadd_ps(a_r, b0, c##r##0);                                           \
        c##r##1 = _mm256_fmadd_ps(a_r, b1, c##r##1);                                           \
    } while (0)
/* Row r's sums of bf16 panels (even columns, odd columns) back in the
 * order of the columns. */
#define ROW_UNPAIR(r)                                                                        \
    do {                                                                                       \
        __m256 lo = _mm256_unpacklo_ps(c##r##0, c##r##1), hi = _mm256_unpackhi_ps(c##r##0, c##r##1); \
        c##r##0 = _mm256_permute2f128_ps(lo, hi, 0x20);                                        \
        c##r##1 = _mm256_permute2f128_ps(lo, hi, 0x31);                                        \
    } while (0)
/* Row r of c = alpha * acc (+ beta * c), then + bias where given. */
#define ROW_STORE(r)                                                                         \
    do {                                                                                       \
        float *c_r = c + (r) * ldc;                                                            \
        __m256 x0 = _mm256_mul_ps(va, c##r##0), x1 = _mm256_mul_ps(va, c##r##1);               \
        if (beta != 0.0f) {                                                                    \
            x0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(c_r), x0);                                \
            x1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(c_r + 8), x1);                            \
        }                                                                                      \
        if (bias) {                                                                            \
            x0 = _mm256_add_ps(x0, bias0);                                                     \
            x1 = _mm256_add_ps(x1, bias1);                                                     \
        }                                                                                      \
        _mm256_storeu_ps(c_r, x0);                                                             \
        _mm256_storeu_ps(c_r + 8, x1);                                                         \
    } while (0)
/* The tile's row r (one or two cache lines), fetched while the FMAs run. */
#define ROW_PREFETCH(r)                                                                      \
    do {                                                                                       \
        _mm_prefetch((const char *)(c + (r) * ldc), _MM_HINT_T0);                              \
        _mm_prefetch((const char *)(c + (r) * ldc + 15), _MM_HINT_T0);                         \
    } while (0)
#define ALL_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define ALL_ROWS_STMT(X) X(0); X(1); X(2); X(3); X(4); X(5)

/* The microkernel (gemm.h) on B's micro-panel stored as fmt. */
static ALWAYS_INLINE void tile(b_format fmt, size_t k, const float *a, const void *b, float *c,
                               size_t ldc, float alpha, float beta, const float *bias) {
    ALL_ROWS(ROW_DECL)
    ALL_ROWS_STMT(ROW_PREFETCH);
    for (size_t p = 0; p < k; p++) {
        __m256 b0, b1;
        load_b(fmt, b, p, &b0, &b1);
        _mm_prefetch(b_ahead(fmt, b, p), _MM_HINT_T0);
        _mm_prefetch((const char *)(a + PREFETCH_STEPS * MR), _MM_HINT_T0);
        ALL_ROWS_STMT(ROW_FMA);
        a += MR;
    }
    if (fmt == B_BF16) {
        ALL_ROWS_STMT(ROW_UNPAIR);
    }
    __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    __m256 bias0 = _mm256_setzero_ps(), bias1 = _mm256_setzero_ps(); /* used only with bias */
    if (bias) {
        bias0 = _mm256_loadu_ps(bias);
        bias1 = _mm256_loadu_ps(bias + 8);
    }
    ALL_ROWS_STMT(ROW_STORE);
}

void attn_sgemm_avx2_6x16(size_t k, const float *a, const float *b, float *c, size_t ldc,
                          float alpha, float beta, const float *bias) {
    tile(B_FLOAT, k, a, b, c, ldc, alpha, beta, bias);
}

void attn_sgemm_avx2_6x16_f16(size_t k, const float *a, const uint16_t *b, float *c, size_t ldc,
                              float alpha, float beta, const float *bias) {
    tile(B_F16, k, a, b, c, ldc, alpha, beta, bias);
}

void attn_sgemm_avx2_6x16_bf16(size_t k, const float *a, const uint16_t *b, float *c, size_t ldc,
                               float alpha, float beta, const float *bias) {
    tile(B_BF16, k, a, b, c, ldc, alpha, beta, bias);
}

/* ---- packing ------------------------------------------------------------ */

/* The first n (< 8) lanes set. */
static inline __m256i first_lanes(size_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Strided packing, 8 steps of p at a time: vectors v < rows (<= 8) are
 * read 8 floats each and transposed; step p holds them at dst[p*width +
 * offset], width floats per step, store(dst, vector) writing the lanes. */
static void transpose_rows(size_t kc, size_t rows, const float *src, size_t ld, size_t p0,
                           __m256 r[8]) {
    size_t steps = kc - p0 < 8 ? kc - p0 : 8;
    __m256i lanes = first_lanes(steps);
    for (size_t i = 0; i < 8; i++) {
        if (i >= rows)
            r[i] = _mm256_setzero_ps();
        else if (steps == 8)
            r[i] = _mm256_loadu_ps(src + i * ld + p0);
        else
            r[i] = _mm256_maskload_ps(src + i * ld + p0, lanes);
    }
    attn_transpose8(r);
}

static size_t min_len(size_t a, size_t b) { return a < b ? a : b; }

void attn_sgemm_avx2_6x16_pack_a(size_t kc, size_t rows, const float *src, size_t ld, bool trans,
                                 float *dst) {
    if (trans) {
        attn_gemm_pack_block(kc, rows, src, ld, true, MR, dst);
        return;
    }
    for (size_t q = 0; q * MR < rows; q++) {
        const float *sq = src + q * MR * ld;
        float *dq = dst + q * kc * MR;
        size_t panel = min_len(MR, rows - q * MR);
        for (size_t p0 = 0; p0 < kc; p0 += 8) {
            __m256 r[8];
            transpose_rows(kc, panel, sq, ld, p0, r);
            for (size_t p = 0; p < 8 && p0 + p < kc; p++) {
                /* the 6 lanes of a step: four, then two */
                float *d = dq + (p0 + p) * MR;
                _mm_storeu_ps(d, _mm256_castps256_ps128(r[p]));
                _mm_storel_pi((__m64 *)(void *)(d + 4), _mm256_extractf128_ps(r[p], 1));
            }
        }
    }
}

void attn_sgemm_avx2_6x16_pack_b(size_t kc, size_t cols, const float *src, size_t ld, bool trans,
                                 float *dst) {
    if (!trans) {
        attn_gemm_pack_block(kc, cols, src, ld, true, NR, dst);
        return;
    }
    for (size_t q = 0; q * NR < cols; q++) {
        size_t panel = min_len(NR, cols - q * NR);
        float *dq = dst + q * kc * NR;
        for (size_t half = 0; half < 2; half++) {
            size_t v0 = half * 8, n = panel > v0 ? min_len(8, panel - v0) : 0;
            const float *sq = src + (q * NR + v0) * ld;
            for (size_t p0 = 0; p0 < kc; p0 += 8) {
                __m256 r[8];
                transpose_rows(kc, n, sq, ld, p0, r);
                for (size_t p = 0; p < 8 && p0 + p < kc; p++)
                    _mm256_storeu_ps(dq + (p0 + p) * NR + v0, r[p]);
            }
        }
    }
}
