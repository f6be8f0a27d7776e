/*
 * test_kv_types.c — KV caches of other element types than float32 (attn.h,
 * "Generation"; contract/kv_format.h):
 *   the formats: every fp8 e4m3 code read back and coded again; coding to
 *     nearest (ties to even) against a search of the e4m3 values written
 *     here; int8, int4 and fp8 rows within half a step of the input, their
 *     largest element exact; NaN and infinity carried as a NaN scale;
 *   the kernels: every pair of K and V types on every kernel set this CPU
 *     runs, against the reference ctx on the same steps (prompts, chunks,
 *     decode steps; GQA and a window layer): near it, and the same bits on
 *     a paged cache and 3 threads as on a contiguous one and 1 thread;
 *   a NaN key, in a float32 or an int8 cache, makes the rows that see it
 *     NaN, on the fast kernels and the reference, a row that sees it alone
 *     too; a prompt's NaN or infinite query makes its row NaN, softcap or
 *     not, and the rest of the call reads the cache as the reference does;
 *   fp8 and int8 keys of tiny scale under huge queries, whose float sums
 *     with the raw codes overflow though every score is finite: the fast
 *     kernels give the reference's output, not NaN;
 *   a cache whose values are its keys: the bits of one given the same rows
 *   as K and V, half its bytes, and what it refuses;
 *   the sizes (attn_kv_cache_token_bytes, attn_kv_cache_bytes) and the
 *   refusals: an unknown type, int4 with head_dim not a multiple of 32, a
 *   cache past the machine's memory.
 * Inputs are fresh random numbers each run (the seed is printed).
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"
#include "contract/kv_format.h"

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
static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = rand_normal();
}

static const attn_dtype TYPES[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16,    ATTN_DTYPE_F16,
                                   ATTN_DTYPE_F8_E4M3, ATTN_DTYPE_I8, ATTN_DTYPE_I4};
#define NUM_TYPES (sizeof TYPES / sizeof TYPES[0])

/* ---- the formats -------------------------------------------------------------- */

/* The value of e4m3 code c from its definition (1.m x 2^(e - 7), or m x 2^-9). */
static double e4m3_value(unsigned c) {
    unsigned e = (c >> 3) & 15u, m = c & 7u;
    double a = e == 0 ? m * ldexp(1.0, -9) : ldexp(1.0 + m / 8.0, (int)e - 7);
    return c & 0x80u ? -a : a;
}

/* The nearest e4m3 code to x (|x| <= 448), ties to the even code. */
static unsigned e4m3_nearest(float x) {
    double a = fabs((double)x);
    unsigned best = 0;
    for (unsigned c = 1; c < 127; c++) {
        double d = fabs(e4m3_value(c) - a), db = fabs(e4m3_value(best) - a);
        if (d < db || (d == db && (c & 1u) == 0)) best = c;
    }
    return best | (signbit(x) ? 0x80u : 0u);
}

static void test_e4m3(void) {
    for (unsigned c = 0; c < 256; c++) {
        if ((c & 0x7Fu) == 0x7Fu) {
            CHECK(isnan(attn_e4m3_to_float((uint8_t)c)));
            continue;
        }
        CHECK(attn_e4m3_to_float((uint8_t)c) == (float)e4m3_value(c));
        CHECK(attn_float_to_e4m3(attn_e4m3_to_float((uint8_t)c)) == c);
    }
    /* random values across the range, and the midpoints between neighbours */
    for (int i = 0; i < 20000; i++) {
        float x = (rand_uniform() * 2.0f - 1.0f) * ldexpf(1.0f, (int)rand_below(18) - 9);
        if (fabsf(x) > 448.0f) continue;
        CHECK(attn_float_to_e4m3(x) == e4m3_nearest(x));
    }
    for (unsigned c = 0; c < 126; c++) {
        float mid = (float)((e4m3_value(c) + e4m3_value(c + 1)) / 2.0);
        CHECK(attn_float_to_e4m3(mid) == e4m3_nearest(mid));
        CHECK(attn_float_to_e4m3(-mid) == e4m3_nearest(-mid));
    }
    CHECK(attn_float_to_e4m3(1e9f) == 0x7Eu);   /* saturates at 448 */
    CHECK(attn_float_to_e4m3(NAN) == 0x7Fu);
}

/* A random row coded and read back: within half a step of the input, the
 * largest element exact (to float rounding). */
