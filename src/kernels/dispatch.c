/* dispatch.c — choosing kernels: the CPU's instruction sets, the ctx's
 * choice, and the calls modules make. */
#include "kernels/dispatch.h"

#include "kernels/flash/flash.h"
#include "kernels/gemm/gemm.h"
#include "parallel.h"
#include "rng/dropout.h"
#include "rng/philox.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Parts of the magnitude scan (its threads, at most). */
#define ATTN_SCAN_PARTS 64

const char *attn_kernels_name(attn_kernels kernels) {
    switch (kernels) {
    case ATTN_KERNELS_AUTO: return "auto";
    case ATTN_KERNELS_REFERENCE: return "reference";
    case ATTN_KERNELS_PORTABLE: return "portable";
    case ATTN_KERNELS_AVX2: return "avx2";
    case ATTN_KERNELS_AVX512: return "avx512";
    }
    return "?";
}

bool attn_kernels_supported(attn_kernels kernels) {
    switch (kernels) {
    case ATTN_KERNELS_AUTO:
    case ATTN_KERNELS_REFERENCE:
    case ATTN_KERNELS_PORTABLE:
        return true;
#if defined(ATTN_HAVE_X86_KERNELS)
    case ATTN_KERNELS_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case ATTN_KERNELS_AVX512:
        return __builtin_cpu_supports("avx512f");
#else
    case ATTN_KERNELS_AVX2:
    case ATTN_KERNELS_AVX512:
        return false;
#endif
    }
    return false;
}

static bool parse_kernels(const char *name, attn_kernels *out) {
    for (attn_kernels k = ATTN_KERNELS_REFERENCE; k <= ATTN_KERNELS_AVX512; k++) {
        if (strcmp(name, attn_kernels_name(k)) == 0) {
            *out = k;
            return true;
        }
    }
    return false;
}

attn_status attn_kernels_resolve(attn_kernels requested, attn_kernels *out) {
    if (requested == ATTN_KERNELS_AUTO) {
        const char *env = getenv("ATTN_KERNELS");
        if (env && *env && strcmp(env, "auto") != 0) {
            if (!parse_kernels(env, &requested)) return ATTN_ERR_INVALID;
        } else {
            requested = attn_kernels_supported(ATTN_KERNELS_AVX512) ? ATTN_KERNELS_AVX512
                        : attn_kernels_supported(ATTN_KERNELS_AVX2) ? ATTN_KERNELS_AVX2
                                                                    : ATTN_KERNELS_PORTABLE;
        }
    }
    if (requested < ATTN_KERNELS_REFERENCE || requested > ATTN_KERNELS_AVX512 ||
        !attn_kernels_supported(requested))
        return ATTN_ERR_INVALID;
    *out = requested;
    return ATTN_OK;
}

/* ---- the calls ---------------------------------------------------------- */

/* The fast kernel set of the ctx, or NULL for the reference loops. */
static const attn_gemm_kernel *fast(const attn_ctx *ctx) {
    return attn_gemm_kernel_for(ctx->kernels);
}

/* The SGEMM on the ctx's scratch memory (kept from call to call); false,
 * having written nothing, when the scratch cannot grow to its workspace. */
static bool sgemm(attn_ctx *ctx, const attn_gemm_kernel *uk, bool trans_a, bool trans_b, size_t m,
                  size_t n, size_t k, float alpha, const float *a, size_t lda, const float *b,
                  size_t ldb, float beta, float *c, size_t ldc) {
    size_t floats = attn_sgemm_workspace(uk, ctx->num_threads, m, n, k);
    float *ws = floats ? attn_ctx_scratch(ctx, floats * sizeof(float)) : NULL;
    if (!ws) return false;
    attn_sgemm_run(uk, ctx->num_threads, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                   ldc, ws);
    return true;
}

/* Each call below runs the reference kernel when the ctx asks for it, and
 * also when the SGEMM cannot have its pack buffers: the reference needs no
 * memory, so a call never fails. */

void attn_k_gemm(attn_ctx *ctx, bool trans_a, bool trans_b, size_t m, size_t n, size_t k,
                 float alpha, const float *a, size_t lda, const float *b, size_t ldb, float beta,
                 float *c, size_t ldc) {
    const attn_gemm_kernel *uk = fast(ctx);
    if (uk && sgemm(ctx, uk, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                         beta, c, ldc))
        return;
    attn_ref_gemm(ctx->num_threads, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                  ldc);
}

