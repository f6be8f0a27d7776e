/* runner.c — the one way attention runs: checks the problem, asks the
 * registry's backends which takes it, finds their memory, turns a dropout
 * stream into the record every backend reads, and runs the pass; a 16-bit
 * problem no backend takes is widened to float32 and asked again. Modules,
 * ops, the KV cache's prompts, the MPI layers and attn_sdpa_* all call
 * it. */
#include "attention/attention.h"

#include "kernels/kernels.h"
#include "mask/mask_internal.h"
#include "rng/dropout.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
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

static bool is_attention_dtype(attn_dtype d) {
    return d == ATTN_DTYPE_F32 || d == ATTN_DTYPE_BF16 || d == ATTN_DTYPE_F16 ||
           d == ATTN_DTYPE_F64;
}

/* The largest element a BIAS modifier's strides reach over the problem,
 * plus one, in *extent; false where that overflows size_t or a double
 * buffer of it would (the reference's backward sums its gradient there). */
static bool bias_extent(const attn_attention_problem *p, const attn_score_mod *m,
                        size_t *extent) {
    size_t last[4] = {p->batch - 1, p->q_heads - 1, p->q_len - 1, p->kv_len - 1}, at = 1, e;
    for (int d = 0; d < 4; d++) {
        if (!attn_mul_size(last[d], m->strides[d], &e) || at > SIZE_MAX - e) return false;
        at += e;
    }
    *extent = at;
    return at <= SIZE_MAX / sizeof(double);
}

size_t attn_score_mod_elements(const attn_attention_problem *p, const attn_score_mod *m) {
    size_t extent = 0;
    switch (m->kind) {
    case ATTN_SCORE_ALIBI: return p->q_heads;
    case ATTN_SCORE_REL_BIAS:
    case ATTN_SCORE_REL_TABLE: return p->q_heads * m->buckets;
    case ATTN_SCORE_BIAS: return bias_extent(p, m, &extent) ? extent : 0;
    default: return 0;
    }
}

/* Whether every element a REL_TABLE modifier reads over the problem's
 * lengths (the longest sequence's, with cu_seqlens) lies in its rows of
 * buckets, negative ones counting from the end; else the first extreme
 * out of range in *e (the offset itself where a length is past 2^62).
 * attn_score_mods_check has bounded the offset and the buckets. */
static bool rel_table_reaches(const attn_attention_problem *p, const attn_score_mod *m,
                              int64_t *e) {
    const int64_t far = (int64_t)1 << 62;
    *e = m->offset;
    if (p->q_len > (size_t)far || p->kv_len > (size_t)far) return false;
    int64_t T = (int64_t)p->q_len, S = (int64_t)p->kv_len, n = (int64_t)m->buckets;
    int64_t lo = (m->signed_distance ? -(T - 1) : -(S - 1)) + m->offset;
    int64_t hi = (m->signed_distance ? S - 1 : T - 1) + m->offset;
    *e = lo < -n ? lo : hi;
    return lo >= -n && hi < n;
}

/* A block map over packed sequences is in each sequence's own positions:
 * sequence b's query i and key j are the map's (b or 0, h, i, j), so the
 * map reaches every sequence's lengths (it may be longer: what lies past a
 * sequence is never read). */
static attn_status check_packed_map(attn_ctx *ctx, const char *who,
                                    const attn_attention_problem *p) {
    const attn_block_map *m = p->block_map;
    for (size_t b = 0; b < p->batch; b++) {
        attn_attention_seq s = attn_attention_seq_of(p, b);
        if (s.q_len > m->q_len || s.kv_len > m->kv_len)
            return attn_fail(ctx, ATTN_ERR_SHAPE,
                             "%s: sequence %zu (%zu queries, %zu keys) is past the block map's "
                             "q_len %zu, kv_len %zu (with cu_seqlens the map is in each "
                             "sequence's positions)",
                             who, b, s.q_len, s.kv_len, m->q_len, m->kv_len);
    }
    return ATTN_OK;
}

