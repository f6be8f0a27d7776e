/*
 * test_kv_cache.c — the KV cache and attn_kv_cache_attend: the paged layout
 * (random page sizes) bit for bit equal to the contiguous one, on 1, 2 and
 * 3 threads, over random head counts (GQA), head dims, windows and ragged
 * batches (sequences with no new tokens), in prefill + decode runs; every
 * kernel set against a float64 oracle written here from the definition;
 * overflow errors that change nothing; reset and reset_sequence; errors.
 * Inputs are fresh random numbers each run (the seed is printed).
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
static size_t rand_below(size_t n) { return (size_t)(next_u64() % n); }
/* roughly N(0, 1): the sum of 4 uniforms, scaled */
static float rand_normal(void) {
    double s = 0.0;
    for (int i = 0; i < 4; i++) s += (double)(next_u64() >> 11) / 9007199254740992.0;
    return (float)((s - 2.0) * 1.7320508);
}
static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = rand_normal();
}

enum { LAYERS = 2, BATCH = 3, MAX_LEN = 720, MAX_RUNNERS = 12 };

/* One cache under test and the ctx it runs on. */
typedef struct runner {
    const char *name;
    attn_ctx *ctx;
    attn_kv_cache *cache;
    attn_kv_layout layout;
    size_t page_size, threads;
    attn_kernels kernels;
    float *out;
} runner;

typedef struct scenario {
    size_t kv_heads, q_heads, head_dim, row, windows[LAYERS];
    float *hist_k[LAYERS], *hist_v[LAYERS]; /* (BATCH, MAX_LEN, row): every token, the oracle's */
    size_t len[LAYERS][BATCH];
    runner runners[MAX_RUNNERS];
    size_t num_runners;
    double worst_ref, worst_fast;
} scenario;

static bool add_runner(scenario *sc, const char *name, attn_kernels kernels, size_t threads,
                       attn_kv_layout layout, size_t page_size, size_t num_pages) {
    if (!attn_kernels_supported(kernels)) return false;
    runner *r = &sc->runners[sc->num_runners];
    *r = (runner){.name = name, .layout = layout, .page_size = page_size, .threads = threads,
                  .kernels = kernels};
    attn_ctx_config cc = {.num_threads = threads, .kernels = kernels};
    CHECK_STATUS(attn_ctx_new(&cc, &r->ctx), ATTN_OK);
    attn_kv_cache_config cfg = {.num_layers = LAYERS, .batch = BATCH, .kv_heads = sc->kv_heads,
                                .head_dim = sc->head_dim, .max_len = MAX_LEN, .layout = layout,
                                .page_size = page_size, .num_pages = num_pages,
                                .windows = sc->windows};
    CHECK_STATUS(attn_kv_cache_new(r->ctx, &cfg, &r->cache), ATTN_OK);
    sc->num_runners++;
    return true;
}

/* Single-threaded test code that ThreadSanitizer need not watch: its scalar
 * loops took most of this test's 175 s under CI's TSan build. */
#if defined(__has_attribute)
#if __has_attribute(no_sanitize)
#define NOT_THREAD_SANITIZED __attribute__((no_sanitize("thread")))
#endif
#endif
#ifndef NOT_THREAD_SANITIZED
#define NOT_THREAD_SANITIZED
#endif

/* The float64 oracle: row r of sequence s (at position len + r) of layer.
 * Returns the largest |score| of the row (after scale). */
