/* cmd_forward.c — attn forward: any attention variant on a .npy input. */
#include "cli.h"
#include "context_parallel.h"
#include "module_options.h"
#include "outputs.h"
#include "weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char forward_help_head[] =
    "usage: attn forward --module simple|sa1|sa2|causal|mha-wrapper|mha|gpt2|\n"
    "                             gqa|mla|swa\n"
    "                    --input x.npy --output y.npy [--seed S] [--d-in N] [--d-out N]\n"
    "                    [--heads N] [--context N] [--qkv-bias] [--dropout P --train]\n"
    "                    [--scale S] [--mask neg-inf|renormalize|none]\n"
    "                    [--kv-groups N (gqa)] [--latent-dim N (mla)] [--window W (swa)]\n"
    "                    [--bernoulli mt19937|mkl|philox] [--threads N]\n"
    "                    [--kernels auto|reference|portable|avx2|avx512]\n"
    "                    [--weights FILE.safetensors [--layer N]]\n"
    "                    [--context-parallel ring|zigzag|ulysses (under mpirun)]\n"
    "\n"
    "Runs one attention variant on a float32 .npy input of shape (B, T, d_in) or\n"
    "(T, d_in) and writes the output with the same rank. The weights are those\n"
    "the seeds' PyTorch class (for gqa, mla, swa: the book's chapter-4\n"
    "GroupedQueryAttention, MultiHeadLatentAttention, MultiHeadAttentionWithSWA)\n"
    "holds after torch.manual_seed(S) (default 123),\n"
    "or those of a safetensors file (--weights).\n";

static void print_more_help(FILE *out) {
    fputs(cli_run_options_help, out);
    fputs(cli_weights_help, out);
    fputs(CLI_CONTEXT_PARALLEL_HELP, out);
}

static const char *const forward_value_options[] = {CLI_RUN_VALUE_OPTIONS, "--output",
                                                    "--weights", "--layer",
                                                    "--context-parallel", NULL};

typedef struct forward_options {
    cli_run_options run;
    const char *output;
    cli_weights_options weights;
    const char *context_parallel; /* NULL: one process */
} forward_options;

static int take_option(void *user, const char *opt, const char *value) {
    forward_options *f = user;
    if (strcmp(opt, "--context-parallel") == 0) {
        f->context_parallel = value;
        return cli_context_parallel_check(value);
    }
    int taken = cli_weights_option(opt, value, &f->weights);
    if (taken == CLI_USAGE) return CLI_USAGE;
    if (!taken) f->output = value; /* --output */
    return CLI_OK;
}

static int parse_args(int argc, char **argv, forward_options *f) {
    *f = (forward_options){.run = cli_run_defaults()};
    static const char *const own[] = {"--output", "--weights", "--layer", "--context-parallel",
                                      NULL};
    cli_extra_options extra = {.options = own, .take = take_option, .user = f};
    if (cli_parse_run_options(argc, argv, &f->run, &extra) != CLI_OK) return CLI_USAGE;
    for (int i = 1; i < argc; i++)
        f->weights.have_heads = f->weights.have_heads || strcmp(argv[i], "--heads") == 0;
    if (!f->run.module.module)
        return cli_usage_error("forward: --module is required (try 'attn forward --help')");
    if (!f->run.input || !f->output)
        return cli_usage_error("forward: --input and --output are required");
    if (cli_weights_check(&f->weights, f->run.module.module) != CLI_OK) return CLI_USAGE;
    return CLI_OK;
}

static int parse_forward(int argc, char **argv) {
    forward_options f;
    return parse_args(argc, argv, &f);
}

static int run_forward(int argc, char **argv) {
    forward_options f;
    int rc = parse_args(argc, argv, &f);
    if (rc != CLI_OK) return rc;
    cli_run_options *o = &f.run;
    /* under mpirun rank 0 says it, once (context_parallel.c) */
    if (o->module.dropout > 0.0 && !o->train && !f.context_parallel)
        fprintf(stderr, "attn: note: --dropout has no effect without --train (eval mode)\n");
    if (f.context_parallel) {
#ifdef ATTN_HAVE_MPI
        return cli_cp_forward(o, f.context_parallel, &f.weights, f.output);
#else
        return cli_usage_error("--context-parallel: this build has no MPI (install Open MPI, "
                               "then configure with -DATTN_MPI=ON)");
#endif
    }

    cli_run run;
    cli_outputs out;
    cli_outputs_init(&out, NULL);
    float *y = NULL;
    size_t at;
    rc = cli_run_open(&run, o);
    if (rc != CLI_OK) goto done;
    cli_outputs_init(&out, run.ctx);
    if ((rc = cli_outputs_add(&out, "--output", f.output, &at)) != CLI_OK ||
        (rc = cli_outputs_not_input(&out, "--input", o->input)) != CLI_OK ||
        (rc = cli_outputs_not_input(&out, "--weights", f.weights.path)) != CLI_OK)
        goto done;
    if ((rc = cli_load_weights(run.ctx, run.module, o->module.module, &f.weights)) != CLI_OK)
        goto done;
    /* inference only: nothing to keep for a backward */
    if (attn_module_set_grad_enabled(run.module, false) != ATTN_OK) {
        rc = cli_library_error(run.ctx, "forward");
        goto done;
    }
    size_t d_out = attn_module_d_out(run.module);
    size_t y_count = run.batch * run.tokens; /* overflow is checked by the forward below */
    y = calloc(y_count, d_out * sizeof *y);
    if (!y) {
        rc = cli_failure("out of memory for the output (%zu x %zu floats)", y_count, d_out);
        goto done;
    }
    if (attn_module_forward(run.module, run.x.data, run.batch, run.tokens, y, run.rng) != ATTN_OK) {
        rc = cli_library_error(run.ctx, "forward");
        goto done;
    }
    size_t shape[3];
    size_t rank = cli_run_shape(&run, d_out, shape);
    if ((rc = cli_outputs_npy(&out, at, y, rank, shape)) == CLI_OK)
        rc = cli_outputs_commit(&out, false);
done:
    cli_outputs_free(&out);
    free(y);
    cli_run_close(&run);
    return rc;
}

const cli_command cli_forward_command = {
    .name = "forward",
    .summary = "run any attention variant on a .npy input",
    .help = forward_help_head,
    .more_help = print_more_help,
    .value_options = forward_value_options,
    .parse = parse_forward,
    .run = run_forward,
};
