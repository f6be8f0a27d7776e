/*
 * ref.c — reference kernels: the plain, materialised path that stays as the
 * oracle for every faster kernel. Dot products accumulate in double.
 */
#include "kernels/kernels.h"

#include "parallel.h"
#include "rng/dropout.h"
#include "rng/philox.h"

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

void attn_ref_sdpa(const attn_sdpa_args *a, double *row) {
    size_t T = a->tokens, S = a->kv_tokens, D = a->head_dim;
    bool masking = a->causal && a->mask != ATTN_MASK_NONE;
    bool renormalize = a->causal && a->mask == ATTN_MASK_RENORMALIZE;
    for (size_t b = 0; b < a->batch; b++) {
        for (size_t h = 0; h < a->heads; h++) {
            const float *q = a->q + b * a->b_stride + h * a->h_stride;
            size_t kv_base = b * a->kv_b_stride + h * a->kv_h_stride;
            const float *k = a->k + kv_base, *v = a->v + kv_base;
            float *out = a->out + b * a->out_b_stride + h * a->out_h_stride;
            /* One query row at a time, in double: scores, softmax and weights
             * never round to float, so the oracle stays near the exact result
             * even where large scores make float32 softmax ill-conditioned. */
            for (size_t i = 0; i < T; i++) {
                size_t flat_row = (b * a->heads + h) * T + i, trace_row = flat_row * S;
                bool sees_none = masking && attn_causal_hides(i, 0, T, S);
                /* row (S) = q_i . k_j * scale, future masked with -inf */
                double max = -INFINITY;
                for (size_t j = 0; j < S; j++) {
                    double dot = 0.0;
                    for (size_t d = 0; d < D; d++)
                        dot += (double)q[i * a->t_stride + d] * k[j * a->kv_t_stride + d];
                    bool hidden = masking && !renormalize && attn_causal_hides(i, j, T, S);
                    row[j] = hidden ? -INFINITY : dot * a->scale;
                    if (row[j] > max || isnan(row[j])) max = row[j];
                    if (a->trace_scores) a->trace_scores[trace_row + j] = (float)row[j];
                }
                /* softmax; the renormalising mask then keeps the visible keys */
                double sum = 0.0, kept_sum = 0.0;
                for (size_t j = 0; j < S; j++) {
                    row[j] = exp(row[j] - max);
                    sum += row[j];
                    if (!masking || !attn_causal_hides(i, j, T, S)) kept_sum += row[j];
                }
                double norm = renormalize ? kept_sum : sum;
                if (a->lse) a->lse[flat_row] = sees_none ? -INFINITY : (float)(max + log(norm));
                for (size_t j = 0; j < S; j++) {
                    bool zero = sees_none || (renormalize && attn_causal_hides(i, j, T, S));
                    row[j] = zero ? 0.0 : row[j] / norm;
                    if (a->trace_weights) a->trace_weights[trace_row + j] = (float)row[j];
                    if (a->dropout) {
                        float factor = attn_dropout_stream_next(a->dropout);
                        row[j] *= factor;
                        if (a->keep_bits && factor != 0.0f) attn_set_bit(a->keep_bits, trace_row + j);
                    }
                    if (a->trace_dropped) a->trace_dropped[trace_row + j] = (float)row[j];
                }
                /* out_i (D) = row (S) @ v (S, D) */
                for (size_t d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (size_t j = 0; j < S; j++) acc += row[j] * v[j * a->kv_t_stride + d];
                    out[i * a->out_t_stride + d] = (float)acc;
                }
            }
        }
    }
}

/* ---- attention backward -------------------------------------------------- */

size_t attn_sdpa_grad_workspace(size_t kv_tokens, size_t head_dim) {
    return 2 * kv_tokens + 2 * head_dim;
}

static double dot_double(const float *a, const float *b, size_t n) {
    double sum = 0.0;
    for (size_t d = 0; d < n; d++) sum += (double)a[d] * b[d];
    return sum;
}

typedef struct sdpa_grad_view {
    const attn_sdpa_grad_args *g;
    const attn_sdpa_args *a;
    size_t T, S, D, H;
    bool masking, renormalize;
} sdpa_grad_view;