NOT_THREAD_SANITIZED
static double oracle_row(const scenario *sc, size_t layer, size_t s, size_t r, const float *q,
                         const float *k_new, const float *v_new, double scale, double *y) {
    size_t H = sc->q_heads, D = sc->head_dim, G = H / sc->kv_heads, len = sc->len[layer][s];
    size_t pos = len + r, W = sc->windows[layer];
    size_t lo = W && pos + 1 > W ? pos + 1 - W : 0;
    double *w = malloc((pos + 1) * sizeof(double)), top = 0.0;
    for (size_t h = 0; h < H; h++) {
        size_t off = (h / G) * D;
        double mx = -INFINITY, sum = 0.0;
        for (size_t j = lo; j <= pos; j++) {
            const float *k = j < len ? sc->hist_k[layer] + (s * MAX_LEN + j) * sc->row
                                     : k_new + (j - len) * sc->row;
            double d = 0.0;
            for (size_t e = 0; e < D; e++) d += (double)q[h * D + e] * k[off + e];
            w[j] = d * scale;
            if (w[j] > mx) mx = w[j];
            if (fabs(w[j]) > top) top = fabs(w[j]);
        }
        for (size_t e = 0; e < D; e++) y[h * D + e] = 0.0;
        for (size_t j = lo; j <= pos; j++) {
            const float *v = j < len ? sc->hist_v[layer] + (s * MAX_LEN + j) * sc->row
                                     : v_new + (j - len) * sc->row;
            double p = exp(w[j] - mx);
            sum += p;
            for (size_t e = 0; e < D; e++) y[h * D + e] += p * v[off + e];
        }
        for (size_t e = 0; e < D; e++) y[h * D + e] /= sum;
    }
    free(w);
    return top;
}

/* One attend of layer with new_lens on every runner: the same bits from
 * every layout and thread count of one kernel set, each near the oracle. */
static void step(scenario *sc, size_t layer, const size_t *new_lens) {
    size_t H = sc->q_heads, D = sc->head_dim, rows = 0;
    for (size_t s = 0; s < BATCH; s++) rows += new_lens[s];
    float *q = malloc((rows * H * D + 1) * sizeof(float));
    float *kn = malloc((rows * sc->row + 1) * sizeof(float));
    float *vn = malloc((rows * sc->row + 1) * sizeof(float));
    fill(q, rows * H * D);
    fill(kn, rows * sc->row);
    fill(vn, rows * sc->row);
    double scale = (next_u64() & 1) ? 0.0 : 0.3 + 0.2 * (double)rand_below(5);
    for (size_t i = 0; i < sc->num_runners; i++) {
        runner *r = &sc->runners[i];
        free(r->out);
        r->out = malloc((rows * H * D + 1) * sizeof(float));
        attn_kv_attend_args a = {.layer = layer, .new_lens = new_lens, .q_heads = H,
                                 .scale = scale, .q = q, .k_new = kn, .v_new = vn, .out = r->out};
        attn_status st = attn_kv_cache_attend(r->cache, &a);
        CHECK_STATUS(st, ATTN_OK);
        if (st != ATTN_OK) fprintf(stderr, "%s: %s\n", r->name, attn_ctx_last_error(r->ctx));
    }
    /* bitwise: every runner equals the first of its kernel set */
    for (size_t i = 1; i < sc->num_runners; i++)
        for (size_t j = 0; j < i; j++)
            if (sc->runners[j].kernels == sc->runners[i].kernels) {
                bool same = memcmp(sc->runners[i].out, sc->runners[j].out,
                                   rows * H * D * sizeof(float)) == 0;
                CHECK(same);
                if (!same)
                    fprintf(stderr, "%s differs from %s (layer %zu, window %zu)\n",
                            sc->runners[i].name, sc->runners[j].name, layer, sc->windows[layer]);
                break;
            }
    /* the oracle */
    double *y = malloc(H * D * sizeof(double));
    double use_scale = scale > 0.0 ? scale : 1.0 / sqrt((double)D);
    for (size_t s = 0, at = 0; s < BATCH; at += new_lens[s], s++)
        for (size_t r = 0; r < new_lens[s]; r++) {
            /* float32 scores are off by ~1e-7 of their size, which the
             * softmax passes on: the fast kernels' error is measured
             * relative to 1 + the largest |score| */
            double top = oracle_row(sc, layer, s, r, q + (at + r) * H * D, kn + at * sc->row,
                                    vn + at * sc->row, use_scale, y);
            for (size_t i = 0; i < sc->num_runners; i++) {
                const float *o = sc->runners[i].out + (at + r) * H * D;
                double worst = 0.0;
                for (size_t e = 0; e < H * D; e++) {
                    double d = fabs(o[e] - y[e]);
                    if (!(d <= worst)) worst = d; /* NaN too */
                }
                bool ref = sc->runners[i].kernels == ATTN_KERNELS_REFERENCE;
                if (!ref) worst /= 1.0 + top;
                double *track = ref ? &sc->worst_ref : &sc->worst_fast;
                if (!(worst <= *track)) *track = worst;
            }
        }
    free(y);
    /* the oracle's history */
    for (size_t s = 0, at = 0; s < BATCH; at += new_lens[s], s++) {
        size_t len = sc->len[layer][s];
        memcpy(sc->hist_k[layer] + (s * MAX_LEN + len) * sc->row, kn + at * sc->row,
               new_lens[s] * sc->row * sizeof(float));
        memcpy(sc->hist_v[layer] + (s * MAX_LEN + len) * sc->row, vn + at * sc->row,
               new_lens[s] * sc->row * sizeof(float));
        sc->len[layer][s] += new_lens[s];
        for (size_t i = 0; i < sc->num_runners; i++) {
            size_t got = 0;
            CHECK_STATUS(attn_kv_cache_length(sc->runners[i].cache, layer, s, &got), ATTN_OK);
            CHECK(got == sc->len[layer][s]);
        }
    }
    free(q);
    free(kn);
    free(vn);
}

