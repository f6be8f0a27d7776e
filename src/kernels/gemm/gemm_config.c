/*
 * gemm_config.c — the kernel sets and their cache blocks, all in one place
 * (BLIS's config/<arch>/): which microkernel and packing each instruction
 * set runs, and the block sizes that fit its tiles to the caches.
 *
 * Blocks (see gemm.h for the loops): kc * MR * 4 bytes of A micro-panel
 * stay in L1 while the B micro-panels (kc * NR * 4 bytes each) stream past
 * them from a B block of kc * nc * 4 bytes in L2; a chunk of at most mc
 * rows of A (mc * kc * 4 bytes) is packed at a time (L2/L3). kc also sets
 * how often C is read and written: k / kc times. Sized for Zen 4/5 (32 and
 * 48 KiB L1d, 1 MiB L2 a core, 32 MiB L3; the A micro-panel, 21 KiB at
 * kc = 384, fits either L1) and not harmful on Intel's 32-48 KiB L1d,
 * 1-2 MiB L2. The tiles use 28 of 32 zmm (AVX-512), 12 of 16 ymm
 * (AVX2) accumulators; see each kernel file.
 */
#include "kernels/gemm/gemm.h"

/* The operand every thread reads (B when rows of C are split, A when
 * columns are) is packed at most 16 MiB at a time: the workspace stays
 * bounded however large k is (see gemm.c). */
#define SHARED_MAX ((size_t)1 << 22)

const attn_gemm_kernel attn_sgemm_kernel_portable = {
    .name = "sgemm_portable_4x8", .isa = ATTN_KERNELS_PORTABLE,
    .mr = 4, .nr = 8, .mc = 1024, .kc = 256, .nc = 512, .shared_max = SHARED_MAX,
    .micro = attn_sgemm_portable_4x8,
    .pack_a = attn_sgemm_portable_4x8_pack_a, .pack_b = attn_sgemm_portable_4x8_pack_b,
};

#if defined(ATTN_HAVE_X86_KERNELS)
const attn_gemm_kernel attn_sgemm_kernel_avx2 = {
    .name = "sgemm_avx2_6x16", .isa = ATTN_KERNELS_AVX2,
    .mr = 6, .nr = 16, .mc = 1020, .kc = 384, .nc = 512, .shared_max = SHARED_MAX,
    .micro = attn_sgemm_avx2_6x16,
    .pack_a = attn_sgemm_avx2_6x16_pack_a, .pack_b = attn_sgemm_avx2_6x16_pack_b,
};

const attn_gemm_kernel attn_sgemm_kernel_avx512 = {
    .name = "sgemm_avx512_14x32", .isa = ATTN_KERNELS_AVX512,
    .mr = 14, .nr = 32, .mc = 1008, .kc = 384, .nc = 512, .shared_max = SHARED_MAX,
    .micro = attn_sgemm_avx512_14x32,
    .pack_a = attn_sgemm_avx512_14x32_pack_a, .pack_b = attn_sgemm_avx512_14x32_pack_b,
};
#endif
