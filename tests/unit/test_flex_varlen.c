/*
 * test_flex_varlen.c — block maps and score modifiers over packed
 * sequences (cu_seqlens) through attn_sdpa_forward / attn_sdpa_backward.
 * With cu_seqlens the map and the modifiers are in each sequence's own
 * positions: sequence b's query i and key j are the map's (b or 0, h, i, j).
 *
 * Each case packs 3 or 4 sequences of different lengths (one of a single
 * query, in half the cases one of no queries or no keys, q and kv lengths
 * drawn apart) under a map built one of five ways
 * (document ids, prefix-LM, chunked, random BlockMask.from_kv_blocks lists,
 * a dense random boolean mask) or none, larger than the longest sequence or
 * not, and a chain of 0 to 3 modifiers (scale, softcap, ALiBi, a bias with
 * its gradient, T5's relative bias with its gradient, a callback). It
 * checks, against
 *   - each sequence run alone as a dense batch-1 problem under the map of
 *     its slice (b, h, :T_b, :S_b), built from the same description or the
 *     same bits: out, lse, dq, dk, dv and a per-sequence bias's gradient
 *     bit for bit where both calls ran on the flex kernels (the tiles are
 *     cut alike from each sequence's first token; the map's blocks past a
 *     sequence add exact zeros), else within 1e-5 relative L2;
 *   - the float64 reference of the same packed call: everything within
 *     1e-5 relative L2 (gradients that sum many terms of both signs
 *     measured against the size of the terms);
 *   - itself at 2 threads: the same bits;
 *   - in bf16 (attn_sdpa_forward_16), the float call on the same rounded
 *     inputs: out within bf16's rounding (2^-8 relative L2), lse 1e-5.
 * Sequences of no queries leave dk and dv 0; of no keys, out 0, lse -inf
 * and dq 0. A map shorter than a sequence, or of another batch, is refused
 * naming it; one of exactly the longest lengths runs, with the same bits
 * where the call's longest lengths are given larger. A chain of softcap and
 * ALiBi at every sequence's positions runs on the fused kernels, with the
 * fixed features' bits. Fresh random inputs each run: the seed is printed,
 * ATTN_TEST_SEED repeats it.
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

#define TOL 1e-5
#define MAX_SEQ 4
#define MAX_MODS 4

/* ---- random numbers -------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double uniform(void) { return (double)(next_u64() >> 11) * 0x1.0p-53; }
static size_t below(size_t n) { return (size_t)(next_u64() % n); }
static float randn(void) {
    double u = uniform() + 1e-300, v = uniform();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}
static float *alloc_randn(size_t n, float sd) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = randn() * sd;
    return x;
}
static float *alloc_nan(size_t n) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

/* ---- a case -------------------------------------------------------------------- */

enum { MAP_NONE, MAP_DOCUMENT, MAP_PREFIX, MAP_CHUNKED, MAP_KV_BLOCKS, MAP_BOOL, MAP_KINDS };
static const char *const map_names[MAP_KINDS] = {"none", "document", "prefix-LM", "chunked",
                                                 "from_kv_blocks", "bool"};

typedef struct mod_tensor {
    float *data, *grad;
    size_t n;
} mod_tensor;

typedef struct varlen_case {
    size_t n;                          /* sequences */
    size_t tq[MAX_SEQ], tk[MAX_SEQ];   /* their lengths */
    int32_t cu_q[MAX_SEQ + 1], cu_kv[MAX_SEQ + 1];
    size_t T, S;                       /* the longest */
    size_t H, Hkv, D, Dv, bq, bkv;
    bool causal, window, top_left;
    long long wl, wr;
    float *sinks;
    int kind;
    size_t mb, mh, MQ, MK;             /* the map's batch, heads and lengths */
    uint8_t *vis;                      /* (mb, mh, MQ, MK): what the map shows */
    attn_mask *desc;                   /* the description (document, prefix, chunked, kv_blocks) */
    int32_t *q_doc, *kv_doc;           /* MAP_DOCUMENT: (mb, MQ), (mb, MK) */
    int64_t prefix[MAX_SEQ];           /* MAP_PREFIX */
    size_t chunk;
    long long chunk_offset;
    attn_block_mask *mask;
    attn_score_mod mods[MAX_MODS];
    mod_tensor tensors[MAX_MODS];
    size_t nmods;
    float *q, *k, *v, *dout;           /* packed */
    size_t total_q, total_kv;
} varlen_case;

/* The callback modifier: s (1 + 0.05 ((q + 2 kv + h) mod 3)) + 0.1 sin s. */
static double callback_factor(size_t h, size_t i, size_t j) {
    return 1.0 + 0.05 * (double)((i + 2 * j + h) % 3);
}
static int callback_fn(void *user, const attn_score_tile *t) {
    (void)user;
    for (size_t r = 0; r < t->rows; r++)
        for (size_t c = 0; c < t->cols; c++) {
            float *s = &t->scores[r * t->ld + c];
            *s = *s * (float)callback_factor(t->h, t->q0 + r, t->kv0 + c) + 0.1f * sinf(*s);
        }
    return 0;
}
static int callback_grad(void *user, const attn_score_tile *t, float *grad) {
    (void)user;
    for (size_t r = 0; r < t->rows; r++)
        for (size_t c = 0; c < t->cols; c++) {
            float s = t->scores[r * t->ld + c];
            grad[r * t->ld + c] *=
                (float)callback_factor(t->h, t->q0 + r, t->kv0 + c) + 0.1f * cosf(s);
        }
    return 0;
}

static size_t pick(const size_t *options, size_t n) { return options[below(n)]; }

/* Lengths of n sequences: one of 0 queries or 0 keys now and then, one of
 * a single query, the rest up to 150, q and kv lengths drawn apart. */
static void make_lengths(varlen_case *c) {
    static const size_t lens[] = {1, 2, 7, 16, 33, 64, 65, 100, 130, 150};
    c->n = 3 + below(2);
    for (size_t b = 0; b < c->n; b++) {
        c->tq[b] = pick(lens, 10);
        c->tk[b] = pick(lens, 10);
    }
    size_t one = below(c->n), zero = (one + 1 + below(c->n - 1)) % c->n;
    c->tq[one] = 1;
    if (below(2)) {
        if (below(2)) c->tq[zero] = 0;
        else c->tk[zero] = 0;
    }
    c->cu_q[0] = c->cu_kv[0] = 0;
    c->T = c->S = 1;
    for (size_t b = 0; b < c->n; b++) {
        c->cu_q[b + 1] = c->cu_q[b] + (int32_t)c->tq[b];
        c->cu_kv[b + 1] = c->cu_kv[b] + (int32_t)c->tk[b];
        if (c->tq[b] > c->T) c->T = c->tq[b];
        if (c->tk[b] > c->S) c->S = c->tk[b];
    }
    c->total_q = (size_t)c->cu_q[c->n];
    c->total_kv = (size_t)c->cu_kv[c->n];
}

