/*
 * cli.h — what the attn command's parts share: the argument helpers of
 * args.c, which turn every bad value into a one-line error, and the
 * commands (cmd_<name>.c each), dispatched by the table in main.c.
 * attn-bench (bench/) shares the helpers and the CPU lines (print_cpu.c)
 * through the attn_cli_common library, and names itself in their errors.
 */
#ifndef ATTN_CLI_H
#define ATTN_CLI_H

#include "attn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Exit codes: 0 ok, 1 the library failed (or writing stdout did), 2 bad usage. */
enum { CLI_OK = 0, CLI_FAILED = 1, CLI_USAGE = 2 };

/*
 * A command. main.c handles what every command shares, so a command never
 * sees it: -h/--help anywhere an option may stand (not as the value of an
 * option: "--output -h" names a file), and the check that everything written
 * to stdout got there (exit 1 when it did not).
 */
typedef struct cli_command {
    const char *name;
    const char *summary;               /* one line for 'attn --help'          */
    const char *help;                  /* 'attn <name> --help', on stdout     */
    void (*more_help)(FILE *out);      /* prints more after help (optional)   */
    const char *const *value_options;  /* options that take a value, NULL-terminated */
    /* Parses and checks the arguments without doing anything (the fuzz
     * target's entry): CLI_OK, or CLI_USAGE after printing the error. */
    int (*parse)(int argc, char **argv);
    int (*run)(int argc, char **argv); /* argv[0] is the command's name */
} cli_command;

extern const cli_command cli_demo_command, cli_trace_command, cli_params_command,
    cli_forward_command, cli_train_command, cli_grad_command, cli_heatmap_command,
    cli_version_command, cli_sdpa_command, cli_generate_command, cli_pretrain_command,
    cli_mask_command;

/* The program's name, which starts every error line ("attn: ..."): each
 * program that uses these helpers defines it (main.c, bench/attn_bench.c). */
extern const char cli_program_name[];

/* The whole command line (argv[0] is the program): dispatch, help, and with
 * parse_only the commands' parse instead of run. Returns the exit code
 * before the stdout check, which main() adds (cli_finish). */
int cli_main(int argc, char **argv, bool parse_only);
/* Flushes stdout; on a write error prints it and returns CLI_FAILED (or rc
 * if rc already says failure), else rc. */
int cli_finish(int rc);
/* Flushes stdout before a command puts its files in place: false when what
 * it printed did not all get out (cli_finish reports it at exit), so that a
 * command that fails leaves no file new or changed. A run that SIGPIPE
 * stopped passes: its reader is gone, cli_finish does not report its
 * failed writes, and it keeps what it saves as it stops. */
bool cli_stdout_flushed(void);

/* Prints "<program>: <message>" to stderr and returns CLI_USAGE. Control
 * characters (and bytes that are not UTF-8) from the values it quotes are
 * written as \n, \t, \xNN, so no argument can move the cursor or recolour
 * the terminal. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
int cli_usage_error(const char *fmt, ...);

/* Prints "<program>: <message>" (escaped likewise): a line that reports,
 * not an error ("attn: wrote o.npy (2x4x8x16 float32)"). */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
void cli_note(const char *fmt, ...);

/* Prints "<program>: <what>: <ctx's last error>" (escaped likewise) and returns
 * CLI_FAILED. */
int cli_library_error(const attn_ctx *ctx, const char *what);

/* attn_ctx_new, its failure printed: CLI_FAILED out of memory; CLI_USAGE
 * for kernels this CPU does not run (named by the ATTN_KERNELS environment
 * variable when it chose them) or too many threads. */
int cli_ctx_new(const attn_ctx_config *cfg, attn_ctx **out);

/* --kernels NAME: one of attn_kernels_name's names, run by this CPU (a
 * usage error naming it otherwise). */
int cli_parse_kernels(const char *value, attn_kernels *out);

/* A KV cache element type by its CLI name (f32, bf16, f16, fp8, int8,
 * int4; fp8 is e4m3): CLI_OK, or a usage error naming opt and value. */
int cli_parse_kv_dtype(const char *opt, const char *value, attn_dtype *out);
/* The CLI name of a KV cache element type ("?" for others). */
const char *cli_kv_dtype_name(attn_dtype dtype);

/* Prints "<program>: <message>" (escaped likewise) and returns CLI_FAILED: for
 * failures that are not the user's (out of memory). */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
int cli_failure(const char *fmt, ...);

/* Strict parsers: the whole string must be the number. cli_parse_double
 * keeps subnormal values (1e-310) and refuses text beyond double's range
 * (1e400, 1e-400), which cli_bad_number then names. */
bool cli_parse_size(const char *text, size_t *out);
bool cli_parse_u64(const char *text, uint64_t *out);
bool cli_parse_double(const char *text, double *out);
/* The usage error for a value of opt that did not parse as a double:
 * "<opt>: expected <expected>, got '<text>'", or that it is out of range. */
int cli_bad_number(const char *opt, const char *text, const char *expected);

/* CLI_OK when an additive array (a float mask, a bias) holds no NaN and no
 * +inf (either would make its rows NaN; -inf hides a key), else the failure
 * naming opt, path, the value and its index in the file. */
int cli_finite_additive(const char *opt, const char *path, const attn_npy *a);

/* "(2, 1, 5)" into buf. */
void cli_format_shape(char *buf, size_t size, size_t rank, const size_t *shape);

/* "--name value" options: the value after argv[*i] (advancing *i), or NULL
 * with an error printed when the option is not in the NULL-terminated
 * known list or its value is missing. argv[0] is the command's name, or
 * cli_program_name in a program without commands. */
const char *cli_option_value(int argc, char **argv, int *i, const char *const *known);

/* True when argv[1..] asks for help: -h or --help where an option may
 * stand, skipping the value that follows each of value_options. */
bool cli_wants_help(int argc, char **argv, const char *const *value_options);

/* The number of online CPUs, at least 1. */
size_t cli_default_threads(void);

/* A monotonic clock in seconds, for progress lines and timings. */
double cli_now_seconds(void);
/* seconds as "m:ss" or "h:mm:ss", past 1e7 s as "N days" (0:00 for a
 * negative or NaN value). */
void cli_format_duration(double seconds, char *buf, size_t size);

/* The CPU as attn_cpu_info_get sees it, on two lines after prefix (attn
 * version, the header of attn-bench): print_cpu.c. */
void cli_print_cpu(FILE *out, const char *prefix);

/* Writes s[0, n) to out as Python prints s.decode("utf-8", errors="replace")
 * (tiktoken's decode, whose text the book prints): each maximal ill-formed
 * subpart as U+FFFD; newline_as_space writes '\n' as ' '. With more bytes
 * to come (final false) a character cut at the end is left for the next
 * call. Returns the bytes of s it wrote. */
size_t cli_write_text(FILE *out, const char *s, size_t n, bool final, bool newline_as_space);

#endif /* ATTN_CLI_H */
