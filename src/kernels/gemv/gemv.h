/*
 * gemv.h — matrix-vector products for decoding: y = x W^T + b with few rows
 * of x (one token per sequence), where the time goes into reading W (GPT-2
 * small: about 500 MB a token). W is streamed once for all rows; threads
 * split the outputs (dispatch.c: attn_k_linear_small).
 *
 * Contract of a kernel, for r < rows (1 .. ATTN_GEMV_MAX_ROWS) and o in
 * [o_begin, o_end):
 *   y[r * ldy + o] = sum over i < in of x[r * in + i] * w[o * in + i]
 *                    (+ bias[o] when bias is not NULL)
 * w is (out, in), nn.Linear's layout. Each sum runs in a fixed order that
 * depends on in alone: the result of a row does not depend on the other
 * rows, o_begin/o_end or the thread count, bit for bit. Fast kernels agree
 * with the reference linear within float32 rounding of a dot product.
 *
 * The 16-bit kernels (run_bf16, run_f16) have the same contract with w in
 * bf16 or f16 bits: each element is widened to float (exactly) and the
 * sums run as the float kernel of the same set runs them, so y is the float
 * kernel's on the widened w, bit for bit. widen_bf16 / widen_f16 write n
 * elements as floats (exact), for the many-row products where the SGEMM
 * cannot widen w as it packs it (linear16.c). run_bf16_dot, where a set has it,
 * takes x in bf16 too (attn_gemv_bf16_dot_fn below).
 */
#ifndef ATTN_GEMV_H
#define ATTN_GEMV_H

#include "attn.h"

#include <stddef.h>
#include <stdint.h>

#define ATTN_GEMV_MAX_ROWS 8

typedef void attn_gemv_fn(size_t rows, size_t in, const float *x, const float *w,
                          const float *bias, float *y, size_t ldy, size_t o_begin, size_t o_end);

typedef void attn_gemv16_fn(size_t rows, size_t in, const float *x, const uint16_t *w,
                            const float *bias, float *y, size_t ldy, size_t o_begin,
                            size_t o_end);
typedef void attn_widen16_fn(const uint16_t *src, size_t n, float *dst);

/* The contract above with x in bf16 bits too: the sums of the products of
 * bf16 pairs, in an order of the kernel's that depends on in alone (not
 * the float kernel's), subnormals as zero. */
typedef void attn_gemv_bf16_dot_fn(size_t rows, size_t in, const uint16_t *x, const uint16_t *w,
                                   const float *bias, float *y, size_t ldy, size_t o_begin,
                                   size_t o_end);

typedef struct attn_gemv_kernel {
    const char *name;
    attn_kernels isa;
    attn_gemv_fn *run;
    attn_gemv16_fn *run_bf16, *run_f16;
    attn_widen16_fn *widen_bf16, *widen_f16;
    attn_gemv_bf16_dot_fn *run_bf16_dot; /* NULL: the set has no bf16 products */
} attn_gemv_kernel;

/* The kernels (gemv_portable.c); a ctx's is in its kernel set
 * (kernels/kernel_set.c). The AVX2 and AVX-512 ones exist in x86 builds;
 * the AVX2 one widens f16 with F16C, which the AVX2 kernel set requires. */
extern const attn_gemv_kernel attn_gemv_kernel_portable;
#if defined(ATTN_HAVE_X86_KERNELS)
extern const attn_gemv_kernel attn_gemv_kernel_avx2, attn_gemv_kernel_avx512;
/* attn_gemv_kernel_avx512 with run_bf16_dot, for CPUs with AVX-512 BF16 */
extern const attn_gemv_kernel attn_gemv_kernel_avx512bf16;
/* The same sums, a token's step reading W's rows streamed (gemv_avx512.c),
 * for CPUs whose prefetchers follow one stream (attn_cpu_gemv_streamed) */
extern const attn_gemv_kernel attn_gemv_kernel_avx512_streamed,
    attn_gemv_kernel_avx512bf16_streamed;
#endif

attn_gemv_fn attn_gemv_portable, attn_gemv_avx2, attn_gemv_avx512;
attn_gemv16_fn attn_gemv_portable_bf16, attn_gemv_portable_f16, attn_gemv_avx2_bf16,
    attn_gemv_avx2_f16, attn_gemv_avx512_bf16, attn_gemv_avx512_f16;
attn_widen16_fn attn_widen_portable_bf16, attn_widen_portable_f16, attn_widen_avx2_bf16,
    attn_widen_avx2_f16, attn_widen_avx512_bf16, attn_widen_avx512_f16;
attn_gemv_fn attn_gemv_avx512_streamed;
attn_gemv16_fn attn_gemv_avx512_bf16_streamed, attn_gemv_avx512_f16_streamed;
attn_gemv_bf16_dot_fn attn_gemv_avx512bf16_dot, attn_gemv_avx512bf16_dot_streamed;

#endif /* ATTN_GEMV_H */