static size_t q_offset(const attn_sdpa_args *a, size_t b, size_t h, size_t t) {
    return b * a->b_stride + h * a->h_stride + t * a->t_stride;
}

static size_t kv_offset(const attn_sdpa_args *a, size_t b, size_t h, size_t s) {
    return b * a->kv_b_stride + h * a->kv_h_stride + s * a->kv_t_stride;
}

static size_t out_offset(const attn_sdpa_args *a, size_t b, size_t h, size_t t) {
    return b * a->out_b_stride + h * a->out_h_stride + t * a->out_t_stride;
}

static bool grad_hides(const sdpa_grad_view *v, size_t i, size_t j) {
    return v->masking && attn_causal_hides(i, j, v->T, v->S);
}

/* The dropout factor the forward applied to weight e of (B, H, T, S). */
static double drop_factor(const attn_sdpa_grad_args *g, size_t e) {
    if (g->keep_bits) return attn_bit(g->keep_bits, e) ? (double)g->kept_scale : 0.0;
    if (!g->philox) return 1.0;
    uint32_t word = attn_philox_dropout_word(g->philox_seed, g->philox_offset, e);
    return word < g->keep_threshold ? (double)g->kept_scale : 0.0;
}

/* Pass 1, query rows [begin, end) of the flattened (B, H, T). */
static void sdpa_grad_query_rows(void *arg, size_t part, size_t begin, size_t end) {
    const sdpa_grad_view *v = arg;
    const attn_sdpa_grad_args *g = v->g;
    const attn_sdpa_args *a = v->a;
    size_t T = v->T, S = v->S, D = v->D, H = v->H, BHT = a->batch * H * T;
    double *P = g->workspace + part * attn_sdpa_grad_workspace(S, D);
    double *dP = P + S, *acc = P + 2 * S;
    for (size_t r = begin; r < end; r++) {
        size_t b = r / (H * T), h = (r / T) % H, i = r % T;
        const float *q_i = a->q + q_offset(a, b, h, i);
        const float *dout_i = g->dout + out_offset(a, b, h, i);
        float *dq_i = g->dq + q_offset(a, b, h, i);
        if (grad_hides(v, i, 0)) {
            /* a row that sees no key output zeros: nothing flows back */
            for (size_t d = 0; d < D; d++) dq_i[d] = 0.0f;
            g->row_stats[r] = -INFINITY;
            g->row_stats[BHT + r] = 0.0;
            continue;
        }
        /* forward: P_i = softmax(mask(q_i k^T * scale)), recomputed in double */
        double max = -INFINITY;
        for (size_t j = 0; j < S; j++) {
            P[j] = grad_hides(v, i, j) ? -INFINITY
                                       : dot_double(q_i, a->k + kv_offset(a, b, h, j), D) * a->scale;
            if (P[j] > max || isnan(P[j])) max = P[j];
        }
        double sum = 0.0;
        for (size_t j = 0; j < S; j++) {
            P[j] = exp(P[j] - max);
            sum += P[j];
        }
        for (size_t j = 0; j < S; j++) P[j] /= sum;
        /* dP_ij = (dO_i . v_j) * drop_ij; masked entries hold 0 * dO_i, which
         * is NaN exactly when dO_i is not finite, as PyTorch's full matmul. */
        double poison = 0.0;
        for (size_t d = 0; d < D; d++) poison += 0.0 * dout_i[d];
        double delta = 0.0;
        for (size_t j = 0; j < S; j++) {
            if (grad_hides(v, i, j)) {
                dP[j] = poison;
            } else {
                double dA = dot_double(dout_i, a->v + kv_offset(a, b, h, j), D);
                dP[j] = dA * drop_factor(g, r * S + j);
            }
            delta += P[j] * dP[j];
        }
        /* dS_ij = P_ij (dP_ij - delta_i); masked_fill's backward zeroes the
         * masked entries, the renormalising product keeps them (0 or NaN). */
        for (size_t d = 0; d < D; d++) acc[d] = 0.0;
        for (size_t j = 0; j < S; j++) {
            if (grad_hides(v, i, j)) continue; /* dS is 0 (or NaN, then so is the row) */
            double dS = P[j] * (dP[j] - delta);
            const float *k_j = a->k + kv_offset(a, b, h, j);
            for (size_t d = 0; d < D; d++) acc[d] += dS * k_j[d];
        }
        /* dq_i = scale * sum_j dS_ij k_j */
        for (size_t d = 0; d < D; d++) dq_i[d] = (float)(acc[d] * a->scale);
        g->row_stats[r] = max + log(sum);
        g->row_stats[BHT + r] = delta;
    }
}

