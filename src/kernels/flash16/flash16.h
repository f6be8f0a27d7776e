/*
 * flash16.h — fused attention on bf16 storage, on AMX tiles where the
 * process may use them (flash16_amx.c: the same products on 16 x 16 float
 * tiles, declared at the end), else with vdpbf16ps (avx512_bf16):
 * FlashAttention-2's algorithm as in kernels/flash (flash.h), every product
 * of two bf16 values summed in float by vdpbf16ps, which takes pairs of
 * bf16 along the reduction in each 32-bit lane:
 *
 *   forward   S = Q K^T          pairs along d:    q rows as stored, K^T packed (D/2, BC)
 *             O += P V           pairs along keys: P rounded to bf16, V two rows interleaved
 *   backward  dP = dO V^T        pairs along d:    dO as stored, V^T packed (D/2, BC)
 *             dV += P^T dO       pairs along rows: P and dO two rows interleaved
 *             dK += dS^T Q       pairs along rows: dS and Q two rows interleaved
 *             dQ += dS K         pairs along keys: dS rounded to bf16, K two rows interleaved
 *
 * The softmax runs in float on base-2 logits, its exponent an fma of the
 * raw score: 2^fma(s, c, -M) with c = scale log2 e and M the row's running
 * max times c, rounded once and used for the row's sum and lse alike, so
 * that its rounding does not grow with the scores; the backward's P =
 * 2^(fma(s, scale, -lse) log2 e). P and dS are rounded to bf16 (round to
 * nearest even) before they multiply V, K, Q (as PyTorch's bf16 SDPA does);
 * sums stay float; each output is rounded to bf16 once.
 *
 * The problem is attention.h's, without dropout, softcap, ALiBi and sinks,
 * v_head_dim == head_dim and scale >= 0 (sdpa16.c sends the rest to the
 * float kernels): GQA, every diagonal, sliding windows and packed
 * variable-length batches are in. The backward is deterministic, as the
 * float one: pass B per query block (dq), then pass A per key block (dk,
 * dv), each output written by one thread in a fixed order. B runs first:
 * its rows nearly one-hot take the delta of their own P and dP
 * (attention.h), and leave it to A.
 *
 * Only call these where attn_flash16_bf16_usable(): this file is compiled
 * for AVX-512 BF16 and the CPU must run it.
 */
#ifndef ATTN_FLASH16_H
#define ATTN_FLASH16_H

#include "contract/attention_problem.h"
#include "parallel.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The 16-bit tensors of a pass, in the problem's strides (p's float
 * pointers are unused). Forward: q, k, v in, out and lse (may be NULL)
 * out. Backward: q, k, v, out, lse, dout in, dq, dk, dv out. */
typedef struct attn_flash16_tensors {
    const uint16_t *q, *k, *v;
    uint16_t *out;
    float *lse;
    const uint16_t *saved_out, *dout;
    const float *saved_lse;
    uint16_t *dq, *dk, *dv;
} attn_flash16_tensors;

/* Bytes of workspace a pass needs at this thread count (SIZE_MAX when it
 * overflows: an allocation that then fails). */
size_t attn_flash16_forward_bytes(const attn_attention_problem *p, size_t threads);
size_t attn_flash16_backward_bytes(const attn_attention_problem *p, size_t threads);
/* The passes, on workspace of that size (contents any); they cannot fail. */
void attn_flash16_forward(attn_workers w, const attn_attention_problem *p,
                          const attn_flash16_tensors *t, void *workspace);
void attn_flash16_backward(attn_workers w, const attn_attention_problem *p,
                           const attn_flash16_tensors *t, void *workspace);

/* The largest magnitude (bf16 bits with the sign cleared: they order as
 * the values; 0x7F80 and up: inf or NaN) of rows x width elements, rows
 * stride elements apart. AVX-512BW, as the kernels. */
uint16_t attn_flash16_max_magnitude(const uint16_t *x, size_t rows, size_t stride, size_t width);

/* The passes on AMX tiles (flash16_amx.c), the same contract: where the
 * process may use the tiles (the CPU has amx_bf16, the OS saves the tile
 * state and Linux gave the permission, which the application asks for:
 * attn_cpu_request_amx; attn_ctx_amx_usable) and head_dim is a multiple
 * of 32. Only where attn_flash16 runs (AVX-512 BF16): that file is
 * compiled for AMX and AVX-512. */
size_t attn_flash16_amx_forward_bytes(const attn_attention_problem *p, size_t threads);
size_t attn_flash16_amx_backward_bytes(const attn_attention_problem *p, size_t threads);
void attn_flash16_amx_forward(attn_workers w, const attn_attention_problem *p,
                              const attn_flash16_tensors *t, void *workspace);
void attn_flash16_amx_backward(attn_workers w, const attn_attention_problem *p,
                               const attn_flash16_tensors *t, void *workspace);

/* One kind of fused bf16 attention, as the ctx's kernel set holds it
 * (flash16_dot: vdpbf16ps; flash16_amx: AMX tiles, where the process may
 * use them, asked per call: attn_ctx_amx_usable). */
typedef struct attn_flash16_kernels {
    const char *name; /* "vdpbf16ps", "amx" */
    /* NULL when it runs p (within the bf16 path's features), else why not */
    const char *(*declines)(const attn_attention_problem *p);
    size_t (*forward_bytes)(const attn_attention_problem *p, size_t threads);
    size_t (*backward_bytes)(const attn_attention_problem *p, size_t threads);
    void (*forward)(attn_workers w, const attn_attention_problem *p,
                    const attn_flash16_tensors *t, void *workspace);
    void (*backward)(attn_workers w, const attn_attention_problem *p,
                     const attn_flash16_tensors *t, void *workspace);
} attn_flash16_kernels;

extern const attn_flash16_kernels attn_flash16_dot_kernels; /* flash16_avx512bf16.c */
extern const attn_flash16_kernels attn_flash16_amx_kernels; /* flash16_amx.c */

#endif /* ATTN_FLASH16_H */
