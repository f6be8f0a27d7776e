/* dispatch.c — the GEMM and linear calls modules make, on the ctx's kernels
 * (its kernel set: kernels/kernel_set.h; attention runs through the attention contract:
 * attention/attention.h). */
#include "kernels/dispatch.h"

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemv/gemv.h"
#include "parallel.h"

#include <stdint.h>
#include <stdlib.h>

/* ---- the calls ---------------------------------------------------------- */

/* The fast kernel set of the ctx, or NULL for the reference loops. */
static const attn_gemm_kernel *fast(const attn_ctx *ctx) { return ctx->ks.gemm; }

/* The SGEMM (+ bias, NULL: none) on the ctx's scratch memory (kept from
 * call to call); false, having written nothing, when the scratch cannot
 * grow to its workspace. */
static bool sgemm(attn_ctx *ctx, const attn_gemm_kernel *uk, bool trans_a, bool trans_b, size_t m,
                  size_t n, size_t k, float alpha, const float *a, size_t lda, const float *b,
                  size_t ldb, float beta, float *c, size_t ldc, const float *bias) {
    size_t floats = attn_sgemm_workspace(uk, ctx->num_threads, m, n, k);
    float *ws = floats ? attn_ctx_scratch(ctx, floats * sizeof(float)) : NULL;
    if (!ws) return false;
    attn_sgemm_run(uk, attn_ctx_workers(ctx), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                   beta, c, ldc, bias, ws);
    return true;
}

/* Each call below runs the reference kernel when the ctx asks for it, and
 * also when the SGEMM cannot have its pack buffers: the reference needs no
 * memory, so a call never fails. */

void attn_k_gemm(attn_ctx *ctx, bool trans_a, bool trans_b, size_t m, size_t n, size_t k,
                 float alpha, const float *a, size_t lda, const float *b, size_t ldb, float beta,
                 float *c, size_t ldc) {
    const attn_gemm_kernel *uk = fast(ctx);
    if (uk && sgemm(ctx, uk, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                    NULL))
        return;
    attn_ref_gemm(ctx->num_threads, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                  ldc);
}

void attn_k_matmul(attn_ctx *ctx, const float *a, const float *b, float *c, size_t m,
                   size_t k, size_t n, bool b_transposed, bool accumulate) {
    const attn_gemm_kernel *uk = fast(ctx);
    if (uk && sgemm(ctx, uk, false, b_transposed, m, n, k, 1.0f, a, k, b, b_transposed ? k : n,
                    accumulate ? 1.0f : 0.0f, c, n, NULL))
        return;
    if (accumulate)
        attn_ref_matmul_acc(ctx->num_threads, a, b, c, m, k, n, b_transposed);
    else
        attn_ref_matmul(ctx->num_threads, a, b, c, m, k, n, b_transposed);
}

void attn_k_matmul_tn_acc(attn_ctx *ctx, const float *a, const float *b, float *c,
                          size_t k, size_t m, size_t n) {
    const attn_gemm_kernel *uk = fast(ctx);
    if (uk && sgemm(ctx, uk, true, false, m, n, k, 1.0f, a, m, b, n, 1.0f, c, n, NULL))
        return;
    attn_ref_matmul_tn_acc(ctx->num_threads, a, b, c, k, m, n);
}

void attn_k_linear(attn_ctx *ctx, const float *x, const float *w, const float *bias,
                   float *y, size_t rows, size_t in, size_t out) {
    const attn_gemm_kernel *uk = fast(ctx);
    /* y = x w^T + bias, the bias added to each tile of y as the SGEMM
     * writes it */
    if (uk && sgemm(ctx, uk, false, true, rows, out, in, 1.0f, x, in, w, in, 0.0f, y, out, bias))
        return;
    attn_ref_linear(ctx->num_threads, x, w, bias, y, rows, in, out);
}

enum { GEMV_MAX_PARTS = 4 };

typedef struct gemv_job {
    const attn_gemv_kernel *kernel;
    const float *x;
    size_t rows, in, chunk; /* chunk: outputs per item, a multiple of 4 */
    const attn_k_linear_part *parts;
    size_t first_item[GEMV_MAX_PARTS + 1]; /* part i's items: [first_item[i], first_item[i + 1]) */
    size_t n;
} gemv_job;

static void gemv_chunk(void *arg, size_t thread, size_t item) {
    (void)thread;
    const gemv_job *j = arg;
    size_t i = 0;
    while (item >= j->first_item[i + 1]) i++;
    const attn_k_linear_part *p = &j->parts[i];
    size_t begin = (item - j->first_item[i]) * j->chunk;
    size_t end = begin + j->chunk < p->out ? begin + j->chunk : p->out;
    j->kernel->run(j->rows, j->in, j->x, p->w, p->bias, p->y, p->out, begin, end);
}

