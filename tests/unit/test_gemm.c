/*
 * test_gemm.c — the SGEMM of every kernel set this CPU runs (portable,
 * AVX2, AVX-512) against a reference in double, and the four kernel calls
 * the modules make (linear forward and backward, matmul, matmul_tn_acc)
 * fast against the reference kernels.
 *
 *   - every transpose case, alpha and beta (beta = 0 on a C full of NaN,
 *     which must not be read), sizes 1..300 with the edges of every tile,
 *     padded leading dimensions (the padding must stay untouched), k = 0;
 *   - L2 error <= 1e-5 of the L2 size of the terms (the result on absolute
 *     values), against the double-precision result: outputs that cancel to
 *     near zero are held to the rounding their terms allow;
 *   - 1, 2 and 3 threads give bitwise identical results (and the large
 *     cases do run on more than one thread);
 *   - the caller-workspace entry point agrees bitwise with the allocating one;
 *   - with beta = 0, a bias added to every row (attn_k_linear's) gives
 *     bitwise what C preset to the bias rows with beta = 1 gives;
 *   - k taken in super-blocks (the shared operand packed a part at a time)
 *     gives bitwise the result of one pass;
 *   - B stored in bf16 or f16 and widened as it is packed (attn_sgemm_run_b16,
 *     the set's widening pack), or packed in 16 bits for the set's tile that
 *     widens it in registers (its pack_b16 and micro_f16 / micro_bf16),
 *     gives bitwise the SGEMM on B widened first;
 *   - the public attn_gemm on every kernel set, the reference included, and
 *     its errors;
 *   - when the SGEMM cannot get its workspace (address space limited with
 *     setrlimit), the calls fall back to the reference kernels: same result
 *     as the reference, bit for bit, and no crash.
 *
 * Fresh random inputs each run: the seed is printed; pass it as argv[1] to
 * replay.
 */
#define _POSIX_C_SOURCE 200809L /* sysconf */

#include "attn.h"
#include "address_space.h"
#include "check.h"
#include "internal.h"
#include "kernels/dispatch.h"
#include "half.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm16.h"
#include "kernels/kernel_set.h"

#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#if defined(__linux__)
#include <sys/resource.h>
#endif

#define TOLERANCE 1e-5
#define MAX_SIZE 300

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return (double)(splitmix(s) >> 11) / 9007199254740992.0; }
static size_t below(uint64_t *s, size_t n) { return (size_t)(splitmix(s) % n); }

static void fill(float *x, size_t n, uint64_t *s) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(2.0 * uniform(s) - 1.0);
}

/* A size that hits the tile edges of uk often: 1, MR or NR +-1, or random. */
static size_t pick_size(const attn_gemm_kernel *uk, uint64_t *s) {
    size_t edges[] = {1, 2, uk->mr - 1, uk->mr, uk->mr + 1, uk->nr - 1, uk->nr, uk->nr + 1,
                      2 * uk->mr + 1, 3 * uk->nr - 1};
    if (below(s, 3) == 0) return edges[below(s, sizeof edges / sizeof edges[0])];
    return 1 + below(s, MAX_SIZE);
}

/* ||got - want|| / ||magnitude|| over n values (the absolute error when the
 * magnitude is 0); magnitude bounds |want| element by element. */
static double error_vs_magnitude(const float *got, const double *want, const double *magnitude,
                                 size_t n) {
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        err += d * d;
        norm += magnitude[i] * magnitude[i];
    }
    return norm > 0.0 ? sqrt(err / norm) : sqrt(err);
}

typedef struct gemm_case {
    bool trans_a, trans_b;
    size_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
} gemm_case;

/* want (m, n) = alpha op(A) op(B) + beta C in double, and magnitude the same
 * sum over the terms' absolute values. */
static void reference(const gemm_case *g, const float *a, const float *b, const float *c,
                      double *want, double *magnitude) {
    for (size_t i = 0; i < g->m; i++) {
        for (size_t j = 0; j < g->n; j++) {
            double sum = 0.0, abs_sum = 0.0;
            for (size_t p = 0; p < g->k; p++) {
                double x = g->trans_a ? a[p * g->lda + i] : a[i * g->lda + p];
                double y = g->trans_b ? b[j * g->ldb + p] : b[p * g->ldb + j];
                sum += x * y;
                abs_sum += fabs(x * y);
            }
            double prior = g->beta == 0.0f ? 0.0 : (double)g->beta * c[i * g->ldc + j];
            want[i * g->n + j] = g->alpha * sum + prior;
            magnitude[i * g->n + j] = fabs((double)g->alpha) * abs_sum + fabs(prior);
        }
    }
}

/* With beta = 0: C + a bias row, added by the SGEMM (3 threads), against C
 * preset to the bias rows with beta = 1 (1 thread): the same bits, padding
 * kept. */
