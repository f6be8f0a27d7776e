/*
 * gpt2.c — GPT-2's CausalSelfAttention (seed 004): one fused projection.
 *   qkv (B, T, 3C) = c_attn(x); q, k, v = qkv.split(C, dim=2)
 *     each viewed as (B, T, nh, hs), transposed to (B, nh, T, hs)
 *   att (B, nh, T, T) = attn_dropout(softmax(mask(q k^T * hs^-0.5)))
 *   y   (B, nh, T, hs) = att @ v, back to (B, T, C)
 *   out (B, T, C) = resid_dropout(c_proj(y))
 * The seed has no dropout; with dropout > 0 both GPT-2 dropouts apply.
 * The backward walks these steps in reverse from the kept qkv, y and masks.
 */
#include "modules/module.h"

#include "kernels/dispatch.h"

#include <stdlib.h>
#include <string.h>

enum { C_ATTN_WEIGHT, C_ATTN_BIAS, C_PROJ_WEIGHT, C_PROJ_BIAS };

struct attn_gpt2 {
    attn_module base;
    attn_gpt2_config cfg;
    size_t head_dim;
    float scale;
    size_t kept_attention_mask_bytes; /* of the saved forward's mask: 0 if not kept */
};

/* Bytes of the attention dropout mask; the residual mask follows it. */
static size_t attention_mask_bytes(size_t batch, size_t heads, size_t tokens) {
    return batch * heads * tokens * tokens / 8 + 1;
}

/* q, k, v are column blocks of qkv (B, T, 3C): (b, t, h, d) at
 * b*T*3C + t*3C + {0, C, 2C} + h*hs + d; heads join in y (B, T, C). */
static attn_sdpa_args gpt2_heads(const attn_gpt2 *g, size_t batch, size_t tokens,
                                 const float *qkv, float *context) {
    size_t C = g->cfg.n_embd;
    attn_sdpa_args args = {
        .batch = batch, .heads = g->cfg.n_head, .tokens = tokens, .head_dim = g->head_dim,
        .q = qkv, .k = qkv + C, .v = qkv + 2 * C,
        .b_stride = tokens * 3 * C, .t_stride = 3 * C, .h_stride = g->head_dim,
        .out = context, .out_b_stride = tokens * C, .out_t_stride = C, .out_h_stride = g->head_dim,
        .scale = g->scale, .causal = true, .mask = ATTN_MASK_NEG_INF,
    };
    attn_sdpa_self(&args);
    return args;
}

