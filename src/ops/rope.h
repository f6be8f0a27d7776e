/*
 * rope.h — RoPE's inverse frequencies as the book's compute_rope_params
 * (llms_from_scratch llama3 / kv_cache) makes them, shared by the Llama 3
 * that generates (src/lm) and the one that trains (src/train).
 */
#ifndef ATTN_OPS_ROPE_H
#define ATTN_OPS_ROPE_H

#include "attn.h"

#include <stddef.h>

/* Llama 3.1's frequency scaling (rope_freq); factor 0 means none. */
typedef struct attn_rope_scaling {
    double factor, low_freq_factor, high_freq_factor;
    size_t original_context_length;
} attn_rope_scaling;

/* inv_freq (head_dim / 2) = 1 / rope_base ** (2i / head_dim), then scaled,
 * in float32 step by step as PyTorch computes them (the comparisons with
 * the wavelength bounds included), the power correctly rounded. */
void attn_rope_inv_freq(double rope_base, const attn_rope_scaling *scaling, size_t head_dim,
                        float *inv_freq);

/* ATTN_OK where rope_base is positive and finite and stays so in float32,
 * where RoPE's frequencies are computed from it (one that rounds to 0 or
 * to infinity makes them infinite or 0); else ATTN_ERR_INVALID, "who:
 * name (...) ...", name what the caller calls it (rope_base, rope_theta). */
attn_status attn_rope_check_base(attn_ctx *ctx, const char *who, const char *name,
                                 double rope_base);

#endif /* ATTN_OPS_ROPE_H */
