/*
 * loss_plot.h — the training and validation loss of a pretraining run drawn
 * as the book's figure 5.12 (llms_from_scratch.ch05.plot_losses): training
 * loss solid in matplotlib's C0 blue, validation loss dash-dot in C1 orange,
 * "Epochs" along the bottom, "Tokens seen" along the top for the same
 * points, "Loss" up the left, the legend in the upper right. Rendering to an
 * RGB image needs no libpng; cli_loss_plot_png writes it through png_write.c.
 */
#ifndef ATTN_CLI_LOSS_PLOT_H
#define ATTN_CLI_LOSS_PLOT_H

#include "attn.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct cli_loss_history {
    const double *tokens_seen, *epochs_seen, *train_losses, *val_losses;
    size_t n;
} cli_loss_history;

/* The image is always CLI_LOSS_PLOT_WIDTH x CLI_LOSS_PLOT_HEIGHT pixels. */
#define CLI_LOSS_PLOT_WIDTH 800
#define CLI_LOSS_PLOT_HEIGHT 500
#define CLI_LOSS_PLOT_MAX_TICKS 12
#define CLI_LOSS_PLOT_LABEL_MAX 24 /* a tick label's bytes, its NUL included */

/* The line colours: matplotlib's C0 (#1f77b4) and C1 (#ff7f0e). */
extern const unsigned char cli_loss_plot_train_colour[3], cli_loss_plot_val_colour[3];

/*
 * One axis. Its range [lo, hi] is the data's range widened by 5% of its
 * span at each end, as matplotlib's autoscaling does; a span of zero (one
 * point, a flat loss) widens to c +- 5% of c, or c +- 1 for c = 0 (or
 * below 2e-299 in magnitude). Ticks sit
 * at the multiples of step in [lo, hi], step being 1, 2 or 5 times a power
 * of ten: the smallest such step whose labels do not crowd (on the epoch
 * axis, a whole number of epochs whenever the range holds two whole
 * numbers, as the book's MaxNLocator(integer=True)). Labels are plain
 * decimals ("40000", "2.5") while every value on the axis is below 1e6 in
 * magnitude and the step at least 1e-4; otherwise C's %e with the digits
 * the step needs ("4.0e+04", "1.2e+09").
 */
typedef struct cli_loss_axis {
    double lo, hi, step;
    double ticks[CLI_LOSS_PLOT_MAX_TICKS];
    char labels[CLI_LOSS_PLOT_MAX_TICKS][CLI_LOSS_PLOT_LABEL_MAX];
    size_t n_ticks;
} cli_loss_axis;

/*
 * Where everything goes, in pixels (x to the right, y down). The axes box's
 * spines are the columns left and right and the rows top and bottom; top =
 * 56 and bottom = 444 always, right = 749, and left = 44 + 12 x the characters
 * of the widest loss tick label. A point (epoch, loss) is drawn
 * centred at
 *   x = left + (epoch - epochs.lo) / (epochs.hi - epochs.lo) * (right - left)
 *   y = bottom - (loss - loss.lo) / (loss.hi - loss.lo) * (bottom - top)
 * and tokens_seen maps onto the top axis by the same formula with tokens.
 * The lines are 2 pixels wide, covering pixels floor(x) and floor(x) + 1
 * (likewise y) about each point on them, clipped to inside the box; so
 * pixel (round(x), round(y)) of every drawn point has the line's colour. A
 * loss that is NaN or infinite is a gap: no line reaches it, and a finite
 * point without a finite neighbour is drawn as a 4x4 dot. Validation's
 * dash-dot pattern along the line is 12 pixels on, 5 off, 3 on, 5 off. The
 * legend box [legend_x, legend_x + legend_w) x [legend_y, legend_y +
 * legend_h) is drawn over the lines, 10 pixels in from the top right corner.
 */
typedef struct cli_loss_plot_layout {
    size_t width, height;
    size_t left, right, top, bottom;
    size_t legend_x, legend_y, legend_w, legend_h;
    cli_loss_axis epochs, tokens, loss;
} cli_loss_plot_layout;

/* Checks h and fills the layout: false with a message when n is 0, an
 * array is missing, or an epoch or token count is not finite, or a value's
 * magnitude is over 1e300 (whose spans would overflow). */
bool cli_loss_plot_layout_compute(const cli_loss_history *h, cli_loss_plot_layout *out, char *err,
                                  size_t err_size);

/* Draws the book's figure 5.12 into an RGB image (rgb: width*height*3 bytes, malloc'd, the
 * caller frees). n >= 1; NaN losses (an empty validation loader) leave gaps. */
bool cli_loss_plot_render(const cli_loss_history *h, unsigned char **rgb, size_t *width,
                          size_t *height, char *err, size_t err_size);

/* Renders and writes it as PNG to file, an open attn_file for path (the caller commits or
 * discards, as with cli_png_write in cli/png_write.h). */
bool cli_loss_plot_png(attn_ctx *ctx, attn_file *file, const char *path, const cli_loss_history *h,
                       char *err, size_t err_size);

#endif /* ATTN_CLI_LOSS_PLOT_H */
