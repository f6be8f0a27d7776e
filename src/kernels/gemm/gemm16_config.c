/*
 * gemm16_config.c — the 16-bit kernel sets (gemm16.h): the SGEMM's kernel
 * of each instruction set on widened panels, with the SGEMM's blocks
 * (gemm_config.c) counted in elements of k, and the bf16 ones on
 * vdpbf16ps and AMX tiles. Which one a call takes is the ctx's kernel
 * set's (kernels/kernel_set.c: attn_kernel_set_gemm16).
 *
 * The bf16 blocks hold half the bytes of the float ones at the same kc:
 * at kc = 384 (192 pairs) the 14-row A micro-panel is 10.5 KiB, each
 * 32-column B micro-panel 24 KiB (L1d), and a B block of nc = 1024 columns
 * 768 KiB (L2).
 */
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm16.h"

#define SHARED_MAX ((size_t)1 << 22)

/* The SGEMM microkernels, on widened float panels. */
static void widened_portable(size_t steps, const void *a, const void *b, float *c, size_t ldc,
                             float alpha, float beta) {
    attn_sgemm_portable_4x8(steps, a, b, c, ldc, alpha, beta, NULL);
}

const attn_gemm16_kernel attn_gemm16_kernel_widened_portable = {
    .name = "gemm16_widened_portable_4x8", .isa = ATTN_KERNELS_PORTABLE,
    .mr = 4, .nr = 8, .mc = 1024, .kc = 256, .nc = 512, .shared_max = SHARED_MAX,
    .k_unit = 1, .packed_bytes = sizeof(float), .micro = widened_portable,
    .pack_a = attn_gemm16_widen_4_pack_a, .pack_b = attn_gemm16_widen_8_pack_b,
};

#if defined(ATTN_HAVE_X86_KERNELS)
static void widened_avx2(size_t steps, const void *a, const void *b, float *c, size_t ldc,
                         float alpha, float beta) {
    attn_sgemm_avx2_6x16(steps, a, b, c, ldc, alpha, beta, NULL);
}

static void widened_avx512(size_t steps, const void *a, const void *b, float *c, size_t ldc,
                           float alpha, float beta) {
    attn_sgemm_avx512_14x32(steps, a, b, c, ldc, alpha, beta, NULL);
}

const attn_gemm16_kernel attn_gemm16_kernel_widened_avx2 = {
    .name = "gemm16_widened_avx2_6x16", .isa = ATTN_KERNELS_AVX2,
    .mr = 6, .nr = 16, .mc = 1020, .kc = 384, .nc = 512, .shared_max = SHARED_MAX,
    .k_unit = 1, .packed_bytes = sizeof(float), .micro = widened_avx2,
    .pack_a = attn_gemm16_widen_avx2_6_pack_a, .pack_b = attn_gemm16_widen_avx2_16_pack_b,
    .pack_b16 = attn_gemm16_avx2_16_pack_b16, .micro_f16 = attn_sgemm_avx2_6x16_f16,
    .micro_bf16 = attn_sgemm_avx2_6x16_bf16,
};

const attn_gemm16_kernel attn_gemm16_kernel_widened_avx512 = {
    .name = "gemm16_widened_avx512_14x32", .isa = ATTN_KERNELS_AVX512,
    .mr = 14, .nr = 32, .mc = 1008, .kc = 384, .nc = 512, .shared_max = SHARED_MAX,
    .k_unit = 1, .packed_bytes = sizeof(float), .micro = widened_avx512,
    .pack_a = attn_gemm16_widen_avx512_14_pack_a, .pack_b = attn_gemm16_widen_avx512_32_pack_b,
};

const attn_gemm16_kernel attn_bgemm_kernel_avx512bf16 = {
    .name = "bgemm_avx512bf16_14x32", .isa = ATTN_KERNELS_AVX512, .bf16_only = true,
    .mr = 14, .nr = 32, .mc = 1008, .kc = 384, .nc = 1024, .shared_max = SHARED_MAX,
    .k_unit = 2, .packed_bytes = sizeof(uint16_t), .micro = attn_bgemm_avx512bf16_14x32,
    .pack_a = attn_bgemm_avx512bf16_14x32_pack_a, .pack_b = attn_bgemm_avx512bf16_14x32_pack_b,
};

/* AMX: 32 x 32 tiles, k in steps of 32. kc = 1024 (micro-panels of 64
 * KiB, which the tile loads stream from L2; a B block of 2 MiB): one C pass
 * per 768-deep projection such as GPT-2's c_attn (1024 x 2304 x 768). */
const attn_gemm16_kernel attn_bgemm_kernel_amx = {
    .name = "bgemm_amx_32x32", .isa = ATTN_KERNELS_AVX512, .bf16_only = true,
    .mr = 32, .nr = 32, .mc = 1024, .kc = 1024, .nc = 1024, .shared_max = SHARED_MAX,
    .k_unit = 32, .packed_bytes = sizeof(uint16_t), .micro = attn_bgemm_amx_32x32,
    .pack_a = attn_bgemm_amx_32x32_pack_a, .pack_b = attn_bgemm_amx_32x32_pack_b,
};
#endif
