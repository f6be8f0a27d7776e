/* decode_portable.c — the decode kernel in portable C: a "vector" is 4
 * floats, left to the compiler to map onto what the target has. */
#include "kernels/vec/vec_portable.h"

#define DECODE_KERNELS attn_decode_portable
#define DECODE_ISA_NAME "portable"

static inline void v_hsum_block(const vec *part, float *out) {
    for (int j = 0; j < 16; j++) out[j] = v_hsum(part[j]);
}

#include "kernels/decode/decode_kernel.h"
