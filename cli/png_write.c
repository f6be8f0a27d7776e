/* png_write.c — PNG output through libpng, or a stub that says it is not
 * there when the build found no libpng. */
#include "png_write.h"

#include <stdio.h>

#ifdef ATTN_HAVE_PNG

#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <string.h>

bool cli_png_available(void) { return true; }

typedef struct png_failure {
    jmp_buf jump;
    char message[200];
} png_failure;

static void on_error(png_structp png, png_const_charp message) {
    png_failure *f = png_get_error_ptr(png);
    snprintf(f->message, sizeof f->message, "libpng: %s", message);
    longjmp(f->jump, 1);
}

static void on_warning(png_structp png, png_const_charp message) {
    (void)png;
    (void)message; /* warnings do not stop the image */
}

/* The libpng calls, kept apart so that nothing the caller owns is live
 * across the longjmp. */
static bool write_png(FILE *file, const unsigned char *rgb, size_t width, size_t height,
                      png_failure *f) {
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
    png_init_io(png, file);
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

bool cli_png_write(const char *path, const unsigned char *rgb, size_t width, size_t height,
                   char *err, size_t err_size) {
    FILE *file = fopen(path, "wb");
    if (!file) {
        snprintf(err, err_size, "%s: cannot open for writing: %s", path, strerror(errno));
        return false;
    }
    png_failure f = {.message = ""};
    bool ok = write_png(file, rgb, width, height, &f);
    int saved = errno;
    if (fclose(file) != 0 && ok) {
        snprintf(f.message, sizeof f.message, "close failed: %s", strerror(errno));
        ok = false;
    } else if (!ok && !f.message[0]) {
        snprintf(f.message, sizeof f.message, "write failed: %s", strerror(saved));
    }
    if (!ok) snprintf(err, err_size, "%s: %s", path, f.message);
    return ok;
}

#else

bool cli_png_available(void) { return false; }

bool cli_png_write(const char *path, const unsigned char *rgb, size_t width, size_t height,
                   char *err, size_t err_size) {
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
