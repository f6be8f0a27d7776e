/*
 * mha.c — MultiHeadAttention (seeds, section 3.6): one projection per q, k,
 * v split into heads, causal mask, dropout, then out_proj (with bias).
 *   queries, keys, values (B, T, d_out) = W_*(x)
 *     viewed as (B, T, H, hd), transposed to (B, H, T, hd)
 *   attn_weights (B, H, T, T) = dropout(softmax(mask(q k^T) * scale))
 *   context_vec  (B, H, T, hd) = attn_weights @ values
 *     transposed back and flattened to (B, T, d_out)
 *   y (B, T, d_out) = out_proj(context_vec)
 */
#include "modules/module.h"

#include <stdlib.h>

struct attn_mha {
    attn_module base;
    attn_mha_config cfg;
    size_t head_dim;
    float scale;
    size_t out_proj_index;
};

static attn_status mha_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                               float *y, attn_rng *rng) {
    attn_mha *mha = (attn_mha *)m;
    double p = m->training ? mha->cfg.dropout : 0.0;
    size_t d_out = m->d_out, rows = batch * tokens, H = mha->cfg.num_heads;
    attn_status st = attn_check_forward(m, x, batch, tokens, y, mha->cfg.context_length,
                                        attn_max_size(m->d_in, 4 * d_out), p > 0.0, rng);
    if (st != ATTN_OK) return st;
    float *buf = attn_scratch(m, 4 * rows * d_out, &st);
    if (!buf) return st;
    float *q = buf, *k = buf + rows * d_out, *v = buf + 2 * rows * d_out;
    float *context = buf + 3 * rows * d_out;

    attn_qkv_weights w = attn_qkv_linear_weights(m, 0, mha->cfg.qkv_bias);
    attn_project_qkv(m, &w, x, batch, tokens, d_out, q, k, v);
    size_t split[4] = {batch, H, tokens, mha->head_dim};
    attn_trace(m->ctx, m->ops->class_name, "heads (view + transpose)", 4, split, NULL);

    /* Heads are views: element (b, t, h, d) sits at b*T*d_out + t*d_out + h*hd + d. */
    attn_sdpa_args args = {
        .batch = batch, .heads = H, .tokens = tokens, .head_dim = mha->head_dim,
        .q = q, .k = k, .v = v,
        .b_stride = tokens * d_out, .t_stride = d_out, .h_stride = mha->head_dim,
        .out = context, .out_b_stride = tokens * d_out, .out_t_stride = d_out,
        .out_h_stride = mha->head_dim,
        .scale = mha->scale, .causal = true, .mask = mha->cfg.mask,
    };
    attn_dropout_stream dropout;
    if (p > 0.0) attn_dropout_stream_begin(&dropout, rng, p, batch * H * tokens * tokens);
    st = attn_run_sdpa(m, &args, p > 0.0 ? &dropout : NULL);
    if (st == ATTN_OK) {
        attn_trace_btc(m, "context_vec", batch, tokens, d_out, context);
        const float *w_out = attn_module_data(m, mha->out_proj_index);
        const float *b_out = attn_module_data(m, mha->out_proj_index + 1);
        attn_ref_linear(m->ctx->num_threads, context, w_out, b_out, y, rows, d_out, d_out);
        attn_trace_btc(m, "out_proj", batch, tokens, d_out, y);
    }
    free(buf);
    return st;
}

static const attn_module_ops mha_ops = {ATTN_MODULE_MHA, "MultiHeadAttention", mha_forward};

attn_status attn_mha_new(attn_ctx *ctx, const attn_mha_config *cfg, attn_rng *init_rng,
                         attn_mha **out) {
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_mha_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    *out = NULL;
    const char *name = "MultiHeadAttention";
    attn_status st = attn_check_causal_config(ctx, name, cfg->d_in, cfg->d_out,
                                              cfg->context_length, cfg->dropout, cfg->scale,
                                              cfg->mask);
    if (st != ATTN_OK) return st;
    if ((st = attn_check_heads(ctx, name, cfg->d_out, cfg->num_heads)) != ATTN_OK) return st;
    attn_mha *m = calloc(1, sizeof *m);
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

attn_module *attn_mha_module(attn_mha *m) { return m ? &m->base : NULL; }
void attn_mha_free(attn_mha *m) { attn_module_free(attn_mha_module(m)); }