/* Keys and values appended without attention (attn_kv_cache_append). */
static void append_step(scenario *sc, size_t layer, const size_t *new_lens) {
    size_t rows = 0;
    for (size_t s = 0; s < BATCH; s++) rows += new_lens[s];
    float *kn = malloc((rows * sc->row + 1) * sizeof(float));
    float *vn = malloc((rows * sc->row + 1) * sizeof(float));
    fill(kn, rows * sc->row);
    fill(vn, rows * sc->row);
    for (size_t i = 0; i < sc->num_runners; i++)
        CHECK_STATUS(attn_kv_cache_append(sc->runners[i].cache, layer, new_lens, 0, kn, vn),
                     ATTN_OK);
    for (size_t s = 0, at = 0; s < BATCH; at += new_lens[s], s++) {
        size_t len = sc->len[layer][s];
        memcpy(sc->hist_k[layer] + (s * MAX_LEN + len) * sc->row, kn + at * sc->row,
               new_lens[s] * sc->row * sizeof(float));
        memcpy(sc->hist_v[layer] + (s * MAX_LEN + len) * sc->row, vn + at * sc->row,
               new_lens[s] * sc->row * sizeof(float));
        sc->len[layer][s] += new_lens[s];
    }
    free(kn);
    free(vn);
}

static void free_scenario(scenario *sc) {
    for (size_t i = 0; i < sc->num_runners; i++) {
        attn_kv_cache_free(sc->runners[i].cache);
        attn_ctx_free(sc->runners[i].ctx);
        free(sc->runners[i].out);
    }
    for (size_t l = 0; l < LAYERS; l++) {
        free(sc->hist_k[l]);
        free(sc->hist_v[l]);
    }
}

static size_t random_page_size(void) {
    static const size_t sizes[] = {1, 2, 3, 5, 7, 16, 17, 32, 64};
    return sizes[rand_below(sizeof sizes / sizeof sizes[0])];
}

/* Prefill (one long prompt through the fused path, a shorter one, an idle
 * sequence), then decode steps and small chunks of 1..20 tokens with idle
 * sequences, a reset_sequence on the way; on both layers. */