/* A block map over a KV cache: its rows and columns are positions, so it
 * covers every position a sequence of the problem reaches (its cached and
 * new rows); a tree's draft rows sit at positions of their own depth, not
 * of their row, so a map does not go with one. */
static attn_status check_cache_map(attn_ctx *ctx, const char *who,
                                   const attn_attention_problem *p) {
    const attn_block_map *m = p->block_map;
    const attn_kv_cache_view *c = p->kv_cache;
    if (c->tree)
        return attn_fail(ctx, ATTN_ERR_UNSUPPORTED,
                         "%s: a block map with a tree of draft tokens: the tree is the mask of "
                         "the draft rows",
                         who);
    if (!c->cached || !c->new_rows) return ATTN_OK; /* refused with the cache's checks */
    for (size_t b = 0; b < p->batch; b++) {
        size_t n = c->new_rows[b], reach = c->cached[b] + n;
        if (n && (reach > m->q_len || reach > m->kv_len))
            return attn_fail(ctx, ATTN_ERR_SHAPE,
                             "%s: the block map is of q_len %zu, kv_len %zu (positions); "
                             "sequence %zu reaches position %zu (%zu cached, %zu new)",
                             who, m->q_len, m->kv_len, b, reach - 1, c->cached[b], n);
    }
    return ATTN_OK;
}

/* A block map and a chain of score modifiers, as the problem may hold them
 * (attention_problem.h): the map over the problem's own lengths (with
 * cu_seqlens: at least each sequence's; over a KV cache: positions), batch
 * and heads (or 1); a chain in place of softcap and ALiBi. Runs after the
 * cu_seqlens checks. */
static attn_status check_programmable(attn_ctx *ctx, const char *who,
                                      const attn_attention_problem *p) {
    const attn_block_map *m = p->block_map;
    attn_status st;
    if (m && ((m->batch != 1 && m->batch != p->batch) || (m->heads != 1 && m->heads != p->q_heads)))
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "%s: the block map's batch (%zu) and heads (%zu) must each be 1 or the "
                         "problem's (%zu, %zu)",
                         who, m->batch, m->heads, p->batch, p->q_heads);
    if (m && p->kv_cache) {
        if ((st = check_cache_map(ctx, who, p)) != ATTN_OK) return st;
    } else if (m && p->cu_seqlens_q) {
        if ((st = check_packed_map(ctx, who, p)) != ATTN_OK) return st;
    } else if (m && (m->q_len != p->q_len || m->kv_len != p->kv_len))
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "%s: the block map is of q_len %zu, kv_len %zu where the problem is of "
                         "%zu, %zu",
                         who, m->q_len, m->kv_len, p->q_len, p->kv_len);
    if (!p->score_mod_count) return ATTN_OK;
    if (!p->score_mods)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: score_mod_count is %zu but score_mods is NULL",
                         who, p->score_mod_count);
    if (p->softcap > 0.0f || p->softcap_f64 > 0.0 || p->alibi_slopes)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: a chain of %zu score modifiers with the problem's own softcap "
                         "(%g) or alibi_slopes (%s): the chain replaces both",
                         who, p->score_mod_count,
                         p->softcap_f64 > 0.0 ? p->softcap_f64 : (double)p->softcap,
                         p->alibi_slopes ? "set" : "NULL");
    if ((st = attn_score_mods_check(ctx, who, p->score_mods, p->score_mod_count, p->q_heads)) !=
        ATTN_OK)
        return st;
    for (size_t k = 0; k < p->score_mod_count; k++) {
        const attn_score_mod *mod = &p->score_mods[k];
        size_t extent;
        int64_t e;
        if (mod->kind == ATTN_SCORE_REL_TABLE && !rel_table_reaches(p, mod, &e))
            return attn_fail(ctx, ATTN_ERR_SHAPE,
                             "%s: score_mods[%zu] (relative table) reads element %lld of rows of "
                             "%zu (%s + offset %lld over q_len %zu, kv_len %zu): every element "
                             "must lie in [-%zu, %zu)",
                             who, k, (long long)e, mod->buckets,
                             mod->signed_distance ? "kv_idx - q_idx" : "q_idx - kv_idx",
                             (long long)mod->offset, p->q_len, p->kv_len, mod->buckets,
                             mod->buckets);
        if (mod->kind == ATTN_SCORE_BIAS && !bias_extent(p, mod, &extent))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                             "%s: score_mods[%zu] (bias) strides (%zu, %zu, %zu, %zu) over "
                             "(%zu, %zu, %zu, %zu) reach past size_t",
                             who, k, mod->strides[0], mod->strides[1], mod->strides[2],
                             mod->strides[3], p->batch, p->q_heads, p->q_len, p->kv_len);
    }
    return ATTN_OK;
}

