/*
 * reference.c — the reference attention backend: the oracle every fused
 * kernel is tested against. Plain loops, one query row (forward, backward
 * pass 1) or one key row (backward pass 2) at a time, with scores, softmax
 * and weights in double, so the result sits near the exact one even where
 * float32 softmax is ill-conditioned. Each pass is parallel over the ctx's
 * threads and every output element is written by one item in a fixed order
 * of additions: the bits are the same for any thread count.
 *
 * Per row (b, h, i) of a sequence with S keys, query position pos_i:
 *   x_ij = q_i . k_j * scale                     (k of KV head h / G)
 *   s_ij = softcap * tanh(x_ij / softcap)         (softcap > 0)
 *   s_ij -= alibi_h * |pos_i - j|                 (alibi_slopes)
 *   P_ij = exp(s_ij - lse_i) over the visible j,  lse_i = log(sum_j exp(s_ij) + exp(sink_h))
 *   out_i = sum_j drop_ij P_ij v_j                (every j of the sequence: 0 * inf
 *                                                  is NaN there, as in PyTorch's matmul)
 *
 * Programmable attention (attn.h): key j is visible to query i of (b, h)
 * when attn_visible_keys allows it and the block map, if any, says so (a
 * full tile: yes; a partial one: its bit; a tile left out: no). A chain of
 * score modifiers replaces softcap and ALiBi (the runner refuses both
 * together): it runs over the row's keys [first, last) of
 * attn_visible_keys, one 1 x n tile at a time, in the tensors' precision
 * (SCALE and SOFTCAP values rounded to float for float32 views, as given
 * for float64 ones); the backward walks it in reverse:
 *   SCALE    g *= value            SOFTCAP   g *= 1 - tanh^2(in / value)
 *   ALIBI    g                     BIAS, REL_BIAS, REL_TABLE  g, and tensor_grad += g
 * CALLBACK tiles are float (attn_score_tile): a float64 problem's callback
 * sees its scores rounded to float and its result is widened back, so a
 * chain with a callback is float-exact there, not double-exact.
 *
 * The passes are written once over the tensors' element type
 * (reference_impl.h), instantiated for float32 and float64 views.
 */
#include "attention/attention.h"
#include "contract/kv_format.h"

#include "kernels/kernels.h"
#include "parallel.h"
#include "rng/philox.h"

#include <math.h>
#include <string.h>

/* Work per part below which starting a thread costs more than it saves. */
#define MIN_FLOPS_PER_THREAD (1u << 18)

/* The factor dropout gave weight e of the (B, Hq, T, S) weights: 1 / (1 -
 * p) rounded to float for float tensors, in double for double ones (f64). */
static double drop_factor(const attn_attention_dropout *drop, uint64_t e, bool f64) {
    if (!drop) return 1.0;
    double kept = f64 ? drop->kept_scale_f64 : (double)drop->kept_scale;
    switch (drop->kind) {
    case ATTN_DROP_BITS:
        return attn_bit(drop->keep_bits, (size_t)e) ? kept : 0.0;
    case ATTN_DROP_PHILOX:
        return attn_philox_dropout_word(drop->seed, drop->offset, e) < drop->keep_threshold
                   ? kept
                   : 0.0;
    case ATTN_DROP_NONE:
        break;
    }
    return 1.0;
}

static bool has_dropout(const attn_attention_dropout *drop) {
    return drop && drop->kind != ATTN_DROP_NONE;
}

/* ---- rows of the packed or dense batch ----------------------------------- */

/* First token of sequence b in the q (kv: false) or kv tensors' row order:
 * b * T (dense) or cu_seqlens[b]. */
static size_t seq_begin(const attn_attention_problem *p, size_t b, bool kv) {
    const int32_t *cu = kv ? p->cu_seqlens_kv : p->cu_seqlens_q;
    if (cu) return (size_t)cu[b];
    return b * (kv ? p->kv_len : p->q_len);
}

