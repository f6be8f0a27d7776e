/*
 * dispatch.h — the kernels modules call: each picks, by the ctx's kernels,
 * the reference loops (ref.c, the oracle) or the fast kernels of an
 * instruction set. Same contract as the reference kernel of the same name
 * in kernels.h; fast kernels agree with it within the stated tolerance.
 */
#ifndef ATTN_DISPATCH_H
#define ATTN_DISPATCH_H

#include "internal.h"
#include "kernels/kernels.h"

/* Resolves requested (AUTO: the ATTN_KERNELS environment variable, else the
 * best the CPU runs) into kernels this CPU runs, or ATTN_ERR_INVALID. */
attn_status attn_kernels_resolve(attn_kernels requested, attn_kernels *out);

/* c (m, n) = a @ b (+ c when accumulate); b is (k, n), or (n, k) transposed. */
void attn_k_matmul(const attn_ctx *ctx, const float *a, const float *b, float *c, size_t m,
                   size_t k, size_t n, bool b_transposed, bool accumulate);
/* c (m, n) += a^T @ b, a (k, m), b (k, n). */
void attn_k_matmul_tn_acc(const attn_ctx *ctx, const float *a, const float *b, float *c,
                          size_t k, size_t m, size_t n);
/* y (rows, out) = x @ w^T (+ bias), and its backward (see kernels.h). */
void attn_k_linear(const attn_ctx *ctx, const float *x, const float *w, const float *bias,
                   float *y, size_t rows, size_t in, size_t out);
void attn_k_linear_backward(const attn_ctx *ctx, const float *x, const float *w, const float *dy,
                            float *dx, bool accumulate_dx, float *dw, float *dbias, size_t rows,
                            size_t in, size_t out);

#endif /* ATTN_DISPATCH_H */