void attn_k_linear_small_n(attn_ctx *ctx, const float *x, size_t rows, size_t in,
                           const attn_k_linear_part *parts, size_t n) {
    const attn_gemv_kernel *kernel = ctx->ks.gemv;
    if (!kernel || rows == 0 || rows > ATTN_GEMV_MAX_ROWS || in == 0 || n > GEMV_MAX_PARTS) {
        for (size_t i = 0; i < n; i++)
            attn_k_linear(ctx, x, parts[i].w, parts[i].bias, parts[i].y, rows, in, parts[i].out);
        return;
    }
    /* Items of about 256 KiB of w, taken by whichever thread is free: a
     * thread the OS holds back (another process on its core) delays the
     * call by one item, not by its share; the kernels ask for w's next rows
     * within an item only, so each item's first rows start cold (64 KiB
     * items read 1-6% slower). Below about 256 KiB one thread reads w
     * faster than the ctx's workers can be woken. */
    gemv_job job = {.kernel = kernel, .x = x, .rows = rows, .in = in, .parts = parts, .n = n};
    job.chunk = (((size_t)1 << 16) / in + 3) / 4 * 4;
    if (job.chunk == 0) job.chunk = 4;
    size_t floats = 0;
    for (size_t i = 0; i < n; i++) {
        job.first_item[i + 1] = job.first_item[i] + (parts[i].out + job.chunk - 1) / job.chunk;
        floats += parts[i].out * in;
    }
    size_t threads = floats < ((size_t)1 << 16) ? 1 : ctx->num_threads;
    attn_pool_dynamic(attn_ctx_pool(ctx), threads, job.first_item[n], gemv_chunk, &job);
}

void attn_k_linear_small(attn_ctx *ctx, const float *x, const float *w, const float *bias,
                         float *y, size_t rows, size_t in, size_t out) {
    attn_k_linear_part part = {w, bias, y, out};
    attn_k_linear_small_n(ctx, x, rows, in, &part, 1);
}

typedef struct colsum_job {
    const float *dy;
    float *dbias;
    size_t rows, out;
} colsum_job;

/* dbias[o] += sum over rows of dy[r, o], for o in [begin, end): summed in
 * double, a block of columns at a time, reading dy row by row. */
static void colsum_columns(void *arg, size_t begin, size_t end) {
    const colsum_job *job = arg;
    enum { BLOCK = 256 };
    double acc[BLOCK];
    for (size_t o0 = begin; o0 < end; o0 += BLOCK) {
        size_t width = end - o0 < BLOCK ? end - o0 : BLOCK;
        for (size_t o = 0; o < width; o++) acc[o] = 0.0;
        for (size_t r = 0; r < job->rows; r++) {
            const float *row = job->dy + r * job->out + o0;
            for (size_t o = 0; o < width; o++) acc[o] += row[o];
        }
        for (size_t o = 0; o < width; o++)
            job->dbias[o0 + o] = (float)(job->dbias[o0 + o] + acc[o]);
    }
}

void attn_k_linear_backward(attn_ctx *ctx, const float *x, const float *w, const float *dy,
                            float *dx, bool accumulate_dx, float *dw, float *dbias, size_t rows,
                            size_t in, size_t out) {
    const attn_gemm_kernel *uk = fast(ctx);
    size_t threads = ctx->num_threads;
    /* forward: y (rows, out) = x (rows, in) @ w^T + bias, w (out, in):
     *   dx (rows, in) = dy @ w; dw (out, in) += dy^T @ x; dbias += colsum(dy) */
    if (!uk || (dx && !sgemm(ctx, uk, false, false, rows, in, out, 1.0f, dy, out, w, in,
                             accumulate_dx ? 1.0f : 0.0f, dx, in, NULL))) {
        attn_ref_linear_backward(threads, x, w, dy, dx, accumulate_dx, dw, dbias, rows, in, out);
        return;
    }
    if (!sgemm(ctx, uk, true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in, NULL))
        attn_ref_matmul_tn_acc(threads, dy, x, dw, rows, out, in);
    if (dbias) {
        colsum_job job = {dy, dbias, rows, out};
        size_t min_cols = ((size_t)1 << 18) / (rows + 1) + 1;
        attn_parallel_for(threads, out, min_cols, colsum_columns, &job);
    }
}

typedef struct activation_job {
    const attn_activation_kernels *kernels;
    const float *x, *dy;
    float *out;
} activation_job;

static void gelu_range(void *arg, size_t begin, size_t end) {
    const activation_job *j = arg;
    j->kernels->gelu_tanh(j->x + begin, j->out + begin, end - begin);
}

static void gelu_backward_range(void *arg, size_t begin, size_t end) {
    const activation_job *j = arg;
    j->kernels->gelu_tanh_backward(j->x + begin, j->dy + begin, j->out + begin, end - begin);
}

/* Elements per thread below which waking another costs more than it saves
 * (an element costs about 30 ns of one core). */
#define ACTIVATION_MIN_PER_THREAD 4096

bool attn_k_gelu_tanh(attn_ctx *ctx, const float *x, float *y, size_t n) {
    const attn_activation_kernels *k = ctx->ks.activation;
    if (!k) return false;
    activation_job job = {k, x, NULL, y};
    attn_pool_for(attn_ctx_pool(ctx), ctx->num_threads, n, ACTIVATION_MIN_PER_THREAD, gelu_range,
                  &job);
    return true;
}

bool attn_k_gelu_tanh_backward(attn_ctx *ctx, const float *x, const float *dy, float *dx,
                               size_t n) {
    const attn_activation_kernels *k = ctx->ks.activation;
    if (!k) return false;
    activation_job job = {k, x, dy, dx};
    attn_pool_for(attn_ctx_pool(ctx), ctx->num_threads, n, ACTIVATION_MIN_PER_THREAD,
                  gelu_backward_range, &job);
    return true;
}

attn_crossentropy_row_fn *attn_k_crossentropy_row(const attn_ctx *ctx) {
    return ctx->ks.activation ? ctx->ks.activation->crossentropy_row : NULL;
}

attn_crossentropy_backward_row_fn *attn_k_crossentropy_backward_row(const attn_ctx *ctx) {
    return ctx->ks.activation ? ctx->ks.activation->crossentropy_backward_row : NULL;
}