/* Rows of the flattened (b, head, token) order: heads x tokens. */
static size_t row_count(const attn_attention_problem *p, size_t heads, bool kv) {
    return heads * (seq_begin(p, p->batch, kv) - seq_begin(p, 0, kv));
}

/* Row r of that order as (b, head, token): sequence b holds rows
 * [heads * begin(b), heads * begin(b + 1)), head-major inside. */
static void decode_row(const attn_attention_problem *p, size_t heads, bool kv, size_t r,
                       size_t *b, size_t *head, size_t *t) {
    r += heads * seq_begin(p, 0, kv);
    size_t token = r / heads, lo = 0, hi = p->batch; /* begin(lo) <= token < begin(hi) */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (seq_begin(p, mid, kv) <= token) lo = mid;
        else hi = mid;
    }
    size_t begin = seq_begin(p, lo, kv), len = seq_begin(p, lo + 1, kv) - begin;
    size_t local = r - heads * begin;
    *b = lo;
    *head = local / len;
    *t = local % len;
}

/* The score s_ij of one visible-or-not key (modifiers, no mask); *t_out
 * gets tanh(x / softcap) when softcap is on. */
static double modified_score(const attn_attention_problem *p, double softcap, size_t h,
                             int64_t pos, size_t j, double x, double *t_out) {
    double s = x;
    if (softcap > 0.0) {
        double t = tanh(x / softcap);
        s = softcap * t;
        if (t_out) *t_out = t;
    }
    if (p->alibi_slopes) {
        int64_t dist = pos - (int64_t)j;
        s -= (double)p->alibi_slopes[h] * (double)(dist < 0 ? -dist : dist);
    }
    return s;
}

/* ---- programmable attention: block maps and score modifiers -------------- */

/* The index of key block kb in the ascending blocks[begin, end), or
 * SIZE_MAX. */
static size_t find_block(const uint32_t *blocks, size_t begin, size_t end, uint32_t kb) {
    while (begin < end) {
        size_t mid = begin + (end - begin) / 2;
        if (blocks[mid] == kb) return mid;
        if (blocks[mid] < kb) begin = mid + 1;
        else end = mid;
    }
    return SIZE_MAX;
}

/* Whether the block map lets query i of (b, h) see key j. */
static bool map_sees(const attn_block_map *m, size_t b, size_t h, size_t i, size_t j) {
    size_t r = attn_block_map_row(m, b, h, i / m->block_q);
    uint32_t kb = (uint32_t)(j / m->block_kv);
    if (find_block(m->full, m->full_at[r], m->full_at[r + 1], kb) != SIZE_MAX) return true;
    size_t e = find_block(m->part, m->part_at[r], m->part_at[r + 1], kb);
    return e != SIZE_MAX &&
           attn_block_map_bit(m, m->part_tile[e], i % m->block_q, j % m->block_kv);
}

/* Whether query i of (b, h) sees key j, given its keys [first, last) of
 * attn_visible_keys. */
static bool sees(const attn_attention_problem *p, size_t b, size_t h, size_t i, size_t j,
                 size_t first, size_t last) {
    return j >= first && j < last && (!p->block_map || map_sees(p->block_map, b, h, i, j));
}

/* Whether query i of (b, h) sees any key of [first, last). */
static bool sees_any(const attn_attention_problem *p, size_t b, size_t h, size_t i,
                     size_t first, size_t last) {
    for (size_t j = first; j < last; j++)
        if (sees(p, b, h, i, j, first, last)) return true;
    return false;
}

/* T5's bucket of relative_position = kv_idx - q_idx, as Hugging Face's
 * T5Attention._relative_position_bucket computes it, in float32 where it
 * does (the log of the ratio, its quotient and product) so that positions
 * on a bucket's edge fall where they fall there. */
