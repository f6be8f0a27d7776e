/*
 * print_driver.c — feeds tensor_print from the command line for the torch
 * comparison (test_print_vs_torch.py).
 *
 *   print_driver NDIM [DIM ...] < raw.f32
 *
 * Reads the product of the dims' float32 values, little-endian, from stdin
 * and writes attn_print_tensor's text to stdout. Exit 2 on bad input.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_print.h"

static int parse_size(const char *text, size_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end != '\0' || text[0] == '-') return 0;
    *out = (size_t)v;
    return (unsigned long long)*out == v;
}

int main(int argc, char **argv) {
    size_t ndim = 0;
    if (argc < 2 || !parse_size(argv[1], &ndim) || (size_t)argc - 2 != ndim) {
        fprintf(stderr, "usage: %s NDIM [DIM ...] < raw-float32-le\n", argv[0]);
        return 2;
    }
    size_t *shape = calloc(ndim ? ndim : 1, sizeof *shape);
    if (!shape) return 2;
    size_t numel = 1;
    for (size_t i = 0; i < ndim; i++) {
        if (!parse_size(argv[2 + i], &shape[i])) {
            fprintf(stderr, "bad dim: %s\n", argv[2 + i]);
            free(shape);
            return 2;
        }
        if (shape[i] != 0 && numel > SIZE_MAX / 4 / shape[i]) {
            fprintf(stderr, "tensor too large\n");
            free(shape);
            return 2;
        }
        numel *= shape[i];
    }

    float *data = malloc((numel ? numel : 1) * sizeof *data);
    unsigned char *raw = malloc((numel ? numel : 1) * 4);
    if (!data || !raw) {
        fprintf(stderr, "out of memory\n");
        free(shape);
        free(data);
        free(raw);
        return 2;
    }
    if (fread(raw, 4, numel, stdin) != numel) {
        fprintf(stderr, "expected %zu float32 values on stdin\n", numel);
        free(shape);
        free(data);
        free(raw);
        return 2;
    }
    for (size_t i = 0; i < numel; i++) {
        const unsigned char *b = raw + 4 * i;
        uint32_t bits = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                        (uint32_t)b[3] << 24;
        memcpy(&data[i], &bits, sizeof bits);
    }

    attn_print_tensor(stdout, data, ndim, shape);
    int rc = fflush(stdout) == 0 ? 0 : 2;
    free(shape);
    free(data);
    free(raw);
    return rc;
}
