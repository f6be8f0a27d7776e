/*
 * test_registry.c — the runner's choice among the registered backends, as
 * attn_ctx_last_explain records it: the order asked, each decline with its
 * reason, the backend (and kernels) that ran.
 *
 *   - the registry holds fused, fused16, decode and the reference, in that
 *     order;
 *   - float32 runs fused on a fast ctx, the reference on a reference ctx
 *     (fused declining for that reason);
 *   - values past float32's range in the tiles: fused declines them (after
 *     its pass, or before it), the reference runs, and the result is the
 *     reference's bit for bit (a reference ctx on the same inputs);
 *   - float64 views: fused and fused16 decline, the reference runs, and its
 *     out is this file's own float64 attention within 1e-12;
 *   - bf16 with dropout and f16: fused16 declines (dropout; the dtype),
 *     the problem is widened to float32 and fused runs it; bf16 without
 *     dropout on a CPU with avx512_bf16 where vdpbf16ps pays (or is
 *     forced): fused16 runs;
 *   - a KV cache (contiguous and paged): a prompt into an empty cache is a
 *     dense problem that fused runs; a decode step's K and V come from the
 *     cache, which fused declines and the decode backend runs (the
 *     reference on a reference ctx), with the same bits on both layouts;
 *   - a problem no backend runs (a chain of score modifiers over a cache,
 *     a backward from a cache) is refused before anything is written,
 *     every reason named.
 * Fresh random inputs each run (the seed is printed; argv[1] replays it).
 */
#include "attn.h"
#include "check.h"
#include "half.h"
#include "internal.h"
#include "attention/attention.h"
#include "ops/sdpa16.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t state;
static double uniform(void) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(state >> 11) * 0x1p-53 * 2.0 - 1.0;
}

enum { B = 1, H = 4, HKV = 2, T = 96, D = 64 };

static const char *explain_of(attn_ctx *ctx) { return attn_ctx_last_explain(ctx); }

/* Whether the record holds text (and prints it when it does not). */
static bool says(attn_ctx *ctx, const char *text) {
    bool found = strstr(explain_of(ctx), text) != NULL;
    if (!found) fprintf(stderr, "explain '%s' lacks '%s'\n", explain_of(ctx), text);
    return found;
}

static attn_sdpa_config config(void) {
    return (attn_sdpa_config){.batch = B, .heads = H, .kv_heads = HKV, .q_tokens = T,
                              .kv_tokens = T, .head_dim = D, .causal = true};
}

static void registry_order(void) {
    size_t n;
    const attn_attention_backend *const *all = attn_attention_registry(&n);
    CHECK(n == 5);
    CHECK(n == 5 && all[0] == &attn_attention_fused && all[1] == &attn_attention_fused16 &&
          all[2] == &attn_attention_decode && all[3] == &attn_attention_flex &&
          all[4] == &attn_attention_reference);
}

static void float32_choices(attn_ctx *fast, attn_ctx *ref, float *q, float *k, float *v) {
    attn_sdpa_config cfg = config();
    float *out = malloc(B * H * T * D * sizeof *out), *out_ref = malloc(B * H * T * D * 4);
    CHECK(attn_sdpa_forward(fast, &cfg, q, k, v, out, NULL, NULL, NULL) == ATTN_OK);
    if (attn_ctx_kernels(fast) != ATTN_KERNELS_REFERENCE)
        CHECK(strncmp(explain_of(fast), "fused [", 7) == 0 && says(fast, "]: ran") &&
              !strstr(explain_of(fast), "declined"));
    /* a refused call ran no backend: its explain is empty, not the last run's */
    attn_sdpa_config bad = cfg;
    bad.head_dim = 0;
    CHECK(attn_sdpa_forward(fast, &bad, q, k, v, out, NULL, NULL, NULL) == ATTN_ERR_SHAPE);
    CHECK(explain_of(fast)[0] == '\0');
    CHECK(attn_sdpa_forward(fast, &cfg, q, k, v, out, NULL, NULL, NULL) == ATTN_OK);
    CHECK(explain_of(fast)[0] != '\0');
    CHECK(attn_sdpa_forward(fast, &cfg, q, k, v, q, NULL, NULL, NULL) == ATTN_ERR_INVALID);
    CHECK(explain_of(fast)[0] == '\0');
    CHECK(attn_sdpa_forward(ref, &cfg, q, k, v, out_ref, NULL, NULL, NULL) == ATTN_OK);
    CHECK(says(ref, "fused: declined (the ctx runs the reference kernels)") &&
          says(ref, "fused16: declined (its kernels read bf16)") && says(ref, "reference: ran"));
    /* q . k past float32: fused declines, the reference runs, its bits */
    float kept = q[5];
    q[5] = 3e37f;
    CHECK(attn_sdpa_forward(fast, &cfg, q, k, v, out, NULL, NULL, NULL) == ATTN_OK);
    CHECK(attn_sdpa_forward(ref, &cfg, q, k, v, out_ref, NULL, NULL, NULL) == ATTN_OK);
    if (attn_ctx_kernels(fast) != ATTN_KERNELS_REFERENCE) {
        CHECK(says(fast, "declined (a non-finite input, or scores past float32's range"));
        CHECK(says(fast, "reference: ran"));
        CHECK(memcmp(out, out_ref, B * H * T * D * sizeof *out) == 0);
    }
    q[5] = kept;
    free(out);
    free(out_ref);
}

