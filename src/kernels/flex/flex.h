/*
 * flex.h — fused attention under a general block map and a chain of score
 * modifiers (programmable attention, attn.h): the kernels of the flex
 * backend (attention/flex.c), written once over the vector vocabulary
 * (flex_kernel.h) and compiled per instruction set.
 *
 * Each pass first packs every key block once (k^T and v in the layouts
 * its tiles read), so that a block visited by many query blocks and heads
 * is read from K and V once.
 *
 * Forward, per (batch, KV head, query block) item and each query head of
 * the group: the key blocks the map lists for the block (ascending; with
 * no map every block some row's causal/window keys reach), each a tile of
 * block_q x block_kv scores computed into L1 (s = q . k * scale), the chain
 * applied to the tile in order, then the mask: nothing for a full tile
 * that every row's causal/window interval covers, the map's bits for a
 * partial one, the intervals where they cut the tile. Online softmax
 * (FlashAttention-2) over the tiles, the sink in each row's sum from the
 * start; out = sum P v / l, lse = m + ln l (and its rounding, lse_lo).
 *
 * Backward, in passes each writing every output from one item in one fixed
 * order, so any thread count gives the same bits:
 *   delta  per row: delta_i = dO_i . O_i;
 *   keys   per (batch, KV head, key block): the query blocks of the map's
 *          transpose for each head of the group in order: P = exp(s -
 *          lse), dP = dO v^T, dS = P (dP - delta), back through the chain
 *          (each modifier's input recomputed), dv += P^T dO, dk += dS^T q;
 *   rows   per (batch, KV head, query block): the same tiles, dq += dS k,
 *          and the gradients of BIAS and REL_BIAS tensors whose elements
 *          the item owns alone;
 *   mods   for a tensor gradient that items would share (a broadcast bias,
 *          T5's table): items over the tensor's own elements, summing the
 *          broadcast (b, h, query block) in order.
 */
#ifndef ATTN_FLEX_H
#define ATTN_FLEX_H

#include "contract/attention_problem.h"
#include "parallel.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A callback modifier's error: the first item (in item order) whose
 * callback returned nonzero, and where. */
typedef struct attn_flex_failure {
    bool failed;
    size_t item;
    int code;
    size_t mod, b, h, q0, kv0, rows, cols;
    bool backward; /* grad_fn (else fn) */
} attn_flex_failure;

/* What a pass takes besides the problem: the T5 bucket of each key
 * distance for each REL_BIAS modifier (bucket[mod][kv_idx - q_idx + T - 1],
 * NULL for other kinds), a failure slot per parallel part, and room for the
 * packed key blocks (keys_floats). */
typedef struct attn_flex_args {
    const attn_attention_problem *p;
    const int32_t *const *buckets;
    attn_flex_failure *failures; /* attn_parallel_parts(threads) of them */
    float *keys;
} attn_flex_args;

/* Rows of p's lse layout that the backward's delta scratch counts. */
static inline size_t attn_flex_rows(const attn_attention_problem *p) {
    return p->batch * p->q_heads * p->q_len;
}

/* Floats of the backward's delta scratch: 3 x attn_flex_rows(p), and per
 * row a float for each softcap or callback of the chain. */
static inline size_t attn_flex_delta_floats(const attn_attention_problem *p) {
    size_t kept = 0;
    for (size_t k = 0; k < p->score_mod_count; k++)
        kept += p->score_mods[k].kind == ATTN_SCORE_SOFTCAP ||
                p->score_mods[k].kind == ATTN_SCORE_CALLBACK;
    return (3 + kept) * attn_flex_rows(p);
}

typedef struct attn_flex_kernels {
    const char *name;
    /* Floats of workspace per parallel part (the backward's may be more). */
    size_t (*part_floats)(const attn_attention_problem *p, bool backward);
    /* Floats of the packed key blocks (each (b, KV head, key block) packed
     * once per pass, K^T and V's rows or, backward, V^T and K's rows). */
    size_t (*keys_floats)(const attn_attention_problem *p, bool backward);
    /* p->out (when set) and p->lse (when set), p->lse_lo (when set). */
    void (*forward)(attn_workers w, const attn_flex_args *a, float *parts);
    /* g's dq, dk, dv and the BIAS/REL_BIAS tensor_grads (zeroed by the
     * caller) from g->dout, p->out, lse and lse_lo (p->lse's layout, or
     * NULL); delta holds attn_flex_delta_floats(p): dO . O in the first
     * attn_flex_rows(p) (the same layout), then the kernels' own per-row
     * scratch. */
    void (*backward)(attn_workers w, const attn_flex_args *a, const attn_attention_grads *g,
                     const float *lse, const float *lse_lo, float *delta, float *parts);
} attn_flex_kernels;

extern const attn_flex_kernels attn_flex_portable;
#if defined(ATTN_HAVE_X86_KERNELS)
extern const attn_flex_kernels attn_flex_avx2;
extern const attn_flex_kernels attn_flex_avx512;
#endif

#endif /* ATTN_FLEX_H */