static void test_row_bounds(attn_dtype dt, size_t D) {
    attn_kv_format f = attn_kv_format_of(dt, D);
    float x[128], scales[8];
    uint8_t codes[512];
    for (int trial = 0; trial < 50; trial++) {
        float spread = ldexpf(1.0f, (int)rand_below(20) - 10);
        for (size_t e = 0; e < D; e++) x[e] = rand_normal() * spread;
        attn_kv_quantize(&f, x, codes, scales);
        size_t group = dt == ATTN_DTYPE_I4 ? ATTN_KV_I4_GROUP : D;
        for (size_t g0 = 0; g0 < D; g0 += group) {
            double amax = 0.0;
            for (size_t e = g0; e < g0 + group; e++) amax = fmax(amax, fabs((double)x[e]));
            for (size_t e = g0; e < g0 + group; e++) {
                double got = attn_kv_read(&f, codes, scales, e), err = fabs(got - x[e]);
                /* integers: half a step of the stored float scale s (amax / 127
                 * or / 7, rounded), and the code x * (top / amax) rounded in
                 * float32 may sit a few ulps of top from x / s, which moves a
                 * value at a half step by that much; fp8 relative, 2^-4 of the
                 * value (3 fraction bits), or half its smallest step 2^-9 s */
                double top = dt == ATTN_DTYPE_I8 ? 127 : 7;
                double bound = dt != ATTN_DTYPE_F8_E4M3
                                   ? scales[g0 / group] * (0.5 + top * ldexp(1.0, -22))
                                   : fmax(fabs((double)x[e]) / 16, amax / 448 * ldexp(1.0, -10));
                CHECK(err <= bound * (1 + 1e-6) + 1e-30);
                if (fabs((double)x[e]) == amax) CHECK(fabs(fabs(got) - amax) <= amax * 1e-6);
            }
        }
    }
    /* rows whose largest value is tiny (below about 1e-36, where top / amax
     * overflows float): coded as any other, within half a step of amax (fp8:
     * 1/16), zeros zero */
    bool scaled = dt == ATTN_DTYPE_I8 || dt == ATTN_DTYPE_F8_E4M3 || dt == ATTN_DTYPE_I4;
    for (int trial = 0; scaled && trial < 20; trial++) {
        float amax = ldexpf(1.0f + rand_uniform(), -(int)rand_below(6) - 122);
        for (size_t e = 0; e < D; e++) x[e] = (rand_uniform() * 2.0f - 1.0f) * amax;
        x[rand_below(D)] = amax;
        x[rand_below(D)] = 0.0f;
        attn_kv_quantize(&f, x, codes, scales);
        double step = dt == ATTN_DTYPE_I8 ? 0.5 / 127 : dt == ATTN_DTYPE_I4 ? 0.5 / 7 : 1.0 / 16;
        for (size_t e = 0; e < D; e++) {
            double got = attn_kv_read(&f, codes, scales, e);
            CHECK(fabs(got - x[e]) <= step * amax * 1.01 + ldexp(1.0, -149) * 128);
            if (x[e] == 0.0f) CHECK(got == 0.0);
        }
    }
    /* zeros read back as zeros; a NaN or an infinity makes the row (group) NaN */
    for (size_t e = 0; e < D; e++) x[e] = 0.0f;
    attn_kv_quantize(&f, x, codes, scales);
    for (size_t e = 0; e < D; e++) CHECK(attn_kv_read(&f, codes, scales, e) == 0.0f);
    for (int bad = 0; bad < 2; bad++) {
        fill(x, D);
        x[3] = bad ? INFINITY : NAN;
        attn_kv_quantize(&f, x, codes, scales);
        for (size_t e = 0; e < (dt == ATTN_DTYPE_I4 ? 32u : D); e++)
            CHECK(isnan(attn_kv_read(&f, codes, scales, e)));
    }
}

/* ---- every pair of types on every kernel set ------------------------------------ */

enum { KH = 2, GROUP = 3, H = KH * GROUP, D = 64, BATCH = 2, MAX_LEN = 300 };

typedef struct run {
    attn_ctx *ctx;
    attn_kv_cache *cache;
} run;

static void run_new(run *r, attn_kernels kernels, size_t threads, attn_kv_layout layout,
                    attn_dtype kt, attn_dtype vt, const size_t *windows) {
    attn_ctx_config cc = {.num_threads = threads, .kernels = kernels};
    CHECK_STATUS(attn_ctx_new(&cc, &r->ctx), ATTN_OK);
    attn_kv_cache_config cfg = {.num_layers = 2, .batch = BATCH, .kv_heads = KH, .head_dim = D,
                                .max_len = MAX_LEN, .layout = layout, .page_size = 7,
                                .windows = windows, .k_dtype = kt, .v_dtype = vt};
    CHECK_STATUS(attn_kv_cache_new(r->ctx, &cfg, &r->cache), ATTN_OK);
}

static void run_free(run *r) {
    attn_kv_cache_free(r->cache);
    attn_ctx_free(r->ctx);
}

static float *attend(run *r, size_t layer, const size_t *lens, const float *q, const float *k,
                     const float *v, size_t rows) {
    float *out = malloc((rows * H * D + 1) * sizeof(float));
    attn_kv_attend_args a = {.layer = layer, .new_lens = lens, .q_heads = H, .q = q,
                             .k_new = k, .v_new = v, .out = out};
    CHECK_STATUS(attn_kv_cache_attend(r->cache, &a), ATTN_OK);
    return out;
}

/* The steps: a prompt through the fused path and a short one, then chunks
 * and single tokens; on a full layer and a window layer. The fast kernel set
 * runs a contiguous cache on 1 thread and a paged one on 3 (the same bits),
 * the reference a contiguous one; returns the largest |fast - reference|. */
