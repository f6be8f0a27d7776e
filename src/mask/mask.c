/*
 * mask.c — mask descriptions (attn.h's attn_mask): immutable trees of
 * primitives and AND, OR, NOT, and the block-map source that reads them.
 *
 * Every primitive but global tokens and documents gives each query row one
 * interval of keys [lo, hi) whose ends never fall as the row grows, so a
 * tile of rows [q0, q1) x keys [k0, k1) is classified from a few rows:
 * full when the last row's lo and the first row's hi cover [k0, k1), empty
 * when the first row that reaches past k0 starts at or past k1. Global
 * tokens are classified from the tile's corners, documents from the runs
 * of their ids (precomputed: where each run ends, whether ids never fall),
 * and rows of documents in order are intervals too. Combinators
 * combine their operands' classes (AND: empty if any is, full if all are;
 * OR the dual; NOT swaps), and whatever stays undecided is PARTIAL, which
 * the builder settles from the bits.
 */
#include "mask/mask.h"

#include <stdlib.h>
#include <string.h>

/* Offsets, window bounds, chunks, lengths and indices stay within 2^62, so
 * that a query's position plus an offset never leaves int64. */
#define MASK_LIMIT ((int64_t)1 << 62)
/* Trees deeper than this are refused: evaluation recurses once per level. */
#define MASK_MAX_DEPTH 256
/* Trees of more nodes than this are refused: a combinator copies its
 * operands, so a mask combined with itself doubles, and every row's
 * evaluation visits each node. */
#define MASK_MAX_NODES 4096
/* row_bits works on up to this many keys at a time (the largest block). */
#define CHUNK_KEYS 256
#define CHUNK_WORDS (CHUNK_KEYS / 64)

typedef enum mask_kind {
    MASK_ALL,
    MASK_CAUSAL,
    MASK_WINDOW,
    MASK_CHUNKED,
    MASK_PREFIX_LM,
    MASK_DOCUMENT,
    MASK_GLOBAL,
    MASK_KV_LENGTH,
    MASK_AND,
    MASK_OR,
    MASK_NOT
} mask_kind;

struct attn_mask {
    mask_kind kind;
    size_t depth;                 /* 1 for a primitive */
    size_t nodes;                 /* of the tree: 1 for a primitive */
    int64_t offset, left, right;  /* causal, window, chunked: offset; window: bounds (-1: none) */
    int64_t size;                 /* chunked: the chunk; global: the tokens */
    int64_t *values;              /* prefix-LM: prefixes; kv_length: lengths */
    size_t count;                 /* of values: 1 or the batch */
    /* documents: (batch, q_len) and (batch, kv_len) ids; run ends (the
     * first index past i with another id, within the sequence); whether
     * each sequence's ids never fall */
    int32_t *q_doc, *kv_doc;
    size_t batch, q_len, kv_len;
    uint32_t *q_run_end, *kv_run_end;
    bool *q_sorted, *kv_sorted;
    attn_mask *a, *b;             /* operands of AND, OR (a, b) and NOT (a) */
};

/* ---- construction -------------------------------------------------------- */

void attn_mask_free(attn_mask *m) {
    if (!m) return;
    attn_mask_free(m->a);
    attn_mask_free(m->b);
    attn_free(m->values);
    attn_free(m->q_doc);
    attn_free(m->kv_doc);
    attn_free(m->q_run_end);
    attn_free(m->kv_run_end);
    attn_free(m->q_sorted);
    attn_free(m->kv_sorted);
    attn_free(m);
}

static attn_status no_memory(attn_ctx *ctx, const char *who) {
    return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for the mask", who);
}

/* The common start of a constructor: *out cleared first (a failure for a
 * NULL ctx too leaves nothing stale), then ctx and out present. */
static attn_status begin(attn_ctx *ctx, const char *who, attn_mask **out) {
    if (out) *out = NULL;
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "%s: out is NULL", who);
    return ATTN_OK;
}

static attn_status check_offset(attn_ctx *ctx, const char *who, const char *name, int64_t v) {
    if (v > MASK_LIMIT || v < -MASK_LIMIT)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: %s (%lld) must be within +-2^62", who, name,
                         (long long)v);
    return ATTN_OK;
}

static attn_status new_node(attn_ctx *ctx, const char *who, mask_kind kind, attn_mask **out) {
    attn_mask *m = attn_calloc(1, sizeof *m);
    if (!m) return no_memory(ctx, who);
    m->kind = kind;
    m->depth = 1;
    m->nodes = 1;
    *out = m;
    return ATTN_OK;
}

