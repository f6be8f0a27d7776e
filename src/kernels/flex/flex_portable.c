/* flex_portable.c — the flex kernels in portable C: a "vector" is 4
 * floats, left to the compiler to map onto what the target has; register
 * tiles of 4 rows x 8 keys. */
#include "kernels/vec/vec_portable.h"

#define RG 4
#define NV 2
#define FLEX_KERNELS attn_flex_portable
#define FLEX_ISA_NAME "portable"

#include "kernels/flex/flex_kernel.h"
