/*
 * attn_decode.c — attn's side of the flash-attention comparison with
 * llama.cpp (fa_harness.c is the other): one new token against a KV cache
 * of one layer filled to L tokens (attn_kv_cache_append), timed through
 * attn_kv_cache_attend, batch 1, q_heads query heads over kv_heads KV heads
 * of head_dim D, K and V stored as --dtype.
 *
 *   q      (1, q_heads, D)    random in [-1, 1)
 *   k, v   (L, kv_heads, D)   random in [-1, 1), stored as the dtype
 *   out    (1, q_heads, D)
 *
 * Each step appends its token, so the cache grows by one per step from L
 * (at most runs + warmup tokens: under 0.1% at L = 4096 and 64 runs).
 * Prints one line:
 *   attn_decode dtype=f32 D=128 L=16384 threads=1 runs=R ms=M gbs=G kv_bytes=B amx=A
 * with M the median ms per step and G the K/V bytes the cache holds at L
 * (attn_kv_cache_token_bytes x L) per second of that median, and A whether
 * the process was given the AMX tiles (granted or no). Exits 3 with
 * "pending: ..." when the cache refuses the dtype, 1 on other errors.
 */
#define _POSIX_C_SOURCE 200809L
#include <attn.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_RUNS = 1000, FILL_ROWS = 512 };

typedef struct dtype_name {
    const char *name;
    attn_dtype dtype;
} dtype_name;

static const dtype_name dtypes[] = {
    {"f32", ATTN_DTYPE_F32}, {"bf16", ATTN_DTYPE_BF16},   {"f16", ATTN_DTYPE_F16},
    {"int8", ATTN_DTYPE_I8}, {"fp8", ATTN_DTYPE_F8_E4M3}, {"int4", ATTN_DTYPE_I4},
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Uniform in [-1, 1) from a 64-bit LCG: the same numbers on every run. */
static float next_uniform(uint64_t *state) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static int usage(void) {
    fprintf(stderr,
            "usage: attn_decode [--dtype f32|bf16|f16|int8|fp8|int4] [--head-dim D]\n"
            "                   [--length L] [--threads N] [--runs R] [--q-heads H]\n"
            "                   [--kv-heads H]\n"
            "defaults: f32, D 128, L 4096, 1 thread, 20 runs, 32 over 8 heads\n");
    return 2;
}

static int parse_size(const char *s, size_t *out) {
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || v == 0) return -1;
    *out = (size_t)v;
    return 0;
}

int main(int argc, char **argv) {
    size_t head_dim = 128, length = 4096, threads = 1, runs = 20, q_heads = 32, kv_heads = 8;
    const dtype_name *dt = &dtypes[0];
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) return usage();
        const char *opt = argv[i], *val = argv[++i];
        int bad = 0;
        if (!strcmp(opt, "--dtype")) {
            dt = NULL;
            for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++)
                if (!strcmp(val, dtypes[k].name)) dt = &dtypes[k];
            bad = dt == NULL;
        } else if (!strcmp(opt, "--head-dim")) bad = parse_size(val, &head_dim);
        else if (!strcmp(opt, "--length")) bad = parse_size(val, &length);
        else if (!strcmp(opt, "--threads")) bad = parse_size(val, &threads);
        else if (!strcmp(opt, "--runs")) bad = parse_size(val, &runs);
        else if (!strcmp(opt, "--q-heads")) bad = parse_size(val, &q_heads);
        else if (!strcmp(opt, "--kv-heads")) bad = parse_size(val, &kv_heads);
        else bad = 1;
        if (bad) {
            fprintf(stderr, "attn_decode: bad option or value: %s %s\n", opt, val);
            return usage();
        }
    }
    if (runs > MAX_RUNS) runs = MAX_RUNS;

    const size_t row = kv_heads * head_dim, qrow = q_heads * head_dim;
    float *fill = malloc(2 * FILL_ROWS * row * sizeof(float));
    float *token = malloc((qrow + 2 * row) * sizeof(float));
    float *out = malloc(qrow * sizeof(float));
    double *t = malloc(runs * sizeof(double));
    if (!fill || !token || !out || !t) {
        fprintf(stderr, "attn_decode: out of memory\n");
        return 1;
    }
    uint64_t seed = 0x5eed;
    for (size_t i = 0; i < 2 * FILL_ROWS * row; i++) fill[i] = next_uniform(&seed);
    for (size_t i = 0; i < qrow + 2 * row; i++) token[i] = next_uniform(&seed);

    /* the AMX tiles, as an application that wants attn's AMX kernels asks
     * for them (bf16 keys are scored on them); refused where there are none */
    bool amx = attn_cpu_request_amx() == ATTN_OK;
    attn_ctx *ctx = NULL;
    attn_kv_cache *cache = NULL;
    attn_ctx_config cc = {.num_threads = threads};
    attn_status st = attn_ctx_new(&cc, &ctx);
    if (st != ATTN_OK) {
        fprintf(stderr, "attn_decode: attn_ctx_new: %s\n", attn_status_name(st));
        return 1;
    }
    attn_kv_cache_config cfg = {.num_layers = 1, .batch = 1, .kv_heads = kv_heads,
                                .head_dim = head_dim, .max_len = length + runs + 2,
                                .k_dtype = dt->dtype, .v_dtype = dt->dtype};
    st = attn_kv_cache_new(ctx, &cfg, &cache);
    if (st != ATTN_OK) {
        printf("pending: attn's KV cache refuses %s: %s\n", dt->name,
               attn_ctx_last_error(ctx));
        attn_ctx_free(ctx);
        return 3;
    }
    for (size_t at = 0; st == ATTN_OK && at < length; at += FILL_ROWS) {
        size_t n = length - at < FILL_ROWS ? length - at : FILL_ROWS;
        st = attn_kv_cache_append(cache, 0, NULL, n, fill, fill + FILL_ROWS * row);
    }
    attn_kv_attend_args a = {.new_tokens = 1, .q_heads = q_heads, .q = token,
                             .k_new = token + qrow, .v_new = token + qrow + row, .out = out};
    for (size_t r = 0; st == ATTN_OK && r <= runs; r++) {
        double t0 = now_s();
        st = attn_kv_cache_attend(cache, &a);
        if (r > 0) t[r - 1] = now_s() - t0; /* the first step warms the threads and caches */
    }
    if (st != ATTN_OK) {
        fprintf(stderr, "attn_decode: %s\n", attn_ctx_last_error(ctx));
        attn_kv_cache_free(cache);
        attn_ctx_free(ctx);
        return 1;
    }
    qsort(t, runs, sizeof t[0], cmp_double);
    double med = runs % 2 ? t[runs / 2] : 0.5 * (t[runs / 2 - 1] + t[runs / 2]);
    double kv_bytes = (double)attn_kv_cache_token_bytes(cache) * (double)length;
    printf("attn_decode dtype=%s D=%zu L=%zu threads=%zu runs=%zu ms=%.4f gbs=%.2f "
           "kv_bytes=%.0f amx=%s\n",
           dt->name, head_dim, length, threads, runs, 1e3 * med, kv_bytes / med * 1e-9, kv_bytes,
           amx ? "granted" : "no");
    attn_kv_cache_free(cache);
    attn_ctx_free(ctx);
    free(fill);
    free(token);
    free(out);
    free(t);
    return 0;
}
