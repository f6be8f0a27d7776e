/*
 * decode.c — the split-KV decode backend of the attention contract: a few
 * new rows per sequence against keys from a KV cache (contiguous or paged),
 * on the decode kernels of the ctx's kernel set (kernels/decode/decode.h).
 * It takes problems whose K and V come from a cache (attn_kv_cache_view),
 * float32 queries over K and V in any of the cache's stored formats
 * (widened in registers), causal with an optional window on the left and
 * an optional block map over positions (its hidden keys are lanes the
 * kernel's softmax weighs nothing; blocks it leaves out are skipped),
 * softcap, ALiBi and sinks, forward only; it declines dropout, which no
 * backend runs over a cache (the runner refuses such a problem, naming it).
 * Softcap and ALiBi change each block of scores in the kernels; a head's
 * sink joins each row's softmax once its chunks are folded, so that split
 * and row mode still fold the same partials the same way.
 *
 * The work of a sequence: its keys in chunks of C positions (C from its
 * length alone), each chunk's partial softmax folded into the result in
 * chunk order. Split mode runs the chunks of a few-row sequence as parallel
 * items and folds them afterwards (one token against a long cache uses
 * every thread); row mode runs blocks of rows, each walking its chunks in
 * order. Both fold the same partials in the same order, so the choice
 * (made by thread count and memory) changes no bit, and neither does the
 * layout: positions turn into rows by one function (attn_decode_key_rows).
 */
#include "attention/attention.h"

#include "kernels/decode/decode.h"
#include "parallel.h"

#include <math.h>
#include <string.h>

/* Chunks a sequence's keys are cut into at most (C is a power of two, at
 * least MIN_CHUNK): enough to spread one token over many threads, few
 * enough that the partials stay small. */
#define MAX_CHUNKS 64
#define MIN_CHUNK 256
/* Split mode's partials take at most this many floats per call (64 MiB);
 * sequences past it run in row mode. */
#define SPLIT_BUDGET ((size_t)16 << 20)
/* Multiply-adds below which one thread runs a call (waking the ctx's
 * workers and waiting for the last costs some microseconds). */
#define PARALLEL_WORK 4e6

static size_t ceil_div(size_t a, size_t b) { return a / b + (a % b != 0); }
static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

static const char *decode_declines(const attn_ctx *ctx, const attn_attention_problem *p,
                                   attn_pass pass) {
    if (!p->kv_cache) return "K and V are dense";
    if (!ctx->ks.decode) return "the ctx runs the reference kernels";
    if (p->q.dtype != ATTN_DTYPE_F32) return "its queries are float32";
    if (pass.backward) return "decoding has no backward";
    if (pass.traced) return "the scores' trace is the reference's";
    if (pass.dropout) return "dropout";
    const char *feature = attn_problem_unsupported(
        p, ATTN_USES_CAUSAL | ATTN_USES_WINDOW | ATTN_USES_KV_CACHE | ATTN_USES_TREE |
               ATTN_USES_SOFTCAP | ATTN_USES_ALIBI | ATTN_USES_SINKS | ATTN_USES_BLOCK_MAP |
               ATTN_USES_ROW_INTERVALS);
    if (feature) return feature;
    if (p->v_head_dim != p->head_dim) return "v_head_dim != head_dim";
    if (!p->causal || p->diagonal != ATTN_DIAGONAL_BOTTOM_RIGHT) return "not causal from the cache";
    if (p->window && (p->window_right != 0 || p->window_left < 0))
        return "a window other than (W - 1, 0)";
    size_t HD = p->q_heads * p->head_dim, KD = p->kv_heads * p->head_dim;
    if (p->q.st.t != HD || p->q.st.h != p->head_dim || p->out.st.t != HD ||
        p->out.st.h != p->head_dim || p->k.st.t != KD || p->k.st.h != p->head_dim ||
        p->v.st.t != KD || p->v.st.h != p->head_dim)
        return "rows that are not (tokens, heads, head_dim)";
    return NULL;
}

/* Whether the ctx's kernels score p's keys on AMX tiles once the process
 * holds them: bf16 keys (head_dim a multiple of 32), int8 ones (of 64). */
