/*
 * block_mask.c — block maps (attn.h's attn_block_mask): the builder every
 * source goes through, the dense and callback sources, and what a map
 * tells about itself (info, the drawing).
 */
#include "mask/block_build.h"
#include "overlap.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct attn_block_mask {
    attn_block_map map;
    size_t *full_at, *part_at, *part_tile, *t_full_at, *t_part_at, *t_part_tile;
    uint32_t *full, *part, *t_full, *t_part;
    uint64_t *bits;
    int64_t *row_lo, *row_hi;
    size_t full_count, part_count; /* entries of full and part */
};

const attn_block_map *attn_block_mask_map(const attn_block_mask *m) { return &m->map; }

void attn_block_mask_free(attn_block_mask *m) {
    if (!m) return;
    attn_free(m->full_at);
    attn_free(m->part_at);
    attn_free(m->part_tile);
    attn_free(m->t_full_at);
    attn_free(m->t_part_at);
    attn_free(m->t_part_tile);
    attn_free(m->full);
    attn_free(m->part);
    attn_free(m->t_full);
    attn_free(m->t_part);
    attn_free(m->bits);
    attn_free(m->row_lo);
    attn_free(m->row_hi);
    attn_free(m);
}

/* ---- growable arrays -------------------------------------------------------- */

/* *p (room for *cap elements of size bytes) with room for n: doubled. */
static bool grow(void **p, size_t *cap, size_t n, size_t size) {
    if (n <= *cap) return true;
    size_t want = *cap ? *cap : 64, bytes;
    while (want < n) {
        if (want > (size_t)-1 / 2) return false;
        want *= 2;
    }
    if (!attn_mul_size(want, size, &bytes)) return false;
    void *q = attn_realloc(*p, bytes);
    if (!q) return false;
    *p = q;
    *cap = want;
    return true;
}

/* ---- the builder ------------------------------------------------------------ */

static bool power_of_two_in(size_t x, size_t lo, size_t hi) {
    return x >= lo && x <= hi && (x & (x - 1)) == 0;
}

static attn_status check_config(attn_ctx *ctx, const char *who, const attn_block_mask_config *c,
                                attn_block_mask_config *out) {
    if (!c) return attn_fail(ctx, ATTN_ERR_NULL, "%s: cfg is NULL", who);
    *out = *c;
    if (!out->block_q) out->block_q = 64;
    if (!out->block_kv) out->block_kv = 64;
    if (!c->batch || !c->heads || !c->q_len || !c->kv_len)
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "%s: batch (%zu), heads (%zu), q_len (%zu) and kv_len (%zu) must be "
                         "positive", who, c->batch, c->heads, c->q_len, c->kv_len);
    if (!power_of_two_in(out->block_q, 16, ATTN_BLOCK_MAP_MAX_BLOCK) ||
        !power_of_two_in(out->block_kv, 16, ATTN_BLOCK_MAP_MAX_BLOCK))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: block sizes (%zu, %zu) must be powers of two from 16 to 256 "
                         "(0: 64)", who, c->block_q, c->block_kv);
    size_t rows, cols;
    if (c->q_len > UINT32_MAX || c->kv_len > ((size_t)UINT32_MAX) ||
        !attn_mul3_size(c->batch, c->heads, c->q_len / out->block_q + 1, &rows) ||
        !attn_mul3_size(c->batch, c->heads, c->kv_len / out->block_kv + 1, &cols) ||
        !attn_mul_size(rows, c->kv_len / out->block_kv + 1, &rows))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "%s: a map of (%zu, %zu, %zu, %zu) is past what block indices hold", who,
                         c->batch, c->heads, c->q_len, c->kv_len);
    return ATTN_OK;
}

static attn_status no_memory(attn_ctx *ctx, const char *who, const attn_block_mask_config *c) {
    return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory building the block map of "
                     "(%zu, %zu, %zu, %zu)", who, c->batch, c->heads, c->q_len, c->kv_len);
}

/* The bits of tile (b, h, qb, kb) into tile (block_q rows of wpr words,
 * zeroed here), and whether they hide or show every element in range. */
