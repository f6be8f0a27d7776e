/*
 * test_loss_plot.c — the loss plot of `attn pretrain --plot` (cli/loss_plot.c)
 * rendered from random and fixed loss histories and measured: each training
 * point's pixel has C0 blue where loss_plot.h's formula puts it, training is
 * solid and validation dash-dotted, NaN losses leave gaps, ticks are 1-2-5
 * multiples inside the range with tick marks where the mapping puts them,
 * the legend holds both colours, degenerate and extreme inputs render, and
 * bad inputs are refused with a message. ATTN_TEST_SEED repeats a run;
 * ATTN_LOSS_PLOT_PNG=path also writes the first random plot there, to look
 * at.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn.h"
#include "check.h"
#include "loss_plot.h"
#include "png_write.h"

static uint64_t rng_state;

static double uniform(void) { /* [0, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

typedef struct image {
    unsigned char *rgb;
    size_t width, height;
} image;

static bool is_colour(const image *im, long x, long y, const unsigned char c[3]) {
    if (x < 0 || y < 0 || (size_t)x >= im->width || (size_t)y >= im->height) return false;
    const unsigned char *p = im->rgb + 3 * ((size_t)y * im->width + (size_t)x);
    return p[0] == c[0] && p[1] == c[1] && p[2] == c[2];
}

/* Any pixel of colour c within +-r of (x, y). */
static bool near_colour(const image *im, long x, long y, long r, const unsigned char c[3]) {
    for (long dy = -r; dy <= r; dy++)
        for (long dx = -r; dx <= r; dx++)
            if (is_colour(im, x + dx, y + dy, c)) return true;
    return false;
}

static size_t count_colour(const image *im, size_t x0, size_t y0, size_t x1, size_t y1,
                           const unsigned char c[3]) {
    size_t n = 0;
    for (size_t y = y0; y <= y1; y++)
        for (size_t x = x0; x <= x1; x++) n += is_colour(im, (long)x, (long)y, c);
    return n;
}

/* The pixel positions loss_plot.h documents, computed here from the layout's
 * rectangle and ranges. */
static double px(const cli_loss_plot_layout *L, const cli_loss_axis *a, double v) {
    return (double)L->left + (v - a->lo) / (a->hi - a->lo) * (double)(L->right - L->left);
}
static double py(const cli_loss_plot_layout *L, double loss) {
    return (double)L->bottom -
           (loss - L->loss.lo) / (L->loss.hi - L->loss.lo) * (double)(L->bottom - L->top);
}

static bool in_legend(const cli_loss_plot_layout *L, double x, double y, double pad) {
    return x >= (double)L->legend_x - pad && x < (double)(L->legend_x + L->legend_w) + pad &&
           y >= (double)L->legend_y - pad && y < (double)(L->legend_y + L->legend_h) + pad;
}

static const unsigned char ink[3] = {0, 0, 0};

/* An axis's ticks: at least two, multiples of a 1-2-5 step, inside [lo, hi],
 * the range holding [dmin, dmax]; and its tick marks drawn where the
 * mapping puts them. */
static void check_axis(const char *name, const cli_loss_axis *a, double dmin, double dmax) {
    if (!(a->lo <= dmin && dmax <= a->hi && a->lo < a->hi)) {
        check_failed++;
        fprintf(stderr, "%s: range [%g, %g] does not hold the data [%g, %g]\n", name, a->lo, a->hi,
                dmin, dmax);
    } else {
        check_passed++;
    }
    CHECK(a->n_ticks >= 2 && a->n_ticks <= CLI_LOSS_PLOT_MAX_TICKS);
    double m = a->step / pow(10, floor(log10(a->step) + 1e-9));
    if (!(fabs(m - 1) < 1e-9 || fabs(m - 2) < 1e-9 || fabs(m - 5) < 1e-9)) {
        check_failed++;
        fprintf(stderr, "%s: step %g is not 1, 2 or 5 times a power of ten\n", name, a->step);
    }
    for (size_t k = 0; k < a->n_ticks; k++) {
        double q = a->ticks[k] / a->step;
        CHECK(fabs(q - round(q)) < 1e-6);
        CHECK(a->ticks[k] >= a->lo && a->ticks[k] <= a->hi);
        if (k) CHECK_NEAR(a->ticks[k] - a->ticks[k - 1], a->step, a->step * 1e-9);
        CHECK(strlen(a->labels[k]) > 0);
    }
}

