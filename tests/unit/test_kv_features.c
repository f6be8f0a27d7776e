/*
 * test_kv_features.c — softcap, ALiBi and sinks over a KV cache (attn.h,
 * attn_kv_cache_attend; the decode backend, attention/decode.c):
 *   every K/V stored type (and two mixed pairs), GQA (3 query heads per KV
 *   head, and 5: a group past the kernels' 4 at once), a head_dim of 44 (no
 *   whole number of the kernels' passes; float32, bf16, f16), a full layer and a
 *   window layer, each modifier alone, all three together and none: the
 *   decode kernels of every kernel set this CPU runs against the reference
 *   ctx (its cache rows in double over the same stored values) on the same
 *   steps (a prompt, a chunked prefill, a long appended prefix, chunks and
 *   single tokens), within a tight bound; and the same bits on a contiguous
 *   cache on 1 thread (row mode), a paged one on 2 (a single token over
 *   more than one chunk of keys runs split: its chunks in parallel, folded
 *   after) and a contiguous one on 2;
 *   a head whose sink outweighs every key (its rows near 0), and the sink
 *   merge of a row that sees no key (zeros) or a NaN sum (NaN);
 *   a NaN key under softcap makes the rows that see it NaN, fast and
 *   reference, as without (the cap would make it finite);
 *   the explain record names the decode kernel with the modifiers;
 *   a tree of draft tokens with softcap and sinks against the reference,
 *   and refused with slopes;
 *   refusals (a negative, NaN or infinite softcap; a NaN slope; an infinite
 *   sink; out over the slopes) name the value, and nothing is appended;
 *   an infinite or NaN value reaches only the rows that see it: in a tree,
 *   under a map that hides it from one head, behind a prompt's window.
 * Inputs are fresh random numbers each run (the seed is printed).
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"
#include "kernels/decode/decode.h"

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
static float rand_uniform(void) { return (float)((double)(next_u64() >> 11) / 9007199254740992.0); }
static float rand_normal(void) {
    double s = 0.0;
    for (int i = 0; i < 4; i++) s += rand_uniform();
    return (float)((s - 2.0) * 1.7320508);
}
static float *random_floats(size_t n, float spread) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = rand_normal() * spread;
    return x;
}

static const attn_dtype TYPES[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16,    ATTN_DTYPE_F16,
                                   ATTN_DTYPE_F8_E4M3, ATTN_DTYPE_I8, ATTN_DTYPE_I4};
#define NUM_TYPES (sizeof TYPES / sizeof TYPES[0])

enum { BATCH = 2, MAX_LEN = 700, LAYERS = 2, MAX_H = 8 };
static const size_t WINDOWS[LAYERS] = {0, 40};

/* What the steps of one comparison share. */
typedef struct shape {
    size_t kv_heads, group, head_dim;
} shape;

/* The modifiers of one run (0, NULL: off). */
typedef struct mods {
    float softcap;
    const float *slopes, *sinks;
} mods;

typedef struct run {
    attn_ctx *ctx;
    attn_kv_cache *cache;
} run;

static void run_new(run *r, const shape *s, attn_kernels kernels, size_t threads,
                    attn_kv_layout layout, attn_dtype kt, attn_dtype vt) {
    attn_ctx_config cc = {.num_threads = threads, .kernels = kernels};
    CHECK_STATUS(attn_ctx_new(&cc, &r->ctx), ATTN_OK);
    attn_kv_cache_config cfg = {.num_layers = LAYERS, .batch = BATCH, .kv_heads = s->kv_heads,
                                .head_dim = s->head_dim, .max_len = MAX_LEN, .layout = layout,
                                .page_size = 7, .windows = WINDOWS, .k_dtype = kt,
                                .v_dtype = vt};
    CHECK_STATUS(attn_kv_cache_new(r->ctx, &cfg, &r->cache), ATTN_OK);
}

static void run_free(run *r) {
    attn_kv_cache_free(r->cache);
    attn_ctx_free(r->ctx);
}

