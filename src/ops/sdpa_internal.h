/*
 * sdpa_internal.h — what the float attn_sdpa_* calls (sdpa.c) share with
 * their 16-bit storage variants (sdpa16.c): the public config read into the
 * attention contract's problem, and the argument checks, so that both name
 * the same wrong values the same way.
 */
#ifndef ATTN_OPS_SDPA_INTERNAL_H
#define ATTN_OPS_SDPA_INTERNAL_H

#include "attention/attention.h"

#include <math.h>

/* Whether x (a scale, a softcap) survives the float calls' rounding to
 * float32: finite, and below FLT_MAX plus half an ulp, where rounding
 * gives infinity. */
static inline bool attn_fits_float(double x) { return isfinite(x) && fabs(x) < 0x1.ffffffp127; }

/* Each query head's ALiBi slope and sink (either NULL: none) finite: a NaN
 * one would make every row of its head NaN, an infinite one every row NaN
 * or zero. ATTN_ERR_INVALID naming the first that is not. */
attn_status attn_check_head_params(attn_ctx *ctx, const char *who, const float *alibi_slopes,
                                   const float *sinks, size_t heads);

/* The problem cfg describes, on these tensors of dtype (NULL for a
 * problem used for its geometry only). */
attn_attention_problem attn_sdpa_problem_of(const attn_sdpa_config *c, attn_dtype dtype,
                                            const void *q, const void *k, const void *v,
                                            void *out, float *lse);
/* The config's own fields (what attn_attention_check does not check). */
attn_status attn_sdpa_check_config(attn_ctx *ctx, const char *fn, const attn_sdpa_config *c);
/* A forward's first checks: ctx (clears its error), the config, the
 * tensors, the dropout's rng and record. */
attn_status attn_sdpa_check_forward_args(attn_ctx *ctx, const char *fn,
                                         const attn_sdpa_config *cfg, const void *q,
                                         const void *k, const void *v, const void *out,
                                         attn_rng *rng, const attn_sdpa_dropout *drawn);
/* A backward's first checks: ctx (clears its error), the config, its
 * tensors (q, k, v, out, lse, dout, dq, dk, dv, in that order),
 * sinks_grad and the forward's dropout record. */
attn_status attn_sdpa_check_backward_args(attn_ctx *ctx, const char *fn,
                                          const attn_sdpa_config *cfg,
                                          const void *const tensors[9],
                                          const attn_sdpa_dropout *drawn);
/* The forward of p, cfg's problem: its workspace, then cfg's dropout
 * drawn from rng (its record in drawn), then the runner. */
attn_status attn_sdpa_run_forward(attn_ctx *ctx, const char *fn, const attn_sdpa_config *cfg,
                                  const attn_attention_problem *p, attn_rng *rng,
                                  attn_sdpa_dropout *drawn);
/* The backward of cfg's problem on tensors (as checked above) of dtype,
 * with the loss's gradient in lse (lse's type; NULL: none): the dropout
 * drawn is redrawn, the runner runs it. */
attn_status attn_sdpa_run_backward(attn_ctx *ctx, const char *fn, const attn_sdpa_config *cfg,
                                   attn_dtype dtype, const void *const tensors[9],
                                   const void *dlse, const attn_sdpa_dropout *drawn);
/* The dropout a backward redraws: the forward's Philox record. */
attn_attention_dropout attn_sdpa_drop_of(const attn_sdpa_config *c,
                                         const attn_sdpa_dropout *drawn);

#endif /* ATTN_OPS_SDPA_INTERNAL_H */
