/* vec_portable.h — the vector vocabulary of the portable kernels (flash/,
 * decode/): a "vector" is 4 floats, left to the compiler to map onto what
 * the target has. */
#ifndef ATTN_KERNELS_VEC_PORTABLE_H
#define ATTN_KERNELS_VEC_PORTABLE_H

#include <math.h>

#define VW 4

typedef struct vec {
    float x[VW];
} vec;

static inline vec v_zero(void) { return (vec){{0.0f, 0.0f, 0.0f, 0.0f}}; }
static inline vec v_set1(float x) { return (vec){{x, x, x, x}}; }
static inline vec v_load(const float *p) { return (vec){{p[0], p[1], p[2], p[3]}}; }
static inline void v_in_register(vec *x) { (void)x; }

static inline void v_store(float *p, vec v) {
    for (int i = 0; i < VW; i++) p[i] = v.x[i];
}

static inline vec v_fma(vec a, vec b, vec c) {
    for (int i = 0; i < VW; i++) c.x[i] = fmaf(a.x[i], b.x[i], c.x[i]);
    return c;
}

/* c - a b, rounded once */
static inline vec v_nfma(vec a, vec b, vec c) {
    for (int i = 0; i < VW; i++) c.x[i] = fmaf(-a.x[i], b.x[i], c.x[i]);
    return c;
}

static inline vec v_mul(vec a, vec b) {
    for (int i = 0; i < VW; i++) a.x[i] *= b.x[i];
    return a;
}

static inline vec v_sub(vec a, vec b) {
    for (int i = 0; i < VW; i++) a.x[i] -= b.x[i];
    return a;
}

static inline vec v_add(vec a, vec b) {
    for (int i = 0; i < VW; i++) a.x[i] += b.x[i];
    return a;
}

static inline vec v_abs(vec a) {
    for (int i = 0; i < VW; i++) a.x[i] = fabsf(a.x[i]);
    return a;
}

static inline vec v_max(vec a, vec b) {
    for (int i = 0; i < VW; i++) a.x[i] = fmaxf(a.x[i], b.x[i]);
    return a;
}

static inline vec v_div(vec a, vec b) {
    for (int i = 0; i < VW; i++) a.x[i] /= b.x[i];
    return a;
}

static inline float v_hmax(vec v) { return fmaxf(fmaxf(v.x[0], v.x[1]), fmaxf(v.x[2], v.x[3])); }
/* whether some lane of a exceeds b's */
static inline int v_any_greater(vec a, vec b) {
    int any = 0;
    for (int i = 0; i < VW; i++) any |= a.x[i] > b.x[i];
    return any;
}
/* whether some lane of a is NaN */
static inline int v_any_nan(vec a) {
    int any = 0;
    for (int i = 0; i < VW; i++) any |= a.x[i] != a.x[i];
    return any;
}
static inline float v_hsum(vec v) { return (v.x[0] + v.x[1]) + (v.x[2] + v.x[3]); }

static inline vec v_exp2(vec a) {
    for (int i = 0; i < VW; i++) a.x[i] = exp2f(a.x[i]);
    return a;
}

static inline vec v_tanh(vec a) {
    for (int i = 0; i < VW; i++) a.x[i] = tanhf(a.x[i]);
    return a;
}

#endif /* ATTN_KERNELS_VEC_PORTABLE_H */
