/*
 * test_gemv.c — the decoding matrix-vector kernels (kernels/gemv/) of every
 * kernel set this CPU runs, and attn_k_linear_small, against a double
 * reference:
 *   - rows 1 .. ATTN_GEMV_MAX_ROWS, in and out across the tile edges
 *     (in % 8, % 16, % 128 and out % 4 all covered, rows shorter and
 *     longer than 2048), with and without bias;
 *   - error <= 1e-5 of the L2 size of each dot product's terms;
 *   - a row's result does not depend on the other rows, the output range
 *     or the thread count, bit for bit;
 *   - outputs outside [o_begin, o_end) are left untouched;
 *   - attn_k_linear_small_n (several matrices, one pass) equals one call
 *     per matrix;
 *   - attn_k_linear_small with more rows than the kernels take, and on the
 *     reference kernels, equals attn_k_linear;
 *   - the 16-bit kernels (bf16, f16 W) equal the float kernel on the
 *     widened W, bit for bit, and their widening equals half.h's;
 *     attn_k_linear16_n (matrix-vector kernels, or the SGEMM widening W as
 *     it packs it) equals attn_k_linear_small_n on the
 *     widened W, bit for bit, on 1 and 3 threads and the reference set;
 *   - a set's bf16 products (x and W in bf16, vdpbf16ps) within 1e-5 of
 *     the double sums of the same values, with the bitwise properties
 *     above; attn_k_linear16_bf16_n with few rows is that kernel on the
 *     rounded x (or run_bf16 on it, in a set without bf16 products), bit
 *     for bit on 1 and 3 threads;
 *   - on AVX-512, both readings of W (paired, streamed: kernel_set.c picks
 *     one by the CPU's vendor) pass the checks above and give the same
 *     bits as each other.
 * Fresh random inputs each run: the seed is printed; argv[1] replays it.
 *
 *   test_gemv --time IN OUT THREADS [f32|bf16|f16|bf16-products]   times one
 *       (1, IN) x (OUT, IN)^T product, W in that dtype (bf16-products: x
 *       rounded to bf16 as well), beside a read-only pass
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, mkstemp, fdopen, unlink */

#include "attn.h"
#include "check.h"
#include "internal.h"
#include "kernels/dispatch.h"
#include "half.h"
#include "kernels/gemv/gemv.h"
#include "kernels/gemv/linear16.h"
#include "kernels/kernel_set.h"
#include "parallel.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static uint64_t state;

static float uniform(void) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = uniform();
}

static attn_ctx *ctx_for(attn_kernels kernels, size_t threads) {
    attn_ctx *ctx = NULL;
    attn_ctx_config cfg = {.num_threads = threads, .kernels = kernels};
    if (attn_ctx_new(&cfg, &ctx) != ATTN_OK) return NULL;
    return ctx;
}

/* One kernel's call on fixed operands: the float kernel (run) on x and w,
 * or the bf16 products (run_bf16_dot) on xh and wh where xh is set. */
typedef struct gemv_call {
    const attn_gemv_kernel *k;
    const float *x, *w, *bias;
    const uint16_t *xh, *wh;
    size_t in;
} gemv_call;

/* rows of x from first_row on, outputs [o_begin, o_end) */
static void call(const gemv_call *c, size_t first_row, size_t rows, float *y, size_t ldy,
                 size_t o_begin, size_t o_end) {
    if (c->xh)
        c->k->run_bf16_dot(rows, c->in, c->xh + first_row * c->in, c->wh, c->bias, y, ldy,
                           o_begin, o_end);
    else
        c->k->run(rows, c->in, c->x + first_row * c->in, c->w, c->bias, y, ldy, o_begin,
                  o_end);
}

/* A call on rows x (rows, in) and out outputs against the double sums of
 * x and w (the floats the operands hold), then its bitwise properties;
 * y gets the result. */
