/*
 * fa_harness.c — llama.cpp's side of the flash-attention comparison
 * (attn_decode.c is attn's): ggml's ggml_flash_attn_ext on the CPU for one
 * query token against L cached keys and values, through ggml's public API
 * only (ggml.h, ggml-cpu.h), built by build.sh against the vendored ggml.
 *
 * Shapes in ggml's order (fastest dimension first), as test-backend-ops
 * lays them out for FLASH_ATTN_EXT:
 *   q     [D, 1, q_heads, 1]    float32, random in [-1, 1)
 *   k, v  [D, L, kv_heads, 1]   f32, f16 or q8_0, from random [-1, 1)
 *   out   [D, q_heads, 1, 1]    float32
 * No mask (one token sees the whole cache, as attn_decode's does), scale
 * 1/sqrt(D), no ALiBi, no softcap. The graph is one node, computed on a
 * ggml threadpool made once, as llama.cpp keeps one across decode steps.
 *
 * Prints one line:
 *   fa_harness type=f16 D=128 L=16384 threads=1 runs=R ms=M gbs=G kv_bytes=B
 * M the median ms of R computes after one warm-up; G the K and V bytes
 * (ggml_nbytes of both) per second of that median.
 */
#include <ggml-cpu.h>
#include <ggml.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_RUNS = 1000 };

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float next_uniform(uint64_t *state) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static int usage(void) {
    fprintf(stderr, "usage: fa_harness [--type f32|f16|q8_0] [--head-dim D] [--length L]\n"
                    "                  [--threads N] [--runs R] [--q-heads H] [--kv-heads H]\n"
                    "defaults: f32, D 128, L 4096, 1 thread, 20 runs, 32 over 8 heads\n");
    return 2;
}

static int parse_int(const char *s, int *out) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v <= 0 || v > (1L << 30)) return -1;
    *out = (int)v;
    return 0;
}

/* Fills t (rows of t->ne[0] elements) with random floats converted to its type. */
static int fill_random(struct ggml_tensor *t, uint64_t *seed) {
    const int64_t n_per_row = t->ne[0], nrows = ggml_nrows(t);
    float *src = malloc((size_t)(n_per_row * nrows) * sizeof(float));
    if (!src) return -1;
    for (int64_t i = 0; i < n_per_row * nrows; i++) src[i] = next_uniform(seed);
    if (t->type == GGML_TYPE_F32)
        memcpy(t->data, src, (size_t)(n_per_row * nrows) * sizeof(float));
    else if (t->type == GGML_TYPE_F16)
        ggml_fp32_to_fp16_row(src, t->data, n_per_row * nrows);
    else
        ggml_quantize_chunk(t->type, src, t->data, 0, nrows, n_per_row, NULL);
    free(src);
    return 0;
}

