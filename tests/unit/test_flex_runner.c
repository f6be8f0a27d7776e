/*
 * test_flex_runner.c — the runner's checks of programmable attention
 * (attn_attention_check), and the reference's threads on it.
 *
 *   - refused, each message naming its values: a block map shorter than a
 *     packed sequence (cu_seqlens: the map is in each sequence's positions;
 *     one as long or longer is taken), over a KV cache whose positions it
 *     does not cover or with a tree of draft tokens, of a batch or heads
 *     neither 1 nor the problem's, of other lengths; a chain of score modifiers with the
 *     problem's own softcap or alibi_slopes; a BIAS whose strides reach
 *     past size_t; taken: a map of batch and heads 1, a chain alone;
 *   - the reference on a block map and a chain (scale, a broadcast BIAS
 *     and a T5 table with their gradients, softcap), float64 and float32
 *     (a reference ctx), forward and backward: the same bits on 1, 2 and
 *     3 threads, tensor_grad included;
 *   - the trace's scores are those after the chain and the mask (-inf where
 *     the map hides a key), against this file's own chain.
 * Values against PyTorch: tests/python/test_flex_reference.py.
 * Fresh random sizes and inputs each run (the seed is printed; argv[1] or
 * ATTN_TEST_SEED replays it).
 */
#include "attn.h"
#include "check.h"
#include "internal.h"
#include "attention/attention.h"
#include "mask/mask_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t state;
static uint64_t next(void) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 11;
}
static double uniform(void) { return (double)next() * 0x1p-53 * 2.0 - 1.0; }
static size_t below(size_t n) { return (size_t)(next() % n); }

/* A map of (batch, heads, T, S) from a random dense mask (into dense, when
 * not NULL: batch * heads * T * S bytes). */
static attn_block_mask *random_dense_map(attn_ctx *ctx, size_t batch, size_t heads, size_t T,
                                         size_t S, uint8_t *dense) {
    size_t n = batch * heads * T * S;
    uint8_t *bits = malloc(n);
    for (size_t e = 0; e < n; e++) bits[e] = uniform() < 0.4;
    if (dense) memcpy(dense, bits, n);
    attn_block_mask_config cfg = {.batch = batch, .heads = heads, .q_len = T, .kv_len = S,
                                  .block_q = 16, .block_kv = 16};
    size_t strides[4] = {heads * T * S, T * S, S, 1};
    attn_block_mask *m = NULL;
    CHECK_STATUS(attn_block_mask_from_bool(ctx, &cfg, bits, strides, &m), ATTN_OK);
    free(bits);
    return m;
}

static attn_block_mask *random_map(attn_ctx *ctx, size_t batch, size_t heads, size_t T,
                                   size_t S) {
    return random_dense_map(ctx, batch, heads, T, S, NULL);
}

static attn_attention_problem problem_of(size_t B, size_t H, size_t T, size_t S) {
    static float dummy[1];
    attn_view_strides st = {0, 0, 0};
    return (attn_attention_problem){.batch = B, .q_heads = H, .kv_heads = H, .q_len = T,
                                    .kv_len = S, .head_dim = 4, .v_head_dim = 4,
                                    .q = attn_view_f32(dummy, st), .k = attn_view_f32(dummy, st),
                                    .v = attn_view_f32(dummy, st),
                                    .out = attn_view_f32(dummy, st), .scale = 0.5f,
                                    .scale_f64 = 0.5};
}

