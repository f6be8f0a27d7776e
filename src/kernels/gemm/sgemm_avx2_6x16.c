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

#include <immintrin.h>

#define MR 6
#define NR 16

#define ROW_DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps();
#define ROW_FMA(r)                                                                           \
    do {                                                                                       \
        __m256 a_r = _mm256_broadcast_ss(a + (r));                                             \
        c##r##0 = _mm256_fmadd_ps(a_r, b0, c##r##0);                                           \
        c##r##1 = _mm256_fmadd_ps(a_r, b1, c##r##1);                                           \
    } while (0)
#define ROW_STORE(r)                                                                         \
    do {                                                                                       \
        float *c_r = c + (r) * ldc;                                                            \
        if (beta == 0.0f) {                                                                    \
            _mm256_storeu_ps(c_r, _mm256_mul_ps(va, c##r##0));                                 \
            _mm256_storeu_ps(c_r + 8, _mm256_mul_ps(va, c##r##1));                             \
        } else {                                                                               \
            _mm256_storeu_ps(c_r, _mm256_fmadd_ps(vb, _mm256_loadu_ps(c_r),                    \
                                                  _mm256_mul_ps(va, c##r##0)));                \
            _mm256_storeu_ps(c_r + 8, _mm256_fmadd_ps(vb, _mm256_loadu_ps(c_r + 8),            \
                                                      _mm256_mul_ps(va, c##r##1)));            \
        }                                                                                      \
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
                          float alpha, float beta) {
    ALL_ROWS(ROW_DECL)
    ALL_ROWS_STMT(ROW_PREFETCH);
    for (size_t p = 0; p < k; p++) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        ALL_ROWS_STMT(ROW_FMA);
        a += MR;
        b += NR;
    }
    __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    ALL_ROWS_STMT(ROW_STORE);
}

ATTN_GEMM_DEFINE_PACK(attn_sgemm_avx2_6x16, MR, NR)
