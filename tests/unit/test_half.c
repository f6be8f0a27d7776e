/* test_half.c — the one float32 <-> bf16 / binary16 conversion (core/half.h)
 * against formulas written independently of it:
 *   widening: every one of the 65536 patterns of each format, its value
 *             computed from sign, exponent and fraction with ldexp
 *             (NaN: sign and payload kept, checked bit by bit);
 *   narrowing: each format's finite values, the midpoints between
 *             neighbours (ties: to the even pattern), the floats just
 *             either side of each midpoint, a stride over all float32
 *             patterns, overflow at the largest value, and NaN payloads.
 * The narrowing oracle searches the sorted positive patterns for the two
 * neighbours of |x| and picks the nearer in double arithmetic, which is
 * exact for these values. */
#include "check.h"
#include "half.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct format {
    const char *name;
    int exponent_bits, fraction_bits, bias;
    float (*widen)(uint16_t);
    uint16_t (*narrow)(float);
} format;

static float f16_widen(uint16_t h) { return attn_f16_to_float(h); }
static uint16_t f16_narrow(float x) { return attn_float_to_f16(x); }
static float bf16_widen(uint16_t h) { return attn_bf16_to_float(h); }
static uint16_t bf16_narrow(float x) { return attn_float_to_bf16(x); }

static const format formats[2] = {
    {"binary16", 5, 10, 15, f16_widen, f16_narrow},
    {"bf16", 8, 7, 127, bf16_widen, bf16_narrow},
};

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_from(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint16_t max_exponent(const format *f) { return (uint16_t)((1u << f->exponent_bits) - 1); }
static uint16_t inf_pattern(const format *f) {
    return (uint16_t)(max_exponent(f) << f->fraction_bits);
}

/* The value of a non-NaN pattern as a double, from its fields; the pattern
 * just past the largest finite one is taken as 2^(emax+1) (where overflow
 * rounds), which is the value infinity stands in for. */
static double value_of(const format *f, uint16_t h) {
    int sign = h >> 15;
    unsigned e = (h >> f->fraction_bits) & max_exponent(f);
    unsigned m = h & ((1u << f->fraction_bits) - 1u);
    double v;
    if (e == 0)
        v = ldexp((double)m, 1 - f->bias - f->fraction_bits);
    else
        v = ldexp((double)((1u << f->fraction_bits) | m), (int)e - f->bias - f->fraction_bits);
    return sign ? -v : v;
}

static void check_widening(const format *f) {
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float got = f->widen(h);
        unsigned e = (h >> f->fraction_bits) & max_exponent(f);
        unsigned m = h & ((1u << f->fraction_bits) - 1u);
        bool ok;
        if (e == max_exponent(f)) {
            /* inf or NaN: float's exponent all ones, the fraction shifted up */
            uint32_t want = (uint32_t)(h >> 15) << 31 | 0x7F800000u | m << (23 - f->fraction_bits);
            ok = bits_of(got) == want && (m ? isnan(got) : isinf(got));
        } else {
            double want = value_of(f, h);
            ok = (double)got == want && (signbit(got) != 0) == (h >> 15 != 0);
        }
        if (!ok && bad++ < 5)
            fprintf(stderr, "%s widening 0x%04x: got %a (0x%08x)\n", f->name, (unsigned)h,
                    (double)got, (unsigned)bits_of(got));
    }
    CHECK(bad == 0);
}

/* The nearest pattern to x (finite or inf), ties to the even pattern. */
static uint16_t nearest(const format *f, float x) {
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    double a = fabs((double)x);
    uint16_t top = inf_pattern(f); /* value_of gives it 2^(emax+1) */
    if (a >= value_of(f, top)) return (uint16_t)(sign | top);
    /* positive patterns ascend with their values: the last one <= a */
    uint16_t lo = 0, hi = top;
    while (hi - lo > 1) {
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (value_of(f, mid) <= a) lo = mid;
        else hi = mid;
    }
    double below = a - value_of(f, lo), above = value_of(f, hi) - a;
    uint16_t pick = below < above ? lo : above < below ? hi : (lo & 1u) ? hi : lo;
    return (uint16_t)(sign | pick);
}

static int narrow_bad;

