/*
 * decode_skeleton.c — the decode kernel's loads and fused multiply-adds
 * alone, over a cache from memory: how near a read-only pass the kernel's
 * loop structure can come on this core before any softmax. K and V are
 * L rows of 4 KiB each (8 KV heads of 128 floats); per block of 16 rows and
 * KV head, 4 query heads score the 16 keys two at a time (8 accumulators,
 * each key vector loaded once for the 4 heads) and weigh the 16 value rows
 * two vectors at a time (8 accumulators), as kernels/decode/decode_kernel.h
 * does with KEYS = WEIGH_VECS = 2. What the skeleton leaves out: the sums
 * across lanes, the softmax steps, the scale, the rows' pointers and the
 * stream's bookkeeping. Orders:
 *   kernel   KV head after KV head, the keys of a block a pair at a time
 *            (rows 4 KiB apart)
 *   address  key pairs outer, KV heads inner (two rows read in address
 *            order); the values 4 rows at a time, the sums in memory
 * each with no software prefetch or with the next block asked for, 16 lines
 * a step (prefetcht1). Prints us per block and GB/s against a read-only
 * pass over the same arrays, and the work alone (the first 32 rows again
 * and again, in cache).
 *
 *   cc -O3 -mavx2 -mfma bench/micro/decode_skeleton.c -o /tmp/ds && /tmp/ds 16384
 *
 * Not part of the build.
 */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { ROWF = 1024, D = 128, BLOCK = 16, HEADS = 8, G = 4 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float q[G][D] __attribute__((aligned(64)));
static float part[HEADS][G][BLOCK][8] __attribute__((aligned(64)));
static float weights[HEADS][G][BLOCK];
static float sums[HEADS][G][D] __attribute__((aligned(64)));

typedef struct stream {
    const char *k, *v;
    size_t at, bytes;
    int on;
} stream;

/* the next block's next n lines, K's then V's */
static inline void step(stream *s, int n) {
    for (int i = 0; s->on && i < n && s->at < 2 * s->bytes; i++, s->at += 64)
        _mm_prefetch(s->at < s->bytes ? s->k + s->at : s->v + s->at - s->bytes, _MM_HINT_T1);
}

static void score_pair(const float *k0, const float *k1, int h, int j) {
    __m256 a[G][2];
    for (int g = 0; g < G; g++) a[g][0] = a[g][1] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
        __m256 x0 = _mm256_loadu_ps(k0 + d), x1 = _mm256_loadu_ps(k1 + d);
        for (int g = 0; g < G; g++) {
            __m256 qv = _mm256_load_ps(&q[g][d]);
            __asm__("" : "+x"(qv)); /* one load for both keys */
            a[g][0] = _mm256_fmadd_ps(qv, x0, a[g][0]);
            a[g][1] = _mm256_fmadd_ps(qv, x1, a[g][1]);
        }
    }
    for (int g = 0; g < G; g++) {
        _mm256_store_ps(part[h][g][j], a[g][0]);
        _mm256_store_ps(part[h][g][j + 1], a[g][1]);
    }
}

static void take_weights(void) {
    for (int h = 0; h < HEADS; h++)
        for (int g = 0; g < G; g++)
            for (int j = 0; j < BLOCK; j++) weights[h][g][j] = part[h][g][j][0] * 1e-3f;
}

static void block(const float *K, const float *V, stream *s, int address_order) {
    if (!address_order) {
        for (int h = 0; h < HEADS; h++)
            for (int j = 0; j < BLOCK; j += 2) {
                step(s, 16);
                score_pair(K + j * ROWF + h * D, K + (j + 1) * ROWF + h * D, h, j);
            }
        take_weights();
        for (int h = 0; h < HEADS; h++)
            for (int d = 0; d < D; d += 16) {
                step(s, 16);
                __m256 a[G][2];
                for (int g = 0; g < G; g++) a[g][0] = a[g][1] = _mm256_setzero_ps();
                for (int j = 0; j < BLOCK; j++) {
                    const float *v = V + j * ROWF + h * D + d;
                    __m256 x0 = _mm256_loadu_ps(v), x1 = _mm256_loadu_ps(v + 8);
                    for (int g = 0; g < G; g++) {
                        __m256 p = _mm256_set1_ps(weights[h][g][j]);
                        a[g][0] = _mm256_fmadd_ps(p, x0, a[g][0]);
                        a[g][1] = _mm256_fmadd_ps(p, x1, a[g][1]);
                    }
                }
                for (int g = 0; g < G; g++) {
                    float *o = &sums[h][g][d];
                    _mm256_store_ps(o, _mm256_add_ps(_mm256_load_ps(o), a[g][0]));
                    _mm256_store_ps(o + 8, _mm256_add_ps(_mm256_load_ps(o + 8), a[g][1]));
                }
            }
        return;
    }
    for (int j = 0; j < BLOCK; j += 2)
        for (int h = 0; h < HEADS; h++) {
            step(s, 16);
            score_pair(K + j * ROWF + h * D, K + (j + 1) * ROWF + h * D, h, j);
        }
    take_weights();
    for (int j = 0; j < BLOCK; j += 4)
        for (int h = 0; h < HEADS; h++) {
            step(s, 32);
            const float *v0 = V + j * ROWF + h * D;
            __m256 p[G][4];
            for (int g = 0; g < G; g++)
                for (int jj = 0; jj < 4; jj++) p[g][jj] = _mm256_set1_ps(weights[h][g][j + jj]);
            for (int d = 0; d < D; d += 8) {
                __m256 x[4];
                for (int jj = 0; jj < 4; jj++) x[jj] = _mm256_loadu_ps(v0 + jj * ROWF + d);
                for (int g = 0; g < G; g++) {
                    __m256 a = _mm256_load_ps(&sums[h][g][d]);
                    for (int jj = 0; jj < 4; jj++) a = _mm256_fmadd_ps(p[g][jj], x[jj], a);
                    _mm256_store_ps(&sums[h][g][d], a);
                }
            }
        }
}

