/*
 * scan.c — the largest magnitudes of a problem's q, k, v and dO
 * (attn_value_tops, attention.h): what the fused backends, float32 and
 * bf16, and the block-map backend check before a pass whose float32 tiles
 * must hold them. One read of each tensor, O((T + S) D) against the
 * attention's O(T S D), on the ctx's threads, with the kernels' vectorised
 * max |x| of the tensor's type.
 */
#include "attention/attention.h"

#include "half.h"
#include "kernels/flash/flash.h"
#if defined(ATTN_HAVE_X86_KERNELS)
#include "kernels/flash16/flash16.h"
#endif
#include "parallel.h"

#include <math.h>

/* Parts of the scan (its threads, at most). */
#define SCAN_PARTS 64

/* Token rows per unit of the scan where a token's heads lie side by side. */
#define SCAN_ROWS 256

/* One tensor of the scan, in units: where a token's heads lie side by side
 * (h stride = D, the (B, T, H, D) layout), blocks of SCAN_ROWS tokens read
 * as rows of heads x D floats in memory order; otherwise one head's rows.
 * Read head by head, (B, T, H, D) rows lie 3 KiB apart at H = 12, past the
 * hardware's stride prefetch. */
typedef struct scan_tensor {
    const void *x;
    attn_dtype dtype; /* F32, or BF16 (the bf16 backend's views) */
    attn_view_strides s;
    size_t heads, units; /* units per batch */
    size_t width;        /* floats a row: head_dim, v_head_dim for v and dout */
    bool keys, flat;     /* rows of the keys' lengths; heads side by side */
} scan_tensor;

typedef struct magnitude_scan {
    const attn_attention_problem *p;
    scan_tensor tensors[4]; /* q, k, v, dout (NULL x: not scanned) */
    /* the kernels' own, vectorised: max |x| over rows of D floats */
    float (*max_abs_rows)(const float *x, size_t rows, size_t st, size_t n, float top);
    float part_max[SCAN_PARTS][4]; /* max |x| of q, k, v, dout per part; inf: not finite */
} magnitude_scan;

static scan_tensor scan_tensor_of(const attn_attention_problem *p, const void *x,
                                  attn_dtype dtype, attn_view_strides s, size_t heads,
                                  size_t width, bool keys) {
    size_t len = keys ? p->kv_len : p->q_len; /* the longest, with cu_seqlens */
    bool flat = s.h == width;
    return (scan_tensor){.x = x, .dtype = dtype, .s = s, .heads = heads, .width = width,
                         .keys = keys, .flat = flat,
                         .units = x == NULL ? 0 : flat ? (len + SCAN_ROWS - 1) / SCAN_ROWS : heads};
}

/* max(top, the largest |x| of rows rows of n elements from element at of
 * x's tensor, st apart), inf where one is inf or NaN. */
static float rows_top(const magnitude_scan *job, const scan_tensor *x, size_t at, size_t rows,
                      size_t n, float top) {
#if defined(ATTN_HAVE_X86_KERNELS)
    if (x->dtype == ATTN_DTYPE_BF16) {
        /* bf16 magnitudes order as their bits; from 0x7F80 inf and NaN */
        uint16_t bits = attn_flash16_max_magnitude((const uint16_t *)x->x + at, rows, x->s.t, n);
        float m = bits >= 0x7F80u ? INFINITY : attn_bf16_to_float(bits);
        return m > top ? m : top;
    }
#endif
    return job->max_abs_rows((const float *)x->x + at, rows, x->s.t, n, top);
}

/* Units [begin, end), numbered through the tensors in order, batch by batch. */
static void scan_units(void *arg, size_t part, size_t begin, size_t end) {
    magnitude_scan *job = arg;
    const attn_attention_problem *p = job->p;
    float *top = job->part_max[part];
    for (size_t i = begin; i < end; i++) {
        size_t t = 0, u = i;
        while (u >= p->batch * job->tensors[t].units) u -= p->batch * job->tensors[t++].units;
        const scan_tensor *x = &job->tensors[t];
        size_t b = u / x->units;
        u %= x->units;
        attn_attention_seq s = attn_attention_seq_of(p, b);
        size_t start = x->keys ? s.kv_start : s.q_start, len = x->keys ? s.kv_len : s.q_len;
        if (x->flat) {
            size_t r0 = u * SCAN_ROWS;
            if (r0 >= len) continue;
            size_t rows = len - r0 < SCAN_ROWS ? len - r0 : SCAN_ROWS;
            top[t] = rows_top(job, x, attn_view_offset(x->s, b, start, 0, r0), rows,
                              x->heads * x->width, top[t]);
        } else {
            top[t] = rows_top(job, x, attn_view_offset(x->s, b, start, u, 0), len, x->width,
                              top[t]);
        }
    }
}

void attn_value_tops(attn_ctx *ctx, const attn_attention_problem *p, bool scores,
                     const void *dout, float top[4]) {
    const void *q = scores ? p->q.data : NULL, *k = scores ? p->k.data : NULL;
    magnitude_scan job = {
        .p = p,
        .tensors = {scan_tensor_of(p, q, p->q.dtype, p->q.st, p->q_heads, p->head_dim, false),
                    scan_tensor_of(p, k, p->k.dtype, p->k.st, p->kv_heads, p->head_dim, true),
                    scan_tensor_of(p, p->v.data, p->v.dtype, p->v.st, p->kv_heads,
                                   p->v_head_dim, true),
                    scan_tensor_of(p, dout, p->out.dtype, p->out.st, p->q_heads,
                                   p->v_head_dim, false)},
        .max_abs_rows = ctx->ks.flash->max_abs_rows};
    size_t units = 0;
    for (int t = 0; t < 4; t++) units += p->batch * job.tensors[t].units;
    /* parts of at least 64 Ki elements, a unit counted as its fewest */
    size_t rows = p->q_len < p->kv_len ? p->q_len : p->kv_len;
    rows = rows < SCAN_ROWS ? rows : SCAN_ROWS;
    size_t min_units = ((size_t)1 << 16) / (rows * p->head_dim + 1) + 1;
    attn_workers w = attn_ctx_workers(ctx);
    size_t threads = w.threads < SCAN_PARTS ? w.threads : SCAN_PARTS;
    attn_pool_for_parts(w.pool, threads, units, min_units, scan_units, &job);
    for (int t = 0; t < 4; t++) top[t] = 0.0f;
    for (size_t part = 0; part < SCAN_PARTS; part++)
        for (int t = 0; t < 4; t++)
            top[t] = job.part_max[part][t] > top[t] ? job.part_max[part][t] : top[t];
    attn_value_tops_whole(p, scores, dout != NULL, top);
}

void attn_value_tops_whole(const attn_attention_problem *p, bool scores, bool dout,
                           float top[4]) {
    if (!p->whole_tops) return;
    const bool read[4] = {scores, scores, true, dout};
    for (int t = 0; t < 4; t++)
        if (read[t] && p->whole_tops[t] > top[t]) top[t] = p->whole_tops[t];
}
