/*
 * mask.h — a mask description (attn.h's attn_mask) as the block-map
 * sources read it: mask.c classifies tiles and fills rows of bits from it,
 * block_lists.c reads a partial block's elements through it.
 */
#ifndef ATTN_MASK_MASK_H
#define ATTN_MASK_MASK_H

#include "mask/block_build.h"

/* Whether mask fits the map of cfg (document lengths, per-sequence counts
 * against the batch), by name; who names the caller. */
attn_status attn_mask_check_config(attn_ctx *ctx, const char *who, const attn_mask *mask,
                                   const attn_block_mask_config *cfg);

/* block_source.classify and .row_bits over a mask (self: the attn_mask),
 * for a mask that passed attn_mask_check_config. */
block_class attn_mask_classify(const void *self, size_t b, size_t h, size_t q0, size_t q1,
                               size_t k0, size_t k1);
attn_status attn_mask_row_bits(const void *self, attn_ctx *ctx, const char *who, size_t b,
                               size_t h, size_t q, size_t k0, size_t k1, uint64_t *words);

#endif /* ATTN_MASK_MASK_H */