static attn_status tile_bits(attn_ctx *ctx, const char *who, const block_source *src,
                             const attn_block_map *m, size_t b, size_t h, size_t qb, size_t kb,
                             uint64_t *tile, block_class *cls) {
    size_t q0 = qb * m->block_q, k0 = kb * m->block_kv;
    size_t q1 = q0 + m->block_q < m->q_len ? q0 + m->block_q : m->q_len;
    size_t k1 = k0 + m->block_kv < m->kv_len ? k0 + m->block_kv : m->kv_len;
    size_t wpr = m->words_per_row, seen = 0, first_row_seen = 0;
    memset(tile, 0, m->block_q * wpr * sizeof *tile);
    for (size_t q = q0; q < q1; q++) {
        uint64_t *row = tile + (q - q0) * wpr;
        if (src->same_rows && q > q0) { /* the first row's bits, already trimmed */
            memcpy(row, tile, wpr * sizeof *row);
            seen += first_row_seen;
            continue;
        }
        attn_status st = src->row_bits(src->self, ctx, who, b, h, q, k0, k1, row);
        if (st != ATTN_OK) return st;
        /* bits past S are the source's to leave zero; make sure */
        size_t width = k1 - k0;
        for (size_t w = 0; w < wpr; w++) {
            if (width <= w * 64) row[w] = 0;
            else if (width < (w + 1) * 64) row[w] &= ((uint64_t)1 << (width - w * 64)) - 1;
            seen += (size_t)__builtin_popcountll(row[w]);
        }
        if (q == q0) first_row_seen = seen;
    }
    *cls = seen == 0 ? BLOCK_EMPTY : seen == (q1 - q0) * (k1 - k0) ? BLOCK_FULL : BLOCK_PARTIAL;
    return ATTN_OK;
}

/* The transpose: column c's query blocks from the rows' lists, in
 * ascending order (rows of one (b, h) are visited by query block). */
static bool transpose(attn_block_mask *bm) {
    attn_block_map *m = &bm->map;
    size_t planes = m->batch * m->heads, cols = planes * m->kv_blocks;
    bm->t_full_at = attn_calloc(cols + 1, sizeof(size_t));
    bm->t_part_at = attn_calloc(cols + 1, sizeof(size_t));
    bm->t_full = attn_malloc((bm->full_count ? bm->full_count : 1) * sizeof(uint32_t));
    bm->t_part = attn_malloc((bm->part_count ? bm->part_count : 1) * sizeof(uint32_t));
    bm->t_part_tile = attn_malloc((bm->part_count ? bm->part_count : 1) * sizeof(size_t));
    if (!bm->t_full_at || !bm->t_part_at || !bm->t_full || !bm->t_part || !bm->t_part_tile)
        return false;
    for (size_t plane = 0; plane < planes; plane++)
        for (size_t qb = 0; qb < m->q_blocks; qb++) {
            size_t r = plane * m->q_blocks + qb;
            for (size_t e = bm->full_at[r]; e < bm->full_at[r + 1]; e++)
                bm->t_full_at[plane * m->kv_blocks + bm->full[e] + 1]++;
            for (size_t e = bm->part_at[r]; e < bm->part_at[r + 1]; e++)
                bm->t_part_at[plane * m->kv_blocks + bm->part[e] + 1]++;
        }
    for (size_t c = 0; c < cols; c++) {
        bm->t_full_at[c + 1] += bm->t_full_at[c];
        bm->t_part_at[c + 1] += bm->t_part_at[c];
    }
    size_t *fill_full = attn_malloc((cols ? cols : 1) * sizeof(size_t));
    size_t *fill_part = attn_malloc((cols ? cols : 1) * sizeof(size_t));
    if (!fill_full || !fill_part) {
        attn_free(fill_full);
        attn_free(fill_part);
        return false;
    }
    memcpy(fill_full, bm->t_full_at, cols * sizeof(size_t));
    memcpy(fill_part, bm->t_part_at, cols * sizeof(size_t));
    for (size_t plane = 0; plane < planes; plane++)
        for (size_t qb = 0; qb < m->q_blocks; qb++) {
            size_t r = plane * m->q_blocks + qb;
            for (size_t e = bm->full_at[r]; e < bm->full_at[r + 1]; e++)
                bm->t_full[fill_full[plane * m->kv_blocks + bm->full[e]]++] = (uint32_t)qb;
            for (size_t e = bm->part_at[r]; e < bm->part_at[r + 1]; e++) {
                size_t at = fill_part[plane * m->kv_blocks + bm->part[e]]++;
                bm->t_part[at] = (uint32_t)qb;
                bm->t_part_tile[at] = bm->part_tile[e];
            }
        }
    attn_free(fill_full);
    attn_free(fill_part);
    m->t_full_at = bm->t_full_at;
    m->t_part_at = bm->t_part_at;
    m->t_full = bm->t_full;
    m->t_part = bm->t_part;
    m->t_part_tile = bm->t_part_tile;
    return true;
}

