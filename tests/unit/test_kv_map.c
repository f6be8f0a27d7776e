/*
 * test_kv_map.c — a block map over a KV cache (attn.h, attn_kv_attend_args
 * block_mask): the map's rows and columns are absolute positions, so new
 * token r of sequence s (position length(s) + r) sees key position j where
 * the map and the causal/window rule both let it.
 *
 *   - random maps: packed documents, prefix-LM, chunked (closed form),
 *     random block lists with a document mask in their partial blocks
 *     (from_kv_blocks), dense boolean maps of random bits (some rows
 *     empty), with batch and heads each 1 or the call's; over caches of
 *     F32, BF16 and I8 K/V, contiguous and paged, some with a window (a
 *     ring: slots are not positions), GQA; a chunked prefill step (several
 *     new tokens, some sequences none), then a decode step, the same map,
 *     with softcap, ALiBi and sinks each in a third of the trials (a
 *     prompt into an empty cache runs as a dense problem under its
 *     sequence's slice of the map, on the map kernels); every output against a dense masked softmax this file computes in
 *     double over the same stored values (the inputs are exact in the
 *     stored type) and against the reference backend (a reference ctx);
 *     the fast kernels bitwise across 1 and 2 threads and contiguous vs
 *     paged; a row that sees no key is zeros;
 *   - a map of every key gives the bits of no map;
 *   - refusals, naming the values, nothing appended and nothing written: a
 *     map shorter than the positions of the call, of another batch, of
 *     other heads.
 * Inputs are fresh random numbers each run (the seed is printed;
 * ATTN_TEST_SEED replays it).
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state;

static uint64_t next_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static size_t below(size_t n) { return (size_t)(next_u64() % n); }
static float rand_normal(void) {
    double s = 0.0;
    for (int i = 0; i < 4; i++) s += (double)(next_u64() >> 11) / 9007199254740992.0;
    return (float)((s - 2.0) * 1.7320508);
}

/* ---- values the cache stores exactly ------------------------------------------ */

/* One (token, KV head) row of D values the type stores as they are:
 * bfloat16 values (low bits cleared), or int8 codes times a power-of-two
 * scale with one code at 127 (so that the row's scale is that power). */
static void exact_row(attn_dtype type, float *x, size_t D) {
    if (type == ATTN_DTYPE_I8) {
        float s = ldexpf(1.0f, -(int)(3 + below(4)));
        for (size_t d = 0; d < D; d++) x[d] = (float)((int)below(255) - 127) * s;
        x[below(D)] = (below(2) ? 127.0f : -127.0f) * s;
        return;
    }
    for (size_t d = 0; d < D; d++) {
        float v = rand_normal();
        if (type == ATTN_DTYPE_BF16) {
            uint32_t u;
            memcpy(&u, &v, 4);
            u &= 0xFFFF0000u;
            memcpy(&v, &u, 4);
        }
        x[d] = v;
    }
}

/* ---- the maps and their truth ---------------------------------------------------- */

typedef enum map_kind { MAP_DOC, MAP_PREFIX, MAP_CHUNK, MAP_BLOCKS, MAP_BOOL, MAP_KINDS } map_kind;
static const char *const kind_names[MAP_KINDS] = {"documents", "prefix-LM", "chunked",
                                                  "block lists", "boolean"};

typedef struct map_truth {
    map_kind kind;
    size_t batch, heads, M; /* the map's batch and heads; q_len = kv_len = M */
    size_t block_q, block_kv;
    int32_t *doc;           /* (batch, M) document ids in runs */
    int64_t *prefix;        /* (batch) */
    size_t chunk;
    uint8_t *listed;        /* MAP_BLOCKS: (batch, heads, q_blocks, kv_blocks) 0, 1 partial, 2 full */
    uint8_t *bits;          /* MAP_BOOL: (batch, heads, M, M) */
} map_truth;