static size_t t5_bucket(int64_t relative_position, const attn_score_mod *m) {
    int64_t buckets = (int64_t)m->buckets, bucket = 0, rp = relative_position;
    if (m->bidirectional) {
        buckets /= 2;
        if (rp > 0) bucket += buckets;
        rp = rp < 0 ? -rp : rp;
    } else {
        rp = rp < 0 ? -rp : 0;
    }
    int64_t max_exact = buckets / 2;
    if (rp < max_exact) return (size_t)(bucket + rp);
    float ratio = (float)rp / (float)max_exact;
    float range = (float)log((double)m->max_distance / (double)max_exact);
    float scaled = logf(ratio) / range * (float)(buckets - max_exact);
    int64_t large = max_exact + (int64_t)scaled;
    if (large > buckets - 1) large = buckets - 1;
    return (size_t)(bucket + large);
}

/* A relative modifier's element of a head's row for relative_position =
 * kv_idx - q_idx: T5's bucket, or a REL_TABLE's index. */
static size_t rel_bucket(int64_t relative_position, const attn_score_mod *m) {
    return m->kind == ATTN_SCORE_REL_TABLE ? attn_rel_table_index(m, relative_position)
                                           : t5_bucket(relative_position, m);
}

/* The element of a BIAS modifier's tensor that (b, h, i, j) reads. */
static size_t bias_at(const attn_score_mod *m, size_t b, size_t h, size_t i, size_t j) {
    return b * m->strides[0] + h * m->strides[1] + i * m->strides[2] + j * m->strides[3];
}

/* Doubles of the backward's sums for modifier k's tensor_grad (0: none
 * wanted). */
static size_t mod_grad_doubles(const attn_attention_problem *p, size_t k) {
    const attn_score_mod *m = &p->score_mods[k];
    if (!m->tensor_grad) return 0;
    return attn_score_mod_relative(m->kind) || m->kind == ATTN_SCORE_BIAS
               ? attn_score_mod_elements(p, m)
               : 0;
}

/* Where modifier k's sums start, and all of them. */
static size_t mod_grad_offset(const attn_attention_problem *p, size_t k) {
    size_t at = 0;
    for (size_t e = 0; e < k; e++) at += mod_grad_doubles(p, e);
    return at;
}

/* The first callback that failed in a part's rows (failed false: none). */
typedef struct chain_failure {
    bool failed, backward;
    int code; /* what the callback returned */
    size_t mod, b, h, q0, kv0, cols;
} chain_failure;

/* Per part, a chain needs its inputs of the row's keys (one run of S per
 * modifier, kept for the backward), two float tiles of S (S doubles) and
 * its failure record. */
#define FAILURE_DOUBLES ((sizeof(chain_failure) + sizeof(double) - 1) / sizeof(double))
static size_t chain_doubles(const attn_attention_problem *p) {
    if (!p->score_mod_count) return 0;
    return (p->score_mod_count + 1) * p->kv_len + FAILURE_DOUBLES;
}

/* Every part's failure record (at doubles `at` of each part of
 * part_doubles) cleared before a pass, a part that gets no rows included. */
static void clear_failures(const attn_ctx *ctx, const attn_attention_problem *p,
                           double *workspace, size_t part_doubles, size_t at) {
    if (!p->score_mod_count) return;
    for (size_t part = 0; part < attn_parallel_parts(ctx->num_threads); part++)
        ((chain_failure *)(workspace + part * part_doubles + at))->failed = false;
}

/* After a pass: NULL, or, when a callback failed, attn_pass_failed with the
 * first failing part's message left in the ctx (the runner returns it). */
static const char *report_failure(attn_ctx *ctx, const attn_attention_problem *p,
                                  const double *workspace, size_t part_doubles, size_t at) {
    if (!p->score_mod_count) return NULL; /* no callback, no record */
    for (size_t part = 0; part < attn_parallel_parts(ctx->num_threads); part++) {
        const chain_failure *f = (const chain_failure *)(workspace + part * part_doubles + at);
        if (!f->failed) continue;
        /* the flex kernels' words (flex.c), for a tile of one row */
        attn_fail(ctx, ATTN_ERR_INVALID,
                  "score_mods[%zu] (callback) %s returned %d on the tile of batch %zu, head "
                  "%zu, queries %zu..%zu, keys %zu..%zu",
                  f->mod, f->backward ? "grad_fn" : "fn", f->code, f->b, f->h, f->q0, f->q0,
                  f->kv0, f->kv0 + f->cols - 1);
        return attn_pass_failed;
    }
    return NULL;
}