/* A (heads, m->buckets) table of random values and its gradient, for m. */
static void head_table(const varlen_case *c, mod_tensor *t, attn_score_mod *m) {
    t->n = c->H * m->buckets;
    t->data = alloc_randn(t->n, 1.0f);
    t->grad = alloc_nan(t->n);
    m->tensor = t->data;
    m->tensor_grad = t->grad;
}

static attn_score_mod make_mod(varlen_case *c, size_t slot) {
    attn_score_mod m = {0};
    mod_tensor *t = &c->tensors[slot];
    m.kind = (attn_score_mod_kind)(1 + (int)below(7));
    switch (m.kind) {
    case ATTN_SCORE_SCALE: m.value = 0.5 + uniform(); break;
    case ATTN_SCORE_SOFTCAP: m.value = 1.0 + 4.0 * uniform(); break;
    case ATTN_SCORE_ALIBI:
        t->n = c->H;
        t->data = alloc_randn(c->H, 0.05f);
        for (size_t h = 0; h < c->H; h++) t->data[h] = fabsf(t->data[h]);
        m.tensor = t->data;
        m.signed_distance = below(2);
        m.offset = (long long)below(9) - 4;
        break;
    case ATTN_SCORE_BIAS: {
        /* (b, h, i, j) over the map's lengths at least: per sequence, or
         * one for every sequence (its gradient then sums them) */
        bool shared = below(3) == 0, heads = below(2);
        size_t ld = c->S + below(5), rows = c->T + below(3);
        m.strides[3] = 1;
        m.strides[2] = ld;
        m.strides[1] = heads ? rows * ld : 0;
        m.strides[0] = shared ? 0 : (heads ? c->H : 1) * rows * ld;
        t->n = (shared ? 1 : c->n) * (heads ? c->H : 1) * rows * ld;
        t->data = alloc_randn(t->n, 1.0f);
        t->grad = alloc_nan(t->n);
        m.tensor = t->data;
        m.tensor_grad = t->grad;
        break;
    }
    case ATTN_SCORE_REL_BIAS:
        m.bidirectional = below(2);
        m.buckets = m.bidirectional ? 8 + 2 * below(12) : 4 + below(20);
        m.max_distance = 16 + below(120);
        head_table(c, t, &m);
        break;
    case ATTN_SCORE_REL_TABLE: {
        /* every element the longest sequences reach, negative ones too */
        m.signed_distance = below(2);
        long long T = (long long)c->T, S = (long long)c->S;
        m.offset = (long long)below((size_t)(T + S)) - (m.signed_distance ? S : T);
        long long lo = (m.signed_distance ? -(T - 1) : -(S - 1)) + m.offset;
        long long hi = (m.signed_distance ? S - 1 : T - 1) + m.offset;
        m.buckets = (size_t)(-lo > hi + 1 ? -lo : hi + 1) + below(3);
        head_table(c, t, &m);
        break;
    }
    case ATTN_SCORE_CALLBACK:
        m.fn = callback_fn;
        m.grad_fn = callback_grad;
        break;
    }
    return m;
}

/* The map's description and its dense picture vis (mb, mh, MQ, MK). */
static attn_status make_map(attn_ctx *ctx, varlen_case *c) {
    size_t MQ = c->MQ, MK = c->MK, plane = MQ * MK;
    attn_block_mask_config mc = {c->mb, c->mh, MQ, MK, c->bq, c->bkv};
    attn_status st = ATTN_OK;
    switch (c->kind) {
    case MAP_NONE: return ATTN_OK;
    case MAP_DOCUMENT:
        /* documents in runs of each sequence's own lengths */
        c->q_doc = malloc(c->mb * MQ * sizeof(int32_t));
        c->kv_doc = malloc(c->mb * MK * sizeof(int32_t));
        for (size_t b = 0; b < c->mb; b++) {
            size_t qrun = 1 + below(40), krun = 1 + below(40);
            for (size_t i = 0; i < MQ; i++) c->q_doc[b * MQ + i] = (int32_t)(i / qrun);
            for (size_t j = 0; j < MK; j++) c->kv_doc[b * MK + j] = (int32_t)(j / krun);
        }
        st = attn_mask_new_document(ctx, c->q_doc, c->kv_doc, c->mb, MQ, MK, &c->desc);
        break;
    case MAP_PREFIX:
        for (size_t b = 0; b < c->mb; b++) c->prefix[b] = (int64_t)below(MK + 1);
        st = attn_mask_new_prefix_lm(ctx, c->prefix, c->mb, &c->desc);
        break;
    case MAP_CHUNKED: {
        attn_mask *chunked = NULL, *causal = NULL;
        c->chunk = 4 + below(40);
        c->chunk_offset = (long long)below(8);
        st = attn_mask_new_chunked(ctx, c->chunk, c->chunk_offset, &chunked);
        if (st == ATTN_OK) st = attn_mask_new_causal(ctx, c->chunk_offset, &causal);
        if (st == ATTN_OK) st = attn_mask_new_and(ctx, chunked, causal, &c->desc);
        attn_mask_free(chunked), attn_mask_free(causal);
        break;
    }
    case MAP_KV_BLOCKS: {
        /* random lists, partial blocks through a causal mask */
        size_t qbs = (MQ + c->bq - 1) / c->bq, kbs = (MK + c->bkv - 1) / c->bkv;
        size_t rows = c->mb * c->mh * qbs;
        int32_t *num = calloc(rows, 4), *idx = calloc(rows * kbs, 4);
        int32_t *fnum = calloc(rows, 4), *fidx = calloc(rows * kbs, 4);
        for (size_t r = 0; r < rows; r++)
            for (size_t kb = 0; kb < kbs; kb++) {
                size_t kind = below(3);
                if (kind == 1) fidx[r * kbs + fnum[r]++] = (int32_t)kb;
                if (kind == 2) idx[r * kbs + num[r]++] = (int32_t)kb;
            }
        st = attn_mask_new_causal(ctx, (long long)below(MK) - (long long)MQ / 2, &c->desc);
        if (st == ATTN_OK)
            st = attn_block_mask_from_kv_blocks(ctx, &mc, num, idx, kbs, fnum, fidx, kbs,
                                                c->desc, &c->mask);
        c->vis = calloc(c->mb * c->mh * plane, 1);
        for (size_t bh = 0; st == ATTN_OK && bh < c->mb * c->mh; bh++)
            for (size_t qb = 0; qb < qbs; qb++) {
                size_t r = bh * qbs + qb;
                for (size_t i = qb * c->bq; i < (qb + 1) * c->bq && i < MQ; i++)
                    for (size_t j = 0; j < MK; j++) {
                        int32_t kb = (int32_t)(j / c->bkv);
                        bool full = false, part = false, seen = false;
                        for (int32_t e = 0; e < fnum[r]; e++) full |= fidx[r * kbs + e] == kb;
                        for (int32_t e = 0; e < num[r]; e++) part |= idx[r * kbs + e] == kb;
                        if (part) attn_mask_visible(ctx, c->desc, bh / c->mh, bh % c->mh, i, j,
                                                    &seen);
                        c->vis[bh * plane + i * MK + j] = full || (part && seen);
                    }
            }
        free(num), free(idx), free(fnum), free(fidx);
        return st;
    }
    case MAP_BOOL: {
        c->vis = calloc(c->mb * c->mh * plane, 1);
        double p = 0.2 + 0.7 * uniform();
        for (size_t e = 0; e < c->mb * c->mh * plane; e++) c->vis[e] = uniform() < p;
        for (size_t r = 0; r < c->mb * c->mh * MQ; r++) /* rows that see no key */
            if (uniform() < 0.08) memset(c->vis + r * MK, 0, MK);
        size_t strides[4] = {c->mh * plane, plane, MK, 1};
        return attn_block_mask_from_bool(ctx, &mc, c->vis, strides, &c->mask);
    }
    }
    if (st != ATTN_OK) return st;
    st = attn_block_mask_from_mask(ctx, &mc, c->desc, &c->mask);
    c->vis = calloc(c->mb * c->mh * plane, 1);
    for (size_t bh = 0; st == ATTN_OK && bh < c->mb * c->mh; bh++)
        for (size_t i = 0; i < MQ; i++)
            for (size_t j = 0; j < MK; j++) {
                bool seen = false;
                st = attn_mask_visible(ctx, c->desc, bh / c->mh, bh % c->mh, i, j, &seen);
                c->vis[bh * plane + i * MK + j] = seen;
            }
    return st;
}

