/*
 * decode_int8_dot.c — the decode kernel's two inner loops on an int8 cache,
 * as the kernel runs them (codes widened to float, float FMAs) against
 * integer dot products without VNNI (AVX2's vpmaddwd: int16 pairs summed
 * into int32): the queries rounded to int16 for the scores, the softmax
 * weights rounded to int16 (a pair of keys per multiply) for the weighing.
 * Rows are 1 KiB apart, as an int8 cache of 8 KV heads of 128 lays them
 * out; 4 query heads and 16 keys per call. Prints nanoseconds per KV head's
 * block of 16 keys, three times; each float loop is 1024 FMAs of 8 lanes.
 *
 *   cc -O2 -mavx2 -mfma bench/micro/decode_int8_dot.c -o /tmp/i8 && /tmp/i8
 *
 * Not part of the build: it decides whether the integer form is worth a
 * kernel (docs/tuning.md, "Decode and GEMV").
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { D = 128, HEADS = 4, KEYS = 16, KV_HEADS = 8, ROW = KV_HEADS * D };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Scores, float: 2 keys at a time, each code vector widened once for the 4
 * heads (the kernel's score_heads). */
__attribute__((noinline)) static void score_float(const float *q, const int8_t *const *k,
                                                  __m256 part[HEADS][KEYS]) {
    for (int j0 = 0; j0 < KEYS; j0 += 2) {
        __m256 acc[HEADS][2];
#pragma GCC unroll 4
        for (int g = 0; g < HEADS; g++) acc[g][0] = acc[g][1] = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8) {
            __m256 k0 = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(k[j0] + d))));
            __m256 k1 = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(k[j0 + 1] + d))));
#pragma GCC unroll 4
            for (int g = 0; g < HEADS; g++) {
                __m256 qv = _mm256_loadu_ps(q + g * D + d);
                acc[g][0] = _mm256_fmadd_ps(qv, k0, acc[g][0]);
                acc[g][1] = _mm256_fmadd_ps(qv, k1, acc[g][1]);
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < HEADS; g++) {
            part[g][j0] = acc[g][0];
            part[g][j0 + 1] = acc[g][1];
        }
    }
}

/* Scores, integer: 16 codes widened to int16, vpmaddwd against the int16
 * query, int32 sums. */
__attribute__((noinline)) static void score_int(const int16_t *q, const int8_t *const *k,
                                                __m256i part[HEADS][KEYS]) {
    for (int j0 = 0; j0 < KEYS; j0 += 2) {
        __m256i acc[HEADS][2];
#pragma GCC unroll 4
        for (int g = 0; g < HEADS; g++) acc[g][0] = acc[g][1] = _mm256_setzero_si256();
        for (int d = 0; d < D; d += 16) {
            __m256i k0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k[j0] + d)));
            __m256i k1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k[j0 + 1] + d)));
#pragma GCC unroll 4
            for (int g = 0; g < HEADS; g++) {
                __m256i qv = _mm256_loadu_si256((const __m256i *)(q + g * D + d));
                acc[g][0] = _mm256_add_epi32(acc[g][0], _mm256_madd_epi16(qv, k0));
                acc[g][1] = _mm256_add_epi32(acc[g][1], _mm256_madd_epi16(qv, k1));
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < HEADS; g++) {
            part[g][j0] = acc[g][0];
            part[g][j0 + 1] = acc[g][1];
        }
    }
}

/* Weighing, float: acc (HEADS, D) = acc * alpha + p (HEADS, KEYS) @ v,
 * 16 dims of each head at a time (the kernel's weigh_heads). */
__attribute__((noinline)) static void weigh_float(float *acc, const float *p,
                                                  const int8_t *const *v) {
    for (int d = 0; d < D; d += 16) {
        __m256 a[HEADS][2];
#pragma GCC unroll 4
        for (int g = 0; g < HEADS; g++) a[g][0] = a[g][1] = _mm256_setzero_ps();
        for (int j = 0; j < KEYS; j++) {
            __m256 x0 = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(v[j] + d))));
            __m256 x1 = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(v[j] + d + 8))));
#pragma GCC unroll 4
            for (int g = 0; g < HEADS; g++) {
                __m256 w = _mm256_broadcast_ss(p + g * KEYS + j);
                a[g][0] = _mm256_fmadd_ps(w, x0, a[g][0]);
                a[g][1] = _mm256_fmadd_ps(w, x1, a[g][1]);
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < HEADS; g++)
            for (int c = 0; c < 2; c++) {
                float *o = acc + g * D + d + 8 * c;
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(o), _mm256_set1_ps(0.5f),
                                                    a[g][c]));
            }
    }
}

