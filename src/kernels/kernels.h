/*
 * kernels.h — the numeric kernels every module is built from.
 *
 * The reference kernels (ref.c) are the oracle: plain loops that accumulate
 * in double, so they sit closer to the exact result than PyTorch's float32
 * and any faster kernel is tested against them. Kernels take sizes and
 * strides, never module structs; they do not report errors (modules check
 * every argument first) and never allocate unless they say so.
 */
#ifndef ATTN_KERNELS_H
#define ATTN_KERNELS_H

#include "attn.h"

#include <stdbool.h>
#include <stddef.h>

struct attn_dropout_stream;

/* c (m, n) = a (m, k) @ b, b is (k, n) or, transposed, (n, k).
 * Rows of c are split over num_threads. */
void attn_ref_matmul(size_t num_threads, const float *a, const float *b, float *c, size_t m,
                     size_t k, size_t n, bool b_transposed);

/* y (rows, out) = x (rows, in) @ w^T (+ bias), w is (out, in). */
void attn_ref_linear(size_t num_threads, const float *x, const float *w, const float *bias,
                     float *y, size_t rows, size_t in, size_t out);

/* Row-wise softmax of x (rows, cols) into y (may alias). A row of all -inf
 * gives NaN, as in PyTorch. */
void attn_ref_softmax(const float *x, float *y, size_t rows, size_t cols);

/* (T, T) in place: entries j > i set to -inf. */
void attn_ref_mask_neg_inf(float *scores, size_t tokens);
/* (T, T) in place: entries j > i zeroed, each row divided by its sum. */
void attn_ref_mask_renormalize(float *weights, size_t tokens);

/*
 * Scaled dot-product attention over (B, H) heads, one query row at a time:
 * out = dropout(softmax(mask(q k^T * scale))) v, scores and weights held in
 * double. Element (b, t, h, d) of q, k, v lives at b*b_stride + t*t_stride +
 * h*h_stride + d; out uses its own strides. Dropout (when dropout is
 * non-NULL) is drawn over the (B, H, T, T) weights in row-major order, as
 * one PyTorch dropout call would.
 */
typedef struct attn_sdpa_args {
    size_t batch, heads, tokens, head_dim;
    const float *q, *k, *v;
    size_t b_stride, t_stride, h_stride;
    float *out;
    size_t out_b_stride, out_t_stride, out_h_stride;
    float scale;
    attn_mask_method mask; /* ignored unless causal */
    bool causal;
    struct attn_dropout_stream *dropout; /* NULL: no dropout */
    /* Optional (B, H, T, T) copies for tracing: scaled masked scores, and
     * weights after softmax/mask and after dropout. */
    float *trace_scores, *trace_weights, *trace_dropped;
} attn_sdpa_args;

/* row holds at least tokens doubles. */
void attn_ref_sdpa(const attn_sdpa_args *args, double *row);

#endif /* ATTN_KERNELS_H */