static attn_status make_case(attn_ctx *ctx, varlen_case *c, size_t index) {
    static const size_t heads[][2] = {{1, 1}, {2, 1}, {3, 3}, {4, 2}};
    static const size_t dims[] = {8, 16, 24, 32, 40};
    static const size_t blocks[] = {16, 32, 64, 128};
    memset(c, 0, sizeof *c);
    make_lengths(c);
    const size_t *hh = heads[below(4)];
    c->H = hh[0], c->Hkv = hh[1];
    c->D = pick(dims, 5);
    c->Dv = below(3) == 0 ? pick(dims, 5) : c->D;
    c->bq = pick(blocks, 4), c->bkv = pick(blocks, 4);
    c->causal = below(4) == 0;
    c->top_left = below(3) == 0;
    c->window = below(5) == 0;
    c->wl = (long long)below(40) - 1, c->wr = (long long)below(40) - 1;
    if (below(4) == 0) c->sinks = alloc_randn(c->H, 1.0f);
    c->kind = index < MAP_KINDS ? (int)index : (int)below(MAP_KINDS);
    bool per_seq = c->kind == MAP_DOCUMENT || c->kind == MAP_PREFIX || below(2);
    c->mb = per_seq ? c->n : 1;
    c->mh = (c->kind == MAP_KV_BLOCKS || c->kind == MAP_BOOL) && below(2) ? c->H : 1;
    /* the map reaches the longest sequence, or further */
    c->MQ = c->T + (below(2) ? below(70) : 0);
    c->MK = c->S + (below(2) ? below(70) : 0);
    c->nmods = below(4);
    if (c->kind == MAP_NONE && !c->nmods) c->nmods = 1;
    for (size_t t = 0; t < c->nmods; t++) c->mods[t] = make_mod(c, t);
    c->q = alloc_randn(c->total_q * c->H * c->D, 1.0f);
    c->k = alloc_randn(c->total_kv * c->Hkv * c->D, 1.0f);
    c->v = alloc_randn(c->total_kv * c->Hkv * c->Dv, 1.0f);
    c->dout = alloc_randn(c->total_q * c->H * c->Dv, 1.0f);
    return make_map(ctx, c);
}

static void free_case(varlen_case *c) {
    attn_block_mask_free(c->mask);
    attn_mask_free(c->desc);
    for (size_t t = 0; t < MAX_MODS; t++) free(c->tensors[t].data), free(c->tensors[t].grad);
    free(c->vis), free(c->q_doc), free(c->kv_doc), free(c->sinks);
    free(c->q), free(c->k), free(c->v), free(c->dout);
}

static attn_sdpa_config config_of(const varlen_case *c) {
    return (attn_sdpa_config){.batch = c->n, .heads = c->H, .kv_heads = c->Hkv,
                              .q_tokens = c->T, .kv_tokens = c->S, .head_dim = c->D,
                              .v_head_dim = c->Dv, .causal = c->causal,
                              .align = c->top_left ? ATTN_ALIGN_TOP_LEFT : ATTN_ALIGN_BOTTOM_RIGHT,
                              .window = c->window, .window_left = c->wl, .window_right = c->wr,
                              .sinks = c->sinks, .cu_seqlens_q = c->cu_q,
                              .cu_seqlens_kv = c->cu_kv, .block_mask = c->mask,
                              .score_mods = c->mods, .score_mod_count = c->nmods};
}

/* ---- runs ------------------------------------------------------------------------ */

typedef struct results {
    float *out, *lse, *dq, *dk, *dv, *dsinks, *grads[MAX_MODS];
    char explain[2][512];
} results;

static void results_alloc(const varlen_case *c, results *r) {
    memset(r, 0, sizeof *r);
    r->out = alloc_nan(c->total_q * c->H * c->Dv);
    r->lse = alloc_nan(c->total_q * c->H);
    r->dq = alloc_nan(c->total_q * c->H * c->D);
    r->dk = alloc_nan(c->total_kv * c->Hkv * c->D);
    r->dv = alloc_nan(c->total_kv * c->Hkv * c->Dv);
    r->dsinks = alloc_nan(c->H);
    for (size_t t = 0; t < MAX_MODS; t++) r->grads[t] = alloc_nan(c->tensors[t].n);
}
static void results_free(results *r) {
    free(r->out), free(r->lse), free(r->dq), free(r->dk), free(r->dv), free(r->dsinks);
    for (size_t t = 0; t < MAX_MODS; t++) free(r->grads[t]);
}

static void copy_grads(const varlen_case *c, results *r) {
    for (size_t t = 0; t < c->nmods; t++)
        if (c->mods[t].tensor_grad)
            memcpy(r->grads[t], c->mods[t].tensor_grad, c->tensors[t].n * sizeof(float));
}

/* The packed call, forward then backward. */
static bool run_packed(attn_ctx *ctx, varlen_case *c, results *r, const char *what) {
    attn_sdpa_config cfg = config_of(c);
    cfg.sinks_grad = c->sinks ? r->dsinks : NULL;
    attn_status st = attn_sdpa_forward(ctx, &cfg, c->q, c->k, c->v, r->out, r->lse, NULL, NULL);
    if (st == ATTN_OK) {
        snprintf(r->explain[0], sizeof r->explain[0], "%s", attn_ctx_last_explain(ctx));
        st = attn_sdpa_backward(ctx, &cfg, c->q, c->k, c->v, r->out, r->lse, c->dout, r->dq,
                                r->dk, r->dv, NULL);
        snprintf(r->explain[1], sizeof r->explain[1], "%s", attn_ctx_last_explain(ctx));
    }
    if (st != ATTN_OK) {
        fprintf(stderr, "%s: packed: %s\n", what, attn_ctx_last_error(ctx));
        return false;
    }
    copy_grads(c, r);
    return true;
}

