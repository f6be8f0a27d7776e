/*
 * dispatch.h — the kernels modules call: each picks, by the ctx's kernels,
 * the reference loops (ref.c, the oracle) or the fast kernels of an
 * instruction set. Same contract as the reference kernel of the same name
 * in kernels.h; fast kernels agree with it within the stated tolerance.
 */
#ifndef ATTN_DISPATCH_H
#define ATTN_DISPATCH_H

#include "internal.h"
#include "kernels/kernels.h"

/* Resolves requested (AUTO: the ATTN_KERNELS environment variable, else the
 * best the CPU runs) into kernels this CPU runs, or ATTN_ERR_INVALID. */
attn_status attn_kernels_resolve(attn_kernels requested, attn_kernels *out);

/* c (m, n) = alpha op(a) @ op(b) + beta c (attn_gemm's contract). */
void attn_k_gemm(attn_ctx *ctx, bool trans_a, bool trans_b, size_t m, size_t n, size_t k,
                 float alpha, const float *a, size_t lda, const float *b, size_t ldb, float beta,
                 float *c, size_t ldc);
/* c (m, n) = a @ b (+ c when accumulate); b is (k, n), or (n, k) transposed. */
void attn_k_matmul(attn_ctx *ctx, const float *a, const float *b, float *c, size_t m,
                   size_t k, size_t n, bool b_transposed, bool accumulate);
/* c (m, n) += a^T @ b, a (k, m), b (k, n). */
void attn_k_matmul_tn_acc(attn_ctx *ctx, const float *a, const float *b, float *c,
                          size_t k, size_t m, size_t n);
/* y (rows, out) = x @ w^T (+ bias), and its backward (see kernels.h). */
void attn_k_linear(attn_ctx *ctx, const float *x, const float *w, const float *bias,
                   float *y, size_t rows, size_t in, size_t out);
void attn_k_linear_backward(attn_ctx *ctx, const float *x, const float *w, const float *dy,
                            float *dx, bool accumulate_dx, float *dw, float *dbias, size_t rows,
                            size_t in, size_t out);

struct attn_dropout_stream;

/* Whether attention runs on the fused kernels (else the reference ones). */
bool attn_k_fused_attention(const attn_ctx *ctx);
/* The attention forward on the fused kernels of the ctx's instruction set:
 * out and (when args->lse is set) lse. dropout as for attn_ref_sdpa (NULL:
 * none): a Philox stream is drawn in the kernel; a serial one (mt19937,
 * MKL) is drawn first, in PyTorch's order, into args->keep_bits (or into
 * scratch when that is NULL). who names the caller in messages.
 * workspace holds attn_k_sdpa_fused_bytes(ctx, args, serial) bytes, serial
 * telling whether a serial stream will draw; NULL: allocated here. Either
 * way all memory is in hand before the stream is drawn from or out
 * written, so a failure (ATTN_ERR_NO_MEMORY) changes neither. */
size_t attn_k_sdpa_fused_bytes(const attn_ctx *ctx, const attn_sdpa_args *args, bool serial);
attn_status attn_k_sdpa_fused(attn_ctx *ctx, const char *who, attn_sdpa_args *args,
                              struct attn_dropout_stream *dropout, void *workspace);
/* The attention backward: the reference kernel (with its workspace) when the
 * ctx runs the reference kernels, else the fused one (which needs g->out
 * and g->lse). workspace holds attn_k_sdpa_backward_bytes(ctx, g->fwd)
 * bytes, or is NULL (allocated here, before anything is written). */
size_t attn_k_sdpa_backward_bytes(const attn_ctx *ctx, const attn_sdpa_args *args);
attn_status attn_k_sdpa_backward(attn_ctx *ctx, const char *who, attn_sdpa_grad_args *g,
                                 void *workspace);

#endif /* ATTN_DISPATCH_H */
