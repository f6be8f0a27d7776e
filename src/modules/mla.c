/*
 * mla.c — MultiHeadLatentAttention (the book's ch04/05_mla, without its
 * latent KV cache): keys and values are up-projected from a shared latent.
 *   queries (B, T, d_out) = W_query(x)
 *   latent  (B, T, L)     = W_DKV(x)        L = latent_dim (default max(16, d_out / 8))
 *   keys, values (B, T, d_out) = W_UK(latent), W_UV(latent)
 *     each viewed as (B, H, T, hd)
 *   attn_weights (B, H, T, T) = dropout(softmax(mask(q k^T) / sqrt(hd)))
 *   context_vec  (B, H, T, hd) = attn_weights @ values, back to (B, T, d_out)
 *   y (B, T, d_out) = out_proj(context_vec)
 * The book divides the masked scores by sqrt(hd); scaling before the -inf
 * mask gives the same weights. The backward walks these steps in reverse:
 * the latent's gradient gathers both up-projections' before W_DKV's.
 */
#include "modules/module.h"

#include "kernels/dispatch.h"

#include <string.h>

/* Weight indices in state_dict order (the book's registration order). */
typedef struct mla_index {
    size_t query, dkv, uk, uv, out;
} mla_index;

struct attn_mla {
    attn_module base;
    attn_mla_config cfg; /* latent_dim resolved */
    size_t head_dim;
    float scale;
    mla_index at;
};

/* The layout of a forward's activations. */
typedef struct mla_acts {
    float *q, *latent, *k, *v, *context, *lse;
} mla_acts;

static size_t mla_acts_floats(const attn_mla *a, size_t rows) {
    /* q, k, v, context (rows, d_out); latent (rows, L); lse (rows, H) */
    return rows * (4 * a->base.d_out + a->cfg.latent_dim + a->cfg.num_heads);
}

static mla_acts mla_acts_at(const attn_mla *a, float *buf, size_t rows) {
    size_t d_out = a->base.d_out;
    mla_acts s;
    s.q = buf;
    s.latent = s.q + rows * d_out;
    s.k = s.latent + rows * a->cfg.latent_dim;
    s.v = s.k + rows * d_out;
    s.context = s.v + rows * d_out;
    s.lse = s.context + rows * d_out;
    return s;
}

static attn_attention_problem mla_problem(const attn_mla *a, size_t batch, size_t tokens,
                                          const mla_acts *s) {
    size_t H = a->cfg.num_heads;
    return attn_heads_problem(batch, tokens, H, H, a->head_dim, s->q, s->k, s->v, s->context,
                              s->lse, a->scale, true, ATTN_MASK_NEG_INF);
}

static const float *bias_of(attn_module *m, size_t weight_index, bool bias) {
    return bias ? attn_module_data(m, weight_index + 1) : NULL;
}

static float *bias_grad_of(attn_module *m, size_t weight_index, bool bias) {
    return bias ? attn_module_grad(m, weight_index + 1) : NULL;
}

