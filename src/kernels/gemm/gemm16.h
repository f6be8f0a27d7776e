/*
 * gemm16.h — the GEMM on 16-bit operands (bf16 or f16, raw bits) with C in
 * float: attn_gemm_16's kernels. The same loops as the SGEMM (gemm.h: cache
 * blocks, packed panels, a microkernel, threads over rows or columns of C,
 * never k), with packing that reads 16-bit elements:
 *
 *   - bf16 on AMX, where the process may use it: 32 x 32 tiles, k in steps
 *     of 32 (bgemm_amx_32x32.c);
 *   - bf16 on avx512_bf16 (where vdpbf16ps pays: gemm16_config.c): panels
 *     of bf16 pairs, interleaved along k (bgemm_avx512bf16_14x32.c);
 *   - otherwise (f16; bf16 elsewhere): elements widened to float while
 *     packing, into the float panels of an SGEMM kernel set, and its
 *     microkernel (gemm16_widen.c, gemm16_widen_avx512.c);
 *   - the reference: widened, summed in double (gemm16_ref.c).
 *
 * Every product of two bf16 (8-bit significands) or two f16 (11-bit) is
 * exact in float, so the fast kernels round only in their float sums.
 * Results are bitwise identical for any thread count, as the SGEMM's.
 *
 * Packed layout of a block kc deep (kc elements of k, padded with zeros to
 * kp, a multiple of k_unit), width W (MR or NR): panel q (vectors q*W ..
 * q*W + W - 1) at element q*kp*W, then for step s (k_unit elements of k,
 * k = s*k_unit + e) and vector i within the panel:
 *     panel[s*W*k_unit + i*k_unit + e]
 * k_unit 1 is the SGEMM's layout; k_unit 2 gives each vector a 32-bit pair
 * (k even, k odd) per step, what vdpbf16ps multiplies.
 */
#ifndef ATTN_GEMM16_H
#define ATTN_GEMM16_H

#include "attn.h"
#include "half.h"
#include "kernels/gemm/gemm.h"
#include "parallel.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* c (MR, NR, row stride ldc) = alpha * acc + beta * c, acc the sum over
 * steps packed steps of a and b (panels, 64-byte aligned), as the SGEMM's
 * microkernel (gemm.h) does it: beta == 0 writes c without reading it. */
typedef void attn_gemm16_micro_fn(size_t steps, const void *a, const void *b, float *c,
                                  size_t ldc, float alpha, float beta);

/* The SGEMM's microkernel (gemm.h) with B's micro-panel in 16 bits: the
 * elements' bits in the float panel's order (pack_b16), widened in
 * registers; the bits of the SGEMM's microkernel on that panel widened. */
typedef void attn_sgemm_micro_b16_fn(size_t k, const float *a, const uint16_t *b, float *c,
                                     size_t ldc, float alpha, float beta, const float *bias);

/* Packs a block kc deep of len vectors (rows of op(A) for pack_a, columns
 * of op(B) for pack_b) into ceil(len / W) panels, zero-padded to the tile
 * and along k to the step. src points at the block's op(X)(0, 0), ld its
 * stored row stride, trans says X is stored transposed. */
typedef void attn_gemm16_pack_fn(attn_dtype dtype, size_t kc, size_t len, const uint16_t *src,
                                 size_t ld, bool trans, void *dst);

/* A 16-bit kernel set: microkernel, packing, tile, cache blocks. */
typedef struct attn_gemm16_kernel {
    const char *name;    /* operation, architecture and tile */
    attn_kernels isa;    /* the instruction set it needs (and see bf16_only) */
    bool bf16_only;      /* takes bf16 alone and needs avx512_bf16 */
    size_t mr, nr;       /* tile */
    size_t mc, kc, nc;   /* cache blocks (elements of k): kc % k_unit == 0 */
    size_t shared_max;   /* packed elements of the shared operand at once */
    size_t k_unit;       /* elements of k per packed step: 2 (bf16 pairs) or 1 */
    size_t packed_bytes; /* bytes of a packed element: 2 (bf16) or 4 (float) */
    attn_gemm16_micro_fn *micro;
    attn_gemm16_pack_fn *pack_a, *pack_b;
    /* For attn_sgemm_run_b16 (float A, 16-bit B), where the set has them:
     * B packed in its 16 bits into the SGEMM's panel order, and the SGEMM
     * tile that widens it in registers, per dtype (else NULL: B widened as
     * pack_b packs it). */
    attn_gemm16_pack_fn *pack_b16;
    attn_sgemm_micro_b16_fn *micro_f16, *micro_bf16;
} attn_gemm16_kernel;

