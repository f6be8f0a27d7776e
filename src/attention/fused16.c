/*
 * fused16.c — the fused bf16 backend of the attention contract: the
 * kernels of kernels/flash16 (flash16.h) on bf16 views, on AMX tiles where
 * the process may use them and they take the problem, else on vdpbf16ps.
 * A block map of single key intervals per row runs here (the kernels see
 * keys through attn_visible_keys and mask each element by its row's
 * interval); one with partial tiles' bits is declined by name.
 * It declines what those kernels lack (dropout, softcap, ALiBi, sinks,
 * v_head_dim != head_dim, a negative scale), a ctx whose kernel set has
 * no bf16 kernels, vdpbf16ps where it does not outrun the float FMA on
 * widened tensors (Intel's cores; the kernel set's bf16_dot_pays),
 * values whose scores, sums or dP float tiles would not hold, and values
 * so small that the bf16 products, which flush below 2^-126, would lose
 * them; the runner then widens the problem to float32.
 */
#include "attention/attention.h"

#include "half.h"
#include "parallel.h"
#if defined(ATTN_HAVE_X86_KERNELS)
#include "kernels/flash16/flash16.h"
#endif

#include <float.h>

#if defined(ATTN_HAVE_X86_KERNELS)

/* The AMX kernels where the process may use the tiles now and they take
 * p, else NULL. */
static const attn_flash16_kernels *amx_kernels(const attn_ctx *ctx,
                                               const attn_attention_problem *p) {
    const attn_flash16_kernels *amx = ctx->ks.flash16_amx;
    return amx && attn_ctx_amx_usable(ctx) && !amx->declines(p) ? amx : NULL;
}

/* The bf16 kernels that run p: AMX's where they take it, else vdpbf16ps'. */
static const attn_flash16_kernels *flash16_kernels(const attn_ctx *ctx,
                                                   const attn_attention_problem *p) {
    const attn_flash16_kernels *amx = amx_kernels(ctx, p);
    return amx ? amx : ctx->ks.flash16_dot;
}

static const char *fused16_declines(const attn_ctx *ctx, const attn_attention_problem *p,
                                    attn_pass pass) {
    if (p->q.dtype != ATTN_DTYPE_BF16) return "its kernels read bf16";
    if (!ctx->ks.flash16_dot) return "the ctx's kernels have no bf16 kernels";
    if (pass.traced) return "the scores' trace is the reference's";
    if (pass.dropout) return "dropout";
    const char *feature =
        attn_problem_unsupported(p, ATTN_USES_CAUSAL | ATTN_USES_WINDOW | ATTN_USES_VARLEN |
                                        ATTN_USES_ROW_INTERVALS);
    if (feature) return feature;
    if (p->v_head_dim != p->head_dim) return "v_head_dim != head_dim";
    if (!(p->scale >= 0.0f)) return "a negative scale";
    if (pass.backward && !p->lse) return "a backward without the forward's lse";
    /* vdpbf16ps where it outruns the float FMA on widened tensors (not on
     * Intel's cores, where it issues at half the FMA's rate), or where a
     * test asks for it (attn_sdpa16_force_dot) */
    if (!amx_kernels(ctx, p) && !ctx->ks.bf16_dot_pays && !ctx->bf16_dot_forced)
        return "vdpbf16ps does not outrun the float FMA on this CPU";
    return NULL;
}

static const char *fused16_kernel_name(const attn_ctx *ctx, const attn_attention_problem *p) {
    return flash16_kernels(ctx, p)->name;
}

/* ---- the scan for values the bf16 kernels must not take ----------------------
 *
 * The largest |x| of q, k, v (and dout) on the ctx's threads. A unit is
 * SCAN16_ROWS tokens of every head where a token's heads lie side by side
 * (h stride = width: rows read in memory order, as fused.c's scan), else
 * one head's rows. */

#define SCAN16_PARTS 64
#define SCAN16_ROWS 256

typedef struct scan16_view {
    const uint16_t *x; /* NULL: not scanned */
    attn_view_strides st;
    bool keys;
    size_t heads, width;
    size_t units; /* per batch */
    bool flat;    /* heads side by side */
} scan16_view;

