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
    "  --context    context_length (causal, mha-wrapper, mha) or block_size\n"
    "               (gpt2); default T\n"
    "  --qkv-bias   biases in W_query, W_key, W_value (sa2, causal, mha-wrapper,\n"
    "               mha; gpt2's c_attn always has one)\n"
    "  --dropout P  dropout probability (causal, mha-wrapper, mha, gpt2); draws\n"
    "               only with --train (training mode)\n"
    "  --scale S    multiplies the scores (every module but simple), rounded to\n"
    "               float32 as in PyTorch; 0 or absent: 1/sqrt(head_dim)\n"
    "  --mask       how causal, mha-wrapper and mha mask the future (default\n"
    "               neg-inf; gpt2 always uses neg-inf)\n"
    "  --bernoulli  dropout draws of PyTorch builds without MKL (mt19937,\n"
    "               default) or with MKL on Intel CPUs (mkl)\n"
    "  --threads    worker threads (default: all online CPUs)\n";

typedef struct forward_args {
    cli_module_options o;
    const char *input, *output;
    uint64_t seed;
    size_t threads;
    attn_bernoulli_method bernoulli;
} forward_args;

static const char *const forward_options[] = {CLI_MODULE_VALUE_OPTIONS, "--input", "--output",
                                              "--seed", "--threads", "--bernoulli", NULL};

static int parse_args(int argc, char **argv, forward_args *a) {
    *a = (forward_args){.o = {.module = NULL, .heads = 1}, .seed = 123,
                        .threads = cli_default_threads(), .bernoulli = ATTN_BERNOULLI_MT19937};
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (cli_module_flag(opt)) {
            cli_module_option(opt, NULL, &a->o);
            continue;
        }
        const char *value = cli_option_value(argc, argv, &i, forward_options);
        if (!value) return CLI_USAGE;
        int handled = cli_module_option(opt, value, &a->o);
        if (handled == CLI_USAGE) return CLI_USAGE;
        if (handled) continue;
        if (strcmp(opt, "--input") == 0) a->input = value;
        else if (strcmp(opt, "--output") == 0) a->output = value;
        else if (strcmp(opt, "--seed") == 0) {
            if (!cli_parse_u64(value, &a->seed))
                return cli_usage_error("--seed: expected a non-negative integer, got '%s'", value);
        } else if (strcmp(opt, "--threads") == 0) {
            if (!cli_parse_size(value, &a->threads) || a->threads == 0)
                return cli_usage_error("--threads: expected a positive integer, got '%s'", value);
        } else if (strcmp(opt, "--bernoulli") == 0) {
            if (strcmp(value, "mt19937") == 0) a->bernoulli = ATTN_BERNOULLI_MT19937;
            else if (strcmp(value, "mkl") == 0) a->bernoulli = ATTN_BERNOULLI_MKL_MCG31;
            else return cli_usage_error("--bernoulli: expected mt19937 or mkl, got '%s'", value);
        }
    }
    if (!a->o.module)
        return cli_usage_error("forward: --module is required (try 'attn forward --help')");
    if (!a->input || !a->output) return cli_usage_error("forward: --input and --output are required");
    return cli_module_check(&a->o);
}

static int parse_forward(int argc, char **argv) {
    forward_args a;
    return parse_args(argc, argv, &a);
}

static int run_forward(int argc, char **argv) {
    forward_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc != CLI_OK) return rc;
    cli_module_options o = a.o;
    bool train = o.train;
    if (o.dropout > 0.0 && !train)
        fprintf(stderr, "attn: note: --dropout has no effect without --train (eval mode)\n");

    attn_ctx *ctx;
    if (attn_ctx_new(&(attn_ctx_config){.num_threads = a.threads}, &ctx) != ATTN_OK)
        return cli_usage_error("--threads: %zu is too many", a.threads);
    attn_npy x = {0};
    attn_rng *rng = NULL;
    attn_module *m = NULL;
    float *y = NULL;
    if (attn_npy_read(ctx, a.input, &x) != ATTN_OK) {
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
    if (attn_rng_new(ctx, a.seed, &rng) != ATTN_OK ||
        attn_rng_set_bernoulli_method(rng, a.bernoulli) != ATTN_OK ||
        cli_build_module(ctx, rng, &o, &m) != ATTN_OK) {
        rc = cli_library_error(ctx, "forward");
        goto done;
    }
    attn_module_set_training(m, train);
    size_t d_out = attn_module_d_out(m);
    size_t y_count = batch * tokens; /* overflow is checked by the forward below */
    y = calloc(y_count, d_out * sizeof *y);
    if (!y) {
        rc = cli_failure("out of memory for the output (%zu x %zu floats)", y_count, d_out);
        goto done;
    }
    if (attn_module_forward(m, x.data, batch, tokens, y, rng) != ATTN_OK) {
        rc = cli_library_error(ctx, "forward");
        goto done;
    }
    size_t y_shape[3] = {batch, tokens, d_out};
    const size_t *shape = x.ndim == 3 ? y_shape : y_shape + 1;
    if (attn_npy_write(ctx, a.output, y, x.ndim, shape) != ATTN_OK)
        rc = cli_library_error(ctx, "--output");
done:
    free(y);
    attn_module_free(m);
    attn_rng_free(rng);
    attn_npy_free(&x);
    attn_ctx_free(ctx);
    return rc;
}

const cli_command cli_forward_command = {
    .name = "forward",
    .summary = "run any attention variant on a .npy input",
    .help = forward_help,
    .value_options = forward_options,
    .parse = parse_forward,
    .run = run_forward,
};
