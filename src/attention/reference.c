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
 */
#include "attention/attention.h"

#include "kernels/kernels.h"
#include "parallel.h"
#include "rng/philox.h"

#include <math.h>
#include <string.h>

/* Work per part below which starting a thread costs more than it saves. */
#define MIN_FLOPS_PER_THREAD (1u << 18)

static double dot_double(const float *a, const float *b, size_t n) {
    double sum = 0.0;
    for (size_t d = 0; d < n; d++) sum += (double)a[d] * b[d];
    return sum;
}

/* The factor dropout gave weight e of the (B, Hq, T, S) weights. */
static double drop_factor(const attn_attention_dropout *drop, uint64_t e) {
    if (!drop) return 1.0;
    switch (drop->kind) {
    case ATTN_DROP_BITS:
        return attn_bit(drop->keep_bits, (size_t)e) ? (double)drop->kept_scale : 0.0;
    case ATTN_DROP_PHILOX:
        return attn_philox_dropout_word(drop->seed, drop->offset, e) < drop->keep_threshold
                   ? (double)drop->kept_scale
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
static double modified_score(const attn_attention_problem *p, size_t h, int64_t pos, size_t j,
                             double x, double *t_out) {
    double s = x;
    if (p->softcap > 0.0f) {
        double t = tanh(x / (double)p->softcap);
        s = (double)p->softcap * t;
        if (t_out) *t_out = t;
    }
    if (p->alibi_slopes) {
        int64_t dist = pos - (int64_t)j;
        s -= (double)p->alibi_slopes[h] * (double)(dist < 0 ? -dist : dist);
    }
    return s;
}

/* ---- forward -------------------------------------------------------------- */

typedef struct forward_view {
    const attn_attention_problem *p;
    const attn_attention_dropout *drop;
    const attn_attention_trace *trace;
    double *workspace; /* p->kv_len doubles per part */
} forward_view;

static size_t reference_forward_bytes(const attn_ctx *ctx, const attn_attention_problem *p,
                                      const attn_attention_trace *trace) {
    (void)trace;
    return attn_parallel_parts(ctx->num_threads) * (p->kv_len + 1) * sizeof(double);
}

/* One query row (b, h, i), in double: scores, softmax and weights never
 * round to float. row holds the sequence's S doubles. */
static void forward_row(const forward_view *fv, size_t b, size_t h, size_t i, double *row) {
    const attn_attention_problem *p = fv->p;
    const attn_attention_trace *tr = fv->trace;
    attn_attention_seq seq = attn_attention_seq_of(p, b);
    size_t S = seq.kv_len, D = p->head_dim, Dv = p->v_head_dim, g = attn_kv_head(p, h);
    size_t begin, end;
    attn_visible_keys(p, &seq, i, &begin, &end);
    bool sees_none = begin >= end, renormalize = p->renormalize;
    int64_t pos = (int64_t)i + seq.diagonal;
    const float *q_i = p->q + attn_view_offset(p->q_strides, b, seq.q_start, h, i);
    const float *k = p->k + attn_view_offset(p->k_strides, b, seq.kv_start, g, 0);
    const float *v = p->v + attn_view_offset(p->v_strides, b, seq.kv_start, g, 0);
    float *out_i = p->out + attn_view_offset(p->out_strides, b, seq.q_start, h, i);
    uint64_t trace_row = attn_drop_index(p, b, h, i, 0);

    /* row (S) = s_ij, hidden keys -inf. The renormalising mask (softmax,
     * then zero the hidden keys and divide by the kept sum) is a softmax
     * over the kept scores, so the shift is their max: a far larger hidden
     * score cannot make the kept weights underflow to 0 / 0. A NaN or +inf
     * hidden score still makes the row NaN, as it does in PyTorch. */
    double max = -INFINITY, hidden_max = -INFINITY;
    for (size_t j = 0; j < S; j++) {
        bool hides = j < begin || j >= end;
        if (hides && !renormalize) {
            row[j] = -INFINITY;
        } else {
            double x = dot_double(q_i, k + j * p->k_strides.t, D) * p->scale;
            row[j] = modified_score(p, h, pos, j, x, NULL);
        }
        double *top = hides && renormalize ? &hidden_max : &max;
        if (row[j] > *top || isnan(row[j])) *top = row[j];
        if (tr && tr->scores) tr->scores[trace_row + j] = (float)row[j];
    }
    if (isnan(hidden_max) || hidden_max == INFINITY) max = hidden_max;
    double sink = p->sinks ? (double)p->sinks[h] : -INFINITY;
    if (p->sinks && (sink > max || isnan(sink))) max = sink;

    /* softmax; the renormalising mask then keeps the visible keys */
    double sum = 0.0, kept_sum = 0.0;
    for (size_t j = 0; j < S; j++) {
        row[j] = exp(row[j] - max);
        sum += row[j];
        if (j >= begin && j < end) kept_sum += row[j];
    }
    if (p->sinks) {
        double e = exp(sink - max); /* the sink's share: in the denominator, no value */
        sum += e;
        kept_sum += e;
    }
    double norm = renormalize ? kept_sum : sum;
    if (p->lse) {
        float lse = sees_none ? (p->sinks ? p->sinks[h] : -INFINITY) : (float)(max + log(norm));
        p->lse[attn_lse_index(p, b, h, i)] = lse;
    }
    bool dropping = has_dropout(fv->drop);
    for (size_t j = 0; j < S; j++) {
        bool zero = sees_none || (renormalize && (j < begin || j >= end));
        row[j] = zero ? 0.0 : row[j] / norm;
        if (tr && tr->weights) tr->weights[trace_row + j] = (float)row[j];
        if (dropping) row[j] *= drop_factor(fv->drop, trace_row + j);
        if (tr && tr->dropped) tr->dropped[trace_row + j] = (float)row[j];
    }
    /* out_i (Dv) = row (S) @ v (S, Dv) */
    for (size_t d = 0; d < Dv; d++) {
        double acc = 0.0;
        for (size_t j = 0; j < S; j++) acc += row[j] * v[j * p->v_strides.t + d];
        out_i[d] = (float)acc;
    }
}

static void forward_rows(void *arg, size_t part, size_t begin, size_t end) {
    const forward_view *fv = arg;
    const attn_attention_problem *p = fv->p;
    double *row = fv->workspace + part * (p->kv_len + 1);
    for (size_t r = begin; r < end; r++) {
        size_t b, h, i;
        decode_row(p, p->q_heads, false, r, &b, &h, &i);
        forward_row(fv, b, h, i, row);
    }
}

static void reference_forward(const attn_ctx *ctx, const attn_attention_problem *p,
                              const attn_attention_dropout *drop,
                              const attn_attention_trace *trace, void *workspace) {
    forward_view fv = {p, drop, trace, workspace};
    size_t row_cost = 2 * p->kv_len * (p->head_dim + p->v_head_dim) + 1;
    attn_parallel_for_parts(ctx->num_threads, row_count(p, p->q_heads, false),
                            MIN_FLOPS_PER_THREAD / row_cost + 1, forward_rows, &fv);
}

/* ---- backward -------------------------------------------------------------- */

/*
 * By recomputation (no T x T buffer), in two passes, each parallel and each
 * output written by one item in a fixed order:
 *   1. per query row i: P_i, dP_ij = (dO_i . v_j) * drop_ij,
 *      delta_i = sum_j P_ij dP_ij, dS_ij = P_ij (dP_ij - delta_i)
 *      (times 1 - tanh^2(x_ij / softcap) with softcap),
 *      dq_i = scale sum_j dS_ij k_j; keeps lse_i and delta_i.
 *   2. per key row j of KV head g: over the group's query heads, then their
 *      rows, dv_j = sum P_ij drop_ij dO_i, dk_j = scale sum dS_ij q_i.
 * then dsinks_h = -sum_(b, i) exp(sink_h - lse_i) delta_i.
 * Sums run over hidden entries too where PyTorch's matmuls do, so NaN in
 * dout spreads exactly as in autograd.
 */
typedef struct backward_view {
    const attn_attention_problem *p;
    const attn_attention_dropout *drop;
    const attn_attention_grads *g;
    double *lse, *delta; /* per row at attn_lse_index */
    double *workspace;   /* part_doubles per part */
    size_t part_doubles;
} backward_view;

static size_t stat_rows(const attn_attention_problem *p) {
    return p->cu_seqlens_q ? p->q_heads * p->total_q : p->batch * p->q_heads * p->q_len;
}

/* Per part: P, dP and tanh (S each), then acc (D) in pass 1; acc_k (D) and
 * acc_v (Dv) in pass 2. */
static size_t part_doubles(const attn_attention_problem *p) {
    return 3 * p->kv_len + 2 * p->head_dim + p->v_head_dim + 1;
}

static size_t reference_backward_bytes(const attn_ctx *ctx, const attn_attention_problem *p) {
    size_t doubles = 2 * stat_rows(p) + attn_parallel_parts(ctx->num_threads) * part_doubles(p);
    return doubles * sizeof(double);
}

/* Pass 1, query rows [begin, end) of the flattened (b, h, i). */
static void backward_query_rows(void *arg, size_t part, size_t begin, size_t end) {
    const backward_view *bv = arg;
    const attn_attention_problem *p = bv->p;
    const attn_attention_grads *g = bv->g;
    size_t D = p->head_dim, Dv = p->v_head_dim;
    double *P = bv->workspace + part * bv->part_doubles;
    double *dP = P + p->kv_len, *th = dP + p->kv_len, *acc = th + p->kv_len;
    bool softcap = p->softcap > 0.0f;
    for (size_t r = begin; r < end; r++) {
        size_t b, h, i;
        decode_row(p, p->q_heads, false, r, &b, &h, &i);
        attn_attention_seq seq = attn_attention_seq_of(p, b);
        size_t S = seq.kv_len, kv_head = attn_kv_head(p, h), first, last;
        attn_visible_keys(p, &seq, i, &first, &last);
        int64_t pos = (int64_t)i + seq.diagonal;
        size_t stat = attn_lse_index(p, b, h, i);
        const float *q_i = p->q + attn_view_offset(p->q_strides, b, seq.q_start, h, i);
        const float *dout_i = g->dout + attn_view_offset(p->out_strides, b, seq.q_start, h, i);
        const float *k = p->k + attn_view_offset(p->k_strides, b, seq.kv_start, kv_head, 0);
        const float *v = p->v + attn_view_offset(p->v_strides, b, seq.kv_start, kv_head, 0);
        float *dq_i = g->dq + attn_view_offset(p->q_strides, b, seq.q_start, h, i);
        if (first >= last) {
            /* a row that sees no key output zeros: nothing flows back */
            for (size_t d = 0; d < D; d++) dq_i[d] = 0.0f;
            bv->lse[stat] = p->sinks ? (double)p->sinks[h] : -INFINITY;
            bv->delta[stat] = 0.0;
            continue;
        }
        /* forward: P_i = softmax(mask(s_i)) with the sink, recomputed in double */
        double max = -INFINITY;
        for (size_t j = 0; j < S; j++) {
            if (j < first || j >= last) {
                P[j] = -INFINITY;
            } else {
                double x = dot_double(q_i, k + j * p->k_strides.t, D) * p->scale;
                P[j] = modified_score(p, h, pos, j, x, &th[j]);
            }
            if (P[j] > max || isnan(P[j])) max = P[j];
        }
        double sink = p->sinks ? (double)p->sinks[h] : -INFINITY;
        if (p->sinks && (sink > max || isnan(sink))) max = sink;
        double sum = 0.0;
        for (size_t j = 0; j < S; j++) {
            P[j] = exp(P[j] - max);
            sum += P[j];
        }
        if (p->sinks) sum += exp(sink - max);
        for (size_t j = 0; j < S; j++) P[j] /= sum;
        /* dP_ij = (dO_i . v_j) * drop_ij; hidden entries hold 0 * dO_i, which
         * is NaN exactly when dO_i is not finite, as PyTorch's full matmul. */
        double poison = 0.0;
        for (size_t d = 0; d < Dv; d++) poison += 0.0 * dout_i[d];
        double delta = 0.0;
        for (size_t j = 0; j < S; j++) {
            if (j < first || j >= last) {
                dP[j] = poison;
            } else {
                double dA = dot_double(dout_i, v + j * p->v_strides.t, Dv);
                dP[j] = dA * drop_factor(bv->drop, attn_drop_index(p, b, h, i, j));
            }
            delta += P[j] * dP[j];
        }
        /* dS_ij = P_ij (dP_ij - delta_i); masked_fill's backward zeroes the
         * hidden entries, the renormalising product keeps them (0 or NaN). */
        for (size_t d = 0; d < D; d++) acc[d] = 0.0;
        for (size_t j = first; j < last; j++) {
            double dS = P[j] * (dP[j] - delta);
            if (softcap) dS *= 1.0 - th[j] * th[j]; /* d(c tanh(x / c)) / dx */
            const float *k_j = k + j * p->k_strides.t;
            for (size_t d = 0; d < D; d++) acc[d] += dS * k_j[d];
        }
        /* dq_i = scale * sum_j dS_ij k_j */
        for (size_t d = 0; d < D; d++) dq_i[d] = (float)(acc[d] * p->scale);
        bv->lse[stat] = max + log(sum);
        bv->delta[stat] = delta;
    }
}

/* Pass 2, key rows [begin, end) of the flattened (b, kv head, j). */
static void backward_key_rows(void *arg, size_t part, size_t begin, size_t end) {
    const backward_view *bv = arg;
    const attn_attention_problem *p = bv->p;
    const attn_attention_grads *g = bv->g;
    size_t D = p->head_dim, Dv = p->v_head_dim, G = p->q_heads / p->kv_heads;
    double *acc_k = bv->workspace + part * bv->part_doubles + 3 * p->kv_len;
    double *acc_v = acc_k + D;
    bool softcap = p->softcap > 0.0f;
    for (size_t r = begin; r < end; r++) {
        size_t b, kv_head, j;
        decode_row(p, p->kv_heads, true, r, &b, &kv_head, &j);
        attn_attention_seq seq = attn_attention_seq_of(p, b);
        const float *k_j = p->k + attn_view_offset(p->k_strides, b, seq.kv_start, kv_head, j);
        const float *v_j = p->v + attn_view_offset(p->v_strides, b, seq.kv_start, kv_head, j);
        for (size_t d = 0; d < D; d++) acc_k[d] = 0.0;
        for (size_t d = 0; d < Dv; d++) acc_v[d] = 0.0;
        for (size_t h = kv_head * G; h < kv_head * G + G; h++) {
            for (size_t i = 0; i < seq.q_len; i++) {
                size_t first, last, stat = attn_lse_index(p, b, h, i);
                attn_visible_keys(p, &seq, i, &first, &last);
                const float *q_i = p->q + attn_view_offset(p->q_strides, b, seq.q_start, h, i);
                const float *dout_i =
                    g->dout + attn_view_offset(p->out_strides, b, seq.q_start, h, i);
                double lse = bv->lse[stat], delta = bv->delta[stat];
                if (j < first || j >= last) {
                    /* weight 0: dv_j += 0 * dO_i, as the matmul A^T dO does */
                    for (size_t d = 0; d < Dv; d++) acc_v[d] += 0.0 * dout_i[d];
                    double dS = p->renormalize ? 0.0 * delta : 0.0;
                    if (dS != 0.0 || isnan(dS))
                        for (size_t d = 0; d < D; d++) acc_k[d] += dS * q_i[d];
                    continue;
                }
                /* forward: P_ij = exp(s_ij - lse_i), A_ij = P_ij * drop_ij */
                double th = 0.0, x = dot_double(q_i, k_j, D) * p->scale;
                double P = exp(modified_score(p, h, (int64_t)i + seq.diagonal, j, x, &th) - lse);
                double drop = drop_factor(bv->drop, attn_drop_index(p, b, h, i, j));
                double A = P * drop;
                double dP = dot_double(dout_i, v_j, Dv) * drop;
                double dS = P * (dP - delta);
                if (softcap) dS *= 1.0 - th * th;
                for (size_t d = 0; d < Dv; d++) acc_v[d] += A * dout_i[d];
                for (size_t d = 0; d < D; d++) acc_k[d] += dS * q_i[d];
            }
        }
        /* dv_j = sum_i A_ij dO_i;  dk_j = scale * sum_i dS_ij q_i */
        float *dk_j = g->dk + attn_view_offset(p->k_strides, b, seq.kv_start, kv_head, j);
        float *dv_j = g->dv + attn_view_offset(p->v_strides, b, seq.kv_start, kv_head, j);
        for (size_t d = 0; d < Dv; d++) dv_j[d] = (float)acc_v[d];
        for (size_t d = 0; d < D; d++) dk_j[d] = (float)(acc_k[d] * p->scale);
    }
}

/* dsinks_h = -sum over (b, i) of P_sink delta_i, b then i ascending: the
 * sink's logit s gets dP_sink = 0 (it has no value), so dS = P (0 - delta). */
static void sink_grads(const backward_view *bv) {
    const attn_attention_problem *p = bv->p;
    for (size_t h = 0; h < p->q_heads; h++) {
        double sink = p->sinks[h], sum = 0.0;
        for (size_t b = 0; b < p->batch; b++) {
            attn_attention_seq seq = attn_attention_seq_of(p, b);
            for (size_t i = 0; i < seq.q_len; i++) {
                size_t stat = attn_lse_index(p, b, h, i);
                sum += exp(sink - bv->lse[stat]) * bv->delta[stat];
            }
        }
        bv->g->dsinks[h] = (float)-sum;
    }
}

static void reference_backward(const attn_ctx *ctx, const attn_attention_problem *p,
                               const attn_attention_dropout *drop,
                               const attn_attention_grads *g, void *workspace) {
    size_t rows = stat_rows(p);
    double *stats = workspace;
    backward_view bv = {p, drop, g, stats, stats + rows, stats + 2 * rows, part_doubles(p)};
    size_t G = p->q_heads / p->kv_heads;
    size_t q_cost = 4 * p->kv_len * (p->head_dim + p->v_head_dim) + 1;
    size_t k_cost = 4 * G * p->q_len * (p->head_dim + p->v_head_dim) + 1;
    /* Pass 2 reads every row's lse and delta: pass 1 finishes first. */
    attn_parallel_for_parts(ctx->num_threads, row_count(p, p->q_heads, false),
                            MIN_FLOPS_PER_THREAD / q_cost + 1, backward_query_rows, &bv);
    attn_parallel_for_parts(ctx->num_threads, row_count(p, p->kv_heads, true),
                            MIN_FLOPS_PER_THREAD / k_cost + 1, backward_key_rows, &bv);
    if (p->sinks && g->dsinks) sink_grads(&bv);
}

/* The oracle runs every problem. */
static const char *reference_declines(const attn_ctx *ctx, const attn_attention_problem *p,
                                      bool backward) {
    (void)ctx;
    (void)p;
    (void)backward;
    return NULL;
}

const attn_attention_backend attn_attention_reference = {
    .name = "reference",
    .declines = reference_declines,
    .takes_values = NULL,
    .forward_bytes = reference_forward_bytes,
    .backward_bytes = reference_backward_bytes,
    .forward = reference_forward,
    .backward = reference_backward,
};
