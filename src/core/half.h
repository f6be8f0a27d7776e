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
 *
 * Each conversion computes its cases side by side and picks one, with no
 * branch, so that a loop over an array of them vectorises (a model's
 * weights converted on load).
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
    uint32_t nan = (u >> 16) | 0x40u;
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16; /* to nearest even */
    return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

static inline float attn_f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7FFFu;
    uint32_t normal = (em << 13) + (112u << 23); /* the exponent rebiased, the fraction up */
    uint32_t special = 0x7F800000u | (em & 0x3FFu) << 13; /* inf, NaN */
    uint32_t small = attn_bits_of_float((float)em * 0x1p-24f); /* zero, subnormal: exact */
    uint32_t bits = em >= 0x7C00u ? special : em >= 0x0400u ? normal : small;
    return attn_float_of_bits(sign | bits);
}

static inline uint16_t attn_float_to_f16(float x) {
    uint32_t u = attn_bits_of_float(x), sign = (u >> 16) & 0x8000u;
    u &= 0x7FFFFFFFu;
    /* NaN: quieted, its payload's top bits kept; from 65520 (a tie to 2^16) up: inf */
    uint32_t big = u > 0x7F800000u ? 0x7E00u | ((u >> 13) & 0x3FFu) : 0x7C00u;
    /* below 2^-14: a subnormal, n 2^-24, n rounded to even (of u there, so
     * that the float to integer conversion stays in range elsewhere) */
    float scaled = attn_float_of_bits(u < 0x38800000u ? u : 0u) * 0x1p24f; /* exact, < 1024 */
    int32_t n = (int32_t)scaled; /* (a signed conversion: one instruction in every ISA) */
    float rest = scaled - (float)n;
    uint32_t small = (uint32_t)n + (uint32_t)((rest > 0.5f) | ((rest == 0.5f) & n));
    /* normal: to nearest even at the 13 bits dropped, the exponent rebiased */
    uint32_t normal = (u + 0x0FFFu + ((u >> 13) & 1u) - (112u << 23)) >> 13;
    uint32_t h = u >= 0x477FF000u ? big : u < 0x38800000u ? small : normal;
    return (uint16_t)(sign | h);
}

/* The dtype chosen per element: for loops that are not hot. */
static inline float attn_half_to_float(attn_dtype dtype, uint16_t h) {
    return dtype == ATTN_DTYPE_BF16 ? attn_bf16_to_float(h) : attn_f16_to_float(h);
}

static inline uint16_t attn_float_to_half(attn_dtype dtype, float x) {
    return dtype == ATTN_DTYPE_BF16 ? attn_float_to_bf16(x) : attn_float_to_f16(x);
}

#endif /* ATTN_CORE_HALF_H */
