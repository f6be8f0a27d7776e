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
    "                    [--weights FILE.safetensors [--layer N]]\n"
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
    "  --threads    worker threads (default: all online CPUs)\n"
    "  --weights    load the weights from a safetensors file instead: the module's\n"
    "               state_dict names (as attn or safetensors.torch.save_file write\n"
    "               them), or, for gpt2, a Hugging Face GPT-2 checkpoint\n"
    "               (h.N.attn.c_attn.weight, ...; --heads must be the model's\n"
    "               n_head, 12 for GPT-2 small)\n"
    "  --layer N    the checkpoint's layer to load (gpt2; default 0)\n";

/* --weights: the module's state_dict names, or a Hugging Face GPT-2
 * checkpoint's layer (gpt2 with --layer, or a file without c_attn.weight). */
static int load_weights(attn_ctx *ctx, attn_module *m, const cli_module_options *o,
                        const char *path, bool have_layer, size_t layer, bool have_heads) {
    attn_safetensors *st;
    if (attn_safetensors_open(ctx, path, &st) != ATTN_OK) return cli_library_error(ctx, "--weights");
    attn_safetensors_info info;
    bool hf = strcmp(o->module, "gpt2") == 0 &&
              (have_layer || attn_safetensors_find(st, "c_attn.weight", &info) != ATTN_OK);
    int rc = CLI_OK;
    if (hf && !have_heads)
        rc = cli_usage_error("forward: a Hugging Face GPT-2 checkpoint does not record n_head: give "
                             "--heads (12 for GPT-2 small, 16 medium, 20 large, 25 xl)");
    else if ((hf ? attn_gpt2_load_hf_from(st, m, layer)
                 : attn_safetensors_load_module_from(st, m, NULL)) != ATTN_OK)
        rc = cli_library_error(ctx, "--weights");
    attn_safetensors_free(st);
    return rc;
}

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
                                           "--bernoulli", "--weights", "--layer", NULL};
    const char *weights = NULL;
    size_t layer = 0;
    bool have_layer = false, have_heads = false;
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
        if (strcmp(opt, "--heads") == 0) have_heads = true;
        int handled = cli_module_option(opt, value, &o);
        if (handled == CLI_USAGE) return CLI_USAGE;
        if (handled) continue;
        if (strcmp(opt, "--input") == 0) input = value;
        else if (strcmp(opt, "--weights") == 0) weights = value;
        else if (strcmp(opt, "--layer") == 0) {
            if (!cli_parse_size(value, &layer))
                return cli_usage_error("--layer: expected a non-negative integer, got '%s'", value);
            have_layer = true;
        }
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
    if (have_layer && !weights) return cli_usage_error("forward: --layer needs --weights");
    if (have_layer && strcmp(o.module, "gpt2") != 0)
        return cli_usage_error("forward: --layer applies to --module gpt2 (Hugging Face GPT-2 "
                               "checkpoints), not %s", o.module);
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
    if (weights && (rc = load_weights(ctx, m, &o, weights, have_layer, layer, have_heads)) != CLI_OK)
        goto done;
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
