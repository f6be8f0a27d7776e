/*
 * attn_mpi.h — context parallelism over MPI (optional: built with
 * -DATTN_MPI=ON, library attn_mpi): one sequence split across the ranks of
 * a communicator, each rank holding a chunk of the tokens, with results
 * equal to the single-process run's (see docs/mpi.md).
 *
 *   ATTN_MPI_RING     rank r holds tokens [r T / P, (r + 1) T / P); K/V
 *                     blocks travel around a ring (MPI_Isend/MPI_Irecv
 *                     overlapped with the fused kernel on the current
 *                     block), partial outputs merged by log-sum-exp; the
 *                     backward sends dK/dV around a second ring.
 *   ATTN_MPI_ZIGZAG   the same ring over 2P chunks, rank r holding chunks
 *                     r and 2P - 1 - r: every rank gets the same causal
 *                     work (the plain ring's last rank does P times its
 *                     first's).
 *   ATTN_MPI_ULYSSES  contiguous chunks as the ring; an all-to-all turns
 *                     them into whole sequences of H / P heads per rank,
 *                     and back (heads and kv_heads divisible by P).
 *
 * Every function is collective over the group's communicator: every rank
 * calls it, with the same sizes, options and weights. A rank that fails (a
 * bad value, out of memory) fails on every rank, with the failing rank's
 * message, before any exchange that could block: no rank hangs. Ranks that
 * disagree (on the mode, the call, a size, the scale, causality, the
 * block map's geometry or a checksum of its content, the module's kind or
 * a checksum of its weights) fail alike, the message
 * naming the value on each side. As in attn.h, the library
 * never prints, aborts or exits, and a failed call leaves the outputs as
 * they were.
 */
#ifndef ATTN_MPI_H
#define ATTN_MPI_H

#include "attn.h"

#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

typedef enum attn_mpi_mode {
    ATTN_MPI_RING = 0,
    ATTN_MPI_ZIGZAG = 1,
    ATTN_MPI_ULYSSES = 2
} attn_mpi_mode;

/* "ring", "zigzag", "ulysses" ("?" if unknown). */
const char *attn_mpi_mode_name(attn_mpi_mode mode);

/* The global token ranges [begin[i], end[i]) that rank holds of a
 * tokens-long sequence split over ranks, in the order they sit in its
 * local tensors: 1 range (ring, Ulysses) or 2 (zigzag). Chunks differ by
 * at most one token when ranks (2 ranks for zigzag) does not divide
 * tokens, and may be empty. Returns the number of ranges; *local the
 * rank's token count. 0 for a bad mode or rank >= ranks. */
size_t attn_mpi_local_ranges(attn_mpi_mode mode, size_t tokens, size_t ranks, size_t rank,
                             size_t begin[2], size_t end[2], size_t *local);

/* A context-parallel group: a duplicate of comm (its messages never meet
 * the caller's), the mode, and what a module's forward keeps for its
 * backward. Made and freed collectively. */
typedef struct attn_mpi_group attn_mpi_group;
attn_status attn_mpi_group_new(attn_ctx *ctx, MPI_Comm comm, attn_mpi_mode mode,
                               attn_mpi_group **out);
void attn_mpi_group_free(attn_mpi_group *g);
int attn_mpi_group_rank(const attn_mpi_group *g);
int attn_mpi_group_size(const attn_mpi_group *g);

/* ---- agreement --------------------------------------------------------------- */

/* A value a program's ranks must hold alike (an option, a path's role):
 * compared by text where text is not NULL, else by number. */
typedef struct attn_mpi_value {
    const char *name; /* for the message: "--seed" */
    const char *text; /* NULL: the number is the value */
    int64_t number;
} attn_mpi_value;

/* Every rank checks that the others hold the same n values (at most 32),
 * in the same step (who, e.g. "attn forward", names it: ranks at another
 * step, or in another call of this layer, fail too). ATTN_OK on every rank,
 * or the same failure on every rank, naming the value and each side's
 * ("attn forward: the ranks disagree on --seed: rank 0 1, rank 1 2"). Every
 * call of this layer makes the same agreement on its own arguments, the
 * group's mode and which call it is before it exchanges anything. */
attn_status attn_mpi_group_agree(attn_mpi_group *g, const char *who, const attn_mpi_value *values,
                                 size_t n);

/* ---- attention over chunks ---------------------------------------------- */