static float *attend(run *r, const shape *s, const mods *m, double scale, size_t layer,
                     const size_t *lens, const float *q, const float *k, const float *v,
                     size_t rows) {
    size_t H = s->kv_heads * s->group;
    float *out = malloc((rows * H * s->head_dim + 1) * sizeof(float));
    attn_kv_attend_args a = {.layer = layer, .new_lens = lens, .q_heads = H, .scale = scale,
                             .q = q, .k_new = k, .v_new = v, .out = out,
                             .softcap = m->softcap, .alibi_slopes = m->slopes,
                             .sinks = m->sinks};
    CHECK_STATUS(attn_kv_cache_attend(r->cache, &a), ATTN_OK);
    return out;
}

/* ALiBi's slopes for H heads (2^(-8 (h + 1) / H), the paper's), scaled
 * at random, and sinks around 0 with one head's far above its scores. */
static void random_mods(size_t H, float *slopes, float *sinks) {
    float f = 0.5f + rand_uniform();
    for (size_t h = 0; h < H; h++) {
        slopes[h] = f * exp2f(-8.0f * (float)(h + 1) / (float)H);
        sinks[h] = 2.0f * rand_normal();
    }
    sinks[rand_below(H)] = 40.0f; /* outweighs every key: its rows near 0 */
}

static const attn_kernels SETS[] = {ATTN_KERNELS_PORTABLE, ATTN_KERNELS_AVX2,
                                    ATTN_KERNELS_AVX512};
#define NUM_SETS 3

/* The steps on the reference and, for each kernel set in sets (a bit per
 * SETS entry) this CPU runs, on its fast kernels (contiguous on 1 thread,
 * paged on 2, contiguous on 2: the same bits), of one pair of types and
 * modifiers; worst[set] receives the largest |fast - reference| over the
 * rows both read from stored values (the fast kernels' prompts attend in
 * float32, the same where the store is float32). */
static void compare(const shape *s, unsigned sets, attn_dtype kt, attn_dtype vt, const mods *m,
                    double *worst) {
    size_t H = s->kv_heads * s->group, KH = s->kv_heads, D = s->head_dim;
    run fast[NUM_SETS][3], ref;
    bool on[NUM_SETS];
    for (size_t k = 0; k < NUM_SETS; k++) {
        on[k] = (sets >> k & 1u) && attn_kernels_supported(SETS[k]);
        worst[k] = 0.0;
        if (!on[k]) continue;
        run_new(&fast[k][0], s, SETS[k], 1, ATTN_KV_CONTIGUOUS, kt, vt);
        run_new(&fast[k][1], s, SETS[k], 2, ATTN_KV_PAGED, kt, vt);
        run_new(&fast[k][2], s, SETS[k], 2, ATTN_KV_CONTIGUOUS, kt, vt);
    }
    run_new(&ref, s, ATTN_KERNELS_REFERENCE, 2, ATTN_KV_CONTIGUOUS, kt, vt);
    double scale = 0.08 + 0.3 * rand_uniform();
    bool f32 = kt == ATTN_DTYPE_F32 && vt == ATTN_DTYPE_F32;
    for (int t = 0; t < 7; t++) {
        /* 0: a prompt (fused on the fast ctx) and a chunked prefill; 1: a
         * long prefix appended; then chunks, single tokens, an idle sequence */
        size_t lens[BATCH] = {t == 0 ? 70 : t == 2 ? 1 + rand_below(12) : 1,
                              t == 0 ? 9 : rand_below(3)};
        size_t rows = lens[0] + lens[1];
        float *q = random_floats(rows * H * D, 1.0f), *k = random_floats(rows * KH * D, 1.0f),
              *v = random_floats(rows * KH * D, 1.0f);
        if (t == 1) {
            size_t prefix[BATCH] = {400 + rand_below(150), 260 + rand_below(200)};
            size_t n = prefix[0] + prefix[1];
            float *pk = random_floats(n * KH * D, 1.0f), *pv = random_floats(n * KH * D, 1.0f);
            for (size_t layer = 0; layer < LAYERS; layer++) {
                for (size_t ks = 0; ks < NUM_SETS; ks++)
                    for (int f = 0; on[ks] && f < 3; f++)
                        CHECK_STATUS(attn_kv_cache_append(fast[ks][f].cache, layer, prefix, 0,
                                                          pk, pv),
                                     ATTN_OK);
                CHECK_STATUS(attn_kv_cache_append(ref.cache, layer, prefix, 0, pk, pv), ATTN_OK);
            }
            free(pk), free(pv);
        }
        for (size_t layer = 0; layer < LAYERS; layer++) {
            float *want = attend(&ref, s, m, scale, layer, lens, q, k, v, rows);
            for (size_t ks = 0; ks < NUM_SETS; ks++) {
                if (!on[ks]) continue;
                float *got[3];
                for (int f = 0; f < 3; f++)
                    got[f] = attend(&fast[ks][f], s, m, scale, layer, lens, q, k, v, rows);
                for (int f = 1; f < 3; f++)
                    CHECK(memcmp(got[0], got[f], rows * H * D * sizeof(float)) == 0);
                size_t from = t == 0 && !f32 ? lens[0] : 0;
                for (size_t i = from * H * D; i < rows * H * D; i++) {
                    double e = fabs((double)got[0][i] - want[i]);
                    worst[ks] = check_worse(worst[ks], e != e ? INFINITY : e);
                }
                for (int f = 0; f < 3; f++) free(got[f]);
            }
            free(want);
        }
        free(q), free(k), free(v);
    }
    for (size_t k = 0; k < NUM_SETS; k++)
        for (int f = 0; on[k] && f < 3; f++) run_free(&fast[k][f]);
    run_free(&ref);
}

