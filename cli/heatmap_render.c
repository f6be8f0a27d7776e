/* heatmap_render.c — see heatmap_render.h for the layout. */
#include "heatmap_render.h"

#include "raster.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { MARGIN = 10, GAP = 16, BAR_GAP = 16, BAR_W = 14, BAR_TEXT_GAP = 4 };

static const unsigned char ink[3] = {40, 40, 40};
static const unsigned char paper[3] = {255, 255, 255};
static const unsigned char hatch_a[3] = {196, 196, 196}, hatch_b[3] = {228, 228, 228};

void hm_colour(float t, unsigned char rgb[3]) {
    /* Anchors chosen so that luminance rises along every segment. */
    static const float anchors[5][3] = {
        {10, 7, 35}, {84, 22, 112}, {182, 54, 100}, {246, 125, 58}, {252, 246, 170}};
    if (!(t > 0.0f)) t = 0.0f; /* NaN too */
    if (t > 1.0f) t = 1.0f;
    float pos = t * 4.0f;
    int k = (int)pos;
    if (k > 3) k = 3;
    float f = pos - (float)k;
    for (int c = 0; c < 3; c++)
        rgb[c] = (unsigned char)lrintf(anchors[k][c] + f * (anchors[k + 1][c] - anchors[k][c]));
}

static size_t label_len(const char *s) {
    size_t n = strlen(s);
    return n > HM_MAX_LABEL ? HM_MAX_LABEL : n;
}

/* The smallest and largest weight drawn (the masked future left out). */
static void weight_range(const hm_spec *spec, float *vmin, float *vmax) {
    size_t T = spec->tokens;
    *vmin = INFINITY;
    *vmax = -INFINITY;
    for (size_t p = 0; p < spec->panels; p++)
        for (size_t i = 0; i < T; i++)
            for (size_t j = 0; j < T; j++) {
                float w = spec->weights[(p * T + i) * T + j];
                if (spec->causal && j > i) continue;
                if (w < *vmin) *vmin = w;
                if (w > *vmax) *vmax = w;
            }
    if (!(*vmin <= *vmax)) *vmin = 0.0f, *vmax = 1.0f; /* nothing finite drawn */
}

/* Where w sits on the scale: 0 at vmin, 1 at vmax (0.5 for a flat map). */
static float scale_position(float w, float vmin, float vmax) {
    return vmax > vmin ? (w - vmin) / (vmax - vmin) : 0.5f;
}

bool hm_compute_layout(const hm_spec *spec, hm_layout *out) {
    size_t T = spec->tokens, P = spec->panels;
    if (T == 0 || P == 0 || T > 4096 || P > 4096) return false;
    memset(out, 0, sizeof *out);
    size_t c = 480 / T;
    out->cell = c < 8 ? 8 : c > 40 ? 40 : c;
    out->scale = out->cell >= 20 ? 2 : 1;
    size_t n = 1;
    for (size_t i = 0; i < T; i++)
        if (label_len(spec->labels[i]) > n) n = label_len(spec->labels[i]);
    out->label_w = 6 * out->scale * n + 6;
    out->title_h = 7 * out->scale + 8;
    out->caption_h = spec->title ? 7 * out->scale + 8 : 0;
    out->cols = P < 4 ? P : 4;
    out->rows = (P + out->cols - 1) / out->cols;
    out->panel_w = out->label_w + T * out->cell;
    out->panel_h = out->title_h + out->label_w + T * out->cell;
    out->bar_x = MARGIN + out->cols * out->panel_w + GAP * (out->cols - 1) + BAR_GAP;
    out->width = out->bar_x + BAR_W + BAR_TEXT_GAP + 30 * out->scale + MARGIN;
    /* the caption whole, where it is wider than the panels and the scale */
    size_t caption_w = spec->title ? 2 * MARGIN + 6 * out->scale * strlen(spec->title) : 0;
    if (out->width < caption_w) out->width = caption_w;
    out->height = MARGIN + out->caption_h + out->rows * out->panel_h + GAP * (out->rows - 1) + MARGIN;
    weight_range(spec, &out->vmin, &out->vmax);
    return out->width <= 32768 && out->height <= 32768;
}

