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
 * heads.c runs both; the projections (mla_project, _backward) are here.
 */
#include "modules/module.h"

#include "kernels/dispatch.h"

/* heads.c's forward and backward, around MLA's own K/V path: the latent
 * (rows, L) is the spec's extra activations. */
struct attn_mla {
    attn_heads_module heads;
    size_t latent_dim; /* resolved */
    size_t dkv_index;  /* W_DKV's weight (W_UK's, W_UV's: the spec's key, value) */
};

static void mla_project(attn_module *m, const float *x, size_t batch, size_t tokens,
                        const attn_heads_acts *a) {
    const attn_mla *mla = (const attn_mla *)m;
    const attn_heads_spec *h = &mla->heads.spec;
    size_t d_in = m->d_in, d_out = m->d_out, L = mla->latent_dim, rows = batch * tokens;
    bool bias = h->qkv_bias;
    /* queries (B, T, d_out) = W_query(x); latent (B, T, L) = W_DKV(x) */
    attn_k_linear(m->ctx, x, attn_module_data(m, h->query_index),
                  attn_module_bias(m, h->query_index, bias), a->q, rows, d_in, d_out);
    attn_k_linear(m->ctx, x, attn_module_data(m, mla->dkv_index),
                  attn_module_bias(m, mla->dkv_index, bias), a->extra, rows, d_in, L);
    /* keys, values (B, T, d_out) = W_UK(latent), W_UV(latent) */
    attn_k_linear(m->ctx, a->extra, attn_module_data(m, h->key_index),
                  attn_module_bias(m, h->key_index, bias), a->k, rows, L, d_out);
    attn_k_linear(m->ctx, a->extra, attn_module_data(m, h->value_index),
                  attn_module_bias(m, h->value_index, bias), a->v, rows, L, d_out);
    attn_trace_btc(m, "queries", batch, tokens, d_out, a->q);
    attn_trace_btc(m, "latent", batch, tokens, L, a->extra);
    attn_trace_btc(m, "keys", batch, tokens, d_out, a->k);
    attn_trace_btc(m, "values", batch, tokens, d_out, a->v);
}

/* dlatent (rows, L) is the backward's scratch. */
static void mla_project_backward(attn_module *m, const float *x, size_t rows,
                                 const attn_heads_acts *a, const float *dq, const float *dk,
                                 const float *dv, float *dlatent, float *dx) {
    const attn_mla *mla = (const attn_mla *)m;
    const attn_heads_spec *h = &mla->heads.spec;
    size_t d_in = m->d_in, d_out = m->d_out, L = mla->latent_dim;
    bool bias = h->qkv_bias;
    size_t uk = h->key_index, uv = h->value_index, query = h->query_index, dkv = mla->dkv_index;
    /* forward: k = W_UK(latent), v = W_UV(latent): dlatent (rows, L) =
     * dk W_UK + dv W_UV */
    attn_k_linear_backward(m->ctx, a->extra, attn_module_data(m, uk), dk, dlatent, false,
                           attn_module_grad(m, uk), attn_module_bias_grad(m, uk, bias), rows, L,
                           d_out);
    attn_k_linear_backward(m->ctx, a->extra, attn_module_data(m, uv), dv, dlatent, true,
                           attn_module_grad(m, uv), attn_module_bias_grad(m, uv, bias), rows, L,
                           d_out);
    /* forward: q = W_query(x), latent = W_DKV(x): dx = dq W_query + dlatent W_DKV */
    attn_k_linear_backward(m->ctx, x, attn_module_data(m, query), dq, dx, false,
                           attn_module_grad(m, query), attn_module_bias_grad(m, query, bias),
                           rows, d_in, d_out);
    attn_k_linear_backward(m->ctx, x, attn_module_data(m, dkv), dlatent, dx, true,
                           attn_module_grad(m, dkv), attn_module_bias_grad(m, dkv, bias), rows,
                           d_in, L);
}

const attn_module_ops attn_mla_ops = {ATTN_MODULE_MLA, "MultiHeadLatentAttention",
                                      attn_heads_forward, attn_heads_backward, ATTN_BUFFERS_NONE};

attn_status attn_mla_new(attn_ctx *ctx, const attn_mla_config *cfg, attn_rng *init_rng,
                         attn_mla **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_mla_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    attn_status st = attn_check_heads_config(ctx, "MultiHeadLatentAttention", cfg->d_in,
                                             cfg->d_out, cfg->num_heads, cfg->dropout, cfg->scale);
    if (st != ATTN_OK) return st;
    attn_heads_module *h = attn_heads_alloc(ctx, &attn_mla_ops, sizeof(attn_mla), cfg->d_in,
                                            cfg->d_out, "attn_mla_new");
    if (!h) return ATTN_ERR_NO_MEMORY;
    attn_mla *a = (attn_mla *)h;
    attn_module *m = &h->base;
    size_t L = attn_mla_latent_width(cfg->d_out, cfg->latent_dim);
    a->latent_dim = L;
    size_t hd = cfg->d_out / cfg->num_heads;
    size_t per = cfg->qkv_bias ? 2 : 1; /* tensors per biased projection */
    a->dkv_index = per;
    /* weights in state_dict order (the book's registration order): W_query,
     * W_DKV, W_UK, W_UV, out_proj; the widest row of activations is
     * 4 d_out + L + H (the constructor bounds each by what its weights hold) */
    h->spec = (attn_heads_spec){
        .q_heads = cfg->num_heads, .kv_heads = cfg->num_heads, .head_dim = hd,
        .scale = attn_default_scale(cfg->scale, hd), .mask = ATTN_MASK_NEG_INF,
        .check_width = 4 * cfg->d_out + L + cfg->num_heads, .dropout = cfg->dropout,
        .qkv_bias = cfg->qkv_bias, .query_index = 0, .key_index = 2 * per,
        .value_index = 3 * per, .out_index = 4 * per, .out_bias = true, .extra = L,
        .project = mla_project, .project_backward = mla_project_backward};
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
    size_t index = 0;
    if ((st = attn_module_init_linear(m, init_rng, &index, bias, cfg->d_in, cfg->d_out)) !=
            ATTN_OK ||
        (st = attn_module_init_linear(m, init_rng, &index, bias, cfg->d_in, L)) != ATTN_OK ||
        (st = attn_module_init_linear(m, init_rng, &index, bias, L, cfg->d_out)) != ATTN_OK ||
        (st = attn_module_init_linear(m, init_rng, &index, bias, L, cfg->d_out)) != ATTN_OK ||
        (st = attn_module_init_linear(m, init_rng, &index, true, cfg->d_out, cfg->d_out)) !=
            ATTN_OK) {
        attn_module_free(m);
        return st;
    }
    *out = a;
    return ATTN_OK;
}

attn_status attn_mla_forward(attn_mla *m, const float *x, size_t batch, size_t tokens, float *y,
                             attn_rng *dropout_rng) {
    return attn_module_forward(attn_mla_module(m), x, batch, tokens, y, dropout_rng);
}

attn_status attn_mla_backward(attn_mla *m, const float *dy, size_t batch, size_t tokens,
                              float *dx) {
    return attn_module_backward(attn_mla_module(m), dy, batch, tokens, dx);
}

attn_module *attn_mla_module(attn_mla *m) { return m ? &m->heads.base : NULL; }
void attn_mla_free(attn_mla *m) { attn_module_free(attn_mla_module(m)); }