attn_status attn_attention_check(attn_ctx *ctx, const char *who, const attn_attention_problem *p) {
    attn_status st;
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
    if (p->q.dtype != p->k.dtype || p->q.dtype != p->v.dtype || p->q.dtype != p->out.dtype)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: q, k, v and out have dtypes %s, %s, %s and "
                         "%s: one dtype for all four", who, attn_dtype_name(p->q.dtype),
                         attn_dtype_name(p->k.dtype), attn_dtype_name(p->v.dtype),
                         attn_dtype_name(p->out.dtype));
    if (!is_attention_dtype(p->q.dtype))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: dtype %s is not F32, BF16, F16 or F64", who,
                         attn_dtype_name(p->q.dtype));
    if (p->q.memory != ATTN_MEMORY_HOST || p->k.memory != ATTN_MEMORY_HOST ||
        p->v.memory != ATTN_MEMORY_HOST || p->out.memory != ATTN_MEMORY_HOST)
        return attn_fail(ctx, ATTN_ERR_UNSUPPORTED, "%s: a view is not in host memory, and no "
                         "backend for other memory is registered", who);
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
    if (p->kv_cache) {
        const attn_kv_cache_view *c = p->kv_cache;
        if (p->cu_seqlens_q || p->cu_seqlens_kv || !c->cached || !c->new_rows || !c->row_start)
            return attn_fail(ctx, ATTN_ERR_INVALID, "%s: a problem over a KV cache has its "
                             "lengths in the cache's view, not in cu_seqlens", who);
        for (size_t b = 0; b < p->batch; b++)
            if (c->new_rows[b] > p->q_len || c->new_rows[b] > p->kv_len ||
                c->cached[b] > p->kv_len - c->new_rows[b])
                return attn_fail(ctx, ATTN_ERR_SHAPE, "%s: sequence %zu (%zu cached, %zu new) "
                                 "is past the longest lengths (%zu new, %zu in all)", who, b,
                                 c->cached[b], c->new_rows[b], p->q_len, p->kv_len);
    }
    if (!p->cu_seqlens_q != !p->cu_seqlens_kv)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: cu_seqlens_q and cu_seqlens_kv go together (%s is NULL)",
                         who, p->cu_seqlens_q ? "cu_seqlens_kv" : "cu_seqlens_q");
    if (p->cu_seqlens_q) {
        st = check_cu_seqlens(ctx, who, "cu_seqlens_q", p->cu_seqlens_q, p->batch, p->q_len);
        if (st == ATTN_OK)
            st = check_cu_seqlens(ctx, who, "cu_seqlens_kv", p->cu_seqlens_kv, p->batch, p->kv_len);
        if (st != ATTN_OK) return st;
        if ((size_t)p->cu_seqlens_q[p->batch] != p->total_q)
            return attn_fail(ctx, ATTN_ERR_INVALID, "%s: cu_seqlens_q[%zu] (%ld) != total_q (%zu)",
                             who, p->batch, (long)p->cu_seqlens_q[p->batch], p->total_q);
    }
    return check_programmable(ctx, who, p);
}

/* ---- choosing a backend ------------------------------------------------------ */

static bool is_16bit(const attn_attention_problem *p) {
    return p->q.dtype == ATTN_DTYPE_BF16 || p->q.dtype == ATTN_DTYPE_F16;
}

