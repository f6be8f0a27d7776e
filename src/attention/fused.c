/*
 * fused.c — the fused CPU backend of the attention contract: the tiled
 * FlashAttention-2 kernels of kernels/flash (flash.h), in the instruction
 * set the ctx runs, with every feature of attention.h forward and backward.
 * A block map runs here where its rows are single key intervals, which
 * the kernels read through attn_visible_keys like causal and a window; a
 * map with partial tiles' bits is declined by name. Of score modifiers it
 * runs one: a relative position bias (T5's buckets or a table by
 * distance) whose gradient is not asked, added from a table by distance
 * that each pass builds in its workspace (attn_flash_bias); other chains
 * are declined by name (the runner says softcap and ALiBi as the fixed
 * features first).
 * It declines views other than float32, a traced forward and
 * v_head_dim != head_dim, and values it would get wrong (non-finite, or
 * magnitudes past float32's range in its tiles): through declines_values,
 * a scan before the pass, or, where the lane forward or the backward's one
 * pass of raw scores measures them as it reads them, after it; the runner
 * then asks the next backend.
 */
#include "attention/attention.h"

#include "kernels/flash/flash.h"
#include "parallel.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* The ctx's fused kernels (its kernel set's; the backend declines a ctx
 * without them). */
static const attn_flash_kernels *flash_kernels(const attn_ctx *ctx) { return ctx->ks.flash; }

/* What the forward sizes its query blocks by (flash.h). */
static attn_flash_fit flash_fit(const attn_ctx *ctx) {
    return (attn_flash_fit){.threads = ctx->num_threads, .l2_bytes = ctx->l2_bytes};
}

/* Whether the runner marked p's rows as another forward's (a traced one,
 * or one the fused kernels declined): that lse comes from scores rounded
 * otherwise (the reference's in double), and a backward that recomputes
 * the weights from its own scores against it is off by their difference
 * times the logits. The backward then runs where the forward ran. */
static bool rows_of_another_forward(const attn_attention_problem *p) {
    return p->lse && p->row_stats && !p->backward_from_lse && attn_lse_rows(p) > 0 &&
           p->row_stats[1] == ATTN_ROW_STATS_FOREIGN;
}

/* p's chain where it is one relative bias (attn_score_mod_relative)
 * without a tensor gradient, else NULL. */
static const attn_score_mod *relative_bias(const attn_attention_problem *p) {
    if (p->score_mod_count != 1) return NULL;
    const attn_score_mod *m = &p->score_mods[0];
    return attn_score_mod_relative(m->kind) && !m->tensor_grad ? m : NULL;
}

/* An upper bound on |pos_i - j| over p's rows and keys: ALiBi's distances,
 * which the kernels hold in float32 (exact integers up to 2^24). */
static double distance_reach(const attn_attention_problem *p) {
    return (double)p->q_len + (double)p->kv_len + fabs((double)p->q_offset);
}

static const char *fused_declines(const attn_ctx *ctx, const attn_attention_problem *p,
                                  attn_pass pass) {
    if (!ctx->ks.flash) return "the ctx runs the reference kernels";
    if (p->q.dtype != ATTN_DTYPE_F32) return "its kernels read float32";
    const char *feature = attn_problem_unsupported(
        p, ATTN_USES_CAUSAL | ATTN_USES_RENORMALIZE | ATTN_USES_WINDOW | ATTN_USES_SOFTCAP |
               ATTN_USES_ALIBI | ATTN_USES_SINKS | ATTN_USES_VARLEN | ATTN_USES_ROW_INTERVALS |
               ATTN_USES_SCORE_MODS | ATTN_USES_LSE_GRAD);
    if (feature) return feature;
    if (p->score_mod_count && !relative_bias(p))
        return "score modifiers other than one relative bias whose gradient is not asked";
    if (pass.traced) return "the scores' trace is the reference's";
    if (pass.backward && rows_of_another_forward(p))
        return "its forward ran on other kernels, whose lse it would have to match";
    if (p->v_head_dim != p->head_dim) return "v_head_dim != head_dim";
    if (p->kv_heads == 0 || p->q_heads % p->kv_heads != 0)
        return "q_heads is not a multiple of kv_heads";
    if (p->alibi_slopes && distance_reach(p) > 0x1p24)
        return "ALiBi's positions pass 2^24, which its float32 distances do not hold exactly";
    return NULL;
}

