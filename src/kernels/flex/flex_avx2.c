/* flex_avx2.c — the flex kernels on AVX2 + FMA: 8 floats a vector,
 * register tiles of 4 rows x 16 keys (8 accumulators, 2 loaded vectors and
 * a broadcast of the 16 registers). */
#include "kernels/vec/vec_avx2.h"

#define RG 4
#define NV 2
#define FLEX_KERNELS attn_flex_avx2
#define FLEX_ISA_NAME "avx2"

#include "kernels/flex/flex_kernel.h"