void attn_k_matmul(attn_ctx *ctx, const float *a, const float *b, float *c, size_t m,
                   size_t k, size_t n, bool b_transposed, bool accumulate) {
    const attn_gemm_kernel *uk = fast(ctx);
    if (uk && sgemm(ctx, uk, false, b_transposed, m, n, k, 1.0f, a, k, b,
                         b_transposed ? k : n, accumulate ? 1.0f : 0.0f, c, n))
        return;
    if (accumulate)
        attn_ref_matmul_acc(ctx->num_threads, a, b, c, m, k, n, b_transposed);
    else
        attn_ref_matmul(ctx->num_threads, a, b, c, m, k, n, b_transposed);
}

void attn_k_matmul_tn_acc(attn_ctx *ctx, const float *a, const float *b, float *c,
                          size_t k, size_t m, size_t n) {
    const attn_gemm_kernel *uk = fast(ctx);
    if (uk && sgemm(ctx, uk, true, false, m, n, k, 1.0f, a, m, b, n, 1.0f, c, n))
        return;
    attn_ref_matmul_tn_acc(ctx->num_threads, a, b, c, k, m, n);
}

void attn_k_linear(attn_ctx *ctx, const float *x, const float *w, const float *bias,
                   float *y, size_t rows, size_t in, size_t out) {
    const attn_gemm_kernel *uk = fast(ctx);
    if (uk) {
        /* y = x w^T + bias: y starts as the bias in every row, then the
         * SGEMM adds x w^T to it. */
        if (bias)
            for (size_t r = 0; r < rows; r++) memcpy(y + r * out, bias, out * sizeof *y);
        if (sgemm(ctx, uk, false, true, rows, out, in, 1.0f, x, in, w, in,
                       bias ? 1.0f : 0.0f, y, out))
            return;
    }
    attn_ref_linear(ctx->num_threads, x, w, bias, y, rows, in, out);
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
                                  accumulate_dx ? 1.0f : 0.0f, dx, in))) {
        attn_ref_linear_backward(threads, x, w, dy, dx, accumulate_dx, dw, dbias, rows, in, out);
        return;
    }
    if (!sgemm(ctx, uk, true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in))
        attn_ref_matmul_tn_acc(threads, dy, x, dw, rows, out, in);
    if (dbias) {
        colsum_job job = {dy, dbias, rows, out};
        size_t min_cols = ((size_t)1 << 18) / (rows + 1) + 1;
        attn_parallel_for(threads, out, min_cols, colsum_columns, &job);
    }
}

/* ---- attention ------------------------------------------------------------ */

static const attn_flash_kernels *flash_kernels(const attn_ctx *ctx) {
    switch (ctx->kernels) {
#if defined(ATTN_HAVE_X86_KERNELS)
    case ATTN_KERNELS_AVX512: return &attn_flash_avx512;
    case ATTN_KERNELS_AVX2: return &attn_flash_avx2;
#endif
    default: return &attn_flash_portable;
    }
}

bool attn_k_fused_attention(const attn_ctx *ctx) { return ctx->kernels != ATTN_KERNELS_REFERENCE; }

/* a * b, or SIZE_MAX when it overflows (an allocation that then fails). */
static size_t mul_or_max(size_t a, size_t b) {
    size_t n;
    return attn_mul_size(a, b, &n) ? n : (size_t)-1;
}

static size_t add_or_max(size_t a, size_t b) {
    size_t n;
    return attn_add_size(a, b, &n) ? n : (size_t)-1;
}

/* Byte counts rounded up to whole doubles, so every piece stays aligned. */
static size_t doubles_bytes(size_t bytes) {
    return bytes > (size_t)-1 - 7 ? (size_t)-1 : (bytes + 7) / 8 * 8;
}

/* Bytes of the fused kernels' per-part tiles (floats). */
static size_t flash_tiles_bytes(const attn_ctx *ctx, size_t per_part) {
    size_t parts = attn_parallel_parts(ctx->num_threads);
    return doubles_bytes(mul_or_max(mul_or_max(parts, per_part), sizeof(float)));
}

/* Bytes of a (B, H, T, S) bit mask. */
static size_t mask_bytes(const attn_sdpa_args *a) {
    size_t n = mul_or_max(mul_or_max(a->batch * a->heads, a->tokens), a->kv_tokens);
    return doubles_bytes(n / 8 + 1);
}

/* ---- where the fused kernels hand over to the reference -------------------
 *
 * The fused kernels keep scores in float32 and their exp2 maps NaN to 0: fed
 * NaN or inf, or magnitudes whose scores pass float32's range, they would
 * give other numbers than the reference (which spreads NaN and inf exactly
 * as PyTorch does, and holds scores in double). A scan of q, k, v (and dO)
 * finds those inputs, O((T + S) D) against the attention's O(T S D), and
 * the reference kernel runs them. */

