/*
 * heads.c — projected multi-head attention, the path MultiHeadAttention
 * (mha.c), MultiHeadAttentionWithSWA (swa.c), GroupedQueryAttention (gqa.c)
 * and MultiHeadLatentAttention (mla.c) share; each of those files holds its
 * constructor and the spec (attn_heads_spec, module.h) that sets it apart.
 *   queries (B, T, d_out)    = W_query(x), viewed as (B, Hq, T, hd)
 *   keys, values (B, T, kvw) = W_key(x), W_value(x), viewed as (B, Hkv, T, hd)
 *     (or the module's own K/V path: MLA's latent), kvw = Hkv * hd
 *   attn_weights (B, Hq, T, T) = dropout(softmax(mask(q k^T * scale)))
 *     causal, within the window when there is one; query head h reads KV
 *     head h / (Hq / Hkv) in place
 *   context_vec  (B, Hq, T, hd) = attn_weights @ values, back to (B, T, d_out)
 *   y (B, T, d_out) = out_proj(context_vec), with or without its bias
 * The backward walks these steps in reverse from what the forward kept
 * (x, q, k, v, context_vec, each row's log-sum-exp and the dropout mask);
 * dk and dv come back at Hkv heads, each summing its group's query heads.
 */
#include "modules/module.h"

#include "kernels/dispatch.h"

#include <stdint.h>
#include <string.h>

static size_t kv_width(const attn_heads_spec *h) { return h->kv_heads * h->head_dim; }

/* Floats per row of a forward's activations: q, context (d_out); k, v
 * (kv_width); lse and lse_lo (Hq each), row_stats (2 Hq); the projection's
 * extra. */
static size_t acts_per_row(const attn_module *m, const attn_heads_spec *h) {
    return 2 * m->d_out + 2 * kv_width(h) + 4 * h->q_heads + h->extra;
}

static attn_heads_acts acts_at(const attn_module *m, const attn_heads_spec *h, float *buf,
                               size_t rows) {
    attn_heads_acts a;
    a.q = buf;
    a.k = a.q + rows * m->d_out;
    a.v = a.k + rows * kv_width(h);
    a.context = a.v + rows * kv_width(h);
    a.lse = a.context + rows * m->d_out;
    a.lse_lo = a.lse + rows * h->q_heads;
    a.row_stats = a.lse_lo + rows * h->q_heads;
    a.extra = a.row_stats + 2 * rows * h->q_heads;
    return a;
}

/* The heads of q, context (B, T, d_out) and k, v (B, T, kv_width), causal,
 * with the window when there is one. */
static attn_attention_problem heads_problem(const attn_heads_spec *h, size_t batch,
                                            size_t tokens, const attn_heads_acts *a) {
    attn_attention_problem p =
        attn_heads_problem(batch, tokens, h->q_heads, h->kv_heads, h->head_dim, a->q, a->k, a->v,
                           a->context, a->lse, h->scale, true, h->mask);
    p.lse_lo = a->lse_lo;
    p.row_stats = a->row_stats;
    if (h->window > 0) {
        /* keys pos - (W - 1) .. pos; a window as long as the sequence or
         * longer hides nothing causal does not */
        p.window = true;
        p.window_left = h->window - 1 < (size_t)INT64_MAX ? (int64_t)(h->window - 1) : -1;
        p.window_right = 0;
    }
    return p;
}

/* queries (B, T, d_out) = W_query(x); keys, values (B, T, kv_width) =
 * W_key(x), W_value(x) */
static void project_qkv(attn_module *m, const attn_heads_spec *h, const float *x, size_t batch,
                        size_t tokens, const attn_heads_acts *a) {
    size_t rows = batch * tokens, d_in = m->d_in, d_out = m->d_out, kvw = kv_width(h);
    bool bias = h->qkv_bias;
    attn_k_linear(m->ctx, x, attn_module_data(m, h->query_index),
                  attn_module_bias(m, h->query_index, bias), a->q, rows, d_in, d_out);
    attn_k_linear(m->ctx, x, attn_module_data(m, h->key_index),
                  attn_module_bias(m, h->key_index, bias), a->k, rows, d_in, kvw);
    attn_k_linear(m->ctx, x, attn_module_data(m, h->value_index),
                  attn_module_bias(m, h->value_index, bias), a->v, rows, d_in, kvw);
    attn_trace_btc(m, "queries", batch, tokens, d_out, a->q);
    attn_trace_btc(m, "keys", batch, tokens, kvw, a->k);
    attn_trace_btc(m, "values", batch, tokens, kvw, a->v);
}

