/*
 * ref.c — reference kernels: the plain, materialised path that stays as the
 * oracle for every faster kernel. Dot products accumulate in double.
 */
#include "kernels/kernels.h"

#include "parallel.h"

#include <math.h>
#include <string.h>

/* Rows of c per thread below which starting a thread costs more than it saves. */
#define MATMUL_MIN_FLOPS_PER_THREAD (1u << 18)

/* Columns accumulated at once in double on the stack by the row kernels. */
#define ROW_CHUNK 256

typedef struct matmul_job {
    const float *a, *b;
    float *c;
    size_t k, n;
    bool b_transposed, accumulate;
} matmul_job;

static void matmul_rows(void *arg, size_t row_begin, size_t row_end) {
    const matmul_job *job = arg;
    size_t k = job->k, n = job->n;
    double acc[ROW_CHUNK];
    for (size_t i = row_begin; i < row_end; i++) {
        const float *a_row = job->a + i * k;
        float *c_row = job->c + i * n;
        for (size_t j0 = 0; j0 < n; j0 += ROW_CHUNK) {
            size_t width = n - j0 < ROW_CHUNK ? n - j0 : ROW_CHUNK;
            if (job->b_transposed) {
                for (size_t j = 0; j < width; j++) {
                    const float *b_row = job->b + (j0 + j) * k;
                    double sum = 0.0;
                    for (size_t p = 0; p < k; p++) sum += (double)a_row[p] * b_row[p];
                    acc[j] = sum;
                }
            } else {
                /* c_i = sum_p a_ip b_p, row by row of b: the same order of
                 * additions per element, read contiguously. */
                for (size_t j = 0; j < width; j++) acc[j] = 0.0;
                for (size_t p = 0; p < k; p++) {
                    const float *b_row = job->b + p * n + j0;
                    double a_ip = a_row[p];
                    for (size_t j = 0; j < width; j++) acc[j] += a_ip * b_row[j];
                }
            }
            for (size_t j = 0; j < width; j++)
                c_row[j0 + j] = job->accumulate ? (float)(c_row[j0 + j] + acc[j]) : (float)acc[j];
        }
    }
}

static void matmul(size_t num_threads, const float *a, const float *b, float *c, size_t m,
                   size_t k, size_t n, bool b_transposed, bool accumulate) {
    matmul_job job = {a, b, c, k, n, b_transposed, accumulate};
    size_t row_cost = k * n + 1;
    size_t min_rows = MATMUL_MIN_FLOPS_PER_THREAD / row_cost + 1;
    attn_parallel_for(num_threads, m, min_rows, matmul_rows, &job);
}

void attn_ref_matmul(size_t num_threads, const float *a, const float *b, float *c, size_t m,
                     size_t k, size_t n, bool b_transposed) {
    matmul(num_threads, a, b, c, m, k, n, b_transposed, false);
}

void attn_ref_matmul_acc(size_t num_threads, const float *a, const float *b, float *c, size_t m,
                         size_t k, size_t n, bool b_transposed) {
    matmul(num_threads, a, b, c, m, k, n, b_transposed, true);
}

typedef struct matmul_tn_job {
    const float *a, *b;
    float *c;
    size_t k, m, n;
} matmul_tn_job;

/* Rows i of c (m, n) += a^T b: c_ij += sum_p a_pi b_pj, p ascending. */
static void matmul_tn_rows(void *arg, size_t row_begin, size_t row_end) {
    const matmul_tn_job *job = arg;
    size_t k = job->k, m = job->m, n = job->n;
    double acc[ROW_CHUNK];
    for (size_t i = row_begin; i < row_end; i++) {
        float *c_row = job->c + i * n;
        for (size_t j0 = 0; j0 < n; j0 += ROW_CHUNK) {
            size_t width = n - j0 < ROW_CHUNK ? n - j0 : ROW_CHUNK;
            for (size_t j = 0; j < width; j++) acc[j] = 0.0;
            for (size_t p = 0; p < k; p++) {
                double a_pi = job->a[p * m + i];
                const float *b_row = job->b + p * n + j0;
                for (size_t j = 0; j < width; j++) acc[j] += a_pi * b_row[j];
            }
            for (size_t j = 0; j < width; j++) c_row[j0 + j] = (float)(c_row[j0 + j] + acc[j]);
        }
    }
}

void attn_ref_matmul_tn_acc(size_t num_threads, const float *a, const float *b, float *c,
                            size_t k, size_t m, size_t n) {
    matmul_tn_job job = {a, b, c, k, m, n};
    size_t min_rows = MATMUL_MIN_FLOPS_PER_THREAD / (k * n + 1) + 1;
    attn_parallel_for(num_threads, m, min_rows, matmul_tn_rows, &job);
}

typedef struct gemm_job {
    bool trans_a, trans_b;
    size_t n, k, lda, ldb, ldc;
    double alpha, beta;
    const float *a, *b;
    float *c;
} gemm_job;

