/* kernel_set.c — a ctx's kernels, chosen once (kernel_set.h), and
 * attn_ctx_new, which makes a ctx and chooses them. */
#include "kernels/kernel_set.h"

#include "cpu_info.h"
#include "kernels/activation/activation.h"
#include "kernels/decode/decode.h"
#include "kernels/flash/flash.h"
#include "kernels/flex/flex.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm16.h"
#include "kernels/gemv/gemv.h"
#if defined(ATTN_HAVE_X86_KERNELS)
#include "kernels/flash16/flash16.h"
#endif

#include <stdio.h>
#include <string.h>

#if defined(ATTN_HAVE_X86_KERNELS)
/* The bf16 kernels need vdpbf16ps and the 16-bit shuffles of AVX-512BW. */
static bool cpu_has_avx512_bf16(void) {
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}

static void fill_avx512(attn_kernel_set *set) {
    set->name = "avx512";
    set->flash = &attn_flash_avx512;
    set->decode = &attn_decode_avx512;
    set->flex = &attn_flex_avx512;
    set->gemm = &attn_sgemm_kernel_avx512;
    set->gemm16 = &attn_gemm16_kernel_widened_avx512;
    bool streamed = attn_cpu_gemv_streamed();
    set->gemv = streamed ? &attn_gemv_kernel_avx512_streamed : &attn_gemv_kernel_avx512;
    set->activation = &attn_activation_avx2; /* every AVX-512 CPU has AVX2 and FMA */
    if (!cpu_has_avx512_bf16()) return;
    set->flash16_dot = &attn_flash16_dot_kernels;
    set->bgemm_dot = &attn_bgemm_kernel_avx512bf16;
    set->gemv = streamed ? &attn_gemv_kernel_avx512bf16_streamed : &attn_gemv_kernel_avx512bf16;
    set->bf16_dot_pays = attn_cpu_bf16_dot_pays();
    if (attn_cpu_amx_bf16_present()) {
        set->flash16_amx = &attn_flash16_amx_kernels;
        set->bgemm_amx = &attn_bgemm_kernel_amx;
        if (attn_cpu_amx_int8_present()) set->decode_amx = &attn_decode_avx512_amx;
    }
}
#endif

void attn_kernel_set_fill(attn_kernels isa, attn_kernel_set *set) {
    *set = (attn_kernel_set){.name = "reference"};
    switch (isa) {
    case ATTN_KERNELS_PORTABLE:
        *set = (attn_kernel_set){.name = "portable", .flash = &attn_flash_portable,
                                 .decode = &attn_decode_portable, .flex = &attn_flex_portable,
                                 .gemm = &attn_sgemm_kernel_portable,
                                 .gemm16 = &attn_gemm16_kernel_widened_portable,
                                 .gemv = &attn_gemv_kernel_portable};
        return;
#if defined(ATTN_HAVE_X86_KERNELS)
    case ATTN_KERNELS_AVX2:
        *set = (attn_kernel_set){.name = "avx2", .flash = &attn_flash_avx2,
                                 .decode = &attn_decode_avx2, .flex = &attn_flex_avx2,
                                 .gemm = &attn_sgemm_kernel_avx2,
                                 .gemm16 = &attn_gemm16_kernel_widened_avx2,
                                 .gemv = &attn_gemv_kernel_avx2,
                                 .activation = &attn_activation_avx2};
        return;
    case ATTN_KERNELS_AVX512:
        fill_avx512(set);
        return;
#else
    case ATTN_KERNELS_AVX2:
    case ATTN_KERNELS_AVX512:
#endif
    case ATTN_KERNELS_AUTO:
    case ATTN_KERNELS_REFERENCE:
        return;
    }
}

const attn_gemm16_kernel *attn_kernel_set_gemm16(const attn_kernel_set *set, attn_dtype dtype,
                                                 bool tiles) {
    if (dtype == ATTN_DTYPE_BF16) {
        if (set->bgemm_amx && tiles) return set->bgemm_amx;
        if (set->bgemm_dot && set->bf16_dot_pays) return set->bgemm_dot;
    }
    return set->gemm16;
}

size_t attn_kernel_set_describe(const attn_kernel_set *set, char *buf, size_t cap) {
    const char *none = "reference";
    char flash16[64];
    snprintf(flash16, sizeof flash16, "%s%s%s",
             set->flash16_dot ? set->flash16_dot->name : "widened",
             set->flash16_amx ? "+" : "", set->flash16_amx ? set->flash16_amx->name : "");
    if (!set->flash) snprintf(flash16, sizeof flash16, "%s", none);
    int n = snprintf(buf, cap,
             "%s: flash %s, flash16 %s, decode %s%s%s, gemm %s, gemm16 %s%s%s%s%s, gemv %s",
             set->name, set->flash ? set->flash->name : none, flash16,
             set->decode ? set->decode->name : none, set->decode_amx ? " / " : "",
             set->decode_amx ? set->decode_amx->name : "", set->gemm ? set->gemm->name : none,
             set->gemm16 ? set->gemm16->name : none, set->bgemm_dot ? " / " : "",
             set->bgemm_dot ? set->bgemm_dot->name : "", set->bgemm_amx ? " / " : "",
             set->bgemm_amx ? set->bgemm_amx->name : "", set->gemv ? set->gemv->name : none);
    return n > 0 ? (size_t)n : 0;
}

size_t attn_ctx_describe_kernels(const attn_ctx *ctx, char *buf, size_t cap) {
    if (!ctx) {
        attn_kernel_set none;
        attn_kernel_set_fill(ATTN_KERNELS_REFERENCE, &none);
        return attn_kernel_set_describe(&none, buf, cap);
    }
    return attn_kernel_set_describe(&ctx->ks, buf, cap);
}

attn_status attn_ctx_new(const attn_ctx_config *cfg, attn_ctx **out) {
    if (!out) return ATTN_ERR_NULL;
    *out = NULL;
    attn_ctx_config defaults = {0};
    if (!cfg) cfg = &defaults;
    attn_kernels kernels;
    attn_status st = attn_kernels_resolve(cfg->kernels, &kernels);
    if (st != ATTN_OK) return st;
    attn_ctx *ctx;
    if ((st = attn_ctx_alloc(cfg, kernels, &ctx)) != ATTN_OK) return st;
    attn_kernel_set_fill(kernels, &ctx->ks);
    *out = ctx;
    return ATTN_OK;
}
