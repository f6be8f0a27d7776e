/* decode_avx2.c — the decode kernel on AVX2 + FMA: 8 floats a vector. */
#include "kernels/vec/vec_avx2.h"

#define DECODE_KERNELS attn_decode_avx2
#define DECODE_ISA_NAME "avx2"

/* out[j] = the sum of part[j]'s 8 lanes, j < 16: two groups of 8 vectors,
 * each folded within 128-bit lanes (unpack, shuffle), then the halves. */
static inline void v_hsum_block(const vec *part, float *out) {
    for (int h = 0; h < 2; h++) {
        const vec *x = part + 8 * h;
        __m256 a[4], b[2];
        for (int i = 0; i < 4; i++)
            a[i] = _mm256_add_ps(_mm256_unpacklo_ps(x[2 * i], x[2 * i + 1]),
                                 _mm256_unpackhi_ps(x[2 * i], x[2 * i + 1]));
        for (int i = 0; i < 2; i++)
            b[i] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                                 _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
        _mm256_storeu_ps(out + 8 * h, _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20),
                                                    _mm256_permute2f128_ps(b[0], b[1], 0x31)));
    }
}

#include "kernels/decode/decode_kernel.h"