/* The visible keys of row i of map row r as one interval [*lo, *hi), or
 * false where they are not one (an empty row gives lo = hi = 0). */
static bool row_interval(const attn_block_map *m, size_t r, size_t i, int64_t *lo, int64_t *hi) {
    size_t f = m->full_at[r], fe = m->full_at[r + 1], p = m->part_at[r], pe = m->part_at[r + 1];
    int64_t first = -1, end = -1;
    size_t qi = i % m->block_q;
    while (f < fe || p < pe) {
        bool take_full = p >= pe || (f < fe && m->full[f] < m->part[p]);
        size_t kb = take_full ? m->full[f] : m->part[p];
        size_t k0 = kb * m->block_kv;
        size_t k1 = k0 + m->block_kv < m->kv_len ? k0 + m->block_kv : m->kv_len;
        /* the row's visible keys in this block, as [a, z) if contiguous */
        int64_t a, z;
        if (take_full) {
            a = (int64_t)k0;
            z = (int64_t)k1;
            f++;
        } else {
            const uint64_t *row = m->bits + (m->part_tile[p] * m->block_q + qi) * m->words_per_row;
            p++;
            int64_t lo_bit = -1, hi_bit = -1;
            size_t count = 0;
            for (size_t w = 0; w < m->words_per_row; w++) {
                if (!row[w]) continue;
                count += (size_t)__builtin_popcountll(row[w]);
                if (lo_bit < 0) lo_bit = (int64_t)(w * 64) + __builtin_ctzll(row[w]);
                hi_bit = (int64_t)(w * 64) + 63 - __builtin_clzll(row[w]) + 1;
            }
            if (!count) continue;
            if ((size_t)(hi_bit - lo_bit) != count) return false;
            a = (int64_t)k0 + lo_bit;
            z = (int64_t)k0 + hi_bit;
        }
        if (first < 0) {
            first = a;
            end = z;
        } else if (a == end) {
            end = z;
        } else {
            return false;
        }
    }
    *lo = first < 0 ? 0 : first;
    *hi = first < 0 ? 0 : end;
    return true;
}

/* Whether map rows r and s list the same key blocks, full and partial,
 * with the same bits in their partial tiles. */
static bool same_rows(const attn_block_map *m, size_t r, size_t s) {
    size_t full = m->full_at[r + 1] - m->full_at[r], part = m->part_at[r + 1] - m->part_at[r];
    if (full != m->full_at[s + 1] - m->full_at[s] || part != m->part_at[s + 1] - m->part_at[s])
        return false;
    if (memcmp(m->full + m->full_at[r], m->full + m->full_at[s], full * sizeof(uint32_t)) ||
        memcmp(m->part + m->part_at[r], m->part + m->part_at[s], part * sizeof(uint32_t)))
        return false;
    size_t tile_words = m->block_q * m->words_per_row;
    for (size_t e = 0; e < part; e++) {
        const uint64_t *a = m->bits + m->part_tile[m->part_at[r] + e] * tile_words;
        const uint64_t *b = m->bits + m->part_tile[m->part_at[s] + e] * tile_words;
        if (a != b && memcmp(a, b, tile_words * sizeof(uint64_t))) return false;
    }
    return true;
}

/* Whether every head of a map of several heads has head 0's rows (a
 * head-independent mask given per head, as PyTorch's create_block_mask
 * with H set builds it). */
static bool same_for_every_head(const attn_block_map *m) {
    for (size_t b = 0; b < m->batch; b++)
        for (size_t h = 1; h < m->heads; h++)
            for (size_t qb = 0; qb < m->q_blocks; qb++)
                if (!same_rows(m, attn_block_map_row(m, b, h, qb), attn_block_map_row(m, b, 0, qb)))
                    return false;
    return true;
}

