/*
 * kv_format.h — how a KV cache stores K or V (attn.h, "Generation"): the
 * bytes and scales of one (token, KV head) row of head_dim elements, and
 * the scalar quantisation and reading back that the cache's append, the
 * reference backend and the tests share. Vector kernels widen in registers
 * with their own instructions; their tests hold them to attn_kv_read.
 *
 *   F32      head_dim floats
 *   BF16     head_dim bfloat16 (core/half.h)
 *   F16      head_dim binary16 (core/half.h)
 *   F8_E4M3  one scale s = amax / 448, then head_dim e4m3 codes of x * (448 / amax)
 *   I8       one scale s = amax / 127, then head_dim int8 round(x * (127 / amax))
 *   I4       per group of 32 elements a scale s = amax / 7 (the group's amax) and
 *            16 bytes: byte i holds element i in its low nibble and element
 *            i + 16 in its high one, each round(x * (7 / amax)) + 8 in 1..15
 *
 * amax is the largest |x| of the row (of the group for I4): the largest
 * element maps to the type's largest value. An all-zero row has scale 0 and
 * codes 0 (reading back zeros); a row holding NaN or infinity has scale NaN
 * and every element reads back as NaN.
 */
#ifndef ATTN_CONTRACT_KV_FORMAT_H
#define ATTN_CONTRACT_KV_FORMAT_H

#include "attn.h"
#include "half.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ATTN_KV_I4_GROUP 32

typedef struct attn_kv_format {
    attn_dtype dtype;
    size_t head_dim;
    size_t head_bytes;  /* bytes of one (token, KV head) row's codes */
    size_t head_scales; /* float32 scales of that row: 0, 1 or head_dim / 32 */
} attn_kv_format;

static inline bool attn_kv_dtype_supported(attn_dtype d) {
    return d == ATTN_DTYPE_F32 || d == ATTN_DTYPE_BF16 || d == ATTN_DTYPE_F16 ||
           d == ATTN_DTYPE_F8_E4M3 || d == ATTN_DTYPE_I8 || d == ATTN_DTYPE_I4;
}

/* The format of dtype for rows of head_dim elements (dtype supported; I4:
 * head_dim a multiple of ATTN_KV_I4_GROUP). */
static inline attn_kv_format attn_kv_format_of(attn_dtype dtype, size_t head_dim) {
    attn_kv_format f = {dtype, head_dim, 4 * head_dim, 0};
    switch (dtype) {
    case ATTN_DTYPE_BF16:
    case ATTN_DTYPE_F16: f.head_bytes = 2 * head_dim; break;
    case ATTN_DTYPE_F8_E4M3:
    case ATTN_DTYPE_I8:
        f.head_bytes = head_dim;
        f.head_scales = 1;
        break;
    case ATTN_DTYPE_I4:
        f.head_bytes = head_dim / 2;
        f.head_scales = head_dim / ATTN_KV_I4_GROUP;
        break;
    default: break;
    }
    return f;
}

/* ---- fp8 e4m3 (OCP FP8: 1 sign, 4 exponent bits of bias 7, 3 fraction
 * bits; no infinities, S.1111.111 is NaN, the largest finite value 448) */

static inline float attn_e4m3_to_float(uint8_t b) {
    unsigned e = (b >> 3) & 15u, m = b & 7u;
    float a = e == 0    ? (float)m * 0x1p-9f
              : e == 15 && m == 7 ? NAN
                        : ldexpf(1.0f + (float)m * 0.125f, (int)e - 7);
    return b & 0x80u ? -a : a;
}

/* x to the nearest e4m3 (ties to even), |x| past 448 saturating to 448,
 * NaN to NaN. */
static inline uint8_t attn_float_to_e4m3(float x) {
    uint32_t u = attn_bits_of_float(x), sign = (u >> 24) & 0x80u;
    float a = fabsf(x);
    if (a != a) return (uint8_t)(sign | 0x7Fu);
    if (a > 448.0f) a = 448.0f;
    if (a < 0x1p-6f) /* subnormal: n 2^-9, n in 0..8 (8 is the first normal) */
        return (uint8_t)(sign | (uint32_t)nearbyintf(a * 512.0f));
    u = attn_bits_of_float(a);
    u += 0x7FFFFu + ((u >> 20) & 1u); /* to nearest even at the 20 bits dropped */
    return (uint8_t)(sign | ((u >> 20) - (120u << 3)));
}

/* ---- one (token, KV head) row ------------------------------------------------ */

/* Largest |x| of n floats; NaN if any is NaN or infinite. */
static inline float attn_kv_amax(const float *x, size_t n) {
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (!(a <= 3.4028235e38f)) return NAN;
        if (a > amax) amax = a;
    }
    return amax;
}

