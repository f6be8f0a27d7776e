/*
 * read_order.c — how fast a core gets the bytes of a decode step when work
 * sits between its reads, by the order it reads them in. Two arrays of
 * L = 16384 rows of 4 KiB (K and V of 8 heads of 128 floats) are read in
 * blocks of 16 rows, K then V, each 512-byte slice (a head's row) summed
 * and followed by W rounds of 8 independent FMAs (the kernel's arithmetic
 * per slice is about W = 10 to 20). Orders: the rows of a group of `group`
 * rows a head's slice at a time (group 1: address order; 16: the decode
 * kernel's order), with no software prefetch or with the next block asked
 * for in address order, 8 lines per slice read (prefetcht0 or prefetcht1).
 * Prints GB/s of each order, and the time of the work alone.
 *
 *   cc -O3 -mavx2 -mfma bench/micro/read_order.c -o /tmp/ro && /tmp/ro 10
 *
 * (-O3: the 8-FMA rounds must unroll into registers.) Not part of the build.
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { ROWF = 1024, SLICE = 128, BLOCK = 16, HEADS = 8 };
static const size_t L = 16384;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static __m256 work[8];

/* a slice summed into a, then W rounds of 8 FMAs */
static inline __m256 slice(const float *p, __m256 a, int W) {
    __m256 x[8], m = _mm256_set1_ps(0.999f);
    for (int i = 0; i < 8; i++) x[i] = work[i];
    for (int d = 0; d < SLICE; d += 8) a = _mm256_add_ps(a, _mm256_loadu_ps(p + d));
    for (int w = 0; w < W; w++)
        for (int i = 0; i < 8; i++) x[i] = _mm256_fmadd_ps(x[i], m, a);
    for (int i = 0; i < 8; i++) work[i] = x[i];
    return a;
}

/* one pass over K and V; prefetch 0: none, 1: prefetcht0, 2: prefetcht1 */
static float pass(const float *K, const float *V, int group, int prefetch, int W) {
    __m256 a = _mm256_setzero_ps();
    for (size_t b0 = 0; b0 < L; b0 += BLOCK) {
        const char *next = (const char *)(K + (b0 + BLOCK) * ROWF);
        const char *next_v = (const char *)(V + (b0 + BLOCK) * ROWF);
        size_t at = 0, block_bytes = (size_t)BLOCK * ROWF * sizeof(float);
        for (int side = 0; side < 2; side++) {
            const float *X = side ? V : K;
            for (int j0 = 0; j0 < BLOCK; j0 += group)
                for (int h = 0; h < HEADS; h++)
                    for (int j = j0; j < j0 + group; j++) {
                        for (int l = 0; prefetch && b0 + BLOCK < L && l < 8; l++, at += 64) {
                            const char *p = at < block_bytes ? next + at : next_v + at - block_bytes;
                            if (prefetch == 1) _mm_prefetch(p, _MM_HINT_T0);
                            else _mm_prefetch(p, _MM_HINT_T1);
                        }
                        a = slice(X + (b0 + j) * ROWF + h * SLICE, a, W);
                    }
        }
    }
    float s[8];
    _mm256_storeu_ps(s, a);
    return s[0];
}

int main(int argc, char **argv) {
    int W = argc > 1 ? atoi(argv[1]) : 10;
    size_t n = L * ROWF;
    float *K = aligned_alloc(4096, n * sizeof(float)), *V = aligned_alloc(4096, n * sizeof(float));
    for (size_t i = 0; i < n; i++) K[i] = 1e-9f * (float)i, V[i] = 2e-9f * (float)i;
    const double bytes = 2.0 * (double)n * sizeof(float);
    float sink = 0.0f;
    const int groups[] = {1, 2, 4, 8, 16};
    for (int prefetch = 0; prefetch < 3; prefetch++)
        for (int g = 0; g < 5; g++) {
            double best = 1e9;
            for (int r = 0; r < 3; r++) {
                double t0 = now();
                sink += pass(K, V, groups[g], prefetch, W);
                double t = now() - t0;
                if (t < best) best = t;
            }
            printf("W %d, group %2d, %-18s %6.2f ms %6.2f GB/s\n", W, groups[g],
                   prefetch == 0 ? "no prefetch:" : prefetch == 1 ? "prefetcht0 ahead:"
                                                                  : "prefetcht1 ahead:",
                   1e3 * best, bytes / best / 1e9);
        }
    /* the work alone: the same slices from 256 KiB that stay in L2 */
    double t0 = now();
    __m256 a = _mm256_setzero_ps();
    for (size_t b0 = 0; b0 < L; b0 += BLOCK)
        for (int s = 0; s < 2 * BLOCK * HEADS; s++) a = slice(K + (s % 512) * SLICE, a, W);
    float v[8];
    _mm256_storeu_ps(v, a);
    printf("W %d, the work alone: %.2f ms (%g)\n", W, 1e3 * (now() - t0), (double)(sink + v[0]));
    return 0;
}