static void check_call(const gemv_call *c, const float *x, const float *w, size_t rows,
                       size_t out, float *y, const char *what) {
    size_t in = c->in;
    const float *b = c->bias;
    float *y1 = malloc(out * sizeof *y1), *y2 = malloc(rows * out * sizeof *y2);
    if (!y1 || !y2) abort();
    call(c, 0, rows, y, out, 0, out);
    double worst = 0.0;
    for (size_t r = 0; r < rows; r++)
        for (size_t o = 0; o < out; o++) {
            double s = b ? b[o] : 0.0, size = b ? (double)b[o] * b[o] : 0.0;
            for (size_t i = 0; i < in; i++) {
                double t = (double)x[r * in + i] * w[o * in + i];
                s += t;
                size += t * t;
            }
            double err = fabs(y[r * out + o] - s) / (sqrt(size) + 1e-30);
            if (err > worst) worst = err;
        }
    if (worst > 1e-5)
        fprintf(stderr, "%s%s rows %zu in %zu out %zu: error %.3g\n", c->k->name, what, rows, in,
                out, worst);
    CHECK(worst <= 1e-5);
    /* the last row alone, as row 0 of its own call */
    call(c, rows - 1, 1, y1, out, 0, out);
    CHECK(memcmp(y1, y + (rows - 1) * out, out * sizeof *y1) == 0);
    /* the outputs in two ranges, the split off the tile; NaN outside */
    for (size_t i = 0; i < rows * out; i++) y2[i] = NAN;
    size_t split = out / 2 + (out > 2 ? 1 : 0);
    call(c, 0, rows, y2, out, split, out);
    bool untouched = true;
    for (size_t r = 0; r < rows; r++)
        for (size_t o = 0; o < split; o++) untouched = untouched && isnan(y2[r * out + o]);
    CHECK(untouched);
    call(c, 0, rows, y2, out, 0, split);
    CHECK(memcmp(y2, y, rows * out * sizeof *y) == 0);
    free(y1), free(y2);
}

/* One kernel on one size against the double reference, then its bitwise
 * properties. */
static void check_kernel(const attn_gemv_kernel *k, size_t rows, size_t in, size_t out,
                         bool with_bias) {
    float *x = malloc(rows * in * sizeof *x), *w = malloc(out * in * sizeof *w);
    float *bias = malloc(out * sizeof *bias), *y = malloc(rows * out * sizeof *y);
    if (!x || !w || !bias || !y) abort();
    fill(x, rows * in);
    fill(w, out * in);
    fill(bias, out);
    gemv_call c = {.k = k, .x = x, .w = w, .bias = with_bias ? bias : NULL, .in = in};
    check_call(&c, x, w, rows, out, y, "");
    free(x), free(w), free(bias), free(y);
}

/* attn_k_linear_small on threads 1, 2, 3 is one result; past the kernels'
 * rows, and on the reference kernels, it is attn_k_linear's. */
static void check_dispatch(attn_kernels kernels, size_t rows, size_t in, size_t out) {
    float *x = malloc(rows * in * sizeof *x), *w = malloc(out * in * sizeof *w);
    float *bias = malloc(out * sizeof *bias), *y = malloc(rows * out * sizeof *y);
    float *y2 = malloc(rows * out * sizeof *y2);
    if (!x || !w || !bias || !y || !y2) abort();
    fill(x, rows * in);
    fill(w, out * in);
    fill(bias, out);
    attn_ctx *c1 = ctx_for(kernels, 1);
    if (!c1) abort();
    attn_k_linear_small(c1, x, w, bias, y, rows, in, out);
    for (size_t threads = 2; threads <= 3; threads++) {
        attn_ctx *c = ctx_for(kernels, threads);
        if (!c) abort();
        attn_k_linear_small(c, x, w, bias, y2, rows, in, out);
        CHECK(memcmp(y, y2, rows * out * sizeof *y) == 0);
        attn_ctx_free(c);
    }
    if (rows > ATTN_GEMV_MAX_ROWS || kernels == ATTN_KERNELS_REFERENCE) {
        attn_k_linear(c1, x, w, bias, y2, rows, in, out);
        CHECK(memcmp(y, y2, rows * out * sizeof *y) == 0);
    }
    attn_ctx_free(c1);
    free(x), free(w), free(bias), free(y), free(y2);
}

