/*
 * gemm16_widen.c — packing of 16-bit blocks into the SGEMM's float panels
 * (gemm_pack.h's layout), each element widened exactly on the way, for the
 * portable kernel set (AVX2's: gemm16_widen_avx2.c; AVX-512's:
 * gemm16_widen_avx512.c). The
 * SGEMM's microkernels then run on the panels unchanged (gemm16_config.c).
 *
 * As in gemm_pack.h, vector v of the block, step p, is at
 *   src[p*ld + v]  when contiguous (A transposed, B as is), or
 *   src[v*ld + p]  otherwise (A as is, B transposed),
 * and lands at dst[q*kc*W + p*W + i] for v = q*W + i, zero beyond len.
 */
#include "kernels/gemm/gemm16.h"

/* Steps of p per pass in the strided case: each source vector is read a
 * cache line (32 elements) at a time. */
#define WIDEN_STEP 32

/* The conversion loops, one per dtype, so that each inner loop has no
 * branch on the type (the compiler vectorises the bf16 shift). */
#define DEFINE_WIDEN_BLOCK(name, convert)                                                   \
    static inline void name(size_t kc, size_t len, const uint16_t *src, size_t ld,           \
                            bool contiguous, size_t width, float *dst) {                      \
        size_t panels = (len + width - 1) / width;                                            \
        for (size_t q = 0; q < panels; q++) {                                                 \
            size_t rows = len - q * width < width ? len - q * width : width;                  \
            float *dq = dst + q * kc * width;                                                 \
            if (contiguous) {                                                                 \
                for (size_t p = 0; p < kc; p++) {                                             \
                    const uint16_t *s = src + p * ld + q * width;                             \
                    float *d = dq + p * width;                                                \
                    for (size_t i = 0; i < rows; i++) d[i] = convert(s[i]);                   \
                    for (size_t i = rows; i < width; i++) d[i] = 0.0f;                        \
                }                                                                             \
                continue;                                                                     \
            }                                                                                 \
            for (size_t p0 = 0; p0 < kc; p0 += WIDEN_STEP) {                                  \
                size_t steps = kc - p0 < WIDEN_STEP ? kc - p0 : WIDEN_STEP;                   \
                float *d = dq + p0 * width;                                                   \
                for (size_t i = 0; i < rows; i++) {                                           \
                    const uint16_t *s = src + (q * width + i) * ld + p0;                      \
                    for (size_t p = 0; p < steps; p++) d[p * width + i] = convert(s[p]);      \
                }                                                                             \
                for (size_t i = rows; i < width; i++)                                         \
                    for (size_t p = 0; p < steps; p++) d[p * width + i] = 0.0f;               \
            }                                                                                 \
        }                                                                                     \
    }

DEFINE_WIDEN_BLOCK(widen_bf16, attn_bf16_to_float)
DEFINE_WIDEN_BLOCK(widen_f16, attn_f16_to_float)

static inline void widen_block(attn_dtype dtype, size_t kc, size_t len, const uint16_t *src,
                               size_t ld, bool contiguous, size_t width, void *dst) {
    if (dtype == ATTN_DTYPE_BF16)
        widen_bf16(kc, len, src, ld, contiguous, width, dst);
    else
        widen_f16(kc, len, src, ld, contiguous, width, dst);
}

/* pack_a for tile height MR (rows of op(A) contiguous when A is stored
 * transposed), pack_b for width NR (columns contiguous unless B is). */
#define DEFINE_WIDEN_PACK_A(MR)                                                               \
    void attn_gemm16_widen_##MR##_pack_a(attn_dtype dtype, size_t kc, size_t rows,            \
                                         const uint16_t *src, size_t ld, bool trans,          \
                                         void *dst) {                                         \
        widen_block(dtype, kc, rows, src, ld, trans, MR, dst);                                \
    }
#define DEFINE_WIDEN_PACK_B(NR)                                                               \
    void attn_gemm16_widen_##NR##_pack_b(attn_dtype dtype, size_t kc, size_t cols,            \
                                         const uint16_t *src, size_t ld, bool trans,          \
                                         void *dst) {                                         \
        widen_block(dtype, kc, cols, src, ld, !trans, NR, dst);                               \
    }

DEFINE_WIDEN_PACK_A(4)
DEFINE_WIDEN_PACK_B(8)
