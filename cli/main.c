/* main.c — the attn command: a table of subcommands and the dispatch. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

typedef struct cli_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the command's name */
} cli_command;

static const cli_command commands[] = {
    {"demo", "the seeds' walk-through on \"Your journey starts with one step\"", cli_demo},
    {"trace", "the shape of every intermediate of a module's forward pass", cli_trace},
    {"params", "parameter counts per tensor and in total for a GPT-2 preset", cli_params},
    {"forward", "run any attention variant on a .npy input", cli_forward},
    {"train", "train a small language model on copy, reverse, sort or induction", cli_train},
    {"grad", "forward and backward of any variant: every gradient as .npy", cli_grad},
    {"heatmap", "attention weights as a PNG heat map or in the terminal", cli_heatmap},
    {"bench", "time the kernels against the machine's peak (OpenBLAS, if installed)", cli_bench},
};

static void print_usage(FILE *out) {
    fputs("usage: attn <command> [options]\n"
          "\n"
          "The attention mechanisms of transformer language models, number for number\n"
          "with PyTorch.\n"
          "\n"
          "commands:\n",
          out);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fputs("  version   print the library version\n"
          "\n"
          "Run 'attn <command> --help' for a command's options.\n",
          out);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_usage(stderr);
        return CLI_USAGE;
    }
    const char *command = argv[1];
    if (strcmp(command, "-h") == 0 || strcmp(command, "--help") == 0 ||
        strcmp(command, "help") == 0) {
        print_usage(stdout);
        return CLI_OK;
    }
    if (strcmp(command, "version") == 0 || strcmp(command, "--version") == 0) {
        printf("attn %s\n", attn_version());
        return CLI_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(command, commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    return cli_usage_error("unknown command '%s' (try 'attn --help')", command);
}