/* The backends that take p as a problem (their values unasked), in the
 * registry's order, into out; returns how many. */
static size_t candidates(const attn_ctx *ctx, const attn_attention_problem *p, attn_pass pass,
                         const attn_attention_backend **out) {
    size_t count, n = 0;
    const attn_attention_backend *const *all = attn_attention_registry(&count);
    for (size_t i = 0; i < count; i++)
        if (!all[i]->declines(ctx, p, pass)) out[n++] = all[i];
    return n;
}

/* Every backend's reason to decline p, for the record. */
static void note_declines(attn_ctx *ctx, const attn_attention_problem *p, attn_pass pass) {
    size_t count;
    const attn_attention_backend *const *all = attn_attention_registry(&count);
    for (size_t i = 0; i < count; i++)
        attn_explain_note(ctx, all[i]->name, all[i]->declines(ctx, p, pass));
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

/* Bits of the (B, Hq, T, S) dropout mask, in whole doubles. */
static size_t mask_bytes(const attn_attention_problem *p) {
    size_t n = p->batch * p->q_heads * p->q_len * p->kv_len; /* checked */
    return (n / 8 + 8) / 8 * 8;
}

/* The float32 problem a 16-bit p widens to, for its geometry (no data). */
static attn_attention_problem widened_shape(const attn_attention_problem *p) {
    attn_attention_problem w = *p;
    w.q.dtype = w.k.dtype = w.v.dtype = w.out.dtype = ATTN_DTYPE_F32;
    return w;
}

/* Whether a 16-bit backward runs the float32 forward again for the out it
 * reads: a score modifier's gradient (a bias's, a table's, a callback's dS)
 * is float32's, and delta_i = dout_i . out_i from the rounded 16-bit out
 * would carry out's rounding into every dS_ij of its row, where PyTorch's
 * comes from float32 internals. */
static bool recomputes_out(const attn_attention_problem *p) {
    if (!is_16bit(p)) return false;
    for (size_t k = 0; k < p->score_mod_count; k++)
        if (p->score_mods[k].tensor_grad || p->score_mods[k].kind == ATTN_SCORE_CALLBACK)
            return true;
    return false;
}

/* Workspace of a pass: the largest any candidate needs (a backend that
 * measures values in its pass may leave the problem to the next one), and
 * for a 16-bit problem that of its widened float32 one. */
static size_t pass_bytes(const attn_ctx *ctx, const attn_attention_problem *p, attn_pass pass) {
    const attn_attention_backend *c[ATTN_MAX_BACKENDS];
    size_t n = candidates(ctx, p, pass, c), bytes = 0;
    attn_attention_trace none = {0};
    for (size_t i = 0; i < n; i++)
        bytes = max_size(bytes, pass.backward ? c[i]->backward_bytes(ctx, p)
                                              : c[i]->forward_bytes(ctx, p, &none));
    if (is_16bit(p)) {
        attn_attention_problem w = widened_shape(p);
        bytes = max_size(bytes, pass_bytes(ctx, &w, pass));
    }
    return bytes;
}

/* ---- chains the fixed features say ---------------------------------------- */

/* Whether query i of every sequence sits at position i + offset (packed
 * sequences aligned bottom-right each have their own). */
static bool one_diagonal(const attn_attention_problem *p, int64_t offset) {
    size_t n = p->cu_seqlens_q ? p->batch : 1;
    for (size_t b = 0; b < n; b++)
        if (attn_attention_seq_of(p, b).diagonal != offset) return false;
    return true;
}

/* Whether every key p lets a query see lies at or before the query's
 * position i + offset (so a signed ALiBi distance is the absolute one). */
static bool keys_before(const attn_attention_problem *p, int64_t offset) {
    bool at_offset = one_diagonal(p, offset);
    if (p->causal && at_offset) return true;
    if (p->window && p->window_right == 0 && at_offset) return true;
    const attn_block_map *m = p->block_map;
    if (!m || !m->row_lo) return false;
    for (size_t b = 0; b < m->rows_batch; b++)
        for (size_t i = 0; i < m->q_len; i++) {
            size_t at = b * m->q_len + i;
            if (m->row_lo[at] < m->row_hi[at] && m->row_hi[at] > (int64_t)i + offset + 1)
                return false;
        }
    return true;
}

/* p with its chain said as the fixed features, into *out, when the chain
 * is softcap, ALiBi or softcap then ALiBi at the problem's own positions
 * (what q . k * scale, softcap, - slope |pos_i - j| computes) and the map,
 * if any, is one of row intervals, and the fused kernels take the problem
 * so said: they then run it, as fast as the features themselves. Else p. */
static const attn_attention_problem *fixed_features(const attn_ctx *ctx,
                                                    const attn_attention_problem *p,
                                                    attn_attention_problem *out) {
    size_t n = p->score_mod_count;
    if (!n || n > 2 || p->kv_cache || (p->block_map && !p->block_map->row_lo)) return p;
    const attn_score_mod *cap = NULL, *alibi = NULL;
    for (size_t k = 0; k < n; k++) {
        const attn_score_mod *m = &p->score_mods[k];
        if (m->kind == ATTN_SCORE_SOFTCAP && k == 0) cap = m;
        else if (m->kind == ATTN_SCORE_ALIBI && k == n - 1) alibi = m;
        else return p;
    }
    if (alibi) {
        if (!one_diagonal(p, alibi->offset)) return p;
        if (alibi->signed_distance && !keys_before(p, alibi->offset)) return p;
    }
    *out = *p;
    out->score_mods = NULL;
    out->score_mod_count = 0;
    if (cap) {
        out->softcap = (float)cap->value;
        out->softcap_f64 = cap->value;
    }
    if (alibi) out->alibi_slopes = alibi->tensor;
    /* only where the fused kernels take it both ways: else the flex
     * kernels run the chain (they decline the features as fields) */
    const attn_pass fwd = {.backward = false}, bwd = {.backward = true};
    bool fused = !attn_attention_fused.declines(ctx, out, fwd) &&
                 !attn_attention_fused.declines(ctx, out, bwd);
    bool fused16 = !attn_attention_fused16.declines(ctx, out, fwd) &&
                   !attn_attention_fused16.declines(ctx, out, bwd);
    return fused || fused16 ? out : p;
}

size_t attn_attention_forward_bytes(const attn_ctx *ctx, const attn_attention_problem *p,
                                    bool mask_in_workspace, bool traced) {
    attn_attention_problem said;
    p = fixed_features(ctx, p, &said);
    /* with dropout or not: the workspace fits either */
    attn_pass plain = {.traced = traced}, dropped = {.traced = traced, .dropout = true};
    size_t bytes = max_size(pass_bytes(ctx, p, plain), pass_bytes(ctx, p, dropped));
    if (mask_in_workspace) {
        size_t extra = mask_bytes(p);
        bytes = bytes > (size_t)-1 - extra ? (size_t)-1 : bytes + extra;
    }
    return bytes;
}

size_t attn_attention_backward_bytes(const attn_ctx *ctx, const attn_attention_problem *p) {
    attn_attention_problem said;
    p = fixed_features(ctx, p, &said);
    attn_pass plain = {.backward = true}, dropped = {.backward = true, .dropout = true};
    size_t bytes = max_size(pass_bytes(ctx, p, plain), pass_bytes(ctx, p, dropped));
    if (recomputes_out(p)) {
        attn_attention_problem w = widened_shape(p);
        attn_pass fwd = {.backward = false}, fwd_dropped = {.dropout = true};
        bytes = max_size(bytes, pass_bytes(ctx, &w, fwd));
        bytes = max_size(bytes, pass_bytes(ctx, &w, fwd_dropped));
    }
    return bytes;
}

/* Refuses p when no backend runs it in this pass and the runner cannot
 * widen it (a 16-bit problem is widened to float32, which the reference
 * runs): the reasons, backend by backend, name what is missing. */
static attn_status check_runnable(attn_ctx *ctx, const char *who,
                                  const attn_attention_problem *p, attn_pass pass) {
    const attn_attention_backend *c[ATTN_MAX_BACKENDS];
    if (is_16bit(p) || candidates(ctx, p, pass, c) > 0) return ATTN_OK;
    attn_explain_begin(ctx);
    note_declines(ctx, p, pass);
    return attn_fail(ctx, ATTN_ERR_UNSUPPORTED, "%s: no backend runs this problem: %s", who,
                     ctx->explain);
}

static attn_status no_workspace(attn_ctx *ctx, const char *who, size_t bytes) {
    return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                     "%s: cannot allocate %zu bytes of attention workspace", who, bytes);
}

