/*
 * fuzz_npy.c — libFuzzer target for the .npy reader.
 *
 * Each input is parsed from memory (attn_npy_parse) and read as a file
 * (attn_npy_read, from a memfd): the two must agree on the status, shape
 * and every bit of the data. A parsed array is walked whole (ASan sees any
 * short allocation), written back with attn_npy_write and parsed again,
 * which must give the same array.
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

/* Writes bytes to a fresh memfd and gives its path; -1 if that fails. */
static int memfd_with(const void *bytes, size_t size, char path[64]) {
    int fd = memfd_create("fuzz_npy", 0);
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

static bool same_array(const attn_npy *a, const attn_npy *b) {
    if (a->ndim != b->ndim || a->numel != b->numel) return false;
    if (memcmp(a->shape, b->shape, sizeof a->shape) != 0) return false;
    return a->numel == 0 || memcmp(a->data, b->data, a->numel * sizeof(float)) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx && attn_ctx_new(NULL, &ctx) != ATTN_OK) abort();
    attn_npy parsed, read;
    attn_status st = attn_npy_parse(ctx, data, size, &parsed);
    if (st == ATTN_OK) {
        size_t numel = 1;
        for (size_t i = 0; i < parsed.ndim; i++) numel *= parsed.shape[i];
        if (parsed.ndim > ATTN_NPY_MAX_DIMS || numel != parsed.numel) abort();
        volatile float sink = 0.0f;
        for (size_t i = 0; i < parsed.numel; i++) sink += parsed.data[i];
        (void)sink;
    } else if (parsed.data || parsed.ndim || parsed.numel) {
        abort(); /* a failure leaves *out zeroed */
    }

    char path[64];
    int fd = memfd_with(data, size, path);
    if (fd >= 0) {
        attn_status st_read = attn_npy_read(ctx, path, &read);
        close(fd);
        if (st_read != st) {
            fprintf(stderr, "parse: %s, read: %s (%s)\n", attn_status_name(st),
                    attn_status_name(st_read), attn_ctx_last_error(ctx));
            abort();
        }
        if (st == ATTN_OK && !same_array(&parsed, &read)) abort();
        attn_npy_free(&read);
    }

    if (st == ATTN_OK && parsed.numel <= 4096) {
        /* written back and parsed again: the same array */
        int out = memfd_create("fuzz_npy_out", 0);
        if (out >= 0) {
            snprintf(path, sizeof path, "/proc/self/fd/%d", out);
            if (attn_npy_write(ctx, path, parsed.data, parsed.ndim, parsed.shape) != ATTN_OK)
                abort();
            attn_npy again;
            if (attn_npy_read(ctx, path, &again) != ATTN_OK || !same_array(&parsed, &again))
                abort();
            attn_npy_free(&again);
            close(out);
        }
    }
    attn_npy_free(&parsed);
    return 0;
}