/* ---- workspace ------------------------------------------------------------- */

static size_t cache_forward_bytes(const attn_ctx *ctx, const attn_attention_problem *p);

/* Per part: the row's S scores and one more, then the chain's room (its
 * failure record last). */
static size_t forward_part_doubles(const attn_attention_problem *p) {
    return p->kv_len + 1 + chain_doubles(p);
}

static size_t forward_failure_at(const attn_attention_problem *p) {
    return p->kv_len + 1 + (p->score_mod_count + 1) * p->kv_len;
}

static size_t reference_forward_bytes(const attn_ctx *ctx, const attn_attention_problem *p,
                                      const attn_attention_trace *trace) {
    (void)trace;
    if (p->kv_cache) return cache_forward_bytes(ctx, p);
    return attn_parallel_parts(ctx->num_threads) * forward_part_doubles(p) * sizeof(double);
}

/*
 * The backward, by recomputation (no T x T buffer), in two passes, each
 * parallel and each output written by one item in a fixed order:
 *   1. per query row i: P_i, dP_ij = (dO_i . v_j) * drop_ij,
 *      delta_i = sum_j P_ij dP_ij (less dlse_i: d lse_i / d s_ij = P_ij),
 *      dS_ij = P_ij (dP_ij - delta_i)
 *      (times 1 - tanh^2(x_ij / softcap) with softcap),
 *      dq_i = scale sum_j dS_ij k_j; keeps lse_i and delta_i.
 *      With backward_from_lse, P_ij = exp(s_ij - lse_i) from the given lse
 *      and delta_i = dO_i . O_i (less dlse_i) from the given out: the row's
 *      statistics over all its keys, of which these are one block.
 *   2. per key row j of KV head g: over the group's query heads, then their
 *      rows, dv_j = sum P_ij drop_ij dO_i, dk_j = scale sum dS_ij q_i.
 * then dsinks_h = -sum_(b, i) exp(sink_h - lse_i) delta_i (with
 * backward_from_lse: the whole rows' gradient, the same from every block).
 * Sums run over hidden entries too where PyTorch's matmuls do, so NaN in
 * dout spreads exactly as in autograd.
 */
/* Per part: P, dP and tanh or the chain's gradient (S each), then acc (D)
 * in pass 1; acc_k (D) and acc_v (Dv) in pass 2; then the chain's room
 * (at part_chain_at). */
static size_t part_chain_at(const attn_attention_problem *p) {
    return 3 * p->kv_len + 2 * p->head_dim + p->v_head_dim + 1;
}

static size_t part_doubles(const attn_attention_problem *p) {
    return part_chain_at(p) + chain_doubles(p);
}

static size_t backward_failure_at(const attn_attention_problem *p) {
    return part_chain_at(p) + (p->score_mod_count + 1) * p->kv_len;
}

/* Stats (lse, delta and lse's low part per row), the parts, then the
 * modifiers' tensor_grad sums. */
static size_t reference_backward_bytes(const attn_ctx *ctx, const attn_attention_problem *p) {
    size_t doubles = 3 * attn_lse_rows(p) + attn_parallel_parts(ctx->num_threads) * part_doubles(p) +
                     mod_grad_offset(p, p->score_mod_count);
    return doubles * sizeof(double);
}

/* ---- the passes, for float and for double tensors ---------------------------- */

/* The gradient of the loss in row stat's lse (0 without dlse). */
static double dlse_of(const attn_attention_problem *p, size_t stat) {
    return p->dlse_f64 ? p->dlse_f64[stat] : p->dlse ? (double)p->dlse[stat] : 0.0;
}

