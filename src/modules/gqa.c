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
 */
#include "modules/module.h"

#include "kernels/dispatch.h"

#include <string.h>

/* state_dict order: the book registers W_key and W_value before W_query. */
struct attn_gqa {
    attn_module base;
    attn_gqa_config cfg;
    size_t head_dim, kv_width; /* kv_width = num_kv_groups * head_dim */
    float scale;
    size_t key_index, value_index, query_index, out_index; /* weight indices */
};

/* The heads of q, context (B, T, d_out) and of k, v (B, T, kv_width):
 * G = num_kv_groups KV heads, rows kv_width wide. */
static attn_attention_problem gqa_problem(const attn_gqa *g, size_t batch, size_t tokens,
                                          const float *q, const float *k, const float *v,
                                          float *context, float *lse) {
    return attn_heads_problem(batch, tokens, g->cfg.num_heads, g->cfg.num_kv_groups,
                              g->head_dim, q, k, v, context, lse, g->scale, true,
                              ATTN_MASK_NEG_INF);
}

/* The layout of a forward's activations: q, k, v, context, lse. */
typedef struct gqa_acts {
    float *q, *k, *v, *context, *lse;
} gqa_acts;

static size_t gqa_acts_floats(const attn_gqa *g, size_t rows) {
    /* q, context (rows, d_out); k, v (rows, kv_width); lse (rows, H) */
    return rows * (2 * g->base.d_out + 2 * g->kv_width + g->cfg.num_heads);
}

static gqa_acts gqa_acts_at(const attn_gqa *g, float *buf, size_t rows) {
    gqa_acts a;
    a.q = buf;
    a.k = a.q + rows * g->base.d_out;
    a.v = a.k + rows * g->kv_width;
    a.context = a.v + rows * g->kv_width;
    a.lse = a.context + rows * g->base.d_out;
    return a;
}

static const float *bias_of(attn_module *m, size_t weight_index, bool bias) {
    return bias ? attn_module_data(m, weight_index + 1) : NULL;
}

static float *bias_grad_of(attn_module *m, size_t weight_index, bool bias) {
    return bias ? attn_module_grad(m, weight_index + 1) : NULL;
}

static attn_status gqa_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                               float *y, attn_rng *rng) {
    attn_gqa *g = (attn_gqa *)m;
    double p = m->training ? g->cfg.dropout : 0.0;
    size_t d_in = m->d_in, d_out = m->d_out, rows = batch * tokens, H = g->cfg.num_heads;
    bool bias = g->cfg.qkv_bias;
    attn_status st = attn_check_forward(m, x, batch, tokens, y, 0,
                                        attn_max_size(d_in, 4 * d_out + H), p > 0.0, rng);
    if (st != ATTN_OK) return st;
    size_t weights = 0; /* B*H*T*T, the dropout's draws */
    if (p > 0.0 && !attn_mul3_size(batch * tokens, tokens, H, &weights))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW,
                         "%s forward: the (%zu, %zu, %zu, %zu) dropout mask overflows",
                         m->ops->class_name, batch, H, tokens, tokens);
    size_t bits = p > 0.0 && attn_keeps_attention_mask(m, rng) ? weights : 0;
    float *buf;         /* gqa_acts */
    uint8_t *keep_bits; /* (B, H, T, T) when dropout draws and the backward needs it */
    if ((st = attn_forward_prepare(m, batch, tokens, gqa_acts_floats(g, rows), bits, &buf,
                                   &keep_bits)) != ATTN_OK)
        return st;
    gqa_acts a = gqa_acts_at(g, buf, rows);
    attn_attention_problem prob = gqa_problem(g, batch, tokens, a.q, a.k, a.v, a.context, a.lse);
    /* the attention's workspace before anything is drawn or written */
    if ((st = attn_attention_reserve(m, &prob, false, p > 0.0 ? rng : NULL)) != ATTN_OK) {
        attn_forward_release(m, buf);
        return st;
    }

    /* queries (B, T, d_out); keys, values (B, T, G*hd) */
    attn_k_linear(m->ctx, x, attn_module_data(m, g->query_index), bias_of(m, g->query_index, bias),
                  a.q, rows, d_in, d_out);
    attn_k_linear(m->ctx, x, attn_module_data(m, g->key_index), bias_of(m, g->key_index, bias),
                  a.k, rows, d_in, g->kv_width);
    attn_k_linear(m->ctx, x, attn_module_data(m, g->value_index),
                  bias_of(m, g->value_index, bias), a.v, rows, d_in, g->kv_width);
    attn_trace_btc(m, "queries", batch, tokens, d_out, a.q);
    attn_trace_btc(m, "keys", batch, tokens, g->kv_width, a.k);
    attn_trace_btc(m, "values", batch, tokens, g->kv_width, a.v);
    size_t split[4] = {batch, H, tokens, g->head_dim};
    attn_trace(m->ctx, m->ops->class_name, "heads (view + transpose)", 4, split, NULL);

    /* dropout over the (B, H, T, T) weights, as nn.Dropout draws them */
    attn_dropout_stream dropout;
    if (p > 0.0) attn_dropout_stream_begin(&dropout, rng, p, weights);
    st = attn_run_attention(m, &prob, p > 0.0 ? &dropout : NULL, keep_bits);
    if (st == ATTN_OK) {
        attn_trace_btc(m, "context_vec", batch, tokens, d_out, a.context);
        /* y (B, T, d_out) = context_vec @ W_out^T */
        attn_k_linear(m->ctx, a.context, attn_module_data(m, g->out_index), NULL, y, rows, d_out,
                      d_out);
        attn_trace_btc(m, "out_proj", batch, tokens, d_out, y);
    }
    if (st == ATTN_OK && m->grad_enabled)
        st = attn_forward_keep(m, x, batch, tokens, attn_dropout_kept_scale(p));
    attn_forward_release(m, buf);
    return st;
}

