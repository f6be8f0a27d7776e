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
    size_t backward_scratch_floats;   /* the budget that sizes the backward's head groups */
};

/* Bytes of the attention dropout mask; the residual mask follows it. */
static size_t attention_mask_bytes(size_t batch, size_t heads, size_t tokens) {
    return batch * heads * tokens * tokens / 8 + 1;
}

/* q, k, v are column blocks of qkv (B, T, 3C): (b, t, h, d) at
 * b*T*3C + t*3C + {0, C, 2C} + h*hs + d; heads join in y (B, T, C). lse
 * (B, nh, T) is followed by its rounding error lse_lo (the same shape) and
 * the row statistics (row_stats: two floats a row). */
static attn_attention_problem gpt2_heads(const attn_gpt2 *g, size_t batch, size_t tokens,
                                         const float *qkv, float *context, float *lse) {
    size_t C = g->cfg.n_embd, nh = g->cfg.n_head;
    attn_attention_problem p = attn_heads_problem(batch, tokens, nh, nh, g->head_dim, qkv,
                                                  qkv + C, qkv + 2 * C, context, lse, g->scale,
                                                  true, ATTN_MASK_NEG_INF);
    attn_view_strides in = {tokens * 3 * C, 3 * C, g->head_dim};
    p.q.st = p.k.st = p.v.st = in;
    p.lse_lo = lse ? lse + batch * nh * tokens : NULL;
    p.row_stats = lse ? lse + 2 * batch * nh * tokens : NULL;
    return p;
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
    float *buf;         /* qkv (B, T, 3C), y (B, T, C), lse, lse_lo, row_stats (gpt2_heads) */
    uint8_t *keep_bits; /* [attention (B, nh, T, T) if kept,] residual (B, T, C) */
    if ((st = attn_forward_prepare(m, batch, tokens, 4 * rows * C + 4 * rows * nh, bits, &buf,
                                   &keep_bits)) != ATTN_OK)
        return st;
    float *qkv = buf, *context = buf + 3 * rows * C, *lse = buf + 4 * rows * C;
    attn_attention_problem heads = gpt2_heads(g, batch, tokens, qkv, context, lse);
    /* the attention's workspace before anything is drawn or written */
    if ((st = attn_attention_reserve(m, &heads, false, p > 0.0 ? rng : NULL)) != ATTN_OK) {
        attn_forward_release(m, buf);
        return st;
    }

    attn_k_linear(m->ctx, x, attn_module_data(m, C_ATTN_WEIGHT),
                    attn_module_data(m, C_ATTN_BIAS), qkv, rows, C, 3 * C);
    attn_trace_btc(m, "qkv = c_attn(x)", batch, tokens, 3 * C, qkv);
    size_t split[4] = {batch, nh, tokens, g->head_dim};
    attn_trace(m->ctx, m->ops->class_name, "q, k, v (split, view, transpose)", 4, split, NULL);

    attn_dropout_stream attn_dropout;
    if (p > 0.0) attn_dropout_stream_begin(&attn_dropout, rng, p, batch * nh * tokens * tokens);
    st = attn_run_attention(m, &heads, p > 0.0 ? &attn_dropout : NULL,
                            keep_attention_mask ? keep_bits : NULL);
    if (st == ATTN_OK) {
        attn_trace_btc(m, "y (heads joined)", batch, tokens, C, context);
        attn_k_linear(m->ctx, context, attn_module_data(m, C_PROJ_WEIGHT),
                        attn_module_data(m, C_PROJ_BIAS), y, rows, C, C);
        if (p > 0.0) {
            attn_dropout_stream resid_dropout;
            attn_dropout_stream_begin(&resid_dropout, rng, p, rows * C);
            uint8_t *resid_bits = keep_bits ? keep_bits + attn_bytes : NULL;
            uint8_t keep[1024];
            for (size_t i0 = 0; i0 < rows * C; i0 += sizeof keep) {
                size_t count = rows * C - i0 < sizeof keep ? rows * C - i0 : sizeof keep;
                attn_dropout_stream_keeps(&resid_dropout, keep, count);
                for (size_t i = 0; i < count; i++) {
                    y[i0 + i] *= keep[i] ? resid_dropout.kept_scale : 0.0f;
                    if (resid_bits && keep[i]) attn_set_bit(resid_bits, i0 + i);
                }
            }
        }
        attn_trace_btc(m, "c_proj(y)", batch, tokens, C, y);
    }
    if (st == ATTN_OK && m->grad_enabled)
        st = attn_forward_keep(m, x, batch, tokens, attn_dropout_kept_scale(p));
    attn_forward_release(m, buf);
    return st;
}