static void run_scenario(size_t kv_heads, size_t group, size_t head_dim, size_t window,
                         bool every_kernel_set) {
    scenario sc = {.kv_heads = kv_heads, .q_heads = kv_heads * group, .head_dim = head_dim};
    clock_t started = clock();
    sc.row = kv_heads * head_dim;
    sc.windows[0] = 0;
    sc.windows[1] = window;
    for (size_t l = 0; l < LAYERS; l++) {
        sc.hist_k[l] = malloc(BATCH * MAX_LEN * sc.row * sizeof(float));
        sc.hist_v[l] = malloc(BATCH * MAX_LEN * sc.row * sizeof(float));
    }
    size_t ps1 = random_page_size(), ps2 = random_page_size();
    add_runner(&sc, "fast contiguous 1 thread", ATTN_KERNELS_AUTO, 1, ATTN_KV_CONTIGUOUS, 0, 0);
    add_runner(&sc, "fast paged 1 thread", ATTN_KERNELS_AUTO, 1, ATTN_KV_PAGED, ps1, 0);
    add_runner(&sc, "fast paged 2 threads", ATTN_KERNELS_AUTO, 2, ATTN_KV_PAGED, ps2, 0);
    add_runner(&sc, "fast contiguous 3 threads", ATTN_KERNELS_AUTO, 3, ATTN_KV_CONTIGUOUS, 0, 0);
    add_runner(&sc, "fast paged 3 threads", ATTN_KERNELS_AUTO, 3, ATTN_KV_PAGED, 1, 0);
    if (every_kernel_set) {
        add_runner(&sc, "reference contiguous", ATTN_KERNELS_REFERENCE, 2, ATTN_KV_CONTIGUOUS, 0, 0);
        add_runner(&sc, "reference paged", ATTN_KERNELS_REFERENCE, 1, ATTN_KV_PAGED, ps1, 0);
        add_runner(&sc, "portable contiguous", ATTN_KERNELS_PORTABLE, 2, ATTN_KV_CONTIGUOUS, 0, 0);
        add_runner(&sc, "portable paged", ATTN_KERNELS_PORTABLE, 1, ATTN_KV_PAGED, ps2, 0);
        add_runner(&sc, "avx2 contiguous", ATTN_KERNELS_AVX2, 2, ATTN_KV_CONTIGUOUS, 0, 0);
        add_runner(&sc, "avx2 paged", ATTN_KERNELS_AVX2, 3, ATTN_KV_PAGED, ps1, 0);
    }
    printf("kv_heads %zu, q_heads %zu, head_dim %zu, window %zu, page sizes %zu %zu: %zu runners\n",
           kv_heads, sc.q_heads, head_dim, window, ps1, ps2, sc.num_runners);

    size_t prompt[BATCH] = {300 + rand_below(40), 0, 5 + rand_below(50)};
    for (size_t l = 0; l < LAYERS; l++) step(&sc, l, prompt);
    for (int t = 0; t < 14; t++) {
        size_t lens[BATCH];
        for (size_t s = 0; s < BATCH; s++) {
            size_t kind = rand_below(6);
            lens[s] = kind == 0 ? 0 : kind < 4 ? 1 : 1 + rand_below(20);
        }
        if (t == 2) lens[1] = 70; /* a second prompt, from an empty cache */
        for (size_t l = 0; l < LAYERS; l++) {
            if (t == 5) append_step(&sc, l, lens); /* a prefix from elsewhere */
            step(&sc, l, lens);
        }
        if (t == 8) {
            /* sequence 2 starts over everywhere */
            for (size_t i = 0; i < sc.num_runners; i++)
                CHECK_STATUS(attn_kv_cache_reset_sequence(sc.runners[i].cache, 2), ATTN_OK);
            for (size_t l = 0; l < LAYERS; l++) sc.len[l][2] = 0;
        }
    }
    /* one token against the longest cache on 3 threads splits it into chunks */
    size_t one[BATCH] = {1, 0, 0};
    for (size_t l = 0; l < LAYERS; l++) step(&sc, l, one);
    printf("  worst |attn - float64 oracle|: reference %.3g, fast %.3g x (1 + max |score|) "
           "(%.1f s)\n", sc.worst_ref,
           sc.worst_fast, (double)(clock() - started) / CLOCKS_PER_SEC);
    CHECK(sc.worst_ref <= 1e-6);
    CHECK(sc.worst_fast <= 3e-6);
    free_scenario(&sc);
}