static bool bias_as_preset(const attn_gemm_kernel *uk, const gemm_case *g, const float *a,
                           const float *b, const float *c0, uint64_t *seed) {
    size_t nc = g->m * g->ldc + 1;
    float *bias = malloc((g->n ? g->n : 1) * sizeof *bias);
    float *fused = malloc(nc * sizeof *fused), *preset = malloc(nc * sizeof *preset);
    fill(bias, g->n, seed);
    memcpy(fused, c0, nc * sizeof *c0);
    memcpy(preset, c0, nc * sizeof *c0);
    for (size_t i = 0; i < g->m; i++) memcpy(preset + i * g->ldc, bias, g->n * sizeof *bias);
    CHECK(attn_sgemm(uk, 3, g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, a, g->lda, b,
                     g->ldb, 0.0f, fused, g->ldc, bias));
    CHECK(attn_sgemm(uk, 1, g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, a, g->lda, b,
                     g->ldb, 1.0f, preset, g->ldc, NULL));
    bool same = memcmp(fused, preset, nc * sizeof *fused) == 0;
    if (!same) fprintf(stderr, "%s: the bias row differs from C preset to it\n", uk->name);
    free(bias);
    free(fused);
    free(preset);
    return same;
}

/* Runs one case on uk with 1, 2 and 3 threads; returns how many threads the
 * largest run used. */
static size_t run_case(const attn_gemm_kernel *uk, const gemm_case *g, uint64_t *seed) {
    size_t a_rows = g->trans_a ? g->k : g->m, b_rows = g->trans_b ? g->n : g->k;
    size_t na = a_rows * g->lda + 1, nb = b_rows * g->ldb + 1, nc = g->m * g->ldc + 1;
    float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c0 = malloc(nc * sizeof *c0);
    float *c[3], *c_ws = malloc(nc * sizeof *c_ws);
    double *want = malloc(g->m * g->n * sizeof *want);
    double *magnitude = malloc(g->m * g->n * sizeof *magnitude);
    float *dense = calloc(g->m * g->n, sizeof *dense);
    fill(a, na, seed);
    fill(b, nb, seed);
    fill(c0, nc, seed);
    if (g->beta == 0.0f) /* never read: NaN must not reach the result */
        for (size_t i = 0; i < g->m; i++)
            for (size_t j = 0; j < g->n; j++) c0[i * g->ldc + j] = NAN;
    reference(g, a, b, c0, want, magnitude);

    size_t most_parts = 1;
    for (int t = 0; t < 3; t++) {
        c[t] = malloc(nc * sizeof *c[t]);
        memcpy(c[t], c0, nc * sizeof *c0);
        size_t threads = (size_t)t + 1;
        size_t parts = attn_sgemm_parts(uk, threads, g->m, g->n, g->k);
        if (parts > most_parts) most_parts = parts;
        CHECK(parts <= threads);
        CHECK(attn_sgemm(uk, threads, g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, a,
                         g->lda, b, g->ldb, g->beta, c[t], g->ldc, NULL));
    }
    for (size_t i = 0; i < g->m; i++)
        memcpy(dense + i * g->n, c[0] + i * g->ldc, g->n * sizeof *dense);
    double err = error_vs_magnitude(dense, want, magnitude, g->m * g->n);
    bool padding_kept = true;
    for (size_t i = 0; i < g->m; i++)
        for (size_t j = g->n; j < g->ldc; j++)
            if (memcmp(&c[0][i * g->ldc + j], &c0[i * g->ldc + j], sizeof(float)) != 0)
                padding_kept = false;
    bool same =
        memcmp(c[0], c[1], nc * sizeof *c0) == 0 && memcmp(c[0], c[2], nc * sizeof *c0) == 0;

    /* The caller-workspace entry point, 2 threads: the caller and a pool worker. */
    memcpy(c_ws, c0, nc * sizeof *c0);
    size_t floats = attn_sgemm_workspace(uk, 2, g->m, g->n, g->k);
    float *ws = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64 + 64);
    attn_pool *pool = attn_pool_new(1); /* as a ctx's workers (NULL: threads per call) */
    attn_sgemm_run(uk, (attn_workers){2, pool}, g->trans_a, g->trans_b, g->m, g->n, g->k,
                   g->alpha, a, g->lda, b, g->ldb, g->beta, c_ws, g->ldc, NULL, ws);
    attn_pool_free(pool);
    bool same_ws = memcmp(c_ws, c[0], nc * sizeof *c0) == 0;
    CHECK(g->beta != 0.0f || bias_as_preset(uk, g, a, b, c0, seed));

    if (!(err <= TOLERANCE) || !padding_kept || !same || !same_ws)
        fprintf(stderr,
                "%s: %c%c m=%zu n=%zu k=%zu lda=%zu ldb=%zu ldc=%zu alpha=%g beta=%g: error %.3g, "
                "padding %s, threads %s, workspace %s\n",
                uk->name, g->trans_a ? 'T' : 'N', g->trans_b ? 'T' : 'N', g->m, g->n, g->k,
                g->lda, g->ldb, g->ldc, (double)g->alpha, (double)g->beta, err,
                padding_kept ? "kept" : "WRITTEN", same ? "identical" : "DIFFER",
                same_ws ? "identical" : "DIFFERS");
    CHECK(err <= TOLERANCE);
    CHECK(padding_kept);
    CHECK(same);
    CHECK(same_ws);
    for (int t = 0; t < 3; t++) free(c[t]);
    free(ws);
    free(a);
    free(b);
    free(c0);
    free(c_ws);
    free(want);
    free(magnitude);
    free(dense);
    return most_parts;
}

