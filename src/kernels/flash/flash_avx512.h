/* flash_avx512.h — the fused attention kernels on AVX-512F: 16 floats a
 * vector, score tiles of 6 rows x 64 keys (24 accumulators). Included by
 * flash_avx512.c, which names the set (FLASH_KERNELS, FLASH_ISA_NAME)
 * first. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kernels/vec/vec_avx512.h"

#define NV 4
/* the lane forward's tiles: 8 keys x 48 rows (24 of the 32 registers as
 * accumulators; loads per fma 11/24, against 10/16 at 32 rows) */
#define LANE_QV 3
#define LANE_KT 8
/* the backward's dk and dv products: 6 keys x 4 vectors (24 of the 32
 * registers as accumulators, against 16 at 4 keys); the bits do not depend
 * on the step */
#define KEY_STEP 6
/* the backward's score tiles (S, dP) and dq products: 6 rows x 4 vectors
 * (24 accumulators, 10 loads per 24 FMAs where 4 rows load 8 per 16), in
 * query blocks of 144 rows: whole groups of 6, each packed key block serving
 * many rows. A row's sums do not depend on the block; GQA's dk and dv sum
 * the group's heads in the blocks' order. The dk and dv products take the A
 * and dS tiles whole (36 KiB, past a 32 KiB L1): cut into runs of rows they
 * cost more than the misses. */
#define RG 6
#define BR 144

static inline vec v_keep(const uint32_t *w, uint64_t threshold, float kept) {
    /* threshold <= 2^32; 2^32 keeps everything */
    if (threshold > UINT32_MAX) return _mm512_set1_ps(kept);
    __mmask16 keep = _mm512_cmplt_epu32_mask(_mm512_loadu_si512(w), _mm512_set1_epi32((int)threshold));
    return _mm512_maskz_mov_ps(keep, _mm512_set1_ps(kept));
}

/* s where begin[lane] <= key < end[lane] (the keys the lane's row sees),
 * else -inf. */
static inline vec v_keep_keys(vec s, int32_t key, const int32_t *begin, const int32_t *end) {
    __m512i k = _mm512_set1_epi32(key);
    __mmask16 seen = _mm512_cmple_epi32_mask(_mm512_loadu_si512(begin), k) &
                     _mm512_cmplt_epi32_mask(k, _mm512_loadu_si512(end));
    return _mm512_mask_blend_ps(seen, _mm512_set1_ps(-INFINITY), s);
}

/* Philox4x32-10 on the 16 blocks of group g at once, one per lane: the
 * words of its 64 elements in order (rng/philox.h's layout). */
#define HAVE_PHILOX_GROUP
static void philox_group(uint64_t seed, uint64_t offset, uint64_t group, uint32_t words[64]) {
    uint64_t first = group * 16; /* a multiple of 16: lanes never carry */
    const __m512i m0 = _mm512_set1_epi32((int)0xD2511F53u), m1 = _mm512_set1_epi32((int)0xCD9E8D57u);
    __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)first),
                                  _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    __m512i c1 = _mm512_set1_epi32((int)(uint32_t)(first >> 32));
    __m512i c2 = _mm512_set1_epi32((int)(uint32_t)offset);
    __m512i c3 = _mm512_set1_epi32((int)(uint32_t)(offset >> 32));
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        /* 32 x 32 -> 64-bit products of even and odd lanes, then hi and lo */
        __m512i p0e = _mm512_mul_epu32(c0, m0), p0o = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
        __m512i p1e = _mm512_mul_epu32(c2, m1), p1o = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
        __m512i hi0 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(p0e, 32), p0o);
        __m512i hi1 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(p1e, 32), p1o);
        __m512i lo0 = _mm512_mullo_epi32(c0, m0), lo1 = _mm512_mullo_epi32(c2, m1);
        c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32((int)k0));
        c1 = lo1;
        c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32((int)k1));
        c3 = lo0;
    }
    _mm512_storeu_si512(words, c0);
    _mm512_storeu_si512(words + 16, c1);
    _mm512_storeu_si512(words + 32, c2);
    _mm512_storeu_si512(words + 48, c3);
}

/* dst[i * ldd + j] = src[j * lds + i] for i, j < 16: a 16 x 16 transpose in
 * registers (pairs of floats, then of pairs, then 128-bit quarters twice),
 * for packing k^T, where a scalar copy would read with a 64-float stride. */
#define HAVE_TRANSPOSE_BLOCK
static inline void transpose_block(const float *src, size_t lds, float *dst, size_t ldd) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xDD);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD);
    }
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ldd, r[i]);
}

#include "kernels/flash/flash_kernel.h"