/* Weighing, integer: two keys' codes interleaved and widened to int16
 * pairs, vpmaddwd against the pair of their int16 weights (w2, one int32
 * per head and key pair); the int32 sums scaled back once per block. */
__attribute__((noinline)) static void weigh_int(float *acc, const int32_t *w2,
                                                const float *w_scale, const int8_t *const *v) {
    for (int d = 0; d < D; d += 16) {
        __m256i a[HEADS][2];
#pragma GCC unroll 4
        for (int g = 0; g < HEADS; g++) a[g][0] = a[g][1] = _mm256_setzero_si256();
        for (int j = 0; j < KEYS; j += 2) {
            __m128i x0 = _mm_loadu_si128((const __m128i *)(v[j] + d));
            __m128i x1 = _mm_loadu_si128((const __m128i *)(v[j + 1] + d));
            __m256i lo = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(x0, x1));
            __m256i hi = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(x0, x1));
#pragma GCC unroll 4
            for (int g = 0; g < HEADS; g++) {
                __m256i w = _mm256_set1_epi32(w2[g * (KEYS / 2) + j / 2]);
                a[g][0] = _mm256_add_epi32(a[g][0], _mm256_madd_epi16(lo, w));
                a[g][1] = _mm256_add_epi32(a[g][1], _mm256_madd_epi16(hi, w));
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < HEADS; g++)
            for (int c = 0; c < 2; c++) {
                float *o = acc + g * D + d + 8 * c;
                __m256 sum = _mm256_mul_ps(_mm256_cvtepi32_ps(a[g][c]), _mm256_set1_ps(w_scale[g]));
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(o), _mm256_set1_ps(0.5f), sum));
            }
    }
}

int main(void) {
    int8_t *K = aligned_alloc(64, KEYS * ROW), *V = aligned_alloc(64, KEYS * ROW);
    for (size_t i = 0; i < (size_t)KEYS * ROW; i++) {
        K[i] = (int8_t)(rand() % 255 - 127);
        V[i] = (int8_t)(rand() % 255 - 127);
    }
    static float q[HEADS * D], p[HEADS * KEYS], acc[HEADS * D], w_scale[HEADS];
    static int16_t q16[HEADS * D];
    static int32_t w2[HEADS * KEYS / 2];
    for (int i = 0; i < HEADS * D; i++) {
        q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        q16[i] = (int16_t)(rand() % 65535 - 32767);
    }
    for (int i = 0; i < HEADS * KEYS; i++) p[i] = (float)rand() / (float)RAND_MAX;
    for (int i = 0; i < HEADS * KEYS / 2; i++) w2[i] = rand();
    for (int g = 0; g < HEADS; g++) w_scale[g] = 1e-9f;
    const int8_t *k_rows[KV_HEADS][KEYS], *v_rows[KV_HEADS][KEYS];
    for (int h = 0; h < KV_HEADS; h++)
        for (int j = 0; j < KEYS; j++) {
            k_rows[h][j] = K + j * ROW + h * D;
            v_rows[h][j] = V + j * ROW + h * D;
        }
    __m256 part_f[HEADS][KEYS];
    __m256i part_i[HEADS][KEYS];
    const long calls = 100000;
    float keep = 0.0f;
    for (int round = 0; round < 3; round++) {
        double ns[4], t0;
        t0 = now();
        for (long n = 0; n < calls; n++)
            for (int h = 0; h < KV_HEADS; h++) {
                score_float(q, k_rows[h], part_f);
                keep += part_f[0][0][0];
            }
        ns[0] = (now() - t0) / (double)(calls * KV_HEADS) * 1e9;
        t0 = now();
        for (long n = 0; n < calls; n++)
            for (int h = 0; h < KV_HEADS; h++) {
                score_int(q16, k_rows[h], part_i);
                keep += (float)part_i[0][0][0];
            }
        ns[1] = (now() - t0) / (double)(calls * KV_HEADS) * 1e9;
        t0 = now();
        for (long n = 0; n < calls; n++)
            for (int h = 0; h < KV_HEADS; h++) weigh_float(acc, p, v_rows[h]);
        ns[2] = (now() - t0) / (double)(calls * KV_HEADS) * 1e9;
        t0 = now();
        for (long n = 0; n < calls; n++)
            for (int h = 0; h < KV_HEADS; h++) weigh_int(acc, w2, w_scale, v_rows[h]);
        ns[3] = (now() - t0) / (double)(calls * KV_HEADS) * 1e9;
        printf("ns per KV head's 16 keys: scores float %.1f, int16 %.1f (%.2fx); "
               "weighing float %.1f, int16 %.1f (%.2fx)\n",
               ns[0], ns[1], ns[0] / ns[1], ns[2], ns[3], ns[2] / ns[3]);
    }
    return keep == 1.2345f && acc[0] == 1.2345f;
}
