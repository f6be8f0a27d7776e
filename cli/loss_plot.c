/* loss_plot.c — see loss_plot.h for the layout. */
#include "loss_plot.h"

#include "png_write.h"
#include "raster.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const unsigned char cli_loss_plot_train_colour[3] = {0x1f, 0x77, 0xb4};
const unsigned char cli_loss_plot_val_colour[3] = {0xff, 0x7f, 0x0e};

static const unsigned char ink[3] = {0, 0, 0};
static const unsigned char paper[3] = {255, 255, 255};
static const unsigned char legend_edge[3] = {204, 204, 204};

enum {
    SCALE = 2,                            /* the font drawn at twice its size */
    CHAR_W = RASTER_CHAR_ADVANCE * SCALE, /* 12 */
    CHAR_H = RASTER_CHAR_HEIGHT * SCALE,  /* 14 */
    MARGIN = 10,
    TICK_LEN = 6,
    TICK_GAP = 4,  /* between a tick and its label */
    LABEL_GAP = 6, /* between tick labels and the axis label */
    PLOT_TOP = MARGIN + CHAR_H + LABEL_GAP + CHAR_H + TICK_GAP + TICK_LEN + 2, /* 56 */
    PLOT_BOTTOM = CLI_LOSS_PLOT_HEIGHT - 1 - MARGIN - CHAR_H - LABEL_GAP - CHAR_H - TICK_GAP -
                  TICK_LEN - 1,                /* 444 */
    /* room right of the box for half of a centred x tick label */
    PLOT_RIGHT = CLI_LOSS_PLOT_WIDTH - 1 - 50, /* 749 */
    /* left = LEFT_BASE + CHAR_W * the widest loss label: "Loss" (x 12 to 25)
     * and a gap of 10 before the labels, which end TICK_LEN + TICK_GAP left
     * of the spine. */
    LEFT_BASE = 44,
    LEGEND_PAD = 8,
    LEGEND_SAMPLE = 28, /* the length of each entry's line sample */
    LEGEND_INSET = 10,
    /* validation's dash-dot, in pixels along the line: on, off, on, off */
    DASH_ON = 12,
    DASH_OFF = 5,
    DOT_ON = 3,
};

/* Beyond this, spans and the 5% widening could overflow a double. */
#define MAX_MAGNITUDE 1e300

static const char train_label[] = "Training loss", val_label[] = "Validation loss";

/* The data range of n values; false when none is finite. */
static bool finite_range(const double *v, size_t n, double *lo, double *hi) {
    *lo = INFINITY;
    *hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i])) continue;
        if (v[i] < *lo) *lo = v[i];
        if (v[i] > *hi) *hi = v[i];
    }
    return *lo <= *hi;
}

/* The axis range: the data's widened by 5% of the span at each end, and a
 * span too small for doubles to tell apart widened about its centre. */
static void autoscale(double dmin, double dmax, double *lo, double *hi) {
    double span = dmax - dmin, mag = fmax(fabs(dmin), fabs(dmax));
    if (span > mag * 1e-9 && span > 1e-290) {
        *lo = dmin - 0.05 * span;
        *hi = dmax + 0.05 * span;
        return;
    }
    double c = 0.5 * (dmin + dmax), half = 0.05 * fabs(c);
    if (!(half > 1e-300)) half = 1.0;
    *lo = c - half;
    *hi = c + half;
}

/* The tick labels for step: plain decimals while the axis stays below 1e6
 * and the step at least 1e-4, %e otherwise (see loss_plot.h). */
