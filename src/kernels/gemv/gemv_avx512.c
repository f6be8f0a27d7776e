/*
 * gemv_avx512.c — the matrix-vector kernels with AVX-512F (gemv.h's
 * contract). Rows of W up to ONE_ROW_IN elements are read one at a time
 * for two rows of x, 8 accumulators a row (row_2), or two at a time for
 * one row of x (row_pair, the same sums); longer ones four at a time, one
 * accumulator each (tile_4): which sums depends on in alone. The
 * tail of in past a multiple of 16 is one masked step of the same loop,
 * so every sum is 16 lanes reduced in a fixed order. One
 * body serves float, bf16 and f16 W: 16-bit elements are widened in
 * registers (bf16 by a shift, f16 by vcvtph2ps), exactly, and multiplied
 * in float, so the sums are the float kernel's on the widened W (vdpbf16ps
 * would round x to bf16: not the float sums). Compiled with -mavx512f
 * -mfma (this file only); run only where the CPU has AVX-512F (dispatch.c).
 *
 * For one row of x (a token's step) two readings of W give the same sums:
 * paired (row_pair, tile_4) reads several rows side by side and asks for
 * them into L1 ahead, which Intel's cores want; streamed reads a short row
 * start to end alone and long rows two (float: four) side by side, asked
 * for into L2 well ahead, which AMD's want: their prefetchers follow one
 * stream, and x, no longer in L1 beside long rows, is best loaded once for
 * two or four (docs/tuning.md has the measurements).
 */
#include "kernels/gemv/gemv.h"

#include <immintrin.h>
#include <string.h>

enum { W_F32, W_BF16, W_F16 };

enum { READ_PAIRED, READ_STREAMED }; /* the readings above */

/* The longest rows of W (elements) read one at a time (row_2); longer
 * ones go four rows at a time (tile_4), x no longer fitting L1 beside
 * them. */
#define ONE_ROW_IN 2048

/* How far ahead (elements of W) tile_4 asks for its rows. */
#define TILE_AHEAD 1024

/* How far ahead (bytes) tile_streamed asks for its rows, into L2. */
#define STREAM_AHEAD 4096

/* n (<= 16) elements of W from element idx, as floats, zeros past n (k:
 * the mask of n lanes). 16-bit masked loads need AVX-512BW, which the set
 * does not assume: a short tail goes through a zeroed copy. */
