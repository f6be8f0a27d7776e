/*
 * test_kv_tree.c — trees of draft tokens over a KV cache (attn.h,
 * attn_tree_mask, attn_kv_cache_attend_tree, attn_kv_cache_append_branch):
 *   the mask: each row's bits are its ancestors and itself, depths count
 *     them; bad parents are refused by name;
 *   the attention: a random tree over a float32 cache (contiguous and
 *     paged, GQA, 1 and 2 threads, the fast and the reference kernels)
 *     against a dense oracle in double (every
 *     cached key, then the draft keys the tree shows); a chain (each draft
 *     the child of the one before) gives attn_kv_cache_attend's bits, in
 *     every K/V type; nothing is appended, so a tree runs in a cache with
 *     room for one more token only;
 *   the verified branch: appended, the cache then answers as one that
 *     appended those rows itself, bit for bit;
 *   refusals: a window layer, seq past the batch, rows not rising, a
 *     parent after its child (named by attn_kv_cache_attend_tree).
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
static float rand_normal(void) {
    double s = 0.0;
    for (int i = 0; i < 4; i++) s += (double)(next_u64() >> 11) / 9007199254740992.0;
    return (float)((s - 2.0) * 1.7320508);
}
static float *random_floats(size_t n) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = rand_normal();
    return x;
}

/* A random tree of n drafts: each one's parent an earlier draft or -1. */
static void random_parents(int32_t *parents, size_t n) {
    for (size_t r = 0; r < n; r++)
        parents[r] = rand_below(5) == 0 ? -1 : (int32_t)rand_below(r + 1) - 1;
}

static bool is_ancestor_or_self(const int32_t *parents, size_t r, size_t j) {
    for (int64_t a = (int64_t)r; a >= 0; a = parents[a])
        if ((size_t)a == j) return true;
    return false;
}

static void test_mask(attn_ctx *ctx) {
    for (int trial = 0; trial < 20; trial++) {
        size_t n = 1 + rand_below(150), words = (n + 63) / 64 + rand_below(2);
        int32_t *parents = malloc(n * sizeof *parents);
        uint64_t *bits = malloc(n * words * sizeof *bits);
        size_t *depth = malloc(n * sizeof *depth);
        random_parents(parents, n);
        CHECK_STATUS(attn_tree_mask(ctx, parents, n, bits, words, depth), ATTN_OK);
        size_t wrong = 0;
        for (size_t r = 0; r < n; r++) {
            size_t d = 0;
            for (int32_t a = parents[r]; a >= 0; a = parents[a]) d++;
            wrong += depth[r] != d;
            for (size_t j = 0; j < words * 64; j++) {
                bool bit = (bits[r * words + j / 64] >> (j % 64)) & 1u;
                wrong += bit != (j < n && is_ancestor_or_self(parents, r, j));
            }
        }
        CHECK(wrong == 0);
        free(parents);
        free(bits);
        free(depth);
    }
    int32_t bad[3] = {-1, 1, 0};
    uint64_t bits[3];
    CHECK_STATUS(attn_tree_mask(ctx, bad, 3, bits, 1, NULL), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "parents[1] is 1");
    bad[1] = -2;
    CHECK_STATUS(attn_tree_mask(ctx, bad, 3, bits, 1, NULL), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "parents[1] is -2");
    int32_t first[1] = {(int32_t)rand_below(3)};
    CHECK_STATUS(attn_tree_mask(ctx, first, 1, bits, 1, NULL), ATTN_ERR_INVALID);
    char text[80];
    snprintf(text, sizeof text, "parents[0] is %d: the first token's parent is -1", first[0]);
    CHECK_MESSAGE(ctx, text);
    int32_t many[65] = {0};
    many[0] = -1;
    CHECK_STATUS(attn_tree_mask(ctx, many, 65, bits, 1, NULL), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "1 words a row hold 64 tokens, not 65");
    /* counts whose words would wrap: refused before a parent is read */
    CHECK_STATUS(attn_tree_mask(ctx, many, SIZE_MAX - 62, bits, 0, NULL), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "0 words a row hold 0 tokens, not 18446744073709551553");
    CHECK_STATUS(attn_tree_mask(ctx, many, SIZE_MAX / 2, bits, 4, NULL), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "rows of 4 words overflow");
}

