/* single_head.c — project, attend, write: the forward every single-head
 * variant shares (SelfAttention_v1/v2, CausalAttention, wrapper heads),
 * and its backward. */
#include "modules/module.h"

#include <stdlib.h>
#include <string.h>

size_t attn_single_head_acts(size_t batch, size_t tokens, size_t d_out) {
    return 4 * batch * tokens * d_out + 4 * batch * tokens;
}

/* The head's kept tensors inside acts: q, k, v, out (B, T, d_out), lse and
 * its rounding error lse_lo (B, T), row_stats (B, T, 2). */
typedef struct head_acts {
    float *q, *k, *v, *out, *lse, *lse_lo, *row_stats;
} head_acts;

static head_acts head_acts_of(float *acts, size_t rows, size_t d_out) {
    float *lse = acts + 4 * rows * d_out;
    return (head_acts){acts, acts + rows * d_out, acts + 2 * rows * d_out, acts + 3 * rows * d_out,
                       lse, lse + rows, lse + 2 * rows};
}

/* The one head over q, k, v (B, T, d_out), its output contiguous in out. */
static attn_attention_problem head_problem(const attn_head_spec *spec, size_t batch,
                                           size_t tokens, const head_acts *h) {
    attn_attention_problem p =
        attn_heads_problem(batch, tokens, 1, 1, spec->d_out, h->q, h->k, h->v, h->out, h->lse,
                           spec->scale, spec->causal, spec->mask);
    p.lse_lo = h->lse_lo;
    p.row_stats = h->row_stats;
    return p;
}

attn_status attn_single_head_forward(attn_module *m, const attn_qkv_weights *w,
                                     const attn_head_spec *spec, const float *x, size_t batch,
                                     size_t tokens, float *acts, uint8_t *keep_bits, float *y,
                                     size_t y_stride, attn_rng *rng) {
    size_t rows = batch * tokens, d_out = spec->d_out;
    head_acts h = head_acts_of(acts, rows, d_out);
    attn_project_qkv(m, w, x, batch, tokens, d_out, h.q, h.k, h.v);

    attn_attention_problem p = head_problem(spec, batch, tokens, &h);
    bool drops = spec->dropout_p > 0.0;
    /* The workspace before the first draw and the first write of y (a
     * no-op when the pass reserved it). */
    attn_status st = attn_attention_reserve(m, &p, false, drops ? rng : NULL);
    if (st != ATTN_OK) return st;
    attn_dropout_stream dropout;
    if (drops) attn_dropout_stream_begin(&dropout, rng, spec->dropout_p, batch * tokens * tokens);
    st = attn_run_attention(m, &p, drops ? &dropout : NULL, keep_bits);
    /* y's rows may be strided (a wrapper head's columns) */
    if (st == ATTN_OK)
        for (size_t r = 0; r < rows; r++)
            memcpy(y + r * y_stride, h.out + r * d_out, d_out * sizeof *y);
    return st;
}

attn_status attn_single_head_reserve(attn_module *m, const attn_head_spec *spec, size_t batch,
                                     size_t tokens, bool backward, const attn_rng *dropout_rng) {
    head_acts none = {0};
    attn_attention_problem p = head_problem(spec, batch, tokens, &none);
    return attn_attention_reserve(m, &p, backward, dropout_rng);
}

attn_status attn_single_head_backward(attn_module *m, const attn_qkv_weights *w,
                                      const attn_qkv_grads *grad, const attn_head_spec *spec,
                                      const float *x, size_t batch, size_t tokens, float *acts,
                                      const uint8_t *keep_bits, size_t call, const float *dy,
                                      size_t dy_stride, float *scratch, float *dx) {
    size_t rows = batch * tokens, d_out = spec->d_out;
    /* dq, dk, dv (B, T, d_out) each, then dy gathered to contiguous rows */
    float *dq = scratch, *dk = scratch + rows * d_out, *dv = scratch + 2 * rows * d_out;
    float *dout = scratch + 3 * rows * d_out;
    for (size_t r = 0; r < rows; r++) memcpy(dout + r * d_out, dy + r * dy_stride, d_out * sizeof *dy);
    head_acts h = head_acts_of(acts, rows, d_out);

    /* forward: y = dropout(softmax(mask(q k^T * scale))) v */
    attn_attention_problem fwd = head_problem(spec, batch, tokens, &h);
    attn_attention_grads g = {.dout = dout, .dq = dq, .dk = dk, .dv = dv};
    attn_status st = attn_run_attention_backward(m, &fwd, &g, call, keep_bits);
    /* forward: q, k, v = x W_q, x W_k, x W_v */
    if (st == ATTN_OK) attn_project_qkv_backward(m, w, grad, x, rows, d_out, dq, dk, dv, dx);
    return st;
}

attn_status attn_one_head_backward(attn_module *m, const attn_qkv_weights *w,
                                   const attn_qkv_grads *grad, const attn_head_spec *spec,
                                   const float *dy, float *dx) {
    const attn_saved *s = &m->saved;
    size_t rows = s->batch * s->tokens;
    attn_status st;
    float *scratch = attn_scratch(m, 4 * rows * spec->d_out, &st);
    if (!scratch) return st;
    if ((st = attn_single_head_reserve(m, spec, s->batch, s->tokens, true, NULL)) == ATTN_OK) {
        if (dx) memset(dx, 0, rows * m->d_in * sizeof *dx);
        st = attn_single_head_backward(m, w, grad, spec, s->x, s->batch, s->tokens, s->acts,
                                       attn_saved_mask(s), 0, dy, spec->d_out, scratch, dx);
    }
    attn_free(scratch);
    attn_attention_release(m);
    return st;
}