static inline __m512 load16(int kind, __mmask16 k, size_t n, const void *w, size_t idx) {
    if (kind == W_F32) return _mm512_maskz_loadu_ps(k, (const float *)w + idx);
    const uint16_t *h = (const uint16_t *)w + idx;
    __m256i bits;
    if (n == 16) {
        bits = _mm256_loadu_si256((const __m256i *)(const void *)h);
    } else {
        uint16_t tail[16] = {0};
        memcpy(tail, h, n * sizeof *h);
        bits = _mm256_loadu_si256((const __m256i *)(const void *)tail);
    }
    if (kind == W_F16) return _mm512_cvtph_ps(bits);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

static inline float hsum(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float with_bias(float s, const float *bias, size_t o) {
    return bias ? s + bias[o] : s;
}

/* Bytes of one element of W. */
static inline size_t elem_bytes(int kind) { return kind == W_F32 ? 4 : 2; }

/* Asks for bytes [at, at + n) of each of rows rows of W from row (ahead,
 * row_bytes apart), into L1. */
static inline void ask_rows(const char *ahead, size_t rows, size_t row_bytes, size_t at,
                            size_t n) {
    for (size_t r = 0; r < rows; r++)
        for (size_t l = 0; l < n; l += 64) _mm_prefetch(ahead + r * row_bytes + at + l, _MM_HINT_T0);
}

/* Outputs o .. o + 3 for rows 0 and 1 (two is false: row 0 only). For
 * one row of x, each of the four rows of W is asked for TILE_AHEAD
 * elements ahead of its reads, 128 at a time: the prefetchers stop at each
 * row's pages and the four streams alone leave the memory idle between
 * them. Past a row's end that is the next row's start (the rows lie end
 * to end), and the next tile's where more (it exists), up to one row
 * past. */
static inline void tile_4(int kind, size_t in, const float *x, const void *w, const float *bias,
                          float *y, size_t ldy, size_t o, int two, int more) {
    size_t w0 = o * in, w1 = w0 + in, w2 = w1 + in, w3 = w2 + in, eb = elem_bytes(kind);
    const float *x0 = x, *x1 = two ? x + in : x;
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    for (size_t i = 0; i < in; i += 16) {
        if (!two && i % 128 == 0 && i + TILE_AHEAD + 128 <= (more ? 2 * in : in))
            ask_rows((const char *)w + w0 * eb, 4, in * eb, (i + TILE_AHEAD) * eb, 128 * eb);
        size_t n = in - i >= 16 ? 16 : in - i;
        __mmask16 k = n == 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
        __m512 b0 = load16(kind, k, n, w, w0 + i), b1 = load16(kind, k, n, w, w1 + i);
        __m512 b2 = load16(kind, k, n, w, w2 + i), b3 = load16(kind, k, n, w, w3 + i);
        __m512 v0 = _mm512_maskz_loadu_ps(k, x0 + i);
        a00 = _mm512_fmadd_ps(v0, b0, a00);
        a01 = _mm512_fmadd_ps(v0, b1, a01);
        a02 = _mm512_fmadd_ps(v0, b2, a02);
        a03 = _mm512_fmadd_ps(v0, b3, a03);
        if (two) {
            __m512 v1 = _mm512_maskz_loadu_ps(k, x1 + i);
            a10 = _mm512_fmadd_ps(v1, b0, a10);
            a11 = _mm512_fmadd_ps(v1, b1, a11);
            a12 = _mm512_fmadd_ps(v1, b2, a12);
            a13 = _mm512_fmadd_ps(v1, b3, a13);
        }
    }
    y[o] = with_bias(hsum(a00), bias, o);
    y[o + 1] = with_bias(hsum(a01), bias, o + 1);
    y[o + 2] = with_bias(hsum(a02), bias, o + 2);
    y[o + 3] = with_bias(hsum(a03), bias, o + 3);
    if (two) {
        y[ldy + o] = with_bias(hsum(a10), bias, o);
        y[ldy + o + 1] = with_bias(hsum(a11), bias, o + 1);
        y[ldy + o + 2] = with_bias(hsum(a12), bias, o + 2);
        y[ldy + o + 3] = with_bias(hsum(a13), bias, o + 3);
    }
}

/* Outputs o .. o + side - 1 (side 2 or 4) for one row of x where W's rows
 * are long, read streamed: tile_4's sums (one accumulator a row, the same
 * bits), the rows side by side, x loaded once for them, each asked for
 * into L2 STREAM_AHEAD bytes ahead of its reads, short of byte end of W
 * (the end of the rows the call reads). Past a row's end each stream goes
 * on into the row the next tile reads in its place (o + side + r for row
 * o + r), so that none of the next tile's rows starts cold: the next row
 * in memory is one this tile reads already. */
static inline void tile_streamed(int kind, int side, size_t in, const float *x, const void *w,
                                 const float *bias, float *y, size_t o, size_t end) {
    size_t eb = elem_bytes(kind), w0 = o * in, row_bytes = in * eb;
    __m512 a[4];
    for (int r = 0; r < side; r++) a[r] = _mm512_setzero_ps();
    for (size_t i = 0; i < in; i += 16) {
        size_t at = i * eb + STREAM_AHEAD; /* within a row, or past its end */
        if (i * eb % 64 == 0) {            /* once a line */
            size_t ask = at < row_bytes ? w0 * eb + at : (w0 + side * in) * eb + (at - row_bytes);
            for (int r = 0; r < side; r++, ask += row_bytes)
                if (ask < end) _mm_prefetch((const char *)w + ask, _MM_HINT_T2);
        }
        size_t n = in - i >= 16 ? 16 : in - i;
        __mmask16 k = n == 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        for (int r = 0; r < side; r++)
            a[r] = _mm512_fmadd_ps(v, load16(kind, k, n, w, w0 + (size_t)r * in + i), a[r]);
    }
    for (int r = 0; r < side; r++) y[o + r] = with_bias(hsum(a[r]), bias, o + r);
}

/*
 * Outputs o of rows r0 and r0 + 1 (two is false: r0 only) where W's rows
 * are short (in <= ONE_ROW_IN): W's row o is read start to end, 128
 * elements at a time into 8 accumulators (16-element chunk c goes to
 * accumulator c % 8, the tail's chunks too), which are then added in
 * order and reduced; x stays in L1 beside W's row.
 */
static inline void row_2(int kind, size_t in, const float *x, const void *w, const float *bias,
                         float *y, size_t ldy, size_t o, int two) {
    const float *x0 = x, *x1 = two ? x + in : x;
    size_t wo = o * in, i = 0;
    __m512 a[8], b[8];
    for (int c = 0; c < 8; c++) a[c] = b[c] = _mm512_setzero_ps();
    for (; i + 128 <= in; i += 128)
        for (int c = 0; c < 8; c++) {
            __m512 wv = load16(kind, (__mmask16)0xffff, 16, w, wo + i + 16 * (size_t)c);
            a[c] = _mm512_fmadd_ps(_mm512_loadu_ps(x0 + i + 16 * (size_t)c), wv, a[c]);
            if (two) b[c] = _mm512_fmadd_ps(_mm512_loadu_ps(x1 + i + 16 * (size_t)c), wv, b[c]);
        }
    for (int c = 0; i < in; i += 16, c++) {
        size_t n = in - i >= 16 ? 16 : in - i;
        __mmask16 k = n == 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
        __m512 wv = load16(kind, k, n, w, wo + i);
        a[c] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, x0 + i), wv, a[c]);
        if (two) b[c] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, x1 + i), wv, b[c]);
    }
    __m512 sa = a[0], sb = b[0];
    for (int c = 1; c < 8; c++) {
        sa = _mm512_add_ps(sa, a[c]);
        if (two) sb = _mm512_add_ps(sb, b[c]);
    }
    y[o] = with_bias(hsum(sa), bias, o);
    if (two) y[ldy + o] = with_bias(hsum(sb), bias, o);
}

