/*
 * sdpa.h — the attention over chunks by the group's mode (sdpa.c, which
 * also holds the public attn_mpi_sdpa_forward and attn_mpi_sdpa_backward):
 * ring or zigzag (ring.h) or Ulysses (ulysses.h), for the SDPA calls and
 * the modules (modules.c) alike.
 */
#ifndef ATTN_MPI_SDPA_H
#define ATTN_MPI_SDPA_H

#include "mpi/group.h"

#include <stdbool.h>

/* Forward or backward by the group's mode. */
attn_status attn_mpi_attention(attn_mpi_group *g, const char *who, const attn_mpi_job *job,
                               bool backward);

#endif /* ATTN_MPI_SDPA_H */