typedef struct setup {
    size_t batch, kv_heads, q_heads, D, cached, n;
    attn_kv_layout layout;
    attn_dtype type;
    bool tight; /* max_len one past the cached rows: a tree appends nothing, so it fits */
} setup;

/* A one-layer cache of s, every sequence holding s.cached random rows (k0, v0). */
static attn_kv_cache *cache_of(attn_ctx *ctx, const setup *s, const float *k0, const float *v0) {
    attn_kv_cache_config cfg = {.num_layers = 1, .batch = s->batch, .kv_heads = s->kv_heads,
                                .head_dim = s->D,
                                .max_len = s->cached + (s->tight ? 1 : s->n + 8),
                                .layout = s->layout, .page_size = 16, .k_dtype = s->type,
                                .v_dtype = s->type};
    attn_kv_cache *c = NULL;
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_OK);
    if (c && s->cached) CHECK_STATUS(attn_kv_cache_append(c, 0, NULL, s->cached, k0, v0), ATTN_OK);
    return c;
}

/* out (n, Hq, D) of draft rows over the cache of sequence seq and the tree, in double. */
static void oracle(const setup *s, size_t seq, const float *k0, const float *v0,
                   const int32_t *parents, const float *q, const float *k, const float *v,
                   double *out) {
    size_t Hq = s->q_heads, KH = s->kv_heads, D = s->D, G = Hq / KH, S = s->cached + s->n;
    double scale = 1.0 / sqrt((double)D), *w = malloc(S * sizeof *w);
    for (size_t r = 0; r < s->n; r++)
        for (size_t h = 0; h < Hq; h++) {
            size_t kh = h / G;
            double mx = -INFINITY, sum = 0.0;
            for (size_t j = 0; j < S; j++) {
                bool draft = j >= s->cached;
                if (draft && !is_ancestor_or_self(parents, r, j - s->cached)) {
                    w[j] = -INFINITY;
                    continue;
                }
                const float *kr = draft ? k + ((j - s->cached) * KH + kh) * D
                                        : k0 + ((seq * s->cached + j) * KH + kh) * D;
                double dot = 0.0;
                for (size_t d = 0; d < D; d++) dot += (double)q[(r * Hq + h) * D + d] * kr[d];
                w[j] = dot * scale;
                if (w[j] > mx) mx = w[j];
            }
            for (size_t j = 0; j < S; j++) sum += w[j] == -INFINITY ? 0.0 : exp(w[j] - mx);
            for (size_t d = 0; d < D; d++) {
                double acc = 0.0;
                for (size_t j = 0; j < S; j++) {
                    if (w[j] == -INFINITY) continue;
                    bool draft = j >= s->cached;
                    const float *vr = draft ? v + ((j - s->cached) * KH + kh) * D
                                            : v0 + ((seq * s->cached + j) * KH + kh) * D;
                    acc += exp(w[j] - mx) / sum * vr[d];
                }
                out[(r * Hq + h) * D + d] = acc;
            }
        }
    free(w);
}

static double rel_l2(const float *got, const double *want, size_t n) {
    double e = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) {
        e += (got[i] - want[i]) * (got[i] - want[i]);
        m += want[i] * want[i];
    }
    return sqrt(e / (m > 0 ? m : 1.0));
}

