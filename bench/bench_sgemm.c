/*
 * bench_sgemm.c — the sgemm section of attn-bench: attn_gemm on each
 * kernel set asked for, and OpenBLAS's cblas_sgemm on the same inputs,
 * runs interleaved so that both see the same machine load.
 *
 * Shapes: 2048^3 (NN), and for rows = B*T = 1024 and 4096 the GPT-2-small
 * projections, forward and backward, in the transpose cases the modules
 * use (nn.Linear weights are (out, in)):
 *   fwd  y = x W^T          NT  (rows, 768) x (out, 768)^T, out = 2304 (c_attn) or 768
 *   dx   dx = dy W          NN  (rows, out) x (out, 768)
 *   dW   dW = dy^T x        TN  (rows, out)^T x (rows, 768)
 * GFLOP/s counts 2mnk; ratio is ours / OpenBLAS in GFLOP/s (>= 0.90 is the
 * target); diff is the relative L2 distance between the two results.
 *
 * Then the bf16 GEMM (attn_gemm_16) on the same shapes, against our SGEMM on
 * the same values (the bf16 inputs widened) and OpenBLAS's cblas_sbgemm
 * where the loaded OpenBLAS exports it (built with BUILD_BFLOAT16), all in
 * the same run: speedup is bf16 / SGEMM in GFLOP/s. Where the CPU has AMX,
 * the table runs again after asking Linux for it (the library uses AMX
 * only in a process that has asked).
 */
#define _GNU_SOURCE /* syscall() */
#include "bench.h"
#include "cli.h"
/* the library's one float <-> bf16 conversion (header-only, no internals) */
#include "../src/core/half.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif
#include <stdlib.h>
#include <string.h>

#define TARGET_RATIO 0.90

typedef struct sgemm_shape {
    char name[40];
    bool trans_a, trans_b;
    size_t m, n, k;
} sgemm_shape;

static size_t shapes_for(const bench_options *o, sgemm_shape *out) {
    size_t count = 0;
    out[count++] = (sgemm_shape){"2048^3", false, false, 2048, 2048, 2048};
    static const size_t rows_list[] = {1024, 4096};
    static const size_t outs[] = {2304, 768};
    static const char *const names[] = {"c_attn", "c_proj"};
    for (size_t r = 0; r < (o->quick ? 1u : 2u); r++) {
        size_t rows = rows_list[r];
        for (size_t w = 0; w < 2; w++) {
            size_t n_out = outs[w];
            sgemm_shape *s = &out[count];
            snprintf(s->name, sizeof s->name, "%s fwd  rows %zu", names[w], rows);
            s->trans_a = false, s->trans_b = true, s->m = rows, s->n = n_out, s->k = 768;
            s = &out[++count];
            snprintf(s->name, sizeof s->name, "%s dx   rows %zu", names[w], rows);
            s->trans_a = false, s->trans_b = false, s->m = rows, s->n = 768, s->k = n_out;
            s = &out[++count];
            snprintf(s->name, sizeof s->name, "%s dW   rows %zu", names[w], rows);
            s->trans_a = true, s->trans_b = false, s->m = n_out, s->n = 768, s->k = rows;
            count++;
        }
    }
    return count;
}

/* One shape on one thread count: every kernel set and OpenBLAS. */
typedef struct sgemm_run {
    const sgemm_shape *s;
    size_t threads;
    const float *a, *b;
    float *c, *c_blas;
} sgemm_run;

