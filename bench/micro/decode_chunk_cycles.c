/*
 * decode_chunk_cycles.c — the arithmetic of the decode kernel without the
 * memory: one query row (q_heads = 4 x kv_heads, head_dim 128) against a
 * cache of L positions small enough to stay in L1/L2, the avx2 chunk kernel
 * called over and over, nanoseconds per block of 16 positions.
 *
 *   cc -O2 -DATTN_HAVE_X86_KERNELS -Isrc -Isrc/core -Iinclude \
 *      bench/micro/decode_chunk_cycles.c build/libattn.a -lm -lpthread -o /tmp/dcc
 *   /tmp/dcc [L 16] [calls 50000] [kv_heads 8] [bf16 0|1]
 *
 * A block costs kv_heads * 2048 FMAs of 8 lanes (4 heads x 16 keys x 16
 * vectors for the scores, as many for the weighing); at 2 a cycle that is
 * the FMA bound.
 * Not part of the build: it reads the library's internal headers.
 */
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

int main(int argc, char **argv) {
    size_t L = argc > 1 ? strtoul(argv[1], NULL, 10) : 16;
    long calls = argc > 2 ? strtol(argv[2], NULL, 10) : 50000;
    size_t KH = argc > 3 ? strtoul(argv[3], NULL, 10) : 8, H = 4 * KH, D = 128;
    int bf16 = argc > 4 && atoi(argv[4]);
    attn_kv_format f = attn_kv_format_of(bf16 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F32, D);
    size_t row = KH * f.head_bytes;
    uint8_t *K = aligned_alloc(64, L * row), *V = aligned_alloc(64, L * row);
    float *q = aligned_alloc(64, H * D * sizeof(float));
    for (size_t i = 0; i < L * KH * D; i++) {
        float k = uniform(), v = uniform();
        if (bf16) { /* the top half of the float: a bf16 by truncation */
            uint32_t kb, vb;
            memcpy(&kb, &k, 4);
            memcpy(&vb, &v, 4);
            ((uint16_t *)K)[i] = (uint16_t)(kb >> 16);
            ((uint16_t *)V)[i] = (uint16_t)(vb >> 16);
        } else {
            ((float *)K)[i] = k;
            ((float *)V)[i] = v;
        }
    }
    for (size_t i = 0; i < H * D; i++) q[i] = 0.1f * uniform();
    attn_decode_seq s = {.q_heads = H, .kv_heads = KH, .head_dim = D, .scale2 = 0.127f, .q = q,
                         .rows = 1, .first_pos = L - 1};
    s.keys.cached = L;
    s.keys.capacity = L;
    s.keys.k = (attn_decode_store){.fmt = f, .row_bytes = row, .cache = K};
    s.keys.v = (attn_decode_store){.fmt = f, .row_bytes = row, .cache = V};
    float *m = malloc(H * sizeof(float)), *l = malloc(H * sizeof(float));
    float *acc = malloc(H * D * sizeof(float));
    float *scratch = malloc(ATTN_DECODE_SCRATCH_FLOATS(H) * sizeof(float));
    const attn_decode_kernels *kern = &attn_decode_avx2;
    for (int w = 0; w < 100; w++) kern->chunk(&s, 0, 1, 0, L, m, l, acc, scratch);
    double t0 = now();
    for (long i = 0; i < calls; i++) kern->chunk(&s, 0, 1, 0, L, m, l, acc, scratch);
    double ns = (now() - t0) / (double)calls / ((double)L / ATTN_DECODE_BLOCK) * 1e9;
    printf("L=%zu kv_heads=%zu %s: %.0f ns a block of 16 positions, %zu FMAs of 8 lanes a "
           "block\n",
           L, KH, bf16 ? "bf16" : "f32", ns, KH * 2048);
    return acc[0] != acc[0]; /* keeps the result live */
}
