/*
 * sa_v1.c — SelfAttention_v1 (seeds, section 3.4): nn.Parameter weights
 * (d_in, d_out) initialised with torch.rand, in the order W_query, W_key,
 * W_value.
 *   queries, keys, values (B, T, d_out) = x @ W_*
 *   context (B, T, d_out) = softmax(queries @ keys^T * scale) @ values
 * The backward runs the same steps in reverse (single_head.c).
 */
#include "modules/module.h"

#include <stdlib.h>
#include <string.h>

enum { SA1_W_QUERY, SA1_W_KEY, SA1_W_VALUE };

struct attn_sa_v1 {
    attn_module base;
    float scale;
};

static attn_qkv_weights sa_v1_weights(attn_module *m) {
    return (attn_qkv_weights){.wq = attn_module_data(m, SA1_W_QUERY),
                              .wk = attn_module_data(m, SA1_W_KEY),
                              .wv = attn_module_data(m, SA1_W_VALUE)};
}

/* y (B, T, d_out) = SelfAttention_v1(x (B, T, d_in)) */
static attn_status sa_v1_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                                 float *y, attn_rng *rng) {
    (void)rng;
    attn_sa_v1 *sa = (attn_sa_v1 *)m;
    size_t width = attn_max_size(m->d_in, 3 * m->d_out);
    attn_status st = attn_check_forward(m, x, batch, tokens, y, 0, width, false, NULL);
    if (st != ATTN_OK) return st;
    attn_qkv_weights w = sa_v1_weights(m);
    attn_head_spec spec = {.d_out = m->d_out, .scale = sa->scale};
    float *acts; /* q, k, v, out (B, T, d_out), lse (B, T) */
    uint8_t *no_bits;
    st = attn_forward_prepare(m, batch, tokens, attn_single_head_acts(batch, tokens, m->d_out), 0,
                              &acts, &no_bits);
    if (st != ATTN_OK) return st;
    st = attn_single_head_forward(m, &w, &spec, x, batch, tokens, acts, NULL, y, m->d_out, NULL);
    if (st == ATTN_OK) attn_trace_btc(m, "context_vec", batch, tokens, m->d_out, y);
    if (st == ATTN_OK && m->grad_enabled) st = attn_forward_keep(m, x, batch, tokens, 1.0f);
    attn_forward_release(m, acts);
    return st;
}

/* dx (B, T, d_in) and dW_* (d_in, d_out) += from dy (B, T, d_out). */
static attn_status sa_v1_backward(attn_module *m, const float *dy, float *dx) {
    attn_sa_v1 *sa = (attn_sa_v1 *)m;
    attn_qkv_weights w = sa_v1_weights(m);
    attn_qkv_grads grad = {.wq = attn_module_grad(m, SA1_W_QUERY),
                           .wk = attn_module_grad(m, SA1_W_KEY),
                           .wv = attn_module_grad(m, SA1_W_VALUE)};
    attn_head_spec spec = {.d_out = m->d_out, .scale = sa->scale};
    return attn_one_head_backward(m, &w, &grad, &spec, dy, dx);
}

const attn_module_ops attn_sa_v1_ops = {ATTN_MODULE_SA_V1, "SelfAttention_v1", sa_v1_forward,
                                        sa_v1_backward, ATTN_BUFFERS_NONE};

attn_status attn_sa_v1_new(attn_ctx *ctx, const attn_sa_v1_config *cfg, attn_rng *init_rng,
                           attn_sa_v1 **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_sa_v1_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    const char *name = "SelfAttention_v1";
    attn_status st;
    if ((st = attn_check_width(ctx, name, "d_in", cfg->d_in)) != ATTN_OK ||
        (st = attn_check_width(ctx, name, "d_out", cfg->d_out)) != ATTN_OK ||
        (st = attn_check_scale(ctx, name, cfg->scale)) != ATTN_OK)
        return st;
    attn_sa_v1 *m = attn_calloc(1, sizeof *m);
    if (!m) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_sa_v1_new: out of memory");
    attn_module_init(&m->base, &attn_sa_v1_ops, ctx, cfg->d_in, cfg->d_out);
    m->scale = attn_default_scale(cfg->scale, cfg->d_out);
    size_t shape[2] = {cfg->d_in, cfg->d_out};
    if ((st = attn_module_declare(&m->base, 2, shape, "W_query")) != ATTN_OK ||
        (st = attn_module_declare(&m->base, 2, shape, "W_key")) != ATTN_OK ||
        (st = attn_module_declare(&m->base, 2, shape, "W_value")) != ATTN_OK ||
        (st = attn_module_alloc(&m->base)) != ATTN_OK) {
        attn_module_free(&m->base);
        return st;
    }
    /* nn.Parameter(torch.rand(d_in, d_out)) three times, in this order. */
    for (size_t i = SA1_W_QUERY; i <= SA1_W_VALUE; i++)
        if ((st = attn_rng_rand(init_rng, attn_module_data(&m->base, i),
                                m->base.params[i].numel)) != ATTN_OK) {
            attn_module_free(&m->base);
            return st;
        }
    *out = m;
    return ATTN_OK;
}

attn_status attn_sa_v1_forward(attn_sa_v1 *m, const float *x, size_t batch, size_t tokens,
                               float *y) {
    if (!m) return ATTN_ERR_NULL;
    return sa_v1_forward(&m->base, x, batch, tokens, y, NULL);
}

attn_status attn_sa_v1_backward(attn_sa_v1 *m, const float *dy, size_t batch, size_t tokens,
                                float *dx) {
    return attn_module_backward(attn_sa_v1_module(m), dy, batch, tokens, dx);
}

attn_module *attn_sa_v1_module(attn_sa_v1 *m) { return m ? &m->base : NULL; }
void attn_sa_v1_free(attn_sa_v1 *m) { attn_module_free(attn_sa_v1_module(m)); }
