/*
 * scan.c — the largest magnitudes of a problem's q, k, v and dO
 * (attn_value_tops, attention.h): what the fused and block-map backends
 * check before a pass whose float32 tiles must hold them. One read of each
 * tensor, O((T + S) D) against the attention's O(T S D), on the ctx's
 * threads, with the fused kernel set's vectorised max |x|.
 */
#include "attention/attention.h"

#include "kernels/flash/flash.h"
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
    const float *x;
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

static scan_tensor scan_tensor_of(const attn_attention_problem *p, const float *x,
                                  attn_view_strides s, size_t heads, size_t width, bool keys) {
    size_t len = keys ? p->kv_len : p->q_len; /* the longest, with cu_seqlens */
    bool flat = s.h == width;
    return (scan_tensor){.x = x, .s = s, .heads = heads, .width = width, .keys = keys,
                         .flat = flat,
                         .units = x == NULL ? 0 : flat ? (len + SCAN_ROWS - 1) / SCAN_ROWS : heads};
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
            top[t] = job->max_abs_rows(x->x + attn_view_offset(x->s, b, start, 0, r0), rows,
                                       x->s.t, x->heads * x->width, top[t]);
        } else {
            top[t] = job->max_abs_rows(x->x + attn_view_offset(x->s, b, start, u, 0), len, x->s.t,
                                       x->width, top[t]);
        }
    }
}

void attn_value_tops(attn_ctx *ctx, const attn_attention_problem *p, bool scores,
                     const void *dout, float top[4]) {
    const attn_flash_kernels *fk = ctx->ks.flash;
    const float *q = scores ? (const float *)p->q.data : NULL;
    const float *k = scores ? (const float *)p->k.data : NULL;
    magnitude_scan job = {
        .p = p,
        .tensors = {scan_tensor_of(p, q, p->q.st, p->q_heads, p->head_dim, false),
                    scan_tensor_of(p, k, p->k.st, p->kv_heads, p->head_dim, true),
                    scan_tensor_of(p, (const float *)p->v.data, p->v.st, p->kv_heads,
                                   p->v_head_dim, true),
                    scan_tensor_of(p, (const float *)dout, p->out.st, p->q_heads,
                                   p->v_head_dim, false)},
        .max_abs_rows = fk->max_abs_rows};
    size_t units = 0;
    for (int t = 0; t < 4; t++) units += p->batch * job.tensors[t].units;
    /* parts of at least 64 Ki floats, a unit counted as its fewest */
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
}
