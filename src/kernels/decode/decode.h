/*
 * decode.h — attention of a few new tokens against a KV cache (decoding):
 * the kernels behind attn_kv_cache_attend, one table per instruction set.
 *
 * A sequence's keys live at positions 0 .. len + rows - 1: those below len
 * in the cache (contiguous, a ring, or pages), the rest in the new rows,
 * all in the cache's stored formats (K's and V's apart). attn_decode_key_rows
 * turns positions into row pointers, the same arithmetic for every layout,
 * so a kernel reads the same numbers in the same order whatever the layout.
 *
 * The keys are cut into chunks of positions [c * C, (c + 1) * C) (C from
 * the sequence's length alone); a kernel returns one chunk's partial
 * softmax per (row, query head): its max m (base-2 logits), its sum l =
 * sum 2^(s - m) and acc = sum 2^(s - m) v. The caller folds the chunks in
 * order (attn_decode_fold), so the result depends on positions only, never
 * on which thread ran which chunk; a head's sink joins the folded result
 * (attn_decode_sink). Softcap and ALiBi change a score where it is made.
 * Within a chunk the keys go in blocks of ATTN_DECODE_BLOCK positions
 * aligned to multiples of it (online softmax).
 */
#ifndef ATTN_DECODE_H
#define ATTN_DECODE_H

#include "contract/block_map.h"
#include "contract/kv_format.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ATTN_DECODE_BLOCK 16
/* log2(e): base-2 logits are natural ones times it */
#define ATTN_DECODE_LOG2E 1.4426950408889634
/* The most rows one chunk call takes. */
#define ATTN_DECODE_ROWS 8
/* A pool page index that holds nothing. */
#define ATTN_DECODE_NO_PAGE UINT32_MAX

/* Where one of K and V of a sequence is, in its stored format
 * (contract/kv_format.h): a position's row holds kv_heads rows of codes
 * (row_bytes in all) and of scales (row_scales floats in all). */
typedef struct attn_decode_store {
    attn_kv_format fmt;
    size_t row_bytes, row_scales;
    const uint8_t *fresh;        /* position cached + r at row r */
    const float *fresh_scales;
    const uint8_t *cache;        /* contiguous: this sequence's slots; paged: the pool */
    const float *cache_scales;
} attn_decode_store;

/* Where one sequence's keys and values are. */
typedef struct attn_decode_keys {
    size_t cached; /* positions below this are in the cache */
    /* contiguous: position p at slot p % capacity */
    size_t capacity;
    /* paged (pages != NULL): logical page p / page_size at table entry
     * (p / page_size) % table_len, an index into the pools */
    const uint32_t *pages;
    size_t page_size, table_len;
    attn_decode_store k, v;
    /* Whether the kernel asks for the next block's lines while it reads a
     * block: keys that come from memory arrive sooner, while for keys an
     * L3 holds the requests only take load slots from the reading. */
    bool stream;
} attn_decode_keys;

/* A position's rows of K and V: codes and scales. */
typedef struct attn_decode_row {
    const uint8_t *k, *v;
    const float *ks, *vs;
} attn_decode_row;

/* Scales of row at of a store with per floats a row (none: base, maybe NULL). */
static inline const float *attn_decode_scales_at(const float *base, size_t at, size_t per) {
    return per ? base + at * per : base;
}

/* The rows of slot at of the new rows (fresh) or of the cache. */
static inline attn_decode_row attn_decode_row_at(const attn_decode_keys *m, bool fresh,
                                                 size_t at) {
    const attn_decode_store *K = &m->k, *V = &m->v;
    return (attn_decode_row){(fresh ? K->fresh : K->cache) + at * K->row_bytes,
                             (fresh ? V->fresh : V->cache) + at * V->row_bytes,
                             attn_decode_scales_at(fresh ? K->fresh_scales : K->cache_scales, at,
                                                   K->row_scales),
                             attn_decode_scales_at(fresh ? V->fresh_scales : V->cache_scales, at,
                                                   V->row_scales)};
}

/* rows[i] = the rows of positions first + i, i < n. Cached positions go in
 * runs of consecutive slots, their slot found (a division) where a run
 * starts: at first, where a page or the ring ends. */
static inline void attn_decode_key_rows(const attn_decode_keys *m, size_t first, size_t n,
                                        attn_decode_row *rows) {
    size_t i = 0;
    while (i < n && first + i < m->cached) {
        size_t pos = first + i, at, run;
        if (m->pages) {
            size_t in_page = pos % m->page_size;
            at = m->pages[(pos / m->page_size) % m->table_len] * m->page_size + in_page;
            run = m->page_size - in_page;
        } else {
            at = pos % m->capacity;
            run = m->capacity - at;
        }
        if (run > n - i) run = n - i;
        if (run > m->cached - pos) run = m->cached - pos;
        for (size_t stop = i + run; i < stop; i++, at++) rows[i] = attn_decode_row_at(m, false, at);
    }
    for (; i < n; i++) rows[i] = attn_decode_row_at(m, true, first + i - m->cached);
}