#define BOUND 1e-5

static void test_against_reference(void) {
    /* the third: a head_dim that is no whole number of the kernels' passes
     * (44: 32 read as pairs of bf16 vectors, one vector, 4 elements) */
    static const shape shapes[] = {{2, 3, 64}, {1, 5, 96}, {2, 2, 44}};
    /* the pairs: each type as K and V, then two mixed */
    attn_dtype pairs[NUM_TYPES + 2][2];
    for (size_t i = 0; i < NUM_TYPES; i++) pairs[i][0] = pairs[i][1] = TYPES[i];
    pairs[NUM_TYPES][0] = ATTN_DTYPE_I4, pairs[NUM_TYPES][1] = ATTN_DTYPE_BF16;
    pairs[NUM_TYPES + 1][0] = ATTN_DTYPE_F8_E4M3, pairs[NUM_TYPES + 1][1] = ATTN_DTYPE_I8;
    const char *names[5] = {"none", "softcap", "ALiBi", "sinks", "all three"};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *s = &shapes[si];
        size_t H = s->kv_heads * s->group;
        double worst[NUM_SETS][5] = {{0}};
        for (size_t pi = 0; pi < NUM_TYPES + 2; pi++) {
            /* the shape with 5 heads a group runs the float32 pair and one
             * quantised; the portable kernels (slow, and the modifiers are
             * the same code whatever the format) those two pairs alone */
            bool few = pi == 0 || pi == NUM_TYPES;
            if (si == 1 && !few) continue;
            /* 44 wide: float32, bf16 and f16 (int4 takes groups of 32) */
            if (si == 2 && !(pi == 0 || pairs[pi][0] == ATTN_DTYPE_BF16 ||
                             pairs[pi][0] == ATTN_DTYPE_F16))
                continue;
            unsigned sets = few ? 7u : 6u;
            for (int c = 0; c < 5; c++) {
                float slopes[MAX_H], sinks[MAX_H];
                random_mods(H, slopes, sinks);
                float cap = 1.0f + 9.0f * rand_uniform();
                mods m = {c == 1 || c == 4 ? cap : 0.0f, c == 2 || c == 4 ? slopes : NULL,
                          c == 3 || c == 4 ? sinks : NULL};
                double w[NUM_SETS];
                compare(s, sets, pairs[pi][0], pairs[pi][1], &m, w);
                for (size_t ks = 0; ks < NUM_SETS; ks++) {
                    if (!(w[ks] <= BOUND))
                        printf("FAIL %s, %zu x %zu heads, D %zu: K %s, V %s, %s: |fast - "
                               "reference| %.3g\n",
                               attn_kernels_name(SETS[ks]), s->kv_heads, s->group, s->head_dim,
                               attn_dtype_name(pairs[pi][0]), attn_dtype_name(pairs[pi][1]),
                               names[c], w[ks]);
                    CHECK(w[ks] <= BOUND);
                    worst[ks][c] = check_worse(worst[ks][c], w[ks]);
                }
            }
        }
        for (size_t ks = 0; ks < NUM_SETS; ks++)
            if (attn_kernels_supported(SETS[ks]))
                printf("%s, %zu x %zu heads, D %zu: worst |fast - reference|: none %.3g, "
                       "softcap %.3g, ALiBi %.3g, sinks %.3g, all three %.3g\n",
                       attn_kernels_name(SETS[ks]), s->kv_heads, s->group, s->head_dim,
                       worst[ks][0], worst[ks][1], worst[ks][2], worst[ks][3], worst[ks][4]);
    }
}

