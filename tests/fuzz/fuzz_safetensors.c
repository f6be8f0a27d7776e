/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors reader.
 *
 * Each input is parsed from memory (attn_safetensors_parse) and opened as a
 * file (attn_safetensors_open, from a memfd): both must agree on the status
 * and, when they succeed, on every tensor and metadata entry. Every tensor's
 * info is checked against itself (numel, byte range, lookup by name), and
 * every loadable one of at most 2^20 elements is loaded through both
 * handles and compared bit for bit.
 */
#define _GNU_SOURCE
#include "attn.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static attn_ctx *ctx;

static int memfd_with(const void *bytes, size_t size, char path[64]) {
    int fd = memfd_create("fuzz_safetensors", 0);
    if (fd < 0) return -1;
    const unsigned char *p = bytes;
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, p + done, size - done);
        if (n <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)n;
    }
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

static size_t dtype_size(attn_dtype d) {
    switch (d) {
    case ATTN_DTYPE_F64: case ATTN_DTYPE_I64: case ATTN_DTYPE_U64: return 8;
    case ATTN_DTYPE_F32: case ATTN_DTYPE_I32: case ATTN_DTYPE_U32: return 4;
    case ATTN_DTYPE_F16: case ATTN_DTYPE_BF16: case ATTN_DTYPE_I16: case ATTN_DTYPE_U16: return 2;
    default: return 1;
    }
}

static void check_tensors(attn_safetensors *a, attn_safetensors *b) {
    size_t count = attn_safetensors_count(a);
    if (b && attn_safetensors_count(b) != count) abort();
    for (size_t i = 0; i < count; i++) {
        attn_safetensors_info info, other;
        if (attn_safetensors_info_at(a, i, &info) != ATTN_OK) abort();
        size_t numel = 1;
        for (size_t d = 0; d < info.ndim; d++) numel *= info.shape[d];
        if (info.ndim > ATTN_SAFETENSORS_MAX_DIMS || numel != info.numel) abort();
        if (info.data_end - info.data_begin != numel * dtype_size(info.dtype)) abort();
        if (attn_safetensors_find(a, info.name, &other) != ATTN_OK || other.index != info.index)
            abort();
        if (b && (attn_safetensors_info_at(b, i, &other) != ATTN_OK ||
                  strcmp(other.name, info.name) != 0 || other.numel != info.numel ||
                  other.dtype != info.dtype))
            abort();
        if (info.dtype > ATTN_DTYPE_F64 || numel > ((size_t)1 << 20)) continue;
        float *x = malloc((numel ? numel : 1) * sizeof *x);
        float *y = malloc((numel ? numel : 1) * sizeof *y);
        if (!x || !y) abort();
        /* every loadable tensor loads, but for an F64 one holding a value
         * float32 cannot (refused by element); the file as the image */
        attn_status sa = attn_safetensors_load(a, info.index, x, numel);
        if (sa != ATTN_OK && !(sa == ATTN_ERR_INVALID && info.dtype == ATTN_DTYPE_F64)) abort();
        if (b && (attn_safetensors_load(b, info.index, y, numel) != sa ||
                  (sa == ATTN_OK && memcmp(x, y, numel * sizeof *x) != 0)))
            abort();
        free(x);
        free(y);
    }
    size_t meta = attn_safetensors_metadata_count(a);
    if (b && attn_safetensors_metadata_count(b) != meta) abort();
    for (size_t i = 0; i < meta; i++) {
        attn_metadata_entry e, f;
        if (attn_safetensors_metadata_at(a, i, &e) != ATTN_OK || !e.key || !e.value) abort();
        if (attn_safetensors_metadata_get(a, e.key) == NULL) abort();
        if (b && (attn_safetensors_metadata_at(b, i, &f) != ATTN_OK ||
                  strcmp(e.key, f.key) != 0 || strcmp(e.value, f.value) != 0))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx && attn_ctx_new(NULL, &ctx) != ATTN_OK) abort();
    attn_safetensors *parsed = NULL, *opened = NULL;
    attn_status st = attn_safetensors_parse(ctx, data, size, &parsed);
    if ((st == ATTN_OK) != (parsed != NULL)) abort();
    char path[64];
    int fd = memfd_with(data, size, path);
    if (fd >= 0) {
        attn_status st_open = attn_safetensors_open(ctx, path, &opened);
        if (st_open != st) {
            fprintf(stderr, "parse: %s, open: %s (%s)\n", attn_status_name(st),
                    attn_status_name(st_open), attn_ctx_last_error(ctx));
            abort();
        }
    }
    if (parsed) check_tensors(parsed, opened);
    attn_safetensors_free(parsed);
    attn_safetensors_free(opened);
    if (fd >= 0) close(fd);
    return 0;
}