typedef struct scan16 {
    const attn_attention_problem *p;
    scan16_view views[4];                /* q, k, v, dout */
    uint16_t part_max[SCAN16_PARTS][4]; /* largest |x| (bf16 bits) per part */
} scan16;

static scan16_view scan16_view_of(const attn_attention_problem *p, const void *x,
                                  attn_view_strides st, bool keys, size_t heads) {
    size_t len = keys ? p->kv_len : p->q_len; /* the longest, with cu_seqlens */
    bool flat = st.h == p->head_dim;
    return (scan16_view){.x = x, .st = st, .keys = keys, .heads = heads, .width = p->head_dim,
                         .flat = flat,
                         .units = !x ? 0 : flat ? (len + SCAN16_ROWS - 1) / SCAN16_ROWS : heads};
}

/* Units [begin, end), numbered through the views in order, batch by batch. */
static void scan16_units(void *arg, size_t part, size_t begin, size_t end) {
    scan16 *job = arg;
    const attn_attention_problem *p = job->p;
    uint16_t *top = job->part_max[part];
    for (size_t i = begin; i < end; i++) {
        size_t t = 0, u = i;
        while (u >= p->batch * job->views[t].units) u -= p->batch * job->views[t++].units;
        const scan16_view *x = &job->views[t];
        size_t b = u / x->units;
        u %= x->units;
        attn_attention_seq s = attn_attention_seq_of(p, b);
        size_t start = x->keys ? s.kv_start : s.q_start, len = x->keys ? s.kv_len : s.q_len;
        size_t r0 = x->flat ? u * SCAN16_ROWS : 0, h = x->flat ? 0 : u;
        if (r0 >= len) continue;
        size_t rows = x->flat && len - r0 > SCAN16_ROWS ? SCAN16_ROWS : len - r0;
        uint16_t m = attn_flash16_max_magnitude(x->x + attn_view_offset(x->st, b, start, h, r0),
                                                rows, x->st.t,
                                                x->flat ? x->heads * x->width : x->width);
        top[t] = m > top[t] ? m : top[t];
    }
}

/* top[t] = the largest |x| of q, k, v, dout (0 for dout NULL), or false
 * when some element is inf or NaN. */
static bool scan_magnitudes(attn_ctx *ctx, const attn_attention_problem *p, const void *dout,
                            float top[4]) {
    scan16 job = {.p = p,
                  .views = {scan16_view_of(p, p->q.data, p->q.st, false, p->q_heads),
                            scan16_view_of(p, p->k.data, p->k.st, true, p->kv_heads),
                            scan16_view_of(p, p->v.data, p->v.st, true, p->kv_heads),
                            scan16_view_of(p, dout, p->out.st, false, p->q_heads)}};
    size_t units = 0;
    for (int t = 0; t < 4; t++) units += p->batch * job.views[t].units;
    /* parts of at least 64 Ki elements, a unit counted as its fewest */
    size_t rows = p->q_len < p->kv_len ? p->q_len : p->kv_len;
    rows = rows < SCAN16_ROWS ? rows : SCAN16_ROWS;
    size_t min_units = ((size_t)1 << 16) / (rows * p->head_dim + 1) + 1;
    attn_workers w = attn_ctx_workers(ctx);
    size_t threads = w.threads < SCAN16_PARTS ? w.threads : SCAN16_PARTS;
    attn_pool_for_parts(w.pool, threads, units, min_units, scan16_units, &job);
    for (int t = 0; t < 4; t++) {
        uint16_t largest = 0;
        for (size_t part = 0; part < SCAN16_PARTS; part++)
            largest = job.part_max[part][t] > largest ? job.part_max[part][t] : largest;
        if (largest >= 0x7F80u) return false; /* magnitudes order as their bits */
        top[t] = attn_bf16_to_float(largest);
    }
    return true;
}

/* Scores, sums and dP that float tiles hold (as the float kernels' own
 * scan, fused.c), or why not. */