/* Overflow: past max_len, and out of pages; nothing written, nothing
 * appended; the caches go on as before. */
static void test_overflow(void) {
    attn_ctx *ctx;
    CHECK_STATUS(attn_ctx_new(&(attn_ctx_config){.num_threads = 2}, &ctx), ATTN_OK);
    enum { KH = 2, D = 8, H = 4, ML = 40 };
    attn_kv_cache *paged, *contig;
    attn_kv_cache_config cfg = {.num_layers = 1, .batch = 2, .kv_heads = KH, .head_dim = D,
                                .max_len = ML, .layout = ATTN_KV_PAGED, .page_size = 4,
                                .num_pages = 6};
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &paged), ATTN_OK);
    cfg.layout = ATTN_KV_CONTIGUOUS;
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &contig), ATTN_OK);
    float q[ML * H * D], k[ML * KH * D], v[ML * KH * D], out[ML * H * D], out2[ML * H * D];
    fill(q, ML * H * D);
    fill(k, ML * KH * D);
    fill(v, ML * KH * D);
    size_t lens[2] = {10, 9}; /* 3 + 3 pages of 4: the whole pool */
    attn_kv_attend_args a = {.new_lens = lens, .q_heads = H, .q = q, .k_new = k, .v_new = v,
                             .out = out};
    CHECK_STATUS(attn_kv_cache_attend(paged, &a), ATTN_OK);
    a.out = out2;
    CHECK_STATUS(attn_kv_cache_attend(contig, &a), ATTN_OK);
    CHECK(memcmp(out, out2, 19 * H * D * sizeof(float)) == 0);
    /* seq 0 fits its page (10 -> 12), seq 1 needs a 4th page: none left */
    size_t more[2] = {2, 4};
    for (size_t i = 0; i < ML * H * D; i++) out[i] = 7.0f;
    a.new_lens = more;
    a.out = out;
    CHECK_STATUS(attn_kv_cache_attend(paged, &a), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "sequence 1");
    CHECK_MESSAGE(ctx, "length 9");
    CHECK_MESSAGE(ctx, "4 new tokens");
    CHECK_MESSAGE(ctx, "6 pages");
    CHECK(out[0] == 7.0f && out[6 * H * D - 1] == 7.0f);
    size_t len = 0;
    CHECK_STATUS(attn_kv_cache_length(paged, 0, 0, &len), ATTN_OK);
    CHECK(len == 10);
    CHECK_STATUS(attn_kv_cache_length(paged, 0, 1, &len), ATTN_OK);
    CHECK(len == 9);
    /* past max_len */
    size_t far[2] = {31, 0};
    a.new_lens = far;
    CHECK_STATUS(attn_kv_cache_attend(contig, &a), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "sequence 0");
    CHECK_MESSAGE(ctx, "10 tokens");
    CHECK_MESSAGE(ctx, "31 new");
    CHECK_MESSAGE(ctx, "max_len 40");
    CHECK(out[0] == 7.0f);
    CHECK_STATUS(attn_kv_cache_length(contig, 0, 0, &len), ATTN_OK);
    CHECK(len == 10);
    CHECK_STATUS(attn_kv_cache_append(contig, 0, far, 0, k, v), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "max_len 40");
    CHECK_STATUS(attn_kv_cache_append(paged, 0, more, 0, k, v), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "needs 1 more");
    CHECK_STATUS(attn_kv_cache_append(paged, 1, more, 0, k, v), ATTN_ERR_INVALID);
    CHECK_STATUS(attn_kv_cache_append(paged, 0, NULL, 1, NULL, v), ATTN_ERR_NULL);
    CHECK_STATUS(attn_kv_cache_length(paged, 0, 1, &len), ATTN_OK);
    CHECK(len == 9);
    /* what fits still runs, the same in both */
    size_t fit[2] = {2, 3};
    a.new_lens = fit;
    CHECK_STATUS(attn_kv_cache_attend(paged, &a), ATTN_OK);
    a.out = out2;
    CHECK_STATUS(attn_kv_cache_attend(contig, &a), ATTN_OK);
    CHECK(memcmp(out, out2, 5 * H * D * sizeof(float)) == 0);
    /* reset gives the pages back: the pool holds a full 24 tokens again */
    CHECK_STATUS(attn_kv_cache_reset(paged), ATTN_OK);
    CHECK_STATUS(attn_kv_cache_length(paged, 0, 0, &len), ATTN_OK);
    CHECK(len == 0);
    size_t all[2] = {24, 0};
    a.new_lens = all;
    a.out = out;
    CHECK_STATUS(attn_kv_cache_attend(paged, &a), ATTN_OK);
    /* reset_sequence gives back that sequence's pages only */
    size_t one[2] = {0, 1};
    a.new_lens = one;
    CHECK_STATUS(attn_kv_cache_attend(paged, &a), ATTN_ERR_OVERFLOW);
    CHECK_STATUS(attn_kv_cache_reset_sequence(paged, 0), ATTN_OK);
    CHECK_STATUS(attn_kv_cache_attend(paged, &a), ATTN_OK);
    CHECK_STATUS(attn_kv_cache_reset_sequence(paged, 2), ATTN_ERR_INVALID);
    attn_kv_cache_free(paged);
    attn_kv_cache_free(contig);
    attn_ctx_free(ctx);
}

