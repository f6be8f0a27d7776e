/* raster.c — see raster.h. */
#include "raster.h"

#include "font5x7.h"

#include <string.h>

void raster_put(const raster *cv, size_t x, size_t y, const unsigned char colour[3]) {
    if (x < cv->width && y < cv->height) memcpy(cv->rgb + 3 * (y * cv->width + x), colour, 3);
}

void raster_fill(const raster *cv, size_t x, size_t y, size_t w, size_t h,
                 const unsigned char colour[3]) {
    if (x >= cv->width || y >= cv->height) return;
    if (w > cv->width - x) w = cv->width - x;
    if (h > cv->height - y) h = cv->height - y;
    for (size_t yy = y; yy < y + h; yy++)
        for (size_t xx = x; xx < x + w; xx++) raster_put(cv, xx, yy, colour);
}

void raster_text(const raster *cv, size_t x, size_t y, const char *s, size_t max, size_t scale,
                 bool vertical, const unsigned char colour[3]) {
    size_t len = strlen(s), n = len > max ? max : len;
    for (size_t k = 0; k < n; k++) {
        char ch = (n < len && k == n - 1) ? '~' : s[k];
        for (int gy = 0; gy < FONT5X7_HEIGHT; gy++)
            for (int gx = 0; gx < FONT5X7_WIDTH; gx++) {
                if (!font5x7_pixel(ch, gx, gy)) continue;
                for (size_t dy = 0; dy < scale; dy++)
                    for (size_t dx = 0; dx < scale; dx++) {
                        size_t along = k * RASTER_CHAR_ADVANCE * scale + (size_t)gx * scale + dx;
                        size_t across = (size_t)gy * scale + dy;
                        if (vertical) raster_put(cv, x + across, y - along, colour);
                        else raster_put(cv, x + along, y + across, colour);
                    }
            }
    }
}

size_t raster_text_width(size_t n, size_t scale) {
    return n ? (RASTER_CHAR_ADVANCE * n - 1) * scale : 0;
}
