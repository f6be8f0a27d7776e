/*
 * gemv_avx512bf16.c — the matrix-vector product of bf16 rows of x and bf16
 * W on vdpbf16ps (gemv.h: attn_gemv_bf16_dot_fn), for a model whose linear
 * layers round their inputs to bf16 (attn_lm_set_matmul_dtype). Each
 * vdpbf16ps multiplies 32 pairs of bf16 values, exactly, and adds them
 * pairwise into 16 float lanes: one instruction per 32 weights, where
 * widening the weights for float FMAs takes six, which counts when two
 * threads share the memory's bandwidth.
 *
 * W's row o is read start to end, 256 elements at a time into 8
 * accumulators (32-element chunk c goes to accumulator c % 8, the tail's
 * masked chunks too), added in order and reduced; the order depends on in
 * alone. For one row of x, W's rows are read paired or streamed, as
 * gemv_avx512.c's are (row_pair, gemv). x's rows (at most
 * ATTN_GEMV_MAX_ROWS, in bf16: 16 KiB a row at in 8192) stay in L1 and L2
 * beside the stream of W. vdpbf16ps treats subnormal inputs and results
 * as zero.
 *
 * Compiled with -mavx512f -mavx512bw -mavx512bf16 (this file only); run
 * only where the CPU has them (kernels/kernel_set.c).
 */
#include "kernels/gemv/gemv.h"

#include <immintrin.h>
#include <stdbool.h>

static inline __m512bh load_bf16(const uint16_t *p, __mmask32 k) {
    return (__m512bh)_mm512_maskz_loadu_epi16(k, p);
}

static inline float with_bias(float s, const float *bias, size_t o) {
    return bias ? s + bias[o] : s;
}

/* Output o of rows r0 and r0 + 1 of x (two is false: r0 only). */
static inline void row_2(size_t in, const uint16_t *x, const uint16_t *w, const float *bias,
                         float *y, size_t ldy, size_t o, int two) {
    const uint16_t *x0 = x, *x1 = two ? x + in : x, *wo = w + o * in;
    __m512 a[8], b[8];
    for (int c = 0; c < 8; c++) a[c] = b[c] = _mm512_setzero_ps();
    size_t i = 0;
    const __mmask32 all = 0xffffffffu;
    for (; i + 256 <= in; i += 256)
        for (int c = 0; c < 8; c++) {
            size_t at = i + 32 * (size_t)c;
            __m512bh wv = load_bf16(wo + at, all);
            a[c] = _mm512_dpbf16_ps(a[c], load_bf16(x0 + at, all), wv);
            if (two) b[c] = _mm512_dpbf16_ps(b[c], load_bf16(x1 + at, all), wv);
        }
    for (int c = 0; i < in; i += 32, c++) {
        size_t n = in - i >= 32 ? 32 : in - i;
        __mmask32 k = n == 32 ? all : (__mmask32)((1u << n) - 1);
        __m512bh wv = load_bf16(wo + i, k);
        a[c] = _mm512_dpbf16_ps(a[c], load_bf16(x0 + i, k), wv);
        if (two) b[c] = _mm512_dpbf16_ps(b[c], load_bf16(x1 + i, k), wv);
    }
    __m512 sa = a[0], sb = b[0];
    for (int c = 1; c < 8; c++) {
        sa = _mm512_add_ps(sa, a[c]);
        if (two) sb = _mm512_add_ps(sb, b[c]);
    }
    y[o] = with_bias(_mm512_reduce_add_ps(sa), bias, o);
    if (two) y[ldy + o] = with_bias(_mm512_reduce_add_ps(sb), bias, o);
}

/* The longest rows a streamed reading takes one at a time: longer ones
 * go two side by side, loading x once for both (x no longer fits L1
 * beside them), each asked for into L2 STREAM_AHEAD bytes ahead. */
#define ONE_ROW_IN 2048
#define STREAM_AHEAD 4096

/* Outputs o and o + 1 of one row of x: row_2's sums (the same bits), the
 * two rows of W read side by side, 256 elements of each in turn. Paired
 * (gemv_avx512.c's readings), the next two rows (ahead, NULL: none) are
 * asked for into L1 at the same place: one row read alone is one stream
 * that Intel's prefetchers restart at each page and follow only so far
 * ahead, and four rows in flight keep the memory busier. Streamed (ahead
 * NULL, end not 0), the two rows themselves are asked for into L2
 * STREAM_AHEAD bytes ahead, short of element end of W (the end of the
 * rows the call reads), each stream going on past its row's end into the
 * row the next pair reads in its place (o + 2, o + 3), as gemv_avx512.c's
 * tile_streamed does. */
