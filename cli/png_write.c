/* png_write.c — PNG output through libpng, or a stub that says it is not
 * there when the build found no libpng. */
#include "png_write.h"

#include <stdio.h>

#ifdef ATTN_HAVE_PNG

#include <png.h>
#include <setjmp.h>
#include <string.h>

bool cli_png_available(void) { return true; }

typedef struct png_failure {
    jmp_buf jump;
    char message[300];
} png_failure;

/* Where libpng's bytes go: the attn_file, whose failures end the image. */
typedef struct png_sink {
    attn_ctx *ctx;
    attn_file *file;
    png_failure *failure;
} png_sink;

static void on_error(png_structp png, png_const_charp message) {
    png_failure *f = png_get_error_ptr(png);
    /* A failed write has said why already; libpng's message would not. */
    if (!f->message[0]) snprintf(f->message, sizeof f->message, "libpng: %s", message);
    longjmp(f->jump, 1);
}

static void on_warning(png_structp png, png_const_charp message) {
    (void)png;
    (void)message; /* warnings do not stop the image */
}

static void on_write(png_structp png, png_bytep data, png_size_t size) {
    png_sink *sink = png_get_io_ptr(png);
    if (attn_file_write(sink->ctx, sink->file, data, size) != ATTN_OK) {
        snprintf(sink->failure->message, sizeof sink->failure->message, "%s",
                 attn_ctx_last_error(sink->ctx));
        png_error(png, "write failed");
    }
}

static void on_flush(png_structp png) {
    (void)png; /* attn_file_close flushes, syncs and checks */
}

/* The libpng calls, kept apart so that nothing the caller owns is live
 * across the longjmp. */
static bool write_png(png_sink *sink, const unsigned char *rgb, size_t width, size_t height) {
    png_failure *f = sink->failure;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, f, on_error, on_warning);
    if (!png) {
        snprintf(f->message, sizeof f->message, "libpng: cannot create a write struct");
        return false;
    }
    png_infop info = png_create_info_struct(png);
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        snprintf(f->message, sizeof f->message, "libpng: cannot create an info struct");
        return false;
    }
    if (setjmp(f->jump)) {
        png_destroy_write_struct(&png, &info);
        return false;
    }
    png_set_write_fn(png, sink, on_write, on_flush);
    png_set_IHDR(png, info, (png_uint_32)width, (png_uint_32)height, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    /* Flat colour areas compress well unfiltered, and the file stays simple
     * to decode (the tests read it with zlib alone). */
    png_set_filter(png, PNG_FILTER_TYPE_BASE, PNG_FILTER_NONE);
    png_set_compression_level(png, 9);
    png_write_info(png, info);
    for (size_t y = 0; y < height; y++) png_write_row(png, rgb + 3 * width * y);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return true;
}

bool cli_png_write(attn_ctx *ctx, attn_file *file, const char *path, const unsigned char *rgb,
                   size_t width, size_t height, char *err, size_t err_size) {
    png_failure f = {.message = ""};
    png_sink sink = {.ctx = ctx, .file = file, .failure = &f};
    if (write_png(&sink, rgb, width, height)) return true;
    /* attn's messages start with the path; libpng's do not. */
    if (strncmp(f.message, "libpng: ", 8) == 0) snprintf(err, err_size, "%s: %s", path, f.message);
    else snprintf(err, err_size, "%s", f.message);
    return false;
}

#else

bool cli_png_available(void) { return false; }

bool cli_png_write(attn_ctx *ctx, attn_file *file, const char *path, const unsigned char *rgb,
                   size_t width, size_t height, char *err, size_t err_size) {
    (void)ctx;
    (void)file;
    (void)rgb;
    (void)width;
    (void)height;
    snprintf(err, err_size,
             "%s: PNG output is unavailable: this attn was built without libpng (install "
             "libpng-dev and rebuild; --terminal works without it)",
             path);
    return false;
}

#endif