static double compare_pair(attn_kernels kernels, attn_dtype kt, attn_dtype vt) {
    static const size_t windows[2] = {0, 24};
    run fast1, fast3, ref;
    run_new(&fast1, kernels, 1, ATTN_KV_CONTIGUOUS, kt, vt, windows);
    run_new(&fast3, kernels, 3, ATTN_KV_PAGED, kt, vt, windows);
    run_new(&ref, ATTN_KERNELS_REFERENCE, 2, ATTN_KV_CONTIGUOUS, kt, vt, windows);
    double worst = 0.0;
    for (int t = 0; t < 8; t++) {
        size_t lens[BATCH] = {t == 0 ? 90 : t < 3 ? 1 + rand_below(12) : 1,
                              t == 0 ? 9 : rand_below(3)};
        size_t rows = lens[0] + lens[1];
        float *q = malloc(rows * H * D * sizeof(float)), *k = malloc(rows * KH * D * sizeof(float)),
              *v = malloc(rows * KH * D * sizeof(float));
        fill(q, rows * H * D);
        fill(k, rows * KH * D);
        fill(v, rows * KH * D);
        for (size_t layer = 0; layer < 2; layer++) {
            float *a = attend(&fast1, layer, lens, q, k, v, rows);
            float *b = attend(&fast3, layer, lens, q, k, v, rows);
            float *c = attend(&ref, layer, lens, q, k, v, rows);
            CHECK(memcmp(a, b, rows * H * D * sizeof(float)) == 0);
            /* a prompt's first step on the fast kernels attends in float32 */
            size_t from = t == 0 ? lens[0] : 0;
            for (size_t i = from * H * D; i < rows * H * D; i++) {
                double e = fabs((double)a[i] - c[i]); /* NaN: the worst (fmax drops it) */
                if (!(e <= worst)) worst = e;
            }
            free(a), free(b), free(c);
        }
        free(q), free(k), free(v);
    }
    run_free(&fast1);
    run_free(&fast3);
    run_free(&ref);
    return worst;
}

static void test_pairs(void) {
    static const attn_kernels sets[] = {ATTN_KERNELS_PORTABLE, ATTN_KERNELS_AVX2,
                                        ATTN_KERNELS_AVX512};
    for (size_t s = 0; s < 3; s++) {
        if (!attn_kernels_supported(sets[s])) continue;
        double worst = 0.0;
        for (size_t i = 0; i < NUM_TYPES; i++)
            for (size_t j = 0; j < NUM_TYPES; j++) {
                double w = compare_pair(sets[s], TYPES[i], TYPES[j]);
                if (!(w <= 2e-5))
                    printf("FAIL %s: K %s, V %s: |fast - reference| %.3g\n",
                           attn_kernels_name(sets[s]), attn_dtype_name(TYPES[i]),
                           attn_dtype_name(TYPES[j]), w);
                CHECK(w <= 2e-5);
                worst = check_worse(worst, w);
            }
        printf("%s: %zu pairs of K and V types, worst |fast - reference| %.3g\n",
               attn_kernels_name(sets[s]), NUM_TYPES * NUM_TYPES, worst);
    }
}

/* One step of a one-head cache of K type kt (V float32, head_dim 64) over
 * keys k (n rows) with query q and scale, on kernels; into out (64). */
static void one_head_step(attn_kernels kernels, attn_dtype kt, const float *q, const float *k,
                          const float *v, size_t n, double scale, float *out) {
    attn_ctx *ctx;
    attn_ctx_config cc = {.num_threads = 1, .kernels = kernels};
    CHECK_STATUS(attn_ctx_new(&cc, &ctx), ATTN_OK);
    attn_kv_cache *c = NULL;
    attn_kv_cache_config cfg = {.num_layers = 1, .batch = 1, .kv_heads = 1, .head_dim = 64,
                                .max_len = 64, .k_dtype = kt, .v_dtype = ATTN_DTYPE_F32};
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_OK);
    CHECK_STATUS(attn_kv_cache_append(c, 0, NULL, n - 1, k, v), ATTN_OK);
    attn_kv_attend_args a = {.new_tokens = 1, .q_heads = 1, .q = q, .k_new = k + (n - 1) * 64,
                             .v_new = v + (n - 1) * 64, .scale = scale, .out = out};
    CHECK_STATUS(attn_kv_cache_attend(c, &a), ATTN_OK);
    attn_kv_cache_free(c);
    attn_ctx_free(ctx);
}

/* Queries the tiles cannot take as they are, against the reference
 * kernels (a hostile test's cases): int8 keys under one query element far
 * above the rest, whose key codes are 0 there (the others' digits would
 * be coarse: such a head stays on the vector path), and under a subnormal
 * query with a scale of 1e38 (its power of two taken out in double); bf16
 * keys whose products with a tiny query are subnormal (the head is scaled
 * up first: the tiles flush subnormal products). */
