/* widen16.c — the runner's way with a 16-bit problem no backend takes:
 * its views widened to float32 (exactly) in head-major copies, the float
 * problem run, each output rounded back to the dtype once (to nearest
 * even; NaN stays NaN). The float kernels then read every head's rows
 * where they lie, where in the (B, T, H, D) layout they would first gather
 * each head's strided rows. */
#include "attention/attention.h"

#include "half.h"
#include "parallel.h"

#include <string.h>

/* A row of n elements, the dtype chosen once per row (the bf16 loops, a
 * shift and a rounding add, are then simple enough to vectorise). */
static void widen_row(attn_dtype dtype, const uint16_t *x, float *y, size_t n) {
    if (dtype == ATTN_DTYPE_BF16)
        for (size_t d = 0; d < n; d++) y[d] = attn_bf16_to_float(x[d]);
    else
        for (size_t d = 0; d < n; d++) y[d] = attn_f16_to_float(x[d]);
}

static void narrow_row(attn_dtype dtype, const float *x, uint16_t *y, size_t n) {
    if (dtype == ATTN_DTYPE_BF16)
        for (size_t d = 0; d < n; d++) y[d] = attn_float_to_bf16(x[d]);
    else
        for (size_t d = 0; d < n; d++) y[d] = attn_float_to_f16(x[d]);
}

/* ---- views: the (b, t, h) rows of a tensor ----------------------------------- */

/* Which rows of a problem a view has: q-side (q, out, dq, dout) or k-side
 * (k, v, dk, dv), heads of width elements. */
typedef struct view_shape {
    bool keys;
    size_t heads, width;
} view_shape;

/* One copy between a view's 16-bit rows and its float copy. */
typedef struct view_copy {
    const attn_attention_problem *p;
    attn_dtype dtype;
    view_shape shape;
    attn_view_strides from, to; /* the 16-bit view's strides, the float copy's */
    const void *src;
    void *dst;
    bool widening;
} view_copy;

/* The rows of tokens [begin, end) of the batch x longest-length grid (a
 * token past its sequence's length has none). */
static void copy_tokens(void *arg, size_t begin, size_t end) {
    const view_copy *c = arg;
    const attn_attention_problem *p = c->p;
    bool keys = c->shape.keys;
    size_t longest = keys ? p->kv_len : p->q_len;
    for (size_t bt = begin; bt < end; bt++) {
        size_t b = bt / longest, i = bt % longest;
        attn_attention_seq s = attn_attention_seq_of(p, b);
        size_t start = keys ? s.kv_start : s.q_start, len = keys ? s.kv_len : s.q_len;
        if (i >= len) continue;
        for (size_t h = 0; h < c->shape.heads; h++) {
            size_t a = attn_view_offset(c->from, b, start, h, i);
            size_t z = attn_view_offset(c->to, b, start, h, i);
            if (c->widening)
                widen_row(c->dtype, (const uint16_t *)c->src + a, (float *)c->dst + z,
                          c->shape.width);
            else
                narrow_row(c->dtype, (const float *)c->src + z, (uint16_t *)c->dst + a,
                           c->shape.width);
        }
    }
}

/* Copies every row of a view (16-bit, strides from) to its float copy
 * (strides to), widened, or back, rounded, when !widening; on the ctx's
 * threads. */
static void copy_view(attn_ctx *ctx, const attn_attention_problem *p, view_shape shape,
                      attn_view_strides from, attn_view_strides to, const void *src, void *dst,
                      bool widening) {
    view_copy c = {p, p->q.dtype, shape, from, to, src, dst, widening};
    size_t longest = shape.keys ? p->kv_len : p->q_len;
    size_t min_tokens = 16384 / (shape.heads * shape.width + 1) + 1;
    attn_workers w = attn_ctx_workers(ctx);
    attn_pool_for(w.pool, w.threads, p->batch * longest, min_tokens, copy_tokens, &c);
}

/* The tokens of a view's rows: B x T (or S), or the packed total. */
static size_t view_tokens(const attn_attention_problem *p, bool keys) {
    if (p->cu_seqlens_q)
        return (size_t)(keys ? p->cu_seqlens_kv[p->batch] : p->cu_seqlens_q[p->batch]);
    return keys ? p->kv_len : p->q_len;
}