static int time_shape(const bench_options *o, const bench_blas *blas, attn_ctx *const *ctxs,
                      const sgemm_run *r, double *worst_ratio /* per kernel set */) {
    const sgemm_shape *s = r->s;
    size_t lda = s->trans_a ? s->m : s->k, ldb = s->trans_b ? s->k : s->n;
    double flops = 2.0 * (double)s->m * (double)s->n * (double)s->k;
    double *ours = malloc(o->kernel_counts * o->runs * sizeof *ours);
    double *theirs = malloc(o->runs * sizeof *theirs);
    if (!ours || !theirs) {
        free(ours);
        free(theirs);
        return cli_failure("sgemm: out of memory");
    }
    /* one warm-up each, then the timed runs, ours and OpenBLAS's interleaved */
    for (size_t run = 0; run <= o->runs; run++) {
        for (size_t kk = 0; kk < o->kernel_counts; kk++) {
            double t0 = bench_now();
            attn_status st = attn_gemm(ctxs[kk], s->trans_a, s->trans_b, s->m, s->n, s->k, 1.0f,
                                       r->a, lda, r->b, ldb, 0.0f, r->c, s->n);
            double t = bench_now() - t0;
            if (st != ATTN_OK) {
                free(ours);
                free(theirs);
                return cli_library_error(ctxs[kk], "bench sgemm");
            }
            if (run > 0) ours[kk * o->runs + run - 1] = t;
        }
        if (blas->handle) {
            double t0 = bench_now();
            bench_blas_sgemm(blas, r->threads, s->trans_a, s->trans_b, s->m, s->n, s->k, 1.0f,
                             r->a, lda, r->b, ldb, 0.0f, r->c_blas, s->n);
            double t = bench_now() - t0;
            if (run > 0) theirs[run - 1] = t;
        }
    }
    double blas_s = blas->handle ? bench_median(theirs, o->runs) : 0.0;
    for (size_t kk = 0; kk < o->kernel_counts; kk++) {
        double ours_s = bench_median(ours + kk * o->runs, o->runs);
        char op[3] = {s->trans_a ? 'T' : 'N', s->trans_b ? 'T' : 'N', '\0'};
        printf("%-22s %s %5zu %5zu %5zu %3zu  %-9s %9.2f %8.1f", kk == 0 ? s->name : "", op, s->m,
               s->n, s->k, r->threads, attn_kernels_name(attn_ctx_kernels(ctxs[kk])),
               1e3 * ours_s, flops / ours_s * 1e-9);
        if (blas->handle) {
            double ratio = blas_s / ours_s;
            if (ratio < worst_ratio[kk]) worst_ratio[kk] = ratio;
            if (kk == 0)
                printf(" %9.2f %8.1f", 1e3 * blas_s, flops / blas_s * 1e-9);
            else
                printf(" %9s %8s", "", "");
            /* the last run of the last kernel set is in c */
            printf(" %6.2f%s", ratio, ratio < TARGET_RATIO ? " <" : "  ");
            if (kk + 1 == o->kernel_counts)
                printf(" %8.1e", bench_rel_l2(r->c, r->c_blas, s->m * s->n));
        }
        printf("\n");
    }
    free(ours);
    free(theirs);
    return CLI_OK;
}

/* ---- bf16 ------------------------------------------------------------------ */

/* OpenBLAS's cblas_sbgemm (bfloat16 = uint16_t), row-major enums as cblas. */
typedef void bench_cblas_sbgemm_fn(int order, int trans_a, int trans_b, int m, int n, int k,
                                   float alpha, const uint16_t *a, int lda, const uint16_t *b,
                                   int ldb, float beta, float *c, int ldc);
enum { SB_ROW_MAJOR = 101, SB_NO_TRANS = 111, SB_TRANS = 112 };

static bench_cblas_sbgemm_fn *find_sbgemm(const bench_blas *blas) {
    bench_cblas_sbgemm_fn *fn = NULL;
    void *sym = blas->handle ? dlsym(blas->handle, "cblas_sbgemm") : NULL;
    if (sym) memcpy(&fn, &sym, sizeof sym); /* object to function pointer, as POSIX allows */
    return fn;
}

typedef struct bgemm_data {
    const uint16_t *a16, *b16; /* the inputs in bf16 */
    const float *a32, *b32;    /* the same values in float, for the SGEMM */
    float *c, *c_ref, *c_blas;
} bgemm_data;

