/* single_head.c — project, attend, write: the forward every single-head
 * variant shares (SelfAttention_v1/v2, CausalAttention, wrapper heads),
 * and its backward. */
#include "modules/module.h"

#include <stdlib.h>
#include <string.h>

size_t attn_single_head_acts(size_t batch, size_t tokens, size_t d_out) {
    return 4 * batch * tokens * d_out + batch * tokens;
}

/* The head's kept tensors inside acts: q, k, v, out (B, T, d_out), lse (B, T). */
typedef struct head_acts {
    float *q, *k, *v, *out, *lse;
} head_acts;

static head_acts head_acts_of(float *acts, size_t rows, size_t d_out) {
    return (head_acts){acts, acts + rows * d_out, acts + 2 * rows * d_out, acts + 3 * rows * d_out,
                       acts + 4 * rows * d_out};
}

/* The one head over q, k, v (B, T, d_out), its output contiguous in out. */
static attn_sdpa_args head_args(const attn_head_spec *spec, size_t batch, size_t tokens,
                                const head_acts *h) {
    size_t d_out = spec->d_out;
    attn_sdpa_args args = {
        .batch = batch, .heads = 1, .tokens = tokens, .head_dim = d_out,
        .q = h->q, .k = h->k, .v = h->v,
        .b_stride = tokens * d_out, .t_stride = d_out, .h_stride = 0,
        .out = h->out, .out_b_stride = tokens * d_out, .out_t_stride = d_out, .out_h_stride = 0,
        .lse = h->lse,
        .scale = spec->scale, .causal = spec->causal, .mask = spec->mask,
    };
    attn_sdpa_self(&args);
    return args;
}

attn_status attn_single_head_forward(attn_module *m, const attn_qkv_weights *w,
                                     const attn_head_spec *spec, const float *x, size_t batch,
                                     size_t tokens, float *acts, uint8_t *keep_bits, float *y,
                                     size_t y_stride, attn_rng *rng) {
    size_t rows = batch * tokens, d_out = spec->d_out;
    head_acts h = head_acts_of(acts, rows, d_out);
    attn_project_qkv(m, w, x, batch, tokens, d_out, h.q, h.k, h.v);

    attn_sdpa_args args = head_args(spec, batch, tokens, &h);
    args.keep_bits = keep_bits;
    attn_dropout_stream dropout;
    bool drops = spec->dropout_p > 0.0;
    if (drops) attn_dropout_stream_begin(&dropout, rng, spec->dropout_p, batch * tokens * tokens);
    attn_status st = attn_run_sdpa(m, &args, drops ? &dropout : NULL);
    /* y's rows may be strided (a wrapper head's columns) */
    if (st == ATTN_OK)
        for (size_t r = 0; r < rows; r++)
            memcpy(y + r * y_stride, h.out + r * d_out, d_out * sizeof *y);
    return st;
}

attn_status attn_single_head_backward(attn_module *m, const attn_qkv_weights *w,
                                      const attn_qkv_grads *grad, const attn_head_spec *spec,
                                      const float *x, size_t batch, size_t tokens, float *acts,
                                      const uint8_t *keep_bits, size_t call, const float *dy,
                                      size_t dy_stride, float *dx) {
    size_t rows = batch * tokens, d_out = spec->d_out;
    attn_status st;
    /* dq, dk, dv (B, T, d_out) each, then dy gathered to contiguous rows */
    float *buf = attn_scratch(m, 4 * rows * d_out, &st);
    if (!buf) return st;
    float *dq = buf, *dk = buf + rows * d_out, *dv = buf + 2 * rows * d_out;
    float *dout = buf + 3 * rows * d_out;
    for (size_t r = 0; r < rows; r++) memcpy(dout + r * d_out, dy + r * dy_stride, d_out * sizeof *dy);
    head_acts h = head_acts_of(acts, rows, d_out);

    /* forward: y = dropout(softmax(mask(q k^T * scale))) v */
    attn_sdpa_args fwd = head_args(spec, batch, tokens, &h);
    attn_sdpa_grad_args g = {.fwd = &fwd, .dout = dout, .dq = dq, .dk = dk, .dv = dv,
                             .out = h.out, .lse = h.lse};
    st = attn_run_sdpa_backward(m, &g, call, keep_bits);
    /* forward: q, k, v = x W_q, x W_k, x W_v */
    if (st == ATTN_OK) attn_project_qkv_backward(m, w, grad, x, rows, d_out, dq, dk, dv, dx);
    free(buf);
    return st;
}
