/*
 * bgemm_avx512bf16_14x32.c — the bf16 kernel set on avx512_bf16: a 14 x 32
 * tile of C in 28 zmm float accumulators, fed by vdpbf16ps.
 *
 * The panels hold bf16 pairs along k (gemm16.h, k_unit 2): a step is two
 * values of k. Per step the kernel loads the B micro-panel's 32 pairs (two
 * zmm) and, for each of the 14 rows, broadcasts the row's A pair (32 bits)
 * into two vdpbf16ps: 28 of them, each 32 products, twice the work of an
 * fp32 FMA at the same issue rate. Each lane computes, as the instruction
 * does, acc += a_odd * b_odd, then acc += a_even * b_even (products exact,
 * each sum rounded to nearest even), with bf16 denormals read as zero and
 * denormal results flushed.
 *
 * Compiled with -mavx512f -mavx512bw -mavx512bf16 (this file only) and run
 * only where the CPU has all three (gemm16_config.c).
 */
#include "kernels/gemm/gemm16.h"
#include "kernels/gemm/transpose16_avx512.h"

#include <immintrin.h>

#define MR 14
#define NR 32

/* The A pair of row r at step p: 32 bits, broadcast to every lane. */
static inline __m512bh pair_of(const uint16_t *a, int r) {
    uint32_t pair;
    memcpy(&pair, a + 2 * r, sizeof pair);
    return (__m512bh)_mm512_set1_epi32((int)pair);
}

#define ROW_DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps();
#define ROW_DOT(r)                                                                           \
    do {                                                                                       \
        __m512bh a_r = pair_of(a, r);                                                          \
        c##r##0 = _mm512_dpbf16_ps(c##r##0, a_r, b0);                                          \
        c##r##1 = _mm512_dpbf16_ps(c##r##1, a_r, b1);                                          \
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
#define ROW_PREFETCH(r)                                                                      \
    do {                                                                                       \
        _mm_prefetch((const char *)(c + (r) * ldc), _MM_HINT_T0);                              \
        _mm_prefetch((const char *)(c + (r) * ldc + 16), _MM_HINT_T0);                         \
    } while (0)
#define ALL_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define ALL_ROWS_STMT(X)                                                                     \
    X(0); X(1); X(2); X(3); X(4); X(5); X(6); X(7); X(8); X(9); X(10); X(11); X(12); X(13)

void attn_bgemm_avx512bf16_14x32(size_t steps, const void *a_panel, const void *b_panel,
                                 float *c, size_t ldc, float alpha, float beta) {
    const uint16_t *a = a_panel, *b = b_panel;
    ALL_ROWS(ROW_DECL)
    ALL_ROWS_STMT(ROW_PREFETCH);
    for (size_t p = 0; p < steps; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 32);
        ALL_ROWS_STMT(ROW_DOT);
        a += 2 * MR;
        b += 2 * NR;
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    ALL_ROWS_STMT(ROW_STORE);
}

/* ---- packing into pairs ------------------------------------------------------ */

static size_t min_len(size_t a, size_t b) { return a < b ? a : b; }

/* The first n bits set (n <= 32). */
static __mmask32 first_bits(size_t n) {
    return n >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1u);
}

/*
 * Vectors along the source's rows (A as is, B transposed): vector i's
 * elements k = 2s, 2s + 1 are adjacent, one 32-bit pair. Rows (<= 16) of a
 * panel of width floats-wide pairs are read 16 pairs at a time, transposed
 * as 32-bit words, and step s is stored at pairs[s*width + offset], lanes
 * [0, lanes). An odd kc leaves the last pair's high half zero.
 */
