/*
 * block_map.h — a block map as the kernels read it (the public
 * attn_block_mask holds one, src/mask/): which key blocks each query block
 * visits, full or partial, the partial tiles' bits, the transpose the
 * backward's key-side pass walks, and, for masks whose rows are single key
 * intervals, those intervals (attn_visible_keys intersects them).
 *
 * Geometry: the (T, S) scores of (b, h) cut into q_blocks x kv_blocks
 * tiles of block_q x block_kv (the last ones cut short at T and S). A map
 * of batch or heads 1 serves every b or h. Row r of the map, for (b, h,
 * query block qb), is r = (b' * heads + h') * q_blocks + qb with b' = b
 * or 0, h' = h or 0 (attn_block_map_row). Column c, for (b, h, key block
 * kb), is c = (b' * heads + h') * kv_blocks + kb.
 */
#ifndef ATTN_BLOCK_MAP_H
#define ATTN_BLOCK_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The largest block a map's tiles have, either side. */
#define ATTN_BLOCK_MAP_MAX_BLOCK 256

typedef struct attn_block_map {
    size_t batch, heads;            /* 1 where broadcast */
    size_t q_len, kv_len;
    size_t block_q, block_kv;       /* powers of two, 16 .. ATTN_BLOCK_MAP_MAX_BLOCK */
    size_t q_blocks, kv_blocks;     /* ceil(q_len / block_q), ceil(kv_len / block_kv) */
    /* By row: the key blocks of row r are full[full_at[r] .. full_at[r + 1])
     * and part[part_at[r] .. part_at[r + 1]), each ascending; partial block
     * part[e] has its bits in tile part_tile[e]. */
    const size_t *full_at, *part_at;  /* (rows + 1) */
    const uint32_t *full, *part;      /* key block indices */
    const size_t *part_tile;          /* into bits */
    /* By column (the transpose): the query blocks of column c are
     * t_full[t_full_at[c] ..) and t_part[t_part_at[c] ..), ascending, the
     * partial ones' bits in tile t_part_tile[e] (the same tiles). */
    const size_t *t_full_at, *t_part_at; /* (columns + 1) */
    const uint32_t *t_full, *t_part;
    const size_t *t_part_tile;
    /* Partial tiles' bits: tile t is block_q rows of words_per_row uint64
     * words; bit (j % 64) of word j / 64 of row i is element (i, j) of the
     * tile (1: visible). Rows and keys past T and S are 0. */
    const uint64_t *bits;
    size_t words_per_row;           /* block_kv / 64, at least 1 */
    /* Row intervals, or NULL: query i of sequence b sees exactly the keys
     * [row_lo[b' * q_len + i], row_hi[b' * q_len + i]) for every head (b' = b
     * or 0 as rows_batch is batch or 1), both non-decreasing in i, lo >= hi
     * for a row that sees nothing. */
    const int64_t *row_lo, *row_hi;
    size_t rows_batch;
} attn_block_map;

/* The map's row for (b, h, query block qb). */
static inline size_t attn_block_map_row(const attn_block_map *m, size_t b, size_t h, size_t qb) {
    size_t bb = m->batch == 1 ? 0 : b, hh = m->heads == 1 ? 0 : h;
    return (bb * m->heads + hh) * m->q_blocks + qb;
}

/* The map's column for (b, h, key block kb). */
static inline size_t attn_block_map_column(const attn_block_map *m, size_t b, size_t h,
                                           size_t kb) {
    size_t bb = m->batch == 1 ? 0 : b, hh = m->heads == 1 ? 0 : h;
    return (bb * m->heads + hh) * m->kv_blocks + kb;
}

/* Whether element (i, j) of partial tile t is visible (i, j within the tile). */
static inline bool attn_block_map_bit(const attn_block_map *m, size_t t, size_t i, size_t j) {
    const uint64_t *row = m->bits + (t * m->block_q + i) * m->words_per_row;
    return (row[j >> 6] >> (j & 63)) & 1u;
}

#endif /* ATTN_BLOCK_MAP_H */