static attn_status gpt2_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                                float *y, attn_rng *rng) {
    attn_gpt2 *g = (attn_gpt2 *)m;
    double p = m->training ? g->cfg.dropout : 0.0;
    size_t C = g->cfg.n_embd, nh = g->cfg.n_head, rows = batch * tokens;
    attn_status st = attn_check_forward(m, x, batch, tokens, y, g->cfg.block_size, 4 * C, p > 0.0,
                                        rng);
    if (st != ATTN_OK) return st;
    /* masks: attention (B, nh, T, T) from a byte boundary, then residual (B, T, C) */
    bool keep_attention_mask = p > 0.0 && attn_keeps_attention_mask(m, rng);
    size_t attn_bits = 0, attn_bytes = 0, bits = 0;
    if (keep_attention_mask && (!attn_mul3_size(batch * tokens, tokens, nh, &attn_bits) ||
                                (attn_bytes = attention_mask_bytes(batch, nh, tokens)) >
                                    ((size_t)-1 - rows * C) / 8))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW, "%s forward: the (%zu, %zu, %zu, %zu) dropout mask overflows",
                         m->ops->class_name, batch, nh, tokens, tokens);
    if (p > 0.0) bits = attn_bytes * 8 + rows * C;
    g->kept_attention_mask_bytes = attn_bytes;
    float *buf;         /* qkv (B, T, 3C), y (B, T, C), lse (B, nh, T) */
    uint8_t *keep_bits; /* [attention (B, nh, T, T) if kept,] residual (B, T, C) */
    if ((st = attn_forward_prepare(m, 4 * rows * C + rows * nh, bits, &buf, &keep_bits)) != ATTN_OK)
        return st;
    float *qkv = buf, *context = buf + 3 * rows * C, *lse = buf + 4 * rows * C;

    attn_k_linear(m->ctx, x, attn_module_data(m, C_ATTN_WEIGHT),
                    attn_module_data(m, C_ATTN_BIAS), qkv, rows, C, 3 * C);
    attn_trace_btc(m, "qkv = c_attn(x)", batch, tokens, 3 * C, qkv);
    size_t split[4] = {batch, nh, tokens, g->head_dim};
    attn_trace(m->ctx, m->ops->class_name, "q, k, v (split, view, transpose)", 4, split, NULL);

    attn_sdpa_args args = gpt2_heads(g, batch, tokens, qkv, context);
    args.keep_bits = keep_attention_mask ? keep_bits : NULL;
    args.lse = lse;
    attn_dropout_stream attn_dropout;
    if (p > 0.0) attn_dropout_stream_begin(&attn_dropout, rng, p, batch * nh * tokens * tokens);
    st = attn_run_sdpa(m, &args, p > 0.0 ? &attn_dropout : NULL);
    if (st == ATTN_OK) {
        attn_trace_btc(m, "y (heads joined)", batch, tokens, C, context);
        attn_k_linear(m->ctx, context, attn_module_data(m, C_PROJ_WEIGHT),
                        attn_module_data(m, C_PROJ_BIAS), y, rows, C, C);
        if (p > 0.0) {
            attn_dropout_stream resid_dropout;
            attn_dropout_stream_begin(&resid_dropout, rng, p, rows * C);
            uint8_t *resid_bits = keep_bits ? keep_bits + attn_bytes : NULL;
            for (size_t i = 0; i < rows * C; i++) {
                float factor = attn_dropout_stream_next(&resid_dropout);
                y[i] *= factor;
                if (resid_bits && factor != 0.0f) attn_set_bit(resid_bits, i);
            }
        }
        attn_trace_btc(m, "c_proj(y)", batch, tokens, C, y);
    }
    if (st == ATTN_OK && m->grad_enabled)
        st = attn_forward_keep(m, x, batch, tokens, attn_dropout_kept_scale(p));
    attn_forward_release(m, buf);
    return st;
}

/* dx (B, T, C) and the c_attn, c_proj gradients from dy (B, T, C). */
static attn_status gpt2_backward(attn_module *m, const float *dy, float *dx) {
    attn_gpt2 *g = (attn_gpt2 *)m;
    const attn_saved *s = &m->saved;
    size_t C = g->cfg.n_embd, rows = s->batch * s->tokens;
    const float *qkv = s->acts;
    float *context = s->acts + 3 * rows * C;
    const float *lse = s->acts + 4 * rows * C;
    const uint8_t *mask = attn_saved_mask(s); /* [attention,] residual */
    size_t attention_bytes = mask ? g->kept_attention_mask_bytes : 0;
    attn_status st;
    float *buf = attn_scratch(m, 5 * rows * C, &st); /* dqkv (B, T, 3C), dy', dcontext */
    if (!buf) return st;
    float *dqkv = buf, *dy_proj = buf + 3 * rows * C, *dcontext = buf + 4 * rows * C;

    /* forward: out = resid_dropout(c_proj(y)) */
    if (mask) {
        const uint8_t *resid_bits = mask + attention_bytes;
        for (size_t i = 0; i < rows * C; i++)
            dy_proj[i] = attn_bit(resid_bits, i) ? dy[i] * s->kept_scale : dy[i] * 0.0f;
    } else {
        memcpy(dy_proj, dy, rows * C * sizeof *dy);
    }
    attn_k_linear_backward(m->ctx, context, attn_module_data(m, C_PROJ_WEIGHT), dy_proj,
                             dcontext, false, attn_module_grad(m, C_PROJ_WEIGHT),
                             attn_module_grad(m, C_PROJ_BIAS), rows, C, C);
    /* forward: y (B, T, nh, hs) = attn_dropout(softmax(mask(q k^T * scale))) v */
    attn_sdpa_args fwd = gpt2_heads(g, s->batch, s->tokens, qkv, context);
    attn_sdpa_grad_args grad = {.fwd = &fwd, .dout = dcontext,
                                .dq = dqkv, .dk = dqkv + C, .dv = dqkv + 2 * C,
                                .out = context, .lse = lse};
    st = attn_run_sdpa_backward(m, &grad, 0, attention_bytes ? mask : NULL);
    /* forward: qkv = c_attn(x) */
    if (st == ATTN_OK)
        attn_k_linear_backward(m->ctx, s->x, attn_module_data(m, C_ATTN_WEIGHT), dqkv, dx,
                                 false, attn_module_grad(m, C_ATTN_WEIGHT),
                                 attn_module_grad(m, C_ATTN_BIAS), rows, C, 3 * C);
    free(buf);
    return st;
}

