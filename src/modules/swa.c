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
 */
#include "modules/module.h"

#include "kernels/dispatch.h"

#include <stdint.h>
#include <string.h>

struct attn_swa {
    attn_module base;
    attn_swa_config cfg;
    size_t head_dim;
    float scale;
    size_t out_proj_index;
};

/* The heads of q, k, v, context (B, T, d_out), with the window. */
static attn_attention_problem swa_problem(const attn_swa *w, size_t batch, size_t tokens,
                                          const float *q, const float *k, const float *v,
                                          float *context, float *lse) {
    size_t H = w->cfg.num_heads, W = w->cfg.sliding_window_size;
    attn_attention_problem p = attn_heads_problem(batch, tokens, H, H, w->head_dim, q, k, v,
                                                  context, lse, w->scale, true, ATTN_MASK_NEG_INF);
    if (W > 0) {
        /* keys pos - (W - 1) .. pos; a window as long as the sequence or
         * longer hides nothing causal does not */
        p.window = true;
        p.window_left = W - 1 < (size_t)INT64_MAX ? (int64_t)(W - 1) : -1;
        p.window_right = 0;
    }
    return p;
}

static attn_status swa_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                               float *y, attn_rng *rng) {
    attn_swa *w = (attn_swa *)m;
    double p = m->training ? w->cfg.dropout : 0.0;
    size_t d_out = m->d_out, rows = batch * tokens, H = w->cfg.num_heads;
    attn_status st = attn_check_forward(m, x, batch, tokens, y, 0,
                                        attn_max_size(m->d_in, 4 * d_out + H), p > 0.0, rng);
    if (st != ATTN_OK) return st;
    size_t weights = 0; /* B*H*T*T, the dropout's draws */
    if (p > 0.0 && !attn_mul3_size(batch * tokens, tokens, H, &weights))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW,
                         "%s forward: the (%zu, %zu, %zu, %zu) dropout mask overflows",
                         m->ops->class_name, batch, H, tokens, tokens);
    size_t bits = p > 0.0 && attn_keeps_attention_mask(m, rng) ? weights : 0;
    float *buf;         /* q, k, v, context: (B, T, d_out) each, lse (B, H, T) */
    uint8_t *keep_bits; /* (B, H, T, T) when dropout draws and the backward needs it */
    if ((st = attn_forward_prepare(m, batch, tokens, 4 * rows * d_out + rows * H, bits, &buf,
                                   &keep_bits)) != ATTN_OK)
        return st;
    float *q = buf, *k = buf + rows * d_out, *v = buf + 2 * rows * d_out;
    float *context = buf + 3 * rows * d_out, *lse = buf + 4 * rows * d_out;
    attn_attention_problem prob = swa_problem(w, batch, tokens, q, k, v, context, lse);
    /* the attention's workspace before anything is drawn or written */
    if ((st = attn_attention_reserve(m, &prob, false, p > 0.0 ? rng : NULL)) != ATTN_OK) {
        attn_forward_release(m, buf);
        return st;
    }

    /* queries, keys, values (B, T, d_out) */
    attn_qkv_weights qkv = attn_qkv_linear_weights(m, 0, w->cfg.qkv_bias);
    attn_project_qkv(m, &qkv, x, batch, tokens, d_out, q, k, v);
    size_t split[4] = {batch, H, tokens, w->head_dim};
    attn_trace(m->ctx, m->ops->class_name, "heads (view + transpose)", 4, split, NULL);

    /* dropout over the (B, H, T, T) weights, as nn.Dropout draws them */
    attn_dropout_stream dropout;
    if (p > 0.0) attn_dropout_stream_begin(&dropout, rng, p, weights);
    st = attn_run_attention(m, &prob, p > 0.0 ? &dropout : NULL, keep_bits);
    if (st == ATTN_OK) {
        attn_trace_btc(m, "context_vec", batch, tokens, d_out, context);
        /* y (B, T, d_out) = context_vec @ W_out^T + b_out */
        const float *w_out = attn_module_data(m, w->out_proj_index);
        const float *b_out = attn_module_data(m, w->out_proj_index + 1);
        attn_k_linear(m->ctx, context, w_out, b_out, y, rows, d_out, d_out);
        attn_trace_btc(m, "out_proj", batch, tokens, d_out, y);
    }
    if (st == ATTN_OK && m->grad_enabled)
        st = attn_forward_keep(m, x, batch, tokens, attn_dropout_kept_scale(p));
    attn_forward_release(m, buf);
    return st;
}