/* out (B, T, H, D) of causal attention in double: this file's truth. */
static void attention_f64(const double *q, const double *k, const double *v, double *out) {
    double scale = 1.0 / sqrt((double)D), w[T];
    for (size_t h = 0; h < H; h++)
        for (size_t i = 0; i < T; i++) {
            size_t g = h / (H / HKV);
            const double *qi = q + (i * H + h) * D;
            double m = -INFINITY, sum = 0.0;
            for (size_t j = 0; j <= i; j++) {
                double s = 0.0;
                for (size_t d = 0; d < D; d++) s += qi[d] * k[(j * HKV + g) * D + d];
                w[j] = s * scale;
                m = w[j] > m ? w[j] : m;
            }
            for (size_t j = 0; j <= i; j++) sum += (w[j] = exp(w[j] - m));
            for (size_t d = 0; d < D; d++) {
                double acc = 0.0;
                for (size_t j = 0; j <= i; j++) acc += w[j] * v[(j * HKV + g) * D + d];
                out[(i * H + h) * D + d] = acc / sum;
            }
        }
}

static void float64_choice(attn_ctx *fast) {
    attn_sdpa_config cfg = config();
    size_t nq = B * T * H * D, nk = B * T * HKV * D;
    double *q = malloc(nq * 8), *k = malloc(nk * 8), *v = malloc(nk * 8), *out = malloc(nq * 8),
           *want = malloc(nq * 8);
    for (size_t i = 0; i < nq; i++) q[i] = uniform();
    for (size_t i = 0; i < nk; i++) k[i] = uniform(), v[i] = uniform();
    CHECK(attn_sdpa_forward_f64(fast, &cfg, q, k, v, out, NULL, NULL, NULL) == ATTN_OK);
    CHECK(says(fast, "fused: declined (its kernels read float32)") &&
          says(fast, "fused16: declined (its kernels read bf16)") && says(fast, "reference: ran"));
    attention_f64(q, k, v, want);
    double worst = 0.0;
    for (size_t i = 0; i < nq; i++) worst = check_worse(worst, fabs(out[i] - want[i]));
    CHECK(worst < 1e-12);
    free(q), free(k), free(v), free(out), free(want);
}

/* bf16 and f16 copies of x, rounded to nearest even. */
static uint16_t *to16(const float *x, size_t n, attn_dtype dtype) {
    uint16_t *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++)
        y[i] = dtype == ATTN_DTYPE_BF16 ? attn_float_to_bf16(x[i]) : attn_float_to_f16(x[i]);
    return y;
}

