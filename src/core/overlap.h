/*
 * overlap.h — the one check of the outputs a call writes against the
 * tensors it reads and its other outputs: a kernel that writes an output
 * while it still reads an input in the same memory computes from values it
 * has already overwritten, so a public call refuses any overlap of the
 * spans (first byte to last) before it writes anything, naming the two
 * arguments. A strided output whose rows overlap one another is refused
 * too: threads would write the same element.
 */
#ifndef ATTN_CORE_OVERLAP_H
#define ATTN_CORE_OVERLAP_H

#include "internal.h"

#include <stdint.h>

/* The bytes [data, data + bytes) an argument spans (data NULL or bytes 0:
 * none). */
typedef struct attn_span {
    const char *name;
    const void *data;
    size_t bytes;
} attn_span;

static inline bool attn_spans_overlap(const attn_span *a, const attn_span *b) {
    if (!a->data || !b->data || !a->bytes || !b->bytes) return false;
    uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
    return a0 < b0 + b->bytes && b0 < a0 + a->bytes;
}

/* ATTN_OK when no output overlaps an input or another output; else
 * ATTN_ERR_INVALID, "who: out overlaps k (...)". */
static inline attn_status attn_check_overlap(attn_ctx *ctx, const char *who,
                                             const attn_span *outs, size_t n_outs,
                                             const attn_span *ins, size_t n_ins) {
    for (size_t i = 0; i < n_outs; i++) {
        for (size_t j = 0; j < n_ins + i; j++) {
            const attn_span *other = j < n_ins ? &ins[j] : &outs[j - n_ins];
            if (attn_spans_overlap(&outs[i], other))
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "%s: %s [%p, +%zu bytes) overlaps %s [%p, +%zu bytes): an "
                                 "output may not share memory with an input or another output",
                                 who, outs[i].name, outs[i].data, outs[i].bytes, other->name,
                                 other->data, other->bytes);
        }
    }
    return ATTN_OK;
}

/* Elements a strided tensor spans: `count[i]` steps of `stride[i]`
 * elements along each of n dimensions, then `width` contiguous elements
 * (0 for an empty tensor); false where that overflows. */
static inline bool attn_strided_extent(size_t n, const size_t *count, const size_t *stride,
                                       size_t width, size_t *out) {
    size_t e = width, step;
    for (size_t i = 0; i < n; i++) {
        if (!count[i] || !width) {
            *out = 0;
            return true;
        }
        if (!attn_mul_size(count[i] - 1, stride[i], &step) || !attn_add_size(e, step, &e))
            return false;
    }
    *out = e;
    return true;
}

/* Whether the rows of such a tensor are apart: taken by stride from the
 * smallest, each dimension of more than one step strides past everything
 * the smaller ones span (a sufficient test: every layout that permutes or
 * pads the dimensions passes it). Needs n <= 4 and the extent checked. */
static inline bool attn_strided_rows_apart(size_t n, const size_t *count, const size_t *stride,
                                           size_t width) {
    size_t order[4], m = 0;
    for (size_t i = 0; i < n && i < 4; i++)
        if (count[i] > 1) order[m++] = i;
    for (size_t i = 1; i < m; i++) /* insertion sort by stride */
        for (size_t j = i; j > 0 && stride[order[j]] < stride[order[j - 1]]; j--) {
            size_t t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    size_t spanned = width;
    for (size_t i = 0; i < m; i++) {
        size_t d = order[i];
        if (stride[d] < spanned) return false;
        spanned += (count[d] - 1) * stride[d];
    }
    return true;
}

#endif /* ATTN_CORE_OVERLAP_H */