static void format_labels(cli_loss_axis *a) {
    double step_exp = floor(log10(a->step) + 1e-9);
    double max_abs = fmax(fabs(a->lo), fabs(a->hi));
    bool plain = max_abs < 1e6 && step_exp >= -4;
    double top_tick = 0;
    for (size_t k = 0; k < a->n_ticks; k++) top_tick = fmax(top_tick, fabs(a->ticks[k]));
    double value_exp = top_tick > 0 ? floor(log10(top_tick) + 1e-9) : step_exp;
    for (size_t k = 0; k < a->n_ticks; k++) {
        double v = a->ticks[k];
        if (fabs(v) < a->step * 1e-6) v = 0; /* no "-0" */
        if (plain) {
            int decimals = step_exp < 0 ? (int)-step_exp : 0;
            snprintf(a->labels[k], sizeof a->labels[k], "%.*f", decimals, v);
        } else {
            double d = value_exp - step_exp;
            int decimals = d < 0 ? 0 : d > 6 ? 6 : (int)d;
            snprintf(a->labels[k], sizeof a->labels[k], "%.*e", decimals, v);
        }
    }
}

static size_t widest_label(const cli_loss_axis *a) {
    size_t w = 0;
    for (size_t k = 0; k < a->n_ticks; k++)
        if (strlen(a->labels[k]) > w) w = strlen(a->labels[k]);
    return w;
}

/*
 * Picks the densest 1-2-5 step whose ticks are at most CLI_LOSS_PLOT_MAX_TICKS
 * and, spread over pixels, at least min_spacing apart, and for horizontal
 * axes far enough apart that neighbouring labels leave a gap.
 */
static void choose_ticks(cli_loss_axis *a, double dmin, double dmax, double pixels,
                         double min_spacing, bool horizontal, bool whole_numbers) {
    autoscale(dmin, dmax, &a->lo, &a->hi);
    double span = a->hi - a->lo;
    if (whole_numbers && floor(a->hi) - ceil(a->lo) < 1) whole_numbers = false;
    static const double mantissas[3] = {1, 2, 5};
    double smallest_exp = floor(log10(span / CLI_LOSS_PLOT_MAX_TICKS));
    for (int tries = 0; tries < 30; tries++) {
        a->step = mantissas[tries % 3] * pow(10, smallest_exp + tries / 3);
        if (whole_numbers && a->step < 1) continue;
        double first = ceil(a->lo / a->step), last = floor(a->hi / a->step);
        if (last - first + 1 > CLI_LOSS_PLOT_MAX_TICKS) continue;
        a->n_ticks = 0;
        for (double k = first; k <= last && a->n_ticks < CLI_LOSS_PLOT_MAX_TICKS; k++)
            a->ticks[a->n_ticks++] = k * a->step;
        format_labels(a);
        double spacing = a->step / span * pixels;
        double need = horizontal ? (double)(widest_label(a) * CHAR_W + 16) : 0;
        if (spacing >= min_spacing && spacing >= need) return;
    }
    /* Past the last try the axis keeps that step's ticks: thirty tries span
     * ten decades above span / CLI_LOSS_PLOT_MAX_TICKS, far beyond any axis
     * whose labels fit. */
}

static bool check_series(const double *v, const char *name, size_t n, bool must_be_finite,
                         char *err, size_t err_size) {
    if (!v) {
        snprintf(err, err_size, "loss plot: %s is missing", name);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (must_be_finite && !isfinite(v[i])) {
            snprintf(err, err_size, "loss plot: %s[%zu] = %g is not finite", name, i, v[i]);
            return false;
        }
        if (isfinite(v[i]) && fabs(v[i]) > MAX_MAGNITUDE) {
            snprintf(err, err_size, "loss plot: %s[%zu] = %g is beyond %g in magnitude", name, i,
                     v[i], MAX_MAGNITUDE);
            return false;
        }
    }
    return true;
}

