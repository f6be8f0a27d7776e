/*
 * sgemm_avx512_14x32.c — the AVX-512F kernel set: a 14 x 32 tile of C in
 * 28 zmm accumulators (14 rows, two vectors of 16 floats each).
 *
 * Each step p loads two vectors of the packed B micro-panel and broadcasts
 * the 14 values of the packed A micro-panel into 28 FMAs: 28 + 2 + 1 of the
 * 32 registers, and 16 loads for 28 FMAs, under the two loads a cycle a
 * core issues alongside its two FMAs. Compiled with -mavx512f (this file
 * only) and run only where the CPU has AVX-512F (dispatch.c).
 */
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_pack.h"

#include <immintrin.h>

#define MR 14
#define NR 32

/* Row r of the tile: c{r}0, c{r}1 += a[r] * (b0, b1). */
#define ROW_DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps();
#define ROW_FMA(r)                                                                           \
    do {                                                                                       \
        __m512 a_r = _mm512_set1_ps(a[r]);                                                     \
        c##r##0 = _mm512_fmadd_ps(a_r, b0, c##r##0);                                           \
        c##r##1 = _mm512_fmadd_ps(a_r, b1, c##r##1);                                           \
    } while (0)
#define ROW_STORE(r)                                                                         \
    do {                                                                                       \
        float *c_r = c + (r) * ldc;                                                            \
        if (beta == 0.0f) {                                                                    \
            _mm512_storeu_ps(c_r, _mm512_mul_ps(va, c##r##0));                                 \
            _mm512_storeu_ps(c_r + 16, _mm512_mul_ps(va, c##r##1));                            \
        } else {                                                                               \
            _mm512_storeu_ps(c_r, _mm512_fmadd_ps(vb, _mm512_loadu_ps(c_r),                    \
                                                  _mm512_mul_ps(va, c##r##0)));                \
            _mm512_storeu_ps(c_r + 16, _mm512_fmadd_ps(vb, _mm512_loadu_ps(c_r + 16),          \
                                                       _mm512_mul_ps(va, c##r##1)));           \
        }                                                                                      \
    } while (0)
#define ALL_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define ALL_ROWS_STMT(X)                                                                     \
    X(0); X(1); X(2); X(3); X(4); X(5); X(6); X(7); X(8); X(9); X(10); X(11); X(12); X(13)

void attn_sgemm_avx512_14x32(size_t k, const float *a, const float *b, float *c, size_t ldc,
                             float alpha, float beta) {
    ALL_ROWS(ROW_DECL)
    for (size_t p = 0; p < k; p++) {
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
        ALL_ROWS_STMT(ROW_FMA);
        a += MR;
        b += NR;
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    ALL_ROWS_STMT(ROW_STORE);
}

ATTN_GEMM_DEFINE_PACK(attn_sgemm_avx512_14x32, MR, NR)