/* one pass over rows blocks of K and V (from their starts, or the first
 * BLOCK rows every time: in cache) */
static void pass(const float *K, const float *V, size_t rows, int prefetch, int address_order,
                 int in_cache) {
    const size_t bytes = (size_t)BLOCK * ROWF * sizeof(float);
    for (size_t b0 = 0; b0 < rows; b0 += BLOCK) {
        size_t at = in_cache ? 0 : b0 * ROWF;
        stream s = {(const char *)(K + at + BLOCK * ROWF), (const char *)(V + at + BLOCK * ROWF), 0,
                    bytes, prefetch && !in_cache && b0 + BLOCK < rows};
        block(K + at, V + at, &s, address_order);
    }
}

static float read_only(const float *x, size_t n) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (size_t i = 0; i < n; i += 32)
        for (int u = 0; u < 4; u++) a[u] = _mm256_add_ps(a[u], _mm256_load_ps(x + i + 8 * u));
    float s[8];
    _mm256_storeu_ps(s, _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
    return s[0];
}

int main(int argc, char **argv) {
    size_t L = argc > 1 ? (size_t)atol(argv[1]) : 16384, n = L * ROWF;
    if (L < 2 * BLOCK || L % BLOCK) {
        fprintf(stderr, "decode_skeleton: L = %zu must be a multiple of %d, at least %d\n", L, BLOCK,
                2 * BLOCK);
        return 1;
    }
    float *K = aligned_alloc(1 << 21, n * sizeof(float) + (1 << 21));
    float *V = aligned_alloc(1 << 21, n * sizeof(float) + (1 << 21));
    if (!K || !V) return 1;
    for (size_t i = 0; i < n; i++) K[i] = 1e-3f * (float)(i % 1000), V[i] = 2e-3f * (float)(i % 777);
    for (int g = 0; g < G; g++)
        for (int d = 0; d < D; d++) q[g][d] = 0.01f * (float)d;
    const double bytes = 2.0 * (double)n * sizeof(float), blocks = (double)(L / BLOCK);
    double best_read = 1e9;
    float sink = 0.0f;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        sink += read_only(K, n) + read_only(V, n);
        double t = now() - t0;
        if (t < best_read) best_read = t;
    }
    printf("L %zu, read-only pass: %.3f ms, %.2f GB/s, %.2f us a block's bytes\n", L, 1e3 * best_read,
           bytes / best_read / 1e9, 1e6 * best_read / blocks);
    for (int order = 0; order < 2; order++)
        for (int prefetch = 0; prefetch < 2; prefetch++) {
            double best = 1e9;
            for (int r = 0; r < 5; r++) {
                double t0 = now();
                pass(K, V, L, prefetch, order, 0);
                double t = now() - t0;
                if (t < best) best = t;
            }
            printf("%-7s order, %-11s %7.3f ms %6.2f GB/s %5.1f%% of read, %.2f us a block\n",
                   order ? "address" : "kernel", prefetch ? "prefetch:" : "no prefetch:", 1e3 * best,
                   bytes / best / 1e9, 100.0 * best_read / best, 1e6 * best / blocks);
        }
    for (int order = 0; order < 2; order++) {
        double best = 1e9;
        for (int r = 0; r < 5; r++) {
            double t0 = now();
            pass(K, V, L, 0, order, 1);
            double t = now() - t0;
            if (t < best) best = t;
        }
        printf("%-7s order, the work alone (in cache): %.2f us a block\n", order ? "address" : "kernel",
               1e6 * best / blocks);
    }
    printf("(%g)\n", (double)(sink + sums[0][0][0]));
    free(K);
    free(V);
    return 0;
}