static const attn_module_ops gpt2_ops = {ATTN_MODULE_GPT2, "CausalSelfAttention", gpt2_forward,
                                         gpt2_backward};

attn_status attn_gpt2_new(attn_ctx *ctx, const attn_gpt2_config *cfg, attn_rng *init_rng,
                          attn_gpt2 **out) {
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_gpt2_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    *out = NULL;
    const char *name = "CausalSelfAttention";
    attn_status st;
    if ((st = attn_check_width(ctx, name, "n_embd", cfg->n_embd)) != ATTN_OK ||
        (st = attn_check_width(ctx, name, "block_size", cfg->block_size)) != ATTN_OK ||
        (st = attn_check_dropout(ctx, name, cfg->dropout)) != ATTN_OK ||
        (st = attn_check_scale(ctx, name, cfg->scale)) != ATTN_OK)
        return st;
    if (cfg->n_head == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: n_head must be positive, got 0", name);
    if (cfg->n_embd % cfg->n_head != 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: n_embd (%zu) must be divisible by n_head (%zu)",
                         name, cfg->n_embd, cfg->n_head);
    if (cfg->n_embd > (size_t)-1 / 16)
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: n_embd (%zu) is too large", name, cfg->n_embd);
    attn_gpt2 *m = calloc(1, sizeof *m);
    if (!m) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_gpt2_new: out of memory");
    attn_module_init(&m->base, &gpt2_ops, ctx, cfg->n_embd, cfg->n_embd);
    m->base.mask_buffer = cfg->block_size;
    m->cfg = *cfg;
    m->head_dim = cfg->n_embd / cfg->n_head;
    m->scale = attn_default_scale(cfg->scale, m->head_dim);
    size_t C = cfg->n_embd;
    if ((st = attn_module_declare_linear(&m->base, "c_attn", C, 3 * C, true)) != ATTN_OK ||
        (st = attn_module_declare_linear(&m->base, "c_proj", C, C, true)) != ATTN_OK ||
        (st = attn_module_alloc(&m->base)) != ATTN_OK) {
        attn_module_free(&m->base);
        return st;
    }
    size_t index = attn_module_init_linear(&m->base, init_rng, C_ATTN_WEIGHT, true, C, 3 * C);
    attn_module_init_linear(&m->base, init_rng, index, true, C, C);
    *out = m;
    return ATTN_OK;
}

attn_status attn_gpt2_forward(attn_gpt2 *m, const float *x, size_t batch, size_t tokens,
                              float *y, attn_rng *dropout_rng) {
    if (!m) return ATTN_ERR_NULL;
    return gpt2_forward(&m->base, x, batch, tokens, y, dropout_rng);
}

attn_status attn_gpt2_backward(attn_gpt2 *m, const float *dy, size_t batch, size_t tokens,
                               float *dx) {
    return attn_module_backward(attn_gpt2_module(m), dy, batch, tokens, dx);
}

attn_module *attn_gpt2_module(attn_gpt2 *m) { return m ? &m->base : NULL; }
void attn_gpt2_free(attn_gpt2 *m) { attn_module_free(attn_gpt2_module(m)); }
