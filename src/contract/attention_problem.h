/*
 * attention_problem.h — the one attention contract, at the bottom of the
 * attention layer: what a problem is (shape, typed tensor views, score
 * modifiers, dropout, gradients) and the geometry every backend shares.
 * Kernels include this header and nothing above it; every module, op and
 * public entry point describes its attention as an attn_attention_problem
 * and runs it through the runner (attention/attention.h), which asks the
 * registered backends in order which takes it.
 *
 *   out[b, h, i] = sum_j dropout(P[b, h, i, j]) v[b, h / G, j]
 *   P[b, h, i, :] = softmax over visible keys j (and the head's sink) of
 *       s_ij = softcap(q_i . k_j * scale) - alibi_h |pos_i - j|
 *
 * with G = q_heads / kv_heads consecutive query heads per KV head (GQA,
 * PyTorch's repeat_interleave), query i of a sequence sitting at key
 * position pos_i = i + diagonal, and key j visible to it when
 *   causal:          j <= pos_i
 *   sliding window:  pos_i - left <= j <= pos_i + right  (FlashAttention-2's
 *                    (left, right); a bound of -1 is unbounded; causal caps
 *                    right at 0)
 * A row that sees no key (and has no sink) outputs zeros and lse = -inf,
 * never NaN; with a sink it outputs zeros and lse = the sink.
 */
#ifndef ATTN_ATTENTION_PROBLEM_H
#define ATTN_ATTENTION_PROBLEM_H

#include "contract/block_map.h"
#include "internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct attn_dropout_stream;

/* Element strides of a (batch, token, head) tensor view; each head's
 * features are contiguous. With cu_seqlens the batch stride is 0 and
 * sequence b's rows start at token cu_seqlens[b]. */
typedef struct attn_view_strides {
    size_t b, t, h;
} attn_view_strides;

/* Where a view's elements live. Every backend today runs on host memory;
 * a device backend declines views elsewhere until it registers. */
typedef enum attn_memory {
    ATTN_MEMORY_HOST = 0
} attn_memory;

/* A (batch, token, head, feature) tensor: element (b, t, h, d) at data +
 * b st.b + t st.t + h st.h + d, in elements of dtype (ATTN_DTYPE_F32,
 * _BF16, _F16 or _F64). data NULL: absent. Quantised K/V will add a scales
 * view beside it. */
typedef struct attn_view {
    void *data;
    attn_view_strides st;
    attn_dtype dtype;
    attn_memory memory;
} attn_view;

/* A float view of data with strides st, in host memory. */
static inline attn_view attn_view_f32(const float *data, attn_view_strides st) {
    return (attn_view){(void *)data, st, ATTN_DTYPE_F32, ATTN_MEMORY_HOST};
}
/* Any other dtype's. */
static inline attn_view attn_view_of(const void *data, attn_view_strides st, attn_dtype dtype) {
    return (attn_view){(void *)data, st, dtype, ATTN_MEMORY_HOST};
}

/* Where query rows sit relative to the keys. */
typedef enum attn_diagonal {
    ATTN_DIAGONAL_BOTTOM_RIGHT = 0, /* pos_i = i + S - T: the last query sees every key */
    ATTN_DIAGONAL_TOP_LEFT = 1,     /* pos_i = i (PyTorch's is_causal when T != S) */
    ATTN_DIAGONAL_OFFSET = 2        /* pos_i = i + q_offset (decode, ring blocks) */
} attn_diagonal;

/* K or V of a KV cache, as stored (kv_format.h): per pool row kv_heads rows
 * of the format's codes (pool) and scales (pool_scales); the call's new
 * rows, packed as q, in the same format (fresh, fresh_scales). */
typedef struct attn_kv_stored {
    attn_dtype dtype;
    const void *pool;
    const float *pool_scales;
    const void *fresh;
    const float *fresh_scales;
} attn_kv_stored;

