/*
 * test_activation.c — the vector GELU (tanh form) of every kernel set this
 * CPU runs (kernels/activation/), forward and backward, against GELU in
 * long double (1 + tanh and 1 - tanh^2 from exp, without cancellation):
 *   - on fresh random inputs across the range GPT-2's MLP sees (|x| up to
 *     8, and near the Taylor/exp switch at |u| = 1/16), each float within
 *     one unit in the last place of the long double value, and at least as
 *     many of them equal to its rounding as the scalar layer's in double
 *     (train/layers_impl.h, which loses bits as tanh nears -1);
 *   - 0, -0, tiny and huge values, +-inf and NaN as the scalar layer gives
 *     them;
 *   - any length (tails of 1-3 elements), any start and 1 or 3 threads:
 *     the same bits;
 *   - the reference set has no vector kernel (the layer runs).
 * And the cross-entropy rows (loss and backward) against the scalar layer's
 * loops and against logsumexp in long double, on fresh random rows of every
 * length to 70 and one of GPT-2's 50257 logits: the loss within 4e-16 of
 * its terms' size (max, log of the sum, the target's logit) from the long
 * double value, each dz float within a unit of the
 * layer's; NaN, +-inf and far-below-max logits as the layer gives them;
 * the same bits through the layer on 1 and 3 threads.
 * The seed is printed; argv[1] replays it.
 */
#include "attn.h"
#include "check.h"
#include "internal.h"
#include "kernels/dispatch.h"
#include "train/layers.h"

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static uint64_t state;

static double uniform(void) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(state >> 11) * 0x1p-53;
}

static attn_ctx *ctx_for(attn_kernels kernels, size_t threads) {
    attn_ctx *ctx = NULL;
    attn_ctx_config cfg = {.num_threads = threads, .kernels = kernels};
    if (attn_ctx_new(&cfg, &ctx) != ATTN_OK) return NULL;
    return ctx;
}

/* Units in the last place between two floats of the same sign (0 when
 * equal, NaN and NaN included). */
static uint32_t ulps(float a, float b) {
    if (isnan(a) && isnan(b)) return 0;
    if (a == b) return 0;
    if (isnan(a) || isnan(b) || (a < 0) != (b < 0)) return UINT32_MAX;
    uint32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return ia > ib ? ia - ib : ib - ia;
}

/* GELU and dx + dy gelu'(x) in long double: 1 + tanh(u) = 2 e / (1 + e)
 * (u < 0) or 2 / (1 + e), 1 - tanh(u)^2 = 4 e / (1 + e)^2, e = exp(-2|u|). */
static void gelu_long(float xf, float dyf, float dxf, float *y, float *dx) {
    long double x = xf, k = 0.7978845608028654L;
    long double u = k * (x + 0.044715L * x * x * x), e = expl(-2.0L * fabsl(u)), d = 1.0L + e;
    long double one_plus = u < 0 ? 2.0L * e / d : 2.0L / d, sech2 = 4.0L * e / (d * d);
    long double du = k * (1.0L + 3.0L * 0.044715L * x * x);
    *y = (float)(0.5L * x * one_plus);
    *dx = (float)(dxf + (long double)dyf * (0.5L * one_plus + 0.5L * x * sech2 * du));
}

enum { N = 100003 };

