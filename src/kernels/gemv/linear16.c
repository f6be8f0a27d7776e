/* linear16.c — the linear layers on 16-bit weights (linear16.h): the
 * matrix-vector kernels for few rows, the SGEMM widening W as it packs it
 * for many, the reference sums for the reference set. */
#include "kernels/gemv/linear16.h"

#include "half.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm16.h"
#include "kernels/kernel_set.h"
#include "kernels/gemv/gemv.h"
#include "parallel.h"

enum { PARTS_MAX = 4 };

/* Floats of W widened per panel: the SGEMM's call costs (a pack of the
 * panel, waking the workers) are small beside its products, and the panel
 * stays in the caches between its widening and its packing. */
#define PANEL_FLOATS ((size_t)1 << 20)

/* Elements of W per item of the parallel loops: 256 KiB of 16-bit W. The
 * kernels ask for the next rows of W within an item only, so an item's
 * first rows start cold: with 64 KiB items a one-token step read 4-8%
 * slower. */
#define ITEM_ELEMENTS ((size_t)1 << 17)

size_t attn_k_linear16_panel_floats(size_t in) { return in > PANEL_FLOATS ? in : PANEL_FLOATS; }

/* ---- few rows: the matrix-vector kernels --------------------------------- */

typedef struct gemv16_job {
    attn_gemv16_fn *run;
    const float *x;
    attn_gemv_bf16_dot_fn *dot; /* or, on x in bf16: */
    const uint16_t *x_bf16;
    size_t rows, in, chunk; /* chunk: outputs per item, a multiple of 4 */
    const attn_k_linear16_part *parts;
    size_t first_item[PARTS_MAX + 1]; /* part i's items: [first_item[i], first_item[i + 1]) */
} gemv16_job;

static void gemv16_item(void *arg, size_t thread, size_t item) {
    (void)thread;
    const gemv16_job *j = arg;
    size_t i = 0;
    while (item >= j->first_item[i + 1]) i++;
    const attn_k_linear16_part *p = &j->parts[i];
    size_t begin = (item - j->first_item[i]) * j->chunk;
    size_t end = begin + j->chunk < p->out ? begin + j->chunk : p->out;
    if (j->dot)
        j->dot(j->rows, j->in, j->x_bf16, p->w, p->bias, p->y, p->out, begin, end);
    else
        j->run(j->rows, j->in, j->x, p->w, p->bias, p->y, p->out, begin, end);
}

/* The parts through the matrix-vector kernels: run on x, or dot on x_bf16
 * where dot is not NULL. */
static void gemv16(attn_ctx *ctx, attn_gemv16_fn *run, const float *x, attn_gemv_bf16_dot_fn *dot,
                   const uint16_t *x_bf16, size_t rows, size_t in,
                   const attn_k_linear16_part *parts, size_t n) {
    /* items of 64 KiB of W taken by whichever thread is free; below 256
     * KiB one thread reads W faster than the workers can be woken (as
     * attn_k_linear_small_n's float items) */
    gemv16_job job = {.run = run, .x = x, .dot = dot, .x_bf16 = x_bf16, .rows = rows, .in = in,
                      .parts = parts};
    job.chunk = (ITEM_ELEMENTS / in + 3) / 4 * 4;
    if (job.chunk == 0) job.chunk = 4;
    size_t elements = 0;
    for (size_t i = 0; i < n; i++) {
        job.first_item[i + 1] = job.first_item[i] + (parts[i].out + job.chunk - 1) / job.chunk;
        elements += parts[i].out * in;
    }
    size_t threads = elements < ((size_t)1 << 17) ? 1 : ctx->num_threads;
    attn_pool_dynamic(attn_ctx_pool(ctx), threads, job.first_item[n], gemv16_item, &job);
}

/* ---- many rows: the SGEMM, W widened as it is packed or in panels -------- */

typedef struct widen_job {
    attn_widen16_fn *widen;
    const uint16_t *src;
    float *dst;
    size_t n, per_item;
} widen_job;

static void widen_item(void *arg, size_t thread, size_t item) {
    (void)thread;
    const widen_job *j = arg;
    size_t begin = item * j->per_item, len = j->n - begin < j->per_item ? j->n - begin : j->per_item;
    j->widen(j->src + begin, len, j->dst + begin);
}