/* The strides {b, t, h} of a head-major float copy of a view: (B, H, T,
 * width), or (H, total, width) packed (no batch stride). */
static attn_view_strides head_major(const attn_attention_problem *p, view_shape v) {
    size_t tokens = view_tokens(p, v.keys);
    bool packed = p->cu_seqlens_q != NULL;
    return (attn_view_strides){packed ? 0 : v.heads * tokens * v.width, v.width, tokens * v.width};
}

/* Elements of a float copy: tokens x heads x width (sizes attn_attention_check bounded). */
static size_t copy_elements(const attn_attention_problem *p, view_shape v) {
    size_t tokens = view_tokens(p, v.keys) * (p->cu_seqlens_q ? 1 : p->batch);
    return tokens * v.heads * v.width;
}

/* The shapes of q, k, v, out: a query view, two key views, an output. */
static view_shape shape_of(const attn_attention_problem *p, int which) {
    switch (which) {
    case 0: return (view_shape){false, p->q_heads, p->head_dim};
    case 1: return (view_shape){true, p->kv_heads, p->head_dim};
    case 2: return (view_shape){true, p->kv_heads, p->v_head_dim};
    default: return (view_shape){false, p->q_heads, p->v_head_dim};
    }
}

attn_status attn_widen16(attn_ctx *ctx, const char *who, const attn_attention_problem *p,
                         const void *dout, attn_attention_problem *wide,
                         attn_attention_grads *g, float **buffer) {
    /* q, k, v, out, then for a backward dout, dq, dk, dv: the inputs first,
     * every element of which the copies write; only the outputs start
     * zeroed */
    bool backward = dout != NULL;
    int count = backward ? 8 : 4, copied = backward ? 5 : 3;
    static const int shapes[8] = {0, 1, 2, 3, 3, 0, 1, 2};
    size_t n[8], total = 0, zero_from = 0;
    bool fits = true;
    for (int i = 0; i < count; i++) {
        n[i] = copy_elements(p, shape_of(p, shapes[i]));
        fits = fits && attn_add_size(total, n[i], &total);
        if (i + 1 == copied) zero_from = total;
    }
    float *all = fits && attn_floats_fit(total) ? attn_malloc((total ? total : 1) * sizeof *all)
                                                : NULL;
    if (!all)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                         "%s: cannot allocate %zu floats for the widened tensors", who, total);
    memset(all + zero_from, 0, (total - zero_from) * sizeof *all);
    float *f[8];
    size_t at = 0;
    for (int i = 0; i < count; at += n[i], i++) f[i] = all + at;
    *wide = *p;
    attn_view *views[4] = {&wide->q, &wide->k, &wide->v, &wide->out};
    const attn_view *from[4] = {&p->q, &p->k, &p->v, &p->out};
    for (int i = 0; i < 4; i++)
        *views[i] = attn_view_f32(f[i], head_major(p, shape_of(p, i)));
    for (int i = 0; i < 3; i++)
        copy_view(ctx, p, shape_of(p, i), from[i]->st, views[i]->st, from[i]->data, f[i], true);
    if (backward) {
        copy_view(ctx, p, shape_of(p, 3), p->out.st, wide->out.st, p->out.data, f[3], true);
        copy_view(ctx, p, shape_of(p, 3), p->out.st, wide->out.st, dout, f[4], true);
        *g = (attn_attention_grads){.dout = f[4], .dq = f[5], .dk = f[6], .dv = f[7]};
    }
    *buffer = all;
    return ATTN_OK;
}

void attn_narrow16(attn_ctx *ctx, const attn_attention_problem *p,
                   const attn_attention_problem *wide, const attn_attention_grads *g,
                   const attn_attention_grads *p_grads) {
    if (!g) {
        copy_view(ctx, p, shape_of(p, 3), p->out.st, wide->out.st, wide->out.data, p->out.data,
                  false);
        return;
    }
    copy_view(ctx, p, shape_of(p, 0), p->q.st, wide->q.st, g->dq, p_grads->dq, false);
    copy_view(ctx, p, shape_of(p, 1), p->k.st, wide->k.st, g->dk, p_grads->dk, false);
    copy_view(ctx, p, shape_of(p, 2), p->v.st, wide->v.st, g->dv, p_grads->dv, false);
}
