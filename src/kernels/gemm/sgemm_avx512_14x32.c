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
#include "kernels/gemm/transpose16_avx512.h"

#include <immintrin.h>

#define MR 14
#define NR 32
_Static_assert(NR <= ATTN_GEMM_NR_MAX, "an edge tile pads its bias to ATTN_GEMM_NR_MAX");
/* Steps of p the loop prefetches ahead: the B micro-panels stream from L2
 * and the A micro-panel (21 KiB at kc = 384) does not stay whole in a
 * 32 KiB L1. Any distance from 8 to 32 steps covers the latency. */
#define PREFETCH_STEPS 16

/* Row r of the tile: c{r}0, c{r}1 += a[r] * (b0, b1). */
#define ROW_DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps();
#define ROW_FMA(r)                                                                           \
    do {                                                                                       \
        __m512 a_r = _mm512_set1_ps(a[r]);                                                     \
        c##r##0 = _mm512_fmadd_ps(a_r, b0, c##r##0);                                           \
        c##r##1 = _mm512_fmadd_ps(a_r, b1, c##r##1);                                           \
    } while (0)
/* Row r of c = alpha * acc (+ beta * c), then + bias where given. */
#define ROW_STORE(r)                                                                         \
    do {                                                                                       \
        float *c_r = c + (r) * ldc;                                                            \
        __m512 x0 = _mm512_mul_ps(va, c##r##0), x1 = _mm512_mul_ps(va, c##r##1);               \
        if (beta != 0.0f) {                                                                    \
            x0 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(c_r), x0);                                \
            x1 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(c_r + 16), x1);                           \
        }                                                                                      \
        if (bias) {                                                                            \
            x0 = _mm512_add_ps(x0, bias0);                                                     \
            x1 = _mm512_add_ps(x1, bias1);                                                     \
        }                                                                                      \
        _mm512_storeu_ps(c_r, x0);                                                             \
        _mm512_storeu_ps(c_r + 16, x1);                                                        \
    } while (0)
/* The tile's two cache lines of row r, fetched while the FMAs run. */
#define ROW_PREFETCH(r)                                                                      \
    do {                                                                                       \
        _mm_prefetch((const char *)(c + (r) * ldc), _MM_HINT_T0);                              \
        _mm_prefetch((const char *)(c + (r) * ldc + 16), _MM_HINT_T0);                         \
    } while (0)
#define ALL_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define ALL_ROWS_STMT(X)                                                                     \
    X(0); X(1); X(2); X(3); X(4); X(5); X(6); X(7); X(8); X(9); X(10); X(11); X(12); X(13)

void attn_sgemm_avx512_14x32(size_t k, const float *a, const float *b, float *c, size_t ldc,
                             float alpha, float beta, const float *bias) {
    ALL_ROWS(ROW_DECL)
    ALL_ROWS_STMT(ROW_PREFETCH);
    for (size_t p = 0; p < k; p++) {
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
        /* B's and A's lines PREFETCH_STEPS steps on (past the panel: the
         * next call's B panel; a prefetch never faults) */
        _mm_prefetch((const char *)(b + PREFETCH_STEPS * NR), _MM_HINT_T0);
        _mm_prefetch((const char *)(b + PREFETCH_STEPS * NR + 16), _MM_HINT_T0);
        _mm_prefetch((const char *)(a + PREFETCH_STEPS * MR), _MM_HINT_T0);
        ALL_ROWS_STMT(ROW_FMA);
        a += MR;
        b += NR;
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __m512 bias0 = _mm512_setzero_ps(), bias1 = _mm512_setzero_ps(); /* used only with bias */
    if (bias) {
        bias0 = _mm512_loadu_ps(bias);
        bias1 = _mm512_loadu_ps(bias + 16);
    }
    ALL_ROWS_STMT(ROW_STORE);
}

/* ---- packing ------------------------------------------------------------ */

/* Strided packing, 16 steps of p at a time: vectors v < rows (<= 16) of a
 * panel of width floats are read 16 floats each, transposed, and step p is
 * stored at dst[p*width + offset], lanes [0, lanes). */
static void pack_transposed(size_t kc, size_t rows, const float *src, size_t ld, size_t width,
                            size_t offset, __mmask16 lanes, float *dst) {
    for (size_t p0 = 0; p0 < kc; p0 += 16) {
        size_t steps = kc - p0 < 16 ? kc - p0 : 16;
        __mmask16 in = (__mmask16)((1u << steps) - 1u);
        __m512 r[16];
        for (size_t i = 0; i < 16; i++)
            r[i] = i < rows ? _mm512_maskz_loadu_ps(in, src + i * ld + p0) : _mm512_setzero_ps();
        attn_transpose16(r);
        for (size_t p = 0; p < steps; p++)
            _mm512_mask_storeu_ps(dst + (p0 + p) * width + offset, lanes,
                                  r[attn_transpose16_order[p]]);
    }
}

static size_t min_len(size_t a, size_t b) { return a < b ? a : b; }

void attn_sgemm_avx512_14x32_pack_a(size_t kc, size_t rows, const float *src, size_t ld,
                                    bool trans, float *dst) {
    if (trans) {
        attn_gemm_pack_block(kc, rows, src, ld, true, MR, dst);
        return;
    }
    for (size_t q = 0; q * MR < rows; q++)
        pack_transposed(kc, min_len(MR, rows - q * MR), src + q * MR * ld, ld, MR, 0,
                        (__mmask16)((1u << MR) - 1u), dst + q * kc * MR);
}

void attn_sgemm_avx512_14x32_pack_b(size_t kc, size_t cols, const float *src, size_t ld,
                                    bool trans, float *dst) {
    if (!trans) {
        attn_gemm_pack_block(kc, cols, src, ld, true, NR, dst);
        return;
    }
    for (size_t q = 0; q * NR < cols; q++) {
        size_t panel = min_len(NR, cols - q * NR);
        for (size_t half = 0; half < 2; half++) {
            size_t v0 = half * 16, n = panel > v0 ? min_len(16, panel - v0) : 0;
            pack_transposed(kc, n, src + (q * NR + v0) * ld, ld, NR, v0, 0xFFFF,
                            dst + q * kc * NR);
        }
    }
}
