/*
 * kv_cache.c — the KV cache (attn.h, "Generation"): storage, contiguous or
 * paged, and attn_kv_cache_attend, "attend, then append".
 *
 * Storage of one layer (a row: one token's kv_heads rows of head_dim
 * elements, K and V each in its stored format, contract/kv_format.h, codes
 * and scales in arrays of their own):
 *   contiguous  k, v (batch, capacity, row), position p at slot
 *               p % capacity; capacity = max_len, or the window W (a ring)
 *   paged       k, v pools (num_pages, page_size, row); per sequence a
 *               table of table_len pool pages, logical page j at entry
 *               j % table_len: table_len = ceil(max_len / page_size), or
 *               ceil(W / page_size) + 1 for a window (a ring of pages whose
 *               oldest page is out of the window when it is reused)
 *
 * attend: new token r of sequence s (position p = len_s + r) sees positions
 * max(0, p - W + 1) .. p (and of those, with a block map, the ones its row p
 * of the map shows: the map is over positions, whatever the layout), its
 * scores softcapped, less ALiBi's slope times p - j, and its head's sink in
 * the softmax (all optional); those below len_s come from the cache, the
 * others straight from k_new/v_new (so a window layer needs W slots even for
 * a chunk longer than W). Then the new rows are appended (of a window layer,
 * only the last W matter). In a cache of other than float32 the new rows are
 * first coded into the stored format (staged), so that the attention reads
 * them as later steps will, and the append copies those codes. The
 * attention itself is the contract's: each
 * prompt (an empty cache, many rows, on fast kernels) a dense problem, the
 * other sequences one problem whose K and V come from the cache's view
 * (attn_kv_cache_view), both through the runner, which gives the cache
 * problem to the split-KV decode backend (attention/decode.c) or the
 * reference. Positions turn into rows by one function for both layouts,
 * so the layouts agree bit for bit.
 *
 * A cache whose values are its keys (values_are_keys: a latent cache)
 * stores K alone; its layers' v and vs are their k and ks, and a call's
 * values are its keys (values_of).
 */
#include "generate/kv_cache.h"

#include "internal.h"
#include "overlap.h"

#include "attention/attention.h"
#include "contract/kv_format.h"
#include "kernels/decode/decode.h"
#include "mask/mask_internal.h"
#include "ops/sdpa_internal.h"
#include "parallel.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define WHO "attn_kv_cache_attend"
/* A sequence whose cache is empty with at least this many new rows is a
 * prompt: a dense problem, which the fused attention runs. */
#define PREFILL_ROWS 64
/* The most positions (max_len) a sequence may reach. */
#define KV_MAX_POSITIONS ((size_t)1 << 62)

typedef struct kv_layer {
    size_t window;     /* 0: keep every token */
    size_t capacity;   /* contiguous: slots per sequence */
    size_t table_len;  /* paged: page-table entries per sequence */
    uint8_t *k, *v;    /* contiguous blocks or page pools: codes */
    float *ks, *vs;    /* and scales (NULL for formats without) */
    size_t *length;    /* (batch) tokens appended */
    uint32_t *pages;   /* paged: (batch, table_len) pool pages, ATTN_DECODE_NO_PAGE */
    uint32_t *free;    /* paged: a stack of free pool pages */
    size_t free_count;
} kv_layer;

/* How one of K and V is stored: its format, and a token's bytes of codes
 * and floats of scales (kv_heads rows each). */
typedef struct kv_store {
    attn_kv_format fmt;
    size_t row_bytes, row_scales;
} kv_store;

struct attn_kv_cache {
    attn_ctx *ctx;
    attn_kv_cache_config cfg; /* page_size and num_pages resolved; windows our copy */
    size_t *windows;
    size_t row; /* elements of one token: kv_heads * head_dim */
    kv_store k, v; /* values_are_keys: v is k's format, stored nowhere */
    kv_layer *layers;
};

/* The values of a call whose keys are k_new. */
static const float *values_of(const attn_kv_cache *c, const float *k_new, const float *v_new) {
    return c->cfg.values_are_keys ? k_new : v_new;
}

static kv_store store_of(attn_dtype dtype, size_t kv_heads, size_t head_dim) {
    attn_kv_format f = attn_kv_format_of(dtype, head_dim);
    return (kv_store){f, kv_heads * f.head_bytes, kv_heads * f.head_scales};
}

static size_t ceil_div(size_t a, size_t b) { return a / b + (a % b != 0); }
static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Layer i's window (0: none), below max_len: a window of max_len or more
 * already sees every position a sequence reaches, so that layer keeps
 * every token (and runs draft trees); the bound keeps the ring's sizes and
 * the problem's window_left far inside their types. */
static size_t layer_window(const attn_kv_cache_config *cfg, size_t i) {
    size_t w = cfg->windows ? cfg->windows[i] : 0;
    return w < cfg->max_len ? w : 0;
}

/* Page-table entries per sequence of a layer with window w (0: none):
 * every page of max_len, or a ring of ceil(w / page_size) + 1; at least 1
 * (the table's index is taken modulo it). */
static size_t table_len_of(const attn_kv_cache_config *cfg, size_t w) {
    size_t all = ceil_div(cfg->max_len, cfg->page_size);
    return w ? min_size(ceil_div(w, cfg->page_size) + 1, all) : all;
}

/* ---- new, free, reset ------------------------------------------------------ */

static void free_layers(attn_kv_cache *c) {
    if (!c->layers) return;
    for (size_t i = 0; i < c->cfg.num_layers; i++) {
        kv_layer *L = &c->layers[i];
        if (!c->cfg.values_are_keys) {
            attn_free(L->v);
            attn_free(L->vs);
        }
        attn_free(L->k);
        attn_free(L->ks);
        attn_free(L->length);
        attn_free(L->pages);
        attn_free(L->free);
    }
    attn_free(c->layers);
}

void attn_kv_cache_free(attn_kv_cache *cache) {
    if (!cache) return;
    free_layers(cache);
    attn_free(cache->windows);
    attn_free(cache);
}

/* Every page of layer L back on its free list (page 0 on top), every table
 * entry empty. */
static void free_all_pages(const attn_kv_cache *c, kv_layer *L) {
    size_t n = c->cfg.num_pages;
    for (size_t i = 0; i < n; i++) L->free[i] = (uint32_t)(n - 1 - i);
    L->free_count = n;
    for (size_t i = 0; i < c->cfg.batch * L->table_len; i++) L->pages[i] = ATTN_DECODE_NO_PAGE;
}

/* Sequence seq's pages of layer L back on the free list. */
static void free_sequence_pages(const attn_kv_cache *c, kv_layer *L, size_t seq) {
    (void)c;
    uint32_t *table = L->pages + seq * L->table_len;
    for (size_t j = 0; j < L->table_len; j++)
        if (table[j] != ATTN_DECODE_NO_PAGE) {
            L->free[L->free_count++] = table[j];
            table[j] = ATTN_DECODE_NO_PAGE;
        }
}

