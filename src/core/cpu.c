/* cpu.c — which kernel sets this CPU runs and which one a ctx takes: the
 * ctx's choice, made here in core so that the context needs nothing from
 * the kernels it chooses between. */
#include "internal.h"

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
