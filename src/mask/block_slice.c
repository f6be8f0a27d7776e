/*
 * block_slice.c — a rectangle of a block map as a map of its own: heads
 * [h0, h1) x queries [q0, q1) x keys [k0, k1) of every sequence, with the
 * same block sizes, for a problem that holds only part of the scores
 * (context parallelism: a rank's queries against another rank's keys, at
 * token offsets that need not fall on block edges; or a rank's heads), or
 * one sequence's first rows and keys (a prompt into an empty KV cache,
 * whose map is over the cache's positions).
 *
 * It goes through the one builder with the map as its source: a tile of
 * the slice is classified from the map's tiles it overlaps (all skipped:
 * empty; all full: full; else its bits decide), and a row of bits is read
 * from the map's full blocks and partial tiles. Where the slice's edges
 * fall on the map's block edges, every tile is the map's own and keeps its
 * class; elsewhere a tile the map's partial tiles cover is promoted to full
 * or dropped as empty as its elements say, like any built map's.
 */
#include "mask/block_build.h"

typedef struct slice_source {
    const attn_block_map *m;
    size_t b0, h0, q0, k0; /* b0: the map's sequence of the slice's first */
} slice_source;

/* Whether ascending list[0 .. n) holds kb; *at its index if so. */
static bool find_block(const uint32_t *list, size_t n, size_t kb, size_t *at) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (list[mid] < kb) lo = mid + 1;
        else hi = mid;
    }
    if (lo < n && list[lo] == kb) {
        *at = lo;
        return true;
    }
    return false;
}

/* The class of the map's tile (row r, key block kb); *tile its bits' tile
 * when partial. */
static block_class tile_class(const attn_block_map *m, size_t r, size_t kb, size_t *tile) {
    size_t at;
    if (find_block(m->full + m->full_at[r], m->full_at[r + 1] - m->full_at[r], kb, &at))
        return BLOCK_FULL;
    if (find_block(m->part + m->part_at[r], m->part_at[r + 1] - m->part_at[r], kb, &at)) {
        *tile = m->part_tile[m->part_at[r] + at];
        return BLOCK_PARTIAL;
    }
    return BLOCK_EMPTY;
}

/* The map's head of the slice's head h. */
static size_t map_head(const slice_source *s, size_t h) {
    return s->m->heads == 1 ? 0 : s->h0 + h;
}

static block_class slice_classify(const void *self, size_t b, size_t h, size_t q0, size_t q1,
                                  size_t k0, size_t k1) {
    const slice_source *s = self;
    const attn_block_map *m = s->m;
    size_t hh = map_head(s, h), tile;
    size_t qb0 = (s->q0 + q0) / m->block_q, qb1 = (s->q0 + q1 - 1) / m->block_q;
    size_t kb0 = (s->k0 + k0) / m->block_kv, kb1 = (s->k0 + k1 - 1) / m->block_kv;
    bool any_full = false, any_empty = false;
    for (size_t qb = qb0; qb <= qb1; qb++) {
        size_t r = attn_block_map_row(m, s->b0 + b, hh, qb);
        for (size_t kb = kb0; kb <= kb1; kb++) {
            block_class c = tile_class(m, r, kb, &tile);
            if (c == BLOCK_PARTIAL) return BLOCK_PARTIAL;
            if (c == BLOCK_FULL) any_full = true;
            else any_empty = true;
            if (any_full && any_empty) return BLOCK_PARTIAL;
        }
    }
    return any_full ? BLOCK_FULL : BLOCK_EMPTY;
}

/* n (<= 64) bits of src from bit off. */
static uint64_t get_bits(const uint64_t *src, size_t off, size_t n) {
    size_t w = off >> 6, sh = off & 63;
    uint64_t x = src[w] >> sh;
    if (sh && sh + n > 64) x |= src[w + 1] << (64 - sh);
    return n == 64 ? x : x & (((uint64_t)1 << n) - 1);
}

/* dst's n (<= 64) bits from bit off |= x. */
static void or_bits(uint64_t *dst, size_t off, uint64_t x, size_t n) {
    size_t w = off >> 6, sh = off & 63;
    dst[w] |= x << sh;
    if (sh && sh + n > 64) dst[w + 1] |= x >> (64 - sh);
}

