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

/* A chain of count modifiers for heads query heads (the tensors' sizes as
 * far as they are known here), by name: kind, values, tensors and
 * callbacks present. who names the caller in the message. */
attn_status attn_score_mods_check(attn_ctx *ctx, const char *who, const attn_score_mod *mods,
                                  size_t count, size_t heads);

#endif /* ATTN_MASK_INTERNAL_H */