typedef struct magnitude_scan {
    const attn_sdpa_args *a;
    const float *dout; /* NULL in the forward */
    float (*max_abs)(const float *x, size_t n, float top); /* the kernels' own, vectorised */
    float part_max[ATTN_SCAN_PARTS][4]; /* max |x| of q, k, v, dout per part; inf: not finite */
} magnitude_scan;

static void scan_heads(void *arg, size_t part, size_t begin, size_t end) {
    magnitude_scan *job = arg;
    const attn_sdpa_args *a = job->a;
    float *top = job->part_max[part];
    for (size_t bh = begin; bh < end; bh++) {
        size_t b = bh / a->heads, h = bh % a->heads;
        for (size_t t = 0; t < a->tokens; t++) {
            size_t qo = b * a->b_stride + h * a->h_stride + t * a->t_stride;
            top[0] = job->max_abs(a->q + qo, a->head_dim, top[0]);
            if (job->dout)
                top[3] = job->max_abs(job->dout + b * a->out_b_stride + h * a->out_h_stride +
                                          t * a->out_t_stride,
                                      a->head_dim, top[3]);
        }
        for (size_t s = 0; s < a->kv_tokens; s++) {
            size_t ko = b * a->kv_b_stride + h * a->kv_h_stride + s * a->kv_t_stride;
            top[1] = job->max_abs(a->k + ko, a->head_dim, top[1]);
            top[2] = job->max_abs(a->v + ko, a->head_dim, top[2]);
        }
    }
}

/* Whether the reference kernel must run these tensors (dout: the
 * backward's, or NULL). */
static bool needs_reference(const attn_ctx *ctx, const attn_sdpa_args *a, const float *dout) {
    magnitude_scan job = {.a = a, .dout = dout, .max_abs = flash_kernels(ctx)->max_abs};
    size_t min_heads = ((size_t)1 << 16) / ((a->tokens + 2 * a->kv_tokens) * a->head_dim + 1) + 1;
    size_t threads = ctx->num_threads < ATTN_SCAN_PARTS ? ctx->num_threads : ATTN_SCAN_PARTS;
    attn_parallel_for_parts(threads, a->batch * a->heads, min_heads, scan_heads, &job);
    float top[4] = {0, 0, 0, 0};
    for (size_t p = 0; p < ATTN_SCAN_PARTS; p++)
        for (int t = 0; t < 4; t++) top[t] = job.part_max[p][t] > top[t] ? job.part_max[p][t] : top[t];
    for (int t = 0; t < 4; t++)
        if (isinf(top[t])) return true; /* inf or NaN */
    double q = top[0], k = top[1], v = top[2];
    double d_o = top[3], D = (double)a->head_dim, S = (double)a->kv_tokens;
    double limit = FLT_MAX / 16.0;
    /* scores (times log2 e), the output's running sums, and dP = dO . v */
    return 1.4426950408889634 * fabs((double)a->scale) * D * q * k >= limit || S * v >= limit ||
           D * d_o * v >= limit || S * d_o >= limit;
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

size_t attn_k_sdpa_fused_bytes(const attn_ctx *ctx, const attn_sdpa_args *args, bool serial) {
    const attn_flash_kernels *fk = flash_kernels(ctx);
    size_t bytes = flash_tiles_bytes(ctx, fk->forward_workspace(args->head_dim));
    if (serial && !args->keep_bits) bytes = add_or_max(bytes, mask_bytes(args));
    /* or the reference's row of doubles */
    return max_size(bytes, mul_or_max(args->kv_tokens ? args->kv_tokens : 1, sizeof(double)));
}

static attn_status no_workspace(attn_ctx *ctx, const char *who, size_t bytes) {
    return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                     "%s: cannot allocate %zu bytes of attention workspace", who, bytes);
}