/* dst (n floats) = src widened, on the ctx's threads. */
static void widen(attn_ctx *ctx, attn_widen16_fn *fn, const uint16_t *src, size_t n, float *dst) {
    widen_job job = {fn, src, dst, n, ITEM_ELEMENTS};
    size_t items = (n + ITEM_ELEMENTS - 1) / ITEM_ELEMENTS;
    attn_pool_dynamic(attn_ctx_pool(ctx), items > 1 ? ctx->num_threads : 1, items, widen_item,
                      &job);
}

/* y (rows, out; row stride ldy) = x @ w^T (+ bias) with w float (out, in),
 * as attn_k_linear runs it: the SGEMM, or without its scratch the
 * reference sums. */
typedef struct ref_job {
    const float *x, *w, *bias;
    float *y;
    size_t in, out, ldy;
} ref_job;

static void ref_rows(void *arg, size_t begin, size_t end) {
    const ref_job *j = arg;
    for (size_t r = begin; r < end; r++)
        for (size_t o = 0; o < j->out; o++) {
            const float *xr = j->x + r * j->in, *wo = j->w + o * j->in;
            double sum = j->bias ? (double)j->bias[o] : 0.0;
            for (size_t i = 0; i < j->in; i++) sum += (double)xr[i] * wo[i];
            j->y[r * j->ldy + o] = (float)sum;
        }
}

static void linear_float(attn_ctx *ctx, const float *x, const float *w, const float *bias,
                         float *y, size_t ldy, size_t rows, size_t in, size_t out) {
    const attn_gemm_kernel *uk = ctx->ks.gemm;
    if (uk) {
        size_t floats = attn_sgemm_workspace(uk, ctx->num_threads, rows, out, in);
        float *ws = floats ? attn_ctx_scratch(ctx, floats * sizeof(float)) : NULL;
        if (ws) {
            attn_sgemm_run(uk, attn_ctx_workers(ctx), false, true, rows, out, in, 1.0f, x, in, w,
                           in, 0.0f, y, ldy, bias, ws);
            return;
        }
    }
    /* the reference linear's sums (kernels/ref.c), bias first, in double */
    ref_job job = {x, w, bias, y, in, out, ldy};
    attn_pool_for(attn_ctx_pool(ctx), ctx->num_threads, rows,
                  ((size_t)1 << 20) / (in * out + 1) + 1, ref_rows, &job);
}

/* The parts through the SGEMM on W's 16 bits (attn_sgemm_run_b16): packed
 * in 16 bits for the set's tile that widens them in registers where it has
 * one, else widened as its panels are packed, by the set's widened 16-bit
 * kernels, whose panels are the SGEMM's; false, having written nothing,
 * where the set has none or the scratch cannot be had. */
static bool linear_b16(attn_ctx *ctx, attn_dtype dtype, const float *x, size_t rows, size_t in,
                       const attn_k_linear16_part *parts, size_t n) {
    const attn_gemm_kernel *uk = ctx->ks.gemm;
    const attn_gemm16_kernel *wk = ctx->ks.gemm16;
    if (!uk || !wk || wk->k_unit != 1 || wk->packed_bytes != sizeof(float) || wk->mr != uk->mr ||
        wk->nr != uk->nr)
        return false;
    size_t widest = 0;
    for (size_t i = 0; i < n; i++) {
        size_t floats = attn_sgemm_workspace(uk, ctx->num_threads, rows, parts[i].out, in);
        if (floats == 0) return false;
        if (floats > widest) widest = floats;
    }
    float *ws = attn_ctx_scratch(ctx, widest * sizeof(float));
    if (!ws) return false;
    attn_sgemm_micro_b16_fn *tile16 =
        !wk->pack_b16 ? NULL : dtype == ATTN_DTYPE_BF16 ? wk->micro_bf16 : wk->micro_f16;
    for (size_t i = 0; i < n; i++) {
        const attn_k_linear16_part *p = &parts[i];
        attn_sgemm_run_b16(uk, tile16 ? wk->pack_b16 : wk->pack_b, tile16, dtype,
                           attn_ctx_workers(ctx), false, true, rows, p->out, in, 1.0f, x, in,
                           p->w, in, 0.0f, p->y, p->out, p->bias, ws);
    }
    return true;
}