attn_status attn_mask_new_all(attn_ctx *ctx, attn_mask **out) {
    const char *who = "attn_mask_new_all";
    attn_status st = begin(ctx, who, out);
    return st != ATTN_OK ? st : new_node(ctx, who, MASK_ALL, out);
}

attn_status attn_mask_new_causal(attn_ctx *ctx, int64_t offset, attn_mask **out) {
    const char *who = "attn_mask_new_causal";
    attn_status st = begin(ctx, who, out);
    if (st == ATTN_OK) st = check_offset(ctx, who, "offset", offset);
    if (st == ATTN_OK) st = new_node(ctx, who, MASK_CAUSAL, out);
    if (st == ATTN_OK) (*out)->offset = offset;
    return st;
}

attn_status attn_mask_new_window(attn_ctx *ctx, int64_t left, int64_t right, int64_t offset,
                                 attn_mask **out) {
    const char *who = "attn_mask_new_window";
    attn_status st = begin(ctx, who, out);
    if (st != ATTN_OK) return st;
    if (left < -1 || right < -1 || left > MASK_LIMIT || right > MASK_LIMIT)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: left (%lld) and right (%lld) must be -1 (unbounded) or 0 .. 2^62",
                         who, (long long)left, (long long)right);
    if ((st = check_offset(ctx, who, "offset", offset)) != ATTN_OK) return st;
    if ((st = new_node(ctx, who, MASK_WINDOW, out)) != ATTN_OK) return st;
    (*out)->left = left;
    (*out)->right = right;
    (*out)->offset = offset;
    return ATTN_OK;
}

attn_status attn_mask_new_chunked(attn_ctx *ctx, size_t chunk, int64_t offset, attn_mask **out) {
    const char *who = "attn_mask_new_chunked";
    attn_status st = begin(ctx, who, out);
    if (st != ATTN_OK) return st;
    if (chunk == 0 || chunk > (size_t)MASK_LIMIT)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: chunk (%zu) must be 1 .. 2^62", who, chunk);
    if ((st = check_offset(ctx, who, "offset", offset)) != ATTN_OK) return st;
    if ((st = new_node(ctx, who, MASK_CHUNKED, out)) != ATTN_OK) return st;
    (*out)->size = (int64_t)chunk;
    (*out)->offset = offset;
    return ATTN_OK;
}

/* prefix-LM and key padding: a length per sequence (count 1 or the batch). */
static attn_status new_lengths(attn_ctx *ctx, const char *who, mask_kind kind, const char *name,
                               const int64_t *values, size_t count, attn_mask **out) {
    attn_status st = begin(ctx, who, out);
    if (st != ATTN_OK) return st;
    if (!values) return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", who, name);
    if (!count) return attn_fail(ctx, ATTN_ERR_INVALID, "%s: count is 0", who);
    for (size_t i = 0; i < count; i++)
        if (values[i] < 0 || values[i] > MASK_LIMIT)
            return attn_fail(ctx, ATTN_ERR_INVALID, "%s: %s[%zu] (%lld) must be 0 .. 2^62", who,
                             name, i, (long long)values[i]);
    size_t bytes;
    if (!attn_mul_size(count, sizeof(int64_t), &bytes))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: count (%zu) overflows", who, count);
    attn_mask *m = NULL;
    if ((st = new_node(ctx, who, kind, &m)) != ATTN_OK) return st;
    if (!(m->values = attn_malloc(bytes))) {
        attn_mask_free(m);
        return no_memory(ctx, who);
    }
    memcpy(m->values, values, bytes);
    m->count = count;
    *out = m;
    return ATTN_OK;
}

attn_status attn_mask_new_prefix_lm(attn_ctx *ctx, const int64_t *prefix, size_t count,
                                    attn_mask **out) {
    return new_lengths(ctx, "attn_mask_new_prefix_lm", MASK_PREFIX_LM, "prefix", prefix, count,
                       out);
}

attn_status attn_mask_new_kv_length(attn_ctx *ctx, const int64_t *length, size_t count,
                                    attn_mask **out) {
    return new_lengths(ctx, "attn_mask_new_kv_length", MASK_KV_LENGTH, "length", length, count,
                       out);
}