static attn_status slice_row_bits(const void *self, attn_ctx *ctx, const char *who, size_t b,
                                  size_t h, size_t q, size_t k0, size_t k1, uint64_t *words) {
    (void)ctx;
    (void)who;
    const slice_source *s = self;
    const attn_block_map *m = s->m;
    size_t gq = s->q0 + q, g0 = s->k0 + k0, g1 = s->k0 + k1, tile = 0;
    size_t r = attn_block_map_row(m, s->b0 + b, map_head(s, h), gq / m->block_q);
    for (size_t kb = g0 / m->block_kv; kb * m->block_kv < g1; kb++) {
        size_t b0 = kb * m->block_kv, lo = b0 > g0 ? b0 : g0;
        size_t hi = b0 + m->block_kv < g1 ? b0 + m->block_kv : g1;
        block_class c = tile_class(m, r, kb, &tile);
        if (c == BLOCK_EMPTY) continue;
        const uint64_t *row =
            m->bits + (tile * m->block_q + gq % m->block_q) * m->words_per_row;
        for (size_t j = lo; j < hi; j += 64) {
            size_t n = hi - j < 64 ? hi - j : 64;
            uint64_t x = c == BLOCK_FULL ? (n == 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1)
                                         : get_bits(row, j - b0, n);
            or_bits(words, j - g0, x, n);
        }
    }
    return ATTN_OK;
}

/* Sequences [b0, b0 + nb) of m (nb 1 or m's batch) cut as
 * attn_block_map_slice's rectangle. */
static attn_status slice(attn_ctx *ctx, const char *who, const attn_block_map *m, size_t b0,
                         size_t nb, size_t h0, size_t h1, size_t q0, size_t q1, size_t k0,
                         size_t k1, bool parents_kernels, attn_block_mask **out) {
    *out = NULL;
    if (h0 >= h1 || q0 >= q1 || k0 >= k1 || q1 > m->q_len || k1 > m->kv_len ||
        (m->heads != 1 && h1 > m->heads))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: heads [%zu, %zu), queries [%zu, %zu), keys [%zu, %zu) are no "
                         "slice of a block map of %zu heads, q_len %zu, kv_len %zu",
                         who, h0, h1, q0, q1, k0, k1, m->heads, m->q_len, m->kv_len);
    slice_source s = {m, m->batch == 1 ? 0 : b0, m->heads == 1 ? 0 : h0, q0, k0};
    attn_block_mask_config cfg = {.batch = m->batch == 1 ? 1 : nb,
                                  .heads = m->heads == 1 ? 1 : h1 - h0,
                                  .q_len = q1 - q0, .kv_len = k1 - k0,
                                  .block_q = m->block_q, .block_kv = m->block_kv};
    block_source src = {.self = &s, .classify = slice_classify, .row_bits = slice_row_bits,
                        .no_row_intervals = parents_kernels && m->row_lo == NULL};
    return attn_block_mask_build(ctx, who, &cfg, &src, out);
}

attn_status attn_block_map_slice(attn_ctx *ctx, const char *who, const attn_block_map *m,
                                 size_t h0, size_t h1, size_t q0, size_t q1, size_t k0, size_t k1,
                                 attn_block_mask **out) {
    return slice(ctx, who, m, 0, m->batch, h0, h1, q0, q1, k0, k1, false, out);
}

attn_status attn_block_map_heads(attn_ctx *ctx, const char *who, const attn_block_map *m,
                                 size_t h0, size_t h1, attn_block_mask **out) {
    return slice(ctx, who, m, 0, m->batch, h0, h1, 0, m->q_len, 0, m->kv_len, true, out);
}

attn_status attn_block_map_sequence(attn_ctx *ctx, const char *who, const attn_block_map *m,
                                    size_t b, size_t q_len, size_t kv_len,
                                    attn_block_mask **out) {
    if (m->batch != 1 && b >= m->batch) {
        *out = NULL;
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: sequence %zu of a block map of batch %zu",
                         who, b, m->batch);
    }
    return slice(ctx, who, m, b, 1, 0, m->heads, 0, q_len, 0, kv_len, false, out);
}
