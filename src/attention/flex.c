/*
 * flex.c — the flex backend of the attention contract: problems with a
 * general block map (partial tiles' bits, or row intervals the fused
 * kernels decline) and/or a chain of score modifiers, on the fused flex
 * kernels of the ctx's instruction set (kernels/flex/flex.h), forward and
 * backward, float32. With causal, windows, sinks, GQA, any strides and
 * packed sequences (cu_seqlens: the map and the modifiers' positions are
 * each sequence's own, attention_problem.h). It declines dropout, KV
 * caches, the renormalising mask, the problem's own softcap and ALiBi (a
 * chain holds them), other dtypes (the runner widens 16-bit problems to
 * float32 and asks again), and problems with neither a map nor modifiers
 * (the fused kernels' own).
 *
 * A callback modifier's error fails the call (attn_pass_failed) with a
 * message naming the modifier and the tile.
 */
#include "attention/attention.h"

#include "kernels/flex/flex.h"
#include "parallel.h"

#include <math.h>
#include <string.h>

/* The kernels' modifier bit masks are 32 bits wide. */
#define FLEX_MAX_MODS 32

static const attn_flex_kernels *flex_kernels(const attn_ctx *ctx) { return ctx->ks.flex; }

static const char *flex_declines(const attn_ctx *ctx, const attn_attention_problem *p,
                                 attn_pass pass) {
    if (!flex_kernels(ctx)) return "the ctx runs the reference kernels";
    if (p->q.dtype != ATTN_DTYPE_F32) return "its kernels read float32";
    const char *feature = attn_problem_unsupported(
        p, ATTN_USES_CAUSAL | ATTN_USES_WINDOW | ATTN_USES_SINKS | ATTN_USES_VARLEN |
               ATTN_USES_BLOCK_MAP | ATTN_USES_ROW_INTERVALS | ATTN_USES_SCORE_MODS |
               ATTN_USES_LSE_GRAD);
    if (feature) return feature;
    if (!p->block_map && !p->score_mod_count)
        return "no block mask or score modifiers";
    if (pass.dropout) return "dropout";
    if (pass.traced) return "the scores' trace is the reference's";
    if (p->score_mod_count > FLEX_MAX_MODS) return "more than 32 score modifiers";
    if (pass.backward && !p->out.data) return "a backward without the forward's out";
    return NULL;
}

static const char *flex_kernel_name(const attn_ctx *ctx, const attn_attention_problem *p) {
    (void)p;
    return flex_kernels(ctx)->name;
}

/* ---- workspace: the parts' tiles, the packed key blocks, T5's bucket
 * tables, then (the backward) delta and, where the forward kept none, lse
 * and lse_lo ---- */

static size_t lines(size_t bytes) { return (bytes + 63) / 64 * 64; }

static size_t tiles_bytes(const attn_ctx *ctx, const attn_attention_problem *p, bool backward) {
    size_t per_part = flex_kernels(ctx)->part_floats(p, backward);
    return lines(attn_parallel_parts(ctx->num_threads) * per_part * sizeof(float));
}

/* The backward's packed keys are the larger (the forward's lse runs in them). */
static size_t keys_bytes(const attn_ctx *ctx, const attn_attention_problem *p, bool backward) {
    return lines(flex_kernels(ctx)->keys_floats(p, backward) * sizeof(float));
}

static size_t parts_bytes(const attn_ctx *ctx, const attn_attention_problem *p, bool backward) {
    return tiles_bytes(ctx, p, backward) + keys_bytes(ctx, p, backward);
}

/* One table of T + S - 1 buckets per REL_BIAS or REL_TABLE modifier. */
static size_t bucket_bytes(const attn_attention_problem *p) {
    size_t n = 0;
    for (size_t k = 0; k < p->score_mod_count; k++)
        if (attn_score_mod_relative(p->score_mods[k].kind))
            n += lines((p->q_len + p->kv_len - 1) * sizeof(int32_t));
    return n;
}

static size_t rows_bytes(const attn_attention_problem *p) {
    return lines(p->batch * p->q_heads * p->q_len * sizeof(float));
}

static size_t delta_bytes(const attn_attention_problem *p) {
    return lines(attn_flex_delta_floats(p) * sizeof(float));
}

static size_t flex_forward_bytes(const attn_ctx *ctx, const attn_attention_problem *p,
                                 const attn_attention_trace *trace) {
    (void)trace;
    return parts_bytes(ctx, p, false) + bucket_bytes(p);
}

/* The |lse| past which a float lse alone is too coarse to weigh a row's
 * keys with (its rounding, |lse| 2^-24, is an error in each weight's
 * exponent): the backward then takes its own lse and lse_lo first, as the
 * fused kernels do. */
#define LSE_ALONE_LIMIT 64.0f

/* Whether the backward runs a forward of its own for lse and lse_lo: p has
 * no lse, or a row's lse alone (a public call keeps no lse_lo) past
 * LSE_ALONE_LIMIT. Rows that see no key (lse -inf) need none. */
