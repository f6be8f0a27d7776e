/*
 * half.h — the library's one scalar conversion between float32 and its two
 * 16-bit formats, used by every reader, writer and kernel that converts an
 * element at a time (vector kernels convert in registers with their own
 * instructions, and their tests hold them to these).
 *
 *   bf16     1 sign, 8 exponent (bias 127), 7 fraction bits: the top half
 *            of a float32, so widening is a shift
 *   binary16 1 sign, 5 exponent (bias 15), 10 fraction bits (IEEE 754 half)
 *
 * Widening is exact for every pattern: subnormals, infinities and NaN
 * payloads included. Narrowing rounds to nearest, ties to even; a value
 * from half an ulp past the largest finite one becomes infinity; a NaN
 * stays a NaN of the same sign, quieted, keeping the top bits of its
 * payload (as x86's VCVTPS2PH and VCVTNEPS2BF16 do).
 */
#ifndef ATTN_CORE_HALF_H
#define ATTN_CORE_HALF_H

#include "attn.h"

#include <stdint.h>
#include <string.h>

static inline float attn_float_of_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline uint32_t attn_bits_of_float(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float attn_bf16_to_float(uint16_t h) { return attn_float_of_bits((uint32_t)h << 16); }

static inline uint16_t attn_float_to_bf16(float x) {
    uint32_t u = attn_bits_of_float(x);
    /* a NaN's rounding add could carry into the exponent and make it inf */
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7FFFu + ((u >> 16) & 1u); /* to nearest even at the 16 bits dropped */
    return (uint16_t)(u >> 16);
}

static inline float attn_f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) /* zero or subnormal: m 2^-24, exact in float */
        return attn_float_of_bits(attn_bits_of_float((float)m * 0x1p-24f) | sign);
    if (e == 31) return attn_float_of_bits(sign | 0x7F800000u | m << 13); /* inf, NaN */
    return attn_float_of_bits(sign | (e + 112u) << 23 | m << 13);
}

static inline uint16_t attn_float_to_f16(float x) {
    uint32_t u = attn_bits_of_float(x), sign = (u >> 16) & 0x8000u;
    u &= 0x7FFFFFFFu;
    if (u > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((u >> 13) & 0x3FFu)); /* NaN */
    if (u >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* from 65520 (a tie to 2^16) up */
    if (u < 0x38800000u) { /* below 2^-14: a subnormal, n 2^-24, n rounded to even */
        float scaled = attn_float_of_bits(u) * 0x1p24f; /* exact, < 1024 */
        uint32_t n = (uint32_t)scaled;
        float rest = scaled - (float)n;
        if (rest > 0.5f || (rest == 0.5f && (n & 1u))) n++;
        return (uint16_t)(sign | n);
    }
    u += 0x0FFFu + ((u >> 13) & 1u); /* to nearest even at the 13 bits dropped */
    return (uint16_t)(sign | (u - (112u << 23)) >> 13);
}

/* The dtype chosen per element: for loops that are not hot. */
static inline float attn_half_to_float(attn_dtype dtype, uint16_t h) {
    return dtype == ATTN_DTYPE_BF16 ? attn_bf16_to_float(h) : attn_f16_to_float(h);
}

static inline uint16_t attn_float_to_half(attn_dtype dtype, float x) {
    return dtype == ATTN_DTYPE_BF16 ? attn_float_to_bf16(x) : attn_float_to_f16(x);
}

#endif /* ATTN_CORE_HALF_H */