static bool keys_tile(const attn_ctx *ctx, const attn_attention_problem *p) {
    attn_dtype k = p->kv_cache->k.dtype;
    return ctx->ks.decode_amx && ((k == ATTN_DTYPE_BF16 && p->head_dim % 32 == 0) ||
                                  (k == ATTN_DTYPE_I8 && p->head_dim % 64 == 0));
}

/* The ctx's decode kernels for p: those on AMX tiles where they take p's
 * keys and the process may use the tiles, else its instruction set's. */
static const attn_decode_kernels *kernels_for(const attn_ctx *ctx,
                                              const attn_attention_problem *p) {
    return keys_tile(ctx, p) && attn_ctx_amx_usable(ctx) ? ctx->ks.decode_amx : ctx->ks.decode;
}

static const char *decode_kernel_name(const attn_ctx *ctx, const attn_attention_problem *p) {
    return kernels_for(ctx, p)->name;
}

/* ---- the plan of one call ---------------------------------------------------- */

typedef enum seq_path { PATH_NONE, PATH_SPLIT, PATH_ROWS } seq_path;

typedef struct seq_plan {
    attn_decode_seq d;
    size_t row_start;      /* its first packed row */
    seq_path path;
    size_t chunk;          /* C: positions per chunk */
    size_t chunk0, chunks; /* its chunks: [chunk0, chunk0 + chunks) */
    size_t partial_at;     /* split: floats into the partials */
} seq_plan;

/* What one call needs, summed over its sequences. */
typedef struct call_plan {
    size_t items;    /* parallel work items */
    size_t partials; /* floats of split partials */
    double work;     /* multiply-adds of the decode kernels */
    size_t rows;     /* packed rows up to the last sequence's last new one */
} call_plan;

/* A unit of parallel work: one chunk of a split sequence, or a block of
 * rows of a row-mode one. */
typedef struct work_item {
    size_t seq, index;
} work_item;

static size_t partial_floats(size_t rows, size_t H, size_t D) { return rows * H * (D + 2); }

/* One of K and V of sequence b, as stored: its slots (contiguous) or the
 * pool (paged), and its new rows. */
static attn_decode_store store_of(const attn_attention_problem *p, const attn_kv_stored *st,
                                  size_t b) {
    const attn_kv_cache_view *c = p->kv_cache;
    attn_kv_format f = attn_kv_format_of(st->dtype, p->head_dim);
    attn_decode_store m = {.fmt = f, .row_bytes = p->kv_heads * f.head_bytes,
                           .row_scales = p->kv_heads * f.head_scales};
    size_t first = c->row_start[b], slot0 = c->pages ? 0 : b * c->capacity;
    m.fresh = (const uint8_t *)st->fresh + first * m.row_bytes;
    m.fresh_scales = attn_decode_scales_at(st->fresh_scales, first, m.row_scales);
    m.cache = (const uint8_t *)st->pool + slot0 * m.row_bytes;
    m.cache_scales = attn_decode_scales_at(st->pool_scales, slot0, m.row_scales);
    return m;
}

