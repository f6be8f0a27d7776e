/* sdpa.c — scaled dot-product attention on the caller's tensors: the
 * public attn_sdpa_config read into the attention contract's problem, of
 * float32 or float64 views, then the runner (sdpa16.c: 16-bit views). */
#include "attention/attention.h"
#include "ops/sdpa_internal.h"
#include "internal.h"
#include "mask/mask_internal.h"
#include "overlap.h"
#include "rng/dropout.h"
#include "rng/philox.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool zeros(const size_t s[3]) { return !s[0] && !s[1] && !s[2]; }

/* Strides s, or the contiguous (B, T, H, width) layout when all are zero;
 * packed batches (cu_seqlens) have no batch stride. */
static attn_view_strides strides_of(const size_t s[3], size_t tokens, size_t heads, size_t width,
                                    bool packed) {
    attn_view_strides v = zeros(s) ? (attn_view_strides){tokens * heads * width, heads * width, width}
                                   : (attn_view_strides){s[0], s[1], s[2]};
    if (packed) v.b = 0;
    return v;
}

attn_attention_problem attn_sdpa_problem_of(const attn_sdpa_config *c, attn_dtype dtype,
                                            const void *q, const void *k, const void *v,
                                            void *out, float *lse) {
    size_t Hkv = c->kv_heads ? c->kv_heads : c->heads;
    size_t Dv = c->v_head_dim ? c->v_head_dim : c->head_dim;
    bool packed = c->cu_seqlens_q != NULL;
    const size_t *vs = zeros(c->v_strides) ? c->kv_strides : c->v_strides;
    double scale = c->scale != 0.0 ? c->scale : 1.0 / sqrt((double)c->head_dim);
    attn_attention_problem p = {
        .batch = c->batch, .q_heads = c->heads, .kv_heads = Hkv, .q_len = c->q_tokens,
        .kv_len = c->kv_tokens, .head_dim = c->head_dim, .v_head_dim = Dv,
        .q = attn_view_of(q, strides_of(c->q_strides, c->q_tokens, c->heads, c->head_dim, packed),
                          dtype),
        .k = attn_view_of(k, strides_of(c->kv_strides, c->kv_tokens, Hkv, c->head_dim, packed),
                          dtype),
        .v = attn_view_of(v, strides_of(vs, c->kv_tokens, Hkv, Dv, packed), dtype),
        .out = attn_view_of(out, strides_of(c->out_strides, c->q_tokens, c->heads, Dv, packed),
                            dtype),
        .lse = lse,
        .scale = c->scale != 0.0 ? (float)c->scale : (float)(1.0 / sqrt((double)c->head_dim)),
        .scale_f64 = scale, .softcap_f64 = c->softcap,
        .causal = c->causal,
        .diagonal = c->align == ATTN_ALIGN_TOP_LEFT ? ATTN_DIAGONAL_TOP_LEFT
                    : c->align == ATTN_ALIGN_OFFSET ? ATTN_DIAGONAL_OFFSET
                                                    : ATTN_DIAGONAL_BOTTOM_RIGHT,
        .q_offset = c->q_offset,
        .window = c->window, .window_left = c->window_left, .window_right = c->window_right,
        .softcap = (float)c->softcap, .alibi_slopes = c->alibi_slopes, .sinks = c->sinks,
        .cu_seqlens_q = c->cu_seqlens_q, .cu_seqlens_kv = c->cu_seqlens_kv,
        .block_map = c->block_mask ? attn_block_mask_map(c->block_mask) : NULL,
        .score_mods = c->score_mods, .score_mod_count = c->score_mod_count,
    };
    if (packed) p.total_q = (size_t)c->cu_seqlens_q[c->batch];
    return p;
}

