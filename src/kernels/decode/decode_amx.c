/* decode_amx.c — the AVX-512 decode kernel with bf16 and int8 keys scored
 * on AMX tiles (decode_kernel.h, DECODE_AMX); every other format as
 * decode_avx512.c reads it. Compiled with -mavx512f -mavx512bw -mavx512dq
 * -mamx-tile -mamx-bf16 -mamx-int8. */
#include "kernels/amx_tiles.h"
#include "kernels/decode/decode_avx512_vec.h"

#define DECODE_KERNELS attn_decode_avx512_amx
#define DECODE_ISA_NAME "avx512+amx"
#define DECODE_AMX 1

#include "kernels/decode/decode_kernel.h"