/* Allocates layer i's storage (sizes checked by the caller). */
static attn_status layer_new(attn_kv_cache *c, size_t i) {
    const attn_kv_cache_config *cfg = &c->cfg;
    kv_layer *L = &c->layers[i];
    size_t tokens = 0; /* per pool or block */
    bool shared = cfg->values_are_keys;
    L->window = layer_window(cfg, i);
    L->length = attn_calloc(cfg->batch, sizeof(size_t));
    if (!L->length) goto no_memory;
    if (cfg->layout == ATTN_KV_CONTIGUOUS) {
        L->capacity = L->window ? min_size(L->window, cfg->max_len) : cfg->max_len;
        tokens = cfg->batch * L->capacity;
    } else {
        L->table_len = table_len_of(cfg, L->window);
        tokens = cfg->num_pages * cfg->page_size;
        L->pages = attn_calloc(cfg->batch * L->table_len, sizeof(uint32_t));
        L->free = attn_calloc(cfg->num_pages, sizeof(uint32_t));
        if (!L->pages || !L->free) goto no_memory;
        free_all_pages(c, L);
    }
    /* never read before written: no need to zero */
    L->k = attn_malloc_large(tokens * c->k.row_bytes);
    if (!L->k) goto no_memory;
    if (c->k.row_scales && !(L->ks = attn_malloc_large(tokens * c->k.row_scales * sizeof(float))))
        goto no_memory;
    if (shared) {
        L->v = L->k;
        L->vs = L->ks;
        return ATTN_OK;
    }
    L->v = attn_malloc_large(tokens * c->v.row_bytes);
    if (!L->v) goto no_memory;
    if (c->v.row_scales && !(L->vs = attn_malloc_large(tokens * c->v.row_scales * sizeof(float))))
        goto no_memory;
    return ATTN_OK;
no_memory:
    return attn_fail(c->ctx, ATTN_ERR_NO_MEMORY,
                     "attn_kv_cache_new: cannot allocate layer %zu (%zu tokens of %zu bytes "
                     "for K and %zu for V)",
                     i, tokens, c->k.row_bytes + c->k.row_scales * sizeof(float),
                     shared ? 0 : c->v.row_bytes + c->v.row_scales * sizeof(float));
}

/* What V adds to a token's bytes: its store, or none where the values are
 * the keys. */
static kv_store stored_values(const attn_kv_cache_config *cfg, const kv_store *v) {
    kv_store none = {v->fmt, 0, 0};
    return cfg->values_are_keys ? none : *v;
}

/* Bytes one token takes in one layer: K's and V's codes and scales. */
static size_t token_bytes(const kv_store *k, const kv_store *v) {
    return k->row_bytes + v->row_bytes + (k->row_scales + v->row_scales) * sizeof(float);
}

/* token_bytes, false where it does not fit a size_t. */
static bool token_bytes_checked(const kv_store *k, const kv_store *v, size_t *out) {
    size_t scales, scale_bytes, codes;
    return attn_add_size(k->row_scales, v->row_scales, &scales) &&
           attn_mul_size(scales, sizeof(float), &scale_bytes) &&
           attn_add_size(k->row_bytes, v->row_bytes, &codes) &&
           attn_add_size(codes, scale_bytes, out);
}

/* The memory this machine has (0 where it cannot be told). */
static size_t physical_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return 0;
    size_t n;
    return attn_mul_size((size_t)pages, (size_t)page, &n) ? n : (size_t)-1;
}

/* The stored formats of cfg, checked. */
static attn_status check_dtypes(attn_ctx *ctx, const attn_kv_cache_config *cfg) {
    const char *who = "attn_kv_cache_new";
    const attn_dtype dt[2] = {cfg->k_dtype, cfg->v_dtype};
    for (int i = 0; i < 2; i++) {
        const char *name = i ? "v_dtype" : "k_dtype";
        if (!attn_kv_dtype_supported(dt[i]))
            return attn_fail(ctx, ATTN_ERR_INVALID, "%s: %s %d (%s) is not a KV cache type: "
                             "F32, BF16, F16, F8_E4M3, I8 or I4", who, name, (int)dt[i],
                             attn_dtype_name(dt[i]));
        if (dt[i] == ATTN_DTYPE_I4 && cfg->head_dim % ATTN_KV_I4_GROUP)
            return attn_fail(ctx, ATTN_ERR_SHAPE, "%s: %s I4 stores groups of %d elements; "
                             "head_dim %zu is not a multiple of %d", who, name, ATTN_KV_I4_GROUP,
                             cfg->head_dim, ATTN_KV_I4_GROUP);
    }
    if (cfg->values_are_keys && cfg->v_dtype != cfg->k_dtype)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: values_are_keys stores one array: v_dtype "
                         "%s is not k_dtype %s", who, attn_dtype_name(cfg->v_dtype),
                         attn_dtype_name(cfg->k_dtype));
    return ATTN_OK;
}

/* Fills in the defaults of cfg (page_size, num_pages) and checks it. */
/* *bytes = what the layers take besides their tokens: each one's record,
 * window, lengths and the allocator's headers of its blocks (at most 7);
 * refused past memory (limit, 0: unknown) before any loop over the layers. */
static attn_status check_records(attn_ctx *ctx, const attn_kv_cache_config *cfg, size_t limit,
                                 size_t *bytes) {
    const char *who = "attn_kv_cache_new";
    size_t layer;
    if (!attn_mul_size(cfg->batch, sizeof(size_t), &layer) ||
        !attn_add_size(layer, sizeof(kv_layer) + sizeof(size_t) + 7 * 64, &layer) ||
        !attn_mul_size(layer, cfg->num_layers, bytes))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: the records of %zu layers of batch %zu "
                         "overflow", who, cfg->num_layers, cfg->batch);
    if (limit && *bytes > limit)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: the records of %zu layers (%zu bytes "
                         "each) are past this machine's memory (%zu bytes)", who,
                         cfg->num_layers, layer, limit);
    return ATTN_OK;
}

