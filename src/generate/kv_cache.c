/*
 * kv_cache.c — the KV cache (attn.h, "Generation"): storage, contiguous or
 * paged, and attn_kv_cache_attend, "attend, then append".
 *
 * Storage of one layer (row = kv_heads * head_dim floats, one token):
 *   contiguous  k, v (batch, capacity, row), position p at slot
 *               p % capacity; capacity = max_len, or the window W (a ring)
 *   paged       k, v pools (num_pages, page_size, row); per sequence a
 *               table of table_len pool pages, logical page j at entry
 *               j % table_len: table_len = ceil(max_len / page_size), or
 *               ceil(W / page_size) + 1 for a window (a ring of pages whose
 *               oldest page is out of the window when it is reused)
 *
 * attend: new token r of sequence s (position p = len_s + r) sees positions
 * max(0, p - W + 1) .. p; those below len_s come from the cache, the others
 * straight from k_new/v_new (so a window layer needs W slots even for a
 * chunk longer than W). Then the new rows are appended (of a window layer,
 * only the last W matter). Positions turn into row pointers by one
 * function (kernels/decode/decode.h) for both layouts, and the arithmetic
 * depends on positions only: the layouts agree bit for bit.
 *
 * The work of a sequence (kernels/decode): its keys in chunks of C
 * positions (C from its length alone), each chunk's partial softmax
 * folded into the result in chunk order. Split mode runs the chunks of a
 * few-row sequence as parallel items and folds them afterwards (one token
 * against a long cache uses every thread); row mode runs blocks of rows,
 * each walking its chunks in order. Both fold the same partials in the
 * same order, so the choice (made by thread count and memory) changes no
 * bit. A prompt (empty cache, many rows) goes through the fused attention
 * runner instead. The reference kernels run plain double loops.
 */
#include "internal.h"

#include "attention/attention.h"
#include "kernels/decode/decode.h"
#include "parallel.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define WHO "attn_kv_cache_attend"
/* Chunks a sequence's keys are cut into at most (C is a power of two, at
 * least MIN_CHUNK): enough to spread one token over many threads, few
 * enough that the partials stay small. */
#define MAX_CHUNKS 64
#define MIN_CHUNK 256
/* A sequence whose cache is empty with at least this many new rows is a
 * prompt: the fused attention runs it. */
#define PREFILL_ROWS 64
/* Split mode's partials take at most this many floats per call (64 MiB);
 * sequences past it run in row mode. */
#define SPLIT_BUDGET ((size_t)16 << 20)
/* Multiply-adds below which one thread runs a call (waking the ctx's
 * workers and waiting for the last costs some microseconds). */
#define PARALLEL_WORK 4e6

typedef struct kv_layer {
    size_t window;     /* 0: keep every token */
    size_t capacity;   /* contiguous: slots per sequence */
    size_t table_len;  /* paged: page-table entries per sequence */
    float *k, *v;      /* contiguous blocks or page pools */
    size_t *length;    /* (batch) tokens appended */
    uint32_t *pages;   /* paged: (batch, table_len) pool pages, ATTN_DECODE_NO_PAGE */
    uint32_t *free;    /* paged: a stack of free pool pages */
    size_t free_count;
} kv_layer;

struct attn_kv_cache {
    attn_ctx *ctx;
    attn_kv_cache_config cfg; /* page_size and num_pages resolved; windows our copy */
    size_t *windows;
    size_t row; /* floats of one token: kv_heads * head_dim */
    kv_layer *layers;
    void *scratch; /* attend's working memory, kept from call to call */
    size_t scratch_bytes;
};

static size_t ceil_div(size_t a, size_t b) { return a / b + (a % b != 0); }
static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* ---- new, free, reset ------------------------------------------------------ */