/* attn_decode_sink: a row that saw no key gives zeros with a sink; a NaN
 * sum stays NaN; a sink far below the row's max changes nothing. */
static void test_sink_merge(void) {
    float acc[4] = {0, 0, 0, 0}, out[4];
    attn_decode_sink(-INFINITY, 0.0f, acc, 3.0f, out, 4);
    for (int d = 0; d < 4; d++) CHECK(out[d] == 0.0f && !signbit(out[d]));
    float acc2[4] = {1, 2, 3, 4};
    attn_decode_sink(5.0f, NAN, acc2, 3.0f, out, 4);
    for (int d = 0; d < 4; d++) CHECK(isnan(out[d]));
    attn_decode_sink(5.0f, 2.0f, acc2, -200.0f, out, 4);
    for (int d = 0; d < 4; d++) CHECK(out[d] == acc2[d] / 2.0f);
    /* a sink of equal weight to the row's (m = sink2, l = 1): half each */
    attn_decode_sink(0.0f, 1.0f, acc2, 0.0f, out, 4);
    for (int d = 0; d < 4; d++) CHECK(out[d] == acc2[d] / 2.0f);
}

/* A NaN key with softcap: the rows that see it are NaN on both sides;
 * the explain record names the decode kernel and the modifiers. */
static void test_nan_and_explain(void) {
    shape s = {2, 3, 64};
    size_t H = 6, KH = 2, D = 64;
    float slopes[MAX_H], sinks[MAX_H];
    random_mods(H, slopes, sinks);
    mods m = {2.0f, slopes, sinks};
    for (int variant = 0; variant < 4; variant++) { /* fast, reference x f32, int8 */
        run r;
        run_new(&r, &s, variant / 2 ? ATTN_KERNELS_REFERENCE : ATTN_KERNELS_AUTO, 2,
                ATTN_KV_CONTIGUOUS, variant % 2 ? ATTN_DTYPE_I8 : ATTN_DTYPE_F32,
                ATTN_DTYPE_F32);
        size_t lens[BATCH] = {4, 4};
        float *q = random_floats(8 * H * D, 1.0f), *k = random_floats(8 * KH * D, 1.0f),
              *v = random_floats(8 * KH * D, 1.0f);
        k[(1 * KH + 0) * D + 5] = NAN; /* sequence 0, token 1, KV head 0 */
        float *out = attend(&r, &s, &m, 0.0, 0, lens, q, k, v, 8);
        for (size_t row = 0; row < 8; row++)
            for (size_t h = 0; h < H; h++) {
                bool sees = row >= 1 && row < 4 && h / 3 == 0;
                CHECK(isnan(out[(row * H + h) * D]) == sees);
            }
        const char *ex = attn_ctx_last_explain(r.ctx);
        if (variant / 2 == 0) {
            char want[128];
            snprintf(want, sizeof want, ", K %s, V F32, softcap, ALiBi, sinks]: ran",
                     variant % 2 ? "I8" : "F32");
            bool named = strstr(ex, "decode [") != NULL && strstr(ex, want) != NULL;
            if (!named) printf("FAIL explain: %s\n", ex);
            CHECK(named);
        } else {
            CHECK(strstr(ex, "reference [K ") != NULL && strstr(ex, "sinks]: ran") != NULL);
        }
        free(q), free(k), free(v), free(out);
        run_free(&r);
    }
}

/* A tree of draft tokens with softcap and sinks, fast against reference;
 * slopes refused. */