/* The row intervals of a map that is the same for every head, when each
 * row's keys are one interval and both ends never fall from row to row
 * (what the fixed-feature kernels' searches need); else none, and the map
 * runs on the block-map kernels alone. */
static bool find_row_intervals(attn_block_mask *bm) {
    attn_block_map *m = &bm->map;
    if (m->heads != 1 && !same_for_every_head(m)) return true;
    size_t n = m->batch * m->q_len;
    bm->row_lo = attn_malloc(n * sizeof(int64_t));
    bm->row_hi = attn_malloc(n * sizeof(int64_t));
    if (!bm->row_lo || !bm->row_hi) return false;
    for (size_t b = 0; b < m->batch; b++) {
        int64_t prev_lo = 0, prev_hi = 0;
        for (size_t i = 0; i < m->q_len; i++) {
            int64_t lo, hi;
            if (!row_interval(m, attn_block_map_row(m, b, 0, i / m->block_q), i, &lo, &hi))
                goto none;
            if (lo == hi) lo = hi = prev_hi; /* nothing visible: placed where the ends allow */
            if (lo < prev_lo || hi < prev_hi) goto none;
            bm->row_lo[b * m->q_len + i] = prev_lo = lo;
            bm->row_hi[b * m->q_len + i] = prev_hi = hi;
        }
    }
    m->row_lo = bm->row_lo;
    m->row_hi = bm->row_hi;
    m->rows_batch = m->batch;
    return true;
none:
    attn_free(bm->row_lo);
    attn_free(bm->row_hi);
    bm->row_lo = bm->row_hi = NULL;
    return true;
}

/* The key blocks [*first, *end) that hold every key rows [q0, q1) of (b,
 * h) may see, from the source's span of them; the others are empty. */
static void key_blocks_spanned(const block_source *src, const attn_block_map *m, size_t b,
                               size_t h, size_t q0, size_t q1, size_t *first, size_t *end) {
    int64_t lo, hi;
    src->keys_span(src->self, b, h, q0, q1, &lo, &hi);
    if (lo < 0) lo = 0;
    if (hi > (int64_t)m->kv_len) hi = (int64_t)m->kv_len; /* kv_len <= UINT32_MAX */
    if (lo >= hi) {
        *first = *end = 0;
        return;
    }
    *first = (size_t)lo / m->block_kv;
    *end = ((size_t)hi + m->block_kv - 1) / m->block_kv;
}

/* A map past this machine's memory (limit), at least bytes of it. */
static attn_status past_memory(attn_ctx *ctx, const char *who, const attn_block_map *m,
                               size_t bytes, size_t limit) {
    return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                     "%s: the block map of (%zu, %zu, %zu, %zu) in blocks of (%zu, %zu) takes "
                     "at least %zu bytes, more than this machine's memory (%zu bytes)", who,
                     m->batch, m->heads, m->q_len, m->kv_len, m->block_q, m->block_kv, bytes,
                     limit);
}

/* The bytes a listed tile adds to a map: its entries in the lists and the
 * transpose; a partial one also its tile twice and its bits. */
static size_t tile_cost(const attn_block_map *m, block_class cls) {
    size_t full_cost = 2 * sizeof(uint32_t);
    if (cls != BLOCK_PARTIAL) return cls == BLOCK_FULL ? full_cost : 0;
    return full_cost + 2 * sizeof(size_t) + m->block_q * m->words_per_row * sizeof(uint64_t);
}

/* A map's bytes are refused past this machine's memory before they are
 * allocated, rather than allocated until the system kills the process. Every
 * source's map is checked here for what does not depend on its tiles (the
 * offsets of its rows and columns and its rows' intervals: a dense mask
 * broadcast by strides, or a callback, describes a map of any size in a few
 * bytes), and the builder counts each tile's bytes against the limit before
 * it keeps the tile. A source that classifies its tiles and spans its rows'
 * keys (a mask description) is checked for its tiles too: its map's bytes,
 * bounded from the classes (a partial tile may still turn out full or
 * empty), before any tile is built. *fixed receives the bytes that do not
 * depend on the tiles, limit the machine's memory (0: unknown, nothing is
 * refused). */