/* dx (B, T, d_in) and every parameter's gradient from dy (B, T, d_out). */
static attn_status gqa_backward(attn_module *m, const float *dy, float *dx) {
    attn_gqa *g = (attn_gqa *)m;
    const attn_saved *s = &m->saved;
    size_t d_in = m->d_in, d_out = m->d_out, kvw = g->kv_width, rows = s->batch * s->tokens;
    bool bias = g->cfg.qkv_bias;
    gqa_acts a = gqa_acts_at(g, s->acts, rows);
    attn_status st;
    /* dq, dcontext (rows, d_out); dk, dv (rows, kv_width) */
    float *buf = attn_scratch(m, rows * (2 * d_out + 2 * kvw), &st);
    if (!buf) return st;
    float *dq = buf, *dcontext = buf + rows * d_out;
    float *dk = buf + 2 * rows * d_out, *dv = dk + rows * kvw;
    attn_attention_problem prob =
        gqa_problem(g, s->batch, s->tokens, a.q, a.k, a.v, a.context, a.lse);
    if ((st = attn_attention_reserve(m, &prob, true, NULL)) != ATTN_OK) { /* before any gradient */
        attn_free(buf);
        return st;
    }

    /* forward: y = context @ W_out^T */
    attn_k_linear_backward(m->ctx, a.context, attn_module_data(m, g->out_index), dy, dcontext,
                           false, attn_module_grad(m, g->out_index), NULL, rows, d_out, d_out);
    /* forward: context (B, T, H, hd) = dropout(softmax(mask(q k^T * scale))) v,
     * query head h reading KV head h / group_size: dk, dv sum the group */
    attn_attention_grads grads = {.dout = dcontext, .dq = dq, .dk = dk, .dv = dv};
    st = attn_run_attention_backward(m, &prob, &grads, 0, attn_saved_mask(s));
    if (st == ATTN_OK) {
        /* forward: q = W_query(x), k = W_key(x), v = W_value(x) */
        const size_t index[3] = {g->query_index, g->key_index, g->value_index};
        const size_t width[3] = {d_out, kvw, kvw};
        const float *grad_out[3] = {dq, dk, dv};
        for (int i = 0; i < 3; i++)
            attn_k_linear_backward(m->ctx, s->x, attn_module_data(m, index[i]), grad_out[i], dx,
                                   i > 0, attn_module_grad(m, index[i]),
                                   bias_grad_of(m, index[i], bias), rows, d_in, width[i]);
    }
    attn_free(buf);
    attn_attention_release(m);
    return st;
}

