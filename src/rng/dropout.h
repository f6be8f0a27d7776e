/*
 * dropout.h — one PyTorch dropout call, applied piece by piece.
 *
 * F.dropout draws its whole mask in one bernoulli_ call over the tensor in
 * row-major order. A stream begun for a tensor hands out that mask in
 * order, so kernels that walk the tensor in pieces draw exactly what
 * PyTorch draws for the whole.
 */
#ifndef ATTN_DROPOUT_H
#define ATTN_DROPOUT_H

#include "attn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct attn_dropout_stream {
    attn_rng *rng;
    attn_bernoulli_method method;
    double keep;       /* 1 - p */
    float kept_scale;  /* float(1 / (1 - p)) as PyTorch's noise.div_ gives */
    bool passthrough;  /* p == 0: PyTorch returns the input, drawing nothing */
    bool drop_all;     /* p == 1: PyTorch multiplies by zero, drawing nothing */
    uint32_t mcg_state;
    /* ATTN_BERNOULLI_PHILOX: the call's key and offset, and where it is */
    uint64_t philox_seed, philox_offset, keep_threshold;
    uint64_t keep_below; /* ATTN_BERNOULLI_MT19937: a 53-bit draw below it keeps */
    uint64_t index;     /* the next element's flat index */
    uint32_t group[64]; /* the draws of group index / 64 */
} attn_dropout_stream;

/* The factor kept elements are multiplied by: float(1 / (1 - p)), 0 for p = 1. */
static inline float attn_dropout_kept_scale(double p) {
    return p < 1.0 ? 1.0f / (float)(1.0 - p) : 0.0f;
}

/* The same in double, as PyTorch's float64 dropout scales. */
static inline double attn_dropout_kept_scale_f64(double p) {
    return p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
}

/* Begins the dropout of a tensor of n elements with probability p. */
void attn_dropout_stream_begin(attn_dropout_stream *s, attn_rng *rng, double p, size_t n);
/* Gives a Philox stream's offset back to its rng, for a call that fails
 * before its pass draws: the rng is then where it was before the begin.
 * Philox streams only (the attention's dropout is Philox): the begin of
 * another method may have drawn from the rng itself (MKL's seed), which
 * this does not give back. */
void attn_dropout_stream_cancel(attn_dropout_stream *s);
/* The factor of the next mask entry: kept_scale or 0 (1 when p == 0). */
float attn_dropout_stream_next(attn_dropout_stream *s);
/* The next n mask entries as bytes: keep[i] is 1 where the element is kept,
 * 0 where it is dropped (1 for every element when p == 0). */
void attn_dropout_stream_keeps(attn_dropout_stream *s, uint8_t *keep, size_t n);
/* Applies the next n mask entries: y = x * mask * scale (y may alias x). */
void attn_dropout_stream_apply(attn_dropout_stream *s, const float *x, float *y, size_t n,
                               uint8_t *keep_mask);

#endif /* ATTN_DROPOUT_H */