static attn_status check_map_bytes(attn_ctx *ctx, const char *who, const block_source *src,
                                   const attn_block_map *m, size_t *fixed, size_t *limit_out) {
    size_t limit = attn_physical_memory();
    *fixed = 0;
    *limit_out = limit;
    if (!limit) return ATTN_OK;
    size_t planes = m->batch * m->heads; /* checked in check_config */
    /* the offsets of the rows and of the columns, lists and transpose; past
     * size_t, past any memory */
    size_t offsets, bytes;
    if (!attn_mul_size(planes, m->q_blocks + m->kv_blocks, &offsets) ||
        !attn_add_size(offsets, 2, &offsets) ||
        !attn_mul_size(offsets, 2 * sizeof(size_t), &bytes))
        bytes = (size_t)-1;
    /* and each row's interval of keys, which a map the same for every head keeps */
    size_t intervals;
    if (!attn_mul3_size(2 * sizeof(int64_t), m->batch, m->q_len, &intervals) ||
        !attn_add_size(bytes, intervals, &bytes))
        bytes = (size_t)-1;
    *fixed = bytes;
    if (bytes > limit) return past_memory(ctx, who, m, bytes, limit);
    if (src->listed || (!src->classify && !src->rereadable)) return ATTN_OK;
    size_t part_cost = tile_cost(m, BLOCK_PARTIAL);
    /* first a bound from the spans alone, every tile in them partial: most
     * maps are well within it, and their tiles are then classified once */
    size_t bound = bytes, first = 0, end = m->kv_blocks;
    for (size_t b = 0; b < m->batch && bound <= limit; b++)
        for (size_t h = 0; h < m->heads && bound <= limit; h++)
            for (size_t qb = 0; qb < m->q_blocks && bound <= limit; qb++) {
                size_t q0 = qb * m->block_q;
                size_t q1 = q0 + m->block_q < m->q_len ? q0 + m->block_q : m->q_len;
                size_t spanned;
                if (src->keys_span) key_blocks_spanned(src, m, b, h, q0, q1, &first, &end);
                if (!attn_mul_size(end - first, part_cost, &spanned) ||
                    !attn_add_size(bound, spanned, &bound))
                    bound = (size_t)-1;
            }
    if (bound <= limit) return ATTN_OK;
    /* then each tile's class: in closed form, or read from the source's bits
     * where it has none (a dense mask, which reading leaves as it was) */
    uint64_t *scratch = NULL;
    if (!src->classify &&
        !(scratch = attn_malloc(m->block_q * m->words_per_row * sizeof(uint64_t))))
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for a tile's bits", who);
    attn_status st = ATTN_OK;
    for (size_t b = 0; b < m->batch && bytes <= limit && st == ATTN_OK; b++)
        for (size_t h = 0; h < m->heads && bytes <= limit && st == ATTN_OK; h++)
            for (size_t qb = 0; qb < m->q_blocks && bytes <= limit && st == ATTN_OK; qb++) {
                size_t q0 = qb * m->block_q;
                size_t q1 = q0 + m->block_q < m->q_len ? q0 + m->block_q : m->q_len;
                if (src->keys_span) key_blocks_spanned(src, m, b, h, q0, q1, &first, &end);
                for (size_t kb = first; kb < end && bytes <= limit && st == ATTN_OK; kb++) {
                    size_t k0 = kb * m->block_kv;
                    size_t k1 = k0 + m->block_kv < m->kv_len ? k0 + m->block_kv : m->kv_len;
                    block_class cls = BLOCK_PARTIAL;
                    if (src->classify) cls = src->classify(src->self, b, h, q0, q1, k0, k1);
                    else st = tile_bits(ctx, who, src, m, b, h, qb, kb, scratch, &cls);
                    bytes += tile_cost(m, cls);
                }
            }
    attn_free(scratch);
    if (st != ATTN_OK) return st;
    return bytes > limit ? past_memory(ctx, who, m, bytes, limit) : ATTN_OK;
}