attn_status attn_mask_new_global(attn_ctx *ctx, size_t tokens, attn_mask **out) {
    const char *who = "attn_mask_new_global";
    attn_status st = begin(ctx, who, out);
    if (st != ATTN_OK) return st;
    if (tokens > (size_t)MASK_LIMIT)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: tokens (%zu) must be at most 2^62", who,
                         tokens);
    if ((st = new_node(ctx, who, MASK_GLOBAL, out)) != ATTN_OK) return st;
    (*out)->size = (int64_t)tokens;
    return ATTN_OK;
}

/* ids (batch sequences of len) copied into *copy, with their run ends and
 * whether each sequence's ids never fall. */
static bool copy_ids(const int32_t *ids, size_t batch, size_t len, int32_t **copy,
                     uint32_t **run_end, bool **sorted) {
    size_t n = batch * len;
    *copy = attn_malloc(n * sizeof(int32_t));
    *run_end = attn_malloc(n * sizeof(uint32_t));
    *sorted = attn_malloc(batch * sizeof(bool));
    if (!*copy || !*run_end || !*sorted) return false;
    memcpy(*copy, ids, n * sizeof(int32_t));
    for (size_t b = 0; b < batch; b++) {
        const int32_t *s = ids + b * len;
        uint32_t *e = *run_end + b * len;
        bool up = true;
        e[len - 1] = (uint32_t)len;
        for (size_t i = len - 1; i-- > 0;) {
            e[i] = s[i] == s[i + 1] ? e[i + 1] : (uint32_t)(i + 1);
            if (s[i] > s[i + 1]) up = false;
        }
        (*sorted)[b] = up;
    }
    return true;
}

attn_status attn_mask_new_document(attn_ctx *ctx, const int32_t *q_doc, const int32_t *kv_doc,
                                   size_t batch, size_t q_len, size_t kv_len, attn_mask **out) {
    const char *who = "attn_mask_new_document";
    attn_status st = begin(ctx, who, out);
    if (st != ATTN_OK) return st;
    if (!q_doc) return attn_fail(ctx, ATTN_ERR_NULL, "%s: q_doc is NULL", who);
    if (!kv_doc && kv_len != q_len && kv_len != 0)
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "%s: without kv_doc the keys are the queries, but kv_len (%zu) is not "
                         "q_len (%zu)", who, kv_len, q_len);
    if (!kv_doc) kv_len = q_len;
    if (!batch || !q_len || !kv_len)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: batch (%zu), q_len (%zu) and kv_len (%zu) must be positive", who,
                         batch, q_len, kv_len);
    size_t n;
    if (q_len > UINT32_MAX || kv_len > UINT32_MAX ||
        !attn_mul3_size(batch, q_len > kv_len ? q_len : kv_len, sizeof(int32_t), &n))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "%s: ids of (%zu, %zu) and (%zu, %zu) are past what a mask holds", who,
                         batch, q_len, batch, kv_len);
    attn_mask *m = NULL;
    if ((st = new_node(ctx, who, MASK_DOCUMENT, &m)) != ATTN_OK) return st;
    m->batch = batch;
    m->q_len = q_len;
    m->kv_len = kv_len;
    if (!copy_ids(q_doc, batch, q_len, &m->q_doc, &m->q_run_end, &m->q_sorted) ||
        !copy_ids(kv_doc ? kv_doc : q_doc, batch, kv_len, &m->kv_doc, &m->kv_run_end,
                  &m->kv_sorted)) {
        attn_mask_free(m);
        return no_memory(ctx, who);
    }
    *out = m;
    return ATTN_OK;
}

/* A deep copy of m into *out (NULL on failure). */
static bool copy_tree(const attn_mask *m, attn_mask **out) {
    attn_mask *c = attn_malloc(sizeof *c);
    *out = c;
    if (!c) return false;
    *c = *m;
    c->values = NULL;
    c->q_doc = c->kv_doc = NULL;
    c->q_run_end = c->kv_run_end = NULL;
    c->q_sorted = c->kv_sorted = NULL;
    c->a = c->b = NULL;
    bool ok = true;
    if (m->values) {
        ok = (c->values = attn_malloc(m->count * sizeof(int64_t))) != NULL;
        if (ok) memcpy(c->values, m->values, m->count * sizeof(int64_t));
    }
    if (ok && m->kind == MASK_DOCUMENT) {
        size_t nq = m->batch * m->q_len, nk = m->batch * m->kv_len;
        c->q_doc = attn_malloc(nq * sizeof(int32_t));
        c->kv_doc = attn_malloc(nk * sizeof(int32_t));
        c->q_run_end = attn_malloc(nq * sizeof(uint32_t));
        c->kv_run_end = attn_malloc(nk * sizeof(uint32_t));
        c->q_sorted = attn_malloc(m->batch * sizeof(bool));
        c->kv_sorted = attn_malloc(m->batch * sizeof(bool));
        ok = c->q_doc && c->kv_doc && c->q_run_end && c->kv_run_end && c->q_sorted && c->kv_sorted;
        if (ok) {
            memcpy(c->q_doc, m->q_doc, nq * sizeof(int32_t));
            memcpy(c->kv_doc, m->kv_doc, nk * sizeof(int32_t));
            memcpy(c->q_run_end, m->q_run_end, nq * sizeof(uint32_t));
            memcpy(c->kv_run_end, m->kv_run_end, nk * sizeof(uint32_t));
            memcpy(c->q_sorted, m->q_sorted, m->batch * sizeof(bool));
            memcpy(c->kv_sorted, m->kv_sorted, m->batch * sizeof(bool));
        }
    }
    if (ok && m->a) ok = copy_tree(m->a, &c->a);
    if (ok && m->b) ok = copy_tree(m->b, &c->b);
    if (!ok) {
        attn_mask_free(c);
        *out = NULL;
    }
    return ok;
}

