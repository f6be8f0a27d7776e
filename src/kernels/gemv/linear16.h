/*
 * linear16.h — the linear layers of a model whose weights are stored in 16
 * bits (bf16 or f16; attn_lm's weights_dtype): y = x W^T (+ bias) with x
 * and y float32, W (out, in) in nn.Linear's layout, float32 accumulation.
 *
 *   rows <= ATTN_GEMV_MAX_ROWS (decoding), on a fast kernel set: the set's
 *       16-bit matrix-vector kernel (gemv.h: W widened in registers), the
 *       outputs split over the ctx's threads as attn_k_linear_small_n's;
 *   more rows (a prompt): the SGEMM (gemm.h) with the float activations,
 *       W widened to float32 as its panels are packed (attn_sgemm_run_b16),
 *       so nothing is rounded but the sums (the alternative, the 16-bit
 *       GEMM, would round the activations to bf16); where that cannot run,
 *       panels of W widened whole, then the SGEMM;
 *   the reference set: the reference linear's double sums on the widened W.
 *
 * Each path is the float path of the same call on the widened W, bit for
 * bit: the kernels sum in the float kernels' order, and the SGEMM's sums
 * depend on k alone, not on which columns of C a call holds (gemm.h). A
 * model holding 16-bit weights gives the logits of the float32 model that
 * holds the same weights widened.
 */
#ifndef ATTN_LINEAR16_H
#define ATTN_LINEAR16_H

#include "internal.h"

#include <stddef.h>
#include <stdint.h>

/* One matrix of a call on a shared x: y (rows, out) = x @ w^T (+ bias). */
typedef struct attn_k_linear16_part {
    const uint16_t *w;
    const float *bias;
    float *y;
    size_t out;
} attn_k_linear16_part;

/* Floats of the panel buffer a call with this in (the widest in of a
 * model's calls) needs for more rows than the matrix-vector kernels take. */
size_t attn_k_linear16_panel_floats(size_t in);

/* The n parts (n <= 4) on x (rows, in), W in dtype (ATTN_DTYPE_BF16 or
 * ATTN_DTYPE_F16). panel: attn_k_linear16_panel_floats(in) floats, where
 * widened panels go when W cannot be widened as it is packed (the
 * reference set, no scratch for the SGEMM). Never fails: without the SGEMM's scratch it runs the reference
 * sums. */
void attn_k_linear16_n(attn_ctx *ctx, attn_dtype dtype, const float *x, size_t rows, size_t in,
                       const attn_k_linear16_part *parts, size_t n, float *panel);

/* attn_k_linear16_n on bf16 W with x's elements rounded to bf16 first
 * (nearest even): for more rows than the matrix-vector kernels take, the
 * 16-bit GEMM of the ctx's set (gemm16.h: vdpbf16ps or AMX where the CPU
 * has them, twice the float FMA's products a cycle), else the
 * matrix-vector kernels on the rounded rows (the set's bf16 products,
 * run_bf16_dot, where it has them). rounded: rows * in bf16 elements,
 * where the rounded rows go; panel as attn_k_linear16_n's. The float32
 * call on the rounded x and widened W, with the sums of another kernel
 * (its order, not its terms). */
void attn_k_linear16_bf16_n(attn_ctx *ctx, const float *x, size_t rows, size_t in,
                            const attn_k_linear16_part *parts, size_t n, uint16_t *rounded,
                            float *panel);

#endif /* ATTN_LINEAR16_H */