/* K and V of a problem from a KV cache: sequence b's keys are positions
 * 0 .. cached[b] + new_rows[b] - 1, those below cached[b] in the cache's
 * pools, the rest its new rows (k.fresh, v.fresh), which, as q and out,
 * hold sequence b's rows from token row_start[b] on (no batch stride); the
 * problem's k and v views are the same new rows in float32. Position p of
 * sequence b is, contiguous, slot p % capacity of the sequence's block (b *
 * capacity rows into the pools); paged (pages not NULL), logical page p /
 * page_size at its table entry (p / page_size) % table_len, an index into
 * the pools. A contiguous cache is a paged one with one page per sequence:
 * both read through attn_kv_cache_row. */
typedef struct attn_kv_cache_view {
    const size_t *cached, *new_rows, *row_start; /* (batch) each */
    attn_kv_stored k, v;
    size_t capacity;   /* contiguous: slots per sequence */
    const uint32_t *pages; /* paged: (batch, table_len) pool pages */
    size_t page_size, table_len;
    /* A tree of draft tokens (speculative decoding), or NULL: new row r of
     * sequence b sees new row j of its sequence only where bit j % 64 of
     * word j / 64 of tree row row_start[b] + r (tree_words words a row) is
     * set, the cached positions as causal lets it; a row's bits are its
     * ancestors and itself, so they lie within causal's. */
    const uint64_t *tree;
    size_t tree_words;
} attn_kv_cache_view;

/* The pool row of position pos of sequence b (cached there). */
static inline size_t attn_kv_cache_row(const attn_kv_cache_view *c, size_t b, size_t pos) {
    if (!c->pages) return b * c->capacity + pos % c->capacity;
    size_t page = c->pages[b * c->table_len + (pos / c->page_size) % c->table_len];
    return page * c->page_size + pos % c->page_size;
}

