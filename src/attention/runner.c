/* runner.c — the one way attention runs: checks the problem, picks the
 * backend, finds its memory, turns a dropout stream into the record every
 * backend reads, and runs the pass. Modules, ops and attn_sdpa_* all call
 * it. */
#include "attention/attention.h"

#include "kernels/kernels.h"
#include "rng/dropout.h"

#include <math.h>
#include <string.h>

/* ---- checks ---------------------------------------------------------------- */

static attn_status check_cu_seqlens(attn_ctx *ctx, const char *who, const char *name,
                                    const int32_t *cu, size_t batch, size_t longest) {
    if (cu[0] != 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: %s[0] (%ld) must be 0", who, name,
                         (long)cu[0]);
    for (size_t b = 0; b < batch; b++) {
        if (cu[b + 1] < cu[b])
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "%s: %s must not decrease (%s[%zu] = %ld, %s[%zu] = %ld)", who, name,
                             name, b, (long)cu[b], name, b + 1, (long)cu[b + 1]);
        if ((size_t)(cu[b + 1] - cu[b]) > longest)
            return attn_fail(ctx, ATTN_ERR_SHAPE,
                             "%s: sequence %zu of %s has %ld tokens, more than the longest "
                             "length given (%zu)",
                             who, b, name, (long)(cu[b + 1] - cu[b]), longest);
    }
    return ATTN_OK;
}

attn_status attn_attention_check(attn_ctx *ctx, const char *who, const attn_attention_problem *p) {
    if (!p->batch || !p->q_heads || !p->kv_heads || !p->q_len || !p->kv_len || !p->head_dim ||
        !p->v_head_dim)
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "%s: batch (%zu), heads (%zu), kv_heads (%zu), q_tokens (%zu), "
                         "kv_tokens (%zu), head_dim (%zu) and v_head_dim (%zu) must be positive",
                         who, p->batch, p->q_heads, p->kv_heads, p->q_len, p->kv_len,
                         p->head_dim, p->v_head_dim);
    if (p->q_heads % p->kv_heads != 0)
        return attn_fail(ctx, ATTN_ERR_SHAPE, "%s: kv_heads (%zu) must divide heads (%zu)", who,
                         p->kv_heads, p->q_heads);
    size_t rows, cols, weights, wide = p->head_dim > p->v_head_dim ? p->head_dim : p->v_head_dim;
    if (!attn_mul3_size(p->batch, p->q_heads, p->q_len, &rows) ||
        !attn_mul_size(rows, p->kv_len, &weights) || !attn_mul_size(rows, wide, &rows) ||
        !attn_mul3_size(p->batch * p->kv_heads, p->kv_len, wide, &cols) ||
        !attn_floats_fit(rows) || !attn_floats_fit(cols))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: (%zu, %zu|%zu, %zu|%zu, %zu) overflows size_t",
                         who, p->batch, p->q_heads, p->kv_heads, p->q_len, p->kv_len, wide);
    if (!isfinite(p->scale))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: scale (%g) must be finite", who,
                         (double)p->scale);
    if (!(p->softcap >= 0.0f) || isinf(p->softcap))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: softcap (%g) must be finite and >= 0", who,
                         (double)p->softcap);
    if (p->window && (p->window_left < -1 || p->window_right < -1))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: window (%lld, %lld) bounds must be >= 0, or -1 for unbounded", who,
                         (long long)p->window_left, (long long)p->window_right);
    /* positions stay far inside int64 (attn_visible_keys adds them) */
    if (p->diagonal == ATTN_DIAGONAL_OFFSET &&
        (p->q_offset > ((int64_t)1 << 62) || p->q_offset < -((int64_t)1 << 62)))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: q_offset (%lld) must be within +-2^62", who,
                         (long long)p->q_offset);
    if (!p->cu_seqlens_q != !p->cu_seqlens_kv)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: cu_seqlens_q and cu_seqlens_kv go together (%s is NULL)",
                         who, p->cu_seqlens_q ? "cu_seqlens_kv" : "cu_seqlens_q");
    if (p->cu_seqlens_q) {
        attn_status st = check_cu_seqlens(ctx, who, "cu_seqlens_q", p->cu_seqlens_q, p->batch,
                                          p->q_len);
        if (st == ATTN_OK)
            st = check_cu_seqlens(ctx, who, "cu_seqlens_kv", p->cu_seqlens_kv, p->batch, p->kv_len);
        if (st != ATTN_OK) return st;
        if ((size_t)p->cu_seqlens_q[p->batch] != p->total_q)
            return attn_fail(ctx, ATTN_ERR_INVALID, "%s: cu_seqlens_q[%zu] (%ld) != total_q (%zu)",
                             who, p->batch, (long)p->cu_seqlens_q[p->batch], p->total_q);
    }
    return ATTN_OK;
}

/* ---- choosing a backend ------------------------------------------------------ */

/* The fused backend when the ctx runs fast kernels, nothing asks for the
 * reference's trace and it takes the problem; else NULL. */