static const attn_module_ops gqa_ops = {ATTN_MODULE_GQA, "GroupedQueryAttention", gqa_forward,
                                        gqa_backward};

attn_status attn_gqa_new(attn_ctx *ctx, const attn_gqa_config *cfg, attn_rng *init_rng,
                         attn_gqa **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_gqa_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    const char *name = "GroupedQueryAttention";
    attn_status st;
    if ((st = attn_check_width(ctx, name, "d_in", cfg->d_in)) != ATTN_OK ||
        (st = attn_check_width(ctx, name, "d_out", cfg->d_out)) != ATTN_OK ||
        (st = attn_check_heads(ctx, name, cfg->d_out, cfg->num_heads)) != ATTN_OK ||
        (st = attn_check_dropout(ctx, name, cfg->dropout)) != ATTN_OK ||
        (st = attn_check_scale(ctx, name, cfg->scale)) != ATTN_OK)
        return st;
    if (cfg->num_kv_groups == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: num_kv_groups must be positive, got 0", name);
    if (cfg->num_heads % cfg->num_kv_groups != 0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: num_heads (%zu) must be divisible by num_kv_groups (%zu)", name,
                         cfg->num_heads, cfg->num_kv_groups);
    attn_gqa *g = attn_calloc(1, sizeof *g);
    if (!g) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_gqa_new: out of memory");
    attn_module_init(&g->base, &gqa_ops, ctx, cfg->d_in, cfg->d_out);
    g->cfg = *cfg;
    g->head_dim = cfg->d_out / cfg->num_heads;
    g->kv_width = cfg->num_kv_groups * g->head_dim; /* <= d_out */
    g->scale = attn_default_scale(cfg->scale, g->head_dim);
    size_t per = cfg->qkv_bias ? 2 : 1; /* tensors per projection */
    g->key_index = 0;
    g->value_index = per;
    g->query_index = 2 * per;
    g->out_index = 3 * per;
    attn_module *m = &g->base;
    /* the book's registration order, which is also its init order */
    if ((st = attn_module_declare_linear(m, "W_key", cfg->d_in, g->kv_width, cfg->qkv_bias)) !=
            ATTN_OK ||
        (st = attn_module_declare_linear(m, "W_value", cfg->d_in, g->kv_width, cfg->qkv_bias)) !=
            ATTN_OK ||
        (st = attn_module_declare_linear(m, "W_query", cfg->d_in, cfg->d_out, cfg->qkv_bias)) !=
            ATTN_OK ||
        (st = attn_module_declare_linear(m, "out_proj", cfg->d_out, cfg->d_out, false)) !=
            ATTN_OK ||
        (st = attn_module_alloc(m)) != ATTN_OK) {
        attn_module_free(m);
        return st;
    }
    size_t index = attn_module_init_linear(m, init_rng, 0, cfg->qkv_bias, cfg->d_in, g->kv_width);
    index = attn_module_init_linear(m, init_rng, index, cfg->qkv_bias, cfg->d_in, g->kv_width);
    index = attn_module_init_linear(m, init_rng, index, cfg->qkv_bias, cfg->d_in, cfg->d_out);
    attn_module_init_linear(m, init_rng, index, false, cfg->d_out, cfg->d_out);
    *out = g;
    return ATTN_OK;
}

attn_status attn_gqa_forward(attn_gqa *m, const float *x, size_t batch, size_t tokens, float *y,
                             attn_rng *dropout_rng) {
    if (!m) return ATTN_ERR_NULL;
    return gqa_forward(&m->base, x, batch, tokens, y, dropout_rng);
}

attn_status attn_gqa_backward(attn_gqa *m, const float *dy, size_t batch, size_t tokens,
                              float *dx) {
    return attn_module_backward(attn_gqa_module(m), dy, batch, tokens, dx);
}

attn_module *attn_gqa_module(attn_gqa *m) { return m ? &m->base : NULL; }
void attn_gqa_free(attn_gqa *m) { attn_module_free(attn_gqa_module(m)); }