static void refusals(attn_ctx *ctx) {
    size_t B = 2 + below(3), H = 2 + below(3), T = 17 + below(30), S = 17 + below(30);
    char text[160];
    attn_block_mask *fit = random_map(ctx, B, H, T, S);
    attn_block_mask *one = random_map(ctx, 1, 1, T, S);
    attn_block_mask *batch = random_map(ctx, B + 1, 1, T, S);
    attn_block_mask *heads = random_map(ctx, 1, H + 2, T, S);
    attn_block_mask *lengths = random_map(ctx, 1, 1, T + 1, S);

    attn_attention_problem p = problem_of(B, H, T, S);
    p.block_map = attn_block_mask_map(fit);
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_OK);
    p.block_map = attn_block_mask_map(one);
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_OK);

    /* packed sequences */
    int32_t cu_q[6] = {0}, cu_kv[6] = {0};
    for (size_t b = 0; b < B; b++) {
        cu_q[b + 1] = cu_q[b] + (int32_t)T;
        cu_kv[b + 1] = cu_kv[b] + (int32_t)S;
    }
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_kv = cu_kv;
    p.total_q = B * T;
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_OK);
    p.block_map = attn_block_mask_map(lengths); /* longer than every sequence */
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_OK);
    /* the last sequence one query longer than the map */
    p.block_map = attn_block_mask_map(fit);
    cu_q[B] += 1;
    p.q_len = T + 1;
    p.total_q = B * T + 1;
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_ERR_SHAPE);
    snprintf(text, sizeof text, "who: sequence %zu (%zu queries, %zu keys) is past the block "
             "map's q_len %zu, kv_len %zu", B - 1, T + 1, S, T, S);
    CHECK_MESSAGE(ctx, text);
    p.cu_seqlens_q = p.cu_seqlens_kv = NULL;
    p.q_len = T;
    p.total_q = 0;

    /* a KV cache: the map's rows and columns are positions, which it must
     * cover; not with a tree of draft tokens */
    size_t cached[5] = {0}, rows[5] = {0}, starts[5] = {0}, reach = T < S ? T : S;
    attn_kv_cache_view cache = {.cached = cached, .new_rows = rows, .row_start = starts};
    p.kv_cache = &cache;
    p.kv_len = reach + 1; /* the view's own bound: one past the map's */
    rows[0] = 1;
    cached[0] = reach - 1;
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_OK);
    cached[0] = reach;
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_ERR_SHAPE);
    snprintf(text, sizeof text, "the block map is of q_len %zu, kv_len %zu (positions); sequence "
             "0 reaches position %zu (%zu cached, 1 new)", T, S, reach, reach);
    CHECK_MESSAGE(ctx, text);
    cached[0] = 0;
    uint64_t tree[1] = {1};
    cache.tree = tree;
    cache.tree_words = 1;
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_ERR_UNSUPPORTED);
    CHECK_MESSAGE(ctx, "who: a block map with a tree of draft tokens");
    p.kv_cache = NULL;
    p.kv_len = S;

    p.block_map = attn_block_mask_map(batch);
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_ERR_SHAPE);
    snprintf(text, sizeof text, "batch (%zu) and heads (1) must each be 1 or the problem's "
             "(%zu, %zu)", B + 1, B, H);
    CHECK_MESSAGE(ctx, text);
    p.block_map = attn_block_mask_map(heads);
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_ERR_SHAPE);
    snprintf(text, sizeof text, "batch (1) and heads (%zu)", H + 2);
    CHECK_MESSAGE(ctx, text);
    p.block_map = attn_block_mask_map(lengths);
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_ERR_SHAPE);
    snprintf(text, sizeof text, "q_len %zu, kv_len %zu where the problem is of %zu, %zu", T + 1,
             S, T, S);
    CHECK_MESSAGE(ctx, text);
    p.block_map = NULL;

    /* a chain with the problem's own softcap or ALiBi */
    float slopes[8] = {0.5f};
    attn_score_mod chain[2] = {{.kind = ATTN_SCORE_SCALE, .value = 2.0},
                               {.kind = ATTN_SCORE_SOFTCAP, .value = 30.0}};
    p.score_mods = chain;
    p.score_mod_count = 1 + below(2);
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_OK);
    double cap = 1.0 + below(40);
    p.softcap = (float)cap;
    p.softcap_f64 = cap;
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_ERR_INVALID);
    snprintf(text, sizeof text, "a chain of %zu score modifiers with the problem's own softcap "
             "(%g) or alibi_slopes (NULL)", p.score_mod_count, cap);
    CHECK_MESSAGE(ctx, text);
    p.softcap = 0.0f;
    p.softcap_f64 = 0.0;
    p.alibi_slopes = slopes;
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "softcap (0) or alibi_slopes (set)");
    p.alibi_slopes = NULL;

    /* a bias whose strides reach past size_t */
    size_t huge = SIZE_MAX / 2 + below(1000);
    float bias[1] = {0.0f};
    attn_score_mod wide = {.kind = ATTN_SCORE_BIAS, .tensor = bias, .strides = {0, 0, 1, huge}};
    p.score_mods = &wide;
    p.score_mod_count = 1;
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_ERR_OVERFLOW);
    snprintf(text, sizeof text, "score_mods[0] (bias) strides (0, 0, 1, %zu)", huge);
    CHECK_MESSAGE(ctx, text);

    /* a relative table whose rows are one short of the elements the
     * lengths reach (i - j + offset over i < T, j < S: from offset - S + 1
     * to offset + T - 1, negative ones from the row's end), at either end */
    float table[256] = {0.0f};
    long long offset = (long long)below(20) - 10;
    long long lo = offset - (long long)S + 1, hi = offset + (long long)T - 1;
    size_t need = (size_t)(-lo > hi + 1 ? -lo : hi + 1);
    attn_score_mod rel = {.kind = ATTN_SCORE_REL_TABLE, .tensor = table, .buckets = need,
                          .offset = offset};
    p.score_mods = &rel;
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_OK);
    rel.buckets = need - 1;
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_ERR_SHAPE);
    snprintf(text, sizeof text,
             "who: score_mods[0] (relative table) reads element %lld of rows of %zu (q_idx - "
             "kv_idx + offset %lld over q_len %zu, kv_len %zu)",
             -lo >= hi + 1 ? lo : hi, need - 1, offset, T, S);
    CHECK_MESSAGE(ctx, text);
    rel.signed_distance = true; /* j - i + offset: the other ends */
    lo = offset - (long long)T + 1, hi = offset + (long long)S - 1;
    rel.buckets = (size_t)(-lo > hi + 1 ? -lo : hi + 1);
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_OK);
    rel.buckets--;
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "(kv_idx - q_idx + offset");

    /* T5's buckets with max_distance at or below the exact ones: the log
     * of their ratio is 0 or negative, and would give buckets outside the
     * table */
    bool two_way = below(2);
    size_t buckets = two_way ? 4 + 2 * below(30) : 2 + below(60);
    size_t exact = (two_way ? buckets / 2 : buckets) / 2;
    attn_score_mod t5 = {.kind = ATTN_SCORE_REL_BIAS, .tensor = table, .buckets = buckets,
                         .max_distance = exact + 1, .bidirectional = two_way};
    p.score_mods = &t5;
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_OK);
    t5.max_distance = exact - below(exact + 1);
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_ERR_INVALID);
    snprintf(text, sizeof text, "who: score_mods[0] (relative bias) max_distance %zu must "
             "exceed the %zu exact buckets of buckets %zu", t5.max_distance, exact, buckets);
    CHECK_MESSAGE(ctx, text);
    t5.max_distance = exact + 1;
    t5.buckets = (size_t)INT32_MAX + 1 + below(10);
    CHECK_STATUS(attn_attention_check(ctx, "who", &p), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "(relative bias) buckets");

    attn_block_mask_free(fit);
    attn_block_mask_free(one);
    attn_block_mask_free(batch);
    attn_block_mask_free(heads);
    attn_block_mask_free(lengths);
}