/* What the contract does not check: the public config's own fields. */
attn_status attn_check_head_params(attn_ctx *ctx, const char *who, const float *alibi_slopes,
                                   const float *sinks, size_t heads) {
    const float *per_head[2] = {alibi_slopes, sinks};
    static const char *const per_head_name[2] = {"alibi_slopes", "sinks"};
    for (int k = 0; k < 2; k++)
        for (size_t h = 0; per_head[k] && h < heads; h++)
            if (!isfinite(per_head[k][h]))
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "%s: %s[%zu] is %g: each query head's must be finite", who,
                                 per_head_name[k], h, (double)per_head[k][h]);
    return ATTN_OK;
}

attn_status attn_sdpa_check_config(attn_ctx *ctx, const char *fn, const attn_sdpa_config *c) {
    if (!c) return attn_fail(ctx, ATTN_ERR_NULL, "%s: cfg is NULL", fn);
    if (!isfinite(c->scale))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: scale (%g) must be finite", fn, c->scale);
    if (!attn_fits_float(c->scale))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: scale (%.9g) is beyond float32's range (largest %.9g)", fn, c->scale,
                         (double)FLT_MAX);
    if (!(c->softcap >= 0.0) || isinf(c->softcap))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: softcap (%g) must be finite and >= 0", fn,
                         c->softcap);
    if (!attn_fits_float(c->softcap))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: softcap (%.9g) is beyond float32's range (largest %.9g)", fn,
                         c->softcap, (double)FLT_MAX);
    /* the kernels hold it in float32, where 0 turns it off */
    if (c->softcap > 0.0 && (float)c->softcap == 0.0f)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: softcap (%g) rounds to 0 in float32, which turns it off "
                         "(smallest %g)", fn, c->softcap, (double)FLT_TRUE_MIN);
    attn_status st = attn_check_head_params(ctx, fn, c->alibi_slopes, c->sinks, c->heads);
    if (st != ATTN_OK) return st;
    if (c->align != ATTN_ALIGN_BOTTOM_RIGHT && c->align != ATTN_ALIGN_TOP_LEFT &&
        c->align != ATTN_ALIGN_OFFSET)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: align (%d) is not an attn_align", fn,
                         (int)c->align);
    char number[ATTN_NUMBER_CHARS];
    if (!(c->dropout >= 0.0 && c->dropout < 1.0))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: dropout (%s) must be in [0, 1)", fn,
                         attn_number_text(c->dropout, number));
    if (c->cu_seqlens_q && c->batch && (!c->cu_seqlens_kv || c->cu_seqlens_q[c->batch] < 0))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: cu_seqlens_q needs cu_seqlens_kv, and offsets >= 0", fn);
    if (c->score_mod_count && (c->softcap != 0.0 || c->alibi_slopes))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: score_mods (%zu) with softcap (%g) or alibi_slopes (%s): put them "
                         "in the chain, where their order is said",
                         fn, c->score_mod_count, c->softcap, c->alibi_slopes ? "set" : "NULL");
    st = attn_score_mods_check(ctx, fn, c->score_mods, c->score_mod_count, c->heads);
    if (st != ATTN_OK) return st;
    if (c->block_mask) {
        const attn_block_map *m = attn_block_mask_map(c->block_mask);
        /* with cu_seqlens the map is in each sequence's positions: the
         * contract checks it against every sequence's lengths */
        bool lengths = c->cu_seqlens_q || (m->q_len == c->q_tokens && m->kv_len == c->kv_tokens);
        if ((m->batch != 1 && m->batch != c->batch) || (m->heads != 1 && m->heads != c->heads) ||
            !lengths)
            return attn_fail(ctx, ATTN_ERR_SHAPE,
                             "%s: block_mask is (batch %zu, heads %zu, q %zu, kv %zu) where the "
                             "call is (%zu, %zu, %zu, %zu) (batch and heads may be 1)",
                             fn, m->batch, m->heads, m->q_len, m->kv_len, c->batch, c->heads,
                             c->q_tokens, c->kv_tokens);
    }
    return ATTN_OK;
}