static attn_status resolve_config(attn_ctx *ctx, attn_kv_cache_config *cfg, size_t *row) {
    const char *who = "attn_kv_cache_new";
    if (!cfg->num_layers || !cfg->batch || !cfg->kv_heads || !cfg->head_dim || !cfg->max_len)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: num_layers (%zu), batch (%zu), kv_heads (%zu), head_dim (%zu) and "
                         "max_len (%zu) must all be positive",
                         who, cfg->num_layers, cfg->batch, cfg->kv_heads, cfg->head_dim,
                         cfg->max_len);
    /* positions, windows and lengths then stay far inside int64 and
     * every size computed from them */
    if (cfg->max_len > KV_MAX_POSITIONS)
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: max_len (%zu) is past the most positions "
                         "a cache holds (2^62)", who, cfg->max_len);
    if (cfg->layout != ATTN_KV_CONTIGUOUS && cfg->layout != ATTN_KV_PAGED)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: layout %d is neither ATTN_KV_CONTIGUOUS "
                         "(0) nor ATTN_KV_PAGED (1)", who, (int)cfg->layout);
    attn_status st = check_dtypes(ctx, cfg);
    if (st != ATTN_OK) return st;
    size_t tokens, floats, limit = physical_memory(), all_meta;
    if (!attn_mul_size(cfg->kv_heads, cfg->head_dim, row))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: kv_heads (%zu) x head_dim (%zu) overflows",
                         who, cfg->kv_heads, cfg->head_dim);
    if (cfg->layout == ATTN_KV_CONTIGUOUS) {
        cfg->page_size = 0;
        cfg->num_pages = 0;
        if (!attn_mul_size(cfg->batch, cfg->max_len, &tokens))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: batch (%zu) x max_len (%zu) overflows",
                             who, cfg->batch, cfg->max_len);
    } else {
        if (!cfg->page_size) cfg->page_size = 16;
        size_t per_seq_max = ceil_div(cfg->max_len, cfg->page_size), table;
        if (!attn_mul_size(cfg->batch, per_seq_max, &table) || !attn_floats_fit(table))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: batch (%zu) x %zu page-table "
                             "entries overflows", who, cfg->batch, per_seq_max);
        st = check_records(ctx, cfg, limit, &all_meta);
        if (st != ATTN_OK) return st;
        if (!cfg->num_pages) {
            /* enough for every sequence at max_len in its largest layer */
            size_t most = 0;
            for (size_t i = 0; i < cfg->num_layers; i++) {
                size_t n = table_len_of(cfg, layer_window(cfg, i));
                if (n > most) most = n;
            }
            if (!attn_mul_size(cfg->batch, most, &cfg->num_pages))
                return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: batch (%zu) x %zu pages overflows",
                                 who, cfg->batch, most);
        }
        if (cfg->num_pages >= ATTN_DECODE_NO_PAGE)
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: num_pages (%zu) is past the most "
                             "pages a pool holds (%u)", who, cfg->num_pages,
                             (unsigned)ATTN_DECODE_NO_PAGE - 1);
        if (!attn_mul_size(cfg->num_pages, cfg->page_size, &tokens))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                             "%s: num_pages (%zu) x page_size (%zu) overflows", who,
                             cfg->num_pages, cfg->page_size);
    }
    if (!attn_mul_size(tokens, *row, &floats) || !attn_floats_fit(floats)) {
        /* named by the fields the caller set (a page_size of 2^63), not
         * by the product of them */
        if (cfg->layout == ATTN_KV_PAGED)
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: num_pages (%zu) x page_size (%zu) "
                             "tokens x %zu floats (kv_heads x head_dim) per layer overflows",
                             who, cfg->num_pages, cfg->page_size, *row);
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: batch (%zu) x max_len (%zu) tokens x %zu "
                         "floats (kv_heads x head_dim) per layer overflows", who, cfg->batch,
                         cfg->max_len, *row);
    }
    /* what the layers take, refused before allocating when past the
     * machine's memory */
    kv_store k = store_of(cfg->k_dtype, cfg->kv_heads, cfg->head_dim), v_format =
             store_of(cfg->v_dtype, cfg->kv_heads, cfg->head_dim),
             v = stored_values(cfg, &v_format);
    size_t per_token = 0, slots = 0, tables = 0, all;
    st = check_records(ctx, cfg, limit, &all_meta);
    if (st != ATTN_OK) return st;
    if (!token_bytes_checked(&k, &v, &per_token))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: a token's bytes (kv_heads %zu x head_dim "
                         "%zu, K and V) overflow", who, cfg->kv_heads, cfg->head_dim);
    for (size_t i = 0; i < cfg->num_layers; i++) {
        size_t w = layer_window(cfg, i), layer_slots = tokens, layer_table = 0;
        if (cfg->layout == ATTN_KV_CONTIGUOUS && w) layer_slots = cfg->batch * w;
        /* paged: the page table and the free list, 4 bytes an entry (the
         * checks above keep both far inside a size_t) */
        if (cfg->layout == ATTN_KV_PAGED)
            layer_table = (cfg->batch * table_len_of(cfg, w) + cfg->num_pages) * sizeof(uint32_t);
        if (!attn_add_size(slots, layer_slots, &slots) ||
            !attn_add_size(tables, layer_table, &tables))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: the tokens of %zu layers overflow",
                             who, cfg->num_layers);
    }
    if (!attn_mul_size(slots, per_token, &all) || !attn_add_size(all, tables, &all) ||
        !attn_add_size(all, all_meta, &all))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: %zu tokens (all layers) x %zu bytes "
                         "and %zu bytes of page tables overflow", who, slots, per_token, tables);
    if (limit && all > limit)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: %zu tokens (all layers) x %zu bytes, "
                         "%zu bytes of page tables and %zu of layer records = %zu bytes is "
                         "past this machine's memory (%zu bytes)", who, slots, per_token, tables,
                         all_meta, all, limit);
    return ATTN_OK;
}

attn_status attn_kv_cache_new(attn_ctx *ctx, const attn_kv_cache_config *cfg,
                              attn_kv_cache **out) {
    attn_clear_error(ctx);
    if (out) *out = NULL;
    if (!ctx || !cfg || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_kv_cache_new: %s is NULL",
                         !ctx ? "ctx" : !cfg ? "cfg" : "out");
    attn_kv_cache_config c = *cfg;
    size_t row = 0;
    attn_status st = resolve_config(ctx, &c, &row);
    if (st != ATTN_OK) return st;
    attn_kv_cache *cache = attn_calloc(1, sizeof(*cache));
    if (!cache)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_kv_cache_new: cannot allocate the cache");
    cache->ctx = ctx;
    cache->row = row;
    cache->k = store_of(c.k_dtype, c.kv_heads, c.head_dim);
    cache->v = store_of(c.v_dtype, c.kv_heads, c.head_dim);
    if (c.windows) {
        cache->windows = attn_calloc(c.num_layers, sizeof(size_t));
        if (!cache->windows) goto no_memory;
        memcpy(cache->windows, c.windows, c.num_layers * sizeof(size_t));
        c.windows = cache->windows;
    }
    cache->cfg = c;
    cache->layers = attn_calloc(c.num_layers, sizeof(kv_layer));
    if (!cache->layers) goto no_memory;
    for (size_t i = 0; i < c.num_layers; i++) {
        st = layer_new(cache, i);
        if (st != ATTN_OK) {
            attn_kv_cache_free(cache);
            return st;
        }
    }
    *out = cache;
    return ATTN_OK;
no_memory:
    attn_kv_cache_free(cache);
    return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_kv_cache_new: cannot allocate the cache's "
                     "tables (%zu layers)", c.num_layers);
}

attn_ctx *attn_kv_cache_ctx(const attn_kv_cache *cache) { return cache ? cache->ctx : NULL; }

attn_kv_cache_config attn_kv_cache_get_config(const attn_kv_cache *cache) {
    attn_kv_cache_config none = {0};
    return cache ? cache->cfg : none;
}

attn_status attn_kv_cache_reset(attn_kv_cache *cache) {
    if (!cache) return ATTN_ERR_NULL;
    attn_clear_error(cache->ctx);
    for (size_t i = 0; i < cache->cfg.num_layers; i++) {
        kv_layer *L = &cache->layers[i];
        memset(L->length, 0, cache->cfg.batch * sizeof(size_t));
        if (cache->cfg.layout == ATTN_KV_PAGED) free_all_pages(cache, L);
    }
    return ATTN_OK;
}

