/*
 * raster.h — the drawing the CLI's images share (attn heatmap's panels,
 * attn pretrain's loss plot): an 8-bit RGB canvas, clipped pixels and
 * rectangles, and text in the 5x7 bitmap font (cli/font5x7.h).
 */
#ifndef ATTN_CLI_RASTER_H
#define ATTN_CLI_RASTER_H

#include <stdbool.h>
#include <stddef.h>

typedef struct raster {
    unsigned char *rgb; /* width * height * 3 bytes, row-major */
    size_t width, height;
} raster;

/* A character's advance at scale s is 6 s pixels (5 s of glyph, s of
 * space); its height is 7 s. */
#define RASTER_CHAR_ADVANCE 6
#define RASTER_CHAR_HEIGHT 7

/* Pixel (x, y) set to colour; pixels outside the canvas are left alone, so
 * coordinates that wrapped below zero are harmless. */
void raster_put(const raster *cv, size_t x, size_t y, const unsigned char colour[3]);

/* The rectangle [x, x + w) x [y, y + h), clipped to the canvas. */
void raster_fill(const raster *cv, size_t x, size_t y, size_t w, size_t h,
                 const unsigned char colour[3]);

/* At most max characters of s at (x, y), the top-left of the first glyph,
 * each font pixel a scale x scale square; a cut string ends in '~'.
 * Vertical text reads bottom to top, (x, y) being the bottom-left of its
 * first character. */
void raster_text(const raster *cv, size_t x, size_t y, const char *s, size_t max, size_t scale,
                 bool vertical, const unsigned char colour[3]);

/* The pixels n characters span at scale s, without the trailing space. */
size_t raster_text_width(size_t n, size_t scale);

#endif /* ATTN_CLI_RASTER_H */
