/*
 * fuzz_cli_args.c — libFuzzer target for the attn command's argument
 * parsing: the dispatch, help requests, every command's options and the
 * module options' checks (cli_main with parse_only, which reads no file and
 * runs no module).
 *
 * The input is the argument list, arguments separated by NUL bytes; argv[0]
 * is "attn". What the parser prints goes to /dev/null (ATTN_FUZZ_VERBOSE=1
 * keeps it). The result must be an exit code the CLI documents.
 */
#include "cli.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int devnull = -2, saved_out = -1, saved_err = -1;
    if (devnull == -2) {
        const char *verbose = getenv("ATTN_FUZZ_VERBOSE");
        devnull = verbose && *verbose == '1' ? -1 : open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            saved_out = dup(1);
            saved_err = dup(2);
        }
    }
    /* One copy, NUL-terminated, cut into arguments at each NUL. */
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = "attn";
    for (size_t i = 0; i <= size && argc <= MAX_ARGS;) {
        argv[argc++] = text + i;
        i += strlen(text + i) + 1;
    }
    if (size == 0) argc = 1;
    argv[argc] = NULL;

    if (devnull >= 0) {
        fflush(stdout);
        fflush(stderr);
        dup2(devnull, 1);
        dup2(devnull, 2);
    }
    int rc = cli_main(argc, argv, true);
    if (devnull >= 0) {
        fflush(stdout);
        fflush(stderr);
        dup2(saved_out, 1);
        dup2(saved_err, 2);
    }
    free(text);
    if (rc != CLI_OK && rc != CLI_USAGE && rc != CLI_FAILED) abort();
    return 0;
}