static void test_amx_extremes(void) {
    enum { N = 3 };
    float q[64], k[N * 64], v[N * 64], fast[64], ref[64];
    for (int c = 0; c < 5; c++) {
        attn_dtype kt = c < 3 ? ATTN_DTYPE_I8 : ATTN_DTYPE_BF16;
        double scale = 0.0;
        for (size_t d = 0; d < 64; d++) {
            for (size_t j = 0; j < N; j++) {
                float sign = j == 0 ? 1.0f : j == 1 ? -1.0f : 0.0f;
                k[j * 64 + d] = d == 0 && c < 2 ? 0.0f : sign * (float)((d % 5) + 1);
                v[j * 64 + d] = sign;
            }
            q[d] = 0.1f + 0.002f * (float)d;
        }
        if (c == 0) q[0] = 1e30f;
        if (c == 1) q[0] = 1e4f;
        if (c == 2) { /* subnormal queries, scale 1e38 */
            for (size_t d = 0; d < 64; d++) q[d] = (float)((int)(d % 5) - 2) * 1e-39f;
            scale = 1e38;
        }
        if (c == 3 || c == 4) { /* products below float's normal range */
            for (size_t d = 0; d < 64; d++) {
                q[d] = c == 3 ? 1e-5f : 1e-20f;
                for (size_t j = 0; j < 2; j++)
                    k[j * 64 + d] = (j ? -1.0f : 1.0f) * (c == 3 ? 1e-34f : 1e-20f);
            }
            scale = 1e38;
        }
        one_head_step(ATTN_KERNELS_AVX512, kt, q, k, v, N, scale, fast);
        one_head_step(ATTN_KERNELS_REFERENCE, kt, q, k, v, N, scale, ref);
        double worst = 0.0;
        for (size_t d = 0; d < 64; d++) {
            double e = fabs((double)fast[d] - ref[d]); /* NaN: the worst (fmax drops it) */
            if (!(e <= worst)) worst = e;
        }
        if (!(worst <= 1e-5))
            printf("FAIL avx512+amx extreme case %d (K %s): |fast - reference| %.3g (out[0] %g "
                   "against %g)\n", c, attn_dtype_name(kt), worst, (double)fast[0],
                   (double)ref[0]);
        CHECK(worst <= 1e-5);
    }
}

/* Keys of fp8 and int8 rows whose scale is far below 1 under queries far
 * above it: the queries' sums with the raw codes (up to 127, or 1.75 for
 * e4m3 read as codes times 2^-8) overflow float before the row's factor
 * brings them down (keys and queries of one sign), while every score
 * q . k * scale is finite. Each fast
 * kernel set gives the reference's output, not NaN. */
static void test_scaled_key_extremes(void) {
    static const attn_kernels sets[] = {ATTN_KERNELS_PORTABLE, ATTN_KERNELS_AVX2,
                                        ATTN_KERNELS_AVX512};
    enum { N = 20 };
    float q[64], k[N * 64], v[N * 64], fast[64], ref[64];
    for (int c = 0; c < 2; c++) {
        attn_dtype kt = c ? ATTN_DTYPE_F8_E4M3 : ATTN_DTYPE_I8;
        float kmag = c ? 1e-37f : 1e-30f, qmag = c ? 1e38f : 1e36f;
        for (size_t i = 0; i < N * 64; i++) {
            k[i] = kmag * (0.5f + 0.5f * rand_uniform());
            v[i] = (float)(i % 7);
        }
        for (size_t d = 0; d < 64; d++) q[d] = qmag * (0.5f + 0.5f * rand_uniform());
        one_head_step(ATTN_KERNELS_REFERENCE, kt, q, k, v, N, 1e-6, ref);
        for (size_t s = 0; s < 3; s++) {
            if (!attn_kernels_supported(sets[s])) continue;
            one_head_step(sets[s], kt, q, k, v, N, 1e-6, fast);
            double worst = 0.0;
            for (size_t d = 0; d < 64; d++) { /* NaN: the worst (fmax drops it) */
                double e = fabs((double)fast[d] - ref[d]) / (1.0 + fabs(ref[d]));
                if (!(e <= worst)) worst = e;
            }
            if (!(worst <= 1e-5))
                printf("FAIL %s: K %s of %g under queries of %g: out[0] %g against %g\n",
                       attn_kernels_name(sets[s]), attn_dtype_name(kt), (double)kmag,
                       (double)qmag, (double)fast[0], (double)ref[0]);
            CHECK(worst <= 1e-5);
        }
    }
}

/* bf16 and int8 keys on AMX tiles, where the OS gives this process the
 * tiles (as an application asks for them: the library never does by
 * itself): the decode names the kernel, and every V type's pair with those
 * K types is near the reference, the same bits paged on 3 threads
 * (compare_pair). A NaN query with int8 keys (which the tiles' fixed point
 * cannot carry) still makes its rows NaN, and only them. */