static void check_narrow(const format *f, float x) {
    uint16_t got = f->narrow(x), want;
    if (isnan(x)) {
        /* sign kept, quiet bit set, the payload's top bits kept */
        uint32_t u = bits_of(x);
        want = (uint16_t)((u >> 31) << 15 | inf_pattern(f) | 1u << (f->fraction_bits - 1) |
                          ((u & 0x7FFFFFu) >> (23 - f->fraction_bits)));
    } else {
        want = nearest(f, x);
    }
    if (got != want && narrow_bad++ < 8)
        fprintf(stderr, "%s narrowing %a (0x%08x): got 0x%04x, want 0x%04x\n", f->name,
                (double)x, (unsigned)bits_of(x), (unsigned)got, (unsigned)want);
}

static void check_narrowing(const format *f) {
    narrow_bad = 0;
    uint16_t top = inf_pattern(f);
    for (uint32_t i = 0; i < top; i++) {
        for (int s = 0; s < 2; s++) {
            uint16_t h = (uint16_t)(i | (s ? 0x8000u : 0));
            double v = value_of(f, h);
            float x = (float)v; /* exact: every value is a float */
            CHECK((double)x == v);
            check_narrow(f, x);
            CHECK(f->narrow(x) == h);
            /* the midpoint to the next pattern up (to 2^(emax+1) from the
             * largest): exact in float, a tie */
            float mid = (float)((v + value_of(f, (uint16_t)(h + 1))) / 2);
            check_narrow(f, mid);
            check_narrow(f, nextafterf(mid, 0.0f));
            check_narrow(f, nextafterf(mid, s ? -INFINITY : INFINITY));
        }
    }
    /* a stride over every float32 pattern (odd, so all low bits occur) */
    for (uint64_t u = 0; u <= 0xFFFFFFFFu; u += 4093)
        check_narrow(f, float_from((uint32_t)u));
    /* infinities, the largest floats, NaN payloads of both signs */
    const uint32_t specials[] = {0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu,
                                 0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u,
                                 0x7FBFFFFFu, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FA5A5A5u,
                                 0x7F802000u, 0x7F810000u, 0x00000001u, 0x80000001u};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        check_narrow(f, float_from(specials[i]));
    CHECK(narrow_bad == 0);
}

int main(void) {
    for (int i = 0; i < 2; i++) {
        check_widening(&formats[i]);
        check_narrowing(&formats[i]);
    }
    /* Rounding direction, spelled out. */
    CHECK(attn_float_to_f16(65519.0f) == 0x7BFFu);      /* below the tie: the largest */
    CHECK(attn_float_to_f16(65520.0f) == 0x7C00u);      /* the tie rounds to even: inf */
    CHECK(attn_float_to_f16(1.0f + 0x1p-11f) == 0x3C00u); /* tie, down to even 1.0 */
    CHECK(attn_float_to_f16(1.0f + 3 * 0x1p-11f) == 0x3C02u); /* tie, up to even */
    CHECK(attn_float_to_f16(0x1p-25f) == 0x0000u);      /* half the least subnormal: 0 */
    CHECK(attn_float_to_f16(0x1.000002p-25f) == 0x0001u);
    CHECK(attn_float_to_f16(-0.0f) == 0x8000u);
    CHECK(attn_float_to_bf16(1.0f + 0x1p-8f) == 0x3F80u);   /* tie, down to even */
    CHECK(attn_float_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3F82u); /* tie, up to even */
    CHECK(attn_float_to_bf16(float_from(0x7F7F8000u)) == 0x7F80u); /* past the largest: inf */
    CHECK(attn_float_to_bf16(float_from(0x7F7F7FFFu)) == 0x7F7Fu);
    CHECK(attn_float_to_bf16(float_from(0x7F800001u)) == 0x7FC0u); /* a NaN stays a NaN */
    CHECK(attn_float_to_f16(float_from(0xFF802000u)) == 0xFE01u);
    CHECK(attn_half_to_float(ATTN_DTYPE_BF16, 0x3F80u) == 1.0f);
    CHECK(attn_half_to_float(ATTN_DTYPE_F16, 0x3C00u) == 1.0f);
    CHECK(attn_float_to_half(ATTN_DTYPE_BF16, 2.0f) == 0x4000u);
    CHECK(attn_float_to_half(ATTN_DTYPE_F16, 2.0f) == 0x4000u);
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