static attn_status new_combination(attn_ctx *ctx, const char *who, mask_kind kind,
                                   const attn_mask *a, const attn_mask *b, attn_mask **out) {
    attn_status st = begin(ctx, who, out);
    if (st != ATTN_OK) return st;
    if (!a || (kind != MASK_NOT && !b))
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: operand %s is NULL", who, !a ? "a" : "b");
    size_t depth = 1 + (b && b->depth > a->depth ? b->depth : a->depth);
    if (depth > MASK_MAX_DEPTH)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: the tree would be %zu deep, past %d", who,
                         depth, MASK_MAX_DEPTH);
    size_t nodes = 1 + a->nodes + (b ? b->nodes : 0);
    if (nodes > MASK_MAX_NODES)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: the tree would have %zu nodes, past %d", who,
                         nodes, MASK_MAX_NODES);
    attn_mask *m = NULL;
    if ((st = new_node(ctx, who, kind, &m)) != ATTN_OK) return st;
    m->depth = depth;
    m->nodes = nodes;
    if (!copy_tree(a, &m->a) || (kind != MASK_NOT && !copy_tree(b, &m->b))) {
        attn_mask_free(m);
        return no_memory(ctx, who);
    }
    *out = m;
    return ATTN_OK;
}

attn_status attn_mask_new_and(attn_ctx *ctx, const attn_mask *a, const attn_mask *b,
                              attn_mask **out) {
    return new_combination(ctx, "attn_mask_new_and", MASK_AND, a, b, out);
}

attn_status attn_mask_new_or(attn_ctx *ctx, const attn_mask *a, const attn_mask *b,
                             attn_mask **out) {
    return new_combination(ctx, "attn_mask_new_or", MASK_OR, a, b, out);
}

attn_status attn_mask_new_not(attn_ctx *ctx, const attn_mask *a, attn_mask **out) {
    return new_combination(ctx, "attn_mask_new_not", MASK_NOT, a, NULL, out);
}

/* ---- rows as key intervals --------------------------------------------------- */