/* A forward's dropout needs a Philox rng and a record of what it drew. */
static attn_status check_forward_dropout(attn_ctx *ctx, const char *fn, const attn_sdpa_config *c,
                                         attn_rng *rng, const attn_sdpa_dropout *drawn) {
    if (c->dropout > 0.0) {
        if (!rng || !drawn)
            return attn_fail(ctx, ATTN_ERR_NULL, "%s: dropout (%g) needs an rng and a drawn record",
                             fn, c->dropout);
        if (attn_rng_bernoulli(rng) != ATTN_BERNOULLI_PHILOX)
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "%s: dropout draws Philox in the kernel: set the rng to "
                             "ATTN_BERNOULLI_PHILOX (the modules offer PyTorch's serial masks)",
                             fn);
    }
    return ATTN_OK;
}

/* What both forwards check first: the config, the tensors, the dropout. */
attn_status attn_sdpa_check_forward_args(attn_ctx *ctx, const char *fn,
                                         const attn_sdpa_config *cfg, const void *q,
                                         const void *k, const void *v, const void *out,
                                         attn_rng *rng, const attn_sdpa_dropout *drawn) {
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    attn_explain_begin(ctx); /* a refused call ran no backend */
    attn_status st = attn_sdpa_check_config(ctx, fn, cfg);
    if (st != ATTN_OK) return st;
    if (!q || !k || !v || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", fn,
                         !q ? "q" : !k ? "k" : !v ? "v" : "out");
    return check_forward_dropout(ctx, fn, cfg, rng, drawn);
}

/* ---- aliasing: which outputs may share memory with what -------------------- */

static size_t dtype_bytes(attn_dtype d) {
    return d == ATTN_DTYPE_F64 ? 8 : d == ATTN_DTYPE_F32 ? 4 : 2;
}

/* The span of a (batch, tokens, heads, width) view of p (packed: rows
 * cu[batch], no batch stride); false, with the message, where its strides
 * reach past the address space, or where an output's rows overlap one
 * another. */
static bool view_span(attn_ctx *ctx, const char *fn, const char *name,
                      const attn_attention_problem *p, attn_view view, size_t tokens,
                      const int32_t *cu, size_t heads, size_t width, bool output,
                      attn_span *out, attn_status *st) {
    size_t count[3] = {cu ? 1 : p->batch, cu ? (size_t)cu[p->batch] : tokens, heads};
    size_t stride[3] = {view.st.b, view.st.t, view.st.h}, elements, bytes;
    if (!attn_strided_extent(3, count, stride, width, &elements) ||
        !attn_mul_size(elements, dtype_bytes(view.dtype), &bytes) ||
        (uintptr_t)view.data > UINTPTR_MAX - bytes) {
        *st = attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: %s's strides (%zu, %zu, %zu) over (%zu, "
                        "%zu, %zu) rows reach past the end of memory", fn, name, stride[0],
                        stride[1], stride[2], count[0], count[1], count[2]);
        return false;
    }
    if (output && !attn_strided_rows_apart(3, count, stride, width)) {
        *st = attn_fail(ctx, ATTN_ERR_INVALID, "%s: %s's strides (%zu, %zu, %zu) over (%zu, "
                        "%zu, %zu) rows of %zu elements make rows overlap", fn, name, stride[0],
                        stride[1], stride[2], count[0], count[1], count[2], width);
        return false;
    }
    *out = (attn_span){name, view.data, bytes};
    return true;
}

/* A chain's tensors are inputs as well, and in the backward the gradients
 * of its bias and tables are outputs: no output may overlap a tensor, and
 * no gradient an input, another gradient or any tensor of the chain (a
 * gradient is zeroed before the pass reads the tensors). */