static void check_tick_marks(const image *im, const cli_loss_plot_layout *L) {
    for (size_t k = 0; k < L->epochs.n_ticks; k++) {
        long x = lround(px(L, &L->epochs, L->epochs.ticks[k]));
        CHECK(is_colour(im, x, (long)L->bottom + 3, ink));
        CHECK(!is_colour(im, x + 3, (long)L->bottom + 3, ink));
    }
    for (size_t k = 0; k < L->tokens.n_ticks; k++) {
        long x = lround(px(L, &L->tokens, L->tokens.ticks[k]));
        CHECK(is_colour(im, x, (long)L->top - 3, ink));
        CHECK(!is_colour(im, x + 3, (long)L->top - 3, ink));
    }
    for (size_t k = 0; k < L->loss.n_ticks; k++) {
        long y = lround(py(L, L->loss.ticks[k]));
        CHECK(is_colour(im, (long)L->left - 3, y, ink));
        CHECK(!is_colour(im, (long)L->left - 3, y + 3, ink));
    }
    /* the axes box */
    CHECK(is_colour(im, (long)L->left, (long)(L->top + L->bottom) / 2, ink));
    CHECK(is_colour(im, (long)L->right, (long)(L->top + L->bottom) / 2, ink));
    CHECK(is_colour(im, (long)(L->left + L->right) / 2, (long)L->top, ink));
    CHECK(is_colour(im, (long)(L->left + L->right) / 2, (long)L->bottom, ink));
    /* axis labels: ink in the bands of "Epochs", "Tokens seen" and "Loss" */
    CHECK(count_colour(im, L->left, L->height - 25, L->right, L->height - 11, ink) > 40);
    CHECK(count_colour(im, L->left, 10, L->right, 23, ink) > 60);
    CHECK(count_colour(im, 12, L->top, 25, L->bottom, ink) > 30);
}

/* Walks a polyline's centre (the finite runs of loss) every half pixel and
 * counts the samples with the colour within a pixel and those without,
 * leaving out the legend. */
static void walk_curve(const image *im, const cli_loss_plot_layout *L, const double *epochs,
                       const double *loss, size_t n, const unsigned char c[3], size_t *on,
                       size_t *off) {
    *on = *off = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (!isfinite(loss[i]) || !isfinite(loss[i + 1])) continue;
        double x0 = px(L, &L->epochs, epochs[i]), y0 = py(L, loss[i]);
        double x1 = px(L, &L->epochs, epochs[i + 1]), y1 = py(L, loss[i + 1]);
        double length = hypot(x1 - x0, y1 - y0);
        size_t samples = (size_t)(2 * length) + 1;
        for (size_t k = 0; k <= samples; k++) {
            double t = (double)k / (double)samples, x = x0 + t * (x1 - x0), y = y0 + t * (y1 - y0);
            if (in_legend(L, x, y, 3)) continue;
            if (near_colour(im, lround(x), lround(y), 1, c)) ++*on;
            else ++*off;
        }
    }
}

/* A training history the shape of the book's: loss falling from about 10
 * with noise, validation above it by 1.5 to 1.7, epochs evenly spaced,
 * tokens growing by a fixed batch. */
typedef struct series {
    double tokens[64], epochs[64], train[64], val[64];
    size_t n;
} series;

static void random_series(series *s, size_t n, double tokens_per_step) {
    s->n = n;
    double epochs = 1 + floor(uniform() * 10), loss = 9 + uniform() * 2;
    for (size_t i = 0; i < n; i++) {
        s->epochs[i] = n > 1 ? epochs * (double)i / (double)(n - 1) : 0;
        s->tokens[i] = tokens_per_step * (double)(i + 1);
        s->train[i] = loss;
        s->val[i] = loss + 1.5 + 0.2 * uniform();
        loss *= 0.8 + 0.15 * uniform();
    }
}

static bool render(const series *s, image *im, cli_loss_plot_layout *L) {
    cli_loss_history h = {s->tokens, s->epochs, s->train, s->val, s->n};
    char err[200] = "";
    bool ok = cli_loss_plot_layout_compute(&h, L, err, sizeof err) &&
              cli_loss_plot_render(&h, &im->rgb, &im->width, &im->height, err, sizeof err);
    if (!ok) {
        check_failed++;
        fprintf(stderr, "render failed: %s\n", err);
    } else {
        check_passed++;
        CHECK(im->width == CLI_LOSS_PLOT_WIDTH && im->height == CLI_LOSS_PLOT_HEIGHT);
        CHECK(L->width == im->width && L->height == im->height);
    }
    return ok;
}

