/*
 * test_block_mask.c — mask descriptions and block maps (attn.h's
 * "Programmable attention"), against brute force on fresh random inputs.
 *
 * Every map built here is checked element by element against a dense
 * oracle: its full and partial lists (ascending), the partial tiles' bits,
 * the skipped tiles, the transpose, the info (counts, sparsity as
 * BlockMask.sparsity()) and the row intervals (present exactly when every
 * row of a head-independent map is one interval with ends that never
 * fall, and then equal to brute force). The oracles: attn_mask_visible for
 * descriptions (itself checked against closed formulas per primitive),
 * the dense tensors for from_bool / from_additive, the lists for
 * from_kv_blocks. A map from a description must also equal the map of the
 * same description read element by element through from_fn, so the
 * closed-form tile classes never claim full or empty wrongly. Slices of a
 * map (the rectangles context parallelism runs) equal the maps of the same
 * rectangles of the oracle.
 * ATTN_TEST_SEED repeats a run.
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"
#include "mask/mask_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state;

static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static size_t rand_below(size_t n) { return (size_t)(next_u64() % n); }
static int64_t rand_in(int64_t lo, int64_t hi) { return lo + (int64_t)rand_below((size_t)(hi - lo + 1)); }

/* ---- primitives with their closed formulas --------------------------------- */

typedef enum prim_kind {
    P_ALL,
    P_CAUSAL,
    P_WINDOW,
    P_CHUNKED,
    P_PREFIX_LM,
    P_DOCUMENT,
    P_GLOBAL,
    P_KV_LENGTH,
    P_KINDS
} prim_kind;

typedef struct prim {
    prim_kind kind;
    int64_t offset, left, right, chunk, tokens;
    int64_t values[3];
    size_t count;
    int32_t *q_doc, *kv_doc; /* (doc_batch, T), (doc_batch, S) */
    size_t doc_batch, T, S;
} prim;

static int64_t floor_div(int64_t a, int64_t c) { return a >= 0 ? a / c : -((-a + c - 1) / c); }

/* The primitive's definition as attn.h states it. */
static bool prim_visible(const prim *p, size_t b, size_t q, size_t kv) {
    int64_t qi = (int64_t)q, ki = (int64_t)kv;
    switch (p->kind) {
    case P_ALL: return true;
    case P_CAUSAL: return ki <= qi + p->offset;
    case P_WINDOW:
        return (p->left < 0 || qi + p->offset - p->left <= ki) &&
               (p->right < 0 || ki <= qi + p->offset + p->right);
    case P_CHUNKED: return floor_div(qi + p->offset, p->chunk) == floor_div(ki, p->chunk);
    case P_PREFIX_LM: return ki <= qi || ki < p->values[p->count == 1 ? 0 : b];
    case P_DOCUMENT: {
        size_t bb = p->doc_batch == 1 ? 0 : b;
        return p->q_doc[bb * p->T + q] == p->kv_doc[bb * p->S + kv];
    }
    case P_GLOBAL: return qi < p->tokens || ki < p->tokens;
    case P_KV_LENGTH: return ki < p->values[p->count == 1 ? 0 : b];
    default: return false;
    }
}

/* ids of n positions: in runs in order (style 0), runs in any order (1), or
 * any ids (2) */
static void random_ids(int32_t *ids, size_t n, int style) {
    int32_t id = (int32_t)rand_in(-3, 3);
    size_t left = 0;
    for (size_t i = 0; i < n; i++) {
        if (style == 2) {
            ids[i] = (int32_t)rand_below(3);
            continue;
        }
        if (!left) {
            left = 1 + rand_below(1 + rand_below(120));
            id = style == 0 ? id + (int32_t)rand_in(1, 2) : (int32_t)rand_below(6);
        }
        ids[i] = id;
        left--;
    }
}

/* A random primitive for a (batch, T, S) map: its description and its
 * parameters. */
static attn_mask *random_prim(attn_ctx *ctx, prim_kind kind, size_t batch, size_t T, size_t S,
                              prim *p) {
    memset(p, 0, sizeof *p);
    p->kind = kind;
    attn_mask *m = NULL;
    attn_status st = ATTN_ERR_INVALID;
    int64_t s = (int64_t)S, t = (int64_t)T;
    switch (kind) {
    case P_ALL: st = attn_mask_new_all(ctx, &m); break;
    case P_CAUSAL:
        p->offset = rand_below(3) == 0 ? s - t : rand_in(-s, s);
        st = attn_mask_new_causal(ctx, p->offset, &m);
        break;
    case P_WINDOW:
        p->left = rand_below(4) == 0 ? -1 : rand_in(0, 80);
        p->right = rand_below(4) == 0 ? -1 : rand_in(0, 80);
        p->offset = rand_in(-s / 2, s / 2);
        st = attn_mask_new_window(ctx, p->left, p->right, p->offset, &m);
        break;
    case P_CHUNKED:
        p->chunk = rand_in(1, 130);
        p->offset = rand_in(-s / 2, s / 2);
        st = attn_mask_new_chunked(ctx, (size_t)p->chunk, p->offset, &m);
        break;
    case P_PREFIX_LM:
    case P_KV_LENGTH:
        p->count = rand_below(2) ? 1 : batch;
        for (size_t i = 0; i < p->count; i++) p->values[i] = rand_in(0, s + 5);
        st = kind == P_PREFIX_LM ? attn_mask_new_prefix_lm(ctx, p->values, p->count, &m)
                                 : attn_mask_new_kv_length(ctx, p->values, p->count, &m);
        break;
    case P_DOCUMENT: {
        p->doc_batch = rand_below(2) ? 1 : batch;
        p->T = T;
        p->S = S;
        bool self = T == S && rand_below(2);
        int style = (int)rand_below(3);
        p->q_doc = malloc(p->doc_batch * T * sizeof(int32_t));
        p->kv_doc = malloc(p->doc_batch * S * sizeof(int32_t));
        for (size_t b = 0; b < p->doc_batch; b++) {
            random_ids(p->q_doc + b * T, T, style);
            if (self) memcpy(p->kv_doc + b * S, p->q_doc + b * T, T * sizeof(int32_t));
            else random_ids(p->kv_doc + b * S, S, style);
        }
        st = attn_mask_new_document(ctx, p->q_doc, self ? NULL : p->kv_doc, p->doc_batch, T,
                                    self ? 0 : S, &m);
        break;
    }
    case P_GLOBAL:
        p->tokens = rand_in(0, 60);
        st = attn_mask_new_global(ctx, (size_t)p->tokens, &m);
        break;
    default: break;
    }
    CHECK_STATUS(st, ATTN_OK);
    return m;
}

static void prim_free(prim *p) {
    free(p->q_doc);
    free(p->kv_doc);
    p->q_doc = p->kv_doc = NULL;
}

/* attn_mask_visible against each primitive's formula on random points. */
static void test_visible_formulas(attn_ctx *ctx) {
    for (int round = 0; round < 40; round++)
        for (int k = 0; k < P_KINDS; k++) {
            size_t batch = 1 + rand_below(3), T = 1 + rand_below(300), S = 1 + rand_below(300);
            prim p;
            attn_mask *m = random_prim(ctx, (prim_kind)k, batch, T, S, &p);
            int wrong = 0;
            for (int i = 0; i < 300 && m; i++) {
                size_t b = rand_below(batch), q = rand_below(T), kv = rand_below(S);
                bool got = false;
                attn_status st = attn_mask_visible(ctx, m, b, 0, q, kv, &got);
                if (st != ATTN_OK || got != prim_visible(&p, b, q, kv)) {
                    if (!wrong++)
                        fprintf(stderr, "primitive %d at (%zu, %zu, %zu): %s, got %d\n", k, b,
                                q, kv, attn_status_name(st), (int)got);
                }
            }
            CHECK(wrong == 0);
            attn_mask_free(m);
            prim_free(&p);
        }
}

/* ---- dense oracles and the map check ---------------------------------------- */

typedef struct dense {
    size_t batch, heads, T, S;
    uint8_t *v; /* (batch, heads, T, S) */
} dense;

static uint8_t *at(const dense *d, size_t b, size_t h, size_t q) {
    return d->v + ((b * d->heads + h) * d->T + q) * d->S;
}

static dense dense_new(size_t batch, size_t heads, size_t T, size_t S) {
    dense d = {batch, heads, T, S, calloc(batch * heads * T * S, 1)};
    return d;
}

static dense dense_of_mask(attn_ctx *ctx, const attn_mask *m, size_t batch, size_t heads,
                           size_t T, size_t S) {
    dense d = dense_new(batch, heads, T, S);
    for (size_t b = 0; b < batch; b++)
        for (size_t h = 0; h < heads; h++)
            for (size_t q = 0; q < T; q++)
                for (size_t k = 0; k < S; k++) {
                    bool v = false;
                    if (attn_mask_visible(ctx, m, b, h, q, k, &v) != ATTN_OK) check_failed++;
                    at(&d, b, h, q)[k] = v;
                }
    return d;
}