static void test_tree(void) {
    shape s = {2, 2, 64};
    size_t H = 4, KH = 2, D = 64, n = 5;
    float slopes[MAX_H], sinks[MAX_H];
    random_mods(H, slopes, sinks);
    int32_t parents[5] = {-1, 0, 0, 1, 2};
    run fast, ref;
    run_new(&fast, &s, ATTN_KERNELS_AUTO, 2, ATTN_KV_PAGED, ATTN_DTYPE_BF16, ATTN_DTYPE_I8);
    run_new(&ref, &s, ATTN_KERNELS_REFERENCE, 1, ATTN_KV_CONTIGUOUS, ATTN_DTYPE_BF16,
            ATTN_DTYPE_I8);
    size_t prefix[BATCH] = {300, 40};
    float *pk = random_floats(340 * KH * D, 1.0f), *pv = random_floats(340 * KH * D, 1.0f);
    CHECK_STATUS(attn_kv_cache_append(fast.cache, 0, prefix, 0, pk, pv), ATTN_OK);
    CHECK_STATUS(attn_kv_cache_append(ref.cache, 0, prefix, 0, pk, pv), ATTN_OK);
    float *q = random_floats(n * H * D, 1.0f), *k = random_floats(n * KH * D, 1.0f),
          *v = random_floats(n * KH * D, 1.0f);
    float *o1 = malloc(n * H * D * sizeof(float)), *o2 = malloc(n * H * D * sizeof(float));
    attn_kv_tree_args a = {.layer = 0, .seq = 0, .draft_tokens = n, .parents = parents,
                           .q_heads = H, .q = q, .k_new = k, .v_new = v, .out = o1,
                           .softcap = 3.0f, .sinks = sinks};
    CHECK_STATUS(attn_kv_cache_attend_tree(fast.cache, &a), ATTN_OK);
    a.out = o2;
    CHECK_STATUS(attn_kv_cache_attend_tree(ref.cache, &a), ATTN_OK);
    double worst = 0.0;
    for (size_t i = 0; i < n * H * D; i++) worst = check_worse(worst, fabs((double)o1[i] - o2[i]));
    CHECK(worst <= BOUND);
    a.alibi_slopes = slopes;
    CHECK_STATUS(attn_kv_cache_attend_tree(fast.cache, &a), ATTN_ERR_UNSUPPORTED);
    CHECK_MESSAGE(fast.ctx, "alibi_slopes with a tree of draft tokens");
    free(pk), free(pv), free(q), free(k), free(v), free(o1), free(o2);
    run_free(&fast);
    run_free(&ref);
}

/* Refusals name the value; nothing is appended. */
static void test_refusals(void) {
    shape s = {2, 3, 64};
    size_t H = 6, KH = 2, D = 64;
    run r;
    run_new(&r, &s, ATTN_KERNELS_AUTO, 1, ATTN_KV_CONTIGUOUS, ATTN_DTYPE_F32, ATTN_DTYPE_F32);
    float *q = random_floats(2 * H * D, 1.0f), *k = random_floats(2 * KH * D, 1.0f),
          *v = random_floats(2 * KH * D, 1.0f), *out = malloc(2 * H * D * sizeof(float));
    float slopes[MAX_H], sinks[MAX_H];
    random_mods(H, slopes, sinks);
    attn_kv_attend_args ok = {.layer = 0, .new_tokens = 1, .q_heads = H, .q = q, .k_new = k,
                              .v_new = v, .out = out, .softcap = 5.0f, .alibi_slopes = slopes,
                              .sinks = sinks};
    attn_kv_attend_args a = ok;
    a.softcap = -1.0f;
    CHECK_STATUS(attn_kv_cache_attend(r.cache, &a), ATTN_ERR_INVALID);
    CHECK_MESSAGE(r.ctx, "softcap -1 is not a finite value >= 0");
    a.softcap = NAN;
    CHECK_STATUS(attn_kv_cache_attend(r.cache, &a), ATTN_ERR_INVALID);
    CHECK_MESSAGE(r.ctx, "softcap nan is not a finite value >= 0");
    a.softcap = INFINITY;
    CHECK_STATUS(attn_kv_cache_attend(r.cache, &a), ATTN_ERR_INVALID);
    CHECK_MESSAGE(r.ctx, "softcap inf is not");
    a = ok;
    slopes[2] = NAN;
    CHECK_STATUS(attn_kv_cache_attend(r.cache, &a), ATTN_ERR_INVALID);
    CHECK_MESSAGE(r.ctx, "alibi_slopes[2] is nan: each query head's must be finite");
    slopes[2] = 0.25f;
    sinks[5] = -INFINITY;
    CHECK_STATUS(attn_kv_cache_attend(r.cache, &a), ATTN_ERR_INVALID);
    CHECK_MESSAGE(r.ctx, "sinks[5] is -inf");
    sinks[5] = 0.0f;
    float *shared = calloc(2 * H * D, sizeof(float)); /* out over the sinks */
    a.out = shared;
    a.sinks = shared + H * D - 2;
    CHECK_STATUS(attn_kv_cache_attend(r.cache, &a), ATTN_ERR_INVALID);
    CHECK_MESSAGE(r.ctx, "sinks");
    free(shared);
    for (size_t b = 0; b < BATCH; b++) {
        size_t len = 99;
        CHECK_STATUS(attn_kv_cache_length(r.cache, 0, b, &len), ATTN_OK);
        CHECK(len == 0);
    }
    /* and the good call appends */
    CHECK_STATUS(attn_kv_cache_attend(r.cache, &ok), ATTN_OK);
    size_t len = 0;
    CHECK_STATUS(attn_kv_cache_length(r.cache, 0, 1, &len), ATTN_OK);
    CHECK(len == 1);
    free(q), free(k), free(v), free(out);
    run_free(&r);
}