static bool truth_sees(const map_truth *t, size_t b, size_t h, size_t i, size_t j) {
    size_t bb = t->batch == 1 ? 0 : b, hh = t->heads == 1 ? 0 : h;
    switch (t->kind) {
    case MAP_DOC: return t->doc[bb * t->M + i] == t->doc[bb * t->M + j];
    case MAP_PREFIX: return j <= i || (int64_t)j < t->prefix[bb];
    case MAP_CHUNK: return i / t->chunk == j / t->chunk;
    case MAP_BLOCKS: {
        size_t qb = (t->M + t->block_q - 1) / t->block_q, kb = (t->M + t->block_kv - 1) / t->block_kv;
        uint8_t e = t->listed[((bb * t->heads + hh) * qb + i / t->block_q) * kb + j / t->block_kv];
        return e == 2 || (e == 1 && t->doc[bb * t->M + i] == t->doc[bb * t->M + j]);
    }
    case MAP_BOOL: return t->bits[((bb * t->heads + hh) * t->M + i) * t->M + j] != 0;
    default: return false;
    }
}

static void random_docs(int32_t *doc, size_t M) {
    int32_t id = 0;
    for (size_t i = 0; i < M;) {
        size_t run = 1 + below(below(4) == 0 ? 8 : 90);
        for (size_t e = 0; e < run && i < M; e++) doc[i++] = id;
        id++;
    }
}

/* A random map of kind over positions [0, M), batch and heads as given. */
static attn_block_mask *random_map(attn_ctx *ctx, map_kind kind, size_t batch, size_t heads,
                                   size_t M, map_truth *t) {
    static const size_t sizes[] = {16, 32, 64, 128};
    *t = (map_truth){.kind = kind, .batch = batch, .heads = heads, .M = M,
                     .block_q = sizes[below(4)], .block_kv = sizes[below(4)]};
    attn_block_mask_config cfg = {batch, heads, M, M, t->block_q, t->block_kv};
    attn_block_mask *bm = NULL;
    attn_mask *mask = NULL;
    t->doc = malloc(batch * M * sizeof *t->doc);
    for (size_t b = 0; b < batch; b++) random_docs(t->doc + b * M, M);
    switch (kind) {
    case MAP_DOC:
        CHECK_STATUS(attn_mask_new_document(ctx, t->doc, NULL, batch, M, M, &mask), ATTN_OK);
        break;
    case MAP_PREFIX:
        t->prefix = malloc(batch * sizeof *t->prefix);
        for (size_t b = 0; b < batch; b++) t->prefix[b] = (int64_t)below(M);
        CHECK_STATUS(attn_mask_new_prefix_lm(ctx, t->prefix, batch, &mask), ATTN_OK);
        break;
    case MAP_CHUNK:
        t->chunk = 1 + below(100);
        CHECK_STATUS(attn_mask_new_chunked(ctx, t->chunk, 0, &mask), ATTN_OK);
        break;
    case MAP_BLOCKS: {
        size_t qb = (M + t->block_q - 1) / t->block_q, kb = (M + t->block_kv - 1) / t->block_kv;
        size_t rows = batch * heads * qb;
        t->listed = calloc(rows * kb, 1);
        int32_t *num = calloc(rows, sizeof *num), *idx = malloc(rows * kb * sizeof *idx);
        int32_t *fnum = calloc(rows, sizeof *fnum), *fidx = malloc(rows * kb * sizeof *fidx);
        for (size_t r = 0; r < rows; r++) {
            if (below(6) == 0) continue; /* a query block that sees nothing */
            for (size_t k = 0; k < kb; k++) {
                size_t roll = below(4);
                if (roll == 1) idx[r * kb + (size_t)num[r]++] = (int32_t)k;
                if (roll == 2) fidx[r * kb + (size_t)fnum[r]++] = (int32_t)k;
                t->listed[r * kb + k] = roll == 1 ? 1 : roll == 2 ? 2 : 0;
            }
        }
        CHECK_STATUS(attn_mask_new_document(ctx, t->doc, NULL, batch, M, M, &mask), ATTN_OK);
        CHECK_STATUS(attn_block_mask_from_kv_blocks(ctx, &cfg, num, idx, kb, fnum, fidx, kb, mask,
                                                    &bm),
                     ATTN_OK);
        free(num), free(idx), free(fnum), free(fidx);
        attn_mask_free(mask);
        return bm;
    }
    case MAP_BOOL: {
        size_t n = batch * heads * M * M;
        t->bits = malloc(n);
        for (size_t bh = 0; bh < batch * heads; bh++) {
            size_t density = 1 + below(9);
            for (size_t i = 0; i < M; i++) {
                uint8_t *row = t->bits + (bh * M + i) * M;
                bool empty = below(10) == 0; /* a row that sees nothing */
                for (size_t j = 0; j < M; j++) row[j] = !empty && below(10) < density;
            }
        }
        size_t strides[4] = {heads * M * M, M * M, M, 1};
        CHECK_STATUS(attn_block_mask_from_bool(ctx, &cfg, t->bits, strides, &bm), ATTN_OK);
        return bm;
    }
    default: break;
    }
    CHECK_STATUS(attn_block_mask_from_mask(ctx, &cfg, mask, &bm), ATTN_OK);
    attn_mask_free(mask);
    return bm;
}

