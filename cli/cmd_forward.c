/* cmd_forward.c — attn forward: any attention variant on a .npy input. */
#include "cli.h"
#include "module_options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char forward_help_head[] =
    "usage: attn forward --module simple|sa1|sa2|causal|mha-wrapper|mha|gpt2\n"
    "                    --input x.npy --output y.npy [--seed S] [--d-in N] [--d-out N]\n"
    "                    [--heads N] [--context N] [--qkv-bias] [--dropout P --train]\n"
    "                    [--scale S] [--mask neg-inf|renormalize|none]\n"
    "                    [--bernoulli mt19937|mkl] [--threads N]\n"
    "                    [--weights FILE.safetensors [--layer N]]\n"
    "\n"
    "Runs one attention variant on a float32 .npy input of shape (B, T, d_in) or\n"
    "(T, d_in) and writes the output with the same rank. The weights are those\n"
    "the seeds' PyTorch class holds after torch.manual_seed(S) (default 123),\n"
    "or those of a safetensors file:\n"
    "  --weights F  load the weights from F: the module's state_dict names (as\n"
    "               attn or safetensors.torch.save_file write them), or, for\n"
    "               gpt2, a Hugging Face GPT-2 checkpoint (h.N.attn.c_attn.weight,\n"
    "               ...; --heads must be the model's n_head, 12 for GPT-2 small)\n"
    "  --layer N    the checkpoint's layer to load (gpt2; default 0)\n";

typedef struct forward_options {
    const char *output, *weights;
    size_t layer;
    bool have_layer;
} forward_options;

static int take_option(void *user, const char *opt, const char *value) {
    forward_options *f = user;
    if (strcmp(opt, "--output") == 0) {
        f->output = value;
    } else if (strcmp(opt, "--weights") == 0) {
        f->weights = value;
    } else {
        if (!cli_parse_size(value, &f->layer))
            return cli_usage_error("--layer: expected a non-negative integer, got '%s'", value);
        f->have_layer = true;
    }
    return CLI_OK;
}

/* --weights: the module's state_dict names, or a Hugging Face GPT-2
 * checkpoint's layer (gpt2 with --layer, or a file without c_attn.weight). */
static int load_weights(cli_run *run, const char *module, const forward_options *f,
                        bool have_heads) {
    attn_safetensors *st;
    if (attn_safetensors_open(run->ctx, f->weights, &st) != ATTN_OK)
        return cli_library_error(run->ctx, "--weights");
    attn_safetensors_info info;
    bool hf = strcmp(module, "gpt2") == 0 &&
              (f->have_layer || attn_safetensors_find(st, "c_attn.weight", &info) != ATTN_OK);
    int rc = CLI_OK;
    if (hf && !have_heads)
        rc = cli_usage_error("forward: a Hugging Face GPT-2 checkpoint does not record n_head: give "
                             "--heads (12 for GPT-2 small, 16 medium, 20 large, 25 xl)");
    else if ((hf ? attn_gpt2_load_hf_from(st, run->module, f->layer)
                 : attn_safetensors_load_module_from(st, run->module, NULL)) != ATTN_OK)
        rc = cli_library_error(run->ctx, "--weights");
    attn_safetensors_free(st);
    return rc;
}

int cli_forward(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(forward_help_head, stdout);
        fputs(cli_run_options_help, stdout);
        return CLI_OK;
    }
    cli_run_options o = cli_run_defaults();
    forward_options f = {0};
    static const char *const own[] = {"--output", "--weights", "--layer", NULL};
    cli_extra_options extra = {.options = own, .take = take_option, .user = &f};
    if (cli_parse_run_options(argc, argv, &o, &extra) != CLI_OK) return CLI_USAGE;
    const char *output = f.output;
    bool have_heads = false;
    for (int i = 1; i < argc; i++) have_heads = have_heads || strcmp(argv[i], "--heads") == 0;
    if (!o.module.module)
        return cli_usage_error("forward: --module is required (try 'attn forward --help')");
    if (!o.input || !output) return cli_usage_error("forward: --input and --output are required");
    if (f.have_layer && !f.weights) return cli_usage_error("forward: --layer needs --weights");
    if (f.have_layer && strcmp(o.module.module, "gpt2") != 0)
        return cli_usage_error("forward: --layer applies to --module gpt2 (Hugging Face GPT-2 "
                               "checkpoints), not %s", o.module.module);
    if (o.module.dropout > 0.0 && !o.train)
        fprintf(stderr, "attn: note: --dropout has no effect without --train (eval mode)\n");

    cli_run run;
    float *y = NULL;
    int rc = cli_run_open(&run, &o);
    if (rc != CLI_OK) goto done;
    if (f.weights && (rc = load_weights(&run, o.module.module, &f, have_heads)) != CLI_OK) goto done;
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