static attn_status check_chain_aliasing(attn_ctx *ctx, const char *fn,
                                        const attn_attention_problem *p, const attn_span *outs,
                                        size_t n_outs, const attn_span *ins, size_t n_ins,
                                        bool backward) {
    char name[2][64];
    attn_status st = ATTN_OK;
    for (size_t k = 0; k < p->score_mod_count && st == ATTN_OK; k++) {
        const attn_score_mod *m = &p->score_mods[k];
        size_t bytes = attn_score_mod_elements(p, m) * sizeof(float);
        snprintf(name[0], sizeof name[0], "score_mods[%zu].tensor", k);
        attn_span tensor = {name[0], m->tensor, bytes};
        if ((st = attn_check_overlap(ctx, fn, outs, n_outs, &tensor, 1)) != ATTN_OK) break;
        bool has_grad = m->kind == ATTN_SCORE_BIAS || attn_score_mod_relative(m->kind);
        if (!backward || !has_grad || !m->tensor_grad) continue;
        snprintf(name[0], sizeof name[0], "score_mods[%zu].tensor_grad", k);
        attn_span grad = {name[0], m->tensor_grad, bytes};
        if ((st = attn_check_overlap(ctx, fn, &grad, 1, ins, n_ins)) != ATTN_OK ||
            (st = attn_check_overlap(ctx, fn, &grad, 1, outs, n_outs)) != ATTN_OK)
            break;
        for (size_t j = 0; j < p->score_mod_count && st == ATTN_OK; j++) {
            const attn_score_mod *o = &p->score_mods[j];
            size_t other_bytes = attn_score_mod_elements(p, o) * sizeof(float);
            snprintf(name[1], sizeof name[1], "score_mods[%zu].tensor", j);
            attn_span other = {name[1], o->tensor, other_bytes};
            if ((st = attn_check_overlap(ctx, fn, &grad, 1, &other, 1)) != ATTN_OK) break;
            bool other_grad = o->kind == ATTN_SCORE_BIAS || attn_score_mod_relative(o->kind);
            if (j >= k || !other_grad) continue;
            snprintf(name[1], sizeof name[1], "score_mods[%zu].tensor_grad", j);
            other.data = o->tensor_grad;
            st = attn_check_overlap(ctx, fn, &grad, 1, &other, 1);
        }
    }
    return st;
}

/* The most outputs check_aliasing names besides the chain's gradients. */
#define SDPA_OUTPUTS 4

/* What every attn_sdpa_* call checks of its memory after p itself: no
 * output (out and lse; with g, the backward's dq, dk, dv and sinks_grad)
 * overlaps an input or another output, and no output's rows overlap.
 * Those outputs' spans go to outs_found (*n_found of them). */