static void test_random_trees(void) {
    for (int trial = 0; trial < 12; trial++) {
        setup s = {.batch = 1 + rand_below(3), .kv_heads = 1 + rand_below(2), .D = 16 << rand_below(3),
                   .cached = rand_below(300), .n = 1 + rand_below(40),
                   .layout = rand_below(2) ? ATTN_KV_PAGED : ATTN_KV_CONTIGUOUS,
                   .type = ATTN_DTYPE_F32, .tight = rand_below(2)};
        s.q_heads = s.kv_heads * (1 + rand_below(4));
        size_t seq = rand_below(s.batch), threads = 1 + rand_below(2);
        attn_ctx *ctx = NULL;
        /* the reference ctx (the oracle's loops in the library) every other trial */
        attn_ctx_config cc = {.num_threads = threads,
                              .kernels = trial % 2 ? ATTN_KERNELS_REFERENCE : ATTN_KERNELS_AUTO};
        CHECK_STATUS(attn_ctx_new(&cc, &ctx), ATTN_OK);
        size_t row = s.kv_heads * s.D;
        float *k0 = random_floats(s.batch * s.cached * row + 1);
        float *v0 = random_floats(s.batch * s.cached * row + 1);
        float *q = random_floats(s.n * s.q_heads * s.D), *k = random_floats(s.n * row);
        float *v = random_floats(s.n * row), *out = calloc(s.n * s.q_heads * s.D, sizeof *out);
        double *want = malloc(s.n * s.q_heads * s.D * sizeof *want);
        int32_t *parents = malloc(s.n * sizeof *parents);
        random_parents(parents, s.n);
        attn_kv_cache *c = cache_of(ctx, &s, k0, v0);
        attn_kv_tree_args a = {.layer = 0, .seq = seq, .draft_tokens = s.n, .parents = parents,
                               .q_heads = s.q_heads, .q = q, .k_new = k, .v_new = v, .out = out};
        CHECK_STATUS(attn_kv_cache_attend_tree(c, &a), ATTN_OK);
        oracle(&s, seq, k0, v0, parents, q, k, v, want);
        double err = rel_l2(out, want, s.n * s.q_heads * s.D);
        if (!(err < 1e-5))
            fprintf(stderr, "tree of %zu over %zu cached (Hq %zu, Hkv %zu, D %zu): rel err %.3g\n",
                    s.n, s.cached, s.q_heads, s.kv_heads, s.D, err);
        CHECK(err < 1e-5);
        size_t len = 0;
        CHECK_STATUS(attn_kv_cache_length(c, 0, seq, &len), ATTN_OK);
        CHECK(len == s.cached); /* nothing appended */
        attn_kv_cache_free(c);
        attn_ctx_free(ctx);
        free(k0), free(v0), free(q), free(k), free(v), free(out), free(want), free(parents);
    }
}

/* A chain is causal decoding: attend_tree gives attend's bits, in every type;
 * then the branch appended gives the cache attend left, bit for bit. */
