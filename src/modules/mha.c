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
 * (and the dropout mask) the forward kept.
 */
#include "modules/module.h"

#include "kernels/dispatch.h"

#include <stdlib.h>
#include <string.h>

struct attn_mha {
    attn_module base;
    attn_mha_config cfg;
    size_t head_dim;
    float scale;
    size_t out_proj_index;
};

/* The heads as views of q, k, v and context (B, T, d_out): element
 * (b, t, h, d) sits at b*T*d_out + t*d_out + h*hd + d. */
static attn_attention_problem mha_heads(const attn_mha *mha, size_t batch, size_t tokens,
                                        const float *q, const float *k, const float *v,
                                        float *context, float *lse) {
    size_t H = mha->cfg.num_heads;
    return attn_heads_problem(batch, tokens, H, H, mha->head_dim, q, k, v, context, lse,
                              mha->scale, true, mha->cfg.mask);
}

static attn_status mha_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                               float *y, attn_rng *rng) {
    attn_mha *mha = (attn_mha *)m;
    double p = m->training ? mha->cfg.dropout : 0.0;
    size_t d_out = m->d_out, rows = batch * tokens, H = mha->cfg.num_heads;
    attn_status st = attn_check_forward(m, x, batch, tokens, y, mha->cfg.context_length,
                                        attn_max_size(m->d_in, 4 * d_out), p > 0.0, rng);
    if (st != ATTN_OK) return st;
    size_t bits = 0;
    if (p > 0.0 && attn_keeps_attention_mask(m, rng) &&
        !attn_mul3_size(batch * tokens, tokens, H, &bits))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW, "%s forward: the (%zu, %zu, %zu, %zu) dropout mask overflows",
                         m->ops->class_name, batch, H, tokens, tokens);
    float *buf;         /* q, k, v, context: (B, T, d_out) each, lse (B, H, T) */
    uint8_t *keep_bits; /* (B, H, T, T) when dropout draws and the backward needs it */
    if ((st = attn_forward_prepare(m, batch, tokens, 4 * rows * d_out + rows * H, bits, &buf,
                                   &keep_bits)) != ATTN_OK)
        return st;
    float *q = buf, *k = buf + rows * d_out, *v = buf + 2 * rows * d_out;
    float *context = buf + 3 * rows * d_out, *lse = buf + 4 * rows * d_out;
    attn_attention_problem heads = mha_heads(mha, batch, tokens, q, k, v, context, lse);
    /* the attention's workspace before anything is drawn or written */
    if ((st = attn_attention_reserve(m, &heads, false, p > 0.0 ? rng : NULL)) != ATTN_OK) {
        attn_forward_release(m, buf);
        return st;
    }

    attn_qkv_weights w = attn_qkv_linear_weights(m, 0, mha->cfg.qkv_bias);
    attn_project_qkv(m, &w, x, batch, tokens, d_out, q, k, v);
    size_t split[4] = {batch, H, tokens, mha->head_dim};
    attn_trace(m->ctx, m->ops->class_name, "heads (view + transpose)", 4, split, NULL);

    attn_dropout_stream dropout;
    if (p > 0.0) attn_dropout_stream_begin(&dropout, rng, p, batch * H * tokens * tokens);
    st = attn_run_attention(m, &heads, p > 0.0 ? &dropout : NULL, keep_bits);
    if (st == ATTN_OK) {
        attn_trace_btc(m, "context_vec", batch, tokens, d_out, context);
        const float *w_out = attn_module_data(m, mha->out_proj_index);
        const float *b_out = attn_module_data(m, mha->out_proj_index + 1);
        attn_k_linear(m->ctx, context, w_out, b_out, y, rows, d_out, d_out);
        attn_trace_btc(m, "out_proj", batch, tokens, d_out, y);
    }
    if (st == ATTN_OK && m->grad_enabled)
        st = attn_forward_keep(m, x, batch, tokens, attn_dropout_kept_scale(p));
    attn_forward_release(m, buf);
    return st;
}

