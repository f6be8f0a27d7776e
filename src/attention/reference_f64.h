/*
 * reference_f64.h — the reference backend's passes on float64 tensors
 * (reference.c, the same code as the float backend, instantiated for
 * double): what attn_sdpa_forward_f64 / _backward_f64 run.
 *
 * The problem gives the geometry (shape, strides, positions, masks, ALiBi
 * slopes, sinks: float as in every problem); its tensor pointers are not
 * read, the tensors are these. scale and softcap are taken in double here
 * (the float problem holds them rounded to float).
 */
#ifndef ATTN_REFERENCE_F64_H
#define ATTN_REFERENCE_F64_H

#include "attention/attention.h"

typedef struct attn_reference_f64 {
    const double *q, *k, *v; /* with the problem's q, k, v strides */
    double *out, *lse;       /* forward: written (lse may be NULL); backward: read */
    const double *dout;      /* backward: out's strides */
    double *dq, *dk, *dv;    /* backward: written with q's, k's, v's strides */
    double scale, softcap;   /* softcap 0: off */
} attn_reference_f64;

/* Workspace bytes of each pass (as the float reference backend's). */
size_t attn_reference_f64_forward_bytes(const attn_ctx *ctx, const attn_attention_problem *p);
size_t attn_reference_f64_backward_bytes(const attn_ctx *ctx, const attn_attention_problem *p);

/* The passes on a checked problem, cannot fail. drop: NULL or kind NONE
 * for none. dsinks (float, NULL: not wanted) receives the sinks' gradient
 * when the problem has sinks. */
void attn_reference_f64_forward(const attn_ctx *ctx, const attn_attention_problem *p,
                                const attn_reference_f64 *t, const attn_attention_dropout *drop,
                                void *workspace);
void attn_reference_f64_backward(const attn_ctx *ctx, const attn_attention_problem *p,
                                 const attn_reference_f64 *t, const attn_attention_dropout *drop,
                                 float *dsinks, void *workspace);

#endif /* ATTN_REFERENCE_F64_H */