static attn_status check_aliasing(attn_ctx *ctx, const char *fn, const attn_sdpa_config *cfg,
                                  const attn_attention_problem *p,
                                  const attn_attention_grads *g,
                                  attn_span outs_found[SDPA_OUTPUTS], size_t *n_found) {
    attn_status st = ATTN_OK;
    size_t H = p->q_heads, KH = p->kv_heads, D = p->head_dim, Dv = p->v_head_dim;
    const int32_t *cq = p->cu_seqlens_q, *ckv = p->cu_seqlens_kv;
    size_t rows = cq ? H * (size_t)cq[p->batch] : p->batch * H * p->q_len; /* lse */
    size_t lse_bytes = rows * (p->q.dtype == ATTN_DTYPE_F64 ? sizeof(double) : sizeof(float));
    const void *lse = p->q.dtype == ATTN_DTYPE_F64 ? (const void *)p->lse_f64
                                                   : (const void *)p->lse;
    size_t seqlens = cq ? (p->batch + 1) * sizeof(int32_t) : 0;
    attn_span ins[11] = {{"alibi_slopes", cfg->alibi_slopes, H * sizeof(float)},
                         {"sinks", cfg->sinks, H * sizeof(float)},
                         {"cu_seqlens_q", cq, seqlens},
                         {"cu_seqlens_kv", ckv, seqlens}};
    attn_span *outs = outs_found;
    size_t n_ins = 4, n_outs = 0;
    *n_found = 0;
    attn_view dq = p->q, dk = p->k, dv = p->v, dout = p->out;
    if (!view_span(ctx, fn, "q", p, p->q, p->q_len, cq, H, D, false, &ins[n_ins++], &st) ||
        !view_span(ctx, fn, "k", p, p->k, p->kv_len, ckv, KH, D, false, &ins[n_ins++], &st) ||
        !view_span(ctx, fn, "v", p, p->v, p->kv_len, ckv, KH, Dv, false, &ins[n_ins++], &st) ||
        !view_span(ctx, fn, "out", p, p->out, p->q_len, cq, H, Dv, !g,
                   g ? &ins[n_ins++] : &outs[n_outs++], &st))
        return st;
    if (!g) {
        outs[n_outs++] = (attn_span){"lse", lse, lse_bytes};
        *n_found = n_outs;
        if ((st = attn_check_overlap(ctx, fn, outs, n_outs, ins, n_ins)) != ATTN_OK) return st;
        return check_chain_aliasing(ctx, fn, p, outs, n_outs, ins, n_ins, false);
    }
    ins[n_ins++] = (attn_span){"lse", lse, lse_bytes};
    ins[n_ins++] = (attn_span){"dlse", p->dlse_f64 ? (const void *)p->dlse_f64 : p->dlse,
                               lse_bytes};
    dq.data = g->dq;
    dk.data = g->dk;
    dv.data = g->dv;
    dout.data = (void *)g->dout;
    if (!view_span(ctx, fn, "dout", p, dout, p->q_len, cq, H, Dv, false, &ins[n_ins++], &st) ||
        !view_span(ctx, fn, "dq", p, dq, p->q_len, cq, H, D, true, &outs[n_outs++], &st) ||
        !view_span(ctx, fn, "dk", p, dk, p->kv_len, ckv, KH, D, true, &outs[n_outs++], &st) ||
        !view_span(ctx, fn, "dv", p, dv, p->kv_len, ckv, KH, Dv, true, &outs[n_outs++], &st))
        return st;
    outs[n_outs++] = (attn_span){"sinks_grad", g->dsinks, H * sizeof(float)};
    *n_found = n_outs;
    if ((st = attn_check_overlap(ctx, fn, outs, n_outs, ins, n_ins)) != ATTN_OK) return st;
    return check_chain_aliasing(ctx, fn, p, outs, n_outs, ins, n_ins, true);
}

/* ---- outputs kept while a score callback runs ------------------------------ */

/* A callback's error comes in the middle of a pass, after the tiles before
 * it were written (and, with dropout, after the generator moved): a call
 * that runs a callback copies everything it may write first, and a failed
 * one puts it all back, so that a refused call changes nothing. The spans
 * are disjoint (check_aliasing). */
typedef struct kept_outputs {
    attn_span spans[SDPA_OUTPUTS];
    size_t n; /* spans */
    attn_ctx *ctx;
    const attn_attention_problem *p;
    bool backward;
    unsigned char *copy; /* NULL: nothing kept (no callback) */
    attn_rng *rng;       /* with its state after the spans' bytes; NULL: none */
} kept_outputs;

static bool runs_callback(const attn_attention_problem *p) {
    for (size_t k = 0; k < p->score_mod_count; k++)
        if (p->score_mods[k].kind == ATTN_SCORE_CALLBACK) return true;
    return false;
}

/* The span of modifier k's gradient, where the backward writes one. */
static attn_span grad_span(const attn_attention_problem *p, size_t k) {
    const attn_score_mod *m = &p->score_mods[k];
    bool has_grad = m->kind == ATTN_SCORE_BIAS || attn_score_mod_relative(m->kind);
    if (!has_grad || !m->tensor_grad) return (attn_span){"tensor_grad", NULL, 0};
    return (attn_span){"tensor_grad", m->tensor_grad,
                       attn_score_mod_elements(p, m) * sizeof(float)};
}

/* Copies the n spans (and the chain's gradients, in a backward; rng's
 * state, where given) into k->copy when p runs a callback; ATTN_ERR_NO_MEMORY,
 * naming the bytes, when there is no room for them. */
