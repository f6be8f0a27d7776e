/*
 * bench_sgemm.c — the sgemm section of attn bench: attn_gemm on each
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
 */
#include "bench.h"
#include "cli.h"

#include <stdio.h>
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
        fprintf(stderr, "attn: bench: out of memory\n");
        return CLI_FAILED;
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
        fprintf(stderr, "attn: bench sgemm: out of memory\n");
        rc = CLI_FAILED;
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
                fprintf(stderr, "attn: bench sgemm: cannot make a ctx with %zu threads\n",
                        o->threads[t]);
                rc = CLI_FAILED;
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
    free(a);
    free(b);
    free(c);
    free(c_blas);
    return rc;
}
