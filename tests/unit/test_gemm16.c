/*
 * test_gemm16.c — attn_gemm_16 (bf16 and f16 a and b, float c) on every
 * kernel set this CPU runs, against the exact result of its inputs.
 *
 * Inputs are random 16-bit values (never zero, never subnormal: exponents
 * within 2^-6 .. 2^6), so every product is exact in float and the fast
 * kernels round only in their float sums. Checked:
 *
 *   - the error bound. Each of the k products is added to a float
 *     accumulator with one rounding (vdpbf16ps adds a pair's two products
 *     one after the other, each rounded; an FMA likewise), the accumulator
 *     restarts every kc block, and each block's alpha * acc is rounded and
 *     added to c (two more roundings, beta's product on the first). With
 *     u = 2^-24 and mag_ij = |alpha| sum_p |a_ip b_pj| + |beta c_ij|:
 *         |c_ij - exact_ij| <= (k + 2 * blocks + 2) * u * mag_ij * (1 + 1e-6)
 *     (the classical (n u) bound of recursive summation; blocks = ceil(k /
 *     kc)). The reference (double sums, one rounding) is held to
 *     u * |exact| + k * 2^-52 * mag. A bound in the style of bf16's own
 *     precision (k * 2^-8) would hold for any bug short of a lost term:
 *     this one is 2^16 times tighter;
 *   - bit for bit, the fast kernels against a scalar emulation of what they
 *     do (the float kernels: acc = fma(a, b, acc) in ascending k; the bf16
 *     kernel: per pair, the odd element's product first, then the even's,
 *     as Intel's and AMD's manuals give vdpbf16ps), the kc blocks and the
 *     alpha/beta stores included. Not AMX's: within a tile step its sums
 *     match neither the manual's order (even, then odd, each rounded) nor
 *     one rounding per pair or per 32 products, on the Sapphire Rapids
 *     where this was tried; AMX is held to the bound alone;
 *   - every transpose case; m, n, k from 1 to 67 with the tile edges, and
 *     a few large ones (several kc blocks, odd k); alpha and beta; padded
 *     leading dimensions (NaN in a's and b's padding must not be read, c's
 *     padding must stay as it was); beta = 0 on a c of NaN;
 *   - 1, 2 and 3 threads bitwise equal (the large cases run on more than
 *     one thread);
 *   - the vdpbf16ps kernel wherever the CPU has it, and the widened AVX-512
 *     one on bf16, called directly: the ctx takes one of them for bf16 by
 *     the CPU's speed, and the other must not go untested;
 *   - the argument errors, with the values named.
 *
 * Fresh random inputs each run: the seed is printed; pass it as argv[1] to
 * replay.
 */
#define _GNU_SOURCE /* syscall() */
#include "attn.h"
#include "check.h"
#include "cpu_info.h"
#include "kernels/kernel_set.h"
#include "internal.h"
#include "kernels/gemm/gemm16.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static size_t below(uint64_t *s, size_t n) { return (size_t)(splitmix(s) % n); }

/* A random normal value within 2^-6 .. 2^6, either sign. */
static uint16_t random_half(attn_dtype dtype, uint64_t *s) {
    uint16_t sign = (uint16_t)(below(s, 2) << 15);
    if (dtype == ATTN_DTYPE_BF16)
        return (uint16_t)(sign | (121 + below(s, 12)) << 7 | below(s, 128));
    return (uint16_t)(sign | (9 + below(s, 12)) << 10 | below(s, 1024));
}
static uint16_t nan_half(attn_dtype dtype) { return dtype == ATTN_DTYPE_BF16 ? 0x7FC0 : 0x7E00; }
static float to_float(attn_dtype dtype, uint16_t h) { return attn_half_to_float(dtype, h); }

typedef struct case16 {
    attn_dtype dtype;
    bool ta, tb;
    size_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
} case16;

typedef struct operands {
    uint16_t *a, *b;
    float *a_f, *bt_f;   /* op(a) (m, k) and op(b)^T (n, k) as floats: the checks' dots run
                            along rows (converting per product was most of the test's time) */
    float *c0;           /* c before the call */
    double *exact, *mag; /* (m, n) */
} operands;

static size_t a_rows(const case16 *g) { return g->ta ? g->k : g->m; }
static size_t b_rows(const case16 *g) { return g->tb ? g->n : g->k; }
static uint16_t a_at(const case16 *g, const uint16_t *a, size_t i, size_t p) {
    return g->ta ? a[p * g->lda + i] : a[i * g->lda + p];
}
static uint16_t b_at(const case16 *g, const uint16_t *b, size_t p, size_t j) {
    return g->tb ? b[j * g->ldb + p] : b[p * g->ldb + j];
}