/* The plot of s written to path through attn_file, for a person to look at. */
static void write_png(const series *s, const char *path) {
    cli_loss_history h = {s->tokens, s->epochs, s->train, s->val, s->n};
    attn_ctx *ctx = NULL;
    attn_file *file = NULL;
    char err[300] = "";
    if (attn_ctx_new(NULL, &ctx) != ATTN_OK) return;
    if (attn_file_open(ctx, path, &file) == ATTN_OK) {
        if (cli_loss_plot_png(ctx, file, path, &h, err, sizeof err)) {
            if (attn_file_commit(ctx, file) != ATTN_OK)
                fprintf(stderr, "%s\n", attn_ctx_last_error(ctx));
        } else {
            fprintf(stderr, "%s\n", err);
            attn_file_discard(file);
        }
    }
    attn_ctx_free(ctx);
}

static void test_random_history(int trial) {
    series s;
    size_t n = 8 + (size_t)(uniform() * 50);
    random_series(&s, n, 512.0 * (1 + floor(uniform() * 8)));
    image im;
    cli_loss_plot_layout L;
    if (!render(&s, &im, &L)) return;
    const char *keep = getenv("ATTN_LOSS_PLOT_PNG");
    if (keep && trial == 0) write_png(&s, keep);

    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) lo = fmin(lo, s.train[i]), hi = fmax(hi, s.val[i]);
    check_axis("loss", &L.loss, lo, hi);
    check_axis("epochs", &L.epochs, s.epochs[0], s.epochs[n - 1]);
    check_axis("tokens", &L.tokens, s.tokens[0], s.tokens[n - 1]);
    /* The book's epoch axis shows whole epochs. */
    CHECK(fabs(L.epochs.step - round(L.epochs.step)) < 1e-12 && L.epochs.step >= 1);
    check_tick_marks(&im, &L);

    /* Every training point not under the legend: C0 at its pixel. */
    size_t checked = 0;
    for (size_t i = 0; i < n; i++) {
        double x = px(&L, &L.epochs, s.epochs[i]), y = py(&L, s.train[i]);
        if (in_legend(&L, x, y, 3)) continue;
        checked++;
        if (!is_colour(&im, lround(x), lround(y), cli_loss_plot_train_colour)) {
            check_failed++;
            fprintf(stderr, "train point %zu (epoch %g, loss %g): pixel (%ld, %ld) is not C0\n", i,
                    s.epochs[i], s.train[i], lround(x), lround(y));
        } else {
            check_passed++;
        }
    }
    CHECK(checked >= n / 2);

    /* Training solid; validation dash-dot: 15 of every 25 pixels on, the
     * gaps narrowed by the brush and the +-1 pixel search to 2 of 5. */
    size_t on, off;
    walk_curve(&im, &L, s.epochs, s.train, n, cli_loss_plot_train_colour, &on, &off);
    CHECK(on > 100 && off == 0);
    walk_curve(&im, &L, s.epochs, s.val, n, cli_loss_plot_val_colour, &on, &off);
    double on_fraction = (double)on / (double)(on + off);
    if (!(off > 10 && on_fraction > 0.6 && on_fraction < 0.95)) {
        check_failed++;
        fprintf(stderr, "validation: %zu samples on, %zu off: not dash-dot\n", on, off);
    } else {
        check_passed++;
    }

    /* Neither colour outside the axes box. */
    size_t outside = 0;
    for (size_t y = 0; y < im.height; y++)
        for (size_t x = 0; x < im.width; x++) {
            bool inside = x > L.left && x < L.right && y > L.top && y < L.bottom;
            if (!inside && (is_colour(&im, (long)x, (long)y, cli_loss_plot_train_colour) ||
                            is_colour(&im, (long)x, (long)y, cli_loss_plot_val_colour)))
                outside++;
        }
    CHECK(outside == 0);

    /* The legend: both colours and its text. */
    size_t lx0 = L.legend_x, ly0 = L.legend_y;
    size_t lx1 = L.legend_x + L.legend_w - 1, ly1 = L.legend_y + L.legend_h - 1;
    size_t mid = ly0 + L.legend_h / 2;
    CHECK(count_colour(&im, lx0, ly0, lx1, mid, cli_loss_plot_train_colour) >= 40);
    CHECK(count_colour(&im, lx0, ly0, lx1, mid, cli_loss_plot_val_colour) == 0);
    CHECK(count_colour(&im, lx0, mid, lx1, ly1, cli_loss_plot_val_colour) >= 20);
    CHECK(count_colour(&im, lx0, mid, lx1, ly1, cli_loss_plot_train_colour) == 0);
    CHECK(count_colour(&im, lx0, ly0, lx1, ly1, ink) > 200);
    CHECK(L.legend_x + L.legend_w + 10 == L.right && L.legend_y == L.top + 10);
    free(im.rgb);
}