/* The packed call on float64 copies: the reference in double. */
static bool run_double(attn_ctx *ctx, varlen_case *c, results *r, double **want,
                       const char *what) {
    size_t nq = c->total_q * c->H, nk = c->total_kv * c->Hkv;
    size_t sizes[5] = {nq * c->D, nk * c->D, nk * c->Dv, nq * c->Dv, nq};
    const float *src[4] = {c->q, c->k, c->v, c->dout};
    double *in[4];
    for (int e = 0; e < 4; e++) {
        in[e] = malloc((sizes[e] ? sizes[e] : 1) * sizeof(double));
        for (size_t i = 0; i < sizes[e]; i++) in[e][i] = (double)src[e][i];
    }
    /* want: out, lse, dq, dk, dv */
    size_t wsize[5] = {nq * c->Dv, nq, nq * c->D, nk * c->D, nk * c->Dv};
    for (int e = 0; e < 5; e++) want[e] = calloc(wsize[e] ? wsize[e] : 1, sizeof(double));
    attn_sdpa_config cfg = config_of(c);
    cfg.sinks_grad = c->sinks ? r->dsinks : NULL;
    attn_status st = attn_sdpa_forward_f64(ctx, &cfg, in[0], in[1], in[2], want[0], want[1],
                                           NULL, NULL);
    if (st == ATTN_OK)
        st = attn_sdpa_backward_f64(ctx, &cfg, in[0], in[1], in[2], want[0], want[1], in[3],
                                    want[2], want[3], want[4], NULL);
    for (int e = 0; e < 4; e++) free(in[e]);
    if (st != ATTN_OK) {
        fprintf(stderr, "%s: float64: %s\n", what, attn_ctx_last_error(ctx));
        return false;
    }
    copy_grads(c, r);
    return true;
}

/* ||got - want|| / max(||want||, floor) over finite wants; -inf wants must
 * be got exactly. */
static double rel_l2(const float *got, const double *want, size_t n, double floor,
                     bool *inf_ok) {
    double num = 0, den = 0;
    *inf_ok = true;
    for (size_t i = 0; i < n; i++) {
        if (isinf(want[i])) {
            if (got[i] != (float)want[i]) *inf_ok = false;
            continue;
        }
        double e = (double)got[i] - want[i];
        num += e * e;
        den += want[i] * want[i];
    }
    den = sqrt(den);
    if (den < floor) den = floor;
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return sqrt(num) / den;
}

static void check_rel(const char *name, const float *got, const double *want, size_t n,
                      double floor, const char *what) {
    bool inf_ok;
    double e = rel_l2(got, want, n, floor, &inf_ok);
    if (getenv("VARLEN_VERBOSE")) fprintf(stderr, "  %s %.3g\n", name, e);
    if (e <= TOL && inf_ok) {
        check_passed++;
    } else {
        check_failed++;
        fprintf(stderr, "%s: %s relative L2 error %.3g (tol %g)%s\n", what, name, e, TOL,
                inf_ok ? "" : ", -inf rows differ");
    }
}

/* Sequence b alone: a dense batch-1 call under the map of its slice, its
 * results written where the packed call writes sequence b's. False when the
 * sequence has no queries or no keys (a dense call has neither). */
typedef struct seq_run {
    bool ran, flex;
} seq_run;

static attn_status slice_map(attn_ctx *ctx, const varlen_case *c, size_t b,
                             attn_block_mask **out) {
    *out = NULL;
    if (c->kind == MAP_NONE) return ATTN_OK;
    size_t bb = c->mb == 1 ? 0 : b, plane = c->MQ * c->MK;
    attn_block_mask_config mc = {1, c->mh, c->tq[b], c->tk[b], c->bq, c->bkv};
    attn_mask *desc = NULL;
    attn_status st = ATTN_OK;
    switch (c->kind) {
    case MAP_DOCUMENT:
        st = attn_mask_new_document(ctx, c->q_doc + bb * c->MQ, c->kv_doc + bb * c->MK, 1,
                                    c->tq[b], c->tk[b], &desc);
        break;
    case MAP_PREFIX: st = attn_mask_new_prefix_lm(ctx, &c->prefix[bb], 1, &desc); break;
    case MAP_CHUNKED: {
        attn_mask *chunked = NULL, *causal = NULL;
        st = attn_mask_new_chunked(ctx, c->chunk, c->chunk_offset, &chunked);
        if (st == ATTN_OK) st = attn_mask_new_causal(ctx, c->chunk_offset, &causal);
        if (st == ATTN_OK) st = attn_mask_new_and(ctx, chunked, causal, &desc);
        attn_mask_free(chunked), attn_mask_free(causal);
        break;
    }
    default: {
        /* the same bits, the slice of sequence b */
        size_t strides[4] = {0, plane, c->MK, 1};
        return attn_block_mask_from_bool(ctx, &mc, c->vis + bb * c->mh * plane, strides, out);
    }
    }
    if (st == ATTN_OK) st = attn_block_mask_from_mask(ctx, &mc, desc, out);
    attn_mask_free(desc);
    return st;
}