static void test_amx_keys(void) {
    attn_cpu_info cpu;
    if (!attn_kernels_supported(ATTN_KERNELS_AVX512) || attn_cpu_request_amx() != ATTN_OK ||
        attn_cpu_info_get(&cpu) != ATTN_OK || !cpu.amx_bf16) {
        printf("AMX pass skipped: no AMX tiles for this process on this CPU/OS\n");
        return;
    }
    static const attn_dtype tiled[2] = {ATTN_DTYPE_BF16, ATTN_DTYPE_I8};
    static const size_t windows[2] = {0, 0};
    for (size_t t = 0; t < 2; t++) {
        run r;
        run_new(&r, ATTN_KERNELS_AVX512, 1, ATTN_KV_CONTIGUOUS, tiled[t], ATTN_DTYPE_F32,
                windows);
        size_t lens[BATCH] = {1, 1};
        float q[BATCH * H * D], k[BATCH * KH * D], v[BATCH * KH * D];
        fill(q, BATCH * H * D);
        fill(k, BATCH * KH * D);
        fill(v, BATCH * KH * D);
        free(attend(&r, 0, lens, q, k, v, BATCH));
        const char *explain = attn_ctx_last_explain(r.ctx);
        if (!strstr(explain, "avx512+amx"))
            printf("FAIL: %s keys did not run on AMX: %s\n", attn_dtype_name(tiled[t]), explain);
        CHECK(strstr(explain, "avx512+amx") != NULL);
        q[5] = NAN; /* sequence 0's first head */
        float *out = attend(&r, 0, lens, q, k, v, BATCH);
        for (size_t i = 0; i < BATCH * H * D; i++) CHECK(isnan(out[i]) == (i / D == 0));
        free(out);
        run_free(&r);
        double worst = 0.0;
        for (size_t j = 0; j < NUM_TYPES; j++) {
            double w = compare_pair(ATTN_KERNELS_AVX512, tiled[t], TYPES[j]);
            if (!(w <= 2e-5))
                printf("FAIL avx512+amx: K %s, V %s: |fast - reference| %.3g\n",
                       attn_dtype_name(tiled[t]), attn_dtype_name(TYPES[j]), w);
            CHECK(w <= 2e-5);
            worst = check_worse(worst, w);
        }
        printf("avx512+amx: K %s with %zu V types, worst |fast - reference| %.3g\n",
               attn_dtype_name(tiled[t]), NUM_TYPES, worst);
    }
    test_amx_extremes();
}

/* ---- NaN, sizes, refusals ----------------------------------------------------- */

static void test_nan_carried(void) {
    for (int variant = 0; variant < 4; variant++) { /* fast, reference x f32, int8 */
        run r;
        run_new(&r, variant / 2 ? ATTN_KERNELS_REFERENCE : ATTN_KERNELS_AUTO, 2,
                ATTN_KV_CONTIGUOUS,
                variant % 2 ? ATTN_DTYPE_I8 : ATTN_DTYPE_F32, ATTN_DTYPE_F32, (size_t[2]){0, 0});
        size_t lens[BATCH] = {4, 4};
        float q[8 * H * D], k[8 * KH * D], v[8 * KH * D];
        fill(q, 8 * H * D);
        fill(k, 8 * KH * D);
        fill(v, 8 * KH * D);
        k[(1 * KH + 0) * D + 5] = NAN; /* sequence 0, token 1, KV head 0 */
        /* sequence 1, token 0, KV head 0: its first row sees that key alone,
         * every score of its chunk NaN (the chunk's max stays -inf) */
        k[(4 * KH + 0) * D + 2] = NAN;
        float *out = attend(&r, 0, lens, q, k, v, 8);
        for (size_t row = 0; row < 8; row++)
            for (size_t h = 0; h < H; h++) {
                bool sees = row >= 1 && h / GROUP == 0;
                CHECK(isnan(out[(row * H + h) * D]) == sees);
            }
        free(out);
        run_free(&r);
    }
}

/* A prompt (an empty cache, 64 rows or more) whose query holds NaN or an
 * infinity: the row with it is NaN on the fast kernels as on the reference,
 * softcap or not (a softcapped infinite score is not a finite one), and the
 * rest of the call reads the stored keys and values as the reference does.
 * The fused kernels decline such a query, and the dense problem they leave
 * would hide a -inf score's key or softcap it to a finite one. */