/* Where sequence b's keys are: the cache's pools and its new rows. */
static attn_decode_keys keys_of(const attn_attention_problem *p, size_t b) {
    const attn_kv_cache_view *c = p->kv_cache;
    attn_decode_keys m = {.cached = c->cached[b], .k = store_of(p, &c->k, b),
                          .v = store_of(p, &c->v, b)};
    if (c->pages) {
        m.pages = c->pages + b * c->table_len;
        m.page_size = c->page_size;
        m.table_len = c->table_len;
    } else {
        m.capacity = c->capacity;
    }
    return m;
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

/* Every sequence's plan (into plans, batch of them, or nowhere when NULL)
 * and the call's sums. */
static call_plan plan_call(const attn_ctx *ctx, const attn_attention_problem *p,
                           seq_plan *plans) {
    size_t H = p->q_heads, D = p->head_dim, parts = attn_parallel_parts(ctx->num_threads);
    call_plan cp = {0};
    seq_plan one;
    double bytes = 0.0; /* of K and V the call reads */
    for (size_t b = 0; b < p->batch; b++) {
        seq_plan *sp = plans ? &plans[b] : &one;
        size_t n = p->kv_cache->new_rows[b];
        *sp = (seq_plan){.row_start = p->kv_cache->row_start[b]};
        sp->d = (attn_decode_seq){
            .q_heads = H, .kv_heads = p->kv_heads, .head_dim = D,
            .scale2 = (float)(p->scale_f64 * 1.4426950408889634), /* log2(e) */
            .q = (const float *)p->q.data + sp->row_start * H * D, .rows = n,
            .first_pos = p->kv_cache->cached[b],
            .window = p->window ? (size_t)p->window_left + 1 : 0, .keys = keys_of(p, b)};
        if (p->softcap > 0.0f) {
            sp->d.cap2 = (float)(p->softcap * ATTN_DECODE_LOG2E);
            sp->d.inv_cap2 = (float)(1.0 / (p->softcap * ATTN_DECODE_LOG2E));
        }
        sp->d.alibi_slopes = p->alibi_slopes;
        if (p->kv_cache->tree) {
            sp->d.tree = p->kv_cache->tree + sp->row_start * p->kv_cache->tree_words;
            sp->d.tree_words = p->kv_cache->tree_words;
        }
        sp->d.map = p->block_map;
        sp->d.map_b = b;
        if (!n) continue;
        if (sp->row_start + n > cp.rows) cp.rows = sp->row_start + n;
        plan_chunks(sp);
        const attn_decode_keys *ks = &sp->d.keys;
        bytes += (double)(sp->chunks * sp->chunk) *
                 (double)(ks->k.row_bytes + ks->v.row_bytes +
                          (ks->k.row_scales + ks->v.row_scales) * sizeof(float));
        cp.work += 2.0 * (double)n * (double)(sp->chunks * sp->chunk) * (double)(H * D);
        size_t pf = sp->chunks * partial_floats(n, H, D);
        if (n <= ATTN_DECODE_ROWS && sp->chunks > 1 && parts > 1 &&
            cp.partials + pf <= SPLIT_BUDGET) {
            sp->path = PATH_SPLIT;
            sp->partial_at = cp.partials;
            cp.partials += pf;
            cp.items += sp->chunks;
        } else {
            sp->path = PATH_ROWS;
            cp.items += ceil_div(n, ATTN_DECODE_ROWS);
        }
    }
    /* Keys past half the L3 come from memory (between two calls on them,
     * their own reading and the rest of a model's evict them), and the
     * lines asked for ahead arrive in time. Float32 keys an L3 holds are
     * read fastest without: the requests take the load slots the reading
     * needs. Narrower codes leave slots free while they are widened. */
    const attn_kv_cache_view *c = p->kv_cache;
    bool narrow = c->k.dtype != ATTN_DTYPE_F32 || c->v.dtype != ATTN_DTYPE_F32;
    bool stream = narrow || ctx->l3_bytes == 0 || bytes > 0.5 * (double)ctx->l3_bytes;
    for (size_t b = 0; plans && b < p->batch; b++) plans[b].d.keys.stream = stream;
    return cp;
}

/* The workspace, in order: the plans, the item list, then per part a
 * partial and the kernel's scratch, m and l of every row, the split
 * partials. */
typedef struct layout {
    size_t plans, items, part_floats, floats;
} layout;

static layout layout_of(const attn_ctx *ctx, const attn_attention_problem *p,
                        const call_plan *cp) {
    size_t H = p->q_heads, D = p->head_dim, parts = attn_parallel_parts(ctx->num_threads);
    layout l = {.plans = (p->batch * sizeof(seq_plan) + 63) / 64 * 64,
                .items = (cp->items * sizeof(work_item) + 63) / 64 * 64,
                .part_floats =
                    partial_floats(ATTN_DECODE_ROWS, H, D) + ATTN_DECODE_SCRATCH_FLOATS(H, D) +
                    /* whether or not the process holds the tiles yet: it
                     * may be given them between this sizing and the pass */
                    (keys_tile(ctx, p) ? ATTN_DECODE_TILE_FLOATS(H, D) : 0)};
    l.floats = parts * l.part_floats + 2 * cp->rows * H + cp->partials;
    return l;
}

static size_t decode_forward_bytes(const attn_ctx *ctx, const attn_attention_problem *p,
                                   const attn_attention_trace *trace) {
    (void)trace;
    call_plan cp = plan_call(ctx, p, NULL);
    layout l = layout_of(ctx, p, &cp);
    return l.plans + l.items + l.floats * sizeof(float);
}

/* ---- the pass ------------------------------------------------------------------ */

typedef struct attend_job {
    const attn_decode_kernels *kern;
    const seq_plan *plans;
    const work_item *items;
    size_t H, D;
    const float *sinks;  /* (H) a logit per query head, or NULL */
    float *out;          /* (rows, H, D): accumulators, then the result */
    float *m, *l;        /* (rows, H) running max and sum */
    float *partials;     /* split: per chunk (rows, H) m, l, then (rows, H, D) acc */
    float *part_scratch; /* per part: part_floats */
    size_t part_floats;
} attend_job;

/* Positions [chunk * C, (chunk + 1) * C) clipped to the sequence's keys. */
static void chunk_keys(const seq_plan *sp, size_t chunk, size_t *begin, size_t *end) {
    size_t total = sp->d.first_pos + sp->d.rows;
    *begin = chunk * sp->chunk;
    *end = min_size(*begin + sp->chunk, total);
}

/* rows [r0, r0 + n) of a sequence: (m, l, acc) /= l into out, each
 * head's sink in l where the problem has sinks; a row that saw no key (a
 * block map's) is zeros, sink or not (its out was never written). */
static void finish_rows(const attend_job *job, const seq_plan *sp, size_t r0, size_t n) {
    size_t H = job->H, D = job->D;
    for (size_t i = (sp->row_start + r0) * H; i < (sp->row_start + r0 + n) * H; i++) {
        float *o = job->out + i * D, l = job->l[i];
        if (l == 0.0f) {
            memset(o, 0, D * sizeof *o);
            continue;
        }
        if (job->sinks) {
            float sink2 = (float)((double)job->sinks[i % H] * ATTN_DECODE_LOG2E);
            attn_decode_sink(job->m[i], l, o, sink2, o, D);
            continue;
        }
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

static const char *decode_forward(attn_ctx *ctx, const attn_attention_problem *p,
                                  const attn_attention_dropout *drop,
                                  const attn_attention_trace *trace, void *workspace) {
    (void)drop, (void)trace; /* neither: decode_declines */
    size_t B = p->batch, H = p->q_heads, D = p->head_dim, threads = ctx->num_threads;
    seq_plan *plans = workspace;
    call_plan cp = plan_call(ctx, p, plans);
    layout lay = layout_of(ctx, p, &cp);
    work_item *list = (work_item *)((char *)workspace + lay.plans);
    float *f = (float *)((char *)list + lay.items);
    attend_job job = {.kern = kernels_for(ctx, p), .plans = plans, .items = list, .H = H, .D = D,
                      .sinks = p->sinks, .out = p->out.data, .part_scratch = f,
                      .part_floats = lay.part_floats};
    job.m = f + attn_parallel_parts(threads) * lay.part_floats;
    job.l = job.m + cp.rows * H;
    job.partials = job.l + cp.rows * H;
    /* every sequence's rows, packed from its row_start (the rows of a
     * sequence with no new ones are none) */
    for (size_t b = 0; b < B; b++)
        for (size_t i = plans[b].row_start * H; i < (plans[b].row_start + plans[b].d.rows) * H;
             i++) {
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
    attn_pool_dynamic(attn_ctx_pool(ctx), cp.work < PARALLEL_WORK ? 1 : threads, k, run_item,
                      &job);
    fold_split(&job, B);
    return NULL;
}

const attn_attention_backend attn_attention_decode = {
    .name = "decode",
    .kernel_name = decode_kernel_name,
    .declines = decode_declines,
    .forward_bytes = decode_forward_bytes,
    .forward = decode_forward,
};
