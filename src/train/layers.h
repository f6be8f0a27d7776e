/*
 * layers.h — the small model's layers in float32 (layers_impl.h, where each
 * forward sits beside its backward with the shape of every buffer).
 */
#ifndef ATTN_TRAIN_LAYERS_H
#define ATTN_TRAIN_LAYERS_H

#include "parallel.h"

#include <stddef.h>
#include <stdint.h>

#define ATTN_LAYERNORM_EPS 1e-5
#define ATTN_RMSNORM_EPS 1e-5 /* the book's Llama 3 norms */

void attn_layer_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                                  const float *wpe, size_t B, size_t T, size_t C);
void attn_layer_embedding_backward(attn_workers w, float *dwte, float *dwpe, const float *dout,
                                   const int32_t *tokens, size_t B, size_t T, size_t C, size_t V);
void attn_layer_layernorm_forward(attn_workers w, float *out, double *mean, double *rstd,
                                  const float *inp, const float *weight, const float *bias,
                                  size_t N, size_t C, double eps);
void attn_layer_layernorm_backward(attn_workers w, float *dinp, float *dweight, float *dbias,
                                   const float *dout, const float *inp, const float *weight,
                                   const double *mean, const double *rstd, size_t N, size_t C);
void attn_layer_rmsnorm_forward(attn_workers w, float *out, double *rstd, const float *inp,
                                const float *weight, size_t N, size_t C, double eps);
void attn_layer_rmsnorm_backward(attn_workers w, float *dinp, float *dweight, const float *dout,
                                 const float *inp, const float *weight, const double *rstd,
                                 size_t N, size_t C);
void attn_layer_swiglu_forward(attn_workers w, float *out, const float *gate, const float *up,
                               size_t n);
void attn_layer_swiglu_backward(attn_workers w, float *dgate, float *dup, const float *gate,
                                const float *up, const float *dout, size_t n);
void attn_layer_rope_forward(float *out, const float *x, const float *cosines,
                             const float *sines, size_t B, size_t T, size_t heads, size_t D);
void attn_layer_rope_backward(float *dx, const float *dout, const float *cosines,
                              const float *sines, size_t B, size_t T, size_t heads, size_t D);
void attn_layer_gelu_forward(attn_workers w, float *out, const float *inp, size_t n);
void attn_layer_gelu_backward(attn_workers w, float *dinp, const float *inp, const float *dout,
                              size_t n);
void attn_layer_gelu_tanh_forward(attn_workers w, float *out, const float *inp, size_t n);
void attn_layer_gelu_tanh_backward(attn_workers w, float *dinp, const float *inp, const float *dout,
                                   size_t n);
void attn_layer_residual_forward(attn_workers w, float *out, const float *a, const float *b,
                                 size_t n);
/* row_loss and row_backward: a kernel set's vector rows
 * (kernels/activation/activation.h), or NULL for the layer's own loops. */
double attn_layer_crossentropy_forward(attn_workers w, const float *logits,
                                       const int32_t *targets, size_t N, size_t V,
                                       int32_t ignore_index, size_t *scored,
                                       double (*row_loss)(const float *, size_t, int32_t));
void attn_layer_crossentropy_backward(attn_workers w, float *dlogits, const float *logits,
                                      const int32_t *targets, size_t N, size_t V,
                                      int32_t ignore_index, double dloss,
                                      void (*row_backward)(const float *, size_t, int32_t, double,
                                                           float *));

#endif /* ATTN_TRAIN_LAYERS_H */