static seq_run run_alone(attn_ctx *ctx, varlen_case *c, size_t b, results *r,
                         const char *what) {
    seq_run run = {false, false};
    size_t T = c->tq[b], S = c->tk[b];
    if (!T || !S) return run;
    size_t q0 = (size_t)c->cu_q[b], k0 = (size_t)c->cu_kv[b], H = c->H, Hkv = c->Hkv;
    attn_block_mask *mask = NULL;
    attn_status st = slice_map(ctx, c, b, &mask);
    /* the modifiers as they are, the bias of sequence b at its (0, h, i, j) */
    attn_score_mod mods[MAX_MODS];
    float *grads[MAX_MODS] = {0};
    for (size_t t = 0; t < c->nmods; t++) {
        mods[t] = c->mods[t];
        if (mods[t].kind == ATTN_SCORE_BIAS) {
            mods[t].tensor += b * mods[t].strides[0];
            grads[t] = alloc_nan(c->tensors[t].n);
            mods[t].tensor_grad = grads[t] + b * mods[t].strides[0];
        } else if (mods[t].tensor_grad) {
            grads[t] = alloc_nan(c->tensors[t].n);
            mods[t].tensor_grad = grads[t];
        }
    }
    float *lse = alloc_nan(H * T), *dsinks = alloc_nan(H);
    attn_sdpa_config cfg = config_of(c);
    cfg.batch = 1, cfg.q_tokens = T, cfg.kv_tokens = S;
    cfg.cu_seqlens_q = cfg.cu_seqlens_kv = NULL;
    cfg.block_mask = mask, cfg.score_mods = mods;
    cfg.sinks_grad = c->sinks ? dsinks : NULL;
    float *out = r->out + q0 * H * c->Dv;
    if (st == ATTN_OK)
        st = attn_sdpa_forward(ctx, &cfg, c->q + q0 * H * c->D, c->k + k0 * Hkv * c->D,
                               c->v + k0 * Hkv * c->Dv, out, lse, NULL, NULL);
    bool flex = st == ATTN_OK && strstr(attn_ctx_last_explain(ctx), "flex [") != NULL;
    if (st == ATTN_OK)
        st = attn_sdpa_backward(ctx, &cfg, c->q + q0 * H * c->D, c->k + k0 * Hkv * c->D,
                                c->v + k0 * Hkv * c->Dv, out, lse, c->dout + q0 * H * c->Dv,
                                r->dq + q0 * H * c->D, r->dk + k0 * Hkv * c->D,
                                r->dv + k0 * Hkv * c->Dv, NULL);
    flex &= st == ATTN_OK && strstr(attn_ctx_last_explain(ctx), "flex [") != NULL;
    if (st != ATTN_OK) {
        fprintf(stderr, "%s: sequence %zu alone: %s\n", what, b, attn_ctx_last_error(ctx));
        CHECK(false);
    }
    /* lse (1, H, T) to the packed (H, total_q) */
    for (size_t h = 0; h < H; h++)
        memcpy(r->lse + h * c->total_q + q0, lse + h * T, T * sizeof(float));
    /* a per-sequence bias's gradient: its own elements */
    for (size_t t = 0; t < c->nmods; t++) {
        const attn_score_mod *m = &c->mods[t];
        if (m->kind != ATTN_SCORE_BIAS || !m->strides[0] || !m->tensor_grad) continue;
        size_t nh = m->strides[1] ? H : 1;
        for (size_t h = 0; h < nh; h++)
            for (size_t i = 0; i < T; i++) {
                size_t at = b * m->strides[0] + h * m->strides[1] + i * m->strides[2];
                memcpy(r->grads[t] + at, grads[t] + at, S * sizeof(float));
            }
    }
    for (size_t t = 0; t < MAX_MODS; t++) free(grads[t]);
    free(lse), free(dsinks);
    attn_block_mask_free(mask);
    run.ran = st == ATTN_OK;
    run.flex = flex;
    return run;
}

/* Whether got and want agree on sequence b's elements: bitwise, or (near)
 * within TOL relative L2 of want, or of elements of size unit where want
 * is smaller. A sequence of one key has dq and dk 0 in exact arithmetic,
 * as dS = P (dP - delta) with P = 1: two float runs then differ by their
 * roundings of dP (from inputs of unit size, about 1e-6 each), which its
 * key's dk sums over the rows of every head of the group; the callers'
 * units cover that sum's growth. */