/* Self-attention over a sequence of `tokens` split as the group's mode
 * says. Each rank's tensors are its chunk, T_local = attn_mpi_local_ranges'
 * count, contiguous: q, out (B, heads, T_local, head_dim); k, v (B,
 * kv_heads, T_local, head_dim); lse (B, heads, T_local). */
typedef struct attn_mpi_sdpa_config {
    size_t batch, heads, kv_heads, tokens, head_dim; /* kv_heads 0: heads */
    double scale; /* 0: 1/sqrt(head_dim) */
    bool causal;
    /* ---- since 0.5 (NULL: off) ---- */
    /* The keys each query sees, ANDed with causal, as attn_sdpa_config's:
     * a map over the WHOLE sequence (q_len = kv_len = tokens, global token
     * positions whatever the mode's chunks; batch 1 or batch, heads 1 or
     * heads), the same on every rank (its geometry and a checksum of its
     * content are agreed on: ranks with different maps fail alike). Ring
     * and zigzag run each (query chunk, key chunk) pair on that rectangle
     * of the map and skip the pairs it leaves empty (the blocks still
     * travel); Ulysses runs its heads of the map. The sub-maps are built in
     * the first call over a map and kept in the group for the next calls
     * over an equal one (a backward after its forward). */
    const attn_block_mask *block_mask;
} attn_mpi_sdpa_config;

/* out and lse (may be NULL) of the chunk's queries over every key. */
attn_status attn_mpi_sdpa_forward(attn_mpi_group *g, const attn_mpi_sdpa_config *cfg,
                                  const float *q, const float *k, const float *v, float *out,
                                  float *lse);
/* dq, dk, dv (the chunk's, written) from dout, given the forward's out and
 * lse (required: each row's whole log-sum-exp). */
attn_status attn_mpi_sdpa_backward(attn_mpi_group *g, const attn_mpi_sdpa_config *cfg,
                                   const float *q, const float *k, const float *v,
                                   const float *out, const float *lse, const float *dout,
                                   float *dq, float *dk, float *dv);

/* ---- modules ------------------------------------------------------------- */

/* A MultiHeadAttention or GPT-2 CausalSelfAttention over the sequence of
 * `tokens` split as the group's mode says: x_local (B, T_local, d_in) ->
 * y_local (B, T_local, d_out). The projections run on the rank's tokens,
 * the attention across ranks. Every rank holds the same weights (built
 * from the same seed, or loaded alike). Without dropout (eval mode, or a
 * dropout of 0). With gradients enabled, the group keeps what the
 * backward needs; without, it drops what an earlier forward over m kept
 * (as one process: nothing is left to differentiate). */
attn_status attn_mpi_module_forward(attn_mpi_group *g, attn_module *m, const float *x_local,
                                    size_t batch, size_t tokens, float *y_local);
/* dx_local (B, T_local, d_in; may be NULL) written, and every parameter's
 * gradient += its whole-sequence gradient (the ranks' parts summed), the
 * same on every rank, from dy_local (B, T_local, d_out) of the group's last
 * module forward over m. */
attn_status attn_mpi_module_backward(attn_mpi_group *g, attn_module *m, const float *dy_local,
                                     float *dx_local);

/* ---- whole tensors ---------------------------------------------------------- */

/* x (B, tokens, width) on rank root (ignored elsewhere) -> each rank's
 * x_local (B, T_local, width), by the group's mode; and back. */
attn_status attn_mpi_scatter_tokens(attn_mpi_group *g, int root, const float *x, size_t batch,
                                    size_t tokens, size_t width, float *x_local);
attn_status attn_mpi_gather_tokens(attn_mpi_group *g, int root, const float *x_local,
                                   size_t batch, size_t tokens, size_t width, float *x);

/* ---- the timeline of the last pass ------------------------------------------- */

/* MPI_Wtime stamps of one ring step (one all-to-all phase for Ulysses):
 * the step began, its sends and receives were posted, its compute ended,
 * and its messages had all arrived (the wait after compute: exposed
 * communication is arrived - computed). */
typedef struct attn_mpi_step {
    double begin, posted, computed, arrived;
} attn_mpi_step;
/* Copies up to cap steps of the group's last forward or backward into
 * steps (may be NULL); returns how many there were. */
size_t attn_mpi_timeline(const attn_mpi_group *g, attn_mpi_step *steps, size_t cap);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* ATTN_MPI_H */