/* Random a, b (NaN in their padding) and c (NaN when beta is 0: it must
 * not be read), and the exact result with its magnitude. */
static bool make_operands(const case16 *g, uint64_t *s, operands *o) {
    size_t na = a_rows(g) * g->lda, nb = b_rows(g) * g->ldb, nc = g->m * g->ldc;
    o->a = malloc(na * sizeof *o->a);
    o->b = malloc(nb * sizeof *o->b);
    o->a_f = malloc(g->m * g->k * sizeof *o->a_f);
    o->bt_f = malloc(g->n * g->k * sizeof *o->bt_f);
    o->c0 = malloc(nc * sizeof *o->c0);
    o->exact = malloc(g->m * g->n * sizeof *o->exact);
    o->mag = malloc(g->m * g->n * sizeof *o->mag);
    if (!o->a || !o->b || !o->a_f || !o->bt_f || !o->c0 || !o->exact || !o->mag) return false;
    size_t a_cols = g->ta ? g->m : g->k, b_cols = g->tb ? g->k : g->n;
    for (size_t i = 0; i < na; i++)
        o->a[i] = i % g->lda < a_cols ? random_half(g->dtype, s) : nan_half(g->dtype);
    for (size_t i = 0; i < nb; i++)
        o->b[i] = i % g->ldb < b_cols ? random_half(g->dtype, s) : nan_half(g->dtype);
    for (size_t i = 0; i < nc; i++)
        o->c0[i] = g->beta == 0.0f && i % g->ldc < g->n ? NAN : (float)below(s, 2001) / 500.0f - 2.0f;
    for (size_t p = 0; p < g->k; p++) {
        for (size_t i = 0; i < g->m; i++)
            o->a_f[i * g->k + p] = to_float(g->dtype, a_at(g, o->a, i, p));
        for (size_t j = 0; j < g->n; j++)
            o->bt_f[j * g->k + p] = to_float(g->dtype, b_at(g, o->b, p, j));
    }
    for (size_t i = 0; i < g->m; i++)
        for (size_t j = 0; j < g->n; j++) {
            const float *a_row = o->a_f + i * g->k, *b_row = o->bt_f + j * g->k;
            double sum = 0.0, abs_sum = 0.0;
            for (size_t p = 0; p < g->k; p++) {
                double t = (double)a_row[p] * b_row[p];
                sum += t;
                abs_sum += fabs(t);
            }
            double prior = g->beta == 0.0f ? 0.0 : (double)g->beta * o->c0[i * g->ldc + j];
            o->exact[i * g->n + j] = g->alpha * sum + prior;
            o->mag[i * g->n + j] = fabs(g->alpha) * abs_sum + fabs(prior);
        }
    return true;
}

static void free_operands(operands *o) {
    free(o->a);
    free(o->b);
    free(o->a_f);
    free(o->bt_f);
    free(o->c0);
    free(o->exact);
    free(o->mag);
}

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* The kc blocks gemm16.c takes (its even_block). */
static size_t block_k(const attn_gemm16_kernel *uk, size_t k) {
    size_t blocks = ceil_div(k, uk->kc), kc = ceil_div(ceil_div(k, blocks), uk->k_unit) * uk->k_unit;
    return kc < uk->kc ? kc : uk->kc;
}

/* What kernel set uk computes for element (i, j), step by step in float. */
static float emulate(const attn_gemm16_kernel *uk, const case16 *g, const operands *o, size_t i,
                     size_t j) {
    size_t kc = block_k(uk, g->k);
    const float *a_row = o->a_f + i * g->k, *b_row = o->bt_f + j * g->k;
    float c = o->c0[i * g->ldc + j];
    for (size_t pc = 0; pc < g->k; pc += kc) {
        size_t end = pc + kc < g->k ? pc + kc : g->k;
        float acc = 0.0f;
        /* vdpbf16ps: each pair's odd element first; the float kernels: k
         * ascending */
        size_t step = uk->k_unit == 2 ? 2 : 1;
        for (size_t p = pc; p < end; p += step) {
            if (step == 2 && p + 1 < end) acc = fmaf(a_row[p + 1], b_row[p + 1], acc);
            acc = fmaf(a_row[p], b_row[p], acc);
        }
        float beta = pc == 0 ? g->beta : 1.0f;
        volatile float scaled = g->alpha * acc; /* rounded, as the kernels round it */
        if (beta == 0.0f)
            c = scaled;
        else if (uk->isa == ATTN_KERNELS_PORTABLE) {
            volatile float prior = beta * c; /* the portable kernel: no fma */
            c = prior + scaled;
        } else {
            c = fmaf(beta, c, scaled);
        }
    }
    return c;
}

