/* main.c — the attn command: a table of subcommands, the dispatch, and
 * what every command shares (help; the stdout write check is args.c's). */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "interrupt.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char cli_program_name[] = "attn";

static const cli_command *const commands[] = {
    &cli_demo_command,    &cli_trace_command,   &cli_params_command,
    &cli_forward_command, &cli_train_command,   &cli_pretrain_command,
    &cli_grad_command,
    &cli_heatmap_command, &cli_sdpa_command,    &cli_mask_command,
    &cli_generate_command,
    &cli_version_command,
};
#define NUM_COMMANDS (sizeof commands / sizeof commands[0])

static void print_usage(FILE *out) {
    fputs("usage: attn <command> [options]\n"
          "\n"
          "The attention mechanisms of transformer language models, number for number\n"
          "with PyTorch.\n"
          "\n"
          "commands:\n",
          out);
    for (size_t i = 0; i < NUM_COMMANDS; i++)
        fprintf(out, "  %-9s %s\n", commands[i]->name, commands[i]->summary);
    fputs("\n"
          "Run 'attn <command> --help' (or 'attn help <command>') for a command's options.\n",
          out);
}

static const cli_command *find_command(const char *name) {
    for (size_t i = 0; i < NUM_COMMANDS; i++)
        if (strcmp(name, commands[i]->name) == 0) return commands[i];
    return NULL;
}

/* The benchmark is a program of its own (bench/attn_bench.c), built beside
 * attn and never installed; whoever asks attn for it learns where it is. */
static int bench_pointer(void) {
    return cli_usage_error("bench: the benchmark is a program of its own, attn-bench: "
                           "build/attn-bench after make (it is not installed)");
}

static void print_help(const cli_command *cmd) {
    fputs(cmd->help, stdout);
    if (cmd->more_help) cmd->more_help(stdout);
}

/* attn help [command] */
static int help(int argc, char **argv) {
    if (argc > 3) return cli_usage_error("help: unexpected argument '%s'", argv[3]);
    if (argc == 2) {
        print_usage(stdout);
        return CLI_OK;
    }
    const cli_command *cmd = find_command(argv[2]);
    if (!cmd && strcmp(argv[2], "bench") == 0) return bench_pointer();
    if (!cmd) return cli_usage_error("help: unknown command '%s' (try 'attn --help')", argv[2]);
    print_help(cmd);
    return CLI_OK;
}

int cli_main(int argc, char **argv, bool parse_only) {
    if (argc < 2) {
        print_usage(stderr);
        return CLI_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0 || strcmp(name, "help") == 0)
        return help(argc, argv);
    if (strcmp(name, "--version") == 0) name = "version";
    const cli_command *cmd = find_command(name);
    if (!cmd && strcmp(name, "bench") == 0) return bench_pointer();
    if (!cmd) return cli_usage_error("unknown command '%s' (try 'attn --help')", name);
    if (cli_wants_help(argc - 1, argv + 1, cmd->value_options)) {
        print_help(cmd);
        return CLI_OK;
    }
    return (parse_only ? cmd->parse : cmd->run)(argc - 1, argv + 1);
}

#ifndef ATTN_CLI_NO_MAIN
/* A usage error when a launcher started this process as one of a job of
 * several (Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE, MPICH's Hydra
 * PMI_SIZE) and the command has no --context-parallel: each process would
 * run the whole command alone and write its outputs, and the ranks that
 * wait for it in MPI would wait forever. Exiting nonzero ends the job. */
static int alone_in_a_job(int argc, char **argv) {
    const char *var = "OMPI_COMM_WORLD_SIZE", *size = getenv(var);
    if (!size) size = getenv(var = "PMI_SIZE");
    size_t n = 0;
    if (!size || !cli_parse_size(size, &n) || n < 2) return CLI_OK;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--context-parallel") == 0) return CLI_OK;
    return cli_usage_error("started as one of %zu processes (%s=%s) without "
                           "--context-parallel: each would run the whole command alone; give "
                           "forward or grad --context-parallel, or run attn without the "
                           "launcher",
                           n, var, size);
}

/* Standard input, output and error that the caller closed (`>&-`) are held
 * open on /dev/null, read-only. Otherwise the next file opened takes the
 * free number, and what is printed lands in an output (a --plot PNG, a
 * checkpoint); this way a write to stdout or stderr still fails with
 * EBADF, as on a closed one, and stdin reads as empty. */
static void hold_standard_descriptors(void) {
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        int held = open("/dev/null", O_RDONLY | O_NOCTTY);
        /* without /dev/null (a bare chroot) the number stays free */
        if (held >= 0 && held != fd) close(held);
    }
}

int main(int argc, char **argv) {
    hold_standard_descriptors();
    /* Past a file size limit (ulimit -f) a write then fails with EFBIG, which
     * the writers report and clean up after, instead of the signal killing
     * the process with a temporary left behind. */
    signal(SIGXFSZ, SIG_IGN);
    /* Ctrl-C, SIGTERM, SIGHUP and SIGPIPE remove the outputs' temporaries, and stop
     * a command that polls at its next safe point (interrupt.h). Here and
     * not in cli_main, which the fuzz target calls. */
    cli_interrupt_install();
    /* The AMX tiles, which Linux gives a process that asks (the library
     * never asks by itself), as PyTorch does on its first bf16 product: the
     * bf16 products and bf16 keys of a KV cache run on them. Where the CPU
     * or the OS has none the request is refused, and the kernels do
     * without (`attn version` says which). */
    if (attn_cpu_request_amx() != ATTN_OK) {
        /* nothing to do: no tiles */
    }
    int rc = alone_in_a_job(argc, argv);
    return cli_finish(rc != CLI_OK ? rc : cli_main(argc, argv, false));
}
#endif