/* Pass 2, key rows [begin, end) of the flattened (B, H, S). */
static void sdpa_grad_key_rows(void *arg, size_t part, size_t begin, size_t end) {
    const sdpa_grad_view *v = arg;
    const attn_sdpa_grad_args *g = v->g;
    const attn_sdpa_args *a = v->a;
    size_t T = v->T, S = v->S, D = v->D, H = v->H, BHT = a->batch * H * T;
    double *acc_v = g->workspace + part * attn_sdpa_grad_workspace(S, D) + 2 * S;
    double *acc_k = acc_v + D;
    for (size_t r = begin; r < end; r++) {
        size_t b = r / (H * S), h = (r / S) % H, j = r % S;
        size_t row0 = (b * H + h) * T; /* flattened index of query row 0 of this head */
        const float *k_j = a->k + kv_offset(a, b, h, j), *v_j = a->v + kv_offset(a, b, h, j);
        for (size_t d = 0; d < D; d++) acc_v[d] = acc_k[d] = 0.0;
        for (size_t i = 0; i < T; i++) {
            const float *q_i = a->q + q_offset(a, b, h, i);
            const float *dout_i = g->dout + out_offset(a, b, h, i);
            double lse = g->row_stats[row0 + i], delta = g->row_stats[BHT + row0 + i];
            if (grad_hides(v, i, j)) {
                /* weight 0: dv_j += 0 * dO_i, as the matmul A^T dO does */
                for (size_t d = 0; d < D; d++) acc_v[d] += 0.0 * dout_i[d];
                double dS = v->renormalize ? 0.0 * delta : 0.0;
                if (dS != 0.0 || isnan(dS))
                    for (size_t d = 0; d < D; d++) acc_k[d] += dS * q_i[d];
                continue;
            }
            /* forward: P_ij = exp(q_i . k_j * scale - lse_i), A_ij = P_ij * drop_ij */
            double P = exp(dot_double(q_i, k_j, D) * a->scale - lse);
            double drop = drop_factor(g, (row0 + i) * S + j);
            double A = P * drop;
            double dP = dot_double(dout_i, v_j, D) * drop;
            double dS = P * (dP - delta);
            for (size_t d = 0; d < D; d++) {
                acc_v[d] += A * dout_i[d];
                acc_k[d] += dS * q_i[d];
            }
        }
        /* dv_j = sum_i A_ij dO_i;  dk_j = scale * sum_i dS_ij q_i */
        float *dv_j = g->dv + kv_offset(a, b, h, j), *dk_j = g->dk + kv_offset(a, b, h, j);
        for (size_t d = 0; d < D; d++) {
            dv_j[d] = (float)acc_v[d];
            dk_j[d] = (float)(acc_k[d] * a->scale);
        }
    }
}

void attn_ref_sdpa_backward(size_t num_threads, const attn_sdpa_grad_args *g) {
    const attn_sdpa_args *a = g->fwd;
    sdpa_grad_view v = {
        .g = g, .a = a, .T = a->tokens, .S = a->kv_tokens, .D = a->head_dim, .H = a->heads,
        .masking = a->causal && a->mask != ATTN_MASK_NONE,
        .renormalize = a->causal && a->mask == ATTN_MASK_RENORMALIZE,
    };
    size_t BH = a->batch * a->heads;
    size_t min_rows = MATMUL_MIN_FLOPS_PER_THREAD / (4 * (v.T + v.S) * v.D + 1) + 1;
    /* Pass 2 reads every row's lse and delta: pass 1 finishes first. */
    attn_parallel_for_parts(num_threads, BH * v.T, min_rows, sdpa_grad_query_rows, &v);
    attn_parallel_for_parts(num_threads, BH * v.S, min_rows, sdpa_grad_key_rows, &v);
}