/* One shape on one thread count: per kernel set the bf16 GEMM and the
 * SGEMM, then cblas_sbgemm, interleaved run by run. */
static int time_bgemm(const bench_options *o, const bench_blas *blas,
                      bench_cblas_sbgemm_fn *sbgemm, attn_ctx *const *ctxs, const sgemm_shape *s,
                      size_t threads, const bgemm_data *d) {
    size_t lda = s->trans_a ? s->m : s->k, ldb = s->trans_b ? s->k : s->n;
    double flops = 2.0 * (double)s->m * (double)s->n * (double)s->k;
    size_t per = o->runs, sets = o->kernel_counts;
    double *times = malloc((2 * sets + 1) * per * sizeof *times);
    if (!times) {
        return cli_failure("sgemm bf16: out of memory");
    }
    for (size_t run = 0; run <= per; run++) {
        for (size_t kk = 0; kk < sets; kk++) {
            double t0 = bench_now();
            attn_status st = attn_gemm_16(ctxs[kk], ATTN_DTYPE_BF16, s->trans_a, s->trans_b, s->m,
                                          s->n, s->k, 1.0f, d->a16, lda, d->b16, ldb, 0.0f, d->c,
                                          s->n);
            double t1 = bench_now();
            attn_status st32 = attn_gemm(ctxs[kk], s->trans_a, s->trans_b, s->m, s->n, s->k, 1.0f,
                                         d->a32, lda, d->b32, ldb, 0.0f, d->c_ref, s->n);
            double t2 = bench_now();
            if (st != ATTN_OK || st32 != ATTN_OK) {
                free(times);
                return cli_library_error(ctxs[kk], "bench bf16");
            }
            if (run > 0) {
                times[(2 * kk) * per + run - 1] = t1 - t0;
                times[(2 * kk + 1) * per + run - 1] = t2 - t1;
            }
        }
        if (sbgemm) {
            blas->set_num_threads((int)threads);
            double t0 = bench_now();
            sbgemm(SB_ROW_MAJOR, s->trans_a ? SB_TRANS : SB_NO_TRANS,
                   s->trans_b ? SB_TRANS : SB_NO_TRANS, (int)s->m, (int)s->n, (int)s->k, 1.0f,
                   d->a16, (int)lda, d->b16, (int)ldb, 0.0f, d->c_blas, (int)s->n);
            if (run > 0) times[2 * sets * per + run - 1] = bench_now() - t0;
        }
    }
    double blas_s = sbgemm ? bench_median(times + 2 * sets * per, per) : 0.0;
    for (size_t kk = 0; kk < sets; kk++) {
        double ours = bench_median(times + 2 * kk * per, per);
        double single = bench_median(times + (2 * kk + 1) * per, per);
        char op[3] = {s->trans_a ? 'T' : 'N', s->trans_b ? 'T' : 'N', '\0'};
        printf("%-22s %s %5zu %5zu %5zu %3zu  %-9s %9.2f %8.1f %8.1f %6.2f", kk == 0 ? s->name : "",
               op, s->m, s->n, s->k, threads, attn_kernels_name(attn_ctx_kernels(ctxs[kk])),
               1e3 * ours, flops / ours * 1e-9, flops / single * 1e-9, single / ours);
        if (sbgemm && kk == 0)
            printf(" %8.1f %6.2f", flops / blas_s * 1e-9, blas_s / ours);
        else if (sbgemm)
            printf(" %8s %6.2f", "", blas_s / ours);
        /* the last run's results: ours against our SGEMM on the same values */
        if (kk + 1 == sets) printf("  %8.1e", bench_rel_l2(d->c, d->c_ref, s->m * s->n));
        printf("\n");
    }
    free(times);
    return CLI_OK;
}

static int bgemm_table(const bench_options *o, const bench_blas *blas,
                       bench_cblas_sbgemm_fn *sbgemm, const sgemm_shape *shapes, size_t count,
                       const bgemm_data *d);