/*
 * The backward's scratch. All heads at once read the kept qkv and y in
 * place and need dqkv (B, T, 3C) and dy_heads (B, T, C): 4 (B, T, C)
 * buffers, 256 MiB for GPT-2 small at T = 16384. So without attention
 * dropout the heads go in groups, each group's q, k, v and y copied out of
 * the interleaved buffers next to its gradients, 8 (B, T, G hs) slices,
 * and the group size keeps those within the module's scratch budget. The
 * group size depends on the shapes alone, so the result is the same for
 * any thread count. With attention dropout all heads go at once: its keep
 * bits and its Philox counters are laid out over all heads.
 */
/* 128 MiB: GPT-2 small keeps groups of 4 heads up to T = 16384, as many
 * items as the fused backward's one pass needs (kernels/flash) */
#define GPT2_BACKWARD_SCRATCH_FLOATS ((size_t)32 << 20)

static size_t backward_heads_per_group(const attn_gpt2 *g, size_t rows) {
    size_t nh = g->cfg.n_head, hs = g->head_dim;
    for (size_t heads = nh; heads > 1; heads--)
        if (nh % heads == 0 && rows * hs * heads <= g->backward_scratch_floats / 8) return heads;
    return 1;
}

void attn_gpt2_set_backward_scratch(attn_gpt2 *g, size_t floats) {
    g->backward_scratch_floats = floats;
}

/* All heads at once, from the kept buffers: dcontext (B, T, C) is dL/dy,
 * dqkv (B, T, 3C) scratch. */
static attn_status backward_all_heads(attn_module *m, const float *dcontext, float *dx,
                                      float *dqkv) {
    attn_gpt2 *g = (attn_gpt2 *)m;
    const attn_saved *s = &m->saved;
    size_t C = g->cfg.n_embd, rows = s->batch * s->tokens;
    const float *qkv = s->acts;
    float *context = s->acts + 3 * rows * C;
    const uint8_t *keep_bits = attn_saved_mask(s); /* [attention,] residual */
    attn_attention_problem fwd = gpt2_heads(g, s->batch, s->tokens, qkv, context,
                                            s->acts + 4 * rows * C);
    /* forward: y (B, T, nh, hs) = attn_dropout(softmax(mask(q k^T * scale))) v */
    attn_attention_grads grad = {.dout = dcontext, .dq = dqkv, .dk = dqkv + C,
                                 .dv = dqkv + 2 * C};
    attn_status st = attn_run_attention_backward(
        m, &fwd, &grad, 0, keep_bits && g->kept_attention_mask_bytes ? keep_bits : NULL);
    /* forward: qkv (B, T, 3C) = c_attn(x) */
    if (st == ATTN_OK)
        attn_k_linear_backward(m->ctx, s->x, attn_module_data(m, C_ATTN_WEIGHT), dqkv, dx,
                               false, attn_module_grad(m, C_ATTN_WEIGHT),
                               attn_module_grad(m, C_ATTN_BIAS), rows, C, 3 * C);
    return st;
}

/* Heads [h0, h0 + heads) from copies, without dropout; scratch holds
 * 8 (B, T, heads hs) slices. dx is overwritten by the first group's first
 * part and accumulated into after. */