/* attn_k_linear_small_n over three matrices (Q, K, V-like, unequal
 * widths) equals three attn_k_linear_small calls, bit for bit. */
static void check_parts(attn_kernels kernels, size_t rows, size_t in) {
    const size_t outs[3] = {129, 33, 64};
    float *x = malloc(rows * in * sizeof *x), *w[3], *b[3], *y[3], *y1[3];
    if (!x) abort();
    fill(x, rows * in);
    attn_k_linear_part parts[3];
    for (int i = 0; i < 3; i++) {
        w[i] = malloc(outs[i] * in * sizeof(float));
        b[i] = malloc(outs[i] * sizeof(float));
        y[i] = malloc(rows * outs[i] * sizeof(float));
        y1[i] = malloc(rows * outs[i] * sizeof(float));
        if (!w[i] || !b[i] || !y[i] || !y1[i]) abort();
        fill(w[i], outs[i] * in);
        fill(b[i], outs[i]);
        parts[i] = (attn_k_linear_part){w[i], i == 1 ? NULL : b[i], y[i], outs[i]};
    }
    attn_ctx *ctx = ctx_for(kernels, 2);
    if (!ctx) abort();
    attn_k_linear_small_n(ctx, x, rows, in, parts, 3);
    for (int i = 0; i < 3; i++) {
        attn_k_linear_small(ctx, x, w[i], parts[i].bias, y1[i], rows, in, outs[i]);
        CHECK(memcmp(y[i], y1[i], rows * outs[i] * sizeof(float)) == 0);
        free(w[i]), free(b[i]), free(y[i]), free(y1[i]);
    }
    attn_ctx_free(ctx);
    free(x);
}

/* w (n) rounded to dtype: bits into h, their widened values into w. */
static void round_to(attn_dtype dtype, float *w, uint16_t *h, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h[i] = attn_float_to_half(dtype, w[i]);
        w[i] = attn_half_to_float(dtype, h[i]);
    }
}

/* A 16-bit kernel equals the float kernel on the widened W, bit for bit;
 * widening equals half.h's. */
static void check_kernel16(const attn_gemv_kernel *k, attn_dtype dtype, size_t rows, size_t in,
                           size_t out, bool with_bias) {
    float *x = malloc(rows * in * sizeof *x), *w = malloc(out * in * sizeof *w);
    float *bias = malloc(out * sizeof *bias), *y = malloc(rows * out * sizeof *y);
    float *y16 = malloc(rows * out * sizeof *y16), *wide = malloc(out * in * sizeof *wide);
    uint16_t *h = malloc(out * in * sizeof *h);
    if (!x || !w || !bias || !y || !y16 || !wide || !h) abort();
    fill(x, rows * in);
    fill(w, out * in);
    fill(bias, out);
    w[0] = 3e-6f; /* an f16 subnormal, and 1e4 past bf16's exact integers */
    if (out * in > 1) w[out * in - 1] = 1e4f;
    round_to(dtype, w, h, out * in);
    const float *b = with_bias ? bias : NULL;
    k->run(rows, in, x, w, b, y, out, 0, out);
    (dtype == ATTN_DTYPE_BF16 ? k->run_bf16 : k->run_f16)(rows, in, x, h, b, y16, out, 0, out);
    if (memcmp(y, y16, rows * out * sizeof *y) != 0)
        fprintf(stderr, "%s %s rows %zu in %zu out %zu differs from float\n", k->name,
                attn_dtype_name(dtype), rows, in, out);
    CHECK(memcmp(y, y16, rows * out * sizeof *y) == 0);
    (dtype == ATTN_DTYPE_BF16 ? k->widen_bf16 : k->widen_f16)(h, out * in, wide);
    CHECK(memcmp(wide, w, out * in * sizeof *w) == 0);
    free(x), free(w), free(bias), free(y), free(y16), free(wide), free(h);
}

/* attn_k_linear16_n on 1 and 3 threads equals attn_k_linear_small_n on the
 * widened weights (three parts, one without bias). */