/* dx (B, T, d_in) and every parameter's gradient from dy (B, T, d_out). */
static attn_status swa_backward(attn_module *m, const float *dy, float *dx) {
    attn_swa *w = (attn_swa *)m;
    const attn_saved *s = &m->saved;
    size_t d_out = m->d_out, rows = s->batch * s->tokens;
    const float *q = s->acts, *k = s->acts + rows * d_out, *v = s->acts + 2 * rows * d_out;
    float *context = s->acts + 3 * rows * d_out, *lse = s->acts + 4 * rows * d_out;
    attn_status st;
    float *buf = attn_scratch(m, 4 * rows * d_out, &st); /* dq, dk, dv, dcontext */
    if (!buf) return st;
    float *dq = buf, *dk = buf + rows * d_out, *dv = buf + 2 * rows * d_out;
    float *dcontext = buf + 3 * rows * d_out;
    attn_attention_problem prob = swa_problem(w, s->batch, s->tokens, q, k, v, context, lse);
    if ((st = attn_attention_reserve(m, &prob, true, NULL)) != ATTN_OK) { /* before any gradient */
        attn_free(buf);
        return st;
    }

    /* forward: y = context @ W_out^T + b_out */
    size_t out = w->out_proj_index;
    attn_k_linear_backward(m->ctx, context, attn_module_data(m, out), dy, dcontext, false,
                           attn_module_grad(m, out), attn_module_grad(m, out + 1), rows, d_out,
                           d_out);
    /* forward: context (B, T, H, hd) = dropout(softmax(window(q k^T * scale))) v */
    attn_attention_grads grads = {.dout = dcontext, .dq = dq, .dk = dk, .dv = dv};
    st = attn_run_attention_backward(m, &prob, &grads, 0, attn_saved_mask(s));
    if (st == ATTN_OK) {
        /* forward: q, k, v = W_query(x), W_key(x), W_value(x) */
        if (dx) memset(dx, 0, rows * m->d_in * sizeof *dx);
        attn_qkv_weights qkv = attn_qkv_linear_weights(m, 0, w->cfg.qkv_bias);
        attn_qkv_grads grad = attn_qkv_linear_grads(m, 0, w->cfg.qkv_bias);
        attn_project_qkv_backward(m, &qkv, &grad, s->x, rows, d_out, dq, dk, dv, dx);
    }
    attn_free(buf);
    attn_attention_release(m);
    return st;
}

static const attn_module_ops swa_ops = {ATTN_MODULE_SWA, "MultiHeadAttentionWithSWA",
                                        swa_forward, swa_backward};

attn_status attn_swa_new(attn_ctx *ctx, const attn_swa_config *cfg, attn_rng *init_rng,
                         attn_swa **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_swa_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    const char *name = "MultiHeadAttentionWithSWA";
    attn_status st;
    if ((st = attn_check_width(ctx, name, "d_in", cfg->d_in)) != ATTN_OK ||
        (st = attn_check_width(ctx, name, "d_out", cfg->d_out)) != ATTN_OK ||
        (st = attn_check_heads(ctx, name, cfg->d_out, cfg->num_heads)) != ATTN_OK ||
        (st = attn_check_dropout(ctx, name, cfg->dropout)) != ATTN_OK ||
        (st = attn_check_scale(ctx, name, cfg->scale)) != ATTN_OK)
        return st;
    attn_swa *w = attn_calloc(1, sizeof *w);
    if (!w) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_swa_new: out of memory");
    attn_module_init(&w->base, &swa_ops, ctx, cfg->d_in, cfg->d_out);
    w->cfg = *cfg;
    w->head_dim = cfg->d_out / cfg->num_heads;
    w->scale = attn_default_scale(cfg->scale, w->head_dim);
    w->out_proj_index = cfg->qkv_bias ? 6 : 3;
    /* MultiHeadAttention's parameters, in its order */
    if ((st = attn_qkv_declare(&w->base, "", cfg->d_in, cfg->d_out, cfg->qkv_bias)) != ATTN_OK ||
        (st = attn_module_declare_linear(&w->base, "out_proj", cfg->d_out, cfg->d_out, true)) !=
            ATTN_OK ||
        (st = attn_module_alloc(&w->base)) != ATTN_OK) {
        attn_module_free(&w->base);
        return st;
    }
    size_t index = attn_qkv_init(&w->base, 0, cfg->d_in, cfg->d_out, cfg->qkv_bias, init_rng);
    attn_module_init_linear(&w->base, init_rng, index, true, cfg->d_out, cfg->d_out);
    *out = w;
    return ATTN_OK;
}

attn_status attn_swa_forward(attn_swa *m, const float *x, size_t batch, size_t tokens, float *y,
                             attn_rng *dropout_rng) {
    if (!m) return ATTN_ERR_NULL;
    return swa_forward(&m->base, x, batch, tokens, y, dropout_rng);
}

attn_status attn_swa_backward(attn_swa *m, const float *dy, size_t batch, size_t tokens,
                              float *dx) {
    return attn_module_backward(attn_swa_module(m), dy, batch, tokens, dx);
}

attn_module *attn_swa_module(attn_swa *m) { return m ? &m->base : NULL; }
void attn_swa_free(attn_swa *m) { attn_module_free(attn_swa_module(m)); }
