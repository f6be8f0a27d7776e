/*
 * gemv_portable.c — the matrix-vector kernels in portable C (gemv.h's
 * contract), and the table of kernels.
 *
 * Four outputs at a time (four streams of W), two rows at a time: each
 * (row, output) pair keeps 8 partial sums, lane j summing the products at
 * i = j mod 8, added up at the end in a fixed tree; the tail of in past a
 * multiple of 8 is added last, in order. The compiler vectorises the lanes.
 * One body serves float, bf16 and f16 W: an element of W is widened to
 * float (exactly) where it is read, so the 16-bit kernels sum what the
 * float one sums on the widened W.
 */
#include "kernels/gemv/gemv.h"

#include "half.h"

#define LANES 8
#define OUTS 4

enum { W_F32, W_BF16, W_F16 };

/* Element idx of W as float. */
static inline float w_at(int kind, const void *w, size_t idx) {
    if (kind == W_BF16) return attn_bf16_to_float(((const uint16_t *)w)[idx]);
    if (kind == W_F16) return attn_f16_to_float(((const uint16_t *)w)[idx]);
    return ((const float *)w)[idx];
}

/* The 8 lanes of a partial sum, in a fixed pairwise order. */
static float lanes_sum(const float *l) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* Outputs [o, o + n) (n <= OUTS) for rows r0 .. r0 + nr - 1 (nr <= 2). */
static inline void tile(int kind, size_t nr, size_t n, size_t in, const float *x, const void *w,
                        const float *bias, float *y, size_t ldy, size_t o) {
    float acc[2][OUTS][LANES] = {{{0}}};
    size_t body = in - in % LANES;
    for (size_t i = 0; i < body; i += LANES)
        for (size_t r = 0; r < nr; r++)
            for (size_t k = 0; k < n; k++) {
                size_t wk = (o + k) * in + i;
                const float *xr = x + r * in + i;
                for (size_t j = 0; j < LANES; j++) acc[r][k][j] += xr[j] * w_at(kind, w, wk + j);
            }
    for (size_t r = 0; r < nr; r++)
        for (size_t k = 0; k < n; k++) {
            float s = lanes_sum(acc[r][k]);
            for (size_t i = body; i < in; i++) s += x[r * in + i] * w_at(kind, w, (o + k) * in + i);
            y[r * ldy + o + k] = bias ? s + bias[o + k] : s;
        }
}

static inline void gemv(int kind, size_t rows, size_t in, const float *x, const void *w,
                        const float *bias, float *y, size_t ldy, size_t o_begin, size_t o_end) {
    for (size_t o = o_begin; o < o_end; o += OUTS) {
        size_t n = o_end - o < OUTS ? o_end - o : OUTS;
        for (size_t r = 0; r < rows; r += 2)
            tile(kind, rows - r < 2 ? rows - r : 2, n, in, x + r * in, w, bias, y + r * ldy, ldy,
                 o);
    }
}

void attn_gemv_portable(size_t rows, size_t in, const float *x, const float *w, const float *bias,
                        float *y, size_t ldy, size_t o_begin, size_t o_end) {
    gemv(W_F32, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}

void attn_gemv_portable_bf16(size_t rows, size_t in, const float *x, const uint16_t *w,
                             const float *bias, float *y, size_t ldy, size_t o_begin,
                             size_t o_end) {
    gemv(W_BF16, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}

void attn_gemv_portable_f16(size_t rows, size_t in, const float *x, const uint16_t *w,
                            const float *bias, float *y, size_t ldy, size_t o_begin,
                            size_t o_end) {
    gemv(W_F16, rows, in, x, w, bias, y, ldy, o_begin, o_end);
}

void attn_widen_portable_bf16(const uint16_t *src, size_t n, float *dst) {
    for (size_t i = 0; i < n; i++) dst[i] = attn_bf16_to_float(src[i]);
}

void attn_widen_portable_f16(const uint16_t *src, size_t n, float *dst) {
    for (size_t i = 0; i < n; i++) dst[i] = attn_f16_to_float(src[i]);
}

const attn_gemv_kernel attn_gemv_kernel_portable = {
    "gemv_portable", ATTN_KERNELS_PORTABLE, attn_gemv_portable, attn_gemv_portable_bf16,
    attn_gemv_portable_f16, attn_widen_portable_bf16, attn_widen_portable_f16, NULL};
#if defined(ATTN_HAVE_X86_KERNELS)
const attn_gemv_kernel attn_gemv_kernel_avx2 = {
    "gemv_avx2", ATTN_KERNELS_AVX2, attn_gemv_avx2, attn_gemv_avx2_bf16, attn_gemv_avx2_f16,
    attn_widen_avx2_bf16, attn_widen_avx2_f16, NULL};
const attn_gemv_kernel attn_gemv_kernel_avx512 = {
    "gemv_avx512", ATTN_KERNELS_AVX512, attn_gemv_avx512, attn_gemv_avx512_bf16,
    attn_gemv_avx512_f16, attn_widen_avx512_bf16, attn_widen_avx512_f16, NULL};
const attn_gemv_kernel attn_gemv_kernel_avx512bf16 = {
    "gemv_avx512 / gemv_vdpbf16ps", ATTN_KERNELS_AVX512, attn_gemv_avx512,
    attn_gemv_avx512_bf16, attn_gemv_avx512_f16, attn_widen_avx512_bf16, attn_widen_avx512_f16,
    attn_gemv_avx512bf16_dot};
const attn_gemv_kernel attn_gemv_kernel_avx512_streamed = {
    "gemv_avx512_streamed", ATTN_KERNELS_AVX512, attn_gemv_avx512_streamed,
    attn_gemv_avx512_bf16_streamed, attn_gemv_avx512_f16_streamed, attn_widen_avx512_bf16,
    attn_widen_avx512_f16, NULL};
const attn_gemv_kernel attn_gemv_kernel_avx512bf16_streamed = {
    "gemv_avx512_streamed / gemv_vdpbf16ps_streamed", ATTN_KERNELS_AVX512,
    attn_gemv_avx512_streamed, attn_gemv_avx512_bf16_streamed, attn_gemv_avx512_f16_streamed,
    attn_widen_avx512_bf16, attn_widen_avx512_f16, attn_gemv_avx512bf16_dot_streamed};
#endif
