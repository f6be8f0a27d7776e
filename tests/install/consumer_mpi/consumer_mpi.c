/* consumer_mpi.c — a program outside the project, built against an
 * installed attn_mpi (pkg-config attn-mpi, find_package(attn COMPONENTS
 * mpi)). Under mpirun it runs one causal attention over a sequence split
 * across the ranks and checks it against the same attention in one process
 * on every rank; rank 0 prints "attn_mpi <version> ok". */
#include <attn.h>
#include <attn_mpi.h>

#include <math.h>
#include <stdio.h>

enum { H = 2, T = 9, D = 4 };

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    static float q[H * T * D], out[H * T * D], lq[H * T * D], lout[H * T * D], lse[H * T];
    for (int i = 0; i < H * T * D; i++) q[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    attn_ctx *ctx = NULL;
    attn_mpi_group *g = NULL;
    size_t b[2], e[2], Tl = 0;
    attn_mpi_local_ranges(ATTN_MPI_RING, T, (size_t)size, (size_t)rank, b, e, &Tl);
    for (int h = 0; h < H; h++)
        for (size_t t = 0; t < Tl; t++)
            for (int d = 0; d < D; d++) lq[(h * Tl + t) * D + d] = q[(h * T + b[0] + t) * D + d];
    /* (B, H, T, D), as the layer's chunks: strides (b, t, h) */
    attn_sdpa_config one = {.batch = 1, .heads = H, .q_tokens = T, .kv_tokens = T, .head_dim = D,
                            .q_strides = {H * T * D, D, T * D}, .kv_strides = {H * T * D, D, T * D},
                            .out_strides = {H * T * D, D, T * D}, .causal = true};
    attn_mpi_sdpa_config cfg = {.batch = 1, .heads = H, .tokens = T, .head_dim = D,
                                .causal = true};
    double worst = 0.0;
    int ok = attn_ctx_new(NULL, &ctx) == ATTN_OK &&
             attn_sdpa_forward(ctx, &one, q, q, q, out, NULL, NULL, NULL) == ATTN_OK &&
             attn_mpi_group_new(ctx, MPI_COMM_WORLD, ATTN_MPI_RING, &g) == ATTN_OK &&
             attn_mpi_sdpa_forward(g, &cfg, lq, lq, lq, lout, lse) == ATTN_OK;
    for (int h = 0; ok && h < H; h++)
        for (size_t t = 0; t < Tl; t++)
            for (int d = 0; d < D; d++) {
                double diff = fabs(lout[(h * Tl + t) * D + d] - out[(h * T + b[0] + t) * D + d]);
                if (diff > worst) worst = diff;
            }
    ok = ok && worst <= 1e-6;
    if (!ok) fprintf(stderr, "consumer_mpi: rank %d: %s (worst %g)\n", rank,
                     ctx ? attn_ctx_last_error(ctx) : "no ctx", worst);
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (ok && rank == 0) printf("attn_mpi %s ok\n", attn_version());
    attn_mpi_group_free(g);
    attn_ctx_free(ctx);
    MPI_Finalize();
    return ok ? 0 : 1;
}