bool cli_loss_plot_layout_compute(const cli_loss_history *h, cli_loss_plot_layout *out, char *err,
                                  size_t err_size) {
    if (!h || h->n == 0) {
        snprintf(err, err_size, "loss plot: no points to plot (n = 0)");
        return false;
    }
    size_t n = h->n;
    if (!check_series(h->epochs_seen, "epochs_seen", n, true, err, err_size) ||
        !check_series(h->tokens_seen, "tokens_seen", n, true, err, err_size) ||
        !check_series(h->train_losses, "train_losses", n, false, err, err_size) ||
        !check_series(h->val_losses, "val_losses", n, false, err, err_size))
        return false;
    memset(out, 0, sizeof *out);
    out->width = CLI_LOSS_PLOT_WIDTH;
    out->height = CLI_LOSS_PLOT_HEIGHT;
    out->top = PLOT_TOP;
    out->bottom = PLOT_BOTTOM;
    out->right = PLOT_RIGHT;

    double lo, hi, lo2, hi2;
    bool train_any = finite_range(h->train_losses, n, &lo, &hi);
    bool val_any = finite_range(h->val_losses, n, &lo2, &hi2);
    if (!train_any && !val_any) lo = 0, hi = 1; /* nothing to draw: a plain 0..1 axis */
    else if (!train_any) lo = lo2, hi = hi2;
    else if (val_any) lo = fmin(lo, lo2), hi = fmax(hi, hi2);
    choose_ticks(&out->loss, lo, hi, (double)(PLOT_BOTTOM - PLOT_TOP), 3.0 * CHAR_H, false, false);
    out->left = LEFT_BASE + widest_label(&out->loss) * CHAR_W;

    double pixels = (double)(out->right - out->left);
    finite_range(h->epochs_seen, n, &lo, &hi);
    choose_ticks(&out->epochs, lo, hi, pixels, 60, true, true);
    finite_range(h->tokens_seen, n, &lo, &hi);
    choose_ticks(&out->tokens, lo, hi, pixels, 60, true, false);

    out->legend_w = LEGEND_PAD + LEGEND_SAMPLE + LEGEND_PAD +
                    raster_text_width(strlen(val_label), SCALE) + LEGEND_PAD;
    out->legend_h = LEGEND_PAD + CHAR_H + LEGEND_PAD + CHAR_H + LEGEND_PAD;
    out->legend_x = out->right - LEGEND_INSET - out->legend_w;
    out->legend_y = out->top + LEGEND_INSET;
    return true;
}

/* Data to pixel coordinates (see loss_plot.h). */
static double map_x(const cli_loss_plot_layout *L, const cli_loss_axis *a, double v) {
    return (double)L->left + (v - a->lo) / (a->hi - a->lo) * (double)(L->right - L->left);
}

static double map_y(const cli_loss_plot_layout *L, double loss) {
    const cli_loss_axis *a = &L->loss;
    return (double)L->bottom - (loss - a->lo) / (a->hi - a->lo) * (double)(L->bottom - L->top);
}

/* Where a line may draw: strictly inside the axes box. */
typedef struct plot_clip {
    const raster *cv;
    long x0, y0, x1, y1;
} plot_clip;

/* A square of side pixels whose top-left is (floor(x) + off, floor(y) + off). */
static void brush(const plot_clip *c, double x, double y, long side, long off,
                  const unsigned char *colour) {
    long bx = (long)floor(x) + off, by = (long)floor(y) + off;
    for (long yy = by; yy < by + side; yy++)
        for (long xx = bx; xx < bx + side; xx++)
            if (xx >= c->x0 && xx <= c->x1 && yy >= c->y0 && yy <= c->y1)
                raster_put(c->cv, (size_t)xx, (size_t)yy, colour);
}

/* Whether the pen is down at distance s along a dash-dot line. */
static bool dash_dot_on(double s) {
    double period = DASH_ON + DASH_OFF + DOT_ON + DASH_OFF;
    double p = fmod(s, period);
    return p < DASH_ON || (p >= DASH_ON + DASH_OFF && p < DASH_ON + DASH_OFF + DOT_ON);
}

