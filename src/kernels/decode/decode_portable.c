/* decode_portable.c — the decode kernel in portable C: a "vector" is 4
 * floats, left to the compiler to map onto what the target has. */
#include "kernels/vec/vec_portable.h"

#define DECODE_KERNELS attn_decode_portable
#define DECODE_ISA_NAME "portable"

static inline void v_reduce_block(const vec *part, float *out, int max) {
    for (int j = 0; j < 16; j++) out[j] = max ? v_hmax(part[j]) : v_hsum(part[j]);
}

#include "contract/kv_format.h"

static inline vec v_from_bf16(const uint16_t *p) {
    vec v;
    for (int i = 0; i < VW; i++) v.x[i] = attn_bf16_to_float(p[i]);
    return v;
}

static inline vec v_from_f16(const uint16_t *p) {
    vec v;
    for (int i = 0; i < VW; i++) v.x[i] = attn_f16_to_float(p[i]);
    return v;
}

static inline vec v_from_e4m3(const uint8_t *p) {
    vec v;
    for (int i = 0; i < VW; i++) v.x[i] = attn_e4m3_to_float(p[i]) * 0x1p-8f;
    return v;
}

static inline vec v_from_i8(const int8_t *p) {
    vec v;
    for (int i = 0; i < VW; i++) v.x[i] = (float)p[i];
    return v;
}

static inline vec v_from_i4(const uint8_t *p, int high) {
    vec v;
    for (int i = 0; i < VW; i++) v.x[i] = (float)((int)(high ? p[i] >> 4 : p[i] & 15) - 8);
    return v;
}

#include "kernels/decode/decode_kernel.h"