/* Checks c against the bound, against the emulation of uk (when given)
 * and c's padding; returns the worst error in units of the bound. */
static double check_result(const char *what, const attn_gemm16_kernel *uk, bool reference,
                           const case16 *g, const operands *o, const float *c) {
    const double u = 0x1p-24;
    size_t blocks = uk ? ceil_div(g->k, block_k(uk, g->k)) : 1;
    double worst = 0.0;
    size_t bad = 0, mismatched = 0, padding = 0;
    for (size_t i = 0; i < g->m; i++) {
        for (size_t j = 0; j < g->ldc; j++) {
            float got = c[i * g->ldc + j];
            if (j >= g->n) {
                padding += memcmp(&got, &o->c0[i * g->ldc + j], sizeof got) != 0;
                continue;
            }
            double want = o->exact[i * g->n + j], mag = o->mag[i * g->n + j];
            double bound = reference ? u * fabs(want) + (double)g->k * 0x1p-52 * mag + 1e-300
                                     : (double)(g->k + 2 * blocks + 2) * u * mag * (1 + 1e-6) + 1e-300;
            double err = fabs((double)got - want);
            if (!(err <= bound)) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s: c[%zu][%zu] = %.9g, exact %.9g: error %.3g > bound %.3g\n",
                            what, i, j, got, want, err, bound);
            }
            if (err / bound > worst) worst = err / bound;
            if (uk && uk->k_unit != 32) {
                float emulated = emulate(uk, g, o, i, j);
                if (memcmp(&emulated, &got, sizeof got) != 0 && mismatched++ < 3)
                    fprintf(stderr, "  %s: c[%zu][%zu] = %.9g, emulated %s %.9g\n", what, i, j,
                            got, uk->name, emulated);
            }
        }
    }
    if (bad || mismatched || padding)
        fprintf(stderr,
                "%s %s %c%c m=%zu n=%zu k=%zu lda=%zu ldb=%zu ldc=%zu alpha=%g beta=%g: %zu over "
                "the bound, %zu unlike the emulation, %zu padding values changed\n",
                what, attn_dtype_name(g->dtype), g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', g->m, g->n,
                g->k, g->lda, g->ldb, g->ldc, g->alpha, g->beta, bad, mismatched, padding);
    CHECK(bad == 0);
    CHECK(mismatched == 0);
    CHECK(padding == 0);
    return worst;
}

static case16 make_case(attn_dtype dtype, bool ta, bool tb, size_t m, size_t n, size_t k,
                        uint64_t *s) {
    static const float alphas[] = {1.0f, -0.75f, 2.5f}, betas[] = {0.0f, 1.0f, -0.5f};
    case16 g = {.dtype = dtype, .ta = ta, .tb = tb, .m = m, .n = n, .k = k,
                .alpha = alphas[below(s, 3)], .beta = betas[below(s, 3)]};
    size_t pad = below(s, 2) ? below(s, 5) : 0;
    g.lda = (ta ? m : k) + pad;
    g.ldb = (tb ? k : n) + pad;
    g.ldc = n + pad;
    return g;
}

/* A size hitting the tiles' edges often (1, 13-15, 31-33) or any in 1..67. */
static size_t small_size(uint64_t *s) {
    static const size_t edges[] = {1, 2, 13, 14, 15, 31, 32, 33, 64, 67};
    return below(s, 3) == 0 ? edges[below(s, 10)] : 1 + below(s, 67);
}

/* One case through the public API on ctxs (same kernels; 1, 2, 3
 * threads): the first checked fully, the others bitwise against it. */
/* The 16-bit GEMM a call of dtype takes on isa's kernel set now
 * (kernels/kernel_set.h), NULL for the reference set. */
static const attn_gemm16_kernel *gemm16_of(attn_kernels isa, attn_dtype dtype) {
    attn_kernel_set set;
    attn_kernel_set_fill(isa, &set);
    return attn_kernel_set_gemm16(&set, dtype, attn_cpu_amx_bf16_usable());
}

/* isa's bf16 kernels on vdpbf16ps and AMX tiles, whether they pay or not
 * (NULL where the CPU lacks them). */