/* Forward and backward of a map and a chain on a ctx of threads threads
 * (the reference kernels): out, lse, dq, dk, dv, the bias and table
 * gradients into one buffer each, in that order. */
enum { B = 2, H = 2, T = 41, S = 53, D = 8, BUCKETS = 16 };
static void run(size_t threads, bool f64, const double *inputs, const attn_block_mask *map,
                const float *bias, const float *table, void *result) {
    attn_ctx *ctx = NULL;
    attn_ctx_config cc = {.num_threads = threads, .kernels = ATTN_KERNELS_REFERENCE};
    CHECK_STATUS(attn_ctx_new(&cc, &ctx), ATTN_OK);
    size_t nq = B * T * H * D, nk = B * S * H * D, nl = B * H * T;
    size_t width = f64 ? sizeof(double) : sizeof(float);
    char *r = result;
    char *out = r, *lse = out + nq * width, *dq = lse + nl * width, *dk = dq + nq * width;
    char *dv = dk + nk * width;
    float *dbias = (float *)(dv + nk * width), *dtable = dbias + T * S;
    char *in = malloc((2 * nq + 2 * nk) * width);
    for (size_t e = 0; e < 2 * nq + 2 * nk; e++) {
        if (f64) ((double *)in)[e] = inputs[e];
        else ((float *)in)[e] = (float)inputs[e];
    }
    char *q = in, *k = q + nq * width, *v = k + nk * width, *dout = v + nk * width;
    attn_score_mod chain[4] = {
        {.kind = ATTN_SCORE_SCALE, .value = 1.25},
        {.kind = ATTN_SCORE_BIAS, .tensor = bias, .tensor_grad = dbias, .strides = {0, 0, S, 1}},
        {.kind = ATTN_SCORE_REL_BIAS, .tensor = table, .tensor_grad = dtable,
         .buckets = BUCKETS, .max_distance = 24, .bidirectional = true},
        {.kind = ATTN_SCORE_SOFTCAP, .value = 3.0}};
    attn_sdpa_config cfg = {.batch = B, .heads = H, .q_tokens = T, .kv_tokens = S, .head_dim = D,
                            .causal = true, .block_mask = map, .score_mods = chain,
                            .score_mod_count = 4};
    if (f64) {
        CHECK_STATUS(attn_sdpa_forward_f64(ctx, &cfg, (double *)q, (double *)k, (double *)v,
                                           (double *)out, (double *)lse, NULL, NULL),
                     ATTN_OK);
        CHECK_STATUS(attn_sdpa_backward_f64(ctx, &cfg, (double *)q, (double *)k, (double *)v,
                                            (double *)out, (double *)lse, (double *)dout,
                                            (double *)dq, (double *)dk, (double *)dv, NULL),
                     ATTN_OK);
    } else {
        CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, (float *)q, (float *)k, (float *)v,
                                       (float *)out, (float *)lse, NULL, NULL),
                     ATTN_OK);
        CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, (float *)q, (float *)k, (float *)v,
                                        (float *)out, (float *)lse, (float *)dout, (float *)dq,
                                        (float *)dk, (float *)dv, NULL),
                     ATTN_OK);
    }
    free(in);
    attn_ctx_free(ctx);
}