attn_status attn_kv_cache_reset_sequence(attn_kv_cache *cache, size_t seq) {
    if (!cache) return ATTN_ERR_NULL;
    attn_clear_error(cache->ctx);
    if (seq >= cache->cfg.batch)
        return attn_fail(cache->ctx, ATTN_ERR_INVALID, "attn_kv_cache_reset_sequence: sequence "
                         "%zu is past the batch of %zu", seq, cache->cfg.batch);
    for (size_t i = 0; i < cache->cfg.num_layers; i++) {
        kv_layer *L = &cache->layers[i];
        L->length[seq] = 0;
        if (cache->cfg.layout == ATTN_KV_PAGED) free_sequence_pages(cache, L, seq);
    }
    return ATTN_OK;
}

attn_status attn_kv_cache_length(const attn_kv_cache *cache, size_t layer, size_t seq,
                                 size_t *out) {
    if (!cache) return ATTN_ERR_NULL;
    attn_clear_error(cache->ctx);
    if (!out)
        return attn_fail(cache->ctx, ATTN_ERR_NULL, "attn_kv_cache_length: out must not be NULL");
    if (layer >= cache->cfg.num_layers || seq >= cache->cfg.batch)
        return attn_fail(cache->ctx, ATTN_ERR_INVALID, "attn_kv_cache_length: layer %zu of %zu, "
                         "sequence %zu of %zu: out of range", layer, cache->cfg.num_layers, seq,
                         cache->cfg.batch);
    *out = cache->layers[layer].length[seq];
    return ATTN_OK;
}

size_t attn_kv_cache_bytes(const attn_kv_cache *cache) {
    if (!cache) return 0;
    size_t total = 0;
    for (size_t i = 0; i < cache->cfg.num_layers; i++) {
        const kv_layer *L = &cache->layers[i];
        size_t tokens = cache->cfg.layout == ATTN_KV_CONTIGUOUS
                            ? cache->cfg.batch * L->capacity
                            : cache->cfg.num_pages * cache->cfg.page_size;
        kv_store v = stored_values(&cache->cfg, &cache->v);
        total += tokens * token_bytes(&cache->k, &v);
    }
    return total;
}

size_t attn_kv_cache_token_bytes(const attn_kv_cache *cache) {
    if (!cache) return 0;
    kv_store v = stored_values(&cache->cfg, &cache->v);
    return cache->cfg.num_layers * token_bytes(&cache->k, &v);
}

/* ---- append ---------------------------------------------------------------------- */

/* The new positions of a sequence (length len, n new) that are stored: all,
 * or a window layer's last W (each later token looks back W - 1). */
static size_t first_stored(const kv_layer *L, size_t len, size_t n) {
    size_t keep = L->window ? min_size(n, L->window) : n;
    return len + n - keep;
}

/* Pages a sequence's append takes from the free list: the entries it
 * writes that hold none yet (a ring reuses the pages it has). */
static size_t pages_needed(const attn_kv_cache *c, const kv_layer *L, size_t s, size_t n) {
    size_t len = L->length[s], ps = c->cfg.page_size, need = 0;
    if (!n) return 0;
    const uint32_t *table = L->pages + s * L->table_len;
    for (size_t j = first_stored(L, len, n) / ps; j <= (len + n - 1) / ps; j++)
        need += table[j % L->table_len] == ATTN_DECODE_NO_PAGE;
    return need;
}

void attn_kv_cache_run_pages(const attn_kv_cache *cache, size_t layer, size_t seq, size_t prompt,
                             size_t total, size_t *need, size_t *have) {
    *need = *have = 0;
    if (cache->cfg.layout != ATTN_KV_PAGED || !total || prompt > total) return;
    const kv_layer *L = &cache->layers[layer];
    size_t ps = cache->cfg.page_size, first = first_stored(L, 0, prompt) / ps;
    /* the prompt stores its positions from first_stored on, each later
     * token its own: one run of logical pages, entries modulo table_len */
    *need = min_size((total - 1) / ps - first + 1, L->table_len);
    const uint32_t *table = L->pages + seq * L->table_len;
    size_t own = 0;
    for (size_t j = 0; j < L->table_len; j++) own += table[j] != ATTN_DECODE_NO_PAGE;
    *have = L->free_count + own;
}

/* The new rows of a call in the stored formats, packed as the caller's
 * k_new and v_new: codes and scales of K and of V (a float32 store reads
 * the caller's rows themselves). */
typedef struct staged_rows {
    const uint8_t *k, *v;
    const float *ks, *vs;
    void *memory; /* what coding took, or NULL */
} staged_rows;

/* Codes rows of x (rows, kv_heads, head_dim) in store's format into codes
 * and scales. */
static void code_rows(const attn_kv_cache *c, const kv_store *store, const float *x, size_t rows,
                      uint8_t *codes, float *scales) {
    const attn_kv_format *f = &store->fmt;
    size_t heads = rows * c->cfg.kv_heads;
    for (size_t i = 0; i < heads; i++)
        attn_kv_quantize(f, x + i * f->head_dim, codes + i * f->head_bytes,
                         f->head_scales ? scales + i * f->head_scales : NULL);
}

/* The rows' stored form: false when its memory cannot be had. */
static bool stage_rows(const attn_kv_cache *c, size_t rows, const float *k_new,
                       const float *v_new, staged_rows *out) {
    const kv_store *K = &c->k, *V = &c->v;
    bool shared = c->cfg.values_are_keys;
    bool code_k = K->fmt.dtype != ATTN_DTYPE_F32;
    bool code_v = !shared && V->fmt.dtype != ATTN_DTYPE_F32;
    *out = (staged_rows){(const uint8_t *)k_new, (const uint8_t *)values_of(c, k_new, v_new), NULL,
                         NULL, NULL};
    if (!rows || (!code_k && !code_v)) return true;
    /* scales first (float aligned), then codes, V's from a line's start:
     * K's one-byte codes may end at an odd byte, where V's 16-bit ones
     * would sit misaligned */
    size_t k_scales = code_k ? rows * K->row_scales : 0;
    size_t v_scales = code_v ? rows * V->row_scales : 0;
    size_t k_bytes = code_k ? (rows * K->row_bytes + 63) / 64 * 64 : 0;
    size_t bytes = (k_scales + v_scales) * sizeof(float) + k_bytes +
                   (code_v ? rows * V->row_bytes : 0);
    char *m = attn_malloc(bytes ? bytes : 1);
    if (!m) return false;
    float *ks = (float *)m, *vs = ks + k_scales;
    uint8_t *kc = (uint8_t *)(vs + v_scales), *vc = kc + k_bytes;
    if (code_k) {
        code_rows(c, K, k_new, rows, kc, ks);
        out->k = kc;
        out->ks = K->row_scales ? ks : NULL;
        if (shared) {
            out->v = out->k;
            out->vs = out->ks;
        }
    }
    if (code_v) {
        code_rows(c, V, v_new, rows, vc, vs);
        out->v = vc;
        out->vs = V->row_scales ? vs : NULL;
    }
    out->memory = m;
    return true;
}