static int64_t sat_add(int64_t x, int64_t y) {
    int64_t r;
    if (__builtin_add_overflow(x, y, &r)) return y > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

/* The first index of ids[0 .. n) (non-decreasing) with an id above d
 * (strictly, or at least d when !above). */
static size_t bound(const int32_t *ids, size_t n, int32_t d, bool above) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (above ? ids[mid] <= d : ids[mid] < d) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static size_t seq(size_t batch, size_t b) { return batch == 1 ? 0 : b; }

/* Whether the keys of row q of sequence b are one interval [*lo, *hi)
 * (lo >= 0; lo >= hi: none) that m gives in closed form; where it is, both
 * ends never fall as q grows. False for combinators and for documents
 * whose keys' ids are out of order. */
static bool row_interval(const attn_mask *m, size_t b, size_t q, int64_t *lo, int64_t *hi) {
    int64_t x = sat_add((int64_t)q, m->offset);
    *lo = 0;
    *hi = 0;
    switch (m->kind) {
    case MASK_ALL:
        *hi = INT64_MAX;
        return true;
    case MASK_CAUSAL:
        *hi = sat_add(x, 1);
        return true;
    case MASK_WINDOW:
        if (m->left >= 0) {
            int64_t l = sat_add(x, -m->left);
            *lo = l > 0 ? l : 0;
        }
        *hi = m->right < 0 ? INT64_MAX : sat_add(sat_add(x, m->right), 1);
        return true;
    case MASK_CHUNKED:
        if (x < 0) { /* a negative chunk holds no key */
            *hi = 0;
        } else {
            *lo = x / m->size * m->size;
            *hi = sat_add(*lo, m->size);
        }
        return true;
    case MASK_PREFIX_LM: {
        int64_t p = m->values[seq(m->count, b)], end = (int64_t)q + 1;
        *hi = p > end ? p : end;
        return true;
    }
    case MASK_GLOBAL:
        *hi = (int64_t)q < m->size ? INT64_MAX : m->size;
        return true;
    case MASK_KV_LENGTH:
        *hi = m->values[seq(m->count, b)];
        return true;
    case MASK_DOCUMENT: {
        size_t bb = seq(m->batch, b);
        if (!m->kv_sorted[bb]) return false;
        const int32_t *kd = m->kv_doc + bb * m->kv_len;
        int32_t d = m->q_doc[bb * m->q_len + q];
        *lo = (int64_t)bound(kd, m->kv_len, d, false);
        *hi = (int64_t)bound(kd, m->kv_len, d, true);
        return true;
    }
    default:
        return false;
    }
}

/* Whether (b, q, kv) is visible under m (the point already checked). */
static bool visible_at(const attn_mask *m, size_t b, size_t q, size_t kv) {
    switch (m->kind) {
    case MASK_AND:
        return visible_at(m->a, b, q, kv) && visible_at(m->b, b, q, kv);
    case MASK_OR:
        return visible_at(m->a, b, q, kv) || visible_at(m->b, b, q, kv);
    case MASK_NOT:
        return !visible_at(m->a, b, q, kv);
    case MASK_DOCUMENT: {
        size_t bb = seq(m->batch, b);
        return m->q_doc[bb * m->q_len + q] == m->kv_doc[bb * m->kv_len + kv];
    }
    default: {
        int64_t lo, hi;
        row_interval(m, b, q, &lo, &hi);
        return (int64_t)kv >= lo && (int64_t)kv < hi;
    }
    }
}

/* Whether point (b, q, kv) lies within every document and per-sequence
 * array of m, by name. */
static attn_status check_point(attn_ctx *ctx, const char *who, const attn_mask *m, size_t b,
                               size_t q, size_t kv) {
    attn_status st = ATTN_OK;
    switch (m->kind) {
    case MASK_AND:
    case MASK_OR:
        st = check_point(ctx, who, m->a, b, q, kv);
        return st != ATTN_OK ? st : check_point(ctx, who, m->b, b, q, kv);
    case MASK_NOT:
        return check_point(ctx, who, m->a, b, q, kv);
    case MASK_PREFIX_LM:
    case MASK_KV_LENGTH:
        if (m->count > 1 && b >= m->count)
            return attn_fail(ctx, ATTN_ERR_INVALID, "%s: b (%zu) is past the %s mask's %zu "
                             "sequences", who, b, m->kind == MASK_PREFIX_LM ? "prefix-LM" :
                             "kv_length", m->count);
        return ATTN_OK;
    case MASK_DOCUMENT:
        if ((m->batch > 1 && b >= m->batch) || q >= m->q_len || kv >= m->kv_len)
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "%s: (b %zu, q_idx %zu, kv_idx %zu) is past the document mask's "
                             "(batch %zu, q_len %zu, kv_len %zu)", who, b, q, kv, m->batch,
                             m->q_len, m->kv_len);
        return ATTN_OK;
    default:
        return ATTN_OK;
    }
}

attn_status attn_mask_visible(attn_ctx *ctx, const attn_mask *m, size_t b, size_t h,
                              size_t q_idx, size_t kv_idx, bool *out) {
    const char *who = "attn_mask_visible";
    (void)h; /* no primitive depends on the head */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!m || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", who, !m ? "mask" : "out");
    if (q_idx > (size_t)MASK_LIMIT || kv_idx > (size_t)MASK_LIMIT)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: q_idx (%zu) and kv_idx (%zu) must be at "
                         "most 2^62", who, q_idx, kv_idx);
    attn_status st = check_point(ctx, who, m, b, q_idx, kv_idx);
    if (st != ATTN_OK) return st;
    *out = visible_at(m, b, q_idx, kv_idx);
    return ATTN_OK;
}