typedef struct attn_attention_problem {
    /* ---- shape (T, S: the longest sequence's lengths with cu_seqlens) */
    size_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, v_head_dim;
    /* ---- tensors: q, out (B, Hq, T, D|Dv); k (B, Hkv, S, D), v (B, Hkv, S, Dv).
     * One dtype for all four (the backends' passes read and write it);
     * out.data NULL: a forward that writes lse alone. */
    attn_view q, k, v, out;
    /* optional (B, Hq, T), or (Hq, total_q) with cu_seqlens: see attn_lse_index;
     * float, or double in lse_f64 for a problem of ATTN_DTYPE_F64 views */
    float *lse;
    double *lse_f64;
    /* optional, the backward's, lse's layout and type: the gradient of a loss
     * in lse as well as in out; each row's scores' gradients gain dlse_i
     * P_ij (d lse_i / d s_ij), which is delta_i less dlse_i */
    const float *dlse;
    const double *dlse_f64;
    /* optional, lse's layout: lse's rounding error (the exact lse less the
     * float one), written by the forward and read by the backward, whose
     * weights exp(s - lse) then stay exact where lse is large: a float lse
     * of 400 is off by up to 1.5e-5, and so is every weight of the row. The
     * modules keep it; the public calls, like PyTorch, keep lse alone. */
    float *lse_lo;
    /* optional, two floats a row at 2 * attn_lse_index: the fused forward's
     * own statistics of the row, the max m it subtracted from its scores (in
     * its tiles' units: one of the scores) and the row's divisor l (the
     * float it divides o by), from which the fused backward takes each
     * weight as the forward did,
     * 2^((s - m) c - log2 l), rounded relative to s - m however large the
     * logits. lse and lse_lo cannot give that: their sum carries 48 bits, an
     * exponent off by |lse| 2^-48 (1e15 at lse = 1e30). After every other
     * forward the runner marks the rows (m NaN, l ATTN_ROW_STATS_FOREIGN):
     * that lse is the other kernel's, from scores the fused ones do not
     * round alike (the reference's in double), so the fused backward
     * declines such rows and the backward runs where the forward ran.
     * The modules keep it; the backward ignores it with backward_from_lse. */
    float *row_stats;
    /* ---- score modifiers: zero (false, NULL) is off */
    float scale;                  /* applied first: q . k * scale */
    double scale_f64, softcap_f64; /* scale and softcap as given, unrounded: what
                                      float64 tensors compute with */
    bool causal;
    bool renormalize;             /* causal by the seeds' renormalising mask (reference only;
                                     equal to -inf masking where both are finite) */
    attn_diagonal diagonal;
    int64_t q_offset;             /* with ATTN_DIAGONAL_OFFSET */
    bool window;                  /* sliding window (window_left, window_right) */
    int64_t window_left, window_right; /* -1: unbounded on that side */
    float softcap;                /* s = softcap * tanh(s / softcap) */
    const float *alibi_slopes;    /* (Hq): s -= slope_h * |pos_i - j| */
    const float *sinks;           /* (Hq): a logit in each row's softmax denominator */
    /* packed variable-length batches: (batch + 1) offsets into the tokens of
     * q/out and of k/v; q_len and kv_len are then the longest lengths */
    const int32_t *cu_seqlens_q, *cu_seqlens_kv;
    size_t total_q; /* cu_seqlens_q[batch] (the lse layout with cu_seqlens) */
    /* K and V from a KV cache (NULL: k and v hold every key): q_len and
     * kv_len are then the longest new rows and the longest sequence */
    const attn_kv_cache_view *kv_cache;
    /* The backward takes P = exp(s - lse) from the given lse and delta =
     * dout . out from the given out, instead of what these keys alone give:
     * the gradients of one block of keys of a longer row (ring attention,
     * split KV), whose lse and out are the whole row's. The fused backend
     * always works this way; the reference recomputes unless this is set. */
    bool backward_from_lse;
    /* ---- programmable attention (NULL, 0: off) */
    /* the keys each query sees, ANDed with causal and window: per (b, h,
     * query block) the key blocks to visit (contract/block_map.h). With
     * cu_seqlens it is in each sequence's own positions: query i and key j
     * of sequence b are the map's (b or 0, h, i, j), its q_len and kv_len at
     * least every sequence's (blocks past a sequence are never read). Over
     * a KV cache its rows and columns are absolute positions: new row i of
     * sequence b is map row cached[b] + i (its position pos_i), key j map
     * column j, so that one map serves every step; its q_len and kv_len
     * cover every position the problem reaches. */
    const attn_block_map *block_map;
    /* applied in order to q . k * scale, in place of softcap and alibi_slopes
     * (the problem has none of those with a chain); with cu_seqlens their
     * positions are each sequence's own, as the map's: ALiBi's and T5's
     * q_idx and kv_idx, a bias's (b, h, q_idx, kv_idx), a callback's tile */
    const attn_score_mod *score_mods;
    size_t score_mod_count;
    /* ---- context parallelism over heads: the KV heads of the whole
     * problem this one holds a slice of (0: kv_heads). A backend whose
     * choice of path counts heads counts these, so that each head's bits
     * are the ones the whole problem gives it. */
    size_t whole_kv_heads;
    /* What the backends that decide by the values read of that whole
     * problem, or NULL: max |x| of its q, k, v and dout (inf where one is
     * not finite; 0 for a tensor the pass does not read), whether its
     * given lse holds a NaN (nonzero), and the largest |lse| of its rows
     * that see a key (0 without lse). A backend takes or declines this
     * slice, and takes its own lse or the given one, as it would for the
     * whole problem, so that each head's bits are the whole problem's for
     * any values. */
    const float *whole_tops; /* (6) */
} attn_attention_problem;

/* Whether modifier kind reads a (heads, buckets) table by the distance
 * kv_idx - q_idx: T5's buckets or a plain relative table. */
static inline bool attn_score_mod_relative(attn_score_mod_kind kind) {
    return kind == ATTN_SCORE_REL_BIAS || kind == ATTN_SCORE_REL_TABLE;
}

/* A REL_TABLE modifier's element of its head's row for the distance rel =
 * kv_idx - q_idx (in range: the runner checks the problem's extremes). */
static inline size_t attn_rel_table_index(const attn_score_mod *m, int64_t rel) {
    int64_t e = (m->signed_distance ? rel : -rel) + m->offset;
    return (size_t)(e < 0 ? e + (int64_t)m->buckets : e);
}

