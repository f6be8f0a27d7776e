/* ops.c — the seeds' tensor steps as public functions, checked, over the
 * reference kernels. */
#include "internal.h"
#include "kernels/dispatch.h"

#include <math.h>

/* Validates that the m * k, k * n and m * n float arrays fit in size_t bytes. */
static attn_status check_sizes(attn_ctx *ctx, const char *fn, size_t m, size_t k, size_t n) {
    size_t mk, kn, mn;
    if (!attn_mul_size(m, k, &mk) || !attn_mul_size(k, n, &kn) || !attn_mul_size(m, n, &mn) ||
        !attn_floats_fit(mk) || !attn_floats_fit(kn) || !attn_floats_fit(mn))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: sizes m=%zu k=%zu n=%zu overflow size_t",
                         fn, m, k, n);
    return ATTN_OK;
}

attn_status attn_matmul(attn_ctx *ctx, const float *a, const float *b, float *c, size_t m,
                        size_t k, size_t n, bool b_transposed) {
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!a || !b || !c)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_matmul: %s is NULL",
                         !a ? "a" : !b ? "b" : "c");
    attn_status st = check_sizes(ctx, "attn_matmul", m, k, n);
    if (st != ATTN_OK) return st;
    attn_k_matmul(ctx, a, b, c, m, k, n, b_transposed, false);
    return ATTN_OK;
}

attn_status attn_softmax(attn_ctx *ctx, const float *x, float *y, size_t rows, size_t cols) {
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!x || !y) return attn_fail(ctx, ATTN_ERR_NULL, "attn_softmax: %s is NULL", !x ? "x" : "y");
    attn_status st = check_sizes(ctx, "attn_softmax", rows, cols, 1);
    if (st != ATTN_OK) return st;
    attn_ref_softmax(x, y, rows, cols);
    return ATTN_OK;
}

attn_status attn_linear(attn_ctx *ctx, const float *x, const float *weight, const float *bias,
                        float *y, size_t rows, size_t in_features, size_t out_features) {
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!x || !weight || !y)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_linear: %s is NULL",
                         !x ? "x" : !weight ? "weight" : "y");
    attn_status st = check_sizes(ctx, "attn_linear", rows, in_features, out_features);
    if (st != ATTN_OK) return st;
    attn_k_linear(ctx, x, weight, bias, y, rows, in_features, out_features);
    return ATTN_OK;
}

attn_status attn_mask_causal_neg_inf(attn_ctx *ctx, float *scores, size_t tokens) {
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!scores) return attn_fail(ctx, ATTN_ERR_NULL, "attn_mask_causal_neg_inf: scores is NULL");
    attn_status st = check_sizes(ctx, "attn_mask_causal_neg_inf", tokens, tokens, 1);
    if (st != ATTN_OK) return st;
    attn_ref_mask_neg_inf(scores, tokens);
    return ATTN_OK;
}

attn_status attn_mask_causal_renormalize(attn_ctx *ctx, float *weights, size_t tokens) {
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!weights)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_mask_causal_renormalize: weights is NULL");
    attn_status st = check_sizes(ctx, "attn_mask_causal_renormalize", tokens, tokens, 1);
    if (st != ATTN_OK) return st;
    attn_ref_mask_renormalize(weights, tokens);
    return ATTN_OK;
}