attn_status attn_block_mask_build(attn_ctx *ctx, const char *who,
                                  const attn_block_mask_config *cfg, const block_source *src,
                                  attn_block_mask **out) {
    if (out) *out = NULL; /* on any failure, as the constructors promise */
    attn_block_mask_config c = {0};
    attn_status st = check_config(ctx, who, cfg, &c);
    if (st != ATTN_OK) return st;
    attn_block_mask *bm = attn_calloc(1, sizeof *bm);
    if (!bm) return no_memory(ctx, who, &c);
    attn_block_map *m = &bm->map;
    *m = (attn_block_map){.batch = c.batch, .heads = c.heads, .q_len = c.q_len,
                          .kv_len = c.kv_len, .block_q = c.block_q, .block_kv = c.block_kv,
                          .q_blocks = (c.q_len + c.block_q - 1) / c.block_q,
                          .kv_blocks = (c.kv_len + c.block_kv - 1) / c.block_kv,
                          .words_per_row = c.block_kv < 64 ? 1 : c.block_kv / 64};
    size_t rows = c.batch * c.heads * m->q_blocks, tile_words = c.block_q * m->words_per_row;
    size_t full_cap = 0, part_cap = 0, tiles_cap = 0, tiles = 0, bytes, limit;
    if ((st = check_map_bytes(ctx, who, src, m, &bytes, &limit)) != ATTN_OK) {
        attn_block_mask_free(bm);
        return st;
    }
    bm->full_at = attn_calloc(rows + 1, sizeof(size_t));
    bm->part_at = attn_calloc(rows + 1, sizeof(size_t));
    uint64_t *scratch = attn_malloc(tile_words * sizeof(uint64_t));
    uint32_t *listed = src->listed ? attn_malloc(m->kv_blocks * sizeof(uint32_t)) : NULL;
    block_class *classes = src->listed ? attn_malloc(m->kv_blocks * sizeof(block_class)) : NULL;
    if (!bm->full_at || !bm->part_at || !scratch || (src->listed && (!listed || !classes)))
        goto oom;
    for (size_t b = 0; b < c.batch; b++)
        for (size_t h = 0; h < c.heads; h++)
            for (size_t qb = 0; qb < m->q_blocks; qb++) {
                size_t r = attn_block_map_row(m, b, h, qb), first = 0, count = m->kv_blocks;
                if (src->listed &&
                    (st = src->listed(src->self, ctx, who, b, h, qb, listed, classes, &count)) !=
                        ATTN_OK)
                    goto fail;
                size_t q0 = qb * c.block_q, q1 = q0 + c.block_q < c.q_len ? q0 + c.block_q : c.q_len;
                if (!listed && src->keys_span)
                    key_blocks_spanned(src, m, b, h, q0, q1, &first, &count);
                for (size_t e = first; e < count; e++) {
                    size_t kb = listed ? listed[e] : e;
                    size_t k0 = kb * c.block_kv;
                    size_t k1 = k0 + c.block_kv < c.kv_len ? k0 + c.block_kv : c.kv_len;
                    block_class cls = listed ? classes[e]
                                      : src->classify ? src->classify(src->self, b, h, q0, q1, k0, k1)
                                                      : BLOCK_PARTIAL;
                    if (cls == BLOCK_PARTIAL &&
                        (st = tile_bits(ctx, who, src, m, b, h, qb, kb, scratch, &cls)) != ATTN_OK)
                        goto fail;
                    if (limit && (bytes += tile_cost(m, cls)) > limit) {
                        st = past_memory(ctx, who, m, bytes, limit);
                        goto fail;
                    }
                    if (cls == BLOCK_FULL) {
                        if (!grow((void **)&bm->full, &full_cap, bm->full_count + 1, sizeof(uint32_t)))
                            goto oom;
                        bm->full[bm->full_count++] = (uint32_t)kb;
                    } else if (cls == BLOCK_PARTIAL) {
                        if (!grow((void **)&bm->part, &part_cap, bm->part_count + 1, sizeof(uint32_t)))
                            goto oom;
                        size_t need = (tiles + 1) * tile_words;
                        if (!grow((void **)&bm->bits, &tiles_cap, need, sizeof(uint64_t))) goto oom;
                        memcpy(bm->bits + tiles * tile_words, scratch, tile_words * sizeof(uint64_t));
                        bm->part[bm->part_count++] = (uint32_t)kb;
                        tiles++;
                    }
                }
                bm->full_at[r + 1] = bm->full_count;
                bm->part_at[r + 1] = bm->part_count;
            }
    /* partial entries are their tiles, in order */
    bm->part_tile = attn_malloc((bm->part_count ? bm->part_count : 1) * sizeof(size_t));
    if (!bm->part_tile) goto oom;
    for (size_t e = 0; e < bm->part_count; e++) bm->part_tile[e] = e;
    if (!bm->full) bm->full = attn_malloc(sizeof(uint32_t));
    if (!bm->part) bm->part = attn_malloc(sizeof(uint32_t));
    if (!bm->bits) bm->bits = attn_calloc(tile_words, sizeof(uint64_t));
    if (!bm->full || !bm->part || !bm->bits) goto oom;
    m->full_at = bm->full_at;
    m->part_at = bm->part_at;
    m->full = bm->full;
    m->part = bm->part;
    m->part_tile = bm->part_tile;
    m->bits = bm->bits;
    if (!transpose(bm) || (!src->no_row_intervals && !find_row_intervals(bm))) goto oom;
    attn_free(scratch);
    attn_free(listed);
    attn_free(classes);
    *out = bm;
    return ATTN_OK;
oom:
    st = no_memory(ctx, who, &c);
fail:
    attn_free(scratch);
    attn_free(listed);
    attn_free(classes);
    attn_block_mask_free(bm);
    return st;
}

