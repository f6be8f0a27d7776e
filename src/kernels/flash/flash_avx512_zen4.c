/* flash_avx512_zen4.c — the AVX-512 fused kernels (flash_avx512.h) for Zen 4,
 * whose tile products take each broadcast value (a key's, query's or
 * weight's) as an operand of their FMAs. Zen 4 runs a 512-bit operation on
 * two 256-bit halves, and in LLVM 19's model of it (llvm-mca -mcpu=znver4)
 * vbroadcastss zmm, m32 takes an FMA pipe for a cycle, so that separate
 * broadcasts lengthen the tiles' loops past their FMAs; as FMA operands
 * they do not. Elsewhere the operand form loads a value once per FMA where
 * one broadcast serves several, so the other AVX-512 cores keep
 * flash_avx512.c. Chosen by the ctx (attn_cpu_is_zen4). */
#define FLASH_KERNELS attn_flash_avx512_zen4
#define FLASH_ISA_NAME "avx512-zen4"
#define BROADCAST_OPERANDS

#include "kernels/flash/flash_avx512.h"
