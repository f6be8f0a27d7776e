/* cmd_version.c — attn version: the library's version. */
#include "cli.h"

#include <stdio.h>

static int parse_version(int argc, char **argv) {
    if (argc > 1) return cli_usage_error("version: unexpected argument '%s'", argv[1]);
    return CLI_OK;
}

static int run_version(int argc, char **argv) {
    int rc = parse_version(argc, argv);
    if (rc == CLI_OK) printf("attn %s\n", attn_version());
    return rc;
}

static const char *const no_options[] = {NULL};

const cli_command cli_version_command = {
    .name = "version",
    .summary = "print the library version (also: attn --version)",
    .help = "usage: attn version\n\nPrints the version of the attn library: attn X.Y.Z.\n",
    .value_options = no_options,
    .parse = parse_version,
    .run = run_version,
};
