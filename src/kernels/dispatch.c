/* dispatch.c — choosing kernels: the CPU's instruction sets, the ctx's
 * choice, and the calls modules make. */
#include "kernels/dispatch.h"

#include <stdlib.h>
#include <string.h>

const char *attn_kernels_name(attn_kernels kernels) {
    switch (kernels) {
    case ATTN_KERNELS_AUTO: return "auto";
    case ATTN_KERNELS_REFERENCE: return "reference";
    case ATTN_KERNELS_PORTABLE: return "portable";
    case ATTN_KERNELS_AVX2: return "avx2";
    case ATTN_KERNELS_AVX512: return "avx512";
    }
    return "?";
}

bool attn_kernels_supported(attn_kernels kernels) {
    switch (kernels) {
    case ATTN_KERNELS_AUTO:
    case ATTN_KERNELS_REFERENCE:
    case ATTN_KERNELS_PORTABLE:
        return true;
#if defined(ATTN_HAVE_X86_KERNELS)
    case ATTN_KERNELS_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case ATTN_KERNELS_AVX512:
        return __builtin_cpu_supports("avx512f");
#else
    case ATTN_KERNELS_AVX2:
    case ATTN_KERNELS_AVX512:
        return false;
#endif
    }
    return false;
}

static bool parse_kernels(const char *name, attn_kernels *out) {
    for (attn_kernels k = ATTN_KERNELS_REFERENCE; k <= ATTN_KERNELS_AVX512; k++) {
        if (strcmp(name, attn_kernels_name(k)) == 0) {
            *out = k;
            return true;
        }
    }
    return false;
}

attn_status attn_kernels_resolve(attn_kernels requested, attn_kernels *out) {
    if (requested == ATTN_KERNELS_AUTO) {
        const char *env = getenv("ATTN_KERNELS");
        if (env && *env && strcmp(env, "auto") != 0) {
            if (!parse_kernels(env, &requested)) return ATTN_ERR_INVALID;
        } else {
            requested = attn_kernels_supported(ATTN_KERNELS_AVX512) ? ATTN_KERNELS_AVX512
                        : attn_kernels_supported(ATTN_KERNELS_AVX2) ? ATTN_KERNELS_AVX2
                                                                    : ATTN_KERNELS_PORTABLE;
        }
    }
    if (requested < ATTN_KERNELS_REFERENCE || requested > ATTN_KERNELS_AVX512 ||
        !attn_kernels_supported(requested))
        return ATTN_ERR_INVALID;
    *out = requested;
    return ATTN_OK;
}

/* ---- the calls ---------------------------------------------------------- */

void attn_k_matmul(const attn_ctx *ctx, const float *a, const float *b, float *c, size_t m,
                   size_t k, size_t n, bool b_transposed, bool accumulate) {
    if (accumulate)
        attn_ref_matmul_acc(ctx->num_threads, a, b, c, m, k, n, b_transposed);
    else
        attn_ref_matmul(ctx->num_threads, a, b, c, m, k, n, b_transposed);
}

void attn_k_matmul_tn_acc(const attn_ctx *ctx, const float *a, const float *b, float *c,
                          size_t k, size_t m, size_t n) {
    attn_ref_matmul_tn_acc(ctx->num_threads, a, b, c, k, m, n);
}

void attn_k_linear(const attn_ctx *ctx, const float *x, const float *w, const float *bias,
                   float *y, size_t rows, size_t in, size_t out) {
    attn_ref_linear(ctx->num_threads, x, w, bias, y, rows, in, out);
}

void attn_k_linear_backward(const attn_ctx *ctx, const float *x, const float *w, const float *dy,
                            float *dx, bool accumulate_dx, float *dw, float *dbias, size_t rows,
                            size_t in, size_t out) {
    attn_ref_linear_backward(ctx->num_threads, x, w, dy, dx, accumulate_dx, dw, dbias, rows, in,
                             out);
}