/* ---- the passes -------------------------------------------------------------- */

/* What asking the backends came to. */
typedef enum run_result {
    RUN_DECLINED = 0, /* every backend declined the values */
    RUN_DONE,
    RUN_FAILED        /* a pass failed (attn_pass_failed): its message is in the ctx */
} run_result;

/* p's row_stats marked as another forward's, every row of lse's layout:
 * the forward that ran keeps none (attn_attention_backend's
 * writes_row_stats). */
static void no_row_stats(const attn_attention_problem *p) {
    for (size_t r = 0; r < attn_lse_rows(p); r++) {
        p->row_stats[2 * r] = NAN;
        p->row_stats[2 * r + 1] = ATTN_ROW_STATS_FOREIGN;
    }
}

/* Asks the registry's backends in order and runs the first that takes p
 * and its values, noting each decline. g NULL: the forward. */
static run_result run_candidates(attn_ctx *ctx, const attn_attention_problem *p,
                                 const attn_attention_dropout *drop,
                                 const attn_attention_trace *trace,
                                 const attn_attention_grads *g, void *workspace) {
    bool backward = g != NULL;
    attn_pass pass = {backward, trace != NULL, drop->kind != ATTN_DROP_NONE};
    size_t count;
    const attn_attention_backend *const *all = attn_attention_registry(&count);
    for (size_t i = 0; i < count; i++) {
        const attn_attention_backend *b = all[i];
        const char *why = b->declines(ctx, p, pass);
        if (why) {
            attn_explain_note(ctx, b->name, why);
            continue;
        }
        bool measures = b->measures_values && b->measures_values(ctx, p, drop, backward);
        if (!measures && b->declines_values)
            why = b->declines_values(ctx, p, backward ? g->dout : NULL);
        if (!why)
            why = backward ? b->backward(ctx, p, drop, g, workspace)
                           : b->forward(ctx, p, drop, trace, workspace);
        char name[160], stored[80] = "";
        if (p->kv_cache) /* the formats the kernel read, and the score modifiers it ran */
            snprintf(stored, sizeof stored, "%sK %s, V %s%s%s%s", b->kernel_name ? ", " : " [",
                     attn_dtype_name(p->kv_cache->k.dtype), attn_dtype_name(p->kv_cache->v.dtype),
                     p->softcap > 0.0f ? ", softcap" : "", p->alibi_slopes ? ", ALiBi" : "",
                     p->sinks ? ", sinks" : "");
        snprintf(name, sizeof name, "%s%s%s%s%s", b->name, b->kernel_name ? " [" : "",
                 b->kernel_name ? b->kernel_name(ctx, p) : "", stored,
                 b->kernel_name || p->kv_cache ? "]" : "");
        attn_explain_note(ctx, name, why);
        if (!why && !backward && p->row_stats && !b->writes_row_stats) no_row_stats(p);
        if (!why) return RUN_DONE;
        if (why == attn_pass_failed) return RUN_FAILED;
    }
    return RUN_DECLINED;
}

