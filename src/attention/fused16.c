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

#include "parallel.h"
#if defined(ATTN_HAVE_X86_KERNELS)
#include "kernels/flash16/flash16.h"
#endif

#include <float.h>
#include <math.h>

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

/* Scores, sums and dP that float tiles hold (as the float kernels' own
 * scan, fused.c), or why not. */
static const char *fused16_declines_values(attn_ctx *ctx, const attn_attention_problem *p,
                                           const void *dout) {
    float top[4];
    attn_value_tops(ctx, p, true, dout, top);
    for (int t = 0; t < 4; t++)
        if (isinf(top[t])) return "a non-finite input";
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
