/*
 * sdpa16.h — which kernels the 16-bit SDPA calls (sdpa16.c) choose, for the
 * tests and benchmarks that must know what they measured.
 */
#ifndef ATTN_OPS_SDPA16_H
#define ATTN_OPS_SDPA16_H

#include "attn.h"

#include <stdbool.h>

/* The kernels attn_sdpa_forward_16 (backward: attn_sdpa_backward_16) runs
 * a valid cfg on, on ctx, now, when its values are finite and small enough
 * for float tiles: "amx" (AMX tiles: flash16_amx.c), "vdpbf16ps"
 * (flash16_avx512bf16.c) or "widened" (to float, the float attention). */
const char *attn_sdpa16_kernel(const attn_ctx *ctx, const attn_sdpa_config *cfg,
                               attn_dtype dtype, bool backward);

/* For the tests: bf16 on ctx runs the vdpbf16ps kernels where the CPU has
 * them even where they do not pay (Intel's cores widen otherwise), so that
 * every CPU with avx512_bf16 checks them. */
void attn_sdpa16_force_dot(attn_ctx *ctx);

#endif /* ATTN_OPS_SDPA16_H */