static attn_status backward_head_group(attn_module *m, const float *dy_proj, float *dx,
                                       size_t h0, size_t heads, float *scratch) {
    attn_gpt2 *g = (attn_gpt2 *)m;
    const attn_saved *s = &m->saved;
    size_t C = g->cfg.n_embd, nh = g->cfg.n_head, hs = g->head_dim;
    size_t B = s->batch, T = s->tokens, rows = B * T, w = heads * hs, slice = rows * w;
    const float *qkv = s->acts, *context = s->acts + 3 * rows * C, *lse = s->acts + 4 * rows * C;
    /* q, k, v, y, dy, dq, dk, dv: each (B, T, heads, hs); then lse, lse_lo
     * and row_stats (B, heads, T), as gpt2_heads' */
    float *q = scratch, *y = scratch + 3 * slice, *dy = scratch + 4 * slice;
    float *dq = scratch + 5 * slice, *group_lse = scratch + 8 * slice;
    for (size_t r = 0; r < rows; r++) {
        for (size_t part = 0; part < 3; part++)
            memcpy(q + part * slice + r * w, qkv + r * 3 * C + part * C + h0 * hs, w * sizeof *q);
        memcpy(y + r * w, context + r * C + h0 * hs, w * sizeof *y);
    }
    for (size_t b = 0; b < B; b++) {
        for (size_t part = 0; part < 2; part++) /* lse, then lse_lo */
            memcpy(group_lse + (part * B + b) * heads * T, lse + (part * B * nh + b * nh + h0) * T,
                   heads * T * sizeof *lse);
        memcpy(group_lse + 2 * (B + b) * heads * T, lse + 2 * (B * nh + b * nh + h0) * T,
               2 * heads * T * sizeof *lse); /* row_stats */
    }
    attn_attention_problem fwd = attn_heads_problem(B, T, heads, heads, hs, q, q + slice,
                                                    q + 2 * slice, y, group_lse, g->scale, true,
                                                    ATTN_MASK_NEG_INF);
    fwd.lse_lo = group_lse + B * heads * T;
    fwd.row_stats = group_lse + 2 * B * heads * T;
    /* forward: y' = y @ W_proj^T + b_proj; the group's columns of dy = dy' @ W_proj */
    attn_k_gemm(m->ctx, false, false, rows, w, C, 1.0f, dy_proj, C,
                attn_module_data(m, C_PROJ_WEIGHT) + h0 * hs, C, 0.0f, dy, w);
    attn_attention_grads grad = {.dout = dy, .dq = dq, .dk = dq + slice, .dv = dq + 2 * slice};
    attn_status st = attn_run_attention_backward(m, &fwd, &grad, 0, NULL);
    /* forward: q, k, v = c_attn(x) restricted to the group's rows of c_attn */
    for (size_t part = 0; part < 3 && st == ATTN_OK; part++) {
        size_t row0 = part * C + h0 * hs;
        attn_k_linear_backward(m->ctx, s->x, attn_module_data(m, C_ATTN_WEIGHT) + row0 * C,
                               dq + part * slice, dx, h0 > 0 || part > 0,
                               attn_module_grad(m, C_ATTN_WEIGHT) + row0 * C,
                               attn_module_grad(m, C_ATTN_BIAS) + row0, rows, C, w);
    }
    return st;
}

