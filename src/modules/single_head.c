/* single_head.c — project, attend, write: the forward every single-head
 * variant shares (SelfAttention_v1/v2, CausalAttention, wrapper heads). */
#include "modules/module.h"

#include <stdlib.h>

attn_status attn_single_head_forward(attn_module *m, const attn_qkv_weights *w,
                                     const attn_head_spec *spec, const float *x, size_t batch,
                                     size_t tokens, float *y, size_t y_stride, attn_rng *rng) {
    size_t rows = batch * tokens, d_out = spec->d_out;
    attn_status st;
    float *qkv = attn_scratch(m, 3 * rows * d_out, &st); /* q, k, v: (B, T, d_out) each */
    if (!qkv) return st;
    float *q = qkv, *k = qkv + rows * d_out, *v = qkv + 2 * rows * d_out;
    attn_project_qkv(m, w, x, batch, tokens, d_out, q, k, v);

    attn_sdpa_args args = {
        .batch = batch, .heads = 1, .tokens = tokens, .head_dim = d_out,
        .q = q, .k = k, .v = v,
        .b_stride = tokens * d_out, .t_stride = d_out, .h_stride = 0,
        .out = y, .out_b_stride = tokens * y_stride, .out_t_stride = y_stride, .out_h_stride = 0,
        .scale = spec->scale, .causal = spec->causal, .mask = spec->mask,
    };
    attn_dropout_stream dropout;
    bool drops = spec->dropout_p > 0.0;
    if (drops) attn_dropout_stream_begin(&dropout, rng, spec->dropout_p, batch * tokens * tokens);
    st = attn_run_sdpa(m, &args, drops ? &dropout : NULL);
    free(qkv);
    return st;
}