static void check_linear16(attn_kernels kernels, attn_dtype dtype, size_t rows, size_t in,
                           const size_t outs[3]) {
    float *x = malloc(rows * in * sizeof *x), *w[3], *b[3], *y[3], *y16[3];
    uint16_t *h[3];
    size_t panel_floats = attn_k_linear16_panel_floats(in);
    float *panel = malloc(panel_floats * sizeof *panel);
    if (!x || !panel) abort();
    fill(x, rows * in);
    attn_k_linear_part parts[3];
    attn_k_linear16_part parts16[3];
    for (int i = 0; i < 3; i++) {
        w[i] = malloc(outs[i] * in * sizeof(float));
        h[i] = malloc(outs[i] * in * sizeof(uint16_t));
        b[i] = malloc(outs[i] * sizeof(float));
        y[i] = malloc(rows * outs[i] * sizeof(float));
        y16[i] = malloc(rows * outs[i] * sizeof(float));
        if (!w[i] || !h[i] || !b[i] || !y[i] || !y16[i]) abort();
        fill(w[i], outs[i] * in);
        round_to(dtype, w[i], h[i], outs[i] * in);
        fill(b[i], outs[i]);
        parts[i] = (attn_k_linear_part){w[i], i == 1 ? NULL : b[i], y[i], outs[i]};
        parts16[i] = (attn_k_linear16_part){h[i], i == 1 ? NULL : b[i], y16[i], outs[i]};
    }
    for (size_t threads = 1; threads <= 3; threads += 2) {
        attn_ctx *ctx = ctx_for(kernels, threads);
        if (!ctx) abort();
        attn_k_linear_small_n(ctx, x, rows, in, parts, 3);
        attn_k_linear16_n(ctx, dtype, x, rows, in, parts16, 3, panel);
        for (int i = 0; i < 3; i++) {
            bool same = memcmp(y[i], y16[i], rows * outs[i] * sizeof(float)) == 0;
            if (!same)
                fprintf(stderr, "linear16 %s %s rows %zu in %zu out %zu threads %zu differs\n",
                        attn_kernels_name(kernels), attn_dtype_name(dtype), rows, in, outs[i],
                        threads);
            CHECK(same);
        }
        attn_ctx_free(ctx);
    }
    for (int i = 0; i < 3; i++) free(w[i]), free(h[i]), free(b[i]), free(y[i]), free(y16[i]);
    free(x), free(panel);
}

/* A set's bf16 products (run_bf16_dot: x and W in bf16) against the
 * double sums of the same bf16 values, then the bitwise properties of
 * check_kernel; and attn_k_linear16_bf16_n with few rows, on 1 and 3
 * threads, is that kernel on x rounded to bf16 (or, in a set without it,
 * run_bf16 on the rounded x), bit for bit. */