static gemm_case make_case(bool ta, bool tb, size_t m, size_t n, size_t k, float alpha,
                           float beta, size_t pad) {
    gemm_case g = {ta, tb, m, n, k, 0, 0, 0, alpha, beta};
    g.lda = (ta ? m : k) + pad;
    g.ldb = (tb ? k : n) + pad;
    g.ldc = n + pad;
    if (g.lda == 0) g.lda = 1;
    if (g.ldb == 0) g.ldb = 1;
    return g;
}

static void gemm_kernel_set(const attn_gemm_kernel *uk, uint64_t *seed) {
    static const float alphas[] = {1.0f, -0.5f, 2.25f};
    static const float betas[] = {0.0f, 1.0f, -0.75f};
    /* Random cases, every transpose case. */
    for (int i = 0; i < 48; i++) {
        bool ta = i & 1, tb = (i >> 1) & 1;
        gemm_case g = make_case(ta, tb, pick_size(uk, seed), pick_size(uk, seed),
                                pick_size(uk, seed), alphas[below(seed, 3)], betas[below(seed, 3)],
                                below(seed, 2) ? below(seed, 7) : 0);
        run_case(uk, &g, seed);
    }
    /* Degenerate sizes. */
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t >> 1;
        run_case(uk, &(gemm_case){ta, tb, 1, 1, 1, 1, 1, 1, 1.0f, 0.0f}, seed);
        run_case(uk, &(gemm_case){ta, tb, 1, 300, 1, ta ? 1 : 1, tb ? 1 : 300, 300, 1.0f, 1.0f},
                 seed);
        gemm_case g = make_case(ta, tb, 300, 1, 300, -0.5f, 1.0f, 3);
        run_case(uk, &g, seed);
    }
    /* k = 0: C = beta C. */
    run_case(uk, &(gemm_case){false, false, 5, 7, 0, 1, 7, 7, 1.0f, -0.75f}, seed);
    run_case(uk, &(gemm_case){false, true, 5, 7, 0, 1, 1, 9, 1.0f, 0.0f}, seed);
    /* Large enough to split over threads: rows (m >= n) and columns. */
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t >> 1;
        gemm_case rows = make_case(ta, tb, 300, 257, 299, 1.0f, t == 3 ? 1.0f : 0.0f, 0);
        gemm_case cols = make_case(ta, tb, 137, 300, 293, 0.5f, -0.75f, 2);
        CHECK(run_case(uk, &rows, seed) >= 3);
        CHECK(run_case(uk, &cols, seed) >= 2);
    }
}

/* The shared operand packed a kc block at a time (small kc, so that small
 * sizes make many blocks): bitwise the result of packing it whole. */
static void super_blocks(const attn_gemm_kernel *uk, uint64_t *seed) {
    attn_gemm_kernel whole = *uk, parts = *uk;
    whole.kc = parts.kc = 16;
    parts.shared_max = 1; /* one kc block per super-block */
    for (int t = 0; t < 4; t++) {
        gemm_case g = make_case(t & 1, t >> 1, 20 + below(seed, 200), 20 + below(seed, 200),
                                100 + below(seed, 200), 1.5f, t == 3 ? 0.0f : 1.0f, below(seed, 3));
        run_case(&parts, &g, seed); /* against double, and 1, 2, 3 threads */
        size_t a_rows = g.trans_a ? g.k : g.m, b_rows = g.trans_b ? g.n : g.k;
        size_t na = a_rows * g.lda, nb = b_rows * g.ldb, nc = g.m * g.ldc;
        float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b);
        float *c1 = malloc(nc * sizeof *c1), *c2 = malloc(nc * sizeof *c2);
        fill(a, na, seed);
        fill(b, nb, seed);
        fill(c1, nc, seed);
        memcpy(c2, c1, nc * sizeof *c1);
        CHECK(attn_sgemm(&whole, 2, g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a, g.lda, b,
                         g.ldb, g.beta, c1, g.ldc, NULL));
        CHECK(attn_sgemm(&parts, 2, g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a, g.lda, b,
                         g.ldb, g.beta, c2, g.ldc, NULL));
        CHECK(memcmp(c1, c2, nc * sizeof *c1) == 0);
        /* and the workspace is bounded by the super-block, not by k */
        CHECK(attn_sgemm_workspace(&parts, 1, g.m, g.n, g.k) <
              attn_sgemm_workspace(&whole, 1, g.m, g.n, g.k));
        free(a);
        free(b);
        free(c1);
        free(c2);
    }
}

