/*
 * sa_v2.c — SelfAttention_v2 (seeds, section 3.4): nn.Linear projections
 * W_query, W_key, W_value (weight (d_out, d_in), bias if qkv_bias).
 *   queries, keys, values (B, T, d_out) = x @ W_*.weight^T (+ bias)
 *   context (B, T, d_out) = softmax(queries @ keys^T * scale) @ values
 */
#include "modules/module.h"

#include <stdlib.h>
#include <string.h>

struct attn_sa_v2 {
    attn_module base;
    bool qkv_bias;
    float scale;
};

/* y (B, T, d_out) = SelfAttention_v2(x (B, T, d_in)) */
static attn_status sa_v2_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                                 float *y, attn_rng *rng) {
    (void)rng;
    attn_sa_v2 *sa = (attn_sa_v2 *)m;
    attn_status st = attn_check_forward(m, x, batch, tokens, y, 0,
                                        attn_max_size(m->d_in, 3 * m->d_out), false, NULL);
    if (st != ATTN_OK) return st;
    attn_qkv_weights w = attn_qkv_linear_weights(m, 0, sa->qkv_bias);
    attn_head_spec spec = {.d_out = m->d_out, .scale = sa->scale};
    float *acts; /* q, k, v, out (B, T, d_out), lse (B, T) */
    uint8_t *no_bits;
    st = attn_forward_prepare(m, batch, tokens, attn_single_head_acts(batch, tokens, m->d_out), 0,
                              &acts, &no_bits);
    if (st != ATTN_OK) return st;
    st = attn_single_head_forward(m, &w, &spec, x, batch, tokens, acts, NULL, y, m->d_out, NULL);
    if (st == ATTN_OK) attn_trace_btc(m, "context_vec", batch, tokens, m->d_out, y);
    if (st == ATTN_OK && m->grad_enabled) st = attn_forward_keep(m, x, batch, tokens, 1.0f);
    attn_forward_release(m, acts);
    return st;
}

/* dx (B, T, d_in), W_*.weight (d_out, d_in) and W_*.bias (d_out) grads
 * from dy (B, T, d_out). */
static attn_status sa_v2_backward(attn_module *m, const float *dy, float *dx) {
    attn_sa_v2 *sa = (attn_sa_v2 *)m;
    attn_qkv_weights w = attn_qkv_linear_weights(m, 0, sa->qkv_bias);
    attn_qkv_grads grad = attn_qkv_linear_grads(m, 0, sa->qkv_bias);
    attn_head_spec spec = {.d_out = m->d_out, .scale = sa->scale};
    return attn_one_head_backward(m, &w, &grad, &spec, dy, dx);
}

const attn_module_ops attn_sa_v2_ops = {ATTN_MODULE_SA_V2, "SelfAttention_v2", sa_v2_forward,
                                        sa_v2_backward, ATTN_BUFFERS_NONE};

attn_status attn_sa_v2_new(attn_ctx *ctx, const attn_sa_v2_config *cfg, attn_rng *init_rng,
                           attn_sa_v2 **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_sa_v2_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    const char *name = "SelfAttention_v2";
    attn_status st;
    if ((st = attn_check_width(ctx, name, "d_in", cfg->d_in)) != ATTN_OK ||
        (st = attn_check_width(ctx, name, "d_out", cfg->d_out)) != ATTN_OK ||
        (st = attn_check_scale(ctx, name, cfg->scale)) != ATTN_OK)
        return st;
    attn_sa_v2 *m = attn_calloc(1, sizeof *m);
    if (!m) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_sa_v2_new: out of memory");
    attn_module_init(&m->base, &attn_sa_v2_ops, ctx, cfg->d_in, cfg->d_out);
    m->qkv_bias = cfg->qkv_bias;
    m->scale = attn_default_scale(cfg->scale, cfg->d_out);
    st = attn_qkv_build(&m->base, cfg->d_in, cfg->d_out, cfg->qkv_bias, init_rng);
    if (st != ATTN_OK) {
        attn_module_free(&m->base);
        return st;
    }
    *out = m;
    return ATTN_OK;
}

attn_status attn_sa_v2_forward(attn_sa_v2 *m, const float *x, size_t batch, size_t tokens,
                               float *y) {
    if (!m) return ATTN_ERR_NULL;
    return sa_v2_forward(&m->base, x, batch, tokens, y, NULL);
}

attn_status attn_sa_v2_backward(attn_sa_v2 *m, const float *dy, size_t batch, size_t tokens,
                                float *dx) {
    return attn_module_backward(attn_sa_v2_module(m), dy, batch, tokens, dx);
}

attn_module *attn_sa_v2_module(attn_sa_v2 *m) { return m ? &m->base : NULL; }
void attn_sa_v2_free(attn_sa_v2 *m) { attn_module_free(attn_sa_v2_module(m)); }
