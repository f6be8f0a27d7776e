/* args.c — the argument helpers every command shares, in attn and in
 * attn-bench: strict number parsing, "--name value" options, help
 * requests, one-line usage errors that cannot carry terminal control
 * sequences, and the check that stdout got everything. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "interrupt.h"
#include "utf8.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The length of the UTF-8 character at s (n bytes left) when it is well
 * formed and printable (not a C1 control), else 0. */
static size_t utf8_printable(const unsigned char *s, size_t n) {
    uint32_t cp;
    size_t len = attn_utf8_decode(s, n, &cp);
    return cp >= 0xa0 ? len : 0;
}

size_t cli_write_text(FILE *out, const char *text, size_t n, bool final, bool newline_as_space) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < n) {
        unsigned char b = s[i];
        if (b < 0x80) {
            fputc(b == '\n' && newline_as_space ? ' ' : b, out);
            i++;
            continue;
        }
        /* the character's length by its first byte, and the range of its
         * second (Unicode's table of well-formed sequences) */
        size_t len = b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3
                     : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
        unsigned char lo = 0x80, hi = 0xbf;
        if (b == 0xe0) lo = 0xa0;
        else if (b == 0xed) hi = 0x9f;
        else if (b == 0xf0) lo = 0x90;
        else if (b == 0xf4) hi = 0x8f;
        size_t k = 1;
        while (len && k < len && i + k < n &&
               s[i + k] >= (k == 1 ? lo : 0x80) && s[i + k] <= (k == 1 ? hi : 0xbf))
            k++;
        if (len && k < len && i + k == n && !final) break; /* cut: its rest may come */
        if (len && k == len) fwrite(s + i, 1, len, out);
        else fputs("\xef\xbf\xbd", out);
        i += k;
    }
    return i;
}

/* Writes text with every byte a terminal could act on escaped. */
static void put_escaped(FILE *out, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    size_t n = strlen(text);
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t len = c >= 0x80 ? utf8_printable(s + i, n - i) : 0;
        if (len) {
            fwrite(s + i, 1, len, out);
            i += len;
            continue;
        }
        if (c == '\n') fputs("\\n", out);
        else if (c == '\t') fputs("\\t", out);
        else if (c == '\r') fputs("\\r", out);
        else if (c < 0x20 || c >= 0x7f) fprintf(out, "\\x%02x", (unsigned)c);
        else fputc(c, out);
        i++;
    }
}

/* "<program>: " + message, escaped, + newline. */
static void put_error_line(FILE *out, const char *message) {
    fputs(cli_program_name, out);
    fputs(": ", out);
    put_escaped(out, message);
    fputc('\n', out);
}

/* "<program>: " + the formatted message, escaped, + newline, on stderr, in one
 * write: stderr is unbuffered, and the ranks of an MPI run, writing the
 * same message at once, cut into each other's lines byte by byte. */
static void print_error(const char *fmt, va_list args) {
    va_list again;
    va_copy(again, args);
    char small[512];
    int len = vsnprintf(small, sizeof small, fmt, args);
    char *text = small;
    if (len >= (int)sizeof small) {
        text = malloc((size_t)len + 1);
        if (text) vsnprintf(text, (size_t)len + 1, fmt, again);
        else text = small; /* cut, but still one line */
    }
    va_end(again);
    const char *message = len < 0 ? "(unprintable message)" : text;
    char *line = NULL;
    size_t line_len = 0;
    FILE *buffer = open_memstream(&line, &line_len);
    if (buffer) put_error_line(buffer, message);
    if (buffer && fclose(buffer) == 0 && line) fwrite(line, 1, line_len, stderr);
    else put_error_line(stderr, message); /* no memory for the line: piece by piece */
    free(line);
    if (text != small) free(text);
}

void cli_note(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    print_error(fmt, args);
    va_end(args);
}

int cli_usage_error(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    print_error(fmt, args);
    va_end(args);
    return CLI_USAGE;
}