static void test_chain_and_branch(void) {
    static const attn_dtype types[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_I8,
                                       ATTN_DTYPE_I4};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (int layout = 0; layout < 2; layout++) {
            setup s = {.batch = 2, .kv_heads = 2, .q_heads = 4, .D = 64, .cached = 1 + rand_below(200),
                       .n = 2 + rand_below(9), .layout = layout ? ATTN_KV_PAGED : ATTN_KV_CONTIGUOUS,
                       .type = types[t]};
            attn_ctx *ctx = NULL;
            attn_ctx_config cc = {.num_threads = 2};
            CHECK_STATUS(attn_ctx_new(&cc, &ctx), ATTN_OK);
            size_t row = s.kv_heads * s.D, qn = s.n * s.q_heads * s.D, seq = 1;
            float *k0 = random_floats(s.batch * s.cached * row), *v0 = random_floats(s.batch * s.cached * row);
            float *q = random_floats(qn), *k = random_floats(s.n * row), *v = random_floats(s.n * row);
            float *out_tree = calloc(qn, sizeof(float)), *out_step = calloc(qn, sizeof(float));
            int32_t *chain = malloc(s.n * sizeof *chain), *all = malloc(s.n * sizeof *all);
            for (size_t r = 0; r < s.n; r++) chain[r] = (int32_t)r - 1, all[r] = (int32_t)r;
            attn_kv_cache *a = cache_of(ctx, &s, k0, v0), *b = cache_of(ctx, &s, k0, v0);
            attn_kv_tree_args ta = {.layer = 0, .seq = seq, .draft_tokens = s.n, .parents = chain,
                                    .q_heads = s.q_heads, .q = q, .k_new = k, .v_new = v,
                                    .out = out_tree};
            CHECK_STATUS(attn_kv_cache_attend_tree(a, &ta), ATTN_OK);
            size_t lens[2] = {0, s.n};
            attn_kv_attend_args sa = {.layer = 0, .new_lens = lens, .q_heads = s.q_heads, .q = q,
                                      .k_new = k, .v_new = v, .out = out_step};
            CHECK_STATUS(attn_kv_cache_attend(b, &sa), ATTN_OK);
            CHECK(memcmp(out_tree, out_step, qn * sizeof(float)) == 0);
            /* the whole chain verified: a's cache now equals b's */
            CHECK_STATUS(attn_kv_cache_append_branch(a, 0, seq, all, s.n, k, v), ATTN_OK);
            float *q1 = random_floats(s.q_heads * s.D), *k1 = random_floats(row), *v1 = random_floats(row);
            float *o1 = calloc(s.q_heads * s.D, sizeof(float)), *o2 = calloc(s.q_heads * s.D, sizeof(float));
            size_t one[2] = {0, 1};
            attn_kv_attend_args next = {.layer = 0, .new_lens = one, .q_heads = s.q_heads, .q = q1,
                                        .k_new = k1, .v_new = v1, .out = o1};
            CHECK_STATUS(attn_kv_cache_attend(a, &next), ATTN_OK);
            next.out = o2;
            CHECK_STATUS(attn_kv_cache_attend(b, &next), ATTN_OK);
            CHECK(memcmp(o1, o2, s.q_heads * s.D * sizeof(float)) == 0);
            attn_kv_cache_free(a);
            attn_kv_cache_free(b);
            attn_ctx_free(ctx);
            free(k0), free(v0), free(q), free(k), free(v), free(out_tree), free(out_step);
            free(chain), free(all), free(q1), free(k1), free(v1), free(o1), free(o2);
        }
}

/* A branch of a random tree appended: the next step equals a cache that
 * appended the same rows with attn_kv_cache_append. */
