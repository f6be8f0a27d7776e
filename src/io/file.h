/*
 * file.h — the attn_file of attn.h, for the writers beside it (npy.c,
 * safetensors.c), which name the destination in their messages.
 */
#ifndef ATTN_IO_FILE_H
#define ATTN_IO_FILE_H

#include "internal.h"

#include <stdbool.h>
#include <stdio.h>

struct attn_file {
    FILE *stream; /* NULL once closed                                       */
    char *path;   /* the destination, as the caller named it                */
    char *target; /* what is replaced: path, or the file its symlink names  */
    char *temp;   /* the temporary beside target; NULL when in place        */
    bool closed;  /* flushed, synced and closed without an error            */
    bool failed;  /* a write or the close failed: only discarding remains  */
};

#endif /* ATTN_IO_FILE_H */
