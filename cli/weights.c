/* weights.c — --weights FILE [--layer N] for forward and heatmap. */
#include "weights.h"

#include "cli.h"
#include "module_options.h"

#include <string.h>

const char cli_weights_help[] =
    "  --weights F  load the weights from F (safetensors): the module's state_dict\n"
    "               names (as attn or safetensors.torch.save_file write them), or,\n"
    "               for gpt2, a Hugging Face GPT-2 checkpoint (h.N.attn.c_attn.weight,\n"
    "               ...; --heads must be the model's n_head, 12 for GPT-2 small)\n"
    "  --layer N    the checkpoint's layer to load (gpt2; default 0)\n";

int cli_weights_option(const char *opt, const char *value, cli_weights_options *w) {
    if (strcmp(opt, "--weights") == 0) {
        w->path = value;
        return 1;
    }
    if (strcmp(opt, "--layer") == 0) {
        if (!cli_parse_size(value, &w->layer))
            return cli_usage_error("--layer: expected a non-negative integer, got '%s'", value);
        w->have_layer = true;
        return 1;
    }
    return 0;
}

/* Hugging Face checkpoints (and --layer) are GPT-2's. */
static bool is_gpt2(const char *module) {
    attn_module_kind kind;
    return cli_module_kind(module, &kind) && kind == ATTN_MODULE_GPT2;
}

int cli_weights_check(const cli_weights_options *w, const char *module) {
    if (w->have_layer && !w->path) return cli_usage_error("--layer needs --weights");
    if (w->have_layer && !is_gpt2(module))
        return cli_usage_error("--layer applies to --module gpt2 (Hugging Face GPT-2 "
                               "checkpoints), not %s", module);
    return CLI_OK;
}

int cli_load_weights(attn_ctx *ctx, attn_module *m, const char *module,
                     const cli_weights_options *w) {
    if (!w->path) return CLI_OK;
    attn_safetensors *st;
    if (attn_safetensors_open(ctx, w->path, &st) != ATTN_OK)
        return cli_library_error(ctx, "--weights");
    attn_safetensors_info info;
    bool hf = is_gpt2(module) &&
              (w->have_layer || attn_safetensors_find(st, "c_attn.weight", &info) != ATTN_OK);
    int rc = CLI_OK;
    if (hf && !w->have_heads)
        rc = cli_usage_error("--weights: a Hugging Face GPT-2 checkpoint does not record n_head: "
                             "give --heads (12 for GPT-2 small, 16 medium, 20 large, 25 xl)");
    else if ((hf ? attn_gpt2_load_hf_from(st, m, w->layer)
                 : attn_safetensors_load_module_from(st, m, NULL)) != ATTN_OK)
        rc = cli_library_error(ctx, "--weights");
    attn_safetensors_free(st);
    return rc;
}