/* attn_sgemm_run_b16: B stored in 16 bits, widened by the set's widening
 * pack as it is packed, and where the set has one, packed in 16 bits for
 * its tile that widens B in registers: each gives bitwise what attn_sgemm
 * gives on B widened to float first, for both 16-bit types, every
 * transpose case, the tile edges, a bias or none, 1 and 2 threads, B the
 * shared operand (more rows than columns) over several kc blocks. */
static void b16_operand(const attn_gemm_kernel *uk, const attn_gemm16_kernel *wk,
                        uint64_t *seed) {
    CHECK(wk->nr == uk->nr && wk->mr == uk->mr && wk->packed_bytes == sizeof(float));
    CHECK(!wk->pack_b16 || (wk->micro_f16 && wk->micro_bf16));
    for (int i = 0; i < 32; i++) {
        attn_dtype dtype = i & 4 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
        size_t threads = 1 + (i & 1);
        /* the last 4: B shared (m > n) over several kc blocks */
        size_t m = i < 28 ? pick_size(uk, seed) : 97, n = i < 28 ? pick_size(uk, seed) : 33;
        size_t k = i < 20 ? pick_size(uk, seed) : i < 28 ? 0 : 2 * uk->kc + 1 + below(seed, 300);
        gemm_case g = make_case(i & 1, (i >> 1) & 1, m, n, k, 1.0f, i % 3 ? 0.0f : 1.0f,
                                below(seed, 3));
        size_t a_rows = g.trans_a ? g.k : g.m, b_rows = g.trans_b ? g.n : g.k;
        size_t na = a_rows * g.lda, nb = b_rows * g.ldb, nc = g.m * g.ldc;
        float *a = malloc((na + 1) * sizeof *a), *b = malloc((nb + 1) * sizeof *b);
        float *bias = malloc(g.n * sizeof *bias), *c1 = malloc(nc * sizeof *c1);
        float *c2 = malloc(nc * sizeof *c2);
        uint16_t *b16 = malloc((nb + 1) * sizeof *b16);
        fill(a, na, seed);
        fill(bias, g.n, seed);
        fill(c1, nc, seed);
        memcpy(c2, c1, nc * sizeof *c1);
        for (size_t e = 0; e < nb; e++) {
            b16[e] = attn_float_to_half(dtype, (float)(4.0 * uniform(seed) - 2.0));
            b[e] = attn_half_to_float(dtype, b16[e]);
        }
        const float *with_bias = i % 4 == 3 ? bias : NULL;
        CHECK(attn_sgemm(uk, threads, g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a, g.lda, b,
                         g.ldb, g.beta, c1, g.ldc, with_bias));
        size_t floats = attn_sgemm_workspace(uk, threads, g.m, g.n, g.k);
        float *ws = attn_aligned_alloc(64, (floats + 16) * sizeof *ws);
        float *c0 = malloc(nc * sizeof *c0);
        CHECK(ws != NULL && c0 != NULL);
        memcpy(c0, c2, nc * sizeof *c0);
        /* widened as packed; then, where the set has them, 16-bit panels */
        for (int path = 0; ws && c0 && path < (wk->pack_b16 ? 2 : 1); path++) {
            attn_sgemm_micro_b16_fn *tile16 =
                path == 0 ? NULL : dtype == ATTN_DTYPE_BF16 ? wk->micro_bf16 : wk->micro_f16;
            memcpy(c2, c0, nc * sizeof *c2);
            attn_sgemm_run_b16(uk, path ? wk->pack_b16 : wk->pack_b, tile16, dtype,
                               (attn_workers){threads, NULL}, g.trans_a, g.trans_b, g.m, g.n, g.k,
                               g.alpha, a, g.lda, b16, g.ldb, g.beta, c2, g.ldc, with_bias, ws);
            if (memcmp(c1, c2, nc * sizeof *c1) != 0)
                fprintf(stderr, "b16_operand %s: case %d (%s, %s B, m %zu n %zu k %zu) differs\n",
                        uk->name, i, attn_dtype_name(dtype), path ? "16-bit" : "widened", g.m, g.n,
                        g.k);
            CHECK(memcmp(c1, c2, nc * sizeof *c1) == 0);
        }
        free(c0);
        attn_free(ws);
        free(a);
        free(b);
        free(b16);
        free(bias);
        free(c1);
        free(c2);
    }
}

/* ---- the kernel calls the modules make ----------------------------------- */