/* The status of a pass that failed, its message prefixed by who. */
static attn_status pass_failed(attn_ctx *ctx, const char *who) {
    char message[ATTN_ERROR_CAPACITY];
    snprintf(message, sizeof message, "%s", ctx->error);
    return attn_fail(ctx, ATTN_ERR_INVALID, "%s: %s", who, message);
}

/* p (16-bit) on float32 copies: widened, run, rounded back. A backward
 * that recomputes_out first runs the float forward on the copies, for the
 * float32 out it reads (the same kernels, dropout and values as the
 * forward whose out was rounded), its lse into a buffer of its own: the
 * caller's is an input. */
static attn_status run_widened(attn_ctx *ctx, const char *who, const attn_attention_problem *p,
                               const attn_attention_dropout *drop,
                               const attn_attention_grads *g, void *workspace) {
    attn_attention_problem wide;
    attn_attention_grads wide_g;
    float *buffer, *lse = NULL;
    attn_status st = attn_widen16(ctx, who, p, g ? g->dout : NULL, &wide, &wide_g, &buffer);
    if (st != ATTN_OK) return st;
    bool recompute = g && recomputes_out(p);
    size_t rows = attn_lse_rows(p);
    if (recompute && !(lse = attn_malloc((rows ? rows : 1) * sizeof *lse))) {
        attn_free(buffer);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                         "%s: cannot allocate %zu floats for the float32 forward's lse", who, rows);
    }
    attn_explain_note(ctx, "widened to float32", NULL);
    run_result ran = RUN_DONE;
    if (recompute) {
        attn_attention_problem fwd = wide;
        fwd.lse = lse;
        fwd.lse_lo = NULL;
        fwd.row_stats = NULL;
        fwd.dlse = NULL;
        fwd.backward_from_lse = false;
        attn_explain_note(ctx, "the float32 forward again, for its out", NULL);
        ran = run_candidates(ctx, &fwd, drop, NULL, NULL, workspace);
    }
    if (g) wide_g.dsinks = g->dsinks;
    if (ran != RUN_FAILED)
        ran = run_candidates(ctx, &wide, drop, NULL, g ? &wide_g : NULL, workspace);
    if (ran != RUN_FAILED) attn_narrow16(ctx, p, &wide, g ? &wide_g : NULL, g);
    attn_free(lse);
    attn_free(buffer);
    return ran == RUN_FAILED ? pass_failed(ctx, who) : ATTN_OK;
}