attn_status attn_mask_check_config(attn_ctx *ctx, const char *who, const attn_mask *m,
                                   const attn_block_mask_config *cfg) {
    attn_status st;
    switch (m->kind) {
    case MASK_AND:
    case MASK_OR:
        st = attn_mask_check_config(ctx, who, m->a, cfg);
        return st != ATTN_OK ? st : attn_mask_check_config(ctx, who, m->b, cfg);
    case MASK_NOT:
        return attn_mask_check_config(ctx, who, m->a, cfg);
    case MASK_PREFIX_LM:
    case MASK_KV_LENGTH:
        if (m->count != 1 && m->count != cfg->batch)
            return attn_fail(ctx, ATTN_ERR_SHAPE, "%s: the %s mask has %zu lengths for a batch "
                             "of %zu (1 or the batch)", who,
                             m->kind == MASK_PREFIX_LM ? "prefix-LM" : "kv_length", m->count,
                             cfg->batch);
        return ATTN_OK;
    case MASK_DOCUMENT:
        if ((m->batch != 1 && m->batch != cfg->batch) || m->q_len != cfg->q_len ||
            m->kv_len != cfg->kv_len)
            return attn_fail(ctx, ATTN_ERR_SHAPE,
                             "%s: the document mask's (batch %zu, q_len %zu, kv_len %zu) does "
                             "not fit the map's (batch %zu, q_len %zu, kv_len %zu)", who,
                             m->batch, m->q_len, m->kv_len, cfg->batch, cfg->q_len, cfg->kv_len);
        return ATTN_OK;
    default:
        return ATTN_OK;
    }
}

/* ---- tiles in closed form ---------------------------------------------------- */

/* The class of rows [q0, q1) x keys [k0, k1) of a mask whose rows are
 * intervals with ends that never fall (row_interval true for every row). */
static block_class classify_intervals(const attn_mask *m, size_t b, size_t q0, size_t q1,
                                      int64_t k0, int64_t k1) {
    int64_t first_lo = 0, first_hi = 0, last_lo = 0, last_hi = 0;
    row_interval(m, b, q0, &first_lo, &first_hi);
    row_interval(m, b, q1 - 1, &last_lo, &last_hi);
    if (last_lo <= k0 && first_hi >= k1) return BLOCK_FULL;
    if (last_hi <= k0) return BLOCK_EMPTY; /* no row reaches the tile */
    /* the first row reaching past k0 starts earliest among those that do */
    size_t lo = q0, hi = q1 - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int64_t l = 0, h = 0;
        row_interval(m, b, mid, &l, &h);
        if (h > k0) hi = mid;
        else lo = mid + 1;
    }
    int64_t l = 0, h = 0;
    row_interval(m, b, lo, &l, &h);
    return l >= k1 ? BLOCK_EMPTY : BLOCK_PARTIAL;
}

/* How many runs of ids a tile's side is read as, at most, before its
 * class is left to the bits. */
#define RUNS_COMPARED 8

/* The ids of the runs of ids[from .. to) (run ends in run_end) into out,
 * and how many; 0 when there are more than RUNS_COMPARED. */
static size_t run_ids(const int32_t *ids, const uint32_t *run_end, size_t from, size_t to,
                      int32_t *out) {
    size_t n = 0;
    for (size_t i = from; i < to; i = run_end[i]) {
        if (n == RUNS_COMPARED) return 0;
        out[n++] = ids[i];
    }
    return n;
}

/* Documents, from the ids' runs (in order or not): full only where the
 * query ids and the key ids are each one run, of the same id; empty where
 * those two ids differ, where the id ranges (known where a side is one
 * run or in order) do not meet, or where a few runs each side share no id.
 * Any tile full or empty is one of these but for ids out of order spread
 * over many runs, which the bits settle. */
static block_class classify_documents(const attn_mask *m, size_t b, size_t q0, size_t q1,
                                      size_t k0, size_t k1) {
    size_t bb = seq(m->batch, b);
    const int32_t *qd = m->q_doc + bb * m->q_len, *kd = m->kv_doc + bb * m->kv_len;
    bool q_one = m->q_run_end[bb * m->q_len + q0] >= q1;
    bool k_one = m->kv_run_end[bb * m->kv_len + k0] >= k1;
    if (q_one && k_one) return qd[q0] == kd[k0] ? BLOCK_FULL : BLOCK_EMPTY;
    if ((q_one || m->q_sorted[bb]) && (k_one || m->kv_sorted[bb])) {
        int32_t q_min = qd[q0], q_max = qd[q1 - 1], k_min = kd[k0], k_max = kd[k1 - 1];
        if (q_max < k_min || k_max < q_min) return BLOCK_EMPTY;
    }
    /* a few runs each side (documents out of order): empty when no query
     * run's id is a key run's */
    int32_t q_ids[RUNS_COMPARED], k_ids[RUNS_COMPARED];
    size_t nq = run_ids(qd, m->q_run_end + bb * m->q_len, q0, q1, q_ids);
    size_t nk = run_ids(kd, m->kv_run_end + bb * m->kv_len, k0, k1, k_ids);
    if (!nq || !nk) return BLOCK_PARTIAL;
    for (size_t i = 0; i < nq; i++)
        for (size_t j = 0; j < nk; j++)
            if (q_ids[i] == k_ids[j]) return BLOCK_PARTIAL;
    return BLOCK_EMPTY;
}