/* Copies staged row `from` into slot `to` of one of K and V. */
static void store_row(const kv_store *st, uint8_t *codes, float *scales, size_t to,
                      const uint8_t *from_codes, const float *from_scales, size_t from) {
    memcpy(codes + to * st->row_bytes, from_codes + from * st->row_bytes, st->row_bytes);
    if (st->row_scales)
        memcpy(scales + to * st->row_scales, from_scales + from * st->row_scales,
               st->row_scales * sizeof(float));
}

/* Writes the stored new rows of sequence s, staged from packed row at
 * (pages were counted free). */
static void append_rows(const attn_kv_cache *c, kv_layer *L, size_t s, size_t n,
                        const staged_rows *rows, size_t at) {
    size_t len = L->length[s];
    for (size_t pos = first_stored(L, len, n); pos < len + n; pos++) {
        size_t slot;
        if (c->cfg.layout == ATTN_KV_PAGED) {
            size_t ps = c->cfg.page_size;
            uint32_t *entry = L->pages + s * L->table_len + (pos / ps) % L->table_len;
            if (*entry == ATTN_DECODE_NO_PAGE) *entry = L->free[--L->free_count];
            slot = (size_t)*entry * ps + pos % ps;
        } else {
            slot = s * L->capacity + pos % L->capacity;
        }
        store_row(&c->k, L->k, L->ks, slot, rows->k, rows->ks, at + pos - len);
        if (!c->cfg.values_are_keys)
            store_row(&c->v, L->v, L->vs, slot, rows->v, rows->vs, at + pos - len);
    }
    L->length[s] = len + n;
}

/* ---- attend ------------------------------------------------------------------ */

/* The new tokens of sequence s. */
static size_t new_count(const size_t *new_lens, size_t new_tokens, size_t s) {
    return new_lens ? new_lens[s] : new_tokens;
}

/* What attend and append share: the layer, the rows (*rows_out, packed),
 * and, where the rows are appended, the limits: max_len and the pool's
 * free pages (a tree of draft tokens is staged apart and appends none). */
static attn_status check_append(attn_kv_cache *c, const char *who, size_t layer,
                                const size_t *new_lens, size_t new_tokens, bool appends,
                                size_t *rows_out) {
    attn_ctx *ctx = c->ctx;
    const attn_kv_cache_config *cfg = &c->cfg;
    if (layer >= cfg->num_layers)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: layer %zu is past the cache's %zu layers",
                         who, layer, cfg->num_layers);
    size_t rows = 0, floats;
    for (size_t s = 0; s < cfg->batch; s++)
        if (!attn_add_size(rows, new_count(new_lens, new_tokens, s), &rows))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: the new tokens of the batch overflow",
                             who);
    if (!attn_mul_size(rows, c->row, &floats) || !attn_floats_fit(floats))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: %zu rows x %zu floats overflows", who,
                         rows, c->row);
    const kv_layer *L = &c->layers[layer];
    size_t pages = 0;
    for (size_t s = 0; s < cfg->batch && appends; s++) {
        size_t n = new_count(new_lens, new_tokens, s), len = L->length[s];
        if (n > cfg->max_len - len)
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: sequence %zu of layer %zu has %zu "
                             "tokens; %zu new would pass max_len %zu", who, s, layer, len, n,
                             cfg->max_len);
        if (cfg->layout != ATTN_KV_PAGED) continue;
        size_t need = pages_needed(c, L, s, n);
        if (need > L->free_count - pages)
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: the page pool of layer %zu is out of "
                             "pages: sequence %zu (length %zu, %zu new tokens) needs %zu more, "
                             "%zu of the %zu pages (of %zu tokens) are free", who, layer, s, len,
                             n, need, L->free_count - pages, cfg->num_pages, cfg->page_size);
        pages += need;
    }
    *rows_out = rows;
    return ATTN_OK;
}

attn_status attn_kv_cache_check_append(attn_kv_cache *cache, const char *who, size_t layer,
                                       const size_t *new_lens, size_t new_tokens) {
    size_t rows = 0;
    return check_append(cache, who, layer, new_lens, new_tokens, true, &rows);
}

/* A call's k_new and v_new (of rows rows): both given, or where the values
 * are the keys, v_new NULL or k_new (other values would be dropped
 * unseen). */
static attn_status check_new_rows(const attn_kv_cache *c, const char *who, size_t rows,
                                  const float *k_new, const float *v_new) {
    bool shared = c->cfg.values_are_keys;
    if (rows && (!k_new || (!v_new && !shared)))
        return attn_fail(c->ctx, ATTN_ERR_NULL, "%s: %s is NULL (k_new%s must not be NULL)",
                         who, !k_new ? "k_new" : "v_new", shared ? "" : " and v_new");
    if (rows && shared && v_new && v_new != k_new)
        return attn_fail(c->ctx, ATTN_ERR_INVALID, "%s: the cache's values are its keys "
                         "(values_are_keys): v_new [%p] must be NULL or k_new [%p]", who,
                         (const void *)v_new, (const void *)k_new);
    return ATTN_OK;
}

/* Appends every sequence's rows (the limits checked). */
static void append_all(attn_kv_cache *c, kv_layer *L, const size_t *new_lens, size_t new_tokens,
                       const staged_rows *rows) {
    for (size_t s = 0, at = 0; s < c->cfg.batch; s++) {
        size_t n = new_count(new_lens, new_tokens, s);
        if (n) append_rows(c, L, s, n, rows, at);
        at += n;
    }
}

attn_status attn_kv_cache_append(attn_kv_cache *cache, size_t layer, const size_t *new_lens,
                                 size_t new_tokens, const float *k_new, const float *v_new) {
    if (!cache) return ATTN_ERR_NULL;
    attn_clear_error(cache->ctx);
    size_t rows = 0;
    attn_status st = check_append(cache, "attn_kv_cache_append", layer, new_lens, new_tokens, true,
                                  &rows);
    if (st != ATTN_OK || rows == 0) return st;
    if ((st = check_new_rows(cache, "attn_kv_cache_append", rows, k_new, v_new)) != ATTN_OK)
        return st;
    staged_rows staged;
    if (!stage_rows(cache, rows, k_new, v_new, &staged))
        return attn_fail(cache->ctx, ATTN_ERR_NO_MEMORY, "attn_kv_cache_append: cannot allocate "
                         "the coded form of %zu rows", rows);
    append_all(cache, &cache->layers[layer], new_lens, new_tokens, &staged);
    attn_free(staged.memory);
    return ATTN_OK;
}