/* The new rows of one sequence and what they see: row r sits at position
 * first_pos + r and sees positions max(0, pos - window + 1) .. pos (window
 * 0: from 0). */
typedef struct attn_decode_seq {
    size_t q_heads, kv_heads, head_dim;
    float scale2;   /* scale * log2(e): scores in base-2 logits */
    const float *q; /* (rows, q_heads, head_dim) */
    size_t rows, first_pos, window;
    attn_decode_keys keys;
    /* A tree of draft tokens, or NULL: row r sees new row j (position
     * first_pos + j) only where bit j of tree row r (tree_words words from
     * tree + r * tree_words) is set. */
    const uint64_t *tree;
    size_t tree_words;
    /* Score modifiers (contract/attention_problem.h) in base-2 logits:
     * softcap as cap2 = softcap * log2(e) and 1 / cap2 (0, 0: none), s =
     * cap2 tanh(s / cap2); ALiBi's slopes (q_heads, as given; NULL: none),
     * s -= slope_h log2(e) (pos - key). A sink is no kernel's: it joins a
     * row's softmax once its chunks are folded (attn_decode_sink). */
    float cap2, inv_cap2;
    const float *alibi_slopes;
    /* A block map over positions (contract/block_map.h), or NULL: row r
     * of query head h sees position j only where the map's row for (map_b,
     * h, (first_pos + r) / block_q) lists j's key block full, or partial
     * with bit (first_pos + r, j) set. */
    const attn_block_map *map;
    size_t map_b;
} attn_decode_seq;

/* attn_decode_map_hidden's flag: the block's whole key block of the map is
 * left out for that row and head (no lane of it is visible). */
#define ATTN_DECODE_MAP_ABSENT (1u << 16)
_Static_assert(ATTN_DECODE_BLOCK == 16, "a block's lanes are the low 16 bits");

/* The lanes of the block of keys at b0 (a multiple of ATTN_DECODE_BLOCK,
 * so that the block lies in one key block of the map: block_kv is a
 * multiple of it) that the map hides from row r under query head h (bit j
 * for lane j), with ATTN_DECODE_MAP_ABSENT where the map leaves its key
 * block out. A full key block hides nothing and costs no test per key; a
 * partial one reads its 16 bits in one word of the tile. */
static inline uint32_t attn_decode_map_hidden(const attn_decode_seq *s, size_t r, size_t h,
                                              size_t b0) {
    const attn_block_map *m = s->map;
    size_t pos = s->first_pos + r, row = attn_block_map_row(m, s->map_b, h, pos / m->block_q);
    uint32_t kb = (uint32_t)(b0 / m->block_kv);
    const uint32_t *full = m->full + m->full_at[row];
    size_t lo = 0, hi = m->full_at[row + 1] - m->full_at[row];
    while (lo < hi) { /* full[] ascends */
        size_t mid = lo + (hi - lo) / 2;
        if (full[mid] == kb) return 0;
        if (full[mid] < kb) lo = mid + 1;
        else hi = mid;
    }
    const uint32_t *part = m->part + m->part_at[row];
    lo = 0;
    hi = m->part_at[row + 1] - m->part_at[row];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (part[mid] == kb) {
            size_t j = b0 % m->block_kv; /* 16 lanes within one 64-bit word */
            const uint64_t *bits = m->bits + (m->part_tile[m->part_at[row] + mid] * m->block_q +
                                              pos % m->block_q) * m->words_per_row;
            return ~(uint32_t)(bits[j >> 6] >> (j & 63)) & 0xFFFFu;
        }
        if (part[mid] < kb) lo = mid + 1;
        else hi = mid;
    }
    return 0xFFFFu | ATTN_DECODE_MAP_ABSENT;
}

/* Lanes [jlo, jhi) of the block at b0 that row r's tree hides (bit j for
 * lane j); 0 without a tree. */
static inline uint32_t attn_decode_tree_hidden(const attn_decode_seq *s, size_t r, size_t b0,
                                               size_t jlo, size_t jhi) {
    if (!s->tree || b0 + jhi <= s->first_pos) return 0;
    const uint64_t *bits = s->tree + r * s->tree_words;
    uint32_t hidden = 0;
    for (size_t j = jlo; j < jhi; j++) {
        size_t pos = b0 + j;
        if (pos < s->first_pos) continue;
        size_t f = pos - s->first_pos;
        if (!((bits[f >> 6] >> (f & 63)) & 1u)) hidden |= 1u << j;
    }
    return hidden;
}