static void threads_agree(attn_ctx *ctx) {
    size_t nq = B * T * H * D, nk = B * S * H * D, n = 2 * nq + 2 * nk;
    double *inputs = malloc(n * sizeof *inputs);
    for (size_t e = 0; e < n; e++) inputs[e] = uniform() * 2.0;
    float *bias = malloc(T * S * sizeof *bias), table[H * BUCKETS];
    for (size_t e = 0; e < T * S; e++) bias[e] = (float)uniform();
    for (size_t e = 0; e < H * BUCKETS; e++) table[e] = (float)uniform();
    attn_block_mask *map = random_map(ctx, B, 1, T, S);
    for (int f64 = 0; f64 <= 1; f64++) {
        size_t width = f64 ? sizeof(double) : sizeof(float);
        size_t bytes = (2 * nq + B * H * T + 2 * nk) * width + (T * S + H * BUCKETS) * 4;
        void *one = calloc(1, bytes), *many = calloc(1, bytes);
        run(1, f64, inputs, map, bias, table, one);
        float *dtable = (float *)((char *)one + bytes) - H * BUCKETS;
        double grad_norm = 0.0;
        for (size_t e = 0; e < H * BUCKETS; e++) grad_norm += fabs(dtable[e]);
        CHECK(grad_norm > 0.0); /* the table's gradient was written */
        for (size_t threads = 2; threads <= 3; threads++) {
            memset(many, 0, bytes);
            run(threads, f64, inputs, map, bias, table, many);
            bool same = memcmp(one, many, bytes) == 0;
            if (!same)
                fprintf(stderr, "%s on %zu threads differs from 1 thread\n",
                        f64 ? "float64" : "float32", threads);
            CHECK(same);
        }
        free(one);
        free(many);
    }
    attn_block_mask_free(map);
    free(bias);
    free(inputs);
}

/* The trace's scores: after the chain and the mask (-inf where hidden),
 * against this file's own chain on the dense mask the map was built from. */