static attn_status mla_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                               float *y, attn_rng *rng) {
    attn_mla *a = (attn_mla *)m;
    double p = m->training ? a->cfg.dropout : 0.0;
    size_t d_in = m->d_in, d_out = m->d_out, L = a->cfg.latent_dim, H = a->cfg.num_heads;
    size_t rows = batch * tokens;
    bool bias = a->cfg.qkv_bias;
    /* the widest row of activations: 4 d_out + L + H (the constructor
     * bounded each by what its weights hold) */
    attn_status st = attn_check_forward(m, x, batch, tokens, y, 0,
                                        attn_max_size(d_in, 4 * d_out + L + H), p > 0.0, rng);
    if (st != ATTN_OK) return st;
    size_t weights = 0; /* B*H*T*T, the dropout's draws */
    if (p > 0.0 && !attn_mul3_size(batch * tokens, tokens, H, &weights))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW,
                         "%s forward: the (%zu, %zu, %zu, %zu) dropout mask overflows",
                         m->ops->class_name, batch, H, tokens, tokens);
    size_t bits = p > 0.0 && attn_keeps_attention_mask(m, rng) ? weights : 0;
    float *buf;         /* mla_acts */
    uint8_t *keep_bits; /* (B, H, T, T) when dropout draws and the backward needs it */
    if ((st = attn_forward_prepare(m, batch, tokens, mla_acts_floats(a, rows), bits, &buf,
                                   &keep_bits)) != ATTN_OK)
        return st;
    mla_acts s = mla_acts_at(a, buf, rows);
    attn_attention_problem prob = mla_problem(a, batch, tokens, &s);
    /* the attention's workspace before anything is drawn or written */
    if ((st = attn_attention_reserve(m, &prob, false, p > 0.0 ? rng : NULL)) != ATTN_OK) {
        attn_forward_release(m, buf);
        return st;
    }

    /* queries (B, T, d_out) = W_query(x); latent (B, T, L) = W_DKV(x) */
    const mla_index *at = &a->at;
    attn_k_linear(m->ctx, x, attn_module_data(m, at->query), bias_of(m, at->query, bias), s.q,
                  rows, d_in, d_out);
    attn_k_linear(m->ctx, x, attn_module_data(m, at->dkv), bias_of(m, at->dkv, bias), s.latent,
                  rows, d_in, L);
    /* keys, values (B, T, d_out) = W_UK(latent), W_UV(latent) */
    attn_k_linear(m->ctx, s.latent, attn_module_data(m, at->uk), bias_of(m, at->uk, bias), s.k,
                  rows, L, d_out);
    attn_k_linear(m->ctx, s.latent, attn_module_data(m, at->uv), bias_of(m, at->uv, bias), s.v,
                  rows, L, d_out);
    attn_trace_btc(m, "queries", batch, tokens, d_out, s.q);
    attn_trace_btc(m, "latent", batch, tokens, L, s.latent);
    attn_trace_btc(m, "keys", batch, tokens, d_out, s.k);
    attn_trace_btc(m, "values", batch, tokens, d_out, s.v);
    size_t split[4] = {batch, H, tokens, a->head_dim};
    attn_trace(m->ctx, m->ops->class_name, "heads (view + transpose)", 4, split, NULL);

    /* dropout over the (B, H, T, T) weights, as nn.Dropout draws them */
    attn_dropout_stream dropout;
    if (p > 0.0) attn_dropout_stream_begin(&dropout, rng, p, weights);
    st = attn_run_attention(m, &prob, p > 0.0 ? &dropout : NULL, keep_bits);
    if (st == ATTN_OK) {
        attn_trace_btc(m, "context_vec", batch, tokens, d_out, s.context);
        /* y (B, T, d_out) = context_vec @ W_out^T + b_out */
        attn_k_linear(m->ctx, s.context, attn_module_data(m, at->out),
                      attn_module_data(m, at->out + 1), y, rows, d_out, d_out);
        attn_trace_btc(m, "out_proj", batch, tokens, d_out, y);
    }
    if (st == ATTN_OK && m->grad_enabled)
        st = attn_forward_keep(m, x, batch, tokens, attn_dropout_kept_scale(p));
    attn_forward_release(m, buf);
    return st;
}

/* dx (B, T, d_in) and every parameter's gradient from dy (B, T, d_out). */
static attn_status mla_backward(attn_module *m, const float *dy, float *dx) {
    attn_mla *a = (attn_mla *)m;
    const attn_saved *sv = &m->saved;
    size_t d_in = m->d_in, d_out = m->d_out, L = a->cfg.latent_dim;
    size_t rows = sv->batch * sv->tokens;
    bool bias = a->cfg.qkv_bias;
    const mla_index *at = &a->at;
    mla_acts s = mla_acts_at(a, sv->acts, rows);
    attn_status st;
    /* dq, dk, dv, dcontext (rows, d_out); dlatent (rows, L) */
    float *buf = attn_scratch(m, rows * (4 * d_out + L), &st);
    if (!buf) return st;
    float *dq = buf, *dk = buf + rows * d_out, *dv = buf + 2 * rows * d_out;
    float *dcontext = buf + 3 * rows * d_out, *dlatent = buf + 4 * rows * d_out;
    attn_attention_problem prob = mla_problem(a, sv->batch, sv->tokens, &s);
    if ((st = attn_attention_reserve(m, &prob, true, NULL)) != ATTN_OK) { /* before any gradient */
        attn_free(buf);
        return st;
    }

    /* forward: y = context @ W_out^T + b_out */
    attn_k_linear_backward(m->ctx, s.context, attn_module_data(m, at->out), dy, dcontext, false,
                           attn_module_grad(m, at->out), attn_module_grad(m, at->out + 1), rows,
                           d_out, d_out);
    /* forward: context (B, T, H, hd) = dropout(softmax(mask(q k^T * scale))) v */
    attn_attention_grads grads = {.dout = dcontext, .dq = dq, .dk = dk, .dv = dv};
    st = attn_run_attention_backward(m, &prob, &grads, 0, attn_saved_mask(sv));
    if (st == ATTN_OK) {
        /* forward: k = W_UK(latent), v = W_UV(latent): dlatent (rows, L) =
         * dk W_UK + dv W_UV */
        attn_k_linear_backward(m->ctx, s.latent, attn_module_data(m, at->uk), dk, dlatent, false,
                               attn_module_grad(m, at->uk), bias_grad_of(m, at->uk, bias), rows,
                               L, d_out);
        attn_k_linear_backward(m->ctx, s.latent, attn_module_data(m, at->uv), dv, dlatent, true,
                               attn_module_grad(m, at->uv), bias_grad_of(m, at->uv, bias), rows,
                               L, d_out);
        /* forward: q = W_query(x), latent = W_DKV(x): dx = dq W_query + dlatent W_DKV */
        attn_k_linear_backward(m->ctx, sv->x, attn_module_data(m, at->query), dq, dx, false,
                               attn_module_grad(m, at->query), bias_grad_of(m, at->query, bias),
                               rows, d_in, d_out);
        attn_k_linear_backward(m->ctx, sv->x, attn_module_data(m, at->dkv), dlatent, dx, true,
                               attn_module_grad(m, at->dkv), bias_grad_of(m, at->dkv, bias), rows,
                               d_in, L);
    }
    attn_free(buf);
    attn_attention_release(m);
    return st;
}