/* What a problem uses beyond plain scaled dot products, a bit each: a
 * backend names those it runs and declines the rest by name
 * (attn_problem_unsupported), so that a modifier added to the problem is
 * declined by every backend that does not list it. */
enum {
    ATTN_USES_CAUSAL = 1u << 0,
    ATTN_USES_RENORMALIZE = 1u << 1,
    ATTN_USES_WINDOW = 1u << 2,
    ATTN_USES_SOFTCAP = 1u << 3,
    ATTN_USES_ALIBI = 1u << 4,
    ATTN_USES_SINKS = 1u << 5,
    ATTN_USES_VARLEN = 1u << 6,
    ATTN_USES_KV_CACHE = 1u << 7,
    ATTN_USES_BLOCK_MAP = 1u << 8,     /* a block map with partial tiles' bits */
    ATTN_USES_ROW_INTERVALS = 1u << 9, /* a block map whose rows are single intervals
                                          (what attn_visible_keys reads) */
    ATTN_USES_SCORE_MODS = 1u << 10,
    ATTN_USES_TREE = 1u << 11,         /* a KV cache's new rows masked by a tree */
    ATTN_USES_LSE_GRAD = 1u << 12,     /* the backward's dlse */
    ATTN_USES_COUNT = 13
};

static inline unsigned attn_problem_uses(const attn_attention_problem *p) {
    return (p->causal ? ATTN_USES_CAUSAL : 0u) | (p->renormalize ? ATTN_USES_RENORMALIZE : 0u) |
           (p->window ? ATTN_USES_WINDOW : 0u) | (p->softcap > 0.0f ? ATTN_USES_SOFTCAP : 0u) |
           (p->alibi_slopes ? ATTN_USES_ALIBI : 0u) | (p->sinks ? ATTN_USES_SINKS : 0u) |
           (p->cu_seqlens_q ? ATTN_USES_VARLEN : 0u) | (p->kv_cache ? ATTN_USES_KV_CACHE : 0u) |
           (p->block_map ? (p->block_map->row_lo ? ATTN_USES_ROW_INTERVALS : ATTN_USES_BLOCK_MAP)
                         : 0u) |
           (p->score_mod_count ? ATTN_USES_SCORE_MODS : 0u) |
           (p->kv_cache && p->kv_cache->tree ? ATTN_USES_TREE : 0u) |
           (p->dlse || p->dlse_f64 ? ATTN_USES_LSE_GRAD : 0u);
}

/* The first thing p uses outside supported (ATTN_USES_* bits), by name,
 * or NULL when it uses nothing else. */
static inline const char *attn_problem_unsupported(const attn_attention_problem *p,
                                                   unsigned supported) {
    static const char *const names[ATTN_USES_COUNT] = {
        "causal", "the renormalising mask", "a window", "softcap", "ALiBi", "sinks",
        "packed sequences", "K and V come from a KV cache", "a block mask",
        "a block mask of row intervals", "score modifiers", "a tree of draft tokens",
        "a gradient of lse"};
    unsigned extra = attn_problem_uses(p) & ~supported;
    for (unsigned i = 0; i < ATTN_USES_COUNT; i++)
        if (extra & (1u << i)) return names[i];
    return NULL;
}

/* A consistent delta where a row's weights are nearly one-hot, in every
 * fused backward. They take delta_i = dO_i . O_i from the forward's out, as
 * FlashAttention does, and it rounds differently from the tiles' dP_ij =
 * dO_i . v_j. Where one weight P_ij* is near 1, dS_ij* = P (dP_ij* -
 * delta_i) is a small difference of the two, so their mismatch (a few
 * roundings of |dP|, or bf16's rounding of O) becomes its error, amplified
 * by 1 / (1 - P_ij*), where PyTorch's math path sums delta from its own P
 * and dP (docs/exactness.md). So a backward sums, per row, resid_i = sum_j dS_ij (zero in exact
 * arithmetic, as sum_j P_ij = 1) and finds the largest weight and its key
 * (attn_row_peak). A row whose weight passes ATTN_ONE_HOT_WEIGHT then takes
 * delta_i + resid_i = sum_j P_ij dP_ij, the delta of the tiles' own P and
 * dP: its dS falls by P_ij resid_i, which to within a rounding only j*
 * carries, so dq_i and dk_j* change by c k_j* and c q_i (c = P_ij* resid_i,
 * times softcap's factor there), O(D) per row; a backward that has the
 * row's sums before its key pass may take the new delta there instead.
 * Rows below the weight lose at most 2x delta's rounding; the float
 * kernels give them the new delta too (flash_kernel.h,
 * take_consistent_delta; the flex kernels' dq and dk, flex_kernel.h,
 * consistent_dq, spread_block), for keys that share a large component. Not with
 * sinks (their weight is outside sum_j P_ij), for one block of keys of a
 * longer row (backward_from_lse: no row is whole) or with dlse (resid_i is
 * then dlse_i, not zero). */