static void truth_free(map_truth *t) {
    free(t->doc), free(t->prefix), free(t->listed), free(t->bits);
}

/* ---- caches and the oracle -------------------------------------------------------- */

typedef struct setup {
    size_t batch, kv_heads, q_heads, D, M, window;
    attn_dtype type;
    float *K, *V; /* (batch, M, kv_heads, D): every position's stored rows */
    size_t *len0; /* (batch) positions appended before the steps */
} setup;

static attn_kv_cache *cache_of(attn_ctx *ctx, const setup *s, attn_kv_layout layout) {
    size_t windows[1] = {s->window};
    attn_kv_cache_config cfg = {.num_layers = 1, .batch = s->batch, .kv_heads = s->kv_heads,
                                .head_dim = s->D, .max_len = s->M, .layout = layout,
                                .page_size = 16, .windows = windows, .k_dtype = s->type,
                                .v_dtype = s->type};
    attn_kv_cache *c = NULL;
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_OK);
    size_t row = s->kv_heads * s->D, total = 0;
    for (size_t b = 0; b < s->batch; b++) total += s->len0[b];
    if (!c || !total) return c;
    float *k = malloc(total * row * sizeof *k), *v = malloc(total * row * sizeof *v);
    for (size_t b = 0, at = 0; b < s->batch; b++)
        for (size_t p = 0; p < s->len0[b]; p++, at++) {
            memcpy(k + at * row, s->K + (b * s->M + p) * row, row * sizeof *k);
            memcpy(v + at * row, s->V + (b * s->M + p) * row, row * sizeof *v);
        }
    CHECK_STATUS(attn_kv_cache_append(c, 0, s->len0, 0, k, v), ATTN_OK);
    free(k), free(v);
    return c;
}

/* out (rows, Hq, D) of a step (sequence b's n[b] new rows from position
 * len[b]) by the dense masked softmax, in double; *empty counts the (row,
 * head) pairs that see no key. */
/* Score modifiers of a trial (0, NULL: off), beside the map. */
typedef struct modifiers {
    float softcap;
    const float *slopes, *sinks;
} modifiers;

