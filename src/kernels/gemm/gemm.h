/*
 * gemm.h — the packed, register-tiled SGEMM every fast projection runs on
 * (the BLIS/GotoBLAS structure: cache blocks, packed panels, a microkernel).
 *
 * Row-major throughout: element (i, j) of an (m, n) matrix x with leading
 * dimension ldx lives at x[i * ldx + j].
 *
 *   C (m, n) = alpha * op(A) (m, k) @ op(B) (k, n) + beta * C (+ bias)
 *
 * op(A) is A (m, k), or, with trans_a, the transpose of A stored (k, m);
 * op(B) is B (k, n), or, with trans_b, the transpose of B stored (n, k).
 * beta == 0 never reads C (NaN there does not spread), as in BLAS.
 *
 * The loops (mirrored from BLIS's column-major ones so that the vector
 * loads of the microkernel run along the rows of C), for rows of C split
 * into chunks (the larger side; columns are split symmetrically):
 *   phase 1  B packed whole, once, into NR-column micro-panels, kc block
 *            after kc block (the threads share the panels out)
 *   phase 2  each thread takes the next chunk of rows (at most mc):
 *     pc  the inner dimension, by kc: the chunk's A rows packed into
 *         MR-row micro-panels (in L2/L3)
 *     jc  columns of C by nc: a B block of kc x nc (in L2)
 *     ir  MR rows:     one A micro-panel, reused from L1
 *     jr  NR columns:  B micro-panels stream from L2
 *         microkernel: an MR x NR tile of C += A micro-panel @ B micro-panel
 *
 * Threads split the rows or the columns of C, never k; the kc blocks
 * depend on k alone. Every element of C is summed in the same order, kc
 * block after kc block, whichever thread computes it, so results are
 * bitwise identical for any thread count; chunks go to whichever thread is
 * free, so a thread slowed down by other work holds no one up. Edge tiles
 * run the same microkernel on zero-padded panels into a scratch tile, so
 * they round exactly as full tiles do.
 */
#ifndef ATTN_GEMM_H
#define ATTN_GEMM_H

#include "attn.h"
#include "parallel.h"

#include <stdbool.h>
#include <stddef.h>

/*
 * The microkernel: c (MR, NR, row stride ldc) = alpha * acc + beta * c where
 * acc = sum over p < k of a[p*MR + i] * b[p*NR + j], accumulated in float in
 * ascending p. a and b are packed micro-panels, 64-byte aligned; k >= 1.
 * beta == 0 writes c without reading it; otherwise c = fma(beta, c, alpha *
 * acc) per element (one rounding for the accumulating beta = alpha = 1).
 * bias (NULL: none), NR floats, is then added to each row, rounding once
 * more: with beta == 0, the bits of c preset to bias rows and beta == 1.
 */
typedef void attn_sgemm_micro_fn(size_t k, const float *a, const float *b, float *c, size_t ldc,
                                 float alpha, float beta, const float *bias);

/* The widest tile (NR) of any kernel set: an edge tile's bias is copied to
 * a padded row of this many floats. */
#define ATTN_GEMM_NR_MAX 64

/*
 * Packing of a block, kc deep, into micro-panels zero-padded to the tile:
 *   pack_a: rows (<= mc) rows of op(A) into ceil(rows / MR) panels, row
 *           q*MR + i at dst[q*kc*MR + p*MR + i]
 *   pack_b: cols (<= nc) columns of op(B) into ceil(cols / NR) panels,
 *           column q*NR + j at dst[q*kc*NR + p*NR + j]
 * src points at op(A)(0, 0) (op(B)(0, 0)) of the block, ld its stored row
 * stride; trans says the operand is stored transposed.
 */
typedef void attn_sgemm_pack_fn(size_t kc, size_t len, const float *src, size_t ld, bool trans,
                                float *dst);

/* A kernel set: the microkernel, its packing and its cache blocks. */
typedef struct attn_gemm_kernel {
    const char *name;   /* datatype, operation, architecture and tile */
    attn_kernels isa;   /* the instruction set it needs               */
    size_t mr, nr;      /* the microkernel's tile                      */
    size_t mc, kc, nc;  /* cache blocks: mc % mr == 0, nc % nr == 0   */
    size_t shared_max;  /* floats of the shared operand packed at once */
    attn_sgemm_micro_fn *micro;
    attn_sgemm_pack_fn *pack_a, *pack_b;
} attn_gemm_kernel;

/* The kernel sets (gemm_config.c); a ctx's is in its kernel set
 * (kernels/kernel_set.c). The AVX2 and AVX-512 ones exist in x86 builds. */
extern const attn_gemm_kernel attn_sgemm_kernel_portable;
#if defined(ATTN_HAVE_X86_KERNELS)
extern const attn_gemm_kernel attn_sgemm_kernel_avx2, attn_sgemm_kernel_avx512;
#endif

/* The threads (parts) a call of these sizes runs on: at most threads, and
 * fewer when the work would not pay for starting them. */
size_t attn_sgemm_parts(const attn_gemm_kernel *uk, size_t threads, size_t m, size_t n, size_t k);

/*
 * Floats of workspace attn_sgemm_run needs for these sizes and threads
 * (the pack buffers of every thread, each 64-byte aligned within a
 * 64-byte-aligned workspace), or 0 when the size overflows.
 */
size_t attn_sgemm_workspace(const attn_gemm_kernel *uk, size_t threads, size_t m, size_t n,
                            size_t k);

/* The SGEMM on a caller's workspace (64-byte aligned, attn_sgemm_workspace
 * floats for w.threads); never allocates. w.threads 0 or 1: the calling
 * thread only.
 * bias (NULL: none), n floats, is added to every row of C after the first
 * kc block's alpha * acc + beta * c, rounding once more: with beta == 0,
 * the bits of C preset to the bias rows and beta == 1, without the copy. */
void attn_sgemm_run(const attn_gemm_kernel *uk, attn_workers w, bool trans_a, bool trans_b,
                    size_t m, size_t n, size_t k, float alpha, const float *a, size_t lda,
                    const float *b, size_t ldb, float beta, float *c, size_t ldc,
                    const float *bias, float *workspace);

/* The same, allocating the workspace for the call, on threads started for
 * it. Returns false, having written nothing, when it cannot be allocated. */
bool attn_sgemm(const attn_gemm_kernel *uk, size_t threads, bool trans_a, bool trans_b, size_t m,
                size_t n, size_t k, float alpha, const float *a, size_t lda, const float *b,
                size_t ldb, float beta, float *c, size_t ldc, const float *bias);

/* The kernel sets, defined in one file each (sgemm_<isa>_<MR>x<NR>.c). */
attn_sgemm_micro_fn attn_sgemm_portable_4x8, attn_sgemm_avx2_6x16, attn_sgemm_avx512_14x32;
attn_sgemm_pack_fn attn_sgemm_portable_4x8_pack_a, attn_sgemm_portable_4x8_pack_b;
attn_sgemm_pack_fn attn_sgemm_avx2_6x16_pack_a, attn_sgemm_avx2_6x16_pack_b;
attn_sgemm_pack_fn attn_sgemm_avx512_14x32_pack_a, attn_sgemm_avx512_14x32_pack_b;

#endif /* ATTN_GEMM_H */
