/*
 * test_layers.c — the small model's layers checked by finite differences in
 * double precision.
 *
 * layers_impl.h is instantiated here for double (the library runs the same
 * source as float). For each layer, a random scalar loss
 *   L = sum_i r_i * out_i    (r fixed random weights, so dL/dout = r)
 * is differentiated by the layer's backward and by central differences
 *   (L(x + h) - L(x - h)) / 2h,  h = 1e-5,
 * for every input and parameter element. In double, the differences are
 * good to a few 1e-9 here, so the tolerance (1e-7, relative to the larger of
 * 1 and the gradient) catches any wrong term, factor or index. The float
 * instantiation is then checked against the double one on the same inputs.
 *
 * (The linear layers are the library's kernels, checked by test_backward and
 * fast_vs_reference; the whole model's gradients are checked against
 * autograd by model_vs_torch.)
 *
 * The seed is printed; pass one as argv[1] to replay a run.
 */
#include "check.h"
#include "train/layers.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REAL double
#define LAYER(name) dbl_##name
#define LAYER_API static
#include "train/layers_impl.h"

#define FD_STEP 1e-5
#define FD_TOL 1e-7

/* xorshift64*: test data only. */
static uint64_t rng_state;
static double uniform(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
static double randn(void) {
    double u = uniform(), v = uniform();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}
static void fill_randn(double *x, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * randn();
}
static size_t below(size_t n) { return (size_t)(uniform() * (double)n) % n; }

static double dot(const double *a, const double *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Compares an analytic gradient with central differences of loss() with
 * respect to every element of x; returns the worst relative error. */
typedef double (*loss_fn)(void *state);
static double fd_check(const char *what, double *x, size_t n, const double *analytic,
                       loss_fn loss, void *state) {
    double worst = 0.0;
    int reported = 0;
    for (size_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + FD_STEP;
        double up = loss(state);
        x[i] = saved - FD_STEP;
        double down = loss(state);
        x[i] = saved;
        double numeric = (up - down) / (2.0 * FD_STEP);
        double scale = fmax(1.0, fmax(fabs(numeric), fabs(analytic[i])));
        double err = fabs(numeric - analytic[i]) / scale;
        if (err > worst) worst = err;
        if (err > FD_TOL && reported++ < 5) {
            fprintf(stderr, "%s[%zu]: analytic %.12g, finite difference %.12g\n", what, i,
                    analytic[i], numeric);
        }
    }
    printf("  %-32s %4zu elements, worst relative error %.2e\n", what, n, worst);
    CHECK(worst <= FD_TOL);
    return worst;
}

/* ---- embedding ---- */

typedef struct emb_state {
    size_t B, T, C, V;
    int32_t *tokens;
    double *wte, *wpe, *out, *r;
} emb_state;

static double emb_loss(void *p) {
    emb_state *s = p;
    dbl_embedding_forward(s->out, s->tokens, s->wte, s->wpe, s->B, s->T, s->C);
    return dot(s->out, s->r, s->B * s->T * s->C);
}

/* C above the kernels' 64-column chunk crosses a chunk edge. */
static void test_embedding(size_t C) {
    enum { B = 3, T = 5, V = 6, CONTEXT = 7 }; /* wpe rows past T get no gradient */
    emb_state s = {.B = B, .T = T, .C = C, .V = V};
    int32_t tokens[B * T];
    for (size_t i = 0; i < B * T; i++) tokens[i] = (int32_t)below(V - 1); /* V-1 never used */
    tokens[0] = tokens[7] = tokens[14] = 2;                               /* repeats add up */
    s.tokens = tokens;
    double *wte = calloc(V * C, sizeof *wte), *wpe = calloc(CONTEXT * C, sizeof *wpe);
    double *out = calloc(B * T * C, sizeof *out), *r = calloc(B * T * C, sizeof *r);
    double *dwte = calloc(V * C, sizeof *dwte), *dwpe = calloc(CONTEXT * C, sizeof *dwpe);
    fill_randn(wte, V * C, 1.0);
    fill_randn(wpe, CONTEXT * C, 1.0);
    fill_randn(r, B * T * C, 1.0);
    s.wte = wte, s.wpe = wpe, s.out = out, s.r = r;
    emb_loss(&s);
    dbl_embedding_backward((attn_workers){2, NULL}, dwte, dwpe, r, tokens, B, T, C, V);
    char what[64];
    snprintf(what, sizeof what, "embedding dwte (C %zu)", C);
    fd_check(what, wte, V * C, dwte, emb_loss, &s);
    snprintf(what, sizeof what, "embedding dwpe (C %zu)", C);
    fd_check(what, wpe, CONTEXT * C, dwpe, emb_loss, &s);
    /* the unused token's row and the rows past T stay zero */
    for (size_t c = 0; c < C; c++) CHECK(dwte[(V - 1) * C + c] == 0.0);
    for (size_t i = T * C; i < CONTEXT * C; i++) CHECK(dwpe[i] == 0.0);
    /* without a position table (Llama's): out = wte[tokens], the same dwte */
    double *dwte_alone = calloc(V * C, sizeof *dwte_alone);
    dbl_embedding_forward(out, tokens, wte, NULL, B, T, C);
    for (size_t n = 0; n < B * T; n++)
        for (size_t c = 0; c < C; c++) CHECK(out[n * C + c] == wte[(size_t)tokens[n] * C + c]);
    dbl_embedding_backward((attn_workers){2, NULL}, dwte_alone, NULL, r, tokens, B, T, C, V);
    CHECK(memcmp(dwte_alone, dwte, V * C * sizeof *dwte) == 0);
    free(dwte_alone);
    free(wte), free(wpe), free(out), free(r), free(dwte), free(dwpe);
}

/* ---- LayerNorm ---- */

typedef struct ln_state {
    size_t N, C;
    double *x, *w, *b, *out, *mean, *rstd, *r;
} ln_state;

static double ln_loss(void *p) {
    ln_state *s = p;
    dbl_layernorm_forward((attn_workers){2, NULL}, s->out, s->mean, s->rstd, s->x, s->w, s->b, s->N,
                          s->C, 1e-5);
    return dot(s->out, s->r, s->N * s->C);
}

static void test_layernorm(size_t N, size_t C) {
    double *x = calloc(N * C, sizeof *x), *w = calloc(C, sizeof *w), *b = calloc(C, sizeof *b);
    double *out = calloc(N * C, sizeof *out), *r = calloc(N * C, sizeof *r);
    double *mean = calloc(N, sizeof *mean), *rstd = calloc(N, sizeof *rstd);
    double *dx = calloc(N * C, sizeof *dx), *dw = calloc(C, sizeof *dw), *db = calloc(C, sizeof *db);
    fill_randn(x, N * C, 2.0);
    for (size_t c = 0; c < C; c++) x[c] += 5.0; /* a row far from zero mean */
    fill_randn(w, C, 1.0);
    fill_randn(b, C, 1.0);
    fill_randn(r, N * C, 1.0);
    ln_state s = {N, C, x, w, b, out, mean, rstd, r};
    ln_loss(&s);
    /* the forward against its definition, row by row */
    for (size_t n = 0; n < N; n++) {
        double m = 0.0, v = 0.0;
        for (size_t c = 0; c < C; c++) m += x[n * C + c] / (double)C;
        for (size_t c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m) / (double)C;
        CHECK_NEAR(mean[n], m, 1e-12);
        CHECK_NEAR(rstd[n], 1.0 / sqrt(v + 1e-5), 1e-9);
        CHECK_NEAR(out[n * C + 3], (x[n * C + 3] - m) / sqrt(v + 1e-5) * w[3] + b[3], 1e-12);
    }
    for (size_t i = 0; i < N * C; i++) dx[i] = 0.5; /* the backward adds to what is there */
    dbl_layernorm_backward((attn_workers){2, NULL}, dx, dw, db, r, x, w, mean, rstd, N, C);
    for (size_t i = 0; i < N * C; i++) dx[i] -= 0.5;
    char what[64];
    snprintf(what, sizeof what, "layernorm dinp (C %zu)", C);
    fd_check(what, x, N * C, dx, ln_loss, &s);
    snprintf(what, sizeof what, "layernorm dweight (C %zu)", C);
    fd_check(what, w, C, dw, ln_loss, &s);
    snprintf(what, sizeof what, "layernorm dbias (C %zu)", C);
    fd_check(what, b, C, db, ln_loss, &s);
    free(x), free(w), free(b), free(out), free(r), free(mean), free(rstd), free(dx), free(dw),
        free(db);
}

/* ---- RMSNorm ---- */

typedef struct rms_state {
    size_t N, C;
    double *x, *w, *out, *rstd, *r;
} rms_state;

static double rms_loss(void *p) {
    rms_state *s = p;
    dbl_rmsnorm_forward((attn_workers){2, NULL}, s->out, s->rstd, s->x, s->w, s->N, s->C, 1e-5);
    return dot(s->out, s->r, s->N * s->C);
}

static void test_rmsnorm(size_t N, size_t C) {
    double *x = calloc(N * C, sizeof *x), *w = calloc(C, sizeof *w);
    double *out = calloc(N * C, sizeof *out), *r = calloc(N * C, sizeof *r);
    double *rstd = calloc(N, sizeof *rstd);
    double *dx = calloc(N * C, sizeof *dx), *dw = calloc(C, sizeof *dw);
    fill_randn(x, N * C, 2.0);
    for (size_t c = 0; c < C; c++) x[c] *= 0.05; /* a small row (finite differences stay exact) */
    fill_randn(w, C, 1.0);
    fill_randn(r, N * C, 1.0);
    rms_state s = {N, C, x, w, out, rstd, r};
    rms_loss(&s);
    /* the forward against its definition, row by row */
    for (size_t n = 0; n < N; n++) {
        double ms = 0.0;
        for (size_t c = 0; c < C; c++) ms += x[n * C + c] * x[n * C + c] / (double)C;
        CHECK_NEAR(rstd[n], 1.0 / sqrt(ms + 1e-5), 1e-9);
        CHECK_NEAR(out[n * C + 2], x[n * C + 2] / sqrt(ms + 1e-5) * w[2], 1e-12);
    }
    for (size_t i = 0; i < N * C; i++) dx[i] = 0.25; /* the backward adds to what is there */
    dbl_rmsnorm_backward((attn_workers){2, NULL}, dx, dw, r, x, w, rstd, N, C);
    for (size_t i = 0; i < N * C; i++) dx[i] -= 0.25;
    char what[64];
    snprintf(what, sizeof what, "rmsnorm dinp (C %zu)", C);
    fd_check(what, x, N * C, dx, rms_loss, &s);
    snprintf(what, sizeof what, "rmsnorm dweight (C %zu)", C);
    fd_check(what, w, C, dw, rms_loss, &s);
    free(x), free(w), free(out), free(r), free(rstd), free(dx), free(dw);
}

/* ---- SwiGLU ---- */

typedef struct swiglu_state {
    size_t n;
    double *gate, *up, *out, *r;
} swiglu_state;

static double swiglu_loss(void *p) {
    swiglu_state *s = p;
    dbl_swiglu_forward((attn_workers){2, NULL}, s->out, s->gate, s->up, s->n);
    return dot(s->out, s->r, s->n);
}

static void test_swiglu(void) {
    enum { n = 40 };
    double gate[n], up[n], out[n], r[n], dgate[n] = {0}, dup[n] = {0};
    fill_randn(gate, n, 3.0);
    gate[0] = 0.0;
    gate[1] = -30.0; /* sigmoid ~ 0 */
    gate[2] = 30.0;  /* sigmoid ~ 1 */
    fill_randn(up, n, 1.0);
    fill_randn(r, n, 1.0);
    swiglu_state s = {n, gate, up, out, r};
    swiglu_loss(&s);
    CHECK_NEAR(out[3], gate[3] / (1.0 + exp(-gate[3])) * up[3], 1e-15);
    dbl_swiglu_backward((attn_workers){2, NULL}, dgate, dup, gate, up, r, n);
    fd_check("swiglu dgate", gate, n, dgate, swiglu_loss, &s);
    fd_check("swiglu dup", up, n, dup, swiglu_loss, &s);
}

/* ---- RoPE ---- */

typedef struct rope_state {
    size_t B, T, heads, D;
    const float *cosines, *sines;
    double *x, *out, *r;
} rope_state;

static double rope_loss(void *p) {
    rope_state *s = p;
    dbl_rope_forward(s->out, s->x, s->cosines, s->sines, s->B, s->T, s->heads, s->D);
    return dot(s->out, s->r, s->B * s->T * s->heads * s->D);
}

static void test_rope(void) {
    enum { B = 2, T = 5, CONTEXT = 7, HEADS = 3, D = 8, HALF = D / 2, n = B * T * HEADS * D };
    float cosines[CONTEXT * HALF], sines[CONTEXT * HALF];
    for (size_t t = 0; t < CONTEXT; t++)
        for (size_t i = 0; i < HALF; i++) {
            double angle = (double)t * pow(10000.0, -(double)(2 * i) / D);
            cosines[t * HALF + i] = (float)cos(angle);
            sines[t * HALF + i] = (float)sin(angle);
        }
    double x[n], out[n], r[n], dx[n], inplace[n];
    fill_randn(x, n, 1.0);
    fill_randn(r, n, 1.0);
    rope_state s = {B, T, HEADS, D, cosines, sines, x, out, r};
    rope_loss(&s);
    /* one element against the definition: b 1, t 3, head 2, i 1 and its pair */
    size_t row = ((1 * T + 3) * HEADS + 2) * D;
    double c = cosines[3 * HALF + 1], sn = sines[3 * HALF + 1];
    CHECK_NEAR(out[row + 1], x[row + 1] * c - x[row + 1 + HALF] * sn, 1e-15);
    CHECK_NEAR(out[row + 1 + HALF], x[row + 1 + HALF] * c + x[row + 1] * sn, 1e-15);
    /* position 0 is the identity; in place gives the same */
    size_t at0 = (1 * T * HEADS) * D; /* b 1, t 0, head 0 */
    for (size_t i = 0; i < D; i++) CHECK(out[at0 + i] == x[at0 + i]);
    memcpy(inplace, x, sizeof x);
    dbl_rope_forward(inplace, inplace, cosines, sines, B, T, HEADS, D);
    CHECK(memcmp(inplace, out, sizeof out) == 0);
    for (size_t i = 0; i < n; i++) dx[i] = 0.5; /* the backward adds to what is there */
    dbl_rope_backward(dx, r, cosines, sines, B, T, HEADS, D);
    for (size_t i = 0; i < n; i++) dx[i] -= 0.5;
    fd_check("rope dinp", x, n, dx, rope_loss, &s);
}

/* ---- GELU ---- */

typedef struct gelu_state {
    size_t n;
    double *x, *out, *r;
} gelu_state;

static double gelu_loss(void *p) {
    gelu_state *s = p;
    dbl_gelu_forward((attn_workers){2, NULL}, s->out, s->x, s->n);
    return dot(s->out, s->r, s->n);
}

static void test_gelu(void) {
    enum { n = 40 };
    double x[n], out[n], r[n], dx[n] = {0};
    fill_randn(x, n, 2.5);
    x[0] = 0.0;
    x[1] = -6.0;
    x[2] = 6.0;
    fill_randn(r, n, 1.0);
    gelu_state s = {n, x, out, r};
    gelu_loss(&s);
    /* nn.GELU(): x * Phi(x); Phi(1) = 0.8413447460685429 */
    double one = 1.0, gelu_one;
    dbl_gelu_forward((attn_workers){2, NULL}, &gelu_one, &one, 1);
    CHECK_NEAR(gelu_one, 0.8413447460685429, 1e-15);
    dbl_gelu_backward((attn_workers){2, NULL}, dx, x, r, n);
    fd_check("gelu dinp", x, n, dx, gelu_loss, &s);
}

/* ---- GELU, tanh form (the book's) ---- */

static double gelu_tanh_loss(void *p) {
    gelu_state *s = p;
    dbl_gelu_tanh_forward((attn_workers){2, NULL}, s->out, s->x, s->n);
    return dot(s->out, s->r, s->n);
}

static void test_gelu_tanh(void) {
    enum { n = 40 };
    double x[n], out[n], r[n], dx[n] = {0};
    fill_randn(x, n, 2.5);
    x[0] = 0.0;
    x[1] = -6.0;
    x[2] = 6.0;
    fill_randn(r, n, 1.0);
    gelu_state s = {n, x, out, r};
    /* 0.5 (1 + tanh(sqrt(2 / pi) * 1.044715)) at x = 1 */
    double one = 1.0, gelu_one;
    dbl_gelu_tanh_forward((attn_workers){2, NULL}, &gelu_one, &one, 1);
    CHECK_NEAR(gelu_one, 0.8411919906082768, 1e-15);
    dbl_gelu_tanh_backward((attn_workers){2, NULL}, dx, x, r, n);
    fd_check("gelu_tanh dinp", x, n, dx, gelu_tanh_loss, &s);
}

/* ---- cross-entropy ---- */

typedef struct ce_state {
    size_t N, V;
    double *logits;
    int32_t *targets;
} ce_state;

static double ce_loss(void *p) {
    ce_state *s = p;
    size_t scored;
    return dbl_crossentropy_forward((attn_workers){2, NULL}, s->logits, s->targets, s->N, s->V, -100, &scored, NULL);
}

static void test_crossentropy(void) {
    enum { N = 7, V = 5 };
    double logits[N * V], dlogits[N * V] = {0};
    int32_t targets[N];
    fill_randn(logits, N * V, 3.0);
    for (size_t n = 0; n < N; n++) targets[n] = (int32_t)below(V);
    targets[1] = targets[4] = -100; /* ignored rows */
    ce_state s = {N, V, logits, targets};
    size_t scored;
    double loss = dbl_crossentropy_forward((attn_workers){2, NULL}, logits, targets, N, V, -100, &scored, NULL);
    CHECK(scored == N - 2);
    /* the definition, row by row: -log softmax(z)[t] */
    double want = 0.0;
    for (size_t n = 0; n < N; n++) {
        if (targets[n] < 0) continue;
        double sum = 0.0;
        for (size_t v = 0; v < V; v++) sum += exp(logits[n * V + v]);
        want += -log(exp(logits[n * V + (size_t)targets[n]]) / sum);
    }
    CHECK_NEAR(loss, want / (N - 2), 1e-12);
    dbl_crossentropy_backward((attn_workers){2, NULL}, dlogits, logits, targets, N, V, -100, 1.0, NULL);
    fd_check("cross-entropy dlogits", logits, N * V, dlogits, ce_loss, &s);
    for (size_t v = 0; v < V; v++) CHECK(dlogits[1 * V + v] == 0.0 && dlogits[4 * V + v] == 0.0);
    /* large logits: stable (no overflow in exp) */
    double big[2] = {1000.0, 0.0};
    int32_t t0 = 1;
    CHECK_NEAR(dbl_crossentropy_forward((attn_workers){2, NULL}, big, &t0, 1, 2, -100, &scored, NULL), 1000.0, 1e-9);
    /* every target ignored: 0 / 0 = NaN, as PyTorch; no gradient */
    int32_t ignored[N];
    for (size_t n = 0; n < N; n++) ignored[n] = -100;
    CHECK(isnan(dbl_crossentropy_forward((attn_workers){2, NULL}, logits, ignored, N, V, -100, &scored, NULL)) && scored == 0);
    double dnone[N * V] = {0};
    dbl_crossentropy_backward((attn_workers){2, NULL}, dnone, logits, ignored, N, V, -100, 1.0, NULL);
    for (size_t i = 0; i < N * V; i++) CHECK(dnone[i] == 0.0);
}

/* ---- residual ---- */

static void test_residual(void) {
    double a[3] = {1.0, -2.0, 0.25}, b[3] = {0.5, 2.0, 1e-17}, out[3];
    dbl_residual_forward((attn_workers){2, NULL}, out, a, b, 3);
    CHECK(out[0] == 1.5 && out[1] == 0.0 && out[2] == 0.25 + 1e-17);
}

/* ---- float (the library) against double (above) ---- */

static void to_float(float *dst, const double *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}
static void to_double(double *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
}
static double max_rel_diff(const float *f, const double *d, size_t n) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)f[i] - d[i]) / fmax(1.0, fabs(d[i])));
    return worst;
}

