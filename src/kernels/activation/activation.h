/*
 * activation.h — element-wise activations of the training layers, in
 * vectors: GPT-2's GELU (tanh form), forward and backward, in double
 * arithmetic as the scalar layers (train/layers_impl.h) compute it, each
 * float rounded once at the end.
 *
 * Contract, for i < n:
 *   gelu_tanh:          y[i] = 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3)
 *   gelu_tanh_backward: dx[i] += dy[i] (0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) du/dx)
 * Every element goes through the same vector code (a tail is padded into
 * a full vector), so an element's bits depend on its value alone, never on
 * n or where a range starts: any split over threads gives the same bits.
 * 1 + tanh(u) and 1 - tanh(u)^2 are computed without cancellation, so each
 * float is within a unit in the last place of the exact value, where the
 * scalar layer's 1 + tanh(u) loses bits as tanh(u) nears -1 (x below
 * about -3).
 *
 * And the cross-entropy of one row of logits z (V), as the scalar layer
 * computes it, exp in double:
 *   crossentropy_row:          max + log(sum_v exp(z[v] - max)) - z[target]
 *   crossentropy_backward_row: dz[v] += scale (exp(z[v] - max) / sum - [v == target])
 * with max the largest z (NaN ignored, so a NaN logit makes the row NaN).
 * The sum runs in vector lanes, so its bits differ from the scalar layer's
 * sequential sum in the last places of the double; each exp is within a
 * unit or two of libm's, and the floats written almost always equal the
 * scalar layer's. A row's numbers do not depend on the thread that runs it.
 */
#ifndef ATTN_ACTIVATION_H
#define ATTN_ACTIVATION_H

#include <stddef.h>
#include <stdint.h>

typedef void attn_gelu_tanh_fn(const float *x, float *y, size_t n);
typedef void attn_gelu_tanh_backward_fn(const float *x, const float *dy, float *dx, size_t n);
typedef double attn_crossentropy_row_fn(const float *z, size_t V, int32_t target);
typedef void attn_crossentropy_backward_row_fn(const float *z, size_t V, int32_t target,
                                               double scale, float *dz);

typedef struct attn_activation_kernels {
    const char *name;
    attn_gelu_tanh_fn *gelu_tanh;
    attn_gelu_tanh_backward_fn *gelu_tanh_backward;
    attn_crossentropy_row_fn *crossentropy_row;
    attn_crossentropy_backward_row_fn *crossentropy_backward_row;
} attn_activation_kernels;

#if defined(ATTN_HAVE_X86_KERNELS)
extern const attn_activation_kernels attn_activation_avx2; /* activation_avx2.c */
#endif

#endif /* ATTN_ACTIVATION_H */
