/*
 * gemm16_ref.c — the 16-bit GEMM's reference kernel, the oracle the fast
 * ones are tested against: each element of C is the double sum of the
 * widened (exact) products, k ascending, rounded once to float.
 */
#include "kernels/gemm/gemm16.h"

#include "parallel.h"

/* A thread for at least this much work (2 flops a product). */
#define REF16_MIN_FLOPS_PER_THREAD ((size_t)1 << 22)

typedef struct ref16_job {
    attn_dtype dtype;
    bool trans_a, trans_b;
    size_t n, k, lda, ldb, ldc;
    double alpha, beta;
    const uint16_t *a, *b;
    float *c;
} ref16_job;

static void ref16_rows(void *arg, size_t row_begin, size_t row_end) {
    const ref16_job *g = arg;
    for (size_t i = row_begin; i < row_end; i++) {
        float *c_row = g->c + i * g->ldc;
        for (size_t j = 0; j < g->n; j++) {
            double sum = 0.0;
            for (size_t p = 0; p < g->k; p++) {
                uint16_t a_ip = g->trans_a ? g->a[p * g->lda + i] : g->a[i * g->lda + p];
                uint16_t b_pj = g->trans_b ? g->b[j * g->ldb + p] : g->b[p * g->ldb + j];
                sum += (double)attn_half_to_float(g->dtype, a_ip) *
                       (double)attn_half_to_float(g->dtype, b_pj);
            }
            double prior = g->beta == 0.0 ? 0.0 : g->beta * c_row[j];
            c_row[j] = (float)(g->alpha * sum + prior);
        }
    }
}

void attn_gemm16_ref(size_t threads, attn_dtype dtype, bool trans_a, bool trans_b, size_t m,
                     size_t n, size_t k, float alpha, const uint16_t *a, size_t lda,
                     const uint16_t *b, size_t ldb, float beta, float *c, size_t ldc) {
    ref16_job job = {dtype, trans_a, trans_b, n, k, lda, ldb, ldc, alpha, beta, a, b, c};
    size_t min_rows = REF16_MIN_FLOPS_PER_THREAD / (2 * k * n + 1) + 1;
    attn_parallel_for(threads, m, min_rows, ref16_rows, &job);
}