static bool list_has(const uint32_t *list, size_t from, size_t to, size_t x, size_t *where) {
    for (size_t e = from; e < to; e++)
        if (list[e] == x) {
            *where = e;
            return true;
        }
    return false;
}

static bool ascending(const uint32_t *list, size_t from, size_t to) {
    for (size_t e = from + 1; e < to; e++)
        if (list[e - 1] >= list[e]) return false;
    return true;
}

/* The map bm equals what oracle d (the map's batch and heads) says, in
 * every part. label names the case in failures. */
static void check_map(const attn_block_mask *bm, const dense *d, const char *label) {
    const attn_block_map *m = attn_block_mask_map(bm);
    int before = check_failed;
    CHECK(m->batch == d->batch && m->heads == d->heads && m->q_len == d->T && m->kv_len == d->S);
    size_t full = 0, part = 0;
    int bad_tiles = 0;
    for (size_t b = 0; b < d->batch; b++)
        for (size_t h = 0; h < d->heads; h++)
            for (size_t qb = 0; qb < m->q_blocks; qb++) {
                size_t r = attn_block_map_row(m, b, h, qb);
                CHECK(ascending(m->full, m->full_at[r], m->full_at[r + 1]));
                CHECK(ascending(m->part, m->part_at[r], m->part_at[r + 1]));
                full += m->full_at[r + 1] - m->full_at[r];
                part += m->part_at[r + 1] - m->part_at[r];
                size_t q0 = qb * m->block_q, q1 = q0 + m->block_q < d->T ? q0 + m->block_q : d->T;
                for (size_t kb = 0; kb < m->kv_blocks; kb++) {
                    size_t k0 = kb * m->block_kv;
                    size_t k1 = k0 + m->block_kv < d->S ? k0 + m->block_kv : d->S;
                    size_t seen = 0;
                    for (size_t q = q0; q < q1; q++)
                        for (size_t k = k0; k < k1; k++) seen += at(d, b, h, q)[k];
                    size_t fe = 0, pe = 0;
                    bool in_full = list_has(m->full, m->full_at[r], m->full_at[r + 1], kb, &fe);
                    bool in_part = list_has(m->part, m->part_at[r], m->part_at[r + 1], kb, &pe);
                    bool ok;
                    if (seen == 0) ok = !in_full && !in_part;
                    else if (seen == (q1 - q0) * (k1 - k0)) ok = in_full && !in_part;
                    else {
                        ok = !in_full && in_part;
                        for (size_t i = 0; ok && i < m->block_q; i++)
                            for (size_t j = 0; ok && j < m->block_kv; j++) {
                                bool want = q0 + i < q1 && k0 + j < k1 && at(d, b, h, q0 + i)[k0 + j];
                                ok = attn_block_map_bit(m, m->part_tile[pe], i, j) == want;
                            }
                    }
                    if (!ok && !bad_tiles++)
                        fprintf(stderr, "%s: tile (b %zu, h %zu, qb %zu, kb %zu): %zu of %zu "
                                "visible, full %d partial %d\n", label, b, h, qb, kb, seen,
                                (q1 - q0) * (k1 - k0), (int)in_full, (int)in_part);
                    CHECK(ok);
                }
            }
    /* the transpose: each column lists the rows that list it */
    for (size_t b = 0; b < d->batch; b++)
        for (size_t h = 0; h < d->heads; h++)
            for (size_t kb = 0; kb < m->kv_blocks; kb++) {
                size_t c = attn_block_map_column(m, b, h, kb);
                size_t tf = m->t_full_at[c], tp = m->t_part_at[c];
                bool ok = true;
                for (size_t qb = 0; qb < m->q_blocks; qb++) {
                    size_t r = attn_block_map_row(m, b, h, qb), e;
                    if (list_has(m->full, m->full_at[r], m->full_at[r + 1], kb, &e))
                        ok = ok && tf < m->t_full_at[c + 1] && m->t_full[tf++] == qb;
                    if (list_has(m->part, m->part_at[r], m->part_at[r + 1], kb, &e))
                        ok = ok && tp < m->t_part_at[c + 1] && m->t_part[tp] == qb &&
                             m->t_part_tile[tp++] == m->part_tile[e];
                }
                CHECK(ok && tf == m->t_full_at[c + 1] && tp == m->t_part_at[c + 1]);
            }
    attn_block_mask_info info;
    CHECK_STATUS(attn_block_mask_get_info(bm, &info), ATTN_OK);
    double tiles = (double)(d->batch * d->heads * m->q_blocks * m->kv_blocks);
    CHECK(info.full_blocks == full && info.partial_blocks == part);
    CHECK(info.q_blocks == (d->T + m->block_q - 1) / m->block_q);
    CHECK(info.kv_blocks == (d->S + m->block_kv - 1) / m->block_kv);
    CHECK_NEAR(info.sparsity, 100.0 * (1.0 - (double)(full + part) / tiles), 1e-9);
    /* row intervals: one interval per row, ends never falling, every head alike */
    bool want = true;
    for (size_t b = 0; b < d->batch; b++)
        for (size_t h = 1; h < d->heads; h++)
            for (size_t q = 0; q < d->T; q++)
                if (memcmp(at(d, b, h, q), at(d, b, 0, q), d->S)) want = false;
    int64_t *lo = calloc(d->batch * d->T, sizeof(int64_t)), *hi = calloc(d->batch * d->T, sizeof(int64_t));
    for (size_t b = 0; want && b < d->batch; b++) {
        int64_t prev_lo = 0, prev_hi = 0;
        for (size_t q = 0; want && q < d->T; q++) {
            const uint8_t *row = at(d, b, 0, q);
            int64_t a = -1, z = -1;
            for (size_t k = 0; want && k < d->S; k++)
                if (row[k]) {
                    if (a < 0) a = z = (int64_t)k;
                    else if ((int64_t)k != z + 1) want = false;
                    z = (int64_t)k;
                }
            if (!want) break;
            if (a < 0) a = z = prev_hi; /* empty: any place the ends allow */
            else z++;
            if (a < prev_lo || z < prev_hi) want = false;
            lo[b * d->T + q] = prev_lo = a;
            hi[b * d->T + q] = prev_hi = z;
        }
    }
    CHECK(info.row_intervals == want);
    if (want && m->row_lo) {
        bool same = m->rows_batch == d->batch;
        for (size_t i = 0; same && i < d->batch * d->T; i++) {
            bool empty = lo[i] == hi[i];
            same = empty ? m->row_lo[i] >= m->row_hi[i] : m->row_lo[i] == lo[i] && m->row_hi[i] == hi[i];
        }
        CHECK(same);
    }
    free(lo);
    free(hi);
    if (check_failed != before) fprintf(stderr, "  (in %s)\n", label);
}

/* Two maps hold the same lists, bits and intervals. */
static bool same_maps(const attn_block_mask *x, const attn_block_mask *y) {
    const attn_block_map *a = attn_block_mask_map(x), *b = attn_block_mask_map(y);
    size_t rows = a->batch * a->heads * a->q_blocks, tile = a->block_q * a->words_per_row;
    if (a->batch != b->batch || a->heads != b->heads || a->q_blocks != b->q_blocks ||
        a->kv_blocks != b->kv_blocks || a->block_q != b->block_q || a->block_kv != b->block_kv)
        return false;
    if (memcmp(a->full_at, b->full_at, (rows + 1) * sizeof(size_t)) ||
        memcmp(a->part_at, b->part_at, (rows + 1) * sizeof(size_t)) ||
        memcmp(a->full, b->full, a->full_at[rows] * sizeof(uint32_t)) ||
        memcmp(a->part, b->part, a->part_at[rows] * sizeof(uint32_t)))
        return false;
    for (size_t e = 0; e < a->part_at[rows]; e++)
        if (memcmp(a->bits + a->part_tile[e] * tile, b->bits + b->part_tile[e] * tile,
                   tile * sizeof(uint64_t)))
            return false;
    if (!a->row_lo != !b->row_lo) return false;
    if (a->row_lo && (memcmp(a->row_lo, b->row_lo, a->batch * a->q_len * sizeof(int64_t)) ||
                      memcmp(a->row_hi, b->row_hi, a->batch * a->q_len * sizeof(int64_t))))
        return false;
    return true;
}

typedef struct fn_user {
    attn_ctx *ctx;
    const attn_mask *m;
} fn_user;

static int visible_fn(void *user, size_t b, size_t h, size_t q, size_t kv) {
    const fn_user *u = user;
    bool v;
    if (attn_mask_visible(u->ctx, u->m, b, h, q, kv, &v) != ATTN_OK) return -1;
    return v;
}

static const size_t block_sizes[] = {16, 32, 64, 128};