/* dx (B, T, d_in) and every parameter's gradient from dy (B, T, d_out). */
static attn_status mha_backward(attn_module *m, const float *dy, float *dx) {
    attn_mha *mha = (attn_mha *)m;
    const attn_saved *s = &m->saved;
    size_t d_out = m->d_out, rows = s->batch * s->tokens;
    const float *q = s->acts, *k = s->acts + rows * d_out, *v = s->acts + 2 * rows * d_out;
    float *context = s->acts + 3 * rows * d_out;
    const float *lse = s->acts + 4 * rows * d_out;
    attn_status st;
    float *buf = attn_scratch(m, 4 * rows * d_out, &st); /* dq, dk, dv, dcontext */
    if (!buf) return st;
    float *dq = buf, *dk = buf + rows * d_out, *dv = buf + 2 * rows * d_out;
    float *dcontext = buf + 3 * rows * d_out;
    attn_attention_problem fwd = mha_heads(mha, s->batch, s->tokens, q, k, v, context,
                                           (float *)lse);
    if ((st = attn_attention_reserve(m, &fwd, true, NULL)) != ATTN_OK) { /* before any gradient */
        attn_free(buf);
        return st;
    }

    /* forward: y = context @ W_out^T + b_out */
    size_t out = mha->out_proj_index;
    attn_k_linear_backward(m->ctx, context, attn_module_data(m, out), dy, dcontext, false,
                             attn_module_grad(m, out), attn_module_grad(m, out + 1), rows, d_out,
                             d_out);
    /* forward: context (B, T, H, hd) = dropout(softmax(mask(q k^T * scale))) v, per head */
    attn_attention_grads g = {.dout = dcontext, .dq = dq, .dk = dk, .dv = dv};
    st = attn_run_attention_backward(m, &fwd, &g, 0, attn_saved_mask(s));
    if (st == ATTN_OK) {
        /* forward: q, k, v = W_query(x), W_key(x), W_value(x) */
        if (dx) memset(dx, 0, rows * m->d_in * sizeof *dx);
        attn_qkv_weights w = attn_qkv_linear_weights(m, 0, mha->cfg.qkv_bias);
        attn_qkv_grads grad = attn_qkv_linear_grads(m, 0, mha->cfg.qkv_bias);
        attn_project_qkv_backward(m, &w, &grad, s->x, rows, d_out, dq, dk, dv, dx);
    }
    attn_free(buf);
    attn_attention_release(m);
    return st;
}

static const attn_module_ops mha_ops = {ATTN_MODULE_MHA, "MultiHeadAttention", mha_forward,
                                        mha_backward};

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
    attn_mha *m = attn_calloc(1, sizeof *m);
    if (!m) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_mha_new: out of memory");
    attn_module_init(&m->base, &mha_ops, ctx, cfg->d_in, cfg->d_out);
    m->base.mask_buffer = cfg->context_length;
    m->cfg = *cfg;
    m->head_dim = cfg->d_out / cfg->num_heads;
    m->scale = attn_default_scale(cfg->scale, m->head_dim);
    m->out_proj_index = cfg->qkv_bias ? 6 : 3;
    if ((st = attn_qkv_declare(&m->base, "", cfg->d_in, cfg->d_out, cfg->qkv_bias)) != ATTN_OK ||
        (st = attn_module_declare_linear(&m->base, "out_proj", cfg->d_out, cfg->d_out, true)) !=
            ATTN_OK ||
        (st = attn_module_alloc(&m->base)) != ATTN_OK) {
        attn_module_free(&m->base);
        return st;
    }
    size_t index = attn_qkv_init(&m->base, 0, cfg->d_in, cfg->d_out, cfg->qkv_bias, init_rng);
    attn_module_init_linear(&m->base, init_rng, index, true, cfg->d_out, cfg->d_out);
    *out = m;
    return ATTN_OK;
}

attn_status attn_mha_forward(attn_mha *m, const float *x, size_t batch, size_t tokens, float *y,
                             attn_rng *dropout_rng) {
    if (!m) return ATTN_ERR_NULL;
    return mha_forward(&m->base, x, batch, tokens, y, dropout_rng);
}

attn_status attn_mha_backward(attn_mha *m, const float *dy, size_t batch, size_t tokens,
                              float *dx) {
    return attn_module_backward(attn_mha_module(m), dy, batch, tokens, dx);
}

attn_module *attn_mha_module(attn_mha *m) { return m ? &m->base : NULL; }
void attn_mha_free(attn_mha *m) { attn_module_free(attn_mha_module(m)); }