static void check_set(attn_kernels kernels, const char *name) {
    attn_ctx *one = ctx_for(kernels, 1), *three = ctx_for(kernels, 3);
    CHECK(one && three);
    if (!one || !three) return;
    float *x = malloc(N * sizeof *x), *dy = malloc(N * sizeof *dy);
    float *y = malloc(N * sizeof *y), *want = malloc(N * sizeof *want);
    float *dx = malloc(N * sizeof *dx), *dx_want = malloc(N * sizeof *dx_want);
    float *y3 = malloc(N * sizeof *y3), *dx3 = malloc(N * sizeof *dx3);
    float *dx0 = malloc(N * sizeof *dx0);
    attn_workers serial = {1, NULL};
    static const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-8f, 0.0784f, -0.0784f,
                                    0.0785f, 20.0f, -20.0f, 1e30f, -1e30f, INFINITY,
                                    -INFINITY, NAN};
    size_t ns = sizeof special / sizeof special[0];
    for (size_t i = 0; i < N; i++) {
        double r = uniform();
        /* a third near 0 (|u| about the switch at 1/16: |x| near 0.078), the rest to 8 */
        x[i] = i < ns ? special[i] : (float)(i % 3 == 0 ? (r - 0.5) * 0.4 : (r - 0.5) * 16.0);
        dy[i] = (float)(uniform() * 2.0 - 1.0);
        dx[i] = dx_want[i] = dx3[i] = dx0[i] = (float)(uniform() - 0.5);
    }
    bool ran = attn_k_gelu_tanh(one, x, y, N);
    if (kernels == ATTN_KERNELS_REFERENCE) {
        CHECK(!ran);
        CHECK(!attn_k_gelu_tanh_backward(one, x, dy, dx, N));
    } else if (ran) {
        attn_layer_gelu_tanh_forward(serial, want, x, N);
        CHECK(attn_k_gelu_tanh_backward(one, x, dy, dx, N));
        attn_layer_gelu_tanh_backward(serial, dx_want, x, dy, N);
        size_t off_y = 0, off_dx = 0, layer_off_y = 0, layer_off_dx = 0, special_off = 0;
        uint32_t worst_y = 0, worst_dx = 0;
        for (size_t i = 0; i < N; i++) {
            if (i < ns) { /* as the scalar layer gives them */
                bool same = ulps(y[i], want[i]) == 0 && ulps(dx[i], dx_want[i]) == 0 &&
                            signbit(y[i]) == signbit(want[i]);
                if (!same)
                    fprintf(stderr, "%s: x = %g: y %.9g want %.9g, dx %.9g want %.9g\n", name,
                            (double)x[i], (double)y[i], (double)want[i], (double)dx[i],
                            (double)dx_want[i]);
                special_off += !same;
                continue;
            }
            float ly, ldx;
            gelu_long(x[i], dy[i], dx0[i], &ly, &ldx);
            uint32_t uy = ulps(y[i], ly), ud = ulps(dx[i], ldx);
            off_y += uy != 0;
            off_dx += ud != 0;
            layer_off_y += ulps(want[i], ly) != 0;
            layer_off_dx += ulps(dx_want[i], ldx) != 0;
            worst_y = uy > worst_y ? uy : worst_y;
            worst_dx = ud > worst_dx ? ud : worst_dx;
        }
        printf("%s: %zu elements off the long double GELU: y %zu (at most %u ulp; the scalar "
               "layer %zu), dx %zu (at most %u ulp; the layer %zu)\n",
               name, (size_t)N, off_y, worst_y, layer_off_y, off_dx, worst_dx, layer_off_dx);
        CHECK(special_off == 0);
        CHECK(worst_y <= 1 && worst_dx <= 1);
        CHECK(off_y <= layer_off_y && off_dx <= layer_off_dx);
        /* any split: 3 threads, and ranges from every start and length */
        CHECK(attn_k_gelu_tanh(three, x, y3, N));
        CHECK(!memcmp(y, y3, N * sizeof *y));
        CHECK(attn_k_gelu_tanh_backward(three, x, dy, dx3, N));
        CHECK(!memcmp(dx, dx3, N * sizeof *dx));
        bool same = true;
        for (size_t start = 0; start < 9; start++)
            for (size_t len = 0; len < 13; len++) {
                float part[16];
                attn_k_gelu_tanh(one, x + 100 + start, part, len);
                same &= !len || !memcmp(part, y + 100 + start, len * sizeof *part);
            }
        CHECK(same);
    }
    free(x);
    free(dy);
    free(y);
    free(want);
    free(dx);
    free(dx_want);
    free(y3);
    free(dx3);
    free(dx0);
    attn_ctx_free(one);
    attn_ctx_free(three);
}

