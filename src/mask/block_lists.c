/*
 * block_lists.c — attn_block_mask_from_kv_blocks (BlockMask.from_kv_blocks):
 * a map from the key blocks each query block lists, partial and full. The
 * builder asks for a row's blocks through the source's listed hook, which
 * checks them (range, count, duplicates, naming the row) and hands them
 * back ascending; a partial block's bits come from the mask, if any.
 */
#include "mask/mask.h"

#include <string.h>

typedef struct lists_source {
    size_t heads, q_blocks, kv_blocks;
    const int32_t *num, *indices, *full_num, *full_indices;
    size_t max, full_max;
    const attn_mask *mask;
    /* per row, the blocks seen so far and which of them are full (one bit
     * per key block), cleared again as the row is handed back */
    uint64_t *seen, *full;
} lists_source;

/* Marks the count blocks of one list of row (b, h, qb); false after a
 * message naming the block at fault. */
static attn_status mark(attn_ctx *ctx, const char *who, const lists_source *s, size_t b,
                        size_t h, size_t qb, const int32_t *list, size_t count, bool full,
                        const char *name) {
    for (size_t e = 0; e < count; e++) {
        int32_t kb = list[e];
        if (kb < 0 || (size_t)kb >= s->kv_blocks)
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "%s: %s[b %zu, h %zu, query block %zu][%zu] (%d) is not a key "
                             "block (0 .. %zu)", who, name, b, h, qb, e, (int)kb,
                             s->kv_blocks - 1);
        uint64_t bit = (uint64_t)1 << (kb & 63);
        if (s->seen[kb >> 6] & bit)
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "%s: key block %d is listed twice for (b %zu, h %zu, query block "
                             "%zu)%s", who, (int)kb, b, h, qb,
                             full && !(s->full[kb >> 6] & bit) ? ", partial and full" : "");
        s->seen[kb >> 6] |= bit;
        if (full) s->full[kb >> 6] |= bit;
    }
    return ATTN_OK;
}

static attn_status lists_listed(const void *self, attn_ctx *ctx, const char *who, size_t b,
                                size_t h, size_t qb, uint32_t *blocks, block_class *classes,
                                size_t *count) {
    const lists_source *s = self;
    size_t r = (b * s->heads + h) * s->q_blocks + qb, words = (s->kv_blocks + 63) / 64;
    int32_t n = s->num[r], fn = s->full_num ? s->full_num[r] : 0;
    if (n < 0 || (size_t)n > s->max)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: num[b %zu, h %zu, query block %zu] (%d) must be 0 .. max (%zu)",
                         who, b, h, qb, (int)n, s->max);
    if (fn < 0 || (size_t)fn > s->full_max)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: full_num[b %zu, h %zu, query block %zu] (%d) must be 0 .. "
                         "full_max (%zu)", who, b, h, qb, (int)fn, s->full_max);
    attn_status st = mark(ctx, who, s, b, h, qb, s->indices + r * s->max, (size_t)n, false,
                          "indices");
    if (st == ATTN_OK && fn)
        st = mark(ctx, who, s, b, h, qb, s->full_indices + r * s->full_max, (size_t)fn, true,
                  "full_indices");
    /* the marks handed back in order, and cleared for the next row */
    size_t c = 0;
    for (size_t w = 0; w < words && (n || fn); w++) {
        for (uint64_t bits = s->seen[w]; bits; bits &= bits - 1) {
            size_t kb = w * 64 + (size_t)__builtin_ctzll(bits);
            blocks[c] = (uint32_t)kb;
            classes[c++] = (s->full[w] >> (kb & 63)) & 1 ? BLOCK_FULL : BLOCK_PARTIAL;
        }
        s->seen[w] = s->full[w] = 0;
    }
    *count = c;
    return st;
}

static attn_status lists_row_bits(const void *self, attn_ctx *ctx, const char *who, size_t b,
                                  size_t h, size_t q, size_t k0, size_t k1, uint64_t *words) {
    const lists_source *s = self;
    if (s->mask) return attn_mask_row_bits(s->mask, ctx, who, b, h, q, k0, k1, words);
    for (size_t j = 0; j < k1 - k0; j += 64) {
        size_t n = k1 - k0 - j;
        words[j / 64] = n >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;
    }
    return ATTN_OK;
}

static bool power_of_two_in(size_t x, size_t lo, size_t hi) {
    return x >= lo && x <= hi && (x & (x - 1)) == 0;
}

attn_status attn_block_mask_from_kv_blocks(attn_ctx *ctx, const attn_block_mask_config *cfg,
                                           const int32_t *num, const int32_t *indices,
                                           size_t max, const int32_t *full_num,
                                           const int32_t *full_indices, size_t full_max,
                                           const attn_mask *mask, attn_block_mask **out) {
    const char *who = "attn_block_mask_from_kv_blocks";
    if (out) *out = NULL; /* on any failure, as the constructors promise */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !num || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", who,
                         !cfg ? "cfg" : !num ? "num" : "out");
    if (max && !indices)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: indices is NULL with max %zu", who, max);
    if (full_num && full_max && !full_indices)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: full_indices is NULL with full_max %zu", who,
                         full_max);
    attn_status st = mask ? attn_mask_check_config(ctx, who, mask, cfg) : ATTN_OK;
    if (st != ATTN_OK) return st;
    lists_source s = {.heads = cfg->heads, .num = num, .indices = indices, .max = max,
                      .full_num = full_num, .full_indices = full_indices,
                      .full_max = full_num ? full_max : 0, .mask = mask};
    size_t block_q = cfg->block_q ? cfg->block_q : 64, block_kv = cfg->block_kv ? cfg->block_kv : 64;
    /* the bitmaps only for a config the builder takes: it refuses the
     * others, by name, before asking for any row */
    if (power_of_two_in(block_q, 16, 256) && power_of_two_in(block_kv, 16, 256) &&
        cfg->kv_len <= UINT32_MAX && cfg->q_len <= UINT32_MAX && cfg->kv_len) {
        s.q_blocks = (cfg->q_len + block_q - 1) / block_q;
        s.kv_blocks = (cfg->kv_len + block_kv - 1) / block_kv;
        size_t rows, entries;
        if (!attn_mul3_size(cfg->batch, cfg->heads, s.q_blocks, &rows) ||
            !attn_mul_size(rows, max > s.full_max ? max : s.full_max, &entries))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                             "%s: lists of (%zu, %zu, %zu) rows of %zu and %zu overflow", who,
                             cfg->batch, cfg->heads, s.q_blocks, max, full_max);
        size_t words = (s.kv_blocks + 63) / 64;
        s.seen = attn_calloc(words, sizeof(uint64_t));
        s.full = attn_calloc(words, sizeof(uint64_t));
        if (!s.seen || !s.full) {
            attn_free(s.seen);
            attn_free(s.full);
            return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for the block lists",
                             who);
        }
    }
    block_source src = {.self = &s, .row_bits = lists_row_bits, .listed = lists_listed};
    st = attn_block_mask_build(ctx, who, cfg, &src, out);
    attn_free(s.seen);
    attn_free(s.full);
    return st;
}
