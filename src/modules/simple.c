/*
 * simple.c — simplified self-attention (seeds, section 3.3): no weights.
 *   attn_scores  (B, T, T) = x @ x^T
 *   attn_weights (B, T, T) = softmax(attn_scores, dim=-1)
 *   context      (B, T, C) = attn_weights @ x
 * x plays query, key and value, so its gradient is the sum of all three.
 */
#include "modules/module.h"
#include "overlap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct attn_simple {
    attn_module base;
};

/* x serves as query, key and value of one head, unscaled, unmasked; out
 * is y (the backward's copy of it), lse (B, T) followed by lse_lo (B, T)
 * and row_stats (two floats a row). */
static attn_attention_problem simple_heads(const attn_module *m, size_t batch, size_t tokens,
                                           const float *x, float *y, float *lse) {
    attn_attention_problem p = attn_heads_problem(batch, tokens, 1, 1, m->d_in, x, x, x, y, lse,
                                                  1.0f, false, ATTN_MASK_NONE);
    p.lse_lo = lse ? lse + batch * tokens : NULL;
    p.row_stats = lse ? lse + 2 * batch * tokens : NULL;
    return p;
}

/* y (B, T, C) = softmax(x x^T) x */
static attn_status simple_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                                  float *y, attn_rng *rng) {
    (void)rng;
    attn_status st = attn_check_forward(m, x, batch, tokens, y, 0, m->d_in, false, NULL);
    if (st != ATTN_OK) return st;
    size_t n = batch * tokens * m->d_in;
    float *acts; /* out (B, T, C), lse, lse_lo, row_stats (simple_heads), for the backward */
    uint8_t *no_bits;
    if ((st = attn_forward_prepare(m, batch, tokens, n + 4 * batch * tokens, 0, &acts, &no_bits)) !=
        ATTN_OK)
        return st;
    attn_attention_problem p = simple_heads(m, batch, tokens, x, y, acts + n);
    st = attn_attention_reserve(m, &p, false, NULL);
    if (st == ATTN_OK) st = attn_run_attention(m, &p, NULL, NULL);
    if (st == ATTN_OK) {
        attn_trace_btc(m, "context_vecs", batch, tokens, m->d_in, y);
        memcpy(acts, y, n * sizeof *y);
    }
    if (st == ATTN_OK && m->grad_enabled) st = attn_forward_keep(m, x, batch, tokens, 1.0f);
    attn_forward_release(m, acts);
    return st;
}

/* dx (B, T, C) = dq + dk + dv from dy (B, T, C). */
static attn_status simple_backward(attn_module *m, const float *dy, float *dx) {
    const attn_saved *s = &m->saved;
    size_t n = s->batch * s->tokens * m->d_in;
    attn_status st;
    float *grads = attn_scratch(m, 3 * n, &st); /* dq, dk, dv: (B, T, C) each */
    if (!grads) return st;
    attn_attention_problem fwd = simple_heads(m, s->batch, s->tokens, s->x, s->acts, s->acts + n);
    attn_attention_grads g = {.dout = dy, .dq = grads, .dk = grads + n, .dv = grads + 2 * n};
    if ((st = attn_attention_reserve(m, &fwd, true, NULL)) == ATTN_OK)
        st = attn_run_attention_backward(m, &fwd, &g, 0, NULL);
    if (st == ATTN_OK && dx)
        for (size_t i = 0; i < n; i++) dx[i] = grads[i] + grads[n + i] + grads[2 * n + i];
    attn_free(grads);
    attn_attention_release(m);
    return st;
}

const attn_module_ops attn_simple_ops = {ATTN_MODULE_SIMPLE, "SimplifiedSelfAttention",
                                         simple_forward, simple_backward, ATTN_BUFFERS_NONE};