static int bench_bgemm(const bench_options *o, const bench_blas *blas, const sgemm_shape *shapes,
                       size_t count, const float *a, const float *b, size_t na, size_t nb,
                       float *c, float *c_blas) {
    bench_cblas_sbgemm_fn *sbgemm = find_sbgemm(blas);
    uint16_t *a16 = malloc(na * sizeof *a16), *b16 = malloc(nb * sizeof *b16);
    float *a32 = malloc(na * sizeof *a32), *b32 = malloc(nb * sizeof *b32);
    size_t nc = 0;
    for (size_t i = 0; i < count; i++) nc = shapes[i].m * shapes[i].n > nc ? shapes[i].m * shapes[i].n : nc;
    float *c_ref = malloc(nc * sizeof *c_ref);
    int rc = CLI_OK;
    if (!a16 || !b16 || !a32 || !b32 || !c_ref) {
        rc = cli_failure("sgemm bf16: out of memory");
    } else {
        for (size_t i = 0; i < na; i++) a16[i] = attn_float_to_bf16(a[i]);
        for (size_t i = 0; i < nb; i++) b16[i] = attn_float_to_bf16(b[i]);
        /* the SGEMM's inputs: the bf16 values exactly */
        for (size_t i = 0; i < na; i++) a32[i] = attn_bf16_to_float(a16[i]);
        for (size_t i = 0; i < nb; i++) b32[i] = attn_bf16_to_float(b16[i]);
        printf("\nbf16 GEMM (attn_gemm_16): C (float) = op(A) op(B), A and B bf16; SGEMM: "
               "attn_gemm on the same values;\nspeedup = bf16 / SGEMM; ");
        if (sbgemm)
            printf("OpenBLAS: cblas_sbgemm, ratio = OpenBLAS time / ours\n");
        else
            printf("OpenBLAS: %s\n", blas->handle ? "this build exports no cblas_sbgemm (built "
                                                    "without BUILD_BFLOAT16), so no comparison"
                                                  : "not found");
        printf("%-22s %-2s %5s %5s %5s %3s  %-9s %9s %8s %8s %6s", "shape", "op", "m", "n", "k",
               "thr", "kernels", "ms", "GFLOP/s", "SGEMM", "speed");
        if (sbgemm) printf(" %8s %6s", "OpenBLAS", "ratio");
        printf("  %8s\n", "diff");
    }
    bgemm_data d = {a16, b16, a32, b32, c, c_ref, c_blas};
    rc = rc == CLI_OK ? bgemm_table(o, blas, sbgemm, shapes, count, &d) : rc;
    /* AMX runs once the process has asked Linux for it (the library never
     * asks): where the CPU has it, ask, and time the table again */
    attn_cpu_info cpu;
    if (rc == CLI_OK && attn_cpu_info_get(&cpu) == ATTN_OK && !cpu.amx_bf16 && attn_cpu_request_amx() == ATTN_OK &&
        attn_cpu_info_get(&cpu) == ATTN_OK && cpu.amx_bf16) {
        printf("\nbf16 GEMM with AMX (attn-bench asked Linux for the tile data, "
               "arch_prctl(ARCH_REQ_XCOMP_PERM)):\n");
        rc = bgemm_table(o, blas, sbgemm, shapes, count, &d);
    }
    free(a16);
    free(b16);
    free(a32);
    free(b32);
    free(c_ref);
    return rc;
}