static bool seq_agrees_within(const float *got, const float *want, size_t at, size_t n,
                              bool bitwise, double unit) {
    if (bitwise) return !memcmp(got + at, want + at, n * sizeof(float));
    double num = 0, den = 0;
    for (size_t i = at; i < at + n; i++) {
        if (isinf(want[i]) || isinf(got[i])) {
            if (got[i] != want[i]) return false;
            continue;
        }
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    double floor = unit * unit * (double)n;
    return num <= TOL * TOL * (den > floor ? den : floor);
}

static bool seq_agrees(const float *got, const float *want, size_t at, size_t n, bool bitwise) {
    return seq_agrees_within(got, want, at, n, bitwise, 0.1);
}

/* Bounds on the sizes of the terms the gradients sum, for gradients that
 * cancel: a row's dS_ij = P_ij (dP_ij - delta_i) sums to 0 over its keys
 * (a row of one key has dS = 0, so are its dq and the dk of its key), a T5
 * bucket or a shared bias sums dS over rows, dsinks sums delta_i = dO_i .
 * O_i over rows. Float's error is then relative to the terms, not to the
 * sum. Per row (b, h, i): sum_j |dS_ij| <= 2 |dO_i| max_j |v_j| (= ds);
 * sum_j |dS_ij| |k_j| <= ds max_j |k_j| times the chain's gain (dq's, and
 * with max |q| dk's); the sink's weight times |O_i| |dO_i| (dsinks'). Each
 * is the L2 norm over rows. */
typedef struct terms {
    double ds, dq, dk, dsinks;
} terms;

static double norm_of(const float *x, size_t n) {
    double s = 0;
    for (size_t d = 0; d < n; d++) s += (double)x[d] * x[d];
    return sqrt(s);
}

static terms terms_of(const varlen_case *c, const double *out, const double *lse) {
    terms t = {0};
    size_t G = c->H / c->Hkv;
    double gain = 1.0 / sqrt((double)c->D); /* the default scale */
    for (size_t m = 0; m < c->nmods; m++) {
        if (c->mods[m].kind == ATTN_SCORE_SCALE && c->mods[m].value > 1.0) gain *= c->mods[m].value;
        if (c->mods[m].kind == ATTN_SCORE_CALLBACK) gain *= 1.2;
    }
    for (size_t b = 0; b < c->n; b++)
        for (size_t h = 0; h < c->H; h++) {
            double vmax = 0, kmax = 0, qmax = 0;
            for (size_t j = 0; j < c->tk[b]; j++) {
                size_t row = ((size_t)c->cu_kv[b] + j) * c->Hkv + h / G;
                double nv = norm_of(c->v + row * c->Dv, c->Dv), nk = norm_of(c->k + row * c->D, c->D);
                vmax = nv > vmax ? nv : vmax;
                kmax = nk > kmax ? nk : kmax;
            }
            for (size_t i = 0; i < c->tq[b]; i++) {
                size_t row = ((size_t)c->cu_q[b] + i) * c->H + h;
                double nq = norm_of(c->q + row * c->D, c->D);
                qmax = nq > qmax ? nq : qmax;
            }
            for (size_t i = 0; i < c->tq[b]; i++) {
                size_t row = ((size_t)c->cu_q[b] + i) * c->H + h;
                double ds = 2.0 * norm_of(c->dout + row * c->Dv, c->Dv) * vmax;
                t.ds += ds * ds;
                t.dq += (ds * kmax * gain) * (ds * kmax * gain);
                t.dk += (ds * qmax * gain) * (ds * qmax * gain);
                if (c->sinks) {
                    double l = lse[h * c->total_q + (size_t)c->cu_q[b] + i], o = 0;
                    for (size_t d = 0; d < c->Dv; d++)
                        o += fabs(out[row * c->Dv + d] * c->dout[row * c->Dv + d]);
                    double e = exp((double)c->sinks[h] - l) * o;
                    t.dsinks += e * e;
                }
            }
        }
    t.ds = sqrt(t.ds), t.dq = sqrt(t.dq), t.dk = sqrt(t.dk), t.dsinks = sqrt(t.dsinks);
    return t;
}

/* bf16 (top half of a float, rounded to nearest even) and back. */
static uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* The packed call in bf16 (attn_sdpa_forward_16: the 16-bit kernels, or
 * widened to the float ones) against the float call on the same
 * bf16-rounded inputs: out within bf16's rounding, lse within 1e-5. */
static void test_bf16(attn_ctx *ctx, varlen_case *c, const char *what) {
    size_t nq = c->total_q * c->H, nk = c->total_kv * c->Hkv;
    size_t n[3] = {nq * c->D, nk * c->D, nk * c->Dv};
    float *src[3] = {c->q, c->k, c->v}, *wide[3];
    uint16_t *half[3];
    for (int e = 0; e < 3; e++) {
        half[e] = malloc((n[e] ? n[e] : 1) * 2);
        wide[e] = malloc((n[e] ? n[e] : 1) * 4);
        for (size_t i = 0; i < n[e]; i++) wide[e][i] = from_bf16(half[e][i] = to_bf16(src[e][i]));
    }
    uint16_t *out16 = calloc(nq * c->Dv + 1, 2);
    float *out = calloc(nq * c->Dv + 1, 4), *lse16 = calloc(nq + 1, 4), *lse = calloc(nq + 1, 4);
    attn_sdpa_config cfg = config_of(c);
    attn_status st = attn_sdpa_forward_16(ctx, &cfg, ATTN_DTYPE_BF16, half[0], half[1], half[2],
                                          out16, lse16, NULL, NULL);
    if (st == ATTN_OK)
        st = attn_sdpa_forward(ctx, &cfg, wide[0], wide[1], wide[2], out, lse, NULL, NULL);
    if (st != ATTN_OK) fprintf(stderr, "%s: bf16: %s\n", what, attn_ctx_last_error(ctx));
    CHECK(st == ATTN_OK);
    double num = 0, den = 0, lnum = 0, lden = 0;
    bool inf_ok = true;
    for (size_t i = 0; i < nq * c->Dv; i++) {
        double d = (double)from_bf16(out16[i]) - out[i];
        num += d * d, den += (double)out[i] * out[i];
    }
    for (size_t i = 0; i < nq; i++) {
        if (isinf(lse[i]) || isinf(lse16[i])) {
            inf_ok &= lse[i] == lse16[i];
            continue;
        }
        lnum += ((double)lse16[i] - lse[i]) * ((double)lse16[i] - lse[i]);
        lden += 1.0; /* a logit's error is relative to the scores' size, about 1 */
    }
    bool ok = st == ATTN_OK && num <= 0x1p-16 * den && lnum <= 1e-10 * lden && inf_ok;
    if (!ok)
        fprintf(stderr, "%s: bf16 out relative L2 %.3g, lse %.3g%s\n", what,
                sqrt(num / (den > 0 ? den : 1)), sqrt(lnum / (lden > 0 ? lden : 1)),
                inf_ok ? "" : ", -inf rows differ");
    CHECK(ok);
    for (int e = 0; e < 3; e++) free(half[e]), free(wide[e]);
    free(out16), free(out), free(lse16), free(lse);
}

static size_t bitwise_seqs, near_seqs;

static void test_case(attn_ctx *one, attn_ctx *two, size_t index) {
    varlen_case c;
    attn_status built = make_case(one, &c, index);
    char what[320];
    int len = snprintf(what, sizeof what,
                       "case %zu (%s map %zux%zu of %zux%zu, blocks %zux%zu, H %zu/%zu D %zu/%zu "
                       "causal %d %s window %d (%lld, %lld) sinks %d mods",
                       index, map_names[c.kind], c.mb, c.mh, c.MQ, c.MK, c.bq, c.bkv, c.H, c.Hkv,
                       c.D, c.Dv, c.causal, c.top_left ? "top-left" : "bottom-right", c.window,
                       c.wl, c.wr, c.sinks != NULL);
    for (size_t t = 0; t < c.nmods && len > 0 && (size_t)len < sizeof what; t++)
        len += snprintf(what + len, sizeof what - (size_t)len, " %d", (int)c.mods[t].kind);
    for (size_t b = 0; b < c.n && len > 0 && (size_t)len < sizeof what; b++)
        len += snprintf(what + len, sizeof what - (size_t)len, "%s%zux%zu", b ? ", " : "; seqs ",
                        c.tq[b], c.tk[b]);
    if (len > 0 && (size_t)len < sizeof what) snprintf(what + len, sizeof what - (size_t)len, ")");
    if (built != ATTN_OK) {
        fprintf(stderr, "%s: building: %s\n", what, attn_ctx_last_error(one));
        CHECK(false);
        free_case(&c);
        return;
    }
    size_t nq = c.total_q * c.H, nk = c.total_kv * c.Hkv;
    results r1, r2, alone, ref;
    results_alloc(&c, &r1), results_alloc(&c, &r2), results_alloc(&c, &alone);
    results_alloc(&c, &ref);
    bool ok = run_packed(one, &c, &r1, what);
    CHECK(ok);
    /* the flex kernels run it, or the fused ones a map of row intervals */
    bool ran = strstr(r1.explain[0], "flex [") || strstr(r1.explain[0], "fused [");
    CHECK(!ok || ran);
    if (ok && (!ran || getenv("VARLEN_VERBOSE")))
        fprintf(stderr, "%s: explain: %s | %s\n", what, r1.explain[0], r1.explain[1]);
    double *want[5] = {0};
    if (ok && run_double(one, &c, &ref, want, what)) {
        check_rel("out", r1.out, want[0], nq * c.Dv, 0, what);
        /* lse is a logit: its error is relative to the scores' size, about 1 */
        check_rel("lse", r1.lse, want[1], nq, sqrt((double)nq), what);
        /* a row's dS sums to 0: a gradient summed over a row's keys (dq of
         * a row of one key, T5's bucket of all its keys) cancels, so the
         * floor is the size of what it sums, from dv's scale */
        /* gradients that cancel: relative to a tenth of their terms' size */
        terms size = terms_of(&c, want[0], want[1]);
        check_rel("dq", r1.dq, want[2], nq * c.D, 0.1 * size.dq, what);
        check_rel("dk", r1.dk, want[3], nk * c.D, 0.1 * size.dk, what);
        check_rel("dv", r1.dv, want[4], nk * c.Dv, 0, what);
        if (c.sinks) {
            double ds[4];
            for (size_t h = 0; h < c.H; h++) ds[h] = (double)ref.dsinks[h];
            check_rel("dsinks", r1.dsinks, ds, c.H, 0.1 * size.dsinks, what);
        }
        for (size_t t = 0; t < c.nmods; t++) {
            if (!c.mods[t].tensor_grad) continue;
            double *g = malloc(c.tensors[t].n * sizeof(double));
            bool untouched_alike = true;
            for (size_t e = 0; e < c.tensors[t].n; e++) {
                /* elements past the longest lengths stay as they were in both */
                bool nan1 = isnan(r1.grads[t][e]), nan2 = isnan(ref.grads[t][e]);
                untouched_alike &= nan1 == nan2;
                g[e] = nan2 ? 0.0 : (double)ref.grads[t][e];
                if (nan1) r1.grads[t][e] = 0.0f;
            }
            CHECK(untouched_alike);
            if (getenv("VARLEN_DUMP"))
                for (size_t e = 0; e < c.tensors[t].n; e++)
                    fprintf(stderr, "    [%zu] %.9g %.9g\n", e, r1.grads[t][e], g[e]);
            check_rel(c.mods[t].kind == ATTN_SCORE_BIAS ? "bias grad" : "T5 grad", r1.grads[t],
                      g, c.tensors[t].n, 0.1 * size.ds, what);
            free(g);
        }
    } else {
        CHECK(false);
    }
    for (int e = 0; e < 5; e++) free(want[e]);
    /* each sequence alone */
    for (size_t b = 0; ok && b < c.n; b++) {
        size_t T = c.tq[b], S = c.tk[b], q0 = (size_t)c.cu_q[b], k0 = (size_t)c.cu_kv[b];
        if (!T || !S) {
            /* no queries: its keys get no gradient; no keys: its rows are empty */
            bool zero = true;
            for (size_t e = k0 * c.Hkv * c.D; e < (k0 + S) * c.Hkv * c.D; e++)
                zero &= r1.dk[e] == 0.0f;
            for (size_t e = k0 * c.Hkv * c.Dv; e < (k0 + S) * c.Hkv * c.Dv; e++)
                zero &= r1.dv[e] == 0.0f;
            for (size_t e = q0 * c.H * c.Dv; e < (q0 + T) * c.H * c.Dv; e++)
                zero &= r1.out[e] == 0.0f;
            for (size_t e = q0 * c.H * c.D; e < (q0 + T) * c.H * c.D; e++)
                zero &= r1.dq[e] == 0.0f;
            for (size_t h = 0; h < c.H; h++)
                for (size_t i = 0; i < T; i++)
                    zero &= r1.lse[h * c.total_q + q0 + i] ==
                            (c.sinks ? c.sinks[h] : -INFINITY);
            if (!zero) fprintf(stderr, "%s: sequence %zu (%zux%zu) is not empty\n", what, b, T, S);
            CHECK(zero);
            continue;
        }
        seq_run run = run_alone(one, &c, b, &alone, what);
        if (!run.ran) continue;
        bool bitwise = run.flex && strstr(r1.explain[0], "flex [") &&
                       strstr(r1.explain[1], "flex [");
        /* one key: dq and dk are rounding noise, dk's summed over T G rows */
        double dq_unit = S == 1 ? 1.0 : 0.1;
        double dk_unit = S == 1 ? sqrt((double)(T * (c.H / c.Hkv))) : 0.1;
        bool agree[5] = {
            seq_agrees(r1.out, alone.out, q0 * c.H * c.Dv, T * c.H * c.Dv, bitwise),
            true,
            seq_agrees_within(r1.dq, alone.dq, q0 * c.H * c.D, T * c.H * c.D, bitwise, dq_unit),
            seq_agrees_within(r1.dk, alone.dk, k0 * c.Hkv * c.D, S * c.Hkv * c.D, bitwise,
                              dk_unit),
            seq_agrees(r1.dv, alone.dv, k0 * c.Hkv * c.Dv, S * c.Hkv * c.Dv, bitwise)};
        for (size_t h = 0; h < c.H; h++)
            agree[1] &= seq_agrees(r1.lse, alone.lse, h * c.total_q + q0, T, bitwise);
        bool same = agree[0] && agree[1] && agree[2] && agree[3] && agree[4];
        for (size_t t = 0; t < c.nmods; t++) {
            const attn_score_mod *m = &c.mods[t];
            if (m->kind != ATTN_SCORE_BIAS || !m->strides[0] || !m->tensor_grad) continue;
            for (size_t h = 0; h < (m->strides[1] ? c.H : 1); h++)
                for (size_t i = 0; i < T; i++)
                    same &= seq_agrees(r1.grads[t], alone.grads[t],
                                       b * m->strides[0] + h * m->strides[1] + i * m->strides[2],
                                       S, bitwise);
        }
        if (!same)
            fprintf(stderr, "%s: sequence %zu (%zux%zu) alone differs (%s; out %d lse %d dq %d "
                    "dk %d dv %d agree)\n",
                    what, b, T, S, bitwise ? "bitwise" : "near", agree[0], agree[1], agree[2],
                    agree[3], agree[4]);
        CHECK(same);
        if (bitwise) bitwise_seqs++;
        else near_seqs++;
    }
    /* two threads: the same bits */
    if (ok && run_packed(two, &c, &r2, what)) {
        for (size_t t = 0; t < c.nmods; t++)
            for (size_t e = 0; e < c.tensors[t].n; e++)
                if (isnan(r2.grads[t][e])) r2.grads[t][e] = 0.0f;
        bool same = !memcmp(r1.out, r2.out, nq * c.Dv * sizeof(float)) &&
                    !memcmp(r1.lse, r2.lse, nq * sizeof(float)) &&
                    !memcmp(r1.dq, r2.dq, nq * c.D * sizeof(float)) &&
                    !memcmp(r1.dk, r2.dk, nk * c.D * sizeof(float)) &&
                    !memcmp(r1.dv, r2.dv, nk * c.Dv * sizeof(float)) &&
                    (!c.sinks || !memcmp(r1.dsinks, r2.dsinks, c.H * sizeof(float)));
        for (size_t t = 0; t < c.nmods; t++)
            if (c.mods[t].tensor_grad)
                same &= !memcmp(r1.grads[t], r2.grads[t], c.tensors[t].n * sizeof(float));
        if (!same) fprintf(stderr, "%s: 1 and 2 threads differ\n", what);
        CHECK(same);
    } else if (ok) {
        CHECK(false);
    }
    if (ok) test_bf16(two, &c, what);
    results_free(&r1), results_free(&r2), results_free(&alone), results_free(&ref);
    free_case(&c);
}

/* A map shorter than a sequence, or of another batch, is refused naming it. */
static void test_bad_maps(attn_ctx *ctx) {
    size_t H = 2, D = 16, total_q = 5 + 40 + 1, total_kv = 30 + 20 + 7;
    int32_t cu_q[4] = {0, 5, 45, 46}, cu_kv[4] = {0, 30, 50, 57};
    float *q = alloc_randn(total_q * H * D, 1), *k = alloc_randn(total_kv * H * D, 1);
    float *v = alloc_randn(total_kv * H * D, 1), *out = calloc(total_q * H * D, 4);
    float *lse = calloc(H * total_q, 4);
    attn_mask *all = NULL;
    CHECK_STATUS(attn_mask_new_all(ctx, &all), ATTN_OK);
    attn_block_mask *shorter = NULL, *wide = NULL, *fits = NULL;
    attn_block_mask_config q_short = {1, 1, 39, 30, 16, 16}, batch4 = {4, 1, 40, 30, 16, 16};
    attn_block_mask_config exact = {3, H, 40, 30, 16, 16};
    CHECK_STATUS(attn_block_mask_from_mask(ctx, &q_short, all, &shorter), ATTN_OK);
    CHECK_STATUS(attn_block_mask_from_mask(ctx, &batch4, all, &wide), ATTN_OK);
    uint8_t *bits = malloc(3 * H * 40 * 30);
    for (size_t e = 0; e < 3 * H * 40 * 30; e++) bits[e] = uniform() < 0.6;
    size_t bit_strides[4] = {H * 40 * 30, 40 * 30, 30, 1};
    CHECK_STATUS(attn_block_mask_from_bool(ctx, &exact, bits, bit_strides, &fits), ATTN_OK);
    free(bits);
    attn_sdpa_config cfg = {.batch = 3, .heads = H, .q_tokens = 40, .kv_tokens = 30,
                            .head_dim = D, .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv,
                            .block_mask = shorter};
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "sequence 1 (40 queries, 20 keys)");
    CHECK_MESSAGE(ctx, "q_len 39, kv_len 30");
    cfg.block_mask = wide;
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "batch 4");
    /* the map of exactly the longest lengths runs; so it does where the
     * call's longest lengths are given larger than any sequence's (the
     * kernels' blocks then reach past the map's), with the same bits */
    cfg.block_mask = fits;
    float *dout = alloc_randn(total_q * H * D, 1), *grads[2][3], *outs[2], *lses[2];
    for (int run = 0; run < 2; run++) {
        outs[run] = calloc(total_q * H * D, 4), lses[run] = calloc(H * total_q, 4);
        grads[run][0] = calloc(total_q * H * D, 4);
        grads[run][1] = calloc(total_kv * H * D, 4), grads[run][2] = calloc(total_kv * H * D, 4);
        cfg.q_tokens = run ? 100 : 40, cfg.kv_tokens = run ? 90 : 30;
        CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, outs[run], lses[run], NULL, NULL),
                     ATTN_OK);
        CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, outs[run], lses[run], dout,
                                        grads[run][0], grads[run][1], grads[run][2], NULL),
                     ATTN_OK);
        CHECK(strstr(attn_ctx_last_explain(ctx), "flex [") != NULL);
    }
    CHECK(!memcmp(outs[0], outs[1], total_q * H * D * 4) &&
          !memcmp(lses[0], lses[1], H * total_q * 4) &&
          !memcmp(grads[0][0], grads[1][0], total_q * H * D * 4) &&
          !memcmp(grads[0][1], grads[1][1], total_kv * H * D * 4) &&
          !memcmp(grads[0][2], grads[1][2], total_kv * H * D * 4));
    for (int run = 0; run < 2; run++) {
        free(outs[run]), free(lses[run]);
        for (int e = 0; e < 3; e++) free(grads[run][e]);
    }
    attn_block_mask_free(shorter), attn_block_mask_free(wide), attn_block_mask_free(fits);
    attn_mask_free(all);
    free(q), free(k), free(v), free(out), free(lse), free(dout);
}

