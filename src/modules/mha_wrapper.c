/*
 * mha_wrapper.c — MultiHeadAttentionWrapper (seeds, section 3.6): num_heads
 * independent CausalAttention heads, constructed in order (heads.0 first),
 * run in order (each its own dropout call), outputs concatenated.
 *   head h: y[:, :, h*d_out:(h+1)*d_out] = CausalAttention_h(x)
 *   y (B, T, num_heads * d_out)
 */
#include "modules/module.h"

#include <stdio.h>
#include <stdlib.h>

struct attn_mha_wrapper {
    attn_module base;
    attn_mha_wrapper_config cfg;
    float scale;
    size_t params_per_head;
};

static attn_status wrapper_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                                   float *y, attn_rng *rng) {
    attn_mha_wrapper *mw = (attn_mha_wrapper *)m;
    double p = m->training ? mw->cfg.dropout : 0.0;
    attn_status st = attn_check_forward(m, x, batch, tokens, y, mw->cfg.context_length,
                                        attn_max_size(m->d_in, 3 * m->d_out), p > 0.0, rng);
    if (st != ATTN_OK) return st;
    size_t head_width = mw->cfg.d_out;
    attn_head_spec spec = {.d_out = head_width, .scale = mw->scale, .causal = true,
                           .mask = mw->cfg.mask, .dropout_p = p};
    for (size_t h = 0; h < mw->cfg.num_heads && st == ATTN_OK; h++) {
        attn_qkv_weights w =
            attn_qkv_linear_weights(m, h * mw->params_per_head, mw->cfg.qkv_bias);
        /* torch.cat(dim=-1): head h fills columns [h*d_out, (h+1)*d_out). */
        st = attn_single_head_forward(m, &w, &spec, x, batch, tokens, y + h * head_width,
                                      m->d_out, rng);
    }
    if (st == ATTN_OK) attn_trace_btc(m, "context_vecs", batch, tokens, m->d_out, y);
    return st;
}

static const attn_module_ops wrapper_ops = {ATTN_MODULE_MHA_WRAPPER, "MultiHeadAttentionWrapper",
                                            wrapper_forward};

attn_status attn_mha_wrapper_new(attn_ctx *ctx, const attn_mha_wrapper_config *cfg,
                                 attn_rng *init_rng, attn_mha_wrapper **out) {
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_mha_wrapper_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    *out = NULL;
    const char *name = "MultiHeadAttentionWrapper";
    attn_status st = attn_check_causal_config(ctx, name, cfg->d_in, cfg->d_out,
                                              cfg->context_length, cfg->dropout, cfg->scale,
                                              cfg->mask);
    if (st != ATTN_OK) return st;
    if ((st = attn_check_width(ctx, name, "num_heads", cfg->num_heads)) != ATTN_OK) return st;
    size_t total_width;
    if (!attn_mul_size(cfg->num_heads, cfg->d_out, &total_width) || total_width > (size_t)-1 / 4)
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: num_heads (%zu) x d_out (%zu) overflows",
                         name, cfg->num_heads, cfg->d_out);
    /* Every head holds 3 weights (d_out, d_in) and maybe 3 biases: check the
     * total before declaring num_heads heads one by one. */
    size_t per_head, all_heads;
    if (!attn_mul_size(cfg->d_in, cfg->d_out, &per_head) ||
        !attn_add_size(per_head, cfg->qkv_bias ? cfg->d_out : 0, &per_head) ||
        !attn_mul3_size(per_head, 3, cfg->num_heads, &all_heads) || !attn_floats_fit(all_heads))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "%s: num_heads (%zu) x 3 x d_in (%zu) x d_out (%zu) parameters overflow",
                         name, cfg->num_heads, cfg->d_in, cfg->d_out);
    attn_mha_wrapper *m = calloc(1, sizeof *m);
    if (!m) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_mha_wrapper_new: out of memory");
    attn_module_init(&m->base, &wrapper_ops, ctx, cfg->d_in, total_width);
    m->base.mask_buffer = cfg->context_length;
    m->cfg = *cfg;
    m->scale = attn_default_scale(cfg->scale, cfg->d_out);
    m->params_per_head = cfg->qkv_bias ? 6 : 3;
    char prefix[32];
    st = attn_module_reserve(&m->base, m->params_per_head * cfg->num_heads);
    for (size_t h = 0; h < cfg->num_heads && st == ATTN_OK; h++) {
        snprintf(prefix, sizeof prefix, "heads.%zu.", h);
        st = attn_qkv_declare(&m->base, prefix, cfg->d_in, cfg->d_out, cfg->qkv_bias);
    }
    if (st == ATTN_OK) st = attn_module_alloc(&m->base);
    if (st != ATTN_OK) {
        attn_module_free(&m->base);
        return st;
    }
    size_t index = 0;
    for (size_t h = 0; h < cfg->num_heads; h++)
        index = attn_qkv_init(&m->base, index, cfg->d_in, cfg->d_out, cfg->qkv_bias, init_rng);
    *out = m;
    return ATTN_OK;
}

attn_status attn_mha_wrapper_forward(attn_mha_wrapper *m, const float *x, size_t batch,
                                     size_t tokens, float *y, attn_rng *dropout_rng) {
    if (!m) return ATTN_ERR_NULL;
    return wrapper_forward(&m->base, x, batch, tokens, y, dropout_rng);
}

attn_module *attn_mha_wrapper_module(attn_mha_wrapper *m) { return m ? &m->base : NULL; }
void attn_mha_wrapper_free(attn_mha_wrapper *m) { attn_module_free(attn_mha_wrapper_module(m)); }