/*
 * The curve through the finite points of loss, in order; dashed curves
 * carry the pattern's phase from one segment to the next, as matplotlib
 * does along a path.
 */
static void draw_curve(const plot_clip *c, const cli_loss_plot_layout *L, const double *epochs,
                       const double *loss, size_t n, const unsigned char *colour, bool dashed) {
    double along = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(loss[i])) continue;
        double x0 = map_x(L, &L->epochs, epochs[i]), y0 = map_y(L, loss[i]);
        bool prev = i > 0 && isfinite(loss[i - 1]), next = i + 1 < n && isfinite(loss[i + 1]);
        if (!prev && !next) brush(c, x0, y0, 4, -1, colour); /* a lone point */
        if (!next) continue;
        double x1 = map_x(L, &L->epochs, epochs[i + 1]), y1 = map_y(L, loss[i + 1]);
        double dx = x1 - x0, dy = y1 - y0, length = hypot(dx, dy);
        /* One sample a pixel along the longer direction; the points are in
         * the box, so this is at most its width or height. */
        size_t steps = (size_t)ceil(fmax(fabs(dx), fabs(dy)));
        if (steps == 0) steps = 1;
        for (size_t k = 0; k <= steps; k++) {
            double t = (double)k / (double)steps;
            if (!dashed || dash_dot_on(along + t * length))
                brush(c, x0 + t * dx, y0 + t * dy, 2, 0, colour);
        }
        along += length;
    }
}

static void hline(const raster *cv, size_t x0, size_t x1, size_t y, const unsigned char *colour) {
    raster_fill(cv, x0, y, x1 - x0 + 1, 1, colour);
}

static void vline(const raster *cv, size_t x, size_t y0, size_t y1, const unsigned char *colour) {
    raster_fill(cv, x, y0, 1, y1 - y0 + 1, colour);
}

/* Ticks and their labels on the bottom (top = false) or top spine. */
static void draw_x_ticks(const raster *cv, const cli_loss_plot_layout *L, const cli_loss_axis *a,
                         bool top) {
    for (size_t k = 0; k < a->n_ticks; k++) {
        size_t x = (size_t)lround(map_x(L, a, a->ticks[k]));
        size_t w = raster_text_width(strlen(a->labels[k]), SCALE);
        size_t tx = x - w / 2; /* may wrap below zero: raster_put skips it */
        if (top) {
            vline(cv, x, L->top - TICK_LEN, L->top - 1, ink);
            raster_text(cv, tx, L->top - TICK_LEN - TICK_GAP - CHAR_H, a->labels[k],
                        CLI_LOSS_PLOT_LABEL_MAX, SCALE, false, ink);
        } else {
            vline(cv, x, L->bottom + 1, L->bottom + TICK_LEN, ink);
            raster_text(cv, tx, L->bottom + TICK_LEN + TICK_GAP + 1, a->labels[k],
                        CLI_LOSS_PLOT_LABEL_MAX, SCALE, false, ink);
        }
    }
}

static void draw_axes(const raster *cv, const cli_loss_plot_layout *L) {
    hline(cv, L->left, L->right, L->top, ink);
    hline(cv, L->left, L->right, L->bottom, ink);
    vline(cv, L->left, L->top, L->bottom, ink);
    vline(cv, L->right, L->top, L->bottom, ink);
    draw_x_ticks(cv, L, &L->epochs, false);
    draw_x_ticks(cv, L, &L->tokens, true);
    for (size_t k = 0; k < L->loss.n_ticks; k++) {
        size_t y = (size_t)lround(map_y(L, L->loss.ticks[k]));
        hline(cv, L->left - TICK_LEN, L->left - 1, y, ink);
        size_t w = raster_text_width(strlen(L->loss.labels[k]), SCALE);
        raster_text(cv, L->left - TICK_LEN - TICK_GAP - w, y - CHAR_H / 2, L->loss.labels[k],
                    CLI_LOSS_PLOT_LABEL_MAX, SCALE, false, ink);
    }
    size_t mid_x = (L->left + L->right) / 2, mid_y = (L->top + L->bottom) / 2;
    raster_text(cv, mid_x - raster_text_width(6, SCALE) / 2, L->height - 1 - MARGIN - CHAR_H,
                "Epochs", 6, SCALE, false, ink);
    raster_text(cv, mid_x - raster_text_width(11, SCALE) / 2, MARGIN, "Tokens seen", 11, SCALE,
                false, ink);
    raster_text(cv, MARGIN + 2, mid_y + raster_text_width(4, SCALE) / 2, "Loss", 4, SCALE, true,
                ink);
}

