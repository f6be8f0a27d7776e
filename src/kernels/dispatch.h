/*
 * dispatch.h — the kernels modules call: each picks, by the ctx's kernels,
 * the reference loops (ref.c, the oracle) or the fast kernels of an
 * instruction set. Same contract as the reference kernel of the same name
 * in kernels.h; fast kernels agree with it within the stated tolerance.
 */
#ifndef ATTN_DISPATCH_H
#define ATTN_DISPATCH_H

#include "internal.h"
#include "kernels/activation/activation.h"
#include "kernels/kernels.h"

/* c (m, n) = alpha op(a) @ op(b) + beta c (attn_gemm's contract). */
void attn_k_gemm(attn_ctx *ctx, bool trans_a, bool trans_b, size_t m, size_t n, size_t k,
                 float alpha, const float *a, size_t lda, const float *b, size_t ldb, float beta,
                 float *c, size_t ldc);
/* c (m, n) = a @ b (+ c when accumulate); b is (k, n), or (n, k) transposed. */
void attn_k_matmul(attn_ctx *ctx, const float *a, const float *b, float *c, size_t m,
                   size_t k, size_t n, bool b_transposed, bool accumulate);
/* c (m, n) += a^T @ b, a (k, m), b (k, n). */
void attn_k_matmul_tn_acc(attn_ctx *ctx, const float *a, const float *b, float *c,
                          size_t k, size_t m, size_t n);
/* y (rows, out) = x @ w^T (+ bias), and its backward (see kernels.h). */
void attn_k_linear(attn_ctx *ctx, const float *x, const float *w, const float *bias,
                   float *y, size_t rows, size_t in, size_t out);
/* The same for decoding: with fast kernels and at most ATTN_GEMV_MAX_ROWS
 * rows, matrix-vector products that read w once for all rows, the outputs
 * split over the ctx's threads (kernels/gemv/gemv.h); else attn_k_linear. */
void attn_k_linear_small(attn_ctx *ctx, const float *x, const float *w, const float *bias,
                         float *y, size_t rows, size_t in, size_t out);
/* Several of them on the same x (rows, in), in one parallel pass when the
 * matrix-vector kernels run them (Q, K and V; SwiGLU's fc1 and fc2): part
 * i computes y_i (rows, out_i) = x @ w_i^T (+ bias_i). */
typedef struct attn_k_linear_part {
    const float *w, *bias;
    float *y;
    size_t out;
} attn_k_linear_part;
void attn_k_linear_small_n(attn_ctx *ctx, const float *x, size_t rows, size_t in,
                           const attn_k_linear_part *parts, size_t n);
void attn_k_linear_backward(attn_ctx *ctx, const float *x, const float *w, const float *dy,
                            float *dx, bool accumulate_dx, float *dw, float *dbias, size_t rows,
                            size_t in, size_t out);

/* GELU (tanh form) on the ctx's vector kernels, over its threads
 * (kernels/activation/activation.h): y (n) = gelu(x), and dx (n) += dy
 * gelu'(x). false, having written nothing, where the ctx has none (the
 * caller runs the scalar layer). */
bool attn_k_gelu_tanh(attn_ctx *ctx, const float *x, float *y, size_t n);
bool attn_k_gelu_tanh_backward(attn_ctx *ctx, const float *x, const float *dy, float *dx,
                               size_t n);
/* The ctx's vector rows of the training cross-entropy, forward and
 * backward (kernels/activation/activation.h); NULL where it has none (the
 * layer's loops run). */
attn_crossentropy_row_fn *attn_k_crossentropy_row(const attn_ctx *ctx);
attn_crossentropy_backward_row_fn *attn_k_crossentropy_backward_row(const attn_ctx *ctx);

#endif /* ATTN_DISPATCH_H */