void attn_k_linear16_n(attn_ctx *ctx, attn_dtype dtype, const float *x, size_t rows, size_t in,
                       const attn_k_linear16_part *parts, size_t n, float *panel) {
    const attn_gemv_kernel *k = ctx->ks.gemv;
    bool bf16 = dtype == ATTN_DTYPE_BF16;
    if (rows == 0 || in == 0) return;
    if (k && rows > 0 && rows <= ATTN_GEMV_MAX_ROWS && in > 0 && n <= PARTS_MAX) {
        gemv16(ctx, bf16 ? k->run_bf16 : k->run_f16, x, NULL, NULL, rows, in, parts, n);
        return;
    }
    if (linear_b16(ctx, dtype, x, rows, in, parts, n)) return;
    attn_widen16_fn *fn = k ? (bf16 ? k->widen_bf16 : k->widen_f16)
                            : (bf16 ? attn_widen_portable_bf16 : attn_widen_portable_f16);
    size_t per_panel = in ? attn_k_linear16_panel_floats(in) / in : 1;
    for (size_t i = 0; i < n; i++) {
        const attn_k_linear16_part *p = &parts[i];
        for (size_t o = 0; o < p->out; o += per_panel) {
            size_t len = p->out - o < per_panel ? p->out - o : per_panel;
            widen(ctx, fn, p->w + o * in, len * in, panel);
            linear_float(ctx, x, panel, p->bias ? p->bias + o : NULL, p->y + o, p->out, rows, in,
                         len);
        }
    }
}

/* ---- bf16 products: x rounded to bf16 -------------------------------------- */

typedef struct round_job {
    const float *x;
    uint16_t *bits;
    float *widened; /* or NULL */
    size_t n, per_item;
} round_job;

static void round_item(void *arg, size_t thread, size_t item) {
    (void)thread;
    const round_job *j = arg;
    size_t begin = item * j->per_item, end = begin + j->per_item < j->n ? begin + j->per_item : j->n;
    for (size_t i = begin; i < end; i++) {
        j->bits[i] = attn_float_to_bf16(j->x[i]);
        if (j->widened) j->widened[i] = attn_bf16_to_float(j->bits[i]);
    }
}

void attn_k_linear16_bf16_n(attn_ctx *ctx, const float *x, size_t rows, size_t in,
                            const attn_k_linear16_part *parts, size_t n, uint16_t *rounded,
                            float *panel) {
    if (rows == 0 || in == 0) return;
    const attn_gemv_kernel *k = ctx->ks.gemv;
    size_t elements = rows * in;
    bool few = k && rows <= ATTN_GEMV_MAX_ROWS && n <= PARTS_MAX &&
               elements <= attn_k_linear16_panel_floats(in);
    /* few rows: the matrix-vector kernels, on the bf16 products where the
     * set has them, else on the rounded x widened back into panel */
    bool widened = few && !k->run_bf16_dot;
    round_job job = {x, rounded, widened ? panel : NULL, elements, ITEM_ELEMENTS};
    size_t items = (elements + ITEM_ELEMENTS - 1) / ITEM_ELEMENTS;
    attn_pool_dynamic(attn_ctx_pool(ctx), items > 1 ? ctx->num_threads : 1, items, round_item,
                      &job);
    if (few) {
        gemv16(ctx, k->run_bf16, panel, widened ? NULL : k->run_bf16_dot, rounded, rows, in,
               parts, n);
        return;
    }
    const attn_gemm16_kernel *uk =
        attn_kernel_set_gemm16(&ctx->ks, ATTN_DTYPE_BF16, attn_ctx_amx_usable(ctx));
    for (size_t i = 0; i < n; i++) {
        const attn_k_linear16_part *p = &parts[i];
        size_t bytes = uk ? attn_gemm16_workspace(uk, ctx->num_threads, rows, p->out, in) : 0;
        void *ws = bytes ? attn_ctx_scratch(ctx, bytes) : NULL;
        if (ws)
            attn_gemm16_run(uk, attn_ctx_workers(ctx), ATTN_DTYPE_BF16, false, true, rows, p->out,
                            in, 1.0f, rounded, in, p->w, in, 0.0f, p->y, p->out, ws);
        else
            attn_gemm16_ref(ctx->num_threads, ATTN_DTYPE_BF16, false, true, rows, p->out, in, 1.0f,
                            rounded, in, p->w, in, 0.0f, p->y, p->out);
        if (p->bias)
            for (size_t r = 0; r < rows; r++)
                for (size_t o = 0; o < p->out; o++) p->y[r * p->out + o] += p->bias[o];
    }
}