/* A mask that hides key 5 from query head 0 only. */
static int hide_key5_head0(void *user, size_t b, size_t h, size_t q_idx, size_t kv_idx) {
    (void)user, (void)b, (void)q_idx;
    return !(h == 0 && kv_idx == 5);
}

/* out's rows (rows, H, D) against the same call without the poison: each
 * (row, head) that sees the poisoned value must come out NaN or infinite
 * (sees[row * H + h]), every other one finite and as without it. */
static void check_poison_rows(const char *what, const float *out, const float *clean,
                              const bool *sees, size_t rows, size_t H, size_t D) {
    for (size_t r = 0; r < rows * H; r++) {
        bool finite = true;
        double num = 0, den = 0;
        for (size_t d = 0; d < D; d++) {
            finite &= isfinite(out[r * D + d]) != 0;
            double e = (double)out[r * D + d] - clean[r * D + d];
            num += e * e;
            den += (double)clean[r * D + d] * clean[r * D + d];
        }
        bool ok = sees[r] ? !finite : finite && num <= 1e-10 * den;
        CHECK(ok);
        if (!ok)
            printf("FAIL %s: row %zu head %zu %s (rel L2 %.3g)\n", what, r / H, r % H,
                   sees[r] ? "should be NaN" : finite ? "moved" : "is not finite",
                   den > 0 ? sqrt(num / den) : num);
    }
}

/* An infinite or NaN value (an f16 cache's overflow, a NaN from the model)
 * makes only the rows that weigh it non-finite (attn.h): not a draft's
 * sibling in a tree, not the rows a block map hides it from (per head, 2
 * query heads over one KV head), not the rows of a prompt whose window has
 * passed it (a dense prompt would follow PyTorch's matmul: 0 x inf in every
 * row). Each against the same call unpoisoned; default kernels. */
