/*
 * ref.c — reference kernels: the plain, materialised path that stays as the
 * oracle for every faster kernel. Dot products accumulate in double.
 */
#include "kernels/kernels.h"

#include "parallel.h"
#include "rng/dropout.h"

#include <math.h>
#include <string.h>

/* Rows of c per thread below which starting a thread costs more than it saves. */
#define MATMUL_MIN_FLOPS_PER_THREAD (1u << 18)

typedef struct matmul_job {
    const float *a, *b;
    float *c;
    size_t k, n;
    bool b_transposed;
} matmul_job;

static void matmul_rows(void *arg, size_t row_begin, size_t row_end) {
    const matmul_job *job = arg;
    size_t k = job->k, n = job->n;
    for (size_t i = row_begin; i < row_end; i++) {
        const float *a_row = job->a + i * k;
        float *c_row = job->c + i * n;
        for (size_t j = 0; j < n; j++) {
            double sum = 0.0;
            if (job->b_transposed) {
                const float *b_row = job->b + j * k;
                for (size_t p = 0; p < k; p++) sum += (double)a_row[p] * b_row[p];
            } else {
                for (size_t p = 0; p < k; p++) sum += (double)a_row[p] * job->b[p * n + j];
            }
            c_row[j] = (float)sum;
        }
    }
}

void attn_ref_matmul(size_t num_threads, const float *a, const float *b, float *c, size_t m,
                     size_t k, size_t n, bool b_transposed) {
    matmul_job job = {a, b, c, k, n, b_transposed};
    size_t row_cost = k * n + 1;
    size_t min_rows = MATMUL_MIN_FLOPS_PER_THREAD / row_cost + 1;
    attn_parallel_for(num_threads, m, min_rows, matmul_rows, &job);
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

void attn_ref_sdpa(const attn_sdpa_args *a, double *row) {
    size_t T = a->tokens, D = a->head_dim;
    bool neg_inf = a->causal && a->mask == ATTN_MASK_NEG_INF;
    bool renormalize = a->causal && a->mask == ATTN_MASK_RENORMALIZE;
    for (size_t b = 0; b < a->batch; b++) {
        for (size_t h = 0; h < a->heads; h++) {
            size_t base = b * a->b_stride + h * a->h_stride;
            const float *q = a->q + base, *k = a->k + base, *v = a->v + base;
            float *out = a->out + b * a->out_b_stride + h * a->out_h_stride;
            /* One query row at a time, in double: scores, softmax and weights
             * never round to float, so the oracle stays near the exact result
             * even where large scores make float32 softmax ill-conditioned. */
            for (size_t i = 0; i < T; i++) {
                size_t trace_row = ((b * a->heads + h) * T + i) * T;
                /* row (T) = q_i . k_j * scale, future masked with -inf */
                double max = -INFINITY;
                for (size_t j = 0; j < T; j++) {
                    double dot = 0.0;
                    for (size_t d = 0; d < D; d++)
                        dot += (double)q[i * a->t_stride + d] * k[j * a->t_stride + d];
                    row[j] = neg_inf && j > i ? -INFINITY : dot * a->scale;
                    if (row[j] > max || isnan(row[j])) max = row[j];
                    if (a->trace_scores) a->trace_scores[trace_row + j] = (float)row[j];
                }
                /* softmax; the renormalising mask then keeps j <= i */
                double sum = 0.0, kept_sum = 0.0;
                for (size_t j = 0; j < T; j++) {
                    row[j] = exp(row[j] - max);
                    sum += row[j];
                    if (j <= i) kept_sum += row[j];
                }
                double norm = renormalize ? kept_sum : sum;
                for (size_t j = 0; j < T; j++) {
                    row[j] = renormalize && j > i ? 0.0 : row[j] / norm;
                    if (a->trace_weights) a->trace_weights[trace_row + j] = (float)row[j];
                    if (a->dropout) row[j] *= attn_dropout_stream_next(a->dropout);
                    if (a->trace_dropped) a->trace_dropped[trace_row + j] = (float)row[j];
                }
                /* out_i (D) = row (T) @ v (T, D) */
                for (size_t d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (size_t j = 0; j < T; j++) acc += row[j] * v[j * a->t_stride + d];
                    out[i * a->out_t_stride + d] = (float)acc;
                }
            }
        }
    }
}