static void pack_pairs_strided(size_t kc, size_t rows, const uint16_t *src, size_t ld,
                               size_t width, size_t offset, __mmask16 lanes, uint32_t *pairs) {
    for (size_t k0 = 0; k0 < kc; k0 += 32) {
        size_t elements = kc - k0 < 32 ? kc - k0 : 32, steps = (elements + 1) / 2;
        __mmask32 in = first_bits(elements);
        __m512 r[16];
        for (size_t i = 0; i < 16; i++)
            r[i] = i < rows ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(in, src + i * ld + k0))
                            : _mm512_setzero_ps();
        attn_transpose16(r);
        for (size_t s = 0; s < steps; s++)
            _mm512_mask_storeu_ps(pairs + (k0 / 2 + s) * width + offset, lanes,
                                  r[attn_transpose16_order[s]]);
    }
}

/*
 * Vectors along the source's columns (A transposed, B as is): element
 * (v, k) at src[k*ld + v]. Rows k = 2s and 2s + 1 of the block are
 * interleaved 16 bits at a time into step s (a zero row past an odd kc).
 */
static void pack_pairs_contiguous(size_t kc, size_t len, const uint16_t *src, size_t ld,
                                  size_t width, uint32_t *pairs) {
    /* lane 2i takes element i of the even row, lane 2i + 1 that of the odd */
    __m512i low_half = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    __m512i high_half = _mm512_add_epi16(low_half, _mm512_set1_epi16(16));
    size_t steps = (kc + 1) / 2;
    for (size_t q = 0; q * width < len; q++) {
        size_t cols = min_len(width, len - q * width);
        uint32_t *panel = pairs + q * steps * width;
        for (size_t v0 = 0; v0 < cols; v0 += 32) {
            size_t n = min_len(32, cols - v0);
            __mmask32 in = first_bits(n);
            const uint16_t *s_col = src + q * width + v0;
            for (size_t s = 0; s < steps; s++) {
                __m512i even = _mm512_maskz_loadu_epi16(in, s_col + 2 * s * ld);
                __m512i odd = 2 * s + 1 < kc ? _mm512_maskz_loadu_epi16(in, s_col + (2 * s + 1) * ld)
                                             : _mm512_setzero_si512();
                uint32_t *d = panel + s * width + v0;
                size_t left = width - v0; /* pairs of the panel from v0 (zero padded) */
                __m512i lo = _mm512_permutex2var_epi16(even, low_half, odd);
                _mm512_mask_storeu_epi16(d, first_bits(2 * min_len(16, left)), lo);
                if (left > 16) {
                    __m512i hi = _mm512_permutex2var_epi16(even, high_half, odd);
                    _mm512_mask_storeu_epi16(d + 16, first_bits(2 * min_len(16, left - 16)), hi);
                }
            }
        }
    }
}

void attn_bgemm_avx512bf16_14x32_pack_a(attn_dtype dtype, size_t kc, size_t rows,
                                        const uint16_t *src, size_t ld, bool trans, void *dst) {
    (void)dtype; /* bf16 only */
    size_t steps = (kc + 1) / 2;
    uint32_t *pairs = dst;
    if (trans) {
        pack_pairs_contiguous(kc, rows, src, ld, MR, pairs);
        return;
    }
    for (size_t q = 0; q * MR < rows; q++)
        pack_pairs_strided(kc, min_len(MR, rows - q * MR), src + q * MR * ld, ld, MR, 0,
                           (__mmask16)((1u << MR) - 1u), pairs + q * steps * MR);
}

void attn_bgemm_avx512bf16_14x32_pack_b(attn_dtype dtype, size_t kc, size_t cols,
                                        const uint16_t *src, size_t ld, bool trans, void *dst) {
    (void)dtype;
    size_t steps = (kc + 1) / 2;
    uint32_t *pairs = dst;
    if (!trans) {
        pack_pairs_contiguous(kc, cols, src, ld, NR, pairs);
        return;
    }
    for (size_t q = 0; q * NR < cols; q++) {
        size_t panel = min_len(NR, cols - q * NR);
        for (size_t half = 0; half < 2; half++) {
            size_t v0 = half * 16, n = panel > v0 ? min_len(16, panel - v0) : 0;
            pack_pairs_strided(kc, n, src + (q * NR + v0) * ld, ld, NR, v0, 0xFFFF,
                               pairs + q * steps * NR);
        }
    }
}
