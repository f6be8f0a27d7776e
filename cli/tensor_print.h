/*
 * tensor_print.h — prints float32 tensors exactly as PyTorch's print(tensor)
 * does under the default print options (precision 4, threshold 1000,
 * edgeitems 3, linewidth 80, sci_mode None), following torch/_tensor_str.py.
 *
 * Data is dense, row-major (C-contiguous). ndim 0 is a scalar (one value,
 * shape may be NULL). A tensor with no elements may pass data == NULL.
 */
#ifndef ATTN_TENSOR_PRINT_H
#define ATTN_TENSOR_PRINT_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes exactly what Python's print(t) writes for a float32 CPU tensor t
 * with this shape and data (no grad_fn), followed by a newline. */
void attn_print_tensor(FILE *out, const float *data, size_t ndim, const size_t *shape);

/* Same text (including the trailing newline) into buf, with snprintf
 * semantics: writes at most cap bytes, always NUL-terminated when cap > 0,
 * and returns the length of the full text (excluding the NUL), so a result
 * >= cap means the text was truncated. buf may be NULL when cap is 0. */
size_t attn_format_tensor(char *buf, size_t cap, const float *data, size_t ndim,
                          const size_t *shape);

/* print(t.shape): "torch.Size([2, 6, 3])" followed by a newline. */
void attn_print_size(FILE *out, size_t ndim, const size_t *shape);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_TENSOR_PRINT_H */
