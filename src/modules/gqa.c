/*
 * gqa.c — GroupedQueryAttention (the book's ch04/04_gqa, without its KV
 * cache): num_heads query heads, num_kv_groups key/value heads, each shared
 * by group_size = num_heads / num_kv_groups consecutive query heads.
 *   queries (B, T, d_out)     = W_query(x), viewed as (B, H, T, hd)
 *   keys, values (B, T, G*hd) = W_key(x), W_value(x), viewed as (B, G, T, hd)
 *     (the book repeat_interleaves them to (B, H, T, hd); the attention
 *     contract reads KV head h / group_size in place: no copy)
 *   attn_weights (B, H, T, T) = dropout(softmax(mask(q k^T) / sqrt(hd)))
 *   context_vec  (B, H, T, hd) = attn_weights @ values, back to (B, T, d_out)
 *   y (B, T, d_out) = out_proj(context_vec)           (no bias in the book)
 * The book divides the masked scores by sqrt(hd); scaling before the -inf
 * mask gives the same weights. The backward walks these steps in reverse;
 * dk and dv come back at G heads, each summing its group's query heads.
 * heads.c runs both; this file gives them the spec and the parameters.
 */
#include "modules/module.h"

/* The forward and backward are heads.c's, with G = num_kv_groups KV heads. */
struct attn_gqa {
    attn_heads_module heads;
};

const attn_module_ops attn_gqa_ops = {ATTN_MODULE_GQA, "GroupedQueryAttention",
                                      attn_heads_forward, attn_heads_backward, ATTN_BUFFERS_NONE};

attn_status attn_gqa_new(attn_ctx *ctx, const attn_gqa_config *cfg, attn_rng *init_rng,
                         attn_gqa **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_gqa_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    const char *name = "GroupedQueryAttention";
    attn_status st = attn_check_heads_config(ctx, name, cfg->d_in, cfg->d_out, cfg->num_heads,
                                             cfg->dropout, cfg->scale);
    if (st != ATTN_OK) return st;
    if (cfg->num_kv_groups == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: num_kv_groups must be positive, got 0", name);
    if (cfg->num_heads % cfg->num_kv_groups != 0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: num_heads (%zu) must be divisible by num_kv_groups (%zu)", name,
                         cfg->num_heads, cfg->num_kv_groups);
    attn_heads_module *h = attn_heads_alloc(ctx, &attn_gqa_ops, sizeof(attn_gqa), cfg->d_in,
                                            cfg->d_out, "attn_gqa_new");
    if (!h) return ATTN_ERR_NO_MEMORY;
    size_t hd = cfg->d_out / cfg->num_heads, kv_width = cfg->num_kv_groups * hd; /* <= d_out */
    size_t per = cfg->qkv_bias ? 2 : 1; /* tensors per projection */
    /* state_dict order: the book registers W_key and W_value before W_query */
    h->spec = (attn_heads_spec){
        .q_heads = cfg->num_heads, .kv_heads = cfg->num_kv_groups, .head_dim = hd,
        .scale = attn_default_scale(cfg->scale, hd), .mask = ATTN_MASK_NEG_INF,
        .check_width = 4 * cfg->d_out + cfg->num_heads, .dropout = cfg->dropout,
        .qkv_bias = cfg->qkv_bias, .key_index = 0, .value_index = per, .query_index = 2 * per,
        .out_index = 3 * per, .out_bias = false};
    attn_module *m = &h->base;
    /* the book's registration order, which is also its init order */
    if ((st = attn_module_declare_linear(m, "W_key", cfg->d_in, kv_width, cfg->qkv_bias)) !=
            ATTN_OK ||
        (st = attn_module_declare_linear(m, "W_value", cfg->d_in, kv_width, cfg->qkv_bias)) !=
            ATTN_OK ||
        (st = attn_module_declare_linear(m, "W_query", cfg->d_in, cfg->d_out, cfg->qkv_bias)) !=
            ATTN_OK ||
        (st = attn_module_declare_linear(m, "out_proj", cfg->d_out, cfg->d_out, false)) !=
            ATTN_OK ||
        (st = attn_module_alloc(m)) != ATTN_OK) {
        attn_module_free(m);
        return st;
    }
    size_t index = 0;
    if ((st = attn_module_init_linear(m, init_rng, &index, cfg->qkv_bias, cfg->d_in,
                                      kv_width)) != ATTN_OK ||
        (st = attn_module_init_linear(m, init_rng, &index, cfg->qkv_bias, cfg->d_in,
                                      kv_width)) != ATTN_OK ||
        (st = attn_module_init_linear(m, init_rng, &index, cfg->qkv_bias, cfg->d_in,
                                      cfg->d_out)) != ATTN_OK ||
        (st = attn_module_init_linear(m, init_rng, &index, false, cfg->d_out, cfg->d_out)) !=
            ATTN_OK) {
        attn_module_free(m);
        return st;
    }
    *out = (attn_gqa *)h;
    return ATTN_OK;
}

attn_status attn_gqa_forward(attn_gqa *m, const float *x, size_t batch, size_t tokens, float *y,
                             attn_rng *dropout_rng) {
    return attn_module_forward(attn_gqa_module(m), x, batch, tokens, y, dropout_rng);
}

attn_status attn_gqa_backward(attn_gqa *m, const float *dy, size_t batch, size_t tokens,
                              float *dx) {
    return attn_module_backward(attn_gqa_module(m), dy, batch, tokens, dx);
}

attn_module *attn_gqa_module(attn_gqa *m) { return m ? &m->heads.base : NULL; }
void attn_gqa_free(attn_gqa *m) { attn_module_free(attn_gqa_module(m)); }