static block_class classify(const attn_mask *m, size_t b, size_t q0, size_t q1, size_t k0,
                            size_t k1) {
    block_class x, y;
    switch (m->kind) {
    case MASK_AND:
        if ((x = classify(m->a, b, q0, q1, k0, k1)) == BLOCK_EMPTY) return BLOCK_EMPTY;
        if ((y = classify(m->b, b, q0, q1, k0, k1)) == BLOCK_EMPTY) return BLOCK_EMPTY;
        return x == BLOCK_FULL && y == BLOCK_FULL ? BLOCK_FULL : BLOCK_PARTIAL;
    case MASK_OR:
        if ((x = classify(m->a, b, q0, q1, k0, k1)) == BLOCK_FULL) return BLOCK_FULL;
        if ((y = classify(m->b, b, q0, q1, k0, k1)) == BLOCK_FULL) return BLOCK_FULL;
        return x == BLOCK_EMPTY && y == BLOCK_EMPTY ? BLOCK_EMPTY : BLOCK_PARTIAL;
    case MASK_NOT:
        x = classify(m->a, b, q0, q1, k0, k1);
        return x == BLOCK_FULL ? BLOCK_EMPTY : x == BLOCK_EMPTY ? BLOCK_FULL : BLOCK_PARTIAL;
    case MASK_GLOBAL:
        /* rows below tokens see every key, the others the keys below tokens */
        if ((int64_t)q1 <= m->size || (int64_t)k1 <= m->size) return BLOCK_FULL;
        if ((int64_t)q0 >= m->size && (int64_t)k0 >= m->size) return BLOCK_EMPTY;
        return BLOCK_PARTIAL;
    case MASK_DOCUMENT:
        return classify_documents(m, b, q0, q1, k0, k1);
    default:
        return classify_intervals(m, b, q0, q1, (int64_t)k0, (int64_t)k1);
    }
}

block_class attn_mask_classify(const void *self, size_t b, size_t h, size_t q0, size_t q1,
                               size_t k0, size_t k1) {
    (void)h;
    return classify(self, b, q0, q1, k0, k1);
}

/* A span [*lo, *hi) of keys that holds every key rows [q0, q1) of sequence
 * b see under m (lo >= hi: none): the first row's lo and the last row's hi
 * where rows are intervals whose ends never fall, combined for AND and OR;
 * every key where that is not known (NOT, documents out of order). */
static void keys_span(const attn_mask *m, size_t b, size_t q0, size_t q1, int64_t *lo,
                      int64_t *hi) {
    int64_t lo2, hi2, unused;
    switch (m->kind) {
    case MASK_AND:
        keys_span(m->a, b, q0, q1, lo, hi);
        keys_span(m->b, b, q0, q1, &lo2, &hi2);
        if (lo2 > *lo) *lo = lo2;
        if (hi2 < *hi) *hi = hi2;
        return;
    case MASK_OR:
        keys_span(m->a, b, q0, q1, lo, hi);
        keys_span(m->b, b, q0, q1, &lo2, &hi2);
        if (lo2 >= hi2) return;
        if (*lo >= *hi || lo2 < *lo) *lo = lo2;
        if (hi2 > *hi) *hi = hi2;
        return;
    case MASK_GLOBAL:
        *lo = 0;
        *hi = (int64_t)q0 < m->size ? INT64_MAX : m->size;
        return;
    case MASK_NOT:
        *lo = 0;
        *hi = INT64_MAX;
        return;
    case MASK_DOCUMENT: {
        size_t bb = seq(m->batch, b);
        if (!m->q_sorted[bb] || !m->kv_sorted[bb]) {
            *lo = 0;
            *hi = INT64_MAX;
            return;
        }
        break;
    }
    default: break;
    }
    row_interval(m, b, q0, lo, &unused);
    row_interval(m, b, q1 - 1, &unused, hi);
}