/* forward: q = W_query(x), k = W_key(x), v = W_value(x):
 * dx (rows, d_in) = dq W_query + dk W_key + dv W_value */
static void project_qkv_backward(attn_module *m, const attn_heads_spec *h, const float *x,
                                 size_t rows, const float *dq, const float *dk, const float *dv,
                                 float *dx) {
    const size_t index[3] = {h->query_index, h->key_index, h->value_index};
    const size_t width[3] = {m->d_out, kv_width(h), kv_width(h)};
    const float *grad_out[3] = {dq, dk, dv};
    for (int i = 0; i < 3; i++)
        attn_k_linear_backward(m->ctx, x, attn_module_data(m, index[i]), grad_out[i], dx, i > 0,
                               attn_module_grad(m, index[i]),
                               attn_module_bias_grad(m, index[i], h->qkv_bias), rows, m->d_in,
                               width[i]);
}

attn_status attn_heads_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                               float *y, attn_rng *rng) {
    const attn_heads_spec *h = &((attn_heads_module *)m)->spec;
    double p = m->training ? h->dropout : 0.0;
    size_t d_out = m->d_out, rows = batch * tokens, H = h->q_heads;
    attn_status st = attn_check_forward(m, x, batch, tokens, y, h->context_length,
                                        attn_max_size(m->d_in, h->check_width), p > 0.0, rng);
    if (st != ATTN_OK) return st;
    size_t weights = 0; /* B*H*T*T, the dropout's draws */
    if (p > 0.0 && !attn_mul3_size(batch * tokens, tokens, H, &weights))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW,
                         "%s forward: the (%zu, %zu, %zu, %zu) dropout mask overflows",
                         m->ops->class_name, batch, H, tokens, tokens);
    size_t bits = p > 0.0 && attn_keeps_attention_mask(m, rng) ? weights : 0;
    float *buf;         /* attn_heads_acts */
    uint8_t *keep_bits; /* (B, H, T, T) when dropout draws and the backward needs it */
    if ((st = attn_forward_prepare(m, batch, tokens, rows * acts_per_row(m, h), bits, &buf,
                                   &keep_bits)) != ATTN_OK)
        return st;
    attn_heads_acts a = acts_at(m, h, buf, rows);
    attn_attention_problem prob = heads_problem(h, batch, tokens, &a);
    /* the attention's workspace before anything is drawn or written */
    if ((st = attn_attention_reserve(m, &prob, false, p > 0.0 ? rng : NULL)) != ATTN_OK) {
        attn_forward_release(m, buf);
        return st;
    }

    if (h->project)
        h->project(m, x, batch, tokens, &a);
    else
        project_qkv(m, h, x, batch, tokens, &a);
    size_t split[4] = {batch, H, tokens, h->head_dim};
    attn_trace(m->ctx, m->ops->class_name, "heads (view + transpose)", 4, split, NULL);

    /* dropout over the (B, H, T, T) weights, as nn.Dropout draws them */
    attn_dropout_stream dropout;
    if (p > 0.0) attn_dropout_stream_begin(&dropout, rng, p, weights);
    st = attn_run_attention(m, &prob, p > 0.0 ? &dropout : NULL, keep_bits);
    if (st == ATTN_OK) {
        attn_trace_btc(m, "context_vec", batch, tokens, d_out, a.context);
        /* y (B, T, d_out) = context_vec @ W_out^T (+ b_out) */
        attn_k_linear(m->ctx, a.context, attn_module_data(m, h->out_index),
                      attn_module_bias(m, h->out_index, h->out_bias), y, rows, d_out, d_out);
        attn_trace_btc(m, "out_proj", batch, tokens, d_out, y);
    }
    if (st == ATTN_OK && m->grad_enabled)
        st = attn_forward_keep(m, x, batch, tokens, attn_dropout_kept_scale(p));
    attn_forward_release(m, buf);
    return st;
}