/* Checks attend's arguments; *rows_out the packed rows. */
static attn_status check_args(attn_kv_cache *c, const char *who, const attn_kv_attend_args *a,
                              bool appends, size_t *rows_out) {
    attn_ctx *ctx = c->ctx;
    const attn_kv_cache_config *cfg = &c->cfg;
    attn_status st = check_append(c, who, a->layer, a->new_lens, a->new_tokens, appends,
                                  rows_out);
    if (st != ATTN_OK) return st;
    size_t rows = *rows_out, qrow;
    if (!a->q_heads || a->q_heads % cfg->kv_heads)
        return attn_fail(ctx, ATTN_ERR_SHAPE, "%s: q_heads (%zu) is not a positive multiple "
                         "of the cache's kv_heads (%zu)", who, a->q_heads, cfg->kv_heads);
    if (!attn_fits_float(a->scale) || a->scale < 0.0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: scale %g is not a value >= 0 within "
                         "float32's range (0: 1 / sqrt(head_dim))", who, a->scale);
    if (!(a->softcap >= 0.0f) || isinf(a->softcap))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: softcap %g is not a finite value >= 0 "
                         "(0: none)", who, (double)a->softcap);
    st = attn_check_head_params(ctx, who, a->alibi_slopes, a->sinks, a->q_heads);
    if (st != ATTN_OK) return st;
    if (!attn_mul3_size(rows, a->q_heads, cfg->head_dim, &qrow) || !attn_floats_fit(qrow))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: %zu rows x %zu heads x %zu overflows",
                         who, rows, a->q_heads, cfg->head_dim);
    bool shared = cfg->values_are_keys;
    if (rows && (!a->q || !a->k_new || (!a->v_new && !shared) || !a->out))
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL (%s must not be NULL)", who,
                         !a->q ? "q" : !a->k_new ? "k_new" : !a->out ? "out" : "v_new",
                         shared ? "q, k_new and out" : "q, k_new, v_new and out");
    if ((st = check_new_rows(c, who, rows, a->k_new, a->v_new)) != ATTN_OK) return st;
    /* the attention reads k_new and v_new (or their coded copies) while
     * it writes out, and the append copies them after */
    if (a->block_mask) {
        /* a map over positions: for every sequence or one, every query head
         * or one, and up to the last position of the call */
        const attn_block_map *m = attn_block_mask_map(a->block_mask);
        if ((m->batch != 1 && m->batch != cfg->batch) || (m->heads != 1 && m->heads != a->q_heads))
            return attn_fail(ctx, ATTN_ERR_SHAPE, "%s: block_mask is of batch %zu, heads %zu; "
                             "each must be 1 or the cache's batch (%zu) and q_heads (%zu)", who,
                             m->batch, m->heads, cfg->batch, a->q_heads);
        const kv_layer *L = &c->layers[a->layer];
        for (size_t s = 0; s < cfg->batch; s++) {
            size_t n = new_count(a->new_lens, a->new_tokens, s), reach = L->length[s] + n;
            if (n && (reach > m->q_len || reach > m->kv_len))
                return attn_fail(ctx, ATTN_ERR_SHAPE, "%s: block_mask is of q_len %zu, kv_len "
                                 "%zu (positions) where sequence %zu of layer %zu reaches "
                                 "position %zu (length %zu, %zu new)", who, m->q_len, m->kv_len,
                                 s, a->layer, reach - 1, L->length[s], n);
        }
    }
    size_t kv_floats = rows * c->row;
    attn_span out = {"out", a->out, qrow * sizeof(float)};
    size_t head_bytes = a->q_heads * sizeof(float);
    attn_span ins[6] = {{"q", a->q, qrow * sizeof(float)},
                        {"k_new", a->k_new, kv_floats * sizeof(float)},
                        {"v_new", a->v_new, a->v_new ? kv_floats * sizeof(float) : 0},
                        {"new_lens", a->new_lens, a->new_lens ? cfg->batch * sizeof(size_t) : 0},
                        {"alibi_slopes", a->alibi_slopes, a->alibi_slopes ? head_bytes : 0},
                        {"sinks", a->sinks, a->sinks ? head_bytes : 0}};
    return attn_check_overlap(ctx, who, &out, 1, ins, 6);
}

/* The call's score modifiers (check_args checked them) in p. */
static void set_modifiers(attn_attention_problem *p, const attn_kv_attend_args *a) {
    p->softcap = a->softcap;
    p->softcap_f64 = a->softcap;
    p->alibi_slopes = a->alibi_slopes;
    p->sinks = a->sinks;
}

/* A layer's window of W positions (0: none) as the problem's (W - 1, 0);
 * W is at most max_len (layer_window), at most 2^62. */
static void set_window(attn_attention_problem *p, size_t W) {
    if (!W) return;
    p->window = true;
    p->window_left = (int64_t)(W - 1);
    p->window_right = 0;
}

/* Whether the n floats at x are all finite (none has an exponent of all
 * ones: NaN or an infinity). */
static bool all_finite(const float *x, size_t n) {
    uint32_t not_finite = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, x + i, sizeof b);
        not_finite |= (b & 0x7f800000u) == 0x7f800000u;
    }
    return !not_finite;
}

/* Sequence s is a prompt: an empty cache and at least PREFILL_ROWS new
 * rows, whose keys are its own rows alone: a dense problem (the reference
 * ctx keeps every row on the cache problem's oracle). With a block map it
 * takes the map's first n positions of sequence s (its rows and columns
 * are then the prompt's own), on the kernels that run maps, which take no
 * softcap or ALiBi of their own: with those the rows stay on the cache
 * problem. So do rows whose queries, keys or values (from packed row at)
 * are not all finite: a dense problem follows PyTorch's matmul there,
 * where a hidden key's zero weight times an infinite value is NaN in every
 * row, and a score of -inf (an infinite query) hides its key, or is
 * softcapped to a finite one, where the cache promises NaN in the rows
 * whose scores are not finite, and only in those, as the decode kernels
 * give. */
static bool is_prompt(const attn_kv_cache *c, const kv_layer *L, const attn_kv_attend_args *a,
                      size_t s, size_t at, size_t n) {
    if (a->block_mask && (a->softcap > 0.0f || a->alibi_slopes)) return false;
    if (!c->ctx->ks.decode || L->length[s] != 0 || n < PREFILL_ROWS) return false;
    size_t row = c->cfg.kv_heads * c->cfg.head_dim, qrow = a->q_heads * c->cfg.head_dim;
    return all_finite(a->k_new + at * row, n * row) &&
           all_finite(values_of(c, a->k_new, a->v_new) + at * row, n * row) &&
           all_finite(a->q + at * qrow, n * qrow);
}

/* The attention of prompt s's n rows (from packed row at) among themselves,
 * under map (the sequence's slice of the call's block map, or NULL). */
static attn_attention_problem prompt_problem(const attn_kv_cache *c, const kv_layer *L,
                                             const attn_kv_attend_args *a, double scale,
                                             size_t at, size_t n, const attn_block_mask *map) {
    size_t H = a->q_heads, KH = c->cfg.kv_heads, D = c->cfg.head_dim;
    attn_attention_problem p = {
        .batch = 1, .q_heads = H, .kv_heads = KH, .q_len = n, .kv_len = n,
        .head_dim = D, .v_head_dim = D,
        .q = attn_view_f32(a->q + at * H * D, (attn_view_strides){0, H * D, D}),
        .k = attn_view_f32(a->k_new + at * KH * D, (attn_view_strides){0, KH * D, D}),
        .v = attn_view_f32(values_of(c, a->k_new, a->v_new) + at * KH * D,
                           (attn_view_strides){0, KH * D, D}),
        .out = attn_view_f32(a->out + at * H * D, (attn_view_strides){0, H * D, D}),
        .scale = (float)scale, .scale_f64 = scale, .causal = true,
        .block_map = map ? attn_block_mask_map(map) : NULL};
    set_window(&p, L->window);
    set_modifiers(&p, a);
    return p;
}

