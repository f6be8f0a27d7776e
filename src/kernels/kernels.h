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
#include <stdint.h>

struct attn_dropout_stream;

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

/*
 * Scaled dot-product attention over (B, H) heads, one query row at a time:
 * out = dropout(softmax(mask(q k^T * scale))) v, scores and weights held in
 * double. q is (B, H, T, hd) and k, v are (B, H, S, hd), read through
 * strides: element (b, t, h, d) of q lives at b*b_stride + t*t_stride +
 * h*h_stride + d, of k and v at the kv_ strides; out (B, H, T, hd) uses its
 * own. The causal mask is aligned bottom-right: query i sees keys
 * j <= i + S - T (all of them in the last row); a row that sees no key
 * outputs zeros. Dropout (when dropout is non-NULL) is drawn over the
 * (B, H, T, S) weights in row-major order, as one PyTorch dropout call
 * would.
 */
typedef struct attn_sdpa_args {
    size_t batch, heads, tokens, head_dim;
    size_t kv_tokens; /* S */
    const float *q, *k, *v;
    size_t b_stride, t_stride, h_stride;
    size_t kv_b_stride, kv_t_stride, kv_h_stride;
    float *out;
    size_t out_b_stride, out_t_stride, out_h_stride;
    float *lse; /* optional (B, H, T): log-sum-exp of each row's scaled scores */
    float scale;
    attn_mask_method mask; /* ignored unless causal */
    bool causal;
    struct attn_dropout_stream *dropout; /* NULL: no dropout */
    /* Optional: one bit per (B, H, T, S) weight, set where dropout kept it
     * (zeroed by the caller), so the backward can replay the mask. */
    uint8_t *keep_bits;
    /* Optional (B, H, T, S) copies for tracing: scaled masked scores, and
     * weights after softmax/mask and after dropout. */
    float *trace_scores, *trace_weights, *trace_dropped;
} attn_sdpa_args;

/* Sets S = T and the k, v strides to q's: self-attention over one buffer
 * layout, as every module has. */
static inline void attn_sdpa_self(attn_sdpa_args *a) {
    a->kv_tokens = a->tokens;
    a->kv_b_stride = a->b_stride;
    a->kv_t_stride = a->t_stride;
    a->kv_h_stride = a->h_stride;
}

/* Whether query i of T is masked from key j of S (causal, bottom-right). */
static inline bool attn_causal_hides(size_t i, size_t j, size_t tokens, size_t kv_tokens) {
    return j + tokens > i + kv_tokens;
}

/* row holds at least kv_tokens doubles. */
void attn_ref_sdpa(const attn_sdpa_args *args, double *row);

/*
 * The backward of attn_ref_sdpa, by recomputation (no T x T buffer):
 *   dq (B, H, T, hd) and dk, dv (B, H, S, hd), laid out with the forward's
 *   q and kv strides, are overwritten from dout (the out strides) and the
 *   forward's q, k, v.
 * With dropout, keep_bits is the forward's mask and kept_scale its 1/(1-p).
 * Two passes, each parallel and each output written by one thread in a
 * fixed order, so the result is the same for any thread count:
 *   1. per query row i: P_i, dP_i = (dO_i . v_j) * drop_ij,
 *      delta_i = sum_j P_ij dP_ij, dS_ij = P_ij (dP_ij - delta_i),
 *      dq_i = scale sum_j dS_ij k_j; keeps lse_i and delta_i.
 *   2. per key row j: dv_j = sum_i P_ij drop_ij dO_i, dk_j = scale sum_i dS_ij q_i.
 * Sums run over masked entries too where PyTorch's matmuls do, so NaN in
 * dout spreads exactly as in autograd.
 */
typedef struct attn_sdpa_grad_args {
    const attn_sdpa_args *fwd; /* q, k, v, sizes, strides, scale, mask */
    const float *dout;         /* with fwd's out strides */
    float *dq, *dk, *dv;       /* dq with fwd's q strides, dk and dv with its kv strides */
    /* the forward's output (its out strides) and lse (B, H, T): read by the
     * fused backward, which rebuilds the weights from them */
    const float *out, *lse;
    /* The forward's dropout, if any: its mask as keep bits, or else its
     * Philox key (rng/philox.h). kept_scale = 1/(1-p). */
    const uint8_t *keep_bits;
    bool philox;
    uint64_t philox_seed, philox_offset, keep_threshold;
    float kept_scale;
    double *row_stats;         /* 2 * B * H * T doubles: lse and delta */
    double *workspace;         /* attn_sdpa_grad_workspace(S, hd) per part */
} attn_sdpa_grad_args;

/* Doubles of workspace each parallel part needs. */
size_t attn_sdpa_grad_workspace(size_t kv_tokens, size_t head_dim);
void attn_ref_sdpa_backward(size_t num_threads, const attn_sdpa_grad_args *args);

/* Bit i of a mask. */
static inline bool attn_bit(const uint8_t *bits, size_t i) { return (bits[i >> 3] >> (i & 7)) & 1u; }
static inline void attn_set_bit(uint8_t *bits, size_t i) { bits[i >> 3] |= (uint8_t)(1u << (i & 7)); }

#endif /* ATTN_KERNELS_H */
