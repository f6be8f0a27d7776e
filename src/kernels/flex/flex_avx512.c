/* flex_avx512.c — the flex kernels on AVX-512F: 16 floats a vector,
 * register tiles of 8 rows x 32 keys (16 accumulators, 2 loaded vectors and
 * a broadcast of the 32 registers). */
#include "kernels/vec/vec_avx512.h"

#define RG 8
#define NV 2
#define FLEX_KERNELS attn_flex_avx512
#define FLEX_ISA_NAME "avx512"

#include "kernels/flex/flex_kernel.h"