typedef struct call_sizes {
    size_t rows, in, out;
} call_sizes;

/* Outputs of one run of the four calls: y, dx, dw, db, mm, mm_acc, tn. */
typedef struct call_outputs {
    float *y, *y_nobias, *dx, *dx_acc, *dw, *db, *mm, *mm_t, *mm_acc, *tn;
} call_outputs;

typedef struct call_inputs {
    call_sizes s;
    float *x, *w, *bias, *dy, *dx0, *dw0, *db0, *wt, *c0, *tn0;
} call_inputs;

static float *copy_of(const float *src, size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    memcpy(p, src, n * sizeof *p);
    return p;
}

static void run_calls(attn_ctx *ctx, const call_inputs *in, call_outputs *o) {
    size_t r = in->s.rows, i = in->s.in, n = in->s.out;
    o->y = malloc(r * n * sizeof *o->y);
    o->y_nobias = malloc(r * n * sizeof *o->y);
    attn_k_linear(ctx, in->x, in->w, in->bias, o->y, r, i, n);
    attn_k_linear(ctx, in->x, in->w, NULL, o->y_nobias, r, i, n);
    /* backward, dx written; then dx accumulated, no bias */
    o->dx = malloc(r * i * sizeof *o->dx);
    o->dw = copy_of(in->dw0, n * i);
    o->db = copy_of(in->db0, n);
    attn_k_linear_backward(ctx, in->x, in->w, in->dy, o->dx, false, o->dw, o->db, r, i, n);
    o->dx_acc = copy_of(in->dx0, r * i);
    attn_k_linear_backward(ctx, in->x, in->w, in->dy, o->dx_acc, true, o->dw, NULL, r, i, n);
    attn_k_linear_backward(ctx, in->x, in->w, in->dy, NULL, false, o->dw, o->db, r, i, n);
    /* matmul: x (r, i) @ wt (i, n); x @ w^T; accumulate */
    o->mm = malloc(r * n * sizeof *o->mm);
    o->mm_t = malloc(r * n * sizeof *o->mm_t);
    attn_k_matmul(ctx, in->x, in->wt, o->mm, r, i, n, false, false);
    attn_k_matmul(ctx, in->x, in->w, o->mm_t, r, i, n, true, false);
    o->mm_acc = copy_of(in->c0, r * n);
    attn_k_matmul(ctx, in->x, in->wt, o->mm_acc, r, i, n, false, true);
    attn_k_matmul(ctx, in->x, in->w, o->mm_acc, r, i, n, true, true);
    /* tn: (i, n) += x^T (i x r) @ dy (r, n) */
    o->tn = copy_of(in->tn0, i * n);
    attn_k_matmul_tn_acc(ctx, in->x, in->dy, o->tn, r, i, n);
}

static void free_outputs(call_outputs *o) {
    float **all[] = {&o->y, &o->y_nobias, &o->dx, &o->dx_acc, &o->dw, &o->db, &o->mm, &o->mm_t,
                     &o->mm_acc, &o->tn};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(*all[i]);
}

/* Compares fast outputs with the reference's (float, widened to double).
 * abs_ref holds the reference's outputs on the inputs' absolute values: a
 * bound on the terms' size, so that outputs that cancel to near zero (a 1x1
 * linear with x w close to -b) are judged by the rounding their terms allow. */
static void compare_calls(const char *label, const call_sizes *s, const call_outputs *fast,
                          const call_outputs *ref, const call_outputs *abs_ref) {
    size_t r = s->rows, i = s->in, n = s->out;
    const struct {
        const char *name;
        const float *got, *want, *magnitude;
        size_t count;
    } outputs[] = {
        {"linear y", fast->y, ref->y, abs_ref->y, r * n},
        {"linear y (no bias)", fast->y_nobias, ref->y_nobias, abs_ref->y_nobias, r * n},
        {"linear dx", fast->dx, ref->dx, abs_ref->dx, r * i},
        {"linear dx (accumulated)", fast->dx_acc, ref->dx_acc, abs_ref->dx_acc, r * i},
        {"linear dw", fast->dw, ref->dw, abs_ref->dw, n * i},
        {"linear dbias", fast->db, ref->db, abs_ref->db, n},
        {"matmul", fast->mm, ref->mm, abs_ref->mm, r * n},
        {"matmul (b transposed)", fast->mm_t, ref->mm_t, abs_ref->mm_t, r * n},
        {"matmul (accumulated)", fast->mm_acc, ref->mm_acc, abs_ref->mm_acc, r * n},
        {"matmul_tn_acc", fast->tn, ref->tn, abs_ref->tn, i * n},
    };
    for (size_t k = 0; k < sizeof outputs / sizeof outputs[0]; k++) {
        size_t count = outputs[k].count;
        double *want = malloc((count ? count : 1) * sizeof *want);
        double *magnitude = malloc((count ? count : 1) * sizeof *magnitude);
        for (size_t e = 0; e < count; e++) {
            want[e] = outputs[k].want[e];
            magnitude[e] = outputs[k].magnitude[e];
        }
        double err = error_vs_magnitude(outputs[k].got, want, magnitude, count);
        if (!(err <= TOLERANCE))
            fprintf(stderr, "%s %s (rows %zu, in %zu, out %zu): L2 error / L2 magnitude %.3g\n",
                    label, outputs[k].name, r, i, n, err);
        CHECK(err <= TOLERANCE);
        free(want);
        free(magnitude);
    }
}

