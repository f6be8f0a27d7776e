/*
 * causal.c — CausalAttention (seeds, section 3.5): SelfAttention_v2 plus a
 * causal mask for T <= context_length and dropout on the attention weights.
 *   queries, keys, values (B, T, d_out) = W_*(x)
 *   attn_scores  (B, T, T) = queries @ keys^T, future masked
 *   attn_weights (B, T, T) = dropout(softmax(attn_scores * scale))
 *   context      (B, T, d_out) = attn_weights @ values
 * A training forward with dropout keeps its mask, one bit per weight, for
 * the backward (single_head.c).
 */
#include "modules/module.h"

#include <stdlib.h>
#include <string.h>

struct attn_causal {
    attn_module base;
    attn_causal_config cfg;
    float scale;
};

static attn_status causal_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                                  float *y, attn_rng *rng) {
    attn_causal *ca = (attn_causal *)m;
    double p = m->training ? ca->cfg.dropout : 0.0;
    attn_status st = attn_check_forward(m, x, batch, tokens, y, ca->cfg.context_length,
                                        attn_max_size(m->d_in, 3 * m->d_out), p > 0.0, rng);
    if (st != ATTN_OK) return st;
    attn_qkv_weights w = attn_qkv_linear_weights(m, 0, ca->cfg.qkv_bias);
    attn_head_spec spec = {.d_out = m->d_out, .scale = ca->scale, .causal = true,
                           .mask = ca->cfg.mask, .dropout_p = p};
    float *acts;        /* q, k, v, out (B, T, d_out), lse (B, T) */
    uint8_t *keep_bits; /* (B, T, T) when dropout draws and the backward needs it */
    size_t bits = p > 0.0 && attn_keeps_attention_mask(m, rng) ? batch * tokens * tokens : 0;
    st = attn_forward_prepare(m, batch, tokens, attn_single_head_acts(batch, tokens, m->d_out),
                              bits, &acts, &keep_bits);
    if (st != ATTN_OK) return st;
    st = attn_single_head_forward(m, &w, &spec, x, batch, tokens, acts, keep_bits, y, m->d_out,
                                  rng);
    if (st == ATTN_OK) attn_trace_btc(m, "context_vec", batch, tokens, m->d_out, y);
    if (st == ATTN_OK && m->grad_enabled)
        st = attn_forward_keep(m, x, batch, tokens, attn_dropout_kept_scale(p));
    attn_forward_release(m, acts);
    return st;
}

/* dx (B, T, d_in) and the W_* gradients from dy (B, T, d_out), through the
 * mask and the dropout the forward drew. */
static attn_status causal_backward(attn_module *m, const float *dy, float *dx) {
    attn_causal *ca = (attn_causal *)m;
    attn_qkv_weights w = attn_qkv_linear_weights(m, 0, ca->cfg.qkv_bias);
    attn_qkv_grads grad = attn_qkv_linear_grads(m, 0, ca->cfg.qkv_bias);
    attn_head_spec spec = {.d_out = m->d_out, .scale = ca->scale, .causal = true,
                           .mask = ca->cfg.mask};
    return attn_one_head_backward(m, &w, &grad, &spec, dy, dx);
}

const attn_module_ops attn_causal_ops = {ATTN_MODULE_CAUSAL, "CausalAttention", causal_forward,
                                         causal_backward, ATTN_BUFFERS_MASK};

attn_status attn_check_causal_config(attn_ctx *ctx, const char *name, size_t d_in, size_t d_out,
                                     size_t context_length, double dropout, double scale,
                                     attn_mask_method mask) {
    attn_status st;
    if ((st = attn_check_width(ctx, name, "d_in", d_in)) != ATTN_OK ||
        (st = attn_check_width(ctx, name, "d_out", d_out)) != ATTN_OK ||
        (st = attn_check_width(ctx, name, "context_length", context_length)) != ATTN_OK ||
        (st = attn_check_dropout(ctx, name, dropout)) != ATTN_OK ||
        (st = attn_check_scale(ctx, name, scale)) != ATTN_OK ||
        (st = attn_check_mask(ctx, name, mask)) != ATTN_OK)
        return st;
    return ATTN_OK;
}

attn_status attn_causal_new(attn_ctx *ctx, const attn_causal_config *cfg, attn_rng *init_rng,
                            attn_causal **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_causal_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    attn_status st = attn_check_causal_config(ctx, "CausalAttention", cfg->d_in, cfg->d_out,
                                              cfg->context_length, cfg->dropout, cfg->scale,
                                              cfg->mask);
    if (st != ATTN_OK) return st;
    attn_causal *m = attn_calloc(1, sizeof *m);
    if (!m) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_causal_new: out of memory");
    attn_module_init(&m->base, &attn_causal_ops, ctx, cfg->d_in, cfg->d_out);
    m->base.mask_buffer = cfg->context_length;
    m->cfg = *cfg;
    m->scale = attn_default_scale(cfg->scale, cfg->d_out);
    st = attn_qkv_build(&m->base, cfg->d_in, cfg->d_out, cfg->qkv_bias, init_rng);
    if (st != ATTN_OK) {
        attn_module_free(&m->base);
        return st;
    }
    *out = m;
    return ATTN_OK;
}

attn_status attn_causal_forward(attn_causal *m, const float *x, size_t batch, size_t tokens,
                                float *y, attn_rng *dropout_rng) {
    if (!m) return ATTN_ERR_NULL;
    return causal_forward(&m->base, x, batch, tokens, y, dropout_rng);
}

attn_status attn_causal_backward(attn_causal *m, const float *dy, size_t batch, size_t tokens,
                                 float *dx) {
    return attn_module_backward(attn_causal_module(m), dy, batch, tokens, dx);
}

attn_module *attn_causal_module(attn_causal *m) { return m ? &m->base : NULL; }
void attn_causal_free(attn_causal *m) { attn_module_free(attn_causal_module(m)); }