/* The rest of the call: every sequence but the prompts (their new_rows 0)
 * against the cache's rows, through view. */
static attn_attention_problem cache_problem(const attn_kv_cache *c, const kv_layer *L,
                                            const attn_kv_attend_args *a, double scale,
                                            const attn_kv_cache_view *view) {
    size_t H = a->q_heads, KH = c->cfg.kv_heads, D = c->cfg.head_dim, longest = 1, all = 1;
    for (size_t s = 0; s < c->cfg.batch; s++) {
        if (view->new_rows[s] > longest) longest = view->new_rows[s];
        if (view->cached[s] + view->new_rows[s] > all) all = view->cached[s] + view->new_rows[s];
    }
    attn_attention_problem p = {
        .batch = c->cfg.batch, .q_heads = H, .kv_heads = KH, .q_len = longest, .kv_len = all,
        .head_dim = D, .v_head_dim = D,
        .q = attn_view_f32(a->q, (attn_view_strides){0, H * D, D}),
        .k = attn_view_f32(a->k_new, (attn_view_strides){0, KH * D, D}),
        .v = attn_view_f32(values_of(c, a->k_new, a->v_new), (attn_view_strides){0, KH * D, D}),
        .out = attn_view_f32(a->out, (attn_view_strides){0, H * D, D}),
        .scale = (float)scale, .scale_f64 = scale, .causal = true, .kv_cache = view,
        .block_map = a->block_mask ? attn_block_mask_map(a->block_mask) : NULL};
    set_window(&p, L->window);
    set_modifiers(&p, a);
    return p;
}

static void free_prompt_maps(attn_block_mask **maps, size_t batch) {
    for (size_t s = 0; maps && s < batch; s++) attn_block_mask_free(maps[s]);
    attn_free(maps);
}

/* attend, then append (tree NULL), or a tree's draft rows attending
 * without an append: the call of attn_kv_cache_attend and of
 * attn_kv_cache_attend_tree (tree_words words per packed row). */
static attn_status attend(attn_kv_cache *cache, const char *who, const attn_kv_attend_args *args,
                          const uint64_t *tree, size_t tree_words) {
    attn_ctx *ctx = cache->ctx;
    size_t rows = 0;
    attn_status st = check_args(cache, who, args, !tree, &rows);
    if (st != ATTN_OK || rows == 0) return st;

    const attn_kv_cache_config *cfg = &cache->cfg;
    kv_layer *L = &cache->layers[args->layer];
    size_t B = cfg->batch;
    double scale = args->scale > 0.0 ? args->scale : 1.0 / sqrt((double)cfg->head_dim);

    /* the problems of the call (the prompts, dense; the rest over the
     * cache) and the memory of the largest: all in hand before anything
     * is written */
    staged_rows staged = {0};
    size_t *lens = attn_calloc(3 * B, sizeof(size_t));
    attn_block_mask **prompt_maps = /* each prompt's slice of the block map */
        args->block_mask ? attn_calloc(B, sizeof *prompt_maps) : NULL;
    if (!lens || (args->block_mask && !prompt_maps) ||
        !stage_rows(cache, rows, args->k_new, args->v_new, &staged))
        goto no_memory;
    attn_kv_cache_view view = {
        .cached = L->length, .new_rows = lens, .row_start = lens + B,
        .k = {cache->k.fmt.dtype, L->k, L->ks, staged.k, staged.ks},
        .v = {cache->v.fmt.dtype, L->v, L->vs, staged.v, staged.vs},
        .capacity = L->capacity, .tree = tree, .tree_words = tree_words};
    if (cfg->layout == ATTN_KV_PAGED) {
        view.pages = L->pages;
        view.page_size = cfg->page_size;
        view.table_len = L->table_len;
    }
    size_t *prompt_rows = lens + 2 * B, bytes = 0, prompts = 0;
    for (size_t s = 0, at = 0; s < B; s++) {
        size_t n = new_count(args->new_lens, args->new_tokens, s);
        lens[B + s] = at;
        if (n && !tree && is_prompt(cache, L, args, s, at, n)) {
            prompt_rows[s] = n;
            if (args->block_mask &&
                (st = attn_block_map_sequence(ctx, who, attn_block_mask_map(args->block_mask), s,
                                              n, n, &prompt_maps[s])) != ATTN_OK)
                goto done;
            attn_attention_problem p =
                prompt_problem(cache, L, args, scale, at, n, prompt_maps ? prompt_maps[s] : NULL);
            if ((st = attn_attention_check(ctx, who, &p)) != ATTN_OK) goto done;
            size_t b = attn_attention_forward_bytes(ctx, &p, false, false);
            if (b > bytes) bytes = b;
            prompts++;
        } else {
            lens[s] = n;
        }
        at += n;
    }
    attn_attention_problem rest = cache_problem(cache, L, args, scale, &view);
    bool decoding = prompts < B;
    if (decoding) {
        if ((st = attn_attention_check(ctx, who, &rest)) != ATTN_OK) goto done;
        size_t b = attn_attention_forward_bytes(ctx, &rest, false, false);
        if (b > bytes) bytes = b;
    }
    void *workspace = attn_ctx_workspace(ctx, bytes);
    if (!workspace) goto no_memory;

    /* checked, and the workspace in hand: the runner fails in nothing */
    for (size_t s = 0; s < B; s++) {
        if (!prompt_rows[s]) continue;
        attn_attention_problem p = prompt_problem(cache, L, args, scale, lens[B + s],
                                                  prompt_rows[s],
                                                  prompt_maps ? prompt_maps[s] : NULL);
        if ((st = attn_attention_forward(ctx, who, &p, NULL, NULL, NULL, NULL, workspace)) !=
            ATTN_OK)
            goto done;
    }
    if (decoding &&
        (st = attn_attention_forward(ctx, who, &rest, NULL, NULL, NULL, NULL, workspace)) !=
            ATTN_OK)
        goto done;
    if (!tree) append_all(cache, L, args->new_lens, args->new_tokens, &staged);
done:
    free_prompt_maps(prompt_maps, B);
    attn_free(lens);
    attn_free(staged.memory);
    return st;
no_memory:
    free_prompt_maps(prompt_maps, B);
    attn_free(lens);
    attn_free(staged.memory);
    return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate the working memory of %zu "
                     "rows against layer %zu", who, rows, args->layer);
}

attn_status attn_kv_cache_attend(attn_kv_cache *cache, const attn_kv_attend_args *args) {
    if (!cache) return ATTN_ERR_NULL;
    attn_clear_error(cache->ctx);
    if (!args) return attn_fail(cache->ctx, ATTN_ERR_NULL, WHO ": args must not be NULL");
    return attend(cache, WHO, args, NULL, 0);
}