/* The factor codes are scaled by, code = (x * *pre) * factor: top / amax
 * with *pre 1, 0 for an all-zero row (a non-finite one, amax NaN, has
 * codes 0 and a NaN scale). Where top / amax overflows float (amax below
 * about 1e-36), x and amax are first scaled by 2^64, exactly, so that
 * such a row is rounded as any other. */
static inline float attn_kv_code_factor(float amax, float top, float *pre) {
    *pre = 1.0f;
    if (!(amax > 0.0f)) return 0.0f;
    float factor = top / amax;
    if (factor <= 3.4028235e38f) return factor;
    *pre = 0x1p64f;
    return top / (amax * 0x1p64f);
}

/* Stores the head_dim floats x in f's codes (data, f->head_bytes) and scales. */
static inline void attn_kv_quantize(const attn_kv_format *f, const float *x, void *data,
                                    float *scales) {
    size_t D = f->head_dim;
    switch (f->dtype) {
    case ATTN_DTYPE_F32:
        for (size_t i = 0; i < D; i++) ((float *)data)[i] = x[i];
        return;
    case ATTN_DTYPE_BF16:
        for (size_t i = 0; i < D; i++) ((uint16_t *)data)[i] = attn_float_to_bf16(x[i]);
        return;
    case ATTN_DTYPE_F16:
        for (size_t i = 0; i < D; i++) ((uint16_t *)data)[i] = attn_float_to_f16(x[i]);
        return;
    case ATTN_DTYPE_F8_E4M3:
    case ATTN_DTYPE_I8: {
        bool fp8 = f->dtype == ATTN_DTYPE_F8_E4M3;
        float top = fp8 ? 448.0f : 127.0f, amax = attn_kv_amax(x, D);
        float pre, inv = attn_kv_code_factor(amax, top, &pre);
        scales[0] = amax / top;
        for (size_t i = 0; i < D; i++) {
            float y = amax == amax ? x[i] * pre * inv : 0.0f;
            if (fp8) {
                ((uint8_t *)data)[i] = attn_float_to_e4m3(y);
            } else {
                float r = nearbyintf(y);
                ((int8_t *)data)[i] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
            }
        }
        return;
    }
    case ATTN_DTYPE_I4:
        for (size_t g = 0; g < D / ATTN_KV_I4_GROUP; g++) {
            const float *xg = x + g * ATTN_KV_I4_GROUP;
            uint8_t *bytes = (uint8_t *)data + g * (ATTN_KV_I4_GROUP / 2);
            float amax = attn_kv_amax(xg, ATTN_KV_I4_GROUP);
            float pre, inv = attn_kv_code_factor(amax, 7.0f, &pre);
            scales[g] = amax / 7.0f;
            for (size_t i = 0; i < ATTN_KV_I4_GROUP / 2; i++) {
                unsigned nib[2];
                for (int h = 0; h < 2; h++) {
                    float r = amax == amax ? nearbyintf(xg[i + 16 * h] * pre * inv) : 0.0f;
                    r = r > 7.0f ? 7.0f : r < -7.0f ? -7.0f : r;
                    nib[h] = (unsigned)(int)r + 8u;
                }
                bytes[i] = (uint8_t)(nib[0] | nib[1] << 4);
            }
        }
        return;
    default: return;
    }
}

/* Element e of a row as stored (data, scales), read back. */
static inline float attn_kv_read(const attn_kv_format *f, const void *data, const float *scales,
                                 size_t e) {
    switch (f->dtype) {
    case ATTN_DTYPE_F32: return ((const float *)data)[e];
    case ATTN_DTYPE_BF16: return attn_bf16_to_float(((const uint16_t *)data)[e]);
    case ATTN_DTYPE_F16: return attn_f16_to_float(((const uint16_t *)data)[e]);
    case ATTN_DTYPE_F8_E4M3: return scales[0] * attn_e4m3_to_float(((const uint8_t *)data)[e]);
    case ATTN_DTYPE_I8: return scales[0] * (float)((const int8_t *)data)[e];
    case ATTN_DTYPE_I4: {
        size_t g = e / ATTN_KV_I4_GROUP, i = e % ATTN_KV_I4_GROUP;
        uint8_t byte = ((const uint8_t *)data)[g * (ATTN_KV_I4_GROUP / 2) + i % 16];
        int code = (int)(i < 16 ? byte & 15u : byte >> 4) - 8;
        return scales[g] * (float)code;
    }
    default: return NAN;
    }
}

#endif /* ATTN_CONTRACT_KV_FORMAT_H */