int cli_failure(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    print_error(fmt, args);
    va_end(args);
    return CLI_FAILED;
}

int cli_library_error(const attn_ctx *ctx, const char *what) {
    return cli_failure("%s: %s", what, attn_ctx_last_error(ctx));
}

int cli_ctx_new(const attn_ctx_config *cfg, attn_ctx **out) {
    attn_status st = attn_ctx_new(cfg, out);
    if (st == ATTN_OK) return CLI_OK;
    /* attn_ctx_new has no ctx to put a message in: its status says which */
    if (st == ATTN_ERR_NO_MEMORY) return cli_failure("cannot create a context: out of memory");
    const char *env = getenv("ATTN_KERNELS");
    if ((!cfg || cfg->kernels == ATTN_KERNELS_AUTO) && env && *env)
        return cli_usage_error("the ATTN_KERNELS environment variable ('%s') names no kernels "
                               "this CPU runs (reference, portable, avx2, avx512)",
                               env);
    if (cfg && !attn_kernels_supported(cfg->kernels))
        return cli_usage_error("--kernels %s: not run by this CPU", attn_kernels_name(cfg->kernels));
    return cli_usage_error("--threads: %zu is too many", cfg ? cfg->num_threads : 0);
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

/* strtod over the whole text: 1 parsed, 0 not a number, -1 out of range. */
static int parse_double(const char *text, double *out) {
    if (!text || !*text || isspace((unsigned char)*text)) return 0;
    errno = 0;
    char *end;
    double value = strtod(text, &end);
    if (end == text || *end) return 0;
    /* ERANGE also flags a subnormal result, which is a number we keep; an
     * overflow (HUGE_VAL) or an underflow to zero is out of range. */
    if (errno == ERANGE && (isinf(value) || value == 0.0)) return -1;
    *out = value;
    return 1;
}

bool cli_parse_double(const char *text, double *out) { return parse_double(text, out) == 1; }

int cli_bad_number(const char *opt, const char *text, const char *expected) {
    double ignored;
    if (parse_double(text, &ignored) == -1)
        return cli_usage_error("%s: '%s' is beyond the range of a double (about 4.9e-324 to "
                               "1.8e308 in magnitude)",
                               opt, text);
    return cli_usage_error("%s: expected %s, got '%s'", opt, expected, text);
}

const char *cli_option_value(int argc, char **argv, int *i, const char *const *known) {
    bool is_known = false;
    for (size_t k = 0; known[k]; k++) is_known = is_known || strcmp(argv[*i], known[k]) == 0;
    if (!is_known) {
        if (strcmp(argv[0], cli_program_name) == 0) /* a program without commands */
            cli_usage_error("unknown option '%s' (try '%s --help')", argv[*i], cli_program_name);
        else
            cli_usage_error("%s: unknown option '%s' (try '%s %s --help')", argv[0], argv[*i],
                            cli_program_name, argv[0]);
        return NULL;
    }
    if (*i + 1 >= argc) {
        cli_usage_error("%s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

bool cli_wants_help(int argc, char **argv, const char *const *value_options) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return true;
        for (size_t k = 0; value_options && value_options[k]; k++) {
            if (strcmp(argv[i], value_options[k]) == 0) {
                i++; /* its value, whatever it reads */
                break;
            }
        }
    }
    return false;
}

size_t cli_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (size_t)n : 1;
}

double cli_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cli_format_duration(double seconds, char *buf, size_t size) {
    if (!(seconds >= 0.0)) seconds = 0.0;
    if (seconds > 1e7) { /* past 115 days: in days, not a clock */
        snprintf(buf, size, "%.3g days", seconds / 86400.0);
        return;
    }
    unsigned long s = (unsigned long)(seconds + 0.5);
    if (s >= 3600)
        snprintf(buf, size, "%lu:%02lu:%02lu", s / 3600, s / 60 % 60, s % 60);
    else
        snprintf(buf, size, "%lu:%02lu", s / 60, s % 60);
}

int cli_parse_kernels(const char *value, attn_kernels *out) {
    for (attn_kernels k = ATTN_KERNELS_AUTO; k <= ATTN_KERNELS_AVX512; k++) {
        if (strcmp(value, attn_kernels_name(k)) != 0) continue;
        if (!attn_kernels_supported(k))
            return cli_usage_error("--kernels: this CPU (or build) does not run %s", value);
        *out = k;
        return CLI_OK;
    }
    return cli_usage_error(
        "--kernels: expected auto, reference, portable, avx2 or avx512, got '%s'", value);
}

static const struct {
    const char *name;
    attn_dtype dtype;
} kv_dtypes[] = {{"f32", ATTN_DTYPE_F32}, {"bf16", ATTN_DTYPE_BF16}, {"f16", ATTN_DTYPE_F16},
                 {"fp8", ATTN_DTYPE_F8_E4M3}, {"int8", ATTN_DTYPE_I8}, {"int4", ATTN_DTYPE_I4}};

int cli_parse_kv_dtype(const char *opt, const char *value, attn_dtype *out) {
    for (size_t i = 0; i < sizeof kv_dtypes / sizeof kv_dtypes[0]; i++)
        if (strcmp(value, kv_dtypes[i].name) == 0) {
            *out = kv_dtypes[i].dtype;
            return CLI_OK;
        }
    return cli_usage_error("%s: expected f32, bf16, f16, fp8, int8 or int4, got '%s'", opt,
                           value);
}

const char *cli_kv_dtype_name(attn_dtype dtype) {
    for (size_t i = 0; i < sizeof kv_dtypes / sizeof kv_dtypes[0]; i++)
        if (kv_dtypes[i].dtype == dtype) return kv_dtypes[i].name;
    return "?";
}

/* Why an earlier flush of stdout failed (cli_stdout_flushed), for
 * cli_finish's line: stdio keeps only that a write failed. */
static int stdout_error;

int cli_finish(int rc) {
    int earlier = stdout_error;
    stdout_error = 0;
    errno = 0;
    bool flushed = fflush(stdout) == 0;
    if (flushed && !ferror(stdout)) return rc;
    /* a run SIGPIPE stopped has said so: its reader is gone, and so its
     * writes failed */
    if (cli_interrupt_pending() == SIGPIPE) return rc;
    int error = !flushed && errno ? errno : earlier;
    if (error)
        fprintf(stderr, "%s: error writing to standard output: %s\n", cli_program_name,
                strerror(error));
    else
        fprintf(stderr, "%s: error writing to standard output\n", cli_program_name);
    return rc == CLI_OK ? CLI_FAILED : rc;
}

bool cli_stdout_flushed(void) {
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return true;
    if (errno) stdout_error = errno;
    return cli_interrupt_pending() == SIGPIPE;
}

int cli_finite_additive(const char *opt, const char *path, const attn_npy *a) {
    for (size_t i = 0; i < a->numel; i++) {
        float x = a->data[i];
        if (!isnan(x) && x != INFINITY) continue;
        char at[160];
        size_t used = 0, rest = i;
        size_t index[ATTN_NPY_MAX_DIMS];
        for (size_t d = a->ndim; d-- > 0;) {
            index[d] = rest % a->shape[d];
            rest /= a->shape[d];
        }
        for (size_t d = 0; d < a->ndim && used < sizeof at; d++)
            used += (size_t)snprintf(at + used, sizeof at - used, "%s%zu", d ? ", " : "",
                                     index[d]);
        return cli_failure("%s: '%s' holds %g at (%s): only -inf hides, and the rest must be "
                           "finite", opt, path, (double)x, a->ndim ? at : "");
    }
    return CLI_OK;
}

void cli_format_shape(char *buf, size_t size, size_t rank, const size_t *shape) {
    size_t used = (size_t)snprintf(buf, size, "(");
    for (size_t i = 0; i < rank && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, i ? ", %zu" : "%zu", shape[i]);
    if (used < size) snprintf(buf + used, size - used, rank == 1 ? ",)" : ")");
}