static attn_block_mask_config random_config(size_t max_len) {
    attn_block_mask_config c = {.batch = 1 + rand_below(3), .heads = 1 + rand_below(2),
                                .q_len = 1 + rand_below(max_len), .kv_len = 1 + rand_below(max_len),
                                .block_q = block_sizes[rand_below(4)],
                                .block_kv = block_sizes[rand_below(4)]};
    return c;
}

/* A random tree of depth <= depth over the primitives (prims collects
 * their parameters to free). */
static attn_mask *random_tree(attn_ctx *ctx, size_t depth, const attn_block_mask_config *c,
                              prim *prims, size_t *n_prims, char *desc, size_t room) {
    if (depth <= 1 || rand_below(3) == 0) {
        prim_kind k = (prim_kind)rand_below(P_KINDS);
        snprintf(desc, room, "%d", (int)k);
        return random_prim(ctx, k, c->batch, c->q_len, c->kv_len, &prims[(*n_prims)++]);
    }
    int op = (int)rand_below(3);
    char da[120], db[120] = "";
    attn_mask *a = random_tree(ctx, depth - 1, c, prims, n_prims, da, sizeof da);
    attn_mask *b = op < 2 ? random_tree(ctx, depth - 1, c, prims, n_prims, db, sizeof db) : NULL;
    attn_mask *m = NULL;
    attn_status st = op == 0 ? attn_mask_new_and(ctx, a, b, &m)
                     : op == 1 ? attn_mask_new_or(ctx, a, b, &m)
                               : attn_mask_new_not(ctx, a, &m);
    CHECK_STATUS(st, ATTN_OK);
    snprintf(desc, room, "%s(%s%s%s)", op == 0 ? "and" : op == 1 ? "or" : "not", da,
             op < 2 ? ", " : "", db);
    /* the operands were copied: freeing them leaves m whole */
    attn_mask_free(a);
    attn_mask_free(b);
    return m;
}

/* from_mask of m against brute force and against from_fn over the same
 * description. */
static void check_description(attn_ctx *ctx, const attn_block_mask_config *c, const attn_mask *m,
                              const char *label) {
    attn_block_mask *bm = NULL, *by_fn = NULL;
    CHECK_STATUS(attn_block_mask_from_mask(ctx, c, m, &bm), ATTN_OK);
    fn_user u = {ctx, m};
    CHECK_STATUS(attn_block_mask_from_fn(ctx, c, visible_fn, &u, &by_fn), ATTN_OK);
    if (bm && by_fn) {
        dense d = dense_of_mask(ctx, m, c->batch, c->heads, c->q_len, c->kv_len);
        check_map(bm, &d, label);
        bool same = same_maps(bm, by_fn);
        if (!same) fprintf(stderr, "%s: from_mask and from_fn differ\n", label);
        CHECK(same);
        free(d.v);
    }
    attn_block_mask_free(bm);
    attn_block_mask_free(by_fn);
}

/* Random trees: from_mask against brute force and against from_fn. */
static void test_random_trees(attn_ctx *ctx, int rounds) {
    for (int round = 0; round < rounds; round++) {
        attn_block_mask_config c = random_config(300);
        prim prims[8];
        size_t n = 0;
        char desc[256], label[400];
        attn_mask *m = random_tree(ctx, 1 + rand_below(3), &c, prims, &n, desc, sizeof desc);
        snprintf(label, sizeof label, "tree %s on (%zu, %zu, %zu, %zu) blocks %zu x %zu", desc,
                 c.batch, c.heads, c.q_len, c.kv_len, c.block_q, c.block_kv);
        check_description(ctx, &c, m, label);
        attn_mask_free(m);
        for (size_t i = 0; i < n; i++) prim_free(&prims[i]);
    }
}

/* Each primitive alone, on maps of every block size. */
static void test_each_primitive(attn_ctx *ctx, int rounds) {
    for (int k = 0; k < P_KINDS; k++)
        for (int round = 0; round < rounds; round++) {
            attn_block_mask_config c = random_config(300);
            prim p;
            attn_mask *m = random_prim(ctx, (prim_kind)k, c.batch, c.q_len, c.kv_len, &p);
            char label[160];
            snprintf(label, sizeof label, "primitive %d on (%zu, %zu, %zu, %zu) blocks %zu x %zu",
                     k, c.batch, c.heads, c.q_len, c.kv_len, c.block_q, c.block_kv);
            if (m) check_description(ctx, &c, m, label);
            attn_mask_free(m);
            prim_free(&p);
        }
}

/* Masks whose rows are intervals get row intervals; global tokens with a
 * window do not. */
static void test_row_intervals(attn_ctx *ctx) {
    size_t T = 150 + rand_below(150), S = T;
    attn_block_mask_config c = {1, 1, T, S, block_sizes[rand_below(4)], block_sizes[rand_below(4)]};
    attn_mask *causal, *window, *prefix, *chunked, *chunk_causal, *docs, *len, *global, *glob_win;
    int64_t p = rand_in(0, (int64_t)S), l = rand_in(1, (int64_t)S);
    int32_t *ids = malloc(T * sizeof(int32_t));
    random_ids(ids, T, 0);
    CHECK_STATUS(attn_mask_new_causal(ctx, 0, &causal), ATTN_OK);
    CHECK_STATUS(attn_mask_new_window(ctx, rand_in(0, 40), rand_in(0, 3), 0, &window), ATTN_OK);
    CHECK_STATUS(attn_mask_new_prefix_lm(ctx, &p, 1, &prefix), ATTN_OK);
    CHECK_STATUS(attn_mask_new_chunked(ctx, (size_t)rand_in(8, 70), 0, &chunked), ATTN_OK);
    CHECK_STATUS(attn_mask_new_and(ctx, chunked, causal, &chunk_causal), ATTN_OK);
    CHECK_STATUS(attn_mask_new_document(ctx, ids, NULL, 1, T, 0, &docs), ATTN_OK);
    CHECK_STATUS(attn_mask_new_kv_length(ctx, &l, 1, &len), ATTN_OK);
    CHECK_STATUS(attn_mask_new_global(ctx, (size_t)rand_in(2, 10), &global), ATTN_OK);
    CHECK_STATUS(attn_mask_new_or(ctx, global, window, &glob_win), ATTN_OK);
    struct { const char *name; attn_mask *m; bool want; } cases[] = {
        {"causal", causal, true}, {"window", window, true}, {"prefix-LM", prefix, true},
        {"chunked and causal", chunk_causal, true}, {"documents in runs", docs, true},
        {"kv_length", len, true}, {"global or window", glob_win, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        attn_block_mask *bm = NULL;
        CHECK_STATUS(attn_block_mask_from_mask(ctx, &c, cases[i].m, &bm), ATTN_OK);
        if (!bm) continue;
        attn_block_mask_info info;
        attn_block_mask_get_info(bm, &info);
        if (info.row_intervals != cases[i].want)
            fprintf(stderr, "%s: row_intervals %d, want %d\n", cases[i].name,
                    (int)info.row_intervals, (int)cases[i].want);
        CHECK(info.row_intervals == cases[i].want);
        dense d = dense_of_mask(ctx, cases[i].m, 1, 1, T, S);
        check_map(bm, &d, cases[i].name);
        free(d.v);
        attn_block_mask_free(bm);
    }
    attn_mask *all[] = {causal, window, prefix, chunked, chunk_causal, docs, len, global, glob_win};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) attn_mask_free(all[i]);
    free(ids);
}

/* ---- dense sources ----------------------------------------------------------- */