/* The table's rows, every thread count. */
static int bgemm_table(const bench_options *o, const bench_blas *blas,
                       bench_cblas_sbgemm_fn *sbgemm, const sgemm_shape *shapes, size_t count,
                       const bgemm_data *d) {
    int rc = CLI_OK;
    for (size_t t = 0; t < o->thread_counts && rc == CLI_OK; t++) {
        attn_ctx *ctxs[BENCH_MAX_KERNELS] = {0};
        for (size_t kk = 0; kk < o->kernel_counts && rc == CLI_OK; kk++) {
            attn_ctx_config cfg = {.num_threads = o->threads[t], .kernels = o->kernels[kk]};
            if (attn_ctx_new(&cfg, &ctxs[kk]) != ATTN_OK) {
                rc = cli_failure("sgemm bf16: cannot make a ctx with %zu threads", o->threads[t]);
            }
        }
        for (size_t i = 0; i < count && rc == CLI_OK; i++)
            rc = time_bgemm(o, blas, sbgemm, ctxs, &shapes[i], o->threads[t], d);
        for (size_t kk = 0; kk < o->kernel_counts; kk++) attn_ctx_free(ctxs[kk]);
    }
    return rc;
}

int bench_sgemm(const bench_options *o, const bench_blas *blas) {
    sgemm_shape shapes[16];
    size_t count = shapes_for(o, shapes);
    size_t max_a = 0, max_b = 0, max_c = 0;
    for (size_t i = 0; i < count; i++) {
        size_t a = shapes[i].m * shapes[i].k, b = shapes[i].k * shapes[i].n,
               c = shapes[i].m * shapes[i].n;
        max_a = a > max_a ? a : max_a;
        max_b = b > max_b ? b : max_b;
        max_c = c > max_c ? c : max_c;
    }
    float *a = bench_random(max_a, 1), *b = bench_random(max_b, 2);
    float *c = calloc(max_c, sizeof *c), *c_blas = calloc(max_c, sizeof *c_blas);
    int rc = CLI_OK;
    if (!a || !b || !c || !c_blas) {
        rc = cli_failure("sgemm: out of memory");
    }
    printf("sgemm: C = op(A) op(B), row-major; GFLOP/s = 2mnk / median time; ratio = ours / "
           "OpenBLAS (target >= %.2f, '<' below it)\n", TARGET_RATIO);
    printf("%-22s %-2s %5s %5s %5s %3s  %-9s %9s %8s", "shape", "op", "m", "n", "k", "thr",
           "kernels", "ms", "GFLOP/s");
    if (blas->handle) printf(" %9s %8s %6s   %8s", "OpenBLAS", "GFLOP/s", "ratio", "diff");
    printf("\n");
    for (size_t t = 0; t < o->thread_counts && rc == CLI_OK; t++) {
        attn_ctx *ctxs[BENCH_MAX_KERNELS] = {0};
        for (size_t kk = 0; kk < o->kernel_counts && rc == CLI_OK; kk++) {
            attn_ctx_config cfg = {.num_threads = o->threads[t], .kernels = o->kernels[kk]};
            if (attn_ctx_new(&cfg, &ctxs[kk]) != ATTN_OK) {
                rc = cli_failure("sgemm: cannot make a ctx with %zu threads", o->threads[t]);
            }
        }
        double worst[BENCH_MAX_KERNELS];
        for (size_t kk = 0; kk < BENCH_MAX_KERNELS; kk++) worst[kk] = 1e300;
        for (size_t i = 0; i < count && rc == CLI_OK; i++) {
            sgemm_run r = {&shapes[i], o->threads[t], a, b, c, c_blas};
            rc = time_shape(o, blas, ctxs, &r, worst);
        }
        for (size_t kk = 0; rc == CLI_OK && blas->handle && kk < o->kernel_counts; kk++)
            printf("worst ratio, %s on %zu thread%s: %.2f (%s)\n",
                   attn_kernels_name(o->kernels[kk]), o->threads[t],
                   o->threads[t] == 1 ? "" : "s", worst[kk],
                   worst[kk] >= TARGET_RATIO ? "target met" : "below target");
        for (size_t kk = 0; kk < o->kernel_counts; kk++) attn_ctx_free(ctxs[kk]);
    }
    if (rc == CLI_OK) rc = bench_bgemm(o, blas, shapes, count, a, b, max_a, max_b, c, c_blas);
    free(a);
    free(b);
    free(c);
    free(c_blas);
    return rc;
}