static void check_bf16_dot(attn_kernels kernels, const attn_gemv_kernel *k, size_t rows,
                           size_t in, size_t out, bool with_bias) {
    float *x = malloc(rows * in * sizeof *x), *w = malloc(out * in * sizeof *w);
    float *bias = malloc(out * sizeof *bias), *y = malloc(rows * out * sizeof *y);
    float *y2 = malloc(rows * out * sizeof *y2), *xr = malloc(rows * in * sizeof *xr);
    uint16_t *xh = malloc(rows * in * sizeof *xh), *wh = malloc(out * in * sizeof *wh);
    uint16_t *rounded = malloc(rows * in * sizeof *rounded);
    float *panel = malloc(attn_k_linear16_panel_floats(in) * sizeof *panel);
    if (!x || !w || !bias || !y || !y2 || !xr || !xh || !wh || !rounded || !panel) abort();
    fill(x, rows * in);
    fill(w, out * in);
    fill(bias, out);
    memcpy(xr, x, rows * in * sizeof *x);
    round_to(ATTN_DTYPE_BF16, xr, xh, rows * in);
    round_to(ATTN_DTYPE_BF16, w, wh, out * in);
    const float *b = with_bias ? bias : NULL;
    if (k->run_bf16_dot) {
        gemv_call c = {.k = k, .xh = xh, .wh = wh, .bias = b, .in = in};
        check_call(&c, xr, w, rows, out, y, " bf16 products");
    } else {
        k->run_bf16(rows, in, xr, wh, b, y, out, 0, out);
    }
    for (size_t threads = 1; threads <= 3; threads += 2) {
        attn_ctx *ctx = ctx_for(kernels, threads);
        if (!ctx) abort();
        attn_k_linear16_part part = {wh, b, y2, out};
        attn_k_linear16_bf16_n(ctx, x, rows, in, &part, 1, rounded, panel);
        CHECK(memcmp(rounded, xh, rows * in * sizeof *xh) == 0);
        bool same = memcmp(y2, y, rows * out * sizeof *y) == 0;
        if (!same)
            fprintf(stderr, "linear16_bf16 %s rows %zu in %zu out %zu threads %zu differs\n",
                    attn_kernels_name(kernels), rows, in, out, threads);
        CHECK(same);
        attn_ctx_free(ctx);
    }
    free(x), free(w), free(bias), free(y), free(y2), free(xr), free(xh), free(wh), free(rounded);
    free(panel);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct read_job {
    const uint64_t *words;
    _Atomic uint64_t sum;
} read_job;

static void read_range(void *arg, size_t begin, size_t end) {
    read_job *j = arg;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = begin;
    for (; i + 4 <= end; i += 4) a += j->words[i], b += j->words[i + 1], c += j->words[i + 2],
                                 d += j->words[i + 3];
    for (; i < end; i++) a += j->words[i];
    atomic_fetch_add(&j->sum, a + b + c + d);
}

/* GB/s of W read by attn_k_linear_small (W float) or attn_k_linear16_n (W
 * bf16 / f16), best of several, beside a read-only pass over the same
 * bytes on as many threads (what a kernel that only reads can reach). */
static int time_one(size_t in, size_t out, size_t threads, const char *dtype_name) {
    /* bf16-products: W bf16, x rounded to bf16 (attn_k_linear16_bf16_n) */
    bool products = strcmp(dtype_name, "bf16-products") == 0;
    attn_dtype dtype = strcmp(dtype_name, "bf16") == 0 || products ? ATTN_DTYPE_BF16
                       : strcmp(dtype_name, "f16") == 0 ? ATTN_DTYPE_F16
                                                        : ATTN_DTYPE_F32;
    size_t bytes = out * in * (dtype == ATTN_DTYPE_F32 ? 4 : 2);
    float *x = malloc(in * sizeof *x), *w = malloc(out * in * sizeof *w), *y = malloc(out * 4);
    uint16_t *h = malloc(out * in * sizeof *h);
    uint16_t *rounded = malloc(in * sizeof *rounded);
    float *panel = malloc(attn_k_linear16_panel_floats(in) * sizeof *panel);
    if (!x || !w || !y || !h || !rounded || !panel) return 1;
    fill(x, in);
    fill(w, out * in);
    if (dtype != ATTN_DTYPE_F32) round_to(dtype, w, h, out * in);
    attn_ctx *ctx = ctx_for(ATTN_KERNELS_AUTO, threads);
    if (!ctx) return 1;
    attn_k_linear16_part part = {h, NULL, y, out};
    double best = 1e30, best_read = 1e30;
    read_job job = {.words = dtype == ATTN_DTYPE_F32 ? (const void *)w : (const void *)h};
    for (int rep = 0; rep < 20; rep++) {
        double t0 = now();
        if (dtype == ATTN_DTYPE_F32)
            attn_k_linear_small(ctx, x, w, NULL, y, 1, in, out);
        else if (products)
            attn_k_linear16_bf16_n(ctx, x, 1, in, &part, 1, rounded, panel);
        else
            attn_k_linear16_n(ctx, dtype, x, 1, in, &part, 1, NULL);
        double t = now() - t0;
        if (t < best) best = t;
        t0 = now();
        attn_parallel_for(threads, bytes / 8, 1, read_range, &job);
        t = now() - t0;
        if (t < best_read) best_read = t;
    }
    printf("gemv %s %s in %zu out %zu threads %zu: %.3f ms, %.1f GB/s (read-only pass %.1f "
           "GB/s)\n",
           attn_kernels_name(ATTN_KERNELS_AUTO), dtype_name, in, out, threads, best * 1e3,
           (double)bytes / best / 1e9, (double)bytes / best_read / 1e9);
    attn_ctx_free(ctx);
    free(x), free(w), free(y), free(h), free(rounded), free(panel);
    return atomic_load(&job.sum) == 1 ? 2 : 0; /* used: the pass is not optimised away */
}

#if defined(ATTN_HAVE_X86_KERNELS)
/* Two readings of W (gemv_avx512.c: paired and streamed; kernel_set.c
 * picks one by the CPU's vendor) give the same bits: the float kernel,
 * the 16-bit ones and the bf16 products, over outputs [o_begin, out). */
static void check_readings(const attn_gemv_kernel *paired, const attn_gemv_kernel *streamed,
                           size_t rows, size_t in, size_t out, size_t o_begin) {
    float *x = malloc(rows * in * sizeof *x), *w = malloc(out * in * sizeof *w);
    float *bias = malloc(out * sizeof *bias), *y[2];
    uint16_t *xh = malloc(rows * in * sizeof *xh), *wh = malloc(out * in * sizeof *wh);
    y[0] = malloc(rows * out * sizeof *y[0]);
    y[1] = malloc(rows * out * sizeof *y[1]);
    if (!x || !w || !bias || !xh || !wh || !y[0] || !y[1]) abort();
    fill(x, rows * in);
    fill(w, out * in);
    fill(bias, out);
    round_to(ATTN_DTYPE_BF16, x, xh, rows * in);
    for (int form = 0; form < 4; form++) {
        if (form == 3 && !paired->run_bf16_dot) break;
        if (form > 0) round_to(form == 2 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16, w, wh, out * in);
        for (int k = 0; k < 2; k++) {
            const attn_gemv_kernel *g = k ? streamed : paired;
            for (size_t i = 0; i < rows * out; i++) y[k][i] = NAN;
            if (form == 0) g->run(rows, in, x, w, bias, y[k], out, o_begin, out);
            if (form == 1) g->run_bf16(rows, in, x, wh, bias, y[k], out, o_begin, out);
            if (form == 2) g->run_f16(rows, in, x, wh, bias, y[k], out, o_begin, out);
            if (form == 3) g->run_bf16_dot(rows, in, xh, wh, bias, y[k], out, o_begin, out);
        }
        bool same = memcmp(y[0], y[1], rows * out * sizeof *y[0]) == 0;
        if (!same)
            fprintf(stderr, "%s and %s (form %d) rows %zu in %zu out %zu from %zu differ\n",
                    paired->name, streamed->name, form, rows, in, out, o_begin);
        CHECK(same);
    }
    free(x), free(w), free(bias), free(xh), free(wh), free(y[0]), free(y[1]);
}
#endif

/* The matrix-vector kernel of isa's kernel set (kernels/kernel_set.h),
 * NULL for the reference set. */
static const attn_gemv_kernel *gemv_of(attn_kernels isa) {
    attn_kernel_set set;
    attn_kernel_set_fill(isa, &set);
    return set.gemv;
}

int main(int argc, char **argv) {
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "--time") == 0)
        return time_one(strtoul(argv[2], NULL, 10), strtoul(argv[3], NULL, 10),
                        strtoul(argv[4], NULL, 10), argc == 6 ? argv[5] : "f32");
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)seed);
    state = seed;
    const attn_kernels sets[] = {ATTN_KERNELS_PORTABLE, ATTN_KERNELS_AVX2, ATTN_KERNELS_AVX512};
    /* 2048 and past it: the AVX-512 kernel reads longer rows four at a time */
    const size_t ins[] = {1, 7, 8, 9, 15, 16, 17, 33, 100, 768, 2048, 2049, 2100};
    const size_t outs[] = {1, 3, 4, 5, 9, 64, 131};
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        if (!attn_kernels_supported(sets[s])) continue;
        const attn_gemv_kernel *k = gemv_of(sets[s]);
        CHECK(k != NULL && k->isa == sets[s]);
        if (!k) continue;
        for (size_t rows = 1; rows <= ATTN_GEMV_MAX_ROWS; rows++)
            for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++)
                for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++)
                    check_kernel(k, rows, ins[i], outs[o], (rows + i + o) % 2 == 0);
        for (size_t rows = 1; rows <= ATTN_GEMV_MAX_ROWS + 2; rows += 3)
            check_dispatch(sets[s], rows, 300, 1001);
        check_parts(sets[s], 1, 2000);
        check_parts(sets[s], 3, 100);
        check_parts(sets[s], ATTN_GEMV_MAX_ROWS + 1, 64);
        for (int d = 0; d < 2; d++) {
            attn_dtype dtype = d ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
            for (size_t rows = 1; rows <= ATTN_GEMV_MAX_ROWS; rows += 3)
                for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++)
                    for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++)
                        check_kernel16(k, dtype, rows, ins[i], outs[o], (rows + i + o) % 2 == 0);
            /* wide's first part (with bias) holds more than a panel of the
             * widened fallback (linear16.c: 2^20 floats) */
            const size_t small[3] = {129, 33, 64}, wide[3] = {3500, 40, 9};
            check_linear16(sets[s], dtype, 1, 2000, small);
            check_linear16(sets[s], dtype, ATTN_GEMV_MAX_ROWS, 37, small);
            check_linear16(sets[s], dtype, ATTN_GEMV_MAX_ROWS + 1, 300, wide);
            check_linear16(sets[s], dtype, 30, 77, small);
        }
        for (size_t rows = 1; rows <= ATTN_GEMV_MAX_ROWS; rows += 2)
            for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++)
                for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o += 2)
                    check_bf16_dot(sets[s], k, rows, ins[i], outs[o], (rows + i + o) % 2 == 0);
    }