typedef struct ref_f32_tensors {
    const float *q, *k, *v;
    float *out, *lse;
    const float *dout;
    float *dq, *dk, *dv;
    double scale, softcap;
} ref_f32_tensors;

typedef struct ref_f64_tensors {
    const double *q, *k, *v;
    double *out, *lse;
    const double *dout;
    double *dq, *dk, *dv;
    double scale, softcap; /* the caller's, unrounded (scale_f64, softcap_f64) */
} ref_f64_tensors;

#define REAL float
#define REF_TENSORS ref_f32_tensors
#define REF(n) ref_f32_##n
#include "attention/reference_impl.h"
#undef REAL
#undef REF_TENSORS
#undef REF

#define REAL double
#define REF_TENSORS ref_f64_tensors
#define REF(n) ref_f64_##n
#include "attention/reference_impl.h"
#undef REAL
#undef REF_TENSORS
#undef REF

/* ---- keys from a KV cache: new rows against cached positions ------------------------ */

/* The problem's keys from a cache (attn_kv_cache_view), a row at a time:
 * packed row r of every query head, softmax(s) @ v over the positions it
 * sees (causal, the window, a tree, a block map whose rows and columns are
 * positions; and the head's sink), s = softcap(q . k * scale) - alibi_h
 * (pos - j), in double, rounded once. A NaN or infinite q . k * scale makes
 * the row NaN before softcap could make it finite (attn.h, the KV cache). */
typedef struct cache_job {
    const attn_attention_problem *p;
    double *scratch; /* per part: positions + D doubles */
    size_t part_doubles;
} cache_job;

/* KV head kh's row of position pos of sequence b in one of K and V (st),
 * read back into x (D floats). */
static void cache_key(const attn_attention_problem *p, const attn_kv_stored *st, size_t b,
                      size_t pos, size_t kh, float *x) {
    const attn_kv_cache_view *c = p->kv_cache;
    attn_kv_format f = attn_kv_format_of(st->dtype, p->head_dim);
    const void *codes = st->pool;
    const float *scales = st->pool_scales;
    size_t row = pos >= c->cached[b] ? c->row_start[b] + pos - c->cached[b]
                                     : attn_kv_cache_row(c, b, pos);
    if (pos >= c->cached[b]) {
        codes = st->fresh;
        scales = st->fresh_scales;
    }
    size_t head = row * p->kv_heads + kh;
    const uint8_t *h = (const uint8_t *)codes + head * f.head_bytes;
    const float *hs = f.head_scales ? scales + head * f.head_scales : NULL;
    for (size_t e = 0; e < p->head_dim; e++) x[e] = attn_kv_read(&f, h, hs, e);
}

/* Whether packed row row of sequence b is kept from position pos by the
 * cache view's tree of draft tokens (new positions only). */
static bool tree_hides(const attn_kv_cache_view *c, size_t row, size_t b, size_t pos) {
    if (!c->tree || pos < c->cached[b]) return false;
    size_t j = pos - c->cached[b];
    return !((c->tree[row * c->tree_words + (j >> 6)] >> (j & 63)) & 1u);
}

/* Whether packed row row of sequence b, at position pos, is kept from key
 * position j under query head h: by the cache view's tree of draft tokens
 * (new positions only) or by the block map, whose rows are positions. */
static bool cache_hides(const attn_attention_problem *p, size_t row, size_t b, size_t h,
                        size_t pos, size_t j) {
    return tree_hides(p->kv_cache, row, b, j) ||
           (p->block_map && !map_sees(p->block_map, b, h, pos, j));
}