static attn_status keep_outputs(attn_ctx *ctx, const char *fn, const attn_attention_problem *p,
                                const attn_span *spans, size_t n, bool backward, attn_rng *rng,
                                kept_outputs *k) {
    *k = (kept_outputs){.n = n, .ctx = ctx, .p = p, .backward = backward};
    if (!runs_callback(p)) return ATTN_OK;
    memcpy(k->spans, spans, n * sizeof *spans);
    size_t bytes = rng ? attn_rng_state_size() : 0;
    for (size_t i = 0; i < n + (backward ? p->score_mod_count : 0); i++) {
        attn_span s = i < n ? spans[i] : grad_span(p, i - n);
        if (s.data && !attn_add_size(bytes, s.bytes, &bytes))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: the outputs a score callback may "
                             "leave half written overflow a copy", fn);
    }
    if (!(k->copy = attn_malloc(bytes ? bytes : 1)))
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate %zu bytes to keep the "
                         "outputs while a score callback runs", fn, bytes);
    unsigned char *at = k->copy;
    for (size_t i = 0; i < n + (backward ? p->score_mod_count : 0); i++) {
        attn_span s = i < n ? spans[i] : grad_span(p, i - n);
        if (!s.data) continue;
        memcpy(at, s.data, s.bytes);
        at += s.bytes;
    }
    attn_status st = rng ? attn_rng_get_state(rng, at, attn_rng_state_size()) : ATTN_OK;
    if (st != ATTN_OK) {
        attn_free(k->copy);
        k->copy = NULL;
        return st;
    }
    k->rng = rng;
    return ATTN_OK;
}

/* After the call: a failed one's outputs (and generator) put back; the
 * copy freed either way. Returns st. */
static attn_status settle_outputs(kept_outputs *k, attn_status st) {
    if (!k->copy) return st;
    if (st != ATTN_OK) {
        size_t n = k->n + (k->backward ? k->p->score_mod_count : 0);
        const unsigned char *at = k->copy;
        for (size_t i = 0; i < n; i++) {
            attn_span s = i < k->n ? k->spans[i] : grad_span(k->p, i - k->n);
            if (!s.data) continue;
            memcpy((void *)s.data, at, s.bytes);
            at += s.bytes;
        }
        if (k->rng) { /* which clears the ctx's message: the call's is set again */
            char message[ATTN_ERROR_CAPACITY];
            snprintf(message, sizeof message, "%s", k->ctx->error);
            attn_status put = attn_rng_set_state(k->rng, at, attn_rng_state_size());
            attn_fail(k->ctx, st, "%s%s", message,
                      put == ATTN_OK ? "" : " (and the rng's state was not put back)");
        }
    }
    attn_free(k->copy);
    return st;
}

attn_status attn_sdpa_run_forward(attn_ctx *ctx, const char *fn, const attn_sdpa_config *cfg,
                                  const attn_attention_problem *p, attn_rng *rng,
                                  attn_sdpa_dropout *drawn) {
    attn_span outs[SDPA_OUTPUTS];
    size_t n_outs;
    attn_status st = attn_attention_check(ctx, fn, p);
    if (st != ATTN_OK || (st = check_aliasing(ctx, fn, cfg, p, NULL, outs, &n_outs)) != ATTN_OK)
        return st;
    /* Memory first: a failure must not have advanced the rng. */
    size_t bytes = attn_attention_forward_bytes(ctx, p, false, false);
    void *workspace = attn_ctx_workspace(ctx, bytes);
    if (!workspace)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                         "%s: cannot allocate %zu bytes of attention workspace", fn, bytes);
    kept_outputs kept;
    if ((st = keep_outputs(ctx, fn, p, outs, n_outs, false, cfg->dropout > 0.0 ? rng : NULL,
                           &kept)) != ATTN_OK)
        return st;
    attn_dropout_stream stream, *dropout = NULL;
    if (cfg->dropout > 0.0) {
        attn_dropout_stream_begin(&stream, rng, cfg->dropout,
                                  cfg->batch * cfg->heads * cfg->q_tokens * cfg->kv_tokens);
        dropout = &stream;
    }
    st = settle_outputs(&kept, attn_attention_forward(ctx, fn, p, dropout, NULL, NULL, NULL,
                                                      workspace));
    /* a 16-bit problem is widened inside the pass's call, which may fail
     * for memory after the offset was taken: a failed call gives it back */
    if (st != ATTN_OK && dropout) attn_dropout_stream_cancel(dropout);
    if (st == ATTN_OK && dropout) /* the record of a call that ran */
        *drawn = (attn_sdpa_dropout){stream.philox_seed, stream.philox_offset};
    return st;
}

