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

attn_status attn_gemm(attn_ctx *ctx, bool trans_a, bool trans_b, size_t m, size_t n, size_t k,
                      float alpha, const float *a, size_t lda, const float *b, size_t ldb,
                      float beta, float *c, size_t ldc) {
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (m == 0 || n == 0) return ATTN_OK;
    /* a and b are read only when there is something to sum */
    if ((k > 0 && (!a || !b)) || !c)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_gemm: %s is NULL",
                         !c ? "c" : !a ? "a" : "b");
    size_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
    size_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
    if (k > 0 && lda < a_cols)
        return attn_fail(ctx, ATTN_ERR_SHAPE, "attn_gemm: lda (%zu) is less than a's row (%zu)",
                         lda, a_cols);
    if (k > 0 && ldb < b_cols)
        return attn_fail(ctx, ATTN_ERR_SHAPE, "attn_gemm: ldb (%zu) is less than b's row (%zu)",
                         ldb, b_cols);
    if (ldc < n)
        return attn_fail(ctx, ATTN_ERR_SHAPE, "attn_gemm: ldc (%zu) is less than n (%zu)", ldc, n);
    /* the last element of each operand must be addressable */
    size_t end_a = 0, end_b = 0, end_c;
    if (k > 0 && (!attn_mul_size(a_rows - 1, lda, &end_a) || !attn_add_size(end_a, a_cols, &end_a) ||
                  !attn_floats_fit(end_a) || !attn_mul_size(b_rows - 1, ldb, &end_b) ||
                  !attn_add_size(end_b, b_cols, &end_b) || !attn_floats_fit(end_b)))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "attn_gemm: sizes m=%zu n=%zu k=%zu with lda=%zu ldb=%zu overflow size_t",
                         m, n, k, lda, ldb);
    if (!attn_mul_size(m - 1, ldc, &end_c) || !attn_add_size(end_c, n, &end_c) ||
        !attn_floats_fit(end_c))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "attn_gemm: sizes m=%zu n=%zu with ldc=%zu overflow size_t", m, n, ldc);
    if (alpha == 0.0f) { /* as BLAS: c = beta c, a and b unread (a NaN in them stays out) */
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < n; j++)
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return ATTN_OK;
    }
    attn_k_gemm(ctx, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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