static void test_prompt_query_not_finite(void) {
    static const float bad[3] = {NAN, INFINITY, -INFINITY};
    enum { ROWS = 74, BAD_ROW = 5, BAD_HEAD = 1 };
    size_t lens[BATCH] = {70, 4};
    float *q = malloc(ROWS * H * D * sizeof(float)), *k = malloc(ROWS * KH * D * sizeof(float)),
          *v = malloc(ROWS * KH * D * sizeof(float)), *out[2];
    for (size_t t = 0; t < 2; t++)
        for (size_t b = 0; b < 3; b++)
            for (int capped = 0; capped < 2; capped++) {
                attn_dtype dt = t ? ATTN_DTYPE_I8 : ATTN_DTYPE_F32;
                fill(q, ROWS * H * D);
                fill(k, ROWS * KH * D);
                fill(v, ROWS * KH * D);
                q[(BAD_ROW * H + BAD_HEAD) * D + 3] = bad[b];
                for (int ref = 0; ref < 2; ref++) {
                    run r;
                    run_new(&r, ref ? ATTN_KERNELS_REFERENCE : ATTN_KERNELS_AUTO, 2,
                            ATTN_KV_CONTIGUOUS, dt, dt, NULL);
                    out[ref] = malloc(ROWS * H * D * sizeof(float));
                    attn_kv_attend_args a = {.layer = 0, .new_lens = lens, .q_heads = H, .q = q,
                                             .k_new = k, .v_new = v, .out = out[ref],
                                             .softcap = capped ? 5.0f : 0.0f};
                    CHECK_STATUS(attn_kv_cache_attend(r.cache, &a), ATTN_OK);
                    run_free(&r);
                }
                double worst = 0.0;
                size_t nan_rows = 0;
                for (size_t row = 0; row < ROWS; row++)
                    for (size_t h = 0; h < H; h++) {
                        const float *f = out[0] + (row * H + h) * D;
                        const float *g = out[1] + (row * H + h) * D;
                        bool nan_row = row == BAD_ROW && h == BAD_HEAD;
                        for (size_t e = 0; e < D; e++) {
                            nan_rows += nan_row && isnan(f[e]);
                            if (nan_row) continue;
                            double err = fabs((double)f[e] - g[e]);
                            if (!(err <= worst)) worst = err;
                        }
                    }
                if (nan_rows != D || !(worst <= 2e-5))
                    printf("FAIL prompt query %g, %s cache, softcap %d: %zu of %d NaN in its row, "
                           "|fast - reference| elsewhere %.3g\n", (double)bad[b],
                           attn_dtype_name(dt), capped ? 5 : 0, nan_rows, (int)D, worst);
                CHECK(nan_rows == D);
                CHECK(worst <= 2e-5);
                free(out[0]), free(out[1]);
            }
    free(q), free(k), free(v);
}

static void test_sizes_and_refusals(void) {
    attn_ctx *ctx;
    CHECK_STATUS(attn_ctx_new(NULL, &ctx), ATTN_OK);
    attn_kv_cache *c = NULL;
    attn_kv_cache_config cfg = {.num_layers = 3, .batch = 2, .kv_heads = 2, .head_dim = 64,
                                .max_len = 10, .k_dtype = ATTN_DTYPE_F32,
                                .v_dtype = ATTN_DTYPE_I4};
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_OK);
    /* per layer and token: K 2 x 64 floats, V 2 x (32 bytes + 2 scales) */
    size_t per_token = 3 * (2 * 64 * 4 + 2 * (32 + 2 * 4));
    CHECK(attn_kv_cache_token_bytes(c) == per_token);
    CHECK(attn_kv_cache_bytes(c) == 2 * 10 * per_token);
    attn_kv_cache_free(c);
    const size_t expect[NUM_TYPES] = {256, 128, 128, 64 + 4, 64 + 4, 32 + 8};
    for (size_t i = 0; i < NUM_TYPES; i++) {
        cfg = (attn_kv_cache_config){.num_layers = 1, .batch = 1, .kv_heads = 1,
                                     .head_dim = 64, .max_len = 4, .k_dtype = TYPES[i],
                                     .v_dtype = TYPES[i]};
        CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_OK);
        CHECK(attn_kv_cache_token_bytes(c) == 2 * expect[i]);
        attn_kv_cache_free(c);
    }
    cfg.k_dtype = ATTN_DTYPE_U16;
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "k_dtype 8 (U16) is not a KV cache type");
    cfg.k_dtype = ATTN_DTYPE_F32;
    cfg.v_dtype = ATTN_DTYPE_I4;
    cfg.head_dim = 48;
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "v_dtype I4 stores groups of 32 elements; head_dim 48");
    cfg.head_dim = 64;
    cfg.max_len = (size_t)1 << 44; /* 2^44 tokens x 288 bytes: past any machine here */
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_ERR_NO_MEMORY);
    CHECK_MESSAGE(ctx, "is past this machine's memory");
    CHECK(c == NULL);
    /* many layers of one token: their records, not their tokens, pass
     * memory; refused at once, before any loop over the layers */
    cfg = (attn_kv_cache_config){.num_layers = (size_t)1 << 40, .batch = 1, .kv_heads = 1,
                                 .head_dim = 1, .max_len = 1};
    clock_t t0 = clock();
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_ERR_NO_MEMORY);
    CHECK_MESSAGE(ctx, "the records of 1099511627776 layers");
    CHECK((double)(clock() - t0) / CLOCKS_PER_SEC < 0.5);
    cfg.num_layers = SIZE_MAX / 8;
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_ERR_OVERFLOW);
    /* paged with a few pages but a page table of 2^32 entries per layer:
     * the tables count (8 layers x 16 GiB, past any machine here) */
    cfg = (attn_kv_cache_config){.num_layers = 8, .batch = 1, .kv_heads = 1, .head_dim = 8,
                                 .max_len = (size_t)1 << 36, .layout = ATTN_KV_PAGED,
                                 .page_size = 16, .num_pages = 4};
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_ERR_NO_MEMORY);
    CHECK_MESSAGE(ctx, "bytes of page tables");
    /* *out is NULL after every failure, a NULL ctx or cfg included */
    c = (attn_kv_cache *)&cfg;
    CHECK_STATUS(attn_kv_cache_new(NULL, &cfg, &c), ATTN_ERR_NULL);
    CHECK(c == NULL);
    c = (attn_kv_cache *)&cfg;
    CHECK_STATUS(attn_kv_cache_new(ctx, NULL, &c), ATTN_ERR_NULL);
    CHECK(c == NULL);
    attn_ctx_free(ctx);
}