/* A window layer with pages: a ring of ceil(W / page) + 1 pages per
 * sequence, whatever the length; the default pool holds exactly that. */
static void test_window_ring(void) {
    attn_ctx *ctx;
    CHECK_STATUS(attn_ctx_new(NULL, &ctx), ATTN_OK);
    size_t windows[1] = {10};
    attn_kv_cache_config cfg = {.num_layers = 1, .batch = 1, .kv_heads = 1, .head_dim = 4,
                                .max_len = 1000, .layout = ATTN_KV_PAGED, .page_size = 4,
                                .windows = windows};
    attn_kv_cache *c;
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_OK);
    attn_kv_cache_config got = attn_kv_cache_get_config(c);
    CHECK(got.num_pages == 4 && got.page_size == 4 && got.windows && got.windows[0] == 10);
    CHECK(attn_kv_cache_bytes(c) == 2 * 4 * 4 * 4 * sizeof(float));
    float q[4], k[4], v[4], out[4];
    for (int t = 0; t < 999; t++) {
        fill(q, 4);
        fill(k, 4);
        fill(v, 4);
        attn_kv_attend_args a = {.new_tokens = 1, .q_heads = 1, .q = q, .k_new = k, .v_new = v,
                                 .out = out};
        attn_status st = attn_kv_cache_attend(c, &a);
        if (st != ATTN_OK) {
            CHECK_STATUS(st, ATTN_OK);
            break;
        }
    }
    attn_kv_cache_free(c);
    cfg.layout = ATTN_KV_CONTIGUOUS;
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_OK);
    CHECK(attn_kv_cache_bytes(c) == 2 * 10 * 4 * sizeof(float));
    attn_kv_cache_free(c);
    attn_ctx_free(ctx);
}

