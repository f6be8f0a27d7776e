/*
 * bench_mpi_ring.c — the overlap measurement of docs/mpi.md.
 *
 *   bench_mpi_ring single T THREADS [REPS]
 *       one process, THREADS threads: attn_sdpa_forward and _backward over
 *       (1, 12, T, 64), causal; the median seconds of REPS (default 3).
 *   mpirun -np P bench_mpi_ring ring|zigzag|ulysses T THREADS [REPS]
 *       the same problem context-parallel, THREADS threads per rank: the
 *       median seconds of each pass (between barriers), and rank by rank
 *       the last pass's timeline: per step the compute (posted ->
 *       computed) and the exposed communication (computed -> arrived).
 */
#include "attn.h"
#include "attn_mpi.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPU seconds of this process, all threads: the work done, apart from
 * what other processes on the machine take of it. */
static double cpu_now(void) { return (double)clock() / CLOCKS_PER_SEC; }

enum { H = 12, D = 64, MAX_REPS = 15 };

static float *random_floats(size_t n, uint64_t seed) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    if (!x) exit(2);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 11) / 9007199254740992.0 - 0.5);
    }
    return x;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static int fail(attn_ctx *ctx) {
    fprintf(stderr, "bench_mpi_ring: %s\n", attn_ctx_last_error(ctx));
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_mpi_ring single|ring|zigzag|ulysses T THREADS [REPS]\n");
        return 2;
    }
    const char *what = argv[1];
    size_t T = strtoull(argv[2], NULL, 10), threads = strtoull(argv[3], NULL, 10);
    int reps = argc > 4 ? atoi(argv[4]) : 3;
    if (reps < 1 || reps > MAX_REPS) reps = 3;
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    attn_ctx *ctx;
    if (attn_ctx_new(&(attn_ctx_config){.num_threads = threads}, &ctx) != ATTN_OK) return 2;
    double fwd[MAX_REPS], bwd[MAX_REPS], cfwd[MAX_REPS], cbwd[MAX_REPS];
    int rc = 0;
    if (strcmp(what, "single") == 0) {
        size_t n = H * T * D;
        float *q = random_floats(n, 1), *k = random_floats(n, 2), *v = random_floats(n, 3);
        float *dout = random_floats(n, 4), *out = calloc(n, 4), *lse = calloc(H * T, 4);
        float *dq = calloc(n, 4), *dk = calloc(n, 4), *dv = calloc(n, 4);
        attn_sdpa_config cfg = {.batch = 1, .heads = H, .q_tokens = T, .kv_tokens = T,
                                .head_dim = D, .causal = true,
                                .q_strides = {H * T * D, D, T * D},
                                .kv_strides = {H * T * D, D, T * D},
                                .out_strides = {H * T * D, D, T * D}};
        for (int r = 0; r < reps && !rc; r++) {
            double t0 = MPI_Wtime(), c0 = cpu_now();
            if (attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL) != ATTN_OK)
                rc = fail(ctx);
            double t1 = MPI_Wtime(), c1 = cpu_now();
            if (!rc &&
                attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, dout, dq, dk, dv, NULL) != ATTN_OK)
                rc = fail(ctx);
            fwd[r] = t1 - t0;
            bwd[r] = MPI_Wtime() - t1;
            cfwd[r] = c1 - c0;
            cbwd[r] = cpu_now() - c1;
        }
        if (!rc)
            printf("single T=%zu threads=%zu: forward %.3f s, backward %.3f s (median of %d); "
                   "CPU forward %.3f s, backward %.3f s\n",
                   T, threads, median(fwd, reps), median(bwd, reps), reps, median(cfwd, reps),
                   median(cbwd, reps));
        free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    } else {
        attn_mpi_mode mode = strcmp(what, "ulysses") == 0  ? ATTN_MPI_ULYSSES
                             : strcmp(what, "zigzag") == 0 ? ATTN_MPI_ZIGZAG
                                                           : ATTN_MPI_RING;
        size_t b[2], e[2], Tl;
        attn_mpi_local_ranges(mode, T, (size_t)size, (size_t)rank, b, e, &Tl);
        size_t n = H * Tl * D;
        float *q = random_floats(n, 1 + 10 * (uint64_t)rank), *k = random_floats(n, 2 + 10 * (uint64_t)rank);
        float *v = random_floats(n, 3 + 10 * (uint64_t)rank), *dout = random_floats(n, 4);
        float *out = calloc(n, 4), *lse = calloc(H * Tl, 4), *dq = calloc(n, 4),
              *dk = calloc(n, 4), *dv = calloc(n, 4);
        attn_mpi_group *g;
        attn_mpi_sdpa_config cfg = {.batch = 1, .heads = H, .tokens = T, .head_dim = D,
                                    .causal = true};
        if (attn_mpi_group_new(ctx, MPI_COMM_WORLD, mode, &g) != ATTN_OK) return fail(ctx);
        attn_mpi_step steps[2][64];
        size_t nsteps[2] = {0, 0};
        for (int r = 0; r < reps && !rc; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime(), c0 = cpu_now();
            if (attn_mpi_sdpa_forward(g, &cfg, q, k, v, out, lse) != ATTN_OK) rc = fail(ctx);
            double c1 = cpu_now();
            MPI_Barrier(MPI_COMM_WORLD);
            double t1 = MPI_Wtime(), c2 = cpu_now();
            nsteps[0] = attn_mpi_timeline(g, steps[0], 64);
            if (!rc && attn_mpi_sdpa_backward(g, &cfg, q, k, v, out, lse, dout, dq, dk, dv) !=
                           ATTN_OK)
                rc = fail(ctx);
            double c3 = cpu_now();
            MPI_Barrier(MPI_COMM_WORLD);
            fwd[r] = t1 - t0;
            bwd[r] = MPI_Wtime() - t1;
            /* the ranks' CPU seconds summed (MPI's waits spin: counted) */
            double c[2] = {c1 - c0, c3 - c2};
            MPI_Allreduce(MPI_IN_PLACE, c, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            cfwd[r] = c[0];
            cbwd[r] = c[1];
            nsteps[1] = attn_mpi_timeline(g, steps[1], 64);
        }
        if (!rc && rank == 0)
            printf("%s P=%d T=%zu threads/rank=%zu: forward %.3f s, backward %.3f s (median of "
                   "%d); CPU (all ranks) forward %.3f s, backward %.3f s\n",
                   what, size, T, threads, median(fwd, reps), median(bwd, reps), reps,
                   median(cfwd, reps), median(cbwd, reps));
        /* the timelines, rank by rank in order */
        for (int p = 0; p < size && !rc; p++) {
            MPI_Barrier(MPI_COMM_WORLD);
            if (p != rank) continue;
            for (int pass = 0; pass < 2; pass++) {
                double origin = steps[pass][0].begin;
                for (size_t s = 0; s < nsteps[pass] && s < 64; s++) {
                    attn_mpi_step *x = &steps[pass][s];
                    printf("  rank %d %s step %zu: begin %+.3f s, post %.4f s, compute %.3f s, "
                           "exposed wait %.4f s\n",
                           rank, pass ? "backward" : "forward", s, x->begin - origin,
                           x->posted - x->begin, x->computed - x->posted,
                           x->arrived - x->computed);
                }
            }
            fflush(stdout);
        }
        attn_mpi_group_free(g);
        free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    }
    attn_ctx_free(ctx);
    MPI_Finalize();
    return rc;
}