static void oracle(const setup *s, const map_truth *t, const modifiers *mods, const size_t *len,
                   const size_t *n, const float *q, double *out, size_t *empty) {
    size_t Hq = s->q_heads, KH = s->kv_heads, D = s->D, G = Hq / KH, row = KH * D;
    double scale = 1.0 / sqrt((double)D), *w = malloc(s->M * sizeof *w);
    for (size_t b = 0, at = 0; b < s->batch; b++)
        for (size_t r = 0; r < n[b]; r++, at++) {
            size_t pos = len[b] + r, lo = s->window && pos + 1 > s->window ? pos + 1 - s->window : 0;
            for (size_t h = 0; h < Hq; h++) {
                const float *qi = q + (at * Hq + h) * D;
                double mx = -INFINITY, sum = 0.0;
                for (size_t j = lo; j <= pos; j++) {
                    w[j] = -INFINITY;
                    if (!truth_sees(t, b, h, pos, j)) continue;
                    const float *kr = s->K + (b * s->M + j) * row + (h / G) * D;
                    double dot = 0.0;
                    for (size_t d = 0; d < D; d++) dot += (double)qi[d] * kr[d];
                    w[j] = dot * scale;
                    if (mods->softcap > 0.0f)
                        w[j] = mods->softcap * tanh(w[j] / (double)mods->softcap);
                    if (mods->slopes) w[j] -= (double)mods->slopes[h] * (double)(pos - j);
                    if (w[j] > mx) mx = w[j];
                }
                double *o = out + (at * Hq + h) * D;
                for (size_t d = 0; d < D; d++) o[d] = 0.0;
                if (mx == -INFINITY) { /* zeros, sink or not: a sink weighs no value */
                    (*empty)++;
                    continue;
                }
                double sink = mods->sinks ? (double)mods->sinks[h] : -INFINITY;
                if (sink > mx) mx = sink;
                for (size_t j = lo; j <= pos; j++) sum += w[j] == -INFINITY ? 0.0 : exp(w[j] - mx);
                if (mods->sinks) sum += exp(sink - mx);
                for (size_t j = lo; j <= pos; j++) {
                    if (w[j] == -INFINITY) continue;
                    const float *vr = s->V + (b * s->M + j) * row + (h / G) * D;
                    double p = exp(w[j] - mx) / sum;
                    for (size_t d = 0; d < D; d++) o[d] += p * vr[d];
                }
            }
        }
    free(w);
}

/* Relative L2, against a floor of 1e-30 an element: a row whose keys lie
 * hundreds of ALiBi units below its sink has true outputs far below
 * float32's range (1e-150 at a slope of 0.5 over 700 positions), which
 * float32 gives as 0, and relative to them alone that is an error of 1. */
static double rel_l2(const float *got, const double *want, size_t n) {
    double e = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) {
        e += (got[i] - want[i]) * (got[i] - want[i]);
        m += want[i] * want[i];
    }
    return sqrt(e / fmax(m, 1e-60 * (double)(n ? n : 1))); /* a call of no rows: 0 */
}

/* Whether every float is exactly 0 where the oracle's row is empty
 * (want exactly 0 over a (row, head)). */
static bool zeros_where_empty(const float *got, const double *want, size_t pairs, size_t D) {
    for (size_t i = 0; i < pairs; i++) {
        bool empty = true;
        for (size_t d = 0; d < D && empty; d++) empty = want[i * D + d] == 0.0;
        for (size_t d = 0; empty && d < D; d++)
            if (got[i * D + d] != 0.0f) return false;
    }
    return true;
}

/* Whether the ctx's last attention ran on the backend (decode, or flex
 * for a prompt's dense problem), not on the reference, which every
 * problem falls back to. */
static bool ran_on(const attn_ctx *ctx, const char *backend) {
    const char *e = strstr(attn_ctx_last_explain(ctx), backend);
    e = e ? strstr(e, "]: ") : NULL;
    return e && strncmp(e + 3, "ran", 3) == 0;
}

/* ---- the random trials ------------------------------------------------------------- */

enum { RUN_REF, RUN_ONE, RUN_TWO, RUN_PAGED, RUNS };

static size_t empty_pairs, all_pairs; /* (row, head) pairs that saw no key, of all */

