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
 * The passes are written once over the tensors' element type
 * (reference_impl.h), instantiated for float32 and float64 views.
 */
#include "attention/attention.h"

#include "kernels/kernels.h"
#include "parallel.h"
#include "rng/philox.h"

#include <math.h>
#include <string.h>

/* Work per part below which starting a thread costs more than it saves. */
#define MIN_FLOPS_PER_THREAD (1u << 18)

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

/* ---- workspace ------------------------------------------------------------- */

static size_t reference_forward_bytes(const attn_ctx *ctx, const attn_attention_problem *p,
                                      const attn_attention_trace *trace) {
    (void)trace;
    return attn_parallel_parts(ctx->num_threads) * (p->kv_len + 1) * sizeof(double);
}

/*
 * The backward, by recomputation (no T x T buffer), in two passes, each
 * parallel and each output written by one item in a fixed order:
 *   1. per query row i: P_i, dP_ij = (dO_i . v_j) * drop_ij,
 *      delta_i = sum_j P_ij dP_ij, dS_ij = P_ij (dP_ij - delta_i)
 *      (times 1 - tanh^2(x_ij / softcap) with softcap),
 *      dq_i = scale sum_j dS_ij k_j; keeps lse_i and delta_i.
 *      With backward_from_lse, P_ij = exp(s_ij - lse_i) from the given lse
 *      and delta_i = dO_i . O_i from the given out: the row's statistics
 *      over all its keys, of which these are one block.
 *   2. per key row j of KV head g: over the group's query heads, then their
 *      rows, dv_j = sum P_ij drop_ij dO_i, dk_j = scale sum dS_ij q_i.
 * then dsinks_h = -sum_(b, i) exp(sink_h - lse_i) delta_i (with
 * backward_from_lse: the whole rows' gradient, the same from every block).
 * Sums run over hidden entries too where PyTorch's matmuls do, so NaN in
 * dout spreads exactly as in autograd.
 */
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

/* ---- the passes, for float and for double tensors ---------------------------- */

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

/* ---- the backend: float32 and float64 views ------------------------------------- */

static const char *reference_forward(attn_ctx *ctx, const attn_attention_problem *p,
                                     const attn_attention_dropout *drop,
                                     const attn_attention_trace *trace, void *workspace) {
    if (p->q.dtype == ATTN_DTYPE_F64) {
        ref_f64_tensors t = {.q = p->q.data, .k = p->k.data, .v = p->v.data,
                                .out = p->out.data, .lse = p->lse_f64,
                                .scale = p->scale_f64, .softcap = p->softcap_f64};
        ref_f64_forward(ctx, p, &t, drop, NULL, workspace);
        return NULL;
    }
    ref_f32_tensors t = {.q = p->q.data, .k = p->k.data, .v = p->v.data, .out = p->out.data,
                         .lse = p->lse, .scale = (double)p->scale, .softcap = (double)p->softcap};
    ref_f32_forward(ctx, p, &t, drop, trace, workspace);
    return NULL;
}

static const char *reference_backward(attn_ctx *ctx, const attn_attention_problem *p,
                                      const attn_attention_dropout *drop,
                                      const attn_attention_grads *g, void *workspace) {
    if (p->q.dtype == ATTN_DTYPE_F64) {
        ref_f64_tensors t = {.q = p->q.data, .k = p->k.data, .v = p->v.data,
                                .out = p->out.data, .lse = p->lse_f64, .dout = g->dout,
                                .dq = g->dq, .dk = g->dk, .dv = g->dv,
                                .scale = p->scale_f64, .softcap = p->softcap_f64};
        ref_f64_backward(ctx, p, &t, drop, g->dsinks, workspace);
        return NULL;
    }
    ref_f32_tensors t = {.q = p->q.data, .k = p->k.data, .v = p->v.data, .out = p->out.data,
                         .lse = p->lse, .dout = g->dout, .dq = g->dq, .dk = g->dk, .dv = g->dv,
                         .scale = (double)p->scale, .softcap = (double)p->softcap};
    ref_f32_backward(ctx, p, &t, drop, g->dsinks, workspace);
    return NULL;
}

/* The oracle runs every float32 and float64 problem. */
static const char *reference_declines(const attn_ctx *ctx, const attn_attention_problem *p,
                                      attn_pass pass) {
    (void)ctx;
    (void)pass;
    if (p->q.dtype == ATTN_DTYPE_F32 || p->q.dtype == ATTN_DTYPE_F64) return NULL;
    return "it reads float32 and float64";
}

const attn_attention_backend attn_attention_reference = {
    .name = "reference",
    .declines = reference_declines,
    .forward_bytes = reference_forward_bytes,
    .backward_bytes = reference_backward_bytes,
    .forward = reference_forward,
    .backward = reference_backward,
};