static void test_dense(attn_ctx *ctx) {
    for (int round = 0; round < 12; round++) {
        attn_block_mask_config c = random_config(200);
        /* the tensor broadcasts over b, h or the queries (a key-padding
         * mask) where its dimension is 1 */
        size_t tb = rand_below(2) ? c.batch : 1, th = rand_below(2) ? c.heads : 1;
        size_t tq = rand_below(3) ? c.q_len : 1;
        size_t st[4] = {tb == 1 ? 0 : th * tq * c.kv_len, th == 1 ? 0 : tq * c.kv_len,
                        tq == 1 ? 0 : c.kv_len, 1};
        size_t n = tb * th * tq * c.kv_len;
        uint8_t *mask = malloc(n);
        float *add = malloc(n * sizeof(float));
        int style = (int)rand_below(3); /* sparse, dense, causal-ish blocks */
        /* any nonzero byte is visible (PyTorch's bool holds 1; other bytes
         * reach the library through a uint8 tensor's memory) */
        static const uint8_t visible[] = {1, 2, 0x7f, 0x80, 0xff};
        for (size_t i = 0; i < n; i++) {
            size_t q = i / c.kv_len % tq, k = i % c.kv_len;
            bool v = style == 0 ? rand_below(10) == 0 : style == 1 ? rand_below(10) != 0
                                                                 : (k <= q && rand_below(50));
            mask[i] = v ? visible[rand_below(sizeof visible)] : 0;
            add[i] = mask[i] ? (float)rand_in(-5, 5) * 0.25f : -INFINITY;
        }
        dense d = dense_new(c.batch, c.heads, c.q_len, c.kv_len);
        for (size_t b = 0; b < c.batch; b++)
            for (size_t h = 0; h < c.heads; h++)
                for (size_t q = 0; q < c.q_len; q++)
                    for (size_t k = 0; k < c.kv_len; k++)
                        at(&d, b, h, q)[k] = mask[b * st[0] + h * st[1] + q * st[2] + k] != 0;
        attn_block_mask *bm = NULL;
        CHECK_STATUS(attn_block_mask_from_bool(ctx, &c, mask, st, &bm), ATTN_OK);
        if (bm) check_map(bm, &d, "from_bool");
        attn_block_mask_free(bm);
        bm = NULL;
        CHECK_STATUS(attn_block_mask_from_additive(ctx, &c, add, st, &bm), ATTN_OK);
        if (bm) check_map(bm, &d, "from_additive");
        attn_block_mask_free(bm);
        /* NaN or +inf anywhere is refused, naming the element (of a mask
         * broadcast over the queries, at the first row that reads it) */
        size_t b = rand_below(tb), h = rand_below(th), q = rand_below(tq), k = rand_below(c.kv_len);
        size_t e = b * st[0] + h * st[1] + q * st[2] + k;
        add[e] = rand_below(2) ? NAN : INFINITY;
        bm = NULL;
        CHECK_STATUS(attn_block_mask_from_additive(ctx, &c, add, st, &bm), ATTN_ERR_INVALID);
        CHECK(bm == NULL);
        char where[96];
        snprintf(where, sizeof where, "at (%zu, %zu, %zu, %zu)", b, h, q, k);
        CHECK_MESSAGE(ctx, where);
        /* strides whose last element lies past the end of memory (the
         * offset past size_t, or the address past the address space):
         * refused before anything is read (the scan faulted) */
        size_t wide[4] = {st[0], st[1], st[2], st[3]};
        size_t axis = c.q_len > 1 ? 2 : c.kv_len > 1 ? 3 : 4;
        if (axis < 4) {
            wide[axis] = SIZE_MAX - rand_below(1000);
            bm = NULL;
            CHECK_STATUS(attn_block_mask_from_bool(ctx, &c, mask, wide, &bm), ATTN_ERR_OVERFLOW);
            CHECK(bm == NULL);
            CHECK_MESSAGE(ctx, "reach past the end of memory");
            CHECK_STATUS(attn_block_mask_from_additive(ctx, &c, add, wide, &bm),
                         ATTN_ERR_OVERFLOW);
        }
        free(d.v);
        free(mask);
        free(add);
    }
}

typedef struct failing_fn {
    size_t b, h, q, kv;
} failing_fn;

static int fails_at(void *user, size_t b, size_t h, size_t q, size_t kv) {
    const failing_fn *f = user;
    if (b == f->b && h == f->h && q == f->q && kv == f->kv) return -1;
    return (q + kv) % 3 != 0;
}

static void test_fn_errors(attn_ctx *ctx) {
    attn_block_mask_config c = random_config(150);
    failing_fn f = {rand_below(c.batch), rand_below(c.heads), rand_below(c.q_len),
                    rand_below(c.kv_len)};
    attn_block_mask *bm = NULL;
    CHECK_STATUS(attn_block_mask_from_fn(ctx, &c, fails_at, &f, &bm), ATTN_ERR_INVALID);
    char where[96];
    snprintf(where, sizeof where, "returned -1 at (%zu, %zu, %zu, %zu)", f.b, f.h, f.q, f.kv);
    CHECK_MESSAGE(ctx, where);
    CHECK(bm == NULL);
    /* bad configs */
    attn_block_mask_config bad = c;
    bad.block_q = 48;
    CHECK_STATUS(attn_block_mask_from_fn(ctx, &bad, fails_at, &f, &bm), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "48");
    bad = c;
    bad.block_kv = 512;
    CHECK_STATUS(attn_block_mask_from_fn(ctx, &bad, fails_at, &f, &bm), ATTN_ERR_INVALID);
    bad = c;
    bad.q_len = 0;
    CHECK_STATUS(attn_block_mask_from_fn(ctx, &bad, fails_at, &f, &bm), ATTN_ERR_SHAPE);
    bad = c;
    bad.kv_len = 0;
    CHECK_STATUS(attn_block_mask_from_fn(ctx, &bad, fails_at, &f, &bm), ATTN_ERR_SHAPE);
    bad = c;
    bad.batch = 0;
    CHECK_STATUS(attn_block_mask_from_fn(ctx, &bad, fails_at, &f, &bm), ATTN_ERR_SHAPE);
    CHECK_STATUS(attn_block_mask_from_fn(ctx, NULL, fails_at, &f, &bm), ATTN_ERR_NULL);
}

/* ---- block lists ---------------------------------------------------------------- */

typedef struct lists {
    size_t rows, kvb, max, full_max;
    int32_t *num, *idx, *full_num, *full_idx;
    uint8_t *cls; /* (rows, kvb): 0 skipped, 1 partial, 2 full */
} lists;

static lists random_lists(size_t rows, size_t kvb, bool with_full) {
    lists l = {rows, kvb, kvb + rand_below(3), with_full ? kvb + rand_below(3) : 0,
               malloc(rows * sizeof(int32_t)), NULL, with_full ? malloc(rows * sizeof(int32_t)) : NULL,
               NULL, calloc(rows * kvb, 1)};
    l.idx = malloc((rows * l.max + 1) * sizeof(int32_t));
    l.full_idx = malloc((rows * l.full_max + 1) * sizeof(int32_t));
    uint32_t *order = malloc(kvb * sizeof(uint32_t));
    for (size_t r = 0; r < rows; r++) {
        for (size_t i = 0; i < kvb; i++) order[i] = (uint32_t)i;
        for (size_t i = kvb; i > 1; i--) { /* shuffled: lists come in any order */
            size_t j = rand_below(i);
            uint32_t t = order[i - 1];
            order[i - 1] = order[j];
            order[j] = t;
        }
        size_t np = 0, nf = 0;
        for (size_t i = 0; i < kvb; i++) {
            int pick = (int)rand_below(with_full ? 3 : 2);
            if (pick == 1) l.idx[r * l.max + np++] = (int32_t)order[i];
            if (pick == 2) l.full_idx[r * l.full_max + nf++] = (int32_t)order[i];
            l.cls[r * kvb + order[i]] = (uint8_t)pick;
        }
        /* entries past num are not read: poison them */
        for (size_t e = np; e < l.max; e++) l.idx[r * l.max + e] = -7;
        for (size_t e = nf; e < l.full_max; e++) l.full_idx[r * l.full_max + e] = -7;
        l.num[r] = (int32_t)np;
        if (with_full) l.full_num[r] = (int32_t)nf;
    }
    free(order);
    return l;
}

static void lists_free(lists *l) {
    free(l->num);
    free(l->idx);
    free(l->full_num);
    free(l->full_idx);
    free(l->cls);
}

