/*
 * gemm_pack.h — packing of blocks into micro-panels, included by each
 * kernel file so that the compiler specialises it for the tile width and
 * the file's instruction set.
 *
 * A block of len vectors, kc deep, becomes ceil(len / width) micro-panels,
 * one after the other, each kc steps of width floats: vector v = q*width + i
 * lands at dst[q*kc*width + p*width + i], zero-padded beyond len. The
 * source holds element (v, p) at
 *   src[p*ld + v]  when contiguous (A transposed, B as is), or
 *   src[v*ld + p]  otherwise (A as is, B transposed).
 */
#ifndef ATTN_GEMM_PACK_H
#define ATTN_GEMM_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* Steps of p transposed at once in the strided case: each source vector is
 * read a cache line at a time. */
#define ATTN_PACK_STEP 16

static inline void attn_gemm_pack_block(size_t kc, size_t len, const float *src, size_t ld,
                                        bool contiguous, size_t width, float *dst) {
    size_t panels = (len + width - 1) / width, full = len / width;
    if (contiguous) {
        /* A group of panels about 64 floats wide at a time: each source row
         * is read 64 floats (four cache lines) at a stretch and dealt out to
         * the group's panels, written sequentially. Wider stretches would
         * write to too many pages at once; narrower ones would reread the
         * rows' lines. */
        size_t group = (64 + width - 1) / width;
        for (size_t q0 = 0; q0 < full; q0 += group) {
            size_t qn = full - q0 < group ? full - q0 : group;
            for (size_t p = 0; p < kc; p++) {
                const float *s = src + p * ld + q0 * width;
                float *d = dst + q0 * kc * width + p * width;
                /* width is a constant where this is inlined: fixed-size
                 * copies the compiler turns into vector moves */
                for (size_t q = 0; q < qn; q++)
                    memcpy(d + q * kc * width, s + q * width, width * sizeof(float));
            }
        }
        if (full < panels) {
            size_t rest = len - full * width;
            for (size_t p = 0; p < kc; p++) {
                const float *s = src + p * ld + full * width;
                float *d = dst + full * kc * width + p * width;
                for (size_t i = 0; i < rest; i++) d[i] = s[i];
                for (size_t i = rest; i < width; i++) d[i] = 0.0f;
            }
        }
        return;
    }
    for (size_t q = 0; q < panels; q++) {
        size_t rows = len - q * width < width ? len - q * width : width;
        const float *sq = src + q * width * ld;
        float *dq = dst + q * kc * width;
        for (size_t p0 = 0; p0 < kc; p0 += ATTN_PACK_STEP) {
            size_t steps = kc - p0 < ATTN_PACK_STEP ? kc - p0 : ATTN_PACK_STEP;
            float *d = dq + p0 * width;
            for (size_t i = 0; i < rows; i++) {
                const float *s = sq + i * ld + p0;
                for (size_t p = 0; p < steps; p++) d[p * width + i] = s[p];
            }
            for (size_t i = rows; i < width; i++)
                for (size_t p = 0; p < steps; p++) d[p * width + i] = 0.0f;
        }
    }
}

/* The pack_a and pack_b functions of a kernel set of tile MR x NR. */
#define ATTN_GEMM_DEFINE_PACK(prefix, MR, NR)                                                  \
    void prefix##_pack_a(size_t kc, size_t rows, const float *src, size_t ld, bool trans,    \
                         float *dst) {                                                         \
        attn_gemm_pack_block(kc, rows, src, ld, trans, MR, dst);                               \
    }                                                                                          \
    void prefix##_pack_b(size_t kc, size_t cols, const float *src, size_t ld, bool trans,    \
                         float *dst) {                                                         \
        attn_gemm_pack_block(kc, cols, src, ld, !trans, NR, dst);                              \
    }

#endif /* ATTN_GEMM_PACK_H */