static bool takes_own_rows(const attn_attention_problem *p) {
    if (!p->lse) return true;
    if (p->lse_lo || p->backward_from_lse) return false;
    if (p->whole_tops) return p->whole_tops[5] > LSE_ALONE_LIMIT; /* the whole problem's */
    for (size_t r = 0; r < attn_lse_rows(p); r++)
        if (isfinite(p->lse[r]) && fabsf(p->lse[r]) > LSE_ALONE_LIMIT) return true;
    return false;
}

/* Whether it may (the workspace is sized before lse holds its values). */
static bool may_take_own_rows(const attn_attention_problem *p) {
    return !p->lse || (!p->lse_lo && !p->backward_from_lse);
}

/* delta's scratch (attn_flex_delta_floats), then, where it may
 * take its own, an lse and lse_lo. */
static size_t flex_backward_bytes(const attn_ctx *ctx, const attn_attention_problem *p) {
    return parts_bytes(ctx, p, true) + bucket_bytes(p) + delta_bytes(p) +
           (may_take_own_rows(p) ? 2 : 0) * rows_bytes(p);
}

/* T5's bucket of relative position rel = kv_idx - q_idx, as Hugging Face's
 * T5Attention._relative_position_bucket computes it (its log in float32). */
static int32_t t5_bucket(int64_t rel, size_t buckets, size_t max_distance, bool bidirectional) {
    int64_t n = (int64_t)buckets, out = 0;
    if (bidirectional) {
        n /= 2;
        if (rel > 0) out += n;
        rel = rel < 0 ? -rel : rel;
    } else {
        rel = rel < 0 ? -rel : 0;
    }
    int64_t max_exact = n / 2;
    if (rel < max_exact) return (int32_t)(out + rel);
    float large = logf((float)rel / (float)max_exact) /
                  (float)log((double)max_distance / (double)max_exact) * (float)(n - max_exact);
    int64_t bucket = !(large < (float)n) ? n - 1 : max_exact + (int64_t)large;
    if (bucket > n - 1) bucket = n - 1;
    return (int32_t)(out + bucket);
}

int32_t attn_rel_bucket(const attn_score_mod *m, int64_t rel) {
    return m->kind == ATTN_SCORE_REL_TABLE
               ? (int32_t)attn_rel_table_index(m, rel)
               : t5_bucket(rel, m->buckets, m->max_distance, m->bidirectional);
}

/* The bucket tables into the workspace at at, their pointers into tables:
 * each relative modifier's element of a head's row for every distance. */
static void fill_buckets(const attn_attention_problem *p, char *at, const int32_t **tables) {
    int64_t T = (int64_t)p->q_len, S = (int64_t)p->kv_len;
    for (size_t k = 0; k < p->score_mod_count; k++) {
        const attn_score_mod *m = &p->score_mods[k];
        tables[k] = NULL;
        if (!attn_score_mod_relative(m->kind)) continue;
        int32_t *table = (int32_t *)at;
        for (int64_t rel = -(T - 1); rel <= S - 1; rel++) table[rel + T - 1] = attn_rel_bucket(m, rel);
        tables[k] = table;
        at += lines((size_t)(T + S - 1) * sizeof(int32_t));
    }
}

/* The first failure in item order, as the call's message; NULL if none. */
static const char *report_failure(attn_ctx *ctx, const attn_flex_failure *failures,
                                  size_t parts) {
    const attn_flex_failure *first = NULL;
    for (size_t i = 0; i < parts; i++)
        if (failures[i].failed && (!first || failures[i].item < first->item)) first = &failures[i];
    if (!first) return NULL;
    attn_fail(ctx, ATTN_ERR_INVALID,
              "score_mods[%zu] (callback) %s returned %d on the tile of batch %zu, head %zu, "
              "queries %zu..%zu, keys %zu..%zu",
              first->mod, first->backward ? "grad_fn" : "fn", first->code, first->b, first->h,
              first->q0, first->q0 + first->rows - 1, first->kv0, first->kv0 + first->cols - 1);
    return attn_pass_failed;
}

static const char *flex_forward(attn_ctx *ctx, const attn_attention_problem *p,
                                const attn_attention_dropout *drop,
                                const attn_attention_trace *trace, void *workspace) {
    (void)drop, (void)trace; /* neither: flex_declines */
    attn_flex_failure failures[ATTN_PARALLEL_MAX];
    const int32_t *tables[FLEX_MAX_MODS];
    memset(failures, 0, sizeof failures);
    fill_buckets(p, (char *)workspace + parts_bytes(ctx, p, false), tables);
    attn_flex_args args = {.p = p, .buckets = tables, .failures = failures,
                           .keys = (float *)((char *)workspace + tiles_bytes(ctx, p, false))};
    flex_kernels(ctx)->forward(attn_ctx_workers(ctx), &args, workspace);
    return report_failure(ctx, failures, attn_parallel_parts(ctx->num_threads));
}