static void test_errors(void) {
    attn_ctx *ctx;
    CHECK_STATUS(attn_ctx_new(NULL, &ctx), ATTN_OK);
    attn_kv_cache *c = NULL;
    attn_kv_cache_config cfg = {.num_layers = 2, .batch = 1, .kv_heads = 2, .head_dim = 4,
                                .max_len = 16};
    CHECK_STATUS(attn_kv_cache_new(NULL, &cfg, &c), ATTN_ERR_NULL);
    CHECK_STATUS(attn_kv_cache_new(ctx, NULL, &c), ATTN_ERR_NULL);
    cfg.head_dim = 0;
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "head_dim (0)");
    cfg.head_dim = 4;
    cfg.layout = (attn_kv_layout)7;
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_ERR_INVALID);
    cfg.layout = ATTN_KV_CONTIGUOUS;
    cfg.max_len = SIZE_MAX / 4;
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_ERR_OVERFLOW);
    cfg.max_len = 16;
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_OK);
    CHECK(attn_kv_cache_bytes(c) == 2 * 2 * 16 * 8 * sizeof(float));
    float x[64] = {0}, out[64];
    attn_kv_attend_args a = {.new_tokens = 1, .q_heads = 3, .q = x, .k_new = x, .v_new = x,
                             .out = out};
    CHECK_STATUS(attn_kv_cache_attend(c, NULL), ATTN_ERR_NULL);
    CHECK_STATUS(attn_kv_cache_attend(NULL, &a), ATTN_ERR_NULL);
    CHECK_STATUS(attn_kv_cache_attend(c, &a), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "q_heads (3)");
    a.q_heads = 4;
    a.layer = 2;
    CHECK_STATUS(attn_kv_cache_attend(c, &a), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "layer 2");
    a.layer = 1;
    a.scale = NAN;
    CHECK_STATUS(attn_kv_cache_attend(c, &a), ATTN_ERR_INVALID);
    a.scale = 0.0;
    a.q = NULL;
    CHECK_STATUS(attn_kv_cache_attend(c, &a), ATTN_ERR_NULL);
    a.q = x;
    size_t len = 5;
    CHECK_STATUS(attn_kv_cache_length(c, 1, 0, &len), ATTN_OK);
    CHECK(len == 0);
    CHECK_STATUS(attn_kv_cache_length(c, 2, 0, &len), ATTN_ERR_INVALID);
    CHECK_STATUS(attn_kv_cache_length(c, 0, 1, &len), ATTN_ERR_INVALID);
    /* no new tokens: nothing to do */
    a.new_tokens = 0;
    CHECK_STATUS(attn_kv_cache_attend(c, &a), ATTN_OK);
    attn_kv_cache_free(c);
    attn_kv_cache_free(NULL);
    attn_ctx_free(ctx);
}

/* usage: test_kv_cache [random_scenarios] (6, one per window; CI's
 * ThreadSanitizer run takes 2, where each cost 1-63 s) */
int main(int argc, char **argv) {
    int random_scenarios = argc > 1 ? atoi(argv[1]) : 6;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    const char *env = getenv("ATTN_TEST_SEED");
    if (env) seed = strtoull(env, NULL, 10);
    printf("seed %llu (ATTN_TEST_SEED to repeat)\n", (unsigned long long)seed);
    rng_state = seed * 2654435761u + 1;
    test_errors();
    test_overflow();
    test_window_ring();
    static const size_t dims[] = {5, 16, 32, 64, 128};
    static const size_t windows[] = {1, 3, 16, 40, 300, 2000};
    const size_t num_windows = sizeof windows / sizeof windows[0];
    /* Llama-like heads: big enough that one token's chunks run in parallel */
    run_scenario(8, 4, 128, 0, false);
    for (int i = 0; i < random_scenarios; i++) {
        size_t kv_heads = 1 + rand_below(3), group = 1 + rand_below(4);
        size_t D = dims[rand_below(5)];
        /* the windows spread over the scenarios, the widest first */
        size_t spread = (size_t)i * num_windows / (size_t)random_scenarios % num_windows;
        size_t W = windows[num_windows - 1 - spread];
        run_scenario(kv_heads, group, D, W, true);
    }
    return check_summary();
}