/* dx (B, T, d_in) and every parameter's gradient from dy (B, T, d_out). */
attn_status attn_heads_backward(attn_module *m, const float *dy, float *dx) {
    const attn_heads_spec *h = &((attn_heads_module *)m)->spec;
    const attn_saved *s = &m->saved;
    size_t d_out = m->d_out, kvw = kv_width(h), rows = s->batch * s->tokens;
    attn_heads_acts a = acts_at(m, h, s->acts, rows);
    attn_status st;
    /* dq, dcontext (rows, d_out); dk, dv (rows, kv_width); dextra (rows, extra) */
    float *buf = attn_scratch(m, rows * (2 * d_out + 2 * kvw + h->extra), &st);
    if (!buf) return st;
    float *dq = buf, *dcontext = buf + rows * d_out;
    float *dk = buf + 2 * rows * d_out, *dv = dk + rows * kvw, *dextra = dv + rows * kvw;
    attn_attention_problem prob = heads_problem(h, s->batch, s->tokens, &a);
    if ((st = attn_attention_reserve(m, &prob, true, NULL)) != ATTN_OK) { /* before any gradient */
        attn_free(buf);
        return st;
    }

    /* forward: y = context @ W_out^T (+ b_out) */
    attn_k_linear_backward(m->ctx, a.context, attn_module_data(m, h->out_index), dy, dcontext,
                           false, attn_module_grad(m, h->out_index),
                           attn_module_bias_grad(m, h->out_index, h->out_bias), rows, d_out, d_out);
    /* forward: context (B, T, H, hd) = dropout(softmax(mask(q k^T * scale))) v,
     * query head h reading KV head h / group_size: dk, dv sum the group */
    attn_attention_grads grads = {.dout = dcontext, .dq = dq, .dk = dk, .dv = dv};
    st = attn_run_attention_backward(m, &prob, &grads, 0, attn_saved_mask(s));
    if (st == ATTN_OK) {
        if (h->project_backward)
            h->project_backward(m, s->x, rows, &a, dq, dk, dv, dextra, dx);
        else
            project_qkv_backward(m, h, s->x, rows, dq, dk, dv, dx);
    }
    attn_free(buf);
    attn_attention_release(m);
    return st;
}

attn_heads_module *attn_heads_alloc(attn_ctx *ctx, const attn_module_ops *ops, size_t bytes,
                                    size_t d_in, size_t d_out, const char *fn) {
    attn_heads_module *h = attn_calloc(1, bytes);
    if (!h) {
        attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", fn);
        return NULL;
    }
    attn_module_init(&h->base, ops, ctx, d_in, d_out);
    return h;
}

attn_status attn_check_heads_config(attn_ctx *ctx, const char *name, size_t d_in, size_t d_out,
                                    size_t num_heads, double dropout, double scale) {
    attn_status st;
    if ((st = attn_check_width(ctx, name, "d_in", d_in)) != ATTN_OK ||
        (st = attn_check_width(ctx, name, "d_out", d_out)) != ATTN_OK ||
        (st = attn_check_heads(ctx, name, d_out, num_heads)) != ATTN_OK ||
        (st = attn_check_dropout(ctx, name, dropout)) != ATTN_OK ||
        (st = attn_check_scale(ctx, name, scale)) != ATTN_OK)
        return st;
    return ATTN_OK;
}

attn_status attn_heads_build_mha(attn_heads_module *h, size_t d_in, size_t d_out, bool qkv_bias,
                                 attn_rng *init_rng) {
    attn_module *m = &h->base;
    size_t per = qkv_bias ? 2 : 1; /* tensors per projection */
    h->spec.qkv_bias = qkv_bias;
    h->spec.query_index = 0;
    h->spec.key_index = per;
    h->spec.value_index = 2 * per;
    h->spec.out_index = 3 * per;
    h->spec.out_bias = true;
    attn_status st;
    if ((st = attn_qkv_declare(m, "", d_in, d_out, qkv_bias)) != ATTN_OK ||
        (st = attn_module_declare_linear(m, "out_proj", d_out, d_out, true)) != ATTN_OK ||
        (st = attn_module_alloc(m)) != ATTN_OK) {
        attn_module_free(m);
        return st;
    }
    size_t index = 0;
    if ((st = attn_qkv_init(m, &index, d_in, d_out, qkv_bias, init_rng)) != ATTN_OK ||
        (st = attn_module_init_linear(m, init_rng, &index, true, d_out, d_out)) != ATTN_OK)
        attn_module_free(m);
    return st;
}