static inline void row_pair(size_t in, const uint16_t *x, const uint16_t *w, const float *bias,
                            float *y, size_t o, const uint16_t *ahead, size_t end) {
    const uint16_t *wa = w + o * in, *wb = wa + in;
    __m512 a[8], b[8];
    for (int c = 0; c < 8; c++) a[c] = b[c] = _mm512_setzero_ps();
    size_t i = 0;
    const __mmask32 all = 0xffffffffu;
    const size_t far = STREAM_AHEAD / sizeof *w;
    for (; i + 256 <= in; i += 256) {
        if (ahead)
            for (size_t l = 0; l < 256; l += 32) {
                _mm_prefetch((const char *)(ahead + i + l), _MM_HINT_T0);
                _mm_prefetch((const char *)(ahead + in + i + l), _MM_HINT_T0);
            }
        for (size_t l = 0; end && l < 256; l += 32) {
            size_t at = i + l + far; /* within a row, or past its end */
            size_t ask_a = at < in ? o * in + at : (o + 2) * in + (at - in), ask_b = ask_a + in;
            if (ask_a < end) _mm_prefetch((const char *)(w + ask_a), _MM_HINT_T2);
            if (ask_b < end) _mm_prefetch((const char *)(w + ask_b), _MM_HINT_T2);
        }
        for (int c = 0; c < 8; c++) {
            size_t at = i + 32 * (size_t)c;
            a[c] = _mm512_dpbf16_ps(a[c], load_bf16(x + at, all), load_bf16(wa + at, all));
        }
        for (int c = 0; c < 8; c++) {
            size_t at = i + 32 * (size_t)c;
            b[c] = _mm512_dpbf16_ps(b[c], load_bf16(x + at, all), load_bf16(wb + at, all));
        }
    }
    for (int c = 0; i < in; i += 32, c++) {
        size_t n = in - i >= 32 ? 32 : in - i;
        __mmask32 k = n == 32 ? all : (__mmask32)((1u << n) - 1);
        __m512bh xv = load_bf16(x + i, k);
        a[c] = _mm512_dpbf16_ps(a[c], xv, load_bf16(wa + i, k));
        b[c] = _mm512_dpbf16_ps(b[c], xv, load_bf16(wb + i, k));
    }
    __m512 sa = a[0], sb = b[0];
    for (int c = 1; c < 8; c++) {
        sa = _mm512_add_ps(sa, a[c]);
        sb = _mm512_add_ps(sb, b[c]);
    }
    y[o] = with_bias(_mm512_reduce_add_ps(sa), bias, o);
    y[o + 1] = with_bias(_mm512_reduce_add_ps(sb), bias, o + 1);
}

/* paired: one row of x reads W's rows two at a time (row_pair); streamed:
 * short ones one at a time, start to end, without requests, long ones two
 * at a time asked for into L2 (gemv_avx512.c's readings) */
static inline void gemv(bool paired, size_t rows, size_t in, const uint16_t *x,
                        const uint16_t *w, const float *bias, float *y, size_t ldy,
                        size_t o_begin, size_t o_end) {
    size_t o = o_begin;
    if (rows == 1 && paired) /* a token's step: W's rows two at a time */
        for (; o + 2 <= o_end; o += 2)
            row_pair(in, x, w, bias, y, o, o + 4 <= o_end ? w + (o + 2) * in : NULL, 0);
    if (rows == 1 && !paired && in > ONE_ROW_IN)
        for (; o + 2 <= o_end; o += 2) row_pair(in, x, w, bias, y, o, NULL, o_end * in);
    for (; o < o_end; o++)
        for (size_t r = 0; r < rows; r += 2) {
            /* constant arguments: the one-row body is compiled apart */
            if (r + 1 < rows)
                row_2(in, x + r * in, w, bias, y + r * ldy, ldy, o, 1);
            else
                row_2(in, x + r * in, w, bias, y + r * ldy, ldy, o, 0);
        }
}

void attn_gemv_avx512bf16_dot(size_t rows, size_t in, const uint16_t *x, const uint16_t *w,
                              const float *bias, float *y, size_t ldy, size_t o_begin,
                              size_t o_end) {
    gemv(true, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}

void attn_gemv_avx512bf16_dot_streamed(size_t rows, size_t in, const uint16_t *x,
                                       const uint16_t *w, const float *bias, float *y,
                                       size_t ldy, size_t o_begin, size_t o_end) {
    gemv(false, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}