/* NaN losses: no line of that colour over the span they leave. */
static void test_nan_gaps(void) {
    series s;
    random_series(&s, 30, 1024);
    size_t gap_val = 10 + (size_t)(uniform() * 8), gap_train = 22;
    s.val[gap_val] = NAN;
    s.val[gap_val + 1] = NAN;
    s.train[gap_train] = INFINITY; /* a diverged step: a gap too */
    image im;
    cli_loss_plot_layout L;
    if (!render(&s, &im, &L)) return;
    long x0 = lround(px(&L, &L.epochs, s.epochs[gap_val - 1])) + 3;
    long x1 = lround(px(&L, &L.epochs, s.epochs[gap_val + 2])) - 3;
    CHECK(x1 - x0 > 10);
    CHECK(count_colour(&im, (size_t)x0, L.top, (size_t)x1, L.bottom, cli_loss_plot_val_colour) ==
          0);
    /* ...while either side of the gap validation is drawn. */
    long before = lround(px(&L, &L.epochs, s.epochs[gap_val - 2]));
    CHECK(count_colour(&im, (size_t)before, L.top, (size_t)x0, L.bottom, cli_loss_plot_val_colour) >
          0);
    x0 = lround(px(&L, &L.epochs, s.epochs[gap_train - 1])) + 3;
    x1 = lround(px(&L, &L.epochs, s.epochs[gap_train + 1])) - 3;
    CHECK(count_colour(&im, (size_t)x0, L.top, (size_t)x1, L.bottom, cli_loss_plot_train_colour) ==
          0);
    CHECK(count_colour(&im, (size_t)x0, L.top, (size_t)x1, L.bottom, cli_loss_plot_val_colour) > 0);
    free(im.rgb);

    /* An empty validation loader: every validation loss NaN. */
    for (size_t i = 0; i < s.n; i++) s.val[i] = NAN;
    if (!render(&s, &im, &L)) return;
    CHECK(count_colour(&im, L.left, L.top, L.right, L.bottom, cli_loss_plot_val_colour) ==
          count_colour(&im, L.legend_x, L.legend_y, L.legend_x + L.legend_w - 1,
                       L.legend_y + L.legend_h - 1, cli_loss_plot_val_colour));
    CHECK(count_colour(&im, L.left, L.top, L.right, L.bottom, cli_loss_plot_train_colour) > 200);
    free(im.rgb);
}

/* One point, a flat loss, all losses NaN: they render, the lone point a dot. */
static void test_degenerate(void) {
    series s = {.tokens = {512}, .epochs = {0}, .train = {10.5}, .val = {10.9}, .n = 1};
    image im;
    cli_loss_plot_layout L;
    if (render(&s, &im, &L)) {
        double x = px(&L, &L.epochs, 0), y = py(&L, 10.5);
        CHECK_NEAR(x, (L.left + L.right) / 2.0, 0.5001);
        CHECK(is_colour(&im, lround(x), lround(y), cli_loss_plot_train_colour));
        CHECK(is_colour(&im, lround(x), lround(py(&L, 10.9)), cli_loss_plot_val_colour));
        CHECK(L.epochs.n_ticks >= 2 && L.tokens.n_ticks >= 2 && L.loss.n_ticks >= 2);
        free(im.rgb);
    }
    random_series(&s, 12, 256);
    for (size_t i = 0; i < s.n; i++) s.train[i] = 3.25, s.val[i] = 3.25;
    if (render(&s, &im, &L)) {
        /* a flat loss sits midway up, both lines on it: validation on top */
        CHECK_NEAR(py(&L, 3.25), (L.top + L.bottom) / 2.0, 0.5001);
        CHECK(count_colour(&im, L.left, L.top, L.right, L.bottom, cli_loss_plot_val_colour) > 100);
        check_axis("flat loss", &L.loss, 3.25, 3.25);
        free(im.rgb);
    }
    for (size_t i = 0; i < s.n; i++) s.train[i] = NAN, s.val[i] = NAN;
    if (render(&s, &im, &L)) {
        CHECK_NEAR(L.loss.lo, -0.05, 1e-12);
        CHECK_NEAR(L.loss.hi, 1.05, 1e-12);
        free(im.rgb);
    }
    for (size_t i = 0; i < s.n; i++) s.train[i] = 0, s.val[i] = 0;
    if (render(&s, &im, &L)) {
        CHECK(L.loss.lo == -1 && L.loss.hi == 1);
        free(im.rgb);
    }
}