attn_status attn_k_sdpa_fused(attn_ctx *ctx, const char *who, attn_sdpa_args *args,
                              attn_dropout_stream *dropout, void *workspace) {
    bool serial = dropout && !dropout->passthrough && !dropout->drop_all &&
                  dropout->method != ATTN_BERNOULLI_PHILOX;
    const attn_flash_kernels *fk = flash_kernels(ctx);
    size_t bytes = attn_k_sdpa_fused_bytes(ctx, args, serial);
    void *owned = NULL;
    if (!workspace) {
        workspace = owned = attn_calloc(1, bytes);
        if (!owned) return no_workspace(ctx, who, bytes);
    }
    if (needs_reference(ctx, args, NULL)) {
        /* the same draws, in the same order, into the same bits */
        args->dropout = dropout;
        attn_ref_sdpa(args, workspace);
        args->dropout = NULL;
        attn_free(owned);
        return ATTN_OK;
    }
    float *ws = workspace;
    size_t tiles = flash_tiles_bytes(ctx, fk->forward_workspace(args->head_dim));
    memset(ws, 0, tiles); /* as freshly allocated, also when reused */
    attn_flash_dropout drop = {.kind = ATTN_FLASH_DROP_NONE};
    if (dropout && !dropout->passthrough) {
        drop.kept_scale = dropout->kept_scale;
        if (dropout->drop_all) {
            /* p = 1: every weight dropped, nothing drawn */
            drop = (attn_flash_dropout){.kind = ATTN_FLASH_DROP_PHILOX, .keep_threshold = 0};
        } else if (dropout->method == ATTN_BERNOULLI_PHILOX) {
            drop.kind = ATTN_FLASH_DROP_PHILOX;
            drop.seed = dropout->philox_seed;
            drop.offset = dropout->philox_offset;
            drop.keep_threshold = dropout->keep_threshold;
        } else {
            /* a serial stream: PyTorch's mask, drawn in its order first */
            size_t n = args->batch * args->heads * args->tokens * args->kv_tokens;
            uint8_t *bits = args->keep_bits;
            if (!bits) {
                bits = (uint8_t *)workspace + tiles;
                memset(bits, 0, n / 8 + 1);
            }
            for (size_t e = 0; e < n; e++)
                if (attn_dropout_stream_next(dropout) != 0.0f) attn_set_bit(bits, e);
            drop.kind = ATTN_FLASH_DROP_BITS;
            drop.keep_bits = bits;
        }
    }
    fk->forward(ctx->num_threads, args, &drop, ws);
    attn_free(owned);
    return ATTN_OK;
}

/* The reference backward's: two statistics per row, then each part's doubles. */
static size_t reference_backward_bytes(const attn_ctx *ctx, const attn_sdpa_args *a) {
    size_t rows = a->batch * a->heads * a->tokens; /* fits: checked by the forward */
    size_t per_part = attn_sdpa_grad_workspace(a->kv_tokens, a->head_dim);
    size_t parts = attn_parallel_parts(ctx->num_threads);
    return mul_or_max(add_or_max(mul_or_max(2, rows), mul_or_max(parts, per_part)),
                      sizeof(double));
}

size_t attn_k_sdpa_backward_bytes(const attn_ctx *ctx, const attn_sdpa_args *a) {
    size_t rows = a->batch * a->heads * a->tokens; /* fits: checked by the forward */
    size_t reference = reference_backward_bytes(ctx, a);
    if (!attn_k_fused_attention(ctx)) return reference;
    const attn_flash_kernels *fk = flash_kernels(ctx);
    size_t tiles = flash_tiles_bytes(ctx, fk->backward_workspace(a->head_dim));
    /* the fused kernels' tiles and row sums, or the reference's (see
     * needs_reference) */
    return max_size(add_or_max(tiles, doubles_bytes(mul_or_max(rows, sizeof(float)))), reference);
}

attn_status attn_k_sdpa_backward(attn_ctx *ctx, const char *who, attn_sdpa_grad_args *g,
                                 void *workspace) {
    const attn_sdpa_args *a = g->fwd;
    size_t rows = a->batch * a->heads * a->tokens; /* fits: checked by the forward */
    size_t bytes = attn_k_sdpa_backward_bytes(ctx, a);
    void *owned = NULL;
    if (!workspace) {
        workspace = owned = attn_calloc(1, bytes);
        if (!owned) return no_workspace(ctx, who, bytes);
    }
    if (!attn_k_fused_attention(ctx) || needs_reference(ctx, a, g->dout)) {
        memset(workspace, 0, bytes);
        g->row_stats = workspace;
        g->workspace = g->row_stats + 2 * rows;
        attn_ref_sdpa_backward(ctx->num_threads, g);
        attn_free(owned);
        return ATTN_OK;
    }
    attn_flash_dropout drop = {.kind = ATTN_FLASH_DROP_NONE, .kept_scale = g->kept_scale};
    if (g->keep_bits) {
        drop.kind = ATTN_FLASH_DROP_BITS;
        drop.keep_bits = g->keep_bits;
    } else if (g->philox) {
        drop.kind = ATTN_FLASH_DROP_PHILOX;
        drop.seed = g->philox_seed;
        drop.offset = g->philox_offset;
        drop.keep_threshold = g->keep_threshold;
    }
    const attn_flash_kernels *fk = flash_kernels(ctx);
    size_t tiles = flash_tiles_bytes(ctx, fk->backward_workspace(a->head_dim));
    float *ws = workspace, *delta = (float *)((char *)workspace + tiles);
    memset(workspace, 0, bytes); /* as freshly allocated, also when reused */
    fk->backward(ctx->num_threads, a, &drop, g->out, g->lse, g->dout, g->dq, g->dk, g->dv, delta,
                 ws);
    attn_free(owned);
    return ATTN_OK;
}
