/*
 * ulysses.h — DeepSpeed-Ulysses attention over the group's ranks
 * (ulysses.c): the job's forward and backward, heads exchanged for tokens
 * by all-to-all.
 */
#ifndef ATTN_MPI_ULYSSES_H
#define ATTN_MPI_ULYSSES_H

#include "mpi/group.h"

attn_status attn_mpi_ulysses_forward(attn_mpi_group *g, const char *who,
                                     const attn_mpi_job *job);
attn_status attn_mpi_ulysses_backward(attn_mpi_group *g, const char *who,
                                      const attn_mpi_job *job);

#endif /* ATTN_MPI_ULYSSES_H */
