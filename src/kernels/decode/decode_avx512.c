/* decode_avx512.c — the decode kernel on AVX-512F: 16 floats a vector, a
 * key block's scores of one query head in one register. */
#include "kernels/decode/decode_avx512_vec.h"

#define DECODE_KERNELS attn_decode_avx512
#define DECODE_ISA_NAME "avx512"

#include "kernels/decode/decode_kernel.h"