/* logsumexp(z) - z[target] in long double, and in *size the magnitude of
 * its terms (the loss is their difference, so its error is relative to
 * them). */
static long double loss_long(const float *z, size_t V, int32_t target, long double *size) {
    long double max = -INFINITY, sum = 0.0L;
    for (size_t v = 0; v < V; v++) max = z[v] > max ? z[v] : max;
    for (size_t v = 0; v < V; v++) sum += expl((long double)z[v] - max);
    *size = fabsl(max) + logl(sum) + fabsl((long double)z[target]);
    return max + logl(sum) - (long double)z[target];
}

static void check_crossentropy(attn_kernels kernels, const char *name) {
    attn_ctx *ctx = ctx_for(kernels, 1);
    CHECK(ctx != NULL);
    if (!ctx) return;
    attn_crossentropy_row_fn *row = attn_k_crossentropy_row(ctx);
    attn_crossentropy_backward_row_fn *backward = attn_k_crossentropy_backward_row(ctx);
    CHECK((row == NULL) == (backward == NULL));
    if (kernels == ATTN_KERNELS_REFERENCE) CHECK(row == NULL);
    if (!row) {
        attn_ctx_free(ctx);
        return;
    }
    enum { BIG = 50257 };
    float *z = malloc(BIG * sizeof *z), *dz = malloc(BIG * sizeof *dz);
    float *want = malloc(BIG * sizeof *want);
    double worst_loss = 0.0, worst_layer = 0.0;
    uint32_t worst_dz = 0;
    size_t dz_off = 0, dz_count = 0;
    for (size_t V = 1; V <= 71; V++) {
        size_t n = V == 71 ? BIG : V;
        for (int round = 0; round < 8; round++) {
            double spread = round < 4 ? 8.0 : 60.0; /* some rows reach e^-60 below the max */
            for (size_t v = 0; v < n; v++) {
                z[v] = (float)((uniform() - 0.5) * spread);
                dz[v] = want[v] = (float)(uniform() - 0.5);
            }
            int32_t target = (int32_t)(uniform() * (double)n) % (int32_t)n;
            double loss = row(z, n, target);
            long double size, exact = loss_long(z, n, target, &size);
            double err = (double)(fabsl((long double)loss - exact) / size);
            worst_loss = err > worst_loss ? err : worst_loss;
            size_t scored = 0;
            double layer = attn_layer_crossentropy_forward((attn_workers){1, NULL}, z, &target, 1,
                                                           n, -100, &scored, NULL);
            err = (double)(fabsl((long double)layer - exact) / size);
            worst_layer = err > worst_layer ? err : worst_layer;
            double scale = 1.0 / (1.0 + (double)round);
            backward(z, n, target, scale, dz);
            attn_layer_crossentropy_backward((attn_workers){1, NULL}, want, z, &target, 1, n, -100,
                                             scale, NULL);
            for (size_t v = 0; v < n; v++) {
                uint32_t u = ulps(dz[v], want[v]);
                worst_dz = u > worst_dz ? u : worst_dz;
                dz_off += u != 0;
            }
            dz_count += n;
        }
    }
    printf("%s: cross-entropy loss at most %.2g of its terms' size from long double (the scalar "
           "layer %.2g); dz %zu of %zu floats off the scalar layer's (at most %u ulp)\n",
           name, worst_loss, worst_layer, dz_off, dz_count, worst_dz);
    /* max + log(sum) - z[target] rounds in the exps, the sum, the log and two
     * subtractions: a few double ulps (2.2e-16 each) of the terms' size, the
     * same budget the scalar layer needs (both reached 2e-15, 9 ulps, over
     * 800 draws; a float step anywhere would be 1e-8). */
    CHECK(worst_loss <= 4e-15);
    CHECK(worst_dz <= 1);
    /* special rows: as the scalar layer gives them (NaN for NaN or inf) */
    static const float rows[][5] = {{1.0f, NAN, 2.0f, 0.0f, 3.0f},
                                    {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
                                    {0.0f, INFINITY, 1.0f, 2.0f, 3.0f},
                                    {0.0f, -INFINITY, -1000.0f, -745.0f, -700.0f},
                                    {88.0f, -88.0f, 87.0f, 1e30f, -1e30f}};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        size_t scored = 0;
        int32_t target = 0;
        double layer = attn_layer_crossentropy_forward((attn_workers){1, NULL}, rows[r], &target,
                                                       1, 5, -100, &scored, NULL);
        double vec = row(rows[r], 5, target);
        bool same = (isnan(layer) && isnan(vec)) || fabs(layer - vec) <= 4e-16 * fabs(layer);
        float d[5] = {0}, dw[5] = {0};
        backward(rows[r], 5, target, 1.0, d);
        attn_layer_crossentropy_backward((attn_workers){1, NULL}, dw, rows[r], &target, 1, 5,
                                         -100, 1.0, NULL);
        for (int v = 0; v < 5; v++) same &= ulps(d[v], dw[v]) == 0;
        if (!same) fprintf(stderr, "%s: special row %zu: loss %.17g, layer's %.17g\n", name, r,
                           vec, layer);
        CHECK(same);
    }
    /* through the layer, 1 and 3 threads */
    enum { ROWS = 300, W = 67 };
    float *logits = malloc(ROWS * W * sizeof *logits), *d1 = calloc(ROWS * W, sizeof *d1);
    float *d3 = calloc(ROWS * W, sizeof *d3);
    int32_t targets[ROWS];
    for (size_t i = 0; i < ROWS * W; i++) logits[i] = (float)((uniform() - 0.5) * 10.0);
    for (size_t n = 0; n < ROWS; n++) targets[n] = n % 5 == 2 ? -100 : (int32_t)(n * 7 % W);
    size_t s1 = 0, s3 = 0;
    attn_ctx *three = ctx_for(kernels, 3);
    CHECK(three != NULL);
    if (three) {
        double l1 = attn_layer_crossentropy_forward(attn_ctx_workers(ctx), logits, targets, ROWS,
                                                    W, -100, &s1, row);
        double l3 = attn_layer_crossentropy_forward(attn_ctx_workers(three), logits, targets, ROWS,
                                                    W, -100, &s3, row);
        CHECK(s1 == s3 && !memcmp(&l1, &l3, sizeof l1));
        attn_layer_crossentropy_backward(attn_ctx_workers(ctx), d1, logits, targets, ROWS, W, -100,
                                         1.0, backward);
        attn_layer_crossentropy_backward(attn_ctx_workers(three), d3, logits, targets, ROWS, W,
                                         -100, 1.0, backward);
        CHECK(!memcmp(d1, d3, ROWS * W * sizeof *d1));
        attn_ctx_free(three);
    }
    free(logits);
    free(d1);
    free(d3);
    free(z);
    free(dz);
    free(want);
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    state = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (argv[1] to repeat)\n", (unsigned long long)state);
    static const struct {
        attn_kernels kernels;
        const char *name;
    } sets[] = {{ATTN_KERNELS_REFERENCE, "reference"},
                {ATTN_KERNELS_PORTABLE, "portable"},
                {ATTN_KERNELS_AVX2, "avx2"},
                {ATTN_KERNELS_AVX512, "avx512"}};
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++)
        if (attn_kernels_supported(sets[s].kernels)) {
            check_set(sets[s].kernels, sets[s].name);
            check_crossentropy(sets[s].kernels, sets[s].name);
        }
    return check_summary();
}
