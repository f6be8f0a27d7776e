/*
 * context_parallel.h — attn forward|grad --context-parallel MODE: the run
 * under mpirun (context_parallel.c, built only with ATTN_MPI). Rank 0
 * reads the whole input, scatters the tokens, every rank runs the module
 * on its chunk with the attention across ranks, rank 0 gathers and writes.
 */
#ifndef ATTN_CLI_CONTEXT_PARALLEL_H
#define ATTN_CLI_CONTEXT_PARALLEL_H

#include "cli.h"
#include "module_options.h"
#include "weights.h"

#include <string.h>

/* The option's help line, and its check: CLI_OK for ring, zigzag or
 * ulysses, else CLI_USAGE after printing. */
#define CLI_CONTEXT_PARALLEL_HELP                                                            \
    "  --context-parallel ring|zigzag|ulysses\n"                                              \
    "                      run under mpirun, the sequence split over the ranks (mha,\n"       \
    "                      gpt2; docs/mpi.md): rank 0 reads and writes the files\n"
static inline int cli_context_parallel_check(const char *mode) {
    if (strcmp(mode, "ring") == 0 || strcmp(mode, "zigzag") == 0 || strcmp(mode, "ulysses") == 0)
        return CLI_OK;
    return cli_usage_error("--context-parallel: expected ring, zigzag or ulysses, got '%s'", mode);
}

/* The runs (with MPI only): CLI_OK, CLI_USAGE or CLI_FAILED on every rank. */
int cli_cp_forward(cli_run_options *o, const char *mode, const cli_weights_options *weights,
                   const char *output);
int cli_cp_grad(cli_run_options *o, const char *mode, const char *grad_output,
                const char *out_dir);

#endif /* ATTN_CLI_CONTEXT_PARALLEL_H */