/* The kernel sets (gemm16_config.c): widened panels of each instruction
 * set, and for bf16 alone vdpbf16ps (AVX-512 BF16) and AMX tiles. The x86
 * ones exist in x86 builds; which a call takes is the ctx's kernel set's
 * (kernels/kernel_set.h). */
extern const attn_gemm16_kernel attn_gemm16_kernel_widened_portable;
#if defined(ATTN_HAVE_X86_KERNELS)
extern const attn_gemm16_kernel attn_gemm16_kernel_widened_avx2,
    attn_gemm16_kernel_widened_avx512, attn_bgemm_kernel_avx512bf16, attn_bgemm_kernel_amx;
#endif

/* Bytes of workspace attn_gemm16_run needs (64-byte aligned), 0 on
 * overflow. */
size_t attn_gemm16_workspace(const attn_gemm16_kernel *uk, size_t threads, size_t m, size_t n,
                             size_t k);

/* The threads a call of these sizes runs on (at most threads). */
size_t attn_gemm16_parts(const attn_gemm16_kernel *uk, size_t threads, size_t m, size_t n,
                         size_t k);

/* C (m, n) = alpha op(A) op(B) + beta C on the caller's workspace (64-byte
 * aligned, attn_gemm16_workspace bytes for w.threads); w.threads 0 or 1:
 * the caller only. */
void attn_gemm16_run(const attn_gemm16_kernel *uk, attn_workers w, attn_dtype dtype, bool trans_a,
                     bool trans_b, size_t m, size_t n, size_t k, float alpha, const uint16_t *a,
                     size_t lda, const uint16_t *b, size_t ldb, float beta, float *c, size_t ldc,
                     void *workspace);

/* attn_sgemm_run (gemm.h) with B stored in 16 bits (dtype), with no float
 * copy of B. Without micro_b16, pack_b (a widened set's, whose panels are
 * uk's) widens B's elements into uk's panels as it packs them; with it,
 * pack_b packs them in 16 bits (a set's pack_b16) and micro_b16 (uk's tile
 * on such panels, of dtype) widens them in registers. Either way the bits
 * are attn_sgemm_run's on B widened first: the same panels, the same sums.
 * Its workspace is attn_sgemm_workspace's. */
void attn_sgemm_run_b16(const attn_gemm_kernel *uk, attn_gemm16_pack_fn *pack_b,
                        attn_sgemm_micro_b16_fn *micro_b16, attn_dtype dtype, attn_workers w,
                        bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha,
                        const float *a, size_t lda, const uint16_t *b, size_t ldb, float beta,
                        float *c, size_t ldc, const float *bias, float *workspace);

/* The reference: widened to float, summed in double (k ascending), rounded
 * once: c = (float)(alpha * sum + beta * c); beta == 0 never reads c. */
void attn_gemm16_ref(size_t threads, attn_dtype dtype, bool trans_a, bool trans_b, size_t m,
                     size_t n, size_t k, float alpha, const uint16_t *a, size_t lda,
                     const uint16_t *b, size_t ldb, float beta, float *c, size_t ldc);

/* The kernel sets' parts, defined in one file each. */
attn_gemm16_pack_fn attn_gemm16_widen_4_pack_a, attn_gemm16_widen_8_pack_b;
attn_gemm16_pack_fn attn_gemm16_widen_avx2_6_pack_a, attn_gemm16_widen_avx2_16_pack_b;
attn_gemm16_pack_fn attn_gemm16_avx2_16_pack_b16;
attn_sgemm_micro_b16_fn attn_sgemm_avx2_6x16_f16, attn_sgemm_avx2_6x16_bf16;
attn_gemm16_pack_fn attn_gemm16_widen_avx512_14_pack_a, attn_gemm16_widen_avx512_32_pack_b;
attn_gemm16_micro_fn attn_bgemm_avx512bf16_14x32, attn_bgemm_amx_32x32;
attn_gemm16_pack_fn attn_bgemm_amx_32x32_pack_a, attn_bgemm_amx_32x32_pack_b;
attn_gemm16_pack_fn attn_bgemm_avx512bf16_14x32_pack_a, attn_bgemm_avx512bf16_14x32_pack_b;

#endif /* ATTN_GEMM16_H */