static void trace_shows_chained_scores(void) {
    enum { TB = 2, TH = 2, TT = 20, TS = 27, TD = 4 };
    attn_ctx *ctx = NULL;
    attn_ctx_config cc = {.num_threads = 2, .kernels = ATTN_KERNELS_REFERENCE};
    CHECK_STATUS(attn_ctx_new(&cc, &ctx), ATTN_OK);
    static float q[TB * TT * TH * TD], k[TB * TS * TH * TD], v[TB * TS * TH * TD],
        out[TB * TT * TH * TD], scores[TB * TH * TT * TS];
    static uint8_t dense[TB * TH * TT * TS];
    for (size_t e = 0; e < TB * TT * TH * TD; e++) q[e] = (float)uniform();
    for (size_t e = 0; e < TB * TS * TH * TD; e++) k[e] = (float)uniform(), v[e] = (float)uniform();
    attn_block_mask *map = random_dense_map(ctx, TB, TH, TT, TS, dense);
    float slopes[TH] = {(float)(0.5 + 0.5 * uniform()), (float)(0.5 + 0.5 * uniform())};
    int64_t offset = (int64_t)below(5) - 2;
    attn_score_mod chain[3] = {{.kind = ATTN_SCORE_SCALE, .value = 1.5},
                               {.kind = ATTN_SCORE_ALIBI, .tensor = slopes, .offset = offset},
                               {.kind = ATTN_SCORE_SOFTCAP, .value = 4.0}};
    attn_view_strides qs = {TT * TH * TD, TH * TD, TD}, ks = {TS * TH * TD, TH * TD, TD};
    attn_attention_problem p = {.batch = TB, .q_heads = TH, .kv_heads = TH, .q_len = TT,
                                .kv_len = TS, .head_dim = TD, .v_head_dim = TD,
                                .q = attn_view_f32(q, qs), .k = attn_view_f32(k, ks),
                                .v = attn_view_f32(v, ks), .out = attn_view_f32(out, qs),
                                .scale = 0.5f, .scale_f64 = 0.5,
                                .block_map = attn_block_mask_map(map), .score_mods = chain,
                                .score_mod_count = 3};
    attn_attention_trace trace = {.scores = scores};
    CHECK_STATUS(attn_attention_forward(ctx, "trace", &p, NULL, NULL, &trace, NULL, NULL),
                 ATTN_OK);
    size_t wrong = 0;
    for (size_t b = 0; b < TB; b++)
        for (size_t h = 0; h < TH; h++)
            for (size_t i = 0; i < TT; i++)
                for (size_t j = 0; j < TS; j++) {
                    size_t at = ((b * TH + h) * TT + i) * TS + j;
                    double want = -INFINITY;
                    if (dense[at]) {
                        double x = 0.0;
                        for (size_t d = 0; d < TD; d++)
                            x += (double)q[qs.b * b + qs.t * i + qs.h * h + d] *
                                 k[ks.b * b + ks.t * j + ks.h * h + d];
                        double dist = fabs((double)j - (double)((int64_t)i + offset));
                        double s = x * 0.5 * 1.5 - (double)slopes[h] * dist;
                        want = 4.0 * tanh(s / 4.0);
                    }
                    bool ok = isinf(want) ? scores[at] == -INFINITY
                                          : fabs(scores[at] - want) <= 1e-6 * fmax(1.0, fabs(want));
                    if (!ok && wrong++ < 5)
                        fprintf(stderr, "trace (%zu, %zu, %zu, %zu): %g, want %g\n", b, h, i, j,
                                (double)scores[at], want);
                }
    CHECK(wrong == 0);
    attn_block_mask_free(map);
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    const char *env = getenv("ATTN_TEST_SEED");
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10)
                    : env   ? strtoull(env, NULL, 10)
                            : (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)seed);
    state = seed;
    attn_ctx *ctx = NULL;
    CHECK_STATUS(attn_ctx_new(NULL, &ctx), ATTN_OK);
    refusals(ctx);
    threads_agree(ctx);
    trace_shows_chained_scores();
    attn_ctx_free(ctx);
    return check_summary();
}
