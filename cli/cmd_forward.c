/* cmd_forward.c — attn forward: any attention variant on a .npy input. */
#include "cli.h"
#include "module_options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char forward_help[] =
    "usage: attn forward --module simple|sa1|sa2|causal|mha-wrapper|mha|gpt2\n"
    "                    --input x.npy --output y.npy [--seed S] [--d-in N] [--d-out N]\n"
    "                    [--heads N] [--context N] [--qkv-bias] [--dropout P --train]\n"
    "                    [--scale S] [--mask neg-inf|renormalize|none]\n"
    "                    [--bernoulli mt19937|mkl] [--threads N]\n"
    "\n"
    "Runs one attention variant on a float32 .npy input of shape (B, T, d_in) or\n"
    "(T, d_in) and writes the output with the same rank. The weights are those\n"
    "the seeds' PyTorch class holds after torch.manual_seed(S) (default 123).\n"
    "  --d-in       defaults to the input's last dimension\n"
    "  --d-out      output width; for mha-wrapper the width of each head; simple\n"
    "               and gpt2 keep d_in (gpt2: n_embd)\n"
    "  --heads      num_heads (mha-wrapper, mha) or n_head (gpt2); default 1\n"
    "  --context    context_length / block_size; default T\n"
    "  --dropout P  dropout probability; draws only with --train\n"
    "  --scale S    score scale; default 1/sqrt(head_dim)\n"
    "  --mask       how causal modules mask the future (default neg-inf)\n"
    "  --bernoulli  dropout draws of PyTorch builds without MKL (mt19937,\n"
    "               default) or with MKL on Intel CPUs (mkl)\n"
    "  --threads    worker threads (default: all online CPUs)\n";

int cli_forward(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(forward_help, stdout);
        return CLI_OK;
    }
    cli_module_options o = {.module = NULL, .heads = 1};
    const char *input = NULL, *output = NULL;
    uint64_t seed = 123;
    bool train = false;
    size_t threads = cli_default_threads();
    attn_bernoulli_method bernoulli = ATTN_BERNOULLI_MT19937;
    static const char *const options[] = {"--module", "--d-in",    "--d-out",   "--heads",
                                           "--context", "--dropout", "--scale",   "--mask",
                                           "--input",  "--output",  "--seed",    "--threads",
                                           "--bernoulli", NULL};
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--qkv-bias") == 0) {
            o.qkv_bias = true;
            continue;
        }
        if (strcmp(opt, "--train") == 0) {
            train = true;
            continue;
        }
        const char *value = cli_option_value(argc, argv, &i, options);
        if (!value) return CLI_USAGE;
        int handled = cli_module_option(opt, value, &o);
        if (handled == CLI_USAGE) return CLI_USAGE;
        if (handled) continue;
        if (strcmp(opt, "--input") == 0) input = value;
        else if (strcmp(opt, "--output") == 0) output = value;
        else if (strcmp(opt, "--seed") == 0) {
            if (!cli_parse_u64(value, &seed))
                return cli_usage_error("--seed: expected a non-negative integer, got '%s'", value);
        } else if (strcmp(opt, "--threads") == 0) {
            if (!cli_parse_size(value, &threads) || threads == 0)
                return cli_usage_error("--threads: expected a positive integer, got '%s'", value);
        } else if (strcmp(opt, "--bernoulli") == 0) {
            if (strcmp(value, "mt19937") == 0) bernoulli = ATTN_BERNOULLI_MT19937;
            else if (strcmp(value, "mkl") == 0) bernoulli = ATTN_BERNOULLI_MKL_MCG31;
            else return cli_usage_error("--bernoulli: expected mt19937 or mkl, got '%s'", value);
        }
    }
    if (!o.module) return cli_usage_error("forward: --module is required (try 'attn forward --help')");
    if (!input || !output) return cli_usage_error("forward: --input and --output are required");
    if (o.dropout > 0.0 && !train)
        fprintf(stderr, "attn: note: --dropout has no effect without --train (eval mode)\n");

    attn_ctx *ctx;
    if (attn_ctx_new(&(attn_ctx_config){.num_threads = threads}, &ctx) != ATTN_OK)
        return cli_usage_error("--threads: %zu is too many", threads);
    int rc = CLI_OK;
    attn_npy x = {0};
    attn_rng *rng = NULL;
    attn_module *m = NULL;
    float *y = NULL;
    if (attn_npy_read(ctx, input, &x) != ATTN_OK) {
        rc = cli_library_error(ctx, "--input");
        goto done;
    }
    if (x.ndim != 2 && x.ndim != 3) {
        rc = cli_usage_error("--input: expected shape (B, T, d_in) or (T, d_in), got %zu dimensions",
                             x.ndim);
        goto done;
    }
    size_t batch = x.ndim == 3 ? x.shape[0] : 1, tokens = x.shape[x.ndim - 2];
    size_t width = x.shape[x.ndim - 1];
    if (batch == 0 || tokens == 0) {
        rc = cli_usage_error("--input: empty shape (batch %zu, tokens %zu)", batch, tokens);
        goto done;
    }
    if ((rc = cli_module_resolve(&o, width, tokens)) != CLI_OK) goto done;
    if (attn_rng_new(ctx, seed, &rng) != ATTN_OK ||
        attn_rng_set_bernoulli_method(rng, bernoulli) != ATTN_OK ||
        cli_build_module(ctx, rng, &o, &m) != ATTN_OK) {
        rc = cli_library_error(ctx, "forward");
        goto done;
    }
    attn_module_set_training(m, train);
    size_t d_out = attn_module_d_out(m);
    size_t y_count = batch * tokens; /* overflow is checked by the forward below */
    y = calloc(y_count, d_out * sizeof *y);
    if (!y) {
        rc = cli_usage_error("out of memory for the output (%zu x %zu floats)", y_count, d_out);
        goto done;
    }
    if (attn_module_forward(m, x.data, batch, tokens, y, rng) != ATTN_OK) {
        rc = cli_library_error(ctx, "forward");
        goto done;
    }
    size_t y_shape[3] = {batch, tokens, d_out};
    const size_t *shape = x.ndim == 3 ? y_shape : y_shape + 1;
    if (attn_npy_write(ctx, output, y, x.ndim, shape) != ATTN_OK)
        rc = cli_library_error(ctx, "--output");
done:
    free(y);
    attn_module_free(m);
    attn_rng_free(rng);
    attn_npy_free(&x);
    attn_ctx_free(ctx);
    return rc;
}