static const attn_attention_backend *fused_for(const attn_ctx *ctx,
                                               const attn_attention_problem *p, bool traced,
                                               bool backward) {
    const attn_attention_backend *f = &attn_attention_fused;
    if (traced || f->declines(ctx, p, backward))
        return NULL;
    return f;
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

/* Bits of the (B, Hq, T, S) dropout mask, in whole doubles. */
static size_t mask_bytes(const attn_attention_problem *p) {
    size_t n = p->batch * p->q_heads * p->q_len * p->kv_len; /* checked */
    return (n / 8 + 8) / 8 * 8;
}

size_t attn_attention_forward_bytes(const attn_ctx *ctx, const attn_attention_problem *p,
                                    bool mask_in_workspace, bool traced) {
    /* the fused kernels may hand values they cannot hold to the reference,
     * so the workspace fits both */
    attn_attention_trace none = {0};
    size_t bytes = attn_attention_reference.forward_bytes(ctx, p, &none);
    const attn_attention_backend *f = fused_for(ctx, p, traced, false);
    if (f) bytes = max_size(bytes, f->forward_bytes(ctx, p, &none));
    if (mask_in_workspace) {
        size_t extra = mask_bytes(p);
        bytes = bytes > (size_t)-1 - extra ? (size_t)-1 : bytes + extra;
    }
    return bytes;
}

size_t attn_attention_backward_bytes(const attn_ctx *ctx, const attn_attention_problem *p) {
    size_t bytes = attn_attention_reference.backward_bytes(ctx, p);
    const attn_attention_backend *f = fused_for(ctx, p, false, true);
    return f ? max_size(bytes, f->backward_bytes(ctx, p)) : bytes;
}

static attn_status no_workspace(attn_ctx *ctx, const char *who, size_t bytes) {
    return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                     "%s: cannot allocate %zu bytes of attention workspace", who, bytes);
}

/* ---- the passes -------------------------------------------------------------- */

attn_status attn_attention_forward(attn_ctx *ctx, const char *who, const attn_attention_problem *p,
                                   attn_dropout_stream *stream, uint8_t *keep_bits,
                                   const attn_attention_trace *trace,
                                   attn_attention_dropout *drop_out, void *workspace) {
    attn_status st = attn_attention_check(ctx, who, p);
    if (st != ATTN_OK) return st;
    bool drawn = stream && !stream->passthrough;
    bool serial = drawn && !stream->drop_all && stream->method != ATTN_BERNOULLI_PHILOX;
    if (serial && p->cu_seqlens_q)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: PyTorch's serial dropout masks are for dense batches; packed "
                         "sequences draw Philox (ATTN_BERNOULLI_PHILOX)",
                         who);
    bool traced = trace && (trace->scores || trace->weights || trace->dropped);
    bool mask_in_workspace = serial && !keep_bits;
    size_t bytes = attn_attention_forward_bytes(ctx, p, mask_in_workspace, traced);
    if (!workspace && !(workspace = attn_ctx_workspace(ctx, bytes)))
        return no_workspace(ctx, who, bytes);
    /* Everything is in hand: from here on nothing fails. */
    attn_attention_dropout drop = {.kind = ATTN_DROP_NONE};
    if (drawn) {
        drop.kept_scale = stream->kept_scale;
        if (stream->drop_all) {
            drop.kind = ATTN_DROP_PHILOX; /* p = 1: a threshold no draw is under */
        } else if (!serial) {
            drop.kind = ATTN_DROP_PHILOX;
            drop.seed = stream->philox_seed;
            drop.offset = stream->philox_offset;
            drop.keep_threshold = stream->keep_threshold;
        } else {
            /* PyTorch's mask, drawn in its (B, Hq, T, S) order before the pass */
            size_t n = p->batch * p->q_heads * p->q_len * p->kv_len;
            uint8_t *bits = keep_bits;
            if (!bits) {
                bits = (uint8_t *)workspace + (bytes - mask_bytes(p));
                memset(bits, 0, mask_bytes(p));
            }
            for (size_t e = 0; e < n; e++)
                if (attn_dropout_stream_next(stream) != 0.0f) attn_set_bit(bits, e);
            drop.kind = ATTN_DROP_BITS;
            drop.keep_bits = bits;
        }
    }
    const attn_attention_backend *backend = fused_for(ctx, p, traced, false);
    bool checks = backend && backend->forward_checks_values &&
                  backend->forward_checks_values(ctx, p, &drop);
    if (backend && backend->takes_values && !checks && !backend->takes_values(ctx, p, NULL))
        backend = NULL;
    if (!backend) backend = &attn_attention_reference;
    backend->forward(ctx, p, &drop, traced ? trace : NULL, workspace);
    if (drop_out) *drop_out = drop;
    return ATTN_OK;
}

attn_status attn_attention_backward(attn_ctx *ctx, const char *who, const attn_attention_problem *p,
                                    const attn_attention_dropout *drop,
                                    const attn_attention_grads *g, void *workspace) {
    attn_status st = attn_attention_check(ctx, who, p);
    if (st != ATTN_OK) return st;
    size_t bytes = attn_attention_backward_bytes(ctx, p);
    if (!workspace && !(workspace = attn_ctx_workspace(ctx, bytes)))
        return no_workspace(ctx, who, bytes);
    attn_attention_dropout none = {.kind = ATTN_DROP_NONE};
    const attn_attention_backend *backend = fused_for(ctx, p, false, true);
    bool checks = backend && backend->backward_checks_values &&
                  backend->backward_checks_values(ctx, p, drop ? drop : &none);
    if (backend && backend->takes_values && !checks && !backend->takes_values(ctx, p, g->dout))
        backend = NULL;
    if (!backend) backend = &attn_attention_reference;
    backend->backward(ctx, p, drop ? drop : &none, g, workspace);
    return ATTN_OK;
}
