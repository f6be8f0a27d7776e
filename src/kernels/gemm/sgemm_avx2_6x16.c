/*
 * sgemm_avx2_6x16.c — the AVX2 + FMA kernel set: a 6 x 16 tile of C in 12
 * ymm accumulators (6 rows, two vectors of 8 floats each).
 *
 * Each step p loads two vectors of the packed B micro-panel and broadcasts
 * the 6 values of the packed A micro-panel into 12 FMAs: 12 + 2 + 1 of the
 * 16 registers, 8 loads for 12 FMAs. Compiled with -mavx2 -mfma (this file
 * only) and run only where the CPU has both (dispatch.c).
 */
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_pack.h"
#include "kernels/gemm/transpose8_avx2.h"

#include <immintrin.h>

#define MR 6
#define NR 16
_Static_assert(NR <= ATTN_GEMM_NR_MAX, "an edge tile pads its bias to ATTN_GEMM_NR_MAX");
/* Steps of p the loop prefetches ahead, B's line and A's (as the AVX-512
 * set's, which says why). */
#define PREFETCH_STEPS 16

#define ROW_DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps();
#define ROW_FMA(r)                                                                           \
    do {                                                                                       \
        __m256 a_r = _mm256_broadcast_ss(a + (r));                                             \
        c##r##0 = _mm256_fmadd_ps(a_r, b0, c##r##0);                                           \
        c##r##1 = _mm256_fmadd_ps(a_r, b1, c##r##1);                                           \
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

void attn_sgemm_avx2_6x16(size_t k, const float *a, const float *b, float *c, size_t ldc,
                          float alpha, float beta, const float *bias) {
    ALL_ROWS(ROW_DECL)
    ALL_ROWS_STMT(ROW_PREFETCH);
    for (size_t p = 0; p < k; p++) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        _mm_prefetch((const char *)(b + PREFETCH_STEPS * NR), _MM_HINT_T0);
        _mm_prefetch((const char *)(a + PREFETCH_STEPS * MR), _MM_HINT_T0);
        ALL_ROWS_STMT(ROW_FMA);
        a += MR;
        b += NR;
    }
    __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    __m256 bias0 = _mm256_setzero_ps(), bias1 = _mm256_setzero_ps(); /* used only with bias */
    if (bias) {
        bias0 = _mm256_loadu_ps(bias);
        bias1 = _mm256_loadu_ps(bias + 8);
    }
    ALL_ROWS_STMT(ROW_STORE);
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
