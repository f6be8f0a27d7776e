/*
 * file.h — the attn_file of attn.h, for the writers beside it (npy.c,
 * safetensors.c), which name the destination in their messages; and the
 * reading of a whole small file for the library's other readers.
 */
#ifndef ATTN_IO_FILE_H
#define ATTN_IO_FILE_H

#include "internal.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct attn_file {
    FILE *stream; /* NULL once closed                                       */
    char *path;   /* the destination, as the caller named it                */
    char *target; /* what is replaced: path, or the file its symlink names  */
    char *temp;   /* the temporary beside target; NULL when in place        */
    bool closed;  /* flushed, synced and closed without an error            */
    bool failed;  /* a write or the close failed: only discarding remains  */
};

/* Commits two files as a pair (each closed first): first is put in place,
 * then second; where second cannot be, first's destination gets back the
 * file it held (kept under a hard link meanwhile), or loses the new one
 * where it held none, so that a failure leaves both as they were. A file
 * system without hard links gets the two commits alone; out of memory,
 * neither is committed. Both are freed. */
attn_status attn_file_commit_pair(attn_ctx *ctx, attn_file *first, attn_file *second);

/* The whole file at path in a new buffer (attn_free it) with a NUL after
 * its *size bytes; messages start "who: " (who NULL: none). Only a regular
 * file is read: a device, a pipe or a directory is refused (ATTN_ERR_IO),
 * as /dev/zero or a FIFO would grow the buffer without end or block. */
attn_status attn_file_read_whole(attn_ctx *ctx, const char *who, const char *path,
                                 unsigned char **out, size_t *size);

/* path opened for reading ("rb") without waiting: opening a FIFO waits
 * for a writer, and the readers that refuse anything but a regular file
 * must refuse it at once. NULL with errno set when it does not open. */
FILE *attn_file_open_read(const char *path);

/* Whether the host stores the high byte of a number first. */
static inline bool attn_host_is_big_endian(void) {
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 0;
}

/* numel floats appended to file as little-endian float32 (the byte order of
 * .npy's '<f4' and of safetensors), whatever the host's order. */
attn_status attn_file_write_f32le(attn_ctx *ctx, attn_file *file, const float *data,
                                  size_t numel);

#endif /* ATTN_IO_FILE_H */
