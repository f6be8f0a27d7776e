/* args.c — the argument helpers every command shares: strict number
 * parsing, "--name value" options, and one-line usage errors. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