#if defined(ATTN_HAVE_X86_KERNELS)
    if (attn_kernels_supported(ATTN_KERNELS_AVX512)) {
        /* both readings of W whatever this CPU's vendor: the same checks, the same bits */
        bool dot = gemv_of(ATTN_KERNELS_AVX512)->run_bf16_dot != NULL;
        const attn_gemv_kernel *paired = dot ? &attn_gemv_kernel_avx512bf16
                                             : &attn_gemv_kernel_avx512;
        const attn_gemv_kernel *streamed = dot ? &attn_gemv_kernel_avx512bf16_streamed
                                               : &attn_gemv_kernel_avx512_streamed;
        const size_t longer[] = {4096, 4111, 8192};
        for (size_t rows = 1; rows <= 2; rows++)
            for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++)
                for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++) {
                    bool with_bias = (rows + i + o) % 2 == 0;
                    check_kernel(streamed, rows, ins[i], outs[o], with_bias);
                    check_readings(paired, streamed, rows, ins[i], outs[o], o % 3);
                    if (o % 2 == 0)
                        check_bf16_dot(ATTN_KERNELS_AVX512, streamed, rows, ins[i], outs[o],
                                       with_bias);
                }
        for (size_t i = 0; i < sizeof longer / sizeof longer[0]; i++)
            for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o += 2)
                check_readings(paired, streamed, 1, longer[i], outs[o], o % 2);
    }
#endif
    const size_t small[3] = {129, 33, 64};
    check_linear16(ATTN_KERNELS_REFERENCE, ATTN_DTYPE_BF16, 2, 100, small);
    check_linear16(ATTN_KERNELS_REFERENCE, ATTN_DTYPE_F16, 11, 100, small);
    const size_t wide[3] = {3500, 40, 9}; /* the reference set's panels: two for the first */
    check_linear16(ATTN_KERNELS_REFERENCE, ATTN_DTYPE_BF16, ATTN_GEMV_MAX_ROWS + 1, 300, wide);
    check_dispatch(ATTN_KERNELS_REFERENCE, 2, 300, 1001);
    CHECK(gemv_of(ATTN_KERNELS_REFERENCE) == NULL);
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
