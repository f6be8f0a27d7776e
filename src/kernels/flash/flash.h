/*
 * flash.h — fused, tiled attention (the FlashAttention-2 algorithm) for
 * CPUs: the fast path under every module's attention, forward and backward.
 *
 * Forward: per (batch, head, block of query rows), the keys are walked a
 * block at a time; each block's scores S = q k^T * scale are computed into
 * a register tile, folded into a running max and sum per row (online
 * softmax), and their weights applied to v at once. No (T, S) buffer: the
 * extra memory is a few tiles per thread. It writes out and each row's
 * log-sum-exp (lse), from which the backward recomputes the weights.
 *
 * Backward, deterministic by construction: two passes, each output written
 * by one thread in one fixed order, so any thread count gives the same bits.
 *   A. per (batch, head, block of keys): dv, dk over every query block;
 *   B. per (batch, head, block of queries): dq over every key block.
 * Both recompute P = exp(S - lse) and dS = P (dP - delta), delta_i =
 * dO_i . O_i, for their tiles (7 tile products in all, against the 5 of a
 * backward that adds dq across threads, in an order that varies).
 *
 * Dropout is applied inside: from the forward's keep bits (the PyTorch-exact
 * serial modes, drawn beforehand) or from Philox counters (ATTN_BERNOULLI_
 * PHILOX, drawn in the tile, again in the backward). Same contract as the
 * reference kernels (kernels.h): T queries, S keys, strides, causal aligned
 * bottom-right, the renormalising mask equal to -inf masking.
 */
#ifndef ATTN_FLASH_H
#define ATTN_FLASH_H

#include "kernels/kernels.h"

#include <stddef.h>
#include <stdint.h>

typedef enum attn_flash_drop_kind {
    ATTN_FLASH_DROP_NONE,
    ATTN_FLASH_DROP_BITS,   /* keep_bits: one bit per (B, H, T, S) weight */
    ATTN_FLASH_DROP_PHILOX  /* philox: see rng/philox.h */
} attn_flash_drop_kind;

typedef struct attn_flash_dropout {
    attn_flash_drop_kind kind;
    const uint8_t *keep_bits;
    uint64_t seed, offset, keep_threshold;
    float kept_scale; /* 1 / (1 - p) */
} attn_flash_dropout;

/* One instruction set's kernels. Workspaces are floats per parallel part
 * (attn_parallel_for_parts), sized by the matching _workspace function. */
typedef struct attn_flash_kernels {
    const char *name;
    /* The largest |x[i]| of n floats, or top if larger; inf when some x[i]
     * is inf or NaN (the scan that sends such inputs to the reference) */
    float (*max_abs)(const float *x, size_t n, float top);
    size_t (*forward_workspace)(size_t head_dim);
    /* out and lse (B, H, T) from a's q, k, v */
    void (*forward)(size_t threads, const attn_sdpa_args *a, const attn_flash_dropout *drop,
                    float *workspace);
    size_t (*backward_workspace)(size_t head_dim);
    /* dq, dk, dv from dout, out and lse; delta (B, H, T) is scratch */
    void (*backward)(size_t threads, const attn_sdpa_args *a, const attn_flash_dropout *drop,
                     const float *out, const float *lse, const float *dout, float *dq, float *dk,
                     float *dv, float *delta, float *workspace);
} attn_flash_kernels;

extern const attn_flash_kernels attn_flash_portable;
#if defined(ATTN_HAVE_X86_KERNELS)
extern const attn_flash_kernels attn_flash_avx2;
extern const attn_flash_kernels attn_flash_avx512;
#endif

#endif /* ATTN_FLASH_H */