static void trial(attn_ctx *const *ctxs, int number) {
    static const attn_dtype types[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_I8};
    bool big = number % 4 == 3; /* long caches: split over threads, blocks skipped */
    map_kind kind = (map_kind)below(MAP_KINDS);
    if (big && kind == MAP_BOOL) kind = MAP_DOC;
    setup s = {.batch = 1 + below(3), .kv_heads = 1 + below(2), .D = 16u << below(3),
               .M = big ? 1500 + below(2500) : 40 + below(300), .type = types[below(3)]};
    s.q_heads = s.kv_heads * (1 + below(4));
    if (below(4) == 0) s.window = 4 + below(s.M / 2);
    /* softcap, ALiBi and sinks, each in a third of the trials */
    float slopes[16], sinks[16];
    for (size_t h = 0; h < s.q_heads; h++) {
        slopes[h] = 0.01f * (float)(1 + below(50));
        sinks[h] = rand_normal();
    }
    modifiers mods = {.softcap = below(3) == 0 ? 2.0f + (float)below(30) : 0.0f,
                      .slopes = below(3) == 0 ? slopes : NULL,
                      .sinks = below(3) == 0 ? sinks : NULL};
    size_t mb = below(2) ? s.batch : 1, mh = below(2) ? s.q_heads : 1;
    map_truth t;
    attn_block_mask *bm = random_map(ctxs[RUN_REF], kind, mb, mh, s.M, &t);
    size_t row = s.kv_heads * s.D;
    s.K = malloc(s.batch * s.M * row * sizeof(float));
    s.V = malloc(s.batch * s.M * row * sizeof(float));
    for (size_t e = 0; e < s.batch * s.M * s.kv_heads; e++) {
        exact_row(s.type, s.K + e * s.D, s.D);
        exact_row(s.type, s.V + e * s.D, s.D);
    }
    /* a chunked prefill step of up to 20 rows (some sequences none), then a decode step */
    size_t len[3], n1[3], n2[3], len0[3];
    for (size_t b = 0; b < s.batch; b++) {
        n1[b] = below(5) == 0 ? 0 : 1 + below(20);
        n2[b] = 1;
        len0[b] = below(4) == 0 ? 0 : below(s.M - n1[b] - n2[b]);
    }
    if (s.M > 100 && below(4) == 0) n1[0] = 64 + below(10), len0[0] = 0; /* a prompt */
    if (n1[0] + n2[0] + len0[0] > s.M) len0[0] = s.M - n1[0] - n2[0];
    s.len0 = len0;
    attn_kv_cache *caches[RUNS];
    for (int r = 0; r < RUNS; r++)
        caches[r] = cache_of(ctxs[r], &s, r == RUN_PAGED ? ATTN_KV_PAGED : ATTN_KV_CONTIGUOUS);
    for (size_t b = 0; b < s.batch; b++) len[b] = len0[b];
    for (int step = 0; step < 2; step++) {
        const size_t *n = step ? n2 : n1;
        size_t rows = 0;
        for (size_t b = 0; b < s.batch; b++) rows += n[b];
        size_t qn = rows * s.q_heads * s.D;
        float *q = malloc((qn + 1) * sizeof *q), *kn = malloc((rows * row + 1) * sizeof *kn);
        float *vn = malloc((rows * row + 1) * sizeof *vn), *out[RUNS];
        for (size_t e = 0; e < qn; e++) q[e] = rand_normal();
        for (size_t b = 0, at = 0; b < s.batch; b++)
            for (size_t r = 0; r < n[b]; r++, at++) {
                memcpy(kn + at * row, s.K + (b * s.M + len[b] + r) * row, row * sizeof *kn);
                memcpy(vn + at * row, s.V + (b * s.M + len[b] + r) * row, row * sizeof *vn);
            }
        /* a call of prompts alone (empty caches, 64 rows or more) runs as
         * dense problems, each under its sequence's slice of the map, on the
         * kernels that take it (fused for a map of row intervals, else
         * flex); any other call ends on the decode kernels */
        bool prompts_only = !mods.softcap && !mods.slopes;
        for (size_t b = 0; b < s.batch; b++) prompts_only &= len[b] == 0 && n[b] >= 64;
        double *want = malloc((qn + 1) * sizeof *want);
        size_t empty = 0;
        oracle(&s, &t, &mods, len, n, q, want, &empty);
        empty_pairs += empty;
        all_pairs += rows * s.q_heads;
        for (int r = 0; r < RUNS; r++) {
            out[r] = malloc((qn + 1) * sizeof(float));
            for (size_t e = 0; e < qn; e++) out[r][e] = NAN; /* every element is written */
            attn_kv_attend_args a = {.layer = 0, .new_lens = n, .q_heads = s.q_heads, .q = q,
                                     .k_new = kn, .v_new = vn, .out = out[r], .softcap = mods.softcap,
                                     .alibi_slopes = mods.slopes, .sinks = mods.sinks,
                                     .block_mask = bm};
            CHECK_STATUS(attn_kv_cache_attend(caches[r], &a), ATTN_OK);
            bool fast = prompts_only ? ran_on(ctxs[r], "flex [") || ran_on(ctxs[r], "fused [")
                                     : ran_on(ctxs[r], "decode [");
            if (r != RUN_REF && rows && !fast)
                fprintf(stderr, "trial %d: not the %s kernels: %s\n", number,
                        prompts_only ? "map" : "decode", attn_ctx_last_explain(ctxs[r]));
            CHECK(r == RUN_REF || !rows || fast);
        }
        double err_ref = rel_l2(out[RUN_REF], want, qn), err_fast = rel_l2(out[RUN_ONE], want, qn);
        bool same = memcmp(out[RUN_ONE], out[RUN_TWO], qn * sizeof(float)) == 0 &&
                    memcmp(out[RUN_ONE], out[RUN_PAGED], qn * sizeof(float)) == 0;
        bool zeros = true;
        for (int r = 0; r < RUNS; r++)
            zeros &= zeros_where_empty(out[r], want, rows * s.q_heads, s.D);
        if (!(err_ref < 1e-6) || !(err_fast < 1e-5) || !same || !zeros)
            fprintf(stderr,
                    "trial %d step %d: %s map (batch %zu, heads %zu, blocks %zu x %zu) over %s "
                    "cache of %zu positions (batch %zu, Hq %zu, Hkv %zu, D %zu, window %zu): "
                    "softcap %g, ALiBi %d, sinks %d: "
                    "reference err %.3g, fast err %.3g, bitwise %d, zeros %d (%zu empty)\n",
                    number, step, kind_names[kind], mb, mh, t.block_q, t.block_kv,
                    attn_dtype_name(s.type), s.M, s.batch, s.q_heads, s.kv_heads, s.D, s.window,
                    (double)mods.softcap, mods.slopes != NULL, mods.sinks != NULL, err_ref, err_fast, same, zeros, empty);
        CHECK(err_ref < 1e-6);
        CHECK(err_fast < 1e-5);
        CHECK(same);
        CHECK(zeros);
        for (size_t b = 0; b < s.batch; b++) len[b] += n[b];
        for (int r = 0; r < RUNS; r++) free(out[r]);
        free(q), free(kn), free(vn), free(want);
    }
    for (int r = 0; r < RUNS; r++) {
        size_t got = 0;
        CHECK_STATUS(attn_kv_cache_length(caches[r], 0, s.batch - 1, &got), ATTN_OK);
        CHECK(got == len[s.batch - 1]);
        attn_kv_cache_free(caches[r]);
    }
    attn_block_mask_free(bm);
    truth_free(&t);
    free(s.K), free(s.V);
}