static void sixteen_bit_choices(attn_ctx *fast, const float *q, const float *k, const float *v) {
    attn_sdpa_config cfg = config();
    size_t nq = B * T * H * D, nk = B * T * HKV * D;
    attn_dtype dtypes[2] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
    bool fast_kernels = attn_ctx_kernels(fast) != ATTN_KERNELS_REFERENCE;
    for (int t = 0; t < 2; t++) {
        uint16_t *q16 = to16(q, nq, dtypes[t]), *k16 = to16(k, nk, dtypes[t]),
                 *v16 = to16(v, nk, dtypes[t]), *out = malloc(nq * 2);
        attn_rng *rng = NULL;
        attn_sdpa_dropout drawn;
        CHECK(attn_rng_new(fast, 7, &rng) == ATTN_OK &&
              attn_rng_set_bernoulli_method(rng, ATTN_BERNOULLI_PHILOX) == ATTN_OK);
        cfg.dropout = 0.1;
        CHECK(attn_sdpa_forward_16(fast, &cfg, dtypes[t], q16, k16, v16, out, NULL, rng,
                                   &drawn) == ATTN_OK);
        CHECK(says(fast, t == 1                ? "fused16: declined (its kernels read bf16)"
                         : fast->ks.flash16_dot ? "fused16: declined (dropout)"
                                : "fused16: declined (the ctx's kernels have no bf16 kernels)"));
        CHECK(says(fast, "reference: declined (it reads float32 and float64)"));
        CHECK(says(fast, fast_kernels ? "widened to float32: ran; fused [" :
                                        "widened to float32: ran; fused: declined"));
        cfg.dropout = 0.0;
        CHECK(attn_sdpa_forward_16(fast, &cfg, dtypes[t], q16, k16, v16, out, NULL, NULL,
                                   NULL) == ATTN_OK);
        const char *kernel = attn_sdpa16_kernel(fast, &cfg, dtypes[t], false);
        if (strcmp(kernel, "widened") == 0)
            CHECK(says(fast, "widened to float32: ran"));
        else
            CHECK(strncmp(explain_of(fast), "fused: declined (its kernels read float32); "
                                            "fused16 [", 53) == 0 &&
                  says(fast, kernel) && !strstr(explain_of(fast), "widened"));
        attn_rng_free(rng);
        free(q16), free(k16), free(v16), free(out);
    }
}

/* A prompt of 80 tokens, then 3 decode steps, on a cache of layout. */
static void cache_choices(attn_ctx *ctx, attn_kv_layout layout, float *out_last) {
    attn_kv_cache *cache = NULL;
    attn_kv_cache_config cfg = {.num_layers = 1, .batch = 1, .kv_heads = HKV, .head_dim = D,
                                .max_len = 128, .layout = layout, .page_size = 16};
    CHECK(attn_kv_cache_new(ctx, &cfg, &cache) == ATTN_OK);
    if (!cache) return;
    size_t n = 80, nq = n * H * D, nk = n * HKV * D;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *out = malloc(nq * 4);
    uint64_t kept = state;
    state = 99; /* the same tokens on every ctx and layout */
    for (size_t i = 0; i < nq; i++) q[i] = (float)uniform();
    for (size_t i = 0; i < nk; i++) k[i] = (float)uniform(), v[i] = (float)uniform();
    state = kept;
    bool fast = attn_ctx_kernels(ctx) != ATTN_KERNELS_REFERENCE;
    attn_kv_attend_args a = {.new_tokens = n, .q_heads = H, .q = q, .k_new = k, .v_new = v,
                             .out = out};
    CHECK(attn_kv_cache_attend(cache, &a) == ATTN_OK);
    if (fast)
        CHECK(strncmp(explain_of(ctx), "fused [", 7) == 0 && says(ctx, "]: ran"));
    else
        CHECK(says(ctx, "decode: declined (the ctx runs the reference kernels); flex: declined "
                        "(the ctx runs the reference kernels); reference [K F32, V F32]: ran"));
    for (size_t step = 0; step < 3; step++) {
        a = (attn_kv_attend_args){.new_tokens = 1, .q_heads = H, .q = q + step * H * D,
                                  .k_new = k + step * HKV * D, .v_new = v + step * HKV * D,
                                  .out = out_last};
        CHECK(attn_kv_cache_attend(cache, &a) == ATTN_OK);
        CHECK(says(ctx, fast ? "fused: declined (K and V come from a KV cache)"
                             : "fused: declined (the ctx runs the reference kernels)"));
        CHECK(says(ctx, fast ? "; decode [" : "decode: declined (the ctx runs the reference"));
        CHECK(fast ? !strstr(explain_of(ctx), "reference") && says(ctx, ", K F32, V F32]: ran")
                   : says(ctx, "reference [K F32, V F32]: ran"));
    }
    attn_kv_cache_free(cache);
    free(q), free(k), free(v), free(out);
}

/* A problem no backend runs (a chain of score modifiers over a cache; a
 * backward from one): refused before anything is written, each backend's
 * reason named. */