attn_status attn_sdpa_forward(attn_ctx *ctx, const attn_sdpa_config *cfg, const float *q,
                              const float *k, const float *v, float *out, float *lse,
                              attn_rng *rng, attn_sdpa_dropout *drawn) {
    const char *fn = "attn_sdpa_forward";
    attn_status st = attn_sdpa_check_forward_args(ctx, fn, cfg, q, k, v, out, rng, drawn);
    if (st != ATTN_OK) return st;
    attn_attention_problem p = attn_sdpa_problem_of(cfg, ATTN_DTYPE_F32, q, k, v, out, lse);
    return attn_sdpa_run_forward(ctx, fn, cfg, &p, rng, drawn);
}

/* The backward's tensors (q, k, v, out, lse, dout, dq, dk, dv, in that
 * order), sinks_grad and the forward's dropout record, of either precision. */
attn_status attn_sdpa_check_backward_args(attn_ctx *ctx, const char *fn,
                                          const attn_sdpa_config *cfg,
                                          const void *const tensors[9],
                                          const attn_sdpa_dropout *drawn) {
    static const char *const names[9] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    attn_explain_begin(ctx); /* a refused call ran no backend */
    attn_status st = attn_sdpa_check_config(ctx, fn, cfg);
    if (st != ATTN_OK) return st;
    for (int i = 0; i < 9; i++)
        if (!tensors[i]) return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", fn, names[i]);
    if (cfg->sinks && !cfg->sinks_grad)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: sinks are set but sinks_grad is NULL", fn);
    if (cfg->dropout > 0.0 && !drawn)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: dropout (%g) needs the forward's drawn record", fn,
                         cfg->dropout);
    return ATTN_OK;
}

/* The dropout a backward redraws: the forward's Philox record. */
attn_attention_dropout attn_sdpa_drop_of(const attn_sdpa_config *c,
                                         const attn_sdpa_dropout *drawn) {
    attn_attention_dropout drop = {.kind = ATTN_DROP_NONE};
    if (c->dropout > 0.0)
        drop = (attn_attention_dropout){.kind = ATTN_DROP_PHILOX, .seed = drawn->seed,
                                        .offset = drawn->offset,
                                        .keep_threshold = attn_philox_keep_threshold(c->dropout),
                                        .kept_scale = attn_dropout_kept_scale(c->dropout),
                                        .kept_scale_f64 =
                                            attn_dropout_kept_scale_f64(c->dropout)};
    return drop;
}

attn_status attn_sdpa_run_backward(attn_ctx *ctx, const char *fn, const attn_sdpa_config *cfg,
                                   attn_dtype dtype, const void *const tensors[9],
                                   const void *dlse, const attn_sdpa_dropout *drawn) {
    attn_attention_problem p = attn_sdpa_problem_of(cfg, dtype, tensors[0], tensors[1],
                                                    tensors[2], (void *)tensors[3], NULL);
    if (dtype == ATTN_DTYPE_F64) {
        p.lse_f64 = (double *)tensors[4];
        p.dlse_f64 = dlse;
    } else {
        p.lse = (float *)tensors[4];
        p.dlse = dlse;
    }
    attn_attention_dropout drop = attn_sdpa_drop_of(cfg, drawn);
    attn_attention_grads g = {.dout = tensors[5], .dq = (void *)tensors[6],
                              .dk = (void *)tensors[7], .dv = (void *)tensors[8],
                              .dsinks = cfg->sinks ? cfg->sinks_grad : NULL};
    attn_span outs[SDPA_OUTPUTS];
    size_t n_outs;
    kept_outputs kept;
    attn_status st = attn_attention_check(ctx, fn, &p);
    if (st != ATTN_OK || (st = check_aliasing(ctx, fn, cfg, &p, &g, outs, &n_outs)) != ATTN_OK ||
        (st = keep_outputs(ctx, fn, &p, outs, n_outs, true, NULL, &kept)) != ATTN_OK)
        return st;
    return settle_outputs(&kept, attn_attention_backward(ctx, fn, &p, &drop, &g, NULL));
}