/* Rows of c: c_ij = alpha sum_p op(a)_ip op(b)_pj + beta c_ij, p ascending. */
static void gemm_rows(void *arg, size_t row_begin, size_t row_end) {
    const gemm_job *g = arg;
    double acc[ROW_CHUNK];
    for (size_t i = row_begin; i < row_end; i++) {
        float *c_row = g->c + i * g->ldc;
        for (size_t j0 = 0; j0 < g->n; j0 += ROW_CHUNK) {
            size_t width = g->n - j0 < ROW_CHUNK ? g->n - j0 : ROW_CHUNK;
            if (g->trans_b) {
                /* op(b)_pj = b[j][p]: a dot product along a row of b */
                for (size_t j = 0; j < width; j++) {
                    const float *b_row = g->b + (j0 + j) * g->ldb;
                    double sum = 0.0;
                    for (size_t p = 0; p < g->k; p++) {
                        double a_ip = g->trans_a ? g->a[p * g->lda + i] : g->a[i * g->lda + p];
                        sum += a_ip * b_row[p];
                    }
                    acc[j] = sum;
                }
            } else {
                for (size_t j = 0; j < width; j++) acc[j] = 0.0;
                for (size_t p = 0; p < g->k; p++) {
                    double a_ip = g->trans_a ? g->a[p * g->lda + i] : g->a[i * g->lda + p];
                    const float *b_row = g->b + p * g->ldb + j0;
                    for (size_t j = 0; j < width; j++) acc[j] += a_ip * b_row[j];
                }
            }
            for (size_t j = 0; j < width; j++) {
                double prior = g->beta == 0.0 ? 0.0 : g->beta * c_row[j0 + j];
                c_row[j0 + j] = (float)(g->alpha * acc[j] + prior);
            }
        }
    }
}

void attn_ref_gemm(size_t num_threads, bool trans_a, bool trans_b, size_t m, size_t n, size_t k,
                   float alpha, const float *a, size_t lda, const float *b, size_t ldb,
                   float beta, float *c, size_t ldc) {
    gemm_job job = {trans_a, trans_b, n, k, lda, ldb, ldc, alpha, beta, a, b, c};
    size_t min_rows = MATMUL_MIN_FLOPS_PER_THREAD / (k * n + 1) + 1;
    attn_parallel_for(num_threads, m, min_rows, gemm_rows, &job);
}

typedef struct linear_job {
    const float *x, *w, *bias;
    float *y;
    size_t in, out;
} linear_job;

static void linear_rows(void *arg, size_t row_begin, size_t row_end) {
    const linear_job *job = arg;
    for (size_t r = row_begin; r < row_end; r++) {
        const float *x_row = job->x + r * job->in;
        float *y_row = job->y + r * job->out;
        for (size_t o = 0; o < job->out; o++) {
            const float *w_row = job->w + o * job->in;
            double sum = job->bias ? (double)job->bias[o] : 0.0;
            for (size_t i = 0; i < job->in; i++) sum += (double)x_row[i] * w_row[i];
            y_row[o] = (float)sum;
        }
    }
}

void attn_ref_linear(size_t num_threads, const float *x, const float *w, const float *bias,
                     float *y, size_t rows, size_t in, size_t out) {
    linear_job job = {x, w, bias, y, in, out};
    size_t min_rows = MATMUL_MIN_FLOPS_PER_THREAD / (in * out + 1) + 1;
    attn_parallel_for(num_threads, rows, min_rows, linear_rows, &job);
}

typedef struct bias_grad_job {
    const float *dy;
    float *dbias;
    size_t rows, out;
} bias_grad_job;

static void bias_grad_columns(void *arg, size_t col_begin, size_t col_end) {
    const bias_grad_job *job = arg;
    for (size_t o = col_begin; o < col_end; o++) {
        double sum = 0.0;
        for (size_t r = 0; r < job->rows; r++) sum += job->dy[r * job->out + o];
        job->dbias[o] = (float)(job->dbias[o] + sum);
    }
}

void attn_ref_linear_backward(size_t num_threads, const float *x, const float *w, const float *dy,
                              float *dx, bool accumulate_dx, float *dw, float *dbias, size_t rows,
                              size_t in, size_t out) {
    /* forward: y (rows, out) = x (rows, in) @ w^T + bias */
    if (dx) matmul(num_threads, dy, w, dx, rows, out, in, false, accumulate_dx);
    attn_ref_matmul_tn_acc(num_threads, dy, x, dw, rows, out, in);
    if (dbias) {
        bias_grad_job job = {dy, dbias, rows, out};
        attn_parallel_for(num_threads, out, MATMUL_MIN_FLOPS_PER_THREAD / (rows + 1) + 1,
                          bias_grad_columns, &job);
    }
}

void attn_ref_softmax(const float *x, float *y, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) {
        const float *x_row = x + r * cols;
        float *y_row = y + r * cols;
        float max = -INFINITY;
        for (size_t j = 0; j < cols; j++)
            if (x_row[j] > max || isnan(x_row[j])) max = x_row[j];
        double sum = 0.0;
        for (size_t j = 0; j < cols; j++) {
            /* exp(-inf - -inf) is NaN: an all -inf row gives NaN, as in PyTorch. */
            double e = exp((double)x_row[j] - (double)max);
            y_row[j] = (float)e;
            sum += e;
        }
        for (size_t j = 0; j < cols; j++) y_row[j] = (float)((double)y_row[j] / sum);
    }
}

void attn_ref_mask_neg_inf(float *scores, size_t tokens) {
    for (size_t i = 0; i < tokens; i++)
        for (size_t j = i + 1; j < tokens; j++) scores[i * tokens + j] = -INFINITY;
}

void attn_ref_mask_renormalize(float *weights, size_t tokens) {
    for (size_t i = 0; i < tokens; i++) {
        float *row = weights + i * tokens;
        double sum = 0.0;
        for (size_t j = 0; j <= i; j++) sum += row[j];
        for (size_t j = 0; j < tokens; j++) row[j] = j <= i ? (float)(row[j] / sum) : 0.0f;
    }
}