static const attn_gemm16_kernel *bgemm_dot_of(attn_kernels isa) {
    attn_kernel_set set;
    attn_kernel_set_fill(isa, &set);
    return set.bgemm_dot;
}

static const attn_gemm16_kernel *bgemm_amx_usable(void) {
    attn_kernel_set set;
    attn_kernel_set_fill(ATTN_KERNELS_AVX512, &set);
    return attn_cpu_amx_bf16_usable() ? set.bgemm_amx : NULL;
}

static double run_case(attn_ctx *const ctxs[3], const case16 *g, uint64_t *s) {
    operands o = {0};
    float *c = NULL, *c_more = NULL;
    double worst = 0.0;
    size_t nc = g->m * g->ldc;
    if (!make_operands(g, s, &o) || !(c = malloc(nc * sizeof *c)) ||
        !(c_more = malloc(nc * sizeof *c_more))) {
        fprintf(stderr, "out of memory\n");
        CHECK(0);
        goto done;
    }
    attn_kernels kernels = attn_ctx_kernels(ctxs[0]);
    const attn_gemm16_kernel *uk = gemm16_of(kernels, g->dtype);
    memcpy(c, o.c0, nc * sizeof *c);
    CHECK_STATUS(attn_gemm_16(ctxs[0], g->dtype, g->ta, g->tb, g->m, g->n, g->k, g->alpha, o.a,
                              g->lda, o.b, g->ldb, g->beta, c, g->ldc),
                 ATTN_OK);
    worst = check_result(uk ? uk->name : "reference", uk, uk == NULL, g, &o, c);
    for (int t = 1; t < 3; t++) {
        memcpy(c_more, o.c0, nc * sizeof *c_more);
        CHECK_STATUS(attn_gemm_16(ctxs[t], g->dtype, g->ta, g->tb, g->m, g->n, g->k, g->alpha,
                                  o.a, g->lda, o.b, g->ldb, g->beta, c_more, g->ldc),
                     ATTN_OK);
        if (memcmp(c, c_more, nc * sizeof *c) != 0) {
            fprintf(stderr, "%s on %d threads differs from 1 thread: m=%zu n=%zu k=%zu\n",
                    attn_kernels_name(kernels), t + 1, g->m, g->n, g->k);
            CHECK(0);
        }
    }
done:
    free(c);
    free(c_more);
    free_operands(&o);
    return worst;
}

static void kernel_set(attn_kernels kernels, attn_dtype dtype, uint64_t *s) {
    attn_ctx *ctxs[3] = {NULL, NULL, NULL};
    for (int t = 0; t < 3; t++) {
        attn_ctx_config cfg = {.num_threads = (size_t)t + 1, .kernels = kernels};
        CHECK_STATUS(attn_ctx_new(&cfg, &ctxs[t]), ATTN_OK);
        if (!ctxs[t]) return;
    }
    const attn_gemm16_kernel *uk = gemm16_of(kernels, dtype);
    double worst = 0.0;
    size_t cases = 0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int r = 0; r < 12; r++, cases++) {
                case16 g = make_case(dtype, ta, tb, small_size(s), small_size(s), small_size(s), s);
                double w = run_case(ctxs, &g, s);
                worst = w > worst ? w : worst;
            }
    /* large: several kc blocks, odd k, more than one thread */
    static const size_t large[][3] = {{150, 290, 1031}, {301, 97, 800}, {40, 333, 2049}};
    for (size_t r = 0; r < 3; r++, cases++) {
        case16 g = make_case(dtype, below(s, 2), below(s, 2), large[r][0], large[r][1],
                             large[r][2], s);
        if (uk) CHECK(attn_gemm16_parts(uk, 2, g.m, g.n, g.k) > 1);
        double w = run_case(ctxs, &g, s);
        worst = w > worst ? w : worst;
    }
    printf("%-9s %-4s %-28s %zu cases, worst error %.3f of the bound\n", attn_kernels_name(kernels),
           attn_dtype_name(dtype), uk ? uk->name : "reference (double sums)", cases, worst);
    for (int t = 0; t < 3; t++) attn_ctx_free(ctxs[t]);
}

/* A kernel set called directly (attn_gemm16_run) on bf16, on 1, 2 and 3
 * threads: the vdpbf16ps kernel wherever the CPU has it (the ctx takes it
 * only where it is the faster), and the widened AVX-512 one, which the ctx
 * takes for bf16 only where the other does not pay. */
