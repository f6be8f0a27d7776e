/*
 * gemv_portable.c — the matrix-vector kernel in portable C (gemv.h's
 * contract), and the table of kernels.
 *
 * Four outputs at a time (four streams of W), two rows at a time: each
 * (row, output) pair keeps 8 partial sums, lane j summing the products at
 * i = j mod 8, added up at the end in a fixed tree; the tail of in past a
 * multiple of 8 is added last, in order. The compiler vectorises the lanes.
 */
#include "kernels/gemv/gemv.h"

#define LANES 8
#define OUTS 4

/* The 8 lanes of a partial sum, in a fixed pairwise order. */
static float lanes_sum(const float *l) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* Outputs [o, o + n) (n <= OUTS) for rows r0 .. r0 + nr - 1 (nr <= 2). */
static void tile(size_t nr, size_t n, size_t in, const float *x, const float *w,
                 const float *bias, float *y, size_t ldy, size_t o) {
    float acc[2][OUTS][LANES] = {{{0}}};
    size_t body = in - in % LANES;
    for (size_t i = 0; i < body; i += LANES)
        for (size_t r = 0; r < nr; r++)
            for (size_t k = 0; k < n; k++) {
                const float *wk = w + (o + k) * in + i, *xr = x + r * in + i;
                for (size_t j = 0; j < LANES; j++) acc[r][k][j] += xr[j] * wk[j];
            }
    for (size_t r = 0; r < nr; r++)
        for (size_t k = 0; k < n; k++) {
            float s = lanes_sum(acc[r][k]);
            for (size_t i = body; i < in; i++) s += x[r * in + i] * w[(o + k) * in + i];
            y[r * ldy + o + k] = bias ? s + bias[o + k] : s;
        }
}

void attn_gemv_portable(size_t rows, size_t in, const float *x, const float *w, const float *bias,
                        float *y, size_t ldy, size_t o_begin, size_t o_end) {
    for (size_t o = o_begin; o < o_end; o += OUTS) {
        size_t n = o_end - o < OUTS ? o_end - o : OUTS;
        for (size_t r = 0; r < rows; r += 2)
            tile(rows - r < 2 ? rows - r : 2, n, in, x + r * in, w, bias, y + r * ldy, ldy, o);
    }
}

const attn_gemv_kernel attn_gemv_kernel_portable = {"gemv_portable", ATTN_KERNELS_PORTABLE,
                                                    attn_gemv_portable};
#if defined(ATTN_HAVE_X86_KERNELS)
const attn_gemv_kernel attn_gemv_kernel_avx2 = {"gemv_avx2", ATTN_KERNELS_AVX2, attn_gemv_avx2};
const attn_gemv_kernel attn_gemv_kernel_avx512 = {"gemv_avx512", ATTN_KERNELS_AVX512,
                                                  attn_gemv_avx512};
#endif