static void free_layers(attn_kv_cache *c) {
    if (!c->layers) return;
    for (size_t i = 0; i < c->cfg.num_layers; i++) {
        kv_layer *L = &c->layers[i];
        attn_free(L->k);
        attn_free(L->v);
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
    attn_free(cache->scratch);
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
    L->window = c->windows ? c->windows[i] : 0;
    L->length = attn_calloc(cfg->batch, sizeof(size_t));
    if (!L->length) goto no_memory;
    size_t tokens; /* per pool or block */
    if (cfg->layout == ATTN_KV_CONTIGUOUS) {
        L->capacity = L->window ? min_size(L->window, cfg->max_len) : cfg->max_len;
        tokens = cfg->batch * L->capacity;
    } else {
        size_t all = ceil_div(cfg->max_len, cfg->page_size);
        L->table_len = L->window ? min_size(ceil_div(L->window, cfg->page_size) + 1, all) : all;
        tokens = cfg->num_pages * cfg->page_size;
        L->pages = attn_calloc(cfg->batch * L->table_len, sizeof(uint32_t));
        L->free = attn_calloc(cfg->num_pages, sizeof(uint32_t));
        if (!L->pages || !L->free) goto no_memory;
        free_all_pages(c, L);
    }
    /* never read before written: no need to zero */
    L->k = attn_malloc(tokens * c->row * sizeof(float));
    L->v = attn_malloc(tokens * c->row * sizeof(float));
    if (!L->k || !L->v) goto no_memory;
    return ATTN_OK;
no_memory:
    return attn_fail(c->ctx, ATTN_ERR_NO_MEMORY,
                     "attn_kv_cache_new: cannot allocate layer %zu (%zu tokens of %zu floats "
                     "for K and for V)",
                     i, cfg->layout == ATTN_KV_CONTIGUOUS ? cfg->batch * L->capacity
                                                          : cfg->num_pages * cfg->page_size,
                     c->row);
}

/* Fills in the defaults of cfg (page_size, num_pages) and checks it. */
static attn_status resolve_config(attn_ctx *ctx, attn_kv_cache_config *cfg, size_t *row) {
    const char *who = "attn_kv_cache_new";
    if (!cfg->num_layers || !cfg->batch || !cfg->kv_heads || !cfg->head_dim || !cfg->max_len)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: num_layers (%zu), batch (%zu), kv_heads (%zu), head_dim (%zu) and "
                         "max_len (%zu) must all be positive",
                         who, cfg->num_layers, cfg->batch, cfg->kv_heads, cfg->head_dim,
                         cfg->max_len);
    if (cfg->layout != ATTN_KV_CONTIGUOUS && cfg->layout != ATTN_KV_PAGED)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: layout %d is neither ATTN_KV_CONTIGUOUS "
                         "(0) nor ATTN_KV_PAGED (1)", who, (int)cfg->layout);
    size_t tokens, floats;
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
        size_t per_seq_max = ceil_div(cfg->max_len, cfg->page_size);
        if (!cfg->num_pages) {
            /* enough for every sequence at max_len in its largest layer */
            size_t most = 0;
            for (size_t i = 0; i < cfg->num_layers; i++) {
                size_t w = cfg->windows ? cfg->windows[i] : 0;
                size_t n = w ? min_size(ceil_div(w, cfg->page_size) + 1, per_seq_max)
                             : per_seq_max;
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
        size_t table;
        if (!attn_mul_size(cfg->batch, per_seq_max, &table) || !attn_floats_fit(table))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: batch (%zu) x %zu page-table "
                             "entries overflows", who, cfg->batch, per_seq_max);
    }
    if (!attn_mul_size(tokens, *row, &floats) || !attn_floats_fit(floats))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: %zu tokens x %zu floats per layer "
                         "overflows", who, tokens, *row);
    return ATTN_OK;
}

attn_status attn_kv_cache_new(attn_ctx *ctx, const attn_kv_cache_config *cfg,
                              attn_kv_cache **out) {
    attn_clear_error(ctx);
    if (!ctx || !cfg || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_kv_cache_new: ctx, cfg and out must not be NULL");
    *out = NULL;
    attn_kv_cache_config c = *cfg;
    size_t row = 0;
    attn_status st = resolve_config(ctx, &c, &row);
    if (st != ATTN_OK) return st;
    attn_kv_cache *cache = attn_calloc(1, sizeof(*cache));
    if (!cache)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_kv_cache_new: cannot allocate the cache");
    cache->ctx = ctx;
    cache->row = row;
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
        total += 2 * tokens * cache->row * sizeof(float);
    }
    return total;
}

/* ---- positions to rows --------------------------------------------------------- */