static void cache_rows(void *arg, size_t part, size_t begin, size_t end) {
    const cache_job *job = arg;
    const attn_attention_problem *p = job->p;
    const attn_kv_cache_view *c = p->kv_cache;
    size_t H = p->q_heads, D = p->head_dim, G = H / p->kv_heads;
    double *w = job->scratch + part * job->part_doubles, *o = w + job->part_doubles - 2 * D;
    float *x = (float *)(o + D); /* one row of K or V, D floats */
    for (size_t row = begin; row < end; row++) {
        size_t b = 0;
        while (b < p->batch && !(row >= c->row_start[b] && row < c->row_start[b] + c->new_rows[b]))
            b++;
        if (b == p->batch) continue; /* a row of no sequence of this problem */
        size_t r = row - c->row_start[b], pos = c->cached[b] + r;
        size_t W = p->window ? (size_t)p->window_left + 1 : 0;
        size_t lo = W && pos + 1 > W ? pos + 1 - W : 0, hi = pos + 1;
        for (size_t h = 0; h < H; h++) {
            const float *q = (const float *)p->q.data + (row * H + h) * D;
            size_t kh = h / G;
            double mx = -INFINITY, sum = 0.0;
            bool bad = false; /* a non-finite score makes the row NaN, as the kernels do */
            for (size_t j = lo; j < hi; j++) {
                if (cache_hides(p, row, b, h, pos, j)) continue;
                cache_key(p, &c->k, b, j, kh, x);
                double dotp = 0.0;
                for (size_t e = 0; e < D; e++) dotp += (double)q[e] * x[e];
                double raw = dotp * p->scale_f64;
                bad |= !isfinite(raw);
                w[j - lo] = modified_score(p, p->softcap_f64, h, (int64_t)pos, j, raw, NULL);
                if (w[j - lo] > mx) mx = w[j - lo];
            }
            double sink = p->sinks ? (double)p->sinks[h] : -INFINITY;
            if (sink > mx) mx = sink;
            for (size_t e = 0; e < D; e++) o[e] = 0.0;
            for (size_t j = lo; j < hi; j++) {
                if (cache_hides(p, row, b, h, pos, j)) continue;
                cache_key(p, &c->v, b, j, kh, x);
                double e_j = exp(w[j - lo] - mx);
                sum += e_j;
                for (size_t e = 0; e < D; e++) o[e] += e_j * x[e];
            }
            if (p->sinks) sum += exp(sink - mx); /* in the denominator, no value */
            float *y = (float *)p->out.data + (row * H + h) * D;
            /* sum 0: the row sees no key and has no sink (zeros) */
            for (size_t e = 0; e < D; e++)
                y[e] = bad ? NAN : sum > 0.0 ? (float)(o[e] / sum) : 0.0f;
        }
    }
}

/* The packed rows up to the last new one, and the most keys a row sees. */
static size_t cache_extent(const attn_attention_problem *p, size_t *max_keys) {
    const attn_kv_cache_view *c = p->kv_cache;
    size_t rows = 0;
    *max_keys = 0;
    for (size_t b = 0; b < p->batch; b++) {
        if (!c->new_rows[b]) continue;
        if (c->row_start[b] + c->new_rows[b] > rows) rows = c->row_start[b] + c->new_rows[b];
        if (c->cached[b] + c->new_rows[b] > *max_keys) *max_keys = c->cached[b] + c->new_rows[b];
    }
    return rows;
}

static size_t cache_forward_bytes(const attn_ctx *ctx, const attn_attention_problem *p) {
    size_t max_keys;
    cache_extent(p, &max_keys);
    return attn_parallel_parts(ctx->num_threads) * (max_keys + 2 * p->head_dim) * sizeof(double);
}

static void cache_forward(attn_ctx *ctx, const attn_attention_problem *p, void *workspace) {
    size_t max_keys, rows = cache_extent(p, &max_keys);
    cache_job job = {p, workspace, max_keys + 2 * p->head_dim};
    attn_parallel_for_parts(ctx->num_threads, rows, 1, cache_rows, &job);
}

/* ---- the backend: float32 and float64 views ------------------------------------- */