/* Labels as loss_plot.h documents them, on a history fixed here; and huge
 * and tiny values. */
static void test_labels_and_extremes(void) {
    series s = {.n = 11};
    for (size_t i = 0; i < 11; i++) {
        s.epochs[i] = (double)i;
        s.tokens[i] = 4000.0 * (double)i;
        s.train[i] = 10 - 0.8 * (double)i;
        s.val[i] = 10.5 - 0.7 * (double)i;
    }
    image im;
    cli_loss_plot_layout L;
    if (render(&s, &im, &L)) {
        /* loss 2..10.5: range [1.575, 10.925]; step 2 gives 5 ticks 2..10 */
        CHECK(L.loss.n_ticks == 5 && strcmp(L.loss.labels[0], "2") == 0 &&
              strcmp(L.loss.labels[4], "10") == 0);
        CHECK(L.left == 44 + 2 * 12);
        /* tokens 0..40000: plain integers */
        CHECK(strcmp(L.tokens.labels[0], "0") == 0);
        bool has_40000 = false;
        for (size_t k = 0; k < L.tokens.n_ticks; k++) {
            CHECK(strpbrk(L.tokens.labels[k], "e.") == NULL);
            has_40000 |= strcmp(L.tokens.labels[k], "40000") == 0;
        }
        CHECK(has_40000);
        /* epochs 0..10: whole numbers from 0 */
        CHECK(strcmp(L.epochs.labels[0], "0") == 0 && L.epochs.step >= 1);
        check_tick_marks(&im, &L);
        free(im.rgb);
    }
    /* A billion tokens, losses near 1e30, then near 1e-8: %e labels. */
    for (size_t i = 0; i < 11; i++) {
        s.tokens[i] = 1e8 * (double)i;
        s.train[i] = 1e30 * (1 + 0.1 * (double)i);
        s.val[i] = 1.5e30;
    }
    if (render(&s, &im, &L)) {
        check_axis("1e9 tokens", &L.tokens, 0, 1e9);
        check_axis("1e30 loss", &L.loss, 1e30, 2e30);
        CHECK(strcmp(L.tokens.labels[0], "0.0e+00") == 0);
        for (size_t k = 1; k < L.tokens.n_ticks; k++)
            CHECK(strstr(L.tokens.labels[k], "e+08") || strstr(L.tokens.labels[k], "e+09"));
        for (size_t k = 0; k < L.loss.n_ticks; k++) CHECK(strstr(L.loss.labels[k], "e+30") != NULL);
        CHECK(is_colour(&im, lround(px(&L, &L.epochs, 0)), lround(py(&L, 1e30)),
                        cli_loss_plot_train_colour));
        check_tick_marks(&im, &L);
        free(im.rgb);
    }
    for (size_t i = 0; i < 11; i++) s.train[i] = 1e-8 * (1 + 0.1 * (double)i), s.val[i] = 1.5e-8;
    if (render(&s, &im, &L)) {
        check_axis("1e-8 loss", &L.loss, 1e-8, 2e-8);
        for (size_t k = 0; k < L.loss.n_ticks; k++) CHECK(strstr(L.loss.labels[k], "e-0") != NULL);
        free(im.rgb);
    }
}

