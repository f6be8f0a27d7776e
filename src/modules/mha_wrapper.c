/*
 * mha_wrapper.c — MultiHeadAttentionWrapper (seeds, section 3.6): num_heads
 * independent CausalAttention heads, constructed in order (heads.0 first),
 * run in order (each its own dropout call), outputs concatenated.
 *   head h: y[:, :, h*d_out:(h+1)*d_out] = CausalAttention_h(x)
 *   y (B, T, num_heads * d_out)
 * Backward: head h takes columns [h*d_out, (h+1)*d_out) of dy, and the
 * heads' input gradients add up in dx.
 */
#include "modules/module.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    size_t head_width = mw->cfg.d_out, H = mw->cfg.num_heads;
    /* each head's mask starts on a byte */
    bool keep_mask = p > 0.0 && attn_keeps_attention_mask(m, rng);
    size_t head_bytes = keep_mask ? (batch * tokens * tokens + 7) / 8 : 0, all_bits;
    if (!attn_mul3_size(head_bytes, 8, H, &all_bits))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW, "%s forward: %zu heads of (%zu, %zu, %zu) dropout masks overflow",
                         m->ops->class_name, H, batch, tokens, tokens);
    size_t head_acts = attn_single_head_acts(batch, tokens, head_width);
    float *acts;        /* per head: q, k, v, out (B, T, d_out), lse (B, T) */
    uint8_t *keep_bits; /* (H, B, T, T) when dropout draws and the backward needs it */
    if ((st = attn_forward_prepare(m, batch, tokens, H * head_acts, all_bits, &acts, &keep_bits)) !=
        ATTN_OK)
        return st;
    attn_head_spec spec = {.d_out = head_width, .scale = mw->scale, .causal = true,
                           .mask = mw->cfg.mask, .dropout_p = p};
    /* One workspace for every head, before head 0 writes y or draws; when
     * heads keep their masks, each draws into its own bits. */
    if ((st = attn_single_head_reserve(m, &spec, batch, tokens, false,
                                       p > 0.0 && !keep_bits ? rng : NULL)) != ATTN_OK) {
        attn_forward_release(m, acts);
        return st;
    }
    for (size_t h = 0; h < H && st == ATTN_OK; h++) {
        attn_qkv_weights w =
            attn_qkv_linear_weights(m, h * mw->params_per_head, mw->cfg.qkv_bias);
        /* torch.cat(dim=-1): head h fills columns [h*d_out, (h+1)*d_out). */
        st = attn_single_head_forward(m, &w, &spec, x, batch, tokens,
                                      acts + h * head_acts,
                                      keep_bits ? keep_bits + h * head_bytes : NULL,
                                      y + h * head_width, m->d_out, rng);
    }
    if (st == ATTN_OK) attn_trace_btc(m, "context_vecs", batch, tokens, m->d_out, y);
    if (st == ATTN_OK && m->grad_enabled)
        st = attn_forward_keep(m, x, batch, tokens, attn_dropout_kept_scale(p));
    attn_forward_release(m, acts);
    return st;
}

/* dx (B, T, d_in) = the sum over heads of each head's input gradient. */
static attn_status wrapper_backward(attn_module *m, const float *dy, float *dx) {
    attn_mha_wrapper *mw = (attn_mha_wrapper *)m;
    const attn_saved *s = &m->saved;
    size_t head_width = mw->cfg.d_out, rows = s->batch * s->tokens;
    size_t head_acts = attn_single_head_acts(s->batch, s->tokens, head_width);
    size_t head_bytes = (s->batch * s->tokens * s->tokens + 7) / 8;
    attn_head_spec spec = {.d_out = head_width, .scale = mw->scale, .causal = true,
                           .mask = mw->cfg.mask};
    /* Scratch and workspace for one head, shared by all, before dx and the
     * gradients are touched. */
    attn_status st;
    float *scratch = attn_scratch(m, 4 * rows * head_width, &st);
    if (!scratch) return st;
    if ((st = attn_single_head_reserve(m, &spec, s->batch, s->tokens, true, NULL)) != ATTN_OK) {
        attn_free(scratch);
        return st;
    }
    if (dx) memset(dx, 0, rows * m->d_in * sizeof *dx);
    for (size_t h = 0; h < mw->cfg.num_heads && st == ATTN_OK; h++) {
        size_t first = h * mw->params_per_head;
        attn_qkv_weights w = attn_qkv_linear_weights(m, first, mw->cfg.qkv_bias);
        attn_qkv_grads grad = attn_qkv_linear_grads(m, first, mw->cfg.qkv_bias);
        st = attn_single_head_backward(m, &w, &grad, &spec, s->x, s->batch, s->tokens,
                                       s->acts + h * head_acts,
                                       attn_saved_mask(s) ? attn_saved_mask(s) + h * head_bytes : NULL,
                                       h, dy + h * head_width, m->d_out, scratch, dx);
    }
    attn_free(scratch);
    attn_attention_release(m);
    return st;
}

const attn_module_ops attn_mha_wrapper_ops = {
    ATTN_MODULE_MHA_WRAPPER, "MultiHeadAttentionWrapper", wrapper_forward, wrapper_backward,
    ATTN_BUFFERS_HEAD_MASKS};

attn_status attn_mha_wrapper_new(attn_ctx *ctx, const attn_mha_wrapper_config *cfg,
                                 attn_rng *init_rng, attn_mha_wrapper **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_mha_wrapper_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
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
    attn_mha_wrapper *m = attn_calloc(1, sizeof *m);
    if (!m) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_mha_wrapper_new: out of memory");
    attn_module_init(&m->base, &attn_mha_wrapper_ops, ctx, cfg->d_in, total_width);
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
    for (size_t h = 0; h < cfg->num_heads && st == ATTN_OK; h++)
        st = attn_qkv_init(&m->base, &index, cfg->d_in, cfg->d_out, cfg->qkv_bias, init_rng);
    if (st != ATTN_OK) {
        attn_module_free(&m->base);
        return st;
    }
    *out = m;
    return ATTN_OK;
}

attn_status attn_mha_wrapper_forward(attn_mha_wrapper *m, const float *x, size_t batch,
                                     size_t tokens, float *y, attn_rng *dropout_rng) {
    if (!m) return ATTN_ERR_NULL;
    return wrapper_forward(&m->base, x, batch, tokens, y, dropout_rng);
}

attn_status attn_mha_wrapper_backward(attn_mha_wrapper *m, const float *dy, size_t batch,
                                      size_t tokens, float *dx) {
    return attn_module_backward(attn_mha_wrapper_module(m), dy, batch, tokens, dx);
}

attn_module *attn_mha_wrapper_module(attn_mha_wrapper *m) { return m ? &m->base : NULL; }
void attn_mha_wrapper_free(attn_mha_wrapper *m) { attn_module_free(attn_mha_wrapper_module(m)); }