static const char *fused16_declines_values(attn_ctx *ctx, const attn_attention_problem *p,
                                           const void *dout) {
    float top[4];
    if (!scan_magnitudes(ctx, p, dout, top)) return "a non-finite input";
    float qm = top[0], km = top[1], vm = top[2], dm = top[3];
    double D = (double)p->head_dim, S = (double)p->kv_len, limit = FLT_MAX / 16.0;
    double raw = 1.4426950408889634 * (double)p->scale * D * qm * km;
    if (S * vm >= limit || D * dm * vm >= limit || S * dm >= limit)
        return "scores past float32's range in its tiles";
    if (attn_values_past_weight_floor(p, vm, dm))
        return "values that the weights below 2^-125 it leaves out would carry";
    /* AMX and vdpbf16ps flush a product below 2^-126 (and read denormals)
     * as 0: a row's S weighted values (T for dv's sums of dO, D for dP's
     * dO . v) may each lose 2^-126, which stays within 2^-24 of the values'
     * own scale only above S 2^-102; float32's widened tiles keep them */
    double T = (double)p->q_len, tiny = 0x1p-102;
    if ((vm > 0.0f && vm < S * tiny) ||
        (dm > 0.0f && (dm < T * tiny || (vm > 0.0f && (double)dm * vm < D * tiny))))
        return "values so small that the bf16 products flush them to 0";
    /* the tiles subtract a row's max from its scores after scaling them
     * (s c - m): from 2^24 the rounding of s c and of m alone is a whole
     * exponent of 2 or more (a weight off by 2, then inf, NaN or 0) */
    if (raw >= 0x1p24) return "scaled scores past 2^24";
    return NULL;
}

/* ---- the passes ---------------------------------------------------------------- */

static size_t fused16_forward_bytes(const attn_ctx *ctx, const attn_attention_problem *p,
                                    const attn_attention_trace *trace) {
    (void)trace;
    return flash16_kernels(ctx, p)->forward_bytes(p, ctx->num_threads);
}

static size_t fused16_backward_bytes(const attn_ctx *ctx, const attn_attention_problem *p) {
    return flash16_kernels(ctx, p)->backward_bytes(p, ctx->num_threads);
}

static const char *fused16_forward(attn_ctx *ctx, const attn_attention_problem *p,
                                   const attn_attention_dropout *drop,
                                   const attn_attention_trace *trace, void *workspace) {
    (void)drop, (void)trace; /* neither: fused16_declines */
    attn_flash16_tensors t = {.q = p->q.data, .k = p->k.data, .v = p->v.data,
                              .out = p->out.data, .lse = p->lse};
    flash16_kernels(ctx, p)->forward(attn_ctx_workers(ctx), p, &t, workspace);
    return NULL;
}

static const char *fused16_backward(attn_ctx *ctx, const attn_attention_problem *p,
                                    const attn_attention_dropout *drop,
                                    const attn_attention_grads *g, void *workspace) {
    (void)drop;
    attn_flash16_tensors t = {.q = p->q.data, .k = p->k.data, .v = p->v.data,
                              .saved_out = p->out.data, .saved_lse = p->lse, .dout = g->dout,
                              .dq = g->dq, .dk = g->dk, .dv = g->dv};
    flash16_kernels(ctx, p)->backward(attn_ctx_workers(ctx), p, &t, workspace);
    return NULL;
}

const attn_attention_backend attn_attention_fused16 = {
    .name = "fused16",
    .kernel_name = fused16_kernel_name,
    .declines = fused16_declines,
    .declines_values = fused16_declines_values,
    .forward_bytes = fused16_forward_bytes,
    .backward_bytes = fused16_backward_bytes,
    .forward = fused16_forward,
    .backward = fused16_backward,
};

#else /* no x86 kernels: a backend that declines every problem */

static const char *fused16_declines(const attn_ctx *ctx, const attn_attention_problem *p,
                                    attn_pass pass) {
    (void)ctx, (void)p, (void)pass;
    return "this build has no bf16 kernels";
}

const attn_attention_backend attn_attention_fused16 = {
    .name = "fused16",
    .declines = fused16_declines,
};

#endif