#define ATTN_ONE_HOT_WEIGHT 0.5f

/* A query row's largest weight P_ij* past ATTN_ONE_HOT_WEIGHT (0 while
 * none is), softcap's factor 1 - t^2 there (1 without softcap) and the key
 * j*; three floats of a workspace. resid_i is summed beside it, in a
 * vector's lanes. */
typedef struct attn_row_peak {
    float weight, factor;
    uint32_t key;
} attn_row_peak;

static inline bool attn_consistent_delta(const attn_attention_problem *p) {
    return !p->sinks && !p->backward_from_lse && !p->dlse && p->kv_len <= UINT32_MAX;
}

/* The dropout of the weights, as every backend applies it: factor 0 or
 * kept_scale per weight, from keep bits (one per (b, h, i, j), see
 * attn_drop_index; set where kept) or from Philox counters keyed by
 * (seed, offset) at the same index (rng/philox.h). */
typedef enum attn_drop_kind {
    ATTN_DROP_NONE = 0,
    ATTN_DROP_BITS,
    ATTN_DROP_PHILOX
} attn_drop_kind;

typedef struct attn_attention_dropout {
    attn_drop_kind kind;
    const uint8_t *keep_bits;
    uint64_t seed, offset, keep_threshold; /* a keep_threshold of 0 drops every weight */
    float kept_scale;                      /* float(1 / (1 - p)), as PyTorch's float32 */
    double kept_scale_f64;                 /* 1 / (1 - p) in double: float64 problems */
} attn_attention_dropout;

/* The backward's tensors, of the problem's dtype: dout with out's
 * strides; dq with q's, dk with k's, dv with v's (at kv_heads: the group's
 * gradients summed in a fixed order); dsinks (Hq, float) written when the
 * problem has sinks. */
typedef struct attn_attention_grads {
    const void *dout;
    void *dq, *dk, *dv;
    float *dsinks;
} attn_attention_grads;

/* Optional (B, Hq, T, S) copies the reference forward writes for tracing:
 * scores after modifiers and mask, weights, weights after dropout. */
typedef struct attn_attention_trace {
    float *scores, *weights, *dropped;
} attn_attention_trace;

/* ---- the geometry every backend shares ---------------------------------- */

/* One sequence of the batch. */
typedef struct attn_attention_seq {
    size_t b;                 /* its index in the batch */
    size_t q_len, kv_len;     /* this sequence's T and S */
    size_t q_start, kv_start; /* its first token in the packed tensors (0 unless varlen) */
    int64_t diagonal;         /* pos_i = i + diagonal */
} attn_attention_seq;

static inline attn_attention_seq attn_attention_seq_of(const attn_attention_problem *p,
                                                       size_t b) {
    attn_attention_seq s = {b, p->q_len, p->kv_len, 0, 0, 0};
    if (p->kv_cache) {
        const attn_kv_cache_view *c = p->kv_cache;
        s.q_len = c->new_rows[b];
        s.q_start = s.kv_start = c->row_start[b];
        s.kv_len = c->cached[b] + s.q_len;
    } else if (p->cu_seqlens_q) {
        s.q_start = (size_t)p->cu_seqlens_q[b];
        s.q_len = (size_t)p->cu_seqlens_q[b + 1] - s.q_start;
        s.kv_start = (size_t)p->cu_seqlens_kv[b];
        s.kv_len = (size_t)p->cu_seqlens_kv[b + 1] - s.kv_start;
    }
    s.diagonal = p->diagonal == ATTN_DIAGONAL_TOP_LEFT ? 0
                 : p->diagonal == ATTN_DIAGONAL_OFFSET ? p->q_offset
                 : (int64_t)s.kv_len - (int64_t)s.q_len;
    return s;
}