int main(int argc, char **argv) {
    int head_dim = 128, length = 4096, threads = 1, runs = 20, q_heads = 32, kv_heads = 8;
    enum ggml_type type = GGML_TYPE_F32;
    const char *type_name = "f32";
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) return usage();
        const char *opt = argv[i], *val = argv[++i];
        int bad = 0;
        if (!strcmp(opt, "--type")) {
            type_name = val;
            if (!strcmp(val, "f32")) type = GGML_TYPE_F32;
            else if (!strcmp(val, "f16")) type = GGML_TYPE_F16;
            else if (!strcmp(val, "q8_0")) type = GGML_TYPE_Q8_0;
            else bad = 1;
        } else if (!strcmp(opt, "--head-dim")) bad = parse_int(val, &head_dim);
        else if (!strcmp(opt, "--length")) bad = parse_int(val, &length);
        else if (!strcmp(opt, "--threads")) bad = parse_int(val, &threads);
        else if (!strcmp(opt, "--runs")) bad = parse_int(val, &runs);
        else if (!strcmp(opt, "--q-heads")) bad = parse_int(val, &q_heads);
        else if (!strcmp(opt, "--kv-heads")) bad = parse_int(val, &kv_heads);
        else bad = 1;
        if (bad) {
            fprintf(stderr, "fa_harness: bad option or value: %s %s\n", opt, val);
            return usage();
        }
    }
    if (runs > MAX_RUNS) runs = MAX_RUNS;
    if (q_heads % kv_heads || head_dim % ggml_blck_size(type)) {
        fprintf(stderr, "fa_harness: q_heads %d must be a multiple of kv_heads %d and head_dim "
                        "%d of the %s block %lld\n",
                q_heads, kv_heads, head_dim, type_name, (long long)ggml_blck_size(type));
        return 2;
    }

    ggml_cpu_init();
    const size_t kv_row = ggml_row_size(type, head_dim);
    const size_t data = (size_t)head_dim * (size_t)q_heads * sizeof(float) * 2 +
                        2 * kv_row * (size_t)length * (size_t)kv_heads;
    struct ggml_init_params ip = {
        .mem_size = data + 16 * ggml_tensor_overhead() + ggml_graph_overhead() + (1 << 20),
        .mem_buffer = NULL,
        .no_alloc = false,
    };
    struct ggml_context *ctx = ggml_init(ip);
    if (!ctx) {
        fprintf(stderr, "fa_harness: ggml_init could not take %zu bytes\n", ip.mem_size);
        return 1;
    }
    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, head_dim, 1, q_heads, 1);
    struct ggml_tensor *k = ggml_new_tensor_4d(ctx, type, head_dim, length, kv_heads, 1);
    struct ggml_tensor *v = ggml_new_tensor_4d(ctx, type, head_dim, length, kv_heads, 1);
    uint64_t seed = 0x5eed;
    if (fill_random(q, &seed) || fill_random(k, &seed) || fill_random(v, &seed)) {
        fprintf(stderr, "fa_harness: out of memory\n");
        return 1;
    }
    struct ggml_tensor *out =
        ggml_flash_attn_ext(ctx, q, k, v, NULL, 1.0f / sqrtf((float)head_dim), 0.0f, 0.0f);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);

    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    struct ggml_threadpool *pool = ggml_threadpool_new(&tpp);
    struct ggml_cplan plan = ggml_graph_plan(gf, threads, pool);
    void *work = plan.work_size ? malloc(plan.work_size) : NULL;
    double *t = malloc((size_t)runs * sizeof(double));
    if (!pool || (plan.work_size && !work) || !t) {
        fprintf(stderr, "fa_harness: no threadpool or out of memory (work %zu bytes)\n",
                plan.work_size);
        return 1;
    }
    plan.work_data = work;
    for (int r = 0; r <= runs; r++) {
        int64_t t0 = ggml_time_us();
        enum ggml_status st = ggml_graph_compute(gf, &plan);
        int64_t t1 = ggml_time_us();
        if (st != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "fa_harness: ggml_graph_compute: %s\n", ggml_status_to_string(st));
            return 1;
        }
        if (r > 0) t[r - 1] = 1e-6 * (double)(t1 - t0); /* the first warms the pool */
    }
    qsort(t, (size_t)runs, sizeof t[0], cmp_double);
    double med = runs % 2 ? t[runs / 2] : 0.5 * (t[runs / 2 - 1] + t[runs / 2]);
    double kv_bytes = (double)(ggml_nbytes(k) + ggml_nbytes(v));
    /* A finite output shows the op ran on real data, not on an empty graph. */
    float probe = ((const float *)out->data)[0];
    printf("fa_harness type=%s D=%d L=%d threads=%d runs=%d ms=%.4f gbs=%.2f kv_bytes=%.0f "
           "out0=%.6f\n",
           type_name, head_dim, length, threads, runs, 1e3 * med, kv_bytes / med * 1e-9, kv_bytes,
           probe);
    ggml_threadpool_free(pool);
    free(work);
    free(t);
    ggml_free(ctx);
    return isfinite(probe) ? 0 : 1;
}