static void test_poisoned_values(void) {
    enum { D = 32, H = 2, N = 100 };
    attn_ctx *ctx;
    attn_ctx_config cc = {.num_threads = 2};
    CHECK_STATUS(attn_ctx_new(&cc, &ctx), ATTN_OK);
    float *q = random_floats(N * H * D, 1.0f), *k = random_floats(N * D, 1.0f);
    float *v = random_floats(N * D, 1.0f), *out[2];
    bool sees[N * H];
    for (int i = 0; i < 2; i++) out[i] = calloc(N * H * D, sizeof(float));
    for (int kind = 0; kind < 2; kind++) {
        float poison = kind ? NAN : INFINITY;
        for (int c = 0; c < 2; c++) { /* c = 0: poisoned, 1: clean */
            attn_kv_cache *cache;
            /* a tree of 3 drafts over 4 cached tokens: drafts 1 and 2 children of 0, 1's
             * value poisoned */
            attn_kv_cache_config cfg = {.num_layers = 1, .batch = 1, .kv_heads = 1,
                                        .head_dim = D, .max_len = 64};
            CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &cache), ATTN_OK);
            CHECK_STATUS(attn_kv_cache_append(cache, 0, NULL, 4, k, v), ATTN_OK);
            float saved = v[(4 + 1) * D + 3];
            if (c == 0) v[(4 + 1) * D + 3] = poison;
            int32_t parents[3] = {-1, 0, 0};
            attn_kv_tree_args t = {.draft_tokens = 3, .parents = parents, .q_heads = H,
                                   .q = q, .k_new = k + 4 * D, .v_new = v + 4 * D,
                                   .out = out[c]};
            CHECK_STATUS(attn_kv_cache_attend_tree(cache, &t), ATTN_OK);
            v[(4 + 1) * D + 3] = saved;
            attn_kv_cache_free(cache);
        }
        for (size_t r = 0; r < 3 * H; r++) sees[r] = r / H == 1;
        check_poison_rows("poisoned tree", out[0], out[1], sees, 3, H, D);

        for (int c = 0; c < 2; c++) { /* a map hiding key 5 from head 0, 8 new rows */
            attn_kv_cache *cache;
            attn_kv_cache_config cfg = {.num_layers = 1, .batch = 1, .kv_heads = 1,
                                        .head_dim = D, .max_len = 64};
            CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &cache), ATTN_OK);
            attn_block_mask_config mc = {.batch = 1, .heads = H, .q_len = 64, .kv_len = 64,
                                         .block_q = 16, .block_kv = 16};
            attn_block_mask *map;
            CHECK_STATUS(attn_block_mask_from_fn(ctx, &mc, hide_key5_head0, NULL, &map), ATTN_OK);
            float saved = v[5 * D + 7];
            if (c == 0) v[5 * D + 7] = poison;
            attn_kv_attend_args a = {.new_tokens = 8, .q_heads = H, .q = q, .k_new = k,
                                     .v_new = v, .out = out[c], .block_mask = map};
            CHECK_STATUS(attn_kv_cache_attend(cache, &a), ATTN_OK);
            v[5 * D + 7] = saved;
            attn_block_mask_free(map);
            attn_kv_cache_free(cache);
        }
        for (size_t r = 0; r < 8 * H; r++) sees[r] = r % H == 1 && r / H >= 5;
        check_poison_rows("poisoned value under a map", out[0], out[1], sees, 8, H, D);

        for (int c = 0; c < 2; c++) { /* a window of 4, a prompt of N rows, key 2 poisoned */
            attn_kv_cache *cache;
            size_t window[1] = {4};
            attn_kv_cache_config cfg = {.num_layers = 1, .batch = 1, .kv_heads = 1,
                                        .head_dim = D, .max_len = 2 * N, .windows = window};
            CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &cache), ATTN_OK);
            float saved = v[2 * D];
            if (c == 0) v[2 * D] = poison;
            attn_kv_attend_args a = {.new_tokens = N, .q_heads = H, .q = q, .k_new = k,
                                     .v_new = v, .out = out[c]};
            CHECK_STATUS(attn_kv_cache_attend(cache, &a), ATTN_OK);
            v[2 * D] = saved;
            attn_kv_cache_free(cache);
        }
        for (size_t r = 0; r < N * H; r++) sees[r] = r / H >= 2 && r / H <= 5;
        check_poison_rows("poisoned value behind a window", out[0], out[1], sees, N, H, D);
    }
    for (int i = 0; i < 2; i++) free(out[i]);
    free(q), free(k), free(v);
    attn_ctx_free(ctx);
}

int main(void) {
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    const char *env = getenv("ATTN_TEST_SEED");
    if (env) seed = strtoull(env, NULL, 10);
    printf("seed %llu (ATTN_TEST_SEED to repeat)\n", (unsigned long long)seed);
    rng_state = seed * 2654435761u + 1;
    test_sink_merge();
    test_refusals();
    test_nan_and_explain();
    test_tree();
    test_poisoned_values();
    test_against_reference();
    return check_summary();
}
