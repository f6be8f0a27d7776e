/* cmd_trace.c — attn trace: the shape of every intermediate of a forward. */
#include "cli.h"
#include "module_options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_shape(size_t ndim, const size_t *shape) {
    putchar('[');
    for (size_t i = 0; i < ndim; i++) printf(i ? ", %zu" : "%zu", shape[i]);
    putchar(']');
}

static const char trace_help[] =
    "usage: attn trace [--preset NAME] [--module mha|gpt2|causal|mha-wrapper|sa2|sa1|simple]\n"
    "                  [--batch N] [--tokens N] [--seed S]\n"
    "\n"
    "Runs one forward pass of the module at the preset's size on random input\n"
    "and prints the shape of every intermediate tensor, in order, like the\n"
    "seeds' call-flow tables. Defaults: --preset gpt2-small --module mha\n"
    "--batch 2 --tokens 6 --seed 123.\n";

typedef struct trace_state {
    int step;
} trace_state;

static void print_trace_row(void *user, const char *module, const char *name, size_t ndim,
                            const size_t *shape, const float *data) {
    trace_state *state = user;
    printf("%3d  %-22s %-34s ", ++state->step, module, name);
    print_shape(ndim, shape);
    printf("%s\n", data ? "" : "  (view)");
}

int cli_trace(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(trace_help, stdout);
        return CLI_OK;
    }
    const char *preset_name = "gpt2-small", *module = "mha";
    size_t batch = 2, tokens = 6;
    uint64_t seed = 123;
    static const char *const options[] = {"--preset", "--module", "--batch", "--tokens", "--seed",
                                           NULL};
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i], *value = cli_option_value(argc, argv, &i, options);
        if (!value) return CLI_USAGE;
        if (strcmp(opt, "--preset") == 0) preset_name = value;
        else if (strcmp(opt, "--module") == 0) module = value;
        else if (strcmp(opt, "--batch") == 0) {
            if (!cli_parse_size(value, &batch) || batch == 0)
                return cli_usage_error("--batch: expected a positive integer, got '%s'", value);
        } else if (strcmp(opt, "--tokens") == 0) {
            if (!cli_parse_size(value, &tokens) || tokens == 0)
                return cli_usage_error("--tokens: expected a positive integer, got '%s'", value);
        } else if (strcmp(opt, "--seed") == 0) {
            if (!cli_parse_u64(value, &seed))
                return cli_usage_error("--seed: expected a non-negative integer, got '%s'", value);
        }
    }
    if (!cli_known_module(module))
        return cli_usage_error("--module: expected one of %s, got '%s'", cli_module_names, module);

    trace_state state = {0};
    attn_ctx *ctx;
    attn_ctx_config ctx_cfg = {.num_threads = cli_default_threads(), .trace = print_trace_row,
                               .trace_user = &state};
    if (attn_ctx_new(&ctx_cfg, &ctx) != ATTN_OK) return cli_usage_error("cannot create a context");
    attn_gpt2_preset preset;
    int rc = CLI_OK;
    attn_rng *rng = NULL;
    attn_module *m = NULL;
    float *x = NULL, *y = NULL;
    if (attn_gpt2_preset_find(ctx, preset_name, &preset) != ATTN_OK) {
        rc = cli_usage_error("--preset: %s", attn_ctx_last_error(ctx));
        goto done;
    }
    cli_module_options o = {.module = module, .d_in = preset.n_embd, .d_out = preset.n_embd,
                        .heads = preset.n_head, .context = preset.context_length,
                        .qkv_bias = preset.qkv_bias};
    /* The wrapper's d_out is per head, so its concatenation is n_embd wide. */
    if (strcmp(module, "mha-wrapper") == 0) o.d_out = preset.n_embd / preset.n_head;
    if (attn_rng_new(ctx, seed, &rng) != ATTN_OK || cli_build_module(ctx, rng, &o, &m) != ATTN_OK) {
        rc = cli_library_error(ctx, "trace");
        goto done;
    }
    attn_module_set_training(m, false);
    size_t d_in = attn_module_d_in(m), d_out = attn_module_d_out(m);
    size_t rows = batch * tokens;
    bool fits = rows / batch == tokens && rows <= (size_t)-1 / sizeof(float) / (d_in + d_out);
    x = fits ? calloc(rows * d_in, sizeof *x) : NULL;
    y = fits ? calloc(rows * d_out, sizeof *y) : NULL;
    if (!x || !y) {
        rc = cli_usage_error("out of memory for batch %zu x tokens %zu", batch, tokens);
        goto done;
    }
    attn_rng_rand(rng, x, batch * tokens * d_in);
    printf("%s (%s: n_embd %zu, n_head %zu, head_dim %zu), batch %zu, tokens %zu\n\n",
           attn_module_class_name(m), preset.name, preset.n_embd, preset.n_head,
           preset.n_embd / preset.n_head, batch, tokens);
    printf("%3s  %-22s %-34s %s\n", "#", "module", "tensor", "shape");
    size_t in_shape[3] = {batch, tokens, d_in};
    print_trace_row(&state, attn_module_class_name(m), "x (input)", 3, in_shape, x);
    if (attn_module_forward(m, x, batch, tokens, y, NULL) != ATTN_OK)
        rc = cli_library_error(ctx, "trace");
done:
    free(x);
    free(y);
    attn_module_free(m);
    attn_rng_free(rng);
    attn_ctx_free(ctx);
    return rc;
}