static void test_kv_blocks(attn_ctx *ctx) {
    for (int round = 0; round < 12; round++) {
        attn_block_mask_config c = random_config(300);
        size_t qb = (c.q_len + c.block_q - 1) / c.block_q, kvb = (c.kv_len + c.block_kv - 1) / c.block_kv;
        size_t rows = c.batch * c.heads * qb;
        lists l = random_lists(rows, kvb, rand_below(3) != 0);
        prim p = {0};
        attn_mask *m = rand_below(2) ? random_prim(ctx, (prim_kind)rand_below(P_KINDS), c.batch,
                                                   c.q_len, c.kv_len, &p)
                                     : NULL;
        dense d = dense_new(c.batch, c.heads, c.q_len, c.kv_len);
        for (size_t b = 0; b < c.batch; b++)
            for (size_t h = 0; h < c.heads; h++)
                for (size_t q = 0; q < c.q_len; q++)
                    for (size_t k = 0; k < c.kv_len; k++) {
                        size_t r = (b * c.heads + h) * qb + q / c.block_q;
                        int cls = l.cls[r * kvb + k / c.block_kv];
                        at(&d, b, h, q)[k] = cls == 2 || (cls == 1 && (!m || prim_visible(&p, b, q, k)));
                    }
        attn_block_mask *bm = NULL;
        CHECK_STATUS(attn_block_mask_from_kv_blocks(ctx, &c, l.num, l.idx, l.max, l.full_num,
                                                    l.full_idx, l.full_max, m, &bm),
                     ATTN_OK);
        if (bm) check_map(bm, &d, m ? "from_kv_blocks with a mask" : "from_kv_blocks");
        attn_block_mask_free(bm);

        /* errors name the row and the block: pick a row with something listed */
        size_t r = rand_below(rows);
        size_t b = r / (c.heads * qb), h = r / qb % c.heads, q = r % qb;
        char where[96];
        snprintf(where, sizeof where, "b %zu, h %zu, query block %zu", b, h, q);
        if (l.num[r] > 0) {
            int32_t keep = l.idx[r * l.max];
            int32_t bad = rand_below(2) ? -1 - (int32_t)rand_below(5) : (int32_t)(kvb + rand_below(5));
            l.idx[r * l.max] = bad;
            bm = NULL;
            CHECK_STATUS(attn_block_mask_from_kv_blocks(ctx, &c, l.num, l.idx, l.max, l.full_num,
                                                        l.full_idx, l.full_max, m, &bm),
                         ATTN_ERR_INVALID);
            CHECK(bm == NULL);
            CHECK_MESSAGE(ctx, where);
            char value[32];
            snprintf(value, sizeof value, "(%d)", (int)bad);
            CHECK_MESSAGE(ctx, value);
            l.idx[r * l.max] = keep;
            if (l.num[r] > 1) { /* the same block twice */
                int32_t second = l.idx[r * l.max + 1];
                l.idx[r * l.max + 1] = keep;
                CHECK_STATUS(attn_block_mask_from_kv_blocks(ctx, &c, l.num, l.idx, l.max,
                                                            l.full_num, l.full_idx, l.full_max,
                                                            m, &bm),
                             ATTN_ERR_INVALID);
                CHECK_MESSAGE(ctx, "twice");
                CHECK_MESSAGE(ctx, where);
                l.idx[r * l.max + 1] = second;
            }
            if (l.full_num && l.full_num[r] < (int32_t)l.full_max) { /* partial and full */
                l.full_idx[r * l.full_max + l.full_num[r]] = keep;
                l.full_num[r]++;
                CHECK_STATUS(attn_block_mask_from_kv_blocks(ctx, &c, l.num, l.idx, l.max,
                                                            l.full_num, l.full_idx, l.full_max,
                                                            m, &bm),
                             ATTN_ERR_INVALID);
                CHECK_MESSAGE(ctx, "partial and full");
                CHECK_MESSAGE(ctx, where);
                l.full_num[r]--;
            }
        }
        int32_t keep = l.num[r];
        l.num[r] = rand_below(2) ? -1 : (int32_t)l.max + 1;
        CHECK_STATUS(attn_block_mask_from_kv_blocks(ctx, &c, l.num, l.idx, l.max, l.full_num,
                                                    l.full_idx, l.full_max, m, &bm),
                     ATTN_ERR_INVALID);
        CHECK_MESSAGE(ctx, where);
        l.num[r] = keep;
        /* and with the lists restored it builds again */
        CHECK_STATUS(attn_block_mask_from_kv_blocks(ctx, &c, l.num, l.idx, l.max, l.full_num,
                                                    l.full_idx, l.full_max, m, &bm),
                     ATTN_OK);
        attn_block_mask_free(bm);
        free(d.v);
        attn_mask_free(m);
        prim_free(&p);
        lists_free(&l);
    }
}

/* ---- argument errors ---------------------------------------------------------- */