/*
 * Outputs o and o + 1 of one row of x, where W's rows are short: row_2's
 * sums (8 accumulators a row, chunk c into accumulator c % 8, then added
 * in order: the same bits), the two rows of W read side by side, 128
 * elements of each in turn, while the next two rows (ahead, NULL: none)
 * are asked for at the same place. One row read alone is one stream that
 * the prefetchers restart at each page and follow only so far ahead; four
 * rows in flight keep the memory busier.
 */
static inline void row_pair(int kind, size_t in, const float *x, const void *w, const float *bias,
                            float *y, size_t o, const char *ahead) {
    size_t wa = o * in, wb = wa + in, i = 0, eb = elem_bytes(kind);
    __m512 a[8], b[8];
    for (int c = 0; c < 8; c++) a[c] = b[c] = _mm512_setzero_ps();
    for (; i + 128 <= in; i += 128) {
        if (ahead) ask_rows(ahead, 2, in * eb, i * eb, 128 * eb);
        for (int c = 0; c < 8; c++)
            a[c] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * (size_t)c),
                                   load16(kind, (__mmask16)0xffff, 16, w, wa + i + 16 * (size_t)c),
                                   a[c]);
        for (int c = 0; c < 8; c++)
            b[c] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * (size_t)c),
                                   load16(kind, (__mmask16)0xffff, 16, w, wb + i + 16 * (size_t)c),
                                   b[c]);
    }
    for (int c = 0; i < in; i += 16, c++) {
        size_t n = in - i >= 16 ? 16 : in - i;
        __mmask16 k = n == 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
        __m512 xv = _mm512_maskz_loadu_ps(k, x + i);
        a[c] = _mm512_fmadd_ps(xv, load16(kind, k, n, w, wa + i), a[c]);
        b[c] = _mm512_fmadd_ps(xv, load16(kind, k, n, w, wb + i), b[c]);
    }
    __m512 sa = a[0], sb = b[0];
    for (int c = 1; c < 8; c++) {
        sa = _mm512_add_ps(sa, a[c]);
        sb = _mm512_add_ps(sb, b[c]);
    }
    y[o] = with_bias(hsum(sa), bias, o);
    y[o + 1] = with_bias(hsum(sb), bias, o + 1);
}

static inline float dot1(int kind, size_t in, const float *x, const void *w, size_t wo,
                         const float *bias, size_t o) {
    __m512 a = _mm512_setzero_ps();
    for (size_t i = 0; i < in; i += 16) {
        size_t n = in - i >= 16 ? 16 : in - i;
        __mmask16 k = n == 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
        a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, x + i), load16(kind, k, n, w, wo + i), a);
    }
    return with_bias(hsum(a), bias, o);
}

