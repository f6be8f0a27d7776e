/*
 * gemm16.c — attn_gemm_16: BLAS's sgemm, row-major, on 16-bit a and b (bf16
 * or f16, raw bits) with c in float. Checks the arguments as attn_gemm
 * does, then runs the ctx's 16-bit kernels (kernels/gemm/gemm16.h) on its
 * threads and scratch memory, or the reference kernel when the ctx asks
 * for it or the scratch cannot grow (the reference needs no memory).
 */
#include "internal.h"
#include "kernels/gemm/gemm16.h"
#include "kernels/kernel_set.h"

/* The last element of an operand of rows x cols at stride ld lies within
 * the address space (in 16-bit elements, or floats for c). */
static bool operand_fits(size_t rows, size_t cols, size_t ld, size_t elem) {
    size_t end, bytes;
    return attn_mul_size(rows - 1, ld, &end) && attn_add_size(end, cols, &end) &&
           attn_mul_size(end, elem, &bytes);
}

attn_status attn_gemm_16(attn_ctx *ctx, attn_dtype dtype, bool trans_a, bool trans_b, size_t m,
                         size_t n, size_t k, float alpha, const void *a, size_t lda,
                         const void *b, size_t ldb, float beta, float *c, size_t ldc) {
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (dtype != ATTN_DTYPE_BF16 && dtype != ATTN_DTYPE_F16)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_gemm_16: dtype %s (%d) is not BF16 or F16", attn_dtype_name(dtype),
                         (int)dtype);
    if (m == 0 || n == 0) return ATTN_OK;
    /* a and b are read only when there is something to sum */
    if ((k > 0 && (!a || !b)) || !c)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_gemm_16: %s is NULL",
                         !c ? "c" : !a ? "a" : "b");
    size_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
    size_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
    if (k > 0 && lda < a_cols)
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "attn_gemm_16: lda (%zu) is less than a's row (%zu)", lda, a_cols);
    if (k > 0 && ldb < b_cols)
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "attn_gemm_16: ldb (%zu) is less than b's row (%zu)", ldb, b_cols);
    if (ldc < n)
        return attn_fail(ctx, ATTN_ERR_SHAPE, "attn_gemm_16: ldc (%zu) is less than n (%zu)",
                         ldc, n);
    if (k > 0 && (!operand_fits(a_rows, a_cols, lda, sizeof(uint16_t)) ||
                  !operand_fits(b_rows, b_cols, ldb, sizeof(uint16_t))))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "attn_gemm_16: sizes m=%zu n=%zu k=%zu with lda=%zu ldb=%zu overflow "
                         "size_t", m, n, k, lda, ldb);
    if (!operand_fits(m, n, ldc, sizeof(float)))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "attn_gemm_16: sizes m=%zu n=%zu with ldc=%zu overflow size_t", m, n, ldc);

    if (k == 0 || alpha == 0.0f) {
        /* alpha times an empty sum, or alpha 0: c = beta c, as BLAS and
         * attn_gemm (a and b unread: a NaN or inf in them stays out) */
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < n; j++)
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return ATTN_OK;
    }
    const attn_gemm16_kernel *uk = attn_kernel_set_gemm16(&ctx->ks, dtype, attn_ctx_amx_usable(ctx));
    if (uk) {
        size_t bytes = attn_gemm16_workspace(uk, ctx->num_threads, m, n, k);
        void *ws = bytes ? attn_ctx_scratch(ctx, bytes) : NULL;
        if (ws) {
            attn_gemm16_run(uk, attn_ctx_workers(ctx), dtype, trans_a, trans_b, m, n, k, alpha, a,
                            lda, b, ldb, beta, c, ldc, ws);
            return ATTN_OK;
        }
    }
    attn_gemm16_ref(ctx->num_threads, dtype, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                    beta, c, ldc);
    return ATTN_OK;
}