/* Where sequence s's keys of layer L are, its new rows at k_new/v_new. */
static attn_decode_keys keys_of(const attn_kv_cache *c, const kv_layer *L, size_t s,
                                const float *k_new, const float *v_new) {
    attn_decode_keys m = {.row = c->row, .cached = L->length[s], .k_new = k_new, .v_new = v_new};
    if (c->cfg.layout == ATTN_KV_PAGED) {
        m.pages = L->pages + s * L->table_len;
        m.page_size = c->cfg.page_size;
        m.table_len = L->table_len;
        m.k_pool = L->k;
        m.v_pool = L->v;
    } else {
        m.capacity = L->capacity;
        m.k_cache = L->k + s * L->capacity * c->row;
        m.v_cache = L->v + s * L->capacity * c->row;
    }
    return m;
}

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

/* Writes the stored new rows of sequence s (pages were counted free). */
static void append_rows(const attn_kv_cache *c, kv_layer *L, size_t s, size_t n,
                        const float *k_new, const float *v_new) {
    size_t len = L->length[s], row = c->row, bytes = row * sizeof(float);
    for (size_t pos = first_stored(L, len, n); pos < len + n; pos++) {
        size_t at;
        if (c->cfg.layout == ATTN_KV_PAGED) {
            size_t ps = c->cfg.page_size;
            uint32_t *entry = L->pages + s * L->table_len + (pos / ps) % L->table_len;
            if (*entry == ATTN_DECODE_NO_PAGE) *entry = L->free[--L->free_count];
            at = ((size_t)*entry * ps + pos % ps) * row;
        } else {
            at = (s * L->capacity + pos % L->capacity) * row;
        }
        memcpy(L->k + at, k_new + (pos - len) * row, bytes);
        memcpy(L->v + at, v_new + (pos - len) * row, bytes);
    }
    L->length[s] = len + n;
}

/* ---- the plan of one call ---------------------------------------------------- */

typedef enum seq_path { PATH_NONE, PATH_REFERENCE, PATH_PREFILL, PATH_SPLIT, PATH_ROWS } seq_path;

typedef struct seq_plan {
    attn_decode_seq d;
    size_t row_start;     /* its first packed row */
    seq_path path;
    size_t chunk;         /* C: positions per chunk */
    size_t chunk0, chunks; /* its chunks: [chunk0, chunk0 + chunks) */
    size_t partial_at;    /* split: floats into the partials */
} seq_plan;

/* A unit of parallel work: one chunk of a split sequence, or a block of
 * rows of a row-mode one. */
typedef struct work_item {
    size_t seq, index;
} work_item;

typedef struct attend_job {
    const attn_decode_kernels *kern;
    const seq_plan *plans;
    const work_item *items;
    size_t H, D;
    float *out;            /* (rows, H, D): accumulators, then the result */
    float *m, *l;          /* (rows, H) running max and sum */
    float *partials;       /* split: per chunk (rows, H) m, l, then (rows, H, D) acc */
    float *part_scratch;   /* per part: part_floats */
    size_t part_floats;
} attend_job;

static size_t partial_floats(size_t rows, size_t H, size_t D) { return rows * H * (D + 2); }

/* Positions [chunk * C, (chunk + 1) * C) clipped to the sequence's keys. */
static void chunk_keys(const seq_plan *sp, size_t chunk, size_t *begin, size_t *end) {
    size_t total = sp->d.first_pos + sp->d.rows;
    *begin = chunk * sp->chunk;
    *end = min_size(*begin + sp->chunk, total);
}

/* rows [r0, r0 + n) of a sequence: (m, l, acc) /= l into out. */
static void finish_rows(const attend_job *job, const seq_plan *sp, size_t r0, size_t n) {
    size_t H = job->H, D = job->D;
    for (size_t i = (sp->row_start + r0) * H; i < (sp->row_start + r0 + n) * H; i++) {
        float *o = job->out + i * D, l = job->l[i];
        for (size_t d = 0; d < D; d++) o[d] = o[d] / l;
    }
}

/* Folds a partial of rows [r0, r0 + n) (m, l (n, H), acc (n, H, D)) into
 * the running results of those rows. */
static void fold_rows(const attend_job *job, const seq_plan *sp, size_t r0, size_t n,
                      const float *pm, const float *pl, const float *pacc) {
    size_t H = job->H, D = job->D, base = (sp->row_start + r0) * H;
    for (size_t i = 0; i < n * H; i++)
        attn_decode_fold(&job->m[base + i], &job->l[base + i], job->out + (base + i) * D, pm[i],
                         pl[i], pacc + i * D, D);
}