attn_status attn_attention_forward(attn_ctx *ctx, const char *who, const attn_attention_problem *p,
                                   attn_dropout_stream *stream, uint8_t *keep_bits,
                                   const attn_attention_trace *trace,
                                   attn_attention_dropout *drop_out, void *workspace) {
    attn_status st = attn_attention_check(ctx, who, p);
    if (st != ATTN_OK) return st;
    attn_attention_problem said;
    p = fixed_features(ctx, p, &said);
    bool drawn = stream && !stream->passthrough;
    bool serial = drawn && !stream->drop_all && stream->method != ATTN_BERNOULLI_PHILOX;
    if (serial && p->cu_seqlens_q)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: PyTorch's serial dropout masks are for dense batches; packed "
                         "sequences draw Philox (ATTN_BERNOULLI_PHILOX)",
                         who);
    if (serial && is_16bit(p))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: 16-bit attention draws Philox dropout (ATTN_BERNOULLI_PHILOX)", who);
    bool traced = trace && (trace->scores || trace->weights || trace->dropped);
    if ((st = check_runnable(ctx, who, p, (attn_pass){.traced = traced, .dropout = drawn})) !=
        ATTN_OK)
        return st;
    bool mask_in_workspace = serial && !keep_bits;
    /* the size, where the workspace is this call's to take or the mask
     * lies at its end (a caller's workspace is sized alike) */
    size_t bytes = !workspace || mask_in_workspace
                       ? attn_attention_forward_bytes(ctx, p, mask_in_workspace, traced)
                       : 0;
    if (!workspace && !(workspace = attn_ctx_workspace(ctx, bytes)))
        return no_workspace(ctx, who, bytes);
    attn_explain_begin(ctx);
    /* a 16-bit problem no backend takes (with dropout: no 16-bit kernel
     * draws it) is widened: its copies are made before the rng moves */
    attn_attention_problem wide;
    attn_attention_grads unused;
    float *buffer = NULL;
    const attn_attention_backend *c[ATTN_MAX_BACKENDS];
    attn_pass pass = {.traced = traced, .dropout = drawn};
    bool widen_first = is_16bit(p) && candidates(ctx, p, pass, c) == 0;
    if (widen_first &&
        (st = attn_widen16(ctx, who, p, NULL, &wide, &unused, &buffer)) != ATTN_OK)
        return st;
    if (widen_first) note_declines(ctx, p, pass);
    /* Everything is in hand: from here on nothing fails. */
    attn_attention_dropout drop = {.kind = ATTN_DROP_NONE};
    if (drawn) {
        drop.kept_scale = stream->kept_scale;
        drop.kept_scale_f64 = stream->drop_all ? 0.0 : 1.0 / stream->keep; /* keep = 1 - p */
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
            uint8_t keep[1024];
            for (size_t e0 = 0; e0 < n; e0 += sizeof keep) {
                size_t m = n - e0 < sizeof keep ? n - e0 : sizeof keep;
                attn_dropout_stream_keeps(stream, keep, m);
                for (size_t e = 0; e < m; e++)
                    if (keep[e]) attn_set_bit(bits, e0 + e);
            }
            drop.kind = ATTN_DROP_BITS;
            drop.keep_bits = bits;
        }
    }
    if (drop_out) *drop_out = drop;
    if (widen_first) {
        attn_explain_note(ctx, "widened to float32", NULL);
        run_result ran = run_candidates(ctx, &wide, &drop, NULL, NULL, workspace);
        if (ran != RUN_FAILED) attn_narrow16(ctx, p, &wide, NULL, NULL);
        attn_free(buffer);
        return ran == RUN_FAILED ? pass_failed(ctx, who) : ATTN_OK;
    }
    run_result ran = run_candidates(ctx, p, &drop, traced ? trace : NULL, NULL, workspace);
    if (ran == RUN_DONE) return ATTN_OK;
    if (ran == RUN_FAILED) return pass_failed(ctx, who);
    /* every 16-bit backend declined the values (none draws dropout); a
     * float problem never gets here: its last candidate, the reference,
     * takes any values (check_runnable) */
    return run_widened(ctx, who, p, &drop, NULL, workspace);
}