static void direct_kernel(const attn_gemm16_kernel *uk, const char *why, uint64_t *s) {
    if (!uk) return;
    size_t cases = 0;
    double worst = 0.0;
    for (int r = 0; r < 20; r++, cases++) {
        /* large: m n k >= 160 * 160 * 700, past two threads' share of work
         * (2 m n k >= 2 * 2^23 flops); from 100 rows, about 1 run in 1300
         * drew a product one thread runs alone (seed 1795674994) */
        bool large = r >= 17;
        case16 g = make_case(ATTN_DTYPE_BF16, below(s, 2), below(s, 2),
                             large ? 160 + below(s, 200) : small_size(s),
                             large ? 160 + below(s, 200) : small_size(s),
                             large ? 700 + below(s, 900) : small_size(s), s);
        operands o = {0};
        size_t nc = g.m * g.ldc;
        float *c[3] = {malloc(nc * sizeof(float)), malloc(nc * sizeof(float)),
                       malloc(nc * sizeof(float))};
        if (make_operands(&g, s, &o) && c[0] && c[1] && c[2]) {
            if (large) CHECK(attn_gemm16_parts(uk, 2, g.m, g.n, g.k) > 1);
            for (size_t t = 0; t < 3; t++) {
                size_t bytes = attn_gemm16_workspace(uk, t + 1, g.m, g.n, g.k);
                void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
                CHECK(ws != NULL);
                if (!ws) continue;
                memcpy(c[t], o.c0, nc * sizeof(float));
                attn_gemm16_run(uk, (attn_workers){t + 1, NULL}, g.dtype, g.ta, g.tb, g.m, g.n,
                                g.k, g.alpha, o.a, g.lda, o.b, g.ldb, g.beta, c[t], g.ldc, ws);
                free(ws);
            }
            double w = check_result(uk->name, uk, false, &g, &o, c[0]);
            worst = w > worst ? w : worst;
            CHECK(memcmp(c[0], c[1], nc * sizeof(float)) == 0);
            CHECK(memcmp(c[0], c[2], nc * sizeof(float)) == 0);
        } else {
            CHECK(0);
        }
        for (size_t t = 0; t < 3; t++) free(c[t]);
        free_operands(&o);
    }
    printf("direct    BF16 %-28s %zu cases, worst error %.3f of the bound (%s)\n", uk->name, cases,
           worst, why);
}

