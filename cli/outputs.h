/*
 * outputs.h — the files a command writes, written as one: every output path
 * is checked and opened (as an attn_file, a temporary beside it) before the
 * command computes anything, the results go to the temporaries, and only
 * when every one of them is complete are they renamed into place. On any
 * failure the temporaries are removed, a directory made for the outputs is
 * removed again, and no destination changes. Each temporary is tracked
 * (interrupt.h) while it exists, so a signal that ends the process removes
 * it too, and the renames happen with the signals held: a signal finds all
 * of the outputs in place or none.
 *
 *     cli_outputs out;
 *     cli_outputs_init(&out, ctx);
 *     rc = cli_outputs_add(&out, "--output", path, &o);          // checks, opens
 *     rc = cli_outputs_not_input(&out, "--q", q_path);           // output != input
 *     ... read, compute ...
 *     rc = cli_outputs_npy(&out, o, data, rank, shape);          // to the temporary
 *     rc = cli_outputs_commit(&out);   // stdout flushed, all in place; "attn: wrote ..."
 *     cli_outputs_free(&out);          // removes what was not committed
 */
#ifndef ATTN_CLI_OUTPUTS_H
#define ATTN_CLI_OUTPUTS_H

#include "attn.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct cli_output cli_output;

typedef struct cli_outputs {
    attn_ctx *ctx;
    cli_output *items;
    size_t count, cap;
    char *made_dir; /* a directory made for the outputs: removed unless committed */
    bool committed;
} cli_outputs;

void cli_outputs_init(cli_outputs *out, attn_ctx *ctx);

/* Makes directory dir (named by opt) when it does not exist; it is removed
 * again by cli_outputs_free unless the outputs were committed. A usage
 * error naming opt when dir is a file or cannot be made. */
int cli_outputs_dir(cli_outputs *out, const char *opt, const char *dir);

/* Checks path (named by opt) and opens its temporary; *index is its number
 * for cli_outputs_npy and cli_outputs_file. A usage error when path is
 * another output's (the same file by any spelling), CLI_FAILED with the
 * library's message when it cannot be written (a directory, a missing
 * parent, no permission). */
int cli_outputs_add(cli_outputs *out, const char *opt, const char *path, size_t *index);
/* The same for DIR/name.npy. */
int cli_outputs_add_in_dir(cli_outputs *out, const char *opt, const char *dir, const char *name,
                           size_t *index);

/* A usage error when an output is the file in_path, read by in_opt: a
 * command never writes over its own input. */
int cli_outputs_not_input(cli_outputs *out, const char *in_opt, const char *in_path);

/* Writes data as .npy to output index's temporary, and notes the shape for
 * the summary line. */
int cli_outputs_npy(cli_outputs *out, size_t index, const float *data, size_t rank,
                    const size_t *shape);
/* The attn_file of output index, for writers of other formats; summary (a
 * few words, or NULL) goes after its name in the "wrote" line. */
attn_file *cli_outputs_file(cli_outputs *out, size_t index, const char *summary);

/* Closes every output: each complete and durable, or CLI_FAILED naming the
 * option and the path. A command that reports its files on stdout closes
 * them first, prints the report, then commits, so that the report is
 * checked with the rest of what it printed. */
int cli_outputs_close(cli_outputs *out);

/* Closes every output (cli_outputs_close) and flushes stdout, then, when
 * all are complete and everything printed is out (cli_stdout_flushed),
 * renames each into place and prints "attn: wrote PATH (SHAPE float32),
 * ..." on stderr (unless quiet). CLI_FAILED otherwise, naming the option
 * and the path (a failed stdout: cli_finish names it), with no destination
 * changed. */
int cli_outputs_commit(cli_outputs *out, bool quiet);

/* Removes every temporary not committed (and the directory made, when
 * nothing was committed) and frees out. */
void cli_outputs_free(cli_outputs *out);

#endif /* ATTN_CLI_OUTPUTS_H */