attn_status attn_attention_backward(attn_ctx *ctx, const char *who, const attn_attention_problem *p,
                                    const attn_attention_dropout *drop,
                                    const attn_attention_grads *g, void *workspace) {
    attn_status st = attn_attention_check(ctx, who, p);
    attn_attention_problem said;
    if (st == ATTN_OK) p = fixed_features(ctx, p, &said);
    for (size_t k = 0; st == ATTN_OK && k < p->score_mod_count; k++)
        if (p->score_mods[k].kind == ATTN_SCORE_CALLBACK && !p->score_mods[k].grad_fn)
            st = attn_fail(ctx, ATTN_ERR_NULL,
                           "%s: score_mods[%zu] (callback) has no grad_fn: the backward needs "
                           "it",
                           who, k);
    attn_pass pass = {.backward = true, .dropout = drop && drop->kind != ATTN_DROP_NONE};
    if (st != ATTN_OK || (st = check_runnable(ctx, who, p, pass)) != ATTN_OK) return st;
    if (!workspace) {
        size_t bytes = attn_attention_backward_bytes(ctx, p);
        if (!(workspace = attn_ctx_workspace(ctx, bytes))) return no_workspace(ctx, who, bytes);
    }
    attn_explain_begin(ctx);
    attn_attention_dropout none = {.kind = ATTN_DROP_NONE};
    run_result ran = run_candidates(ctx, p, drop ? drop : &none, NULL, g, workspace);
    if (ran == RUN_DONE) return ATTN_OK;
    if (ran == RUN_FAILED) return pass_failed(ctx, who);
    return run_widened(ctx, who, p, drop ? drop : &none, g, workspace);
}