/* A chain of softcap then ALiBi at every sequence's own positions (top-left:
 * query i at key position i) is the fixed features over packed sequences
 * too: the fused kernels run it, with the features' bits; bottom-right,
 * where sequences' S - T differ, one ALiBi offset cannot say it: flex. */
static void test_fixed_features_packed(attn_ctx *ctx) {
    size_t H = 2, D = 16;
    int32_t cu_q[4] = {0, 7, 57, 58}, cu_kv[4] = {0, 20, 70, 90};
    size_t tq = 58, tk = 90;
    float *q = alloc_randn(tq * H * D, 1), *k = alloc_randn(tk * H * D, 1);
    float *v = alloc_randn(tk * H * D, 1), *dout = alloc_randn(tq * H * D, 1), slopes[2];
    for (size_t h = 0; h < H; h++) slopes[h] = (float)(0.05 + 0.3 * uniform());
    float *out[2], *lse[2], *dq[2], *dk[2], *dv[2];
    for (int r = 0; r < 2; r++) {
        out[r] = calloc(tq * H * D, 4), lse[r] = calloc(H * tq, 4), dq[r] = calloc(tq * H * D, 4);
        dk[r] = calloc(tk * H * D, 4), dv[r] = calloc(tk * H * D, 4);
    }
    attn_sdpa_config fixed = {.batch = 3, .heads = H, .q_tokens = 50, .kv_tokens = 50,
                              .head_dim = D, .causal = true, .align = ATTN_ALIGN_TOP_LEFT,
                              .softcap = 20.0, .alibi_slopes = slopes, .cu_seqlens_q = cu_q,
                              .cu_seqlens_kv = cu_kv};
    attn_score_mod chain[2] = {{.kind = ATTN_SCORE_SOFTCAP, .value = 20.0},
                               {.kind = ATTN_SCORE_ALIBI, .tensor = slopes}};
    attn_sdpa_config said = fixed;
    said.softcap = 0.0, said.alibi_slopes = NULL;
    said.score_mods = chain, said.score_mod_count = 2;
    for (int r = 0; r < 2; r++) {
        const attn_sdpa_config *cfg = r ? &said : &fixed;
        CHECK_STATUS(attn_sdpa_forward(ctx, cfg, q, k, v, out[r], lse[r], NULL, NULL), ATTN_OK);
        CHECK(strstr(attn_ctx_last_explain(ctx), "fused [") != NULL);
        CHECK_STATUS(attn_sdpa_backward(ctx, cfg, q, k, v, out[r], lse[r], dout, dq[r], dk[r],
                                        dv[r], NULL),
                     ATTN_OK);
    }
    CHECK(!memcmp(out[0], out[1], tq * H * D * 4) && !memcmp(lse[0], lse[1], H * tq * 4) &&
          !memcmp(dq[0], dq[1], tq * H * D * 4) && !memcmp(dk[0], dk[1], tk * H * D * 4) &&
          !memcmp(dv[0], dv[1], tk * H * D * 4));
    said.align = ATTN_ALIGN_BOTTOM_RIGHT; /* S - T: 13, 0, 19 */
    CHECK_STATUS(attn_sdpa_forward(ctx, &said, q, k, v, out[1], lse[1], NULL, NULL), ATTN_OK);
    CHECK(strstr(attn_ctx_last_explain(ctx), "flex [") != NULL);
    for (int r = 0; r < 2; r++) free(out[r]), free(lse[r]), free(dq[r]), free(dk[r]), free(dv[r]);
    free(q), free(k), free(v), free(dout);
}

int main(int argc, char **argv) {
    const char *env = getenv("ATTN_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (ATTN_TEST_SEED to repeat)\n", (unsigned long long)seed);
    rng_state = seed;
    attn_ctx *one, *two;
    attn_ctx_config c1 = {.num_threads = 1}, c2 = {.num_threads = 2};
    if (attn_ctx_new(&c1, &one) != ATTN_OK || attn_ctx_new(&c2, &two) != ATTN_OK) return 1;
    size_t cases = argc == 3 && !strcmp(argv[1], "--cases") ? strtoul(argv[2], NULL, 10) : 60;
    for (size_t i = 0; i < cases; i++) test_case(one, two, i);
    test_bad_maps(two);
    test_fixed_features_packed(two);
    printf("sequences alone: %zu bit for bit (flex both ways), %zu within %g\n", bitwise_seqs,
           near_seqs, TOL);
    attn_ctx_free(one);
    attn_ctx_free(two);
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