static inline void gemv(int kind, int read, size_t rows, size_t in, const float *x,
                        const void *w, const float *bias, float *y, size_t ldy, size_t o_begin,
                        size_t o_end) {
    if (in <= ONE_ROW_IN) {
        size_t o = o_begin;
        if (rows == 1 && read == READ_PAIRED) /* a token's step: W's rows two at a time */
            for (; o + 2 <= o_end; o += 2)
                row_pair(kind, in, x, w, bias, y, o,
                         o + 4 <= o_end ? (const char *)w + (o + 2) * in * elem_bytes(kind)
                                        : NULL);
        for (; o < o_end; o++)
            for (size_t r = 0; r < rows; r += 2) {
                if (r + 1 < rows)
                    row_2(kind, in, x + r * in, w, bias, y + r * ldy, ldy, o, 1);
                else
                    row_2(kind, in, x + r * in, w, bias, y + r * ldy, ldy, o, 0);
            }
        return;
    }
    size_t o = o_begin;
    /* float rows four side by side, x loaded once for four: 16-bit ones
     * measure faster two side by side */
    if (rows == 1 && read == READ_STREAMED && kind == W_F32)
        for (; o + 4 <= o_end; o += 4)
            tile_streamed(kind, 4, in, x, w, bias, y, o, o_end * in * elem_bytes(kind));
    if (rows == 1 && read == READ_STREAMED)
        for (; o + 2 <= o_end; o += 2)
            tile_streamed(kind, 2, in, x, w, bias, y, o, o_end * in * elem_bytes(kind));
    for (; o + 4 <= o_end; o += 4)
        for (size_t r = 0; r < rows; r += 2) {
            /* constant arguments: the one-row tile is compiled apart */
            if (r + 1 < rows)
                tile_4(kind, in, x + r * in, w, bias, y + r * ldy, ldy, o, 1, 0);
            else
                tile_4(kind, in, x + r * in, w, bias, y + r * ldy, ldy, o, 0, o + 8 <= o_end);
        }
    for (; o < o_end; o++)
        for (size_t r = 0; r < rows; r++)
            y[r * ldy + o] = dot1(kind, in, x + r * in, w, o * in, bias, o);
}

void attn_gemv_avx512(size_t rows, size_t in, const float *x, const float *w, const float *bias,
                      float *y, size_t ldy, size_t o_begin, size_t o_end) {
    gemv(W_F32, READ_PAIRED, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}

void attn_gemv_avx512_bf16(size_t rows, size_t in, const float *x, const uint16_t *w,
                           const float *bias, float *y, size_t ldy, size_t o_begin,
                           size_t o_end) {
    gemv(W_BF16, READ_PAIRED, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}

void attn_gemv_avx512_f16(size_t rows, size_t in, const float *x, const uint16_t *w,
                          const float *bias, float *y, size_t ldy, size_t o_begin,
                          size_t o_end) {
    gemv(W_F16, READ_PAIRED, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}

void attn_gemv_avx512_streamed(size_t rows, size_t in, const float *x, const float *w,
                               const float *bias, float *y, size_t ldy, size_t o_begin,
                               size_t o_end) {
    gemv(W_F32, READ_STREAMED, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}

void attn_gemv_avx512_bf16_streamed(size_t rows, size_t in, const float *x, const uint16_t *w,
                                    const float *bias, float *y, size_t ldy, size_t o_begin,
                                    size_t o_end) {
    gemv(W_BF16, READ_STREAMED, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}

void attn_gemv_avx512_f16_streamed(size_t rows, size_t in, const float *x, const uint16_t *w,
                                   const float *bias, float *y, size_t ldy, size_t o_begin,
                                   size_t o_end) {
    gemv(W_F16, READ_STREAMED, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}

void attn_widen_avx512_bf16(const uint16_t *src, size_t n, float *dst) {
    for (size_t i = 0; i < n; i += 16) {
        size_t c = n - i >= 16 ? 16 : n - i;
        __mmask16 k = c == 16 ? (__mmask16)0xffff : (__mmask16)((1u << c) - 1);
        _mm512_mask_storeu_ps(dst + i, k, load16(W_BF16, k, c, src, i));
    }
}

void attn_widen_avx512_f16(const uint16_t *src, size_t n, float *dst) {
    for (size_t i = 0; i < n; i += 16) {
        size_t c = n - i >= 16 ? 16 : n - i;
        __mmask16 k = c == 16 ? (__mmask16)0xffff : (__mmask16)((1u << c) - 1);
        _mm512_mask_storeu_ps(dst + i, k, load16(W_F16, k, c, src, i));
    }
}
