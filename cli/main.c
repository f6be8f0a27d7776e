/* main.c — the attn command: dispatch to a subcommand, and the shared
 * argument helpers. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: attn <command> [options]\n"
    "\n"
    "The attention mechanisms of transformer language models, number for number\n"
    "with PyTorch.\n"
    "\n"
    "commands:\n"
    "  demo      the seeds' walk-through on \"Your journey starts with one step\"\n"
    "  trace     the shape of every intermediate of a module's forward pass\n"
    "  params    parameter counts per tensor and in total for a GPT-2 preset\n"
    "  forward   run any attention variant on a .npy input\n"
    "  version   print the library version\n"
    "\n"
    "Run 'attn <command> --help' for a command's options.\n";

int cli_usage_error(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fputs("attn: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    return CLI_USAGE;
}

int cli_library_error(const attn_ctx *ctx, const char *what) {
    fprintf(stderr, "attn: %s: %s\n", what, attn_ctx_last_error(ctx));
    return CLI_FAILED;
}

bool cli_parse_u64(const char *text, uint64_t *out) {
    /* strtoull would skip blanks and accept a sign: " -1" is not a size. */
    if (!text || !isdigit((unsigned char)*text)) return false;
    errno = 0;
    char *end;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno || *end) return false;
    *out = value;
    return true;
}

bool cli_parse_size(const char *text, size_t *out) {
    uint64_t value;
    if (!cli_parse_u64(text, &value) || value > (uint64_t)(size_t)-1) return false;
    *out = (size_t)value;
    return true;
}

bool cli_parse_double(const char *text, double *out) {
    if (!text || !*text || isspace((unsigned char)*text)) return false;
    errno = 0;
    char *end;
    double value = strtod(text, &end);
    if (errno || *end) return false;
    *out = value;
    return true;
}

const char *cli_option_value(int argc, char **argv, int *i, const char *const *known) {
    bool is_known = false;
    for (size_t k = 0; known[k]; k++) is_known = is_known || strcmp(argv[*i], known[k]) == 0;
    if (!is_known) {
        cli_usage_error("%s: unknown option '%s' (try 'attn %s --help')", argv[0], argv[*i], argv[0]);
        return NULL;
    }
    if (*i + 1 >= argc) {
        cli_usage_error("%s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

bool cli_wants_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return true;
    return false;
}

size_t cli_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (size_t)n : 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage, stderr);
        return CLI_USAGE;
    }
    const char *command = argv[1];
    if (strcmp(command, "-h") == 0 || strcmp(command, "--help") == 0 ||
        strcmp(command, "help") == 0) {
        fputs(usage, stdout);
        return CLI_OK;
    }
    if (strcmp(command, "version") == 0 || strcmp(command, "--version") == 0) {
        printf("attn %s\n", attn_version());
        return CLI_OK;
    }
    /* Subcommands see their own name as argv[0]. */
    if (strcmp(command, "demo") == 0) return cli_demo(argc - 1, argv + 1);
    if (strcmp(command, "trace") == 0) return cli_trace(argc - 1, argv + 1);
    if (strcmp(command, "params") == 0) return cli_params(argc - 1, argv + 1);
    if (strcmp(command, "forward") == 0) return cli_forward(argc - 1, argv + 1);
    return cli_usage_error("unknown command '%s' (try 'attn --help')", command);
}