static bool same_outputs(const call_sizes *s, const call_outputs *a, const call_outputs *b) {
    size_t r = s->rows, i = s->in, n = s->out;
    return memcmp(a->y, b->y, r * n * sizeof(float)) == 0 &&
           memcmp(a->y_nobias, b->y_nobias, r * n * sizeof(float)) == 0 &&
           memcmp(a->dx, b->dx, r * i * sizeof(float)) == 0 &&
           memcmp(a->dx_acc, b->dx_acc, r * i * sizeof(float)) == 0 &&
           memcmp(a->dw, b->dw, n * i * sizeof(float)) == 0 &&
           memcmp(a->db, b->db, n * sizeof(float)) == 0 &&
           memcmp(a->mm, b->mm, r * n * sizeof(float)) == 0 &&
           memcmp(a->mm_t, b->mm_t, r * n * sizeof(float)) == 0 &&
           memcmp(a->mm_acc, b->mm_acc, r * n * sizeof(float)) == 0 &&
           memcmp(a->tn, b->tn, i * n * sizeof(float)) == 0;
}

static void kernel_calls(attn_kernels kernels, call_sizes s, uint64_t *seed) {
    call_inputs in = {.s = s};
    size_t r = s.rows, i = s.in, n = s.out;
    float **bufs[] = {&in.x, &in.w, &in.bias, &in.dy, &in.dx0, &in.dw0, &in.db0, &in.wt, &in.c0,
                      &in.tn0};
    size_t counts[] = {r * i, n * i, n, r * n, r * i, n * i, n, i * n, r * n, i * n};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) {
        *bufs[k] = malloc(counts[k] * sizeof(float));
        fill(*bufs[k], counts[k], seed);
    }
    attn_ctx *ref_ctx;
    attn_ctx_new(&(attn_ctx_config){.num_threads = 2, .kernels = ATTN_KERNELS_REFERENCE}, &ref_ctx);
    call_outputs ref, abs_ref, fast[3];
    run_calls(ref_ctx, &in, &ref);
    call_inputs abs_in = {.s = s};
    float **abs_bufs[] = {&abs_in.x, &abs_in.w, &abs_in.bias, &abs_in.dy, &abs_in.dx0,
                          &abs_in.dw0, &abs_in.db0, &abs_in.wt, &abs_in.c0, &abs_in.tn0};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) {
        *abs_bufs[k] = malloc(counts[k] * sizeof(float));
        for (size_t e = 0; e < counts[k]; e++) (*abs_bufs[k])[e] = fabsf((*bufs[k])[e]);
    }
    run_calls(ref_ctx, &abs_in, &abs_ref);
    for (int t = 0; t < 3; t++) {
        attn_ctx *ctx;
        CHECK_STATUS(attn_ctx_new(&(attn_ctx_config){.num_threads = (size_t)t + 1,
                                                     .kernels = kernels},
                                  &ctx),
                     ATTN_OK);
        run_calls(ctx, &in, &fast[t]);
        attn_ctx_free(ctx);
    }
    compare_calls(attn_kernels_name(kernels), &s, &fast[0], &ref, &abs_ref);
    bool same = same_outputs(&s, &fast[0], &fast[1]) && same_outputs(&s, &fast[0], &fast[2]);
    if (!same)
        fprintf(stderr, "%s (rows %zu, in %zu, out %zu): 1, 2, 3 threads differ\n",
                attn_kernels_name(kernels), r, i, n);
    CHECK(same);
    free_outputs(&ref);
    free_outputs(&abs_ref);
    for (int t = 0; t < 3; t++) free_outputs(&fast[t]);
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) {
        free(*bufs[k]);
        free(*abs_bufs[k]);
    }
    attn_ctx_free(ref_ctx);
}

/* ---- allocation failure --------------------------------------------------- */

/* Run first, on a fresh heap: the workspace (about in x out floats) must be
 * new address space, which the limit refuses. */
