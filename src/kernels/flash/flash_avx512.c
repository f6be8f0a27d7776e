/* flash_avx512.c — the fused attention kernels on AVX-512F (flash_avx512.h),
 * on every AVX-512 core. */
#define FLASH_KERNELS attn_flash_avx512
#define FLASH_ISA_NAME "avx512"

#include "kernels/flash/flash_avx512.h"