static void test_branch_of_tree(attn_ctx *ctx) {
    setup s = {.batch = 1, .kv_heads = 1, .q_heads = 2, .D = 32, .cached = 50, .n = 12,
               .layout = ATTN_KV_PAGED, .type = ATTN_DTYPE_F32};
    size_t row = s.kv_heads * s.D;
    float *k0 = random_floats(s.cached * row), *v0 = random_floats(s.cached * row);
    float *k = random_floats(s.n * row), *v = random_floats(s.n * row);
    int32_t parents[12];
    random_parents(parents, s.n);
    /* the branch ending at the last draft, root to leaf */
    int32_t path[12];
    size_t count = 0;
    for (int32_t r = (int32_t)s.n - 1; r >= 0; r = parents[r]) path[count++] = r;
    for (size_t i = 0; i < count / 2; i++) {
        int32_t x = path[i];
        path[i] = path[count - 1 - i];
        path[count - 1 - i] = x;
    }
    attn_kv_cache *a = cache_of(ctx, &s, k0, v0), *b = cache_of(ctx, &s, k0, v0);
    CHECK_STATUS(attn_kv_cache_append_branch(a, 0, 0, path, count, k, v), ATTN_OK);
    float *kb = malloc(count * row * sizeof(float)), *vb = malloc(count * row * sizeof(float));
    for (size_t i = 0; i < count; i++) {
        memcpy(kb + i * row, k + (size_t)path[i] * row, row * sizeof(float));
        memcpy(vb + i * row, v + (size_t)path[i] * row, row * sizeof(float));
    }
    CHECK_STATUS(attn_kv_cache_append(b, 0, NULL, count, kb, vb), ATTN_OK);
    float *q1 = random_floats(s.q_heads * s.D), *k1 = random_floats(row), *v1 = random_floats(row);
    float o1[64], o2[64];
    attn_kv_attend_args next = {.layer = 0, .new_tokens = 1, .q_heads = s.q_heads, .q = q1,
                                .k_new = k1, .v_new = v1, .out = o1};
    CHECK_STATUS(attn_kv_cache_attend(a, &next), ATTN_OK);
    next.out = o2;
    CHECK_STATUS(attn_kv_cache_attend(b, &next), ATTN_OK);
    CHECK(memcmp(o1, o2, s.q_heads * s.D * sizeof(float)) == 0);
    size_t len = 0;
    CHECK_STATUS(attn_kv_cache_length(a, 0, 0, &len), ATTN_OK);
    CHECK(len == s.cached + count + 1);
    /* refusals */
    int32_t falling[2] = {3, 1};
    CHECK_STATUS(attn_kv_cache_append_branch(a, 0, 0, falling, 2, k, v), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "rows[1] is 1");
    CHECK_STATUS(attn_kv_cache_append_branch(a, 0, 5, path, count, k, v), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "seq 5 is past the cache's batch of 1");
    attn_kv_tree_args ta = {.layer = 0, .seq = 3, .draft_tokens = s.n, .parents = parents,
                            .q_heads = s.q_heads, .q = q1, .k_new = k, .v_new = v, .out = o1};
    CHECK_STATUS(attn_kv_cache_attend_tree(a, &ta), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "seq 3 is past the cache's batch of 1");
    /* a bad parent is named by the call the caller made */
    int32_t late[3] = {-1, 2, 0};
    attn_kv_tree_args bad = {.layer = 0, .seq = 0, .draft_tokens = 3, .parents = late,
                             .q_heads = s.q_heads, .q = q1, .k_new = k, .v_new = v, .out = o1};
    CHECK_STATUS(attn_kv_cache_attend_tree(a, &bad), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "attn_kv_cache_attend_tree: attn_tree_mask: parents[1] is 2");
    ta.seq = 0, ta.draft_tokens = SIZE_MAX - 62;
    CHECK_STATUS(attn_kv_cache_attend_tree(a, &ta), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "a tree of 18446744073709551553 tokens overflows");
    attn_kv_cache_free(a);
    attn_kv_cache_free(b);
    size_t windows[1] = {8};
    attn_kv_cache_config wc = {.num_layers = 1, .batch = 1, .kv_heads = 1, .head_dim = 32,
                               .max_len = 64, .windows = windows};
    attn_kv_cache *w = NULL;
    CHECK_STATUS(attn_kv_cache_new(ctx, &wc, &w), ATTN_OK);
    ta.seq = 0;
    CHECK_STATUS(attn_kv_cache_attend_tree(w, &ta), ATTN_ERR_UNSUPPORTED);
    CHECK_MESSAGE(ctx, "layer 0 keeps a window of 8 positions");
    attn_kv_cache_free(w);
    /* a window of max_len or more sees every position: the layer keeps
     * every token, and runs the tree (it was refused) */
    windows[0] = rand_below(2) ? 64 : SIZE_MAX;
    CHECK_STATUS(attn_kv_cache_new(ctx, &wc, &w), ATTN_OK);
    int32_t root[1] = {-1};
    attn_kv_tree_args one = {.layer = 0, .seq = 0, .draft_tokens = 1, .parents = root,
                             .q_heads = s.q_heads, .q = q1, .k_new = k1, .v_new = v1, .out = o1};
    CHECK_STATUS(attn_kv_cache_attend_tree(w, &one), ATTN_OK);
    attn_kv_cache_free(w);
    free(k0), free(v0), free(k), free(v), free(kb), free(vb), free(q1), free(k1), free(v1);
}

int main(void) {
    const char *env = getenv("ATTN_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    if (!seed) seed = 1;
    rng_state = seed;
    printf("seed %llu (ATTN_TEST_SEED to repeat)\n", (unsigned long long)seed);
    attn_ctx *ctx = NULL;
    if (attn_ctx_new(NULL, &ctx) != ATTN_OK) return 1;
    test_mask(ctx);
    test_random_trees();
    test_chain_and_branch();
    test_branch_of_tree(ctx);
    attn_ctx_free(ctx);
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