static const char *fused_kernel_name(const attn_ctx *ctx, const attn_attention_problem *p) {
    (void)p;
    return flash_kernels(ctx)->name;
}

/* ---- where the fused kernels hand over to the reference -------------------
 *
 * The fused kernels keep scores in float32 and their exp2 maps NaN to 0: fed
 * NaN or inf, or magnitudes whose scores pass float32's range, they would
 * give other numbers than the reference (which spreads NaN and inf exactly
 * as PyTorch does, and holds scores in double). A scan of q, k, v (and dO)
 * finds those inputs, O((T + S) D) against the attention's O(T S D)
 * (attn_value_tops, scan.c). */

/* Whether the kernels take p with inputs of these magnitudes (max |x| of
 * q, k, v, dout; inf where not finite). */
static bool magnitudes_fit(const attn_flash_kernels *fk, const attn_attention_problem *p,
                           const float top[4]) {
    float slope = p->alibi_slopes ? fk->max_abs(p->alibi_slopes, p->q_heads, 0.0f) : 0.0f;
    float sink = p->sinks ? fk->max_abs(p->sinks, p->q_heads, 0.0f) : 0.0f;
    const attn_score_mod *rel = relative_bias(p);
    float bias = rel ? fk->max_abs(rel->tensor, p->q_heads * rel->buckets, 0.0f) : 0.0f;
    for (int t = 0; t < 4; t++)
        if (isinf(top[t])) return false; /* inf or NaN */
    if (isinf(slope) || isinf(sink) || isinf(bias) || !isfinite(p->softcap)) return false;
    double q = top[0], k = top[1], v = top[2], d_o = top[3];
    double D = (double)p->head_dim, S = (double)p->kv_len, limit = FLT_MAX / 16.0;
    /* the raw scores q . k * scale (times log2 e) the tiles sum; softcap
     * then bounds them, ALiBi adds up to slope * |pos_i - j| (the kernels
     * subtract each row's nearest distance, but a bound is enough), the
     * relative bias up to its largest element, and the sink starts each
     * row's running max */
    double raw = 1.4426950408889634 * fabs((double)p->scale) * D * q * k;
    double cap = 1.4426950408889634 * p->softcap;
    double score = p->softcap > 0.0f && cap < raw ? cap : raw;
    double reach = distance_reach(p);
    score += 1.4426950408889634 * ((double)slope * reach + sink + bias);
    /* and the output's running sums, and dP = dO . v; and what the keys
     * the kernels weigh 0 would carry */
    return !(raw >= limit || score >= limit || S * v >= limit || D * d_o * v >= limit ||
             S * d_o >= limit || attn_values_past_weight_floor(p, v, d_o));
}

/* Values past what the kernels hold, as a reason. */
#define VALUES_OUT_OF_RANGE "a non-finite input, or scores past float32's range in its tiles"

/* Whether a backward's given lse holds a NaN: a row another block made
 * NaN (backward_from_lse), whose weights here are NaN too, or an lse the
 * caller passed so. The kernels' exp2 would weigh the row's keys 0 (dv
 * finite, dq 0); the reference spreads the NaN as PyTorch does. */
static bool given_lse_has_nan(const attn_attention_problem *p) {
    if (!p->lse) return false;
    if (p->whole_tops && p->whole_tops[4] != 0.0f) return true; /* another slice's */
    for (size_t i = 0, n = attn_lse_rows(p); i < n; i++)
        if (p->lse[i] != p->lse[i]) return true;
    return false;
}

static const char *fused_declines_values(attn_ctx *ctx, const attn_attention_problem *p,
                                         const void *dout) {
    if (dout && given_lse_has_nan(p)) return VALUES_OUT_OF_RANGE;
    float top[4];
    attn_value_tops(ctx, p, true, dout, top);
    return magnitudes_fit(flash_kernels(ctx), p, top) ? NULL : VALUES_OUT_OF_RANGE;
}