/* ---- a map of every key: the bits of no map ---------------------------------------- */

static void test_all_keys(attn_ctx *ctx) {
    static const attn_dtype types[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_I8};
    for (size_t ti = 0; ti < 3; ti++) {
        setup s = {.batch = 2, .kv_heads = 2, .q_heads = 8, .D = 64, .M = 700, .type = types[ti]};
        size_t row = s.kv_heads * s.D, len0[2] = {300 + below(300), 1 + below(200)};
        s.len0 = len0;
        s.K = malloc(s.batch * s.M * row * sizeof(float));
        s.V = malloc(s.batch * s.M * row * sizeof(float));
        for (size_t e = 0; e < s.batch * s.M * s.kv_heads; e++) {
            exact_row(s.type, s.K + e * s.D, s.D);
            exact_row(s.type, s.V + e * s.D, s.D);
        }
        attn_mask *all = NULL;
        attn_block_mask *bm = NULL;
        attn_block_mask_config cfg = {1, 1, s.M, s.M, 0, 0};
        CHECK_STATUS(attn_mask_new_all(ctx, &all), ATTN_OK);
        CHECK_STATUS(attn_block_mask_from_mask(ctx, &cfg, all, &bm), ATTN_OK);
        attn_kv_cache *a = cache_of(ctx, &s, ATTN_KV_PAGED), *b = cache_of(ctx, &s, ATTN_KV_PAGED);
        size_t n[2] = {1 + below(8), 1 + below(8)}, rows = n[0] + n[1], qn = rows * s.q_heads * s.D;
        float *q = malloc(qn * sizeof *q), *kn = malloc(rows * row * sizeof *kn);
        float *vn = malloc(rows * row * sizeof *vn), *o1 = malloc(qn * sizeof *o1);
        float *o2 = malloc(qn * sizeof *o2);
        for (size_t e = 0; e < qn; e++) q[e] = rand_normal();
        for (size_t e = 0; e < rows * row; e++) kn[e] = rand_normal(), vn[e] = rand_normal();
        attn_kv_attend_args args = {.layer = 0, .new_lens = n, .q_heads = s.q_heads, .q = q,
                                    .k_new = kn, .v_new = vn, .out = o1};
        CHECK_STATUS(attn_kv_cache_attend(a, &args), ATTN_OK);
        args.out = o2;
        args.block_mask = bm;
        CHECK_STATUS(attn_kv_cache_attend(b, &args), ATTN_OK);
        CHECK(memcmp(o1, o2, qn * sizeof *o1) == 0);
        attn_kv_cache_free(a);
        attn_kv_cache_free(b);
        attn_block_mask_free(bm);
        attn_mask_free(all);
        free(s.K), free(s.V), free(q), free(kn), free(vn), free(o1), free(o2);
    }
}