/* Element offset of row i of head h of sequence b (start: the sequence's
 * first packed token, see attn_attention_seq). */
static inline size_t attn_view_offset(attn_view_strides s, size_t b, size_t start, size_t h,
                                      size_t i) {
    return b * s.b + (start + i) * s.t + h * s.h;
}

/* The KV head query head h reads. */
static inline size_t attn_kv_head(const attn_attention_problem *p, size_t h) {
    return h / (p->q_heads / p->kv_heads);
}

/* Keys [*begin, *end) of query i are the only ones it may see (clipped to
 * the sequence); begin >= end when it sees none. */
static inline void attn_visible_keys(const attn_attention_problem *p,
                                     const attn_attention_seq *s, size_t i, size_t *begin,
                                     size_t *end) {
    /* |diagonal| <= 2^62 (attn_attention_check) and lengths are far below,
     * so pos fits; the bounds are compared before they are added, so a
     * window of 2^63 - 1 (as good as unbounded) cannot overflow */
    int64_t pos = (int64_t)i + s->diagonal, lo = 0, hi = (int64_t)s->kv_len; /* [lo, hi) */
    if (p->window && p->window_left >= 0 && pos > p->window_left) lo = pos - p->window_left;
    int64_t right = -1;
    if (p->window && p->window_right >= 0) right = p->window_right;
    if (p->causal && (right < 0 || right > 0)) right = 0;
    if (right >= 0 && pos < hi - 1 - right) hi = pos + right + 1;
    if (p->block_map && p->block_map->row_lo) {
        const attn_block_map *m = p->block_map;
        /* over a KV cache the map's rows are positions (pos_i = cached + i) */
        size_t row = p->kv_cache ? (size_t)pos : i;
        size_t at = (m->rows_batch == 1 ? 0 : s->b) * m->q_len + row;
        if (m->row_lo[at] > lo) lo = m->row_lo[at];
        if (m->row_hi[at] < hi) hi = m->row_hi[at];
    }
    if (lo > (int64_t)s->kv_len) lo = (int64_t)s->kv_len;
    if (hi < lo) hi = lo;
    *begin = (size_t)lo;
    *end = (size_t)(hi < lo ? lo : hi);
}

/* The flat index of weight (b, h, i, j) in the dropout mask (the (B, Hq,
 * T, S) row-major order of PyTorch's dropout over the weights; with
 * cu_seqlens T and S are the longest lengths). */
static inline uint64_t attn_drop_index(const attn_attention_problem *p, size_t b, size_t h,
                                       size_t i, size_t j) {
    return (((uint64_t)b * p->q_heads + h) * p->q_len + i) * p->kv_len + j;
}

/* The rows of lse: B Hq T, or Hq total_q packed. */
static inline size_t attn_lse_rows(const attn_attention_problem *p) {
    return p->cu_seqlens_q ? p->q_heads * p->total_q : p->batch * p->q_heads * p->q_len;
}

/* A row's row_stats divisor where another forward than the fused one ran
 * (the runner's mark): its lse came from other arithmetic than the fused
 * kernels' scores. */
#define ATTN_ROW_STATS_FOREIGN (-1.0f)

/* The index of row (b, h, i) in lse: (B, Hq, T), or (Hq, total_q) packed. */
static inline size_t attn_lse_index(const attn_attention_problem *p, size_t b, size_t h,
                                    size_t i) {
    if (p->cu_seqlens_q) return h * p->total_q + (size_t)p->cu_seqlens_q[b] + i;
    return (b * p->q_heads + h) * p->q_len + i;
}

#endif /* ATTN_ATTENTION_PROBLEM_H */
