/* png_write.h — an 8-bit RGB image written as PNG through libpng (built
 * only when CMake finds libpng; see ATTN_HAVE_PNG). */
#ifndef ATTN_CLI_PNG_WRITE_H
#define ATTN_CLI_PNG_WRITE_H

#include "attn.h"

#include <stdbool.h>
#include <stddef.h>

/* True when this attn was built with libpng. */
bool cli_png_available(void);

/* Writes rgb (width * height * 3 bytes) as PNG to file, an open attn_file
 * for path (which the caller commits or discards). On failure returns false
 * with a message naming path in err. */
bool cli_png_write(attn_ctx *ctx, attn_file *file, const char *path, const unsigned char *rgb,
                   size_t width, size_t height, char *err, size_t err_size);

#endif /* ATTN_CLI_PNG_WRITE_H */