void hm_render(const hm_spec *spec, const hm_layout *L, unsigned char *rgb) {
    raster cv = {rgb, L->width, L->height};
    raster_fill(&cv, 0, 0, L->width, L->height, paper);
    size_t T = spec->tokens, c = L->cell, s = L->scale;
    if (spec->title) raster_text(&cv, MARGIN, MARGIN, spec->title, 200, s, false, ink);
    for (size_t p = 0; p < spec->panels; p++) {
        size_t col = p % L->cols, row = p / L->cols;
        size_t x0 = MARGIN + col * (L->panel_w + GAP);
        size_t y0 = MARGIN + L->caption_h + row * (L->panel_h + GAP);
        size_t gx = x0 + L->label_w, gy = y0 + L->title_h + L->label_w;
        char title[32];
        snprintf(title, sizeof title, "head %zu", spec->heads[p]);
        raster_text(&cv, gx, y0 + 2, title, sizeof title, s, false, ink);
        for (size_t i = 0; i < T; i++) {
            const char *label = spec->labels[i];
            size_t w = label_len(label) * 6 * s;
            size_t pad = (c > 7 * s ? c - 7 * s : 0) / 2;
            /* row labels, right-aligned left of the grid */
            raster_text(&cv, gx - 6 - w, gy + i * c + pad, label, HM_MAX_LABEL, s, false, ink);
            /* column labels, vertical, ending just above the grid */
            raster_text(&cv, gx + i * c + pad, gy - 4, label, HM_MAX_LABEL, s, true, ink);
        }
        for (size_t i = 0; i < T; i++)
            for (size_t j = 0; j < T; j++) {
                size_t cx = gx + j * c, cy = gy + i * c;
                size_t inner = c >= 12 ? c - 1 : c;
                if (spec->causal && j > i) {
                    for (size_t yy = 0; yy < inner; yy++)
                        for (size_t xx = 0; xx < inner; xx++)
                            raster_put(&cv, cx + xx, cy + yy, ((xx + yy) / 3) % 2 ? hatch_a : hatch_b);
                } else {
                    unsigned char colour[3];
                    hm_colour(scale_position(spec->weights[(p * T + i) * T + j], L->vmin,
                                             L->vmax),
                              colour);
                    raster_fill(&cv, cx, cy, inner, inner, colour);
                }
            }
    }
    /* The colour scale beside the first row of panels: vmax at the top. */
    size_t top = MARGIN + L->caption_h + L->title_h + L->label_w, h = T * c;
    for (size_t y = 0; y < h; y++) {
        unsigned char colour[3];
        hm_colour(h > 1 ? 1.0f - (float)y / (float)(h - 1) : 1.0f, colour);
        raster_fill(&cv, L->bar_x, top + y, BAR_W, 1, colour);
    }
    char value[16];
    snprintf(value, sizeof value, "%.3f", (double)L->vmax);
    raster_text(&cv, L->bar_x + BAR_W + BAR_TEXT_GAP, top, value, 5, s, false, ink);
    snprintf(value, sizeof value, "%.3f", (double)L->vmin);
    raster_text(&cv, L->bar_x + BAR_W + BAR_TEXT_GAP, top + h - 7 * s, value, 5, s, false, ink);
}

bool hm_print_terminal(FILE *out, const hm_spec *spec) {
    size_t T = spec->tokens, n = 1;
    for (size_t i = 0; i < T; i++)
        if (label_len(spec->labels[i]) > n) n = label_len(spec->labels[i]);
    float vmin, vmax;
    weight_range(spec, &vmin, &vmax);
    if (spec->title) fprintf(out, "%s\n", spec->title);
    for (size_t p = 0; p < spec->panels; p++) {
        fprintf(out, "head %zu\n%*s ", spec->heads[p], (int)n, "");
        for (size_t j = 0; j < T; j++) fprintf(out, "%2zu", j % 100);
        fputc('\n', out);
        for (size_t i = 0; i < T; i++) {
            /* a word's control bytes as '?': a word may not drive the terminal */
            char shown[HM_MAX_LABEL + 1];
            size_t len = label_len(spec->labels[i]);
            for (size_t k = 0; k < len; k++) {
                unsigned char ch = (unsigned char)spec->labels[i][k];
                shown[k] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
            }
            shown[len] = '\0';
            fprintf(out, "%*s ", (int)n, shown);
            for (size_t j = 0; j < T; j++) {
                if (spec->causal && j > i) {
                    fputs("\x1b[48;2;70;70;70m\x1b[38;2;140;140;140m//", out);
                } else {
                    unsigned char rgb[3];
                    hm_colour(scale_position(spec->weights[(p * T + i) * T + j], vmin, vmax),
                              rgb);
                    fprintf(out, "\x1b[48;2;%u;%u;%um  ", rgb[0], rgb[1], rgb[2]);
                }
            }
            fprintf(out, "\x1b[0m %2zu\n", i);
        }
    }
    fprintf(out, "scale: %.3f ", (double)vmin);
    for (int k = 0; k <= 16; k++) {
        unsigned char rgb[3];
        hm_colour((float)k / 16.0f, rgb);
        fprintf(out, "\x1b[48;2;%u;%u;%um ", rgb[0], rgb[1], rgb[2]);
    }
    fprintf(out, "\x1b[0m %.3f%s\n", (double)vmax,
            spec->causal ? "   \x1b[48;2;70;70;70m\x1b[38;2;140;140;140m//\x1b[0m masked (future)"
                         : "");
    return !ferror(out);
}