static void nothing_runs(attn_ctx *ctx) {
    size_t cached[1] = {8}, rows[1] = {1}, start[1] = {0};
    float pool[16 * HKV * D] = {0}, q[H * D] = {0}, k[HKV * D] = {0}, out[H * D];
    for (size_t i = 0; i < H * D; i++) out[i] = 7.0f;
    attn_kv_cache_view view = {.cached = cached, .new_rows = rows, .row_start = start,
                               .k = {ATTN_DTYPE_F32, pool, NULL, k, NULL},
                               .v = {ATTN_DTYPE_F32, pool, NULL, k, NULL}, .capacity = 16};
    attn_view_strides qs = {0, H * D, D}, ks = {0, HKV * D, D};
    attn_attention_problem p = {
        .batch = 1, .q_heads = H, .kv_heads = HKV, .q_len = 1, .kv_len = 9, .head_dim = D,
        .v_head_dim = D, .q = attn_view_f32(q, qs), .k = attn_view_f32(k, ks),
        .v = attn_view_f32(k, ks), .out = attn_view_f32(out, qs), .scale = 0.125f,
        .scale_f64 = 0.125, .causal = true, .kv_cache = &view};
    attn_score_mod chain[1] = {{.kind = ATTN_SCORE_SCALE, .value = 2.0}};
    p.score_mods = chain;
    p.score_mod_count = 1;
    CHECK(attn_attention_forward(ctx, "test", &p, NULL, NULL, NULL, NULL, NULL) ==
          ATTN_ERR_UNSUPPORTED);
    const char *e = attn_ctx_last_error(ctx);
    CHECK(strstr(e, "test: no backend runs this problem") && strstr(e, "decode: declined") &&
          strstr(e, "reference: declined"));
    if (attn_ctx_kernels(ctx) != ATTN_KERNELS_REFERENCE)
        CHECK(strstr(e, "(score modifiers)") != NULL);
    CHECK(out[0] == 7.0f && out[H * D - 1] == 7.0f); /* nothing written */
    p.score_mods = NULL;
    p.score_mod_count = 0;
    float dq[H * D];
    attn_attention_grads g = {.dout = q, .dq = dq, .dk = k, .dv = k};
    CHECK(attn_attention_backward(ctx, "test", &p, NULL, &g, NULL) == ATTN_ERR_UNSUPPORTED);
    CHECK(strstr(attn_ctx_last_error(ctx), "no backend runs this problem") != NULL);
    CHECK(attn_attention_forward(ctx, "test", &p, NULL, NULL, NULL, NULL, NULL) == ATTN_OK);
}

static void cache_layouts(attn_ctx *ctx) {
    float a[H * D], b[H * D];
    cache_choices(ctx, ATTN_KV_CONTIGUOUS, a);
    cache_choices(ctx, ATTN_KV_PAGED, b);
    CHECK(memcmp(a, b, sizeof a) == 0);
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)seed);
    state = seed;
    registry_order();
    attn_ctx *fast = NULL, *ref = NULL, *forced = NULL;
    CHECK(attn_ctx_new(&(attn_ctx_config){.num_threads = 2}, &fast) == ATTN_OK);
    CHECK(attn_ctx_new(&(attn_ctx_config){.num_threads = 2}, &forced) == ATTN_OK);
    CHECK(attn_ctx_new(&(attn_ctx_config){.kernels = ATTN_KERNELS_REFERENCE}, &ref) == ATTN_OK);
    if (!fast || !ref || !forced) return check_summary();
    CHECK(strcmp(attn_ctx_last_explain(fast), "") == 0);
    attn_sdpa16_force_dot(forced);
    size_t nq = B * T * H * D, nk = B * T * HKV * D;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
    for (size_t i = 0; i < nq; i++) q[i] = (float)uniform();
    for (size_t i = 0; i < nk; i++) k[i] = (float)uniform(), v[i] = (float)uniform();
    float32_choices(fast, ref, q, k, v);
    float64_choice(fast);
    sixteen_bit_choices(fast, q, k, v);
    sixteen_bit_choices(forced, q, k, v);
    sixteen_bit_choices(ref, q, k, v);
    cache_layouts(fast);
    cache_layouts(ref);
    nothing_runs(fast);
    nothing_runs(ref);
    free(q), free(k), free(v);
    attn_ctx_free(fast);
    attn_ctx_free(forced);
    attn_ctx_free(ref);
    return check_summary();
}