static void test_float_matches_double(void) {
    enum { N = 6, C = 12 };
    float xf[N * C], wf[C], bf[C], outf[N * C], rf[N * C], dxf[N * C] = {0}, dwf[C] = {0},
        dbf[C] = {0};
    double x[N * C], w[C], b[C], out[N * C], r[N * C], dx[N * C] = {0}, dw[C] = {0}, db[C] = {0};
    double mean[N], rstd[N], meand[N], rstdd[N];
    fill_randn(x, N * C, 1.0);
    fill_randn(w, C, 1.0);
    fill_randn(b, C, 1.0);
    fill_randn(r, N * C, 1.0);
    to_float(xf, x, N * C), to_float(wf, w, C), to_float(bf, b, C), to_float(rf, r, N * C);
    to_double(x, xf, N * C), to_double(w, wf, C), to_double(b, bf, C), to_double(r, rf, N * C);
    attn_layer_layernorm_forward((attn_workers){2, NULL}, outf, mean, rstd, xf, wf, bf, N, C, 1e-5);
    dbl_layernorm_forward((attn_workers){2, NULL}, out, meand, rstdd, x, w, b, N, C, 1e-5);
    attn_pool *pool = attn_pool_new(1); /* as a ctx's worker (NULL: threads per loop) */
    attn_layer_layernorm_backward((attn_workers){2, pool}, dxf, dwf, dbf, rf, xf, wf, mean, rstd,
                                  N, C);
    attn_pool_free(pool);
    dbl_layernorm_backward((attn_workers){2, NULL}, dx, dw, db, r, x, w, meand, rstdd, N, C);
    double worst = fmax(max_rel_diff(outf, out, N * C), max_rel_diff(dxf, dx, N * C));
    worst = fmax(worst, fmax(max_rel_diff(dwf, dw, C), max_rel_diff(dbf, db, C)));
    printf("  float vs double, layernorm: worst relative difference %.2e\n", worst);
    CHECK(worst < 1e-6);

    int32_t targets[N] = {0, 3, -100, 11, 5, 7};
    float logitsf[N * C], dlf[N * C] = {0};
    double logits[N * C], dl[N * C] = {0};
    to_float(logitsf, x, N * C);
    to_double(logits, logitsf, N * C);
    size_t scored;
    double lf = attn_layer_crossentropy_forward((attn_workers){2, NULL}, logitsf, targets, N, C, -100, &scored, NULL);
    double ld = dbl_crossentropy_forward((attn_workers){2, NULL}, logits, targets, N, C, -100, &scored, NULL);
    attn_layer_crossentropy_backward((attn_workers){2, NULL}, dlf, logitsf, targets, N, C, -100, 1.0, NULL);
    dbl_crossentropy_backward((attn_workers){2, NULL}, dl, logits, targets, N, C, -100, 1.0, NULL);
    CHECK_NEAR(lf, ld, 1e-12);
    CHECK(max_rel_diff(dlf, dl, N * C) < 1e-7);
}

