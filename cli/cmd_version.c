/* cmd_version.c — attn version: the library's version, and the CPU as the
 * library sees it (what its kernels are chosen and tuned for: print_cpu.c). */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static int parse_version(int argc, char **argv) {
    if (argc > 1) return cli_usage_error("version: unexpected argument '%s'", argv[1]);
    return CLI_OK;
}

static int run_version(int argc, char **argv) {
    int rc = parse_version(argc, argv);
    if (rc != CLI_OK) return rc;
    printf("attn %s\n", attn_version());
    /* attn --version stays the one line scripts read */
    if (strcmp(argv[0], "--version") == 0) return rc;
    cli_print_cpu(stdout, "cpu: ");
    /* the kernels a ctx of the default kernels (ATTN_KERNELS, else the
     * best the CPU runs) chooses, once */
    attn_ctx *ctx = NULL;
    if (attn_ctx_new(NULL, &ctx) == ATTN_OK) {
        char kernels[512];
        attn_ctx_describe_kernels(ctx, kernels, sizeof kernels);
        printf("kernels: %s\n", kernels);
    }
    attn_ctx_free(ctx);
    return rc;
}

static const char *const no_options[] = {NULL};

const cli_command cli_version_command = {
    .name = "version",
    .summary = "print the library version and the CPU it runs on",
    .help = "usage: attn version\n\nPrints the version of the attn library, attn X.Y.Z, then\n"
            "two lines on the CPU as the library sees it: model, vendor, family and\n"
            "model numbers, the microarchitecture its kernels are tuned for, the\n"
            "FMA width, the caches of a core and the vector extensions it can use;\n"
            "then the kernels the library chose for this CPU, once, by kind: the\n"
            "fused float and bf16 attention, decoding, the float and 16-bit GEMM\n"
            "and the matrix-vector products (ATTN_KERNELS=reference|portable|avx2|\n"
            "avx512 chooses another instruction set).\n"
            "attn --version prints the first line alone.\n",
    .value_options = no_options,
    .parse = parse_version,
    .run = run_version,
};
