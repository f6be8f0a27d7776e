/*
 * swa.c — MultiHeadAttentionWithSWA (the book's ch04/06_swa, without its
 * KV cache): MultiHeadAttention whose query i sees only the W most recent
 * keys, itself included.
 *   queries, keys, values (B, T, d_out) = W_*(x), viewed as (B, H, T, hd)
 *   attn_weights (B, H, T, T) = dropout(softmax(mask(q k^T) / sqrt(hd)))
 *     mask: diff = i - j hidden where diff < 0 (the future) or diff >= W,
 *     so keys i - W + 1 .. i stay: the contract's window (W - 1, 0) with
 *     causal. W None (0 here) is num_tokens + 1 in the book: plain causal.
 *   context_vec  (B, H, T, hd) = attn_weights @ values, back to (B, T, d_out)
 *   y (B, T, d_out) = out_proj(context_vec)
 * The book divides the masked scores by sqrt(hd); scaling before the -inf
 * mask gives the same weights. The backward walks these steps in reverse.
 * heads.c runs both, with the window of this file's spec.
 */
#include "modules/module.h"

/* The forward and backward are heads.c's, with the window. */
struct attn_swa {
    attn_heads_module heads;
};

const attn_module_ops attn_swa_ops = {ATTN_MODULE_SWA, "MultiHeadAttentionWithSWA",
                                      attn_heads_forward, attn_heads_backward, ATTN_BUFFERS_NONE};

attn_status attn_swa_new(attn_ctx *ctx, const attn_swa_config *cfg, attn_rng *init_rng,
                         attn_swa **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_swa_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    attn_status st = attn_check_heads_config(ctx, "MultiHeadAttentionWithSWA", cfg->d_in,
                                             cfg->d_out, cfg->num_heads, cfg->dropout, cfg->scale);
    if (st != ATTN_OK) return st;
    attn_heads_module *h = attn_heads_alloc(ctx, &attn_swa_ops, sizeof(attn_swa), cfg->d_in,
                                            cfg->d_out, "attn_swa_new");
    if (!h) return ATTN_ERR_NO_MEMORY;
    size_t hd = cfg->d_out / cfg->num_heads;
    h->spec = (attn_heads_spec){
        .q_heads = cfg->num_heads, .kv_heads = cfg->num_heads, .head_dim = hd,
        .scale = attn_default_scale(cfg->scale, hd), .mask = ATTN_MASK_NEG_INF,
        .window = cfg->sliding_window_size, .check_width = 4 * cfg->d_out + cfg->num_heads,
        .dropout = cfg->dropout};
    /* MultiHeadAttention's parameters, in its order */
    if ((st = attn_heads_build_mha(h, cfg->d_in, cfg->d_out, cfg->qkv_bias, init_rng)) != ATTN_OK)
        return st; /* h freed */
    *out = (attn_swa *)h;
    return ATTN_OK;
}

attn_status attn_swa_forward(attn_swa *m, const float *x, size_t batch, size_t tokens, float *y,
                             attn_rng *dropout_rng) {
    return attn_module_forward(attn_swa_module(m), x, batch, tokens, y, dropout_rng);
}

attn_status attn_swa_backward(attn_swa *m, const float *dy, size_t batch, size_t tokens,
                              float *dx) {
    return attn_module_backward(attn_swa_module(m), dy, batch, tokens, dx);
}

attn_module *attn_swa_module(attn_swa *m) { return m ? &m->heads.base : NULL; }
void attn_swa_free(attn_swa *m) { attn_module_free(attn_swa_module(m)); }
