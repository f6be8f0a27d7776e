/* single_head.c — project, attend, write: the forward every single-head
 * variant shares (SelfAttention_v1/v2, CausalAttention, wrapper heads),
 * and its backward. */
#include "modules/module.h"

#include <stdlib.h>

/* The one head over q, k, v (B, T, d_out) writing y at row stride y_stride. */
static attn_sdpa_args head_args(const attn_head_spec *spec, size_t batch, size_t tokens,
                                const float *q, const float *k, const float *v, float *y,
                                size_t y_stride) {
    size_t d_out = spec->d_out;
    attn_sdpa_args args = {
        .batch = batch, .heads = 1, .tokens = tokens, .head_dim = d_out,
        .q = q, .k = k, .v = v,
        .b_stride = tokens * d_out, .t_stride = d_out, .h_stride = 0,
        .out = y, .out_b_stride = tokens * y_stride, .out_t_stride = y_stride, .out_h_stride = 0,
        .scale = spec->scale, .causal = spec->causal, .mask = spec->mask,
    };
    attn_sdpa_self(&args);
    return args;
}

attn_status attn_single_head_forward(attn_module *m, const attn_qkv_weights *w,
                                     const attn_head_spec *spec, const float *x, size_t batch,
                                     size_t tokens, float *qkv, uint8_t *keep_bits, float *y,
                                     size_t y_stride, attn_rng *rng) {
    size_t rows = batch * tokens, d_out = spec->d_out;
    /* q, k, v: (B, T, d_out) each */
    float *q = qkv, *k = qkv + rows * d_out, *v = qkv + 2 * rows * d_out;
    attn_project_qkv(m, w, x, batch, tokens, d_out, q, k, v);

    attn_sdpa_args args = head_args(spec, batch, tokens, q, k, v, y, y_stride);
    args.keep_bits = keep_bits;
    attn_dropout_stream dropout;
    bool drops = spec->dropout_p > 0.0;
    if (drops) attn_dropout_stream_begin(&dropout, rng, spec->dropout_p, batch * tokens * tokens);
    return attn_run_sdpa(m, &args, drops ? &dropout : NULL);
}

attn_status attn_single_head_backward(attn_module *m, const attn_qkv_weights *w,
                                      const attn_qkv_grads *grad, const attn_head_spec *spec,
                                      const float *x, size_t batch, size_t tokens,
                                      const float *qkv, const uint8_t *keep_bits,
                                      float kept_scale, const float *dy, size_t dy_stride,
                                      float *dx) {
    size_t rows = batch * tokens, d_out = spec->d_out;
    attn_status st;
    float *dqkv = attn_scratch(m, 3 * rows * d_out, &st); /* dq, dk, dv: (B, T, d_out) each */
    if (!dqkv) return st;
    float *dq = dqkv, *dk = dqkv + rows * d_out, *dv = dqkv + 2 * rows * d_out;
    const float *q = qkv, *k = qkv + rows * d_out, *v = qkv + 2 * rows * d_out;

    /* forward: y = dropout(softmax(mask(q k^T * scale))) v */
    attn_sdpa_args fwd = head_args(spec, batch, tokens, q, k, v, NULL, dy_stride);
    attn_sdpa_grad_args g = {.fwd = &fwd, .dout = dy, .dq = dq, .dk = dk, .dv = dv,
                             .keep_bits = keep_bits, .kept_scale = kept_scale};
    st = attn_run_sdpa_backward(m, &g);
    /* forward: q, k, v = x W_q, x W_k, x W_v */
    if (st == ATTN_OK) attn_project_qkv_backward(m, w, grad, x, rows, d_out, dq, dk, dv, dx);
    free(dqkv);
    return st;
}