static void allocation_failure(attn_kernels kernels, uint64_t *seed) {
#if defined(__linux__) && !defined(UNDER_ASAN)
    enum { ROWS = 300, IN = 1024, OUT = 2048 };
    float *x = malloc(sizeof(float) * ROWS * IN), *w = malloc(sizeof(float) * OUT * IN);
    float *bias = malloc(sizeof(float) * OUT), *y = malloc(sizeof(float) * ROWS * OUT);
    float *want = malloc(sizeof(float) * ROWS * OUT);
    fill(x, (size_t)ROWS * IN, seed);
    fill(w, (size_t)OUT * IN, seed);
    fill(bias, OUT, seed);
    attn_ctx *fast, *ref;
    attn_ctx_new(&(attn_ctx_config){.num_threads = 2, .kernels = kernels}, &fast);
    attn_ctx_new(&(attn_ctx_config){.num_threads = 2, .kernels = ATTN_KERNELS_REFERENCE}, &ref);
    attn_k_linear(ref, x, w, bias, want, ROWS, IN, OUT);
    struct rlimit old, tight;
    size_t now = mapped_bytes();
    if (now == 0 || getrlimit(RLIMIT_AS, &old) != 0) {
        printf("allocation failure: cannot limit address space here, skipped\n");
    } else {
        tight = old;
        tight.rlim_cur = (rlim_t)(now + ((size_t)1 << 20)); /* 1 MiB more: less than 8 MiB asked */
        if (setrlimit(RLIMIT_AS, &tight) == 0) {
            attn_k_linear(fast, x, w, bias, y, ROWS, IN, OUT);
            setrlimit(RLIMIT_AS, &old);
            /* the SGEMM got no workspace, so the reference computed y */
            CHECK(fast->scratch.data == NULL);
            CHECK(memcmp(y, want, sizeof(float) * ROWS * OUT) == 0);
            /* with memory back, the same ctx runs the SGEMM */
            attn_k_linear(fast, x, w, bias, y, ROWS, IN, OUT);
            CHECK(fast->scratch.data != NULL);
            double *wide = malloc(sizeof(double) * ROWS * OUT);
            for (size_t i = 0; i < (size_t)ROWS * OUT; i++) wide[i] = want[i];
            CHECK(error_vs_magnitude(y, wide, wide, (size_t)ROWS * OUT) <= TOLERANCE);
            free(wide);
        } else {
            printf("allocation failure: setrlimit refused, skipped\n");
        }
    }
    attn_ctx_free(fast);
    attn_ctx_free(ref);
    free(x);
    free(w);
    free(bias);
    free(y);
    free(want);
#else
    (void)kernels;
    (void)seed;
    printf("allocation failure: not tested in this build\n");
#endif
}

/* ---- the public attn_gemm ------------------------------------------------ */