static void draw_legend(const raster *cv, const cli_loss_plot_layout *L) {
    size_t x = L->legend_x, y = L->legend_y, w = L->legend_w, h = L->legend_h;
    raster_fill(cv, x, y, w, h, paper);
    hline(cv, x, x + w - 1, y, legend_edge);
    hline(cv, x, x + w - 1, y + h - 1, legend_edge);
    vline(cv, x, y, y + h - 1, legend_edge);
    vline(cv, x + w - 1, y, y + h - 1, legend_edge);
    plot_clip inside = {cv, (long)x + 1, (long)y + 1, (long)(x + w) - 2, (long)(y + h) - 2};
    for (int entry = 0; entry < 2; entry++) {
        size_t row = y + LEGEND_PAD + (size_t)entry * (CHAR_H + LEGEND_PAD);
        double line_y = (double)row + CHAR_H / 2.0 - 1.0;
        const unsigned char *colour = entry ? cli_loss_plot_val_colour : cli_loss_plot_train_colour;
        for (int k = 0; k < LEGEND_SAMPLE - 1; k++)
            if (!entry || dash_dot_on(k))
                brush(&inside, (double)(x + LEGEND_PAD + (size_t)k), line_y, 2, 0, colour);
        const char *label = entry ? val_label : train_label;
        raster_text(cv, x + LEGEND_PAD + LEGEND_SAMPLE + LEGEND_PAD, row, label, strlen(label),
                    SCALE, false, ink);
    }
}

bool cli_loss_plot_render(const cli_loss_history *h, unsigned char **rgb, size_t *width,
                          size_t *height, char *err, size_t err_size) {
    cli_loss_plot_layout L;
    if (!cli_loss_plot_layout_compute(h, &L, err, err_size)) return false;
    unsigned char *pixels = malloc(L.width * L.height * 3);
    if (!pixels) {
        snprintf(err, err_size, "loss plot: out of memory for a %zux%zu image", L.width, L.height);
        return false;
    }
    raster cv = {pixels, L.width, L.height};
    raster_fill(&cv, 0, 0, L.width, L.height, paper);
    plot_clip box = {&cv, (long)L.left + 1, (long)L.top + 1, (long)L.right - 1, (long)L.bottom - 1};
    /* matplotlib's order: training, then validation over it, then the
     * spines, then the legend over everything. */
    draw_curve(&box, &L, h->epochs_seen, h->train_losses, h->n, cli_loss_plot_train_colour, false);
    draw_curve(&box, &L, h->epochs_seen, h->val_losses, h->n, cli_loss_plot_val_colour, true);
    draw_axes(&cv, &L);
    draw_legend(&cv, &L);
    *rgb = pixels;
    *width = L.width;
    *height = L.height;
    return true;
}

bool cli_loss_plot_png(attn_ctx *ctx, attn_file *file, const char *path, const cli_loss_history *h,
                       char *err, size_t err_size) {
    unsigned char *rgb = NULL;
    size_t width = 0, height = 0;
    if (!cli_loss_plot_render(h, &rgb, &width, &height, err, err_size)) return false;
    bool ok = cli_png_write(ctx, file, path, rgb, width, height, err, err_size);
    free(rgb);
    return ok;
}
