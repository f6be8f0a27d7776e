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
 */
#ifndef ATTN_ACTIVATION_H
#define ATTN_ACTIVATION_H

#include <stddef.h>

typedef void attn_gelu_tanh_fn(const float *x, float *y, size_t n);
typedef void attn_gelu_tanh_backward_fn(const float *x, const float *dy, float *dx, size_t n);

typedef struct attn_activation_kernels {
    const char *name;
    attn_gelu_tanh_fn *gelu_tanh;
    attn_gelu_tanh_backward_fn *gelu_tanh_backward;
} attn_activation_kernels;

#if defined(ATTN_HAVE_X86_KERNELS)
extern const attn_activation_kernels attn_activation_avx2; /* activation_avx2.c */
#endif

#endif /* ATTN_ACTIVATION_H */