static void public_gemm(attn_kernels kernels, uint64_t *seed) {
    attn_ctx *ctx;
    CHECK_STATUS(attn_ctx_new(&(attn_ctx_config){.num_threads = 2, .kernels = kernels}, &ctx),
                 ATTN_OK);
    for (int t = 0; t < 8; t++) {
        gemm_case g = make_case(t & 1, (t >> 1) & 1, 1 + below(seed, 120), 1 + below(seed, 120),
                                1 + below(seed, 120), t < 4 ? 1.0f : -1.25f,
                                t & 4 ? 0.5f : 0.0f, below(seed, 4));
        size_t na = (g.trans_a ? g.k : g.m) * g.lda, nb = (g.trans_b ? g.n : g.k) * g.ldb;
        size_t nc = g.m * g.ldc;
        float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c);
        float *c0 = malloc(nc * sizeof *c0), *dense = malloc(g.m * g.n * sizeof *dense);
        double *want = malloc(g.m * g.n * sizeof *want);
        double *magnitude = malloc(g.m * g.n * sizeof *magnitude);
        fill(a, na, seed);
        fill(b, nb, seed);
        fill(c0, nc, seed);
        memcpy(c, c0, nc * sizeof *c);
        reference(&g, a, b, c0, want, magnitude);
        CHECK_STATUS(attn_gemm(ctx, g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a, g.lda, b,
                               g.ldb, g.beta, c, g.ldc),
                     ATTN_OK);
        for (size_t i = 0; i < g.m; i++) memcpy(dense + i * g.n, c + i * g.ldc, g.n * sizeof *c);
        double err = error_vs_magnitude(dense, want, magnitude, g.m * g.n);
        /* the reference sums in double and rounds once */
        double tolerance = kernels == ATTN_KERNELS_REFERENCE ? 1e-7 : TOLERANCE;
        if (!(err <= tolerance))
            fprintf(stderr, "attn_gemm %s: m=%zu n=%zu k=%zu: error %.3g\n",
                    attn_kernels_name(kernels), g.m, g.n, g.k, err);
        CHECK(err <= tolerance);
        free(a);
        free(b);
        free(c);
        free(c0);
        free(dense);
        free(want);
        free(magnitude);
    }
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1}, c[4] = {NAN, NAN, NAN, NAN};
    /* (2, 3) @ (3, 2) */
    CHECK_STATUS(attn_gemm(ctx, false, false, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2), ATTN_OK);
    CHECK(c[0] == 4.0f && c[1] == 5.0f && c[2] == 10.0f && c[3] == 11.0f);
    /* k = 0: a and b unread, c = beta c */
    CHECK_STATUS(attn_gemm(ctx, false, false, 2, 2, 0, 1.0f, NULL, 0, NULL, 0, 0.5f, c, 2),
                 ATTN_OK);
    CHECK(c[0] == 2.0f && c[3] == 5.5f);
    /* alpha = 0: a and b unread, as BLAS's (their NaN stays out), c = beta c */
    float nan_a[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
    CHECK_STATUS(attn_gemm(ctx, false, false, 2, 2, 3, 0.0f, nan_a, 3, b, 2, 2.0f, c, 2),
                 ATTN_OK);
    CHECK(c[0] == 4.0f && c[1] == 5.0f && c[2] == 10.0f && c[3] == 11.0f);
    c[1] = NAN;
    CHECK_STATUS(attn_gemm(ctx, true, true, 2, 2, 3, 0.0f, nan_a, 2, nan_a, 3, 0.0f, c, 2),
                 ATTN_OK);
    CHECK(c[0] == 0.0f && c[1] == 0.0f && c[2] == 0.0f && c[3] == 0.0f);
    CHECK_STATUS(attn_gemm(NULL, false, false, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2),
                 ATTN_ERR_NULL);
    CHECK_STATUS(attn_gemm(ctx, false, false, 2, 2, 3, 1.0f, NULL, 3, b, 2, 0.0f, c, 2),
                 ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "a is NULL");
    CHECK_STATUS(attn_gemm(ctx, false, false, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, NULL, 2),
                 ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "c is NULL");
    CHECK_STATUS(attn_gemm(ctx, true, false, 2, 2, 3, 1.0f, a, 1, b, 2, 0.0f, c, 2),
                 ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "lda (1) is less than a's row (2)");
    CHECK_STATUS(attn_gemm(ctx, false, true, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2),
                 ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "ldb (2) is less than b's row (3)");
    CHECK_STATUS(attn_gemm(ctx, false, false, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 1),
                 ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "ldc (1) is less than n (2)");
    CHECK_STATUS(attn_gemm(ctx, false, false, 2, 2, 3, 1.0f, a, (size_t)-1 / 2, b, 2, 0.0f, c, 2),
                 ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "overflow");
    CHECK_STATUS(attn_gemm(ctx, false, false, 0, 2, 3, 1.0f, NULL, 3, NULL, 2, 0.0f, NULL, 2),
                 ATTN_OK);
    attn_ctx_free(ctx);
}

/* The SGEMM of isa's kernel set (kernels/kernel_set.h), NULL for the
 * reference set. */
static const attn_gemm_kernel *gemm_of(attn_kernels isa) {
    attn_kernel_set set;
    attn_kernel_set_fill(isa, &set);
    return set.gemm;
}

int main(int argc, char **argv) {
    struct timespec now;
    timespec_get(&now, TIME_UTC);
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10)
                             : (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    printf("seed %llu\n", (unsigned long long)seed);
    allocation_failure(ATTN_KERNELS_PORTABLE, &seed);
    const attn_kernels sets[] = {ATTN_KERNELS_PORTABLE, ATTN_KERNELS_AVX2, ATTN_KERNELS_AVX512};
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        if (!attn_kernels_supported(sets[s])) {
            printf("%s: not supported here, skipped\n", attn_kernels_name(sets[s]));
            continue;
        }
        const attn_gemm_kernel *uk = gemm_of(sets[s]);
        CHECK(uk != NULL);
        if (!uk) continue;
        CHECK(uk->isa == sets[s]);
        int before = check_failed;
        gemm_kernel_set(uk, &seed);
        super_blocks(uk, &seed);
        attn_kernel_set set;
        attn_kernel_set_fill(sets[s], &set);
        b16_operand(uk, set.gemm16, &seed);
        for (int c = 0; c < 6; c++) {
            call_sizes sizes = {1 + below(&seed, 150), 1 + below(&seed, 150),
                                1 + below(&seed, 150)};
            kernel_calls(sets[s], sizes, &seed);
        }
        kernel_calls(sets[s], (call_sizes){1, 1, 1}, &seed);
        kernel_calls(sets[s], (call_sizes){256, 200, 300}, &seed); /* splits over threads */
        printf("%s (%s): %s\n", attn_kernels_name(sets[s]), uk->name,
               check_failed == before ? "ok" : "FAILED");
    }
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++)
        if (attn_kernels_supported(sets[s])) public_gemm(sets[s], &seed);
    public_gemm(ATTN_KERNELS_REFERENCE, &seed);
    CHECK(gemm_of(ATTN_KERNELS_REFERENCE) == NULL);
    CHECK(gemm_of(ATTN_KERNELS_AUTO) == NULL);
    return check_summary();
}
