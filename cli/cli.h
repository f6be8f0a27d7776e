/*
 * cli.h — what the attn command's parts share: the argument helpers of
 * args.c, which turn every bad value into a one-line error, and the
 * commands (cmd_<name>.c each), dispatched by the table in main.c.
 */
#ifndef ATTN_CLI_H
#define ATTN_CLI_H

#include "attn.h"

#include <stdbool.h>
#include <stddef.h>

/* Exit codes: 0 ok, 1 the library failed, 2 bad usage. */
enum { CLI_OK = 0, CLI_FAILED = 1, CLI_USAGE = 2 };

/* Prints "attn: <message>" to stderr and returns CLI_USAGE. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
int cli_usage_error(const char *fmt, ...);

/* Prints "attn: <what>: <ctx's last error>" and returns CLI_FAILED. */
int cli_library_error(const attn_ctx *ctx, const char *what);

/* Strict parsers: the whole string must be the number. */
bool cli_parse_size(const char *text, size_t *out);
bool cli_parse_u64(const char *text, uint64_t *out);
bool cli_parse_double(const char *text, double *out);

/* "--name value" options: the value after argv[*i] (advancing *i), or NULL
 * with an error printed when the option is not in the NULL-terminated
 * known list or its value is missing. argv[0] is the command's name. */
const char *cli_option_value(int argc, char **argv, int *i, const char *const *known);

/* True when argv holds -h or --help. */
bool cli_wants_help(int argc, char **argv);

/* The number of online CPUs, at least 1. */
size_t cli_default_threads(void);

int cli_demo(int argc, char **argv);
int cli_trace(int argc, char **argv);
int cli_params(int argc, char **argv);
int cli_forward(int argc, char **argv);
int cli_grad(int argc, char **argv);
int cli_heatmap(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_train(int argc, char **argv);

#endif /* ATTN_CLI_H */
