/* decode_avx512.c — the decode kernel on AVX-512F: 16 floats a vector, a
 * key block's scores of one query head in one register. */
#include <immintrin.h>

#define VW 16
#define DECODE_KERNELS attn_decode_avx512
#define DECODE_ISA_NAME "avx512"

typedef __m512 vec;

static inline vec v_zero(void) { return _mm512_setzero_ps(); }
static inline vec v_set1(float x) { return _mm512_set1_ps(x); }
static inline vec v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_store(float *p, vec v) { _mm512_storeu_ps(p, v); }
static inline vec v_fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec v_mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
static inline vec v_sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
static inline vec v_add(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline vec v_max(vec a, vec b) { return _mm512_max_ps(a, b); }
static inline float v_hmax(vec v) { return _mm512_reduce_max_ps(v); }
static inline float v_hsum(vec v) { return _mm512_reduce_add_ps(v); }

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

/* 2^x = 2^n 2^f, n = round(x), 2^f by its degree-7 Taylor series in f ln 2
 * (the fused kernels' exp2, flash_avx512.c); x below -125 (-inf, NaN)
 * gives exactly 0 by a mask, never a subnormal. */
static inline vec v_exp2(vec x) {
    __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-125.0f));
    vec n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vec f = _mm512_sub_ps(x, n);
    vec p = _mm512_set1_ps(1.5252733804e-5f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393e-4f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(live, p, n);
}

#include "kernels/decode/decode_kernel.h"
