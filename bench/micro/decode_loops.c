/*
 * decode_loops.c — the decode kernel's two inner loops alone, in AVX2, on
 * rows 4 KiB apart as a KV cache of 8 heads of 128 floats lays them out:
 * the scores of 4 query heads against 16 keys, NK keys at a time (4 x NK
 * accumulators), and the weighing of 16 value rows for 4 heads, WV vectors
 * of each at a time (4 x WV accumulators). Prints nanoseconds per KV head's
 * 16 keys; each loop is 1024 FMAs of 8 lanes there (4 heads x 16 keys x 16
 * vectors), 512 cycles at 2 a cycle.
 *
 *   cc -O3 -mavx2 -mfma -DNK=2 -DWV=2 bench/micro/decode_loops.c -o /tmp/dl && /tmp/dl
 *
 * Not part of the build; the kernel's KEYS and WEIGH_VECS are NK and WV.
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifndef NK
#define NK 2
#endif
#ifndef WV
#define WV 2
#endif
enum { D = 128, ROW = 8 * D, KEYS = 16, HEADS = 4 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* out[g][j] = q_g . k_j, a key of ROW floats apart (the last keys of a
 * pass wrap to the first when NK does not divide 16) */
__attribute__((noinline)) static void score(const float *K, const float *q, float *out) {
    __m256 part[HEADS][KEYS + NK];
    for (int j0 = 0; j0 < KEYS; j0 += NK) {
        const float *k[NK];
        for (int jj = 0; jj < NK; jj++) k[jj] = K + ((j0 + jj) % KEYS) * ROW;
        __m256 a[HEADS][NK];
        for (int g = 0; g < HEADS; g++)
            for (int jj = 0; jj < NK; jj++) a[g][jj] = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8) {
            __m256 x[NK];
            for (int jj = 0; jj < NK; jj++) x[jj] = _mm256_loadu_ps(k[jj] + d);
            for (int g = 0; g < HEADS; g++) {
                __m256 qv = _mm256_loadu_ps(q + g * D + d);
                __asm__("" : "+x"(qv));
                for (int jj = 0; jj < NK; jj++) a[g][jj] = _mm256_fmadd_ps(qv, x[jj], a[g][jj]);
            }
        }
        for (int g = 0; g < HEADS; g++)
            for (int jj = 0; jj < NK; jj++) part[g][j0 + jj] = a[g][jj];
    }
    for (int g = 0; g < HEADS; g++)
        for (int j = 0; j < KEYS; j++) {
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(part[g][j]),
                                  _mm256_extractf128_ps(part[g][j], 1));
            out[g * KEYS + j] = _mm_cvtss_f32(s);
        }
}

/* acc[g] = 0.9 acc[g] + sum_j p[g][j] v_j */
__attribute__((noinline)) static void weigh(const float *V, const float *p, float *acc) {
    int d = 0;
    for (; d + 8 * WV <= D; d += 8 * WV) {
        __m256 a[HEADS][WV];
        for (int g = 0; g < HEADS; g++)
            for (int c = 0; c < WV; c++) a[g][c] = _mm256_setzero_ps();
        for (int j = 0; j < KEYS; j++) {
            __m256 pb[HEADS];
            for (int g = 0; g < HEADS; g++) pb[g] = _mm256_broadcast_ss(p + g * KEYS + j);
            for (int c = 0; c < WV; c++) {
                __m256 x = _mm256_loadu_ps(V + j * ROW + d + 8 * c);
                for (int g = 0; g < HEADS; g++) a[g][c] = _mm256_fmadd_ps(pb[g], x, a[g][c]);
            }
        }
        for (int g = 0; g < HEADS; g++)
            for (int c = 0; c < WV; c++) {
                float *o = acc + g * D + d + 8 * c;
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(o), _mm256_set1_ps(0.9f),
                                                    a[g][c]));
            }
    }
    for (; d < D; d += 8) /* the tail when WV does not divide 16 */
        for (int g = 0; g < HEADS; g++) {
            __m256 a = _mm256_setzero_ps();
            for (int j = 0; j < KEYS; j++)
                a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + g * KEYS + j),
                                    _mm256_loadu_ps(V + j * ROW + d), a);
            float *o = acc + g * D + d;
            _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(o), _mm256_set1_ps(0.9f), a));
        }
}

int main(void) {
    const int kv_heads = 8;
    const long reps = 250000;
    float *K = aligned_alloc(64, sizeof(float) * KEYS * ROW);
    float *q = aligned_alloc(64, sizeof(float) * HEADS * D);
    float *p = aligned_alloc(64, sizeof(float) * HEADS * KEYS);
    float *acc = aligned_alloc(64, sizeof(float) * HEADS * D);
    for (int i = 0; i < KEYS * ROW; i++) K[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < HEADS * D; i++) q[i] = 0.01f * (float)i, acc[i] = 0.0f;
    for (int i = 0; i < HEADS * KEYS; i++) p[i] = 0.01f;
    double t0 = now();
    for (long r = 0; r < reps; r++)
        for (int kh = 0; kh < kv_heads; kh++) score(K + kh * D, q, p);
    double score_ns = (now() - t0) / (double)(reps * kv_heads) * 1e9;
    for (int i = 0; i < HEADS * KEYS; i++) p[i] = 0.01f;
    t0 = now();
    for (long r = 0; r < reps; r++)
        for (int kh = 0; kh < kv_heads; kh++) weigh(K + kh * D, p, acc);
    double weigh_ns = (now() - t0) / (double)(reps * kv_heads) * 1e9;
    printf("NK=%d: scores %.0f ns; WV=%d: weighing %.0f ns a KV head's 16 keys (%g)\n", NK,
           score_ns, WV, weigh_ns, (double)acc[5]);
    return 0;
}
