/* weights.h — --weights FILE [--layer N]: a module's weights from a
 * safetensors file, shared by the commands that run a module. */
#ifndef ATTN_CLI_WEIGHTS_H
#define ATTN_CLI_WEIGHTS_H

#include "attn.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct cli_weights_options {
    const char *path; /* NULL: keep the seeded weights */
    size_t layer;
    bool have_layer;
    bool have_heads;  /* --heads was given (HF checkpoints do not record n_head) */
} cli_weights_options;

/* The help lines of --weights and --layer. */
extern const char cli_weights_help[];

/* Takes --weights or --layer (returns 1), or returns 0 for another option,
 * CLI_USAGE after printing for a bad value. */
int cli_weights_option(const char *opt, const char *value, cli_weights_options *w);

/* Usage checks once every option is read: --layer needs --weights and gpt2. */
int cli_weights_check(const cli_weights_options *w, const char *module);

/* Loads w->path into m: by state_dict names, or, for gpt2 with --layer or a
 * file without c_attn.weight, as a Hugging Face GPT-2 checkpoint's layer.
 * Returns CLI_OK, CLI_USAGE or CLI_FAILED (after printing). */
int cli_load_weights(attn_ctx *ctx, attn_module *m, const char *module,
                     const cli_weights_options *w);

#endif /* ATTN_CLI_WEIGHTS_H */