/* dx (B, T, C) and the c_attn, c_proj gradients from dy (B, T, C). */
static attn_status gpt2_backward(attn_module *m, const float *dy, float *dx) {
    attn_gpt2 *g = (attn_gpt2 *)m;
    const attn_saved *s = &m->saved;
    size_t C = g->cfg.n_embd, nh = g->cfg.n_head, rows = s->batch * s->tokens;
    float *context = s->acts + 3 * rows * C;
    const uint8_t *mask = attn_saved_mask(s); /* [attention,] residual */
    bool attention_dropout = mask || s->philox;
    size_t heads = attention_dropout ? nh : backward_heads_per_group(g, rows);
    size_t slice = rows * heads * g->head_dim;
    /* all heads: dqkv (B, T, 3C) and dcontext (B, T, C), and dy' when
     * masked, in dqkv's room; groups: 8 slices and lse, lse_lo and row_stats
     * (dy' is dy: no dropout) */
    size_t floats = heads == nh ? 4 * rows * C : 8 * slice + 4 * s->batch * heads * s->tokens;
    attn_status st;
    float *scratch = attn_scratch(m, floats, &st);
    if (!scratch) return st;
    attn_attention_problem fwd = gpt2_heads(g, s->batch, s->tokens, s->acts, context, NULL);
    fwd.q_heads = fwd.kv_heads = heads;
    if ((st = attn_attention_reserve(m, &fwd, true, NULL)) != ATTN_OK) { /* before any gradient */
        attn_free(scratch);
        return st;
    }

    /* forward: out = resid_dropout(y'), y' = c_proj(y) */
    const float *dy_proj = dy;
    if (mask) {
        const uint8_t *resid_bits = mask + g->kept_attention_mask_bytes;
        float *masked = scratch; /* dqkv's room, free until the attention's backward */
        for (size_t i = 0; i < rows * C; i++)
            masked[i] = attn_bit(resid_bits, i) ? dy[i] * s->kept_scale : dy[i] * 0.0f;
        dy_proj = masked;
    }
    /* all heads: dcontext = dy' @ W_proj here; groups take their columns */
    float *dcontext = heads == nh ? scratch + 3 * rows * C : NULL;
    attn_k_linear_backward(m->ctx, context, attn_module_data(m, C_PROJ_WEIGHT), dy_proj,
                           dcontext, false, attn_module_grad(m, C_PROJ_WEIGHT),
                           attn_module_grad(m, C_PROJ_BIAS), rows, C, C);
    if (heads == nh) {
        st = backward_all_heads(m, dcontext, dx, scratch);
    } else {
        for (size_t h0 = 0; h0 < nh && st == ATTN_OK; h0 += heads)
            st = backward_head_group(m, dy_proj, dx, h0, heads, scratch);
    }
    attn_free(scratch);
    attn_attention_release(m);
    return st;
}

const attn_module_ops attn_gpt2_ops = {ATTN_MODULE_GPT2, "CausalSelfAttention", gpt2_forward,
                                       gpt2_backward, ATTN_BUFFERS_TRIL_BIAS};

attn_status attn_gpt2_new(attn_ctx *ctx, const attn_gpt2_config *cfg, attn_rng *init_rng,
                          attn_gpt2 **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_gpt2_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
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
    attn_gpt2 *m = attn_calloc(1, sizeof *m);
    if (!m) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_gpt2_new: out of memory");
    attn_module_init(&m->base, &attn_gpt2_ops, ctx, cfg->n_embd, cfg->n_embd);
    m->base.mask_buffer = cfg->block_size;
    m->cfg = *cfg;
    m->head_dim = cfg->n_embd / cfg->n_head;
    m->scale = attn_default_scale(cfg->scale, m->head_dim);
    m->backward_scratch_floats = GPT2_BACKWARD_SCRATCH_FLOATS;
    size_t C = cfg->n_embd;
    if ((st = attn_module_declare_linear(&m->base, "c_attn", C, 3 * C, true)) != ATTN_OK ||
        (st = attn_module_declare_linear(&m->base, "c_proj", C, C, true)) != ATTN_OK ||
        (st = attn_module_alloc(&m->base)) != ATTN_OK) {
        attn_module_free(&m->base);
        return st;
    }
    size_t index = C_ATTN_WEIGHT;
    if ((st = attn_module_init_linear(&m->base, init_rng, &index, true, C, 3 * C)) != ATTN_OK ||
        (st = attn_module_init_linear(&m->base, init_rng, &index, true, C, C)) != ATTN_OK) {
        attn_module_free(&m->base);
        return st;
    }
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

bool attn_gpt2_attention(const attn_module *m, attn_module_attention *out) {
    if (!m || m->ops != &attn_gpt2_ops) return false;
    const attn_gpt2 *g = (const attn_gpt2 *)m;
    *out = (attn_module_attention){g->cfg.n_head, g->head_dim, g->scale, true, g->cfg.dropout,
                                   false};
    return true;
}