attn_status attn_simple_new(attn_ctx *ctx, const attn_simple_config *cfg, attn_simple **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_simple_new: %s is NULL", !cfg ? "cfg" : "out");
    attn_status st = attn_check_width(ctx, "SimplifiedSelfAttention", "d_in", cfg->d_in);
    if (st != ATTN_OK) return st;
    attn_simple *m = attn_calloc(1, sizeof *m);
    if (!m) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_simple_new: out of memory");
    attn_module_init(&m->base, &attn_simple_ops, ctx, cfg->d_in, cfg->d_in);
    *out = m;
    return ATTN_OK;
}

attn_status attn_simple_forward(attn_simple *m, const float *x, size_t batch, size_t tokens,
                                float *y) {
    if (!m) return ATTN_ERR_NULL;
    return simple_forward(&m->base, x, batch, tokens, y, NULL);
}

attn_status attn_simple_forward_query(attn_simple *m, const float *x, size_t tokens,
                                      size_t query_index, float *scores, float *weights,
                                      float *context) {
    if (!m) return ATTN_ERR_NULL;
    attn_ctx *ctx = m->base.ctx;
    attn_clear_error(ctx);
    if (!x || !scores || !weights || !context)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_simple_forward_query: %s is NULL",
                         !x ? "x" : !scores ? "scores" : !weights ? "weights" : "context");
    if (tokens == 0)
        return attn_fail(ctx, ATTN_ERR_SHAPE, "attn_simple_forward_query: tokens must be positive");
    if (query_index >= tokens)
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "attn_simple_forward_query: query_index (%zu) must be below tokens (%zu)",
                         query_index, tokens);
    size_t d = m->base.d_in, n;
    if (!attn_mul_size(tokens, d, &n) || !attn_floats_fit(n))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "attn_simple_forward_query: tokens (%zu) x d_in (%zu) overflows", tokens, d);
    attn_span outs[] = {{"scores", scores, tokens * sizeof(float)},
                        {"weights", weights, tokens * sizeof(float)},
                        {"context", context, d * sizeof(float)}};
    attn_span ins[] = {{"x", x, n * sizeof(float)}};
    attn_status st = attn_check_overlap(ctx, "attn_simple_forward_query", outs, 3, ins, 1);
    if (st != ATTN_OK) return st;
    double *exact = tokens <= SIZE_MAX / sizeof(double) ? attn_malloc(tokens * sizeof *exact) : NULL;
    if (!exact)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                         "attn_simple_forward_query: out of memory for %zu scores", tokens);
    const float *query = x + query_index * d;
    /* scores (T) = x @ query: the seeds' loop of torch.dot(x_i, query),
     * summed in double (as attn_ref_matmul sums) and kept so */
    bool overflowed = false;
    for (size_t i = 0; i < tokens; i++) {
        double sum = 0.0;
        for (size_t k = 0; k < d; k++) sum += (double)x[i * d + k] * query[k];
        exact[i] = sum;
        scores[i] = (float)sum;
        overflowed |= isfinite(sum) && !isfinite(scores[i]);
    }
    /* weights (T) = softmax(scores, dim=0); where a finite score leaves
     * float's range, the softmax of the double scores, the finite values
     * float64 gives, as the reference attention does (docs/exactness.md) */
    if (!overflowed) {
        attn_ref_softmax(scores, weights, 1, tokens);
    } else {
        double max = -INFINITY, total = 0.0;
        for (size_t i = 0; i < tokens; i++) max = exact[i] > max ? exact[i] : max;
        for (size_t i = 0; i < tokens; i++) total += exp(exact[i] - max);
        for (size_t i = 0; i < tokens; i++) weights[i] = (float)(exp(exact[i] - max) / total);
    }
    attn_free(exact);
    /* context (C) = sum_i weights[i] * x_i */
    attn_ref_matmul(1, weights, x, context, 1, tokens, d, false);
    return ATTN_OK;
}

attn_status attn_simple_backward(attn_simple *m, const float *dy, size_t batch, size_t tokens,
                                 float *dx) {
    return attn_module_backward(attn_simple_module(m), dy, batch, tokens, dx);
}

attn_module *attn_simple_module(attn_simple *m) { return m ? &m->base : NULL; }
void attn_simple_free(attn_simple *m) { attn_module_free(attn_simple_module(m)); }
