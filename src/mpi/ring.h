/*
 * ring.h — ring attention over the group's ranks, plain and zigzag (ring.c):
 * the job's forward and backward, K/V blocks (and dK/dV) travelling rank to
 * rank.
 */
#ifndef ATTN_MPI_RING_H
#define ATTN_MPI_RING_H

#include "mpi/group.h"

attn_status attn_mpi_ring_forward(attn_mpi_group *g, const char *who, const attn_mpi_job *job);
attn_status attn_mpi_ring_backward(attn_mpi_group *g, const char *who, const attn_mpi_job *job);

#endif /* ATTN_MPI_RING_H */