static void run_item(void *arg, size_t part, size_t item) {
    const attend_job *job = arg;
    const work_item *w = &job->items[item];
    const seq_plan *sp = &job->plans[w->seq];
    size_t H = job->H, D = job->D, begin, end;
    float *scratch = job->part_scratch + part * job->part_floats;
    if (sp->path == PATH_SPLIT) {
        size_t c = sp->chunk0 + w->index, n = sp->d.rows;
        float *pm = job->partials + sp->partial_at + w->index * partial_floats(n, H, D);
        chunk_keys(sp, c, &begin, &end);
        job->kern->chunk(&sp->d, 0, n, begin, end, pm, pm + n * H, pm + 2 * n * H, scratch);
        return;
    }
    /* row mode: rows [r0, r0 + n), every chunk in order */
    size_t r0 = w->index * ATTN_DECODE_ROWS, n = min_size(ATTN_DECODE_ROWS, sp->d.rows - r0);
    float *pm = scratch, *pl = pm + n * H, *pacc = pl + n * H;
    float *chunk_scratch = scratch + partial_floats(ATTN_DECODE_ROWS, H, D);
    for (size_t c = sp->chunk0; c < sp->chunk0 + sp->chunks; c++) {
        chunk_keys(sp, c, &begin, &end);
        job->kern->chunk(&sp->d, r0, n, begin, end, pm, pl, pacc, chunk_scratch);
        fold_rows(job, sp, r0, n, pm, pl, pacc);
    }
    finish_rows(job, sp, r0, n);
}

/* Split sequences: fold each one's chunk partials in chunk order. */
static void fold_split(const attend_job *job, size_t batch) {
    size_t H = job->H, D = job->D;
    for (size_t s = 0; s < batch; s++) {
        const seq_plan *sp = &job->plans[s];
        if (sp->path != PATH_SPLIT) continue;
        size_t n = sp->d.rows;
        for (size_t c = 0; c < sp->chunks; c++) {
            const float *pm = job->partials + sp->partial_at + c * partial_floats(n, H, D);
            fold_rows(job, sp, 0, n, pm, pm + n * H, pm + 2 * n * H);
        }
        finish_rows(job, sp, 0, n);
    }
}

/* ---- the reference: double loops ---------------------------------------------- */

typedef struct reference_job {
    const seq_plan *plans;
    size_t batch, H, D;
    double scale;
    float *out;
    double *scratch; /* per part: positions + D doubles */
    size_t part_doubles;
} reference_job;

/* Row r (packed) of every query head: softmax(q . k * scale) @ v over its
 * visible positions, all in double. */
static void reference_row(void *arg, size_t part, size_t begin, size_t end) {
    const reference_job *job = arg;
    size_t H = job->H, D = job->D;
    double *w = job->scratch + part * job->part_doubles, *o = w + job->part_doubles - D;
    for (size_t row = begin; row < end; row++) {
        size_t s = 0;
        while (!(job->plans[s].path == PATH_REFERENCE && row >= job->plans[s].row_start &&
                 row < job->plans[s].row_start + job->plans[s].d.rows))
            s++;
        const attn_decode_seq *d = &job->plans[s].d;
        size_t r = row - job->plans[s].row_start, lo, hi, G = H / d->kv_heads;
        attn_decode_visible(d, r, &lo, &hi);
        for (size_t h = 0; h < H; h++) {
            const float *q = d->q + (r * H + h) * D;
            size_t off = (h / G) * D;
            double mx = -INFINITY, sum = 0.0;
            for (size_t j = lo; j < hi; j++) {
                const float *k, *v;
                attn_decode_key_rows(&d->keys, j, 1, &k, &v);
                double dotp = 0.0;
                for (size_t e = 0; e < D; e++) dotp += (double)q[e] * k[off + e];
                w[j - lo] = dotp * job->scale;
                if (w[j - lo] > mx) mx = w[j - lo];
            }
            for (size_t e = 0; e < D; e++) o[e] = 0.0;
            for (size_t j = lo; j < hi; j++) {
                const float *k, *v;
                attn_decode_key_rows(&d->keys, j, 1, &k, &v);
                double p = exp(w[j - lo] - mx);
                sum += p;
                for (size_t e = 0; e < D; e++) o[e] += p * v[off + e];
            }
            float *y = job->out + (row * H + h) * D;
            for (size_t e = 0; e < D; e++) y[e] = (float)(o[e] / sum);
        }
    }
}