static const attn_attention_dropout no_dropout = {.kind = ATTN_DROP_NONE};

/* The forward takes p's values unscanned where its kernel measures them as
 * it reads them (the lane forward), and answers after its pass
 * (fused_forward); the backward likewise (its one pass of raw scores). */
static bool fused_measures_values(const attn_ctx *ctx, const attn_attention_problem *p,
                                  const attn_attention_dropout *drop, bool backward) {
    const attn_flash_kernels *fk = flash_kernels(ctx);
    return backward ? fk->backward_measures(p, drop ? drop : &no_dropout)
                    : fk->forward_measures(p, drop);
}

/* ---- workspaces ------------------------------------------------------------ */

/* a * b, or SIZE_MAX when it overflows (an allocation that then fails). */
static size_t mul_or_max(size_t a, size_t b) {
    size_t n;
    return attn_mul_size(a, b, &n) ? n : (size_t)-1;
}

static size_t add_or_max(size_t a, size_t b) {
    size_t n;
    return attn_add_size(a, b, &n) ? n : (size_t)-1;
}

/* Byte counts rounded up to 64, so every piece stays aligned to a line. */
static size_t lines_bytes(size_t bytes) {
    return bytes > (size_t)-1 - 63 ? (size_t)-1 : (bytes + 63) / 64 * 64;
}

/* Bytes of the kernels' per-part tiles (floats per part). */
static size_t tiles_bytes(const attn_ctx *ctx, size_t per_part) {
    size_t parts = attn_parallel_parts(ctx->num_threads);
    return lines_bytes(mul_or_max(mul_or_max(parts, per_part), sizeof(float)));
}

/* Bytes of a float per lse row: (B, Hq, T), or (Hq, total_q) packed. */
static size_t rows_bytes(const attn_attention_problem *p) {
    size_t rows = p->cu_seqlens_q ? mul_or_max(p->q_heads, p->total_q)
                                  : mul_or_max(mul_or_max(p->batch, p->q_heads), p->q_len);
    return lines_bytes(mul_or_max(rows, sizeof(float)));
}

/* The relative bias's tables reach this many distances past the
 * problem's on either side: a padded tile's rows and keys (at most 64 of
 * each past the last real one: flash_kernel.h's BC, LBC, RG and LG). */
#define BIAS_PAD 128

/* Floats of one head's table in one order: every distance kv_idx - q_idx
 * of the problem, -(T - 1) .. S - 1, and the pads. */
static size_t bias_stride(const attn_attention_problem *p) {
    return add_or_max(add_or_max(p->q_len, p->kv_len), 2 * BIAS_PAD + 15) / 16 * 16;
}

/* Bytes of the tables (by key and by row, each head's) where p has a
 * relative bias, else 0. */
static size_t bias_bytes(const attn_attention_problem *p) {
    if (!relative_bias(p)) return 0;
    return lines_bytes(mul_or_max(mul_or_max(2 * p->q_heads, bias_stride(p)), sizeof(float)));
}

/* p's relative bias as the kernels' tables, at `at` (bias_bytes of it),
 * into *tables; NULL where p has none. Each element is the table's,
 * times log2 e in double, rounded once; the pads hold 0. */
static const attn_flash_bias *bias_tables(const attn_attention_problem *p, float *at,
                                          attn_flash_bias *tables) {
    const attn_score_mod *m = relative_bias(p);
    if (!m) return NULL;
    size_t stride = bias_stride(p), H = p->q_heads;
    int64_t T = (int64_t)p->q_len, S = (int64_t)p->kv_len;
    float *by_key = at, *by_row = at + H * stride;
    memset(at, 0, 2 * H * stride * sizeof *at);
    /* by key: distance d = j - i at BIAS_PAD + (T - 1) + d; by row: i - j
     * at BIAS_PAD + (S - 1) + (i - j) */
    for (int64_t d = -(T - 1); d <= S - 1; d++) {
        size_t column = (size_t)attn_rel_bucket(m, d);
        for (size_t h = 0; h < H; h++) {
            float v = (float)(1.4426950408889634 * (double)m->tensor[h * m->buckets + column]);
            by_key[h * stride + (size_t)(BIAS_PAD + (T - 1) + d)] = v;
            by_row[h * stride + (size_t)(BIAS_PAD + (S - 1) - d)] = v;
        }
    }
    *tables = (attn_flash_bias){.by_key = by_key + BIAS_PAD + (T - 1),
                                .by_row = by_row + BIAS_PAD + (S - 1), .stride = stride};
    return tables;
}