/* ---- refusals ------------------------------------------------------------------------ */

static void test_refusals(attn_ctx *ctx) {
    setup s = {.batch = 2, .kv_heads = 1, .q_heads = 4, .D = 32, .M = 100, .type = ATTN_DTYPE_F32};
    size_t row = s.kv_heads * s.D, len0[2] = {50, 60};
    s.len0 = len0;
    s.K = malloc(s.batch * s.M * row * sizeof(float));
    s.V = malloc(s.batch * s.M * row * sizeof(float));
    for (size_t e = 0; e < s.batch * s.M * row; e++) s.K[e] = rand_normal(), s.V[e] = rand_normal();
    attn_kv_cache *c = cache_of(ctx, &s, below(2) ? ATTN_KV_PAGED : ATTN_KV_CONTIGUOUS);
    attn_mask *all = NULL;
    CHECK_STATUS(attn_mask_new_all(ctx, &all), ATTN_OK);
    attn_block_mask *small = NULL, *batch = NULL, *heads = NULL;
    attn_block_mask_config cs = {1, 1, 62, 100, 0, 0}, cb = {3, 1, 100, 100, 0, 0},
                           ch = {1, 2, 100, 100, 0, 0};
    CHECK_STATUS(attn_block_mask_from_mask(ctx, &cs, all, &small), ATTN_OK);
    CHECK_STATUS(attn_block_mask_from_mask(ctx, &cb, all, &batch), ATTN_OK);
    CHECK_STATUS(attn_block_mask_from_mask(ctx, &ch, all, &heads), ATTN_OK);
    float q[4 * 4 * 32], kn[4 * 32], vn[4 * 32], out[4 * 4 * 32];
    for (size_t e = 0; e < sizeof q / sizeof q[0]; e++) q[e] = rand_normal();
    for (size_t e = 0; e < sizeof kn / sizeof kn[0]; e++) kn[e] = rand_normal(), vn[e] = rand_normal();
    for (size_t e = 0; e < sizeof out / sizeof out[0]; e++) out[e] = 7.0f;
    size_t n[2] = {1, 3};
    attn_kv_attend_args a = {.layer = 0, .new_lens = n, .q_heads = 4, .q = q, .k_new = kn,
                             .v_new = vn, .out = out, .block_mask = small};
    CHECK_STATUS(attn_kv_cache_attend(c, &a), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "block_mask is of q_len 62, kv_len 100 (positions) where sequence 1 of "
                       "layer 0 reaches position 62 (length 60, 3 new)");
    a.block_mask = batch;
    CHECK_STATUS(attn_kv_cache_attend(c, &a), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "block_mask is of batch 3, heads 1; each must be 1 or the cache's batch "
                       "(2) and q_heads (4)");
    a.block_mask = heads;
    CHECK_STATUS(attn_kv_cache_attend(c, &a), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "block_mask is of batch 1, heads 2");
    bool untouched = true;
    for (size_t e = 0; e < sizeof out / sizeof out[0]; e++) untouched &= out[e] == 7.0f;
    CHECK(untouched);
    for (size_t b = 0; b < 2; b++) {
        size_t got = 0;
        CHECK_STATUS(attn_kv_cache_length(c, 0, b, &got), ATTN_OK);
        CHECK(got == len0[b]); /* nothing appended */
    }
    /* the same small map takes a call that stays within it */
    n[1] = 2;
    a.block_mask = small;
    CHECK_STATUS(attn_kv_cache_attend(c, &a), ATTN_OK);
    attn_block_mask_free(small);
    attn_block_mask_free(batch);
    attn_block_mask_free(heads);
    attn_mask_free(all);
    attn_kv_cache_free(c);
    free(s.K), free(s.V);
}