/* ---- trees of draft tokens ------------------------------------------------------ */

attn_status attn_tree_mask(attn_ctx *ctx, const int32_t *parents, size_t n, uint64_t *bits,
                           size_t words_per_row, size_t *depths) {
    const char *who = "attn_tree_mask";
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!parents || !bits)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", who, !parents ? "parents" : "bits");
    if (!n) return attn_fail(ctx, ATTN_ERR_INVALID, "%s: a tree of 0 tokens", who);
    size_t words;
    if (!attn_mul_size(n, words_per_row, &words))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: %zu rows of %zu words overflow", who, n,
                         words_per_row);
    if (words_per_row < n / 64 + (n % 64 != 0))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: %zu words a row hold %zu tokens, not %zu",
                         who, words_per_row, words_per_row * 64, n);
    for (size_t r = 0; r < n; r++) {
        if (r == 0 && parents[0] != -1)
            return attn_fail(ctx, ATTN_ERR_INVALID, "%s: parents[0] is %d: the first token's "
                             "parent is -1 (the cache's last token)", who, (int)parents[0]);
        if (parents[r] < -1 || (parents[r] >= 0 && (size_t)parents[r] >= r))
            return attn_fail(ctx, ATTN_ERR_INVALID, "%s: parents[%zu] is %d: a token's parent "
                             "comes before it (0 .. %zu), or is -1 (the cache's last token)",
                             who, r, (int)parents[r], r - 1);
    }
    for (size_t r = 0; r < n; r++) {
        uint64_t *row = bits + r * words_per_row;
        if (parents[r] >= 0)
            memcpy(row, bits + (size_t)parents[r] * words_per_row, words_per_row * sizeof *row);
        else
            memset(row, 0, words_per_row * sizeof *row);
        row[r >> 6] |= (uint64_t)1 << (r & 63);
        if (depths) depths[r] = parents[r] >= 0 ? depths[parents[r]] + 1 : 0;
    }
    return ATTN_OK;
}

attn_status attn_kv_cache_attend_tree(attn_kv_cache *cache, const attn_kv_tree_args *args) {
    const char *who = "attn_kv_cache_attend_tree";
    if (!cache) return ATTN_ERR_NULL;
    attn_ctx *ctx = cache->ctx;
    attn_clear_error(ctx);
    if (!args) return attn_fail(ctx, ATTN_ERR_NULL, "%s: args must not be NULL", who);
    const attn_kv_cache_config *cfg = &cache->cfg;
    if (args->seq >= cfg->batch)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: seq %zu is past the cache's batch of %zu",
                         who, args->seq, cfg->batch);
    if (args->layer < cfg->num_layers && cache->layers[args->layer].window)
        return attn_fail(ctx, ATTN_ERR_UNSUPPORTED, "%s: layer %zu keeps a window of %zu "
                         "positions; draft trees run on layers that keep every token", who,
                         args->layer, cache->layers[args->layer].window);
    if (args->alibi_slopes)
        return attn_fail(ctx, ATTN_ERR_UNSUPPORTED, "%s: alibi_slopes with a tree of draft "
                         "tokens: a draft's ALiBi distance to an ancestor is their depths' "
                         "difference, which the rows' positions do not hold", who);
    size_t n = args->draft_tokens, words = n / 64 + (n % 64 != 0), bytes;
    if (!n) return attn_fail(ctx, ATTN_ERR_INVALID, "%s: draft_tokens is 0", who);
    if (!attn_mul3_size(n, words, sizeof(uint64_t), &bytes))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: a tree of %zu tokens overflows", who, n);
    size_t *lens = attn_calloc(cfg->batch, sizeof(size_t));
    uint64_t *tree = attn_malloc(bytes);
    if (!lens || !tree) {
        attn_free(lens);
        attn_free(tree);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate the mask of a tree of "
                         "%zu tokens", who, n);
    }
    attn_status st = attn_tree_mask(ctx, args->parents, n, tree, words, NULL);
    if (st != ATTN_OK) {
        /* the mask names itself; the caller called this */
        char why[ATTN_ERROR_CAPACITY];
        snprintf(why, sizeof why, "%s", attn_ctx_last_error(ctx));
        st = attn_fail(ctx, st, "%s: %s", who, why);
    } else {
        lens[args->seq] = n;
        attn_kv_attend_args a = {.layer = args->layer, .new_lens = lens, .q_heads = args->q_heads,
                                 .scale = args->scale, .q = args->q, .k_new = args->k_new,
                                 .v_new = args->v_new, .out = args->out,
                                 .softcap = args->softcap, .sinks = args->sinks};
        st = attend(cache, who, &a, tree, words);
    }
    attn_free(lens);
    attn_free(tree);
    return st;
}

attn_status attn_kv_cache_append_branch(attn_kv_cache *cache, size_t layer, size_t seq,
                                        const int32_t *rows, size_t count, const float *k_new,
                                        const float *v_new) {
    const char *who = "attn_kv_cache_append_branch";
    if (!cache) return ATTN_ERR_NULL;
    attn_ctx *ctx = cache->ctx;
    attn_clear_error(ctx);
    if (!count) return ATTN_OK;
    if (!rows) return attn_fail(ctx, ATTN_ERR_NULL, "%s: rows is NULL", who);
    attn_status st = check_new_rows(cache, who, count, k_new, v_new);
    if (st != ATTN_OK) return st;
    v_new = values_of(cache, k_new, v_new);
    if (seq >= cache->cfg.batch)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: seq %zu is past the cache's batch of %zu",
                         who, seq, cache->cfg.batch);
    for (size_t i = 0; i < count; i++)
        if (rows[i] < 0 || (i && rows[i] <= rows[i - 1]))
            return attn_fail(ctx, ATTN_ERR_INVALID, "%s: rows[%zu] is %d: a branch's draft rows "
                             "are >= 0 and rise from root to leaf", who, i, (int)rows[i]);
    size_t floats;
    if (!attn_mul_size(count, cache->row, &floats) || !attn_floats_fit(2 * floats))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: %zu rows overflow", who, count);
    size_t *lens = attn_calloc(cache->cfg.batch, sizeof(size_t));
    float *k = attn_malloc(2 * floats * sizeof(float));
    if (!lens || !k) {
        attn_free(lens);
        attn_free(k);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate %zu rows", who, count);
    }
    float *v = k + floats;
    for (size_t i = 0; i < count; i++) {
        memcpy(k + i * cache->row, k_new + (size_t)rows[i] * cache->row, cache->row * sizeof(float));
        memcpy(v + i * cache->row, v_new + (size_t)rows[i] * cache->row, cache->row * sizeof(float));
    }
    lens[seq] = count;
    st = attn_kv_cache_append(cache, layer, lens, 0, k, cache->cfg.values_are_keys ? NULL : v);
    /* the append names itself; the caller called this */
    if (st != ATTN_OK) {
        char why[ATTN_ERROR_CAPACITY];
        snprintf(why, sizeof why, "%s", attn_ctx_last_error(ctx));
        st = attn_fail(ctx, st, "%s: %s", who, why);
    }
    attn_free(lens);
    attn_free(k);
    return st;
}
