/* sdpa.c — scaled dot-product attention on the caller's tensors: checks,
 * then the fused (or reference) kernels through dispatch. */
#include "internal.h"
#include "kernels/dispatch.h"
#include "rng/dropout.h"
#include "rng/philox.h"

#include <math.h>
#include <stdlib.h>

/* The kernels' description of cfg; strides filled in for zeros. */
static attn_sdpa_args args_of(const attn_sdpa_config *c, const float *q, const float *k,
                              const float *v, float *out, float *lse) {
    size_t HD = c->heads * c->head_dim;
    const size_t *qs = c->q_strides, *ks = c->kv_strides, *os = c->out_strides;
    bool q0 = !qs[0] && !qs[1] && !qs[2], k0 = !ks[0] && !ks[1] && !ks[2];
    bool o0 = !os[0] && !os[1] && !os[2];
    attn_sdpa_args a = {
        .batch = c->batch, .heads = c->heads, .tokens = c->q_tokens, .head_dim = c->head_dim,
        .kv_tokens = c->kv_tokens, .q = q, .k = k, .v = v, .out = out, .lse = lse,
        .b_stride = q0 ? c->q_tokens * HD : qs[0], .t_stride = q0 ? HD : qs[1],
        .h_stride = q0 ? c->head_dim : qs[2],
        .kv_b_stride = k0 ? c->kv_tokens * HD : ks[0], .kv_t_stride = k0 ? HD : ks[1],
        .kv_h_stride = k0 ? c->head_dim : ks[2],
        .out_b_stride = o0 ? c->q_tokens * HD : os[0], .out_t_stride = o0 ? HD : os[1],
        .out_h_stride = o0 ? c->head_dim : os[2],
        .scale = c->scale != 0.0f ? c->scale : (float)(1.0 / sqrt((double)c->head_dim)),
        .causal = c->causal, .mask = ATTN_MASK_NEG_INF,
    };
    return a;
}

static attn_status check_config(attn_ctx *ctx, const char *fn, const attn_sdpa_config *c) {
    if (!c) return attn_fail(ctx, ATTN_ERR_NULL, "%s: cfg is NULL", fn);
    if (!c->batch || !c->heads || !c->q_tokens || !c->kv_tokens || !c->head_dim)
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "%s: batch (%zu), heads (%zu), q_tokens (%zu), kv_tokens (%zu) and "
                         "head_dim (%zu) must be positive",
                         fn, c->batch, c->heads, c->q_tokens, c->kv_tokens, c->head_dim);
    size_t bh, rows, cols;
    if (!attn_mul_size(c->batch, c->heads, &bh) || !attn_mul3_size(bh, c->q_tokens, c->head_dim, &rows) ||
        !attn_mul3_size(bh, c->kv_tokens, c->head_dim, &cols) || !attn_floats_fit(rows) ||
        !attn_floats_fit(cols))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: (%zu, %zu, %zu|%zu, %zu) overflows size_t", fn,
                         c->batch, c->heads, c->q_tokens, c->kv_tokens, c->head_dim);
    if (!isfinite(c->scale))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: scale (%g) must be finite", fn, (double)c->scale);
    if (!(c->dropout >= 0.0 && c->dropout < 1.0))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: dropout (%g) must be in [0, 1)", fn, c->dropout);
    return ATTN_OK;
}

attn_status attn_sdpa_forward(attn_ctx *ctx, const attn_sdpa_config *cfg, const float *q,
                              const float *k, const float *v, float *out, float *lse,
                              attn_rng *rng, attn_sdpa_dropout *drawn) {
    const char *fn = "attn_sdpa_forward";
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    attn_status st = check_config(ctx, fn, cfg);
    if (st != ATTN_OK) return st;
    if (!q || !k || !v || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", fn,
                         !q ? "q" : !k ? "k" : !v ? "v" : "out");
    attn_dropout_stream stream, *dropout = NULL;
    if (cfg->dropout > 0.0) {
        if (!rng || !drawn)
            return attn_fail(ctx, ATTN_ERR_NULL, "%s: dropout (%g) needs an rng and a drawn record",
                             fn, cfg->dropout);
        if (attn_rng_bernoulli(rng) != ATTN_BERNOULLI_PHILOX)
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "%s: dropout draws Philox in the kernel: set the rng to "
                             "ATTN_BERNOULLI_PHILOX (the modules offer PyTorch's serial masks)",
                             fn);
        attn_dropout_stream_begin(&stream, rng, cfg->dropout,
                                  cfg->batch * cfg->heads * cfg->q_tokens * cfg->kv_tokens);
        *drawn = (attn_sdpa_dropout){stream.philox_seed, stream.philox_offset};
        dropout = &stream;
    }
    attn_sdpa_args a = args_of(cfg, q, k, v, out, lse);
    if (attn_k_fused_attention(ctx)) return attn_k_sdpa_fused(ctx, fn, &a, dropout);
    double *row = calloc(cfg->kv_tokens, sizeof *row);
    if (!row) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate a row of %zu scores", fn, cfg->kv_tokens);
    a.dropout = dropout;
    attn_ref_sdpa(&a, row);
    free(row);
    return ATTN_OK;
}

attn_status attn_sdpa_backward(attn_ctx *ctx, const attn_sdpa_config *cfg, const float *q,
                               const float *k, const float *v, const float *out,
                               const float *lse, const float *dout, float *dq, float *dk,
                               float *dv, const attn_sdpa_dropout *drawn) {
    const char *fn = "attn_sdpa_backward";
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    attn_status st = check_config(ctx, fn, cfg);
    if (st != ATTN_OK) return st;
    if (!q || !k || !v || !out || !lse || !dout || !dq || !dk || !dv)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", fn,
                         !q ? "q" : !k ? "k" : !v ? "v" : !out ? "out" : !lse ? "lse"
                         : !dout ? "dout" : !dq ? "dq" : !dk ? "dk" : "dv");
    if (cfg->dropout > 0.0 && !drawn)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: dropout (%g) needs the forward's drawn record", fn,
                         cfg->dropout);
    attn_sdpa_args a = args_of(cfg, q, k, v, (float *)out, (float *)lse);
    attn_sdpa_grad_args g = {.fwd = &a, .dout = dout, .dq = dq, .dk = dk, .dv = dv, .out = out,
                             .lse = lse};
    if (cfg->dropout > 0.0) {
        g.philox = true;
        g.philox_seed = drawn->seed;
        g.philox_offset = drawn->offset;
        g.keep_threshold = attn_philox_keep_threshold(cfg->dropout);
        g.kept_scale = attn_dropout_kept_scale(cfg->dropout);
    }
    return attn_k_sdpa_backward(ctx, fn, &g);
}