static void check_refused(const cli_loss_history *h, const char *fragment) {
    unsigned char *rgb = NULL;
    size_t w = 0, ht = 0;
    char err[200] = "";
    bool ok = cli_loss_plot_render(h, &rgb, &w, &ht, err, sizeof err);
    if (ok || !strstr(err, fragment) || rgb) {
        check_failed++;
        fprintf(stderr, "want a refusal with \"%s\", got %s \"%s\"\n", fragment,
                ok ? "success" : "failure", err);
    } else {
        check_passed++;
    }
    free(rgb);
}

static void test_refusals(void) {
    series s;
    random_series(&s, 5, 100);
    check_refused(NULL, "n = 0");
    cli_loss_history h = {s.tokens, s.epochs, s.train, s.val, 0};
    check_refused(&h, "n = 0");
    h.n = 5;
    h.val_losses = NULL;
    check_refused(&h, "val_losses is missing");
    h.val_losses = s.val;
    s.epochs[2] = NAN;
    check_refused(&h, "epochs_seen[2] = nan is not finite");
    s.epochs[2] = 1;
    s.tokens[4] = INFINITY;
    check_refused(&h, "tokens_seen[4] = inf is not finite");
    s.tokens[4] = 5;
    s.train[1] = -2e300;
    check_refused(&h, "train_losses[1] = -2e+300 is beyond 1e+300");
}

/* Through attn_file: a PNG of the plot's size, or the no-libpng message. */
static void test_png(void) {
    series s;
    random_series(&s, 20, 512);
    cli_loss_history h = {s.tokens, s.epochs, s.train, s.val, s.n};
    attn_ctx *ctx = NULL;
    CHECK_STATUS(attn_ctx_new(NULL, &ctx), ATTN_OK);
    if (!ctx) return;
    const char *tmp = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/attn_test_loss_plot_%ld.png", tmp && *tmp ? tmp : "/tmp",
             (long)(rng_state % 1000000007u));
    attn_file *file = NULL;
    CHECK_STATUS(attn_file_open(ctx, path, &file), ATTN_OK);
    if (!file) {
        attn_ctx_free(ctx);
        return;
    }
    char err[300] = "";
    bool ok = cli_loss_plot_png(ctx, file, path, &h, err, sizeof err);
    if (!cli_png_available()) {
        CHECK(!ok && strstr(err, "PNG output is unavailable"));
        attn_file_discard(file);
        attn_ctx_free(ctx);
        return;
    }
    CHECK(ok);
    if (!ok) fprintf(stderr, "cli_loss_plot_png: %s\n", err);
    if (ok) CHECK_STATUS(attn_file_commit(ctx, file), ATTN_OK);
    else attn_file_discard(file);
    FILE *f = fopen(path, "rb");
    unsigned char head[24] = {0};
    CHECK(f && fread(head, 1, sizeof head, f) == sizeof head);
    if (f) fclose(f);
    static const unsigned char signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    CHECK(memcmp(head, signature, 8) == 0 && memcmp(head + 12, "IHDR", 4) == 0);
    unsigned w =
        (unsigned)head[16] << 24 | (unsigned)head[17] << 16 | (unsigned)head[18] << 8 | head[19];
    unsigned ht =
        (unsigned)head[20] << 24 | (unsigned)head[21] << 16 | (unsigned)head[22] << 8 | head[23];
    CHECK(w == CLI_LOSS_PLOT_WIDTH && ht == CLI_LOSS_PLOT_HEIGHT);
    remove(path);
    /* A refused history writes nothing and says why. */
    h.n = 0;
    CHECK_STATUS(attn_file_open(ctx, path, &file), ATTN_OK);
    if (file) {
        CHECK(!cli_loss_plot_png(ctx, file, path, &h, err, sizeof err) && strstr(err, "n = 0"));
        attn_file_discard(file);
    }
    FILE *gone = fopen(path, "rb");
    CHECK(gone == NULL);
    if (gone) fclose(gone);
    attn_ctx_free(ctx);
}

int main(void) {
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    const char *env = getenv("ATTN_TEST_SEED");
    if (env) seed = strtoull(env, NULL, 10);
    printf("seed %llu (ATTN_TEST_SEED to repeat)\n", (unsigned long long)seed);
    rng_state = seed * 2654435761u + 1;
    for (int trial = 0; trial < 20; trial++) test_random_history(trial);
    test_nan_gaps();
    test_degenerate();
    test_labels_and_extremes();
    test_refusals();
    test_png();
    return check_summary();
}