/* The keys [*lo, *hi) row r sees. */
static inline void attn_decode_visible(const attn_decode_seq *s, size_t r, size_t *lo,
                                       size_t *hi) {
    size_t pos = s->first_pos + r;
    *lo = s->window && pos + 1 > s->window ? pos + 1 - s->window : 0;
    *hi = pos + 1;
}

/* The floats of a chunk call's scratch, for q_heads heads of head_dim:
 * a block's scores and softmax factors, and the queries reordered for a
 * kernel set that reads bf16 keys in pairs of vectors. */
#define ATTN_DECODE_SCRATCH_FLOATS(q_heads, head_dim)                                              \
    ((size_t)ATTN_DECODE_ROWS * (q_heads) * (ATTN_DECODE_BLOCK + 1 + (head_dim)))
/* And the floats the kernels on AMX tiles need on top, per group
 * of up to 4 query heads whatever its size (decode_kernel.h): its queries
 * as tiles and their factors, at most 8 head_dim + 4 floats
 * (amx_group_words), and a block's scores' tile, 256 floats. */
#define ATTN_DECODE_TILE_FLOATS(q_heads, head_dim)                                                 \
    ((size_t)ATTN_DECODE_ROWS * (q_heads) * ((head_dim) * 8 + 260))

typedef struct attn_decode_kernels {
    const char *name;
    /* Rows [row0, row0 + rows) (rows <= ATTN_DECODE_ROWS) of s against keys [begin, end): m, l
     * (rows, q_heads) and acc (rows, q_heads, head_dim) receive the
     * partial softmax (m = -inf, l = 0, acc = 0 where a row sees none);
     * scratch holds ATTN_DECODE_SCRATCH_FLOATS(q_heads, head_dim) floats. */
    void (*chunk)(const attn_decode_seq *s, size_t row0, size_t rows, size_t begin, size_t end,
                  float *m, float *l, float *acc, float *scratch);
} attn_decode_kernels;

extern const attn_decode_kernels attn_decode_portable;
#if defined(ATTN_HAVE_X86_KERNELS)
extern const attn_decode_kernels attn_decode_avx2;
extern const attn_decode_kernels attn_decode_avx512;
/* attn_decode_avx512 with bf16 keys (head_dim a multiple of 32) and int8
 * ones (of 64) scored on AMX tiles: its chunk runs only where the process
 * may use them (attn_ctx_amx_usable), with ATTN_DECODE_TILE_FLOATS more
 * floats of scratch. */
extern const attn_decode_kernels attn_decode_avx512_amx;
#endif

/* (m, l, acc[D]) += the partial (m2, l2, acc2[D]): both rescaled to the
 * larger max. One function for every caller, so that folding the same
 * partials in the same order gives the same bits. A NaN sum (a NaN or
 * infinite score) stays NaN whatever the maxes: a chunk whose every score
 * is NaN keeps the max -inf of a chunk that saw nothing. */
static inline void attn_decode_fold(float *m, float *l, float *acc, float m2, float l2,
                                    const float *acc2, size_t D) {
    bool nan = *l != *l || l2 != l2;
    if (m2 == -INFINITY) {
        /* nothing to add */
    } else if (*m == -INFINITY) {
        *m = m2;
        *l = l2;
        for (size_t d = 0; d < D; d++) acc[d] = acc2[d];
    } else {
        float mx = *m > m2 ? *m : m2;
        float a1 = exp2f(*m - mx), a2 = exp2f(m2 - mx);
        *m = mx;
        *l = *l * a1 + l2 * a2;
        for (size_t d = 0; d < D; d++) acc[d] = acc[d] * a1 + acc2[d] * a2;
    }
    if (nan) *l = NAN;
}

/* A row's folded softmax (m, l, acc[D]) with its head's sink, sink2 (a
 * logit in base 2), in the denominator: (m, l) rescaled to max(m, sink2),
 * plus 2^(sink2 - max), then acc / l into out[D]. A row that saw no key (m
 * -inf, l 0) gives zeros; a NaN sum stays NaN. */
static inline void attn_decode_sink(float m, float l, const float *acc, float sink2,
                                    float *out, size_t D) {
    float mx = m > sink2 ? m : sink2;
    float a = exp2f(m - mx);
    float total = l * a + exp2f(sink2 - mx);
    for (size_t d = 0; d < D; d++) out[d] = acc[d] * a / total;
}

#endif /* ATTN_DECODE_H */