/* The forward's tiles, then the relative bias's tables. */
static size_t forward_tiles_bytes(const attn_ctx *ctx, const attn_attention_problem *p) {
    return tiles_bytes(ctx, flash_kernels(ctx)->forward_workspace(p, flash_fit(ctx)));
}

static size_t fused_forward_bytes(const attn_ctx *ctx, const attn_attention_problem *p,
                                  const attn_attention_trace *trace) {
    (void)trace;
    return add_or_max(forward_tiles_bytes(ctx, p), bias_bytes(p));
}

/* The largest |lse| whose float alone the backward takes: a weight
 * recomputed against it is off by up to |lse| 2^-24 in its exponent, 4e-6
 * at this limit, within the 1e-5 the gradients are held to; past it the
 * error grows with the logits until the weights overflow. */
#define LSE_ALONE_LIMIT 64.0f

/* Whether the backward runs a forward of its own for lse, lse_lo and the
 * row statistics (without values): p has no lse, or a whole row's lse
 * alone (a public call keeps no lse_lo) past LSE_ALONE_LIMIT. Rows that
 * see no key (lse -inf) need none. */
static bool takes_own_rows(const attn_attention_problem *p) {
    if (!p->lse) return true;
    if (p->lse_lo || p->row_stats || p->backward_from_lse) return false;
    if (p->whole_tops) return p->whole_tops[5] > LSE_ALONE_LIMIT; /* the whole problem's */
    for (size_t r = 0; r < attn_lse_rows(p); r++)
        if (isfinite(p->lse[r]) && fabsf(p->lse[r]) > LSE_ALONE_LIMIT) return true;
    return false;
}

/* Whether it may (the workspace is sized before lse holds its values):
 * without lse, or with lse alone. */
static bool may_take_own_rows(const attn_attention_problem *p) {
    return !p->lse || (!p->lse_lo && !p->row_stats && !p->backward_from_lse);
}

/* The backward's tiles (also the forward's, for the lse it recomputes
 * (takes_own_rows)), then delta, then that lse, its lse_lo and its row
 * statistics, then the relative bias's tables. */
static size_t backward_tiles_bytes(const attn_ctx *ctx, const attn_attention_problem *p) {
    const attn_flash_kernels *fk = flash_kernels(ctx);
    size_t bwd = fk->backward_workspace(p), fwd = fk->forward_workspace(p, flash_fit(ctx));
    return tiles_bytes(ctx, may_take_own_rows(p) && fwd > bwd ? fwd : bwd);
}

/* The backward's workspace up to the relative bias's tables. */
static size_t backward_rows_end(const attn_ctx *ctx, const attn_attention_problem *p) {
    size_t bytes = add_or_max(backward_tiles_bytes(ctx, p), rows_bytes(p));
    /* its own lse, lse_lo and row statistics (two floats a row) */
    return may_take_own_rows(p) ? add_or_max(bytes, mul_or_max(4, rows_bytes(p))) : bytes;
}

static size_t fused_backward_bytes(const attn_ctx *ctx, const attn_attention_problem *p) {
    return add_or_max(backward_rows_end(ctx, p), bias_bytes(p));
}

/* ---- the passes ------------------------------------------------------------ */