/* int8 K beside f16 V, an odd count of K's one-byte codes in a call's new
 * rows (3 rows x head_dim 3): V's 16-bit codes are read and written where
 * they are aligned (UBSan's alignment check, under make sanitize), and the
 * step agrees with the reference kernels. */
static void test_odd_code_bytes(void) {
    static const attn_dtype vt[2] = {ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
    for (size_t t = 0; t < 2; t++) {
        float out[2][3 * 3];
        for (int ref = 0; ref < 2; ref++) {
            attn_ctx *ctx;
            attn_ctx_config cc = {.kernels = ref ? ATTN_KERNELS_REFERENCE : ATTN_KERNELS_AUTO};
            CHECK_STATUS(attn_ctx_new(&cc, &ctx), ATTN_OK);
            attn_kv_cache *c = NULL;
            attn_kv_cache_config cfg = {.num_layers = 1, .batch = 1, .kv_heads = 1,
                                        .head_dim = 3, .max_len = 8, .k_dtype = ATTN_DTYPE_I8,
                                        .v_dtype = vt[t]};
            CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_OK);
            float q[9] = {0.5f, -1, 2, 1, 0.25f, -0.5f, -2, 1, 1};
            float k[9] = {1, 2, 3, -1, 0.5f, 2, 0, 1, -1}, v[9] = {3, -2, 1, 0.5f, 4, -1, 2, 2, 2};
            attn_kv_attend_args a = {.new_tokens = 3, .q_heads = 1, .q = q, .k_new = k,
                                     .v_new = v, .out = out[ref]};
            CHECK_STATUS(attn_kv_cache_attend(c, &a), ATTN_OK);
            attn_kv_cache_free(c);
            attn_ctx_free(ctx);
        }
        for (size_t i = 0; i < 9; i++) CHECK(fabsf(out[0][i] - out[1][i]) <= 1e-5f);
    }
}

/* A cache whose values are its keys (values_are_keys) against a cache of
 * the same type given the same rows as K and as V: the same bits from
 * prompts, chunks, single tokens, a draft tree and its appended branch, on a
 * full and a window layer, contiguous on 1 thread and paged on 3, while it
 * holds half the bytes, and on the reference kernels; v_new NULL or k_new,
 * anything else refused, and a v_dtype other than k_dtype. */