static void errors(void) {
    attn_ctx *ctx;
    CHECK_STATUS(attn_ctx_new(NULL, &ctx), ATTN_OK);
    uint16_t a[12] = {0}, b[12] = {0};
    float c[12] = {0};
    CHECK_STATUS(attn_gemm_16(NULL, ATTN_DTYPE_BF16, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, c, 2),
                 ATTN_ERR_NULL);
    CHECK_STATUS(attn_gemm_16(ctx, ATTN_DTYPE_F32, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, c, 2),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "dtype F32 (0) is not BF16 or F16");
    CHECK_STATUS(attn_gemm_16(ctx, ATTN_DTYPE_BF16, false, false, 2, 2, 2, 1, NULL, 2, b, 2, 0, c, 2),
                 ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "attn_gemm_16: a is NULL");
    CHECK_STATUS(attn_gemm_16(ctx, ATTN_DTYPE_F16, false, false, 2, 2, 2, 1, a, 2, b, 2, 0, NULL, 2),
                 ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "c is NULL");
    CHECK_STATUS(attn_gemm_16(ctx, ATTN_DTYPE_BF16, true, false, 3, 2, 2, 1, a, 2, b, 2, 0, c, 2),
                 ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "lda (2) is less than a's row (3)");
    CHECK_STATUS(attn_gemm_16(ctx, ATTN_DTYPE_BF16, false, true, 2, 2, 3, 1, a, 3, b, 2, 0, c, 2),
                 ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "ldb (2) is less than b's row (3)");
    CHECK_STATUS(attn_gemm_16(ctx, ATTN_DTYPE_BF16, false, false, 2, 4, 2, 1, a, 2, b, 4, 0, c, 3),
                 ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "ldc (3) is less than n (4)");
    CHECK_STATUS(attn_gemm_16(ctx, ATTN_DTYPE_BF16, false, false, 2, 2, (size_t)1 << 62, 1, a,
                              (size_t)1 << 62, b, 2, 0, c, 2),
                 ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "overflow");
    /* m == 0 is nothing to do, even with NULL operands; k == 0 scales c */
    CHECK_STATUS(attn_gemm_16(ctx, ATTN_DTYPE_BF16, false, false, 0, 2, 2, 1, NULL, 2, NULL, 2, 0,
                              NULL, 2),
                 ATTN_OK);
    c[0] = 3.0f, c[1] = -1.0f;
    CHECK_STATUS(attn_gemm_16(ctx, ATTN_DTYPE_F16, false, false, 1, 2, 0, 1, NULL, 1, NULL, 2, 0.5f,
                              c, 2),
                 ATTN_OK);
    CHECK(c[0] == 1.5f && c[1] == -0.5f);
    /* alpha 0 is c = beta c on every kernel set, as attn_gemm's: a NaN or
     * inf in a and b stays out */
    static const attn_kernels sets[] = {ATTN_KERNELS_REFERENCE, ATTN_KERNELS_PORTABLE,
                                        ATTN_KERNELS_AVX2, ATTN_KERNELS_AVX512};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        if (!attn_kernels_supported(sets[i])) continue;
        attn_ctx *kctx;
        attn_ctx_config cfg = {.num_threads = 2, .kernels = sets[i]};
        CHECK_STATUS(attn_ctx_new(&cfg, &kctx), ATTN_OK);
        for (size_t d = 0; d < 2; d++) {
            attn_dtype dtype = d ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
            uint16_t na[6], nb[6];
            for (size_t e = 0; e < 6; e++) na[e] = nan_half(dtype), nb[e] = nan_half(dtype);
            float cz[4] = {3.0f, -1.0f, 0.25f, 8.0f};
            CHECK_STATUS(attn_gemm_16(kctx, dtype, false, false, 2, 2, 3, 0.0f, na, 3, nb, 2,
                                      0.5f, cz, 2),
                         ATTN_OK);
            CHECK(cz[0] == 1.5f && cz[1] == -0.5f && cz[2] == 0.125f && cz[3] == 4.0f);
            float cn[4] = {NAN, NAN, NAN, NAN}; /* beta 0 never reads c */
            CHECK_STATUS(attn_gemm_16(kctx, dtype, true, true, 2, 2, 3, 0.0f, na, 2, nb, 3, 0.0f,
                                      cn, 2),
                         ATTN_OK);
            CHECK(cn[0] == 0.0f && cn[1] == 0.0f && cn[2] == 0.0f && cn[3] == 0.0f);
        }
        attn_ctx_free(kctx);
    }
    attn_ctx_free(ctx);
}

/* Asks Linux for the AMX tile data, as an application that wants attn's
 * AMX kernel does (the library never asks): then the ctx's AVX-512 bf16
 * GEMM runs on AMX where the CPU has it. */
static void request_amx(void) {
#if defined(__linux__) && defined(__x86_64__) && defined(SYS_arch_prctl)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
#endif
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    printf("seed %llu\n", (unsigned long long)seed);
    uint64_t s = seed;
    static const attn_kernels sets[] = {ATTN_KERNELS_REFERENCE, ATTN_KERNELS_PORTABLE,
                                        ATTN_KERNELS_AVX2, ATTN_KERNELS_AVX512};
    static const attn_dtype dtypes[] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
    /* AMX runs only once the process has the permission, then always */
    const attn_gemm16_kernel *avx512_bf16 = attn_kernels_supported(ATTN_KERNELS_AVX512)
                                                ? gemm16_of(ATTN_KERNELS_AVX512, ATTN_DTYPE_BF16)
                                                : NULL;
    bool amx_before = bgemm_amx_usable() != NULL;
    if (avx512_bf16) CHECK(amx_before == (strcmp(avx512_bf16->name, "bgemm_amx_32x32") == 0));
    request_amx();
    const attn_gemm16_kernel *amx = bgemm_amx_usable();
    if (amx) CHECK(gemm16_of(ATTN_KERNELS_AVX512, ATTN_DTYPE_BF16) == amx);
    printf("AMX: %s\n", amx ? (amx_before ? "usable" : "usable once asked for")
                            : "not on this CPU (or refused)");
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        if (attn_kernels_supported(sets[i]))
            for (size_t d = 0; d < 2; d++) kernel_set(sets[i], dtypes[d], &s);
    if (attn_kernels_supported(ATTN_KERNELS_AVX512)) {
        direct_kernel(bgemm_dot_of(ATTN_KERNELS_AVX512), "vdpbf16ps, wherever the CPU has it", &s);
        direct_kernel(gemm16_of(ATTN_KERNELS_AVX512, ATTN_DTYPE_F16),
                      "widened, as where vdpbf16ps does not pay", &s);
    }
    errors();
    return check_summary();
}
