/* flash_avx2.c — the fused attention kernels on AVX2 + FMA: 8 floats a
 * vector, score tiles of 4 rows x 16 keys (8 of the 16 registers). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kernels/vec/vec_avx2.h"

#define NV 2
#define LANE_QV 2 /* the lane forward's tiles: 4 keys x 16 rows (8 accumulators) */
#define LANE_KT 4
#define FLASH_KERNELS attn_flash_avx2
#define FLASH_ISA_NAME "avx2"

static inline vec v_keep(const uint32_t *w, uint64_t threshold, float kept) {
    if (threshold > UINT32_MAX) return _mm256_set1_ps(kept);
    /* unsigned w < t as signed compare of both with the sign bit flipped */
    const __m256i flip = _mm256_set1_epi32((int)0x80000000u);
    __m256i words = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)w), flip);
    __m256i t = _mm256_xor_si256(_mm256_set1_epi32((int)(uint32_t)threshold), flip);
    return _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(t, words)), _mm256_set1_ps(kept));
}

/* s where begin[lane] <= key < end[lane], else -inf, as flash_avx512.c's. */
static inline vec v_keep_keys(vec s, int32_t key, const int32_t *begin, const int32_t *end) {
    __m256i k = _mm256_set1_epi32(key);
    __m256i after = _mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)begin), k);
    __m256i before = _mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)end), k);
    __m256 seen = _mm256_castsi256_ps(_mm256_andnot_si256(after, before));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, seen);
}

/* Philox4x32-10 on the 16 blocks of group g, 8 lanes at a time, as in
 * flash_avx512.c. */
#define HAVE_PHILOX_GROUP
static void philox_half(uint64_t seed, uint64_t offset, uint64_t first, uint32_t *words) {
    const __m256i m0 = _mm256_set1_epi32((int)0xD2511F53u), m1 = _mm256_set1_epi32((int)0xCD9E8D57u);
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)first),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i c1 = _mm256_set1_epi32((int)(uint32_t)(first >> 32));
    __m256i c2 = _mm256_set1_epi32((int)(uint32_t)offset);
    __m256i c3 = _mm256_set1_epi32((int)(uint32_t)(offset >> 32));
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        __m256i p0e = _mm256_mul_epu32(c0, m0), p0o = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
        __m256i p1e = _mm256_mul_epu32(c2, m1), p1o = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
        __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(p0e, 32), p0o, 0xAA);
        __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(p1e, 32), p1o, 0xAA);
        __m256i lo0 = _mm256_mullo_epi32(c0, m0), lo1 = _mm256_mullo_epi32(c2, m1);
        c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32((int)k0));
        c1 = lo1;
        c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32((int)k1));
        c3 = lo0;
    }
    _mm256_storeu_si256((__m256i *)words, c0);
    _mm256_storeu_si256((__m256i *)(words + 16), c1);
    _mm256_storeu_si256((__m256i *)(words + 32), c2);
    _mm256_storeu_si256((__m256i *)(words + 48), c3);
}

static void philox_group(uint64_t seed, uint64_t offset, uint64_t group, uint32_t words[64]) {
    philox_half(seed, offset, group * 16, words);
    philox_half(seed, offset, group * 16 + 8, words + 8);
}

#include "kernels/flash/flash_kernel.h"
