/* cmd_forward.c — attn forward: any attention variant on a .npy input. */
#include "cli.h"
#include "module_options.h"
#include "weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char forward_help_head[] =
    "usage: attn forward --module simple|sa1|sa2|causal|mha-wrapper|mha|gpt2\n"
    "                    --input x.npy --output y.npy [--seed S] [--d-in N] [--d-out N]\n"
    "                    [--heads N] [--context N] [--qkv-bias] [--dropout P --train]\n"
    "                    [--scale S] [--mask neg-inf|renormalize|none]\n"
    "                    [--bernoulli mt19937|mkl|philox] [--threads N]\n"
    "                    [--kernels auto|reference|portable|avx2|avx512]\n"
    "                    [--weights FILE.safetensors [--layer N]]\n"
    "\n"
    "Runs one attention variant on a float32 .npy input of shape (B, T, d_in) or\n"
    "(T, d_in) and writes the output with the same rank. The weights are those\n"
    "the seeds' PyTorch class holds after torch.manual_seed(S) (default 123),\n"
    "or those of a safetensors file (--weights).\n";

typedef struct forward_options {
    const char *output;
    cli_weights_options weights;
} forward_options;

static int take_option(void *user, const char *opt, const char *value) {
    forward_options *f = user;
    int taken = cli_weights_option(opt, value, &f->weights);
    if (taken == CLI_USAGE) return CLI_USAGE;
    if (!taken) f->output = value; /* --output */
    return CLI_OK;
}

int cli_forward(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(forward_help_head, stdout);
        fputs(cli_run_options_help, stdout);
        fputs(cli_weights_help, stdout);
        return CLI_OK;
    }
    cli_run_options o = cli_run_defaults();
    forward_options f = {0};
    static const char *const own[] = {"--output", "--weights", "--layer", NULL};
    cli_extra_options extra = {.options = own, .take = take_option, .user = &f};
    if (cli_parse_run_options(argc, argv, &o, &extra) != CLI_OK) return CLI_USAGE;
    const char *output = f.output;
    for (int i = 1; i < argc; i++)
        f.weights.have_heads = f.weights.have_heads || strcmp(argv[i], "--heads") == 0;
    if (!o.module.module)
        return cli_usage_error("forward: --module is required (try 'attn forward --help')");
    if (!o.input || !output) return cli_usage_error("forward: --input and --output are required");
    if (cli_weights_check(&f.weights, o.module.module) != CLI_OK) return CLI_USAGE;
    if (o.module.dropout > 0.0 && !o.train)
        fprintf(stderr, "attn: note: --dropout has no effect without --train (eval mode)\n");

    cli_run run;
    float *y = NULL;
    int rc = cli_run_open(&run, &o);
    if (rc != CLI_OK) goto done;
    if ((rc = cli_load_weights(run.ctx, run.module, o.module.module, &f.weights)) != CLI_OK)
        goto done;
    /* inference only: nothing to keep for a backward */
    attn_module_set_grad_enabled(run.module, false);
    size_t d_out = attn_module_d_out(run.module);
    size_t y_count = run.batch * run.tokens; /* overflow is checked by the forward below */
    y = calloc(y_count, d_out * sizeof *y);
    if (!y) {
        rc = cli_usage_error("out of memory for the output (%zu x %zu floats)", y_count, d_out);
        goto done;
    }
    if (attn_module_forward(run.module, run.x.data, run.batch, run.tokens, y, run.rng) != ATTN_OK) {
        rc = cli_library_error(run.ctx, "forward");
        goto done;
    }
    size_t shape[3];
    size_t rank = cli_run_shape(&run, d_out, shape);
    if (attn_npy_write(run.ctx, output, y, rank, shape) != ATTN_OK)
        rc = cli_library_error(run.ctx, "--output");
done:
    free(y);
    cli_run_close(&run);
    return rc;
}
