/*
 * heatmap_render.h — attention weights drawn as heat maps: one panel per
 * head, a colour scale, token labels on both axes, the masked future
 * hatched in grey. Rendering to an RGB image (written as PNG by
 * png_write.c) and to a terminal with 24-bit colour. No libpng here.
 */
#ifndef ATTN_CLI_HEATMAP_RENDER_H
#define ATTN_CLI_HEATMAP_RENDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define HM_MAX_LABEL 12 /* characters of a label drawn; longer ones are cut */

typedef struct hm_spec {
    size_t panels, tokens;
    const float *weights;       /* (panels, T, T), row i = query i */
    const size_t *heads;        /* the head number of each panel */
    const char *const *labels;  /* T labels (tokens or positions) */
    bool causal;                /* cells j > i are the masked future */
    const char *title;          /* a caption above the panels (may be NULL) */
} hm_spec;

/*
 * The layout, in pixels (docs/cli.md gives the same formulas):
 *   cell  c = clamp(480 / T, 8, 40); font scale s = 2 when c >= 20, else 1
 *   label band L = 6 s n + 6, n = the longest label's length (at most 12)
 *   title band A = 7 s + 8;  panel: (L + T c) wide, (A + L + T c) high
 *   cols = min(P, 4), rows = ceil(P / cols), gap 16, margin 10
 *   caption band C = 7 s + 8 when a title is given, else 0
 *   width  = 10 + cols (L + T c) + 16 (cols - 1) + 16 + 14 + 4 + 30 s + 10
 *   height = 10 + C + rows (A + L + T c) + 16 (rows - 1) + 10
 * Cell (i, j) of panel p fills [gx + j c, gx + (j+1) c) x [gy + i c, ...),
 * with gx = 10 + col (L + T c + 16) + L and gy = 10 + C + row (A + L + T c
 * + 16) + A + L; when c >= 12 its last row and column are white grid lines.
 * Colours run from the smallest weight drawn (dark) to the largest (pale);
 * the masked future is not drawn as a weight but hatched grey.
 */
typedef struct hm_layout {
    size_t cell, scale, label_w, title_h, caption_h, cols, rows, panel_w, panel_h;
    size_t width, height, bar_x;
    float vmin, vmax; /* the colour scale: the smallest and largest weight drawn */
} hm_layout;

/* Fills the layout; false when the image would be absurdly large. */
bool hm_compute_layout(const hm_spec *spec, hm_layout *out);

/* Draws into rgb (width * height * 3 bytes, row-major). */
void hm_render(const hm_spec *spec, const hm_layout *layout, unsigned char *rgb);

/* The colour of t in [0, 1]: dark purple through red and orange to pale
 * yellow, its luminance rising with t. */
void hm_colour(float t, unsigned char rgb[3]);

/* The same panels as rows of coloured cells with 24-bit ANSI escapes.
 * Returns false when writing failed. */
bool hm_print_terminal(FILE *out, const hm_spec *spec);

#endif /* ATTN_CLI_HEATMAP_RENDER_H */
