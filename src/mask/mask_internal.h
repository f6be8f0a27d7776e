/*
 * mask_internal.h — what the rest of the library reads of programmable
 * attention's public objects (attn.h): a block mask's map as the kernels
 * take it, and the checks of a chain of score modifiers.
 */
#ifndef ATTN_MASK_INTERNAL_H
#define ATTN_MASK_INTERNAL_H

#include "contract/block_map.h"
#include "internal.h"

/* The map m holds (never NULL for a mask attn_block_mask_* made). */
const attn_block_map *attn_block_mask_map(const attn_block_mask *m);

/* The rectangle heads [h0, h1) x queries [q0, q1) x keys [k0, k1) of every
 * sequence of m as a map of its own (block_slice.c): m's batch and block
 * sizes, q1 - q0 by k1 - k0, h1 - h0 heads (a map of heads 1 keeps one);
 * freed with attn_block_mask_free. Element (b, h, i, j) of the slice is
 * element (b, h0 + h, q0 + i, k0 + j) of m. who names the caller. */
attn_status attn_block_map_slice(attn_ctx *ctx, const char *who, const attn_block_map *m,
                                 size_t h0, size_t h1, size_t q0, size_t q1, size_t k0, size_t k1,
                                 attn_block_mask **out);

/* Heads [h0, h1) of m, every query and key, as a map that runs on the
 * kernels m runs on (block_slice.c): where m keeps no row intervals (its
 * heads differ), neither does the slice, though its own heads may be
 * alike, so that each head's attention takes the same path and gives the
 * same bits as in m (Ulysses's split of the heads). */
attn_status attn_block_map_heads(attn_ctx *ctx, const char *who, const attn_block_map *m,
                                 size_t h0, size_t h1, attn_block_mask **out);

/* Sequence b of m (any b where m's batch is 1), every head, queries
 * [0, q_len) x keys [0, kv_len), as a map of batch 1 (block_slice.c). */
attn_status attn_block_map_sequence(attn_ctx *ctx, const char *who, const attn_block_map *m,
                                    size_t b, size_t q_len, size_t kv_len,
                                    attn_block_mask **out);

/* Whether m lets no query see any key. */
static inline bool attn_block_map_empty(const attn_block_map *m) {
    size_t rows = m->batch * m->heads * m->q_blocks;
    return m->full_at[rows] == 0 && m->part_at[rows] == 0;
}

/* A chain of count modifiers for heads query heads (the tensors' sizes as
 * far as they are known here), by name: kind, values, tensors and
 * callbacks present. who names the caller in the message. */
attn_status attn_score_mods_check(attn_ctx *ctx, const char *who, const attn_score_mod *mods,
                                  size_t count, size_t heads);

#endif /* ATTN_MASK_INTERNAL_H */
