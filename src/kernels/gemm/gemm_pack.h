/*
 * gemm_pack.h — packing of micro-panels, included by each kernel file so
 * that the compiler specialises it for the tile width and the file's
 * instruction set.
 *
 * A micro-panel is kc steps of width floats: dst[p*width + i], i < len the
 * panel's vectors, zero beyond. Its source holds element (i, p) at
 *   src[p*ld + i]  when contiguous (A transposed, B as is), or
 *   src[i*ld + p]  otherwise (A as is, B transposed).
 */
#ifndef ATTN_GEMM_PACK_H
#define ATTN_GEMM_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* Steps of p transposed at once in the strided case: each source row is
 * read a cache line at a time. */
#define ATTN_PACK_STEP 16

static inline void attn_gemm_pack_panel(size_t kc, size_t len, const float *src, size_t ld,
                                        bool contiguous, size_t width, float *dst) {
    if (contiguous) {
        for (size_t p = 0; p < kc; p++) {
            const float *s = src + p * ld;
            float *d = dst + p * width;
            size_t i = 0;
            for (; i < len; i++) d[i] = s[i];
            for (; i < width; i++) d[i] = 0.0f;
        }
        return;
    }
    for (size_t p0 = 0; p0 < kc; p0 += ATTN_PACK_STEP) {
        size_t steps = kc - p0 < ATTN_PACK_STEP ? kc - p0 : ATTN_PACK_STEP;
        float *d = dst + p0 * width;
        for (size_t i = 0; i < len; i++) {
            const float *s = src + i * ld + p0;
            for (size_t p = 0; p < steps; p++) d[p * width + i] = s[p];
        }
        for (size_t i = len; i < width; i++)
            for (size_t p = 0; p < steps; p++) d[p * width + i] = 0.0f;
    }
}

/* The pack_a and pack_b functions of a kernel set of tile MR x NR. */
#define ATTN_GEMM_DEFINE_PACK(prefix, MR, NR)                                                  \
    void prefix##_pack_a(size_t kc, size_t len, const float *src, size_t ld, bool trans,     \
                         float *dst) {                                                         \
        attn_gemm_pack_panel(kc, len, src, ld, trans, MR, dst);                                \
    }                                                                                          \
    void prefix##_pack_b(size_t kc, size_t len, const float *src, size_t ld, bool trans,     \
                         float *dst) {                                                         \
        attn_gemm_pack_panel(kc, len, src, ld, !trans, NR, dst);                               \
    }

#endif /* ATTN_GEMM_PACK_H */