/* Cross-entropy spread over threads: the same bits for 1 and 3 threads, over
 * more rows than a block, and the loss the rows' plain in-order sum gives. */
static void test_crossentropy_threads(void) {
    enum { N = 600, V = 97 };
    static float logits[N * V], d1[N * V], d3[N * V];
    static int32_t targets[N];
    for (size_t i = 0; i < N * V; i++) logits[i] = (float)(8.0 * uniform() - 4.0);
    for (size_t n = 0; n < N; n++)
        targets[n] = n % 7 == 3 ? -100 : (int32_t)(uniform() * V) % V;
    size_t s1, s3;
    double l1 = attn_layer_crossentropy_forward((attn_workers){1, NULL}, logits, targets, N, V,
                                                -100, &s1, NULL);
    double l3 = attn_layer_crossentropy_forward((attn_workers){3, NULL}, logits, targets, N, V,
                                                -100, &s3, NULL);
    double total = 0.0;
    size_t count = 0;
    for (size_t n = 0; n < N; n++) {
        if (targets[n] == -100) continue;
        const float *z = logits + n * V;
        double max = -INFINITY, sum = 0.0;
        for (size_t v = 0; v < V; v++) max = z[v] > max ? z[v] : max;
        for (size_t v = 0; v < V; v++) sum += exp((double)z[v] - max);
        total += max + log(sum) - (double)z[targets[n]];
        count++;
    }
    CHECK(s1 == count && s3 == count);
    CHECK(memcmp(&l1, &l3, sizeof l1) == 0);
    CHECK(l1 == total / (double)count);
    memset(d1, 0, sizeof d1);
    memset(d3, 0, sizeof d3);
    attn_layer_crossentropy_backward((attn_workers){1, NULL}, d1, logits, targets, N, V, -100, 1.0, NULL);
    attn_layer_crossentropy_backward((attn_workers){3, NULL}, d3, logits, targets, N, V, -100, 1.0, NULL);
    CHECK(memcmp(d1, d3, sizeof d1) == 0);
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    printf("test_layers seed %llu (replay: test_layers %llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    test_embedding(4);
    test_embedding(70);
    test_layernorm(6, 9);
    test_layernorm(3, 70);
    test_rmsnorm(6, 9);
    test_rmsnorm(3, 70);
    test_swiglu();
    test_rope();
    test_gelu();
    test_gelu_tanh();
    test_crossentropy();
    test_crossentropy_threads();
    test_residual();
    test_float_matches_double();
    return check_summary();
}
