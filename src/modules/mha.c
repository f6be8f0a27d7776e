/*
 * mha.c — MultiHeadAttention (seeds, section 3.6): one projection per q, k,
 * v split into heads, causal mask, dropout, then out_proj (with bias).
 *   queries, keys, values (B, T, d_out) = W_*(x)
 *     viewed as (B, T, H, hd), transposed to (B, H, T, hd)
 *   attn_weights (B, H, T, T) = dropout(softmax(mask(q k^T) * scale))
 *   context_vec  (B, H, T, hd) = attn_weights @ values
 *     transposed back and flattened to (B, T, d_out)
 *   y (B, T, d_out) = out_proj(context_vec)
 * The backward walks these steps in reverse, reading q, k, v and context_vec
 * (and the dropout mask) the forward kept. heads.c runs both; this file
 * gives them MultiHeadAttention's spec and parameters.
 */
#include "modules/module.h"

/* The forward and backward are heads.c's (attn_heads_forward, _backward). */
struct attn_mha {
    attn_heads_module heads;
};

const attn_module_ops attn_mha_ops = {ATTN_MODULE_MHA, "MultiHeadAttention", attn_heads_forward,
                                      attn_heads_backward, ATTN_BUFFERS_MASK};

attn_status attn_mha_new(attn_ctx *ctx, const attn_mha_config *cfg, attn_rng *init_rng,
                         attn_mha **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_mha_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    const char *name = "MultiHeadAttention";
    attn_status st = attn_check_causal_config(ctx, name, cfg->d_in, cfg->d_out,
                                              cfg->context_length, cfg->dropout, cfg->scale,
                                              cfg->mask);
    if (st != ATTN_OK) return st;
    if ((st = attn_check_heads(ctx, name, cfg->d_out, cfg->num_heads)) != ATTN_OK) return st;
    attn_heads_module *h = attn_heads_alloc(ctx, &attn_mha_ops, sizeof(attn_mha), cfg->d_in,
                                            cfg->d_out, "attn_mha_new");
    if (!h) return ATTN_ERR_NO_MEMORY;
    h->base.mask_buffer = cfg->context_length;
    size_t hd = cfg->d_out / cfg->num_heads;
    h->spec = (attn_heads_spec){
        .q_heads = cfg->num_heads, .kv_heads = cfg->num_heads, .head_dim = hd,
        .scale = attn_default_scale(cfg->scale, hd), .mask = cfg->mask,
        .context_length = cfg->context_length,
        .check_width = 4 * cfg->d_out, /* its bound: q, k, v, context (not lse's H) */
        .dropout = cfg->dropout};
    if ((st = attn_heads_build_mha(h, cfg->d_in, cfg->d_out, cfg->qkv_bias, init_rng)) != ATTN_OK)
        return st; /* h freed */
    *out = (attn_mha *)h;
    return ATTN_OK;
}

attn_status attn_mha_forward(attn_mha *m, const float *x, size_t batch, size_t tokens, float *y,
                             attn_rng *dropout_rng) {
    return attn_module_forward(attn_mha_module(m), x, batch, tokens, y, dropout_rng);
}

attn_status attn_mha_backward(attn_mha *m, const float *dy, size_t batch, size_t tokens,
                              float *dx) {
    return attn_module_backward(attn_mha_module(m), dy, batch, tokens, dx);
}

attn_module *attn_mha_module(attn_mha *m) { return m ? &m->heads.base : NULL; }
void attn_mha_free(attn_mha *m) { attn_module_free(attn_mha_module(m)); }

bool attn_mha_attention(const attn_module *m, attn_module_attention *out) {
    if (!m || m->ops != &attn_mha_ops) return false;
    const attn_heads_spec *h = &((const attn_heads_module *)m)->spec;
    *out = (attn_module_attention){h->q_heads, h->head_dim, h->scale, h->mask != ATTN_MASK_NONE,
                                   h->dropout, h->qkv_bias};
    return true;
}