static void mask_keys_span(const void *self, size_t b, size_t h, size_t q0, size_t q1,
                           int64_t *lo, int64_t *hi) {
    (void)h; /* no primitive depends on the head */
    keys_span(self, b, q0, q1, lo, hi);
}

/* ---- rows of bits ------------------------------------------------------------- */

/* Bits [from, to) of words set. */
static void set_bits(uint64_t *words, size_t from, size_t to) {
    while (from < to) {
        size_t w = from >> 6, bit = from & 63, n = 64 - bit < to - from ? 64 - bit : to - from;
        words[w] |= (n == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1)) << bit;
        from += n;
    }
}

/* words (CHUNK_WORDS, zeroed by the caller) set where (b, q, j) is visible,
 * k0 <= j < k1, k1 - k0 <= CHUNK_KEYS. */
static void node_bits(const attn_mask *m, size_t b, size_t q, size_t k0, size_t k1,
                      uint64_t *words) {
    size_t n = k1 - k0, nw = (n + 63) / 64;
    uint64_t other[CHUNK_WORDS] = {0};
    switch (m->kind) {
    case MASK_AND:
    {
        node_bits(m->a, b, q, k0, k1, words);
        bool any = false;
        for (size_t w = 0; w < nw; w++) any |= words[w] != 0;
        if (!any) return; /* nothing left for b to hide */
        node_bits(m->b, b, q, k0, k1, other);
        for (size_t w = 0; w < nw; w++) words[w] &= other[w];
        return;
    }
    case MASK_OR:
        node_bits(m->a, b, q, k0, k1, words);
        node_bits(m->b, b, q, k0, k1, other);
        for (size_t w = 0; w < nw; w++) words[w] |= other[w];
        return;
    case MASK_NOT:
        node_bits(m->a, b, q, k0, k1, other);
        set_bits(words, 0, n);
        for (size_t w = 0; w < nw; w++) words[w] &= ~other[w];
        return;
    default: {
        int64_t lo, hi;
        if (row_interval(m, b, q, &lo, &hi)) {
            int64_t from = lo > (int64_t)k0 ? lo : (int64_t)k0;
            int64_t to = hi < (int64_t)k1 ? hi : (int64_t)k1;
            if (from < to) set_bits(words, (size_t)from - k0, (size_t)to - k0);
            return;
        }
        /* documents with ids out of order: element by element, a run at a time */
        size_t bb = seq(m->batch, b);
        const int32_t *kd = m->kv_doc + bb * m->kv_len;
        const uint32_t *run = m->kv_run_end + bb * m->kv_len;
        int32_t d = m->q_doc[bb * m->q_len + q];
        for (size_t j = k0; j < k1;) {
            size_t end = run[j] < k1 ? run[j] : k1;
            if (kd[j] == d) set_bits(words, j - k0, end - k0);
            j = end;
        }
        return;
    }
    }
}

attn_status attn_mask_row_bits(const void *self, attn_ctx *ctx, const char *who, size_t b,
                               size_t h, size_t q, size_t k0, size_t k1, uint64_t *words) {
    (void)ctx;
    (void)who;
    (void)h;
    for (size_t at = k0; at < k1; at += CHUNK_KEYS) {
        size_t end = k1 - at > CHUNK_KEYS ? at + CHUNK_KEYS : k1;
        uint64_t chunk[CHUNK_WORDS] = {0};
        node_bits(self, b, q, at, end, chunk);
        memcpy(words + (at - k0) / 64, chunk, (end - at + 63) / 64 * sizeof(uint64_t));
    }
    return ATTN_OK;
}

attn_status attn_block_mask_from_mask(attn_ctx *ctx, const attn_block_mask_config *cfg,
                                      const attn_mask *mask, attn_block_mask **out) {
    const char *who = "attn_block_mask_from_mask";
    if (out) *out = NULL; /* on any failure, as the constructors promise */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !mask || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", who,
                         !cfg ? "cfg" : !mask ? "mask" : "out");
    attn_status st = attn_mask_check_config(ctx, who, mask, cfg);
    if (st != ATTN_OK) return st;
    block_source src = {.self = mask, .classify = attn_mask_classify,
                        .row_bits = attn_mask_row_bits, .keys_span = mask_keys_span};
    return attn_block_mask_build(ctx, who, cfg, &src, out);
}
