/*
 * kernels.h — the numeric kernels every module is built from.
 *
 * The reference kernels (ref.c) are the oracle: plain loops that accumulate
 * in double, so they sit closer to the exact result than PyTorch's float32
 * and any faster kernel is tested against them. Kernels take sizes and
 * strides, never module structs; they do not report errors (modules check
 * every argument first) and never allocate unless they say so. Attention
 * itself is a backend of the attention contract (attention/attention.h):
 * its reference loops are attention/reference.c.
 */
#ifndef ATTN_KERNELS_H
#define ATTN_KERNELS_H

#include "attn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* c (m, n) = a (m, k) @ b, b is (k, n) or, transposed, (n, k).
 * Rows of c are split over num_threads. */
void attn_ref_matmul(size_t num_threads, const float *a, const float *b, float *c, size_t m,
                     size_t k, size_t n, bool b_transposed);

/* c (m, n) += a (m, k) @ b: attn_ref_matmul, added to c. */
void attn_ref_matmul_acc(size_t num_threads, const float *a, const float *b, float *c, size_t m,
                         size_t k, size_t n, bool b_transposed);
/* c (m, n) += a^T @ b for a (k, m) and b (k, n): the weight gradients. */
void attn_ref_matmul_tn_acc(size_t num_threads, const float *a, const float *b, float *c,
                            size_t k, size_t m, size_t n);

/* c (m, n) = alpha op(a) @ op(b) + beta c with row strides lda, ldb, ldc
 * (op: transposed when trans_a / trans_b), summed in double and rounded
 * once; beta == 0 never reads c. Rows of c are split over num_threads. */
void attn_ref_gemm(size_t num_threads, bool trans_a, bool trans_b, size_t m, size_t n, size_t k,
                   float alpha, const float *a, size_t lda, const float *b, size_t ldb,
                   float beta, float *c, size_t ldc);

/* y (rows, out) = x (rows, in) @ w^T (+ bias), w is (out, in). */
void attn_ref_linear(size_t num_threads, const float *x, const float *w, const float *bias,
                     float *y, size_t rows, size_t in, size_t out);
/* Its backward, given dy (rows, out):
 *   dx (rows, in) = dy @ w, or dx += dy @ w when accumulate_dx (dx may be NULL)
 *   dw (out, in) += dy^T @ x
 *   dbias (out)  += dy summed over rows (dbias may be NULL) */
void attn_ref_linear_backward(size_t num_threads, const float *x, const float *w, const float *dy,
                              float *dx, bool accumulate_dx, float *dw, float *dbias, size_t rows,
                              size_t in, size_t out);

/* Row-wise softmax of x (rows, cols) into y (may alias). A row of all -inf
 * gives NaN, as in PyTorch. */
void attn_ref_softmax(const float *x, float *y, size_t rows, size_t cols);

/* (T, T) in place: entries j > i set to -inf. */
void attn_ref_mask_neg_inf(float *scores, size_t tokens);
/* (T, T) in place: entries j > i zeroed, each row divided by its sum. */
void attn_ref_mask_renormalize(float *weights, size_t tokens);

/* Bit i of a mask. */
static inline bool attn_bit(const uint8_t *bits, size_t i) { return (bits[i >> 3] >> (i & 7)) & 1u; }
static inline void attn_set_bit(uint8_t *bits, size_t i) { bits[i >> 3] |= (uint8_t)(1u << (i & 7)); }

#endif /* ATTN_KERNELS_H */
