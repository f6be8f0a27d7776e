/*
 * block_build.h — the one builder of block maps (block_mask.c) and the
 * sources it reads visibility from: a dense mask, a callback, a mask
 * description (mask.c), block lists. A source classifies a tile where it
 * can in closed form and gives the bits of a row of keys; the builder asks
 * for bits only where a tile is partial or unknown, drops tiles whose bits
 * turn out all hidden, promotes those all visible, builds the transpose
 * and, where the map is the same for every head, the row intervals.
 */
#ifndef ATTN_MASK_BLOCK_BUILD_H
#define ATTN_MASK_BLOCK_BUILD_H

#include "mask/mask_internal.h"

typedef enum block_class {
    BLOCK_EMPTY = 0,
    BLOCK_FULL = 1,
    BLOCK_PARTIAL = 2 /* or unknown: the bits decide */
} block_class;

typedef struct block_source {
    const void *self;
    /* The class of rows [q0, q1) x keys [k0, k1) of (b, h); NULL: unknown. */
    block_class (*classify)(const void *self, size_t b, size_t h, size_t q0, size_t q1,
                            size_t k0, size_t k1);
    /* words (bit j - k0 of the little-endian words, zeroed by the caller)
     * set where (b, h, q, j), k0 <= j < k1, is visible; a message naming
     * the element on failure. */
    attn_status (*row_bits)(const void *self, attn_ctx *ctx, const char *who, size_t b,
                            size_t h, size_t q, size_t k0, size_t k1, uint64_t *words);
    /* The key blocks a row of the map may visit (NULL: every one): for
     * from_kv_blocks, the listed ones, with class BLOCK_FULL or
     * BLOCK_PARTIAL each; *count of them into blocks/classes (room for
     * kv_blocks), ascending. */
    attn_status (*listed)(const void *self, attn_ctx *ctx, const char *who, size_t b, size_t h,
                          size_t qb, uint32_t *blocks, block_class *classes, size_t *count);
    /* Keys [*lo, *hi) hold every key rows [q0, q1) of (b, h) may see (lo >=
     * hi: none); NULL: any key. The builder asks no tile outside them, so a
     * map of long rows that see few keys costs its tiles, not every tile. */
    void (*keys_span)(const void *self, size_t b, size_t h, size_t q0, size_t q1, int64_t *lo,
                      int64_t *hi);
    /* Whether every row of a (b, h) gives the same bits (a dense mask
     * broadcast over the queries, such as a key-padding mask): a tile's
     * first row then stands for the others. */
    bool same_rows;
    /* Whether row_bits may be asked twice for a tile, reading what it reads
     * and calling nothing of the caller's (a dense mask, not a callback
     * called once per element): the memory check may then read tiles ahead
     * of the build. */
    bool rereadable;
    /* Whether the map keeps no row intervals whatever its rows: a slice of
     * heads of a map that keeps none (attn_block_map_heads), which then
     * runs on the kernels its parent runs on (heads alike can have
     * intervals their parent lacks, and the kernels that read them round
     * otherwise). */
    bool no_row_intervals;
} block_source;

/* The block map of cfg (checked here, by name) read from src. */
attn_status attn_block_mask_build(attn_ctx *ctx, const char *who,
                                  const attn_block_mask_config *cfg, const block_source *src,
                                  attn_block_mask **out);

#endif /* ATTN_MASK_BLOCK_BUILD_H */
