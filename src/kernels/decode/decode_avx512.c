/* decode_avx512.c — the decode kernel on AVX-512F: 16 floats a vector, a
 * key block's scores of one query head in one register. */
#include "kernels/vec/vec_avx512.h"

#define DECODE_KERNELS attn_decode_avx512
#define DECODE_ISA_NAME "avx512"

/* out[j] = the sum of part[j]'s 16 lanes, j < 16, in one register: pairs
 * of vectors folded within 128-bit lanes (unpack, then shuffle), then the
 * four 128-bit lanes across vectors: 30 shuffles and 15 adds for 16 sums. */
static inline void v_hsum_block(const vec *part, float *out) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(part[2 * i], part[2 * i + 1]),
                             _mm512_unpackhi_ps(part[2 * i], part[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
    /* b[i], 128-bit lane k: the lane-k sums of keys 4i .. 4i + 3 */
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                                        _mm512_shuffle_f32x4(c[0], c[1], 0xDD)));
}

#include "kernels/decode/decode_kernel.h"