attn_status attn_sdpa_backward(attn_ctx *ctx, const attn_sdpa_config *cfg, const float *q,
                               const float *k, const float *v, const float *out,
                               const float *lse, const float *dout, float *dq, float *dk,
                               float *dv, const attn_sdpa_dropout *drawn) {
    const char *fn = "attn_sdpa_backward";
    const void *tensors[9] = {q, k, v, out, lse, dout, dq, dk, dv};
    attn_status st = attn_sdpa_check_backward_args(ctx, fn, cfg, tensors, drawn);
    if (st != ATTN_OK) return st;
    return attn_sdpa_run_backward(ctx, fn, cfg, ATTN_DTYPE_F32, tensors, NULL, drawn);
}

attn_status attn_sdpa_backward_dlse(attn_ctx *ctx, const attn_sdpa_config *cfg, attn_dtype dtype,
                                    const void *q, const void *k, const void *v, const void *out,
                                    const void *lse, const void *dout, const void *dlse,
                                    void *dq, void *dk, void *dv,
                                    const attn_sdpa_dropout *drawn) {
    const char *fn = "attn_sdpa_backward_dlse";
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    attn_explain_begin(ctx); /* a refused call ran no backend */
    if (dtype != ATTN_DTYPE_F32 && dtype != ATTN_DTYPE_F64 && dtype != ATTN_DTYPE_BF16 &&
        dtype != ATTN_DTYPE_F16)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: dtype (%s, %d) must be F32, F64, BF16 or F16",
                         fn, attn_dtype_name(dtype), (int)dtype);
    const void *tensors[9] = {q, k, v, out, lse, dout, dq, dk, dv};
    attn_status st = attn_sdpa_check_backward_args(ctx, fn, cfg, tensors, drawn);
    if (st != ATTN_OK) return st;
    if (!dlse) return attn_fail(ctx, ATTN_ERR_NULL, "%s: dlse is NULL", fn);
    return attn_sdpa_run_backward(ctx, fn, cfg, dtype, tensors, dlse, drawn);
}

/* ---- float64: the same problem on double views (the reference runs it) ---- */

attn_status attn_sdpa_forward_f64(attn_ctx *ctx, const attn_sdpa_config *cfg, const double *q,
                                  const double *k, const double *v, double *out, double *lse,
                                  attn_rng *rng, attn_sdpa_dropout *drawn) {
    const char *fn = "attn_sdpa_forward_f64";
    attn_status st = attn_sdpa_check_forward_args(ctx, fn, cfg, q, k, v, out, rng, drawn);
    if (st != ATTN_OK) return st;
    attn_attention_problem p = attn_sdpa_problem_of(cfg, ATTN_DTYPE_F64, q, k, v, out, NULL);
    p.lse_f64 = lse;
    return attn_sdpa_run_forward(ctx, fn, cfg, &p, rng, drawn);
}

attn_status attn_sdpa_backward_f64(attn_ctx *ctx, const attn_sdpa_config *cfg, const double *q,
                                   const double *k, const double *v, const double *out,
                                   const double *lse, const double *dout, double *dq, double *dk,
                                   double *dv, const attn_sdpa_dropout *drawn) {
    const char *fn = "attn_sdpa_backward_f64";
    const void *tensors[9] = {q, k, v, out, lse, dout, dq, dk, dv};
    attn_status st = attn_sdpa_check_backward_args(ctx, fn, cfg, tensors, drawn);
    if (st != ATTN_OK) return st;
    return attn_sdpa_run_backward(ctx, fn, cfg, ATTN_DTYPE_F64, tensors, NULL, drawn);
}