int main(int argc, char **argv) {
    const char *env = argc > 1 ? argv[1] : getenv("ATTN_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    if (!seed) seed = 1;
    rng_state = seed;
    printf("seed %llu (ATTN_TEST_SEED to repeat)\n", (unsigned long long)seed);
    attn_ctx *ctxs[RUNS] = {NULL};
    attn_ctx_config ref = {.num_threads = 2, .kernels = ATTN_KERNELS_REFERENCE};
    attn_ctx_config one = {.num_threads = 1}, two = {.num_threads = 2};
    if (attn_ctx_new(&ref, &ctxs[RUN_REF]) != ATTN_OK || attn_ctx_new(&one, &ctxs[RUN_ONE]) != ATTN_OK ||
        attn_ctx_new(&two, &ctxs[RUN_TWO]) != ATTN_OK || attn_ctx_new(&one, &ctxs[RUN_PAGED]) != ATTN_OK)
        return 1;
    for (int i = 0; i < 40; i++) trial(ctxs, i);
    printf("%zu of %zu (row, head) pairs saw no key\n", empty_pairs, all_pairs);
    CHECK(empty_pairs > 0); /* the zeros were tested */
    test_all_keys(ctxs[RUN_TWO]);
    test_refusals(ctxs[RUN_ONE]);
    for (int r = 0; r < RUNS; r++) attn_ctx_free(ctxs[r]);
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