static const attn_module_ops mla_ops = {ATTN_MODULE_MLA, "MultiHeadLatentAttention",
                                        mla_forward, mla_backward};

attn_status attn_mla_new(attn_ctx *ctx, const attn_mla_config *cfg, attn_rng *init_rng,
                         attn_mla **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_mla_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    const char *name = "MultiHeadLatentAttention";
    attn_status st;
    if ((st = attn_check_width(ctx, name, "d_in", cfg->d_in)) != ATTN_OK ||
        (st = attn_check_width(ctx, name, "d_out", cfg->d_out)) != ATTN_OK ||
        (st = attn_check_heads(ctx, name, cfg->d_out, cfg->num_heads)) != ATTN_OK ||
        (st = attn_check_dropout(ctx, name, cfg->dropout)) != ATTN_OK ||
        (st = attn_check_scale(ctx, name, cfg->scale)) != ATTN_OK)
        return st;
    attn_mla *a = attn_calloc(1, sizeof *a);
    if (!a) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_mla_new: out of memory");
    attn_module *m = &a->base;
    attn_module_init(m, &mla_ops, ctx, cfg->d_in, cfg->d_out);
    a->cfg = *cfg;
    /* the book's default: latent_dim if given, else max(16, d_out // 8) */
    size_t L = cfg->latent_dim ? cfg->latent_dim : attn_max_size(16, cfg->d_out / 8);
    a->cfg.latent_dim = L;
    a->head_dim = cfg->d_out / cfg->num_heads;
    a->scale = attn_default_scale(cfg->scale, a->head_dim);
    size_t per = cfg->qkv_bias ? 2 : 1; /* tensors per biased projection */
    a->at = (mla_index){.query = 0, .dkv = per, .uk = 2 * per, .uv = 3 * per, .out = 4 * per};
    bool bias = cfg->qkv_bias;
    if ((st = attn_module_declare_linear(m, "W_query", cfg->d_in, cfg->d_out, bias)) != ATTN_OK ||
        (st = attn_module_declare_linear(m, "W_DKV", cfg->d_in, L, bias)) != ATTN_OK ||
        (st = attn_module_declare_linear(m, "W_UK", L, cfg->d_out, bias)) != ATTN_OK ||
        (st = attn_module_declare_linear(m, "W_UV", L, cfg->d_out, bias)) != ATTN_OK ||
        (st = attn_module_declare_linear(m, "out_proj", cfg->d_out, cfg->d_out, true)) !=
            ATTN_OK ||
        (st = attn_module_alloc(m)) != ATTN_OK) {
        attn_module_free(m);
        return st;
    }
    /* nn.Linear draws at construction, in the order the book builds them */
    size_t index = attn_module_init_linear(m, init_rng, 0, bias, cfg->d_in, cfg->d_out);
    index = attn_module_init_linear(m, init_rng, index, bias, cfg->d_in, L);
    index = attn_module_init_linear(m, init_rng, index, bias, L, cfg->d_out);
    index = attn_module_init_linear(m, init_rng, index, bias, L, cfg->d_out);
    attn_module_init_linear(m, init_rng, index, true, cfg->d_out, cfg->d_out);
    *out = a;
    return ATTN_OK;
}

attn_status attn_mla_forward(attn_mla *m, const float *x, size_t batch, size_t tokens, float *y,
                             attn_rng *dropout_rng) {
    if (!m) return ATTN_ERR_NULL;
    return mla_forward(&m->base, x, batch, tokens, y, dropout_rng);
}

attn_status attn_mla_backward(attn_mla *m, const float *dy, size_t batch, size_t tokens,
                              float *dx) {
    return attn_module_backward(attn_mla_module(m), dy, batch, tokens, dx);
}

attn_module *attn_mla_module(attn_mla *m) { return m ? &m->base : NULL; }
void attn_mla_free(attn_mla *m) { attn_module_free(attn_mla_module(m)); }
