/*
 * decode_chunk_cycles.c — the arithmetic of the decode kernel without the
 * memory: one query row (q_heads = 4 x kv_heads) against a cache of L
 * positions small enough to stay in L1/L2, the chunk kernel of the widest
 * instruction set this CPU has (AVX-512, else AVX2) called over and over,
 * nanoseconds per block of 16 positions and KV head, best of 5 rounds.
 *
 *   cc -O2 -DATTN_HAVE_X86_KERNELS -Isrc -Isrc/core -Iinclude \
 *      bench/micro/decode_chunk_cycles.c build/libattn.a -lm -lpthread -o /tmp/dcc
 *   /tmp/dcc [L 64] [calls 20000] [kv_heads 8] [dtype f32] [head_dim 128]
 *
 * dtype: f32, bf16, f16, fp8, int8 or int4, K and V alike. A block and KV
 * head cost 2 x 4 x 16 x head_dim multiply-adds (the 4 query heads' scores
 * and their weighing of the values): 512 FMAs of 16 lanes at head_dim 128,
 * the bound at one 16-lane FMA a cycle (two 8-lane ones).
 * Not part of the build: it reads the library's internal headers.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include "contract/kv_format.h"
#include "kernels/decode/decode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float uniform(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

static const struct {
    const char *name;
    attn_dtype dtype;
} dtypes[] = {{"f32", ATTN_DTYPE_F32}, {"bf16", ATTN_DTYPE_BF16}, {"f16", ATTN_DTYPE_F16},
              {"fp8", ATTN_DTYPE_F8_E4M3}, {"int8", ATTN_DTYPE_I8}, {"int4", ATTN_DTYPE_I4}};

int main(int argc, char **argv) {
    size_t L = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    long calls = argc > 2 ? strtol(argv[2], NULL, 10) : 20000;
    size_t KH = argc > 3 ? strtoul(argv[3], NULL, 10) : 8, H = 4 * KH;
    const char *name = argc > 4 ? argv[4] : "f32";
    size_t D = argc > 5 ? strtoul(argv[5], NULL, 10) : 128;
    size_t t = 0;
    while (t < sizeof dtypes / sizeof dtypes[0] && strcmp(dtypes[t].name, name) != 0) t++;
    if (t == sizeof dtypes / sizeof dtypes[0] || L == 0 || KH == 0 || D == 0 || D % 32) {
        fprintf(stderr, "usage: dcc [L] [calls] [kv_heads] [f32|bf16|f16|fp8|int8|int4] "
                        "[head_dim, a multiple of 32]\n");
        return 2;
    }
    attn_kv_format f = attn_kv_format_of(dtypes[t].dtype, D);
    size_t row = KH * f.head_bytes, scales = KH * f.head_scales;
    uint8_t *K = aligned_alloc(64, L * row), *V = aligned_alloc(64, L * row);
    float *ks = malloc((L * scales + 1) * sizeof(float));
    float *vs = malloc((L * scales + 1) * sizeof(float));
    float *q = aligned_alloc(64, H * D * sizeof(float));
    if (!K || !V || !ks || !vs || !q) return 1;
    /* small codes: finite in every format, the same spread of values */
    for (size_t i = 0; i < L * row; i++) {
        K[i] = (uint8_t)(rand() & 0x3f);
        V[i] = (uint8_t)(rand() & 0x3f);
    }
    for (size_t i = 0; i < L * scales + 1; i++) ks[i] = vs[i] = 0.01f;
    for (size_t i = 0; i < H * D; i++) q[i] = 0.1f * uniform();
    attn_decode_seq s = {.q_heads = H, .kv_heads = KH, .head_dim = D, .scale2 = 0.127f, .q = q,
                         .rows = 1, .first_pos = L - 1};
    s.keys.cached = L;
    s.keys.capacity = L;
    s.keys.k = (attn_decode_store){.fmt = f, .row_bytes = row, .row_scales = scales, .cache = K,
                                   .cache_scales = ks};
    s.keys.v = (attn_decode_store){.fmt = f, .row_bytes = row, .row_scales = scales, .cache = V,
                                   .cache_scales = vs};
    float *m = malloc(H * sizeof(float)), *l = malloc(H * sizeof(float));
    float *acc = malloc(H * D * sizeof(float));
    float *scratch = malloc(ATTN_DECODE_SCRATCH_FLOATS(H, D) * sizeof(float));
    if (!m || !l || !acc || !scratch) return 1;
    __builtin_cpu_init();
    const attn_decode_kernels *kern =
        __builtin_cpu_supports("avx512f") ? &attn_decode_avx512 : &attn_decode_avx2;
    for (int w = 0; w < 100; w++) kern->chunk(&s, 0, 1, 0, L, m, l, acc, scratch);
    double best = 1e30;
    for (int round = 0; round < 5; round++) {
        double t0 = now();
        for (long i = 0; i < calls; i++) kern->chunk(&s, 0, 1, 0, L, m, l, acc, scratch);
        double blocks = (double)L / ATTN_DECODE_BLOCK * (double)KH;
        double ns = (now() - t0) / (double)calls / blocks * 1e9;
        if (ns < best) best = ns;
    }
    printf("%s %s head_dim %zu L %zu kv_heads %zu: %.0f ns a block of 16 positions and KV head "
           "(%zu FMAs of 16 lanes)\n",
           kern->name, name, D, L, KH, best, 2 * 4 * 16 * D / 16);
    return acc[0] != acc[0]; /* keeps the result live */
}