/* ---- dense masks and callbacks ---------------------------------------------- */

typedef struct dense_source {
    const void *mask; /* uint8_t or float */
    size_t st[4];
    bool additive;
} dense_source;

/* Bit i of the result set where byte i of the 8 at p is nonzero. */
static uint64_t nonzero_bytes(const uint8_t *p) {
    uint64_t x, low7 = 0x7f7f7f7f7f7f7f7full;
    memcpy(&x, p, sizeof x);
    /* each byte's high bit: set by its own, or by a carry out of its low seven */
    uint64_t high = (((x & low7) + low7) | x) & ~low7;
    /* the eight high bits gathered into the top byte, byte i to bit 56 + i */
    return (high >> 7) * 0x0102040810204080ull >> 56;
}

static attn_status dense_row_bits(const void *self, attn_ctx *ctx, const char *who, size_t b,
                                  size_t h, size_t q, size_t k0, size_t k1, uint64_t *words) {
    const dense_source *d = self;
    size_t at = b * d->st[0] + h * d->st[1] + q * d->st[2];
    if (!d->additive && d->st[3] == 1) { /* contiguous bytes: eight at a time */
        const uint8_t *row = (const uint8_t *)d->mask + at;
        size_t j = k0;
        for (; j + 8 <= k1; j += 8)
            words[(j - k0) >> 6] |= nonzero_bytes(row + j) << ((j - k0) & 63);
        for (; j < k1; j++)
            if (row[j]) words[(j - k0) >> 6] |= (uint64_t)1 << ((j - k0) & 63);
        return ATTN_OK;
    }
    for (size_t j = k0; j < k1; j++) {
        bool visible;
        if (d->additive) {
            float x = ((const float *)d->mask)[at + j * d->st[3]];
            if (isnan(x) || x == INFINITY)
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "%s: the additive mask holds %g at (%zu, %zu, %zu, %zu): only "
                                 "-inf hides, and the rest must be finite",
                                 who, (double)x, b, h, q, j);
            visible = x != -INFINITY;
        } else {
            visible = ((const uint8_t *)d->mask)[at + j * d->st[3]] != 0;
        }
        if (visible) words[(j - k0) >> 6] |= (uint64_t)1 << ((j - k0) & 63);
    }
    return ATTN_OK;
}

static attn_status from_dense(attn_ctx *ctx, const char *who, const attn_block_mask_config *cfg,
                              const void *mask, const size_t strides[4], bool additive,
                              attn_block_mask **out) {
    if (out) *out = NULL; /* on any failure, as the constructors promise */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!mask || !strides || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", who,
                         !mask ? "mask" : !strides ? "strides" : "out");
    if (cfg) { /* the last element must lie in memory: reading past it would fault */
        size_t dims[4] = {cfg->batch, cfg->heads, cfg->q_len, cfg->kv_len}, elements, bytes;
        bool fits = attn_strided_extent(4, dims, strides, 1, &elements) &&
                    attn_mul_size(elements, additive ? sizeof(float) : 1, &bytes) &&
                    bytes <= UINTPTR_MAX - (uintptr_t)mask;
        if (!fits)
            return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                             "%s: strides (%zu, %zu, %zu, %zu) over (batch %zu, heads %zu, "
                             "q_len %zu, kv_len %zu) reach past the end of memory",
                             who, strides[0], strides[1], strides[2], strides[3], dims[0],
                             dims[1], dims[2], dims[3]);
    }
    dense_source d = {mask, {strides[0], strides[1], strides[2], strides[3]}, additive};
    block_source src = {.self = &d, .row_bits = dense_row_bits, .same_rows = strides[2] == 0,
                        .rereadable = true};
    return attn_block_mask_build(ctx, who, cfg, &src, out);
}