/* Zeroes the elements of modifier m's tensor_grad the problem reaches. */
static void zero_tensor_grad(const attn_attention_problem *p, const attn_score_mod *m) {
    if (!m->tensor_grad) return;
    if (attn_score_mod_relative(m->kind)) {
        memset(m->tensor_grad, 0, p->q_heads * m->buckets * sizeof(float));
        return;
    }
    if (m->kind != ATTN_SCORE_BIAS) return;
    size_t nb = m->strides[0] ? p->batch : 1, nh = m->strides[1] ? p->q_heads : 1;
    size_t ni = m->strides[2] ? p->q_len : 1, nj = m->strides[3] ? p->kv_len : 1;
    for (size_t b = 0; b < nb; b++)
        for (size_t h = 0; h < nh; h++)
            for (size_t i = 0; i < ni; i++) {
                float *row = m->tensor_grad + b * m->strides[0] + h * m->strides[1] +
                             i * m->strides[2];
                for (size_t j = 0; j < nj; j++) row[j * m->strides[3]] = 0.0f;
            }
}

static const char *flex_backward(attn_ctx *ctx, const attn_attention_problem *p,
                                 const attn_attention_dropout *drop, const attn_attention_grads *g,
                                 void *workspace) {
    (void)drop; /* none: flex_declines */
    const attn_flex_kernels *fk = flex_kernels(ctx);
    attn_workers w = attn_ctx_workers(ctx);
    size_t parts = attn_parallel_parts(ctx->num_threads);
    attn_flex_failure failures[ATTN_PARALLEL_MAX];
    const int32_t *tables[FLEX_MAX_MODS];
    memset(failures, 0, sizeof failures);
    char *at = (char *)workspace + parts_bytes(ctx, p, true);
    fill_buckets(p, at, tables);
    at += bucket_bytes(p);
    float *delta = (float *)at;
    attn_flex_args args = {.p = p, .buckets = tables, .failures = failures,
                           .keys = (float *)((char *)workspace + tiles_bytes(ctx, p, true))};
    const float *lse = p->lse, *lse_lo = p->lse_lo;
    if (takes_own_rows(p)) {
        /* no statistics, or an lse too coarse alone: the forward's lse and
         * lse_lo again, without out */
        float *own = (float *)(at + delta_bytes(p));
        float *own_lo = (float *)(at + delta_bytes(p) + rows_bytes(p));
        attn_attention_problem stats = *p;
        stats.out.data = NULL;
        stats.lse = own;
        stats.lse_lo = own_lo;
        args.p = &stats;
        fk->forward(w, &args, workspace);
        const char *why = report_failure(ctx, failures, parts);
        if (why) return why;
        args.p = p;
        lse = own;
        lse_lo = own_lo;
    }
    for (size_t k = 0; k < p->score_mod_count; k++) zero_tensor_grad(p, &p->score_mods[k]);
    fk->backward(w, &args, g, lse, lse_lo, delta, workspace);
    const char *why = report_failure(ctx, failures, parts);
    if (why) return why;
    if (p->sinks && g->dsinks) {
        /* dsinks_h = -sum_(b, i) exp(sink_h - lse_i) delta_i, in that order */
        for (size_t h = 0; h < p->q_heads; h++) {
            double sum = 0.0;
            for (size_t b = 0; b < p->batch; b++)
                for (size_t i = 0; i < attn_attention_seq_of(p, b).q_len; i++) {
                    size_t r = attn_lse_index(p, b, h, i);
                    double l = (double)lse[r] + (lse_lo ? (double)lse_lo[r] : 0.0);
                    sum += exp((double)p->sinks[h] - l) * (double)delta[r];
                }
            g->dsinks[h] = (float)-sum;
        }
    }
    return NULL;
}

/* A weight below 2^-125 of its row's largest is 0 in the kernels (their
 * exp2's floor): values such keys could carry past 2^-48 of a row's output
 * or dP go to the reference. Non-finite values are the kernels' own to
 * carry (docs/programmable.md), and so are scores: a chain's bias or
 * callback bounds them, not q and k. */
static const char *flex_declines_values(attn_ctx *ctx, const attn_attention_problem *p,
                                        const void *dout) {
    float top[4];
    attn_value_tops(ctx, p, false, dout, top);
    double v = isinf(top[2]) ? 0.0 : top[2], d_o = isinf(top[3]) ? 0.0 : top[3];
    if (attn_values_past_weight_floor(p, v, d_o))
        return "values that the weights below 2^-125 it leaves out would carry";
    return NULL;
}

const attn_attention_backend attn_attention_flex = {
    .name = "flex",
    .kernel_name = flex_kernel_name,
    .declines = flex_declines,
    .declines_values = flex_declines_values,
    .forward_bytes = flex_forward_bytes,
    .backward_bytes = flex_backward_bytes,
    .forward = flex_forward,
    .backward = flex_backward,
};