static void test_constructor_errors(attn_ctx *ctx) {
    attn_mask *m = (attn_mask *)&m; /* must come back NULL */
    const int64_t limit = (int64_t)1 << 62;
    CHECK_STATUS(attn_mask_new_chunked(ctx, 0, 0, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "chunk (0)");
    CHECK(m == NULL);
    CHECK_STATUS(attn_mask_new_window(ctx, -2, 3, 0, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "left (-2)");
    CHECK_STATUS(attn_mask_new_window(ctx, 3, -5, 0, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "right (-5)");
    CHECK_STATUS(attn_mask_new_window(ctx, 3, 3, limit + 1, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "offset");
    CHECK_STATUS(attn_mask_new_causal(ctx, -limit - 1, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "offset");
    CHECK_STATUS(attn_mask_new_chunked(ctx, 4, limit + 1, &m), ATTN_ERR_INVALID);
    CHECK_STATUS(attn_mask_new_causal(ctx, limit, &m), ATTN_OK);
    attn_mask_free(m);
    int64_t vals[3] = {3, -4, 5};
    CHECK_STATUS(attn_mask_new_prefix_lm(ctx, NULL, 1, &m), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "prefix is NULL");
    CHECK_STATUS(attn_mask_new_prefix_lm(ctx, vals, 0, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "count is 0");
    CHECK_STATUS(attn_mask_new_prefix_lm(ctx, vals, 3, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "prefix[1] (-4)");
    CHECK_STATUS(attn_mask_new_kv_length(ctx, vals, 2, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "length[1] (-4)");
    CHECK_STATUS(attn_mask_new_kv_length(ctx, NULL, 2, &m), ATTN_ERR_NULL);
    int32_t ids[4] = {0, 0, 1, 1};
    CHECK_STATUS(attn_mask_new_document(ctx, NULL, ids, 1, 4, 4, &m), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "q_doc");
    CHECK_STATUS(attn_mask_new_document(ctx, ids, ids, 0, 4, 4, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "batch (0)");
    CHECK_STATUS(attn_mask_new_document(ctx, ids, ids, 1, 4, 0, &m), ATTN_ERR_INVALID);
    CHECK_STATUS(attn_mask_new_document(ctx, ids, NULL, 1, 4, 3, &m), ATTN_ERR_SHAPE);
    CHECK_STATUS(attn_mask_new_global(ctx, (size_t)limit + 1, &m), ATTN_ERR_INVALID);
    CHECK_STATUS(attn_mask_new_and(ctx, NULL, NULL, &m), ATTN_ERR_NULL);
    CHECK_STATUS(attn_mask_new_not(ctx, NULL, &m), ATTN_ERR_NULL);
    CHECK_STATUS(attn_mask_new_all(ctx, NULL), ATTN_ERR_NULL);
    /* a NULL ctx too: *out comes back NULL from every constructor */
    int64_t one_length = 2;
    int32_t one_doc[2] = {0, 1};
    attn_mask *operand = NULL;
    CHECK_STATUS(attn_mask_new_all(ctx, &operand), ATTN_OK);
    for (int i = 0; i < 11; i++) {
        m = (attn_mask *)&m;
        attn_status st =
            i == 0 ? attn_mask_new_all(NULL, &m)
            : i == 1 ? attn_mask_new_causal(NULL, 0, &m)
            : i == 2 ? attn_mask_new_window(NULL, 1, 0, 0, &m)
            : i == 3 ? attn_mask_new_chunked(NULL, 4, 0, &m)
            : i == 4 ? attn_mask_new_prefix_lm(NULL, &one_length, 1, &m)
            : i == 5 ? attn_mask_new_document(NULL, one_doc, NULL, 1, 2, 2, &m)
            : i == 6 ? attn_mask_new_global(NULL, 1, &m)
            : i == 7 ? attn_mask_new_kv_length(NULL, &one_length, 1, &m)
            : i == 8 ? attn_mask_new_and(NULL, operand, operand, &m)
            : i == 9 ? attn_mask_new_or(NULL, operand, operand, &m)
                     : attn_mask_new_not(NULL, operand, &m);
        CHECK_STATUS(st, ATTN_ERR_NULL);
        CHECK(m == NULL);
    }
    attn_mask_free(operand);
    attn_mask_free(NULL);

    /* descriptions that do not fit the map, and points past them */
    attn_mask *docs = NULL, *prefix = NULL, *either = NULL;
    CHECK_STATUS(attn_mask_new_document(ctx, ids, NULL, 1, 4, 0, &docs), ATTN_OK);
    CHECK_STATUS(attn_mask_new_prefix_lm(ctx, vals, 2, &prefix), ATTN_ERR_INVALID);
    vals[1] = 4;
    CHECK_STATUS(attn_mask_new_prefix_lm(ctx, vals, 2, &prefix), ATTN_OK);
    CHECK_STATUS(attn_mask_new_or(ctx, docs, prefix, &either), ATTN_OK);
    attn_block_mask *bm = NULL;
    attn_block_mask_config c = {3, 1, 4, 4, 16, 16};
    /* every builder sets *out to NULL on any failure, a NULL argument too */
    attn_block_mask *stale = (attn_block_mask *)&stale;
    uint8_t one = 1;
    size_t zeros[4] = {0, 0, 0, 0};
    int32_t none = 0;
    for (int i = 0; i < 9; i++) {
        bm = stale;
        attn_status st =
            i == 0 ? attn_block_mask_from_mask(ctx, &c, NULL, &bm)
            : i == 1 ? attn_block_mask_from_mask(NULL, &c, either, &bm)
            : i == 2 ? attn_block_mask_from_bool(ctx, &c, NULL, zeros, &bm)
            : i == 3 ? attn_block_mask_from_bool(ctx, &c, &one, NULL, &bm)
            : i == 4 ? attn_block_mask_from_additive(NULL, &c, NULL, zeros, &bm)
            : i == 5 ? attn_block_mask_from_fn(ctx, &c, NULL, NULL, &bm)
            : i == 6 ? attn_block_mask_from_fn(NULL, &c, visible_fn, NULL, &bm)
            : i == 7 ? attn_block_mask_from_kv_blocks(ctx, &c, NULL, &none, 1, NULL, NULL, 0,
                                                      NULL, &bm)
                     : attn_block_mask_from_kv_blocks(ctx, NULL, &none, &none, 1, NULL, NULL, 0,
                                                      NULL, &bm);
        CHECK_STATUS(st, ATTN_ERR_NULL);
        if (bm != NULL) printf("builder %d left *out stale\n", i);
        CHECK(bm == NULL);
    }
    CHECK_STATUS(attn_block_mask_from_mask(ctx, &c, either, &bm), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "2 lengths for a batch of 3");
    c.batch = 2;
    c.kv_len = 5;
    CHECK_STATUS(attn_block_mask_from_mask(ctx, &c, either, &bm), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "kv_len 4");
    c.kv_len = 4;
    CHECK_STATUS(attn_block_mask_from_mask(ctx, &c, either, &bm), ATTN_OK);
    attn_block_mask_free(bm);
    bool v;
    CHECK_STATUS(attn_mask_visible(ctx, either, 2, 0, 0, 0, &v), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "b (2)");
    CHECK_STATUS(attn_mask_visible(ctx, either, 1, 0, 4, 0, &v), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "q_idx 4");
    CHECK_STATUS(attn_mask_visible(ctx, either, 1, 0, 3, 1, &v), ATTN_OK);
    CHECK(v == true);
    CHECK_STATUS(attn_mask_visible(ctx, NULL, 1, 0, 3, 1, &v), ATTN_ERR_NULL);
    attn_mask_free(docs);
    attn_mask_free(prefix);
    attn_mask_free(either);

    /* trees deeper than the limit are refused */
    attn_mask *deep = NULL;
    CHECK_STATUS(attn_mask_new_all(ctx, &deep), ATTN_OK);
    attn_status st = ATTN_OK;
    for (int i = 0; i < 300 && st == ATTN_OK; i++) {
        attn_mask *next = NULL;
        st = attn_mask_new_not(ctx, deep, &next);
        if (st == ATTN_OK) {
            attn_mask_free(deep);
            deep = next;
        }
    }
    CHECK(st == ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "deep");
    attn_mask_free(deep);

    /* a mask ANDed with itself doubles: refused at the node limit, 12 levels
     * (8191 nodes) down, long before the depth limit or memory */
    attn_mask *twice = NULL;
    CHECK_STATUS(attn_mask_new_causal(ctx, 0, &twice), ATTN_OK);
    st = ATTN_OK;
    int levels = 0;
    for (; levels < 64 && st == ATTN_OK; levels++) {
        attn_mask *next = NULL;
        st = attn_mask_new_and(ctx, twice, twice, &next);
        if (st == ATTN_OK) {
            attn_mask_free(twice);
            twice = next;
        }
    }
    CHECK(st == ATTN_ERR_INVALID);
    CHECK(levels == 12);
    CHECK_MESSAGE(ctx, "8191 nodes");
    bool seen = false;
    CHECK_STATUS(attn_mask_visible(ctx, twice, 0, 0, 5, 5, &seen), ATTN_OK);
    CHECK(seen);
    CHECK_STATUS(attn_mask_visible(ctx, twice, 0, 0, 5, 6, &seen), ATTN_OK);
    CHECK(!seen);
    attn_mask_free(twice);
}

/* The drawing of a small causal map, character by character. */
static void test_to_string(attn_ctx *ctx) {
    attn_mask *causal = NULL;
    CHECK_STATUS(attn_mask_new_causal(ctx, 0, &causal), ATTN_OK);
    attn_block_mask_config c = {1, 1, 64, 64, 16, 16};
    attn_block_mask *bm = NULL;
    CHECK_STATUS(attn_block_mask_from_mask(ctx, &c, causal, &bm), ATTN_OK);
    const char *want = "~...\n#~..\n##~.\n###~\n";
    char buf[64];
    size_t needed = 0;
    CHECK_STATUS(attn_block_mask_to_string(bm, 0, 0, NULL, 0, &needed), ATTN_OK);
    CHECK(needed == strlen(want) + 1);
    CHECK_STATUS(attn_block_mask_to_string(bm, 0, 0, buf, sizeof buf, &needed), ATTN_OK);
    CHECK(strcmp(buf, want) == 0);
    memset(buf, 'x', sizeof buf); /* a refused call writes nothing into buf */
    CHECK_STATUS(attn_block_mask_to_string(bm, 0, 0, buf, 5, &needed), ATTN_ERR_INVALID);
    CHECK(buf[0] == 'x' && buf[4] == 'x' && needed == strlen(want) + 1);
    CHECK_STATUS(attn_block_mask_to_string(bm, 1, 0, buf, sizeof buf, NULL), ATTN_ERR_INVALID);
    attn_block_mask_free(bm);
    attn_mask_free(causal);
}

/* attn_block_mask_from_mask of c and m into *bm, checked ATTN_OK; the
 * seconds it took. */
static double timed_from_mask(attn_ctx *ctx, const attn_block_mask_config *c, const attn_mask *m,
                              attn_block_mask **bm) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_STATUS(attn_block_mask_from_mask(ctx, c, m, bm), ATTN_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

/* Four causal documents at T = S = 32768: the map from the description
 * alone, timed (printed, not asserted), and its counts from the geometry. */
static void test_speed(attn_ctx *ctx) {
    const size_t T = 32768, docs = 4, len = T / docs;
    int32_t *ids = malloc(T * sizeof(int32_t));
    for (size_t i = 0; i < T; i++) ids[i] = (int32_t)(i / len);
    attn_mask *doc = NULL, *causal = NULL, *both = NULL;
    CHECK_STATUS(attn_mask_new_document(ctx, ids, NULL, 1, T, 0, &doc), ATTN_OK);
    CHECK_STATUS(attn_mask_new_causal(ctx, 0, &causal), ATTN_OK);
    CHECK_STATUS(attn_mask_new_and(ctx, doc, causal, &both), ATTN_OK);
    attn_block_mask_config c = {1, 1, T, T, 0, 0};
    attn_block_mask *bm = NULL;
    struct timespec t0, t1;
    double s = timed_from_mask(ctx, &c, both, &bm);
    printf("from_mask, 4 causal documents at T = S = %zu: %.3f s\n", T, s);
    if (bm) {
        attn_block_mask_info info;
        attn_block_mask_get_info(bm, &info);
        size_t per_doc = len / info.config.block_q; /* blocks of 64 each way */
        CHECK(info.partial_blocks == docs * per_doc);
        CHECK(info.full_blocks == docs * per_doc * (per_doc - 1) / 2);
        CHECK(info.row_intervals);
        const attn_block_map *m = attn_block_mask_map(bm);
        bool ok = m->row_lo != NULL;
        for (size_t i = 0; ok && i < T; i += 1 + rand_below(97))
            ok = m->row_lo[i] == (int64_t)(i / len * len) && m->row_hi[i] == (int64_t)i + 1;
        CHECK(ok);
    }
    /* the same documents numbered out of order: the same map, through the
     * classes of runs rather than of ranges */
    for (size_t i = 0; i < T; i++) ids[i] = (int32_t)((i / len * 3 + 1) % docs);
    attn_mask *shuffled = NULL, *both_shuffled = NULL;
    attn_block_mask *bm_shuffled = NULL;
    CHECK_STATUS(attn_mask_new_document(ctx, ids, NULL, 1, T, 0, &shuffled), ATTN_OK);
    CHECK_STATUS(attn_mask_new_and(ctx, shuffled, causal, &both_shuffled), ATTN_OK);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_STATUS(attn_block_mask_from_mask(ctx, &c, both_shuffled, &bm_shuffled), ATTN_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("from_mask, the same documents numbered out of order: %.3f s\n", s);
    CHECK(bm && bm_shuffled && same_maps(bm, bm_shuffled));
    attn_block_mask_free(bm_shuffled);
    attn_mask_free(shuffled);
    attn_mask_free(both_shuffled);
    attn_block_mask_free(bm);
    attn_mask_free(doc);
    attn_mask_free(causal);
    attn_mask_free(both);
    free(ids);
}

/* A sliding window over a long sequence: 2^17 x 2^17 tiles of 16 in
 * principle, about eight a query block in fact. The map costs its tiles:
 * the key blocks no row of a query block can reach are never asked about
 * (a build that classified every tile would take minutes, past the test's
 * timeout). Its counts equal those of every tile near the diagonal,
 * element by element, and its rows are the window's intervals. */
static void test_long_window(attn_ctx *ctx) {
    const size_t T = (size_t)1 << 21, blk = 16, left = 100;
    attn_mask *window = NULL;
    CHECK_STATUS(attn_mask_new_window(ctx, (int64_t)left, 0, 0, &window), ATTN_OK);
    attn_block_mask_config c = {1, 1, T, T, blk, blk};
    attn_block_mask *bm = NULL;
    struct timespec t0, t1;
    double s = timed_from_mask(ctx, &c, window, &bm);
    printf("from_mask, a window of %zu keys at T = S = %zu in blocks of %zu: %.3f s\n", left + 1,
           T, blk, s);
    size_t full = 0, partial = 0;
    for (size_t q0 = 0; q0 < T; q0 += blk)
        for (size_t k0 = q0 > left ? (q0 - left) / blk * blk : 0; k0 <= q0; k0 += blk) {
            size_t seen = 0;
            for (size_t i = q0; i < q0 + blk; i++)
                for (size_t j = k0; j < k0 + blk; j++) seen += j <= i && i <= j + left;
            full += seen == blk * blk;
            partial += seen > 0 && seen < blk * blk;
        }
    if (bm) {
        attn_block_mask_info info;
        attn_block_mask_get_info(bm, &info);
        CHECK(info.full_blocks == full);
        CHECK(info.partial_blocks == partial);
        CHECK(info.row_intervals);
        const attn_block_map *m = attn_block_mask_map(bm);
        bool ok = m->row_lo != NULL;
        for (size_t i = 0; ok && i < T; i += 1 + rand_below(997))
            ok = m->row_lo[i] == (int64_t)(i > left ? i - left : 0) &&
                 m->row_hi[i] == (int64_t)i + 1;
        CHECK(ok);
    }
    attn_block_mask_free(bm);
    /* The same window at the longest lengths a map takes: two partial tiles
     * of 8 KiB a query block of 256 make 256 GiB a sequence, and batch
     * enough sequences to pass twice this machine's memory. The map is
     * refused for memory, naming the limit, before any of it is allocated
     * (not allocated until the system kills the process), and quickly. */
    size_t limit = attn_physical_memory(), per_seq = ((size_t)1 << 25) * 8192;
    attn_block_mask_config huge = {limit / per_seq * 2 + 1, 1, UINT32_MAX, UINT32_MAX, 256, 256};
    bm = NULL;
    if (limit) { /* else the machine's memory is unknown, and nothing is refused */
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CHECK_STATUS(attn_block_mask_from_mask(ctx, &huge, window, &bm), ATTN_ERR_NO_MEMORY);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        printf("from_mask, the window at T = S = 2^32 - 1, batch %zu: refused in %.3f s: %s\n",
               huge.batch, s, attn_ctx_last_error(ctx));
        char want[32];
        snprintf(want, sizeof want, "(%zu bytes)", limit);
        CHECK(strstr(attn_ctx_last_error(ctx), want) != NULL);
        CHECK(bm == NULL);
        attn_block_mask_free(bm);
        /* long rows over few keys: the rows' intervals (16 bytes a query)
         * pass the memory where the tiles do not */
        attn_block_mask_config rows = {limit / ((size_t)16 * UINT32_MAX) + 1, 1, UINT32_MAX, 16,
                                       128, 16};
        CHECK_STATUS(attn_block_mask_from_mask(ctx, &rows, window, &bm), ATTN_ERR_NO_MEMORY);
        CHECK(strstr(attn_ctx_last_error(ctx), want) != NULL);
        CHECK(bm == NULL);
        attn_block_mask_free(bm);
        /* Maps past memory by their sequences' count alone: 2^40 of 4096
         * tokens, and 2^61 of 16, whose row offsets' bytes pass size_t.
         * Refused at once, not after a walk over every sequence (which
         * would run past the test's timeout). */
        attn_block_mask_config many[] = {{(size_t)1 << 40, 1, 4096, 4096, 128, 128},
                                         {(size_t)1 << 61, 1, 16, 16, 16, 16}};
        for (size_t i = 0; i < sizeof many / sizeof many[0]; i++) {
            bm = NULL;
            CHECK_STATUS(attn_block_mask_from_mask(ctx, &many[i], window, &bm),
                         ATTN_ERR_NO_MEMORY);
            CHECK(strstr(attn_ctx_last_error(ctx), want) != NULL);
            CHECK(bm == NULL);
            attn_block_mask_free(bm);
        }
    }
    attn_mask_free(window);
}

static int counting_fn(void *user, size_t b, size_t h, size_t q, size_t kv) {
    (void)b, (void)h;
    ++*(size_t *)user;
    return (q + kv) % 2 == 0;
}

/* Maps from a dense mask broadcast by strides, and from a callback, of
 * 2^40 sequences: their rows' offsets alone pass this machine's memory.
 * Each is refused at once for memory, naming the bytes and the limit, as a
 * description's map is, before any of it is allocated or the callback is
 * called (not an allocation that fails without the limit, or one that
 * succeeds and is filled until the system kills the process). */
static void test_dense_past_memory(attn_ctx *ctx) {
    size_t limit = attn_physical_memory();
    if (!limit) return; /* the machine's memory is unknown, and nothing is refused */
    char want[64];
    snprintf(want, sizeof want, "more than this machine's memory (%zu bytes)", limit);
    attn_block_mask_config c = {(size_t)1 << 40, 1, 4096, 4096, 128, 128};
    uint8_t one = 1;
    float zero = 0.0f;
    size_t strides[4] = {0, 0, 0, 0}, calls = 0;
    for (int source = 0; source < 3; source++) {
        attn_block_mask *bm = NULL;
        attn_status st = source == 0 ? attn_block_mask_from_bool(ctx, &c, &one, strides, &bm)
                         : source == 1 ? attn_block_mask_from_additive(ctx, &c, &zero, strides, &bm)
                                       : attn_block_mask_from_fn(ctx, &c, counting_fn, &calls, &bm);
        CHECK_STATUS(st, ATTN_ERR_NO_MEMORY);
        printf("source %d past memory: %s\n", source, attn_ctx_last_error(ctx));
        CHECK(strstr(attn_ctx_last_error(ctx), want) != NULL);
        CHECK(strstr(attn_ctx_last_error(ctx), "takes at least ") != NULL);
        CHECK(bm == NULL);
        attn_block_mask_free(bm);
    }
    CHECK(calls == 0);
    /* One sequence of 2^20 queries over a key row of alternate bytes: its
     * offsets fit, but every tile is partial, 8 KiB of bits each, 137 GB in
     * all. Refused once its tiles' bytes pass the limit, before they are
     * allocated. The check reads tiles until they pass the limit, which
     * takes longer the larger the memory: machines past 32 GiB skip it. */
    if (limit > ((size_t)32 << 30)) return;
    size_t S = (size_t)1 << 20;
    uint8_t *row = malloc(S);
    if (!row) return;
    for (size_t j = 0; j < S; j++) row[j] = (uint8_t)(j % 2);
    attn_block_mask_config single = {1, 1, S, S, 256, 256};
    size_t row_strides[4] = {0, 0, 0, 1};
    attn_block_mask *bm = NULL;
    CHECK_STATUS(attn_block_mask_from_bool(ctx, &single, row, row_strides, &bm),
                 ATTN_ERR_NO_MEMORY);
    printf("a row of alternate bytes over 2^20 queries: %s\n", attn_ctx_last_error(ctx));
    CHECK(strstr(attn_ctx_last_error(ctx), want) != NULL);
    CHECK(bm == NULL);
    attn_block_mask_free(bm);
    free(row);
}

/* ---- slices (attn_block_map_slice: context parallelism's rectangles) ---------- */

/* A random edge in [lo, hi], on a block edge one time in three. */
static size_t random_edge(size_t lo, size_t hi, size_t block) {
    size_t x = lo + rand_below(hi - lo + 1);
    if (rand_below(3) == 0) {
        size_t y = (x + block - 1) / block * block;
        if (y <= hi) x = y;
        else if (x / block * block >= lo) x = x / block * block;
    }
    return x;
}

/* Slices of random maps (dense or from a random description, so that full
 * tiles come from closed-form classes and from bits) at random offsets,
 * block-aligned or not: each equals, list for list and bit for bit, the
 * map built from the same rectangle of the dense oracle, and passes the
 * element-by-element check. Out-of-range rectangles are refused. */
static void test_slices(attn_ctx *ctx, int rounds) {
    for (int round = 0; round < rounds; round++) {
        attn_block_mask_config c = random_config(200);
        attn_block_mask *bm = NULL;
        dense d;
        prim prims[8];
        size_t n_prims = 0;
        if (round % 2) {
            char desc[256];
            attn_mask *m = random_tree(ctx, 1 + rand_below(3), &c, prims, &n_prims, desc,
                                       sizeof desc);
            CHECK_STATUS(attn_block_mask_from_mask(ctx, &c, m, &bm), ATTN_OK);
            d = dense_of_mask(ctx, m, c.batch, c.heads, c.q_len, c.kv_len);
            attn_mask_free(m);
        } else {
            d = dense_new(c.batch, c.heads, c.q_len, c.kv_len);
            /* sparse, dense, causal-ish, or tiles each all hidden, all
             * visible or random (full and skipped tiles side by side, which
             * a slice's unaligned tiles straddle) */
            int style = (int)rand_below(4);
            size_t qbs = (c.q_len + c.block_q - 1) / c.block_q;
            size_t kbs = (c.kv_len + c.block_kv - 1) / c.block_kv;
            uint8_t *cls = malloc(c.batch * c.heads * qbs * kbs);
            for (size_t i = 0; i < c.batch * c.heads * qbs * kbs; i++) cls[i] = (uint8_t)rand_below(3);
            for (size_t i = 0; i < c.batch * c.heads * c.q_len * c.kv_len; i++) {
                size_t q = i / c.kv_len % c.q_len, k = i % c.kv_len;
                size_t plane = i / (c.q_len * c.kv_len);
                uint8_t t = cls[(plane * qbs + q / c.block_q) * kbs + k / c.block_kv];
                d.v[i] = style == 0   ? rand_below(10) == 0
                         : style == 1 ? rand_below(10) != 0
                         : style == 2 ? (k <= q && rand_below(50))
                                      : (t == 1 || (t == 2 && rand_below(2)));
            }
            free(cls);
            size_t st[4] = {c.heads * c.q_len * c.kv_len, c.q_len * c.kv_len, c.kv_len, 1};
            CHECK_STATUS(attn_block_mask_from_bool(ctx, &c, d.v, st, &bm), ATTN_OK);
        }
        for (size_t i = 0; i < n_prims; i++) prim_free(&prims[i]);
        if (!bm) {
            free(d.v);
            continue;
        }
        const attn_block_map *m = attn_block_mask_map(bm);
        for (int k = 0; k < 4; k++) {
            size_t h0 = rand_below(c.heads), h1 = h0 + 1 + rand_below(c.heads - h0);
            size_t q0 = random_edge(0, c.q_len - 1, c.block_q);
            size_t q1 = random_edge(q0 + 1, c.q_len, c.block_q);
            size_t k0 = random_edge(0, c.kv_len - 1, c.block_kv);
            size_t k1 = random_edge(k0 + 1, c.kv_len, c.block_kv);
            dense part = dense_new(c.batch, h1 - h0, q1 - q0, k1 - k0);
            for (size_t b = 0; b < c.batch; b++)
                for (size_t h = h0; h < h1; h++)
                    for (size_t q = q0; q < q1; q++)
                        memcpy(at(&part, b, h - h0, q - q0), at(&d, b, h, q) + k0, k1 - k0);
            attn_block_mask_config pc = {c.batch, h1 - h0, q1 - q0, k1 - k0, c.block_q,
                                         c.block_kv};
            size_t st[4] = {pc.heads * pc.q_len * pc.kv_len, pc.q_len * pc.kv_len, pc.kv_len, 1};
            attn_block_mask *slice = NULL, *want = NULL;
            char label[200];
            snprintf(label, sizeof label,
                     "slice h [%zu, %zu) q [%zu, %zu) k [%zu, %zu) of (%zu, %zu, %zu, %zu) "
                     "blocks %zu x %zu", h0, h1, q0, q1, k0, k1, c.batch, c.heads, c.q_len,
                     c.kv_len, c.block_q, c.block_kv);
            CHECK_STATUS(attn_block_map_slice(ctx, "test", m, h0, h1, q0, q1, k0, k1, &slice),
                         ATTN_OK);
            CHECK_STATUS(attn_block_mask_from_bool(ctx, &pc, part.v, st, &want), ATTN_OK);
            if (slice && want) {
                check_map(slice, &part, label);
                bool same = same_maps(slice, want);
                if (!same) fprintf(stderr, "%s: differs from the map of its rectangle\n", label);
                CHECK(same);
                bool none = true;
                for (size_t i = 0; i < c.batch * pc.heads * pc.q_len * pc.kv_len; i++)
                    if (part.v[i]) none = false;
                CHECK(attn_block_map_empty(attn_block_mask_map(slice)) == none);
            }
            attn_block_mask_free(slice);
            attn_block_mask_free(want);
            free(part.v);
        }
        /* a rectangle past the map, or of nothing, is refused */
        attn_block_mask *bad = bm;
        CHECK_STATUS(attn_block_map_slice(ctx, "test", m, 0, c.heads, 0, c.q_len + 1, 0,
                                          c.kv_len, &bad), ATTN_ERR_INVALID);
        CHECK(bad == NULL);
        CHECK_MESSAGE(ctx, "no slice");
        CHECK_STATUS(attn_block_map_slice(ctx, "test", m, 0, c.heads, 3, 3, 0, c.kv_len, &bad),
                     ATTN_ERR_INVALID);
        attn_block_mask_free(bm);
        free(d.v);
    }
}

/* usage: test_block_mask [rounds] (random trees, 300; each primitive a tenth) */
/* A slice of heads (attn_block_map_heads) runs as its parent runs
 * (Ulysses's premise: each rank's heads give the single process's bits).
 * Heads 0 and 1 see every key and heads 2 and 3 a random part: the
 * parent's heads differ, so it keeps no row intervals, while its slice of
 * heads 0 and 1 alone is the same for both heads; out and lse of each
 * slice's heads are the parent's, bit for bit, over random inputs (the
 * kernels that read row intervals round otherwise). The backward's path
 * is the MPI layer's to choose (test_mpi_attention). */
static void test_slice_kernels(attn_ctx *ctx) {
    enum { H = 4, D = 16 };
    static const size_t lengths[] = {3, 40};
    for (size_t li = 0; li < 2; li++) {
        size_t T = lengths[li], n = H * T * D;
        uint8_t *vis = malloc(H * T * T);
        float *x = malloc(6 * n * sizeof(float));
        float *q = x, *k = q + n, *v = k + n, *out = v + n, *o2 = out + n, *lse = o2 + n;
        float lse2[H * 40];
        bool same = true;
        for (int trial = 0; trial < 64; trial++) {
            for (size_t i = 0; i < H * T * T; i++) vis[i] = i < 2 * T * T || rand_below(10) < 8;
            for (size_t i = 0; i < 3 * n; i++)
                x[i] = (float)((double)(next_u64() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
            attn_block_mask_config c = {.batch = 1, .heads = H, .q_len = T, .kv_len = T,
                                        .block_q = 32, .block_kv = 16};
            size_t st[4] = {0, T * T, T, 1};
            attn_block_mask *bm = NULL;
            CHECK_STATUS(attn_block_mask_from_bool(ctx, &c, vis, st, &bm), ATTN_OK);
            attn_sdpa_config cfg = {.batch = 1, .heads = H, .kv_heads = H, .q_tokens = T,
                                    .kv_tokens = T, .head_dim = D, .causal = true,
                                    .q_strides = {H * T * D, D, T * D},
                                    .kv_strides = {H * T * D, D, T * D},
                                    .out_strides = {H * T * D, D, T * D}, .block_mask = bm};
            CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_OK);
            for (size_t h0 = 0; h0 < H; h0 += 2) {
                attn_block_mask *half = NULL;
                CHECK_STATUS(attn_block_map_heads(ctx, "test", attn_block_mask_map(bm), h0,
                                                  h0 + 2, &half),
                             ATTN_OK);
                attn_sdpa_config g = cfg;
                g.heads = g.kv_heads = 2;
                g.q_strides[0] = g.kv_strides[0] = g.out_strides[0] = 2 * T * D;
                g.block_mask = half;
                size_t at = h0 * T * D;
                CHECK_STATUS(attn_sdpa_forward(ctx, &g, q + at, k + at, v + at, o2 + at,
                                               lse2 + h0 * T, NULL, NULL),
                             ATTN_OK);
                attn_block_mask_free(half);
            }
            size_t bytes = n * sizeof(float);
            same = same && !memcmp(out, o2, bytes) && !memcmp(lse, lse2, H * T * sizeof(float));
            attn_block_mask_free(bm);
        }
        if (!same) printf("FAIL: T %zu: a slice of heads gives other bits than its map\n", T);
        CHECK(same);
        free(vis);
        free(x);
    }
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 300;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    const char *env = getenv("ATTN_TEST_SEED");
    if (env) seed = strtoull(env, NULL, 10);
    printf("seed %llu (ATTN_TEST_SEED to repeat)\n", (unsigned long long)seed);
    rng_state = seed;
    attn_ctx *ctx = NULL;
    if (attn_ctx_new(NULL, &ctx) != ATTN_OK) return 1;
    test_visible_formulas(ctx);
    test_constructor_errors(ctx);
    test_to_string(ctx);
    test_row_intervals(ctx);
    test_each_primitive(ctx, rounds / 10);
    test_random_trees(ctx, rounds);
    test_dense(ctx);
    test_fn_errors(ctx);
    test_kv_blocks(ctx);
    test_slices(ctx, rounds / 10);
    test_slice_kernels(ctx);
    test_speed(ctx);
    test_long_window(ctx);
    test_dense_past_memory(ctx);
    attn_ctx_free(ctx);
    return check_summary();
}