static void test_values_are_keys(void) {
    static const size_t windows[2] = {0, 24};
    for (size_t i = 0; i < NUM_TYPES; i++)
        for (int setup = 0; setup < 3; setup++) { /* contiguous, paged, the reference kernels */
            bool paged = setup == 1;
            attn_ctx_config cc = {.num_threads = paged ? 3 : 1,
                                  .kernels = setup == 2 ? ATTN_KERNELS_REFERENCE : ATTN_KERNELS_AUTO};
            attn_ctx *ctx;
            CHECK_STATUS(attn_ctx_new(&cc, &ctx), ATTN_OK);
            attn_kv_cache_config cfg = {.num_layers = 2, .batch = BATCH, .kv_heads = KH,
                                        .head_dim = D, .max_len = MAX_LEN,
                                        .layout = paged ? ATTN_KV_PAGED : ATTN_KV_CONTIGUOUS,
                                        .page_size = 7, .windows = windows,
                                        .k_dtype = TYPES[i], .v_dtype = TYPES[i]};
            attn_kv_cache *two = NULL, *one = NULL;
            CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &two), ATTN_OK);
            cfg.values_are_keys = true;
            CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &one), ATTN_OK);
            if (!two || !one) break;
            CHECK(attn_kv_cache_get_config(one).values_are_keys);
            CHECK(2 * attn_kv_cache_token_bytes(one) == attn_kv_cache_token_bytes(two));
            CHECK(2 * attn_kv_cache_bytes(one) == attn_kv_cache_bytes(two));
            for (int t = 0; t < 6; t++) {
                size_t lens[BATCH] = {t == 0 ? 90 : t < 3 ? 1 + rand_below(12) : 1,
                                      t == 0 ? 9 : rand_below(3)};
                size_t rows = lens[0] + lens[1];
                float *q = malloc(rows * H * D * sizeof(float)),
                      *k = malloc(rows * KH * D * sizeof(float)),
                      *out = malloc(2 * rows * H * D * sizeof(float));
                fill(q, rows * H * D);
                fill(k, rows * KH * D);
                for (size_t layer = 0; layer < 2; layer++) {
                    attn_kv_attend_args a = {.layer = layer, .new_lens = lens, .q_heads = H,
                                             .q = q, .k_new = k, .v_new = k, .out = out};
                    CHECK_STATUS(attn_kv_cache_attend(two, &a), ATTN_OK);
                    a.out = out + rows * H * D;
                    a.v_new = t % 2 ? k : NULL;
                    CHECK_STATUS(attn_kv_cache_attend(one, &a), ATTN_OK);
                    CHECK(memcmp(out, out + rows * H * D, rows * H * D * sizeof(float)) == 0);
                }
                free(q), free(k), free(out);
            }
            /* a tree of 3 drafts on layer 0, then its branch 0 -> 2 */
            int32_t parents[3] = {-1, 0, 0}, branch[2] = {0, 2};
            float q[3 * H * D], k[3 * KH * D], out[2][3 * H * D];
            fill(q, sizeof q / sizeof q[0]);
            fill(k, sizeof k / sizeof k[0]);
            attn_kv_tree_args ta = {.seq = 1, .draft_tokens = 3, .parents = parents,
                                    .q_heads = H, .q = q, .k_new = k, .v_new = k, .out = out[0]};
            CHECK_STATUS(attn_kv_cache_attend_tree(two, &ta), ATTN_OK);
            ta.v_new = NULL;
            ta.out = out[1];
            CHECK_STATUS(attn_kv_cache_attend_tree(one, &ta), ATTN_OK);
            CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0);
            CHECK_STATUS(attn_kv_cache_append_branch(two, 0, 1, branch, 2, k, k), ATTN_OK);
            CHECK_STATUS(attn_kv_cache_append_branch(one, 0, 1, branch, 2, k, NULL), ATTN_OK);
            size_t ones[BATCH] = {1, 1};
            attn_kv_attend_args a = {.new_lens = ones, .q_heads = H, .q = q, .k_new = k,
                                     .v_new = k, .out = out[0]};
            CHECK_STATUS(attn_kv_cache_attend(two, &a), ATTN_OK);
            a.out = out[1];
            CHECK_STATUS(attn_kv_cache_attend(one, &a), ATTN_OK);
            CHECK(memcmp(out[0], out[1], 2 * H * D * sizeof(float)) == 0);
            /* values other than the keys would be dropped unseen: refused,
             * nothing appended */
            size_t before = 0, after = 0;
            CHECK_STATUS(attn_kv_cache_length(one, 0, 0, &before), ATTN_OK);
            a.v_new = k + KH * D;
            CHECK_STATUS(attn_kv_cache_attend(one, &a), ATTN_ERR_INVALID);
            CHECK_MESSAGE(ctx, "attn_kv_cache_attend: the cache's values are its keys "
                               "(values_are_keys): v_new [");
            CHECK_STATUS(attn_kv_cache_append(one, 0, ones, 0, k, k + 1), ATTN_ERR_INVALID);
            CHECK_MESSAGE(ctx, "attn_kv_cache_append: the cache's values are its keys");
            CHECK_STATUS(attn_kv_cache_append(one, 0, ones, 0, NULL, NULL), ATTN_ERR_NULL);
            CHECK_MESSAGE(ctx, "attn_kv_cache_append: k_new is NULL (k_new must not be NULL)");
            CHECK_STATUS(attn_kv_cache_length(one, 0, 0, &after), ATTN_OK);
            CHECK(before == after);
            CHECK_STATUS(attn_kv_cache_append(two, 0, ones, 0, k, NULL), ATTN_ERR_NULL);
            CHECK_MESSAGE(ctx, "attn_kv_cache_append: v_new is NULL (k_new and v_new must not be "
                               "NULL)");
            attn_kv_cache_free(two);
            attn_kv_cache_free(one);
            if (i + 1 < NUM_TYPES || setup < 2) {
                attn_ctx_free(ctx);
                continue;
            }
            attn_kv_cache *c = (attn_kv_cache *)&cfg;
            cfg.v_dtype = TYPES[0];
            CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &c), ATTN_ERR_INVALID);
            CHECK_MESSAGE(ctx, "attn_kv_cache_new: values_are_keys stores one array: v_dtype "
                               "F32 is not k_dtype I4");
            CHECK(c == NULL);
            attn_ctx_free(ctx);
        }
}

int main(void) {
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    const char *env = getenv("ATTN_TEST_SEED");
    if (env) seed = strtoull(env, NULL, 10);
    printf("seed %llu (ATTN_TEST_SEED to repeat)\n", (unsigned long long)seed);
    rng_state = seed * 2654435761u + 1;
    test_e4m3();
    for (size_t i = 3; i < NUM_TYPES; i++) { /* the scaled ones; core/half.h's test has the rest */
        test_row_bounds(TYPES[i], 64);
        test_row_bounds(TYPES[i], 128);
    }
    test_nan_carried();
    test_prompt_query_not_finite();
    test_sizes_and_refusals();
    test_odd_code_bytes();
    test_values_are_keys();
    test_scaled_key_extremes();
    test_pairs();
    test_amx_keys();
    return check_summary();
}