static const char *fused_forward(attn_ctx *ctx, const attn_attention_problem *p,
                                 const attn_attention_dropout *drop,
                                 const attn_attention_trace *trace, void *workspace) {
    (void)trace; /* a traced forward is the reference's (fused_declines) */
    const attn_flash_kernels *fk = flash_kernels(ctx);
    attn_workers w = attn_ctx_workers(ctx);
    drop = drop ? drop : &no_dropout;
    /* As freshly allocated, also when reused: no stale NaN in a tile's pad;
     * on the threads, each its own part's tiles. */
    size_t tiles = forward_tiles_bytes(ctx, p);
    attn_pool_zero(w.pool, w.threads, workspace, tiles);
    attn_flash_bias tables;
    const attn_flash_bias *bias = bias_tables(p, (float *)((char *)workspace + tiles), &tables);
    if (!fk->forward_measures(p, drop)) {
        fk->forward(w, flash_fit(ctx), p, drop, bias, workspace, NULL);
        return NULL;
    }
    /* unscanned (fused_measures_values): values the kernels would get
     * wrong are declined now, and the runner's next backend writes over
     * what they wrote */
    float top[4] = {0, 0, 0, 0};
    fk->forward(w, flash_fit(ctx), p, drop, bias, workspace, top);
    attn_value_tops_whole(p, true, false, top);
    return magnitudes_fit(fk, p, top) ? NULL : VALUES_OUT_OF_RANGE;
}

static const char *fused_backward(attn_ctx *ctx, const attn_attention_problem *p,
                                  const attn_attention_dropout *drop,
                                  const attn_attention_grads *g, void *workspace) {
    const attn_flash_kernels *fk = flash_kernels(ctx);
    if (given_lse_has_nan(p)) return VALUES_OUT_OF_RANGE; /* nothing written yet */
    attn_workers w = attn_ctx_workers(ctx);
    size_t tiles = backward_tiles_bytes(ctx, p);
    float *ws = workspace, *delta = (float *)((char *)workspace + tiles);
    attn_pool_zero(w.pool, w.threads, workspace, tiles);
    attn_flash_bias tables;
    const attn_flash_bias *bias =
        bias_tables(p, (float *)((char *)workspace + backward_rows_end(ctx, p)), &tables);
    /* the row statistics are the given lse's rows' own, not so for one
     * block of a longer row (backward_from_lse) */
    attn_flash_rows rows = {.lse = p->lse, .lse_lo = p->lse_lo,
                            .stats = p->backward_from_lse ? NULL : p->row_stats};
    if (takes_own_rows(p)) {
        /* no statistics, or an lse too coarse alone: this forward's lse,
         * lse_lo and row statistics, without values */
        float *own = (float *)((char *)delta + rows_bytes(p));
        float *own_lo = (float *)((char *)own + rows_bytes(p));
        float *own_stats = (float *)((char *)own_lo + rows_bytes(p));
        attn_attention_problem stats = *p;
        stats.out.data = NULL;
        stats.lse = own;
        stats.lse_lo = own_lo;
        stats.row_stats = own_stats;
        fk->forward(w, flash_fit(ctx), &stats, &no_dropout, bias, ws, NULL);
        attn_pool_zero(w.pool, w.threads, workspace, tiles);
        rows = (attn_flash_rows){.lse = own, .lse_lo = own_lo, .stats = own_stats};
    }
    drop = drop ? drop : &no_dropout;
    if (!fk->backward_measures(p, drop)) {
        fk->backward(w, p, drop, bias, g, rows, delta, ws, NULL);
        return NULL;
    }
    /* unscanned (fused_measures_values): as the forward, declined after
     * the pass (the lse forward above measures nothing: it takes the lane
     * path, which any values leave in bounds) */
    float top[4] = {0, 0, 0, 0};
    fk->backward(w, p, drop, bias, g, rows, delta, ws, top);
    attn_value_tops_whole(p, true, true, top);
    return magnitudes_fit(fk, p, top) ? NULL : VALUES_OUT_OF_RANGE;
}

const attn_attention_backend attn_attention_fused = {
    .name = "fused",
    .kernel_name = fused_kernel_name,
    .declines = fused_declines,
    .declines_values = fused_declines_values,
    .measures_values = fused_measures_values,
    .forward_bytes = fused_forward_bytes,
    .backward_bytes = fused_backward_bytes,
    .forward = fused_forward,
    .backward = fused_backward,
    .writes_row_stats = true,
};