attn_status attn_block_mask_from_bool(attn_ctx *ctx, const attn_block_mask_config *cfg,
                                      const uint8_t *mask, const size_t strides[4],
                                      attn_block_mask **out) {
    return from_dense(ctx, "attn_block_mask_from_bool", cfg, mask, strides, false, out);
}

attn_status attn_block_mask_from_additive(attn_ctx *ctx, const attn_block_mask_config *cfg,
                                          const float *mask, const size_t strides[4],
                                          attn_block_mask **out) {
    return from_dense(ctx, "attn_block_mask_from_additive", cfg, mask, strides, true, out);
}

typedef struct fn_source {
    attn_mask_fn fn;
    void *user;
} fn_source;

static attn_status fn_row_bits(const void *self, attn_ctx *ctx, const char *who, size_t b,
                               size_t h, size_t q, size_t k0, size_t k1, uint64_t *words) {
    const fn_source *f = self;
    for (size_t j = k0; j < k1; j++) {
        int r = f->fn(f->user, b, h, q, j);
        if (r < 0)
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "%s: the mask callback returned %d at (%zu, %zu, %zu, %zu)", who, r,
                             b, h, q, j);
        if (r) words[(j - k0) >> 6] |= (uint64_t)1 << ((j - k0) & 63);
    }
    return ATTN_OK;
}

attn_status attn_block_mask_from_fn(attn_ctx *ctx, const attn_block_mask_config *cfg,
                                    attn_mask_fn fn, void *user, attn_block_mask **out) {
    const char *who = "attn_block_mask_from_fn";
    if (out) *out = NULL; /* on any failure, as the constructors promise */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!fn || !out) return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", who, !fn ? "fn" : "out");
    fn_source f = {fn, user};
    block_source src = {.self = &f, .row_bits = fn_row_bits};
    return attn_block_mask_build(ctx, who, cfg, &src, out);
}

/* ---- what a map tells ------------------------------------------------------- */

attn_status attn_block_mask_get_info(const attn_block_mask *bm, attn_block_mask_info *out) {
    if (!bm || !out) return ATTN_ERR_NULL;
    const attn_block_map *m = &bm->map;
    double tiles = (double)m->batch * (double)m->heads * (double)m->q_blocks * (double)m->kv_blocks;
    *out = (attn_block_mask_info){
        .config = {m->batch, m->heads, m->q_len, m->kv_len, m->block_q, m->block_kv},
        .q_blocks = m->q_blocks, .kv_blocks = m->kv_blocks,
        .full_blocks = bm->full_count, .partial_blocks = bm->part_count,
        .sparsity = 100.0 * (1.0 - (double)(bm->full_count + bm->part_count) / tiles),
        .row_intervals = m->row_lo != NULL};
    return ATTN_OK;
}

attn_status attn_block_mask_to_string(const attn_block_mask *bm, size_t b, size_t h, char *buf,
                                      size_t size, size_t *needed) {
    if (!bm || (!buf && size)) return ATTN_ERR_NULL;
    const attn_block_map *m = &bm->map;
    if (b >= m->batch || h >= m->heads) return ATTN_ERR_INVALID;
    size_t total = m->q_blocks * (m->kv_blocks + 1) + 1;
    if (needed) *needed = total;
    if (size < total) return size ? ATTN_ERR_INVALID : ATTN_OK; /* buf untouched */
    char *c = buf;
    for (size_t qb = 0; qb < m->q_blocks; qb++) {
        size_t r = attn_block_map_row(m, b, h, qb);
        memset(c, '.', m->kv_blocks);
        for (size_t e = m->full_at[r]; e < m->full_at[r + 1]; e++) c[m->full[e]] = '#';
        for (size_t e = m->part_at[r]; e < m->part_at[r + 1]; e++) c[m->part[e]] = '~';
        c += m->kv_blocks;
        *c++ = '\n';
    }
    *c = '\0';
    return ATTN_OK;
}
