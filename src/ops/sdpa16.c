/* sdpa16.c — scaled dot-product attention on 16-bit storage (bf16, f16):
 * attn_sdpa_forward_16 / attn_sdpa_backward_16, the public config read
 * into a problem of 16-bit views, then the runner: the fused bf16 backend
 * (attention/fused16.c) where it takes the problem and its values, else
 * the problem widened to float32 (attention/widen16.c) on the float
 * backends, each output rounded to the dtype once.
 */
#include "attention/attention.h"
#include "internal.h"
#include "ops/sdpa16.h"
#include "ops/sdpa_internal.h"

void attn_sdpa16_force_dot(attn_ctx *ctx) { ctx->bf16_dot_forced = true; }

const char *attn_sdpa16_kernel(const attn_ctx *ctx, const attn_sdpa_config *cfg,
                               attn_dtype dtype, bool backward) {
    attn_attention_problem p = attn_sdpa_problem_of(cfg, dtype, NULL, NULL, NULL, NULL, NULL);
    float lse; /* a backward's lse, for its geometry only */
    if (backward) p.lse = &lse;
    attn_pass pass = {.backward = backward, .dropout = cfg->dropout > 0.0};
    const attn_attention_backend *b = &attn_attention_fused16;
    return b->declines(ctx, &p, pass) ? "widened" : b->kernel_name(ctx, &p);
}

/* ---- the entry points ------------------------------------------------------------ */

static attn_status check_dtype(attn_ctx *ctx, const char *fn, attn_dtype dtype) {
    if (dtype == ATTN_DTYPE_BF16 || dtype == ATTN_DTYPE_F16) return ATTN_OK;
    return attn_fail(ctx, ATTN_ERR_INVALID, "%s: dtype (%s, %d) must be BF16, F16 or F32", fn,
                     attn_dtype_name(dtype), (int)dtype);
}

attn_status attn_sdpa_forward_16(attn_ctx *ctx, const attn_sdpa_config *cfg, attn_dtype dtype,
                                 const void *q, const void *k, const void *v, void *out,
                                 float *lse, attn_rng *rng, attn_sdpa_dropout *drawn) {
    const char *fn = "attn_sdpa_forward_16";
    if (!ctx) return ATTN_ERR_NULL;
    if (dtype == ATTN_DTYPE_F32)
        return attn_sdpa_forward(ctx, cfg, q, k, v, out, lse, rng, drawn);
    attn_status st = attn_sdpa_check_forward_args(ctx, fn, cfg, q, k, v, out, rng, drawn);
    if (st != ATTN_OK || (st = check_dtype(ctx, fn, dtype)) != ATTN_OK) return st;
    attn_attention_problem p = attn_sdpa_problem_of(cfg, dtype, q, k, v, out, lse);
    return attn_sdpa_run_forward(ctx, fn, cfg, &p, rng, drawn);
}

attn_status attn_sdpa_backward_16(attn_ctx *ctx, const attn_sdpa_config *cfg, attn_dtype dtype,
                                  const void *q, const void *k, const void *v, const void *out,
                                  const float *lse, const void *dout, void *dq, void *dk,
                                  void *dv, const attn_sdpa_dropout *drawn) {
    const char *fn = "attn_sdpa_backward_16";
    if (!ctx) return ATTN_ERR_NULL;
    if (dtype == ATTN_DTYPE_F32)
        return attn_sdpa_backward(ctx, cfg, q, k, v, out, lse, dout, dq, dk, dv, drawn);
    const void *tensors[9] = {q, k, v, out, lse, dout, dq, dk, dv};
    attn_status st = attn_sdpa_check_backward_args(ctx, fn, cfg, tensors, drawn);
    if (st != ATTN_OK || (st = check_dtype(ctx, fn, dtype)) != ATTN_OK) return st;
    return attn_sdpa_run_backward(ctx, fn, cfg, dtype, tensors, NULL, drawn);
}
