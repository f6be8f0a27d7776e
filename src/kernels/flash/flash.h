/*
 * flash.h — fused, tiled attention (the FlashAttention-2 algorithm) for
 * CPUs: the fast path under every module's attention, forward and backward,
 * on the one attention contract (attention/attention.h) with all of its
 * features: GQA, diagonals and sliding windows, softcap, ALiBi, a
 * relative position bias (attn_flash_bias), sinks, packed variable-length
 * batches and dropout.
 *
 * Forward: per (batch, KV head, block of query rows), the keys a
 * block's rows may see are walked a block at a time (blocks wholly outside
 * the causal/window band are never visited); each key block is packed once
 * and run against the blocks of every query head of the group (GQA reads K
 * and V once per group). Scores S = q k^T (raw; the scale enters each
 * exponent after the row max is subtracted, so rounding does not grow with
 * the logits) go into a register tile, are folded into a running max and
 * sum per row (online softmax, the sink included from the start), and
 * their weights applied to v at once. No (T, S) buffer: the extra memory is
 * a few tiles per thread. It writes out and each row's log-sum-exp (lse,
 * its rounding error and the row's max and sum where the caller keeps
 * them: attn_attention_problem's lse_lo, row_stats), from which the
 * backward recomputes the weights. Plain problems (raw scores: no softcap,
 * ALiBi or sinks; no dropout) take the lane forward (flash_lanes.h): the
 * same blocks and arithmetic with each query row in a vector lane, keys
 * and values read as rows (a strided head packed once per thread), the
 * row statistics one lane of a vector.
 *
 * Backward, deterministic by construction: each output written by one
 * thread in one fixed order, so any thread count gives the same bits. With
 * at least 4 (batch, KV head) items, one pass per item: key block after key
 * block, the query blocks that see it, dv and dk of the block and dq of the
 * rows (five tile products). With fewer, two passes spread wider:
 *   A. per (batch, KV head, block of keys): dv, dk summed over the group's
 *      query heads in order, and over the query blocks that see the keys;
 *   B. per (batch, KV head, block of queries): dq of each of the group's
 *      heads over the key blocks its rows see.
 * Both recompute P (the forward's own weights from its row max and sum, or
 * else exp(s scale - lse)) and dS = P (dP - delta), delta_i =
 * dO_i . O_i, for their tiles; rows nearly one-hot then take the delta of
 * their own P and dP (attention.h): the one pass changes dq and dk at the
 * largest weight's key after its sweep, and every key's dk by the
 * transpose of dq's mean-key estimate; B runs before A, changes dq so and
 * leaves A the new delta. dsinks[h] = -sum_i exp(sink_h - lse_i) delta_i,
 * summed in a fixed order.
 *
 * Dropout is applied inside: from keep bits (drawn beforehand) or from
 * Philox counters (drawn in the tile, again in the backward), at
 * attn_drop_index. The renormalising causal mask runs as -inf masking.
 */
#ifndef ATTN_FLASH_H
#define ATTN_FLASH_H

#include "contract/attention_problem.h"
#include "parallel.h"

#include <stddef.h>
#include <stdint.h>

/* What the forward may size its query blocks by: the threads it runs on
 * and one core's L2 (0: unknown). The forward and its workspace must be
 * given the same. */
typedef struct attn_flash_fit {
    size_t threads, l2_bytes;
} attn_flash_fit;

/* What the backward knows of each row's softmax, in p->lse's layout
 * (attn_lse_index): lse, and optionally its rounding error lse_lo and the
 * forward's own row statistics (attn_attention_problem's row_stats, two
 * floats a row; NaN rows: none), from which it takes the weights where a
 * row has them. */
typedef struct attn_flash_rows {
    const float *lse, *lse_lo, *stats;
} attn_flash_rows;

/* A relative position bias (T5's buckets, or a table by distance: the
 * problem's one score modifier, attn_score_mod_relative) as the kernels
 * add it after softcap, in base 2 (times log2 e), query head h's values
 * by distance in two orders so that a vector of keys or of rows reads
 * consecutive floats: by_key[h * stride + (j - i)] for key j of query i
 * (each counted in its sequence), by_row[h * stride + (i - j)] the same
 * value. Both pointers sit at distance 0, with every distance a padded
 * tile reaches on either side. */
typedef struct attn_flash_bias {
    const float *by_key, *by_row;
    size_t stride;
} attn_flash_bias;

/* One instruction set's kernels, run on w's threads. Workspaces are floats
 * per parallel part (attn_parallel_parts(w.threads) of them), sized by the
 * matching _workspace function, zeroed or not. The caller has checked the problem (kv_heads
 * divides q_heads, v_head_dim == head_dim). */
typedef struct attn_flash_kernels {
    const char *name;
    /* The largest |x[i]| of n floats, or top if larger; inf when some x[i]
     * is inf or NaN (the scan that sends such inputs to the reference) */
    float (*max_abs)(const float *x, size_t n, float top);
    /* The same over rows rows of n floats, row stride st */
    float (*max_abs_rows)(const float *x, size_t rows, size_t st, size_t n, float top);
    size_t (*forward_workspace)(const attn_attention_problem *p, attn_flash_fit fit);
    /* Whether forward, given magnitudes, measures the inputs it reads
     * itself (max |x| of q, k, v: every row the attention uses, inf for
     * inf or NaN), so that the caller need not scan them first */
    bool (*forward_measures)(const attn_attention_problem *p, const attn_attention_dropout *drop);
    /* p->out and p->lse (when set) from p's q, k, v; with p->out NULL only
     * p->lse (the statistics a backward needs when its forward kept none).
     * bias: p's relative bias as a table, where p's chain is one (else
     * NULL). magnitudes (or NULL): what it measured, all inf when it did
     * not */
    void (*forward)(attn_workers w, attn_flash_fit fit, const attn_attention_problem *p,
                    const attn_attention_dropout *drop, const attn_flash_bias *bias,
                    float *workspace, float magnitudes[3]);
    size_t (*backward_workspace)(const attn_attention_problem *p);
    /* Whether backward, given magnitudes, measures the inputs it reads
     * itself (max |x| of q, k, v, dout, as forward_measures) */
    bool (*backward_measures)(const attn_attention_problem *p, const attn_attention_dropout *drop);
    /* g's dq, dk, dv (and dsinks) from g->dout, p->out and the rows'
     * statistics (attn_flash_rows); delta (lse's layout) is scratch; bias
     * as forward's. magnitudes (or NULL): what it measured, all inf when
     * it did not */
    void (*backward)(attn_workers w, const attn_attention_problem *p,
                     const attn_attention_dropout *drop, const attn_flash_bias *bias,
                     const attn_attention_grads *g, attn_flash_rows rows, float *delta,
                     float *workspace, float magnitudes[4]);
} attn_flash_kernels;

extern const attn_flash_kernels attn_flash_portable;
#if defined(ATTN_HAVE_X86_KERNELS)
extern const attn_flash_kernels attn_flash_avx2;
extern const attn_flash_kernels attn_flash_avx512;
#endif

#endif /* ATTN_FLASH_H */