static const char *reference_forward(attn_ctx *ctx, const attn_attention_problem *p,
                                     const attn_attention_dropout *drop,
                                     const attn_attention_trace *trace, void *workspace) {
    if (p->kv_cache) {
        cache_forward(ctx, p, workspace);
        return NULL;
    }
    if (p->q.dtype == ATTN_DTYPE_F64) {
        ref_f64_tensors t = {.q = p->q.data, .k = p->k.data, .v = p->v.data,
                                .out = p->out.data, .lse = p->lse_f64,
                                .scale = p->scale_f64, .softcap = p->softcap_f64};
        return ref_f64_forward(ctx, p, &t, drop, NULL, workspace);
    }
    ref_f32_tensors t = {.q = p->q.data, .k = p->k.data, .v = p->v.data, .out = p->out.data,
                         .lse = p->lse, .scale = (double)p->scale, .softcap = (double)p->softcap};
    return ref_f32_forward(ctx, p, &t, drop, trace, workspace);
}

static const char *reference_backward(attn_ctx *ctx, const attn_attention_problem *p,
                                      const attn_attention_dropout *drop,
                                      const attn_attention_grads *g, void *workspace) {
    if (p->q.dtype == ATTN_DTYPE_F64) {
        ref_f64_tensors t = {.q = p->q.data, .k = p->k.data, .v = p->v.data,
                                .out = p->out.data, .lse = p->lse_f64, .dout = g->dout,
                                .dq = g->dq, .dk = g->dk, .dv = g->dv,
                                .scale = p->scale_f64, .softcap = p->softcap_f64};
        return ref_f64_backward(ctx, p, &t, drop, g->dsinks, workspace);
    }
    ref_f32_tensors t = {.q = p->q.data, .k = p->k.data, .v = p->v.data, .out = p->out.data,
                         .lse = p->lse, .dout = g->dout, .dq = g->dq, .dk = g->dk, .dv = g->dv,
                         .scale = (double)p->scale, .softcap = (double)p->softcap};
    return ref_f32_backward(ctx, p, &t, drop, g->dsinks, workspace);
}

/* The oracle runs every float32 and float64 problem of the features it
 * names; from a cache, the causal forward (softcap, ALiBi and sinks
 * included). */
static const char *reference_declines(const attn_ctx *ctx, const attn_attention_problem *p,
                                      attn_pass pass) {
    (void)ctx;
    if (p->kv_cache) {
        /* new rows against a cache: causal (a window on the left, a block
         * map over positions), softcap, ALiBi, sinks */
        if (p->q.dtype != ATTN_DTYPE_F32) return "queries of other than float32";
        const char *feature = attn_problem_unsupported(
            p, ATTN_USES_CAUSAL | ATTN_USES_WINDOW | ATTN_USES_KV_CACHE | ATTN_USES_TREE |
                   ATTN_USES_SOFTCAP | ATTN_USES_ALIBI | ATTN_USES_SINKS | ATTN_USES_BLOCK_MAP |
                   ATTN_USES_ROW_INTERVALS);
        if (feature || pass.backward || pass.dropout || pass.traced ||
            p->v_head_dim != p->head_dim)
            return "from a cache it runs the causal forward alone (softcap, ALiBi and sinks "
                   "its only modifiers)";
        return NULL;
    }
    if (p->q.dtype != ATTN_DTYPE_F32 && p->q.dtype != ATTN_DTYPE_F64)
        return "it reads float32 and float64";
    return attn_problem_unsupported(
        p, ATTN_USES_CAUSAL | ATTN_USES_RENORMALIZE | ATTN_USES_WINDOW | ATTN_USES_SOFTCAP |
               ATTN_USES_ALIBI | ATTN_USES_SINKS | ATTN_USES_VARLEN | ATTN_USES_BLOCK_MAP |
               ATTN_USES_ROW_INTERVALS | ATTN_USES_SCORE_MODS | ATTN_USES_LSE_GRAD);
}

const attn_attention_backend attn_attention_reference = {
    .name = "reference",
    .declines = reference_declines,
    .forward_bytes = reference_forward_bytes,
    .backward_bytes = reference_backward_bytes,
    .forward = reference_forward,
    .backward = reference_backward,
};