/* ---- attend ------------------------------------------------------------------ */

/* The new tokens of sequence s. */
static size_t new_count(const size_t *new_lens, size_t new_tokens, size_t s) {
    return new_lens ? new_lens[s] : new_tokens;
}

/* What attend and append share: the layer, the rows (*rows_out, packed),
 * and the limits: max_len and the pool's free pages. */
static attn_status check_append(attn_kv_cache *c, const char *who, size_t layer,
                                const size_t *new_lens, size_t new_tokens, size_t *rows_out) {
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
    for (size_t s = 0; s < cfg->batch; s++) {
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

/* Appends every sequence's rows (the limits checked). */
static void append_all(attn_kv_cache *c, kv_layer *L, const size_t *new_lens, size_t new_tokens,
                       const float *k_new, const float *v_new) {
    for (size_t s = 0, at = 0; s < c->cfg.batch; s++) {
        size_t n = new_count(new_lens, new_tokens, s);
        if (n) append_rows(c, L, s, n, k_new + at * c->row, v_new + at * c->row);
        at += n;
    }
}

attn_status attn_kv_cache_append(attn_kv_cache *cache, size_t layer, const size_t *new_lens,
                                 size_t new_tokens, const float *k_new, const float *v_new) {
    if (!cache) return ATTN_ERR_NULL;
    attn_clear_error(cache->ctx);
    size_t rows = 0;
    attn_status st = check_append(cache, "attn_kv_cache_append", layer, new_lens, new_tokens,
                                  &rows);
    if (st != ATTN_OK || rows == 0) return st;
    if (!k_new || !v_new)
        return attn_fail(cache->ctx, ATTN_ERR_NULL,
                         "attn_kv_cache_append: k_new and v_new must not be NULL");
    append_all(cache, &cache->layers[layer], new_lens, new_tokens, k_new, v_new);
    return ATTN_OK;
}

/* Checks attend's arguments; *rows_out the packed rows. */
static attn_status check_args(attn_kv_cache *c, const attn_kv_attend_args *a, size_t *rows_out) {
    attn_ctx *ctx = c->ctx;
    const attn_kv_cache_config *cfg = &c->cfg;
    attn_status st = check_append(c, WHO, a->layer, a->new_lens, a->new_tokens, rows_out);
    if (st != ATTN_OK) return st;
    size_t rows = *rows_out, qrow;
    if (!a->q_heads || a->q_heads % cfg->kv_heads)
        return attn_fail(ctx, ATTN_ERR_SHAPE, WHO ": q_heads (%zu) is not a positive multiple "
                         "of the cache's kv_heads (%zu)", a->q_heads, cfg->kv_heads);
    if (!isfinite(a->scale) || a->scale < 0.0)
        return attn_fail(ctx, ATTN_ERR_INVALID, WHO ": scale %g is not a finite value >= 0 "
                         "(0: 1 / sqrt(head_dim))", a->scale);
    if (!attn_mul3_size(rows, a->q_heads, cfg->head_dim, &qrow) || !attn_floats_fit(qrow))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, WHO ": %zu rows x %zu heads x %zu overflows",
                         rows, a->q_heads, cfg->head_dim);
    if (rows && (!a->q || !a->k_new || !a->v_new || !a->out))
        return attn_fail(ctx, ATTN_ERR_NULL, WHO ": q, k_new, v_new and out must not be NULL");
    return ATTN_OK;
}

/* The chunks of a sequence: C from its length, and those its rows see. */
static void plan_chunks(seq_plan *sp) {
    size_t total = sp->d.first_pos + sp->d.rows, C = MIN_CHUNK;
    while (C < total && ceil_div(total, C) > MAX_CHUNKS) C *= 2;
    size_t lo, hi;
    attn_decode_visible(&sp->d, 0, &lo, &hi);
    sp->chunk = C;
    sp->chunk0 = lo / C;
    sp->chunks = (total - 1) / C - sp->chunk0 + 1;
}

/* Grows the cache's scratch to bytes (its contents lost). */
static bool scratch_fit(attn_kv_cache *c, size_t bytes) {
    if (bytes <= c->scratch_bytes) return true;
    attn_free(c->scratch);
    c->scratch = attn_aligned_alloc(64, bytes); /* the kernels' tiles: whole lines */
    c->scratch_bytes = c->scratch ? bytes : 0;
    return c->scratch != NULL;
}

/* The fused attention on one prompt (an empty cache: keys = its rows). */
static attn_attention_problem prefill_problem(const seq_plan *sp, float scale, float *out) {
    const attn_decode_seq *d = &sp->d;
    size_t H = d->q_heads, KH = d->kv_heads, D = d->head_dim;
    attn_attention_problem p = {
        .batch = 1, .q_heads = H, .kv_heads = KH, .q_len = d->rows, .kv_len = d->rows,
        .head_dim = D, .v_head_dim = D,
        .q = attn_view_f32(d->q, (attn_view_strides){0, H * D, D}),
        .k = attn_view_f32(d->keys.k_new, (attn_view_strides){0, KH * D, D}),
        .v = attn_view_f32(d->keys.v_new, (attn_view_strides){0, KH * D, D}),
        .out = attn_view_f32(out + sp->row_start * H * D, (attn_view_strides){0, H * D, D}),
        .scale = scale, .causal = true};
    if (d->window) {
        p.window = true;
        p.window_left = (int64_t)d->window - 1;
        p.window_right = 0;
    }
    return p;
}

/* What one call needs, summed over its sequences. */
typedef struct call_plan {
    size_t items;         /* parallel work items */
    size_t partials;      /* floats of split partials */
    size_t max_keys;      /* reference: the most keys a row sees, at most */
    size_t prefill_bytes; /* the largest prompt's attention workspace */
    double work;          /* multiply-adds of the decode kernels */
} call_plan;

/* Chooses the path of sequence sp (its d and row_start set) and adds what
 * it needs to cp. */
static void plan_sequence(attn_ctx *ctx, seq_plan *sp, size_t parts, float scale, float *out,
                          call_plan *cp) {
    size_t n = sp->d.rows, H = sp->d.q_heads, D = sp->d.head_dim;
    if (!n) return;
    if (!ctx->ks.decode) {
        sp->path = PATH_REFERENCE;
        if (sp->d.first_pos + n > cp->max_keys) cp->max_keys = sp->d.first_pos + n;
        return;
    }
    if (sp->d.first_pos == 0 && n >= PREFILL_ROWS) {
        sp->path = PATH_PREFILL;
        attn_attention_problem p = prefill_problem(sp, scale, out);
        size_t b = attn_attention_forward_bytes(ctx, &p, false, false);
        if (b > cp->prefill_bytes) cp->prefill_bytes = b;
        return;
    }
    plan_chunks(sp);
    cp->work += 2.0 * (double)n * (double)(sp->chunks * sp->chunk) * (double)(H * D);
    size_t pf = sp->chunks * partial_floats(n, H, D);
    if (n <= ATTN_DECODE_ROWS && sp->chunks > 1 && parts > 1 &&
        cp->partials + pf <= SPLIT_BUDGET) {
        sp->path = PATH_SPLIT;
        sp->partial_at = cp->partials;
        cp->partials += pf;
        cp->items += sp->chunks;
    } else {
        sp->path = PATH_ROWS;
        cp->items += ceil_div(n, ATTN_DECODE_ROWS);
    }
}

/* The fast paths on scratch laid out as in attn_kv_cache_attend: prompts
 * through the fused attention, then the decode items, then the folds. */
static void run_fast(attn_kv_cache *c, const seq_plan *plans, const call_plan *cp, size_t rows,
                     size_t H, float scale, float *out, size_t item_bytes, size_t part_floats) {
    attn_ctx *ctx = c->ctx;
    size_t B = c->cfg.batch, D = c->cfg.head_dim, threads = attn_ctx_num_threads(ctx);
    for (size_t s = 0; s < B; s++) {
        if (plans[s].path != PATH_PREFILL) continue;
        attn_attention_problem p = prefill_problem(&plans[s], scale, out);
        /* checked and its workspace in hand: it cannot fail */
        (void)attn_attention_forward(ctx, WHO, &p, NULL, NULL, NULL, NULL, c->scratch);
    }
    work_item *list = c->scratch;
    float *f = (float *)((char *)c->scratch + item_bytes);
    attend_job job = {.kern = ctx->ks.decode, .plans = plans, .items = list, .H = H, .D = D,
                      .out = out, .part_scratch = f, .part_floats = part_floats};
    job.m = f + attn_parallel_parts(threads) * part_floats;
    job.l = job.m + rows * H;
    job.partials = job.l + rows * H;
    for (size_t i = 0; i < rows * H; i++) {
        job.m[i] = -INFINITY;
        job.l[i] = 0.0f;
    }
    size_t k = 0;
    for (size_t s = 0; s < B; s++) {
        const seq_plan *sp = &plans[s];
        size_t n = sp->path == PATH_SPLIT  ? sp->chunks
                   : sp->path == PATH_ROWS ? ceil_div(sp->d.rows, ATTN_DECODE_ROWS)
                                           : 0;
        for (size_t i = 0; i < n; i++) list[k++] = (work_item){s, i};
    }
    /* threads only where the work pays for starting them */
    attn_pool_dynamic(attn_ctx_pool(ctx), cp->work < PARALLEL_WORK ? 1 : threads, k, run_item,
                      &job);
    fold_split(&job, B);
}

attn_status attn_kv_cache_attend(attn_kv_cache *cache, const attn_kv_attend_args *args) {
    if (!cache) return ATTN_ERR_NULL;
    attn_ctx *ctx = cache->ctx;
    attn_clear_error(ctx);
    if (!args) return attn_fail(ctx, ATTN_ERR_NULL, WHO ": args must not be NULL");
    size_t rows = 0;
    attn_status st = check_args(cache, args, &rows);
    if (st != ATTN_OK || rows == 0) return st;

    const attn_kv_cache_config *cfg = &cache->cfg;
    kv_layer *L = &cache->layers[args->layer];
    size_t B = cfg->batch, H = args->q_heads, D = cfg->head_dim, KH = cfg->kv_heads;
    size_t threads = attn_ctx_num_threads(ctx), parts = attn_parallel_parts(threads);
    double scale = args->scale > 0.0 ? args->scale : 1.0 / sqrt((double)D);

    /* plan every sequence and take the memory: all in hand before anything
     * is written */
    seq_plan *plans = attn_calloc(B, sizeof(seq_plan));
    if (!plans) goto no_memory;
    call_plan cp = {0};
    for (size_t s = 0, at = 0; s < B; s++) {
        seq_plan *sp = &plans[s];
        size_t n = new_count(args->new_lens, args->new_tokens, s);
        sp->row_start = at;
        sp->d = (attn_decode_seq){
            .q_heads = H, .kv_heads = KH, .head_dim = D,
            .scale2 = (float)(scale * 1.4426950408889634), /* log2(e) */
            .q = args->q + at * H * D, .rows = n, .first_pos = L->length[s],
            .window = L->window,
            .keys = keys_of(cache, L, s, args->k_new + at * KH * D, args->v_new + at * KH * D)};
        at += n;
        plan_sequence(ctx, sp, parts, (float)scale, args->out, &cp);
    }
    /* scratch: the item list, then per part a partial and the kernel's
     * scratch, m and l of every row, the split partials; or the
     * reference's doubles; or a prompt's workspace (used first) */
    bool reference = !ctx->ks.decode;
    size_t part_floats = partial_floats(ATTN_DECODE_ROWS, H, D) +
                         ATTN_DECODE_ROWS * H * ATTN_DECODE_BLOCK;
    size_t item_bytes = (cp.items * sizeof(work_item) + 63) / 64 * 64;
    size_t bytes = item_bytes + (parts * part_floats + 2 * rows * H + cp.partials) * sizeof(float);
    if (reference) bytes = parts * (cp.max_keys + D) * sizeof(double);
    if (cp.prefill_bytes > bytes) bytes = cp.prefill_bytes;
    if (!scratch_fit(cache, bytes)) goto no_memory;

    /* nothing fails from here on */
    if (reference) {
        reference_job rj = {plans, B, H, D, scale, args->out, cache->scratch, cp.max_keys + D};
        attn_parallel_for_parts(threads, rows, 1, reference_row, &rj);
    } else {
        run_fast(cache, plans, &cp, rows, H, (float)scale, args->out, item_bytes, part_floats);
    }
    append_all(cache, L, args->new_lens, args->new_tokens, args->k_new, args->v_new);
    attn_free(plans);
    return ATTN_OK;
no_memory:
    attn_free(plans);
    return attn_fail(ctx, ATTN_ERR_NO_MEMORY, WHO ": cannot allocate the working memory of %zu "
                     "rows against layer %zu", rows, args->layer);
}
